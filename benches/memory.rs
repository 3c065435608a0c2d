//! The memory figures of docs/performance.md, measured with a counting global
//! allocator: bytes per idle scope, bytes per waiting request, bytes per
//! request pending in a frontier, the CPU time 100 000 waiting requests
//! cost over 2 s, and the stack size of the public types a user stores.
//! Prints a table against the budgets (≤ 256 bytes per idle scope, key and
//! index included; ≤ 256 bytes per waiting request, body excluded; ≤ 96
//! bytes per pending request beyond the request itself; ~0 CPU while
//! waiting) and always exits 0: it is a measurement, not a test (CI only
//! compiles it).
//!
//! ```text
//! cargo bench --bench memory
//! ```
//!
//! # How the figures are taken
//!
//! The global allocator forwards to `System` and keeps the live heap bytes
//! and live allocations in atomics. Each figure is
//! `(live after − live before) / N` on a current-thread tokio runtime, with
//! everything that is not the registry's (the URIs, the `Vec` holding the
//! futures) allocated before the "before" snapshot.
//!
//! - **Idle scope**: N = 100 000 URIs on distinct hosts are parsed first;
//!   then one request per host goes through `ThrottleLayer` (delay 0) over
//!   the bare service and completes. What is live afterwards is what the
//!   registry keeps for N idle scopes: scope state, key, index entry, lanes.
//! - **Waiting request**: one scope with delay 1 h; a first request is sent
//!   (creating the scope) before the snapshot, then N = 100 000 futures are
//!   created and polled once each with a no-op waker, so all wait. Each
//!   future is boxed (the caller's choice of storage), and each request
//!   carries its own parts; both are subtracted per request:
//!   `size_of` of the boxed future, `size_of::<http::Request<()>>()` (the
//!   request is moved into the future's heap block while it waits) and the
//!   heap bytes that building one request allocates (measured by building
//!   one the same way). What remains is the throttle's own cost per waiter:
//!   the ticket in the scheduler, the queue entry, the `Scopes` extension
//!   the throttle inserts with `record_scopes(true)` (shown apart).
//! - **Pending request in a frontier**: N = 1 000 000 requests over
//!   10 000 scopes (100 each, pushed site by site, as a crawler's links
//!   come) into a `frontier::Frontier` around `ThrottleLayer` over the bare
//!   service, never polled, so all stay pending. The URIs are parsed (and
//!   cloned once, so their buffers are shared) before the snapshot; each
//!   request is built in the loop, and what building one allocates and its
//!   own `size_of` (the frontier boxes it) are subtracted per request, as
//!   for a waiting request. What remains is the frontier's bookkeeping and
//!   the tag: measured with `push` (the tag is the request's URI, a clone:
//!   `size_of::<http::Uri>()` inline, its buffers shared) and with
//!   `push_tagged(request, ())` (no tag: the frontier's own cost).
//! - **CPU while waiting**: utime + stime from `/proc/self/stat` (clock
//!   ticks, usually 10 ms each) over 2 s of `tokio::time::sleep` with the
//!   100 000 waiters pending.
//!
//! # Limits of the method
//!
//! - Only the bytes requested are counted: the allocator's rounding and
//!   per-block headers (typically 8–16 bytes a block) are not, so the real
//!   resident cost is somewhat higher; the live block count per item is
//!   printed so a reader can estimate it.
//! - Hash maps, slabs and vectors grow by doubling, so the per-item figures
//!   include their spare capacity and depend on N (reported): right after a
//!   doubling they are highest, just before one lowest.
//! - The registry is dropped after the idle-scope run and the change in
//!   live bytes against the "before" snapshot printed: near 0 means the
//!   bytes counted were the registry's (a few hundred either way are the
//!   runtime's own buffers).
//! - The figures are for the host resolver's keys (`host12345.example`,
//!   17 bytes); longer keys cost their extra length.

use std::alloc::{GlobalAlloc, Layout, System};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use tower::{Layer, Service, ServiceExt};
use tower_throttle::frontier::{FrontierBuilder, FrontierHandle};
use tower_throttle::{Registry, ScopeConfig, ScopeStats, Scopes, ThrottleLayer};

#[path = "variants/mod.rs"]
mod variants;

use variants::{bare, drive, request, unthrottled_registry, uris};

/// Counts live bytes and live allocations, forwarding every call to
/// `System`.
struct Counting;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
static LIVE_BLOCKS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards its arguments unchanged to `System`, which
// implements `GlobalAlloc` soundly; the only addition is atomic counter
// updates, which neither allocate nor touch the memory handed out. So each
// method upholds exactly the contract `System` upholds.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's guarantees on `layout` are passed on as is.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
            LIVE_BLOCKS.fetch_add(1, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
            LIVE_BLOCKS.fetch_add(1, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, hence from `System`, with
        // this `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        LIVE_BLOCKS.fetch_sub(1, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `dealloc`; `new_size` is passed on as the caller
        // gave it.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            LIVE_BYTES.fetch_add(new_size, Ordering::Relaxed);
            LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Live heap bytes and blocks at one instant.
#[derive(Clone, Copy)]
struct Snapshot {
    bytes: usize,
    blocks: usize,
}

fn snapshot() -> Snapshot {
    Snapshot {
        bytes: LIVE_BYTES.load(Ordering::Relaxed),
        blocks: LIVE_BLOCKS.load(Ordering::Relaxed),
    }
}

/// Live bytes and blocks per item between two snapshots.
fn per_item(before: Snapshot, after: Snapshot, count: usize) -> (f64, f64) {
    (
        (after.bytes as f64 - before.bytes as f64) / count as f64,
        (after.blocks as f64 - before.blocks as f64) / count as f64,
    )
}

const SCOPES: usize = 100_000;
const WAITERS: usize = 100_000;
const BUDGET_BYTES: f64 = 256.0;
const PENDING: usize = 1_000_000;
const PENDING_SCOPES: usize = 10_000;
const PENDING_BUDGET_BYTES: f64 = 96.0;
const IDLE_WALL: Duration = Duration::from_secs(2);

/// One row of the final table.
struct Row {
    figure: String,
    measured: String,
    budget: &'static str,
    verdict: &'static str,
}

fn verdict(pass: bool) -> &'static str {
    if pass {
        "PASS"
    } else {
        "MISS"
    }
}

/// Process CPU time (user + system) in clock ticks.
fn cpu_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces: count fields after its
    // closing parenthesis, where field 3 (state) comes first.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

fn future_size<S: Service<R>, R>(_service: &S) -> usize {
    std::mem::size_of::<S::Future>()
}

/// Per idle scope: live bytes and blocks.
async fn idle_scopes() -> (f64, f64) {
    let hosts = uris(SCOPES);
    let mut service = ThrottleLayer::new(unthrottled_registry()).layer(bare());
    let before = snapshot();
    drive(&mut service, &hosts, SCOPES as u64).await;
    let after = snapshot();
    let figure = per_item(before, after, SCOPES);
    drop(service);
    let dropped = snapshot();
    println!(
        "  idle scopes: {SCOPES} scopes held {} bytes; after dropping the service and registry, live bytes {:+} against before",
        after.bytes as isize - before.bytes as isize,
        dropped.bytes as isize - before.bytes as isize,
    );
    figure
}

/// The figures of the waiting-request run.
struct Waiting {
    /// Live bytes per waiter, everything included.
    gross: f64,
    /// What is subtracted per waiter (boxed future + request parts).
    subtracted: f64,
    blocks: f64,
    boxed_future: usize,
    request_inline: usize,
    request_heap: f64,
    queued: usize,
    cpu_ticks: Option<u64>,
    wall: Duration,
}

impl Waiting {
    fn net(&self) -> f64 {
        self.gross - self.subtracted
    }
}

/// Creates `WAITERS` waiting requests on one scope with delay 1 h, and
/// optionally measures the CPU they cost over `IDLE_WALL`.
async fn waiting_requests(record_scopes: bool, measure_cpu: bool) -> Waiting {
    let registry = Registry::builder()
        .max_queued(2 * WAITERS)
        .default_scope(
            ScopeConfig::default()
                .concurrency(1)
                .delay(Duration::from_secs(3_600))
                .delay_per_slot(Duration::from_secs(3_600))
                .jitter(0.0),
        )
        .build()
        .unwrap();
    let mut service = ThrottleLayer::new(registry.clone())
        .record_scopes(record_scopes)
        .layer(bare());
    let uri = uris(1).pop().unwrap();
    let boxed_future = future_size(&service);
    let mut waiters = Vec::with_capacity(WAITERS);
    let mut cx = Context::from_waker(Waker::noop());

    // The first request creates the scope and goes at once; every later one
    // waits an hour behind it.
    let mut first = Box::pin(service.ready().await.unwrap().call(request(&uri)));
    assert!(first.as_mut().poll(&mut cx).is_ready());
    drop(first);

    // Heap bytes one request built the same way allocates (a second one, so
    // one-time costs such as the URI's shared buffer are already paid).
    let probe = request(&uri);
    let before_request = snapshot();
    let probe_again = request(&uri);
    let request_heap = snapshot().bytes.saturating_sub(before_request.bytes) as f64;
    drop((probe, probe_again));
    let request_inline = std::mem::size_of::<http::Request<()>>();

    let before = snapshot();
    for _ in 0..WAITERS {
        let mut future = Box::pin(service.ready().await.unwrap().call(request(&uri)));
        assert!(future.as_mut().poll(&mut cx).is_pending());
        waiters.push(future);
    }
    let after = snapshot();
    let (gross, blocks) = per_item(before, after, WAITERS);
    let queued = registry
        .scope_stats("host0.example")
        .map_or(0, |stats| stats.queued);

    let mut cpu = None;
    let start = Instant::now();
    if measure_cpu {
        let cpu_before = cpu_ticks();
        tokio::time::sleep(IDLE_WALL).await;
        cpu = cpu_ticks().zip(cpu_before).map(|(after, before)| after - before);
    }
    let wall = start.elapsed();
    drop(waiters);

    Waiting {
        gross,
        subtracted: boxed_future as f64 + request_inline as f64 + request_heap,
        blocks,
        boxed_future,
        request_inline,
        request_heap,
        queued,
        cpu_ticks: cpu,
        wall,
    }
}

/// The figures of a frontier-pending run.
struct Pending {
    gross: f64,
    blocks: f64,
    request_inline: usize,
    request_heap: f64,
    /// Live bytes against before, once the frontier is dropped.
    after_drop: isize,
}

impl Pending {
    fn net(&self) -> f64 {
        self.gross - self.request_inline as f64 - self.request_heap
    }
}

/// How a frontier-pending run tags its requests.
#[derive(Clone, Copy, PartialEq)]
enum Tagging {
    /// `push`: the request's URI.
    Uri,
    /// `push_tagged(request, ())`.
    Nothing,
}

/// Pushes `PENDING` requests over `PENDING_SCOPES` scopes, site by site,
/// into a frontier that is never polled.
async fn frontier_pending(tagging: Tagging) -> Pending {
    let registry = Registry::builder()
        .default_scope(ScopeConfig::default().delay(Duration::from_secs(3_600)))
        .build()
        .unwrap();
    let hosts = uris(PENDING_SCOPES);
    // One clone each first: a parsed URI's buffers become shared at their
    // first clone (an allocation), and later clones only count references.
    drop(hosts.to_vec());
    let service = ThrottleLayer::new(registry.clone()).layer(bare());

    let probe = request(&hosts[0]);
    let before_request = snapshot();
    let probe_again = request(&hosts[0]);
    let request_heap = snapshot().bytes.saturating_sub(before_request.bytes) as f64;
    drop((probe, probe_again));

    let per_scope = PENDING / PENDING_SCOPES;
    let pending = match tagging {
        Tagging::Uri => {
            let (frontier, handle) = FrontierBuilder::new(registry.clone()).build(service).unwrap();
            let before = snapshot();
            for uri in &hosts {
                for _ in 0..per_scope {
                    handle.push(request(uri)).await.unwrap();
                }
            }
            let after = snapshot();
            assert_eq!(handle.pending(), PENDING);
            drop((frontier, handle));
            (before, after)
        }
        Tagging::Nothing => {
            let (frontier, handle): (_, FrontierHandle<(), ()>) =
                FrontierBuilder::new(registry.clone()).build(service).unwrap();
            let before = snapshot();
            for uri in &hosts {
                for _ in 0..per_scope {
                    handle.push_tagged(request(uri), ()).await.unwrap();
                }
            }
            let after = snapshot();
            assert_eq!(handle.pending(), PENDING);
            drop((frontier, handle));
            (before, after)
        }
    };
    let (before, after) = pending;
    let (gross, blocks) = per_item(before, after, PENDING);
    Pending {
        gross,
        blocks,
        request_inline: std::mem::size_of::<http::Request<()>>(),
        request_heap,
        after_drop: snapshot().bytes as isize - before.bytes as isize,
    }
}

fn main() {
    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut rows = Vec::new();

    println!("memory: N = {SCOPES} idle scopes, N = {WAITERS} waiting requests");
    let (scope_bytes, scope_blocks) = runtime.block_on(idle_scopes());
    println!("  idle scopes: {scope_bytes:.1} bytes and {scope_blocks:.2} live blocks per scope");
    rows.push(Row {
        figure: format!("bytes per idle scope (N = {SCOPES})"),
        measured: format!("{scope_bytes:.1}"),
        budget: "≤ 256",
        verdict: verdict(scope_bytes <= BUDGET_BYTES),
    });

    let waiting = runtime.block_on(waiting_requests(false, true));
    println!(
        "  waiting: {} queued in the scope; {:.1} bytes and {:.2} live blocks per waiter in all",
        waiting.queued, waiting.gross, waiting.blocks,
    );
    println!(
        "  waiting: subtracted per waiter {:.1} bytes = boxed future {} + http::Request<()> inline {} + its heap {:.1}",
        waiting.subtracted, waiting.boxed_future, waiting.request_inline, waiting.request_heap,
    );
    rows.push(Row {
        figure: format!("bytes per waiting request (N = {WAITERS})"),
        measured: format!("{:.1}", waiting.net()),
        budget: "≤ 256",
        verdict: verdict(waiting.net() <= BUDGET_BYTES),
    });

    let recorded = runtime.block_on(waiting_requests(true, false));
    rows.push(Row {
        figure: "  same, record_scopes(true)".to_string(),
        measured: format!("{:.1}", recorded.net()),
        budget: "(info)",
        verdict: "",
    });

    println!("memory: N = {PENDING} requests pending in a frontier over {PENDING_SCOPES} scopes");
    for (tagging, label) in [
        (Tagging::Uri, "push (tag: the URI)"),
        (Tagging::Nothing, "push_tagged(request, ())"),
    ] {
        let pending = runtime.block_on(frontier_pending(tagging));
        println!(
            "  frontier, {label}: {:.1} bytes and {:.2} live blocks per pending request in all; subtracted {:.1} = \
             http::Request<()> inline {} (boxed by the frontier) + its heap {:.1}; live bytes {:+} against before \
             once the frontier is dropped",
            pending.gross,
            pending.blocks,
            pending.request_inline as f64 + pending.request_heap,
            pending.request_inline,
            pending.request_heap,
            pending.after_drop,
        );
        rows.push(Row {
            figure: format!("bytes per pending request, {label}"),
            measured: format!("{:.1}", pending.net()),
            budget: "≤ 96",
            verdict: verdict(pending.net() <= PENDING_BUDGET_BYTES),
        });
    }

    match waiting.cpu_ticks {
        Some(ticks) => rows.push(Row {
            figure: format!(
                "CPU ticks, {WAITERS} waiters, {:.1} s idle",
                waiting.wall.as_secs_f64()
            ),
            measured: ticks.to_string(),
            budget: "~0",
            // A tick or two is the runtime's own wake-ups and rounding.
            verdict: verdict(ticks <= 2),
        }),
        None => rows.push(Row {
            figure: "CPU while waiting".to_string(),
            measured: "n/a".to_string(),
            budget: "~0",
            verdict: "(no /proc/self/stat)",
        }),
    }

    let throttle = ThrottleLayer::new(unthrottled_registry()).layer(bare());
    for (figure, size) in [
        ("size_of Scopes", std::mem::size_of::<Scopes>()),
        ("size_of ScopeStats", std::mem::size_of::<ScopeStats>()),
        ("size_of Throttle<bare> future", future_size(&throttle)),
        (
            "size_of http::Request<()>",
            std::mem::size_of::<http::Request<()>>(),
        ),
        ("size_of http::Uri (push's tag)", std::mem::size_of::<http::Uri>()),
    ] {
        rows.push(Row {
            figure: figure.to_string(),
            measured: size.to_string(),
            budget: "(info)",
            verdict: "",
        });
    }

    println!();
    println!("{:<48} {:>10} {:>8}  result", "figure", "measured", "budget");
    for row in &rows {
        println!(
            "{:<48} {:>10} {:>8}  {}",
            row.figure, row.measured, row.budget, row.verdict
        );
    }
    println!(
        "(bytes: live heap bytes requested, allocator rounding not counted; total {:.1} s)",
        started.elapsed().as_secs_f64()
    );
}
