//! The tower contract, checked with `tower-test` mocks for every layer.
//!
//! A `tower_test::mock::Mock` keeps a readiness flag per clone: `call` on
//! a clone whose own `poll_ready` did not return `Ready(Ok(()))` panics
//! with "service not ready; poll_ready must be called first", and the
//! request then never reaches the mock's `Handle`. So every test below
//! that sends requests through a layer also checks that the layer never
//! calls its inner service unreadied (a panic fails the test, and the
//! handle must see exactly the requests expected). Each layer is checked
//! for:
//!
//! - `poll_ready` errors of the inner service come out of the layer's
//!   `poll_ready` (the mock's `send_error` makes its next `poll_ready`
//!   fail);
//! - a clone does not share readiness: readying one handle and calling
//!   its clone panics without the inner service seeing any request, and
//!   the readied handle still sends;
//! - requests through the layer reach the inner service only readied,
//!   including the paths where the layer holds a request back (Throttle's
//!   waiting requests, robots.txt's fetch) and `tower::retry` with
//!   `BackoffRetry`.
//!
//! Throttle also gives the inner service's readiness back while a request
//! waits, so an inner service with a scarce readiness (a
//! `ConcurrencyLimit`) is not held by a request that waits for its delay.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use tokio::time::Instant;
use tokio_test::{assert_pending, assert_ready_err, assert_ready_ok};
use tower::retry::RetryLayer;
use tower::{BoxError, Layer, Service, ServiceBuilder, ServiceExt};
use tower_test::mock::{self, Handle};
#[cfg(feature = "robots")]
use tower_throttle::RobotsDelayLayer;
use tower_throttle::{BackoffLayer, Registry, RetryAfterLayer, ScopeConfig, Scopes, ThrottleLayer};

type Request = http::Request<()>;
type Response = http::Response<String>;

fn get(path: &str) -> Request {
    http::Request::get(format!("http://site.example{path}"))
        .body(())
        .unwrap()
}

fn get_in(scope: &str, path: &str) -> Request {
    let mut request = http::Request::get(format!("http://{scope}{path}"))
        .body(())
        .unwrap();
    request.extensions_mut().insert(Scopes::from(scope));
    request
}

fn ok(body: &str) -> Response {
    http::Response::new(body.to_owned())
}

/// A registry that sends at once: the contract tests are about readiness.
fn open_registry() -> Registry {
    Registry::builder()
        .default_scope(
            ScopeConfig::default()
                .concurrency(4)
                .delay(Duration::ZERO)
                .delay_per_slot(Duration::ZERO)
                .jitter(0.0),
        )
        .build()
        .unwrap()
}

fn error_chain_mentions(error: &(dyn std::error::Error + 'static), text: &str) -> bool {
    let mut next = Some(error);
    while let Some(error) = next {
        if error.to_string().contains(text) {
            return true;
        }
        next = error.source();
    }
    false
}

/// `service` was readied: with the inner service no longer ready, a clone
/// of it is not ready either, while `service` itself still sends; then a
/// clone called unreadied panics (see [`expect_unreadied_call_to_panic`]).
async fn expect_readiness_per_clone<S, B>(
    mut service: tower_test::mock::Spawn<S>,
    mut handle: Handle<Request, Response>,
) where
    S: Service<Request, Response = http::Response<B>> + Clone,
    B: http_body::Body + Send + Unpin + 'static,
    B::Error: std::fmt::Debug,
    S::Future: Send + 'static,
    S::Error: std::fmt::Debug + Send + 'static,
{
    handle.allow(0);
    let mut clone = service.clone();
    assert_pending!(clone.poll_ready(), "the clone is ready without the inner service");
    let response = tokio::spawn(service.call(get("/ready")));
    let (request, reply) = handle.next_request().await.unwrap();
    assert_eq!(request.uri().path(), "/ready");
    reply.send_response(ok("fine"));
    let body = http_body_util::BodyExt::collect(response.await.unwrap().unwrap().into_body())
        .await
        .unwrap();
    assert_eq!(body.to_bytes(), "fine");
    drop(clone);
    expect_unreadied_call_to_panic(service, handle);
}

/// Calls a never-readied clone of `service`: it must panic (in the layer,
/// or in the mock, which the layer must not have called) and the inner
/// service must see no request.
fn expect_unreadied_call_to_panic<S>(
    service: tower_test::mock::Spawn<S>,
    mut handle: Handle<Request, Response>,
) where
    S: Service<Request> + Clone,
{
    let mut clone = service.clone();
    let called_unreadied = catch_unwind(AssertUnwindSafe(|| drop(clone.call(get("/unreadied")))));
    assert!(called_unreadied.is_err(), "a clone sent without being readied");
    assert_pending!(handle.poll_request());
    // A mock that panicked in `call` did so holding its state's lock, which
    // is poisoned now, and its handles would panic when dropped.
    std::mem::forget((service, clone, handle));
}

/// The checks every layer must pass, given the layer under test.
macro_rules! contract_tests {
    ($module:ident, $layer:expr) => {
        mod $module {
            use super::*;

            #[tokio::test(start_paused = true)]
            async fn a_poll_ready_error_of_the_inner_service_propagates() {
                let registry = open_registry();
                let (mut service, mut handle) =
                    mock::spawn_layer::<Request, Response, _>(($layer)(&registry));
                handle.send_error("inner service broke");
                let error: BoxError = assert_ready_err!(service.poll_ready()).into();
                assert!(
                    error_chain_mentions(&*error, "inner service broke"),
                    "unexpected error: {error}"
                );
            }

            #[tokio::test(start_paused = true)]
            async fn a_clone_does_not_share_readiness() {
                let registry = open_registry();
                let (mut service, handle) = mock::spawn_layer::<Request, Response, _>(($layer)(&registry));
                assert_ready_ok!(service.poll_ready());
                expect_readiness_per_clone(service, handle).await;
            }
            #[tokio::test(start_paused = true)]
            async fn requests_reach_the_inner_service_only_readied() {
                let registry = open_registry();
                let (mock, mut handle) = mock::pair::<Request, Response>();
                handle.allow(0);
                let service = ($layer)(&registry).layer(mock);
                let mut responses = Vec::new();
                for i in 0..6 {
                    let request = get(&format!("/page/{i}"));
                    // Readiness comes late: the layer must wait for it.
                    let mut ready = tokio_test::task::spawn(service.clone().oneshot(request));
                    assert_pending!(ready.poll());
                    // The status only: a response kept whole keeps its lane.
                    responses.push(tokio::spawn(async move {
                        ready.await.map(|response| response.status())
                    }));
                }
                tokio::task::yield_now().await;
                handle.allow(u64::MAX);
                for _ in 0..6 {
                    let (_request, reply) = handle.next_request().await.unwrap();
                    reply.send_response(ok("fine"));
                }
                for status in responses {
                    assert_eq!(status.await.unwrap().unwrap(), 200);
                }
            }
        }
    };
}

contract_tests!(throttle, |registry: &Registry| ThrottleLayer::new(
    registry.clone()
));
contract_tests!(backoff, |registry: &Registry| BackoffLayer::new(registry.clone()));
contract_tests!(retry_after, |registry: &Registry| RetryAfterLayer::new(
    registry.clone()
));

/// robots.txt answers are served by the test, so its checks are written
/// out: the fetch is one more request the inner service must see readied.
#[cfg(feature = "robots")]
mod robots {
    use super::*;

    fn layer(registry: &Registry) -> RobotsDelayLayer {
        RobotsDelayLayer::new(registry.clone())
    }

    #[tokio::test(start_paused = true)]
    async fn a_poll_ready_error_of_the_inner_service_propagates() {
        let registry = open_registry();
        let (mut service, mut handle) = mock::spawn_layer::<Request, Response, _>(layer(&registry));
        handle.send_error("inner service broke");
        let error = assert_ready_err!(service.poll_ready());
        assert!(
            error_chain_mentions(&error, "inner service broke"),
            "unexpected error: {error}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_clone_does_not_share_readiness() {
        let registry = open_registry();
        let (mut service, mut handle) = mock::spawn_layer::<Request, Response, _>(layer(&registry));
        assert_ready_ok!(service.poll_ready());
        // A clone's request waits for robots.txt and readies its own
        // handle once the rules are known; the fetch readies its own too.
        let mut first_clone = service.clone();
        assert_ready_ok!(first_clone.poll_ready());
        let waiting = tokio::spawn(first_clone.call(get("/clone")));
        let (fetch, reply) = handle.next_request().await.unwrap();
        assert_eq!(fetch.uri().path(), "/robots.txt");
        reply.send_response(ok("User-agent: *\nDisallow:\n"));
        let (request, reply) = handle.next_request().await.unwrap();
        assert_eq!(request.uri().path(), "/clone");
        reply.send_response(ok("fine"));
        assert_eq!(waiting.await.unwrap().unwrap().into_body(), "fine");
        drop(first_clone);
        // Once the rules are known a request goes straight through, on the
        // handle `poll_ready` readied; a clone needs readiness of its own.
        expect_readiness_per_clone(service, handle).await;
    }

    #[tokio::test(start_paused = true)]
    async fn the_fetch_and_the_waiting_requests_reach_the_inner_service_only_readied() {
        let registry = open_registry();
        let (mock, mut handle) = mock::pair::<Request, Response>();
        let service = layer(&registry).layer(mock);
        handle.allow(0);
        let mut responses = Vec::new();
        for i in 0..4 {
            let service = service.clone();
            responses.push(tokio::spawn(service.oneshot(get(&format!("/page/{i}")))));
        }
        tokio::task::yield_now().await;
        handle.allow(u64::MAX);
        let (fetch, reply) = handle.next_request().await.unwrap();
        assert_eq!(fetch.uri().path(), "/robots.txt");
        reply.send_response(ok("User-agent: *\nCrawl-delay: 2\n"));
        for _ in 0..4 {
            let (request, reply) = handle.next_request().await.unwrap();
            assert!(request.uri().path().starts_with("/page/"));
            reply.send_response(ok("fine"));
        }
        for response in responses {
            assert_eq!(response.await.unwrap().unwrap().status(), 200);
        }
        assert_eq!(
            registry.scope_stats("site.example").unwrap().robots_delay,
            Some(Duration::from_secs(2))
        );
    }
}

/// Throttle's own paths: requests that wait, the fixed-scope mode, and
/// the readiness a waiting request gives back.
mod throttle_waiting {
    use super::*;

    fn delayed_registry() -> Registry {
        Registry::builder()
            .default_scope(
                ScopeConfig::default()
                    .concurrency(1)
                    .delay(Duration::from_secs(10))
                    .delay_per_slot(Duration::ZERO)
                    .jitter(0.0),
            )
            .build()
            .unwrap()
    }

    async fn answer(handle: &mut Handle<Request, Response>, path: &str) -> Instant {
        let (request, reply) = handle.next_request().await.unwrap();
        assert_eq!(request.uri().path(), path);
        reply.send_response(ok("fine"));
        Instant::now()
    }

    /// Sends `path` through `service`, which must be ready, and answers it
    /// at once: the instant it reached the inner service.
    async fn send_answered<S>(
        service: &mut mock::Spawn<S>,
        handle: &mut Handle<Request, Response>,
        path: &str,
    ) -> Instant
    where
        S: Service<Request>,
        S::Future: Send + 'static,
        S::Response: Send + 'static,
        S::Error: std::fmt::Debug + Send + 'static,
    {
        assert_ready_ok!(service.poll_ready());
        let call = tokio::spawn(service.call(get(path)));
        let at = answer(handle, path).await;
        call.await.unwrap().unwrap();
        at
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_request_readies_its_own_handle_when_admitted() {
        let start = Instant::now();
        let registry = delayed_registry();
        let (mut service, mut handle) =
            mock::spawn_layer::<Request, Response, _>(ThrottleLayer::new(registry.clone()));
        assert_eq!(send_answered(&mut service, &mut handle, "/1").await, start);
        // The second waits 10 s, giving its readiness back; the inner
        // service is not ready when it is admitted, so the request waits
        // for its own readiness before it leaves.
        assert_ready_ok!(service.poll_ready());
        let second = tokio::spawn(service.call(get("/2")));
        handle.allow(0);
        tokio::time::sleep(Duration::from_secs(15)).await;
        assert_pending!(handle.poll_request());
        handle.allow(1);
        assert_eq!(answer(&mut handle, "/2").await, start + Duration::from_secs(15));
        second.await.unwrap().unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_dropped_before_it_leaves_starts_no_gap() {
        let start = Instant::now();
        let registry = delayed_registry();
        let (mut service, mut handle) =
            mock::spawn_layer::<Request, Response, _>(ThrottleLayer::new(registry.clone()));
        assert_eq!(send_answered(&mut service, &mut handle, "/1").await, start);
        // The second is admitted at 10 s but its inner service is not
        // ready; it is dropped at 12 s, before it left.
        assert_ready_ok!(service.poll_ready());
        let second = tokio::spawn(service.call(get("/2")));
        handle.allow(0);
        tokio::time::sleep_until(start + Duration::from_secs(12)).await;
        assert_eq!(registry.stats().in_flight, 1, "admitted at 10 s");
        second.abort();
        assert!(second.await.unwrap_err().is_cancelled());
        // The site saw nothing at 10 s: the third runs its gap from the
        // first, 12 s ago, and goes at once.
        handle.allow(1);
        assert_eq!(
            send_answered(&mut service, &mut handle, "/3").await,
            start + Duration::from_secs(12)
        );
        // And the gap after the third runs from it.
        handle.allow(1);
        assert_eq!(
            send_answered(&mut service, &mut handle, "/4").await,
            start + Duration::from_secs(22)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_the_inner_service_had_counts_as_sent_even_if_never_polled() {
        let start = Instant::now();
        let registry = delayed_registry();
        let (mut service, mut handle) =
            mock::spawn_layer::<Request, Response, _>(ThrottleLayer::new(registry.clone()));
        send_answered(&mut service, &mut handle, "/1").await;
        // Admitted at 10 s and handed to the inner service by `call`, which
        // (as the mock does) may send it before its future is polled. The
        // future is dropped unpolled at 13 s: the request counts as sent
        // then, the latest it can have left.
        tokio::time::sleep_until(start + Duration::from_secs(10)).await;
        assert_ready_ok!(service.poll_ready());
        let second = service.call(get("/2"));
        let (request, _reply) = handle.next_request().await.unwrap();
        assert_eq!(request.uri().path(), "/2");
        tokio::time::sleep_until(start + Duration::from_secs(13)).await;
        drop(second);
        assert_eq!(
            send_answered(&mut service, &mut handle, "/3").await,
            start + Duration::from_secs(23)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_poll_ready_error_while_waiting_ends_the_request_with_it() {
        let registry = delayed_registry();
        let (mut service, mut handle) =
            mock::spawn_layer::<Request, Response, _>(ThrottleLayer::new(registry.clone()));
        send_answered(&mut service, &mut handle, "/1").await;
        assert_ready_ok!(service.poll_ready());
        let second = tokio::spawn(service.call(get("/2")));
        handle.send_error("inner service broke");
        let error = second.await.unwrap().unwrap_err();
        assert!(
            error_chain_mentions(&*error, "inner service broke"),
            "unexpected error: {error}"
        );
        // Its lane and its queue place are released.
        let stats = registry.stats();
        assert_eq!((stats.in_flight, stats.waiting), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn fixed_scope_readies_the_inner_service_after_admission_only() {
        let start = Instant::now();
        let registry = delayed_registry();
        let (mut service, mut handle) = mock::spawn_layer::<Request, Response, _>(
            ThrottleLayer::new(registry.clone()).fixed_scope(Scopes::from("site.example")),
        );
        send_answered(&mut service, &mut handle, "/1").await;
        // Not admitted for 10 s: poll_ready stays pending, and a clone
        // called meanwhile panics without reaching the inner service.
        assert_pending!(service.poll_ready());
        let mut clone = service.clone();
        let called_unreadied = catch_unwind(AssertUnwindSafe(|| drop(clone.call(get("/clone")))));
        assert!(called_unreadied.is_err());
        tokio::time::sleep_until(start + Duration::from_secs(10)).await;
        assert_ready_ok!(service.poll_ready());
        let second = tokio::spawn(service.call(get("/2")));
        assert_eq!(answer(&mut handle, "/2").await, start + Duration::from_secs(10));
        second.await.unwrap().unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_waiting_for_its_delay_does_not_hold_a_scarce_inner_readiness() {
        let start = Instant::now();
        let registry = delayed_registry();
        let (mock, mut handle) = mock::pair::<Request, Response>();
        // One call at a time: readiness is a permit, taken by poll_ready.
        let mut service = ServiceBuilder::new()
            .layer(ThrottleLayer::new(registry.clone()))
            .concurrency_limit(1)
            .service(mock);
        let first = service.ready().await.unwrap().call(get_in("a.example", "/a1"));
        let first = tokio::spawn(first);
        answer(&mut handle, "/a1").await;
        first.await.unwrap().unwrap();
        // a2 waits 10 s for scope a: it must give the permit back...
        let second = tokio::spawn(service.ready().await.unwrap().call(get_in("a.example", "/a2")));
        // ...so scope b's request gets ready and goes at once.
        let other = tokio::spawn(service.ready().await.unwrap().call(get_in("b.example", "/b1")));
        assert_eq!(answer(&mut handle, "/b1").await, start);
        other.await.unwrap().unwrap();
        assert_eq!(answer(&mut handle, "/a2").await, start + Duration::from_secs(10));
        second.await.unwrap().unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn an_inner_service_that_is_not_ready_holds_back_only_what_poll_ready_forces() {
        let start = Instant::now();
        let registry = delayed_registry();
        let (mock, mut handle) = mock::pair::<Request, Response>();
        let service = ThrottleLayer::new(registry.clone()).layer(mock);
        handle.allow(0);
        // Scope a's request is admitted at once but the inner service is
        // not ready: it keeps its lane (it has not departed yet).
        let waiting_a = tokio::spawn(service.clone().oneshot(get_in("a.example", "/a1")));
        let waiting_b = tokio::spawn(service.clone().oneshot(get_in("b.example", "/b1")));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_pending!(handle.poll_request());
        handle.allow(u64::MAX);
        // Both go as soon as the inner service is ready, whatever the order.
        let mut paths = Vec::new();
        for _ in 0..2 {
            let (request, reply) = handle.next_request().await.unwrap();
            assert_eq!(Instant::now(), start + Duration::from_secs(3));
            paths.push(request.uri().path().to_owned());
            reply.send_response(ok("fine"));
        }
        paths.sort();
        assert_eq!(paths, ["/a1", "/b1"]);
        waiting_a.await.unwrap().unwrap();
        waiting_b.await.unwrap().unwrap();
    }
}

/// `tower::retry` with `BackoffRetry` around Throttle: every attempt is a
/// fresh call on a readied clone.
mod retry {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn every_retry_reaches_the_inner_service_readied() {
        let registry = open_registry();
        let (mock, mut handle) = mock::pair::<Request, Response>();
        let service = ServiceBuilder::new()
            .layer(RetryLayer::new(
                BackoffLayer::new(registry.clone()).retry_policy(3),
            ))
            .layer(ThrottleLayer::new(registry.clone()))
            .layer(BackoffLayer::new(registry.clone()))
            .service(mock);
        let response = tokio::spawn(service.oneshot(get("/flaky")));
        for status in [503, 503] {
            let (request, reply) = handle.next_request().await.unwrap();
            assert_eq!(request.uri().path(), "/flaky");
            reply.send_response(
                http::Response::builder()
                    .status(status)
                    .body(String::new())
                    .unwrap(),
            );
        }
        let (_request, reply) = handle.next_request().await.unwrap();
        reply.send_response(ok("third time"));
        assert_eq!(
            response.await.unwrap().unwrap().into_body().get_ref(),
            "third time"
        );
        assert_eq!(registry.scope_stats("site.example").unwrap().sent, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_poll_ready_error_between_attempts_propagates() {
        let registry = open_registry();
        let (mock, mut handle) = mock::pair::<Request, Response>();
        let service = ServiceBuilder::new()
            .layer(RetryLayer::new(
                BackoffLayer::new(registry.clone()).retry_policy(3),
            ))
            .layer(ThrottleLayer::new(registry.clone()))
            .service(mock);
        let response = tokio::spawn(service.oneshot(get("/flaky")));
        let (_request, reply) = handle.next_request().await.unwrap();
        handle.send_error("inner service broke");
        reply.send_response(http::Response::builder().status(503).body(String::new()).unwrap());
        let error = response.await.unwrap().unwrap_err();
        assert!(
            error_chain_mentions(&*error, "inner service broke"),
            "unexpected error: {error}"
        );
    }
}

#[test]
fn the_mock_panics_when_called_unreadied() {
    // What every check above relies on.
    let (mut mock, handle) = mock::pair::<Request, Response>();
    let called = catch_unwind(AssertUnwindSafe(|| drop(mock.call(get("/")))));
    assert!(called.is_err());
    std::mem::forget((mock, handle));
}
