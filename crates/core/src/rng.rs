//! Seeded randomness. One master seed per run; every node, link and client gets its own child
//! stream derived from (seed, purpose, index), so adding a node does not perturb the others.
//! Only ChaCha8 streams are used; nothing here reads OS entropy.

use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

/// The random stream type used everywhere.
pub type Rng = ChaCha8Rng;

/// FNV-1a 64-bit offset basis.
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a 64-bit prime.
pub const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a over bytes, continuing from `hash`. Stable across platforms and releases.
pub fn fnv1a(mut hash: u64, bytes: &[u8]) -> u64 {
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    hash
}

/// A child stream for `purpose` number `index` of the run seeded with `seed`.
pub fn child_rng(seed: u64, purpose: &str, index: u64) -> Rng {
    let mut hash = fnv1a(FNV_OFFSET, &seed.to_le_bytes());
    hash = fnv1a(hash, purpose.as_bytes());
    hash = fnv1a(hash, &index.to_le_bytes());
    // Mix once more so nearby indexes give unrelated seeds.
    let mut seed_bytes = [0u8; 32];
    for (i, chunk) in seed_bytes.chunks_mut(8).enumerate() {
        let word = splitmix64(hash.wrapping_add(i as u64));
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    ChaCha8Rng::from_seed(seed_bytes)
}

/// SplitMix64's step: a fixed, fully mixing function of a 64-bit word.
pub fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A uniform integer in `0..bound` (`bound` > 0), without modulo bias worth measuring: the
/// 128-bit multiply-shift method.
pub fn uniform_u64(rng: &mut impl RngCore, bound: u64) -> u64 {
    assert!(bound > 0, "uniform_u64 needs a positive bound");
    ((u128::from(rng.next_u64()) * u128::from(bound)) >> 64) as u64
}

/// A uniform float in `[0, 1)` with 53 random bits.
pub fn uniform_f64(rng: &mut impl RngCore) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A standard normal sample (Box–Muller; one of the pair is discarded for simplicity).
pub fn standard_normal(rng: &mut impl RngCore) -> f64 {
    // 1 - u keeps the logarithm finite.
    let u1 = 1.0 - uniform_f64(rng);
    let u2 = uniform_f64(rng);
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// True with probability `p` (clamped to [0, 1]).
pub fn chance(rng: &mut impl RngCore, p: f64) -> bool {
    p > 0.0 && uniform_f64(rng) < p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_streams_are_reproducible_and_distinct() {
        let a1 = child_rng(7, "node", 1).next_u64();
        let a2 = child_rng(7, "node", 1).next_u64();
        let b = child_rng(7, "node", 2).next_u64();
        let c = child_rng(8, "node", 1).next_u64();
        assert_eq!(a1, a2);
        assert_ne!(a1, b);
        assert_ne!(a1, c);
    }

    #[test]
    fn uniform_stays_in_bounds_and_covers_them() {
        let mut rng = child_rng(1, "t", 0);
        let mut seen = [0u32; 5];
        for _ in 0..10_000 {
            seen[uniform_u64(&mut rng, 5) as usize] += 1;
        }
        for count in seen {
            assert!((1_700..2_300).contains(&count), "{seen:?}");
        }
    }

    #[test]
    fn normal_has_unit_variance() {
        let mut rng = child_rng(3, "t", 0);
        let samples: Vec<f64> = (0..50_000).map(|_| standard_normal(&mut rng)).collect();
        let mean = samples.iter().sum::<f64>() / samples.len() as f64;
        let var = samples.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / samples.len() as f64;
        assert!(mean.abs() < 0.02, "mean {mean}");
        assert!((var - 1.0).abs() < 0.03, "variance {var}");
    }

    #[test]
    fn fnv_matches_reference_vectors() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(fnv1a(FNV_OFFSET, b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(FNV_OFFSET, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(FNV_OFFSET, b"foobar"), 0x8594_4171_f739_67e8);
    }
}
