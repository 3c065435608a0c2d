//! The embedded loopback server: every site on an address of its own
//! (`127.0.0.2`, `127.0.0.3`, ...), so the client keeps one connection pool
//! per site, as it would on the internet; the `shared` names of one server
//! on one address (shared hosting).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::time::Instant;

use crate::sites::{moved_to, Kind, Site, API_QUOTA, API_WINDOW, BUSY_SITE_RATE};

/// The most servers (addresses) the demo can start.
pub const MAX_SITES: usize = 250;

/// Starts one listener per server; returns each site's address, in the
/// order of `sites`. The listeners run until the runtime shuts down.
///
/// # Errors
///
/// When a loopback address cannot be bound, or there are more than
/// [`MAX_SITES`] sites.
pub async fn start(sites: &[Site]) -> std::io::Result<Vec<SocketAddr>> {
    let servers = sites.iter().map(|site| site.server + 1).max().unwrap_or(0);
    if servers > MAX_SITES {
        return Err(std::io::Error::other(format!(
            "{servers} servers, at most {MAX_SITES} fit on 127.0.0.x"
        )));
    }
    let mut addresses: Vec<SocketAddr> = Vec::with_capacity(sites.len());
    for (index, site) in sites.iter().enumerate() {
        // The names of one shared server share its listener.
        let earlier = sites[..index]
            .iter()
            .position(|other| other.server == site.server);
        if let Some(earlier) = earlier {
            addresses.push(addresses[earlier]);
            continue;
        }
        let ip = Ipv4Addr::new(127, 0, 0, 2 + site.server as u8);
        let listener = TcpListener::bind((ip, 0))
            .await
            .map_err(|error| std::io::Error::new(error.kind(), format!("cannot bind {ip}: {error}")))?;
        addresses.push(listener.local_addr()?);
        // A `moved` site's pages go to its `fast` site, started before it.
        let target = moved_to(&site.host).and_then(|host| {
            let fast = sites[..index].iter().position(|other| other.host == host)?;
            Some(format!("{host}:{}", addresses[fast].port()))
        });
        let server = SiteServer::new(site.kind, target);
        tokio::spawn(serve(listener, Arc::new(server)));
    }
    Ok(addresses)
}

async fn serve(listener: TcpListener, site: Arc<SiteServer>) {
    while let Ok((stream, _)) = listener.accept().await {
        let site = site.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                let site = site.clone();
                async move { Ok::<_, Infallible>(site.answer(request.uri().path()).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// One site's behaviour and the little state its limits need.
struct SiteServer {
    kind: Kind,
    /// `moved`: the host and port its pages moved to.
    moved_to: Option<String>,
    /// `busy`: when the requests it accepted in the last second arrived.
    recent: Mutex<VecDeque<Instant>>,
    /// `api`: the current quota window's start and the requests it used.
    window: Mutex<Option<(Instant, u32)>>,
}

impl SiteServer {
    fn new(kind: Kind, moved_to: Option<String>) -> Self {
        SiteServer {
            kind,
            moved_to,
            recent: Mutex::default(),
            window: Mutex::default(),
        }
    }

    async fn answer(&self, path: &str) -> http::Response<Full<Bytes>> {
        tokio::time::sleep(self.kind.latency()).await;
        if path == "/robots.txt" {
            return match self.kind.robots_txt() {
                Some(robots_txt) => respond(200, robots_txt),
                None => respond(404, ""),
            };
        }
        match self.kind {
            Kind::Busy => self.answer_busy(),
            Kind::Api => self.answer_api(),
            Kind::Moved => self.answer_moved(path),
            _ => respond(200, "a page"),
        }
    }

    /// `301 Moved Permanently` to the same path on the host the site moved
    /// to; `404` if it has none (its `fast` site is not in the crawl).
    fn answer_moved(&self, path: &str) -> http::Response<Full<Bytes>> {
        match &self.moved_to {
            Some(target) => with_headers(
                respond(301, "moved"),
                &[("location", format!("http://{target}{path}"))],
            ),
            None => respond(404, "moved away"),
        }
    }

    /// At most [`BUSY_SITE_RATE`] pages in any rolling second; above it,
    /// 429 + `Retry-After: 1`.
    fn answer_busy(&self) -> http::Response<Full<Bytes>> {
        let now = Instant::now();
        let mut recent = self.recent.lock().unwrap();
        while recent
            .front()
            .is_some_and(|&at| now.duration_since(at) >= Duration::from_secs(1))
        {
            recent.pop_front();
        }
        if recent.len() >= BUSY_SITE_RATE {
            return with_headers(respond(429, "slow down"), &[("retry-after", "1".to_owned())]);
        }
        recent.push_back(now);
        respond(200, "a page")
    }

    /// [`API_QUOTA`] requests per fixed [`API_WINDOW`], announced on every
    /// answer; 429 + `Retry-After` once it is spent.
    fn answer_api(&self) -> http::Response<Full<Bytes>> {
        let now = Instant::now();
        let mut window = self.window.lock().unwrap();
        let (started, used) = (*window)
            .filter(|(started, _)| now.duration_since(*started) < API_WINDOW)
            .unwrap_or((now, 0));
        let reset = API_WINDOW.saturating_sub(now.duration_since(started));
        // Rounded up, so a client that waits what it is told is never early.
        let reset_secs = reset.as_secs() + u64::from(reset.subsec_nanos() > 0);
        let policy = (
            "ratelimit-policy",
            format!("\"default\";q={API_QUOTA};w={}", API_WINDOW.as_secs()),
        );
        if used >= API_QUOTA {
            *window = Some((started, used));
            return with_headers(
                respond(429, "quota spent"),
                &[
                    policy,
                    ("ratelimit", format!("\"default\";r=0;t={reset_secs}")),
                    ("retry-after", reset_secs.to_string()),
                ],
            );
        }
        *window = Some((started, used + 1));
        let remaining = API_QUOTA - used - 1;
        with_headers(
            respond(200, "{\"items\": []}"),
            &[
                policy,
                ("ratelimit", format!("\"default\";r={remaining};t={reset_secs}")),
            ],
        )
    }
}

fn respond(status: u16, body: &str) -> http::Response<Full<Bytes>> {
    let mut response = http::Response::new(Full::new(Bytes::from(body.to_owned())));
    *response.status_mut() = http::StatusCode::from_u16(status).expect("a valid status");
    response
}

fn with_headers(
    mut response: http::Response<Full<Bytes>>,
    headers: &[(&'static str, String)],
) -> http::Response<Full<Bytes>> {
    for (name, value) in headers {
        let value = http::HeaderValue::from_str(value).expect("ASCII header values");
        response.headers_mut().insert(*name, value);
    }
    response
}
