//! What a read leaves behind, in one place: the copy into DRAM at once (so the next read
//! hits it), and, off the read's path, what a value read from the object store also brings
//! about, its return to the warm tier and the prefetch it triggers, and the putting
//! together of a value read often from its parts: queued (`queue`) for one worker
//! (`prefetch::start`).

use bytes::Bytes;
use strata_format::{BlockRef, Key, Kind};

use crate::core::Core;
use crate::queue::Job;
use crate::stats::add;

/// What a read found outside DRAM, for the hook.
pub(crate) enum Read {
    /// A value read from the warm store.
    Warm {
        seen: u64,
        value: Bytes,
        kind: Kind,
        expire_ms: u64,
    },
    /// A value read from block `r` of the object store, with the whole block.
    Cold {
        seen: u64,
        r: BlockRef,
        value: Bytes,
        block: Bytes,
    },
}

/// Called once per value a read found outside DRAM.
pub(crate) fn after_read(core: &Core, key: &Key, read: Read) {
    match read {
        Read::Warm {
            seen,
            value,
            kind,
            expire_ms,
        } => promote(core, key, seen, value, kind, expire_ms),
        Read::Cold {
            seen,
            r,
            value,
            block,
        } => {
            // Into DRAM now; back to the warm tier (a write of the warm store) after the
            // reply, in the worker, with whatever prefetch the read triggers.
            let back = core.settings.warm.cold_reads_return_to_warm;
            let job = Job {
                key: key.clone(),
                block: Some((r, block)),
                back: back.then(|| (seen, value.clone())),
                prefetch: core.prefetch.wants_job(),
                whole: false,
            };
            promote(core, key, seen, value, r.kind, r.expire_ms);
            submit(core, job);
        }
    }
}

/// Called on every DRAM hit: counts the first read of a prefetched value, and moves the
/// prediction window on from it (a stream that consumes prefetched keys keeps the
/// prefetcher ahead of it; the job also returns the value to the warm tier).
pub(crate) fn on_hot_hit(core: &Core, key: &Key) {
    if core.prefetch.take_tracked(key) {
        add(&core.counters.prefetch_used);
        let job = Job {
            key: key.clone(),
            block: None,
            back: None,
            prefetch: core.prefetch.wants_job(),
            whole: false,
        };
        submit(core, job);
    }
}

/// Puts `key`'s value, stored as parts, together into DRAM after the reply (a whole read
/// in the worker), so that a later read makes it live from there.
pub(crate) fn put_together(core: &Core, key: &Key) {
    let job = Job {
        key: key.clone(),
        block: None,
        back: None,
        prefetch: false,
        whole: true,
    };
    submit(core, job);
}

/// Queues `job` if it has anything to do (a return, a prefetch the prefetcher wants, a
/// value to put together); counts it when the queue is full.
fn submit(core: &Core, job: Job) {
    if (job.back.is_some() || job.prefetch || job.whole) && !core.after_read.submit(job) {
        add(&core.counters.prefetch_dropped);
    }
}

/// Copies a value read from warm or cold into DRAM, unless a write raced with the read.
fn promote(core: &Core, key: &Key, seen: u64, value: Bytes, kind: Kind, expire_ms: u64) {
    if core.insert_hot_if_unchanged(key, seen, value, kind, expire_ms) {
        add(&core.counters.promotions);
        core.prefetch.forget(key);
    }
}
