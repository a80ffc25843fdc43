//! Speculative prefetch from the cold tier. After a read served from the object store, a
//! background worker brings into DRAM what the client is likely to read next:
//!
//! - the other entries of the block just fetched (its neighbours in key order: segments are
//!   sorted, so a session's next keys usually sit beside it), and
//! - the keys an online [`MarkovModel`] predicts from transitions seen in each client's
//!   stream of reads (`Engine::note_access`), following the strongest rule up to
//!   `prefetch_keys_max` steps.
//!
//! It runs off the request's path (a bounded queue feeds a worker; a full queue drops the
//! job), within `prefetch_bytes_max` per cold read and `prefetch_tasks_max` concurrent jobs.
//! The budget follows precision: over each window of 512 prefetches, the share that was
//! used scales the next window's budget (full from 50% up, never below 1/64), so a workload
//! prefetch cannot predict does not get its DRAM filled with guesses.
//! A prefetched value enters DRAM only if no write touched its key since its location was
//! read (the same stripe-version rule as promotions), so it is never stale. Counters:
//! values prefetched (`issued`), prefetched values read from DRAM before eviction (`used`):
//! precision is used / issued, and each use is a cold read avoided.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use strata_format::BlockRef;
use strata_policy::MarkovModel;
use tokio::sync::{mpsc, Semaphore};

use crate::engine::{Inner, Loc};

/// Jobs waiting for the worker; more are dropped (prefetch is best effort).
const QUEUE_MAX: usize = 64;
/// Client streams whose last key is remembered.
const STREAMS_MAX: usize = 65_536;
/// Prefetched keys remembered for the `used` count.
const TRACKED_MAX: usize = 1 << 18;
/// A rule must explain at least this share of its shape's recent transitions to be followed.
const MIN_PROBABILITY: f64 = 0.3;

pub(crate) struct Job {
    pub(crate) key: Bytes,
    /// The block a cold read just fetched (its neighbours are prefetched); `None` when the
    /// job only extends the prediction window (a prefetched value was just used).
    pub(crate) block: Option<(BlockRef, Bytes)>,
}

pub(crate) struct Prefetcher {
    model: Mutex<MarkovModel>,
    streams: Mutex<HashMap<u64, Bytes>>,
    tracked: Mutex<HashSet<Bytes>>,
    tracked_len: AtomicUsize,
    /// Keys a job is fetching now, so overlapping jobs do not fetch them twice.
    fetching: Mutex<HashSet<Bytes>>,
    queue: Mutex<Option<mpsc::Sender<Job>>>,
    pub(crate) issued: AtomicU64,
    pub(crate) used: AtomicU64,
    pub(crate) dropped: AtomicU64,
    /// Prefetches issued and used in the current window of `WINDOW` issues.
    window_issued: AtomicU64,
    window_used: AtomicU64,
    /// Share of the byte budget jobs may use, in 1/1024ths: follows the last window's
    /// precision, so a workload prefetch cannot predict does not have its DRAM polluted.
    scale: AtomicU64,
    submitted: AtomicU64,
}

/// Prefetches per precision window.
const WINDOW: u64 = 512;
/// Full budget from this precision up; below it, the budget shrinks in proportion.
const PRECISION_FOR_FULL_BUDGET: f64 = 0.5;
/// The budget never shrinks below this share (1/1024ths), so prefetch can notice when the
/// workload becomes predictable again.
const SCALE_MIN: u64 = 16;
/// At the floor, one job in this many runs.
const PROBE_EVERY: u64 = 16;

impl Prefetcher {
    pub(crate) fn new() -> Prefetcher {
        Prefetcher {
            model: Mutex::new(MarkovModel::default()),
            streams: Mutex::new(HashMap::new()),
            tracked: Mutex::new(HashSet::new()),
            tracked_len: AtomicUsize::new(0),
            fetching: Mutex::new(HashSet::new()),
            queue: Mutex::new(None),
            issued: AtomicU64::new(0),
            used: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            window_issued: AtomicU64::new(0),
            window_used: AtomicU64::new(0),
            scale: AtomicU64::new(1024),
            submitted: AtomicU64::new(0),
        }
    }

    /// Starts the worker (once the engine exists); without it, jobs are not queued.
    pub(crate) fn start(inner: &Arc<Inner>) {
        if !inner.opts.prefetch {
            return;
        }
        let (tx, mut rx) = mpsc::channel::<Job>(QUEUE_MAX);
        *inner.prefetch.queue.lock() = Some(tx);
        let weak = Arc::downgrade(inner);
        let slots = Arc::new(Semaphore::new(inner.opts.prefetch_tasks_max.max(1)));
        tokio::spawn(async move {
            while let Some(job) = rx.recv().await {
                let Some(inner) = weak.upgrade() else { return };
                let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
                    return;
                };
                tokio::spawn(async move {
                    run_job(&inner, job).await;
                    drop(permit);
                });
            }
        });
    }

    /// Learns from `stream` reading `key` after its previous key.
    pub(crate) fn note_access(&self, stream: u64, key: &[u8]) {
        let prev = {
            let mut s = self.streams.lock();
            if s.len() >= STREAMS_MAX && !s.contains_key(&stream) {
                s.clear();
            }
            s.insert(stream, Bytes::copy_from_slice(key))
        };
        if let Some(p) = prev {
            if p.as_ref() != key {
                self.model.lock().observe(&p, key);
            }
        }
    }

    pub(crate) fn end_stream(&self, stream: u64) {
        self.streams.lock().remove(&stream);
    }

    /// Queues a job after a cold read; drops it if the worker is behind. While precision is
    /// at its floor, only one job in `PROBE_EVERY` runs: enough to notice when the
    /// workload becomes predictable again, too few to pollute DRAM.
    pub(crate) fn submit(&self, job: Job) {
        if !self.should_run() {
            return;
        }
        if let Some(tx) = &*self.queue.lock() {
            if tx.try_send(job).is_err() {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Called on every DRAM hit: counts the first read of a prefetched value, and moves the
    /// prediction window on from it (a stream that consumes prefetched keys keeps the
    /// prefetcher ahead of it).
    pub(crate) fn on_hot_hit(&self, key: &[u8]) {
        if self.tracked_len.load(Ordering::Relaxed) == 0 {
            return;
        }
        let used = {
            let mut t = self.tracked.lock();
            let used = t.remove(key);
            self.tracked_len.store(t.len(), Ordering::Relaxed);
            used
        };
        if used {
            self.used.fetch_add(1, Ordering::Relaxed);
            self.window_used.fetch_add(1, Ordering::Relaxed);
            self.submit(Job {
                key: Bytes::copy_from_slice(key),
                block: None,
            });
        }
    }

    /// A key that entered DRAM by an ordinary read is no longer a prefetch.
    pub(crate) fn forget(&self, key: &[u8]) {
        if self.tracked_len.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut t = self.tracked.lock();
        if t.remove(key) {
            self.tracked_len.store(t.len(), Ordering::Relaxed);
        }
    }

    fn track(&self, key: &[u8]) {
        let mut t = self.tracked.lock();
        if t.len() >= TRACKED_MAX {
            t.clear();
        }
        t.insert(Bytes::copy_from_slice(key));
        self.tracked_len.store(t.len(), Ordering::Relaxed);
        self.issued.fetch_add(1, Ordering::Relaxed);
        if self.window_issued.fetch_add(1, Ordering::Relaxed) + 1 >= WINDOW {
            let used = self.window_used.swap(0, Ordering::Relaxed);
            self.window_issued.store(0, Ordering::Relaxed);
            let precision = used as f64 / WINDOW as f64;
            let scale = (precision / PRECISION_FOR_FULL_BUDGET * 1024.0) as u64;
            self.scale
                .store(scale.clamp(SCALE_MIN, 1024), Ordering::Relaxed);
        }
    }

    fn should_run(&self) -> bool {
        let n = self.submitted.fetch_add(1, Ordering::Relaxed);
        self.scale.load(Ordering::Relaxed) > SCALE_MIN || n.is_multiple_of(PROBE_EVERY)
    }

    /// The byte budget of one job now: `max`, scaled by recent precision.
    fn budget(&self, max: u64) -> u64 {
        max.saturating_mul(self.scale.load(Ordering::Relaxed)) / 1024
    }
}

/// Puts `value` into DRAM as a prefetch, unless a write raced with the lookup.
fn admit(inner: &Inner, key: &[u8], seen: u64, value: Bytes, expire_ms: u64) -> bool {
    let admitted = inner.insert_hot_if_unchanged(key, seen, value, expire_ms);
    if admitted {
        inner.prefetch.track(key);
    }
    admitted
}

async fn run_job(inner: &Arc<Inner>, job: Job) {
    // A job may not fill more than an eighth of DRAM: prefetches would evict each other
    // (and the data being read) before they are used.
    let mut budget = inner.prefetch.budget(
        inner
            .opts
            .prefetch_bytes_max
            .min(inner.opts.hot_bytes_max / 8),
    );
    let now = inner.now_ms();
    // 0. A prefetched value that was read is in use: back to the warm tier with it.
    if job.block.is_none() {
        inner.return_prefetched_to_warm(&job.key);
    }
    // 1. The neighbours in the block just fetched.
    if let Some((block_ref, block)) = &job.block {
        for e in strata_format::iter_block(block) {
            let Ok(e) = e else { break };
            if e.key == job.key.as_ref() || inner.hot.contains(e.key, now) {
                continue;
            }
            if (e.value.len() as u64) > budget {
                break;
            }
            let seen = inner.stripe_version(e.key);
            // Only if the index still points at this very block (no newer write elsewhere).
            let here = matches!(
                inner.read_stored(e.key, false),
                Ok(Some(s)) if s.is_live(now) && matches!(s.loc, Loc::Cold(r) if r.segment_id == block_ref.segment_id && r.block == block_ref.block)
            );
            if here
                && admit(
                    inner,
                    e.key,
                    seen,
                    Bytes::copy_from_slice(e.value),
                    e.expire_ms,
                )
            {
                budget -= e.value.len() as u64;
            }
        }
    }
    // 2. What the model predicts this stream reads next, fetched concurrently.
    let predicted = inner.prefetch.model.lock().predict(
        &job.key,
        inner.opts.prefetch_keys_max,
        MIN_PROBABILITY,
    );
    let mut wanted = Vec::new();
    for k in predicted {
        if inner.hot.contains(&k, now) {
            continue;
        }
        let seen = inner.stripe_version(&k);
        // With the value: a warm value is read here once (RocksDB would load it even to
        // answer where the key is), a cold one is fetched below.
        let Ok(Some(s)) = inner.read_stored(&k, true) else {
            continue;
        };
        if !s.is_live(now) || s.value_len > budget {
            continue;
        }
        if !inner
            .prefetch
            .fetching
            .lock()
            .insert(Bytes::copy_from_slice(&k))
        {
            continue; // another job is on it
        }
        budget -= s.value_len;
        wanted.push((k, seen, s));
    }
    let fetches = wanted.into_iter().map(|(k, seen, s)| async move {
        let value = match s.loc {
            Loc::Cold(r) => inner.read_cold(&k, &r).await.ok(),
            Loc::Warm { value, .. } => value,
        };
        if let Some(v) = value {
            admit(inner, &k, seen, v, s.expire_ms);
        }
        inner.prefetch.fetching.lock().remove(k.as_slice());
    });
    futures::future::join_all(fetches).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_follows_precision_and_unpredictable_workloads_are_probed_rarely() {
        let p = Prefetcher::new();
        assert_eq!(
            p.budget(1 << 20),
            1 << 20,
            "full budget before any evidence"
        );
        // A window in which nothing prefetched was used.
        for i in 0..WINDOW {
            p.track(format!("k{i}").as_bytes());
        }
        assert_eq!(p.budget(1 << 20), (1 << 20) * SCALE_MIN / 1024);
        let runs = (0..PROBE_EVERY * 10).filter(|_| p.should_run()).count();
        assert_eq!(runs as u64, 10, "one job in {PROBE_EVERY} at the floor");
        // A window in which everything was used restores the full budget.
        for i in 0..WINDOW {
            let k = format!("u{i}");
            p.track(k.as_bytes());
            p.on_hot_hit(k.as_bytes());
        }
        assert_eq!(p.budget(1 << 20), 1 << 20);
        assert!((0..10).all(|_| p.should_run()));
        // Half used: still the full budget; a quarter: half of it.
        for i in 0..WINDOW {
            let k = format!("q{i}");
            p.track(k.as_bytes());
            if i % 4 == 0 {
                p.on_hot_hit(k.as_bytes());
            }
        }
        // (One use of the previous window lands in this one: 129 of 512.)
        assert!((512..=520).contains(&p.budget(1024)), "{}", p.budget(1024));
    }
}
