//! Write-back's state, a component the engine's core holds: which keys DRAM holds dirty,
//! which keys the live log files have records of, and when the log is due for a
//! compaction. The operations on it are the module above's and `settle`'s.

use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use strata_format::{Key, Kind};
use strata_hot::HotCache;

use super::log::{HotLog, OP_PUT, OP_SETTLED};
use crate::Result;

/// A compaction starts once the current log file holds this many times the dirty budget
/// (so rewriting the dirty values costs at most half as much again as logging them, and a
/// replay at open reads at most about that much), or at least this many bytes.
const LOG_FILE_BUDGETS: u64 = 2;

const LOG_FILE_BYTES_MIN: u64 = 1 << 20;

/// A compaction starts at least this often while the log has records.
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(30);

/// Bounds of the table of keys with records (`WriteBack::records`), in slots.
const RECORD_SLOTS_MIN: usize = 1 << 12;

const RECORD_SLOTS_MAX: usize = 1 << 22;

/// A key's value that DRAM and the hot log hold and the warm store does not yet.
#[derive(Debug, Clone)]
pub(crate) struct Dirty {
    pub(crate) kind: Kind,
    pub(crate) value: Bytes,
    pub(crate) expire_ms: u64,
}

impl Dirty {
    pub(crate) fn is_live(&self, now_ms: u64) -> bool {
        strata_format::is_live(self.expire_ms, now_ms)
    }
}

/// What write-back needs of the background task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Due {
    Nothing,
    /// [`settle_colder_half`]: the colder half of the dirty values into the warm store.
    Settle,
    /// [`compact`]: the log rewritten to what is dirty now.
    Compaction,
}

/// Dirty values live in DRAM as dirty entries (never evicted); beside them, write-back
/// keeps only which keys the live log files have records of.
pub(crate) struct WriteBack {
    /// The share of DRAM's budget (as it is now) dirty values may hold; 0 turns write-back
    /// off.
    pub(crate) fraction: f64,
    /// Most dirty bytes whatever DRAM's budget: half the warm tier's budget. Dirty values
    /// count against the warm tier's hard limit (they are bound for it), so they must
    /// settle while the warm tier and demotion can still make room for them; a larger
    /// share would stall writes at the hard limit with nothing demotion could move.
    pub(crate) warm_share_max: u64,
    pub(crate) hot: Arc<HotCache>,
    /// Which keys the live log files have records of, dirty or settled: a slot per hash of
    /// the stored key, holding the newest log file any key hashed there has a record in (0:
    /// none). Keys that share a slot only cost needless `SETTLED` records; a slot is
    /// cleared when its file is retired.
    pub(crate) records: Box<[AtomicU32]>,
    /// Hashes stored keys for `records`, with a random key per process (clients choose keys).
    pub(crate) hasher: ahash::RandomState,
    /// Slots of `records` in use: 0 lets every check skip DRAM (a dirty key always has one).
    pub(crate) slots_used: AtomicU64,
    pub(crate) log: Arc<HotLog>,
    /// Writes leave their records to [`log_unlogged`] (`durability = none`).
    pub(crate) defers: bool,
    pub(crate) last_checkpoint: Mutex<Instant>,
    /// Held for the whole of a checkpoint (the background task's, one on request, one at
    /// close): two at once would each delete the files the other retired.
    pub(crate) checkpointing: Mutex<()>,
}

impl WriteBack {
    /// Opens the hot log under `data_dir`; what it holds is read by [`recover`].
    pub(crate) fn open(
        data_dir: &Path,
        fraction: f64,
        warm_bytes_max: u64,
        defers: bool,
        hot: Arc<HotCache>,
    ) -> Result<WriteBack> {
        let warm_share_max = warm_bytes_max / 2;
        // About a slot per smallest dirty entry the budget holds.
        let dirty_max = ((hot.bytes_max() as f64 * fraction) as u64).min(warm_share_max) as usize;
        let slots = (dirty_max / strata_hot::charge(0, 0))
            .next_power_of_two()
            .clamp(RECORD_SLOTS_MIN, RECORD_SLOTS_MAX);
        Ok(WriteBack {
            fraction,
            warm_share_max,
            hot,
            records: (0..slots).map(|_| AtomicU32::new(0)).collect(),
            hasher: ahash::RandomState::new(),
            slots_used: AtomicU64::new(0),
            log: Arc::new(HotLog::open(&data_dir.join("hotlog"))?),
            defers,
            last_checkpoint: Mutex::new(Instant::now()),
            checkpointing: Mutex::new(()),
        })
    }

    pub(crate) fn log(&self) -> &Arc<HotLog> {
        &self.log
    }

    pub(crate) fn dirty_bytes(&self) -> u64 {
        self.hot.dirty_bytes() as u64
    }

    /// Most bytes dirty values may hold now.
    pub(crate) fn bytes_max(&self) -> u64 {
        ((self.hot.bytes_max() as f64 * self.fraction) as u64).min(self.warm_share_max)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.slots_used.load(Ordering::Acquire) == 0
    }

    /// `key`'s slot in `records`.
    pub(crate) fn record_slot(&self, key: &Key) -> &AtomicU32 {
        let h = self.hasher.hash_one(key.stored()) as usize;
        &self.records[h % self.records.len()]
    }

    /// Notes that log file `gen` has a record of `key`.
    pub(crate) fn note_record(&self, key: &Key, gen: u64) {
        // Generations only grow: the slot keeps the newest of the keys hashed to it (most
        // writes find it there already, and change nothing).
        let slot = self.record_slot(key);
        if slot.load(Ordering::Acquire) >= gen as u32 {
            return;
        }
        if slot.fetch_max(gen as u32, Ordering::AcqRel) == 0 {
            self.slots_used.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Whether the live log files may have records of `key`.
    pub(crate) fn has_records(&self, key: &Key) -> bool {
        !self.is_empty() && self.record_slot(key).load(Ordering::Acquire) != 0
    }

    /// The dirty value of `key`, if write-back holds one (live or not: an expired one
    /// means the key is gone, whatever the warm store says).
    pub(crate) fn get(&self, key: &Key) -> Option<Dirty> {
        if self.is_empty() {
            return None;
        }
        let (value, expire_ms, tag) = self.hot.dirty(key.stored())?;
        Some(Dirty {
            kind: Kind::from_u8(tag).expect("write-back tags entries with their kind"),
            value,
            expire_ms,
        })
    }

    pub(crate) fn has_dirty(&self, key: &Key) -> bool {
        !self.is_empty() && self.hot.is_dirty(key.stored())
    }

    /// Holds `value` as `key`'s dirty value (the caller holds its stripe lock), its last
    /// record in log file `gen`, or (not `logged`) in a file from `gen` on once
    /// [`log_unlogged`] logs it. False if DRAM cannot hold it ([`takes`] checks first).
    pub(crate) fn put(
        &self,
        key: &Key,
        kind: Kind,
        value: &[u8],
        expire_ms: u64,
        gen: u64,
        logged: bool,
    ) -> bool {
        self.note_record(key, gen);
        self.hot
            .insert_dirty(key.stored(), value, expire_ms, kind as u8, logged)
    }

    /// Where a write's record goes: `(gen, logged)`, the log file it is in (appended now),
    /// or (`durability = none`, not logged) the first file [`log_unlogged`] may log it in.
    /// A compaction that rotates meanwhile retires only files before that one, and logs the
    /// key again itself if it finds it dirty.
    pub(crate) fn record(
        &self,
        key: &Key,
        kind: Kind,
        value: &[u8],
        expire_ms: u64,
    ) -> (u64, bool) {
        if self.defers {
            self.log.note_deferred(key.stored().len() + value.len());
            (self.log.gen() + 1, false)
        } else {
            let gen = self
                .log
                .append(OP_PUT, kind as u8, expire_ms, key.stored(), value);
            (gen, true)
        }
    }

    /// Marks `key`'s value as held by the warm store (its records stay live until their
    /// file is retired, unless `records_void`); DRAM keeps it as a copy. A value not logged
    /// yet gets a `SETTLED` record (otherwise an older record of the key would be replayed
    /// over it), as does every value with `records_void`: one record either way.
    pub(crate) fn mark_settled(&self, key: &Key, records_void: bool) {
        if self.hot.mark_clean(key.stored()) | records_void {
            self.log.append(OP_SETTLED, 0, 0, key.stored(), b"");
        }
    }

    /// Every key with a dirty value now, a DRAM shard at a time (a checkpoint's lists stay
    /// small).
    pub(crate) fn dirty_keys(&self) -> impl Iterator<Item = Vec<Key>> + '_ {
        let shards = if self.is_empty() {
            0
        } else {
            self.hot.shard_count()
        };
        (0..shards).map(|i| {
            self.hot
                .dirty_keys_in(i)
                .iter()
                .filter_map(|k| Key::from_stored(k).ok())
                .collect()
        })
    }

    /// Forgets the keys whose last record is in a retired file (a checkpoint settled every
    /// value logged before it).
    pub(crate) fn forget_settled(&self, retired_gen: u64) {
        if self.is_empty() {
            return;
        }
        for slot in self.records.iter() {
            let gen = slot.load(Ordering::Acquire);
            if gen != 0
                && u64::from(gen) <= retired_gen
                && slot
                    .compare_exchange(gen, 0, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                self.slots_used.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// Forgets every record and every dirty value (`FLUSHALL`).
    pub(crate) fn clear(&self) {
        for slot in self.records.iter() {
            if slot.swap(0, Ordering::AcqRel) != 0 {
                self.slots_used.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.hot.clear_all();
    }

    /// Whether dirty values hold three quarters of their budget or more.
    pub(crate) fn settle_due(&self) -> bool {
        self.dirty_bytes() >= self.bytes_max() / 4 * 3
    }

    /// What the background task should do for write-back now: write the colder half of the
    /// dirty values to the warm store once they pass three quarters of their budget (DRAM
    /// needs room, and writes a margin while it runs), compact the log once its file is
    /// large or old.
    pub(crate) fn due(&self) -> Due {
        if self.is_empty() {
            Due::Nothing
        } else if self.settle_due() {
            Due::Settle
        } else if self.log.file_bytes()
            >= (self.bytes_max() * LOG_FILE_BUDGETS).max(LOG_FILE_BYTES_MIN)
            || self.last_checkpoint.lock().elapsed() >= CHECKPOINT_INTERVAL
        {
            Due::Compaction
        } else {
            Due::Nothing
        }
    }
}
