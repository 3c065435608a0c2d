//! A fleet of workers sharing a scope's lanes through a store: how many
//! requests each worker sent in each window (for the fairness tests, in
//! paused time against `MemoryStore` and in real time against Redis).

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_throttle::{Registry, Scopes, ThrottleLayer};

/// One worker of the run: its registry, how many request loops it runs,
/// the scopes of its requests, and how long each loop pauses between an
/// answer and its next request.
pub struct Loops {
    pub registry: Registry,
    pub loops: usize,
    pub scopes: Vec<&'static str>,
    pub pause: Duration,
}

/// Runs every worker's loops for `windows` windows, each request taking
/// `latency` in the inner service, and counts each worker's sends per
/// window: `counts[window][worker]`.
pub async fn sends_per_window(
    workers: Vec<Loops>,
    latency: Duration,
    window: Duration,
    windows: usize,
) -> Vec<Vec<usize>> {
    let count = workers.len();
    let sends: Arc<Mutex<Vec<(Duration, usize)>>> = Arc::default();
    let start = Instant::now();
    let end = start + window * windows as u32;
    let runs = workers.into_iter().enumerate().map(|(index, worker)| {
        let sends = sends.clone();
        tokio::spawn(async move {
            let client = ServiceBuilder::new()
                .layer(ThrottleLayer::new(worker.registry).store_errors())
                .service(tower::service_fn(move |_request: http::Request<()>| {
                    let sends = sends.clone();
                    async move {
                        sends.lock().unwrap().push((start.elapsed(), index));
                        tokio::time::sleep(latency).await;
                        Ok::<_, Infallible>(http::Response::new(()))
                    }
                }));
            let scopes = worker.scopes.clone();
            let each = (0..worker.loops).map(|_| {
                let (client, scopes) = (client.clone(), scopes.clone());
                async move {
                    while Instant::now() < end {
                        let mut request = http::Request::get("http://fleet.test/").body(()).unwrap();
                        request.extensions_mut().insert(Scopes::from(scopes.clone()));
                        client.clone().oneshot(request).await.unwrap();
                        tokio::time::sleep(worker.pause).await;
                    }
                }
            });
            futures::future::join_all(each).await;
        })
    });
    for run in futures::future::join_all(runs).await {
        run.unwrap();
    }
    let mut counts = vec![vec![0; count]; windows];
    for (at, index) in sends.lock().unwrap().iter() {
        let window_index = (at.as_nanos() / window.as_nanos()) as usize;
        if let Some(window_counts) = counts.get_mut(window_index) {
            window_counts[*index] += 1;
        }
    }
    counts
}
