//! Stripe locks and versions: every mutation of a key happens under its stripe's lock, and
//! moves the stripe's version, so a reader that copies a value into DRAM (checking the
//! version under the lock) can tell whether a write raced with it. A commit to the warm
//! store makes the version odd while it is written ([`Stripes::begin_commit`]), so a reader
//! whose two look-ups (the records, then the cold index) straddle a commit that moved a key
//! between them can tell, even if it read the version after the commit began: that version
//! is odd.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, MutexGuard};
use strata_format::Key;

/// Most keys a background batch (a settle, a log compaction's step, a demotion's or a
/// segment rewrite's commit) holds locked at once: enough that RocksDB inserts a settle's
/// sorted keys cheaply. A client's write that meets one of them waits in [`wait`], which
/// frees its runtime thread's other tasks; at 64 keys without that, the tails were the
/// same and `SET` of 1 KiB at `-P 16` 20% slower (`strata-bench tails`, `scripts/ab.py`).
pub(crate) const BATCH_KEYS_MAX: usize = 512;

/// Stripes: enough that unrelated keys rarely share one, and that a client's pipeline
/// meets a stripe a background batch holds ([`BATCH_KEYS_MAX`] keys) on few of its batches.
const STRIPE_COUNT: usize = 32768;

pub(crate) struct Stripes {
    locks: Box<[Mutex<()>]>,
    versions: Box<[AtomicU64]>,
}

/// A key's stripe: a multiply-fold of its 8-byte words (a few cycles for the short keys
/// most are; a stripe needs spread, not a checksum). The product's high bits choose.
fn stripe_of(key: &Key) -> usize {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let bytes = key.stored();
    let mut words = bytes.chunks_exact(8);
    let mut h = bytes.len() as u64;
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().expect("eight bytes"));
        h = (h.rotate_left(23) ^ w).wrapping_mul(K);
    }
    let mut last = [0u8; 8];
    last[..words.remainder().len()].copy_from_slice(words.remainder());
    h = (h.rotate_left(23) ^ u64::from_le_bytes(last)).wrapping_mul(K);
    (h >> 40) as usize % STRIPE_COUNT
}

/// Waits for a held stripe (`take` blocks until it has it). On a runtime thread it waits
/// through `block_in_place`, so the tasks queued on that thread go on on another one
/// meanwhile instead of waiting with it (a background batch can hold a stripe for a
/// millisecond and more on a busy core).
fn wait<T>(take: impl FnOnce() -> T) -> T {
    let on_workers = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if on_workers {
        tokio::task::block_in_place(take)
    } else {
        take()
    }
}

impl Stripes {
    pub(crate) fn new() -> Stripes {
        Stripes {
            locks: (0..STRIPE_COUNT).map(|_| Mutex::new(())).collect(),
            versions: (0..STRIPE_COUNT).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    pub(crate) fn lock(&self, key: &Key) -> MutexGuard<'_, ()> {
        let m = &self.locks[stripe_of(key)];
        m.try_lock().unwrap_or_else(|| wait(|| m.lock()))
    }

    /// Locks `key`'s stripe if no one holds it (the caller may hold another: waiting could
    /// deadlock).
    pub(crate) fn try_lock(&self, key: &Key) -> Option<MutexGuard<'_, ()>> {
        self.locks[stripe_of(key)].try_lock()
    }

    /// Locks the stripes of all `keys` in a fixed order (so two batches cannot deadlock).
    pub(crate) fn lock_many<'a>(
        &'a self,
        keys: impl Iterator<Item = &'a Key>,
    ) -> Vec<MutexGuard<'a, ()>> {
        let mut stripes: Vec<usize> = keys.map(stripe_of).collect();
        stripes.sort_unstable();
        stripes.dedup();
        let mut guards = Vec::with_capacity(stripes.len());
        for &i in &stripes {
            match self.locks[i].try_lock() {
                Some(g) => guards.push(g),
                None => break,
            }
        }
        if guards.len() < stripes.len() {
            let rest = &stripes[guards.len()..];
            guards.extend(wait(|| {
                rest.iter()
                    .map(|&i| self.locks[i].lock())
                    .collect::<Vec<_>>()
            }));
        }
        guards
    }

    /// Locks every stripe (for operations on the whole keyspace).
    pub(crate) fn lock_all(&self) -> Vec<MutexGuard<'_, ()>> {
        self.locks.iter().map(|m| m.lock()).collect()
    }

    pub(crate) fn version(&self, key: &Key) -> u64 {
        self.versions[stripe_of(key)].load(Ordering::Acquire)
    }

    /// Whether no write touched `key`'s stripe since its version was `seen`, and none was
    /// being committed then.
    pub(crate) fn unchanged(&self, key: &Key, seen: u64) -> bool {
        seen.is_multiple_of(2) && self.version(key) == seen
    }

    /// Called by writers with each change of a key, under its stripe lock (before or after
    /// DRAM changes: a promotion compares versions under the same lock, and a lock-free
    /// lookup compares them around its reads).
    pub(crate) fn bump(&self, key: &Key) {
        self.versions[stripe_of(key)].fetch_add(2, Ordering::AcqRel);
    }

    /// Marks the stripes of `keys` (their locks held) as being committed: their versions
    /// are odd until what this hands back is dropped (after the commit, or a panic in it).
    pub(crate) fn begin_commit<'a>(&self, keys: impl Iterator<Item = &'a Key>) -> Committing<'_> {
        let mut stripes: Vec<usize> = keys.map(stripe_of).collect();
        stripes.sort_unstable();
        stripes.dedup();
        for &i in &stripes {
            self.versions[i].fetch_add(1, Ordering::AcqRel);
        }
        Committing {
            versions: &self.versions,
            stripes,
        }
    }

    pub(crate) fn bump_all(&self) {
        for v in self.versions.iter() {
            v.fetch_add(2, Ordering::AcqRel);
        }
    }
}

/// Stripes being committed ([`Stripes::begin_commit`]); dropped, their versions are even.
pub(crate) struct Committing<'a> {
    versions: &'a [AtomicU64],
    stripes: Vec<usize>,
}

impl Drop for Committing<'_> {
    fn drop(&mut self) {
        for &i in &self.stripes {
            self.versions[i].fetch_add(1, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_read_while_a_commit_runs_never_counts_as_unchanged() {
        let s = Stripes::new();
        let (a, b) = (Key::new(0, 0, b"a"), Key::new(0, 0, b"b"));
        let before = s.version(&a);
        assert!(s.unchanged(&a, before));
        // A stripe named twice moves once, and stays odd until the commit ends.
        let committing = s.begin_commit([&a, &a, &b].into_iter());
        let during = s.version(&a);
        assert!(!s.unchanged(&a, during), "read during the commit");
        assert!(!s.unchanged(&a, before));
        drop(committing);
        assert!(
            !s.unchanged(&a, during),
            "the commit ended after it was read"
        );
        let after = s.version(&a);
        assert!(s.unchanged(&a, after));
        s.bump(&a);
        assert!(!s.unchanged(&a, after));
        assert!(s.unchanged(&a, s.version(&a)));
    }

    #[test]
    fn keys_that_differ_in_any_byte_spread_over_the_stripes() {
        // Keys as benchmarks and feature stores name them: a shared prefix, a counter at
        // the end or in the middle; short and long.
        let shapes: [fn(u32) -> String; 3] = [
            |i| format!("key:{i:012}"),
            |i| format!("{i}"),
            |i| format!("feature:{i}:user-embedding-of-some-length:v1"),
        ];
        for shape in shapes {
            let mut load = vec![0u32; STRIPE_COUNT];
            for i in 0..(STRIPE_COUNT as u32 * 8) {
                load[stripe_of(&Key::new(0, 0, shape(i).as_bytes()))] += 1;
            }
            let empty = load.iter().filter(|&&n| n == 0).count();
            let most = *load.iter().max().unwrap();
            // Eight keys a stripe on average: a uniform spread leaves almost none empty.
            assert!(empty < STRIPE_COUNT / 100, "{} empty stripes", empty);
            assert!(most <= 32, "a stripe holds {most} keys");
        }
    }
}
