//! The soak's randomness, all from one seed so that a run can be repeated:
//! a splitmix64 generator for the schedule (which fault next, how long to
//! wait, how long each stream lasts), and the same mixing function as a
//! stateless map from (stream, offset) to the bytes a stream carries.

/// splitmix64's output function: a well-mixed 64-bit value for `x`.
pub fn mix(x: u64) -> u64 {
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A splitmix64 generator.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    /// A number in `0..n` (`n` > 0; the modulo bias is negligible here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// A number in `[low, high)`.
    pub fn between(&mut self, low: f64, high: f64) -> f64 {
        let unit = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        low + (high - low) * unit
    }

    /// Shuffles `items` in place (Fisher–Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

/// A seed from the clock, for a run not given `--seed`.
pub fn clock_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // Short enough to type back in.
    mix(nanos ^ u64::from(std::process::id())) % 1_000_000
}

/// Fills `out` with the bytes at `offset..` of the stream keyed `key`: each
/// 8-byte word is `mix(key ^ index)`, so any stretch can be recomputed to
/// check what came back, and two streams never carry the same bytes.
pub fn fill(key: u64, offset: u64, out: &mut [u8]) {
    let mut position = offset;
    let mut written = 0;
    while written < out.len() {
        let word = mix(key ^ (position / 8).wrapping_mul(0x9e37_79b9_7f4a_7c15)).to_le_bytes();
        let within = (position % 8) as usize;
        let take = (8 - within).min(out.len() - written);
        out[written..written + take].copy_from_slice(&word[within..within + take]);
        written += take;
        position += take as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_repeats_its_schedule() {
        let mut a = Rng::new(42);
        let mut b = Rng::new(42);
        let first: Vec<u64> = (0..5).map(|_| a.next_u64()).collect();
        assert_eq!(first, (0..5).map(|_| b.next_u64()).collect::<Vec<_>>());
        let mut items = [1, 2, 3, 4, 5, 6];
        a.shuffle(&mut items);
        let mut sorted = items;
        sorted.sort_unstable();
        assert_eq!(sorted, [1, 2, 3, 4, 5, 6]);
        let x = a.between(2.0, 6.0);
        assert!((2.0..6.0).contains(&x));
        assert!(a.below(3) < 3);
    }

    #[test]
    fn any_stretch_of_a_stream_recomputes() {
        let mut whole = vec![0u8; 100];
        fill(7, 0, &mut whole);
        let mut part = vec![0u8; 37];
        fill(7, 13, &mut part);
        assert_eq!(&whole[13..50], &part[..]);
        let mut other = vec![0u8; 100];
        fill(8, 0, &mut other);
        assert_ne!(whole, other);
    }
}
