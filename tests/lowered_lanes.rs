//! A plain scope's lanes lowered while threads admit and end on its
//! lock-free word: once the change has returned, and the requests that
//! started before it have ended, the inner service never sees more
//! requests of the scope in flight than the lanes in force.
//!
//! The race this guards against (issue 53): a request read the word's
//! lanes, the scheduler closed the word, adopted what was in flight and
//! opened it again with fewer lanes, and the request then admitted on the
//! reopened word against the old count. `loom/tests/word.rs` checks the
//! protocol under every interleaving; this test runs the real registry on
//! real threads, where the window is a few instructions wide, so it finds
//! the race only by chance: a guard, not a proof.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tower::{Layer, ServiceExt};
use tower_throttle::{Registry, ScopeConfig, ThrottleLayer};

/// The lanes before each change, and after it.
const HIGH: u32 = 8;
const LOW: u32 = 2;
/// Threads sending requests of the scope, one at a time each.
const THREADS: usize = 4;
/// How long the threads send. The issue asks for 10 s; 3 s of changes
/// every few hundred microseconds closes and reopens the word thousands
/// of times, which is what the test needs, in a third of the time.
const RUN: Duration = Duration::from_secs(3);

fn plain(lanes: u32) -> ScopeConfig {
    ScopeConfig::default()
        .concurrency(lanes)
        .delay(Duration::ZERO)
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0)
}

/// What the sampler knows, under one mutex.
#[derive(Default)]
struct Track {
    /// Bumped by each change once it has returned: odd while the lanes
    /// are lowered (and the change has returned), even from just before
    /// they are raised again.
    phase: u64,
    /// Requests not yet ended, by the phase in which they started.
    started: HashMap<u64, u32>,
    /// Requests in the inner service now.
    inner: u32,
    /// Requests in the inner service at once, at most, while the lanes
    /// in force were `LOW` and no request from before was left.
    peak_checked: u32,
    /// Times the inner service was entered under that check.
    checked: u64,
}

impl Track {
    /// Whether `LOW` lanes bind the requests now: the lowering has
    /// returned and every request that started before it has ended.
    fn low_binds(&self) -> bool {
        self.phase % 2 == 1
            && self
                .started
                .iter()
                .all(|(phase, count)| *phase >= self.phase || *count == 0)
    }
}

/// Holds the threads between requests for a moment after each change,
/// so that the scope drains and the next admission opens its word again
/// with the lanes then in force (the scheduler opens a word only with
/// nothing of the scope in flight). It waits for the threads at most a
/// millisecond: one held up in the middle of an admission must not be
/// waited for, since that is the race.
#[derive(Default)]
struct Gate {
    /// True while the threads may go on.
    open: AtomicBool,
    /// Threads waiting at the gate.
    waiting: AtomicUsize,
}

impl Gate {
    /// Between two requests of a thread: waits while the gate is shut.
    fn pass(&self) {
        if self.open.load(Ordering::SeqCst) {
            return;
        }
        self.waiting.fetch_add(1, Ordering::SeqCst);
        while !self.open.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        self.waiting.fetch_sub(1, Ordering::SeqCst);
    }

    /// Shuts the gate until every thread waits at it (or a millisecond
    /// passed), then opens it.
    fn drain(&self) {
        self.open.store(false, Ordering::SeqCst);
        let shut = Instant::now();
        while self.waiting.load(Ordering::SeqCst) < THREADS && shut.elapsed() < Duration::from_millis(1) {
            std::thread::yield_now();
        }
        self.open.store(true, Ordering::SeqCst);
    }
}

#[test]
fn lanes_lowered_while_threads_admit_on_the_word_never_pass_the_new_lanes() {
    let registry = Registry::builder()
        .max_concurrency(64)
        .default_scope(plain(HIGH))
        .lock_free_plain_scopes(true)
        .build()
        .unwrap();
    let track = Arc::new(Mutex::new(Track::default()));
    let inner_track = track.clone();
    let inner = tower::service_fn(move |_request: http::Request<()>| {
        let track = inner_track.clone();
        async move {
            {
                let mut track = track.lock().unwrap();
                track.inner += 1;
                if track.low_binds() {
                    track.checked += 1;
                    track.peak_checked = track.peak_checked.max(track.inner);
                }
            }
            // A short stay in the inner service, handing the thread back.
            for _ in 0..fastrand::u8(0..4) {
                tokio::task::yield_now().await;
            }
            track.lock().unwrap().inner -= 1;
            Ok::<_, Infallible>(http::Response::new(()))
        }
    });
    let service = ThrottleLayer::new(registry.clone()).layer(inner);
    let stop = Arc::new(AtomicBool::new(false));
    let gate = Arc::new(Gate::default());
    gate.open.store(true, Ordering::SeqCst);

    let senders: Vec<_> = (0..THREADS)
        .map(|thread| {
            let service = service.clone();
            let track = track.clone();
            let stop = stop.clone();
            let gate = gate.clone();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let mut rng = fastrand::Rng::with_seed(thread as u64);
                let mut sent = 0u64;
                runtime.block_on(async {
                    while !stop.load(Ordering::Relaxed) {
                        let phase = {
                            let mut track = track.lock().unwrap();
                            let phase = track.phase;
                            *track.started.entry(phase).or_default() += 1;
                            phase
                        };
                        let request = http::Request::get("https://api.example/").body(()).unwrap();
                        service.clone().oneshot(request).await.unwrap();
                        *track.lock().unwrap().started.get_mut(&phase).unwrap() -= 1;
                        sent += 1;
                        gate.pass();
                        for _ in 0..rng.u32(0..200) {
                            std::hint::spin_loop();
                        }
                    }
                });
                sent
            })
        })
        .collect();

    let mut rng = fastrand::Rng::with_seed(53);
    let mut changes = 0u64;
    let start = Instant::now();
    while start.elapsed() < RUN {
        std::thread::sleep(Duration::from_micros(rng.u64(50..400)));
        registry.set_scope("api.example", plain(LOW)).unwrap();
        track.lock().unwrap().phase += 1;
        gate.drain();
        std::thread::sleep(Duration::from_micros(rng.u64(50..400)));
        // No longer checked from here: the lanes are raised next.
        track.lock().unwrap().phase += 1;
        registry.set_scope("api.example", plain(HIGH)).unwrap();
        gate.drain();
        changes += 1;
    }
    stop.store(true, Ordering::Relaxed);
    gate.open.store(true, Ordering::SeqCst);
    let sent: u64 = senders.into_iter().map(|sender| sender.join().unwrap()).sum();

    let track = track.lock().unwrap();
    assert!(
        track.peak_checked <= LOW,
        "{} requests in the inner service at once with {LOW} lanes in force",
        track.peak_checked
    );
    // The check ran: requests went in while the lowered lanes bound them,
    // and the threads filled them.
    assert!(changes > 100, "only {changes} changes");
    assert!(
        track.checked > 100,
        "only {} requests checked of {sent}",
        track.checked
    );
    assert_eq!(track.peak_checked, LOW, "the lowered lanes were never full");
    assert_eq!(registry.stats().in_flight, 0);
}
