//! A hash map with a fixed hasher (FNV-1a), for point lookups in protocol and storage code.
//!
//! The standard `HashMap` seeds its hasher randomly per process, so anything that iterates it
//! varies between runs. These maps hash the same way everywhere; still, code that must be
//! deterministic uses them only for lookups and keeps order in a `BTreeMap`/`BTreeSet`.

use crate::rng::{FNV_OFFSET, FNV_PRIME};
use std::hash::{BuildHasherDefault, Hasher};

/// FNV-1a as a `Hasher`.
#[derive(Clone, Copy, Debug)]
pub struct FnvHasher(u64);

impl Default for FnvHasher {
    fn default() -> Self {
        Self(FNV_OFFSET)
    }
}

impl Hasher for FnvHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 ^= u64::from(byte);
            self.0 = self.0.wrapping_mul(FNV_PRIME);
        }
    }
}

/// A hash map with the fixed FNV-1a hasher.
pub type FixedHashMap<K, V> =
    std::collections::hash_map::HashMap<K, V, BuildHasherDefault<FnvHasher>>;
