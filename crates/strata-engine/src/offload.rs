//! Blocking work the engine does for itself (write-back settles and compactions, demotion,
//! segment rewrites, backups) runs here: on a few threads of its own at a lower CPU
//! priority, so that on a busy core the threads serving clients run first and background
//! work takes the time they leave. (RocksDB's own flush and compaction threads are lowered
//! the same way, in `strata-rocks`, and the `none` log hand-off runs on a lowered thread of
//! its own, `durability::flush_log_every`.) Work a client waits for runs on the runtime's
//! blocking pool instead.

use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::OnceLock;

use crate::{Error, Result};

/// Threads of the pool: background rounds run one at a time, beside a backup.
const THREADS: usize = 2;
/// The nice value of the pool's threads (0 is a client's; 19 the lowest). At 10 the
/// scheduler gives a busy core's client threads about ten times their share.
const NICE: i32 = 10;
/// Jobs waiting for a thread; the callers await each job, so at most a few ever wait.
const QUEUE_JOBS_MAX: usize = 64;

type Job = Box<dyn FnOnce() + Send>;

fn pool() -> &'static SyncSender<Job> {
    static POOL: OnceLock<SyncSender<Job>> = OnceLock::new();
    POOL.get_or_init(|| {
        let (tx, rx) = sync_channel::<Job>(QUEUE_JOBS_MAX);
        let rx = std::sync::Arc::new(parking_lot::Mutex::new(rx));
        for i in 0..THREADS {
            let rx = std::sync::Arc::clone(&rx);
            std::thread::Builder::new()
                .name(format!("strata-bg-{i}"))
                .spawn(move || {
                    lower_priority();
                    loop {
                        let job = rx.lock().recv();
                        match job {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    }
                })
                .expect("starting a background thread");
        }
        tx
    })
}

/// Lowers the calling thread's CPU priority to [`NICE`] (best effort: a failure leaves it
/// as it was).
pub(crate) fn lower_priority() {
    // SAFETY: setpriority on this thread's id only changes its scheduling weight.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, NICE);
    }
}

/// Starts a thread of its own named `name`, at [`NICE`], that passes every job sent on the
/// returned channel (at most `queue` waiting) to `serve`, and ends once the sender is
/// dropped. If the thread cannot start, the failure is logged and every send fails (the
/// receiver is gone): callers treat that as the thread's absence.
pub(crate) fn lowered_thread<J: Send + 'static>(
    name: &str,
    queue: usize,
    mut serve: impl FnMut(J) + Send + 'static,
) -> SyncSender<J> {
    let (tx, rx) = sync_channel::<J>(queue);
    let started = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            lower_priority();
            while let Ok(job) = rx.recv() {
                serve(job);
            }
        });
    if let Err(e) = started {
        tracing::warn!("thread {name} not started: {e}");
    }
    tx
}

/// Runs `f` on a background thread and waits for its result without blocking the runtime.
/// `what` names the work in the error a panic becomes.
pub(crate) async fn run<T, F>(what: &'static str, f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        let _ = tx.send(out);
    });
    // The queue is far from full (see QUEUE_JOBS_MAX); a send only fails once the pool's
    // threads are gone, which they never are while the process runs.
    pool()
        .send(job)
        .map_err(|_| Error::Internal(format!("{what}: the background threads are gone")))?;
    match rx.await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(_)) => Err(Error::Internal(format!("{what}: the task panicked"))),
        Err(_) => Err(Error::Internal(format!("{what}: the task was dropped"))),
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn work_runs_at_a_lower_priority_and_a_panic_is_an_error() {
        let nice = super::run("test", || unsafe {
            libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t)
        })
        .await
        .unwrap();
        assert_eq!(nice, super::NICE);
        let e = super::run::<(), _>("a panicking job", || panic!("boom"))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("a panicking job"), "{e}");
        // The pool still works after a panic.
        assert_eq!(super::run("test", || 2 + 2).await.unwrap(), 4);
    }
}
