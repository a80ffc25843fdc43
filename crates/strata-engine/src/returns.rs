//! Values going back up to the warm tier: a value read from the object store (or
//! prefetched from it into DRAM and then read) is in use again, so it is written back to the
//! warm store (`cold_reads_return_to_warm`). Both run in the job the read leaves behind
//! (`hook`), after its reply; both are best effort.

use bytes::Bytes;
use strata_format::{BlockRef, Key};

use crate::commit::{apply_locked, Change};
use crate::core::Core;
use crate::stats::add;
use crate::warm::{warm_charge, Loc, Stored, Want};

/// Writes `value`, just read from block `r` of the object store, back to the warm tier, if
/// returns are on, no write touched the key since `seen_version`, and the index still
/// points at that block. Says whether it went back.
pub(crate) fn return_read(
    core: &Core,
    key: &Key,
    seen_version: u64,
    r: &BlockRef,
    value: &Bytes,
) -> bool {
    if !core.settings.warm.cold_reads_return_to_warm {
        return false;
    }
    let _g = core.locks.lock(key);
    if core.locks.version(key) != seen_version {
        return false;
    }
    let stored = match core.lookup(key, Want::Entry) {
        Ok(Some(s)) if matches!(s.loc, Loc::Cold(now_r) if now_r == *r) => s,
        _ => return false,
    };
    let back = return_locked(core, key, &stored, value);
    if back {
        core.prefetch.forget(key);
    }
    back
}

/// A value prefetched into DRAM was read from there: it goes back to the warm tier as a
/// value read from the object store does (the DRAM copy is the value the index points at:
/// a write replaces or drops it under the same stripe lock).
pub(crate) fn return_prefetched(core: &Core, key: &Key) -> bool {
    if !core.settings.warm.cold_reads_return_to_warm {
        return false;
    }
    let _g = core.locks.lock(key);
    let now = core.now_ms();
    let stored = match core.lookup(key, Want::Entry) {
        Ok(Some(s)) if s.is_live(now) && matches!(s.loc, Loc::Cold(_)) => s,
        _ => return false,
    };
    match core.hot.peek(key.stored(), now) {
        Some((value, _)) => return_locked(core, key, &stored, &value),
        None => false,
    }
}

/// Writes `value`, the value of the cold entry `stored`, to the warm tier; the caller holds
/// the key's stripe lock. Not synced even with `durability = sync`: the object store still
/// holds the value, and collection syncs before it deletes a segment. Returns stop halfway
/// from `warm_bytes_max` to the hard limit, so that when demotion falls behind, the rest of
/// the headroom is left to clients' writes.
fn return_locked(core: &Core, key: &Key, stored: &Stored, value: &Bytes) -> bool {
    let soft = core.settings.warm.warm_bytes_max;
    let hard = core.settings.warm.warm_hard_limit();
    let warm = core.sizes.warm_bytes();
    if warm + warm_charge(key, value.len() as u64) > soft + hard.saturating_sub(soft) / 2 {
        return false;
    }
    let change = Change::Put {
        kind: stored.kind,
        value: value.clone(),
        expire_ms: stored.expire_ms,
    };
    match apply_locked(core, key, Some(stored), change, false) {
        // Nobody is told of this write: its ticket needs no wait.
        Ok(_ticket) => {
            add(&core.counters.returns_to_warm);
            if let Some(w) = core.tier_watch.get() {
                w.note(key, crate::tierwatch::Move::Returned);
            }
            true
        }
        Err(e) => {
            tracing::debug!(key = ?key, error = %e, "a cold value stays cold");
            false
        }
    }
}
