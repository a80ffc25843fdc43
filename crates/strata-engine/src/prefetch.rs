//! What a prefetch job does, off the read's path: a prefetched value that was read goes
//! back to the warm tier; the neighbours of a block just fetched and the keys the model
//! predicts come into DRAM, within the job's byte budget (see `prefetcher` for the model,
//! the budget and the counts).

use bytes::Bytes;
use strata_format::{BlockRef, Key, Kind};

use crate::core::{key_of_entry, Core};
use crate::queue::Job;
use crate::stats::add;
use crate::warm::{Loc, Want};

/// Puts `value` into DRAM as a prefetch, unless a write raced with the lookup.
fn admit(core: &Core, key: &Key, seen: u64, value: Bytes, kind: Kind, expire_ms: u64) -> bool {
    let admitted = core.insert_hot_if_unchanged(key, seen, value, kind, expire_ms);
    if admitted {
        add(&core.counters.prefetch_issued);
        core.prefetch.track(key);
    }
    admitted
}

/// Runs one job: the return of a prefetched value that was read, then block neighbours and
/// predicted keys into DRAM, within the job's budget.
pub(crate) async fn run_job(core: &Core, job: Job) {
    if job.whole {
        // A whole read puts the value together and into DRAM (if it fits).
        if let Err(e) = crate::read::get(core, &job.key).await {
            tracing::debug!(error = %e, "putting a value stored as parts together failed");
        }
        return;
    }
    // A job may not fill more than an eighth of DRAM: prefetches would evict each other
    // (and the data being read) before they are used.
    let budget = core.prefetch.budget(
        core.settings
            .prefetch
            .prefetch_bytes_max
            .min(core.settings.hot.hot_bytes_max / 8),
    );
    // A value read from the object store, or prefetched from it and read, is in use: back
    // to the warm tier with it.
    match (&job.block, &job.back) {
        (Some((r, _)), Some((seen, value))) => {
            crate::returns::return_read(core, &job.key, *seen, r, value);
        }
        (None, _) => {
            crate::returns::return_prefetched(core, &job.key);
        }
        (Some(_), None) => {}
    }
    if !job.prefetch {
        return;
    }
    let budget = match &job.block {
        Some((r, block)) => neighbours(core, &job.key, r, block, budget),
        None => budget,
    };
    predicted(core, &job.key, budget).await;
}

/// Brings the other entries of the block just fetched into DRAM; returns the budget left.
fn neighbours(core: &Core, key: &Key, block_ref: &BlockRef, block: &Bytes, mut budget: u64) -> u64 {
    let now = core.now_ms();
    for e in strata_format::iter_block(block) {
        let Ok(e) = e else { break };
        let Ok(k) = key_of_entry(block_ref, e.key) else {
            break;
        };
        if k == *key || core.hot.contains(k.stored(), now) {
            continue;
        }
        if (e.value.len() as u64) > budget {
            break;
        }
        let seen = core.locks.version(&k);
        // Only if the index still points at this very block (no newer write elsewhere).
        let here = matches!(
            core.lookup(&k, Want::Entry),
            Ok(Some(s)) if s.is_live(now) && matches!(s.loc, Loc::Cold(r) if r.segment_id == block_ref.segment_id && r.block == block_ref.block)
        );
        let value = Bytes::copy_from_slice(e.value);
        if here && admit(core, &k, seen, value, e.kind, e.expire_ms) {
            budget -= e.value.len() as u64;
        }
    }
    budget
}

/// Brings what the model predicts the stream reads after `key` into DRAM, concurrently.
async fn predicted(core: &Core, key: &Key, mut budget: u64) {
    let now = core.now_ms();
    let predicted = core
        .prefetch
        .predict(key, core.settings.prefetch.prefetch_keys_max);
    let mut wanted = Vec::new();
    for k in predicted {
        let Ok(k) = Key::from_stored(&k) else {
            continue;
        };
        if core.hot.contains(k.stored(), now) {
            continue;
        }
        let seen = core.locks.version(&k);
        // With the value: a warm value is read here once (RocksDB would load it even to
        // answer where the key is), a cold one is fetched below.
        let Ok(Some(s)) = core.lookup(&k, Want::Value) else {
            continue;
        };
        if !s.is_live(now) || s.value_len > budget {
            continue;
        }
        if !core.prefetch.begin_fetch(&k) {
            continue; // another job is on it
        }
        budget -= s.value_len;
        wanted.push((k, seen, s));
    }
    let fetches = wanted.into_iter().map(|(k, seen, s)| async move {
        let value = match s.loc {
            Loc::Cold(r) => {
                let _permit = core.prefetch.fetch_permit().await;
                core.prefetch.after_demand().await;
                // A read may have brought it in while this waited for its turn.
                if core.hot.contains(k.stored(), core.now_ms()) {
                    None
                } else {
                    core.fetch_cold(&k, &r).await.ok().map(|v| v.0)
                }
            }
            Loc::Warm { value, .. } => value,
        };
        if let Some(v) = value {
            admit(core, &k, seen, v, s.kind, s.expire_ms);
        }
        core.prefetch.end_fetch(&k);
    });
    futures::future::join_all(fetches).await;
}
