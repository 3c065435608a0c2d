//! The client side: a hyper-util client that finds each site at its own
//! loopback address, wrapped in the whole stack, with a recorder of sends
//! between Backoff and the client.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;
use tower::retry::RetryLayer;
use tower::{Service, ServiceBuilder};
use tower_throttle::connect::{PinServerLayer, PinnedConnector};
use tower_throttle::departure::{DepartureStampLayer, StampedBody, StampingConnector};
use tower_throttle::ip::{FixedResolver, IpScopeLayer};
use tower_throttle::redirect::{FailOnLoops, FollowRedirectLayer};
use tower_throttle::throttle::ThrottledBody;
use tower_throttle::{BackoffLayer, Registry, RetryAfterLayer, RobotsDelayLayer, ThrottleLayer};

use crate::crawl::{BoxError, PageSends, Sent};
use crate::sites::Site;

/// How often a 429 is sent again (through the throttle) before the page counts as failed.
pub const MAX_RETRIES: u32 = 3;

/// The stack the README describes, FollowRedirect → BackoffRetry →
/// RobotsDelay → Throttle → RetryAfter (pacing to announced policies) →
/// Backoff, around a client that
/// reaches each of `sites` at its address in `addresses`; `log` notes every
/// request the client is handed.
pub fn full_stack(
    registry: &Registry,
    sites: &[Site],
    addresses: &[SocketAddr],
    log: Arc<SendLog>,
) -> impl Service<
    http::Request<Full<Bytes>>,
    Response = http::Response<ThrottledBody<hyper::body::Incoming>>,
    Error = BoxError,
    Future = impl std::future::Future<
        Output = Result<http::Response<ThrottledBody<hyper::body::Incoming>>, BoxError>,
    > + std::marker::Send
                 + 'static,
> + Clone
       + std::marker::Send
       + 'static {
    let backoff = BackoffLayer::new(registry.clone());
    ServiceBuilder::new()
        // Above the throttle: each redirect hop is admitted in its own host's scope.
        .layer(FollowRedirectLayer::with_policy(FailOnLoops::new(10)))
        .map_err(BoxError::from)
        .layer(RetryLayer::new(backoff.retry_policy(MAX_RETRIES)))
        .layer(ip_scopes(registry, sites, addresses))
        .layer(RobotsDelayLayer::new(registry.clone()).user_agent("demo-bot/1.0"))
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(RetryAfterLayer::new(registry.clone()).pace_to_policy(true))
        .layer(backoff)
        // Between Backoff and the client: the instant each request is
        // handed to the client is what the site experiences.
        .map_request(move |request: http::Request<Full<Bytes>>| {
            log.record(&request);
            request
        })
        // The connection goes to the address the IP scope throttled.
        .layer(PinServerLayer::new())
        // Innermost: a send departs when the socket write of its head
        // returns, so a busy machine cannot shorten a gap at the site.
        .layer(DepartureStampLayer::new().at_socket_write())
        .service(site_client(sites, addresses))
}

/// Where each send is written down.
/// Each request also in the scope of its server's address (`ip:127.0.0.N`),
/// resolved before admission as the client resolves it: the `shared` names
/// of one server share one scope.
fn ip_scopes(registry: &Registry, sites: &[Site], addresses: &[SocketAddr]) -> IpScopeLayer {
    let resolver = FixedResolver::new();
    for (site, address) in sites.iter().zip(addresses) {
        resolver.set(&site.host, [address.ip()]);
    }
    IpScopeLayer::builder(registry.clone())
        .resolver(resolver)
        .build()
        .expect("the defaults with a resolver are valid")
}

#[derive(Debug)]
pub struct SendLog {
    start: Instant,
    site_of_host: HashMap<String, usize>,
    sends: Mutex<Vec<Sent>>,
}

impl SendLog {
    /// A log for `sites`, timing sends from `start`.
    pub fn new(sites: &[Site], start: Instant) -> Self {
        SendLog {
            start,
            site_of_host: sites
                .iter()
                .enumerate()
                .map(|(index, site)| (site.host.clone(), index))
                .collect(),
            sends: Mutex::default(),
        }
    }

    /// Notes a send, in the log and in the page's own [`PageSends`] when
    /// the request carries one.
    fn record<B>(&self, request: &http::Request<B>) {
        let site = request.uri().host().and_then(|host| self.site_of_host.get(host));
        if let Some(&site) = site {
            let send = Sent {
                site,
                at: self.start.elapsed(),
                robots: request.uri().path() == "/robots.txt",
            };
            if let Some(page) = request.extensions().get::<PageSends>() {
                page.push(send.at);
            }
            self.sends.lock().unwrap().push(send);
        }
    }

    /// The sends so far, in order; the log is left empty.
    pub fn take(&self) -> Vec<Sent> {
        std::mem::take(&mut *self.sends.lock().unwrap())
    }
}

/// Finds each demo site at its loopback address, at once; any other name
/// is not found.
#[derive(Clone, Debug)]
struct SiteResolver(Arc<HashMap<String, SocketAddr>>);

impl Service<Name> for SiteResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        std::future::ready(match self.0.get(name.as_str()) {
            Some(&address) => Ok(vec![address].into_iter()),
            None => Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{name} is not a demo site"),
            )),
        })
    }
}

/// A client that connects to the address a request's IP scope throttled
/// (`PinnedConnector`), and reaches each of `sites` at its address in
/// `addresses` when a request has none; its connections stamp each
/// request's departure at the socket write (`StampingConnector`).
fn site_client(
    sites: &[Site],
    addresses: &[SocketAddr],
) -> Client<StampingConnector<PinnedConnector<HttpConnector<SiteResolver>>>, StampedBody<Full<Bytes>>> {
    let addresses = sites
        .iter()
        .zip(addresses)
        .map(|(site, &address)| (site.host.clone(), address))
        .collect();
    let mut connector = HttpConnector::new_with_resolver(SiteResolver(Arc::new(addresses)));
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(StampingConnector::new(PinnedConnector::new(connector)))
}
