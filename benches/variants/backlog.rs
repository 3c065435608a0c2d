//! The `backlog` workload: requests that wait. Many requests spawned at
//! once against 64 lanes, through the throttle and through a tokio
//! semaphore; the `overhead` bench times it, the `instructions` example
//! counts its instructions.

use std::time::{Duration, Instant};

use tower::{Layer, Service, ServiceExt};
use tower_throttle::throttle::ThrottledBody;
use tower_throttle::{Registry, ScopeConfig, ThrottleLayer};

/// A backlog's in-flight limit: `loadtest` (b)'s, an API client's.
pub const BACKLOG_LANES: usize = 64;

/// Spawns `count` requests at once on the current thread, each a task
/// calling its own clone of `service`, and waits for them all: a backlog
/// far deeper than the lanes, so nearly every request waits.
pub async fn drive_backlog<S, B>(service: &S, uri: &http::Uri, count: usize) -> Duration
where
    S: Service<http::Request<()>, Response = http::Response<B>> + Clone + 'static,
    B: Send + 'static,
    S::Error: std::fmt::Debug,
{
    let tasks = tokio::task::LocalSet::new();
    tasks
        .run_until(async {
            let start = Instant::now();
            let spawned: Vec<_> = (0..count)
                .map(|_| {
                    let service = service.clone();
                    let request = super::request(uri);
                    tokio::task::spawn_local(async move { service.oneshot(request).await.unwrap() })
                })
                .collect();
            for task in spawned {
                std::hint::black_box(task.await.unwrap());
            }
            start.elapsed()
        })
        .await
}

/// The inner service of the backlog: answers after one yield, so the
/// request is in flight across a turn of the runtime.
fn yielding(
) -> impl Service<http::Request<()>, Response = http::Response<()>, Error = std::convert::Infallible>
       + Clone
       + 'static {
    tower::service_fn(|_request: http::Request<()>| async {
        tokio::task::yield_now().await;
        Ok(http::Response::new(()))
    })
}

/// The throttle over [`yielding`]: one scope of `BACKLOG_LANES` lanes,
/// delay 0, and queue places for half the backlog (the other half waits
/// in `poll_ready`).
pub fn backlog_throttle(
    count: usize,
) -> impl Service<http::Request<()>, Response = http::Response<ThrottledBody<()>>, Error = tower::BoxError>
       + Clone
       + 'static {
    let lanes = BACKLOG_LANES as u32;
    let registry = Registry::builder()
        .max_concurrency(lanes)
        .max_queued(count / 2)
        .default_scope(
            ScopeConfig::default()
                .concurrency(lanes)
                .delay(Duration::ZERO)
                .delay_per_slot(Duration::ZERO)
                .jitter(0.0),
        )
        .build()
        .unwrap();
    tower::ServiceExt::map_err(ThrottleLayer::new(registry).layer(yielding()), Into::into)
}

/// The peer: a tokio semaphore of `BACKLOG_LANES` permits held across the
/// inner call, as `loadtest`'s bare client holds one.
pub fn backlog_semaphore(
) -> impl Service<http::Request<()>, Response = http::Response<()>, Error = tower::BoxError> + Clone + 'static
{
    let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(BACKLOG_LANES));
    let inner = yielding();
    tower::service_fn(move |request: http::Request<()>| {
        let (permits, inner) = (permits.clone(), inner.clone());
        async move {
            let _permit = permits.acquire_owned().await?;
            Ok::<_, tower::BoxError>(inner.oneshot(request).await?)
        }
    })
}
