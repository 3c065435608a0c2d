//! The request's span (`tower_throttle`, debug) carries the breakdown of
//! its wait (issue 25). A test binary of its own: the subscriber is the
//! global one, as tracing's per-callsite cache wants (a thread-local one
//! races with other tests of the binary over that cache).

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::join;
use tower::{Layer, ServiceExt};
use tower_throttle::waited::Waited;
use tower_throttle::{Registry, ScopeConfig, ThrottleLayer};
use tracing_subscriber::layer::SubscriberExt;

/// Keeps the fields recorded on spans.
#[derive(Clone, Default)]
struct SpanFields(Arc<Mutex<Vec<(String, String)>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for SpanFields {
    fn on_record(
        &self,
        _id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        struct Visit<'a>(&'a mut Vec<(String, String)>);
        impl tracing::field::Visit for Visit<'_> {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0.push((field.name().to_owned(), format!("{value:?}")));
            }
        }
        values.record(&mut Visit(&mut self.0.lock().unwrap()));
    }
}

#[tokio::test(start_paused = true)]
async fn the_requests_span_carries_the_breakdown_of_its_wait() {
    let fields = SpanFields::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(fields.clone())).unwrap();
    let registry = Registry::builder()
        .default_scope(
            ScopeConfig::default()
                .delay(Duration::from_secs(1))
                .delay_per_slot(Duration::ZERO)
                .jitter(0.0),
        )
        .build()
        .unwrap();
    let client = ThrottleLayer::new(registry).layer(tower::service_fn(|_request: http::Request<()>| async {
        Ok::<_, Infallible>(http::Response::new(()))
    }));
    let get = |uri: &str| http::Request::get(uri).body(()).unwrap();
    // The first response is dropped as it comes: its lane is free again.
    let (_, second) = join(
        async { client.clone().oneshot(get("http://a.test/1")).await.map(drop) },
        client.clone().oneshot(get("http://a.test/2")),
    )
    .await;
    assert_eq!(
        Waited::from_extensions(second.unwrap().extensions()).total(),
        Duration::from_secs(1)
    );
    let recorded = fields.0.lock().unwrap().clone();
    // The first request went at once: its span says it waited 0 ms.
    assert_eq!(
        recorded,
        [
            ("waited_ms".to_owned(), "0.0".to_owned()),
            ("waited_ms".to_owned(), "1000.0".to_owned()),
            ("top_cause".to_owned(), "\"delay\"".to_owned()),
            ("wait_delay_ms".to_owned(), "1000.0".to_owned()),
        ]
    );
}
