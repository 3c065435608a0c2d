//! Per-request overhead of `Throttle` against peers, measured in one run on
//! one thread: the bare service, `tower::limit::ConcurrencyLimit`, a
//! `governor` keyed rate-limit check, and `Throttle` with one scope and with
//! 100 000 scopes visited round-robin (and with one scope without recording
//! the resolved scopes in the request extensions).
//!
//! Every variant builds the same request (a pre-parsed URI cloned into a new
//! `http::Request`) and drives `ready` + `call` + the response future to
//! completion, so `variant - bare` is the overhead of the layer. The figure
//! to report is the ratio of overheads, not absolute times.
//!
//! The `scaling` group drives the same requests from 1 and from 2 OS
//! threads (each with its own current-thread runtime, all sharing one
//! registry) for each workload of issue 26: `bare`, `one_scope`,
//! `one_scope_delay0_c64`, `scopes_10k` and `multi_scope_2` (and
//! `ip_scoped_10k`, a crawl behind `IpScopeLayer`: 10 000 hosts on 1 000
//! servers, every request its host's scope and its server's; and
//! `ip_scoped_1`, an API client behind it: one host and its server), beside
//! `governor_1_key` (governor's keyed check on one host, one limiter
//! shared by both threads: the lock-free peer of the hot scope, whose
//! speedup is what one shared key allows on this machine),
//! `governor_10k_keys` and `locked_shards_10k` (the peers of `scopes_10k`
//! over the same hosts: governor's keyed check, one limiter for both
//! threads; and the least a registry of locked shards does, eight mutexes
//! by the host's hash, each request locking its host's twice;
//! `locked_once_10k` the same locking once, as a registry whose requests
//! end without the lock would),
//! `one_scope_locked` (every admission under the lock),
//! `scopes_10k_together` (both threads in the same order from the same
//! start, so they meet on every scope) and
//! `scopes_10k_split` (each thread
//! a registry of its own: the ceiling any split of the registry's state
//! could reach here). After criterion's own
//! report it prints one line per workload for scripts:
//!
//! ```text
//! scaling one_scope threads=1 ns=330.0 threads=2 ns=390.0 speedup=0.85
//! ```
//!
//! (`ns`: the median time per request over 15 runs of 200 000 requests,
//! taken round the workloads (in a new order each round), and at 1 and at
//! 2 threads in turn; `speedup`: the throughput
//! at 2 threads over 1 thread. The bare service's own speedup is the
//! ceiling on this machine.)
//!
//! `SCALING_WORKLOADS=bare,scopes_10k` runs only the workloads it names.
//! `SCALING_SUBSCRIBER=debug` runs them with a DEBUG subscriber listening.
//! `SCALING_LINES_ONLY=1` skips criterion's own samples of the `scaling`
//! group and prints the lines alone (a minute instead of three).
//! `SCALING_OFF=words` (or
//! `all`) follows each throttle workload with itself with that performance
//! mechanism off (`scopes_10k-no_words`), through the registry builder's
//! hidden bench hook: the lock-free words of plain scopes. Its worth is
//! then measured in one run, its samples taken in turn with the workload's.
//!
//! The `backlog` group measures requests that wait: 20 000 and 40 000
//! requests spawned at once (tasks on one thread) against 64 lanes, half
//! of them beyond `max_queued` (so they wait in `poll_ready` too), through
//! the throttle and through a tokio semaphore held across the call (the
//! bare client of `loadtest` (b)). After criterion's report it prints
//! `backlog depth=<n> throttle ns=<..> semaphore ns=<..> ratio=<..>` per
//! depth (medians of 7 runs each, taken in turn): the time per request
//! should not grow with the depth.
//!
//! ```text
//! cargo bench --bench overhead
//! cargo bench --bench overhead -- scaling
//! cargo bench --bench overhead -- backlog
//! ```

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use tower::Service;
use tower_throttle::registry::RegistryBuilder;
use tower_throttle::{Registry, ScopeConfig, Scopes, ThrottleLayer};

#[path = "variants/mod.rs"]
mod variants;

use variants::backlog::{backlog_semaphore, backlog_throttle, drive_backlog};
use variants::{
    bare, drive, governor_keyed, unthrottled_builder, unthrottled_registry, unthrottled_scope, uris,
    Governor, LockedShards, Locks, MECHANISMS,
};

const MANY_SCOPES: usize = 100_000;

fn overhead(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let one = uris(1);
    let many = uris(MANY_SCOPES);
    let mut group = c.benchmark_group("overhead");

    group.bench_function("bare", |b| {
        let mut service = bare();
        b.iter_custom(|iters| runtime.block_on(drive(&mut service, &one, iters)));
    });

    group.bench_function("concurrency_limit", |b| {
        let mut service = tower::limit::ConcurrencyLimit::new(bare(), 1_000);
        b.iter_custom(|iters| runtime.block_on(drive(&mut service, &one, iters)));
    });

    for (name, uris) in [
        ("governor_keyed/1_key", &one),
        ("governor_keyed/100k_keys", &many),
    ] {
        group.bench_function(name, |b| {
            let mut service = governor_keyed();
            b.iter_custom(|iters| runtime.block_on(drive(&mut service, uris, iters)));
        });
    }

    group.bench_function("throttle/1_scope", |b| {
        let mut service = ThrottleLayer::new(unthrottled_registry()).layer_service(bare());
        b.iter_custom(|iters| runtime.block_on(drive(&mut service, &one, iters)));
    });

    group.bench_function("throttle/1_scope_recorded", |b| {
        // `record_scopes(true)`: the `Scopes` extension inserted too.
        let layer = ThrottleLayer::new(unthrottled_registry()).record_scopes(true);
        let mut service = layer.layer_service(bare());
        b.iter_custom(|iters| runtime.block_on(drive(&mut service, &one, iters)));
    });

    group.bench_function("throttle/100k_scopes", |b| {
        let mut service = ThrottleLayer::new(unthrottled_registry()).layer_service(bare());
        // Create every scope first, so the figure is the steady state of a
        // crawl over 100 000 sites, not their first sight.
        runtime.block_on(drive(&mut service, &many, MANY_SCOPES as u64));
        b.iter_custom(|iters| runtime.block_on(drive(&mut service, &many, iters)));
    });

    group.finish();
}

const SCALING_SCOPES: usize = 10_000;

/// Runs `iters` requests split over `threads` OS threads, each driving its
/// own clone of one of `services` (thread `t` the `t`-th, round the list)
/// on a current-thread runtime; returns the wall time for all of them.
fn drive_threads<S, B>(services: &[S], uris: &[http::Uri], iters: u64, threads: u64) -> Duration
where
    S: Service<http::Request<()>, Response = http::Response<B>> + Clone + Send,
    B: Send + 'static,
    S::Error: std::fmt::Debug,
{
    let start = std::sync::Barrier::new(threads as usize + 1);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|thread| {
                let mut service = services[thread as usize % services.len()].clone();
                let start = &start;
                // Each thread visits the scopes from its own offset, so two
                // threads work on different scopes at any moment.
                let offset = (thread as usize * uris.len()) / threads as usize;
                scope.spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    // Parsed again, not cloned: a clone shares the URI's
                    // bytes, and every request's clone of it would then
                    // write one reference count from both threads (for a
                    // one-host workload, on every request), a line the
                    // harness, not the service, would share.
                    let mine: Vec<http::Uri> = uris[offset..]
                        .iter()
                        .chain(&uris[..offset])
                        .map(|uri| uri.to_string().parse().expect("a URI parses again"))
                        .collect();
                    start.wait();
                    runtime.block_on(drive(&mut service, &mine, iters / threads))
                })
            })
            .collect();
        start.wait();
        let began = Instant::now();
        for worker in workers {
            worker.join().unwrap();
        }
        began.elapsed()
    })
}

/// A workload of the `scaling` group: its services (one, shared by every
/// thread, but for the `_split` ceiling: one per thread) and the URIs its
/// requests cycle over.
struct Workload<B> {
    name: String,
    services: Vec<ScalingService<B>>,
    uris: Vec<http::Uri>,
}

/// The services the workloads drive: one type (enums, no boxing), so the
/// workloads are a list: the bare service or the governor peer, or the
/// throttle.
type ScalingService<B> = tower::util::Either<tower::util::Either<B, Peer<B>>, Throttled<B>>;

/// The throttle, its response's body unwrapped to the peers' type (which
/// ends the request, as dropping the response would).
type Throttled<B> =
    tower::util::MapResponse<tower_throttle::Throttle<B>, fn(ThrottledResponse) -> http::Response<()>>;

type ThrottledResponse = http::Response<tower_throttle::throttle::ThrottledBody<()>>;

fn unwrap_body(response: ThrottledResponse) -> http::Response<()> {
    response.map(tower_throttle::throttle::ThrottledBody::into_inner)
}

/// The peers of the scaling workloads: governor's keyed limiter, or the
/// least a registry of locked shards does.
type Peer<B> = tower::util::Either<Governor<B>, LockedShards<B>>;

/// The workloads of issue 26: the bare service (and governor's keyed
/// check on one key, the lock-free peer of a hot scope); one scope (1 000 lanes,
/// delay 0); one scope at 64 lanes and delay 0 (an API client's hot host);
/// one scope with every admission under the registry's lock (for
/// comparison); 10 000 scopes (the threads half the list apart, or
/// together); two scopes per request (each host and a scope of its own
/// beside it, over 10 000 hosts); and a crawl behind `IpScopeLayer`
/// (`ip_scoped_10k`: 10 000 hosts on 1 000 servers, each request its
/// host's scope and its server's).
fn workloads<B: Clone>(bare: impl Fn() -> B) -> Vec<Workload<B>> {
    let peer = |peer: Peer<B>| tower::util::Either::Left(tower::util::Either::Right(peer));
    let workload = |name: &str, service, uris| Workload {
        name: name.to_string(),
        services: vec![service],
        uris,
    };
    let mut list = vec![
        workload(
            "bare",
            tower::util::Either::Left(tower::util::Either::Left(bare())),
            uris(1),
        ),
        // The peer of the hot scope: governor's keyed check on one host,
        // one limiter for both threads.
        workload(
            "governor_1_key",
            peer(tower::util::Either::Left(Governor::new(bare()))),
            uris(1),
        ),
        // The peer of `scopes_10k`: governor's keyed check over the same
        // 10 000 hosts, one limiter (its keys in a sharded map) for both
        // threads.
        workload(
            "governor_10k_keys",
            peer(tower::util::Either::Left(Governor::new(bare()))),
            uris(SCALING_SCOPES),
        ),
        // The floor of any registry of locked shards over the same 10 000
        // hosts: each request locks its host's shard (one of eight) twice,
        // as the throttle's lock path locks the registry, and counts itself
        // in and out; nothing else.
        workload(
            "locked_shards_10k",
            peer(tower::util::Either::Right(LockedShards::new(
                bare(),
                8,
                Locks::Twice,
            ))),
            uris(SCALING_SCOPES),
        ),
        // `locked_shards_10k` locking once per request: the ceiling of a
        // registry whose requests end without the lock.
        workload(
            "locked_once_10k",
            peer(tower::util::Either::Right(LockedShards::new(
                bare(),
                8,
                Locks::Once,
            ))),
            uris(SCALING_SCOPES),
        ),
    ];
    list.extend(throttled_workloads(&bare, "", |builder| builder));
    list
}

/// The throttle's workloads, each registry's builder passed through
/// `tweak` and each name followed by `suffix`: the workloads as they are
/// (`""`, no change), or with a mechanism off (see `variants::MECHANISMS`).
fn throttled_workloads<B: Clone>(
    bare: &impl Fn() -> B,
    suffix: &str,
    tweak: impl Fn(RegistryBuilder) -> RegistryBuilder,
) -> Vec<Workload<B>> {
    let throttled = |registry: RegistryBuilder| {
        let registry = tweak(registry).build().unwrap();
        let throttle = ThrottleLayer::new(registry).layer_service(bare());
        tower::util::Either::Right(tower::util::MapResponse::new(throttle, unwrap_body as fn(_) -> _))
    };
    let workload = |name: &str, builders: Vec<RegistryBuilder>, uris| Workload {
        name: format!("{name}{suffix}"),
        services: builders.into_iter().map(throttled).collect(),
        uris,
    };
    let two_scopes = || {
        unthrottled_builder().resolver(|head: &tower_throttle::scope::RequestHead<'_>| {
            let host = head.host().unwrap_or_default();
            Scopes::from([host.to_string(), format!("{host}#api")])
        })
    };
    // The scopes `IpScopeLayer` would give (see `ip_scopes`), the IP
    // scopes made once, as its cache of lookups does.
    let servers: std::sync::Arc<[tower_throttle::Scope]> = (0..SCALING_SERVERS)
        .map(|server| format!("ip:10.0.{}.{}", server / 256, server % 256).into())
        .collect();
    let ip_scoped = || {
        let servers = servers.clone();
        unthrottled_builder().ip_scopes(unthrottled_scope()).resolver(
            move |head: &tower_throttle::scope::RequestHead<'_>| {
                let host = head.host().unwrap_or_default();
                let server = &servers[host_number(&host) % servers.len()];
                Scopes::from([tower_throttle::Scope::from(host), server.clone()])
            },
        )
    };
    let c64 = || {
        Registry::builder().max_concurrency(1_000).default_scope(
            ScopeConfig::default()
                .concurrency(64)
                .delay(Duration::ZERO)
                .delay_per_slot(Duration::ZERO)
                .jitter(0.0),
        )
    };
    vec![
        workload("one_scope", vec![unthrottled_builder()], uris(1)),
        workload("one_scope_delay0_c64", vec![c64()], uris(1)),
        // `one_scope` with every admission under the lock, as before the
        // lock-free path of plain scopes: the comparison in the same run.
        workload(
            "one_scope_locked",
            vec![unthrottled_builder().lock_free_plain_scopes(false)],
            uris(1),
        ),
        workload("scopes_10k", vec![unthrottled_builder()], uris(SCALING_SCOPES)),
        // `scopes_10k` with both threads going round the scopes in the
        // same order from the same start (the list twice over: the second
        // thread's offset is the second copy), so they meet on every
        // scope, as a crawl's workers do on a frontier ordered by host;
        // `scopes_10k`'s threads start half the list apart.
        workload(
            "scopes_10k_together",
            vec![unthrottled_builder()],
            [uris(SCALING_SCOPES), uris(SCALING_SCOPES)].concat(),
        ),
        // The ceiling of any split of the registry's state: each thread
        // drives a registry of its own over the same 10 000 scopes, so the
        // threads share nothing of the throttle's (`speedup` against
        // `scopes_10k`'s 1-thread figure is what no sharding can pass on
        // this machine).
        workload(
            "scopes_10k_split",
            vec![unthrottled_builder(), unthrottled_builder()],
            uris(SCALING_SCOPES),
        ),
        workload("multi_scope_2", vec![two_scopes()], uris(SCALING_SCOPES)),
        workload("ip_scoped_10k", vec![ip_scoped()], uris(SCALING_SCOPES)),
        // An API client behind `IpScopeLayer`: one host, each request its
        // host's scope and its server's.
        workload("ip_scoped_1", vec![ip_scoped()], uris(1)),
    ]
}

/// The servers of `ip_scoped_10k`: ten hosts on each.
const SCALING_SERVERS: usize = 1_000;

/// The number in a host name of [`uris`] (`host<n>.example`).
fn host_number(host: &str) -> usize {
    host.trim_start_matches("host")
        .split('.')
        .next()
        .and_then(|number| number.parse().ok())
        .unwrap_or(0)
}

/// Requests per sample of the `scaling` lines, and samples per figure (the
/// median is reported).
const LINE_REQUESTS: u64 = 200_000;
const LINE_SAMPLES: usize = 15;

/// The median times per request of each workload driven from 1 and from
/// 2 threads. The samples go round the workloads, in a new order each
/// round, and within each workload alternate 1 and 2 threads, so that a
/// spell of other work on this shared machine weighs on every figure alike
/// instead of on one workload's, or one thread count's, and no workload
/// always runs after the same one (whose memory the caches then hold).
fn ns_per_request<B>(workloads: &[Workload<B>]) -> Vec<(f64, f64)>
where
    ScalingService<B>: Service<http::Request<()>, Response = http::Response<()>> + Clone + Send,
    <ScalingService<B> as Service<http::Request<()>>>::Error: std::fmt::Debug,
{
    let sample = |workload: &Workload<B>, threads: u64| {
        drive_threads(&workload.services, &workload.uris, LINE_REQUESTS, threads).as_nanos() as f64
            / LINE_REQUESTS as f64
    };
    let mut samples = vec![(Vec::new(), Vec::new()); workloads.len()];
    let mut order: Vec<usize> = (0..workloads.len()).collect();
    let mut rng = fastrand::Rng::with_seed(26);
    for _ in 0..LINE_SAMPLES {
        rng.shuffle(&mut order);
        for &index in &order {
            let (one, two) = &mut samples[index];
            one.push(sample(&workloads[index], 1));
            two.push(sample(&workloads[index], 2));
        }
    }
    samples
        .iter_mut()
        .map(|(one, two)| (median(one), median(two)))
        .collect()
}

fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Whether the command line's filter (criterion's first free argument)
/// selects the group `group`, or there is none.
fn group_selected(group: &str) -> bool {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with('-'))
        .collect();
    filters.is_empty()
        || filters
            .iter()
            .any(|filter| group.contains(filter.as_str()) || filter.starts_with(group))
}

/// With `SCALING_SUBSCRIBER=debug`, listens to the crate's events at
/// DEBUG (formatted, then thrown away), as a user who debugs a throughput
/// problem does: the throttle must scale the same with a subscriber as
/// without (its words log their sends rather than close).
fn install_subscriber_if_asked() {
    if std::env::var("SCALING_SUBSCRIBER").as_deref() != Ok("debug") {
        return;
    }
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(std::io::sink)
        .finish();
    tracing::subscriber::set_global_default(subscriber).expect("no subscriber was set before");
    println!("scaling: a DEBUG subscriber listens (SCALING_SUBSCRIBER=debug)");
}

/// The workloads `SCALING_WORKLOADS` names (a comma-separated list of
/// names), or all of them when it is not set: a shorter run while working
/// on one of them. With `SCALING_OFF` (a comma-separated list of
/// [`MECHANISMS`], or `all`), each throttle workload is followed by itself
/// with each of those mechanisms off, named with `-no_<mechanism>`, so
/// that the lines compare them in one run.
fn selected_workloads<B: Clone>(bare: impl Fn() -> B) -> Vec<Workload<B>> {
    let chosen = std::env::var("SCALING_WORKLOADS").ok();
    let off = std::env::var("SCALING_OFF").unwrap_or_default();
    let off: Vec<_> = MECHANISMS
        .iter()
        .filter(|(name, _)| {
            off.split(',')
                .any(|wanted| [*name, "all"].contains(&wanted.trim()))
        })
        .collect();
    let is_chosen = |name: &str| {
        chosen
            .as_deref()
            .is_none_or(|names| names.split(',').any(|chosen| chosen.trim() == name))
    };
    let mut variants: Vec<Vec<Workload<B>>> = off
        .iter()
        .map(|(mechanism, hook)| throttled_workloads(&bare, &format!("-no_{mechanism}"), hook))
        .collect();
    let mut list = Vec::new();
    for workload in workloads(&bare) {
        let name = workload.name.clone();
        if !is_chosen(&name) {
            continue;
        }
        list.push(workload);
        for variant in &mut variants {
            if let Some(at) = variant
                .iter()
                .position(|variant| variant.name.starts_with(&format!("{name}-no_")))
            {
                list.push(variant.swap_remove(at));
            }
        }
    }
    list
}

fn scaling(c: &mut Criterion) {
    install_subscriber_if_asked();
    let workloads = selected_workloads(bare);
    let lines_only = std::env::var_os("SCALING_LINES_ONLY").is_some();
    let mut group = c.benchmark_group("scaling");
    for workload in &workloads {
        // Every scope of every registry seen once first: the steady state
        // of a crawl.
        let threads = workload.services.len() as u64;
        drive_threads(
            &workload.services,
            &workload.uris,
            workload.uris.len() as u64 * threads,
            threads,
        );
    }
    for workload in workloads.iter().filter(|_| !lines_only) {
        for threads in [1, 2] {
            group.bench_function(format!("{}/{threads}_threads", workload.name), |b| {
                b.iter_custom(|iters| drive_threads(&workload.services, &workload.uris, iters, threads));
            });
        }
    }
    group.finish();
    if !group_selected("scaling") {
        return;
    }
    // One line per workload, for scripts: the median of LINE_SAMPLES runs
    // of LINE_REQUESTS requests each; speedup = throughput at 2 threads
    // over 1 thread (ns at 1 / ns at 2).
    println!();
    for (workload, (one, two)) in workloads.iter().zip(ns_per_request(&workloads)) {
        println!(
            "scaling {} threads=1 ns={one:.1} threads=2 ns={two:.1} speedup={:.2}",
            workload.name,
            one / two
        );
    }
}

trait LayerService {
    fn layer_service<S>(&self, inner: S) -> tower_throttle::Throttle<S>;
}

impl LayerService for ThrottleLayer {
    fn layer_service<S>(&self, inner: S) -> tower_throttle::Throttle<S> {
        tower::Layer::layer(self, inner)
    }
}

/// `backlog`: requests that wait. A backlog of 20 000 and 40 000 requests
/// spawned at once against 64 lanes, through the throttle and through a
/// tokio semaphore; after criterion's report, one line per depth for
/// scripts (the median over `BACKLOG_SAMPLES` runs of each, taken in turn):
/// `backlog depth=<n> throttle ns=<..> semaphore ns=<..> ratio=<..>`.
fn backlog(c: &mut Criterion) {
    const BACKLOG_SAMPLES: usize = 7;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let uri: http::Uri = "https://backlog.example/".parse().unwrap();
    let mut group = c.benchmark_group("backlog");
    group.sample_size(10);
    let depth = 20_000;
    group.bench_function("throttle/20k", |b| {
        b.iter_custom(|iters| backlog_per_request(&runtime, &backlog_throttle(depth), &uri, depth, iters));
    });
    group.bench_function("semaphore/20k", |b| {
        b.iter_custom(|iters| backlog_per_request(&runtime, &backlog_semaphore(), &uri, depth, iters));
    });
    group.finish();
    if !group_selected("backlog") {
        return;
    }
    println!();
    for depth in [20_000, 40_000] {
        let (mut throttle, mut semaphore) = (Vec::new(), Vec::new());
        for _ in 0..BACKLOG_SAMPLES {
            let ns = |elapsed: Duration| elapsed.as_nanos() as f64 / depth as f64;
            throttle.push(ns(runtime.block_on(drive_backlog(
                &backlog_throttle(depth),
                &uri,
                depth,
            ))));
            semaphore.push(ns(runtime.block_on(drive_backlog(
                &backlog_semaphore(),
                &uri,
                depth,
            ))));
        }
        let (throttle, semaphore) = (median(&mut throttle), median(&mut semaphore));
        println!(
            "backlog depth={depth} throttle ns={throttle:.1} semaphore ns={semaphore:.1} ratio={:.2}",
            throttle / semaphore
        );
    }
}

/// `iters` requests as backlogs of `depth`, timed per request and scaled
/// to `iters` (criterion's contract for `iter_custom`).
fn backlog_per_request<S, B>(
    runtime: &tokio::runtime::Runtime,
    service: &S,
    uri: &http::Uri,
    depth: usize,
    iters: u64,
) -> Duration
where
    S: Service<http::Request<()>, Response = http::Response<B>> + Clone + 'static,
    B: Send + 'static,
    S::Error: std::fmt::Debug,
{
    let batches = iters.div_ceil(depth as u64).max(1);
    let elapsed: Duration = (0..batches)
        .map(|_| runtime.block_on(drive_backlog(service, uri, depth)))
        .sum();
    elapsed.mul_f64(iters as f64 / (batches * depth as u64) as f64)
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = overhead, scaling, backlog
}
criterion_main!(benches);
