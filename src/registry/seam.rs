//! The registry's side of a throttled request: the narrow seam through
//! which [`throttle`](crate::throttle)'s ticket talks to the scheduler
//! (queue, poll, depart, end, and the store's reservation terms). Each
//! call is one lock of the registry.

use std::sync::Arc;
use std::task::Waker;

use tokio::time::Instant;

use super::fast_path::{self, hot, Ended, Held, TwoAdmission, WordPair, WordShard};
use super::report::Collected;
use super::scheduler::{Admission, FastMode, Finishing, Outcome, Scheduler, TicketId, TicketPoll};
use super::ticket::WaitedInScheduler;
use super::{Registry, RequestBound};
use crate::scope::{Priority, Scope, Scopes, DEFAULT_COST};
use crate::store::backend::{ScopeTerms, SharedFacts};
use crate::time::Stamp;

impl Registry {
    /// Queues a request and admits it at once if nothing is ahead of it
    /// and every limit allows: the one way into the registry. Returns its
    /// admission (its ticket, and whether it was admitted: then, whether
    /// its departure must be reported at once) and the request's scopes.
    /// A request of one busy plain scope may be admitted on the scope's
    /// lock-free word instead (see [`fast_path`]). With
    /// the built-in host resolver and a URI that names a host, the host's
    /// scope is found by name under the lock, and a scope already known
    /// costs no new key. A request that would wait is failed at once for
    /// its `bound` and its scopes' bounds (see `scheduler/bounds.rs`).
    #[inline]
    pub(crate) fn enqueue<B>(
        &self,
        asked: Asked<'_, B>,
        priority: Priority,
        bound: RequestBound,
    ) -> (Admission, Scopes) {
        let request = match asked {
            Asked::Scopes(scopes) => return (self.enqueue_scopes(&scopes, priority, bound), scopes),
            Asked::Request(request) => request,
        };
        let authority = request.uri().authority();
        let (true, None, Some(authority)) = (
            self.shared.resolves_hosts,
            request.extensions().get::<Scopes>(),
            authority,
        ) else {
            let scopes = self.resolve(request);
            let admission = self.enqueue_scopes(&scopes, priority, bound);
            return (admission, scopes);
        };
        let name = crate::scope::host_scope_name(authority);
        let mode = match self.admit_unlocked(&name) {
            Ok((fast, key)) => return (Admission::Fast(fast), Scopes::one(key)),
            Err(mode) => mode,
        };
        let (admission, scope) = self.with_scheduler(|scheduler, now, wake| {
            let checked =
                match scheduler.check_bounds([(&*name, DEFAULT_COST)].into_iter(), priority.0, bound, now) {
                    Ok(checked) => checked,
                    Err(refusal) => return (Admission::Refused(refusal), Scope::new(&*name)),
                };
            let (admission, scope) = scheduler.enqueue_named(&name, priority.0, mode, now, wake);
            (scheduler.wait_within(admission, (checked, bound), now), scope)
        });
        (admission, Scopes::one(scope))
    }

    /// [`enqueue`](Self::enqueue) for `scopes`.
    #[inline]
    fn enqueue_scopes(&self, scopes: &Scopes, priority: Priority, bound: RequestBound) -> Admission {
        let (key, _) = scopes.iter().next().expect("a Scopes is never empty");
        let mode = match scopes.len() {
            1 => match self.admit_unlocked(key.as_str()) {
                Ok((fast, _)) => return Admission::Fast(fast),
                Err(mode) => mode,
            },
            2 => match self.admit_two_unlocked(scopes) {
                Some(pair) => return Admission::FastTwo(pair),
                None => FastMode::Join,
            },
            _ => FastMode::Never,
        };
        let admission = self.with_scheduler(|scheduler, now, wake| {
            let named = scopes.iter().map(|(scope, cost)| (scope.as_str(), cost));
            let checked = match scheduler.check_bounds(named, priority.0, bound, now) {
                Ok(checked) => checked,
                Err(refusal) => return Admission::Refused(refusal),
            };
            let admission = scheduler.enqueue(scopes, priority.0, mode, now, wake);
            scheduler.wait_within(admission, (checked, bound), now)
        });
        admission
    }

    /// Admits a request of the scope named `name` on its open word, if
    /// this thread has the word cached, or the registry's directory lists
    /// it, and a lane is free; else how the lock may use the word.
    #[inline(always)]
    fn admit_unlocked(&self, name: &str) -> Result<(Arc<WordShard>, Scope), FastMode> {
        // No word yet (never, without words): the lock decides whether to
        // open one.
        if !self.shared.global.words_exist() {
            return Err(FastMode::Join);
        }
        let found = match hot::admit(self.shared.uid, name) {
            hot::Lookup::Missed => self.shared.words.admit(self.shared.uid, name),
            cached => cached,
        };
        match found {
            hot::Lookup::Admitted(fast, key) => {
                fast.metrics.sent(&key);
                fast.metrics.in_flight(|| self.shared.global.in_flight());
                Ok((fast, key))
            }
            hot::Lookup::Refused | hot::Lookup::Missed => Err(FastMode::Join),
        }
    }

    /// Admits a request of two scopes on their open words, found as
    /// [`admit_unlocked`](Self::admit_unlocked) finds one, if both have a
    /// lane free (see [`fast_path::admit_two`]); else the lock decides.
    fn admit_two_unlocked(&self, scopes: &Scopes) -> Option<WordPair> {
        if !self.shared.global.words_exist() {
            return None;
        }
        let mut keys = scopes.iter().map(|(key, _)| key);
        let (a, b) = (keys.next()?, keys.next()?);
        let (uid, names) = (self.shared.uid, (a.as_str(), b.as_str()));
        // This thread's cache first: a client of one host and its server
        // writes nothing there that the other threads read.
        let admission = hot::with_two(uid, names, fast_path::admit_two).unwrap_or_else(|| {
            self.shared
                .words
                .with_two(names, |first, second| match (first, second) {
                    (Some(first), Some(second)) => {
                        hot::found_two_in_directory(uid, first, second);
                        fast_path::admit_two(first, second)
                    }
                    _ => TwoAdmission::Refused,
                })
        });
        match admission {
            TwoAdmission::Admitted(held) => {
                let metrics = held[0].metrics;
                metrics.sent(a);
                metrics.sent(b);
                metrics.in_flight(|| self.shared.global.in_flight());
                if fast_path::logs_sends() {
                    fast_path::log_sent(a);
                    fast_path::log_sent(b);
                }
                Some(held)
            }
            TwoAdmission::Refused => None,
            TwoAdmission::FirstAdopted(shard) => {
                // Never sent: it gives back what the scheduler counts.
                self.with_scheduler(|scheduler, now, wake| {
                    scheduler.finish_adopted(
                        [Some(&shard), None],
                        Outcome::NoResponse,
                        None,
                        (now, None),
                        wake,
                    )
                });
                None
            }
        }
    }

    /// Polls waiting ticket `id`: admitted (and whether its departure must
    /// be reported at once), or when to look again; once admitted after
    /// waiting, why it waited.
    pub(crate) fn poll_ticket(&self, id: TicketId, waker: &Waker) -> (TicketPoll, Option<WaitedInScheduler>) {
        self.with_scheduler(|scheduler, now, wake| {
            let polled = scheduler.poll_ticket(id, now, waker, wake);
            let waited = match polled {
                TicketPoll::Sent { .. } => scheduler.take_waited(id),
                TicketPoll::Waiting { .. } | TicketPoll::Refused(_) => None,
            };
            (polled, waited)
        })
    }

    /// Records that admitted ticket `id` departed at `at`.
    pub(crate) fn depart(&self, id: TicketId, at: Stamp) {
        self.with_scheduler(|scheduler, now, wake| scheduler.depart(id, at, now, wake));
    }

    /// Ends a request: the one way out of the registry, whoever holds the
    /// request (see [`RequestEnd`]). On a word, by its atomics while the
    /// word is open and no feedback came (the lock only to let a waiter
    /// for a global permit go, or once the scheduler's eviction work is
    /// due); otherwise under one lock, which applies first the departure
    /// the scheduler has yet to learn and the reports the feedback layers
    /// left (then, with a fleet that learns together, shares what
    /// AutoThrottle learnt once it is released). A transfer's end counts
    /// from its response head: the clock is read only when a waiter may
    /// go.
    #[inline(always)]
    pub(crate) fn end(end: RequestEnd<'_>) {
        let RequestEnd {
            owner,
            outcome,
            departed_at,
            timing,
            collected,
        } = end;
        match (owner, timing) {
            (EndOwner::Word(held), timing) => {
                // A transfer's end counts from its head, as the
                // scheduler's lanes do: the word needs only its stamp.
                let ended = match timing {
                    EndTiming::Read(ended, stamp) => (Some(ended), stamp),
                    EndTiming::FromHead(_, head) => (None, Some(head)),
                    EndTiming::Unread => (None, None),
                };
                Self::end_on_words(held, outcome, departed_at, ended, collected)
            }
            (EndOwner::Scheduler(registry, which), EndTiming::FromHead(head, stamp))
                if collected.is_empty() =>
            {
                registry.end_transfer(which, outcome, departed_at, (head, stamp))
            }
            (EndOwner::Scheduler(registry, which), timing) => {
                registry.end_on_scheduler(which, outcome, departed_at, timing.reading(), collected)
            }
        }
    }

    /// [`end`](Self::end) for a ticket of the scheduler or a plain lane, at
    /// `ended` (with its stamp) when the caller read the clock after the
    /// request ended.
    #[inline]
    fn end_on_scheduler(
        &self,
        which: Finishing,
        outcome: Outcome,
        departed_at: Option<Stamp>,
        (ended, ended_stamp): (Option<Instant>, Option<Stamp>),
        collected: &[Collected],
    ) {
        let learns = self.fleet().is_some_and(|fleet| fleet.learns);
        if collected.is_empty() && !learns {
            self.with_scheduler_at(ended, |scheduler, now, wake| {
                scheduler.finish_request(which, outcome, departed_at, (now, ended_stamp), wake)
            });
            return;
        }
        self.end_reported(which, outcome, departed_at, (ended, ended_stamp), collected);
    }

    /// [`end`](Self::end) for a ticket of the scheduler or a plain lane
    /// whose response head came at `head` (its `outcome`) and whose body
    /// has just ended, with no reports left (those of the head were
    /// applied then). Its lanes count from the head (the next gap, and the
    /// time its scope became idle, run from there), so the clock is read
    /// only when a waiter may go now.
    fn end_transfer(
        &self,
        which: Finishing,
        outcome: Outcome,
        departed_at: Option<Stamp>,
        head: (Instant, Stamp),
    ) {
        if self.fleet().is_some_and(|fleet| fleet.learns) {
            return self.end_reported(which, outcome, departed_at, (None, None), &[]);
        }
        let now = |scheduler: &Scheduler| match scheduler.end_lets_someone_go(which) {
            true => Instant::now(),
            false => head.0,
        };
        self.with_scheduler_timed(now, |scheduler, now, wake| {
            // Spares the conversion when `now` is the head.
            let stamp = (now == head.0).then_some(head.1);
            scheduler.finish_request(which, outcome, departed_at, (now, stamp), wake)
        });
    }

    /// [`end`](Self::end) on the scheduler with reports to apply (or a
    /// fleet that learns together), under the same lock as the end.
    #[inline(never)]
    fn end_reported(
        &self,
        which: Finishing,
        outcome: Outcome,
        departed_at: Option<Stamp>,
        (ended, ended_stamp): (Option<Instant>, Option<Stamp>),
        collected: &[Collected],
    ) {
        let mut writes = Vec::new();
        let samples = self.with_scheduler_at(ended, |scheduler, now, wake| {
            self.apply_collected(scheduler, collected, (now, wake), &mut writes);
            scheduler.finish_request(which, outcome, departed_at, (now, ended_stamp), wake);
            scheduler.take_autothrottle_samples()
        });
        self.write_shared(writes);
        if let Some(samples) = samples {
            self.share_autothrottle(samples);
        }
    }

    /// Applies the reports the feedback layers left for a request whose
    /// response head came while its body streams on (its lanes go back at
    /// the body's end), under one lock, as [`end`](Self::end) would apply
    /// them.
    pub(crate) fn apply_head_reports(&self, collected: &[Collected]) {
        let mut writes = Vec::new();
        self.with_scheduler(|scheduler, now, wake| {
            self.apply_collected(scheduler, collected, (now, wake), &mut writes);
        });
        self.write_shared(writes);
    }

    /// [`end`](Self::end) for a request admitted on words (`held`): on the
    /// words alone while they are open and no feedback came; under the
    /// lock (a word reaches its registry) when a word was closed meanwhile
    /// (the scheduler adopted the request there), when requests wait for a
    /// global permit or eviction work is due, or to apply the feedback
    /// layers' reports first.
    #[inline(always)]
    fn end_on_words(
        held: Held<'_>,
        outcome: Outcome,
        departed_at: Option<Stamp>,
        ended: (Option<Instant>, Option<Stamp>),
        collected: &[Collected],
    ) {
        if !collected.is_empty() {
            return Self::end_on_words_with_reports(held, outcome, departed_at, ended.0, collected);
        }
        match held {
            // A request of one scope, the common case, on its own path.
            Held::One(fast) => Self::end_on_word(fast, outcome, departed_at, ended),
            Held::Two(_) => Self::end_on_two_words(held, outcome, departed_at, ended),
        }
    }

    /// [`end_on_words`](Self::end_on_words) for a request of one scope,
    /// admitted on `fast`, without reports.
    fn end_on_word(
        fast: &WordShard,
        outcome: Outcome,
        departed_at: Option<Stamp>,
        (ended, ended_stamp): (Option<Instant>, Option<Stamp>),
    ) {
        let stamp = end_stamp(ended, ended_stamp);
        match fast.end(departed_at, stamp, latency(outcome, departed_at, stamp)) {
            Ended::Open => Self::ended_open(fast, stamp, ended),
            Ended::Adopted => {
                Self::finish_adopted_on(fast, [Some(fast), None], (outcome, departed_at), (stamp, ended))
            }
        }
    }

    /// [`end_on_words`](Self::end_on_words) for a request of two scopes,
    /// without reports.
    #[inline(never)]
    fn end_on_two_words(
        held: Held<'_>,
        outcome: Outcome,
        departed_at: Option<Stamp>,
        (ended, ended_stamp): (Option<Instant>, Option<Stamp>),
    ) {
        let stamp = end_stamp(ended, ended_stamp);
        let adopted = held.end(departed_at, stamp, latency(outcome, departed_at, stamp));
        match adopted.is_empty() {
            true => Self::ended_open(held.first(), stamp, ended),
            false => Self::finish_adopted_on(
                held.first(),
                adopted.shards(),
                (outcome, departed_at),
                (stamp, ended),
            ),
        }
    }

    /// After a request ended open on every word it held (`first` its first
    /// scope's), at `stamp` (`ended`, if the caller read the clock): its
    /// global permit goes back, and the lock is taken only to let a waiter
    /// for one go, or once eviction work is due.
    #[inline(always)]
    fn ended_open(first: &WordShard, stamp: Stamp, ended: Option<Instant>) {
        let global = first.global();
        let waiters = first.release_permit();
        first.metrics.in_flight(|| global.in_flight());
        let due = global.eviction_due(stamp);
        if !(waiters || due) {
            return;
        }
        if let Some(registry) = first.registry() {
            // Every lock ends by serving the global queue: the first
            // waiter goes.
            registry.with_scheduler_at(Some(ended.unwrap_or_else(Instant::now)), |scheduler, now, _| {
                if due {
                    // Requests on words take no lock, so the eviction
                    // work arriving requests do under it is theirs once
                    // it is due.
                    scheduler.evict_expired(now);
                }
            });
        }
    }

    /// Finishes under the lock a request that words closed meanwhile
    /// adopted (`adopted`: its shards there; `first` its first scope's),
    /// which gives back its global permit too.
    #[cold]
    fn finish_adopted_on(
        first: &WordShard,
        adopted: [Option<&WordShard>; 2],
        (outcome, departed_at): (Outcome, Option<Stamp>),
        (stamp, ended): (Stamp, Option<Instant>),
    ) {
        match first.registry() {
            Some(registry) => registry.with_scheduler_at(
                Some(ended.unwrap_or_else(Instant::now)),
                |scheduler, now, wake| {
                    scheduler.finish_adopted(adopted, outcome, departed_at, (now, Some(stamp)), wake)
                },
            ),
            None => {
                let _ = first.global().release();
            }
        }
    }

    /// [`end_on_words`](Self::end_on_words) with the feedback layers'
    /// reports to apply first, under the lock (or, with the registry gone,
    /// nothing to apply them to).
    #[cold]
    fn end_on_words_with_reports(
        held: Held<'_>,
        outcome: Outcome,
        departed_at: Option<Stamp>,
        ended: Option<Instant>,
        collected: &[Collected],
    ) {
        match held.first().registry() {
            Some(registry) => registry.end_on_words_reported(held, outcome, departed_at, ended, collected),
            None => held.end_orphaned(),
        }
    }

    /// [`end_on_words`](Self::end_on_words) with reports to apply first,
    /// under the lock.
    fn end_on_words_reported(
        &self,
        held: Held<'_>,
        outcome: Outcome,
        departed_at: Option<Stamp>,
        ended: Option<Instant>,
        collected: &[Collected],
    ) {
        let mut writes = Vec::new();
        self.with_scheduler_at(ended, |scheduler, now, wake| {
            self.apply_collected(scheduler, collected, (now, wake), &mut writes);
            let stamp = Stamp::of(now);
            let adopted = held.end(departed_at, stamp, latency(outcome, departed_at, stamp));
            if adopted.is_empty() {
                let _ = self.shared.global.release();
            } else {
                scheduler.finish_adopted(adopted.shards(), outcome, departed_at, (now, Some(stamp)), wake)
            }
        });
        self.write_shared(writes);
    }

    /// The store reservation terms of admitted ticket `id`: its scopes
    /// with their effective limits now, and this send's jitter drawn.
    pub(crate) fn fleet_terms(&self, id: TicketId) -> Vec<ScopeTerms> {
        self.with_scheduler(|scheduler, now, _wake| scheduler.fleet_terms(id, now))
    }

    /// Applies what the store said about ticket `id`'s scopes (in the
    /// reservation's order) to the local scopes.
    /// With a fleet that learns together, reads again in the background
    /// what it learnt of the scopes whose copy is stale.
    pub(crate) fn apply_shared_facts(&self, id: TicketId, facts: &[SharedFacts]) {
        let stale = {
            self.with_scheduler(|scheduler, now, wake| scheduler.apply_shared_facts(id, facts, now, wake))
        };
        if !stale.is_empty() {
            self.refresh_learnt(stale);
        }
    }
}

/// The stamp of a request's end: the caller's, or that of its reading
/// `ended`; with neither (a transfer that ended after its head, counted
/// from it), the clock's now.
#[inline(always)]
fn end_stamp(ended: Option<Instant>, ended_stamp: Option<Stamp>) -> Stamp {
    match (ended_stamp, ended) {
        (Some(stamp), _) => stamp,
        (None, Some(ended)) => Stamp::of(ended),
        (None, None) => Stamp::of(Instant::now()),
    }
}

/// The latency of a response that ended at `ended`, sent at `departed_at`.
fn latency(outcome: Outcome, departed_at: Option<Stamp>, ended: Stamp) -> Option<std::time::Duration> {
    match (outcome, departed_at) {
        (Outcome::Response { answered_at, .. }, Some(sent)) => Some(answered_at.unwrap_or(ended).since(sent)),
        _ => None,
    }
}

/// What a request is queued for, as [`Registry::enqueue`] is told it.
pub(crate) enum Asked<'a, B> {
    /// These scopes (a throttle of fixed scopes).
    Scopes(Scopes),
    /// The scopes of this request, resolved as the throttle does (its
    /// [`Scopes`] extension, or the resolver).
    Request(&'a http::Request<B>),
}

/// How a request ended, as [`Registry::end`] is told it.
pub(crate) struct RequestEnd<'a> {
    /// Who holds the request.
    pub(crate) owner: EndOwner<'a>,
    pub(crate) outcome: Outcome,
    /// The departure, when the scheduler has yet to learn it (it is
    /// applied first, as [`Registry::depart`] would have).
    pub(crate) departed_at: Option<Stamp>,
    pub(crate) timing: EndTiming,
    /// The reports the feedback layers left for the request, applied
    /// under the same lock as its end.
    pub(crate) collected: &'a [Collected],
}

/// Who holds a request that ends.
pub(crate) enum EndOwner<'a> {
    /// Admitted on its scopes' lock-free words, where it ends too (a word
    /// reaches its registry when the lock is needed).
    Word(Held<'a>),
    /// A ticket of this registry's scheduler, or a plain lane of it.
    Scheduler(&'a Registry, Finishing),
}

/// How the end of a request is timed.
#[derive(Clone, Copy)]
pub(crate) enum EndTiming {
    /// The caller read the clock after the request ended: that reading,
    /// and its stamp when the caller has it.
    Read(Instant, Option<Stamp>),
    /// The end of a transfer whose response head came at this instant
    /// (and stamp): it counts from the head, and the clock is read only
    /// when a waiter may go.
    FromHead(Instant, Stamp),
    /// No reading: the end is timed when it is applied.
    Unread,
}

impl EndTiming {
    /// The caller's reading and its stamp, if it took one (a transfer's
    /// head is none: an end that reads the clock at once reads it anew).
    #[inline(always)]
    fn reading(self) -> (Option<Instant>, Option<Stamp>) {
        match self {
            EndTiming::Read(ended, stamp) => (Some(ended), stamp),
            EndTiming::FromHead(..) | EndTiming::Unread => (None, None),
        }
    }
}
