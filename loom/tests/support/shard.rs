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

/// Makes `home` this thread's home shard.
pub fn set_home(home: usize) {
    HOME.with(|cell| cell.set(home));
}
