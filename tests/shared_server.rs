//! A server shared by many paced host names gets its whole allowance:
//! a name whose own scope holds its next page back (its delay, a hold)
//! never blocks the server's scope, whatever order the crawler queued
//! its pages in. Paused virtual time, an in-process inner service, exact
//! instants.

mod support;

use std::time::Duration;

use tower::ServiceExt;
use tower_throttle::ip::FixedResolver;
use tower_throttle::{Registry, ScopeConfig};

use support::{get, instants_by, one_lane_every, resolving, throttled_through, Recorder, Sent};

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// Each name: one lane, 250 ms apart (4/s); each server: two lanes, 25 ms
/// apart (40/s). No jitter, no per-lane delay beyond those.
fn paced_names_on_shared_servers() -> Registry {
    Registry::builder()
        .max_concurrency(256)
        .default_scope(
            ScopeConfig::default()
                .concurrency(1)
                .delay(ms(250))
                .delay_per_slot(Duration::ZERO)
                .jitter(0.0),
        )
        .ip_scopes(
            ScopeConfig::default()
                .concurrency(2)
                .delay(ms(25))
                .delay_per_slot(Duration::ZERO)
                .jitter(0.0),
        )
        .build()
        .unwrap()
}

/// The order a crawler queued its pages in.
#[derive(Debug, Clone, Copy)]
enum Order {
    /// Page 1 of every name, then page 2, ...
    RoundRobin,
    /// All of one name's pages, then the next name's.
    SiteBySite,
}

/// `servers` servers with `names` names each, `pages` pages per name.
struct Crawl {
    servers: usize,
    names: usize,
    pages: usize,
}

/// The shape: twenty names on one server, twenty pages each.
const TWENTY_NAMES_ON_ONE_SERVER: Crawl = Crawl {
    servers: 1,
    names: 20,
    pages: 20,
};

impl Crawl {
    fn name(&self, server: usize, name: usize) -> String {
        format!("n{name}.s{server}.example")
    }

    fn resolver(&self) -> FixedResolver {
        let resolver = FixedResolver::new();
        for server in 0..self.servers {
            for name in 0..self.names {
                let address = [10, 0, (server / 256) as u8, (server % 256) as u8];
                resolver.set(&self.name(server, name), [address]);
            }
        }
        resolver
    }

    /// Every page's URI, in the order server `s` queued them (`orders[s]`),
    /// the servers' pages interleaved.
    fn uris(&self, orders: &[Order]) -> Vec<String> {
        let per_server: Vec<Vec<String>> = (0..self.servers)
            .map(|server| {
                let mut uris = Vec::new();
                match orders[server % orders.len()] {
                    Order::RoundRobin => {
                        for page in 0..self.pages {
                            for name in 0..self.names {
                                uris.push(format!("http://{}/{page}", self.name(server, name)));
                            }
                        }
                    }
                    Order::SiteBySite => {
                        for name in 0..self.names {
                            for page in 0..self.pages {
                                uris.push(format!("http://{}/{page}", self.name(server, name)));
                            }
                        }
                    }
                }
                uris
            })
            .collect();
        (0..self.names * self.pages)
            .flat_map(|index| per_server.iter().map(move |uris| uris[index].clone()))
            .collect()
    }

    /// Queues every page at once (instant responses) and returns what the
    /// inner service saw.
    async fn run(&self, registry: &Registry, orders: &[Order]) -> Vec<Sent> {
        let recorder = Recorder::new();
        let client = throttled_through(registry, self.resolver(), recorder.service(Duration::ZERO));
        let tasks: Vec<_> = self
            .uris(orders)
            .into_iter()
            .map(|uri| {
                let client = client.clone();
                // The response is dropped in its task: its lanes are free
                // at once, whatever order the tasks are awaited in.
                tokio::spawn(async move { drop(client.oneshot(get(&uri)).await.unwrap()) })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        recorder.sent()
    }

    /// The server of a name's URI host.
    fn server_of(host: &str) -> String {
        host.split_once('.').map(|(_, server)| server.to_owned()).unwrap()
    }
}

/// Requests per second from a server's first arrival to its last.
fn rate(instants: &[Duration]) -> f64 {
    let span = instants.last().unwrap().saturating_sub(instants[0]);
    (instants.len() - 1) as f64 / span.as_secs_f64()
}

/// Every limit held: each name's sends at least 250 ms apart, each
/// server's at least 25 ms apart; and each server reached `floor` requests
/// per second. Returns the servers' rates.
fn check(sent: &[Sent], expected: usize, floor: f64) -> Vec<f64> {
    assert_eq!(sent.len(), expected, "every page was fetched");
    for (name, instants) in instants_by(sent, |one| one.host.clone()) {
        for gap in instants.windows(2) {
            assert!(gap[1] - gap[0] >= ms(250), "{name}: {gap:?} closer than 250 ms");
        }
    }
    let servers = instants_by(sent, |one| Crawl::server_of(&one.host));
    let mut rates = Vec::new();
    for (server, instants) in servers {
        for gap in instants.windows(2) {
            assert!(gap[1] - gap[0] >= ms(25), "{server}: {gap:?} closer than 25 ms");
        }
        let rate = rate(&instants);
        assert!(rate >= floor, "{server} got {rate:.1}/s, below {floor}/s");
        rates.push(rate);
    }
    rates
}

/// Twenty names on one server, twenty pages each, all queued at once:
/// demand (80/s) is twice the server's allowance (40/s), so the server is
/// what binds, in either order. Site by site, a name's next page waits for
/// its own 250 ms while standing first in the server's queue: the server
/// serves the other names meanwhile.
#[tokio::test(start_paused = true)]
async fn twenty_paced_names_on_one_server_get_its_whole_allowance_in_either_order() {
    let crawl = TWENTY_NAMES_ON_ONE_SERVER;
    for order in [Order::RoundRobin, Order::SiteBySite] {
        let registry = paced_names_on_shared_servers();
        let sent = crawl.run(&registry, &[order]).await;
        let rates = check(&sent, 400, 38.0);
        // 400 requests 25 ms apart: the first at 0, the last at 9.975 s.
        let last = sent.iter().map(|one| one.at).max().unwrap();
        assert_eq!(last, ms(9_975), "{order:?}: rate {rates:?}");
    }
}

/// Two hundred names on ten servers (twenty each), five servers' pages
/// queued round robin and five site by site, interleaved: every server
/// gets at least 95 % of its allowance.
#[tokio::test(start_paused = true)]
async fn two_hundred_names_on_ten_servers_in_mixed_orders_get_every_allowance() {
    let crawl = Crawl {
        servers: 10,
        names: 20,
        pages: 20,
    };
    let registry = paced_names_on_shared_servers();
    let sent = crawl
        .run(&registry, &[Order::RoundRobin, Order::SiteBySite])
        .await;
    let rates = check(&sent, 4_000, 38.0);
    assert_eq!(rates.len(), 10);
}

/// One name of the server is held for 60 s (as a `Retry-After: 60` on
/// that name would): the other nineteen keep the server at its allowance
/// meanwhile, and the held name's pages go once the hold ends, each 250 ms
/// after the last, none starved.
#[tokio::test(start_paused = true)]
async fn a_held_name_does_not_stall_its_server_and_goes_when_its_hold_ends() {
    let crawl = TWENTY_NAMES_ON_ONE_SERVER;
    let registry = paced_names_on_shared_servers();
    let held = crawl.name(0, 0);
    registry.hold(held.clone(), Duration::from_secs(60));
    // Site by site: the held name's twenty pages are the first in the
    // server's queue.
    let sent = crawl.run(&registry, &[Order::SiteBySite]).await;
    assert_eq!(sent.len(), 400);
    let others: Vec<Duration> = sent
        .iter()
        .filter(|one| one.host != held)
        .map(|one| one.at)
        .collect();
    // 380 requests of the other names, at 40/s while their demand (76/s)
    // exceeds it: the first ten names in the queue go at their own 4/s
    // each until about 4.75 s, the last nine (36/s of demand) then finish
    // at their own pace, the last page at 9.95 s. None waits for the hold.
    assert_eq!(others.len(), 380);
    assert_eq!(*others.iter().max().unwrap(), ms(9_950));
    let busy: Vec<Duration> = others.iter().copied().filter(|&at| at <= ms(4_750)).collect();
    assert!(
        rate(&busy) >= 39.9,
        "{} while ten names or more wait",
        rate(&busy)
    );
    assert!(rate(&others) >= 38.0, "{}", rate(&others));
    let held_at: Vec<u128> = sent
        .iter()
        .filter(|one| one.host == held)
        .map(|one| one.at.as_millis())
        .collect();
    let expected: Vec<u128> = (0..20).map(|page| 60_000 + page * 250).collect();
    assert_eq!(held_at, expected);
}

/// A name's first request opens a connection of its own after it leaves
/// (hyper-util and reqwest keep one per name), so it reaches the server
/// later than its hand-over by the connection's setup, and a request of
/// another name on a kept connection could arrive closer than the server's
/// delay. The server's next gap therefore runs from that first request's
/// answer, as a cold scope's does; a request of a name already warm is
/// timed from its departure as before. Names: one lane, no delay; the
/// server: one lane, 100 ms; 30 ms answers.
#[tokio::test(start_paused = true)]
async fn a_names_first_request_times_its_servers_next_gap_from_its_answer() {
    let registry = Registry::builder()
        .default_scope(one_lane_every(Duration::ZERO))
        .ip_scopes(one_lane_every(ms(100)))
        .build()
        .unwrap();
    let resolver = resolving(&["a.example", "b.example", "c.example"], [10, 0, 0, 1]);
    let recorder = Recorder::new();
    let client = throttled_through(&registry, resolver, recorder.service(ms(30)));
    let pages = [
        "a.example/1",
        "b.example/1",
        "c.example/1",
        "a.example/2",
        "b.example/2",
    ];
    let tasks: Vec<_> = pages
        .iter()
        .map(|page| {
            let client = client.clone();
            let uri = format!("http://{page}");
            tokio::spawn(async move { drop(client.oneshot(get(&uri)).await.unwrap()) })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let sent: Vec<(String, u128)> = recorder
        .sent()
        .into_iter()
        .map(|one| (format!("{}{}", one.host, one.path), one.at.as_millis()))
        .collect();
    let expected = [
        // Cold: the server's first request; its next gap runs from the
        // answer at 30 ms.
        ("a.example/1", 0),
        // b's first: it opens a connection, the next gap runs from its
        // answer at 160 ms.
        ("b.example/1", 130),
        // c's first, the same: answered at 290 ms.
        ("c.example/1", 260),
        // a is warm: its send at 390 ms times the next gap from itself.
        ("a.example/2", 390),
        ("b.example/2", 490),
    ];
    let expected: Vec<(String, u128)> = expected
        .iter()
        .map(|(page, at)| (page.to_string(), *at))
        .collect();
    assert_eq!(sent, expected);
    let stats = registry.stats();
    assert_eq!((stats.in_flight, stats.waiting), (0, 0));
}
