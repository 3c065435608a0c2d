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

/// A registry of plain scopes (delay 0, 4 lanes) whose idle scopes go
/// after `idle_ttl`, and a throttle over a service that answers at once.
fn plain_registry(
    idle_ttl: Duration,
) -> (
    Registry,
    impl Service<
        http::Request<()>,
        Response = http::Response<crate::throttle::ThrottledBody<()>>,
        Error = std::convert::Infallible,
    >,
) {
    let plain = ScopeConfig::default()
        .concurrency(4)
        .delay(Duration::ZERO)
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0);
    let registry = Registry::builder()
        .default_scope(plain)
        .idle_ttl(idle_ttl)
        .build()
        .unwrap();
    let inner = tower::service_fn(|_request: http::Request<()>| {
        std::future::ready(Ok::<_, std::convert::Infallible>(http::Response::new(())))
    });
    (registry.clone(), ThrottleLayer::new(registry).layer(inner))
}

/// Sends a request for `host` through `service` and reads its response.
async fn send<S>(service: &mut S, host: &str)
where
    S: Service<http::Request<()>, Error = std::convert::Infallible>,
{
    let request = http::Request::get(format!("http://{host}/")).body(()).unwrap();
    service.ready().await.unwrap();
    let _response = service.call(request).await.unwrap();
}

/// The words the registry's directory lists.
fn words(registry: &Registry) -> usize {
    registry.shared.words.len()
}

/// A plain scope gets a word when it is busy (asked for again within
/// `WORD_GAP` of its last request's end), not when it is asked for the
/// first time or now and then; an idle word goes (the scope stays), and
/// the scope gets a new one, found by the same thread, once it is busy
/// again.
#[tokio::test(start_paused = true)]
async fn busy_plain_scopes_get_words_that_go_when_idle() {
    let (registry, mut service) = plain_registry(Duration::from_secs(3600));
    send(&mut service, "a.test").await;
    assert_eq!(words(&registry), 0, "asked for once: no word");
    send(&mut service, "a.test").await;
    assert_eq!(words(&registry), 1, "asked for again at once: busy");
    send(&mut service, "b.test").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    send(&mut service, "c.test").await;
    send(&mut service, "b.test").await;
    assert_eq!(
        words(&registry),
        1,
        "b asked for again 300 ms after its end, c's in between: not busy"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    send(&mut service, "b.test").await;
    assert_eq!(
        words(&registry),
        2,
        "b asked for again after 300 ms, nothing else in between: busy (a lone client's scope)"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Any request under the lock does the work that is due.
    send(&mut service, "c.test").await;
    assert_eq!(words(&registry), 0, "a's and b's words idle for 3 s: gone");
    assert!(registry.scope_stats("a.test").is_some(), "the scope stays");
    // This thread still holds a's retired word: it is refused, and the
    // lock makes a new one for the busy scope.
    send(&mut service, "a.test").await;
    send(&mut service, "a.test").await;
    assert_eq!(words(&registry), 1);
    let before = registry.debug_lock_count();
    send(&mut service, "a.test").await;
    if let (Some(before), Some(after)) = (before, registry.debug_lock_count()) {
        assert_eq!(after - before, 0, "admitted and ended on the new word");
    }
    assert_eq!(registry.scope_stats("a.test").unwrap().sent, 5);
}

/// An evicted scope's word leaves the directory with it.
#[tokio::test(start_paused = true)]
async fn an_evicted_scope_takes_its_word_out_of_the_directory() {
    let (registry, mut service) = plain_registry(Duration::from_millis(100));
    send(&mut service, "a.test").await;
    send(&mut service, "a.test").await;
    assert_eq!(words(&registry), 1);
    // Evicted after 100 ms idle (candidates count in whole seconds: by
    // 2 s at most), before its word's own time.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    send(&mut service, "c.test").await;
    assert!(registry.scope_stats("a.test").is_none(), "evicted");
    assert_eq!(words(&registry), 0);
}
