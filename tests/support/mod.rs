//! Shared test helpers: an in-process recording service (for exact virtual
//! instants) and a loopback hyper server (for real-socket tests).
#![allow(dead_code, unreachable_pub)]

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
        let recorder = self.clone();
        tower::service_fn(move |request: http::Request<()>| {
            recorder.record(&request);
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

pub fn get(uri: &str) -> http::Request<()> {
    http::Request::get(uri).body(()).unwrap()
}

/// A loopback HTTP/1 server. `handler` answers each request.
pub async fn serve<H, F>(handler: H) -> SocketAddr
where
    H: Fn(http::Request<hyper::body::Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = http::Response<Full<Bytes>>> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let handler = handler.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let response = handler(request);
                    async move { Ok::<_, Infallible>(response.await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
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

pub type LoopbackClient = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector<LoopbackResolver>,
    Full<Bytes>,
>;

/// A real hyper-util client whose every host resolves to loopback.
pub fn loopback_client() -> LoopbackClient {
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
    tower::service_fn(move |request: http::Request<Full<Bytes>>| {
        let handler = handler.clone();
        async move {
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

pub fn status(code: u16) -> http::Response<Full<Bytes>> {
    http::Response::builder()
        .status(code)
        .body(Full::new(Bytes::new()))
        .unwrap()
}
