use crate::registry::Feedback;

/// The feedback [`BackoffLayer`](super::BackoffLayer) reported for a
/// response, attached to it as a response extension.
///
/// Outer layers read it instead of judging the response again, so every
/// layer agrees with the hooks the backoff layer was given:
/// [`BackoffRetry`](super::BackoffRetry) retries exactly the responses
/// whose `Judged` feedback is backoff. A request with several scopes is
/// judged once per scope (each scope's `http_codes` may differ); the
/// response carries backoff when any of its scopes got backoff feedback,
/// otherwise the first scope's feedback.
///
/// ```
/// use tower::{ServiceBuilder, ServiceExt};
/// use tower_throttle::backoff::Judged;
/// use tower_throttle::{BackoffLayer, Registry};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let client = ServiceBuilder::new()
///     .layer(BackoffLayer::new(Registry::default()))
///     .service(tower::service_fn(|_request: http::Request<()>| async {
///         let response = http::Response::builder().status(503).body(())?;
///         Ok::<_, http::Error>(response)
///     }));
/// let response = client.oneshot(http::Request::get("https://example.com/").body(())?).await?;
/// assert!(response.extensions().get::<Judged>().unwrap().feedback().is_backoff());
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Judged {
    feedback: Feedback,
}

impl Judged {
    pub(crate) fn new(feedback: Feedback) -> Self {
        Judged { feedback }
    }

    /// The feedback reported for the response.
    pub fn feedback(&self) -> Feedback {
        self.feedback
    }
}
