//! Stripe locks and versions: every mutation of a key happens under its stripe's lock, and
//! bumps the stripe's version before it touches DRAM, so a reader that copies a value into
//! DRAM can tell whether a write raced with it.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, MutexGuard};
use strata_format::Key;

/// Stripes: enough that unrelated keys rarely share one.
const STRIPE_COUNT: usize = 4096;

pub(crate) struct Stripes {
    locks: Box<[Mutex<()>]>,
    versions: Box<[AtomicU64]>,
}

fn stripe_of(key: &Key) -> usize {
    crc32c::crc32c(key.stored()) as usize % STRIPE_COUNT
}

impl Stripes {
    pub(crate) fn new() -> Stripes {
        Stripes {
            locks: (0..STRIPE_COUNT).map(|_| Mutex::new(())).collect(),
            versions: (0..STRIPE_COUNT).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    pub(crate) fn lock(&self, key: &Key) -> MutexGuard<'_, ()> {
        self.locks[stripe_of(key)].lock()
    }

    /// Locks the stripes of all `keys` in a fixed order (so two batches cannot deadlock).
    pub(crate) fn lock_many<'a>(
        &'a self,
        keys: impl Iterator<Item = &'a Key>,
    ) -> Vec<MutexGuard<'a, ()>> {
        let mut stripes: Vec<usize> = keys.map(stripe_of).collect();
        stripes.sort_unstable();
        stripes.dedup();
        stripes.into_iter().map(|i| self.locks[i].lock()).collect()
    }

    /// Locks every stripe (for operations on the whole keyspace).
    pub(crate) fn lock_all(&self) -> Vec<MutexGuard<'_, ()>> {
        self.locks.iter().map(|m| m.lock()).collect()
    }

    pub(crate) fn version(&self, key: &Key) -> u64 {
        self.versions[stripe_of(key)].load(Ordering::Acquire)
    }

    /// Called by writers, under the stripe lock, before they touch DRAM.
    pub(crate) fn bump(&self, key: &Key) {
        self.versions[stripe_of(key)].fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn bump_all(&self) {
        for v in self.versions.iter() {
            v.fetch_add(1, Ordering::AcqRel);
        }
    }
}
