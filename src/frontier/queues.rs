//! The frontier's pending requests: one queue per scope, and the order in
//! which scopes are looked at (the one ready longest first). Pure
//! bookkeeping: what a scope's next instant is comes from the registry's
//! prediction, which the caller asks.

use std::borrow::Borrow;
use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::ops::Bound;

use slab::Slab;
use tokio::time::Instant;

use super::boxed::QueuedRequest;
use super::redirects::Chain;
use super::resolving::Item;
use crate::scope::Scope;

/// One pending request: its priority, its arrival, the request (boxed, so
/// a queue's spare capacity costs a pointer per slot, not a request), its
/// tag (boxed: `None` when the tag is the request's URI, taken when it is
/// sent), and its chain of redirects when it is a hop. 40 bytes.
pub(super) struct Entry<B, T> {
    priority: i32,
    seq: u64,
    pub(super) request: QueuedRequest<B>,
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

/// A scope's pending requests, the one that goes next kept apart from the
/// heap of the others: while a scope has one request pending at a time (a
/// crawl's requests taken one by one), its heap is not touched.
struct Entries<B, T> {
    /// The greatest of all; `None` only when there are none.
    next: Option<Entry<B, T>>,
    /// The others, all below `next`.
    rest: BinaryHeap<Entry<B, T>>,
}

impl<B, T> Entries<B, T> {
    fn new() -> Self {
        Entries {
            next: None,
            rest: BinaryHeap::new(),
        }
    }

    fn push(&mut self, entry: Entry<B, T>) {
        match &mut self.next {
            None => self.next = Some(entry),
            Some(next) if entry > *next => {
                let next = std::mem::replace(next, entry);
                self.rest.push(next);
            }
            Some(_) => self.rest.push(entry),
        }
    }

    fn peek(&self) -> Option<&Entry<B, T>> {
        self.next.as_ref()
    }

    fn pop(&mut self) -> Option<Entry<B, T>> {
        let next = self.next.take()?;
        if !self.rest.is_empty() {
            self.next = self.rest.pop();
        }
        Some(next)
    }

    fn len(&self) -> usize {
        self.rest.len() + usize::from(self.next.is_some())
    }

    fn is_empty(&self) -> bool {
        self.next.is_none()
    }

    /// Gives back the heap's spare capacity past [`IDLE_CAPACITY`].
    fn trim(&mut self) {
        if self.rest.capacity() > IDLE_CAPACITY {
            self.rest = BinaryHeap::new();
        }
    }
}

/// A scope's pending requests and its place in the ready order.
struct ScopeQueue<B, T> {
    key: Scope,
    entries: Entries<B, T>,
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

/// Instants this close count as one in the ready order: on a real clock,
/// the names waiting for one server's next send get instants that differ
/// by the lag between a send and its departure stamp (a name that asks
/// before the stamp lands is told the send's instant plus the server's
/// gap; one that asks after, the departure's plus the gap), and the one
/// with the most pending must still go first.
const ONE_INSTANT: std::time::Duration = std::time::Duration::from_micros(500);

/// How many places after the first a pop looks at for one of
/// [`ONE_INSTANT`] with more pending: a bound on the work of a pop.
const TIE_LOOKS: usize = 8;

/// The scopes with pending requests in the ready order, the first kept
/// beside the others: while one scope at a time is ready (a crawl's
/// requests taken one by one), the order is that one place, and no tree
/// node is made and freed for each request.
#[derive(Default)]
struct ReadyOrder {
    /// The least of all; `None` only when there are none.
    first: Option<(ReadyKey, Slot)>,
    /// The others, all after `first`.
    rest: BTreeSet<(ReadyKey, Slot)>,
}

impl ReadyOrder {
    fn first(&self) -> Option<&(ReadyKey, Slot)> {
        self.first.as_ref()
    }

    fn insert(&mut self, place: (ReadyKey, Slot)) {
        match &mut self.first {
            None => self.first = Some(place),
            Some(first) if place < *first => {
                let first = std::mem::replace(first, place);
                self.rest.insert(first);
            }
            Some(_) => {
                self.rest.insert(place);
            }
        }
    }

    fn remove(&mut self, place: &(ReadyKey, Slot)) {
        if self.first.as_ref() == Some(place) {
            self.pop_first();
        } else {
            self.rest.remove(place);
        }
    }

    /// Takes the first place out: its slot (its key is not copied out).
    fn pop_first(&mut self) -> Option<Slot> {
        let slot = self.first.as_ref()?.1;
        self.first = match self.rest.is_empty() {
            true => None,
            false => self.rest.pop_first(),
        };
        Some(slot)
    }

    /// Takes the place that goes next at `now`: the first, or a place of
    /// [`ONE_INSTANT`] later, come by `now`, with more requests pending.
    fn pop_next(&mut self, now: Instant) -> Option<Slot> {
        let first = self.first.as_ref()?;
        match self.more_pending_at_one_instant(first, now) {
            Some(later) => {
                self.rest.remove(&later);
                Some(later.1)
            }
            None => self.pop_first(),
        }
    }

    /// Among the [`TIE_LOOKS`] places after `first`'s instant that lie
    /// within [`ONE_INSTANT`] of it and have come by `now`, the one with
    /// the most pending, if it has more than `first`.
    fn more_pending_at_one_instant(
        &self,
        first: &(ReadyKey, Slot),
        now: Instant,
    ) -> Option<(ReadyKey, Slot)> {
        let &((at, first_pending, _), _) = first;
        if self.rest.is_empty() || now <= at {
            return None;
        }
        // Past every place of `first`'s own instant (ranked among
        // themselves already).
        let after_instant = ((at, Reverse(0), u64::MAX), Slot::MAX);
        self.rest
            .range((Bound::Excluded(after_instant), Bound::Unbounded))
            .take(TIE_LOOKS)
            .take_while(|((later, _, _), _)| *later <= now && *later - at <= ONE_INSTANT)
            .fold(None::<(ReadyKey, Slot)>, |best, &place| {
                let most = best.map_or(first_pending, |((_, pending, _), _)| pending);
                if place.0 .1 < most {
                    Some(place)
                } else {
                    best
                }
            })
    }
}

/// Every scope's queue, and the scopes with pending requests in the ready
/// order ([`ReadyKey`]).
pub(super) struct Queues<B, T> {
    by_key: HashMap<Scope, usize>,
    scopes: Slab<ScopeQueue<B, T>>,
    ready: ReadyOrder,
    /// Queues that went idle since the last sweep (some may have work
    /// again): see [`IDLE_KEPT`].
    idle: Vec<Slot>,
    /// The queue [`slot_of_host`](Queues::slot_of_host) gave last, and the
    /// authority it was given (as the request wrote it): a crawl's
    /// requests come site by site, and the next request of the same
    /// authority costs a comparison, not its scope's name found and hashed
    /// again.
    last: Option<Slot>,
    last_authority: String,
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
            ready: ReadyOrder::default(),
            idle: Vec::new(),
            last: None,
            last_authority: String::new(),
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
            entries: Entries::new(),
            ready_at: None,
            in_flight: 0,
            listed_idle: false,
        });
        self.by_key.insert(key, slot);
        slot
    }

    /// The queue of a request whose one scope is its host's (the
    /// registry's host resolver names it from `authority`).
    pub(super) fn slot_of_host(&mut self, authority: &http::uri::Authority) -> Slot {
        match self.last {
            Some(last) if self.last_authority == authority.as_str() => last,
            _ => {
                let slot = self.slot_of(crate::scope::host_scope_name(authority));
                self.last = Some(slot);
                self.last_authority.clear();
                self.last_authority.push_str(authority.as_str());
                slot
            }
        }
    }

    /// Queues `request` with `tag` in `slot`'s queue (see
    /// [`slot_of`](Self::slot_of)), at `priority`; a scope that had no
    /// place in the ready order gets one at `now` (the clock, read only
    /// then; the caller then asks when it may really go).
    pub(super) fn push(
        &mut self,
        slot: Slot,
        priority: i32,
        (request, tag, chain): Item<B, T>,
        now: impl FnOnce() -> Instant,
    ) {
        self.seq += 1;
        let queue = &mut self.scopes[slot];
        queue.entries.push(Entry {
            priority,
            seq: self.seq,
            request,
            tag,
            chain,
        });
        self.pending += 1;
        if queue.ready_at.is_none() {
            self.schedule(slot, now());
        }
    }

    /// The first instant of the ready order, if any scope has pending
    /// requests.
    pub(super) fn next_instant(&self) -> Option<Instant> {
        self.ready.first().map(|&((at, _, _), _)| at)
    }

    /// Takes the scope that goes next at `now` out of the ready order: the
    /// one that may go soonest (the caller saw its instant come:
    /// [`next_instant`](Self::next_instant)), or one of the same instant
    /// within [`ONE_INSTANT`] with more pending.
    pub(super) fn pop_first(&mut self, now: Instant) -> Option<Slot> {
        let slot = self.ready.pop_next(now)?;
        self.scopes[slot].ready_at = None;
        Some(slot)
    }

    /// The request at the head of `slot`'s queue, and the name of the
    /// queue's scope (the request's first scope).
    pub(super) fn head(&self, slot: Slot) -> Option<(&http::Request<B>, &str)> {
        let queue = &self.scopes[slot];
        let entry = queue.entries.peek()?;
        Some((&*entry.request, queue.key.as_str()))
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

    /// `slot`'s next request is looked at again at once, at `now` (the
    /// clock, read only if the scope has requests pending).
    pub(super) fn look_again(&mut self, slot: Slot, now: impl FnOnce() -> Instant) {
        if !self.scopes[slot].entries.is_empty() {
            self.schedule(slot, now());
        }
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

    /// A request of `slot` the frontier sent has ended at `now` (the
    /// clock, read only if the scope has requests pending): its scope is
    /// looked at again at once (a lane of its may be free); a scope with
    /// nothing pending nor in flight is forgotten.
    pub(super) fn finished(&mut self, slot: Slot, now: impl FnOnce() -> Instant) {
        let Some(queue) = self.scopes.get_mut(slot) else {
            return;
        };
        queue.in_flight = queue.in_flight.saturating_sub(1);
        if !queue.entries.is_empty() {
            // Not idle: it has requests pending.
            self.schedule(slot, now());
        } else if queue.is_idle() && !queue.listed_idle {
            self.list_idle(slot);
        }
    }

    /// Notes that `slot` may have nothing pending nor in flight: such a
    /// queue is kept for its scope's next request, until more than
    /// [`IDLE_KEPT`] went idle; then every queue still idle is forgotten.
    #[inline]
    pub(super) fn forget_if_idle(&mut self, slot: Slot) {
        let queue = &self.scopes[slot];
        if queue.is_idle() && !queue.listed_idle {
            self.list_idle(slot);
        }
    }

    /// Lists `slot`'s idle queue, to be forgotten past [`IDLE_KEPT`].
    fn list_idle(&mut self, slot: Slot) {
        let queue = &mut self.scopes[slot];
        queue.listed_idle = true;
        queue.entries.trim();
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
                if self.last == Some(slot) {
                    self.last = None;
                }
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
        /// The scope that may go soonest, if its instant has come by
        /// `now`.
        fn pop_ready(&mut self, now: Instant) -> Option<Slot> {
            self.next_instant().filter(|&at| at <= now)?;
            self.pop_first(now)
        }

        fn push_to(
            &mut self,
            key: Scope,
            priority: i32,
            (request, tag, chain): (http::Request<B>, Option<Box<T>>, Option<Box<Chain>>),
            now: Instant,
        ) {
            let slot = self.slot_of(key);
            self.push(slot, priority, (QueuedRequest::new(request), tag, chain), || now);
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
    fn instants_half_a_millisecond_apart_are_one_and_the_most_pending_goes_first_once_both_came() {
        let now = Instant::now();
        let micros = |n| now + Duration::from_micros(n);
        let mut queues: Queues<(), ()> = Queues::default();
        for (key, count) in [
            ("asked before the stamp", 1),
            ("asked after", 3),
            ("a millisecond later", 5),
        ] {
            for _ in 0..count {
                let (request, _) = request("/", 0);
                queues.push_to(Scope::new(key), 0, (request, Some(Box::new(())), None), now);
            }
        }
        let name = |queues: &Queues<(), ()>, slot: Slot| queues.scopes[slot].key.as_str().to_owned();
        let slots: Vec<Slot> = std::iter::from_fn(|| queues.pop_ready(now)).collect();
        for slot in slots {
            let at = match name(&queues, slot).as_str() {
                "asked before the stamp" => micros(25_000),
                "asked after" => micros(25_100),
                _ => micros(26_000),
            };
            queues.schedule(slot, at);
        }
        // At its instant exactly, the first goes: the other's has not come.
        let first = queues.pop_ready(micros(25_000)).unwrap();
        assert_eq!(name(&queues, first), "asked before the stamp");
        queues.schedule(first, micros(25_000));
        // Once both came, the one with more pending goes first; the one a
        // millisecond later, with more still, is another instant.
        let order: Vec<Slot> = std::iter::from_fn(|| queues.pop_ready(micros(26_500))).collect();
        let order: Vec<String> = order.into_iter().map(|slot| name(&queues, slot)).collect();
        assert_eq!(
            order,
            ["asked after", "asked before the stamp", "a millisecond later"]
        );
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
            queues.finished(slot, || now);
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
        queues.finished(a, || now);
        let (again, _) = request("/again", 0);
        queues.push_to(Scope::new("a"), 0, (again, Some(Box::new(())), None), now);
        queues.forget_idle();
        assert_eq!(queues.head(a).unwrap().0.uri(), "/again");
        assert!(!queues.scopes[a].listed_idle);
    }
}
