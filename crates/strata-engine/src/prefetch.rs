//! What a prefetch job does, off the read's path: a prefetched value that was read goes
//! back to the warm tier; the neighbours of a block just fetched and the keys the model
//! predicts come into DRAM, within the job's byte budget (see `prefetcher` for the model,
//! the budget and the counts).

use std::sync::{Arc, Weak};

use bytes::Bytes;
use strata_format::{BlockRef, Key, Kind};
use tokio::sync::Semaphore;

use crate::cold::extends_run;
use crate::core::{key_of_entry, Core};
use crate::queue::Job;
use crate::stats::add;
use crate::warm::{Loc, Want};

/// Starts the worker of the prefetch queue (once the engine exists).
pub(crate) fn start(core: &Arc<Core>) {
    let mut rx = core.after_read.open();
    let weak: Weak<Core> = Arc::downgrade(core);
    let slots = Arc::new(Semaphore::new(
        core.settings.prefetch.prefetch_tasks_max.max(1),
    ));
    tokio::spawn(async move {
        while let Some(job) = rx.recv().await {
            let Some(core) = weak.upgrade() else { return };
            let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
                return;
            };
            tokio::spawn(async move {
                run_job(&core, job).await;
                core.after_read.done();
                drop(permit);
            });
        }
    });
}

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
            Ok(Some(s)) if s.is_live(now) && matches!(s.loc, Loc::Cold(r) if r.id() == block_ref.id())
        );
        let value = Bytes::copy_from_slice(e.value);
        if here && admit(core, &k, seen, value, e.kind, e.expire_ms) {
            budget -= e.value.len() as u64;
        }
    }
    budget
}

/// A predicted key in the object store: its stripe version when looked up, its index entry.
struct Wanted {
    key: Key,
    seen: u64,
    r: BlockRef,
}

/// Brings what the model predicts the stream reads after `key` into DRAM: warm values at
/// once, cold ones by runs of blocks that lie end to end in a segment, one GET per run
/// (a session's next keys usually do: segments are sorted), the runs concurrently.
///
/// The window is the predicted keys that exist, in order, as far as the byte budget
/// covers those still to fetch. As the kernel's readahead does, its cold keys wait until
/// the first of the window is one of them or at least half of the window is: a stream
/// read in order then costs one GET per half window, not one per read, and a read that
/// misses meets fewer guesses at the object store.
async fn predicted(core: &Core, key: &Key, mut budget: u64) {
    let now = core.now_ms();
    let full_budget = budget;
    let predicted = core
        .prefetch
        .predict(key, core.settings.prefetch.prefetch_keys_max);
    let mut cold = Vec::new();
    let mut window = 0;
    let mut next_missing = false;
    for k in predicted {
        let Ok(k) = Key::from_stored(&k) else {
            continue;
        };
        if core.hot.contains(k.stored(), now) || core.prefetch.is_fetching(&k) {
            window += 1; // here, or on its way
            continue;
        }
        let seen = core.locks.version(&k);
        // With the value: a warm value is read here once (RocksDB would load it even to
        // answer where the key is), a cold one is fetched below.
        let Ok(Some(s)) = core.lookup(&k, Want::Value) else {
            continue;
        };
        if !s.is_live(now) || s.value_len > full_budget {
            continue; // gone, or never to be prefetched
        }
        if s.value_len > budget {
            break; // the window ends where the budget does
        }
        budget -= s.value_len;
        window += 1;
        match s.loc {
            Loc::Cold(r) => {
                next_missing |= window == 1;
                cold.push(Wanted { key: k, seen, r });
            }
            Loc::Warm { value, .. } => {
                if let Some(v) = value {
                    if core.prefetch.begin_fetch(&k) {
                        admit(core, &k, seen, v, s.kind, s.expire_ms);
                        core.prefetch.end_fetch(&k);
                    }
                }
            }
        }
    }
    if !next_missing && cold.len() * 2 < window {
        return;
    }
    // Another job may have started on some of them since they were looked at.
    cold.retain(|w| core.prefetch.begin_fetch(&w.key));
    let fetches = runs(cold).into_iter().map(|run| fetch_run(core, run));
    futures::future::join_all(fetches).await;
}

/// `cold` split into runs of keys whose blocks follow each other in one segment, as far as
/// one GET asks for ([`extends_run`]), each run in block order; the runs in the order of
/// the model's ranking of their first keys.
fn runs(cold: Vec<Wanted>) -> Vec<Vec<Wanted>> {
    // Each key with its rank, in block order.
    let mut ranked: Vec<(usize, Wanted)> = cold.into_iter().enumerate().collect();
    ranked.sort_by_key(|(_, w)| (w.r.segment_id, w.r.offset));
    // (first rank, keys, bytes of blocks)
    let mut runs: Vec<(usize, Vec<Wanted>, u64)> = Vec::new();
    for (rank, w) in ranked {
        let len = u64::from(w.r.len);
        if let Some((first, run, bytes)) = runs.last_mut() {
            let last = &run[run.len() - 1].r;
            // Another key of the last block adds no bytes; the next block adds its own.
            let grows = if last.id() == w.r.id() {
                Some(0)
            } else {
                extends_run(last, &w.r, *bytes).then_some(len)
            };
            if let Some(grows) = grows {
                *first = (*first).min(rank);
                *bytes += grows;
                run.push(w);
                continue;
            }
        }
        runs.push((rank, vec![w], len));
    }
    runs.sort_by_key(|(first, ..)| *first);
    runs.into_iter().map(|(_, run, _)| run).collect()
}

/// Fetches one run of predicted cold keys (one GET, in its turn among prefetch GETs) and
/// admits each value, unless a read brought it in meanwhile.
async fn fetch_run(core: &Core, run: Vec<Wanted>) {
    let _permit = core.prefetch.fetch_permit().await;
    core.prefetch.after_demand().await;
    let now = core.now_ms();
    let (here, run): (Vec<Wanted>, Vec<Wanted>) = run
        .into_iter()
        .partition(|w| core.hot.contains(w.key.stored(), now));
    for w in here {
        core.prefetch.end_fetch(&w.key);
    }
    let mut blocks: Vec<BlockRef> = run.iter().map(|w| w.r).collect();
    blocks.dedup_by_key(|r| r.id());
    let got = core.cold.get_blocks(&blocks).await;
    for w in run {
        let at = blocks.iter().position(|b| b.id() == w.r.id());
        match at.map(|at| &got[at]) {
            Some(Ok(block)) => {
                if let Ok(v) = core.value_in_block(&w.key, &w.r, block) {
                    admit(core, &w.key, w.seen, v, w.r.kind, w.r.expire_ms);
                }
            }
            Some(Err(e)) => core.count_data_error(e),
            None => {}
        }
        core.prefetch.end_fetch(&w.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A predicted key whose value lies in block `block` of segment `segment`, blocks of
    /// 100 bytes end to end.
    fn wanted(name: &str, segment: u64, block: u32) -> Wanted {
        wanted_in(name, segment, block, 100)
    }

    /// The same, blocks of `len` bytes.
    fn wanted_in(name: &str, segment: u64, block: u32, len: u32) -> Wanted {
        Wanted {
            key: Key::new(0, 0, name.as_bytes()),
            seen: 0,
            r: BlockRef {
                segment_id: segment,
                block,
                offset: u64::from(len) * u64::from(block),
                len,
                raw_len: len,
                block_crc: 0,
                expire_ms: 0,
                value_len: 10,
                layout: 2,
                kind: Kind::String,
            },
        }
    }

    fn names(runs: &[Vec<Wanted>]) -> Vec<Vec<&[u8]>> {
        runs.iter()
            .map(|run| run.iter().map(|w| w.key.client()).collect())
            .collect()
    }

    #[test]
    fn predicted_keys_are_fetched_by_runs_of_blocks_end_to_end_in_the_models_order() {
        // Ranked by the model: a gap (block 5) splits segment 1's blocks, another segment is
        // its own run, two keys of one block share it.
        let cold = vec![
            wanted("c", 1, 6),
            wanted("a", 1, 3),
            wanted("x", 2, 4),
            wanted("b", 1, 4),
            wanted("b2", 1, 4),
            wanted("d", 1, 7),
        ];
        let got = runs(cold);
        let want: Vec<Vec<&[u8]>> = vec![vec![b"c", b"d"], vec![b"a", b"b", b"b2"], vec![b"x"]];
        assert_eq!(names(&got), want);
        assert!(runs(Vec::new()).is_empty());
        // A run asks for at most RUN_BYTES_MAX: two blocks of 1.5 MiB, then the third.
        let big = (0..3)
            .map(|b| wanted_in(&format!("k{b}"), 1, b, 3 << 19))
            .collect();
        let want: Vec<Vec<&[u8]>> = vec![vec![b"k0", b"k1"], vec![b"k2"]];
        assert_eq!(names(&runs(big)), want);
    }
}
