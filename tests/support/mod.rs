//! Shared test helpers: an in-process recording service (for exact virtual
//! instants) and a loopback hyper server (for real-socket tests).
#![allow(dead_code, unreachable_pub)]

pub mod bounds;
pub mod fleet_share;
pub mod kernel_stamps;
pub mod tls;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use tokio::time::Instant;

/// One request as the inner service saw it.
#[derive(Debug, Clone)]
pub struct Sent {
    /// The request path (tests use it as a label).
    pub path: String,
    /// The scope host.
    pub host: String,
    /// When the inner service was called, relative to the recorder's start.
    pub at: Duration,
}

/// Records every call of the inner service, with its virtual instant.
#[derive(Clone)]
pub struct Recorder {
    start: Instant,
    sent: Arc<Mutex<Vec<Sent>>>,
}

impl Recorder {
    pub fn new() -> Self {
        Recorder {
            start: Instant::now(),
            sent: Arc::default(),
        }
    }

    /// An inner service that records each call and answers after `latency`.
    pub fn service(
        &self,
        latency: Duration,
    ) -> impl tower::Service<
        http::Request<()>,
        Response = http::Response<()>,
        Error = Infallible,
        Future = impl Future<Output = Result<http::Response<()>, Infallible>> + Send,
    > + Clone
           + Send {
        self.service_by(move |_| latency)
    }

    /// An inner service that records each call and answers after
    /// `latency_of` the request.
    pub fn service_by(
        &self,
        latency_of: impl Fn(&http::Request<()>) -> Duration + Clone + Send,
    ) -> impl tower::Service<
        http::Request<()>,
        Response = http::Response<()>,
        Error = Infallible,
        Future = impl Future<Output = Result<http::Response<()>, Infallible>> + Send,
    > + Clone
           + Send {
        let recorder = self.clone();
        tower::service_fn(move |request: http::Request<()>| {
            recorder.record(&request);
            let latency = latency_of(&request);
            async move {
                if !latency.is_zero() {
                    tokio::time::sleep(latency).await;
                }
                Ok::<_, Infallible>(http::Response::new(()))
            }
        })
    }

    pub fn record(&self, request: &http::Request<()>) {
        self.sent.lock().unwrap().push(Sent {
            path: request.uri().path().to_owned(),
            host: request.uri().host().unwrap_or_default().to_owned(),
            at: self.start.elapsed(),
        });
    }

    pub fn sent(&self) -> Vec<Sent> {
        self.sent.lock().unwrap().clone()
    }

    /// Send instants in milliseconds, in send order.
    pub fn millis(&self) -> Vec<u128> {
        self.sent().iter().map(|sent| sent.at.as_millis()).collect()
    }

    /// Send instants in milliseconds of requests whose path starts with `prefix`.
    pub fn millis_of(&self, prefix: &str) -> Vec<u128> {
        self.sent()
            .iter()
            .filter(|sent| sent.path.starts_with(prefix))
            .map(|sent| sent.at.as_millis())
            .collect()
    }
}

/// Send instants by key (a host, say), each key's sorted.
pub fn instants_by(
    sent: &[Sent],
    key: impl Fn(&Sent) -> String,
) -> std::collections::HashMap<String, Vec<Duration>> {
    let mut by: std::collections::HashMap<String, Vec<Duration>> = std::collections::HashMap::new();
    for one in sent {
        by.entry(key(one)).or_default().push(one.at);
    }
    for instants in by.values_mut() {
        instants.sort();
    }
    by
}

pub fn get(uri: &str) -> http::Request<()> {
    http::Request::get(uri).body(()).unwrap()
}

/// A loopback HTTP/1 server. `handler` answers each request.
pub async fn serve<H, F>(handler: H) -> SocketAddr
where
    H: Fn(http::Request<hyper::body::Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = http::Response<Full<Bytes>>> + Send + 'static,
{
    serve_at(SocketAddr::from(([127, 0, 0, 1], 0)), handler).unwrap()
}

/// [`serve`] on `address` (another loopback address, a given port); an
/// error when it cannot be bound (the port is taken).
pub fn serve_at<H, F>(address: SocketAddr, handler: H) -> std::io::Result<SocketAddr>
where
    H: Fn(http::Request<hyper::body::Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = http::Response<Full<Bytes>>> + Send + 'static,
{
    let listener = std::net::TcpListener::bind(address)?;
    kernel_stamps::receive_stamps::enable_on_listener(&listener);
    listener.set_nonblocking(true).unwrap();
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let addr = listener.local_addr()?;
    let clock = kernel_stamps::RealtimeClock::sample();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let handler = handler.clone();
            let stamp = Arc::new(kernel_stamps::KernelStamp::default());
            let stream = kernel_stamps::receive_stamps::wrap(stream, stamp.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |mut request: http::Request<_>| {
                    // Taken for every request: it lets the next read stamp the next one.
                    let kernel = stamp.take().map(|since_epoch| clock.instant(since_epoch));
                    request.extensions_mut().insert(KernelArrival(kernel));
                    let response = handler(request);
                    async move { Ok::<_, Infallible>(response.await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(addr)
}

/// When the site's kernel received a request's head (`SO_TIMESTAMPNS`,
/// mapped onto the `Instant` timeline), before any thread of the site ran:
/// a request extension [`serve`] sets. `None` off Linux, or when the kernel
/// gave no stamp.
#[derive(Clone, Copy, Debug)]
pub struct KernelArrival(pub Option<std::time::Instant>);

impl KernelArrival {
    /// The kernel's stamp of `request`, else the clock now (the site
    /// thread's view, later by however long that thread took to run).
    pub fn of<B>(request: &http::Request<B>) -> std::time::Instant {
        request
            .extensions()
            .get::<KernelArrival>()
            .and_then(|arrival| arrival.0)
            .unwrap_or_else(std::time::Instant::now)
    }
}

/// Resolves every host name to 127.0.0.1, so tests and the demo can crawl
/// virtual sites (`http://books.toscrape.test:PORT/`) served on loopback.
#[derive(Clone, Debug, Default)]
pub struct LoopbackResolver;

impl tower::Service<hyper_util::client::legacy::connect::dns::Name> for LoopbackResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _name: hyper_util::client::legacy::connect::dns::Name) -> Self::Future {
        std::future::ready(Ok(vec![SocketAddr::from(([127, 0, 0, 1], 0))].into_iter()))
    }
}

pub type LoopbackClient<B = Full<Bytes>> = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector<LoopbackResolver>,
    B,
>;

/// A real hyper-util client whose every host resolves to loopback.
pub fn loopback_client() -> LoopbackClient {
    loopback_client_for()
}

/// [`loopback_client`] for requests with bodies of type `B` (say, a
/// `departure::StampedBody`).
pub fn loopback_client_for<B>() -> LoopbackClient<B>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
{
    let connector = hyper_util::client::legacy::connect::HttpConnector::new_with_resolver(LoopbackResolver);
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(connector)
}

pub fn text(body: impl Into<String>) -> http::Response<Full<Bytes>> {
    http::Response::new(Full::new(Bytes::from(body.into())))
}

/// A real hyper HTTP/1 client talking to a real hyper server through an
/// in-memory duplex pipe, one connection per request. No socket is
/// involved, so paused virtual time stays exact (the runtime is never idle
/// while bytes are in flight).
pub fn duplex_service<H, F>(
    handler: H,
) -> impl tower::Service<
    http::Request<Full<Bytes>>,
    Response = http::Response<hyper::body::Incoming>,
    Error = hyper::Error,
    Future = impl Future<Output = Result<http::Response<hyper::body::Incoming>, hyper::Error>> + Send,
> + Clone
       + Send
where
    H: Fn(http::Request<hyper::body::Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = http::Response<Full<Bytes>>> + Send + 'static,
{
    duplex_service_with(handler, |_: &http::Request<Full<Bytes>>| Duration::ZERO)
}

/// [`duplex_service`] for any request body, opening each request's
/// connection `connect_after(&request)` after the call (a slow connection
/// set-up, or a client runtime that runs the connection late).
pub fn duplex_service_with<B, H, F>(
    handler: H,
    connect_after: fn(&http::Request<B>) -> Duration,
) -> impl tower::Service<
    http::Request<B>,
    Response = http::Response<hyper::body::Incoming>,
    Error = hyper::Error,
    Future = impl Future<Output = Result<http::Response<hyper::body::Incoming>, hyper::Error>> + Send,
> + Clone
       + Send
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    H: Fn(http::Request<hyper::body::Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = http::Response<Full<Bytes>>> + Send + 'static,
{
    tower::service_fn(move |request: http::Request<B>| {
        let handler = handler.clone();
        let wait = connect_after(&request);
        async move {
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            let (client_io, server_io) = tokio::io::duplex(64 * 1024);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let response = handler(request);
                    async move { Ok::<_, Infallible>(response.await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(server_io), service)
                    .await;
            });
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(client_io)).await?;
            tokio::spawn(connection);
            sender.send_request(request).await
        }
    })
}

pub fn full_request(uri: &str) -> http::Request<Full<Bytes>> {
    http::Request::get(uri).body(Full::new(Bytes::new())).unwrap()
}

pub fn full_status(code: u16) -> http::Response<Full<Bytes>> {
    http::Response::builder()
        .status(code)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// The response body of the in-process robots.txt sites (any body, boxed).
pub type TestBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// A complete body.
pub fn body(text: &str) -> TestBody {
    use http_body_util::BodyExt;
    Full::new(Bytes::from(text.to_owned())).boxed()
}

/// A body that never sends anything and never ends.
pub fn endless_body() -> TestBody {
    use http_body_util::BodyExt;
    let frames = futures::stream::pending::<Result<hyper::body::Frame<Bytes>, Infallible>>();
    http_body_util::StreamBody::new(frames).boxed()
}

/// A 200 response carrying `text` (a robots.txt).
pub fn robots_txt(text: &str) -> http::Response<TestBody> {
    http::Response::new(body(text))
}

/// An empty response with `status`.
pub fn status(status: u16) -> http::Response<TestBody> {
    let mut response = http::Response::new(body(""));
    *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
    response
}

/// A redirect with `status` to `location`.
pub fn redirect(status_code: u16, location: &str) -> http::Response<TestBody> {
    let mut response = status(status_code);
    response
        .headers_mut()
        .insert(http::header::LOCATION, location.parse().unwrap());
    response
}

/// A response extension for [`RobotsSite`]: answer only after this long.
#[derive(Debug, Clone, Copy)]
pub struct AnswerAfter(pub Duration);

/// `response`, answered after `latency`.
pub fn after(latency: Duration, mut response: http::Response<TestBody>) -> http::Response<TestBody> {
    response.extensions_mut().insert(AnswerAfter(latency));
    response
}

/// An in-process site (any host) for robots.txt tests. Requests whose path
/// contains `robots` are robots.txt fetches: recorded in `fetches` and
/// answered by the script given to [`RobotsSite::service`]. Every other
/// request is a page: recorded in `pages` and answered 200 at once.
#[derive(Clone)]
pub struct RobotsSite {
    pub pages: Recorder,
    pub fetches: Recorder,
}

impl RobotsSite {
    pub fn new() -> Self {
        RobotsSite {
            pages: Recorder::new(),
            fetches: Recorder::new(),
        }
    }

    /// The inner service. `robots` gets each robots.txt request and how many
    /// fetches came before it, and returns the answer (delayed with
    /// [`after`] if wanted).
    pub fn service<F>(
        &self,
        robots: F,
    ) -> impl tower::Service<
        http::Request<()>,
        Response = http::Response<TestBody>,
        Error = Infallible,
        Future = impl Future<Output = Result<http::Response<TestBody>, Infallible>> + Send,
    > + Clone
           + Send
           + 'static
    where
        F: Fn(&http::Request<()>, usize) -> http::Response<TestBody> + Send + Sync + 'static,
    {
        let site = self.clone();
        let robots = Arc::new(robots);
        tower::service_fn(move |request: http::Request<()>| {
            let response = if request.uri().path().contains("robots") {
                let before = site.fetches.sent().len();
                site.fetches.record(&request);
                robots(&request, before)
            } else {
                site.pages.record(&request);
                http::Response::new(body(""))
            };
            async move {
                if let Some(AnswerAfter(latency)) = response.extensions().get::<AnswerAfter>().copied() {
                    tokio::time::sleep(latency).await;
                }
                Ok::<_, Infallible>(response)
            }
        })
    }

    /// Paths of the pages the site was asked for, in order.
    pub fn page_paths(&self) -> Vec<String> {
        self.pages.sent().into_iter().map(|sent| sent.path).collect()
    }

    /// Paths of the robots.txt fetches, in order.
    pub fn fetch_paths(&self) -> Vec<String> {
        self.fetches.sent().into_iter().map(|sent| sent.path).collect()
    }
}

/// Every `tower_throttle` event at `level` or above, captured as formatted
/// lines by one global subscriber, installed by the first call in a test
/// binary (later calls share it; the first caller's level holds). A global
/// subscriber, because a thread-local one races with the binary's other
/// tests over tracing's per-callsite cache and misses events now and then.
/// Tests look only at events of their own scopes.
pub fn captured_events(level: tracing::Level) -> Arc<Mutex<Vec<String>>> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::Layer as _;
    static CAPTURED: std::sync::OnceLock<Arc<Mutex<Vec<String>>>> = std::sync::OnceLock::new();
    CAPTURED
        .get_or_init(|| {
            let captured: Arc<Mutex<Vec<String>>> = Arc::default();
            let sink = captured.clone();
            let subscriber = tracing_subscriber::registry().with(
                tracing_subscriber::fmt::layer()
                    .with_writer(move || CaptureWriter(sink.clone()))
                    .with_ansi(false)
                    .with_filter(
                        tracing_subscriber::filter::Targets::new().with_target("tower_throttle", level),
                    ),
            );
            tracing::subscriber::set_global_default(subscriber)
                .expect("one global subscriber per test binary");
            captured
        })
        .clone()
}

struct CaptureWriter(Arc<Mutex<Vec<String>>>);

impl std::io::Write for CaptureWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap()
            .push(String::from_utf8_lossy(buf).into_owned());
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One lane, `delay` between sends, no per-lane delay, no jitter: the
/// scope of the fleet tests (`fleet_memory.rs`, `redis_store.rs`) and of
/// the names and servers of the connection tests (`ip_scopes.rs`,
/// `shared_server.rs`), whose gaps are then exactly the delay.
pub fn one_lane_every(delay: Duration) -> tower_throttle::ScopeConfig {
    tower_throttle::ScopeConfig::default()
        .concurrency(1)
        .delay(delay)
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0)
}

/// Implements `ScopeStore` for `$name`, a newtype around a `MemoryStore`,
/// by handing the four required methods to it; the items given replace
/// the trait's provided methods (the behaviour a test changes).
#[macro_export]
macro_rules! memory_store_but {
    ($name:ident { $($changed:item)* }) => {
        impl tower_throttle::store::backend::ScopeStore for $name {
            fn reserve(
                &self,
                reservation: tower_throttle::store::backend::Reservation,
            ) -> tower_throttle::store::backend::StoreFuture<tower_throttle::store::backend::Grant> {
                self.0.reserve(reservation)
            }

            fn release(&self, lease: tower_throttle::store::backend::Lease) -> tower_throttle::store::backend::StoreFuture<()> {
                self.0.release(lease)
            }

            fn hold(
                &self,
                scope: tower_throttle::Scope,
                duration: std::time::Duration,
            ) -> tower_throttle::store::backend::StoreFuture<()> {
                self.0.hold(scope, duration)
            }

            fn backoff(
                &self,
                scope: tower_throttle::Scope,
                delay: std::time::Duration,
                ttl: std::time::Duration,
            ) -> tower_throttle::store::backend::StoreFuture<()> {
                self.0.backoff(scope, delay, ttl)
            }

            $($changed)*
        }
    };
}

/// A worker of a fleet: a registry with `config` for every scope, sharing
/// `store`, learning with the fleet or alone.
pub fn fleet_worker(
    config: &tower_throttle::ScopeConfig,
    store: &tower_throttle::store::MemoryStore,
    learn_together: bool,
) -> tower_throttle::Registry {
    tower_throttle::Registry::builder()
        .default_scope(config.clone())
        .store(store.clone())
        .fleet_learning(learn_together)
        .build()
        .unwrap()
}

/// Awaits a throttled response and unwraps its body, which frees the
/// request's lanes at once: the in-process bodies of the scheduling tests
/// carry nothing (`()`), so their transfer is over at the response head.
pub async fn at_head<F, B, E>(response: F) -> Result<http::Response<B>, E>
where
    F: Future<Output = Result<http::Response<tower_throttle::throttle::ThrottledBody<B>>, E>>,
{
    response
        .await
        .map(|response| response.map(tower_throttle::throttle::ThrottledBody::into_inner))
}

/// Awaits a response and drops it at once, which ends its transfer (and
/// frees its lanes): for tests that only need to know it came.
pub async fn dropped<F, R, E>(response: F) -> Result<(), E>
where
    F: Future<Output = Result<R, E>>,
{
    response.await.map(drop)
}

/// When the inner service of a [`timed_client`] got each request (by its
/// label), relative to the test's start.
pub type Calls = Arc<Mutex<Vec<(String, Duration)>>>;

/// A throttled client of `registry` whose inner service answers each
/// request after the milliseconds its query asks (`?ms=1000`; none: at
/// once) and records in `calls` when it got it, by the request's `label`.
pub fn timed_client(
    registry: &tower_throttle::Registry,
    start: Instant,
    calls: &Calls,
    label: fn(&http::Uri) -> String,
) -> impl tower::Service<
    http::Request<()>,
    Response = http::Response<tower_throttle::throttle::ThrottledBody<()>>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    let calls = calls.clone();
    let inner = tower::service_fn(move |request: http::Request<()>| {
        let latency = request
            .uri()
            .query()
            .and_then(|query| query.strip_prefix("ms="))
            .map_or(0, |ms| ms.parse().unwrap());
        calls
            .lock()
            .unwrap()
            .push((label(request.uri()), start.elapsed()));
        async move {
            tokio::time::sleep(Duration::from_millis(latency)).await;
            Ok::<_, Infallible>(http::Response::new(()))
        }
    });
    tower::Layer::layer(&tower_throttle::ThrottleLayer::new(registry.clone()), inner)
}

/// `service` behind an `IpScopeLayer` with `resolver` and a throttle, all
/// on `registry`: the stack of the IP scope tests.
pub fn throttled_through<S>(
    registry: &tower_throttle::Registry,
    resolver: impl tower_throttle::ip::Resolve,
    service: S,
) -> tower_throttle::ip::IpScope<tower_throttle::Throttle<S>> {
    tower::ServiceBuilder::new()
        .layer(
            tower_throttle::ip::IpScopeLayer::builder(registry.clone())
                .resolver(resolver)
                .build()
                .unwrap(),
        )
        .layer(tower_throttle::ThrottleLayer::new(registry.clone()))
        .service(service)
}

/// A fixed resolver that gives every one of `names` the one `address`.
pub fn resolving(names: &[impl AsRef<str>], address: [u8; 4]) -> tower_throttle::ip::FixedResolver {
    let resolver = tower_throttle::ip::FixedResolver::new();
    for name in names {
        resolver.set(name.as_ref(), [address]);
    }
    resolver
}
