//! The seeded shuffle of an experiment's runs: SplitMix64 and
//! Fisher-Yates, so a recorded seed gives the same order on every machine
//! and every version.

/// SplitMix64 (Steele, Lea and Flood): a tiny, well-mixed 64-bit generator.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`), without modulo bias.
    pub fn below(&mut self, n: u64) -> u64 {
        let zone = u64::MAX - u64::MAX % n;
        loop {
            let x = self.next_u64();
            if x < zone {
                return x % n;
            }
        }
    }
}

/// Shuffles `items` in place (Fisher-Yates), the same way for the same
/// seed.
pub fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut rng = SplitMix64::new(seed);
    for i in (1..items.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        items.swap(i, j);
    }
}

/// A fresh seed when the experiment names none: from the kernel's random
/// source, kept below 2^53 so every JSON reader holds it exactly.
pub fn random_seed() -> u64 {
    let mut bytes = [0u8; 8];
    let from_kernel = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .is_ok();
    let raw = if from_kernel {
        u64::from_le_bytes(bytes)
    } else {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        SplitMix64::new(t ^ u64::from(std::process::id())).next_u64()
    };
    raw & ((1 << 53) - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_the_reference_sequence() {
        // Reference values of SplitMix64 seeded with 1234567.
        let mut r = SplitMix64::new(1_234_567);
        assert_eq!(r.next_u64(), 6_457_827_717_110_365_317);
        assert_eq!(r.next_u64(), 3_203_168_211_198_807_973);
        assert_eq!(r.next_u64(), 9_817_491_932_198_370_423);
    }

    #[test]
    fn shuffle_is_deterministic_and_a_permutation() {
        let mut a: Vec<u32> = (0..20).collect();
        let mut b = a.clone();
        shuffle(&mut a, 42);
        shuffle(&mut b, 42);
        assert_eq!(a, b, "same seed, same order");
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..20).collect::<Vec<_>>(), "a permutation");
        assert_ne!(a, (0..20).collect::<Vec<_>>(), "actually shuffled");
        let mut c: Vec<u32> = (0..20).collect();
        shuffle(&mut c, 43);
        assert_ne!(a, c, "another seed, another order");
        // The order for a seed never changes between versions: resumed and
        // re-planned experiments depend on it.
        let mut golden: Vec<u32> = (0..8).collect();
        shuffle(&mut golden, 7);
        assert_eq!(golden, GOLDEN_7);
    }

    /// `shuffle(0..8, seed 7)`, fixed forever.
    const GOLDEN_7: [u32; 8] = [1, 4, 5, 2, 6, 0, 3, 7];

    #[test]
    fn below_stays_in_range() {
        let mut r = SplitMix64::new(9);
        let mut seen = [0u32; 3];
        for _ in 0..3000 {
            seen[r.below(3) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| (800..1200).contains(&n)), "{seen:?}");
    }

    #[test]
    fn random_seeds_differ_and_fit_json() {
        let (a, b) = (random_seed(), random_seed());
        assert_ne!(a, b);
        assert!(a < 1 << 53 && b < 1 << 53);
    }
}
