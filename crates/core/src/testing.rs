//! Helpers for bounded property tests of parsers and decoders (the fuzz targets' in-suite
//! counterparts): seeded mutations of valid inputs.

use crate::rng::{uniform_u64, Rng};

/// `input` with 1 to `edits_max` random edits: a byte replaced (from `alphabet` or any byte),
/// a byte removed, a byte duplicated, or the tail cut off.
pub fn mutate(rng: &mut Rng, input: &[u8], alphabet: &[u8], edits_max: u64) -> Vec<u8> {
    let mut bytes = input.to_vec();
    for _ in 0..1 + uniform_u64(rng, edits_max.max(1)) {
        if bytes.is_empty() {
            break;
        }
        let at = uniform_u64(rng, bytes.len() as u64) as usize;
        match uniform_u64(rng, 5) {
            0 if !alphabet.is_empty() => {
                bytes[at] = alphabet[uniform_u64(rng, alphabet.len() as u64) as usize];
            }
            0 | 1 => bytes[at] = uniform_u64(rng, 256) as u8,
            2 => {
                bytes.remove(at);
            }
            3 => bytes.insert(at, bytes[at]),
            _ => bytes.truncate(at),
        }
    }
    bytes
}
