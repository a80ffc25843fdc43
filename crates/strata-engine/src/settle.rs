//! Settling: write-back's dirty values written to the warm store, each key's live value
//! folded first (so the warm store gets its newest state), and what keeps the hot log short:
//! a checkpoint writes every dirty value out, a compaction logs them again into a new file,
//! and opening replays the files.

use std::collections::HashMap;
use std::time::Instant;

use bytes::Bytes;
use strata_format::{Key, Kind};

use crate::core::Core;
use crate::locks::BATCH_KEYS_MAX;
use crate::offload::give_way;
use crate::stats::add;
use crate::writeback::log::{decode, OP_DELTA, OP_FLUSHED, OP_PUT, OP_SETTLED};
use crate::writeback::state::Dirty;
use crate::writeback::{settle_dirty_many_locked, write_dirty};
use crate::{Error, Result};

/// [`current_locked`] that lends the value to `see` (`None`: write-back knows the key is
/// gone) instead of copying it; `None` if only the warm store knows.
pub(crate) fn current_seen_locked<T>(
    core: &Core,
    key: &Key,
    now: &crate::core::LazyNow<'_>,
    see: impl FnOnce(Option<(&[u8], u64, Kind)>) -> T,
) -> Result<Option<T>> {
    crate::fold::fold_locked(core, key, true)?;
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
    crate::fold::fold_locked(core, key, true)?;
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
        crate::fold::fold_locked(core, k, true)?;
    }
    settle_dirty_many_locked(core, keys)
}

/// Writes every dirty value to the warm store (before an operation that reads the warm
/// store as a whole; the live values folded first), a chunk of keys per batch. Returns how many it wrote.
pub(crate) fn settle_all(core: &Core) -> Result<u64> {
    crate::fold::fold_all(core, crate::fold::Fold::Stored)?;
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
            crate::fold::fold_locked(core, k, false)?;
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
                if crate::fold::fold_locked(core, k, false)? {
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
