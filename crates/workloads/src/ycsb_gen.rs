//! YCSB's generators, ported to match its Java code (CoreWorkload, Utils, ZipfianGenerator,
//! ScrambledZipfianGenerator, SkewedLatestGenerator, AcknowledgedCounterGenerator,
//! HotspotIntegerGenerator), so that key choice is the same distribution YCSB draws.
//!
//! - [`fnvhash64`] and [`key_name`]: `"user" + fnvhash64(keynum)` for hashed insert order.
//! - [`Zipfian`]: Gray et al. (SIGMOD '94), item 0 most popular, with YCSB's incremental zeta
//!   when the item count grows (and its quirk: `eta` keeps the constructor's item count).
//! - [`ScrambledZipfian`]: Zipfian(θ = 0.99) over 10¹⁰ ranks, hashed and folded onto the key
//!   space, which is what `requestdistribution=zipfian` uses.
//! - [`AcknowledgedCounter`] and [`SkewedLatest`]: `latest` picks recent acknowledged inserts.
//! - [`Hotspot`]: a hot fraction of the keys gets a fraction of the operations.

use meridian_core::rng::{uniform_f64, uniform_u64, Rng};
use meridian_core::ConfigError;

/// The Zipfian constant YCSB uses.
pub const ZIPFIAN_CONSTANT: f64 = 0.99;
/// Ranks the scrambled Zipfian draws from before folding onto the key space.
pub const SCRAMBLED_ITEM_COUNT: u64 = 10_000_000_000;
/// ζ(10¹⁰, 0.99), precomputed as in YCSB.
pub const SCRAMBLED_ZETAN: f64 = 26.469_028_201_783_02;
/// Largest growth of a Zipfian's item count computed incrementally in one draw; YCSB has no
/// bound, this keeps one draw bounded.
pub const ZETA_GROWTH_MAX: u64 = 1 << 26;
/// Acknowledgement window of the insert counter (YCSB's `WINDOW_SIZE`).
pub const ACK_WINDOW: u64 = 1 << 20;

const FNV_OFFSET_BASIS_64: i64 = 0xCBF2_9CE4_8422_2325_u64 as i64;
const FNV_PRIME_64: i64 = 1_099_511_628_211;

/// YCSB's `Utils.fnvhash64`: FNV-1a over the 8 little-endian bytes, then `Math.abs` of the
/// signed result (`abs(i64::MIN)` stays negative, as in Java).
pub fn fnvhash64(value: i64) -> i64 {
    let mut v = value;
    let mut hash = FNV_OFFSET_BASIS_64;
    for _ in 0..8 {
        let octet = v & 0xff;
        v >>= 8;
        hash ^= octet;
        hash = hash.wrapping_mul(FNV_PRIME_64);
    }
    hash.wrapping_abs()
}

/// YCSB's `CoreWorkload.buildKeyName`: `"user"` and the key number (hashed when `hashed`),
/// left-padded with zeros to `zero_padding` digits.
pub fn key_name(keynum: u64, hashed: bool, zero_padding: usize) -> String {
    let number = if hashed { fnvhash64(keynum as i64) as u64 } else { keynum };
    format!("user{number:0>zero_padding$}")
}

/// ζ(n, θ) summed from rank `from` (exclusive count) to `n`, added to `start`: YCSB's
/// `zeta(st, n, theta, initialsum)`.
fn zeta_from(from: u64, n: u64, theta: f64, start: f64) -> f64 {
    (from..n).fold(start, |sum, i| sum + 1.0 / ((i + 1) as f64).powf(theta))
}

/// Gray et al.'s Zipfian over `base..base + items`, as YCSB's `ZipfianGenerator`.
#[derive(Clone, Debug)]
pub struct Zipfian {
    base: u64,
    items: u64,
    theta: f64,
    alpha: f64,
    zeta_n: f64,
    zeta_2: f64,
    eta: f64,
    count_for_zeta: u64,
}

impl Zipfian {
    /// Over `base..base + items` with skew `theta`, computing ζ (O(items)).
    pub fn new(base: u64, items: u64, theta: f64) -> Result<Self, ConfigError> {
        Self::check(items, theta)?;
        if items > ZETA_GROWTH_MAX {
            return Err(ConfigError::new(format!(
                "a Zipfian over {items} items needs its zeta precomputed (at most {ZETA_GROWTH_MAX} summed here)"
            )));
        }
        let zeta_n = zeta_from(0, items, theta, 0.0);
        Ok(Self::with_zeta(base, items, theta, zeta_n))
    }

    /// Over `base..base + items` with ζ(items, θ) given (YCSB precomputes it for 10¹⁰).
    pub fn with_zeta(base: u64, items: u64, theta: f64, zeta_n: f64) -> Self {
        let zeta_2 = zeta_from(0, 2, theta, 0.0);
        let eta = (1.0 - (2.0 / items as f64).powf(1.0 - theta)) / (1.0 - zeta_2 / zeta_n);
        Self {
            base,
            items,
            theta,
            alpha: 1.0 / (1.0 - theta),
            zeta_n,
            zeta_2,
            eta,
            count_for_zeta: items,
        }
    }

    fn check(items: u64, theta: f64) -> Result<(), ConfigError> {
        if !(theta > 0.0 && theta < 1.0) {
            return Err(ConfigError::new(format!("zipfian theta must be in (0, 1), got {theta}")));
        }
        if items == 0 {
            return Err(ConfigError::new("a Zipfian needs at least one item"));
        }
        Ok(())
    }

    /// ζ(items, θ) as computed.
    pub fn zeta_n(&self) -> f64 {
        self.zeta_n
    }

    /// Draws over the constructor's item count.
    pub fn next(&mut self, rng: &mut Rng) -> u64 {
        self.next_of(rng, self.items)
    }

    /// YCSB's `nextLong(itemcount)`: when the count grew, ζ is extended incrementally (at most
    /// [`ZETA_GROWTH_MAX`] terms per draw) and `eta` recomputed with the constructor's count,
    /// as YCSB does. A shrinking count recomputes ζ from scratch, as YCSB does.
    pub fn next_of(&mut self, rng: &mut Rng, item_count: u64) -> u64 {
        let item_count = item_count.max(1);
        if item_count != self.count_for_zeta {
            if item_count > self.count_for_zeta {
                let to = item_count.min(self.count_for_zeta + ZETA_GROWTH_MAX);
                self.zeta_n = zeta_from(self.count_for_zeta, to, self.theta, self.zeta_n);
                self.count_for_zeta = to;
            } else {
                let to = item_count.min(ZETA_GROWTH_MAX);
                self.zeta_n = zeta_from(0, to, self.theta, 0.0);
                self.count_for_zeta = to;
            }
            self.eta = (1.0 - (2.0 / self.items as f64).powf(1.0 - self.theta))
                / (1.0 - self.zeta_2 / self.zeta_n);
        }
        let u = uniform_f64(rng);
        let uz = u * self.zeta_n;
        if uz < 1.0 {
            return self.base;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return self.base + 1;
        }
        let rank = (item_count as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        self.base + rank.min(item_count - 1)
    }
}

/// YCSB's `ScrambledZipfianGenerator` over `min..min + item_count`.
#[derive(Clone, Debug)]
pub struct ScrambledZipfian {
    min: u64,
    item_count: u64,
    ranks: Zipfian,
}

impl ScrambledZipfian {
    /// Over `min..min + item_count` (θ = 0.99 over 10¹⁰ ranks, folded).
    pub fn new(min: u64, item_count: u64) -> Result<Self, ConfigError> {
        if item_count == 0 {
            return Err(ConfigError::new("a scrambled Zipfian needs at least one item"));
        }
        let ranks = Zipfian::with_zeta(0, SCRAMBLED_ITEM_COUNT, ZIPFIAN_CONSTANT, SCRAMBLED_ZETAN);
        Ok(Self { min, item_count, ranks })
    }

    /// Draws a key number.
    pub fn next(&mut self, rng: &mut Rng) -> u64 {
        let rank = self.ranks.next(rng);
        self.min + (fnvhash64(rank as i64) as u64) % self.item_count
    }
}

/// YCSB's `AcknowledgedCounterGenerator`: hands out insert ids from `start`, and reports as
/// the last value the highest id below which every id was acknowledged (within a window of
/// [`ACK_WINDOW`] ids), so readers never pick a key whose insert is still in flight.
#[derive(Clone, Debug)]
pub struct AcknowledgedCounter {
    next: u64,
    /// Every id below this is acknowledged.
    acked_below: u64,
    window: Vec<bool>,
}

impl AcknowledgedCounter {
    /// Ids start at `start`; ids below it count as acknowledged (the loaded records).
    pub fn new(start: u64) -> Self {
        Self { next: start, acked_below: start, window: vec![false; ACK_WINDOW as usize] }
    }

    /// The next id to insert.
    pub fn next_id(&mut self) -> u64 {
        let id = self.next;
        self.next += 1;
        id
    }

    /// Marks `id` inserted. Refuses ids not handed out, already acknowledged, or beyond the
    /// window.
    pub fn acknowledge(&mut self, id: u64) -> Result<(), ConfigError> {
        if id >= self.next || id < self.acked_below {
            return Err(ConfigError::new(format!(
                "id {id} was not handed out or is already acknowledged"
            )));
        }
        if id - self.acked_below >= ACK_WINDOW {
            return Err(ConfigError::new(format!("id {id} is beyond the acknowledgement window")));
        }
        self.window[(id % ACK_WINDOW) as usize] = true;
        // Advance over the contiguous acknowledged prefix (bounded by the window).
        while self.acked_below < self.next && self.window[(self.acked_below % ACK_WINDOW) as usize]
        {
            self.window[(self.acked_below % ACK_WINDOW) as usize] = false;
            self.acked_below += 1;
        }
        Ok(())
    }

    /// The highest id with every id up to it acknowledged (0 when none is).
    pub fn last_value(&self) -> u64 {
        self.acked_below.saturating_sub(1)
    }
}

/// YCSB's `SkewedLatestGenerator`: the newest acknowledged key is the most popular.
#[derive(Clone, Debug)]
pub struct SkewedLatest {
    zipfian: Zipfian,
}

impl SkewedLatest {
    /// For a key space whose acknowledged ids currently reach `counter.last_value()`.
    pub fn new(counter: &AcknowledgedCounter) -> Result<Self, ConfigError> {
        let items = counter.last_value().saturating_add(1).max(1);
        Ok(Self { zipfian: Zipfian::new(0, items, ZIPFIAN_CONSTANT)? })
    }

    /// Draws a key number at or below `counter.last_value()`.
    pub fn next(&mut self, rng: &mut Rng, counter: &AcknowledgedCounter) -> u64 {
        let max = counter.last_value();
        max - self.zipfian.next_of(rng, max.max(1)).min(max)
    }
}

/// YCSB's `HotspotIntegerGenerator` over `lower..=upper`: with probability `hot_op_fraction`
/// a key from the first `hot_set_fraction` of the range, otherwise from the rest.
#[derive(Clone, Debug)]
pub struct Hotspot {
    lower: u64,
    hot_interval: u64,
    cold_interval: u64,
    hot_op_fraction: f64,
}

impl Hotspot {
    /// YCSB's defaults are 0.2 of the keys taking 0.8 of the operations.
    pub fn new(
        lower: u64,
        upper: u64,
        hot_set_fraction: f64,
        hot_op_fraction: f64,
    ) -> Result<Self, ConfigError> {
        let fractions = [hot_set_fraction, hot_op_fraction];
        if fractions.iter().any(|f| !(0.0..=1.0).contains(f)) || upper < lower {
            return Err(ConfigError::new(format!(
                "hotspot needs lower <= upper and fractions in [0, 1], got {lower}..={upper}, {hot_set_fraction}, {hot_op_fraction}"
            )));
        }
        let interval = upper - lower + 1;
        let hot_interval = (interval as f64 * hot_set_fraction) as u64;
        Ok(Self { lower, hot_interval, cold_interval: interval - hot_interval, hot_op_fraction })
    }

    /// Draws a key number.
    pub fn next(&self, rng: &mut Rng) -> u64 {
        let hot = uniform_f64(rng) < self.hot_op_fraction;
        if (hot && self.hot_interval > 0) || self.cold_interval == 0 {
            self.lower + uniform_u64(rng, self.hot_interval.max(1))
        } else {
            self.lower + self.hot_interval + uniform_u64(rng, self.cold_interval)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::rng::child_rng;

    #[test]
    fn key_names_match_the_ycsb_test_vectors() {
        let vectors = [
            (0, "user6284781860667377211"),
            (1, "user8517097267634966620"),
            (2, "user1820151046732198393"),
            (999, "user2071219101098386137"),
            (1000, "user5952875239596136740"),
        ];
        for (keynum, name) in vectors {
            assert_eq!(key_name(keynum, true, 1), name, "key {keynum}");
        }
        assert_eq!(key_name(42, false, 6), "user000042");
        assert!(fnvhash64(i64::MIN) != 0);
    }

    #[test]
    fn zeta_matches_the_reference_values() {
        let close = |a: f64, b: f64| ((a - b) / b).abs() < 1e-12;
        assert!(close(zeta_from(0, 2, 0.99, 0.0), 1.503_477_775_028_359_4));
        assert!(close(Zipfian::new(0, 1_000, 0.99).unwrap().zeta_n(), 7.728_953_217_284_7));
        assert!(close(Zipfian::new(0, 100_000, 0.99).unwrap().zeta_n(), 12.778_338_062_551));
        assert!(close(Zipfian::new(0, 1_000_000, 0.99).unwrap().zeta_n(), 15.391_849_746_037));
        // Incremental growth gives the same zeta as computing it at once.
        let mut grown = Zipfian::new(0, 1_000, 0.99).unwrap();
        let mut rng = child_rng(1, "zeta", 0);
        grown.next_of(&mut rng, 100_000);
        assert!(close(grown.zeta_n(), 12.778_338_062_551));
    }

    #[test]
    fn zipfian_item_zero_takes_one_over_zeta() {
        let mut zipfian = Zipfian::new(10, 1_000, 0.99).unwrap();
        let mut rng = child_rng(2, "zipfian", 0);
        let draws = 200_000;
        let zeros = (0..draws).filter(|_| zipfian.next(&mut rng) == 10).count() as f64;
        let expected = draws as f64 / zipfian.zeta_n();
        assert!((zeros - expected).abs() / expected < 0.03, "{zeros} vs {expected}");
    }

    #[test]
    fn scrambled_zipfian_scatters_the_hot_keys_and_keeps_the_skew() {
        let items = 1_000;
        let mut scrambled = ScrambledZipfian::new(0, items).unwrap();
        let mut rng = child_rng(3, "scrambled", 0);
        let draws = 300_000;
        let mut counts = vec![0u64; items as usize];
        for _ in 0..draws {
            counts[scrambled.next(&mut rng) as usize] += 1;
        }
        let (hottest, &top) = counts.iter().enumerate().max_by_key(|(_, c)| **c).unwrap();
        // Rank 0 lands on fnvhash64(0) % 1000 = 211 and carries 1/ζ(10¹⁰) ≈ 3.8% of the draws,
        // plus the few ranks that fold onto the same key.
        assert_eq!(hottest, (fnvhash64(0) as u64 % items) as usize);
        let share = top as f64 / draws as f64;
        assert!((0.036..0.045).contains(&share), "hottest share {share}");
        assert!(counts.iter().filter(|&&c| c > 0).count() > 900, "keys are scattered");
    }

    #[test]
    fn latest_picks_recent_acknowledged_keys() {
        let mut counter = AcknowledgedCounter::new(1_000);
        for _ in 0..10 {
            let id = counter.next_id();
            counter.acknowledge(id).unwrap();
        }
        assert_eq!(counter.last_value(), 1_009);
        // An insert in flight holds the last value back.
        let in_flight = counter.next_id();
        let later = counter.next_id();
        counter.acknowledge(later).unwrap();
        assert_eq!(counter.last_value(), 1_009);
        counter.acknowledge(in_flight).unwrap();
        assert_eq!(counter.last_value(), 1_011);
        assert!(counter.acknowledge(5_000).is_err(), "never handed out");
        assert!(counter.acknowledge(in_flight).is_err(), "already acknowledged");
        let mut empty = AcknowledgedCounter::new(0);
        let first = empty.next_id();
        empty.acknowledge(first).unwrap();
        assert_eq!(empty.last_value(), 0);
        let mut latest = SkewedLatest::new(&counter).unwrap();
        let mut rng = child_rng(4, "latest", 0);
        let draws: Vec<u64> = (0..10_000).map(|_| latest.next(&mut rng, &counter)).collect();
        assert!(draws.iter().all(|&d| d <= 1_011));
        let newest = draws.iter().filter(|&&d| d == 1_011).count();
        assert!(newest > 10_000 / 12, "the newest key is the most popular: {newest}");
    }

    #[test]
    fn hotspot_sends_the_hot_fraction_of_operations_to_the_hot_keys() {
        let hotspot = Hotspot::new(100, 1_099, 0.2, 0.8).unwrap();
        let mut rng = child_rng(5, "hotspot", 0);
        let draws = 100_000;
        let hot = (0..draws).filter(|_| hotspot.next(&mut rng) < 300).count() as f64;
        assert!((hot / draws as f64 - 0.8).abs() < 0.01, "{hot}");
        assert!(Hotspot::new(0, 10, 1.5, 0.8).is_err());
        assert!(Zipfian::new(0, 10, 1.0).is_err());
        assert!(ScrambledZipfian::new(0, 0).is_err());
    }
}
