//! Rampup against a real rate limiter: nginx `limit_req` at R requests/s
//! with no burst, which answers 429 to anything faster. The crawler is not
//! told R. Prints, per rampup window, what nginx accepted and rejected, and
//! the settled figures the crate aims at (≥ 90 % of R served, ≤ 2 %
//! rejected; docs/performance.md).
//!
//! ```text
//! apt-get install -y nginx-light      # once; the bench skips without nginx
//! cargo bench --bench rampup_nginx    # about two minutes of real time
//! RAMPUP_RATE=50 RAMPUP_SECONDS=180 cargo bench --bench rampup_nginx
//! RAMPUP_WORKERS=4 RAMPUP_SECONDS=180 cargo bench --bench rampup_nginx --features redis
//! ```
//!
//! `RAMPUP_WORKERS=N` runs N workers, each with its own registry, Redis
//! connection and hyper-util client, sharing one `RedisStore` (feature
//! `redis`, a Redis on 127.0.0.1:6379), all crawling the one site. The
//! last line is for scripts: `rampup workers=N rate=R served=..% rejected=..%
//! learning=shared|alone` (the settled second half). The workers search
//! for the rate together (`RegistryBuilder::fleet_learning`, the default);
//! `RAMPUP_LEARNING=alone` makes each search on its own, as before.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_throttle::registry::RampupConfig;
use tower_throttle::{BackoffLayer, Registry, ScopeConfig, ThrottleLayer};

const WINDOW: Duration = Duration::from_secs(5);

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Nginx {
    child: Child,
    dir: PathBuf,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_nginx(rate: u64, port: u16) -> Option<Nginx> {
    let binary = ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())?;
    let dir = std::env::temp_dir().join(format!("tower-throttle-nginx-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("www")).ok()?;
    std::fs::write(dir.join("www/index.html"), "ok\n").ok()?;
    // One process, no master: killing the child stops nginx entirely (a
    // killed master would leave its workers running). With
    // `RAMPUP_ACCESS_LOG=PATH`, nginx logs each request's arrival (`$msec`,
    // its clock at the request's read) and status there.
    let access_log = match std::env::var("RAMPUP_ACCESS_LOG") {
        Ok(path) => format!("log_format arrivals '$msec $status';\n  access_log {path} arrivals;"),
        Err(_) => "access_log off;".to_owned(),
    };
    let config = format!(
        "master_process off;\ndaemon off;\npid {dir}/nginx.pid;\nerror_log {dir}/error.log;\n\
         events {{ worker_connections 1024; }}\n\
         http {{\n  {access_log}\n  client_body_temp_path {dir};\n  proxy_temp_path {dir};\n  fastcgi_temp_path {dir};\n  uwsgi_temp_path {dir};\n  scgi_temp_path {dir};\n\
         limit_req_zone $server_name zone=api:1m rate={rate}r/s;\n\
         server {{\n    listen 127.0.0.1:{port};\n    server_name api.test;\n    root {dir}/www;\n\
         location / {{ limit_req zone=api; limit_req_status 429; try_files /index.html =404; }}\n  }}\n}}\n",
        dir = dir.display()
    );
    std::fs::write(dir.join("nginx.conf"), config).ok()?;
    let child = Command::new(binary)
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .arg("-p")
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    Some(Nginx { child, dir })
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes `--bench`; `cargo bench --no-run` never runs this.
    let rate = env_or("RAMPUP_RATE", 20);
    let seconds = env_or("RAMPUP_SECONDS", 120);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let Some(_nginx) = start_nginx(rate, port) else {
        println!("rampup_nginx: skipped, nginx is not installed (apt-get install -y nginx-light)");
        return;
    };
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    for _ in 0..50 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let workers = env_or("RAMPUP_WORKERS", 1).max(1) as usize;
    let Some(registries) = worker_registries(workers) else {
        println!("rampup_nginx: RAMPUP_WORKERS={workers} needs a shared store: run with --features redis and a Redis on 127.0.0.1:6379");
        return;
    };

    let windows = (seconds / WINDOW.as_secs()) as usize;
    let accepted: Arc<Vec<AtomicU32>> = Arc::new((0..=windows).map(|_| AtomicU32::new(0)).collect());
    let rejected: Arc<Vec<AtomicU32>> = Arc::new((0..=windows).map(|_| AtomicU32::new(0)).collect());
    let start = Instant::now();
    let end = start + Duration::from_secs(seconds);
    let counts = Counts {
        accepted: accepted.clone(),
        rejected: rejected.clone(),
        windows,
        start,
    };
    let crawls = registries
        .iter()
        .map(|registry| crawl(registry.clone(), port, end, counts.clone()));
    futures::future::join_all(crawls).await;

    println!("nginx limit_req rate={rate}r/s, no burst; rampup window {WINDOW:?}; {seconds} s; {workers} worker(s)");
    println!("window  accepted/s  rejected");
    let load = |v: &AtomicU32| v.load(Ordering::Relaxed);
    for w in 0..windows {
        println!(
            "{w:>6}  {:>10.2}  {:>8}",
            f64::from(load(&accepted[w])) / WINDOW.as_secs_f64(),
            load(&rejected[w])
        );
    }
    let settled = windows / 2..windows;
    let served: u32 = settled.clone().map(|w| load(&accepted[w])).sum();
    let refused: u32 = settled.clone().map(|w| load(&rejected[w])).sum();
    let span = settled.len() as f64 * WINDOW.as_secs_f64();
    println!(
        "settled (second half): served {:.2} req/s = {:.1} % of R, rejected {:.2} % of requests",
        f64::from(served) / span,
        100.0 * f64::from(served) / span / rate as f64,
        100.0 * f64::from(refused) / f64::from((served + refused).max(1))
    );
    for (index, registry) in registries.iter().enumerate() {
        let stats = registry.scope_stats("127.0.0.1").unwrap();
        println!(
            "worker {index}: rampup delay {:?}, {} windows, {} backoff feedbacks",
            stats.rampup_delay, stats.rampup_windows, stats.backoff_feedbacks
        );
    }
    println!(
        "rampup workers={workers} rate={rate} served={:.1}% rejected={:.2}% learning={}",
        100.0 * f64::from(served) / span / rate as f64,
        100.0 * f64::from(refused) / f64::from((served + refused).max(1)),
        if learning_together() { "shared" } else { "alone" }
    );
}

/// Where each answer is counted: per rampup window, accepted or rejected.
#[derive(Clone)]
struct Counts {
    accepted: Arc<Vec<AtomicU32>>,
    rejected: Arc<Vec<AtomicU32>>,
    windows: usize,
    start: Instant,
}

/// The scope every worker crawls with: one lane, 1 s to start, rampup.
fn rampup_scope() -> ScopeConfig {
    ScopeConfig::default()
        .concurrency(1)
        .delay(Duration::from_secs(1))
        .rampup(RampupConfig::default().window(WINDOW))
}

/// One registry for one worker; for several, one each, sharing a
/// `RedisStore` (a fresh key prefix per run). `None` when several are asked
/// for without the `redis` feature.
fn worker_registries(workers: usize) -> Option<Vec<Registry>> {
    if workers == 1 {
        return Some(vec![Registry::builder()
            .default_scope(rampup_scope())
            .build()
            .unwrap()]);
    }
    shared_registries(workers)
}

#[cfg(feature = "redis")]
fn shared_registries(workers: usize) -> Option<Vec<Registry>> {
    let prefix = format!("rampup-bench-{}:", std::process::id());
    (0..workers)
        .map(|_| {
            let store = tower_throttle::store::RedisStore::new("redis://127.0.0.1:6379")
                .ok()?
                .prefix(&prefix);
            Registry::builder()
                .default_scope(rampup_scope())
                .store(store)
                .fleet_learning(learning_together())
                .build()
                .ok()
        })
        .collect()
}

/// Whether the workers learn together (`RAMPUP_LEARNING`, `shared` by
/// default, or `alone`).
fn learning_together() -> bool {
    std::env::var("RAMPUP_LEARNING").as_deref() != Ok("alone")
}

#[cfg(not(feature = "redis"))]
fn shared_registries(_workers: usize) -> Option<Vec<Registry>> {
    None
}

/// One worker's crawl until `end`: its own registry and hyper-util client,
/// at most 32 requests in flight, each answer counted.
async fn crawl(registry: Registry, port: u16, end: Instant, counts: Counts) {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut service = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(BackoffLayer::new(registry))
        .service(client);
    let mut handles = Vec::new();
    while Instant::now() < end {
        service.ready().await.unwrap();
        let request = http::Request::get(format!("http://127.0.0.1:{port}/"))
            .header(http::header::HOST, "api.test")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let future = service.call(request);
        let counts = counts.clone();
        handles.push(tokio::spawn(async move {
            let response = future.await.expect("nginx answers");
            let window = ((Instant::now() - counts.start).as_secs_f64() / WINDOW.as_secs_f64()) as usize;
            let counter = if response.status() == 429 {
                &counts.rejected
            } else {
                &counts.accepted
            };
            counter[window.min(counts.windows)].fetch_add(1, Ordering::Relaxed);
            response.into_body().collect().await.ok();
        }));
        if handles.len() >= 32 {
            handles.remove(0).await.unwrap();
        }
    }
    for handle in handles {
        handle.await.unwrap();
    }
}
