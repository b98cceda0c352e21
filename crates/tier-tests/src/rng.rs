//! [`Rng`]: a small seeded generator (splitmix64) for tests that must replay from a seed.

/// The seed a random test runs with: `KVTIER_SEED` (decimal, or hex with `0x`) when set, to
/// replay a printed seed or try others, else `default`. Printed either way, so every run can be
/// replayed.
pub fn seed(default: u64) -> u64 {
    let chosen = std::env::var("KVTIER_SEED").ok().and_then(|v| {
        let v = v.trim();
        match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => v.parse().ok(),
        }
    });
    let seed = chosen.unwrap_or(default);
    eprintln!("random seed {seed:#x} (KVTIER_SEED={seed:#x} replays it)");
    seed
}

/// splitmix64: every value follows from the seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value below `n` (0 if `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}
