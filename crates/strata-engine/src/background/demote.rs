//! Demotion: when the warm tier passes `warm_bytes_max`, a clock hand over the warm records
//! picks victims, they are packed sorted into a segment, the segment is uploaded, and only
//! then one batch swaps their warm records for cold index entries. A crash in between
//! leaves an orphan segment, which collection deletes; never a lost key.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use strata_format::{
    BlockRef, Key, Kind, SegmentBuilder, WarmRecord, WarmValue, WARM_HEADER_BYTES,
};
use strata_warm::{Bounds, Family};

use crate::commit::commit_batch;
use crate::core::Core;
use crate::locks::BATCH_KEYS_MAX;
use crate::offload::give_way;
use crate::pins::is_pinned;
use crate::stats::add;
use crate::warm::{warm_charge, Counts, SegmentMeta};
use crate::{Error, Result};

struct Victim {
    key: Key,
    kind: Kind,
    /// The record's header when picked: the swap happens only if it is unchanged.
    header: [u8; WARM_HEADER_BYTES],
    value: Bytes,
    expire_ms: u64,
    charge: u64,
}

/// Walks the warm records like a clock hand from where it stopped last, sparing keys with
/// access counts left (each pass takes one away, so a key read n times survives n passes),
/// pinned and leased keys, and keys already expired (the sweep removes those).
fn pick_victims(core: &Core, bytes_to_free: u64) -> Vec<Victim> {
    let now = core.now_ms();
    let mut cursor = core.demote_cursor.lock();
    let start = cursor.clone();
    let mut out = Vec::new();
    let mut freed = 0u64;
    let mut raw = 0u64;
    let mut it = core.warm.cursor(Family::Records, Bounds::all(), None);
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
        let stored = it.key();
        if wrapped && stored >= start.as_slice() {
            passes += 1;
            if passes >= 2 {
                break;
            }
            wrapped = false;
            it.seek(&start);
            continue;
        }
        give_way();
        if let Some(v) = consider(core, stored, it.value(), now, passes) {
            freed += v.charge;
            raw += (v.value.len() + v.key.stored().len()) as u64;
            out.push(v);
        }
        it.next();
        if freed >= bytes_to_free || raw >= core.settings.cold.segment_bytes_max {
            break;
        }
    }
    *cursor = if it.valid() {
        it.key().to_vec()
    } else {
        Vec::new()
    };
    out
}

/// The victim the record `bytes` of `stored` makes, if the hand takes it on pass `passes`.
fn consider(core: &Core, stored: &[u8], bytes: &[u8], now: u64, passes: u32) -> Option<Victim> {
    let Ok(key) = Key::from_stored(stored) else {
        return None;
    };
    let rec = match WarmRecord::decode(key.client(), bytes) {
        Ok(rec) => rec,
        Err(e) => {
            add(&core.counters.checksum_errors);
            tracing::error!(key = ?key, error = %e, "warm record failed its checksum; not demoted");
            return None;
        }
    };
    if !strata_format::is_live(rec.expire_ms, now)
        || is_pinned(core, key.client())
        || core.is_leased(&key, now)
        || passes == 0 && core.access.take(stored)
    {
        return None;
    }
    let value = match rec.value {
        // Parts stay warm: a segment holds whole values.
        WarmValue::Parted(_) => return None,
        WarmValue::Inline(v) => Bytes::copy_from_slice(v),
        WarmValue::Logged(at) => match core.vlog.read_checked(key.client(), &rec, at) {
            Ok(v) => v,
            Err(e) => {
                add(&core.counters.checksum_errors);
                tracing::error!(key = ?key, error = %e, "logged value failed its checksum; not demoted");
                return None;
            }
        },
    };
    let mut header = [0u8; WARM_HEADER_BYTES];
    header.copy_from_slice(&bytes[..WARM_HEADER_BYTES]);
    Some(Victim {
        kind: rec.kind,
        charge: warm_charge(&key, value.len() as u64),
        key,
        header,
        value,
        expire_ms: rec.expire_ms,
    })
}

/// Takes the next segment id (persisted before the segment is written, so an id is never
/// used twice).
pub(crate) fn alloc_segment_id(core: &Core) -> Result<u64> {
    let mut next = core.next_segment_id.lock();
    let id = *next;
    let mut b = core.warm.batch();
    b.set_next_segment_id(id + 1);
    core.warm.write(b, false)?;
    *next += 1;
    Ok(id)
}

/// Demotes one segment's worth of victims; returns how many keys moved.
pub(crate) async fn once(core: &Arc<Core>) -> Result<u64> {
    let warm_bytes = core.sizes.warm_bytes();
    let s = &core.settings;
    if warm_bytes <= s.warm.warm_bytes_max {
        return Ok(0);
    }
    let target = (s.warm.warm_bytes_max as f64 * s.warm.warm_demote_to_fraction) as u64;
    let to_free = warm_bytes - target;
    let me = Arc::clone(core);
    let mut victims =
        crate::offload::run("victim scan", move || pick_victims(&me, to_free)).await?;
    if victims.is_empty() {
        return Ok(0);
    }
    victims.sort_by(|a, b| a.key.cmp(&b.key));
    victims.dedup_by(|a, b| a.key == b.key);
    let id = alloc_segment_id(core)?;
    let (block_bytes, level) = (s.cold.block_bytes, s.cold.zstd_level);
    let (victims, segment) = crate::offload::run("segment build", move || {
        let mut b = SegmentBuilder::new(id, block_bytes, level);
        for v in &victims {
            give_way();
            b.push(v.kind, v.key.stored(), &v.value, v.expire_ms)?;
        }
        Ok::<_, Error>((victims, b.finish()?))
    })
    .await??;
    core.cold.put_segment(id, segment.bytes).await?;
    add(&core.counters.segments_written);

    // The segment is durable in the object store; now swap warm records for index entries.
    let me = Arc::clone(core);
    let refs = segment.refs;
    let moved =
        crate::offload::run("demotion commit", move || commit(&me, id, &victims, &refs)).await??;
    if moved == 0 {
        core.cold.delete_segment(id).await.ok();
        add(&core.counters.segments_deleted);
    }
    core.counters.demotions.fetch_add(moved, Ordering::Relaxed);
    Ok(moved)
}

/// Swaps the victims' warm records for the index entries `refs`, each only if its record
/// did not change since it was picked; a batch of at most [`BATCH_KEYS_MAX`] keys at a
/// time, each batch under its keys' locks.
fn commit(core: &Core, id: u64, victims: &[Victim], refs: &[(Vec<u8>, BlockRef)]) -> Result<u64> {
    let planned = SegmentMeta::of(refs);
    let mut moved = SegmentMeta::default();
    for (vs, rs) in victims
        .chunks(BATCH_KEYS_MAX)
        .zip(refs.chunks(BATCH_KEYS_MAX))
    {
        let _locks = core.locks.lock_many(vs.iter().map(|v| &v.key));
        let mut batch = core.warm.batch();
        let mut d = Counts::default();
        let mut swapped = Vec::new();
        for (v, (k, r)) in vs.iter().zip(rs) {
            give_way();
            assert_eq!(
                v.key.stored(),
                k.as_slice(),
                "segment refs follow the victims' order"
            );
            let current = core.warm.record(&v.key)?;
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
                batch.add_vlog_garbage(&v.key, at);
            }
            batch.delete_record(&v.key);
            batch.put_cold(&v.key, r);
            swapped.push(&v.key);
            d.warm_bytes -= v.charge as i64;
            d.warm_entries -= 1;
            d.cold_bytes += r.value_len as i64;
            d.cold_entries += 1;
        }
        if d.cold_entries == 0 {
            continue;
        }
        // The segment's record goes with the first index entries that point into it (a
        // segment without one is an orphan, which collection deletes), counting every
        // victim until the end says how many moved.
        if moved.entries == 0 {
            batch.put_segment(id, planned);
        }
        moved.entries += d.cold_entries as u64;
        moved.value_bytes += d.cold_bytes as u64;
        commit_batch(core, batch, &d, false)?;
        if let Some(w) = core.tier_watch.get() {
            for k in swapped {
                w.note(k, crate::tierwatch::Move::Demoted);
            }
        }
        core.room.notify_waiters();
    }
    if moved.entries > 0 && moved != planned {
        let mut batch = core.warm.batch();
        batch.put_segment(id, moved);
        core.warm.write(batch, false)?;
    }
    Ok(moved.entries)
}
