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

pub(crate) mod log;
pub(crate) mod state;

use bytes::Bytes;
use strata_format::{Key, Kind};

use crate::commit::{commit_acknowledged, stage, Change};
use crate::core::Core;
use crate::durability::Ticket;
use crate::offload::give_way;
use crate::stats::add;
use crate::warm::{Counts, Want};
use crate::Result;
use log::{OP_DELTA, OP_FLUSHED, OP_PUT, OP_SETTLED};
use state::Dirty;

/// Bytes of records a tick's logging of unlogged values buffers before it writes them out
/// (a tick may log a second's worth of writes: in small steps, the buffer stays small).
const LOG_DRAIN_BYTES: usize = 1 << 20;
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
    core.changed(key);
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

pub(crate) fn settle_dirty_many_locked(core: &Core, keys: &[&Key]) -> Result<()> {
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
pub(crate) fn write_dirty(core: &Core, items: &[(&Key, Dirty)], records_void: bool) -> Result<()> {
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
