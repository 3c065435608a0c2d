//! Requests whose names are being looked up before they are ordered (with
//! [`FrontierBuilder::ip_scopes`](super::FrontierBuilder::ip_scopes)): a
//! request is queued by its scopes, its server's IP scope among them, only
//! once its name is known, so the frontier never sends a request the
//! server's scope would make wait.

use std::collections::HashMap;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};

use super::boxed::QueuedRequest;
use super::redirects::Chain;
use crate::ip::LookedUp;

/// A request as the frontier holds it: the request (boxed once, as it
/// comes in, and moved no more until it is sent), its tag (`None`: its
/// URI) and its chain of redirects when it is a hop.
pub(super) type Item<B, T> = (QueuedRequest<B>, Option<Box<T>>, Option<Box<Chain>>);

/// The requests waiting for their host's lookup, by host, and one lookup
/// future per host.
pub(super) struct Resolving<B, T> {
    waiting: HashMap<String, Vec<Item<B, T>>>,
    lookups: FuturesUnordered<BoxFuture<'static, (String, LookedUp)>>,
    count: usize,
}

impl<B, T> Default for Resolving<B, T> {
    fn default() -> Self {
        Resolving {
            waiting: HashMap::new(),
            lookups: FuturesUnordered::new(),
            count: 0,
        }
    }
}

impl<B, T> Resolving<B, T> {
    /// Requests waiting for a lookup.
    pub(super) fn len(&self) -> usize {
        self.count
    }

    /// `item` waits for `host`'s lookup (the first of its host brings it).
    pub(super) fn wait(&mut self, host: String, lookup: BoxFuture<'static, LookedUp>, item: Item<B, T>) {
        self.count += 1;
        match self.waiting.get_mut(&host) {
            Some(items) => items.push(item),
            None => {
                self.waiting.insert(host.clone(), vec![item]);
                self.lookups.push(Box::pin(async move { (host, lookup.await) }));
            }
        }
    }

    /// A lookup that ended, with the requests that waited for it; `cx` is
    /// woken when the next one ends.
    pub(super) fn poll_looked_up(&mut self, cx: &mut Context<'_>) -> Option<(LookedUp, Vec<Item<B, T>>)> {
        match self.lookups.poll_next_unpin(cx) {
            Poll::Ready(Some((host, answer))) => {
                let items = self.waiting.remove(&host).unwrap_or_default();
                self.count -= items.len();
                Some((answer, items))
            }
            Poll::Ready(None) | Poll::Pending => None,
        }
    }
}
