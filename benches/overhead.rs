//! Per-request overhead of `Throttle` against peers, measured in one run on
//! one thread: the bare service, `tower::limit::ConcurrencyLimit`, a
//! `governor` keyed rate-limit check, and `Throttle` with one scope and with
//! 100 000 scopes visited round-robin (and with one scope without recording
//! the resolved scopes in the request extensions).
//!
//! Every variant builds the same request (a pre-parsed URI cloned into a new
//! `http::Request`) and drives `ready` + `call` + the response future to
//! completion, so `variant - bare` is the overhead of the layer. The figure
//! to report is the ratio of overheads, not absolute times.
//!
//! The `scaling` group drives the same requests from 1 and from 2 OS
//! threads (each with its own current-thread runtime, all sharing one
//! registry), with 1 and with 10 000 scopes: the time per request at 2
//! threads against 1 thread shows how much the registry's lock costs under
//! contention (0.5 would be perfect scaling, 1.0 no scaling at all). The
//! bare service and `ConcurrencyLimit` (one shared semaphore) are the peers.
//!
//! ```text
//! cargo bench --bench overhead
//! ```

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use tower::Service;
use tower_throttle::ThrottleLayer;

#[path = "variants/mod.rs"]
mod variants;

use variants::{bare, drive, governor_keyed, unthrottled_registry, uris};

const MANY_SCOPES: usize = 100_000;

fn overhead(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let one = uris(1);
    let many = uris(MANY_SCOPES);
    let mut group = c.benchmark_group("overhead");

    group.bench_function("bare", |b| {
        let mut service = bare();
        b.iter_custom(|iters| runtime.block_on(drive(&mut service, &one, iters)));
    });

    group.bench_function("concurrency_limit", |b| {
        let mut service = tower::limit::ConcurrencyLimit::new(bare(), 1_000);
        b.iter_custom(|iters| runtime.block_on(drive(&mut service, &one, iters)));
    });

    for (name, uris) in [
        ("governor_keyed/1_key", &one),
        ("governor_keyed/100k_keys", &many),
    ] {
        group.bench_function(name, |b| {
            let mut service = governor_keyed();
            b.iter_custom(|iters| runtime.block_on(drive(&mut service, uris, iters)));
        });
    }

    group.bench_function("throttle/1_scope", |b| {
        let mut service = ThrottleLayer::new(unthrottled_registry()).layer_service(bare());
        b.iter_custom(|iters| runtime.block_on(drive(&mut service, &one, iters)));
    });

    group.bench_function("throttle/1_scope_recorded", |b| {
        // `record_scopes(true)`: the `Scopes` extension inserted too.
        let layer = ThrottleLayer::new(unthrottled_registry()).record_scopes(true);
        let mut service = layer.layer_service(bare());
        b.iter_custom(|iters| runtime.block_on(drive(&mut service, &one, iters)));
    });

    group.bench_function("throttle/100k_scopes", |b| {
        let mut service = ThrottleLayer::new(unthrottled_registry()).layer_service(bare());
        // Create every scope first, so the figure is the steady state of a
        // crawl over 100 000 sites, not their first sight.
        runtime.block_on(drive(&mut service, &many, MANY_SCOPES as u64));
        b.iter_custom(|iters| runtime.block_on(drive(&mut service, &many, iters)));
    });

    group.finish();
}

const SCALING_SCOPES: usize = 10_000;

/// Runs `iters` requests split over `threads` OS threads, each driving its
/// own clone of `service` on a current-thread runtime; returns the wall
/// time for all of them.
fn drive_threads<S>(service: &S, uris: &[http::Uri], iters: u64, threads: u64) -> Duration
where
    S: Service<http::Request<()>, Response = http::Response<()>> + Clone + Send,
    S::Error: std::fmt::Debug,
{
    let start = std::sync::Barrier::new(threads as usize + 1);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|thread| {
                let mut service = service.clone();
                let start = &start;
                // Each thread visits the scopes from its own offset, so two
                // threads work on different scopes at any moment.
                let offset = (thread as usize * uris.len()) / threads as usize;
                scope.spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    let mine: Vec<http::Uri> =
                        uris[offset..].iter().chain(&uris[..offset]).cloned().collect();
                    start.wait();
                    runtime.block_on(drive(&mut service, &mine, iters / threads))
                })
            })
            .collect();
        start.wait();
        let began = Instant::now();
        for worker in workers {
            worker.join().unwrap();
        }
        began.elapsed()
    })
}

fn scaling(c: &mut Criterion) {
    let one = uris(1);
    let many = uris(SCALING_SCOPES);
    let mut group = c.benchmark_group("scaling");
    for threads in [1, 2] {
        group.bench_function(format!("bare/{threads}_threads"), |b| {
            let service = bare();
            b.iter_custom(|iters| drive_threads(&service, &one, iters, threads));
        });
        group.bench_function(format!("concurrency_limit/{threads}_threads"), |b| {
            let service = tower::limit::ConcurrencyLimit::new(bare(), 1_000);
            b.iter_custom(|iters| drive_threads(&service, &one, iters, threads));
        });
        for (scopes, uris) in [(1, &one), (SCALING_SCOPES, &many)] {
            group.bench_function(format!("throttle/{scopes}_scopes/{threads}_threads"), |b| {
                let service = ThrottleLayer::new(unthrottled_registry()).layer_service(bare());
                drive_threads(&service, uris, uris.len() as u64, 1);
                b.iter_custom(|iters| drive_threads(&service, uris, iters, threads));
            });
        }
    }
    group.finish();
}

trait LayerService {
    fn layer_service<S>(&self, inner: S) -> tower_throttle::Throttle<S>;
}

impl LayerService for ThrottleLayer {
    fn layer_service<S>(&self, inner: S) -> tower_throttle::Throttle<S> {
        tower::Layer::layer(self, inner)
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = overhead, scaling
}
criterion_main!(benches);
