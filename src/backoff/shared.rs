//! What the backoff layer's services share: the registry and the hooks
//! that judge responses and errors. Apart from the layer, which makes the
//! services, so that the services, their futures and the retry policy
//! use it without using the layer back.

use std::sync::Arc;

use http::HeaderName;

use super::classify::{ErrorView, ResponseHead};
use crate::registry::{BackoffConfig, Feedback, Registry};

pub(crate) type ResponseHook = dyn Fn(&ResponseHead<'_>, &BackoffConfig) -> Feedback + Send + Sync;
pub(crate) type ErrorHook = dyn Fn(&ErrorView<'_>) -> Feedback + Send + Sync;

/// What every [`Backoff`](super::Backoff) service of one layer shares.
pub(crate) struct BackoffShared {
    pub(crate) registry: Registry,
    /// A response header carrying the request's actual cost.
    pub(crate) cost_header: Option<HeaderName>,
    pub(crate) on_response: Arc<ResponseHook>,
    pub(crate) on_error: Arc<ErrorHook>,
    /// Whether `on_response` is the user's: every response then goes to
    /// it (the built-in rule can skip a success).
    pub(crate) custom_on_response: bool,
}
