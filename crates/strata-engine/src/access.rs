//! Per-key access counts for the warm tier's clock hand (hashed, one byte each): a read adds
//! one (up to [`ACCESS_COUNT_MAX`]; which reads count: [`AccessCounts::count_read`]), each
//! pass of the hand over a key takes one away, and the hand demotes a key whose count is
//! zero. So a key survives as many passes as it had recent reads: frequency-weighted aging,
//! the rule Strata's DRAM policy follows (GCLOCK), without the chain links (the warm tier
//! does not learn them).

use std::sync::atomic::{AtomicU8, Ordering};

use smallvec::SmallVec;
use strata_format::Key;

/// Slots of the count table.
const ACCESS_SLOTS: usize = 1 << 20;
/// Most passes of the clock hand a key's reads can buy it.
const ACCESS_COUNT_MAX: u8 = 15;

pub(crate) struct AccessCounts {
    slots: Box<[AtomicU8]>,
    /// Whether values read from the object store return to the warm tier (then only reads
    /// that find a key count).
    returns_to_warm: bool,
}

impl AccessCounts {
    pub(crate) fn new(returns_to_warm: bool) -> Self {
        AccessCounts {
            slots: (0..ACCESS_SLOTS).map(|_| AtomicU8::new(0)).collect(),
            returns_to_warm,
        }
    }

    fn slot(&self, key: &[u8]) -> &AtomicU8 {
        let h = (crc32c::crc32c(key) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
        &self.slots[h as usize % ACCESS_SLOTS]
    }

    /// Counts a read of `key`. With values returning to warm, only reads that found the key
    /// count. Without, every read counts: a key written after a read that missed it starts
    /// with one, which keeps new keys through a pass of the clock (the only reuse the warm
    /// tier can see then; measured on the conversation trace: RocksDB served 20,600 blocks
    /// this way and 13,800 counting found keys only).
    pub(crate) fn count_read(&self, key: &Key, found: bool) {
        if found || !self.returns_to_warm {
            self.count_reads_found(&[key]);
        }
    }

    /// [`AccessCounts::count_read`] of keys that were found, their slots looked up before
    /// any is changed (the changes' cache misses overlap).
    pub(crate) fn count_reads_found(&self, keys: &[&Key]) {
        let slots: SmallVec<[&AtomicU8; 16]> = keys.iter().map(|k| self.slot(k.stored())).collect();
        for c in slots {
            let v = c.load(Ordering::Relaxed);
            if v < ACCESS_COUNT_MAX {
                c.store(v + 1, Ordering::Relaxed);
            }
        }
    }

    /// One pass of the hand over the stored key `key`: takes one count away and says
    /// whether it had any.
    pub(crate) fn take(&self, key: &[u8]) -> bool {
        let c = self.slot(key);
        let v = c.load(Ordering::Relaxed);
        if v > 0 {
            c.store(v - 1, Ordering::Relaxed);
        }
        v > 0
    }
}
