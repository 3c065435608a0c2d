//! Scope names as the registry's tables find them: one hash function for
//! the process, and an equality that compares host-sized names inline.
//! The scheduler's index and the directory of open words both use them.

/// The hash of scope names: one function for the whole process, seeded at
/// random once (as foldhash's `RandomState` is), so that names that
/// collide on purpose in one process do not in the next.
#[derive(Debug, Clone)]
pub(crate) struct NameHash(foldhash::fast::RandomState);

impl Default for NameHash {
    fn default() -> Self {
        static PROCESS: std::sync::OnceLock<foldhash::fast::RandomState> = std::sync::OnceLock::new();
        NameHash(PROCESS.get_or_init(Default::default).clone())
    }
}

impl NameHash {
    /// The hash of scope name `name`: its bytes alone (a `str`'s `Hash`
    /// also folds in a terminator, which only matters where hashes of
    /// several fields are chained).
    #[inline(always)]
    pub(crate) fn of(&self, name: &str) -> u64 {
        use std::hash::{BuildHasher, Hasher};
        let mut hasher = self.0.build_hasher();
        hasher.write(name.as_bytes());
        hasher.finish()
    }
}

/// Whether scope names `a` and `b` are equal. A host name of 8 to 32
/// bytes, the common length, is compared inline in two overlapping reads
/// of each, sparing every lookup a call to `memcmp`.
#[inline(always)]
pub(crate) fn same_name(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let len = a.len();
    match len {
        16..=32 => {
            let at = |bytes: &[u8], from: usize| read::<16>(bytes, from).map(u128::from_le_bytes);
            at(a, 0) == at(b, 0) && at(a, len - 16) == at(b, len - 16)
        }
        8..=15 => {
            let at = |bytes: &[u8], from: usize| read::<8>(bytes, from).map(u64::from_le_bytes);
            at(a, 0) == at(b, 0) && at(a, len - 8) == at(b, len - 8)
        }
        _ => a == b,
    }
}

/// The `N` bytes of `bytes` from `from` (`None` past its end).
#[inline(always)]
fn read<const N: usize>(bytes: &[u8], from: usize) -> Option<[u8; N]> {
    bytes.get(from..from + N)?.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::same_name;

    #[test]
    fn names_compare_as_strings_do_at_every_length() {
        let long = "abcdefghijklmnopqrstuvwxyz0123456789-abcdefghij";
        for len in 0..=long.len() {
            let name = &long[..len];
            assert!(same_name(name, name), "{name}");
            assert!(!same_name(name, &long[..len.saturating_sub(1)]) || len == 0);
            for at in 0..len {
                let mut other = name.as_bytes().to_vec();
                other[at] = b'.';
                let other = std::str::from_utf8(&other).unwrap();
                assert!(!same_name(name, other), "{name} vs {other}");
            }
        }
    }
}
