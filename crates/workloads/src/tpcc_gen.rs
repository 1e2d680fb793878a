//! TPC-C's random generators (TPC-C 5.11 §2.1.6, §4.3.2): NURand with its run-time constants,
//! customer last names from syllables, random a-strings and n-strings, zip codes, and the data
//! fields of which 10% carry "ORIGINAL". The TPC-C workload builds on these; they are kept apart
//! so they can be checked against the specification on their own.

use meridian_core::rng::{uniform_u64, Rng};

/// The syllables customer last names are made of (§4.3.2.3).
pub const SYLLABLES: [&str; 10] =
    ["BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING"];

/// NURand's constant `C` for one field: the value used to load and the one used at run time.
/// The specification requires the run-time C_LAST constant to differ from the load one by
/// 65..=119 (§2.1.6.1); the others may be equal. BenchBase's values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NurandConstants {
    /// C for C_LAST (A = 255) at load.
    pub c_last_load: u64,
    /// C for C_LAST at run time.
    pub c_last_run: u64,
    /// C for C_ID (A = 1023).
    pub c_id: u64,
    /// C for OL_I_ID (A = 8191).
    pub ol_i_id: u64,
}

/// BenchBase's constants.
pub const NURAND_CONSTANTS: NurandConstants =
    NurandConstants { c_last_load: 157, c_last_run: 223, c_id: 259, ol_i_id: 7911 };

const _: () = {
    let delta = NURAND_CONSTANTS.c_last_run - NURAND_CONSTANTS.c_last_load;
    assert!(delta >= 65 && delta <= 119, "TPC-C 2.1.6.1: |C_run - C_load| in 65..=119");
};

/// A uniform integer in `low..=high`.
pub fn rand_range(rng: &mut Rng, low: u64, high: u64) -> u64 {
    debug_assert!(low <= high);
    low + uniform_u64(rng, high - low + 1)
}

/// `NURand(A, x, y) = (((random(0, A) | random(x, y)) + C) % (y - x + 1)) + x` (§2.1.6).
pub fn nurand(rng: &mut Rng, a: u64, x: u64, y: u64, c: u64) -> u64 {
    (((rand_range(rng, 0, a) | rand_range(rng, x, y)) + c) % (y - x + 1)) + x
}

/// A customer id for a transaction: NURand(1023, 1, 3000) (`customers` = 3000 at spec scale).
pub fn customer_id(rng: &mut Rng, constants: &NurandConstants, customers: u64) -> u64 {
    nurand(rng, 1023, 1, customers, constants.c_id)
}

/// An item id for an order line: NURand(8191, 1, 100000) (`items` = 100,000 at spec scale).
pub fn item_id(rng: &mut Rng, constants: &NurandConstants, items: u64) -> u64 {
    nurand(rng, 8191, 1, items, constants.ol_i_id)
}

/// The last name numbered `number` (0..=999): three syllables by its digits (§4.3.2.3).
pub fn last_name(number: u64) -> String {
    let digit = |d: u64| SYLLABLES[(d % 10) as usize];
    format!("{}{}{}", digit(number / 100), digit(number / 10), digit(number))
}

/// A last name for a transaction: NURand(255, 0, 999) with the run-time constant.
pub fn run_last_name(rng: &mut Rng, constants: &NurandConstants) -> String {
    last_name(run_last_number(rng, constants))
}

/// The number of a last name for a transaction: NURand(255, 0, 999), run-time constant.
pub fn run_last_number(rng: &mut Rng, constants: &NurandConstants) -> u64 {
    nurand(rng, 255, 0, 999, constants.c_last_run)
}

/// The last name of loaded customer `c_id` (1..=3000): the first 1,000 take the numbers
/// 0..=999 in order, the rest NURand(255, 0, 999) with the load constant (§4.3.3.1).
pub fn load_last_name(rng: &mut Rng, c_id: u64, constants: &NurandConstants) -> String {
    last_name(load_last_number(rng, c_id, constants))
}

/// The number (0..=999) of loaded customer `c_id`'s last name; see [`load_last_name`].
pub fn load_last_number(rng: &mut Rng, c_id: u64, constants: &NurandConstants) -> u64 {
    if c_id <= 1_000 {
        c_id - 1
    } else {
        nurand(rng, 255, 0, 999, constants.c_last_load)
    }
}

const ALPHANUMERIC: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// A random a-string of `low..=high` alphanumeric characters (§4.3.2.2).
pub fn a_string(rng: &mut Rng, low: u64, high: u64) -> String {
    let len = rand_range(rng, low, high);
    (0..len)
        .map(|_| ALPHANUMERIC[uniform_u64(rng, ALPHANUMERIC.len() as u64) as usize] as char)
        .collect()
}

/// A random n-string of `low..=high` digits.
pub fn n_string(rng: &mut Rng, low: u64, high: u64) -> String {
    let len = rand_range(rng, low, high);
    (0..len).map(|_| char::from(b'0' + uniform_u64(rng, 10) as u8)).collect()
}

/// A zip code: 4 random digits then "11111" (§4.3.2.7).
pub fn zip(rng: &mut Rng) -> String {
    format!("{}11111", n_string(rng, 4, 4))
}

/// I_DATA / S_DATA: an a-string of 26..=50 characters, 10% of them with "ORIGINAL" at a random
/// position (§4.3.3.1).
pub fn data_field(rng: &mut Rng) -> String {
    let mut data = a_string(rng, 26, 50);
    if uniform_u64(rng, 10) == 0 {
        let at = uniform_u64(rng, data.len() as u64 - 7) as usize;
        data.replace_range(at..at + 8, "ORIGINAL");
    }
    data
}

/// A random permutation of `1..=n` (O_C_ID at load, §4.3.3.1).
pub fn permutation(rng: &mut Rng, n: u64) -> Vec<u64> {
    let mut ids: Vec<u64> = (1..=n).collect();
    for i in (1..ids.len()).rev() {
        let j = uniform_u64(rng, i as u64 + 1) as usize;
        ids.swap(i, j);
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::rng::child_rng;

    #[test]
    fn last_names_follow_the_syllable_table() {
        assert_eq!(last_name(0), "BARBARBAR");
        assert_eq!(last_name(371), "PRICALLYOUGHT");
        assert_eq!(last_name(999), "EINGEINGEING");
        let mut rng = child_rng(1, "tpcc", 0);
        assert_eq!(load_last_name(&mut rng, 1, &NURAND_CONSTANTS), "BARBARBAR");
        assert_eq!(load_last_name(&mut rng, 1_000, &NURAND_CONSTANTS), "EINGEINGEING");
    }

    #[test]
    fn nurand_stays_in_range_and_is_not_uniform() {
        let mut rng = child_rng(2, "nurand", 0);
        let mut counts = vec![0u32; 3_001];
        for _ in 0..300_000 {
            let c = customer_id(&mut rng, &NURAND_CONSTANTS, 3_000);
            assert!((1..=3_000).contains(&c));
            counts[c as usize] += 1;
        }
        let max = *counts.iter().max().unwrap();
        let mean = 300_000 / 3_000;
        assert!(max > 2 * mean, "NURand concentrates on some ids: max {max}, mean {mean}");
        for _ in 0..10_000 {
            assert!((1..=100_000).contains(&item_id(&mut rng, &NURAND_CONSTANTS, 100_000)));
            let name = run_last_name(&mut rng, &NURAND_CONSTANTS);
            assert!(name.len() >= 9 && name.len() <= 15, "{name}");
        }
    }

    #[test]
    fn strings_zips_data_and_permutations_have_their_shapes() {
        let mut rng = child_rng(3, "strings", 0);
        let mut originals = 0;
        for _ in 0..10_000 {
            let a = a_string(&mut rng, 8, 16);
            assert!((8..=16).contains(&a.len()) && a.bytes().all(|b| b.is_ascii_alphanumeric()));
            let z = zip(&mut rng);
            assert!(z.len() == 9 && z.ends_with("11111") && z.bytes().all(|b| b.is_ascii_digit()));
            let d = data_field(&mut rng);
            assert!((26..=50).contains(&d.len()));
            originals += usize::from(d.contains("ORIGINAL"));
        }
        assert!((800..1_200).contains(&originals), "about 10% ORIGINAL: {originals}");
        let mut p = permutation(&mut rng, 3_000);
        p.sort_unstable();
        assert_eq!(p, (1..=3_000).collect::<Vec<_>>());
    }
}
