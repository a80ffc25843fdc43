//! The jobs reads leave behind (returns to the warm tier, prefetches), run by one worker off
//! the reads' path (`hook`). Bounded: a full queue drops jobs, which are best effort.

use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use strata_format::{BlockRef, Key};
use tokio::sync::{mpsc, Notify};

/// Prefetch jobs waiting for the worker; more are dropped. Few: a job that waits long
/// prefetches for a reader that has moved on.
pub(crate) const JOBS_MAX: usize = 64;

pub(crate) struct Job {
    pub(crate) key: Key,
    /// The block a cold read just fetched (its neighbours are prefetched); `None` when the
    /// job only extends the prediction window (a prefetched value was just used).
    pub(crate) block: Option<(BlockRef, Bytes)>,
    /// The value a cold read just fetched from `block`, to write back to the warm tier, and
    /// the key's stripe version when it was read.
    pub(crate) back: Option<(u64, Bytes)>,
    /// Whether the prefetcher wants this job run too (or only the return).
    pub(crate) prefetch: bool,
    /// Whether to put the key's value, stored as parts, together into DRAM (a value read
    /// often from its parts: [`crate::live::read_from_parts`]).
    pub(crate) whole: bool,
}

/// The queue of prefetch jobs, and how many are not done yet.
#[derive(Default)]
pub(crate) struct AfterRead {
    queue: Mutex<Option<mpsc::Sender<Job>>>,
    /// Queued or running jobs.
    pending: AtomicUsize,
    idle: Notify,
}

impl AfterRead {
    /// Opens the queue; the worker reads the other end.
    pub(crate) fn open(&self) -> mpsc::Receiver<Job> {
        let (tx, rx) = mpsc::channel::<Job>(JOBS_MAX);
        *self.queue.lock() = Some(tx);
        rx
    }

    /// Queues `job`; drops it (and says so) when the queue is full or the worker gone.
    pub(crate) fn submit(&self, job: Job) -> bool {
        let queue = self.queue.lock();
        let Some(tx) = queue.as_ref() else {
            return false;
        };
        self.pending.fetch_add(1, Ordering::AcqRel);
        let queued = tx.try_send(job).is_ok();
        if !queued {
            self.done();
        }
        queued
    }

    /// One job is finished.
    pub(crate) fn done(&self) {
        if self.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle.notify_waiters();
        }
    }

    /// Waits until every queued job is done.
    pub(crate) async fn settle(&self) {
        loop {
            let idle = self.idle.notified();
            if self.pending.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }
}
