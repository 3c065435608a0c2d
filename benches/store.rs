//! Per-admission cost of a scope store: the same throttle over the bare
//! service with no store (the in-process registry alone), with a
//! [`MemoryStore`] (the store protocol without a network) and with a
//! [`RedisStore`] on `REDIS_URL` (default `redis://127.0.0.1:6379`), one
//! request at a time. Delay 0 and lanes to spare, so nothing waits: what is
//! measured is the reservation (one Redis script call) and the bookkeeping
//! around it. The release of each lease runs in the background, on the
//! runtime's worker thread, and overlaps the next request.
//!
//! The figures to report are the time per request through Redis against
//! the in-memory registry (the added latency per admission, about one
//! loopback round trip) and its inverse, admissions per second. Without a
//! Redis the Redis variant is skipped, with the reason printed.
//!
//! ```text
//! redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save ''
//! cargo bench --bench store --features redis
//! ```

use criterion::{criterion_group, criterion_main, Criterion};
use tower_throttle::store::{backend::ScopeStore, MemoryStore, RedisStore};
use tower_throttle::{Registry, ThrottleLayer};

#[path = "variants/mod.rs"]
mod variants;

use variants::{bare, drive, unthrottled_builder, unthrottled_registry, uris};

/// The unthrottled registry of the overhead bench (delay 0, lanes to
/// spare), sharing `store`.
fn registry_with(store: impl ScopeStore) -> Registry {
    unthrottled_builder()
        .store(store)
        .build()
        .expect("a valid config")
}

/// A Redis store on `REDIS_URL`, if one answers there.
fn redis_store(runtime: &tokio::runtime::Runtime) -> Option<RedisStore> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let store = RedisStore::new(&url)
        .ok()?
        .prefix(format!("tower-throttle-bench:{:016x}:", fastrand::u64(..)));
    // One request to find out whether Redis answers (and to load the script).
    let registry = registry_with(store.clone());
    let mut service = tower::Layer::layer(&ThrottleLayer::new(registry).store_errors(), bare());
    let probe = runtime.block_on(async {
        use tower::{Service, ServiceExt};
        let request = variants::request(&uris(1)[0]);
        service.ready().await?.call(request).await.map(drop)
    });
    match probe {
        Ok(()) => Some(store),
        Err(error) => {
            let cause = std::error::Error::source(&error)
                .map(ToString::to_string)
                .unwrap_or_default();
            eprintln!("skipped the Redis variant: no Redis answers at {url} ({error}: {cause})");
            None
        }
    }
}

fn store(c: &mut Criterion) {
    // The requests are driven from this thread; the background releases
    // run on the runtime's one worker thread, as in an application.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let one = uris(1);
    let mut group = c.benchmark_group("store");

    group.bench_function("no_store", |b| {
        let mut service = tower::Layer::layer(&ThrottleLayer::new(unthrottled_registry()), bare());
        b.iter_custom(|iters| runtime.block_on(drive(&mut service, &one, iters)));
    });

    group.bench_function("memory_store", |b| {
        let registry = registry_with(MemoryStore::new());
        let mut service = tower::Layer::layer(&ThrottleLayer::new(registry).store_errors(), bare());
        b.iter_custom(|iters| runtime.block_on(drive(&mut service, &one, iters)));
    });

    if let Some(store) = redis_store(&runtime) {
        group.bench_function("redis_store", |b| {
            let registry = registry_with(store.clone());
            let mut service = tower::Layer::layer(&ThrottleLayer::new(registry).store_errors(), bare());
            b.iter_custom(|iters| runtime.block_on(drive(&mut service, &one, iters)));
        });
    }
    group.finish();
}

criterion_group!(benches, store);
criterion_main!(benches);
