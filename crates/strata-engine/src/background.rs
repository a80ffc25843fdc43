//! Background work, one task per engine: expire due keys, demote warm entries to the cold
//! tier when warm is over budget, and collect or rewrite segments.
//!
//! Demotion never removes data before its index entry exists: the segment is uploaded
//! first, and only then one write batch deletes the warm records and writes the index
//! entries. A crash in between leaves an orphan segment, which [`collect_segments`] deletes.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rocksdb::WriteBatch;
use strata_format::{BlockRef, SegmentBuilder, WarmRecord, WarmValue, WARM_HEADER_BYTES};
use tokio::sync::watch;

use crate::engine::{warm_charge, Inner};
use crate::stats::add;
use crate::warm::{self, segment_meta_key, SegmentMeta, CF_DATA, CF_INDEX, CF_META, CF_TTL};
use crate::{Error, Result};

/// Segment collection runs on every this many rounds.
const COLLECT_EVERY_ROUNDS: u64 = 30;

pub(crate) async fn run(inner: Arc<Inner>, mut shutdown: watch::Receiver<bool>) {
    let mut rounds = 0u64;
    let mut backoff_ms = inner.opts.background_interval_ms;
    loop {
        let wait = Duration::from_millis(backoff_ms.max(1));
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tokio::time::sleep(wait) => {}
            _ = inner.background_wake.notified() => {}
        }
        if *shutdown.borrow() {
            return;
        }
        rounds += 1;
        match round(&inner, rounds % COLLECT_EVERY_ROUNDS == 1).await {
            Ok(_) => backoff_ms = inner.opts.background_interval_ms,
            Err(e) => {
                add(&inner.counters.demotion_errors);
                // Exponential, capped at 30 s or 100 rounds' worth of interval.
                let cap = inner
                    .opts
                    .background_interval_ms
                    .saturating_mul(100)
                    .min(30_000);
                backoff_ms = (backoff_ms * 2).min(cap.max(1));
                tracing::warn!(error = %e, retry_ms = backoff_ms, "background round failed; will retry");
            }
        }
    }
}

/// One round: expire, demote until under budget, optionally collect segments.
pub(crate) async fn round(inner: &Arc<Inner>, collect: bool) -> Result<u64> {
    sweep_expired(inner)?;
    let now = inner.now_ms();
    inner.leases.lock().retain(|_, &mut until| until > now);
    let mut demoted = 0;
    loop {
        let n = demote_once(inner).await?;
        demoted += n;
        if n == 0 {
            break;
        }
    }
    if collect {
        collect_segments(inner).await?;
        collect_value_log(inner).await?;
    }
    Ok(demoted)
}

fn sweep_expired(inner: &Inner) -> Result<()> {
    let now = inner.now_ms();
    let mut due = Vec::new();
    {
        let mut it = inner.warm.db.raw_iterator_cf(inner.warm.cf(CF_TTL));
        it.seek_to_first();
        while it.valid() && due.len() < inner.opts.expire_sweep_count_max {
            let k = it.key().expect("valid iterator");
            if k.len() < 8 {
                it.next();
                continue;
            }
            let at = u64::from_be_bytes(k[..8].try_into().expect("8 bytes"));
            if at > now {
                break;
            }
            due.push((at, k[8..].to_vec()));
            it.next();
        }
    }
    for (at, key) in due {
        inner.expire_if_due(&key, at)?;
    }
    Ok(())
}

struct Victim {
    key: Vec<u8>,
    header: [u8; WARM_HEADER_BYTES],
    value: Bytes,
    expire_ms: u64,
    charge: u64,
}

/// Walks the warm tier like a clock hand from where it stopped last, sparing keys with
/// access counts left (each pass takes one away, so a key read n times survives n passes)
/// and keys already expired (the sweeper removes those).
fn pick_victims(inner: &Inner, bytes_to_free: u64) -> Vec<Victim> {
    let now = inner.now_ms();
    let mut cursor = inner.demote_cursor.lock();
    let start = cursor.clone();
    let mut out = Vec::new();
    let mut freed = 0u64;
    let mut raw = 0u64;
    let mut it = inner.warm.db.raw_iterator_cf(inner.warm.cf(CF_DATA));
    it.seek(&start);
    // A full cycle runs from `start` to the end, then from the first key back to `start`.
    // Pass 0 takes one access count from each key and spares those that had any (so a key
    // survives as many passes as it had recent reads); pass 1 takes what pass 0 spared.
    let mut wrapped = false;
    let mut passes = 0;
    loop {
        if !it.valid() {
            if wrapped {
                break;
            }
            wrapped = true;
            it.seek_to_first();
            continue;
        }
        let key = it.key().expect("valid iterator");
        if wrapped && key >= start.as_slice() {
            passes += 1;
            if passes >= 2 {
                break;
            }
            wrapped = false;
            it.seek(&start);
            continue;
        }
        let bytes = it.value().expect("valid iterator");
        match WarmRecord::decode(key, bytes) {
            Ok(rec) if rec.expire_ms != 0 && rec.expire_ms <= now => {}
            Ok(_) if inner.is_pinned(key) || inner.is_leased(key, now) => {}
            Ok(_) if passes == 0 && inner.access.take(key) => {}
            Ok(rec) => match victim_value(inner, key, &rec) {
                Ok(value) => {
                    let mut header = [0u8; WARM_HEADER_BYTES];
                    header.copy_from_slice(&bytes[..WARM_HEADER_BYTES]);
                    let charge = warm_charge(key, value.len() as u64);
                    freed += charge;
                    raw += value.len() as u64 + key.len() as u64;
                    out.push(Victim {
                        key: key.to_vec(),
                        header,
                        value,
                        expire_ms: rec.expire_ms,
                        charge,
                    });
                }
                Err(e) => {
                    add(&inner.counters.checksum_errors);
                    tracing::error!(key = %String::from_utf8_lossy(key), error = %e, "logged value failed its checksum; not demoted");
                }
            },
            Err(e) => {
                add(&inner.counters.checksum_errors);
                tracing::error!(key = %String::from_utf8_lossy(key), error = %e, "warm record failed its checksum; not demoted");
            }
        }
        it.next();
        if freed >= bytes_to_free || raw >= inner.opts.segment_bytes_max {
            break;
        }
    }
    *cursor = if it.valid() {
        it.key().expect("valid").to_vec()
    } else {
        Vec::new()
    };
    out
}

/// A victim's value: copied out of an inline record, or the verified value-log bytes.
fn victim_value(inner: &Inner, key: &[u8], rec: &WarmRecord<'_>) -> Result<Bytes> {
    match rec.value {
        WarmValue::Inline(v) => Ok(Bytes::copy_from_slice(v)),
        WarmValue::Logged(at) => inner.vlog.read_checked(key, rec, at),
    }
}

fn alloc_segment_id(inner: &Inner) -> Result<u64> {
    let mut next = inner.next_segment_id.lock();
    let id = *next;
    *next += 1;
    inner.warm.db.put_cf(
        inner.warm.cf(CF_META),
        warm::NEXT_SEGMENT_ID,
        (*next as i64).to_le_bytes(),
    )?;
    Ok(id)
}

/// Demotes one segment's worth of victims; returns how many keys moved.
async fn demote_once(inner: &Arc<Inner>) -> Result<u64> {
    let warm_bytes = inner.counters.warm_bytes.load(Ordering::Relaxed).max(0) as u64;
    if warm_bytes <= inner.opts.warm_bytes_max {
        return Ok(0);
    }
    let target = (inner.opts.warm_bytes_max as f64 * inner.opts.warm_demote_to_fraction) as u64;
    let to_free = warm_bytes - target;
    let me = Arc::clone(inner);
    let mut victims = tokio::task::spawn_blocking(move || pick_victims(&me, to_free))
        .await
        .map_err(|e| Error::Internal(format!("victim scan: {e}")))?;
    if victims.is_empty() {
        return Ok(0);
    }
    victims.sort_by(|a, b| a.key.cmp(&b.key));
    victims.dedup_by(|a, b| a.key == b.key);
    let id = alloc_segment_id(inner)?;
    let (block_bytes, level) = (inner.opts.block_bytes, inner.opts.zstd_level);
    let (victims, segment) = tokio::task::spawn_blocking(move || {
        let mut b = SegmentBuilder::new(id, block_bytes, level);
        for v in &victims {
            b.push(&v.key, &v.value, v.expire_ms)?;
        }
        Ok::<_, Error>((victims, b.finish()?))
    })
    .await
    .map_err(|e| Error::Internal(format!("segment build: {e}")))??;
    inner.cold.put_segment(id, segment.bytes).await?;
    add(&inner.counters.segments_written);

    // The segment is durable in the object store; now swap warm records for index entries.
    let me = Arc::clone(inner);
    let refs = segment.refs;
    let moved = tokio::task::spawn_blocking(move || commit_demotion(&me, id, &victims, &refs))
        .await
        .map_err(|e| Error::Internal(format!("demotion commit: {e}")))??;
    if moved == 0 {
        inner.cold.delete_segment(id).await.ok();
        add(&inner.counters.segments_deleted);
    }
    inner.counters.demotions.fetch_add(moved, Ordering::Relaxed);
    Ok(moved)
}

fn commit_demotion(
    inner: &Inner,
    id: u64,
    victims: &[Victim],
    refs: &[(Vec<u8>, BlockRef)],
) -> Result<u64> {
    let _locks = inner.lock_many(victims.iter().map(|v| v.key.as_slice()));
    let w = &inner.warm;
    let mut batch = WriteBatch::default();
    let (mut warm_bytes, mut cold_bytes, mut moved) = (0i64, 0i64, 0i64);
    for (v, (k, r)) in victims.iter().zip(refs) {
        assert_eq!(&v.key, k, "segment refs follow the victims' order");
        let current = w.db.get_pinned_cf(w.cf(CF_DATA), &v.key)?;
        // A write after the victim was picked changed the record: keep the new one warm.
        if current
            .as_deref()
            .map(|c| &c[..WARM_HEADER_BYTES.min(c.len())])
            != Some(&v.header[..])
        {
            continue;
        }
        if let Some(WarmValue::Logged(at)) = current
            .as_deref()
            .and_then(|c| WarmRecord::decode_unverified(c).ok())
            .map(|rec| rec.value)
        {
            w.add_vlog_garbage(&mut batch, &v.key, at);
        }
        batch.delete_cf(w.cf(CF_DATA), &v.key);
        batch.put_cf(w.cf(CF_INDEX), &v.key, r.encode());
        warm_bytes += v.charge as i64;
        cold_bytes += r.value_len as i64;
        moved += 1;
    }
    if moved > 0 {
        let meta = SegmentMeta {
            entries: moved as u64,
            value_bytes: cold_bytes as u64,
        };
        batch.put_cf(w.cf(CF_META), segment_meta_key(id), meta.encode());
    }
    inner.commit_moves(batch, (warm_bytes, moved), (cold_bytes, moved))?;
    Ok(moved as u64)
}

/// Live entries and value bytes per segment, counted from the index.
fn live_per_segment(inner: &Inner) -> Result<HashMap<u64, (u64, u64)>> {
    let mut live: HashMap<u64, (u64, u64)> = HashMap::new();
    let mut it = inner.warm.db.raw_iterator_cf(inner.warm.cf(CF_INDEX));
    it.seek_to_first();
    while it.valid() {
        let r = BlockRef::decode(it.value().expect("valid iterator"))?;
        let e = live.entry(r.segment_id).or_default();
        e.0 += 1;
        e.1 += r.value_len as u64;
        it.next();
    }
    it.status()?;
    Ok(live)
}

pub(crate) fn segment_metas(inner: &Inner) -> Result<HashMap<u64, SegmentMeta>> {
    let mut out = HashMap::new();
    let mut it = inner.warm.db.raw_iterator_cf(inner.warm.cf(CF_META));
    it.seek(warm::SEGMENT_PREFIX);
    while it.valid() {
        let k = it.key().expect("valid iterator");
        if !k.starts_with(warm::SEGMENT_PREFIX) || k.len() != warm::SEGMENT_PREFIX.len() + 8 {
            break;
        }
        let id = u64::from_be_bytes(k[warm::SEGMENT_PREFIX.len()..].try_into().expect("8 bytes"));
        if let Some(m) = SegmentMeta::decode(it.value().expect("valid")) {
            out.insert(id, m);
        }
        it.next();
    }
    Ok(out)
}

/// Deletes orphan and empty segments and rewrites sparse ones.
pub(crate) async fn collect_segments(inner: &Arc<Inner>) -> Result<()> {
    let Ok(_gate) = inner.gc_gate.try_write() else {
        return Ok(()); // a backup is copying segments
    };
    let me = Arc::clone(inner);
    let (live, metas) = tokio::task::spawn_blocking(move || {
        Ok::<_, Error>((live_per_segment(&me)?, segment_metas(&me)?))
    })
    .await
    .map_err(|e| Error::Internal(format!("segment scan: {e}")))??;
    // The index entries that stopped pointing into these segments (overwrites, deletes,
    // values returned to the warm tier, rewrites), and the values that replaced them, must
    // be on disk before a segment goes.
    inner.sync_values_and_wal()?;
    let next_id = *inner.next_segment_id.lock();
    for id in inner.cold.list_segments().await? {
        // Only this task allocates ids, so ids below `next_id` without a record are orphans.
        if id < next_id && !metas.contains_key(&id) {
            inner.cold.delete_segment(id).await?;
            add(&inner.counters.segments_deleted);
        }
    }
    for (id, meta) in metas {
        let (count, bytes) = live.get(&id).copied().unwrap_or((0, 0));
        if count == 0 {
            inner
                .warm
                .db
                .delete_cf(inner.warm.cf(CF_META), segment_meta_key(id))?;
            inner.cold.delete_segment(id).await?;
            add(&inner.counters.segments_deleted);
        } else if (bytes as f64) < meta.value_bytes as f64 * inner.opts.segment_live_fraction_min {
            rewrite_segment(inner, id).await?;
        }
    }
    Ok(())
}

/// Rewrites the live entries of sealed value-log files that are mostly garbage into the
/// newest file, then deletes the old files.
pub(crate) async fn collect_value_log(inner: &Arc<Inner>) -> Result<()> {
    inner.vlog.release_retired();
    let Ok(_gate) = inner.gc_gate.try_write() else {
        return Ok(()); // a backup is copying value-log files
    };
    let me = Arc::clone(inner);
    tokio::task::spawn_blocking(move || collect_value_log_files(&me))
        .await
        .map_err(|e| Error::Internal(format!("value log collection: {e}")))?
}

fn collect_value_log_files(inner: &Inner) -> Result<()> {
    let w = &inner.warm;
    let garbage = w.vlog_garbage()?;
    let active = inner.vlog.active_id();
    let files = inner.vlog.files()?;
    let mut done = Vec::new();
    for &(id, len) in files.iter().filter(|f| f.0 < active) {
        let g = garbage.get(&id).copied().unwrap_or(0);
        if (g as f64) < len as f64 * inner.opts.vlog_garbage_fraction_max {
            continue;
        }
        let mut intact = true;
        for (key, at) in inner.vlog.entries(id)? {
            let _g = inner.lock(&key);
            let Some(p) = w.db.get_pinned_cf(w.cf(CF_DATA), &key)? else {
                continue;
            };
            let rec = WarmRecord::decode_unverified(&p)?;
            if rec.value != WarmValue::Logged(at) {
                continue;
            }
            let value = inner.vlog.read(at)?;
            if let Err(e) = rec.verify(&key, &value) {
                // Keep the file: the record still points at it, and its bytes are evidence.
                add(&inner.counters.checksum_errors);
                tracing::error!(key = %String::from_utf8_lossy(&key), error = %e, "logged value failed its checksum; file not collected");
                intact = false;
                continue;
            }
            let moved = inner.vlog.append(&key, &value)?;
            let mut b = WriteBatch::default();
            let rec = WarmRecord::encode_logged(rec.expire_ms, rec.write_seq, rec.checksum, moved);
            b.put_cf(w.cf(CF_DATA), &key, rec);
            w.write(b, false)?;
        }
        if intact {
            done.push(id);
        }
    }
    // Counts of files that are gone (a crash after a deletion) go too.
    let mut b = WriteBatch::default();
    for id in garbage
        .keys()
        .filter(|id| files.binary_search_by_key(*id, |f| f.0).is_err())
    {
        w.drop_vlog_garbage(&mut b, *id);
    }
    if !done.is_empty() {
        // The moved values, then the records that point at them, are durable before the
        // files they left are deleted.
        inner.sync_values_and_wal()?;
        for &id in &done {
            inner.vlog.remove_file(id)?;
            w.drop_vlog_garbage(&mut b, id);
            add(&inner.counters.vlog_files_collected);
        }
        // The deletions are durable before their garbage counts go: a file that came back
        // after a crash without its count would never look collectable.
        inner.vlog.sync_dir()?;
    }
    w.write(b, false)
}

/// Copies the live entries of segment `id` into a new segment, repoints their index
/// entries, and deletes the old segment.
async fn rewrite_segment(inner: &Arc<Inner>, id: u64) -> Result<()> {
    let bytes = inner.cold.get_segment(id).await?;
    let new_id = alloc_segment_id(inner)?;
    let me = Arc::clone(inner);
    let built = tokio::task::spawn_blocking(move || build_rewrite(&me, id, new_id, &bytes))
        .await
        .map_err(|e| Error::Internal(format!("segment rewrite: {e}")))??;
    let Some((old_refs, segment)) = built else {
        return Ok(());
    };
    inner.cold.put_segment(new_id, segment.bytes).await?;
    let me = Arc::clone(inner);
    let refs = segment.refs;
    tokio::task::spawn_blocking(move || {
        let _locks = me.lock_many(refs.iter().map(|(k, _)| k.as_slice()));
        let w = &me.warm;
        let mut batch = WriteBatch::default();
        let (mut n, mut bytes) = (0u64, 0u64);
        for ((key, new_ref), old_ref) in refs.iter().zip(&old_refs) {
            let cur = w.db.get_pinned_cf(w.cf(CF_INDEX), key)?;
            let Some(cur) = cur.map(|c| BlockRef::decode(&c)).transpose()? else {
                continue;
            };
            if cur.segment_id != old_ref.segment_id || cur.block != old_ref.block {
                continue;
            }
            let mut r = *new_ref;
            r.expire_ms = cur.expire_ms;
            batch.put_cf(w.cf(CF_INDEX), key, r.encode());
            n += 1;
            bytes += r.value_len as u64;
        }
        batch.put_cf(
            w.cf(CF_META),
            segment_meta_key(new_id),
            SegmentMeta {
                entries: n,
                value_bytes: bytes,
            }
            .encode(),
        );
        batch.delete_cf(w.cf(CF_META), segment_meta_key(id));
        w.write(batch, false)
    })
    .await
    .map_err(|e| Error::Internal(format!("segment rewrite commit: {e}")))??;
    inner.sync_values_and_wal()?;
    inner.cold.delete_segment(id).await?;
    add(&inner.counters.segments_rewritten);
    add(&inner.counters.segments_written);
    add(&inner.counters.segments_deleted);
    Ok(())
}

type Rewrite = (Vec<BlockRef>, strata_format::Segment);

fn build_rewrite(inner: &Inner, id: u64, new_id: u64, bytes: &Bytes) -> Result<Option<Rewrite>> {
    let footer = strata_format::decode_footer(bytes)?;
    if footer.segment_id != id {
        return Err(Error::Data(format!(
            "segment {id:016x} carries id {:016x}",
            footer.segment_id
        )));
    }
    let w = &inner.warm;
    let mut b = SegmentBuilder::new(new_id, inner.opts.block_bytes, inner.opts.zstd_level);
    let mut old_refs = Vec::new();
    for (i, fb) in footer.blocks.iter().enumerate() {
        let probe = footer.block_ref(i, 0, 0);
        let stored = &bytes[fb.offset as usize..(fb.offset + fb.len as u64) as usize];
        let raw = strata_format::decode_block(&probe, stored)?;
        for e in strata_format::iter_block(&raw) {
            let e = e?;
            let Some(cur) = w.db.get_pinned_cf(w.cf(CF_INDEX), e.key)? else {
                continue;
            };
            let cur = BlockRef::decode(&cur)?;
            if cur.segment_id == id && cur.block == i as u32 {
                b.push(e.key, e.value, e.expire_ms)?;
                old_refs.push(cur);
            }
        }
    }
    if b.is_empty() {
        return Ok(None);
    }
    Ok(Some((old_refs, b.finish()?)))
}
