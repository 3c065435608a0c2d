//! The global queue's order, and what a request that never left gives
//! back: the scheduler at fixed instants, as in the parent module.

use super::*;

/// A global permit freed by an end goes to the earliest waiter for one,
/// counting those the same end lets go in its scopes: the page of two
/// scopes that the server's end frees, not the later request of its host
/// that was waiting for the permit.
#[test]
fn a_freed_permit_goes_to_the_earliest_of_the_waiters_the_end_lets_go() {
    let mut d = Driver::new(scheduler(free(1), 1));
    let t0 = tokio::time::Instant::now();
    let (first, sent) = d.enqueue("server", 0, t0);
    assert!(sent);
    // Held by the server's lane, the page stands aside on its host...
    let (page, sent) = d.enqueue(["host", "server"], 0, t0);
    assert!(!sent);
    // ...where a later request waits for the permit alone.
    let (later, sent) = d.enqueue("host", 0, t0);
    assert!(!sent);
    d.finish(first, ANSWERED, t0 + ms(10));
    assert_eq!(d.poll(page, t0 + ms(10)), SENT);
    assert_eq!(d.poll(later, t0 + ms(10)), waiting(None));
}

/// A waiter served from the global queue that a scope of it now holds (a
/// quota another waiter just spent) keeps its turn there, even though it
/// stood aside in that scope while another of its scopes held it.
#[test]
fn a_waiter_served_from_the_global_queue_keeps_its_turn_where_it_is_held() {
    let paced = free(1).delay(ms(100));
    let api = free(4).quota(3.0).window(ms(10_000));
    let configs = vec![
        (Scope::new("gate"), paced.clone()),
        (Scope::new("host"), paced),
        (Scope::new("api"), api),
    ];
    let mut d = Driver::new(Scheduler::new(free(1), configs, 1, fastrand::Rng::with_seed(1)));
    let t0 = tokio::time::Instant::now();
    for scope in ["gate", "host"] {
        let (id, sent) = d.enqueue(scope, 0, t0);
        assert!(sent);
        d.finish(id, ANSWERED, t0);
    }
    // The permit is busy until 100 ms; gate and host are paced until then.
    let (busy, sent) = d.enqueue("other", 0, t0);
    assert!(sent);
    let (spender, _) = d.enqueue(Scopes::with_costs([("gate", 1.0), ("api", 2.0)]), 0, t0);
    let (page, _) = d.enqueue(Scopes::with_costs([("host", 1.0), ("api", 2.0)]), 0, t0);
    let (cheap, _) = d.enqueue(Scopes::with_costs([("api", 1.0)]), 0, t0);
    let t1 = t0 + ms(100);
    for id in [spender, page, cheap] {
        assert!(matches!(d.poll(id, t1), TicketPoll::Waiting { .. }));
    }
    // The permit comes back: the spender goes and leaves 1 of the quota,
    // too little for the page, enough for the cheap request behind it.
    d.finish(busy, ANSWERED, t1);
    assert_eq!(d.poll(spender, t1), SENT);
    d.finish(spender, ANSWERED, t1);
    assert!(matches!(d.poll(page, t1), TicketPoll::Waiting { .. }));
    assert!(matches!(d.poll(cheap, t1), TicketPoll::Waiting { .. }));
    // The window ends: the page goes first.
    let t2 = t1 + ms(10_000);
    assert_eq!(d.poll(page, t2), SENT);
    assert!(matches!(d.poll(cheap, t2), TicketPoll::Waiting { .. }));
}

/// A request admitted but never handed over gives its scope's gap and
/// quota back: the site never saw it.
#[test]
fn a_request_that_never_left_gives_its_gap_and_its_quota_back() {
    let api = free(1).delay(ms(500)).quota(1.0).window(ms(10_000));
    let configs = vec![(Scope::new("api"), api)];
    let mut d = Driver::new(Scheduler::new(free(1), configs, 4, fastrand::Rng::with_seed(1)));
    let t0 = tokio::time::Instant::now();
    let (unsent, admitted) = d.scheduler.enqueue_ticket(&Scopes::from("api"), t0, &mut d.woken);
    assert!(admitted.is_some());
    // Ends without a departure: dropped before the inner service had it.
    d.finish(unsent, Outcome::NoResponse, t0 + ms(100));
    let (next, sent) = d.enqueue("api", 0, t0 + ms(100));
    assert!(sent);
    // This one did leave: the gap and the quota count from it.
    d.finish(next, ANSWERED, t0 + ms(100));
    let (last, sent) = d.enqueue("api", 0, t0 + ms(100));
    assert!(!sent);
    assert_eq!(d.poll(last, t0 + ms(10_099)), waiting(Some(t0 + ms(10_100))));
}

/// A waiter whose group a later one of higher priority leads stands in no
/// queue, even while it waits for a global permit: served from that queue
/// and held, it is not moved into one (an entry there would outlive it,
/// since it leaves as a member).
#[test]
fn a_waiter_another_leads_is_served_from_the_global_queue_without_entering_a_queue() {
    let mut d = Driver::new(scheduler(free(1), 1));
    let t0 = tokio::time::Instant::now();
    let (busy, sent) = d.enqueue("other", 0, t0);
    assert!(sent);
    // Both wait for the permit; the later one, of higher priority, leads.
    let (low, sent) = d.enqueue(["a", "b"], 0, t0);
    assert!(!sent);
    let (high, sent) = d.enqueue(["a", "b"], 1, t0);
    assert!(!sent);
    let b = Scope::new("b");
    d.scheduler.hold(&b, t0 + ms(1_000), t0, &mut d.woken);
    // The permit comes back while b holds both.
    d.finish(busy, ANSWERED, t0 + ms(10));
    for id in [high, low] {
        assert!(matches!(d.poll(id, t0 + ms(10)), TicketPoll::Waiting { .. }));
    }
    // The one that does not lead stands in no queue of its scopes.
    for scope in ["a", "b"] {
        let (_, entry) = d.scheduler.scope_with_id(scope).unwrap();
        let mut entries = entry.queue().ids().chain(entry.parked().values().copied());
        assert!(entries.all(|id| id != low), "{scope}");
    }
    d.finish(low, Outcome::NoResponse, t0 + ms(20));
    let t1 = t0 + ms(1_000);
    assert_eq!(d.poll(high, t1), SENT);
    d.finish(high, ANSWERED, t1);
    for scope in ["a", "b"] {
        let (_, entry) = d.scheduler.scope_with_id(scope).unwrap();
        assert!(entry.queue().is_empty() && entry.parked().is_empty(), "{scope}");
    }
}
