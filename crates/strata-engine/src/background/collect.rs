//! Collection: orphan and empty segments are deleted, sparse ones rewritten; sealed
//! value-log files that are mostly garbage have their live entries moved to the newest file
//! and are deleted. Before anything is deleted, the batches that stopped pointing into it
//! and the values they wrote are synced, so nothing acknowledged can be lost with it.

use std::sync::Arc;

use bytes::Bytes;
use strata_format::{BlockRef, Key, Kind, SegmentBuilder, WarmRecord, WarmValue};

use crate::core::{key_of_entry, Core};
use crate::locks::BATCH_KEYS_MAX;
use crate::offload::give_way;
use crate::stats::add;
use crate::warm::SegmentMeta;
use crate::{Error, Result};

use super::demote::alloc_segment_id;

/// Deletes orphan and empty segments and rewrites sparse ones.
pub(crate) async fn segments(core: &Arc<Core>) -> Result<()> {
    let Ok(_gate) = core.gc_gate.try_write() else {
        return Ok(()); // a backup is copying segments
    };
    let me = Arc::clone(core);
    let (live, metas) = crate::offload::run("segment scan", move || {
        Ok::<_, Error>((me.warm.live_per_segment()?, me.warm.segments()?))
    })
    .await??;
    // The index entries that stopped pointing into these segments (overwrites, deletes,
    // values returned to the warm tier, rewrites), and the values that replaced them, must
    // be on disk before a segment goes.
    sync_values_and_log(core).await?;
    let next_id = *core.next_segment_id.lock();
    for id in core.cold.list_segments(core.settings.writer_epoch).await? {
        // Only a round allocates ids, and rounds never overlap (`Core::rounds`), so ids of
        // this writer's epoch below `next_id` without a record are orphans. Other writers'
        // segments (a bucket the nodes of a cluster share) are never listed here.
        if id < next_id && !metas.contains_key(&id) {
            core.cold.delete_segment(id).await?;
            add(&core.counters.segments_deleted);
        }
    }
    for (id, meta) in metas {
        let (count, bytes) = live.get(&id).copied().unwrap_or((0, 0));
        if count == 0 {
            let mut b = core.warm.batch();
            b.delete_segment(id);
            core.warm.write(b, false)?;
            core.cold.delete_segment(id).await?;
            add(&core.counters.segments_deleted);
        } else if (bytes as f64)
            < meta.value_bytes as f64 * core.settings.cold.segment_live_fraction_min
        {
            rewrite(core, id).await?;
        }
    }
    Ok(())
}

/// Makes the value log and the warm store's log durable (their fsyncs) on a background
/// thread: a runtime thread that waited for the disk would hold up its clients.
async fn sync_values_and_log(core: &Arc<Core>) -> Result<()> {
    let me = Arc::clone(core);
    crate::offload::run("sync", move || me.sync_values_and_log()).await?
}

/// Copies the live entries of segment `id` into a new segment, repoints their index
/// entries, and deletes the old segment.
async fn rewrite(core: &Arc<Core>, id: u64) -> Result<()> {
    let bytes = core.cold.get_segment(id).await?;
    let new_id = alloc_segment_id(core)?;
    let me = Arc::clone(core);
    let built = crate::offload::run("segment rewrite", move || {
        build_rewrite(&me, id, new_id, &bytes)
    })
    .await??;
    let Some((old_refs, segment)) = built else {
        return Ok(());
    };
    core.cold.put_segment(new_id, segment.bytes).await?;
    let me = Arc::clone(core);
    let refs = segment.refs;
    crate::offload::run("segment rewrite commit", move || {
        repoint(&me, id, new_id, &refs, &old_refs)
    })
    .await??;
    sync_values_and_log(core).await?;
    core.cold.delete_segment(id).await?;
    add(&core.counters.segments_rewritten);
    add(&core.counters.segments_written);
    add(&core.counters.segments_deleted);
    Ok(())
}

/// Points the index entries of the rewritten keys at the new segment, each only if it
/// still points where the old segment had it; a batch of at most [`BATCH_KEYS_MAX`] keys
/// at a time, each under its keys' locks. The old segment's record goes last.
fn repoint(
    core: &Core,
    id: u64,
    new_id: u64,
    refs: &[(Vec<u8>, BlockRef)],
    old: &[BlockRef],
) -> Result<()> {
    let keys: Vec<Key> = refs
        .iter()
        .map(|(k, _)| Key::from_stored(k))
        .collect::<std::result::Result<_, _>>()?;
    let mut done = SegmentMeta::default();
    for (i, ks) in keys.chunks(BATCH_KEYS_MAX).enumerate() {
        let at = i * BATCH_KEYS_MAX;
        let _locks = core.locks.lock_many(ks.iter());
        let mut batch = core.warm.batch();
        if i == 0 {
            // The new segment's record goes with its first index entries, counting every
            // entry until the end says how many moved.
            batch.put_segment(new_id, SegmentMeta::of(refs));
        }
        for ((key, (_, new_ref)), old_ref) in ks.iter().zip(&refs[at..]).zip(&old[at..]) {
            give_way();
            let Some(cur) = core.warm.cold_ref(key)? else {
                continue;
            };
            if cur.segment_id != old_ref.segment_id || cur.block != old_ref.block {
                continue;
            }
            let mut r = *new_ref;
            r.expire_ms = cur.expire_ms;
            batch.put_cold(key, &r);
            done.entries += 1;
            done.value_bytes += r.value_len as u64;
        }
        core.warm.write(batch, false)?;
    }
    let mut batch = core.warm.batch();
    batch.put_segment(new_id, done);
    batch.delete_segment(id);
    core.warm.write(batch, false)
}

type Rewrite = (Vec<BlockRef>, strata_format::Segment);

/// Packs the entries of segment `id` that the index still points at into segment `new_id`
/// (as stored keys, whatever layout the old segment had).
fn build_rewrite(core: &Core, id: u64, new_id: u64, bytes: &Bytes) -> Result<Option<Rewrite>> {
    let footer = strata_format::decode_footer(bytes)?;
    if footer.segment_id != id {
        return Err(Error::Data(format!(
            "segment {id:016x} carries id {:016x}",
            footer.segment_id
        )));
    }
    let s = &core.settings.cold;
    let mut b = SegmentBuilder::new(new_id, s.block_bytes, s.zstd_level);
    let mut old_refs = Vec::new();
    for (i, fb) in footer.blocks.iter().enumerate() {
        let probe = footer.block_ref(i, Kind::String, 0, 0);
        let stored = &bytes[fb.offset as usize..(fb.offset + fb.len as u64) as usize];
        let raw = strata_format::decode_block(&probe, stored)?;
        for e in strata_format::iter_block(&raw) {
            give_way();
            let e = e?;
            let key = key_of_entry(&probe, e.key)?;
            let Some(cur) = core.warm.cold_ref(&key)? else {
                continue;
            };
            if cur.segment_id == id && cur.block == i as u32 {
                b.push(e.kind, key.stored(), e.value, e.expire_ms)?;
                old_refs.push(cur);
            }
        }
    }
    if b.is_empty() {
        return Ok(None);
    }
    Ok(Some((old_refs, b.finish()?)))
}

/// Rewrites the live entries of sealed value-log files that are mostly garbage into the
/// newest file, then deletes the old files.
pub(crate) async fn value_log(core: &Arc<Core>) -> Result<()> {
    core.vlog.release_retired();
    let Ok(_gate) = core.gc_gate.try_write() else {
        return Ok(()); // a backup is copying value-log files
    };
    let me = Arc::clone(core);
    crate::offload::run("value log collection", move || value_log_files(&me)).await?
}

fn value_log_files(core: &Core) -> Result<()> {
    let garbage = core.warm.vlog_garbage()?;
    let active = core.vlog.active_id();
    let files = core.vlog.files()?;
    let mut done = Vec::new();
    for &(id, len) in files.iter().filter(|f| f.0 < active) {
        let g = garbage.get(&id).copied().unwrap_or(0);
        if (g as f64) < len as f64 * core.settings.vlog.vlog_garbage_fraction_max {
            continue;
        }
        if move_live_entries(core, id)? {
            done.push(id);
        }
    }
    // Counts of files that are gone (a crash after a deletion) go too.
    let mut b = core.warm.batch();
    for id in garbage
        .keys()
        .filter(|id| files.binary_search_by_key(*id, |f| f.0).is_err())
    {
        b.drop_vlog_garbage(*id);
    }
    if !done.is_empty() {
        // The moved values, then the records that point at them, are durable before the
        // files they left are deleted.
        core.sync_values_and_log()?;
        for &id in &done {
            core.vlog.remove_file(id)?;
            b.drop_vlog_garbage(id);
            add(&core.counters.vlog_files_collected);
        }
        // The deletions are durable before their garbage counts go: a file that came back
        // after a crash without its count would never look collectable.
        core.vlog.sync_dir()?;
    }
    if b.is_empty() {
        return Ok(());
    }
    core.warm.write(b, false)
}

/// Moves the entries of value-log file `id` that a record still points at to the newest
/// file; says whether the file may go (false if an entry failed its checksum: the record
/// still points there, and its bytes are evidence).
fn move_live_entries(core: &Core, id: u64) -> Result<bool> {
    let mut intact = true;
    for (key, at) in core.vlog.entries(id)? {
        let _g = core.locks.lock(&key);
        let rec = core.warm.record(&key)?;
        let rec = rec
            .as_deref()
            .map(WarmRecord::decode_unverified)
            .transpose()?;
        let Some(rec) = rec.filter(|r| r.value == WarmValue::Logged(at)) else {
            // A dead entry. DRAM may still hold its value as a view of this file's map (a
            // value demoted while in DRAM, or expired): that would keep the deleted file's
            // disk space for as long as DRAM holds it, so DRAM gets a copy.
            let now = core.now_ms();
            core.hot
                .copy_clean_if(key.stored(), now, |v| core.vlog.lies_in(id, v));
            continue;
        };
        let value = core.vlog.read(at)?;
        if let Err(e) = rec.verify(key.client(), &value) {
            add(&core.counters.checksum_errors);
            tracing::error!(key = ?key, error = %e, "logged value failed its checksum; file not collected");
            intact = false;
            continue;
        }
        let moved = core.vlog.append(&key, &value)?;
        let mut b = core.warm.batch();
        let (kind, expire_ms) = (rec.kind, rec.expire_ms);
        let rec = WarmRecord::encode_logged(kind, expire_ms, rec.write_seq, rec.checksum, moved);
        b.put_record(&key, &rec);
        core.warm.write(b, false)?;
        // DRAM's copy of a logged value is a view of the file's map, which would keep the
        // deleted file's disk space for as long as DRAM holds the value: it follows the move.
        if let Ok(v) = core.vlog.read(moved) {
            core.hot
                .replace_clean(key.stored(), v, expire_ms, kind as u8);
        }
    }
    Ok(intact)
}
