//! What a request admitted on words holds, and the admission of a request
//! of two scopes on both its words: see the parent module's "Requests of
//! two scopes".

use std::sync::Arc;
use std::time::Duration;

use super::shard::{self, SHARDS};
use super::word::{self, Ended, TwoLanes};
use super::{FastScope, WordShard};
use crate::time::Stamp;

/// The lanes a request of two scopes admitted on their words holds, and
/// ends on: a shard of each word (boxed, so that a request that holds
/// them keeps the size of one that holds one).
pub(crate) type WordPair = Box<[Arc<WordShard>; 2]>;

/// What a request admitted on words holds (a shard, or a [`WordPair`]), as its end
/// reads it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Held<'a> {
    One(&'a WordShard),
    Two(&'a [Arc<WordShard>; 2]),
}

impl<'a> Held<'a> {
    /// The first scope's shard (the one whose permits' shard the request's
    /// global permit goes back to).
    #[inline(always)]
    pub(crate) fn first(self) -> &'a WordShard {
        match self {
            Held::One(shard) => shard,
            Held::Two(shards) => &shards[0],
        }
    }

    /// Ends the request on each shard it holds (see [`WordShard::end`]):
    /// the shards whose word was closed meanwhile, where the scheduler
    /// adopted it and it must finish under the lock.
    pub(crate) fn end(
        self,
        departed_at: Option<Stamp>,
        ended: Stamp,
        latency: Option<Duration>,
    ) -> AdoptedOn<'a> {
        let adopted = |shard: &&WordShard| shard.end(departed_at, ended, latency) == Ended::Adopted;
        match self {
            Held::One(shard) => AdoptedOn {
                first: Some(shard).filter(adopted),
                second: None,
            },
            Held::Two([first, second]) => AdoptedOn {
                first: Some(&**first).filter(adopted),
                second: Some(&**second).filter(adopted),
            },
        }
    }

    /// Ends a request whose registry is gone: its counts go back, and
    /// nobody is left to wait for them.
    pub(crate) fn end_orphaned(self) {
        let _ = self.end(None, Stamp::EARLIEST, None);
        let _ = self.first().release_permit();
    }
}

/// The shards of a [`Held`] whose words adopted the request.
pub(crate) struct AdoptedOn<'a> {
    first: Option<&'a WordShard>,
    second: Option<&'a WordShard>,
}

impl<'a> AdoptedOn<'a> {
    /// Whether the request ended on every word open.
    #[inline(always)]
    pub(crate) fn is_empty(&self) -> bool {
        self.first.is_none() && self.second.is_none()
    }

    /// The shards, for [`Scheduler::finish_adopted`](crate::registry::scheduler::Scheduler::finish_adopted).
    pub(crate) fn shards(&self) -> [Option<&'a WordShard>; 2] {
        [self.first, self.second]
    }
}

/// What [`admit_two`] gave.
#[derive(Debug)]
pub(crate) enum TwoAdmission {
    /// A global permit and a lane on each word.
    Admitted(WordPair),
    /// Nothing taken: a permit or a lane was not free.
    Refused,
    /// Nothing taken, but the lane taken on the first scope's word (this
    /// shard) was adopted by a close meanwhile: the caller finishes it
    /// under the lock, never sent, which gives back its permit too.
    FirstAdopted(Arc<WordShard>),
}

/// Admits a request of the two scopes `a` and `b` (of one registry) on
/// their open words: a global permit, then a lane on each, on this
/// thread's home shards first (see [`word::take_two_lanes`]).
pub(crate) fn admit_two(a: &FastScope, b: &FastScope) -> TwoAdmission {
    if std::ptr::eq(a, b) {
        // One scope named twice: the scheduler decides what that means.
        return TwoAdmission::Refused;
    }
    let permits = &a.shards[0].global.counts.permits;
    let home = shard::home();
    if !permits.try_take_at(home) {
        return TwoAdmission::Refused;
    }
    let at = |step: usize| (home + step) % SHARDS;
    match word::take_two_lanes(&a.words_from(home), &b.words_from(home)) {
        TwoLanes::Taken(one, two) => {
            TwoAdmission::Admitted(Box::new([a.shards[at(one)].clone(), b.shards[at(two)].clone()]))
        }
        TwoLanes::Refused => {
            // As `FastScope::admit`'s: waiters are the lock path's.
            let _ = permits.release_to(home);
            TwoAdmission::Refused
        }
        TwoLanes::FirstAdopted(one) => TwoAdmission::FirstAdopted(a.shards[at(one)].clone()),
    }
}
