//! The crawl: every site's pages through the whole stack, with a record of
//! each send (as the client hands it to the network) and of each site's
//! limits, sampled while it runs.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use tokio::time::{Instant, MissedTickBehavior};
use tower::{Service, ServiceExt};
use tower_throttle::registry::LimitSource;
use tower_throttle::waited::Waited;
use tower_throttle::{Registry, ScopeStats};

use crate::client::{self, SendLog};
use crate::progress::{Reporter, SiteStatus};
use crate::sites::{self, Site};

/// An error of the crawl's setup (a page that fails is counted, not an error).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How often each site's limits are sampled for the timeline and progress.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(50);

/// One request handed to the hyper-util client.
#[derive(Debug, Clone, Copy)]
pub struct Sent {
    /// Index of the site in [`Run::sites`].
    pub site: usize,
    /// Since the crawl started.
    pub at: Duration,
    /// A robots.txt fetch rather than a page.
    pub robots: bool,
}

/// Where the client notes each send of one page (every attempt), carried
/// in the page's request extensions.
#[derive(Debug, Clone, Default)]
pub struct PageSends(Arc<Mutex<Vec<Duration>>>);

impl PageSends {
    /// Notes a send at `at` (since the crawl started).
    pub fn push(&self, at: Duration) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(at);
    }

    /// The last send noted.
    fn last(&self) -> Option<Duration> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).last().copied()
    }
}

/// Why one page waited before its last send: the record its response
/// carried.
#[derive(Debug, Clone)]
pub struct PageWait {
    /// Index of the site in [`Run::sites`].
    pub site: usize,
    /// The page's last send (the attempt that answered), since the crawl
    /// started: where its wait ended.
    pub sent: Duration,
    /// The response's record (empty when the page went at once).
    pub waited: Waited,
}

/// A site's limits at one instant.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Since the crawl started.
    pub at: Duration,
    /// The effective delay between sends.
    pub delay: Duration,
    /// What set it.
    pub delay_source: LimitSource,
    /// The lanes the site may use.
    pub concurrency: u32,
    /// What set them.
    pub concurrency_source: LimitSource,
    /// Whether a hold (Retry-After, quota reset) was in force.
    pub held: bool,
    /// Backoff feedbacks so far.
    pub backoff_feedbacks: u64,
}

/// How a site's pages ended.
#[derive(Debug, Default)]
struct Tally {
    ok: AtomicUsize,
    failed: AtomicUsize,
}

/// Everything a crawl recorded.
#[derive(Debug)]
pub struct Run {
    /// The sites, in row order.
    pub sites: Vec<Site>,
    /// Each site's loopback address.
    pub addresses: Vec<SocketAddr>,
    /// Pages asked per site.
    pub requests: usize,
    /// Every send, in order.
    pub sends: Vec<Sent>,
    /// Every page that got a response, with why it waited, in the order
    /// the pages were asked.
    pub waits: Vec<PageWait>,
    /// Per site, its limits every [`SAMPLE_EVERY`].
    pub samples: Vec<Vec<Sample>>,
    /// Per site, pages answered 2xx in the end.
    pub pages_ok: Vec<usize>,
    /// Per site, the site's scope when the crawl ended.
    pub stats: Vec<Option<ScopeStats>>,
    /// The crawl's wall time.
    pub elapsed: Duration,
}

impl Run {
    /// The sends of site `site`.
    pub fn sends_of(&self, site: usize) -> impl Iterator<Item = &Sent> {
        self.sends.iter().filter(move |send| send.site == site)
    }

    /// The waits of site `site`'s pages.
    pub fn waits_of(&self, site: usize) -> impl Iterator<Item = &PageWait> {
        self.waits.iter().filter(move |wait| wait.site == site)
    }

    /// The intervals during which site `site` was held, as sampled.
    pub fn holds_of(&self, site: usize) -> Vec<(Duration, Duration)> {
        let mut holds: Vec<(Duration, Duration)> = Vec::new();
        let mut open: Option<Duration> = None;
        for sample in &self.samples[site] {
            match (sample.held, open) {
                (true, None) => open = Some(sample.at),
                (false, Some(start)) => {
                    holds.push((start, sample.at));
                    open = None;
                }
                _ => {}
            }
        }
        if let Some(start) = open {
            holds.push((start, self.elapsed));
        }
        holds
    }

    /// When site `site` received backoff feedback (to the sampling step), with
    /// how many feedbacks arrived in that step.
    pub fn backoffs_of(&self, site: usize) -> Vec<(Duration, u64)> {
        let mut seen = 0;
        let mut events = Vec::new();
        for sample in &self.samples[site] {
            if sample.backoff_feedbacks > seen {
                events.push((sample.at, sample.backoff_feedbacks - seen));
                seen = sample.backoff_feedbacks;
            }
        }
        events
    }
}

/// The order the crawl queues its pages in, as `(site, page)`: the `shared`
/// names site by site (a crawler that found each site's links at once, so
/// a name's next page stands first in its server's queue while the name's
/// own delay holds it), then every other site's pages round robin.
fn queue_order(sites: &[Site], requests: usize) -> Vec<(usize, usize)> {
    let shared = |site: &Site| site.kind == crate::sites::Kind::Shared;
    let site_by_site = (0..sites.len())
        .filter(|&index| shared(&sites[index]))
        .flat_map(|index| (0..requests).map(move |page| (index, page)));
    let round_robin = (0..requests).flat_map(|page| {
        (0..sites.len())
            .filter(|&index| !shared(&sites[index]))
            .map(move |index| (index, page))
    });
    site_by_site.chain(round_robin).collect()
}

/// Crawls `requests` pages of each site, on a loopback server started for
/// them, reporting progress to `reporter`.
///
/// # Errors
///
/// When the server cannot start or the registry's config is invalid.
pub async fn crawl(sites: Vec<Site>, requests: usize, reporter: Reporter) -> Result<Run, BoxError> {
    let addresses = crate::server::start(&sites).await?;
    let registry = sites::registry(&sites, &addresses)?;
    let start = Instant::now();
    let log = Arc::new(SendLog::new(&sites, start));
    let client = client::full_stack(&registry, &sites, &addresses, log.clone());

    let tallies: Arc<Vec<Tally>> = Arc::new(sites.iter().map(|_| Tally::default()).collect());
    let finished = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn(sample_until_finished(
        start,
        registry.clone(),
        sites.clone(),
        requests,
        tallies.clone(),
        finished.clone(),
        reporter,
    ));

    let mut pages = Vec::with_capacity(sites.len() * requests);
    for (index, page) in queue_order(&sites, requests) {
        {
            let (site, address) = (&sites[index], &addresses[index]);
            let uri = format!("http://{}:{}/page/{page}", site.host, address.port());
            let mut request = http::Request::get(uri).body(Full::new(Bytes::new()))?;
            let sends = PageSends::default();
            request.extensions_mut().insert(sends.clone());
            let mut client = client.clone();
            client.ready().await?;
            let response = client.call(request);
            let tallies = tallies.clone();
            pages.push(tokio::spawn(async move {
                let mut wait = None;
                let ok = match response.await {
                    Ok(response) => {
                        wait = sends.last().map(|sent| PageWait {
                            site: index,
                            sent,
                            waited: Waited::from_extensions(response.extensions()),
                        });
                        let status = response.status();
                        response.into_body().collect().await.is_ok() && status.is_success()
                    }
                    Err(_) => false,
                };
                let tally = &tallies[index];
                if ok { &tally.ok } else { &tally.failed }.fetch_add(1, Ordering::Relaxed);
                wait
            }));
        }
    }
    let mut waits = Vec::with_capacity(pages.len());
    for page in pages {
        waits.extend(page.await?);
    }
    let elapsed = start.elapsed();
    finished.store(true, Ordering::Relaxed);
    let samples = sampler.await?;

    let sends = log.take();
    Ok(Run {
        stats: sites
            .iter()
            .map(|site| registry.scope_stats(&site.host))
            .collect(),
        pages_ok: tallies
            .iter()
            .map(|tally| tally.ok.load(Ordering::Relaxed))
            .collect(),
        sites,
        addresses,
        requests,
        sends,
        waits,
        samples,
        elapsed,
    })
}

/// Samples every site's limits until the crawl is over, feeding the progress
/// reporter; returns the samples.
async fn sample_until_finished(
    start: Instant,
    registry: Registry,
    sites: Vec<Site>,
    requests: usize,
    tallies: Arc<Vec<Tally>>,
    finished: Arc<AtomicBool>,
    mut reporter: Reporter,
) -> Vec<Vec<Sample>> {
    let mut samples: Vec<Vec<Sample>> = sites.iter().map(|_| Vec::new()).collect();
    let mut ticker = tokio::time::interval(SAMPLE_EVERY);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let at = start.elapsed();
        let mut statuses = Vec::with_capacity(sites.len());
        for (index, site) in sites.iter().enumerate() {
            let stats = registry.scope_stats(&site.host);
            if let Some(stats) = &stats {
                samples[index].push(Sample {
                    at,
                    delay: stats.delay,
                    delay_source: stats.delay_limited_by,
                    concurrency: stats.concurrency,
                    concurrency_source: stats.concurrency_limited_by,
                    held: stats.held_for.is_some(),
                    backoff_feedbacks: stats.backoff_feedbacks,
                });
            }
            let tally = &tallies[index];
            statuses.push(SiteStatus {
                done: tally.ok.load(Ordering::Relaxed) + tally.failed.load(Ordering::Relaxed),
                total: requests,
                stats,
            });
        }
        reporter.update(at, &statuses);
        if finished.load(Ordering::Relaxed) {
            reporter.finish();
            return samples;
        }
    }
}
