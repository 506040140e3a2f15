//! Generated keys and values: what `granary load` writes, what the crash
//! drills check it acknowledged, and what the benchmarks load; and the
//! Zipfian rank generator the benchmarks and the cache-policy tests draw
//! keys with. Kept in the engine crate so that the `granary` binary and the
//! benchmarks share them without one depending on the other.
//!
//! Key `i` is `key-<i, 12 digits>`; value `(i, round)` repeats `i:round:`
//! to the requested length, so a value names the key and the round that
//! wrote it, and a value that was never written cannot pass for one.

/// The key of item `i`.
pub fn load_key(i: u64) -> Vec<u8> {
    format!("key-{i:012}").into_bytes()
}

/// The value item `i` gets in `round`: `len` bytes (at least the tag's).
pub fn load_value(i: u64, round: u64, len: usize) -> Vec<u8> {
    let tag = format!("{i}:{round}:");
    tag.bytes().cycle().take(len.max(tag.len())).collect()
}

/// YCSB's Zipfian generator (Gray et al., "Quickly generating
/// billion-record synthetic databases") over the ranks `0..n`, rank 0 the
/// most frequent, with constant `theta` in (0, 1) (YCSB uses 0.99). It maps
/// a uniform draw to a rank; callers scatter ranks over their keys with a
/// hash of their own (YCSB's scrambled Zipfian), so hot keys are not
/// neighbours.
#[derive(Debug, Clone)]
pub struct Zipf {
    n: u64,
    theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
}

impl Zipf {
    /// The generator over `0..n` (`n >= 1`); costs O(n) to set up.
    pub fn new(n: u64, theta: f64) -> Zipf {
        assert!(n >= 1, "a Zipfian over no items");
        let zeta = |k: u64| (1..=k).map(|i| 1.0 / (i as f64).powf(theta)).sum::<f64>();
        let (zetan, zeta2) = (zeta(n), zeta(2));
        let eta = (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan);
        Zipf { n, theta, alpha: 1.0 / (1.0 - theta), zetan, eta }
    }

    /// How many ranks.
    pub fn n(&self) -> u64 {
        self.n
    }

    /// The normalising constant `zeta(n) = sum of 1 / i^theta`: rank 0
    /// comes with probability `1 / zeta(n)`.
    pub fn zetan(&self) -> f64 {
        self.zetan
    }

    /// The rank (in `0..n`) for a uniform draw `u` in [0, 1).
    pub fn rank(&self, u: f64) -> u64 {
        let uz = u * self.zetan;
        let rank = if uz < 1.0 {
            0
        } else if uz < 1.0 + 0.5f64.powf(self.theta) {
            1
        } else {
            (self.n as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64
        };
        rank.min(self.n - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Over an even grid of draws (no randomness), each rank's share is
    /// its Zipfian probability: rank 0 about 1/zeta(n), rank 1 about
    /// 2^-theta of that, and the shares fall with the rank.
    #[test]
    fn zipf_ranks_follow_the_power_law() {
        let (n, theta, draws) = (1000u64, 0.99, 200_000u64);
        let z = Zipf::new(n, theta);
        let mut counts = vec![0u64; n as usize];
        for i in 0..draws {
            let r = z.rank(i as f64 / draws as f64);
            assert!(r < n, "rank {r} of {n}");
            counts[r as usize] += 1;
        }
        let p0 = counts[0] as f64 / draws as f64;
        assert!((p0 - 1.0 / z.zetan()).abs() < 0.001, "{p0} vs {}", 1.0 / z.zetan());
        let ratio = counts[0] as f64 / counts[1] as f64;
        assert!((ratio - 2f64.powf(theta)).abs() < 0.05, "rank 0 / rank 1 = {ratio}");
        assert!(counts[1] > counts[10] && counts[10] > counts[100] && counts[100] > counts[900], "{:?}", &counts[..12]);
        assert!(counts.iter().all(|&c| c > 0), "every rank is drawn");
        assert_eq!(z.rank(0.999_999_999), n - 1);
    }

    #[test]
    fn zipf_over_one_or_two_items() {
        let one = Zipf::new(1, 0.99);
        assert!([0.0, 0.5, 0.999].iter().all(|&u| one.rank(u) == 0));
        let two = Zipf::new(2, 0.99);
        assert_eq!(two.rank(0.0), 0);
        assert_eq!(two.rank(0.999), 1);
    }

    #[test]
    fn values_name_key_and_round() {
        assert_eq!(load_key(7), b"key-000000000007");
        assert_eq!(load_value(7, 3, 10), b"7:3:7:3:7:");
        assert_ne!(load_value(7, 3, 100), load_value(7, 4, 100));
        assert_ne!(load_value(7, 3, 100), load_value(8, 3, 100));
        assert_eq!(load_value(123, 45, 0), b"123:45:");
    }
}
