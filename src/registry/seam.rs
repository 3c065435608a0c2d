//! The registry's side of a throttled request: the narrow seam through
//! which [`throttle`](crate::throttle)'s ticket talks to the scheduler
//! (queue, poll, depart, finish, and the store's reservation terms). Each
//! call is one lock of the registry.

use std::task::Waker;

use tokio::time::Instant;

use super::report::Collected;
use super::scheduler::{Outcome, TicketId, TicketPoll};
use super::ticket::WaitedInScheduler;
use super::Registry;
use crate::scope::{Priority, Scopes};
use crate::store::{ScopeTerms, SharedFacts};
use crate::time::Stamp;

impl Registry {
    /// Queues a request for `scopes` and admits it at once if nothing is
    /// ahead of it and every limit allows: its ticket, and whether it was
    /// admitted (then, whether its departure must be reported at once).
    #[inline]
    pub(crate) fn enqueue(&self, scopes: &Scopes, priority: Priority) -> (TicketId, Option<bool>) {
        self.with_scheduler(|scheduler, now, wake| scheduler.enqueue(scopes, priority.0, now, wake))
    }

    /// Resolves `request`'s scopes as the throttle does (its [`Scopes`]
    /// extension, or the resolver) and queues it as
    /// [`enqueue`](Self::enqueue) does; also returns the scopes. With the
    /// built-in host resolver and a URI that names a host, the host's
    /// scope is found by name under the lock, and a scope already known
    /// costs no new key.
    #[inline]
    pub(crate) fn enqueue_resolved<B>(
        &self,
        request: &http::Request<B>,
        priority: Priority,
    ) -> (TicketId, Option<bool>, Scopes) {
        let authority = request.uri().authority();
        let (true, None, Some(authority)) = (
            self.shared.resolves_hosts,
            request.extensions().get::<Scopes>(),
            authority,
        ) else {
            let scopes = self.resolve(request);
            let (id, admitted) = self.enqueue(&scopes, priority);
            return (id, admitted, scopes);
        };
        let name = crate::scope::host_scope_name(authority);
        let (id, admitted, scope) =
            self.with_scheduler(|scheduler, now, wake| scheduler.enqueue_named(&name, priority.0, now, wake));
        (id, admitted, Scopes::one(scope))
    }

    /// Polls waiting ticket `id`: admitted (and whether its departure must
    /// be reported at once), or when to look again; once admitted after
    /// waiting, why it waited.
    pub(crate) fn poll_ticket(
        &self,
        id: TicketId,
        waker: &Waker,
    ) -> (TicketPoll, Option<Box<WaitedInScheduler>>) {
        self.with_scheduler(|scheduler, now, wake| {
            let polled = scheduler.poll_ticket(id, now, waker, wake);
            let waited = match polled {
                TicketPoll::Sent { .. } => scheduler.take_waited(id),
                TicketPoll::Waiting { .. } => None,
            };
            (polled, waited)
        })
    }

    /// Records that admitted ticket `id` departed at `at`.
    pub(crate) fn depart(&self, id: TicketId, at: Stamp) {
        self.with_scheduler(|scheduler, now, wake| scheduler.depart(id, at, now, wake));
    }

    /// Ends ticket `id` with `outcome`, applying first `departed_at` (a
    /// departure the scheduler has yet to learn) and the reports the
    /// feedback layers left for it; at `ended` (with its stamp) when the
    /// caller read the clock after the request ended.
    #[inline]
    pub(crate) fn finish(
        &self,
        id: TicketId,
        outcome: Outcome,
        departed_at: Option<Stamp>,
        (ended, ended_stamp): (Option<Instant>, Option<Stamp>),
        collected: &[Collected],
    ) {
        let learns = self.fleet().is_some_and(|fleet| fleet.learns);
        if collected.is_empty() && !learns {
            self.with_scheduler_at(ended, |scheduler, now, wake| {
                scheduler.finish(id, outcome, departed_at, (now, ended_stamp), wake)
            });
            return;
        }
        let mut writes = Vec::new();
        let samples = self.with_scheduler_at(ended, |scheduler, now, wake| {
            self.apply_collected(scheduler, collected, (now, wake), &mut writes);
            scheduler.finish(id, outcome, departed_at, (now, ended_stamp), wake);
            scheduler.take_autothrottle_samples()
        });
        self.write_shared(writes);
        if let Some(samples) = samples {
            self.share_autothrottle(samples);
        }
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
        let stale =
            self.with_scheduler(|scheduler, now, wake| scheduler.apply_shared_facts(id, facts, now, wake));
        if !stale.is_empty() {
            self.refresh_learnt(stale);
        }
    }
}
