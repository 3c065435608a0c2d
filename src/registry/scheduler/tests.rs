//! The scheduler on its own, at fixed instants: no runtime, no clock,
//! no futures. Every instant is `t0 + a duration`.

use std::task::Waker;
use std::time::Duration;

use super::*;

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// No delays, no jitter, `lanes` lanes.
fn free(lanes: u32) -> ScopeConfig {
    ScopeConfig::default()
        .concurrency(lanes)
        .delay(Duration::ZERO)
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0)
}

fn scheduler(default: ScopeConfig, max_concurrency: u32) -> Scheduler {
    Scheduler::new(
        default,
        Vec::<(Scope, ScopeConfig)>::new(),
        max_concurrency,
        fastrand::Rng::with_seed(1),
    )
}

/// An admitted ticket, as [`Driver::poll`] reports it (it hands the
/// request over at once).
const SENT: TicketPoll = TicketPoll::Sent {
    report_departure: false,
};

/// A test driver: the scheduler plus the wakers each call collected.
struct Driver {
    scheduler: Scheduler,
    woken: WakeList,
}

impl Driver {
    fn new(scheduler: Scheduler) -> Self {
        Driver {
            scheduler,
            woken: WakeList::new(),
        }
    }

    /// Queues a request; says whether it was sent at once (and then hands
    /// it over at once, as a response future does).
    fn enqueue(&mut self, scopes: impl Into<Scopes>, priority: i32, now: Instant) -> (TicketId, bool) {
        self.woken.clear();
        let admission =
            self.scheduler
                .enqueue(&scopes.into(), priority, FastMode::Never, now, &mut self.woken);
        let Admission::Ticket(id, admitted) = admission else {
            panic!("never admitted on a word: {admission:?}")
        };
        if admitted.is_some() {
            self.scheduler.depart(id, Stamp::of(now), now, &mut self.woken);
        }
        (id, admitted.is_some())
    }

    /// Polls a ticket; an admitted one is handed over at once.
    fn poll(&mut self, id: TicketId, now: Instant) -> TicketPoll {
        self.woken.clear();
        match self
            .scheduler
            .poll_ticket(id, now, Waker::noop(), &mut self.woken)
        {
            TicketPoll::Sent { .. } => {
                self.scheduler.depart(id, Stamp::of(now), now, &mut self.woken);
                SENT
            }
            waiting => waiting,
        }
    }

    fn finish(&mut self, id: TicketId, outcome: Outcome, now: Instant) {
        self.woken.clear();
        self.scheduler
            .finish(id, outcome, None, (now, None), &mut self.woken);
    }

    /// The lane ticket `id` took in its first scope.
    fn lane(&self, id: TicketId) -> usize {
        self.scheduler.tickets[id].seats.iter().next().unwrap().lane
    }

    fn in_flight(&self, scope: &str) -> u32 {
        self.scheduler
            .scope_with_id(scope)
            .map_or(0, |(_, scope)| scope.state.in_flight)
    }
}

const ANSWERED: Outcome = Outcome::Response {
    status: 200,
    adjust_autothrottle: true,
    answered_at: None,
};

fn waiting(timer: Option<Instant>) -> TicketPoll {
    TicketPoll::Waiting { timer }
}

/// Scrapy's worked example (lane choice: the free lane that becomes
/// eligible soonest): concurrency 2, delay 0.3 s, per-slot 1.0 s, no
/// jitter, instant responses, three requests at t=0 are sent at 0.0
/// (lane 1), 0.3 (lane 2) and 1.0 (lane 1).
#[test]
fn seeds_worked_example_sends_at_0_0_3_and_1_0_on_the_soonest_free_lane() {
    let config = ScopeConfig::default()
        .concurrency(2)
        .delay(ms(300))
        .delay_per_slot(ms(1000))
        .jitter(0.0);
    let mut d = Driver::new(scheduler(config, 16));
    let t0 = tokio::time::Instant::now();

    let (a, sent) = d.enqueue("site", 0, t0);
    assert!(sent, "the first request goes at once");
    assert_eq!(d.lane(a), 0);
    d.finish(a, ANSWERED, t0);

    let (b, sent_b) = d.enqueue("site", 0, t0);
    let (c, sent_c) = d.enqueue("site", 0, t0);
    assert!(!sent_b && !sent_c);
    // The head keeps the scope's one timer, for the scope delay.
    assert_eq!(d.poll(b, t0), waiting(Some(t0 + ms(300))));
    assert_eq!(d.poll(c, t0), waiting(None));

    // At 0.3 lane 1 is still in its per-slot delay: B takes a new lane.
    assert_eq!(d.poll(b, t0 + ms(300)), SENT);
    assert_eq!(d.lane(b), 1);
    d.finish(b, ANSWERED, t0 + ms(300));

    // Lane 1 frees at 1.0, lane 2 at 1.3, the scope delay ends at 0.6.
    assert_eq!(d.poll(c, t0 + ms(300)), waiting(Some(t0 + ms(1000))));
    assert_eq!(d.poll(c, t0 + ms(999)), waiting(Some(t0 + ms(1000))));
    assert_eq!(d.poll(c, t0 + ms(1000)), SENT);
    assert_eq!(d.lane(c), 0);
}

#[test]
fn finishing_releases_the_lane_and_wakes_the_next_waiter() {
    let mut d = Driver::new(scheduler(free(1), 16));
    let t0 = tokio::time::Instant::now();
    let (a, _) = d.enqueue("site", 0, t0);
    let (b, sent) = d.enqueue("site", 0, t0);
    assert!(!sent);
    // Only a completion can free the one lane: no timer.
    assert_eq!(d.poll(b, t0), waiting(None));
    assert_eq!(d.in_flight("site"), 1);

    d.finish(a, ANSWERED, t0 + ms(50));
    assert_eq!(d.woken.len(), 1, "the waiter is woken once");
    assert_eq!(d.in_flight("site"), 1, "B took the freed lane");
    assert_eq!(d.poll(b, t0 + ms(50)), SENT);
    assert_eq!(d.lane(b), 0);
    // The latency of A (send to answer) feeds the average.
    assert_eq!(
        d.scheduler.scope_with_id("site").unwrap().1.state.latency(),
        Some(ms(50))
    );

    d.finish(b, Outcome::NoResponse, t0 + ms(60));
    assert_eq!(d.in_flight("site"), 0);
    assert_eq!(d.scheduler.in_flight(), 0);
}

/// A request waiting on scope B holds nothing in scope A, and A's later
/// requests pass it while B holds it back.
#[test]
fn multi_scope_admission_is_all_or_nothing() {
    let mut d = Driver::new(scheduler(free(1), 16));
    let t0 = tokio::time::Instant::now();
    let (x, _) = d.enqueue("b", 0, t0);

    let (y, sent) = d.enqueue(["a", "b"], 0, t0);
    assert!(!sent);
    assert_eq!(d.in_flight("a"), 0, "nothing taken in a while b is full");
    assert_eq!(d.poll(y, t0), waiting(None));

    let (z, sent) = d.enqueue("a", 0, t0 + ms(1));
    assert!(sent, "a is free: its later request passes the held one");
    let a = d.scheduler.scope_with_id("a").unwrap().1;
    assert_eq!(
        a.parked().values().copied().collect::<Vec<_>>(),
        [y],
        "parked in a"
    );

    // b frees, but a is now busy with Z: Y still takes nothing.
    d.finish(x, ANSWERED, t0 + ms(2));
    assert_eq!(d.poll(y, t0 + ms(2)), waiting(None));
    assert_eq!((d.in_flight("a"), d.in_flight("b")), (1, 0));

    d.finish(z, ANSWERED, t0 + ms(3));
    assert_eq!(d.poll(y, t0 + ms(3)), SENT);
    assert_eq!((d.in_flight("a"), d.in_flight("b")), (1, 1));
    assert_eq!(d.scheduler.in_flight(), 1);
}

/// Requests whose scopes allow them but the global cap does not wait in
/// one global queue, served oldest first as permits free.
#[test]
fn global_max_concurrency_queues_waiters_in_arrival_order() {
    let mut d = Driver::new(scheduler(free(8), 1));
    let t0 = tokio::time::Instant::now();
    let (a, sent) = d.enqueue("a", 0, t0);
    assert!(sent);
    let (b, sent_b) = d.enqueue("b", 0, t0);
    let (c, sent_c) = d.enqueue("a", 0, t0);
    assert!(!sent_b && !sent_c);
    assert_eq!(d.poll(b, t0), waiting(None));
    assert_eq!(d.poll(c, t0), waiting(None));

    d.finish(a, ANSWERED, t0 + ms(10));
    assert_eq!(d.poll(b, t0 + ms(10)), SENT, "B is older than C");
    assert_eq!(d.poll(c, t0 + ms(10)), waiting(None));

    d.finish(b, ANSWERED, t0 + ms(20));
    assert_eq!(d.poll(c, t0 + ms(20)), SENT);
    assert_eq!(d.scheduler.in_flight(), 1);
}

/// A waiter another of its scopes holds back is passed as often as
/// others come while it could not go, also by waiters the global queue
/// admits: b holds it for an hour, and twenty later requests of a go.
#[test]
fn a_waiter_held_by_another_scope_is_passed_as_often_as_others_come() {
    let slow = ScopeConfig::default()
        .concurrency(1)
        .delay(Duration::from_secs(3600))
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0);
    let mut d = Driver::new(Scheduler::new(
        free(8),
        vec![(Scope::new("b"), slow)],
        1,
        fastrand::Rng::with_seed(1),
    ));
    let t0 = tokio::time::Instant::now();
    let (mut in_flight, sent) = d.enqueue("b", 0, t0);
    assert!(sent);
    // Held back by b's delay for an hour.
    let (x, sent) = d.enqueue(["a", "b"], 0, t0);
    assert!(!sent);
    for i in 1..=20 {
        // Each later request of a arrives while the global permit is
        // taken, so it is admitted from the global queue.
        let now = t0 + ms(i);
        let (y, sent) = d.enqueue("a", 0, now);
        assert!(!sent);
        d.finish(in_flight, ANSWERED, now);
        assert_eq!(d.poll(y, now), SENT, "pass {i}");
        in_flight = y;
    }
    // b's first request ended at 1 ms: its next send comes an hour later
    // (a cold scope's gap runs from its first request's end).
    let end_of_delay = t0 + ms(1) + Duration::from_secs(3600);
    assert_eq!(d.poll(x, t0 + ms(20)), waiting(Some(end_of_delay)));
}

/// A waiter of two busy scopes, refused by each just as the other lets it
/// go, is passed at most `MAX_NEAR_MISSES` times: both scopes then keep
/// their turn for it, and it goes at the next release.
#[test]
fn a_waiter_of_two_busy_scopes_goes_after_a_bounded_number_of_near_misses() {
    let mut d = Driver::new(scheduler(free(1), 16));
    let t0 = tokio::time::Instant::now();
    let names = ["a", "b"];
    let mut busy = names.map(|name| d.enqueue(name, 0, t0).0);
    let (x, sent) = d.enqueue(["a", "b"], 0, t0);
    assert!(!sent);
    let mut passes = 0;
    let mut went = None;
    // a and b free in turn; each time a new request of the freed scope
    // comes at once, and goes unless that scope keeps its turn for x.
    for round in 1..=40 {
        let at = t0 + ms(round);
        let freed = round as usize % 2;
        d.finish(busy[freed], ANSWERED, at);
        if d.poll(x, at) == SENT {
            went = Some(round);
            break;
        }
        let (next, sent) = d.enqueue(names[freed], 0, at);
        if sent {
            passes += 1;
            busy[freed] = next;
        }
    }
    assert_eq!(passes, u32::from(groups::MAX_NEAR_MISSES));
    assert_eq!(went, Some(u64::from(groups::MAX_NEAR_MISSES) + 2));
}

/// A hold lasts as long as asked, past the backoff `max_delay` (300 s):
/// only the registry's `max_hold` caps it.
#[test]
fn a_hold_delays_the_head_until_it_ends_past_the_backoff_max_delay() {
    let mut d = Driver::new(scheduler(free(1), 16));
    let t0 = tokio::time::Instant::now();
    let mut wake = WakeList::new();
    d.scheduler
        .hold(&Scope::new("site"), t0 + Duration::from_secs(1000), t0, &mut wake);
    let (a, sent) = d.enqueue("site", 0, t0);
    assert!(!sent);
    let end = t0 + Duration::from_secs(1000);
    assert_eq!(d.poll(a, t0), waiting(Some(end)));
    assert_eq!(d.poll(a, end - ms(1)), waiting(Some(end)));
    assert_eq!(d.poll(a, end), SENT);
}

/// A hold longer than `max_hold` (1 h by default, up to 24 h) is capped.
#[test]
fn a_hold_is_capped_at_max_hold() {
    let two_days = Duration::from_secs(2 * 24 * 3600);
    for (max_hold, expected) in [(None, DEFAULT_MAX_HOLD), (Some(MAX_MAX_HOLD), MAX_MAX_HOLD)] {
        let mut scheduler = scheduler(free(1), 16);
        if let Some(max_hold) = max_hold {
            scheduler = scheduler.with_max_hold(max_hold);
        }
        let mut d = Driver::new(scheduler);
        let t0 = tokio::time::Instant::now();
        let mut wake = WakeList::new();
        d.scheduler
            .hold(&Scope::new("site"), t0 + two_days, t0, &mut wake);
        let (a, sent) = d.enqueue("site", 0, t0);
        assert!(!sent);
        assert_eq!(d.poll(a, t0), waiting(Some(t0 + expected)));
        assert_eq!(d.poll(a, t0 + expected), SENT);
    }
}

#[test]
fn priority_orders_waiters_within_a_scope() {
    let mut d = Driver::new(scheduler(free(1), 16));
    let t0 = tokio::time::Instant::now();
    let (a, _) = d.enqueue("site", 0, t0);
    let (low, _) = d.enqueue("site", 0, t0);
    let (high, _) = d.enqueue("site", 5, t0 + ms(1));
    d.finish(a, ANSWERED, t0 + ms(2));
    assert_eq!(d.poll(low, t0 + ms(2)), waiting(None));
    assert_eq!(d.poll(high, t0 + ms(2)), SENT);
}

/// A waiter that leaves (its future dropped) hands the scope's timer to
/// the next one.
#[test]
fn a_waiter_leaving_hands_the_timer_to_the_next() {
    let config = free(1).delay(Duration::from_secs(1));
    let mut d = Driver::new(scheduler(config, 16));
    let t0 = tokio::time::Instant::now();
    let (a, _) = d.enqueue("site", 0, t0);
    d.finish(a, ANSWERED, t0);
    let (b, _) = d.enqueue("site", 0, t0);
    let (c, _) = d.enqueue("site", 0, t0);
    assert_eq!(d.poll(b, t0), waiting(Some(t0 + Duration::from_secs(1))));
    assert_eq!(d.poll(c, t0), waiting(None));

    d.finish(b, Outcome::NoResponse, t0 + ms(100));
    assert_eq!(d.woken.len(), 1, "the new head is woken to take the timer");
    assert_eq!(
        d.poll(c, t0 + ms(100)),
        waiting(Some(t0 + Duration::from_secs(1)))
    );
    assert_eq!(d.poll(c, t0 + Duration::from_secs(1)), SENT);
    assert_eq!(d.scheduler.scope_with_id("site").unwrap().1.queued(), 0);
}

/// A ticket admitted by another event leaves when its own task runs:
/// the scope's next gap runs from that departure, and nothing else of
/// the scope is admitted before it.
#[test]
fn the_next_gap_runs_from_a_late_departure() {
    let config = free(3).delay(ms(100));
    let mut d = Driver::new(scheduler(config, 16));
    let t0 = tokio::time::Instant::now();
    let (a, _) = d.enqueue("site", 0, t0);
    d.finish(a, ANSWERED, t0);
    let (b, sent) = d.enqueue("site", 0, t0);
    assert!(!sent);
    assert_eq!(d.poll(b, t0), waiting(Some(t0 + ms(100))));
    // C's arrival at 100 ms admits B, whose task has not run yet.
    let (c, sent) = d.enqueue("site", 0, t0 + ms(100));
    assert!(!sent);
    assert_eq!(
        d.scheduler.tickets[b].status,
        Status::Admitted {
            report_departure: true
        }
    );
    // Until B leaves, C's gap runs from B's admission at the earliest: a
    // timer for then, which B's departure only moves later.
    assert_eq!(d.poll(c, t0 + ms(120)), waiting(Some(t0 + ms(200))));
    let mut wake = WakeList::new();
    d.scheduler
        .depart(b, Stamp::of(t0 + ms(140)), t0 + ms(141), &mut wake);
    assert!(wake.is_empty(), "C keeps its earlier timer: nobody to wake");
    assert_eq!(
        d.scheduler.tickets[b].status,
        Status::Departed(Stamp::of(t0 + ms(140)))
    );
    assert_eq!(d.poll(c, t0 + ms(140)), waiting(Some(t0 + ms(240))));
    assert_eq!(d.poll(c, t0 + ms(240)), SENT);
}

/// A departure the ticket's handle carries to `finish` (its scope has one
/// lane, so nothing could be admitted before the end anyway) times the
/// next gap just as an early report would: from the hand-over, not from
/// the admission.
#[test]
fn a_departure_carried_by_finish_times_the_next_gap() {
    let mut d = Driver::new(scheduler(free(1).delay(ms(100)), 16));
    let t0 = tokio::time::Instant::now();
    let (a, _) = d.enqueue("site", 0, t0);
    d.finish(a, ANSWERED, t0);
    let (b, admitted) = d
        .scheduler
        .enqueue_ticket(&"site".into(), t0 + ms(100), &mut d.woken);
    assert_eq!(admitted, Some(false), "one lane: the departure waits for the end");
    let mut wake = WakeList::new();
    d.scheduler.finish(
        b,
        ANSWERED,
        Some(Stamp::of(t0 + ms(130))),
        (t0 + ms(150), None),
        &mut wake,
    );
    let (c, sent) = d.enqueue("site", 0, t0 + ms(150));
    assert!(!sent);
    assert_eq!(d.poll(c, t0 + ms(150)), waiting(Some(t0 + ms(230))));
    assert_eq!(d.poll(c, t0 + ms(230)), SENT);
}

/// Only a scope that could admit another request before this one ends
/// (a delay, and more than one lane) needs the departure at once.
#[test]
fn the_departure_is_reported_at_once_only_where_a_gap_depends_on_it() {
    let t0 = tokio::time::Instant::now();
    for (config, expected) in [
        (free(2).delay(ms(100)), true),
        (free(1).delay(ms(100)), false),
        (free(8), false),
        (free(8).delay_per_slot(ms(100)), false),
    ] {
        let mut d = Driver::new(scheduler(config.clone(), 16));
        // Warm the scope: its first request holds it until it ends.
        let (a, _) = d.enqueue("site", 0, t0);
        d.finish(a, ANSWERED, t0);
        let (_, admitted) = d
            .scheduler
            .enqueue_ticket(&"site".into(), t0 + ms(500), &mut d.woken);
        assert_eq!(admitted, Some(expected), "{config:?}");
    }
}

/// Replays `arrivals` (offset in ms, cost) against one scope with quota
/// `quota` per `window`, sending each request as soon as the scheduler
/// lets it and answering it at once. Returns each send's instant and cost,
/// in send order, and whether every request was sent.
fn replay_quota(quota: f64, window: Duration, arrivals: &[(u64, f64)]) -> (Vec<(Instant, f64)>, bool) {
    let config = free(64).quota(quota).window(window);
    let mut d = Driver::new(scheduler(config, 64));
    let t0 = tokio::time::Instant::now();
    let mut arrivals: Vec<(Instant, f64)> = arrivals.iter().map(|&(at, cost)| (t0 + ms(at), cost)).collect();
    arrivals.sort_by_key(|&(at, _)| at);
    let mut arrivals = arrivals.into_iter().peekable();
    let mut waiting: Vec<(TicketId, f64)> = Vec::new();
    let mut sends = Vec::new();
    let mut now = t0;
    loop {
        while let Some(&(at, cost)) = arrivals.peek().filter(|(at, _)| *at <= now) {
            arrivals.next();
            let (id, sent) = d.enqueue(Scopes::with_costs([("site", cost)]), 0, at.max(now));
            if sent {
                sends.push((now, cost));
                d.finish(id, ANSWERED, now);
            } else {
                waiting.push((id, cost));
            }
        }
        let mut next_timer: Option<Instant> = None;
        let mut progress = true;
        while progress {
            progress = false;
            next_timer = None;
            for (id, cost) in std::mem::take(&mut waiting) {
                match d.poll(id, now) {
                    TicketPoll::Sent { .. } => {
                        sends.push((now, cost));
                        d.finish(id, ANSWERED, now);
                        progress = true;
                    }
                    TicketPoll::Waiting { timer } => {
                        next_timer = [next_timer, timer].into_iter().flatten().min();
                        waiting.push((id, cost));
                    }
                    TicketPoll::Refused(refusal) => panic!("no bound here: {refusal:?}"),
                }
            }
        }
        let next_arrival = arrivals.peek().map(|&(at, _)| at);
        match [next_timer, next_arrival].into_iter().flatten().min() {
            Some(next) => now = next.max(now),
            None => return (sends, waiting.is_empty()),
        }
    }
}

proptest::proptest! {
    /// Over random costs, arrivals, quotas and windows, no window is
    /// overspent except by a single request costing more than the whole
    /// quota, alone in its window; and every request is sent.
    #[test]
    fn no_quota_window_is_overspent(
        quota in 1.0f64..20.0,
        window_ms in 10u64..1_000,
        arrivals in proptest::collection::vec((0u64..3_000, 0.1f64..30.0), 1..40),
    ) {
        let window = ms(window_ms);
        let (sends, all_sent) = replay_quota(quota, window, &arrivals);
        proptest::prop_assert!(all_sent, "a request starved");
        proptest::prop_assert_eq!(sends.len(), arrivals.len());
        let mut index = 0;
        while index < sends.len() {
            let start = sends[index].0;
            let in_window: Vec<f64> = sends[index..]
                .iter()
                .take_while(|(at, _)| *at < start + window)
                .map(|&(_, cost)| cost)
                .collect();
            let spent: f64 = in_window.iter().sum();
            let oversized_alone = in_window.len() == 1 && in_window[0] > quota;
            proptest::prop_assert!(
                spent <= quota * (1.0 + 1e-9) || oversized_alone,
                "window at {:?} spent {} of {} over {:?}",
                start - sends[0].0,
                spent,
                quota,
                in_window
            );
            index += in_window.len();
        }
    }
}

/// A broad crawl: a million distinct scopes, one request each. The
/// registry never holds more than `max_scopes`, and evicts the rest.
#[test]
fn a_million_scopes_once_each_stay_within_max_scopes() {
    const MAX_SCOPES: usize = 1_000;
    let scheduler = scheduler(free(1), 16).with_eviction(Duration::from_secs(3600), MAX_SCOPES);
    let mut d = Driver::new(scheduler);
    let t0 = tokio::time::Instant::now();
    let mut most = 0;
    for i in 0..1_000_000u64 {
        let now = t0 + Duration::from_micros(i);
        let (id, sent) = d.enqueue(Scope::new(format!("site{i}.example")), 0, now);
        assert!(sent);
        d.finish(id, ANSWERED, now);
        most = most.max(d.scheduler.scopes_tracked());
    }
    assert_eq!(most, MAX_SCOPES);
    assert_eq!(d.scheduler.evictions(), 1_000_000 - MAX_SCOPES as u64);
    assert!(d.woken.is_empty());
}

/// The memory budget is 256 bytes per idle scope, key and index included; the
/// slab slot is most of it and the slab's doubling adds up to 2× to it, so
/// its size is pinned here (measured in full by `cargo bench --bench memory`).
#[test]
fn an_idle_scope_entry_fits_its_share_of_the_memory_budget() {
    let entry = std::mem::size_of::<ScopeEntry>();
    assert!(entry <= 136, "a scope's slab entry takes {entry} bytes");
}

impl Scheduler {
    /// Queues a request at priority 0 without the lock-free path: its
    /// ticket, and whether it was admitted at once.
    fn enqueue_ticket(
        &mut self,
        scopes: &Scopes,
        now: Instant,
        wake: &mut WakeList,
    ) -> (TicketId, Option<bool>) {
        match self.enqueue(scopes, 0, FastMode::Never, now, wake) {
            Admission::Ticket(id, admitted) => (id, admitted),
            admission => panic!("never admitted on a word: {admission:?}"),
        }
    }
}

mod global_queue;

/// A plain scope given a plain config at run time stays plain: its
/// one-scope requests go on a free lane without a ticket, as before the
/// change (an empty set of contributions once kept it off them for good).
#[test]
fn a_plain_scope_given_a_plain_config_admits_on_plain_lanes_again() {
    let mut scheduler = scheduler(free(2), 8);
    let now = Instant::now();
    let mut wake = WakeList::new();
    let scopes = Scopes::from("api.example");
    let admission = scheduler.enqueue(&scopes, 0, FastMode::Join, now, &mut wake);
    assert!(matches!(admission, Admission::Plain(..)), "{admission:?}");
    scheduler.set_scope(Scope::new("api.example"), free(1), now, &mut wake);
    let admission = scheduler.enqueue(&scopes, 0, FastMode::Join, now + ms(1), &mut wake);
    assert!(
        matches!(admission, Admission::Ticket(_, None)),
        "one lane, taken: {admission:?}"
    );
    scheduler.set_scope(Scope::new("api.example"), free(3), now, &mut wake);
    let admission = scheduler.enqueue(
        &Scopes::from("api.example"),
        0,
        FastMode::Join,
        now + ms(2),
        &mut wake,
    );
    assert!(matches!(admission, Admission::Plain(..)), "{admission:?}");
}
