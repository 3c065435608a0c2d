//! What the protocol files take from their parent module's `shard`: two
//! shards, and each thread's home set by the model (0 unless it says
//! otherwise), so that a model can give and take on different shards.

use std::cell::Cell;

pub const SHARDS: usize = 2;

loom::thread_local! {
    static HOME: Cell<usize> = Cell::new(0);
}

pub fn home() -> usize {
    HOME.with(Cell::get)
}

/// As the crate's: shard `shard`'s part of `total`.
pub fn share_of(total: usize, shard: usize) -> usize {
    total / SHARDS + usize::from(shard < total % SHARDS)
}

/// As the crate's, for a count of `u32`s.
pub fn share_of_u32(total: u32, shard: usize) -> u32 {
    u32::try_from(share_of(total as usize, shard)).unwrap_or(total)
}

/// Makes `home` this thread's home shard.
pub fn set_home(home: usize) {
    HOME.with(|cell| cell.set(home));
}
