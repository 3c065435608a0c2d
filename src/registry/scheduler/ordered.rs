//! Waiters in order: a sorted deque.

use std::collections::VecDeque;

use super::{OrderKey, TicketId};

/// Waiters in order, kept sorted in a deque: a scope's candidates (see
/// [`Waiters`](super::entry::Waiters)) and a group's members (see
/// `groups.rs`).
///
/// Nearly every change is at an end: a new waiter has the latest order
/// (unless it has a higher priority, which puts it near the front), and
/// the waiter that leaves is the one sent, the first. Both are O(1) here,
/// with one allocation for the whole queue, where an ordered map paid a
/// search and its nodes for each. A change inside the queue (a waiter
/// dropped while it waits, a leader put back among later waiters)
/// finds its place by binary search and moves the entries between it and
/// the nearer end; the registry's `max_queued` (10 000 by default) bounds
/// how many that can be.
#[derive(Debug, Default)]
pub(crate) struct Ordered(VecDeque<(OrderKey, TicketId)>);

impl Ordered {
    /// Nobody: the candidates of a scope nobody waits for.
    pub(super) const NONE: Ordered = Ordered(VecDeque::new());

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The first waiter, with its order.
    pub(crate) fn first(&self) -> Option<(OrderKey, TicketId)> {
        self.0.front().copied()
    }

    /// The waiters, first to last.
    pub(crate) fn ids(&self) -> impl Iterator<Item = TicketId> + '_ {
        self.0.iter().map(|&(_, id)| id)
    }

    /// Whether a waiter comes before `order`.
    pub(crate) fn has_one_before(&self, order: OrderKey) -> bool {
        self.0.front().is_some_and(|&(first, _)| first < order)
    }

    /// Adds waiter `id` at its `order` (replacing the one at that order,
    /// should there be one: an order is one waiter's).
    pub(crate) fn insert(&mut self, order: OrderKey, id: TicketId) {
        match self.0.back() {
            Some(&(last, _)) if last >= order => match self.position(order) {
                Ok(at) => self.0[at] = (order, id),
                Err(at) => self.0.insert(at, (order, id)),
            },
            _ => self.0.push_back((order, id)),
        }
    }

    /// Takes out the waiter at `order`, if it is here.
    pub(crate) fn remove(&mut self, order: OrderKey) -> Option<TicketId> {
        match self.0.front() {
            Some(&(first, _)) if first == order => self.0.pop_front().map(|(_, id)| id),
            _ => {
                let at = self.position(order).ok()?;
                self.0.remove(at).map(|(_, id)| id)
            }
        }
    }

    fn position(&self, order: OrderKey) -> Result<usize, usize> {
        self.0.binary_search_by(|&(known, _)| known.cmp(&order))
    }
}

#[cfg(test)]
mod tests {
    use std::cmp::Reverse;

    use super::*;

    fn key(priority: i32, seq: u64) -> OrderKey {
        OrderKey {
            priority: Reverse(priority),
            seq,
        }
    }

    #[test]
    fn waiters_stay_in_order_whatever_the_order_of_changes() {
        let mut waiters = Ordered::default();
        for (priority, seq) in [(0, 1), (0, 2), (5, 3), (0, 4), (1, 5)] {
            waiters.insert(key(priority, seq), seq as TicketId);
        }
        // Higher priority first, then arrival.
        assert_eq!(waiters.ids().collect::<Vec<_>>(), [3, 5, 1, 2, 4]);
        assert_eq!(waiters.first(), Some((key(5, 3), 3)));
        assert!(waiters.has_one_before(key(0, 1)));
        assert!(!waiters.has_one_before(key(5, 3)));

        // Out of the middle, then a waiter put back where it was.
        assert_eq!(waiters.remove(key(0, 2)), Some(2));
        assert_eq!(waiters.remove(key(0, 2)), None, "no longer there");
        waiters.insert(key(0, 2), 2);
        assert_eq!(waiters.ids().collect::<Vec<_>>(), [3, 5, 1, 2, 4]);

        // The first leaves; an order inserted twice stays one waiter.
        assert_eq!(waiters.remove(key(5, 3)), Some(3));
        waiters.insert(key(0, 4), 4);
        assert_eq!(waiters.ids().collect::<Vec<_>>(), [5, 1, 2, 4]);
        for id in [5, 1, 2, 4] {
            let (order, first) = waiters.first().unwrap();
            assert_eq!(first, id);
            assert_eq!(waiters.remove(order), Some(id));
        }
        assert!(waiters.is_empty() && waiters.first().is_none());
    }
}
