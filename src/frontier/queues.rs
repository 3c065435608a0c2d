//! The frontier's pending requests: one queue per scope, and the order in
//! which scopes are looked at (the one ready longest first). Pure
//! bookkeeping: what a scope's next instant is comes from the registry's
//! prediction, which the caller asks.

use std::borrow::Borrow;
use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeSet, BinaryHeap, HashMap};

use slab::Slab;
use tokio::time::Instant;

use super::redirects::Chain;
use crate::scope::Scope;

/// One pending request: its priority, its arrival, the request (boxed, so
/// a queue's spare capacity costs a pointer per slot, not a request), its
/// tag (boxed: `None` when the tag is the request's URI, taken when it is
/// sent), and its chain of redirects when it is a hop. 40 bytes.
pub(super) struct Entry<B, T> {
    priority: i32,
    seq: u64,
    pub(super) request: Box<http::Request<B>>,
    pub(super) tag: Option<Box<T>>,
    pub(super) chain: Option<Box<Chain>>,
}

impl<B, T> Entry<B, T> {
    fn key(&self) -> (i32, Reverse<u64>) {
        (self.priority, Reverse(self.seq))
    }
}

impl<B, T> PartialEq for Entry<B, T> {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl<B, T> Eq for Entry<B, T> {}

impl<B, T> PartialOrd for Entry<B, T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<B, T> Ord for Entry<B, T> {
    /// The greatest goes first: higher priority, then earlier arrival.
    fn cmp(&self, other: &Self) -> Ordering {
        self.key().cmp(&other.key())
    }
}

/// A scope's pending requests and its place in the ready order.
struct ScopeQueue<B, T> {
    key: Scope,
    entries: BinaryHeap<Entry<B, T>>,
    /// Its key in [`Queues::ready`], while it has one.
    ready_at: Option<ReadyKey>,
    /// Its requests the frontier has in the service now.
    in_flight: u32,
    /// Whether it is in [`Queues::idle`].
    listed_idle: bool,
}

/// Idle queues (nothing pending nor in flight) kept for their scopes'
/// next requests before they are forgotten: a scope whose requests come
/// one at a time keeps its queue instead of making it again for each (a
/// map entry and a slot, about 450 instructions a request). Past this
/// many, the idle ones are forgotten at once: at most about 150 kB.
const IDLE_KEPT: usize = 1024;

/// A queue's spare capacity kept while it is idle: past this, it goes.
const IDLE_CAPACITY: usize = 8;

/// A scope's place in the ready order: the instant from which it may go;
/// among scopes of one instant, the one with the most requests pending
/// first (the names of a shared server, all held for the server's next
/// send, then finish together: the server is not left to its last names
/// alone, each at its own pace, below its allowance); then the one that
/// got the instant first.
type ReadyKey = (Instant, Reverse<usize>, u64);

/// Every scope's queue, and the scopes with pending requests in the ready
/// order ([`ReadyKey`]).
pub(super) struct Queues<B, T> {
    by_key: HashMap<Scope, usize>,
    scopes: Slab<ScopeQueue<B, T>>,
    ready: BTreeSet<(ReadyKey, usize)>,
    /// Queues that went idle since the last sweep (some may have work
    /// again): see [`IDLE_KEPT`].
    idle: Vec<Slot>,
    pending: usize,
    seq: u64,
}

/// A scope's queue, as the caller names it between calls.
pub(super) type Slot = usize;

impl<B, T> Default for Queues<B, T> {
    fn default() -> Self {
        Queues {
            by_key: HashMap::new(),
            scopes: Slab::new(),
            ready: BTreeSet::new(),
            idle: Vec::new(),
            pending: 0,
            seq: 0,
        }
    }
}

impl<B, T> Queues<B, T> {
    /// Requests waiting in every queue.
    pub(super) fn pending(&self) -> usize {
        self.pending
    }

    /// The queue of the scope `key` names, made if it has none.
    pub(super) fn slot_of(&mut self, key: impl Borrow<str> + Into<Scope>) -> Slot {
        if let Some(&slot) = self.by_key.get(key.borrow()) {
            return slot;
        }
        let key: Scope = key.into();
        let slot = self.scopes.insert(ScopeQueue {
            key: key.clone(),
            entries: BinaryHeap::new(),
            ready_at: None,
            in_flight: 0,
            listed_idle: false,
        });
        self.by_key.insert(key, slot);
        slot
    }

    /// Queues `request` with `tag` in `slot`'s queue (see
    /// [`slot_of`](Self::slot_of)), at `priority`; a scope that had no
    /// place in the ready order gets one at `now` (the caller then asks
    /// when it may really go).
    pub(super) fn push(
        &mut self,
        slot: Slot,
        priority: i32,
        (request, tag, chain): (http::Request<B>, Option<Box<T>>, Option<Box<Chain>>),
        now: Instant,
    ) {
        self.seq += 1;
        let seq = self.seq;
        self.scopes[slot].entries.push(Entry {
            priority,
            seq,
            request: Box::new(request),
            tag,
            chain,
        });
        self.pending += 1;
        if self.scopes[slot].ready_at.is_none() {
            self.schedule(slot, now);
        }
    }

    /// The first instant of the ready order, if any scope has pending
    /// requests.
    pub(super) fn next_instant(&self) -> Option<Instant> {
        self.ready.first().map(|&((at, _, _), _)| at)
    }

    /// Takes the scope that may go soonest out of the ready order, if its
    /// instant has come by `now`.
    pub(super) fn pop_ready(&mut self, now: Instant) -> Option<Slot> {
        let &(key, slot) = self.ready.first()?;
        if key.0 > now {
            return None;
        }
        self.ready.remove(&(key, slot));
        self.scopes[slot].ready_at = None;
        Some(slot)
    }

    /// The request at the head of `slot`'s queue.
    pub(super) fn head(&self, slot: Slot) -> Option<&http::Request<B>> {
        self.scopes[slot].entries.peek().map(|entry| &*entry.request)
    }

    /// Puts `slot` in the ready order at `at`, ranked by its pending
    /// requests now (a scope already there keeps the earlier of its instant
    /// and `at`); nothing for a scope with no pending request.
    pub(super) fn schedule(&mut self, slot: Slot, at: Instant) {
        let queue = &mut self.scopes[slot];
        if queue.entries.is_empty() {
            return;
        }
        if let Some(old) = queue.ready_at {
            if old.0 <= at {
                return;
            }
            self.ready.remove(&(old, slot));
        }
        self.seq += 1;
        let key = (at, Reverse(queue.entries.len()), self.seq);
        queue.ready_at = Some(key);
        self.ready.insert((key, slot));
    }

    /// Takes the head of `slot`'s queue to send it: the scope counts it in
    /// flight until [`finished`](Self::finished).
    pub(super) fn take_head(&mut self, slot: Slot) -> Option<Entry<B, T>> {
        let queue = &mut self.scopes[slot];
        let entry = queue.entries.pop()?;
        queue.in_flight += 1;
        self.pending -= 1;
        Some(entry)
    }

    /// A request of `slot` the frontier sent has ended at `now`: its scope
    /// is looked at again at once (a lane of its may be free); a scope
    /// with nothing pending nor in flight is forgotten.
    pub(super) fn finished(&mut self, slot: Slot, now: Instant) {
        let Some(queue) = self.scopes.get_mut(slot) else {
            return;
        };
        queue.in_flight = queue.in_flight.saturating_sub(1);
        self.schedule(slot, now);
        self.forget_if_idle(slot);
    }

    /// Notes that `slot` may have nothing pending nor in flight: such a
    /// queue is kept for its scope's next request, until more than
    /// [`IDLE_KEPT`] went idle; then every queue still idle is forgotten.
    pub(super) fn forget_if_idle(&mut self, slot: Slot) {
        let queue = &mut self.scopes[slot];
        if !queue.is_idle() || queue.listed_idle {
            return;
        }
        queue.listed_idle = true;
        if queue.entries.capacity() > IDLE_CAPACITY {
            queue.entries = BinaryHeap::new();
        }
        self.idle.push(slot);
        if self.idle.len() > IDLE_KEPT {
            self.forget_idle();
        }
    }

    /// Forgets every listed queue that is still idle.
    fn forget_idle(&mut self) {
        for slot in std::mem::take(&mut self.idle) {
            let Some(queue) = self.scopes.get_mut(slot) else {
                continue;
            };
            queue.listed_idle = false;
            if queue.is_idle() {
                let queue = self.scopes.remove(slot);
                self.by_key.remove(&queue.key);
            }
        }
    }
}

impl<B, T> ScopeQueue<B, T> {
    /// Nothing pending, nothing in flight, no place in the ready order.
    fn is_idle(&self) -> bool {
        self.entries.is_empty() && self.in_flight == 0 && self.ready_at.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    impl<B, T> Queues<B, T> {
        fn push_to(
            &mut self,
            key: Scope,
            priority: i32,
            item: (http::Request<B>, Option<Box<T>>, Option<Box<Chain>>),
            now: Instant,
        ) {
            let slot = self.slot_of(key);
            self.push(slot, priority, item, now);
        }
    }

    fn request(path: &str, priority: i32) -> (http::Request<()>, i32) {
        (http::Request::get(path).body(()).unwrap(), priority)
    }

    #[test]
    fn a_scope_gives_its_requests_by_priority_then_arrival() {
        let now = Instant::now();
        let mut queues: Queues<(), &str> = Queues::default();
        for (path, priority) in [("/a", 0), ("/b", 5), ("/c", 0), ("/d", 5)] {
            let (request, priority) = request(path, priority);
            queues.push_to(
                Scope::new("s"),
                priority,
                (request, Some(Box::new(path)), None),
                now,
            );
        }
        let slot = queues.pop_ready(now).unwrap();
        let order: Vec<&str> =
            std::iter::from_fn(|| queues.take_head(slot).map(|entry| *entry.tag.unwrap())).collect();
        assert_eq!(order, ["/b", "/d", "/a", "/c"]);
        assert_eq!(queues.pending(), 0);
    }

    #[test]
    fn the_scope_ready_longest_goes_first_and_a_later_one_waits_its_instant() {
        let now = Instant::now();
        let mut queues: Queues<(), u32> = Queues::default();
        for (index, key) in ["a", "b", "c"].into_iter().enumerate() {
            let (request, _) = request("/", 0);
            queues.push_to(
                Scope::new(key),
                0,
                (request, Some(Box::new(index as u32)), None),
                now,
            );
        }
        let a = queues.pop_ready(now).unwrap();
        let b = queues.pop_ready(now).unwrap();
        queues.schedule(a, now + Duration::from_secs(2));
        queues.schedule(b, now + Duration::from_secs(1));
        let c = queues.pop_ready(now).unwrap();
        assert_eq!(*queues.take_head(c).unwrap().tag.unwrap(), 2);
        assert_eq!(queues.pop_ready(now), None, "a and b are not ready yet");
        assert_eq!(queues.next_instant(), Some(now + Duration::from_secs(1)));
        assert_eq!(queues.pop_ready(now + Duration::from_secs(5)), Some(b));
        assert_eq!(queues.pop_ready(now + Duration::from_secs(5)), Some(a));
    }

    #[test]
    fn among_scopes_of_one_instant_the_one_with_most_pending_goes_first() {
        let now = Instant::now();
        let later = now + Duration::from_millis(25);
        let mut queues: Queues<(), ()> = Queues::default();
        for (key, count) in [("small", 1), ("large", 3), ("middle", 2)] {
            for _ in 0..count {
                let (request, _) = request("/", 0);
                queues.push_to(Scope::new(key), 0, (request, Some(Box::new(())), None), now);
            }
        }
        // All three wait for the same instant (their shared server's next
        // send): the largest goes first, then the middle one.
        let slots: Vec<Slot> = std::iter::from_fn(|| queues.pop_ready(now)).collect();
        for &slot in &slots {
            queues.schedule(slot, later);
        }
        let order: Vec<Slot> = std::iter::from_fn(|| queues.pop_ready(later)).collect();
        let order: Vec<&str> = order
            .into_iter()
            .map(|slot| queues.scopes[slot].key.as_str())
            .collect();
        assert_eq!(order, ["large", "middle", "small"]);
    }

    #[test]
    fn idle_queues_are_kept_for_their_next_request_and_forgotten_past_the_limit() {
        let now = Instant::now();
        let mut queues: Queues<(), ()> = Queues::default();
        let send_one = |queues: &mut Queues<(), ()>, scope: String| {
            let (request, _) = request("/", 0);
            queues.push_to(Scope::new(scope), 0, (request, Some(Box::new(())), None), now);
            let slot = queues.pop_ready(now).unwrap();
            queues.take_head(slot).unwrap();
            let listed = queues.idle.len();
            queues.forget_if_idle(slot);
            assert_eq!(queues.idle.len(), listed, "one request still in flight");
            queues.finished(slot, now);
            slot
        };
        let slot = send_one(&mut queues, "a".into());
        assert_eq!(queues.scopes.len(), 1, "kept while idle");
        assert_eq!(send_one(&mut queues, "a".into()), slot, "the same queue again");
        assert_eq!(queues.idle, [slot], "listed once");
        for scope in 0..IDLE_KEPT {
            send_one(&mut queues, format!("s{scope}"));
        }
        assert!(queues.scopes.is_empty() && queues.by_key.is_empty() && queues.idle.is_empty());
        assert_eq!(queues.pending(), 0);
    }

    #[test]
    fn a_queue_with_work_again_is_not_forgotten() {
        let now = Instant::now();
        let mut queues: Queues<(), ()> = Queues::default();
        let (first, _) = request("/", 0);
        queues.push_to(Scope::new("a"), 0, (first, Some(Box::new(())), None), now);
        let a = queues.pop_ready(now).unwrap();
        queues.take_head(a).unwrap();
        queues.finished(a, now);
        let (again, _) = request("/again", 0);
        queues.push_to(Scope::new("a"), 0, (again, Some(Box::new(())), None), now);
        queues.forget_idle();
        assert_eq!(queues.head(a).unwrap().uri(), "/again");
        assert!(!queues.scopes[a].listed_idle);
    }
}
