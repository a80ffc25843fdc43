//! Cache policies over block ids, and the replay rules that measure them on traces.
//!
//! This crate is the yardstick for Strata's tiering work: it replays a trace (the Mooncake
//! FAST'25 format, or one key per line) against one cache of a given capacity under a
//! [`PolicyKind`] (including [`StrataPolicy`], ours), with the KV-cache rule that a block counts as a hit only if every earlier
//! block of the same request hit too. [`Opt`] is Belady's offline optimum, computed from
//! the whole trace. No I/O beyond reading the trace, no RocksDB.
//!
//! ```
//! use strata_policy::{replay, PolicyKind, Request};
//! let trace = vec![Request { blocks: vec![1, 2, 3] }, Request { blocks: vec![1, 2, 4] }];
//! let r = replay(&trace, PolicyKind::Lru, 10);
//! assert_eq!((r.hits, r.blocks), (2, 6));
//! ```

mod cache;
mod lru;
mod markov;
mod opt;
mod s3fifo;
mod sketch;
mod strata;
mod tenants;
mod tinylfu;
mod trace;

pub use cache::{BlockCache, IdHasher, IdMap};
pub use lru::Lru;
pub use markov::MarkovModel;
pub use opt::Opt;
pub use s3fifo::S3Fifo;
pub use strata::StrataPolicy;
pub use tenants::{replay_tenants, rounds_to_send_all, Tenant};
pub use tinylfu::WTinyLfu;
pub use trace::{load_trace, Request};

/// The policies a replay can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyKind {
    Lru,
    S3Fifo,
    WTinyLfu,
    Strata,
    Opt,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 5] = [
        PolicyKind::Lru,
        PolicyKind::S3Fifo,
        PolicyKind::WTinyLfu,
        PolicyKind::Strata,
        PolicyKind::Opt,
    ];

    pub fn name(&self) -> &'static str {
        match self {
            PolicyKind::Lru => "lru",
            PolicyKind::S3Fifo => "s3fifo",
            PolicyKind::WTinyLfu => "wtinylfu",
            PolicyKind::Strata => "strata",
            PolicyKind::Opt => "opt",
        }
    }
}

impl std::str::FromStr for PolicyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        PolicyKind::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                format!("unknown policy '{s}'; choose lru, s3fifo, wtinylfu, strata or opt")
            })
    }
}

/// What a replay measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ReplayResult {
    pub blocks: u64,
    pub hits: u64,
}

impl ReplayResult {
    pub fn hit_rate(&self) -> f64 {
        self.hits as f64 / self.blocks.max(1) as f64
    }
}

/// The flattened access sequence of a trace (every block of every request, in order).
pub fn flatten(trace: &[Request]) -> Vec<u64> {
    trace
        .iter()
        .flat_map(|r| r.blocks.iter().copied())
        .collect()
}

/// Replays `trace` against one cache of `capacity` blocks under `policy`.
pub fn replay(trace: &[Request], policy: PolicyKind, capacity: usize) -> ReplayResult {
    let capacity = capacity.max(1);
    let mut cache: Box<dyn BlockCache> = match policy {
        PolicyKind::Lru => Box::new(Lru::new(capacity)),
        PolicyKind::S3Fifo => Box::new(S3Fifo::new(capacity)),
        PolicyKind::WTinyLfu => Box::new(WTinyLfu::new(capacity)),
        PolicyKind::Strata => Box::new(StrataPolicy::new(capacity)),
        PolicyKind::Opt => Box::new(Opt::new(capacity, &flatten(trace))),
    };
    replay_with(trace, cache.as_mut())
}

/// Replays `trace` against `cache`: a block hits only if it and every earlier block of its
/// request are cached; afterwards every block of the request is accessed (stored).
pub fn replay_with(trace: &[Request], cache: &mut dyn BlockCache) -> ReplayResult {
    let mut out = ReplayResult { blocks: 0, hits: 0 };
    let mut t = 0;
    for req in trace {
        let mut prefix = true;
        for &b in &req.blocks {
            prefix = prefix && cache.contains(b);
            out.blocks += 1;
            out.hits += prefix as u64;
        }
        cache.begin_request();
        for &b in &req.blocks {
            cache.access(b, t);
            t += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small generated trace: sessions that extend shared prefixes, plus one-off noise.
    fn generated(seed: u64, requests: usize) -> Vec<Request> {
        let mut x = seed | 1;
        let mut rnd = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut out = Vec::new();
        let mut next_id = 1_000_000u64;
        for _ in 0..requests {
            let len = 1 + rnd(12) as usize;
            let session = rnd(40);
            let mut blocks: Vec<u64> = (0..len as u64).map(|i| session * 1000 + i).collect();
            if rnd(4) == 0 {
                next_id += 1;
                blocks.push(next_id);
            }
            out.push(Request { blocks });
        }
        out
    }

    #[test]
    fn opt_is_never_beaten_by_an_online_policy() {
        for seed in 1..30u64 {
            let trace = generated(seed * 7919, 300);
            for cap in [4, 16, 64, 200] {
                let opt = replay(&trace, PolicyKind::Opt, cap).hits;
                for p in [
                    PolicyKind::Lru,
                    PolicyKind::S3Fifo,
                    PolicyKind::WTinyLfu,
                    PolicyKind::Strata,
                ] {
                    let got = replay(&trace, p, cap).hits;
                    assert!(
                        got <= opt,
                        "seed {seed} cap {cap}: {} got {got} > opt {opt}",
                        p.name()
                    );
                }
            }
        }
    }

    #[test]
    fn strata_never_loses_to_lru_by_more_than_half_a_point() {
        for seed in 1..7u64 {
            let trace = generated(seed * 104_729, 2000);
            for cap in [16, 64, 200, 400] {
                let lru = replay(&trace, PolicyKind::Lru, cap).hit_rate();
                let strata = replay(&trace, PolicyKind::Strata, cap).hit_rate();
                assert!(
                    strata >= lru - 0.005,
                    "seed {seed} cap {cap}: strata {strata:.4} < lru {lru:.4} - 0.005"
                );
            }
        }
    }

    #[test]
    fn unlimited_capacity_reaches_the_ceiling_for_every_policy() {
        let trace = generated(42, 400);
        let ceiling = replay(&trace, PolicyKind::Lru, 1 << 20);
        for p in PolicyKind::ALL {
            assert_eq!(replay(&trace, p, 1 << 20), ceiling, "{}", p.name());
        }
    }

    #[test]
    fn contiguous_prefix_rule() {
        let trace = vec![
            Request {
                blocks: vec![1, 2, 3],
            },
            Request {
                blocks: vec![9, 2, 3],
            },
            Request {
                blocks: vec![1, 2, 3],
            },
        ];
        // Request 2 misses block 9, so its cached 2 and 3 do not count.
        assert_eq!(replay(&trace, PolicyKind::Lru, 100).hits, 3);
    }
}
