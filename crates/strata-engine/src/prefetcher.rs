//! Speculative prefetch from the cold tier. After a read served from the object store, a
//! background worker brings into DRAM what the client is likely to read next:
//!
//! - the other entries of the block just fetched (its neighbours in key order: segments are
//!   sorted, so a session's next keys usually sit beside it), and
//! - the keys an online [`MarkovModel`] predicts from transitions seen in each client's
//!   stream of reads (`Engine::note_access`), following the strongest rule up to
//!   `prefetch_keys_max` steps.
//!
//! It runs off the request's path (the after-read queue of `hook` feeds a worker; a full
//! queue drops the job), within `prefetch_bytes_max` per cold read, `prefetch_tasks_max`
//! concurrent jobs and `prefetch_fetches_max` object-store GETs in flight (taken in the
//! order the model ranks its keys), so a read that misses is not queued at the object
//! store behind many guesses.
//! The budget follows precision: over each window of 512 prefetches, the share that was
//! used scales the next window's budget (full from 50% up, never below 1/64), so a workload
//! prefetch cannot predict does not get its DRAM filled with guesses.
//! A prefetched value enters DRAM only if no write touched its key since its location was
//! read (the same stripe-version rule as promotions), so it is never stale. Counters:
//! values prefetched (`issued`), prefetched values read from DRAM before eviction (`used`):
//! precision is used / issued, and each use is a cold read avoided.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;
use strata_format::Key;
use strata_policy::MarkovModel;

/// Client streams whose last key is remembered.
const STREAMS_MAX: usize = 65_536;
/// Prefetched keys remembered for the `used` count.
const TRACKED_MAX: usize = 1 << 18;
/// A rule must explain at least this share of its shape's recent transitions to be followed.
const MIN_PROBABILITY: f64 = 0.3;

pub(crate) struct Prefetcher {
    /// Whether prefetch is on (`prefetch`).
    on: bool,
    model: Mutex<MarkovModel>,
    /// Each stream's last key, as the client named it (the model learns key shapes).
    streams: Mutex<HashMap<u64, Key>>,
    tracked: Mutex<HashSet<Key>>,
    tracked_len: AtomicUsize,
    /// Keys a job is fetching now, so overlapping jobs do not fetch them twice.
    fetching: Mutex<HashSet<Key>>,
    /// Permits for object-store GETs, `prefetch_fetches_max` of them (first come, first
    /// served).
    fetch_permits: tokio::sync::Semaphore,
    /// Client reads from the object store in flight ([`Prefetcher::demand_read`]); a
    /// prefetch GET not yet started waits for them ([`Prefetcher::after_demand`]).
    demand: AtomicUsize,
    demand_done: tokio::sync::Notify,
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
    pub(crate) fn new(on: bool, fetches_max: usize) -> Prefetcher {
        Prefetcher {
            on,
            model: Mutex::new(MarkovModel::default()),
            streams: Mutex::new(HashMap::new()),
            tracked: Mutex::new(HashSet::new()),
            tracked_len: AtomicUsize::new(0),
            fetching: Mutex::new(HashSet::new()),
            fetch_permits: tokio::sync::Semaphore::new(fetches_max.max(1)),
            demand: AtomicUsize::new(0),
            demand_done: tokio::sync::Notify::new(),
            window_issued: AtomicU64::new(0),
            window_used: AtomicU64::new(0),
            scale: AtomicU64::new(1024),
            submitted: AtomicU64::new(0),
        }
    }

    /// Learns from `stream` reading `key` after its previous key.
    pub(crate) fn note_access(&self, stream: u64, key: &Key) {
        if !self.on {
            return;
        }
        let prev = {
            let mut s = self.streams.lock();
            if s.len() >= STREAMS_MAX && !s.contains_key(&stream) {
                s.clear();
            }
            s.insert(stream, key.clone())
        };
        if let Some(p) = prev {
            if p != *key {
                self.model.lock().observe(p.stored(), key.stored());
            }
        }
    }

    pub(crate) fn end_stream(&self, stream: u64) {
        self.streams.lock().remove(&stream);
    }

    /// Whether a job after a cold read should run (prefetch is on, and while precision is
    /// at its floor only one job in `PROBE_EVERY` does: enough to notice when the workload
    /// becomes predictable again, too few to pollute DRAM).
    pub(crate) fn wants_job(&self) -> bool {
        self.on && self.should_run()
    }

    /// Whether `key` is a prefetched value read for the first time (it counts as used).
    pub(crate) fn take_tracked(&self, key: &Key) -> bool {
        if self.tracked_len.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let used = {
            let mut t = self.tracked.lock();
            let used = t.remove(key);
            self.tracked_len.store(t.len(), Ordering::Relaxed);
            used
        };
        if used {
            self.window_used.fetch_add(1, Ordering::Relaxed);
        }
        used
    }

    /// A key that entered DRAM by an ordinary read is no longer a prefetch.
    pub(crate) fn forget(&self, key: &Key) {
        if self.tracked_len.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut t = self.tracked.lock();
        if t.remove(key) {
            self.tracked_len.store(t.len(), Ordering::Relaxed);
        }
    }

    /// Remembers a value prefetched into DRAM; at the end of each window, sets the next
    /// window's budget from its precision.
    pub(crate) fn track(&self, key: &Key) {
        let mut t = self.tracked.lock();
        if t.len() >= TRACKED_MAX {
            t.clear();
        }
        t.insert(key.clone());
        self.tracked_len.store(t.len(), Ordering::Relaxed);
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
    pub(crate) fn budget(&self, max: u64) -> u64 {
        max.saturating_mul(self.scale.load(Ordering::Relaxed)) / 1024
    }

    /// Up to `n` keys the model predicts the stream reads after `key`.
    pub(crate) fn predict(&self, key: &Key, n: usize) -> Vec<Vec<u8>> {
        self.model.lock().predict(key.stored(), n, MIN_PROBABILITY)
    }

    /// Marks `key` as being fetched by a job; false if another job already is.
    pub(crate) fn begin_fetch(&self, key: &Key) -> bool {
        self.fetching.lock().insert(key.clone())
    }

    pub(crate) fn end_fetch(&self, key: &Key) {
        self.fetching.lock().remove(key);
    }

    /// Counts a client's read from the object store until the guard drops.
    pub(crate) fn demand_read(&self) -> DemandRead<'_> {
        self.demand.fetch_add(1, Ordering::AcqRel);
        DemandRead(self)
    }

    /// Waits, at most [`DEMAND_WAIT_MAX`], until no client reads from the object store: a
    /// read the model did not foresee then does not queue at the store behind the GETs of
    /// those it did.
    pub(crate) async fn after_demand(&self) {
        let deadline = tokio::time::Instant::now() + DEMAND_WAIT_MAX;
        loop {
            let done = self.demand_done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if self.demand.load(Ordering::Acquire) == 0 {
                return;
            }
            if tokio::time::timeout_at(deadline, done).await.is_err() {
                return;
            }
        }
    }

    /// Waits for a permit to GET a predicted value from the object store; held until the
    /// GET is done.
    pub(crate) async fn fetch_permit(&self) -> tokio::sync::SemaphorePermit<'_> {
        self.fetch_permits
            .acquire()
            .await
            .expect("the semaphore is never closed")
    }
}

/// Longest a prefetch GET waits for clients' reads from the object store to finish.
const DEMAND_WAIT_MAX: std::time::Duration = std::time::Duration::from_millis(10);

/// A client's read from the object store, counted while it lives.
pub(crate) struct DemandRead<'a>(&'a Prefetcher);

impl Drop for DemandRead<'_> {
    fn drop(&mut self) {
        if self.0.demand.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.demand_done.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[test]
    fn prefetch_gets_in_flight_stop_at_their_limit() {
        let p = Prefetcher::new(true, 2);
        let a = p.fetch_permit().now_or_never().expect("first permit");
        let _b = p.fetch_permit().now_or_never().expect("second permit");
        assert!(
            p.fetch_permit().now_or_never().is_none(),
            "a third GET waits"
        );
        drop(a);
        assert!(
            p.fetch_permit().now_or_never().is_some(),
            "a GET done frees its permit"
        );
    }

    #[tokio::test]
    async fn prefetch_gets_wait_for_client_reads_from_the_store_but_not_forever() {
        let p = Prefetcher::new(true, 2);
        assert!(
            p.after_demand().now_or_never().is_some(),
            "no client read: at once"
        );
        let read = p.demand_read();
        let mut waiting = Box::pin(p.after_demand());
        assert!(
            futures::poll!(&mut waiting).is_pending(),
            "waits while a client reads"
        );
        drop(read);
        assert!(
            futures::poll!(&mut waiting).is_ready(),
            "goes when the read is done"
        );
        let _endless = p.demand_read();
        let started = std::time::Instant::now();
        p.after_demand().await;
        let waited = started.elapsed();
        assert!(
            waited >= DEMAND_WAIT_MAX && waited < DEMAND_WAIT_MAX * 100,
            "never much longer than its limit: {waited:?}"
        );
    }

    #[test]
    fn budget_follows_precision_and_unpredictable_workloads_are_probed_rarely() {
        let p = Prefetcher::new(true, 2);
        let k = |s: String| Key::new(0, 0, s.as_bytes());
        assert_eq!(
            p.budget(1 << 20),
            1 << 20,
            "full budget before any evidence"
        );
        // A window in which nothing prefetched was used.
        for i in 0..WINDOW {
            p.track(&k(format!("k{i}")));
        }
        assert_eq!(p.budget(1 << 20), (1 << 20) * SCALE_MIN / 1024);
        let runs = (0..PROBE_EVERY * 10).filter(|_| p.should_run()).count();
        assert_eq!(runs as u64, 10, "one job in {PROBE_EVERY} at the floor");
        // A window in which everything was used restores the full budget.
        for i in 0..WINDOW {
            let key = k(format!("u{i}"));
            p.track(&key);
            assert!(p.take_tracked(&key));
        }
        assert_eq!(p.budget(1 << 20), 1 << 20);
        assert!((0..10).all(|_| p.should_run()));
        // Half used: still the full budget; a quarter: half of it.
        for i in 0..WINDOW {
            let key = k(format!("q{i}"));
            p.track(&key);
            if i % 4 == 0 {
                p.take_tracked(&key);
            }
        }
        // (One use of the previous window lands in this one: 129 of 512.)
        assert!((512..=520).contains(&p.budget(1024)), "{}", p.budget(1024));
    }
}
