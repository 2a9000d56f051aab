//! The hash maps whose key is hashed on every fetch (coalescer, tail cache, view readers):
//! hashbrown's table with foldhash, a hasher about five times cheaper than std's SipHash-1-3 on
//! the small fixed-size keys these maps hold. Why, and where std's map stays: `docs/engine.md`.

use foldhash::fast::{FoldHasher, SeedableRandomState};
use foldhash::SharedSeed;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;

/// A map keyed by a small value hashed on every request.
pub type FastMap<K, V> = hashbrown::HashMap<K, V, FastState>;
/// A set of the same.
pub type FastSet<K> = hashbrown::HashSet<K, FastState>;

/// foldhash seeded from the operating system's random source (through std's `RandomState`): one
/// seed per process and one per map. foldhash's own `RandomState`, as hashbrown takes it (no
/// `std`), is seeded only from addresses, fixed when address space randomization is off; keys
/// here hold client-chosen offsets and sizes, and collisions must not be precomputable.
#[derive(Clone, Debug)]
pub struct FastState(SeedableRandomState);

impl Default for FastState {
    fn default() -> Self {
        static SHARED: OnceLock<SharedSeed> = OnceLock::new();
        let shared = SHARED.get_or_init(|| SharedSeed::from_u64(os_random()));
        Self(SeedableRandomState::with_seed(os_random(), shared))
    }
}

impl BuildHasher for FastState {
    type Hasher = FoldHasher<'static>;

    #[inline(always)]
    fn build_hasher(&self) -> Self::Hasher {
        self.0.build_hasher()
    }
}

/// 64 random bits: std's `RandomState` keys SipHash from the OS's random source once per thread
/// and steps the key for each new state, so each call hashes nothing under a different key.
fn os_random() -> u64 {
    RandomState::new().build_hasher().finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_are_seeded_apart() {
        let (a, b) = (FastState::default(), FastState::default());
        assert_ne!(a.hash_one(42u64), b.hash_one(42u64));
        assert_eq!(a.hash_one(42u64), a.clone().hash_one(42u64));
    }

    #[test]
    fn map_works() {
        let mut m: FastMap<(u64, u32), u32> = FastMap::default();
        for i in 0..1000u32 {
            m.insert((u64::from(i) << 32, i), i);
        }
        assert!((0..1000u32).all(|i| m.get(&(u64::from(i) << 32, i)) == Some(&i)));
        assert_eq!(m.get(&(0, 1)), None);
    }
}
