//! The fetch tool's logic, apart from its command line so that a test can
//! run it against loopback sites with its own client.

use std::io::{self, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use serde_json::{json, Map, Value};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::retry::RetryLayer;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_throttle::config_file::RegistryConfig;
use tower_throttle::connect::{PinServerLayer, PinnedConnector};
use tower_throttle::ip::IpScopeLayer;
use tower_throttle::redirect::{FailOnLoops, FollowRedirectLayer};
use tower_throttle::scope::MaxWait;
use tower_throttle::throttle::ThrottledBody;
use tower_throttle::waited::{WaitCause, Waited};
use tower_throttle::{BackoffLayer, Registry, RetryAfterLayer, RobotsDelayLayer, ThrottleLayer};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The most redirects one URL follows, each hop throttled.
const MAX_REDIRECTS: usize = 10;

/// What the command line sets besides the URLs and the registry.
#[derive(Debug, Clone)]
pub struct Options {
    /// Sent as `User-Agent`, and the name robots.txt groups are matched by.
    pub user_agent: String,
    /// Re-sends of a backoff response (429, 503, ...) or a failed
    /// connection, each through the throttle again.
    pub retries: u32,
    /// A progress line on stderr after this many URLs.
    pub progress_every: usize,
    /// Throttle by server address too (`ip:203.0.113.7`, configured by
    /// the registry's `[ip_scopes]`), resolving names before admission.
    pub ip_scopes: bool,
    /// The longest a URL may wait for its turn: one predicted to wait
    /// longer is not sent (see `tower_throttle::scope::MaxWait`).
    pub max_wait: Option<Duration>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            user_agent: "tower-throttle-fetch/0.1".to_owned(),
            retries: 3,
            progress_every: 10,
            ip_scopes: false,
            max_wait: None,
        }
    }
}

/// The tool's client: http and https, HTTP/1.
pub type WebClient = Client<HttpsConnector<PinnedConnector<HttpConnector>>, Full<Bytes>>;

/// A client for `http://` and `https://` URLs. It trusts Mozilla's root
/// certificates (webpki-roots, built in, so the same on every machine
/// whatever its CA store) and the certificates in the PEM file `ca_cert`
/// if given (a private CA, or a test's self-signed certificate).
///
/// # Errors
///
/// A message naming the file when it cannot be read or holds no usable
/// certificate.
pub fn web_client(ca_cert: Option<&Path>) -> Result<WebClient, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = ca_cert {
        let named = |error: &dyn std::fmt::Display| format!("--ca-cert {}: {error}", path.display());
        let certificates = CertificateDer::pem_file_iter(path)
            .map_err(|error| named(&error))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| named(&error))?;
        if certificates.is_empty() {
            return Err(named(&"no PEM certificate in the file"));
        }
        for certificate in certificates {
            roots.add(certificate).map_err(|error| named(&error))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| format!("TLS setup: {error}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    // Under TLS, so the server name stays the URL's host while the TCP
    // connection goes to the address the request was throttled for.
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let connector = HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(PinnedConnector::new(http));
    Ok(Client::builder(TokioExecutor::new()).build(connector))
}

/// The registry a config file describes, TOML or JSON by its extension.
pub fn load_registry(path: &Path) -> Result<Registry, String> {
    let text = std::fs::read_to_string(path).map_err(|err| format!("{}: {err}", path.display()))?;
    let config = match path.extension().and_then(|e| e.to_str()) {
        Some("toml") => RegistryConfig::from_toml_str(&text),
        Some("json") => RegistryConfig::from_json_str(&text),
        _ => {
            return Err(format!(
                "{}: the config file must end in .toml or .json",
                path.display()
            ))
        }
    };
    config
        .and_then(RegistryConfig::build)
        .map_err(|err| format!("{}: {err}", path.display()))
}

/// Counts for the final summary.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub urls: usize,
    pub success: usize,
    pub other_status: usize,
    pub errors: usize,
}

/// When each attempt of a request reached the client: stamped just above
/// it, below every layer, so the first stamp ends the request's wait.
#[derive(Clone, Default)]
struct SendStamps(Arc<Mutex<Vec<Instant>>>);

impl SendStamps {
    fn stamp(&self) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Instant::now());
    }

    fn all(&self) -> Vec<Instant> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Fetches every URL through RobotsDelay → Throttle → RetryAfter →
/// Backoff → `client`, with backoff responses retried through the
/// throttle; writes one JSON line per URL to `out` in completion order,
/// progress lines to `progress`.
pub async fn run<C>(
    registry: Registry,
    client: C,
    urls: impl IntoIterator<Item = String>,
    options: &Options,
    out: &mut impl Write,
    progress: &mut impl Write,
) -> io::Result<Summary>
where
    C: Service<http::Request<Full<Bytes>>, Response = http::Response<Incoming>> + Clone + Send + 'static,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
{
    let backoff = BackoffLayer::new(registry.clone());
    let stack = ServiceBuilder::new()
        // Redirects are followed above the throttle: each hop waits its turn
        // in the scope of the host it goes to; a loop or more than 10 hops
        // is an error line.
        .layer(FollowRedirectLayer::with_policy(FailOnLoops::new(MAX_REDIRECTS)))
        .map_err(Into::<BoxError>::into)
        .layer(RetryLayer::new(backoff.retry_policy(options.retries)))
        .option_layer(options.ip_scopes.then(|| IpScopeLayer::new(registry.clone())))
        .layer(RobotsDelayLayer::new(registry.clone()).user_agent(options.user_agent.clone()))
        // The crate's errors: a URL past its bound fails with its predicted
        // wait.
        .layer(ThrottleLayer::new(registry.clone()).crate_errors())
        .layer(RetryAfterLayer::new(registry.clone()))
        .layer(backoff)
        .map_request(|request: http::Request<Full<Bytes>>| {
            if let Some(stamps) = request.extensions().get::<SendStamps>() {
                stamps.stamp();
            }
            request
        })
        // Each request connects to the address its IP scope was throttled for.
        .layer(PinServerLayer::new())
        .service(client);

    let started = Instant::now();
    let mut summary = Summary::default();
    let mut running = JoinSet::new();
    for url in urls {
        let url = url.trim().to_owned();
        if url.is_empty() || url.starts_with('#') {
            continue;
        }
        let mut request = match request_for(&url, &options.user_agent) {
            Ok(request) => request,
            Err(err) => {
                let line = Fetched::failed(url, Vec::new(), format!("invalid URL: {err}")).json_line();
                report(&line, &mut summary, options, started, out, progress)?;
                continue;
            }
        };
        let scopes: Vec<String> = registry
            .scopes_of(&request)
            .iter()
            .map(|(scope, _)| scope.as_str().to_owned())
            .collect();
        let stamps = SendStamps::default();
        request.extensions_mut().insert(stamps.clone());
        if let Some(bound) = options.max_wait {
            request.extensions_mut().insert(MaxWait(bound));
        }
        let mut stack = stack.clone();
        let call_started = Instant::now();
        // Waiting here is waiting for a place among `max_queued`: part of
        // the request's wait too.
        let response = match stack.ready().await {
            Ok(ready) => ready.call(request),
            Err(err) => {
                let line = Fetched::failed(url, scopes, error_chain(&*err)).json_line();
                report(&line, &mut summary, options, started, out, progress)?;
                continue;
            }
        };
        running.spawn(async move {
            let mut retry_after = None;
            let outcome = response.await.map_err(|err| {
                retry_after = predicted_wait(&*err);
                error_chain(&*err)
            });
            let finished = Instant::now();
            // The throttle's own account of the wait, on the response head.
            let waited = outcome
                .as_ref()
                .ok()
                .map(|response| Waited::from_extensions(response.extensions()));
            let outcome = match outcome {
                Ok(response) => count_body(response).await,
                Err(err) => Err(err),
            };
            Fetched {
                url,
                scopes,
                outcome,
                call_started,
                sends: stamps.all(),
                finished,
                waited,
                retry_after,
            }
        });
        while let Some(done) = running.try_join_next() {
            report(&joined(done), &mut summary, options, started, out, progress)?;
        }
    }
    while let Some(done) = running.join_next().await {
        report(&joined(done), &mut summary, options, started, out, progress)?;
    }
    writeln!(progress, "done: {}", progress_line(&summary, started))?;
    Ok(summary)
}

fn progress_line(summary: &Summary, started: Instant) -> String {
    format!(
        "{} URLs in {:.1} s: {} answered 2xx, {} another status, {} failed",
        summary.urls,
        started.elapsed().as_secs_f64(),
        summary.success,
        summary.other_status,
        summary.errors
    )
}

/// What happened to one URL.
struct Fetched {
    url: String,
    scopes: Vec<String>,
    /// The status and the body's length, or what failed.
    outcome: Result<(http::StatusCode, u64), String>,
    /// When the tool handed the request to the stack.
    call_started: Instant,
    /// When each attempt reached the client.
    sends: Vec<Instant>,
    /// When the stack answered (response head or error).
    finished: Instant,
    /// Why the request waited, as its response says; `None` when no
    /// response came.
    waited: Option<Waited>,
    /// The predicted wait of a request not sent because it was past its
    /// bound.
    retry_after: Option<Duration>,
}

impl Fetched {
    fn failed(url: String, scopes: Vec<String>, error: String) -> Self {
        let now = Instant::now();
        Fetched {
            url,
            scopes,
            outcome: Err(error),
            call_started: now,
            sends: Vec::new(),
            finished: now,
            waited: None,
            retry_after: None,
        }
    }

    /// `waited_ms`: from the call to the first send (robots.txt, the
    /// throttle's queue, holds), measured by the tool; `latency_ms`: from
    /// the last send to the answer. Both `null` when nothing was sent.
    ///
    /// `waited`: the throttle's breakdown of the wait by cause, from the
    /// response's [`Waited`], in milliseconds keyed by
    /// each [`WaitCause`]'s name, as it displays
    /// (each cause summed over its sources); `{}` when the request went at
    /// once, `null` when no response came. It is not a split of
    /// `waited_ms`, which the tool measures itself: the record covers the
    /// last attempt only, up to the throttle's hand-over to the layers
    /// below it, so it leaves out the tool's own steps, the trip down to
    /// the client and, after a retry, the earlier attempts and the waits
    /// between them.
    fn json_line(&self) -> Value {
        let mut line = Map::new();
        line.insert("url".into(), json!(self.url));
        match &self.outcome {
            Ok((status, bytes)) => {
                line.insert("status".into(), json!(status.as_u16()));
                line.insert("bytes".into(), json!(bytes));
            }
            Err(error) => {
                line.insert("error".into(), json!(error));
                line.insert("bytes".into(), Value::Null);
            }
        }
        let millis = |span: Duration| json!((span.as_secs_f64() * 1000.0 * 10.0).round() / 10.0);
        let (waited, latency) = match (self.sends.first(), self.sends.last()) {
            (Some(first), Some(last)) => (
                millis(first.saturating_duration_since(self.call_started)),
                millis(self.finished.saturating_duration_since(*last)),
            ),
            _ => (Value::Null, Value::Null),
        };
        line.insert("latency_ms".into(), latency);
        line.insert("waited_ms".into(), waited);
        line.insert(
            "waited".into(),
            self.waited
                .as_ref()
                .map_or(Value::Null, |waited| by_cause(waited, millis)),
        );
        if let Some(wait) = self.retry_after {
            line.insert("retry_after_ms".into(), millis(wait));
        }
        line.insert("attempts".into(), json!(self.sends.len()));
        line.insert("scopes".into(), json!(self.scopes));
        Value::Object(line)
    }
}

/// `{"delay": 812.0, "lanes": 40.0}`: each cause of `waited`, summed over
/// its sources (keys in serde_json's order, by name).
fn by_cause(waited: &Waited, millis: impl Fn(Duration) -> Value) -> Value {
    let mut sums: Vec<(WaitCause, Duration)> = Vec::new();
    for (cause, _, time) in waited.causes() {
        match sums.iter_mut().find(|(known, _)| *known == cause) {
            Some((_, sum)) => *sum += time,
            None => sums.push((cause, time)),
        }
    }
    let causes: Map<String, Value> = sums
        .into_iter()
        .map(|(cause, time)| (cause.to_string(), millis(time)))
        .collect();
    Value::Object(causes)
}

fn joined(done: Result<Fetched, tokio::task::JoinError>) -> Value {
    match done {
        Ok(fetched) => fetched.json_line(),
        // The task only awaits futures that do not panic; should one, the
        // tool says so rather than losing the URL silently.
        Err(err) => json!({ "url": null, "error": format!("fetch task failed: {err}") }),
    }
}

fn report(
    line: &Value,
    summary: &mut Summary,
    options: &Options,
    started: Instant,
    out: &mut impl Write,
    progress: &mut impl Write,
) -> io::Result<()> {
    writeln!(out, "{line}")?;
    summary.urls += 1;
    match line.get("status").and_then(Value::as_u64) {
        Some(status) if (200..300).contains(&status) => summary.success += 1,
        Some(_) => summary.other_status += 1,
        None => summary.errors += 1,
    }
    if options.progress_every > 0 && summary.urls.is_multiple_of(options.progress_every) {
        writeln!(progress, "{}", progress_line(summary, started))?;
    }
    Ok(())
}

fn request_for(url: &str, user_agent: &str) -> Result<http::Request<Full<Bytes>>, BoxError> {
    let uri: http::Uri = url.parse()?;
    let web = [http::uri::Scheme::HTTP, http::uri::Scheme::HTTPS];
    if !uri.scheme().is_some_and(|scheme| web.contains(scheme)) || uri.host().is_none() {
        return Err("only absolute http:// and https:// URLs are supported".into());
    }
    Ok(http::Request::get(uri)
        .header(http::header::USER_AGENT, user_agent)
        .body(Full::new(Bytes::new()))?)
}

/// The status and the body's length, read frame by frame (never held
/// whole in memory).
async fn count_body(
    response: http::Response<ThrottledBody<Incoming>>,
) -> Result<(http::StatusCode, u64), String> {
    let status = response.status();
    let mut body = response.into_body();
    let mut bytes = 0u64;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|err| format!("reading the body: {}", error_chain(&err)))?;
        if let Some(data) = frame.data_ref() {
            bytes += data.len() as u64;
        }
    }
    Ok((status, bytes))
}

/// The wait the registry predicted for a request it did not send because
/// that wait was past the request's bound.
fn predicted_wait(err: &(dyn std::error::Error + 'static)) -> Option<Duration> {
    let mut error = Some(err);
    while let Some(current) = error {
        if let Some(throttle) = current.downcast_ref::<tower_throttle::Error>() {
            return throttle.retry_after();
        }
        error = current.source();
    }
    None
}

/// An error and its sources, joined by `: `.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
