//! Write-back: a plain write of a small string (`SET`, `SET EX`, `MSET`, the `INCR`
//! family) lands in DRAM, as a dirty entry, and in the hot log, not in the warm store.
//! Overwrites of a hot key coalesce there. The warm store is filled behind it: with the
//! colder half of the dirty values once they pass three quarters of their budget
//! ([`settle_colder_half`]), with all of them before an operation on the whole keyspace
//! (scans, backups, the change log, `FLUSHDB`, `DBSIZE`, `Engine::stats`: [`settle_all`];
//! not `INFO`, which counts keys as they stand) or at a
//! checkpoint (close, recovery), and with one key as soon as another command needs its
//! stored state (`settle_locked`). Until then DRAM holds the key's newest value: reads find
//! it there before the warm store, and every other write settles the key first.
//!
//! The hot log is files `hotlog/<gen>.log` of records `body_len u32 | crc32c(body) u32 |
//! body`, body `op u8 | kind u8 | expire_ms u64 | key_len u32 | stored key | value`. `PUT`
//! gives a key a value; `SETTLED` says the warm store now answers for the key and its
//! earlier records are void (logged when another write changes a key that has records);
//! `FLUSHED` voids every earlier record (`FLUSHALL`); `DELTA` changes the key's value as
//! the `PUT` (and `DELTA`s) before it left it: a live collection's changes since it was
//! logged whole (`live`, [`strata_format::delta`]). With `durability = none` a write
//! logs nothing itself: DRAM marks the entry unlogged, and the task that hands the log to
//! the OS every `none_flush_ms` first logs each marked key's value as it is then
//! ([`log_unlogged`]), so a key written many times in a period is logged once; a value
//! written to the warm store before its tick gets a `SETTLED` record instead. The log is handed to the OS (with
//! `group`, fsynced) by the tasks that do so for the warm store's log, right after it and
//! only up to where it stood before it, so a `SETTLED` record never reaches the disk ahead
//! of the warm-store writes it stands for. Opening replays the files. A compaction
//! ([`compact`], when the log file grows or ages) starts a new file, logs every dirty value
//! into it again, syncs it and deletes the older files; a checkpoint ([`checkpoint`]) does
//! the same but writes the dirty values to the warm store instead.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use strata_format::{Key, Kind};

use strata_hot::HotCache;

use crate::core::Core;
use crate::durability::Ticket;
use crate::locks::BATCH_KEYS_MAX;
use crate::offload::give_way;
use crate::stats::add;
use crate::warm::{Counts, Want};
use crate::write::{commit_acknowledged, stage, Change};
use crate::{Error, Result};

const OP_PUT: u8 = 1;
const OP_SETTLED: u8 = 2;
const OP_FLUSHED: u8 = 3;
const OP_DELTA: u8 = 4;
/// Bytes of a record before its key: length, checksum, op, kind, expiry, key length.
const RECORD_HEAD_BYTES: usize = 4 + 4 + 1 + 1 + 8 + 4;
/// A compaction starts once the current log file holds this many times the dirty budget
/// (so rewriting the dirty values costs at most half as much again as logging them, and a
/// replay at open reads at most about that much), or at least this many bytes.
const LOG_FILE_BUDGETS: u64 = 2;
const LOG_FILE_BYTES_MIN: u64 = 1 << 20;
/// A compaction starts at least this often while the log has records.
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(30);
/// Bytes the hot log buffers in the process before it asks to be written out early (with
/// `durability = none` it is written out every `none_flush_ms` otherwise).
const LOG_BUFFER_BYTES_MAX: usize = 4 << 20;
/// Bytes of records a tick's logging of unlogged values buffers before it writes them out
/// (a tick may log a second's worth of writes: in small steps, the buffer stays small).
const LOG_DRAIN_BYTES: usize = 1 << 20;
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
    fraction: f64,
    /// Most dirty bytes whatever DRAM's budget: half the warm tier's budget. Dirty values
    /// count against the warm tier's hard limit (they are bound for it), so they must
    /// settle while the warm tier and demotion can still make room for them; a larger
    /// share would stall writes at the hard limit with nothing demotion could move.
    warm_share_max: u64,
    hot: Arc<HotCache>,
    /// Which keys the live log files have records of, dirty or settled: a slot per hash of
    /// the stored key, holding the newest log file any key hashed there has a record in (0:
    /// none). Keys that share a slot only cost needless `SETTLED` records; a slot is
    /// cleared when its file is retired.
    records: Box<[AtomicU32]>,
    /// Hashes stored keys for `records`, with a random key per process (clients choose keys).
    hasher: ahash::RandomState,
    /// Slots of `records` in use: 0 lets every check skip DRAM (a dirty key always has one).
    slots_used: AtomicU64,
    log: Arc<HotLog>,
    /// Writes leave their records to [`log_unlogged`] (`durability = none`).
    defers: bool,
    last_checkpoint: Mutex<Instant>,
    /// Held for the whole of a checkpoint (the background task's, one on request, one at
    /// close): two at once would each delete the files the other retired.
    checkpointing: Mutex<()>,
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

    fn is_empty(&self) -> bool {
        self.slots_used.load(Ordering::Acquire) == 0
    }

    /// `key`'s slot in `records`.
    fn record_slot(&self, key: &Key) -> &AtomicU32 {
        let h = self.hasher.hash_one(key.stored()) as usize;
        &self.records[h % self.records.len()]
    }

    /// Notes that log file `gen` has a record of `key`.
    fn note_record(&self, key: &Key, gen: u64) {
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
    fn has_records(&self, key: &Key) -> bool {
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
    fn put(
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
    fn record(&self, key: &Key, kind: Kind, value: &[u8], expire_ms: u64) -> (u64, bool) {
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
    fn mark_settled(&self, key: &Key, records_void: bool) {
        if self.hot.mark_clean(key.stored()) | records_void {
            self.log.append(OP_SETTLED, 0, 0, key.stored(), b"");
        }
    }

    /// Every key with a dirty value now, a DRAM shard at a time (a checkpoint's lists stay
    /// small).
    fn dirty_keys(&self) -> impl Iterator<Item = Vec<Key>> + '_ {
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
    fn forget_settled(&self, retired_gen: u64) {
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
    fn clear(&self) {
        for slot in self.records.iter() {
            if slot.swap(0, Ordering::AcqRel) != 0 {
                self.slots_used.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.hot.clear_all();
    }

    /// Whether dirty values hold three quarters of their budget or more.
    fn settle_due(&self) -> bool {
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

/// Writes `value` to `key` through write-back, if it takes the write: then returns the
/// ticket to wait for. `None`: the caller writes through the warm store (write-back off,
/// `durability = sync`, a value for the value log, its budget full, or the warm tier at its
/// hard limit, where writes must wait for demotion).
pub(crate) fn try_put(
    core: &Core,
    key: &Key,
    kind: Kind,
    value: &Bytes,
    expire_ms: u64,
) -> Result<Option<Ticket>> {
    if !takes(core, &[(key, value)], expire_ms) {
        return Ok(None);
    }
    core.check_writable()?;
    let _g = core.locks.lock(key);
    put_locked(core, key, kind, value, expire_ms);
    Ok(Some(core.ticket()))
}

/// Whether write-back takes all of `pairs` (strings expiring at `expire_ms`), or none.
pub(crate) fn takes(core: &Core, pairs: &[(&Key, &[u8])], expire_ms: u64) -> bool {
    let value_max = core.settings.vlog.vlog_value_bytes_min.max(1);
    takes_below(core, pairs, expire_ms, value_max)
}

/// Whether write-back takes `value` at `key` whatever its size (a live value's fold: one
/// write of what many commands changed), if DRAM and the budget hold it.
pub(crate) fn takes_any_size(core: &Core, key: &Key, value: &[u8], expire_ms: u64) -> bool {
    takes_below(core, &[(key, value)], expire_ms, u64::MAX)
}

/// [`takes`] of values smaller than `value_max`.
fn takes_below(core: &Core, pairs: &[(&Key, &[u8])], expire_ms: u64, value_max: u64) -> bool {
    let wb = &core.writeback;
    let dirty_max = wb.bytes_max();
    if dirty_max == 0
        || core.syncs_client_writes()
        || expire_ms != 0 && !strata_format::is_live(expire_ms, core.now_ms())
        || pairs
            .iter()
            .any(|(k, v)| v.len() as u64 >= value_max || !core.hot.fits(k.stored().len(), v.len()))
    {
        return false;
    }
    let added: usize = pairs
        .iter()
        .map(|(k, v)| strata_hot::charge(k.stored().len(), v.len()))
        .sum();
    let dirty = wb.dirty_bytes() + added as u64;
    dirty <= dirty_max && core.sizes.warm_bytes() + dirty <= core.settings.warm.warm_hard_limit()
}

/// Before writes of many keys (a pipeline's run of `SET`s or `INCR`s): looks up their DRAM
/// entries and record slots once, all of them, changing nothing, so that the writes that
/// follow find them in the CPU's cache; the look-ups' cache misses overlap instead of
/// coming one after another. Nothing for a single key.
pub(crate) fn look_ahead<'k>(core: &Core, keys: impl ExactSizeIterator<Item = &'k Key>) {
    if keys.len() < 2 {
        return;
    }
    let wb = &core.writeback;
    let stored: Vec<&[u8]> = keys
        .map(|k| {
            strata_hot::prefetch(wb.record_slot(k));
            k.stored()
        })
        .collect();
    wb.hot.look_ahead(&stored);
}

/// Writes `value` to `key` through write-back, which [`takes`] it; `key`'s stripe lock is
/// held. The ticket is the caller's to take, once for all of its writes.
pub(crate) fn put_locked(core: &Core, key: &Key, kind: Kind, value: &[u8], expire_ms: u64) {
    put_with(core, key, kind, value, expire_ms, true);
}

/// [`put_locked`] of a value DRAM already holds as `key`'s dirty value (rewritten in its
/// block by `HotCache::rewrite_dirty`, after [`takes`] took it, marked unlogged if
/// [`defers_log`]): its record in the hot log.
pub(crate) fn put_in_place_locked(
    core: &Core,
    key: &Key,
    kind: Kind,
    value: &[u8],
    expire_ms: u64,
) {
    put_with(core, key, kind, value, expire_ms, false);
}

/// [`put_locked`] (`copy`: DRAM takes a copy of `value`; without, it holds it already).
fn put_with(core: &Core, key: &Key, kind: Kind, value: &[u8], expire_ms: u64, copy: bool) {
    // The value replaces whatever the key held, a live value too.
    core.live.forget(key);
    log_with(core, key, kind, value, expire_ms, copy);
    add(&core.counters.writes);
    add(&core.counters.writes_back);
}

/// The part of [`put_locked`] a live value's fold shares: `value` into the hot log and DRAM
/// as `key`'s dirty value.
pub(crate) fn log_locked(core: &Core, key: &Key, kind: Kind, value: &[u8], expire_ms: u64) {
    log_with(core, key, kind, value, expire_ms, true);
}

/// [`log_locked`] (`copy` as in [`put_with`]).
fn log_with(core: &Core, key: &Key, kind: Kind, value: &[u8], expire_ms: u64, copy: bool) {
    let wb = &core.writeback;
    let (gen, logged) = wb.record(key, kind, value, expire_ms);
    if copy {
        // DRAM holds a copy: the value does not keep alive the client's input buffer it
        // was cut from.
        let held = wb.put(key, kind, value, expire_ms, gen, logged);
        debug_assert!(held, "takes() checked that DRAM holds it");
    } else {
        wb.note_record(key, gen);
    }
    core.locks.bump(key);
    if wb.settle_due() {
        core.background_wake.notify_one();
    }
}

/// Logs `delta`, the changes of `key`'s live value since its last record (its stripe lock
/// held): appended now, covered by the next group commit's sync or `none`'s flush.
pub(crate) fn log_delta_locked(core: &Core, key: &Key, kind: Kind, delta: &[u8], expire_ms: u64) {
    let wb = &core.writeback;
    let gen = wb
        .log
        .append(OP_DELTA, kind as u8, expire_ms, key.stored(), delta);
    wb.note_record(key, gen);
}

/// [`current_locked`] that lends the value to `see` (`None`: write-back knows the key is
/// gone) instead of copying it; `None` if only the warm store knows.
pub(crate) fn current_seen_locked<T>(
    core: &Core,
    key: &Key,
    now: &crate::core::LazyNow<'_>,
    see: impl FnOnce(Option<(&[u8], u64, Kind)>) -> T,
) -> Result<Option<T>> {
    crate::live::fold_locked(core, key, true)?;
    let seen = core.hot.current_seen(
        key.stored(),
        || now.get(),
        |value, expire_ms, tag, dirty| {
            let live = expire_ms == 0 || strata_format::is_live(expire_ms, now.get());
            debug_assert!(live || dirty, "DRAM answers only live clean entries");
            Ok(see(match live {
                true => Some((value, expire_ms, Kind::from_u8(tag)?)),
                false => None,
            }))
        },
    );
    seen.transpose()
}

/// The current value of `key` as DRAM or write-back knows it (its stripe lock held), for a
/// read-modify-write that may stay in write-back: `Some(Some((value, expiry, kind)))` if
/// live, `Some(None)` if write-back knows it is gone, `None` if only the warm store knows.
#[allow(clippy::type_complexity)]
pub(crate) fn current_locked(
    core: &Core,
    key: &Key,
    now: u64,
) -> Result<Option<Option<(Bytes, u64, Kind)>>> {
    // A write follows: a live value of the key is stored first, and let go.
    crate::live::fold_locked(core, key, true)?;
    let Some((value, expire_ms, tag, dirty)) = core.hot.current(key.stored(), now) else {
        return Ok(None);
    };
    let live = strata_format::is_live(expire_ms, now);
    debug_assert!(live || dirty, "DRAM answers only live clean entries");
    Ok(Some(live.then_some((
        value,
        expire_ms,
        Kind::from_u8(tag)?,
    ))))
}

/// Before a write that is not write-back's changes `key` (its stripe lock held): stores
/// and lets go the key's live value, writes the key's dirty value to the warm store, and
/// logs that the warm store answers for it now.
pub(crate) fn settle_locked(core: &Core, key: &Key) -> Result<()> {
    settle_many_locked(core, &[key])
}

/// [`settle_locked`] for many keys, all their stripes locked: their dirty values in one
/// batch.
pub(crate) fn settle_many_locked(core: &Core, keys: &[&Key]) -> Result<()> {
    for k in keys {
        crate::live::fold_locked(core, k, true)?;
    }
    settle_dirty_many_locked(core, keys)
}

/// Writes `change` to the warm store in place of `key`'s dirty value (its stripe lock
/// held): one batch, and only then the dirty entry made clean and the key's records void
/// (`SETTLED`). For a change newer than the dirty value, as a live value's fold is: with
/// its deltas in the log, settling the dirty value first would void them while the warm
/// store holds the older value, until the change lands. Acknowledged already: not held to
/// the hard limit. DRAM is the caller's to update (it still holds the old value, clean).
pub(crate) fn settle_into_locked(core: &Core, key: &Key, change: Change) -> Result<()> {
    let old = core.lookup(key, Want::Entry)?;
    let mut batch = core.warm.batch();
    let mut d = Counts::default();
    let staged = stage(core, key, old.as_ref(), change, &mut batch, &mut d)?;
    commit_acknowledged(core, staged.into_iter().collect(), batch, &d)?;
    let wb = &core.writeback;
    // A dirty key always has records: `mark_settled` makes its entry clean.
    if !wb.is_empty() && wb.has_records(key) {
        wb.mark_settled(key, true);
    }
    Ok(())
}

fn settle_dirty_many_locked(core: &Core, keys: &[&Key]) -> Result<()> {
    let wb = &core.writeback;
    if wb.is_empty() {
        return Ok(());
    }
    // Keys with records, each once (a pipeline may name a key twice): those with a dirty
    // value, and those whose value is settled already.
    let mut seen = std::collections::HashSet::new();
    let (mut dirty, mut clean) = (Vec::new(), Vec::new());
    for &k in keys.iter().filter(|k| seen.insert(**k)) {
        if wb.has_records(k) {
            match wb.get(k) {
                Some(d) => dirty.push((k, d)),
                None => clean.push(k),
            }
        }
    }
    // The keys' earlier records are void from here on: a `SETTLED` record each (written
    // with the dirty values'). Their slots stay set until their files are retired (other
    // keys may share them).
    if !dirty.is_empty() {
        write_dirty(core, &dirty, true)?;
    }
    for k in clean {
        wb.log.append(OP_SETTLED, 0, 0, k.stored(), b"");
    }
    Ok(())
}

/// Writes the dirty values `items` to the warm store as one batch; their stripes are
/// locked. Already acknowledged, they are not held to the hard limit, and DRAM keeps what
/// it has. With `records_void`, each key's log records are void (a `SETTLED` record).
fn write_dirty(core: &Core, items: &[(&Key, Dirty)], records_void: bool) -> Result<()> {
    let keys: Vec<&Key> = items.iter().map(|(k, _)| *k).collect();
    let olds = core.lookup_many(&keys)?;
    let mut batch = core.warm.batch();
    let mut d = Counts::default();
    let mut staged = Vec::with_capacity(items.len());
    let now = core.now_ms();
    for ((k, dirty), old) in items.iter().zip(olds) {
        give_way();
        if !dirty.is_live(now) {
            // Expired before it reached the warm store: it goes, as the sweep would.
            add(&core.counters.expired);
        }
        let change = Change::Put {
            kind: dirty.kind,
            value: dirty.value.clone(),
            expire_ms: dirty.expire_ms,
        };
        staged.extend(stage(core, k, old.as_ref(), change, &mut batch, &mut d)?);
    }
    commit_acknowledged(core, staged, batch, &d)?;
    for (k, _) in items {
        core.writeback.mark_settled(k, records_void);
    }
    Ok(())
}

/// Writes every dirty value to the warm store (before an operation that reads the warm
/// store as a whole; the live values folded first), a chunk of keys per batch. Returns how many it wrote.
pub(crate) fn settle_all(core: &Core) -> Result<u64> {
    crate::live::fold_all(core, crate::live::Fold::Stored)?;
    let mut written = 0;
    for keys in core.writeback.dirty_keys() {
        written += settle_keys(core, keys)?;
    }
    Ok(written)
}

/// Writes the dirty values of `keys` to the warm store, a chunk of keys per batch, in key
/// order: RocksDB inserts a batch's keys into its memtable from where the last one went, so
/// sorted keys skip most of the skiplist's search (at 1M random keys the search was 30% of
/// the server's time).
fn settle_keys(core: &Core, mut keys: Vec<Key>) -> Result<u64> {
    keys.sort_unstable_by(|a, b| a.stored().cmp(b.stored()));
    let mut written = 0;
    for chunk in keys.chunks(BATCH_KEYS_MAX) {
        give_way();
        let _locks = core.locks.lock_many(chunk.iter());
        // A live value whose changes only the log holds is stored whole first: the warm
        // store gets its newest state, and the deltas after it are never left without the
        // record they apply to.
        for k in chunk {
            crate::live::fold_locked(core, k, false)?;
        }
        let items: Vec<(&Key, Dirty)> = chunk
            .iter()
            .filter_map(|k| {
                give_way();
                Some((k, core.writeback.get(k)?))
            })
            .collect();
        if !items.is_empty() {
            write_dirty(core, &items, false)?;
            written += items.len() as u64;
        }
        for (k, _) in &items {
            core.live.unbase(k);
        }
    }
    Ok(written)
}

/// Writes the colder half (by priority in DRAM, so mostly the least recently written) of
/// each DRAM shard's dirty values to the warm store; they stay in DRAM as copies. Their log
/// records stay until a compaction retires their file. Returns how many values it wrote.
pub(crate) fn settle_colder_half(core: &Core) -> Result<u64> {
    let keys: Vec<Key> = (0..core.hot.shard_count())
        .flat_map(|shard| {
            give_way();
            core.hot.coldest_dirty_keys_in(shard, 0.5)
        })
        .filter_map(|k| Key::from_stored(&k).ok())
        .collect();
    let written = settle_keys(core, keys)?;
    add(&core.counters.write_back_settles);
    Ok(written)
}

/// A checkpoint: a new log file, every dirty value into the warm store, the warm store
/// synced, the older log files deleted. Returns how many values it wrote.
pub(crate) fn checkpoint(core: &Core) -> Result<u64> {
    let wb = &core.writeback;
    let _alone = wb.checkpointing.lock();
    *wb.last_checkpoint.lock() = Instant::now();
    let retired = wb.log.rotate()?;
    let written = settle_all(core)?;
    core.sync_values_and_log()?;
    wb.log.delete_through(retired)?;
    wb.forget_settled(retired);
    add(&core.counters.checkpoints);
    Ok(written)
}

/// A compaction: a new log file, every dirty value logged again into it, the older files
/// deleted; nothing goes to the warm store. One sequential write per dirty value instead of
/// a read and a write of the warm store: it bounds the log while the dirty values fit their
/// budget, and overwrites of a hot key keep coalescing in DRAM. Returns how many values it
/// logged again.
pub(crate) fn compact(core: &Core) -> Result<u64> {
    let wb = &core.writeback;
    let _alone = wb.checkpointing.lock();
    *wb.last_checkpoint.lock() = Instant::now();
    let retired = wb.log.rotate()?;
    let mut relogged = 0;
    for keys in wb.dirty_keys() {
        for chunk in keys.chunks(BATCH_KEYS_MAX) {
            // Under the keys' locks, so that no newer record of a key precedes this one.
            let _locks = core.locks.lock_many(chunk.iter());
            for k in chunk {
                give_way();
                // A live value with deltas in the retired files is logged whole here (what
                // DRAM holds is older than it).
                if crate::live::fold_locked(core, k, false)? {
                    relogged += 1;
                    continue;
                }
                if let Some(d) = wb.get(k) {
                    let gen =
                        wb.log
                            .append(OP_PUT, d.kind as u8, d.expire_ms, k.stored(), &d.value);
                    wb.note_record(k, gen);
                    relogged += 1;
                }
            }
        }
        // Hand what this shard logged to the OS as it goes (the log's buffer stays small),
        // behind the warm store's log as always.
        let upto = wb.log.mark();
        core.warm.store.flush_log()?;
        wb.log.write_out(upto, false)?;
    }
    // The new file is durable before the older ones go.
    let upto = wb.log.mark();
    core.sync_values_and_log()?;
    wb.log.write_out(upto, true)?;
    wb.log.delete_through(retired)?;
    wb.forget_settled(retired);
    add(&core.counters.hot_log_compactions);
    Ok(relogged)
}

/// Whether write-back's writes leave their records to [`log_unlogged`]: what a rewrite in
/// DRAM passes as not `logged`.
pub(crate) fn defers_log(core: &Core) -> bool {
    core.writeback.defers
}

/// Logs the value of every dirty key whose write logged nothing (`durability = none`), as
/// DRAM holds it now; whoever writes the log out calls it first (`HotLog::log_deferred`).
/// Each entry's shard is locked while its record is appended, so no write of the key, and
/// no `SETTLED` record of a settle (which unmarks the entry under that lock), falls between
/// the value read and its record. Stops once the log's buffer holds [`LOG_DRAIN_BYTES`]:
/// returns whether it logged them all (if not, the caller writes
/// the log out and calls again).
pub(crate) fn log_unlogged(core: &Core) -> bool {
    let log = &core.writeback.log;
    core.hot.drain_unlogged(|key, value, expire_ms, tag| {
        log.push(OP_PUT, tag, expire_ms, key, value).1 < LOG_DRAIN_BYTES
    })
}

/// `FLUSHALL` (every stripe locked): every entry goes, and the log says so.
pub(crate) fn flush_all_locked(core: &Core) {
    let wb = &core.writeback;
    wb.log.append(OP_FLUSHED, 0, 0, b"", b"");
    wb.clear();
    core.live.clear();
}

/// Opening: reads the hot log's files into dirty entries, then checkpoints them into the
/// warm store. A torn or damaged record ends its file (what follows it was never
/// acknowledged as durable beyond what the durability setting promises). Returns how many
/// values it replayed.
pub(crate) fn recover(core: &Core) -> Result<u64> {
    let wb = &core.writeback;
    // Each key's value, the file of its last record, and its deltas since the `PUT` (applied
    // once all files are read); and keys with a delta before any `PUT` (legitimate only
    // when one follows: a compaction logs a live value whole after deltas written since it
    // began).
    let mut values: HashMap<Key, (Dirty, u64, Vec<Bytes>)> = HashMap::new();
    let mut unbased: std::collections::HashSet<Key> = Default::default();
    for (gen, path) in wb.log.files()? {
        let bytes = std::fs::read(&path)
            .map_err(|e| Error::Storage(format!("cannot read {}: {e}", path.display())))?;
        let mut at = 0;
        while let Some((rec, next)) = decode(&bytes, at) {
            at = next;
            match rec.op {
                OP_PUT => {
                    let key = Key::from_stored(rec.key)?;
                    let dirty = Dirty {
                        kind: Kind::from_u8(rec.kind)?,
                        value: Bytes::copy_from_slice(rec.value),
                        expire_ms: rec.expire_ms,
                    };
                    unbased.remove(&key);
                    values.insert(key, (dirty, gen, Vec::new()));
                }
                OP_DELTA => {
                    let key = Key::from_stored(rec.key)?;
                    match values.get_mut(&key) {
                        Some((dirty, at, deltas)) => {
                            (dirty.expire_ms, *at) = (rec.expire_ms, gen);
                            deltas.push(Bytes::copy_from_slice(rec.value));
                        }
                        None => {
                            unbased.insert(key);
                        }
                    }
                }
                OP_SETTLED => {
                    let key = Key::from_stored(rec.key)?;
                    unbased.remove(&key);
                    values.remove(&key);
                }
                OP_FLUSHED => {
                    values.clear();
                    unbased.clear();
                }
                _ => break,
            }
        }
        if at < bytes.len() {
            tracing::warn!(
                file = %path.display(),
                dropped = bytes.len() - at,
                "hot log ends in a torn or damaged record; replayed what precedes it"
            );
        }
    }
    if !unbased.is_empty() {
        tracing::error!(
            keys = unbased.len(),
            "hot log has changes to collections whose whole value it lacks; those changes are lost"
        );
    }
    for (dirty, _, ds) in values.values_mut().filter(|(_, _, ds)| !ds.is_empty()) {
        let ds: Vec<&[u8]> = ds.iter().map(|d| &d[..]).collect();
        let value = strata_format::delta::apply(dirty.kind, &dirty.value, &ds)
            .map_err(|e| Error::Data(format!("hot log: a change to a collection: {e}")))?;
        dirty.value = Bytes::from(value);
    }
    let replayed = values.len() as u64;
    // What DRAM cannot hold (its budget shrank since) goes to the warm store at once.
    let mut apart = Vec::new();
    for (key, (dirty, gen, _)) in values {
        if !wb.put(&key, dirty.kind, &dirty.value, dirty.expire_ms, gen, true) {
            apart.push((key, dirty));
        }
    }
    for chunk in apart.chunks(BATCH_KEYS_MAX) {
        let items: Vec<(&Key, Dirty)> = chunk.iter().map(|(k, d)| (k, d.clone())).collect();
        write_dirty(core, &items, false)?;
    }
    if let Err(e) = checkpoint(core) {
        // The values stay dirty, served from here; their files stay until a checkpoint
        // writes them.
        tracing::warn!(error = %e, "checkpoint after replaying the hot log failed; retried later");
    }
    Ok(replayed)
}

struct Record<'a> {
    op: u8,
    kind: u8,
    expire_ms: u64,
    key: &'a [u8],
    value: &'a [u8],
}

fn encode(out: &mut Vec<u8>, op: u8, kind: u8, expire_ms: u64, key: &[u8], value: &[u8]) {
    let body_len = RECORD_HEAD_BYTES - 8 + key.len() + value.len();
    out.reserve(8 + body_len);
    out.extend_from_slice(&(body_len as u32).to_le_bytes());
    let crc_at = out.len();
    out.extend_from_slice(&[0; 4]);
    let body_at = out.len();
    out.push(op);
    out.push(kind);
    out.extend_from_slice(&expire_ms.to_le_bytes());
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(value);
    let crc = crc32c::crc32c(&out[body_at..]);
    out[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
}

/// The record at `at` of `bytes` and where the next one starts; `None` at the end, or at a
/// torn or damaged record.
fn decode(bytes: &[u8], at: usize) -> Option<(Record<'_>, usize)> {
    let u32_at = |i: usize| -> Option<u32> {
        Some(u32::from_le_bytes(bytes.get(i..i + 4)?.try_into().ok()?))
    };
    let body_len = u32_at(at)? as usize;
    let crc = u32_at(at + 4)?;
    let body = bytes.get(at + 8..(at + 8).checked_add(body_len)?)?;
    if body.len() < RECORD_HEAD_BYTES - 8 || crc32c::crc32c(body) != crc {
        return None;
    }
    let key_len = u32::from_le_bytes(body[10..14].try_into().ok()?) as usize;
    let key = body.get(14..14usize.checked_add(key_len)?)?;
    Some((
        Record {
            op: body[0],
            kind: body[1],
            expire_ms: u64::from_le_bytes(body[2..10].try_into().ok()?),
            key,
            value: &body[14 + key_len..],
        },
        at + 8 + body_len,
    ))
}

/// The hot log's files: records are appended to a buffer in the process, and written out
/// (and synced) by whoever makes writes durable.
pub(crate) struct HotLog {
    dir: PathBuf,
    state: Mutex<LogState>,
    /// Notified when the buffer passes [`LOG_BUFFER_BYTES_MAX`]: whoever writes the log out
    /// periodically does so now.
    pub(crate) full: tokio::sync::Notify,
    /// Held while writing to the current file, and while switching files.
    file: Mutex<LogFile>,
    file_bytes: AtomicU64,
    /// The generation of the file records go to now. Changed only by a rotation, under the
    /// state lock: a record pushed under that lock names the file it will be written to.
    gen: AtomicU64,
    /// Bytes of writes that left their records to the next tick (`durability = none`):
    /// every [`LOG_BUFFER_BYTES_MAX`] of them wake the task that writes the logs out, as
    /// records in the buffer would, so the warm store's own buffered log is handed to the
    /// OS as often as before.
    deferred_bytes: AtomicU64,
    /// Logs what DRAM holds unlogged: the live values' changes (`live::fold_all`) and the
    /// dirty values whose writes logged nothing ([`log_unlogged`]). Whoever writes the log
    /// out calls it first ([`HotLog::log_deferred`]), so what it writes covers every change
    /// before.
    deferred: std::sync::OnceLock<Box<dyn Fn() -> Result<bool> + Send + Sync>>,
    /// Set while a hand-off of the logs (`durability = none`) has run past half its period:
    /// clients' writes wait for it ([`HotLog::pace`]), so that it finishes within the
    /// period although it runs at the background work's priority. Set and cleared only by
    /// [`HotLog::begin_late`] and [`HotLog::end_late`].
    late: AtomicBool,
    /// Notified when a late hand-off ends.
    caught_up: tokio::sync::Notify,
}

struct LogState {
    buf: Vec<u8>,
    /// Bytes ever appended, and of those, taken out of `buf` to be written.
    appended: u64,
    taken: u64,
}

struct LogFile {
    file: File,
    /// Bytes were written to `file` since its last sync: a sync with none is skipped.
    unsynced: bool,
    /// Why a write or sync failed after its records left the buffer: those records may be
    /// lost, so no later write-out may report success (the group commit would acknowledge
    /// them); every one fails with this.
    broken: Option<String>,
}

impl LogFile {
    /// The error of an earlier failure, if any.
    fn check(&self) -> Result<()> {
        match &self.broken {
            Some(why) => Err(Error::Storage(why.clone())),
            None => Ok(()),
        }
    }

    /// Writes `chunk` (taken from the buffer) and, with `sync`, syncs the file; a failure
    /// breaks the log for good.
    fn write(&mut self, chunk: &[u8], sync: bool, dir: &Path) -> Result<()> {
        self.check()?;
        if !chunk.is_empty() {
            self.unsynced = true;
        }
        let done = self
            .file
            .write_all(chunk)
            .and_then(|()| match sync && self.unsynced {
                true => self.file.sync_data(),
                false => Ok(()),
            });
        match done {
            Ok(()) => {
                if sync {
                    self.unsynced = false;
                }
                Ok(())
            }
            Err(e) => {
                let e = io_error("write", dir, e);
                self.broken = Some(format!("the hot log failed earlier: {e}"));
                Err(e)
            }
        }
    }
}

fn file_name(gen: u64) -> String {
    format!("{gen:016x}.log")
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::Storage(format!("cannot {what} {}: {e}", path.display()))
}

impl HotLog {
    /// The running hand-off of the logs has passed half its period: clients' writes wait
    /// ([`HotLog::pace`]) until [`HotLog::end_late`].
    pub(crate) fn begin_late(&self) {
        self.late.store(true, Ordering::Release);
    }

    /// The hand-off ended: writes waiting in [`HotLog::pace`] go on.
    pub(crate) fn end_late(&self) {
        if self.late.swap(false, Ordering::AcqRel) {
            self.caught_up.notify_waiters();
        }
    }

    /// Waits, before a client's write, while the logs' hand-off is late ([`HotLog::late`]),
    /// at most `max`: the writes a late hand-off has yet to log stop growing, and it gets
    /// the CPU they would take.
    pub(crate) async fn pace(&self, max: std::time::Duration) -> bool {
        if !self.late.load(Ordering::Acquire) {
            return false;
        }
        let ended = self.caught_up.notified();
        tokio::pin!(ended);
        ended.as_mut().enable();
        if self.late.load(Ordering::Acquire) {
            let _ = tokio::time::timeout(max, ended).await;
        }
        true
    }

    fn open(dir: &Path) -> Result<HotLog> {
        std::fs::create_dir_all(dir).map_err(|e| io_error("create", dir, e))?;
        let mut log = HotLog {
            dir: dir.to_path_buf(),
            full: tokio::sync::Notify::new(),
            late: AtomicBool::new(false),
            caught_up: tokio::sync::Notify::new(),
            state: Mutex::new(LogState {
                buf: Vec::new(),
                appended: 0,
                taken: 0,
            }),
            file: Mutex::new(LogFile {
                file: File::open(dir).map_err(|e| io_error("open", dir, e))?,
                unsynced: false,
                broken: None,
            }),
            file_bytes: AtomicU64::new(0),
            gen: AtomicU64::new(0),
            deferred_bytes: AtomicU64::new(0),
            deferred: std::sync::OnceLock::new(),
        };
        let gen = log.files()?.last().map_or(0, |f| f.0) + 1;
        log.file.get_mut().file = log.create(gen)?;
        *log.gen.get_mut() = gen;
        Ok(log)
    }

    fn create(&self, gen: u64) -> Result<File> {
        let path = self.dir.join(file_name(gen));
        let f = File::options()
            .append(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| io_error("create", &path, e))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_error("sync", &self.dir, e))?;
        Ok(f)
    }

    /// The log files, oldest first.
    fn files(&self) -> Result<Vec<(u64, PathBuf)>> {
        let mut out = Vec::new();
        let dir = std::fs::read_dir(&self.dir).map_err(|e| io_error("list", &self.dir, e))?;
        for e in dir {
            let e = e.map_err(|e| io_error("list", &self.dir, e))?;
            let name = e.file_name();
            let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".log")) else {
                continue;
            };
            if let Ok(gen) = u64::from_str_radix(stem, 16) {
                out.push((gen, e.path()));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Appends one record to the buffer; returns the generation of the file it goes to.
    fn append(&self, op: u8, kind: u8, expire_ms: u64, key: &[u8], value: &[u8]) -> u64 {
        self.push(op, kind, expire_ms, key, value).0
    }

    /// [`HotLog::append`], also returning how many bytes the buffer holds now.
    fn push(&self, op: u8, kind: u8, expire_ms: u64, key: &[u8], value: &[u8]) -> (u64, usize) {
        let mut s = self.state.lock();
        let before = s.buf.len();
        encode(&mut s.buf, op, kind, expire_ms, key, value);
        s.appended += (s.buf.len() - before) as u64;
        if before < LOG_BUFFER_BYTES_MAX && s.buf.len() >= LOG_BUFFER_BYTES_MAX {
            self.full.notify_one();
        }
        (self.gen.load(Ordering::Relaxed), s.buf.len())
    }

    /// Counts `bytes` of a write whose record waits for the tick (see `deferred_bytes`).
    fn note_deferred(&self, bytes: usize) {
        let every = LOG_BUFFER_BYTES_MAX as u64;
        let before = self
            .deferred_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
        if before / every != (before + bytes as u64) / every {
            self.full.notify_one();
        }
    }

    /// The generation of the file records go to now.
    fn gen(&self) -> u64 {
        self.gen.load(Ordering::Acquire)
    }

    /// Sets what [`HotLog::log_deferred`] does (once, at open).
    pub(crate) fn set_deferred(&self, deferred: Box<dyn Fn() -> Result<bool> + Send + Sync>) {
        let _ = self.deferred.set(deferred);
    }

    /// Logs what DRAM holds unlogged (live values' changes, dirty values); call before
    /// [`HotLog::mark`] when writing the logs out for durability. False: it stopped with
    /// the buffer full; write the logs out (as always) and call it again.
    pub(crate) fn log_deferred(&self) -> Result<bool> {
        self.deferred.get().map_or(Ok(true), |f| f())
    }

    /// Where the log ends now: pass it to [`HotLog::write_out`] after the warm store's own
    /// log has been written out.
    pub(crate) fn mark(&self) -> u64 {
        self.state.lock().appended
    }

    /// Writes what was appended before `upto` to the current file, and with `sync` makes
    /// it durable.
    pub(crate) fn write_out(&self, upto: u64, sync: bool) -> Result<()> {
        let mut f = self.file.lock();
        let chunk = {
            let mut s = self.state.lock();
            let n = upto.saturating_sub(s.taken).min(s.buf.len() as u64) as usize;
            let rest = s.buf.split_off(n);
            s.taken += n as u64;
            std::mem::replace(&mut s.buf, rest)
        };
        f.write(&chunk, sync, &self.dir)?;
        self.file_bytes
            .fetch_add(chunk.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn file_bytes(&self) -> u64 {
        self.file_bytes.load(Ordering::Relaxed)
    }

    /// Writes out and syncs the current file, then starts the next one; returns the
    /// generation of the file it closed.
    fn rotate(&self) -> Result<u64> {
        let mut f = self.file.lock();
        // Before the buffer is taken: a broken log keeps its records there.
        f.check()?;
        // Only a rotation changes the generation, and rotations hold the file lock.
        let gen = self.gen.load(Ordering::Acquire);
        let next = self.create(gen + 1)?;
        // Records appended from here on name the new file, and are written to it.
        let chunk = {
            let mut s = self.state.lock();
            s.taken = s.appended;
            self.gen.store(gen + 1, Ordering::Release);
            std::mem::take(&mut s.buf)
        };
        f.unsynced = true;
        f.write(&chunk, true, &self.dir)?;
        f.file = next;
        f.unsynced = false;
        self.file_bytes.store(0, Ordering::Relaxed);
        Ok(gen)
    }

    /// Deletes the files of generations up to `gen`.
    fn delete_through(&self, gen: u64) -> Result<()> {
        for (g, path) in self.files()? {
            if g <= gen {
                std::fs::remove_file(&path).map_err(|e| io_error("delete", &path, e))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client's write waits while the hand-off is late and goes on when it ends (or after
    /// its longest wait); with the hand-off on time it does not wait at all.
    #[tokio::test]
    async fn writes_wait_while_the_log_hand_off_is_late() {
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(HotLog::open(dir.path()).unwrap());
        let long = std::time::Duration::from_secs(60);
        assert!(!log.pace(long).await, "on time: no wait");
        log.begin_late();
        let waiting = tokio::spawn({
            let log = Arc::clone(&log);
            async move { log.pace(long).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(
            !waiting.is_finished(),
            "a write waits while the hand-off is late"
        );
        log.end_late();
        let waited = tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
            .await
            .expect("the write goes on once the hand-off ends")
            .unwrap();
        assert!(waited);
        // A hand-off that never ends holds a write for the longest wait, no longer.
        log.begin_late();
        let short = std::time::Duration::from_millis(50);
        tokio::time::timeout(std::time::Duration::from_secs(10), log.pace(short))
            .await
            .expect("the wait is bounded");
    }

    #[test]
    fn records_read_back_and_a_torn_tail_ends_the_file() {
        let mut buf = Vec::new();
        encode(&mut buf, OP_PUT, 0, 42, b"key", b"value");
        encode(&mut buf, OP_SETTLED, 0, 0, b"key", b"");
        let (r, next) = decode(&buf, 0).unwrap();
        assert_eq!(
            (r.op, r.expire_ms, r.key, r.value),
            (OP_PUT, 42, &b"key"[..], &b"value"[..])
        );
        let (r, end) = decode(&buf, next).unwrap();
        assert_eq!((r.op, r.key), (OP_SETTLED, &b"key"[..]));
        assert_eq!(end, buf.len());
        assert!(decode(&buf, end).is_none());
        // A torn tail, and a flipped byte, each end the file.
        assert!(decode(&buf[..buf.len() - 1], next).is_none());
        let mut bad = buf.clone();
        bad[12] ^= 1;
        assert!(decode(&bad, 0).is_none());
    }

    /// A write-out that lost its records (taken from the buffer, then the write failed) may
    /// never be followed by one that reports success: the group commit would acknowledge
    /// the lost records. A write-out with nothing new skips the sync, and still fails.
    #[test]
    fn a_failed_write_out_fails_every_later_one() {
        let dir = tempfile::tempdir().unwrap();
        let log = HotLog::open(dir.path()).unwrap();
        log.append(OP_PUT, 0, 0, b"a", b"1");
        log.write_out(log.mark(), true).unwrap();
        log.write_out(log.mark(), true).unwrap();
        // The file's handle swapped for one that cannot be written.
        log.file.lock().file = File::open(dir.path().join(file_name(1))).unwrap();
        log.append(OP_PUT, 0, 0, b"b", b"2");
        assert!(log.write_out(log.mark(), true).is_err());
        let again = log.write_out(log.mark(), true).unwrap_err();
        assert!(again.to_string().contains("failed earlier"), "{again}");
        assert!(log.rotate().is_err());
    }
}
