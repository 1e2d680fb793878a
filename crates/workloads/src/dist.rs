//! Key-choice distributions: uniform and the Zipfian generator of Gray et al. ("Quickly
//! generating billion-record synthetic databases", SIGMOD'94), the one YCSB uses.

use meridian_core::rng::{uniform_f64, uniform_u64, Rng};
use meridian_core::ConfigError;

/// Most items a Zipfian distribution may span (its constant takes O(items) to compute).
pub const ZIPF_ITEMS_MAX: u64 = 1 << 32;

/// Chooses an item in `0..items`.
#[derive(Clone, Debug, PartialEq)]
pub enum KeyDist {
    /// Every item equally likely.
    Uniform {
        /// Number of items.
        items: u64,
    },
    /// Item 0 most likely, with skew `theta`.
    Zipf(Zipf),
}

impl KeyDist {
    /// Uniform when `theta` is `None`, Zipfian otherwise.
    pub fn new(items: u64, theta: Option<f64>) -> Result<Self, ConfigError> {
        if items == 0 {
            return Err(ConfigError::new("a key distribution needs at least one item"));
        }
        match theta {
            None => Ok(Self::Uniform { items }),
            Some(theta) => Ok(Self::Zipf(Zipf::new(items, theta)?)),
        }
    }

    /// Draws an item.
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        match self {
            Self::Uniform { items } => uniform_u64(rng, *items),
            Self::Zipf(zipf) => zipf.sample(rng),
        }
    }

    /// `count` distinct item ids, the `i`-th on shard `i mod shards` (ids `shard ·
    /// per_shard + key`, the key drawn from this distribution): redraws a taken id, then
    /// falls back to the shard's next free id (bounded: callers take at most `per_shard` ids
    /// per shard).
    pub fn distinct_over_shards(
        &self,
        rng: &mut Rng,
        shards: u32,
        per_shard: u64,
        count: usize,
    ) -> Vec<u64> {
        let mut ids: Vec<u64> = Vec::with_capacity(count);
        for op in 0..count {
            let base = (op as u64 % u64::from(shards)) * per_shard;
            let mut id = base + self.sample(rng);
            let mut draws = 0;
            while ids.contains(&id) {
                draws += 1;
                id = if draws < SHARD_DRAWS_MAX {
                    base + self.sample(rng)
                } else {
                    base + (id + 1 - base) % per_shard
                };
            }
            ids.push(id);
        }
        ids
    }
}

/// Draws of a key not yet taken before falling back to the next free one.
const DISTINCT_DRAWS_MAX: u32 = 100;
/// Redraws of one id before `distinct_over_shards` takes the shard's next free id.
const SHARD_DRAWS_MAX: u32 = 1_000;

/// Chooses items spread over every shard: a shard uniformly, then an item within it from `dist`
/// (item `id` lives on shard `id / per_shard`).
#[derive(Clone, Debug, PartialEq)]
pub struct ShardedKeys {
    /// Number of shards.
    pub shards: u32,
    /// Items per shard.
    pub per_shard: u64,
    /// Choice within a shard.
    pub dist: KeyDist,
}

impl ShardedKeys {
    /// Items in all.
    pub fn items(&self) -> u64 {
        u64::from(self.shards) * self.per_shard
    }

    /// Draws an item.
    pub fn draw(&self, rng: &mut Rng) -> u64 {
        let shard = uniform_u64(rng, u64::from(self.shards));
        shard * self.per_shard + self.dist.sample(rng)
    }

    /// Draws an item not in `taken`: redraws, then falls back to the next free id (bounded:
    /// the callers take fewer items than exist).
    pub fn draw_not_in(&self, rng: &mut Rng, taken: &[u64]) -> u64 {
        let mut id = self.draw(rng);
        let mut draws = 0;
        while taken.contains(&id) {
            draws += 1;
            id = if draws < DISTINCT_DRAWS_MAX { self.draw(rng) } else { (id + 1) % self.items() };
        }
        id
    }

    /// `count` distinct items, in draw order.
    pub fn distinct(&self, rng: &mut Rng, count: usize) -> Vec<u64> {
        let mut chosen = Vec::with_capacity(count);
        while chosen.len() < count {
            let id = self.draw_not_in(rng, &chosen);
            chosen.push(id);
        }
        chosen
    }

    /// The partitioner that places items as [`Self::draw`] assumes.
    pub fn partitioner(&self) -> meridian_core::txn::Partitioner {
        crate::leading_int_partitioner(self.shards, self.per_shard)
    }
}

/// Gray et al.'s Zipfian generator over `0..items`.
#[derive(Clone, Debug, PartialEq)]
pub struct Zipf {
    items: u64,
    theta: f64,
    alpha: f64,
    zeta_n: f64,
    eta: f64,
}

impl Zipf {
    /// The skew.
    pub fn theta(&self) -> f64 {
        self.theta
    }

    /// A distribution with skew `theta` in (0, 1).
    pub fn new(items: u64, theta: f64) -> Result<Self, ConfigError> {
        if !(theta > 0.0 && theta < 1.0) {
            return Err(ConfigError::new(format!("zipf theta must be in (0, 1), got {theta}")));
        }
        if items == 0 || items > ZIPF_ITEMS_MAX {
            return Err(ConfigError::new(format!(
                "zipf needs 1..={ZIPF_ITEMS_MAX} items, got {items}"
            )));
        }
        let zeta = |n: u64| (1..=n).map(|i| 1.0 / (i as f64).powf(theta)).sum::<f64>();
        let zeta_n = zeta(items);
        let zeta_2 = zeta(2.min(items));
        let eta = (1.0 - (2.0 / items as f64).powf(1.0 - theta)) / (1.0 - zeta_2 / zeta_n);
        Ok(Self { items, theta, alpha: 1.0 / (1.0 - theta), zeta_n, eta })
    }

    /// Draws an item; 0 is the most popular.
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        let u = uniform_f64(rng);
        let uz = u * self.zeta_n;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1.min(self.items - 1);
        }
        let value = (self.items as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        value.min(self.items - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::rng::child_rng;

    #[test]
    fn zipf_frequencies_follow_the_power_law() {
        let items = 1_000;
        let theta = 0.9;
        let zipf = Zipf::new(items, theta).unwrap();
        let mut rng = child_rng(3, "zipf", 0);
        let draws = 400_000;
        let mut counts = vec![0u64; items as usize];
        for _ in 0..draws {
            counts[zipf.sample(&mut rng) as usize] += 1;
        }
        // P(item i) = 1 / ((i + 1)^theta * zeta_n); the generator is exact for items 0 and 1 and
        // approximate beyond, so check those closely and the tail loosely.
        for (item, tolerance) in [(0usize, 0.03), (1, 0.03), (9, 0.15), (99, 0.25)] {
            let expected = draws as f64 / ((item as f64 + 1.0).powf(theta) * zipf.zeta_n);
            let found = counts[item] as f64;
            assert!(
                (found - expected).abs() / expected < tolerance,
                "item {item}: {found} vs {expected}"
            );
        }
        assert!(counts.iter().all(|&c| c < counts[0] + 1));
    }

    #[test]
    fn bad_parameters_are_rejected() {
        assert!(Zipf::new(10, 1.0).is_err());
        assert!(Zipf::new(10, 0.0).is_err());
        assert!(Zipf::new(10, f64::NAN).is_err());
        assert!(Zipf::new(0, 0.5).is_err());
        assert!(KeyDist::new(0, None).is_err());
    }

    #[test]
    fn uniform_covers_all_items() {
        let dist = KeyDist::new(8, None).unwrap();
        let mut rng = child_rng(1, "u", 0);
        let mut seen = [false; 8];
        for _ in 0..1_000 {
            seen[dist.sample(&mut rng) as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }
}
