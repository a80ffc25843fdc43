//! Speculative prefetch from the cold tier. After a read served from the object store, a
//! background worker brings into DRAM what the client is likely to read next:
//!
//! - the other entries of the block just fetched (its neighbours in key order: segments are
//!   sorted, so a session's next keys usually sit beside it), and
//! - the keys an online [`MarkovModel`] predicts from transitions seen in each client's
//!   stream of reads (`Engine::note_access`), following the strongest rule up to
//!   `prefetch_keys_max` steps, as far as the byte budget covers; the cold ones once half
//!   of those or the next one are missing (as the kernel's readahead asks for its next
//!   window), by runs of blocks in one GET each.
//!
//! It runs off the request's path (the after-read queue of `hook` feeds a worker; a full
//! queue drops the job), within `prefetch_bytes_max` per cold read, `prefetch_tasks_max`
//! concurrent jobs and `prefetch_fetches_max` object-store GETs in flight (taken in the
//! order the model ranks its keys; predicted keys whose blocks lie end to end in a segment
//! come in one GET, or two when a client's read is fetching a block in the middle), so a
//! read that misses is not queued at the object store behind many guesses.
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
    /// Prefetch GETs at the object store now, and how many may be ([`FetchWindow`]).
    fetches: FetchWindow,
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
            fetches: FetchWindow::new(fetches_max),
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

    /// Whether a job is fetching `key` now.
    pub(crate) fn is_fetching(&self, key: &Key) -> bool {
        self.fetching.lock().contains(key)
    }

    /// Marks `key` as being fetched by a job; false if another job already is.
    pub(crate) fn begin_fetch(&self, key: &Key) -> bool {
        self.fetching.lock().insert(key.clone())
    }

    pub(crate) fn end_fetch(&self, key: &Key) {
        self.fetching.lock().remove(key);
    }

    /// Counts a client's read from the object store until the guard drops, which also
    /// tells the fetch window how long it took ([`FetchWindow::demand_done`]). `joins`: the
    /// read joins a GET of its block already in flight (it says nothing of the store).
    pub(crate) fn demand_read(&self, joins: bool) -> DemandRead<'_> {
        self.demand.fetch_add(1, Ordering::AcqRel);
        DemandRead {
            p: self,
            started: std::time::Instant::now(),
            joins,
            beside_prefetch: self.fetches.in_flight.load(Ordering::Acquire) > 0,
        }
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

    /// Waits for a permit to GET a predicted value from the object store (first come, first
    /// served); held until the GET is done.
    pub(crate) async fn fetch_permit(&self) -> FetchPermit<'_> {
        let w = &self.fetches;
        loop {
            let freed = w.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let n = w.in_flight.load(Ordering::Acquire);
            if n < w.limit.load(Ordering::Acquire) {
                if w.in_flight
                    .compare_exchange(n, n + 1, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    return FetchPermit(w);
                }
                continue;
            }
            freed.await;
        }
    }

    /// Prefetch GETs allowed in flight now.
    pub(crate) fn fetch_limit(&self) -> usize {
        self.fetches.limit.load(Ordering::Relaxed)
    }
}

/// How many prefetch GETs may be at the object store at once: between 1 and
/// `prefetch_fetches_max` (where it starts), found from the clients' reads that sent a GET
/// of their own while prefetch GETs were in flight: one that took more than
/// [`SLOWED_DOWN`] times the usual (a moving average of those that started with none in
/// flight) halves it (on a store that serves requests one after another, a small server or
/// one disk, every guess in flight delays a read that misses); [`UNSLOWED_TO_GROW`] in a
/// row that did not add one (a store that serves in parallel keeps the full window).
struct FetchWindow {
    max: usize,
    limit: AtomicUsize,
    in_flight: AtomicUsize,
    freed: tokio::sync::Notify,
    /// Client reads beside prefetch GETs in a row that were not slowed down.
    unslowed: AtomicUsize,
    /// Moving average of the client reads from the store that started with no prefetch
    /// GET in flight, in microseconds (0: none yet).
    usual_us: AtomicU64,
}

/// How much slower than usual a client's read beside prefetch GETs may be before the
/// window halves.
const SLOWED_DOWN: f64 = 1.5;

/// Client reads beside prefetch GETs, none slowed down, that widen the window by one.
const UNSLOWED_TO_GROW: usize = 4;

impl FetchWindow {
    fn new(max: usize) -> FetchWindow {
        let max = max.max(1);
        FetchWindow {
            max,
            limit: AtomicUsize::new(max),
            in_flight: AtomicUsize::new(0),
            freed: tokio::sync::Notify::new(),
            unslowed: AtomicUsize::new(0),
            usual_us: AtomicU64::new(0),
        }
    }

    /// A client's GET of its own took `us`; `beside_prefetch`: prefetch GETs were in
    /// flight when it started.
    fn demand_done(&self, us: u64, beside_prefetch: bool) {
        let usual = self.usual_us.load(Ordering::Relaxed);
        if !beside_prefetch {
            let next = if usual == 0 { us } else { (usual * 7 + us) / 8 };
            self.usual_us.store(next.max(1), Ordering::Relaxed);
            return;
        }
        if usual == 0 {
            return;
        }
        let slowed = us as f64 > usual as f64 * SLOWED_DOWN;
        let grow = !slowed && self.unslowed.fetch_add(1, Ordering::Relaxed) + 1 >= UNSLOWED_TO_GROW;
        if slowed || grow {
            self.unslowed.store(0, Ordering::Relaxed);
            let max = self.max;
            let _ = self
                .limit
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |l| {
                    Some(if slowed {
                        (l / 2).max(1)
                    } else {
                        (l + 1).min(max)
                    })
                });
        }
    }
}

/// A prefetch GET in flight; its drop frees its place in the window.
pub(crate) struct FetchPermit<'a>(&'a FetchWindow);

impl Drop for FetchPermit<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.freed.notify_waiters();
    }
}

/// Longest a prefetch GET waits for clients' reads from the object store to finish.
const DEMAND_WAIT_MAX: std::time::Duration = std::time::Duration::from_millis(10);

/// A client's read from the object store, counted while it lives.
pub(crate) struct DemandRead<'a> {
    p: &'a Prefetcher,
    started: std::time::Instant,
    joins: bool,
    beside_prefetch: bool,
}

impl Drop for DemandRead<'_> {
    fn drop(&mut self) {
        if !self.joins {
            let us = self.started.elapsed().as_micros() as u64;
            self.p.fetches.demand_done(us, self.beside_prefetch);
        }
        if self.p.demand.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.p.demand_done.notify_waiters();
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

    #[test]
    fn the_fetch_window_halves_when_guesses_slow_client_reads_and_grows_back() {
        let p = Prefetcher::new(true, 8);
        let w = &p.fetches;
        assert_eq!(p.fetch_limit(), 8);
        // Reads alone set the usual time; one beside guesses and a third slower is usual.
        for _ in 0..8 {
            w.demand_done(3_000, false);
        }
        w.demand_done(4_000, true);
        assert_eq!(
            p.fetch_limit(),
            8,
            "a read a third slower is within the usual"
        );
        // Slowed down twice as much: the window halves each time, down to one.
        for want in [4, 2, 1, 1] {
            w.demand_done(7_000, true);
            assert_eq!(p.fetch_limit(), want);
        }
        // Reads beside guesses at their usual speed add one, so many in a row.
        for want in [2, 3, 4] {
            for _ in 1..UNSLOWED_TO_GROW {
                w.demand_done(3_100, true);
            }
            assert_eq!(p.fetch_limit(), want - 1);
            w.demand_done(3_100, true);
            assert_eq!(p.fetch_limit(), want);
        }
        let held: Vec<_> = (0..4)
            .map(|_| p.fetch_permit().now_or_never().expect("within the window"))
            .collect();
        assert!(
            p.fetch_permit().now_or_never().is_none(),
            "one past the window waits"
        );
        drop(held);
        // A read that joined a GET already in flight tells nothing.
        drop(p.demand_read(true));
        assert_eq!(p.fetch_limit(), 4);
        // Grows no further than its maximum.
        for _ in 0..100 * UNSLOWED_TO_GROW {
            w.demand_done(2_000, true);
        }
        assert_eq!(p.fetch_limit(), 8);
    }

    #[tokio::test]
    async fn prefetch_gets_wait_for_client_reads_from_the_store_but_not_forever() {
        let p = Prefetcher::new(true, 2);
        assert!(
            p.after_demand().now_or_never().is_some(),
            "no client read: at once"
        );
        let read = p.demand_read(false);
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
        let _endless = p.demand_read(false);
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
