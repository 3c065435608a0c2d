//! Predictions: when a request could be admitted, read from the state the
//! scheduler decides on, without taking anything (see
//! `scope_state/forecast.rs` for one scope).

use tokio::time::Instant;

use super::groups::NO_GROUP;
use super::{OrderKey, Scheduler, ScopeId, TicketId};
use crate::registry::scope_state::ScopeForecast;
use crate::registry::LimitSource;
use crate::scope::Scopes;
use crate::waited::WaitCause;

impl Scheduler {
    /// The forecast for a request of `scopes` with `priority` that came
    /// now: every waiter of its scopes that it would stand behind goes
    /// first. A scope the scheduler does not know has nothing in its way.
    pub(crate) fn forecast_new(&self, scopes: &Scopes, priority: i32, now: Instant) -> ScopeForecast {
        let seats = scopes.iter().filter_map(|(key, cost)| {
            let id = self.index.get(key.as_str(), &self.scopes)?;
            Some((id, cost))
        });
        self.forecast_new_seats(seats, priority, now)
    }

    /// [`forecast_new`](Self::forecast_new) for the scopes the scheduler
    /// knows, by id.
    pub(crate) fn forecast_new_seats(
        &self,
        seats: impl Iterator<Item = (ScopeId, f64)>,
        priority: i32,
        now: Instant,
    ) -> ScopeForecast {
        let order = OrderKey {
            priority: std::cmp::Reverse(priority),
            seq: self.next_seq,
        };
        self.forecast_seats(seats, order, now)
    }

    /// The forecast for waiting ticket `id`, from where it stands.
    pub(crate) fn forecast_ticket(&self, id: TicketId, now: Instant) -> ScopeForecast {
        let ticket = &self.tickets[id];
        let seats = ticket.seats.iter().map(|seat| (seat.scope, seat.cost));
        self.forecast_seats(seats, ticket.order, now)
    }

    /// The forecast of a request with these seats standing at `order`: the
    /// latest of its scopes' (all-or-nothing admission), then the global
    /// limit, whose next free permit is not known.
    fn forecast_seats(
        &self,
        seats: impl Iterator<Item = (ScopeId, f64)>,
        order: OrderKey,
        now: Instant,
    ) -> ScopeForecast {
        let mut forecast = ScopeForecast {
            at: now,
            cause: None,
            exact: true,
        };
        for (id, cost) in seats {
            let scope = &self.scopes[id];
            let effective = scope.state.effective(now, self.max_concurrency);
            let ahead = self.waiters_ahead(id, order);
            let on_word = scope.on_word();
            let of_scope = scope.state.forecast(now, &effective, (cost, ahead), on_word);
            forecast.exact &= of_scope.exact;
            if of_scope.at > forecast.at {
                forecast.at = of_scope.at;
                forecast.cause = of_scope.cause;
            }
        }
        let earlier_waits_globally = self
            .global_queue
            .first_key_value()
            .is_some_and(|(&first, _)| first < order);
        if !self.global.has_room() || earlier_waits_globally {
            // When a permit frees is not known.
            forecast.exact = false;
            if forecast.at == now {
                forecast.cause = Some((WaitCause::GlobalConcurrency, Some(LimitSource::MaxConcurrency)));
            }
        }
        forecast
    }

    /// How many requests waiting for `scope` stand before `order`: its
    /// candidates and parked leaders, and the members of their groups.
    fn waiters_ahead(&self, scope: ScopeId, order: OrderKey) -> usize {
        let entry = &self.scopes[scope];
        if !entry.has_waiters() {
            return 0;
        }
        let standing = entry.queue().ids().chain(entry.parked().values().copied());
        let mut ahead = 0;
        for id in standing {
            let ticket = &self.tickets[id];
            if ticket.group == NO_GROUP {
                ahead += usize::from(ticket.order < order);
            } else {
                ahead += self
                    .groups
                    .members(ticket.group)
                    .filter(|&member| self.tickets[member].order < order)
                    .count();
            }
        }
        ahead
    }
}
