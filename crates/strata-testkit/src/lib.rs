//! Test support shared by Strata's test suites and fuzzers, and nothing else.
//!
//! Randomness comes through [`Rng`], seeded from `STRATA_SEED` when set (and printed when
//! not), so any failing run can be replayed exactly.
//!
//! ```
//! let mut a = strata_testkit::Rng::new(7);
//! let mut b = strata_testkit::Rng::new(7);
//! assert_eq!(a.next_u64(), b.next_u64());
//! ```

/// splitmix64: small, fast, and the same sequence for the same seed everywhere.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// Seeded from `STRATA_SEED`, or from the clock; prints `<test>: STRATA_SEED=<seed>`.
    pub fn from_env(test: &str) -> Rng {
        let seed = std::env::var("STRATA_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            });
        eprintln!("{test}: STRATA_SEED={seed}");
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// An index in `0..n`.
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    /// One of `xs`.
    pub fn pick<'a, T: ?Sized>(&mut self, xs: &[&'a T]) -> &'a T {
        xs[self.index(xs.len())]
    }
}

/// A free TCP port on 127.0.0.1 (free when asked; bind promptly).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}
