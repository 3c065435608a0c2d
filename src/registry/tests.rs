//! Unit tests of the registry handle.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

use crate::{Registry, ScopeConfig, ThrottleLayer};

#[tokio::test(start_paused = true)]
async fn waiters_go_when_a_pacing_ends_rather_than_when_its_delay_would() {
    let free = ScopeConfig::default()
        .delay(Duration::ZERO)
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0);
    let registry = Registry::builder().default_scope(free).build().unwrap();
    let start = Instant::now();
    let sent = Arc::new(Mutex::new(Vec::new()));
    let seen = sent.clone();
    let inner = tower::service_fn(move |_request: http::Request<()>| {
        seen.lock().unwrap().push(start.elapsed().as_millis());
        std::future::ready(Ok::<_, std::convert::Infallible>(http::Response::new(())))
    });
    let mut service = ThrottleLayer::new(registry.clone()).layer(inner);
    registry.set_pacing(
        "example.com",
        Some((Duration::from_secs(10), start + Duration::from_secs(3))),
    );
    let mut responses = Vec::new();
    for i in 0..3 {
        service.ready().await.unwrap();
        let request = http::Request::get(format!("https://example.com/{i}"))
            .body(())
            .unwrap();
        responses.push(tokio::spawn(service.call(request)));
    }
    for response in responses {
        response.await.unwrap().unwrap();
    }
    assert_eq!(*sent.lock().unwrap(), vec![0, 3000, 3000]);
}
