//! [`MemoryStore`]: the store protocol in the process, under one lock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::line::Line;
use super::{
    Answer, AutoThrottleSample, BackoffStep, FleetBackoff, Grant, Learnt, Lease, LeaseId, QuotaTerms,
    Reservation, ScopeStore, SharedFacts, StoreFuture, LEARNT_TTL,
};
use crate::scope::Scope;
use crate::time::saturating_add;

/// Default time after which a lease nobody released frees its lane.
pub(crate) const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(60);

/// The shortest time a busy answer asks a worker to wait: with no delay
/// and every lane taken, this is how often the fleet's workers ask.
pub(crate) const MIN_RETRY: Duration = Duration::from_millis(5);

/// A [`ScopeStore`] kept in this process: registries holding clones of it
/// share their scopes' facts as workers sharing a Redis would, on tokio's
/// clock (so tests of a fleet can run under paused time).
///
/// Scopes whose facts have all expired are forgotten when next touched.
///
/// # Clone
///
/// Clones share the same facts.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    scopes: Arc<Mutex<HashMap<Scope, Facts>>>,
    lease_ttl: Duration,
}

/// A fresh ticket: one more than the last given by any store in this
/// process (tickets only need to grow).
fn next_ticket() -> u64 {
    static LAST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    LAST.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
}

#[derive(Debug, Default)]
struct Facts {
    next: Option<Instant>,
    leases: Vec<(LeaseId, Instant)>,
    hold_until: Option<Instant>,
    backoff: Option<(Duration, Instant)>,
    /// Units spent in the current quota window, and when it ends.
    spent: Option<(f64, Instant)>,
    /// A worker's first request in flight, which the others wait for, and
    /// when its lease expires.
    first: Option<(LeaseId, Instant)>,
    /// What the fleet learnt: version, state, written at, kept until.
    learnt: Option<(u64, String, Instant, Instant)>,
    /// The waiters refused a lane, in ticket order for the next free ones.
    line: Line,
    /// The fleet's AutoThrottle delay, and until when it is kept.
    autothrottle: Option<(Duration, Instant)>,
    /// The fleet's backoff: its settings, the level and delay its last
    /// step left, and when that step was.
    level: Option<(BackoffStep, u32, Duration, Instant)>,
}

impl Facts {
    fn forget_expired(&mut self, now: Instant) {
        self.leases.retain(|&(_, expiry)| expiry > now);
        self.next = self.next.filter(|&next| next > now);
        self.hold_until = self.hold_until.filter(|&until| until > now);
        self.backoff = self.backoff.filter(|&(_, until)| until > now);
        self.spent = self.spent.filter(|&(_, until)| until > now);
        self.first = self.first.filter(|&(_, until)| until > now);
        if self.learnt.as_ref().is_some_and(|learnt| learnt.3 <= now) {
            self.learnt = None;
        }
        self.line.forget_expired(now);
        self.autothrottle = self.autothrottle.filter(|&(_, until)| until > now);
        if self.level_now(now).is_none() {
            self.level = None;
        }
    }

    /// The fleet's backoff in force at `now`.
    fn level_now(&self, now: Instant) -> Option<FleetBackoff> {
        let (terms, level, delay, stepped) = self.level?;
        terms.recovered(level, delay, now.saturating_duration_since(stepped))
    }

    /// Whether another worker's first request keeps `lease` waiting.
    fn first_of_another(&self, lease: LeaseId) -> bool {
        self.first.is_some_and(|(first, _)| first != lease)
    }

    /// When the quota window ends, if `quota`'s cost does not fit it now.
    fn quota_frees_at(&self, quota: Option<QuotaTerms>) -> Option<Instant> {
        let quota = quota?;
        let (spent, ends) = self.spent?;
        (spent + quota.cost > quota.quota * (1.0 + 1e-9)).then_some(ends)
    }

    fn is_empty(&self) -> bool {
        self.next.is_none()
            && self.leases.is_empty()
            && self.hold_until.is_none()
            && self.backoff.is_none()
            && self.spent.is_none()
            && self.first.is_none()
            && self.learnt.is_none()
            && self.line.is_empty()
            && self.autothrottle.is_none()
            && self.level.is_none()
    }

    fn shared(&self, now: Instant) -> SharedFacts {
        let (mut backoff_delay, backoff_until) = self.backoff.unwrap_or((Duration::ZERO, now));
        let mut backoff_remaining = backoff_until.saturating_duration_since(now);
        let mut backoff_level = 0;
        if let Some(level) = self.level_now(now) {
            (backoff_delay, backoff_remaining, backoff_level) =
                (level.delay, level.next_step_back, level.level);
        }
        SharedFacts {
            hold: self
                .hold_until
                .map_or(Duration::ZERO, |until| until.saturating_duration_since(now)),
            backoff_delay,
            backoff_remaining,
            backoff_level,
            learnt_version: self.learnt.as_ref().map_or(0, |learnt| learnt.0),
            autothrottle_delay: self.autothrottle.map(|(delay, _)| delay),
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl MemoryStore {
    /// An empty store with a lease TTL of 60 s.
    pub fn new() -> Self {
        MemoryStore {
            scopes: Arc::default(),
            lease_ttl: DEFAULT_LEASE_TTL,
        }
    }

    /// How long a lease nobody renews or releases keeps its lane (default
    /// 60 s). A worker renews its requests' leases every third of it, in
    /// one call, so a request may last longer; a crashed worker's lanes
    /// come back within one TTL of its last renewal.
    #[must_use]
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    fn with_scopes<T>(&self, act: impl FnOnce(&mut HashMap<Scope, Facts>, Instant) -> T) -> T {
        let mut scopes = self.scopes.lock().unwrap_or_else(PoisonError::into_inner);
        act(&mut scopes, Instant::now())
    }

    fn reserve_now(&self, reservation: &Reservation) -> Grant {
        let lease_ttl = self.lease_ttl;
        let waiter = reservation.waiter;
        self.with_scopes(|scopes, now| {
            let mut send_at = now;
            let mut busy = false;
            // A scope waiting for another worker's first request to end
            // has no instant yet: ask again a delay later.
            let mut retry_at_least = Duration::ZERO;
            let mut quota_frees_at: Option<Instant> = None;
            // Each scope's free lanes; whether any scope has a line.
            let mut free: smallvec::SmallVec<[usize; 4]> = smallvec::SmallVec::new();
            let mut lines = false;
            let mut facts = Vec::with_capacity(reservation.scopes.len());
            for terms in &reservation.scopes {
                let known = scopes.entry(terms.scope.clone()).or_default();
                known.forget_expired(now);
                known.leases.retain(|&(id, _)| id != reservation.lease);
                free.push((terms.concurrency as usize).saturating_sub(known.leases.len()));
                lines |= !known.line.is_empty();
                if known.first_of_another(reservation.lease) {
                    busy = true;
                    retry_at_least = retry_at_least.max(terms.delay);
                }
                quota_frees_at = quota_frees_at.max(known.quota_frees_at(terms.quota));
                send_at = send_at
                    .max(known.next.unwrap_or(now))
                    .max(known.hold_until.unwrap_or(now));
                facts.push(known.shared(now));
            }
            let (ticket, refused) = match lines {
                false => (None, Self::no_lane(reservation, &free)),
                true => Self::lanes_in_line(scopes, reservation, &free),
            };
            if busy || !refused.is_empty() || quota_frees_at.is_some() {
                let retry_at = send_at.max(quota_frees_at.unwrap_or(now));
                let retry_in = retry_at
                    .saturating_duration_since(now)
                    .max(retry_at_least)
                    .max(MIN_RETRY);
                let ticket = ticket.unwrap_or_else(next_ticket);
                for scope in &refused {
                    let line = &mut scopes.get_mut(scope).expect("entered above").line;
                    line.join(waiter, ticket, saturating_add(now, retry_in));
                }
                return Grant::new(Answer::Busy { retry_in }, facts);
            }
            for (terms, shared) in reservation.scopes.iter().zip(&facts) {
                let known = scopes.get_mut(&terms.scope).expect("entered above");
                known.line.leave(waiter);
                let gap = terms.delay.max(shared.backoff_delay);
                known.next = Some(saturating_add(send_at, gap));
                known
                    .leases
                    .push((reservation.lease, saturating_add(send_at, lease_ttl)));
                if terms.first {
                    known.first = Some((reservation.lease, saturating_add(send_at, lease_ttl)));
                }
                if let Some(quota) = terms.quota {
                    let (spent, ends) = known.spent.unwrap_or((0.0, saturating_add(now, quota.window)));
                    known.spent = Some((spent + quota.cost, ends));
                }
            }
            let wait = send_at.saturating_duration_since(now);
            Grant::new(Answer::Granted { wait }, facts)
        })
    }

    /// Without lines: the scopes with no free lane.
    fn no_lane(reservation: &Reservation, free: &[usize]) -> Vec<Scope> {
        reservation
            .scopes
            .iter()
            .zip(free)
            .filter(|&(_, &free)| free == 0)
            .map(|(terms, _)| terms.scope.clone())
            .collect()
    }

    /// With lines: the waiter's ticket (in any line it is in; `None` for a
    /// newcomer, behind everyone), and the scopes whose free lanes go to
    /// the waiters ahead of it.
    fn lanes_in_line(
        scopes: &HashMap<Scope, Facts>,
        reservation: &Reservation,
        free: &[usize],
    ) -> (Option<u64>, Vec<Scope>) {
        let lines: Vec<&Line> = reservation
            .scopes
            .iter()
            .map(|terms| &scopes[&terms.scope].line)
            .collect();
        let ticket = lines
            .iter()
            .filter_map(|line| line.ticket_of(reservation.waiter))
            .min();
        let refused = reservation
            .scopes
            .iter()
            .zip(free.iter().zip(&lines))
            .filter(|&(_, (&free, line))| free <= line.ahead_of(ticket))
            .map(|(terms, _)| terms.scope.clone())
            .collect();
        (ticket, refused)
    }

    fn update(&self, scope: &Scope, change: impl FnOnce(&mut Facts, Instant)) {
        self.with_scopes(|scopes, now| {
            let known = scopes.entry(scope.clone()).or_default();
            known.forget_expired(now);
            change(known, now);
            if known.is_empty() {
                scopes.remove(scope);
            }
        });
    }
}

/// The store works under its lock at once; its futures are already done.
fn done<T: Send + 'static>(value: T) -> StoreFuture<T> {
    Box::pin(std::future::ready(Ok(value)))
}

impl ScopeStore for MemoryStore {
    fn learnt(&self, scope: Scope) -> StoreFuture<Option<Learnt>> {
        let learnt = self.with_scopes(|scopes, now| {
            let known = scopes.get_mut(&scope)?;
            known.forget_expired(now);
            let (version, state, written, _) = known.learnt.as_ref()?;
            Some(Learnt::new(
                *version,
                state.clone(),
                now.saturating_duration_since(*written),
            ))
        });
        done(learnt)
    }

    fn swap_learnt(
        &self,
        scope: Scope,
        version: u64,
        state: String,
        ttl: Duration,
    ) -> StoreFuture<Option<u64>> {
        let mut swapped = None;
        self.update(&scope, |known, now| {
            let current = known.learnt.as_ref().map_or(0, |learnt| learnt.0);
            if current == version {
                let next = current + 1;
                known.learnt = Some((next, state, now, saturating_add(now, ttl)));
                swapped = Some(next);
            }
        });
        done(swapped)
    }

    fn step_backoff(&self, scope: Scope, step: BackoffStep) -> StoreFuture<Option<FleetBackoff>> {
        let mut stepped = None;
        self.update(&scope, |known, now| {
            let current = known.level_now(now).map(|level| (level.level, level.delay));
            let (level, delay) = step.step(current);
            known.level = Some((step, level, delay, now));
            stepped = Some(FleetBackoff::new(level, delay, step.window));
        });
        done(stepped)
    }

    fn autothrottle(&self, scope: Scope, sample: AutoThrottleSample) -> StoreFuture<Option<Duration>> {
        let mut delay = None;
        self.update(&scope, |known, now| {
            let next = sample.next_delay(known.autothrottle.map(|(delay, _)| delay));
            known.autothrottle = Some((next, saturating_add(now, LEARNT_TTL)));
            delay = Some(next);
        });
        done(delay)
    }

    fn shares_learning(&self) -> bool {
        true
    }

    fn reserve(&self, reservation: Reservation) -> StoreFuture<Grant> {
        done(self.reserve_now(&reservation))
    }

    fn release(&self, lease: Lease) -> StoreFuture<()> {
        for (index, scope) in lease.scopes.iter().enumerate() {
            let after = lease.next_send_after.get(index).copied().unwrap_or_default();
            self.update(scope, |known, now| {
                known.leases.retain(|&(id, _)| id != lease.id);
                if known.first.is_some_and(|(first, _)| first == lease.id) {
                    known.first = None;
                }
                if !after.is_zero() {
                    known.next = known.next.max(Some(saturating_add(now, after)));
                }
            });
        }
        done(())
    }

    fn hold(&self, scope: Scope, duration: Duration) -> StoreFuture<()> {
        self.update(&scope, |known, now| {
            let until = saturating_add(now, duration);
            known.hold_until = known.hold_until.max(Some(until));
        });
        done(())
    }

    fn backoff(&self, scope: Scope, delay: Duration, ttl: Duration) -> StoreFuture<()> {
        self.update(&scope, |known, now| {
            known.backoff = Some((delay, saturating_add(now, ttl)));
        });
        done(())
    }

    fn renew(&self, leases: Vec<Lease>) -> StoreFuture<()> {
        let lease_ttl = self.lease_ttl;
        for lease in &leases {
            for scope in &lease.scopes {
                self.update(scope, |known, now| {
                    let expiry = saturating_add(now, lease_ttl);
                    for (id, until) in &mut known.leases {
                        if *id == lease.id {
                            *until = (*until).max(expiry);
                        }
                    }
                    if let Some((first, until)) = &mut known.first {
                        if *first == lease.id {
                            *until = (*until).max(expiry);
                        }
                    }
                });
            }
        }
        done(())
    }

    fn lease_ttl(&self) -> Option<Duration> {
        Some(self.lease_ttl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::backend::ScopeTerms;

    fn ask(lease: u64, scopes: &[(&str, u32, u64)]) -> Reservation {
        Reservation {
            lease: LeaseId(lease),
            scopes: scopes
                .iter()
                .map(|&(scope, concurrency, delay_ms)| ScopeTerms {
                    scope: Scope::new(scope),
                    concurrency,
                    delay: Duration::from_millis(delay_ms),
                    quota: None,
                    first: false,
                })
                .collect(),
            waiter: crate::store::backend::WaiterId(lease),
        }
    }

    fn reserve(store: &MemoryStore, reservation: Reservation) -> Answer {
        store.reserve_now(&reservation).answer
    }

    fn granted(ms: u64) -> Answer {
        Answer::Granted {
            wait: Duration::from_millis(ms),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn reservations_take_successive_instants_a_delay_apart() {
        let store = MemoryStore::new();
        assert_eq!(reserve(&store, ask(1, &[("a", 3, 100)])), granted(0));
        assert_eq!(reserve(&store, ask(2, &[("a", 3, 100)])), granted(100));
        assert_eq!(reserve(&store, ask(3, &[("a", 3, 100)])), granted(200));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_scope_is_busy_until_a_lease_is_released_or_expires() {
        let store = MemoryStore::new().lease_ttl(Duration::from_secs(1));
        assert_eq!(reserve(&store, ask(1, &[("a", 1, 100)])), granted(0));
        assert_eq!(
            reserve(&store, ask(2, &[("a", 1, 100)])),
            Answer::Busy {
                retry_in: Duration::from_millis(100)
            }
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(reserve(&store, ask(2, &[("a", 1, 100)])), granted(0));
        store
            .release(Lease::new(LeaseId(2), vec![Scope::new("a")]))
            .await
            .unwrap();
        assert_eq!(reserve(&store, ask(3, &[("a", 1, 100)])), granted(100));
    }

    /// A renewed lease lasts a TTL from its last renewal; a worker that
    /// stops renewing (a crash) gets its lane taken within one TTL of it.
    /// A lease given back is not brought back by a renewal.
    #[tokio::test(start_paused = true)]
    async fn a_renewed_lease_lasts_one_ttl_from_its_last_renewal() {
        let store = MemoryStore::new().lease_ttl(Duration::from_secs(1));
        let renew = |id| store.renew(vec![Lease::new(LeaseId(id), vec![Scope::new("a")])]);
        assert_eq!(reserve(&store, ask(1, &[("a", 1, 0)])), granted(0));
        tokio::time::advance(Duration::from_millis(900)).await;
        renew(1).await.unwrap();
        tokio::time::advance(Duration::from_millis(600)).await;
        assert!(
            matches!(reserve(&store, ask(2, &[("a", 1, 0)])), Answer::Busy { .. }),
            "renewed at 0.9 s"
        );
        // No renewal after 0.9 s: the lane is free at 1.9 s.
        tokio::time::advance(Duration::from_millis(400)).await;
        assert_eq!(reserve(&store, ask(2, &[("a", 1, 0)])), granted(0));
        // Lease 1 expired: renewing it takes nothing back.
        store
            .release(Lease::new(LeaseId(2), vec![Scope::new("a")]))
            .await
            .unwrap();
        renew(1).await.unwrap();
        assert_eq!(reserve(&store, ask(3, &[("a", 1, 0)])), granted(0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reservation_over_several_scopes_takes_all_or_nothing() {
        let store = MemoryStore::new();
        assert_eq!(reserve(&store, ask(1, &[("b", 1, 0)])), granted(0));
        assert!(matches!(
            reserve(&store, ask(2, &[("a", 1, 0), ("b", 1, 0)])),
            Answer::Busy { .. }
        ));
        // "a" took nothing from the busy attempt.
        assert_eq!(reserve(&store, ask(3, &[("a", 1, 0)])), granted(0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_quota_window_is_spent_by_the_fleet_and_refills_when_it_ends() {
        let store = MemoryStore::new();
        let spend = |lease, cost| {
            let mut reservation = ask(lease, &[("api", 10, 0)]);
            reservation.scopes[0].quota = Some(QuotaTerms {
                quota: 3.0,
                window: Duration::from_secs(60),
                cost,
            });
            let answer = reserve(&store, reservation);
            // Each request ends at once.
            drop(store.release(Lease::new(LeaseId(lease), vec![Scope::new("api")])));
            answer
        };
        assert_eq!(spend(1, 2.0), granted(0));
        assert_eq!(spend(2, 1.0), granted(0));
        assert_eq!(
            spend(3, 1.0),
            Answer::Busy {
                retry_in: Duration::from_secs(60)
            }
        );
        tokio::time::advance(Duration::from_secs(60)).await;
        // An empty window takes even a cost above the whole quota.
        assert_eq!(spend(3, 5.0), granted(0));
        assert!(matches!(spend(4, 1.0), Answer::Busy { .. }));
    }

    #[tokio::test(start_paused = true)]
    async fn holds_and_backoff_delays_shape_every_grant_and_come_back_as_facts() {
        let store = MemoryStore::new();
        store.hold(Scope::new("a"), Duration::from_secs(2)).await.unwrap();
        store
            .backoff(Scope::new("a"), Duration::from_secs(1), Duration::from_secs(60))
            .await
            .unwrap();
        let grant = store.reserve_now(&ask(1, &[("a", 4, 100)]));
        assert_eq!(grant.answer, granted(2_000));
        assert_eq!(
            grant.facts,
            vec![SharedFacts {
                hold: Duration::from_secs(2),
                backoff_delay: Duration::from_secs(1),
                backoff_remaining: Duration::from_secs(60),
                learnt_version: 0,
                autothrottle_delay: None,
                backoff_level: 0,
            }]
        );
        // The next gap is the backoff delay, not the scope's 100 ms.
        assert_eq!(reserve(&store, ask(2, &[("a", 4, 100)])), granted(3_000));
    }

    #[tokio::test(start_paused = true)]
    async fn learnt_state_is_swapped_only_from_the_version_read_and_expires() {
        let store = MemoryStore::new();
        let scope = || Scope::new("a");
        let ttl = Duration::from_secs(10);
        assert_eq!(store.learnt(scope()).await.unwrap(), None);
        assert_eq!(
            store.swap_learnt(scope(), 1, "x".into(), ttl).await.unwrap(),
            None
        );
        assert_eq!(
            store.swap_learnt(scope(), 0, "one".into(), ttl).await.unwrap(),
            Some(1)
        );
        // A worker that read nothing writes too late: another wrote first.
        assert_eq!(
            store.swap_learnt(scope(), 0, "two".into(), ttl).await.unwrap(),
            None
        );
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(
            store.learnt(scope()).await.unwrap(),
            Some(Learnt::new(1, "one".into(), Duration::from_secs(3)))
        );
        // Reservations say which version the store has.
        let grant = store.reserve_now(&ask(1, &[("a", 4, 100)]));
        assert_eq!(grant.facts[0].learnt_version, 1);
        assert_eq!(
            store.swap_learnt(scope(), 1, "three".into(), ttl).await.unwrap(),
            Some(2)
        );
        tokio::time::advance(ttl).await;
        assert_eq!(store.learnt(scope()).await.unwrap(), None);
    }

    fn release_after(store: &MemoryStore, lease: u64, scope: &str, after_ms: u64) {
        let mut release = Lease::new(LeaseId(lease), vec![Scope::new(scope)]);
        release.next_send_after = vec![Duration::from_millis(after_ms)];
        drop(store.release(release));
    }

    #[tokio::test(start_paused = true)]
    async fn a_first_request_keeps_the_scope_to_itself_until_it_is_released() {
        let store = MemoryStore::new();
        let mut first = ask(1, &[("a", 4, 100)]);
        first.scopes[0].first = true;
        assert_eq!(reserve(&store, first.clone()), granted(0));
        // Lanes to spare, yet the others wait, and ask again a delay later.
        assert_eq!(
            reserve(&store, ask(2, &[("a", 4, 100)])),
            Answer::Busy {
                retry_in: Duration::from_millis(100)
            }
        );
        // Answered at 30 ms: the next send comes a delay after that end.
        tokio::time::advance(Duration::from_millis(30)).await;
        release_after(&store, 1, "a", 100);
        assert_eq!(reserve(&store, ask(2, &[("a", 4, 100)])), granted(100));
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_moves_the_next_send_later_but_never_earlier() {
        let store = MemoryStore::new();
        assert_eq!(reserve(&store, ask(1, &[("a", 1, 100)])), granted(0));
        // The request left 20 ms late and ended at 25 ms: 95 ms to go.
        tokio::time::advance(Duration::from_millis(25)).await;
        release_after(&store, 1, "a", 95);
        assert_eq!(reserve(&store, ask(2, &[("a", 1, 100)])), granted(95));
        // A release asking for less than the store has changes nothing.
        release_after(&store, 2, "a", 10);
        assert_eq!(reserve(&store, ask(3, &[("a", 1, 100)])), granted(195));
    }
}
