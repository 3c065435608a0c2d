//! A fleet of workers sharing one politeness budget through Redis.
//!
//! Starts `--workers` workers (separate registries, each with its own
//! hyper-util client and Redis connection, as separate processes would
//! have) that crawl `--sites` loopback sites together, every site with
//! concurrency 1 and a delay of `--delay-ms` (50 ms). The server records
//! every arrival; the example prints, per site, the combined send rate and
//! the smallest gap between two arrivals against the configured delay (and
//! how far apart those two requests left the client, and the smallest gap
//! between any two sends, so a short gap can be told apart: the throttle's
//! or the path's), and exits non-zero if the fleet broke a limit (a gap
//! below the delay − 2 ms, or two requests of a site at once).
//!
//! Then it measures admissions per second through the Redis store (an
//! in-process inner service, delay 0, lanes to spare: only the store's
//! round trip and bookkeeping) against the same registry without a store.
//!
//! ```text
//! redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save ''
//! cargo run --release --example fleet --features redis
//! REDIS_URL=redis://10.0.0.5:6379 cargo run --release --example fleet --features redis -- --workers 8
//! ```

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_throttle::store::RedisStore;
use tower_throttle::{Registry, ScopeConfig, ThrottleLayer};

struct Settings {
    workers: usize,
    sites: usize,
    requests_per_site: usize,
    delay: Duration,
    admissions: usize,
}

fn settings() -> Result<Settings, String> {
    let mut settings = Settings {
        workers: 4,
        sites: 3,
        requests_per_site: 40,
        delay: Duration::from_millis(50),
        admissions: 5_000,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number: u64 = value
            .parse()
            .map_err(|_| format!("{flag} = {value:?}: not a whole number"))?;
        match flag.as_str() {
            "--workers" => settings.workers = number.max(1) as usize,
            "--sites" => settings.sites = number.clamp(1, 200) as usize,
            "--requests-per-site" => settings.requests_per_site = number.max(2) as usize,
            "--delay-ms" => settings.delay = Duration::from_millis(number),
            "--admissions" => settings.admissions = number.max(1) as usize,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(settings)
}

/// What the loopback server saw, per site (the `Host` header): arrival
/// instants with their paths; and when each request left the client, per
/// site and path.
#[derive(Default)]
struct Arrivals {
    by_site: Mutex<HashMap<String, Vec<(Instant, String)>>>,
    departures: Mutex<HashMap<(String, String), Instant>>,
    in_flight: Mutex<HashMap<String, usize>>,
    overlaps: AtomicUsize,
}

/// Serves one site on `ip` (each site its own loopback address, so each is
/// its own scope and has its own connections).
async fn serve(ip: [u8; 4], arrivals: Arc<Arrivals>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::from(ip), 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let arrivals = arrivals.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                        let arrivals = arrivals.clone();
                        async move {
                            let site = request
                                .headers()
                                .get(http::header::HOST)
                                .and_then(|host| host.to_str().ok())
                                .unwrap_or_default()
                                .to_owned();
                            arrivals
                                .by_site
                                .lock()
                                .unwrap()
                                .entry(site.clone())
                                .or_default()
                                .push((Instant::now(), request.uri().path().to_owned()));
                            let at_once = {
                                let mut in_flight = arrivals.in_flight.lock().unwrap();
                                let count = in_flight.entry(site.clone()).or_default();
                                *count += 1;
                                *count
                            };
                            if at_once > 1 {
                                arrivals.overlaps.fetch_add(1, Ordering::Relaxed);
                            }
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            *arrivals.in_flight.lock().unwrap().get_mut(&site).unwrap() -= 1;
                            Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(b"ok"))))
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// Serves the sites on a thread and runtime of their own, as real sites
/// are other processes: the workers' tasks cannot delay the arrival
/// instants the server records.
async fn serve_apart(count: usize, arrivals: Arc<Arrivals>) -> Vec<SocketAddr> {
    let (addresses, received) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let mut sites = Vec::new();
            for site in 0..count {
                sites.push(serve([127, 0, 0, 2 + site as u8], arrivals.clone()).await);
            }
            let _ = addresses.send(sites);
            std::future::pending::<()>().await;
        });
    });
    received.await.unwrap()
}

fn redis_store(url: &str, prefix: &str) -> RedisStore {
    RedisStore::new(url)
        .unwrap_or_else(|error| panic!("REDIS_URL: {error}"))
        .prefix(prefix)
}

/// Every worker crawls a share of every site's pages; returns whether the
/// fleet kept every limit.
async fn crawl(settings: &Settings, url: &str, prefix: &str) -> bool {
    let arrivals = Arc::new(Arrivals::default());
    let sites = serve_apart(settings.sites, arrivals.clone()).await;
    let started = Instant::now();
    let workers = (0..settings.workers).map(|worker| {
        let registry = Registry::builder()
            .default_scope(
                ScopeConfig::default()
                    .concurrency(1)
                    .delay(settings.delay)
                    .delay_per_slot(Duration::ZERO)
                    .jitter(0.0),
            )
            .store(redis_store(url, prefix))
            .build()
            .unwrap();
        let departures = arrivals.clone();
        let client = ServiceBuilder::new()
            .layer(ThrottleLayer::new(registry).store_errors())
            // Stamps each send in the poll in which the throttle hands it on.
            .map_request(move |request: http::Request<Full<Bytes>>| {
                let site = request
                    .uri()
                    .authority()
                    .map(|a| a.to_string())
                    .unwrap_or_default();
                let path = request.uri().path().to_owned();
                departures
                    .departures
                    .lock()
                    .unwrap()
                    .insert((site, path), Instant::now());
                request
            })
            .service(
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .build_http::<Full<Bytes>>(),
            );
        let pages: Vec<String> = sites
            .iter()
            .flat_map(|site| {
                (0..settings.requests_per_site)
                    .filter(move |page| page % settings.workers == worker)
                    .map(move |page| format!("http://{site}/{page}"))
            })
            .collect();
        async move {
            // Each answer is dropped as it comes: a lane is busy until then.
            let requests = pages.into_iter().map(|uri| {
                let request = http::Request::get(uri).body(Full::default()).unwrap();
                let client = client.clone();
                async move { client.oneshot(request).await.map(drop) }
            });
            futures::future::join_all(requests).await
        }
    });
    let mut failures = 0;
    for answers in futures::future::join_all(workers).await {
        failures += answers.iter().filter(|answer| answer.is_err()).count();
    }
    let elapsed = started.elapsed();
    let bound = settings.delay.saturating_sub(Duration::from_millis(2));
    let mut kept = failures == 0 && arrivals.overlaps.load(Ordering::Relaxed) == 0;
    println!(
        "{} workers, {} sites, delay {:?}: {} requests in {:.2} s ({failures} failed, {} overlaps)",
        settings.workers,
        settings.sites,
        settings.delay,
        settings.sites * settings.requests_per_site,
        elapsed.as_secs_f64(),
        arrivals.overlaps.load(Ordering::Relaxed)
    );
    let mut by_site: Vec<_> = arrivals.by_site.lock().unwrap().clone().into_iter().collect();
    by_site.sort();
    let departures = arrivals.departures.lock().unwrap();
    for (site, mut seen) in by_site {
        seen.sort();
        let sent = |path: &String| departures[&(site.clone(), path.clone())];
        // Each gap at the server, with the gap between the same two sends:
        // the difference is the two requests' path lags (client runtime,
        // kernel, server), which the throttle does not see.
        let gaps: Vec<(Duration, Duration)> = seen
            .windows(2)
            .map(|pair| {
                let (first, second) = (sent(&pair[0].1), sent(&pair[1].1));
                (pair[1].0 - pair[0].0, second.max(first) - second.min(first))
            })
            .collect();
        let (smallest, its_sends) = gaps.iter().min().copied().unwrap_or_default();
        let smallest_sends = gaps.iter().map(|(_, sends)| *sends).min().unwrap_or_default();
        let span = seen.last().unwrap().0.duration_since(seen[0].0).as_secs_f64();
        let rate = (seen.len() - 1) as f64 / span.max(1e-9);
        let ok = smallest >= bound;
        kept &= ok;
        println!(
            "  {site}: {} arrivals, {rate:.1}/s (bound {:.1}/s), smallest gap {:.2} ms (bound {:.2} ms; \
             those two were sent {:.2} ms apart), smallest gap between sends {:.2} ms {}",
            seen.len(),
            1.0 / settings.delay.as_secs_f64(),
            smallest.as_secs_f64() * 1e3,
            bound.as_secs_f64() * 1e3,
            its_sends.as_secs_f64() * 1e3,
            smallest_sends.as_secs_f64() * 1e3,
            if ok { "ok" } else { "BROKEN" }
        );
    }
    kept
}

/// Requests per second through a throttle over an in-process service,
/// `concurrent` at a time.
async fn admissions_per_second(registry: Registry, total: usize, concurrent: usize) -> f64 {
    let mut client = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry).store_errors())
        .service(tower::service_fn(|_request: http::Request<()>| async {
            Ok::<_, Infallible>(http::Response::new(()))
        }));
    let started = Instant::now();
    let mut in_flight = futures::stream::FuturesUnordered::new();
    let mut sent = 0;
    use futures::StreamExt;
    while sent < total || !in_flight.is_empty() {
        while sent < total && in_flight.len() < concurrent {
            let request = http::Request::get("http://bench.test/").body(()).unwrap();
            let ready = client.ready().await.unwrap();
            in_flight.push(ready.call(request));
            sent += 1;
        }
        if let Some(answer) = in_flight.next().await {
            answer.unwrap();
        }
    }
    total as f64 / started.elapsed().as_secs_f64()
}

async fn measure_admissions(settings: &Settings, url: &str, prefix: &str) {
    let config = ScopeConfig::default()
        .concurrency(1_000)
        .delay(Duration::ZERO)
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0);
    for concurrent in [1, 32] {
        let local = Registry::builder()
            .max_concurrency(1_000)
            .default_scope(config.clone())
            .build()
            .unwrap();
        let shared = Registry::builder()
            .max_concurrency(1_000)
            .default_scope(config.clone())
            .store(redis_store(url, prefix))
            .build()
            .unwrap();
        let without = admissions_per_second(local, settings.admissions, concurrent).await;
        let with = admissions_per_second(shared, settings.admissions, concurrent).await;
        println!(
            "admissions, {concurrent} at a time: {with:.0}/s through Redis, {without:.0}/s in memory; \
             {:.0} µs per request through Redis, {:.1} µs in memory",
            concurrent as f64 / with * 1e6,
            concurrent as f64 / without * 1e6
        );
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    // Warnings (a setting that can never take effect, a hold capped) go to
    // `tracing`: print them on stderr (RUST_LOG=debug shows more).
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::builder()
                .with_default_directive(tracing_subscriber::filter::LevelFilter::WARN.into())
                .from_env_lossy(),
        )
        .with_writer(std::io::stderr)
        .init();
    let settings = match settings() {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::from(2);
        }
    };
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let prefix = format!("fleet-example:{:016x}:", fastrand::u64(..));
    let kept = crawl(&settings, &url, &prefix).await;
    measure_admissions(&settings, &url, &prefix).await;
    if kept {
        ExitCode::SUCCESS
    } else {
        eprintln!("the fleet broke a limit");
        ExitCode::FAILURE
    }
}
