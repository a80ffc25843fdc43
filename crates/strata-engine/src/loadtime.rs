//! Measured read cost per tier, so a scheduler can ask how long loading some values would
//! take and decide whether loading beats recomputing.
//!
//! Each tier keeps two moving averages (weight 1/16 per sample): the time of small reads
//! (under 64 KiB), taken as the fixed cost of one read, and the time per MiB of large reads
//! beyond that fixed cost. The estimate for a read of `b` bytes from tier `t` is
//! `latency_us[t] + b / 2^20 × us_per_mib[t]`; for many values, the sum. RocksDB and object
//! store reads are measured on every read that misses DRAM; until then, and for DRAM (not
//! timed, to keep hits cheap), defaults stand in: DRAM 2 µs + 200 µs/MiB, RocksDB 20 µs +
//! 1 ms/MiB, object store 20 ms + 10 ms/MiB.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::tier::Tier;

const SMALL_BYTES_MAX: u64 = 64 << 10;

struct TierCost {
    /// Fixed cost of one read, in nanoseconds.
    latency_ns: AtomicU64,
    /// Cost per MiB beyond the fixed cost, in nanoseconds.
    ns_per_mib: AtomicU64,
}

impl TierCost {
    const fn new(latency_us: u64, us_per_mib: u64) -> Self {
        TierCost {
            latency_ns: AtomicU64::new(latency_us * 1000),
            ns_per_mib: AtomicU64::new(us_per_mib * 1000),
        }
    }
}

fn ewma(cell: &AtomicU64, sample: u64) {
    let old = cell.load(Ordering::Relaxed);
    let new = old - old / 16 + sample / 16;
    cell.store(new, Ordering::Relaxed);
}

pub(crate) struct LoadModel {
    tiers: [TierCost; 3],
}

impl Default for LoadModel {
    fn default() -> Self {
        LoadModel {
            tiers: [
                TierCost::new(2, 200),
                TierCost::new(20, 1_000),
                TierCost::new(20_000, 10_000),
            ],
        }
    }
}

fn idx(t: Tier) -> usize {
    match t {
        Tier::Hot => 0,
        Tier::Warm => 1,
        Tier::Cold => 2,
    }
}

impl LoadModel {
    /// Records one read of `bytes` from `tier` that took `took`.
    pub(crate) fn record(&self, tier: Tier, bytes: u64, took: Duration) {
        let c = &self.tiers[idx(tier)];
        let ns = took.as_nanos().min(u64::MAX as u128) as u64;
        if bytes < SMALL_BYTES_MAX {
            ewma(&c.latency_ns, ns);
        } else {
            let beyond = ns.saturating_sub(c.latency_ns.load(Ordering::Relaxed));
            ewma(&c.ns_per_mib, beyond.saturating_mul(1 << 20) / bytes);
        }
    }

    /// Expected microseconds to read values of the given sizes from the given tiers.
    pub(crate) fn estimate_us(&self, reads: &[(Tier, u64)]) -> u64 {
        let ns: u128 = reads
            .iter()
            .map(|&(t, b)| {
                let c = &self.tiers[idx(t)];
                c.latency_ns.load(Ordering::Relaxed) as u128
                    + c.ns_per_mib.load(Ordering::Relaxed) as u128 * b as u128 / (1 << 20)
            })
            .sum();
        (ns / 1000) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_follow_measurements() {
        let m = LoadModel::default();
        assert_eq!(m.estimate_us(&[(Tier::Cold, 0)]), 20_000);
        for _ in 0..200 {
            m.record(Tier::Cold, 100, Duration::from_millis(2));
            m.record(Tier::Cold, 4 << 20, Duration::from_millis(2 + 4 * 5));
        }
        let est = m.estimate_us(&[(Tier::Cold, 1 << 20), (Tier::Cold, 1 << 20)]);
        assert!(
            (10_000..=16_000).contains(&est),
            "two 1 MiB cold reads ≈ 2 × (2 ms + 5 ms): {est}"
        );
        assert!(m.estimate_us(&[(Tier::Hot, 1 << 20)]) < m.estimate_us(&[(Tier::Cold, 1 << 20)]));
    }
}
