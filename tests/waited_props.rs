//! A property of `Waited` (issue 25): over random schedules (scopes with
//! random lanes and delays, requests with one or two scopes, random
//! arrivals and latencies, a small global limit and few queue places), for
//! every request the causes add up to `total`, and `total` is the wait the
//! request measured itself: from its first `poll_ready` to the moment the
//! inner service had it. Paused virtual time, so "within 1 ms" is checked
//! exactly as well.

use std::convert::Infallible;
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::{sleep, sleep_until, Instant};
use tower::{Layer, ServiceExt};
use tower_throttle::waited::Waited;
use tower_throttle::{Registry, ScopeConfig, Scopes, ThrottleLayer};

const MS: Duration = Duration::from_millis(1);

/// When the inner service had the request.
#[derive(Clone, Copy)]
struct HandedOverAt(Instant);

#[derive(Debug, Clone)]
struct Request {
    at_ms: u64,
    scopes: Vec<usize>,
    latency_ms: u64,
}

#[derive(Debug, Clone)]
struct Schedule {
    lanes: Vec<u32>,
    delays_ms: Vec<u64>,
    max_concurrency: u32,
    max_queued: usize,
    requests: Vec<Request>,
}

fn schedule() -> impl Strategy<Value = Schedule> {
    let scope_count = 1usize..=3;
    scope_count.prop_flat_map(|count| {
        let request = (
            0u64..1500,
            proptest::collection::btree_set(0..count, 1..=2),
            prop_oneof![Just(0u64), 1u64..400],
        )
            .prop_map(|(at_ms, scopes, latency_ms)| Request {
                at_ms,
                scopes: scopes.into_iter().collect(),
                latency_ms,
            });
        (
            proptest::collection::vec(1u32..=3, count),
            proptest::collection::vec(prop_oneof![Just(0u64), 1u64..300], count),
            1u32..=4,
            1usize..=6,
            proptest::collection::vec(request, 1..=12),
        )
            .prop_map(
                |(lanes, delays_ms, max_concurrency, max_queued, requests)| Schedule {
                    lanes,
                    delays_ms,
                    max_concurrency,
                    max_queued,
                    requests,
                },
            )
    })
}

/// Runs `schedule`; returns each request's (measured wait, record).
fn run(schedule: &Schedule) -> Vec<(Duration, Waited)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut builder = Registry::builder()
            .max_concurrency(schedule.max_concurrency)
            .max_queued(schedule.max_queued)
            .default_scope(ScopeConfig::default().jitter(0.0));
        for (scope, (&lanes, &delay)) in schedule.lanes.iter().zip(&schedule.delays_ms).enumerate() {
            let config = ScopeConfig::default()
                .concurrency(lanes)
                .delay(Duration::from_millis(delay))
                .delay_per_slot(Duration::ZERO)
                .jitter(0.0);
            builder = builder.scope(format!("s{scope}"), config);
        }
        let registry = builder.build().unwrap();
        let inner = tower::service_fn(|request: http::Request<()>| async move {
            let handed_over = HandedOverAt(Instant::now());
            let latency: u64 = request.uri().path()[1..].parse().unwrap();
            sleep(Duration::from_millis(latency)).await;
            let mut response = http::Response::new(());
            response.extensions_mut().insert(handed_over);
            Ok::<_, Infallible>(response)
        });
        let client = ThrottleLayer::new(registry).layer(inner);
        let start = Instant::now();
        let tasks: Vec<_> = schedule
            .requests
            .iter()
            .map(|request| {
                let client = client.clone();
                let request = request.clone();
                tokio::spawn(async move {
                    sleep_until(start + Duration::from_millis(request.at_ms)).await;
                    let mut http_request =
                        http::Request::get(format!("http://x.test/{}", request.latency_ms))
                            .body(())
                            .unwrap();
                    let names: Vec<String> = request.scopes.iter().map(|scope| format!("s{scope}")).collect();
                    http_request.extensions_mut().insert(Scopes::from(names));
                    let asked = Instant::now();
                    let response = client.oneshot(http_request).await.unwrap();
                    let handed_over = response.extensions().get::<HandedOverAt>().unwrap().0;
                    (
                        handed_over - asked,
                        Waited::from_extensions(response.extensions()),
                    )
                })
            })
            .collect();
        let mut outcomes = Vec::new();
        for task in tasks {
            outcomes.push(task.await.unwrap());
        }
        outcomes
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn causes_add_up_to_the_total_and_the_total_is_the_measured_wait(schedule in schedule()) {
        for (request, (measured, waited)) in run(&schedule).into_iter().enumerate() {
            let sum: Duration = waited.causes().map(|(_, _, time)| time).sum();
            prop_assert_eq!(sum, waited.total(), "request {}: {:?}", request, waited);
            let error = measured.abs_diff(waited.total());
            prop_assert!(error <= MS, "request {}: measured {:?}, {:?}", request, measured, waited);
            prop_assert_eq!(measured, waited.total(), "request {}: {:?}", request, waited);
        }
    }
}
