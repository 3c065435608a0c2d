//! What the frontier and its handles share: the queues behind one mutex,
//! the count of live handles, and who to wake.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::{Context, Waker};

use super::boxed::{QueuedRequest, SpareBoxes};
use super::clock::Clock;
use super::queues::Queues;
use super::resolving::{Item, Resolving};
use crate::ip::{Ahead, IpScopeLayer};
use crate::registry::Registry;
use crate::scope::Priority;

/// The state behind the mutex.
pub(super) struct State<B, T> {
    pub(super) queues: Queues<B, T>,
    /// The boxes of requests sent, for the next pushes.
    pub(super) spare_boxes: SpareBoxes<B>,
    /// The clock as read under this lock.
    pub(super) clock: Clock,
    /// Requests waiting for their name's lookup before they are queued.
    pub(super) resolving: Resolving<B, T>,
    /// Live [`FrontierHandle`](super::FrontierHandle)s.
    pub(super) handles: usize,
    /// The frontier's task, to wake when a request comes in or the last
    /// handle goes.
    pub(super) frontier: Option<Waker>,
    /// Pushers waiting for room under `max_pending`.
    pub(super) pushers: Vec<Waker>,
    /// Whether a request was queued since the frontier last looked at
    /// the queues: it looks again before it sleeps (a push while it sends
    /// is not left waiting for the next wake).
    pub(super) queued_since_look: bool,
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
    /// Resolves requests' IP scopes before they are queued, when set.
    ip: Option<IpScopeLayer>,
}

impl<B, T> Shared<B, T> {
    pub(super) fn new(registry: Registry, max_pending: usize, ip: Option<IpScopeLayer>) -> Self {
        Shared {
            state: Mutex::new(State {
                queues: Queues::default(),
                spare_boxes: SpareBoxes::default(),
                clock: Clock::default(),
                resolving: Resolving::default(),
                handles: 1,
                frontier: None,
                pushers: Vec::new(),
                queued_since_look: false,
                closed: false,
                uri_tag: None,
            }),
            registry,
            max_pending,
            ip,
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State<B, T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `request` with `tag` (and its chain of redirects, for a hop)
    /// in the queue of its first scope (as the registry resolves it), and
    /// wakes the frontier. With IP scopes, a request whose name is not
    /// known yet waits for its lookup first.
    pub(super) fn enqueue(&self, state: &mut State<B, T>, (request, tag, chain): Item<B, T>) {
        let request = match &self.ip {
            None => request,
            Some(ip) => match ip.resolve_ahead(request.into_inner()) {
                Ahead::Ready(request) => QueuedRequest::new(request),
                Ahead::Wait {
                    host,
                    lookup,
                    request,
                } => {
                    state
                        .resolving
                        .wait(host, lookup, (QueuedRequest::new(request), tag, chain));
                    if let Some(waker) = state.frontier.take() {
                        waker.wake();
                    }
                    return;
                }
            },
        };
        let priority = request
            .extensions()
            .get::<Priority>()
            .copied()
            .unwrap_or_default()
            .0;
        let slot = match self.registry.host_scope_authority(&request) {
            Some(authority) => state.queues.slot_of_host(authority),
            // The key is resolved again for the queue's name only if it is
            // new.
            None => state.queues.slot_of(self.registry.first_scope_name(&request)),
        };
        let clock = &mut state.clock;
        state
            .queues
            .push(slot, priority, (request, tag, chain), || clock.now());
        state.queued_since_look = true;
        if let Some(waker) = state.frontier.take() {
            waker.wake();
        }
    }

    /// Queues the requests whose lookups ended; `cx` is woken when the
    /// next one ends. Nothing (and no lock) without IP scopes.
    pub(super) fn queue_looked_up(&self, cx: &mut Context<'_>) {
        let Some(ip) = &self.ip else {
            return;
        };
        let mut state = self.lock();
        while let Some((answer, items)) = state.resolving.poll_looked_up(cx) {
            for (request, tag, chain) in items {
                let request = QueuedRequest::new(ip.settle_ahead(&answer, request.into_inner()));
                self.enqueue(&mut state, (request, tag, chain));
            }
        }
    }
}

impl<B, T> State<B, T> {
    /// Requests held: queued, or waiting for their name's lookup.
    pub(super) fn pending(&self) -> usize {
        self.queues.pending() + self.resolving.len()
    }

    /// Wakes the pushers waiting for room.
    pub(super) fn wake_pushers(&mut self) {
        if self.pushers.is_empty() {
            return;
        }
        for waker in self.pushers.drain(..) {
            waker.wake();
        }
    }
}
