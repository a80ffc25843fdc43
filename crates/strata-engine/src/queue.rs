//! The queue of work reads leave behind (returns to the warm tier, prefetch jobs), done by
//! one worker off the reads' path (`hook`). Bounded: a full queue drops work, which is all
//! best effort.

use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use strata_format::{BlockRef, Key};
use tokio::sync::{mpsc, Notify};

/// Work waiting for the worker; more is dropped.
pub(crate) const QUEUE_MAX: usize = 4096;

pub(crate) struct Job {
    pub(crate) key: Key,
    /// The block a cold read just fetched (its neighbours are prefetched); `None` when the
    /// job only extends the prediction window (a prefetched value was just used).
    pub(crate) block: Option<(BlockRef, Bytes)>,
}

/// Work done after a read, off its path.
pub(crate) enum Work {
    /// Write a value read from the object store back to the warm tier.
    Return {
        key: Key,
        seen: u64,
        r: BlockRef,
        value: Bytes,
    },
    Prefetch(Job),
}

/// The queue of work after reads, and how much of it is not done yet.
#[derive(Default)]
pub(crate) struct AfterRead {
    queue: Mutex<Option<mpsc::Sender<Work>>>,
    /// Queued or running work items.
    pending: AtomicUsize,
    idle: Notify,
}

impl AfterRead {
    /// Opens the queue; the worker reads the other end.
    pub(crate) fn open(&self) -> mpsc::Receiver<Work> {
        let (tx, rx) = mpsc::channel::<Work>(QUEUE_MAX);
        *self.queue.lock() = Some(tx);
        rx
    }

    /// Queues `work`; drops it (and says so) when the queue is full or the worker gone.
    pub(crate) fn submit(&self, work: Work) -> bool {
        let queue = self.queue.lock();
        let Some(tx) = queue.as_ref() else {
            return false;
        };
        self.pending.fetch_add(1, Ordering::AcqRel);
        let queued = tx.try_send(work).is_ok();
        if !queued {
            self.done();
        }
        queued
    }

    /// One item of work is finished.
    pub(crate) fn done(&self) {
        if self.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle.notify_waiters();
        }
    }

    /// Waits until every queued item is done.
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
