//! The lanes a request holds in the registry's scope store, from the
//! store's grant to the request's end (a leaf: the ticket keeps it, the
//! store admission makes it).

use std::time::Duration;

use tokio::time::Instant;

use crate::scope::Scope;
use crate::store::backend::{Lease, LeaseId};

/// The lanes a request holds in the store, from the grant to its end.
#[derive(Debug)]
pub(crate) struct HeldLease {
    id: LeaseId,
    /// Per scope: the scope, the gap after this request's send, and
    /// whether it is this worker's first request to the scope.
    terms: Vec<(Scope, Duration, bool)>,
    /// When the request was handed to the inner service, if it was.
    departed_at: Option<Instant>,
}

impl HeldLease {
    /// The lease `id`, granted on `terms` (per scope: the scope, the gap
    /// after this request's send, whether it is this worker's first
    /// request to the scope).
    pub(crate) fn new(id: LeaseId, terms: Vec<(Scope, Duration, bool)>) -> Self {
        HeldLease {
            id,
            terms,
            departed_at: None,
        }
    }

    /// The lease's name.
    pub(crate) fn id(&self) -> LeaseId {
        self.id
    }

    /// Notes that the request left at `at`: the hand-over, then the
    /// client's write when it stamps it ([`crate::departure`]). The later
    /// reading wins, so a client that wrote late spaces the fleet's next
    /// send from the write the site saw.
    pub(crate) fn depart(&mut self, at: Instant) {
        self.departed_at = Some(self.departed_at.map_or(at, |earlier| earlier.max(at)));
    }

    /// The lease to give back at `now`, when the request has ended: each
    /// scope's next send comes its gap after the request really left (a
    /// late wake-up or a worker clock behind Redis's made it leave after
    /// its granted instant), or after `now` for a first request, whose
    /// connection setup the site saw late. A request that never left adds
    /// nothing: its granted instant already spaced the next one.
    pub(crate) fn release(self, now: Instant) -> Lease {
        let next_send_after = self
            .terms
            .iter()
            .map(|&(_, gap, first)| match self.departed_at {
                None => Duration::ZERO,
                Some(_) if first => gap,
                Some(departed) => (departed + gap).saturating_duration_since(now),
            })
            .collect();
        let mut lease = Lease::new(self.id, self.terms.into_iter().map(|(scope, ..)| scope).collect());
        lease.next_send_after = next_send_after;
        lease
    }
}
