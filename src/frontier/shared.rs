//! What the frontier and its handles share: the queues behind one mutex,
//! the count of live handles, and who to wake.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::Waker;

use tokio::time::Instant;

use super::queues::Queues;
use super::redirects::Chain;
use crate::registry::Registry;
use crate::scope::Priority;

/// The state behind the mutex.
pub(super) struct State<B, T> {
    pub(super) queues: Queues<B, T>,
    /// Live [`FrontierHandle`](super::FrontierHandle)s.
    pub(super) handles: usize,
    /// The frontier's task, to wake when a request comes in or the last
    /// handle goes.
    pub(super) frontier: Option<Waker>,
    /// Pushers waiting for room under `max_pending`.
    pub(super) pushers: Vec<Waker>,
    /// Whether the frontier was dropped: pushes fail.
    pub(super) closed: bool,
    /// How an untagged request's tag is made when it is sent: its URI (set
    /// by [`FrontierHandle::push`](super::FrontierHandle::push), where the
    /// tag is a `Uri`).
    pub(super) uri_tag: Option<fn(&http::Request<B>) -> T>,
}

/// The frontier's shared part.
pub(super) struct Shared<B, T> {
    state: Mutex<State<B, T>>,
    pub(super) registry: Registry,
    pub(super) max_pending: usize,
}

impl<B, T> Shared<B, T> {
    pub(super) fn new(registry: Registry, max_pending: usize) -> Self {
        Shared {
            state: Mutex::new(State {
                queues: Queues::default(),
                handles: 1,
                frontier: None,
                pushers: Vec::new(),
                closed: false,
                uri_tag: None,
            }),
            registry,
            max_pending,
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State<B, T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `request` with `tag` (and its chain of redirects, for a hop)
    /// in the queue of its first scope (as the registry resolves it), and
    /// wakes the frontier.
    pub(super) fn enqueue(
        &self,
        state: &mut State<B, T>,
        (request, tag, chain): (http::Request<B>, Option<Box<T>>, Option<Box<Chain>>),
    ) {
        let priority = request
            .extensions()
            .get::<Priority>()
            .copied()
            .unwrap_or_default()
            .0;
        // The key is resolved again for the queue's name only if it is new.
        let key = self.registry.first_scope_name(&request);
        let slot = state.queues.slot_of(key);
        state
            .queues
            .push(slot, priority, (request, tag, chain), Instant::now());
        if let Some(waker) = state.frontier.take() {
            waker.wake();
        }
    }
}

impl<B, T> State<B, T> {
    /// Wakes the pushers waiting for room.
    pub(super) fn wake_pushers(&mut self) {
        for waker in self.pushers.drain(..) {
            waker.wake();
        }
    }
}
