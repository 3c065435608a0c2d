//! The kinds of virtual site the demo crawls, what each one teaches, and the
//! registry config the crawl uses for them.

use std::net::SocketAddr;
use std::time::Duration;

use tower_throttle::registry::BackoffConfig;
use tower_throttle::{ConfigError, Registry, ScopeConfig};

/// The pace of every site without a config of its own: one lane, 250 ms
/// between sends, ±50 % jitter.
pub const DEFAULT_DELAY: Duration = Duration::from_millis(250);

/// How many sends per rolling second the `busy` sites accept before they
/// answer 429.
pub const BUSY_SITE_RATE: usize = 5;

/// The `api` sites' quota: this many requests per window.
pub const API_QUOTA: u32 = 10;

/// The `api` sites' quota window.
pub const API_WINDOW: Duration = Duration::from_secs(5);

/// How many names each `shared` server answers for (shared hosting).
pub const SHARED_NAMES: usize = 20;

/// What the crawler allows one `shared` server, whatever the name: its IP
/// scope's lanes and the gap between its sends (40 a second in all, where
/// the names' own scopes, 4 a second each, would send 80).
pub const SHARED_SERVER_LANES: u32 = 2;
/// See [`SHARED_SERVER_LANES`].
pub const SHARED_SERVER_DELAY: Duration = Duration::from_millis(25);

/// A `shared` server's allowance, in requests per second.
pub fn shared_server_allowance() -> f64 {
    1.0 / SHARED_SERVER_DELAY.as_secs_f64()
}

/// What a site does; the demo runs `--sites N` of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Answers at once; crawled on the default config.
    Fast,
    /// Takes 600 ms per answer; crawled on the default config.
    Slow,
    /// Answers 429 + `Retry-After: 1` above [`BUSY_SITE_RATE`] requests a second.
    Busy,
    /// Its robots.txt asks for `Crawl-delay: 0.5`.
    Polite,
    /// An API announcing its quota in `RateLimit` / `RateLimit-Policy`.
    Api,
    /// A site the crawler has its own config for: 4 lanes, no delay.
    Tuned,
    /// One of [`SHARED_NAMES`] names on one server (shared hosting): each
    /// name paced as a real host is (one lane, 250 ms), the server held to
    /// its IP scope, which their pages, queued site by site, keep busy.
    Shared,
    /// Answers every page with `301` to the same path on the `fast` site of
    /// its number: the hop is a request of its own, admitted in that
    /// site's scope (the client follows redirects above the throttle).
    Moved,
}

impl Kind {
    /// Every kind, in the order the demo lists them.
    pub const ALL: [Kind; 8] = [
        Kind::Fast,
        Kind::Slow,
        Kind::Busy,
        Kind::Polite,
        Kind::Api,
        Kind::Tuned,
        Kind::Shared,
        Kind::Moved,
    ];

    /// The kind's name, as used in host names.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Fast => "fast",
            Kind::Slow => "slow",
            Kind::Busy => "busy",
            Kind::Polite => "polite",
            Kind::Api => "api",
            Kind::Tuned => "tuned",
            Kind::Shared => "shared",
            Kind::Moved => "moved",
        }
    }

    /// What the site's row shows, in a few words.
    pub fn lesson(self) -> &'static str {
        match self {
            Kind::Fast => "default config: 1 lane, 250 ms +-50 %",
            Kind::Slow => "600 ms answers keep its one lane busy",
            Kind::Busy => "429 + Retry-After above 5/s: backoff and holds",
            Kind::Polite => "robots.txt Crawl-delay: 0.5",
            Kind::Api => "RateLimit headers, 10 per 5 s: paced",
            Kind::Tuned => "own config: 4 lanes, no delay",
            Kind::Shared => "20 names (1 lane, 250 ms each), 1 server: 2 lanes, 25 ms in all",
            Kind::Moved => "301 to fast-N: each hop waits its turn in fast-N's scope",
        }
    }

    /// How long the site takes to answer.
    pub fn latency(self) -> Duration {
        match self {
            Kind::Slow => Duration::from_millis(600),
            Kind::Tuned => Duration::from_millis(30),
            _ => Duration::from_millis(5),
        }
    }

    /// The site's robots.txt, if it has one (the others answer 404, which
    /// allows everything).
    pub fn robots_txt(self) -> Option<&'static str> {
        match self {
            Kind::Polite => Some("User-agent: *\nCrawl-delay: 0.5\n"),
            _ => None,
        }
    }

    /// The crawler's config for sites of this kind; `None` for the default.
    fn config(self) -> Option<ScopeConfig> {
        match self {
            // Too eager for the site on purpose, with a short backoff whose
            // recovery fits in the demo: the timeline shows the saw-tooth.
            Kind::Busy => Some(
                ScopeConfig::default()
                    .concurrency(2)
                    .delay(Duration::from_millis(100))
                    .delay_per_slot(Duration::ZERO)
                    .jitter(0.0)
                    .backoff(
                        BackoffConfig::default()
                            .min_delay(Duration::from_millis(250))
                            .window(Duration::from_secs(2)),
                    ),
            ),
            // Nothing but the server's announced policy slows it down.
            Kind::Api => Some(
                ScopeConfig::default()
                    .concurrency(2)
                    .delay(Duration::ZERO)
                    .delay_per_slot(Duration::ZERO),
            ),
            Kind::Tuned => Some(
                ScopeConfig::default()
                    .concurrency(4)
                    .delay(Duration::ZERO)
                    .delay_per_slot(Duration::ZERO),
            ),
            // Each name paced as a real host (4 a second, steady): twenty of
            // them ask twice what the server's IP scope allows, which is
            // what holds them back, together.
            Kind::Shared => Some(
                ScopeConfig::default()
                    .concurrency(1)
                    .delay(DEFAULT_DELAY)
                    .delay_per_slot(Duration::ZERO)
                    .jitter(0.0),
            ),
            Kind::Fast | Kind::Slow | Kind::Polite | Kind::Moved => None,
        }
    }
}

/// Where a `moved` site sends its pages: the `fast` site of its number.
pub fn moved_to(host: &str) -> Option<String> {
    host.strip_prefix("moved-").map(|rest| format!("fast-{rest}"))
}

/// One virtual site.
#[derive(Debug, Clone)]
pub struct Site {
    /// What it does.
    pub kind: Kind,
    /// Its host name, which is also its scope.
    pub host: String,
    /// The server it is on: its own, but one for each [`SHARED_NAMES`]
    /// `shared` names.
    pub server: usize,
}

/// `per_kind` sites of every kind, kind after kind; of the `shared` kind,
/// `per_kind` servers of [`SHARED_NAMES`] names each.
pub fn sites(per_kind: usize) -> Vec<Site> {
    let mut sites = Vec::new();
    let mut servers = 0;
    for kind in Kind::ALL {
        for number in 1..=per_kind {
            let names = if kind == Kind::Shared { SHARED_NAMES } else { 1 };
            for name in 1..=names {
                let host = match kind {
                    Kind::Shared => format!("{}-{number}-{name}.demo.test", kind.name()),
                    _ => format!("{}-{number}.demo.test", kind.name()),
                };
                sites.push(Site {
                    kind,
                    host,
                    server: servers,
                });
            }
            servers += 1;
        }
    }
    sites
}

/// The registry the crawl runs on: the default config for most sites, the
/// kinds' own configs for the others; every server an IP scope that holds
/// back only the `shared` ones (the others' own scopes are stricter).
///
/// # Errors
///
/// A [`ConfigError`] if a config above is invalid.
pub fn registry(sites: &[Site], addresses: &[SocketAddr]) -> Result<Registry, ConfigError> {
    let mut builder = Registry::builder()
        .max_concurrency(32)
        .default_scope(
            ScopeConfig::default()
                .delay(DEFAULT_DELAY)
                .delay_per_slot(Duration::ZERO),
        )
        .ip_scopes(
            ScopeConfig::default()
                .concurrency(32)
                .delay(Duration::ZERO)
                .delay_per_slot(Duration::ZERO),
        );
    for (site, address) in sites.iter().zip(addresses) {
        if let Some(config) = site.kind.config() {
            builder = builder.scope(site.host.as_str(), config);
        }
        if site.kind == Kind::Shared {
            let server = ScopeConfig::default()
                .concurrency(SHARED_SERVER_LANES)
                .delay(SHARED_SERVER_DELAY)
                .delay_per_slot(Duration::ZERO)
                .jitter(0.0);
            builder = builder.scope(ip_scope(address), server);
        }
    }
    builder.build()
}

/// The IP scope of the server at `address` (see `tower_throttle::ip`).
pub fn ip_scope(address: &SocketAddr) -> String {
    format!("ip:{}", address.ip())
}
