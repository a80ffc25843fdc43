//! Blocking work the engine does for itself (write-back settles and compactions, demotion,
//! segment rewrites, backups) runs here: on a few threads of its own at a lower CPU
//! priority, so that on a busy core the threads serving clients run first and background
//! work takes the time they leave. (RocksDB's own flush and compaction threads are lowered
//! the same way, in `strata-rocks`, and the `none` log hand-off runs on a lowered thread of
//! its own, `durability::flush_log_every`.) Work a client waits for runs on the runtime's
//! blocking pool instead. The runtime's threads ask for a short time slice
//! ([`serve_clients_promptly`]), so that a client thread woken on a core where background
//! work runs takes the core at once instead of after the background thread's slice.

use std::cell::Cell;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// Threads of the pool: background rounds run one at a time, beside a backup.
const THREADS: usize = 2;
/// The nice value of the pool's threads (0 is a client's; 19 the lowest). At 10 the
/// scheduler gives a busy core's client threads about ten times their share.
const NICE: i32 = 10;
/// The time slice, in nanoseconds, the threads serving clients ask for (the kernel's
/// shortest; its default is 0.7 ms times a factor that grows with the CPU count, 1.4 ms
/// on two CPUs). A thread with a shorter slice than the running one
/// takes the core when it wakes; it gets no larger share of the core for it.
const CLIENT_SLICE_NS: u64 = 100_000;
/// Jobs waiting for a thread; the callers await each job, so at most a few ever wait.
const QUEUE_JOBS_MAX: usize = 64;
/// How long a lowered thread works between the points where it gives way ([`give_way`]).
const GIVE_WAY_EVERY: Duration = Duration::from_micros(200);

/// Calls of [`give_way`] between two readings of the clock (a loop's step is a
/// microsecond or more; a reading costs tens of nanoseconds).
const GIVE_WAY_CALLS_PER_CHECK: u32 = 16;

thread_local! {
    /// On a lowered thread, when it last gave way; `None` on every other thread.
    static GAVE_WAY: Cell<Option<Instant>> = const { Cell::new(None) };
    /// Calls of [`give_way`] since the clock was last read.
    static GIVE_WAY_CALLS: Cell<u32> = const { Cell::new(0) };
}

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

/// Lowers the calling thread's CPU priority to [`NICE`], with the kernel's default time
/// slice (a thread started from a runtime thread inherits its short one). Best effort: a
/// failure leaves it as it was.
pub(crate) fn lower_priority() {
    // SAFETY: setpriority on this thread's id only changes its scheduling weight.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, NICE);
    }
    set_slice(0);
    GAVE_WAY.with(|g| g.set(Some(Instant::now())));
}

/// A point in background work's loops where, on a lowered thread that has worked
/// [`GIVE_WAY_EVERY`] since it last gave way, the thread gives the CPU to whatever waits
/// for it (`sched_yield`), and says so. Elsewhere it does nothing. It reads the clock
/// once every [`GIVE_WAY_CALLS_PER_CHECK`] calls.
///
/// Once the scheduler picks a lowered thread on a busy core, that thread keeps the core
/// until it blocks or the next timer tick (4 ms at 250 Hz), while a runtime thread with
/// requests ready waits: a client woken meanwhile wakes no one, the runtime thread is
/// awake already. A scheduler trace of the tails benchmark (`perf sched`) showed runtime
/// threads waiting to run for 1 to 4 ms 48 times in 3 s, behind the write-back,
/// demotion and log threads.
pub(crate) fn give_way() -> bool {
    GAVE_WAY.with(|g| {
        let Some(last) = g.get() else {
            return false;
        };
        let calls = GIVE_WAY_CALLS.with(|c| {
            let n = c.get() + 1;
            c.set(n % GIVE_WAY_CALLS_PER_CHECK);
            n
        });
        if calls < GIVE_WAY_CALLS_PER_CHECK || last.elapsed() < GIVE_WAY_EVERY {
            return false;
        }
        // SAFETY: sched_yield takes no arguments and only reschedules this thread.
        unsafe { libc::sched_yield() };
        g.set(Some(Instant::now()));
        true
    })
}

/// Asks the kernel for a short time slice ([`CLIENT_SLICE_NS`]) for the calling thread: the
/// runtime calls it on each of its threads. Best effort: a kernel without custom slices
/// (before Linux 6.12) keeps its default, and a failure leaves the thread as it was.
pub fn serve_clients_promptly() {
    set_slice(CLIENT_SLICE_NS);
}

/// Sets the calling thread's time slice to `ns` (0: the kernel's default), keeping its
/// policy and nice value. Best effort, as [`serve_clients_promptly`].
fn set_slice(ns: u64) {
    let Some(mut attr) = sched_attr() else {
        return;
    };
    if attr.sched_policy != libc::SCHED_OTHER as u32 {
        return;
    }
    attr.size = std::mem::size_of::<libc::sched_attr>() as u32;
    attr.sched_flags = 0;
    attr.sched_runtime = ns;
    // SAFETY: the attribute is a full, initialised `sched_attr` of the size given; tid 0
    // is the calling thread.
    unsafe {
        libc::syscall(
            libc::SYS_sched_setattr,
            0,
            &attr as *const libc::sched_attr,
            0,
        );
    }
}

/// The calling thread's scheduling attributes, or `None` if the kernel will not say.
fn sched_attr() -> Option<libc::sched_attr> {
    // SAFETY: sched_attr is plain integers; all zeroes is a valid value.
    let mut attr: libc::sched_attr = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::sched_attr>() as libc::c_uint;
    // SAFETY: the kernel writes at most `size` bytes into `attr`; tid 0 is this thread.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            0,
            &mut attr as *mut libc::sched_attr,
            size,
            0,
        )
    };
    (r == 0).then_some(attr)
}

/// Starts a thread of its own named `name`, at [`NICE`], that passes every job sent through
/// the returned [`Lowered`] (at most `queue` waiting) to `serve`, and ends when that is
/// dropped. If the thread cannot start, the failure is logged and every send fails:
/// callers treat that as the thread's absence.
pub(crate) fn lowered_thread<J: Send + 'static>(
    name: &str,
    queue: usize,
    mut serve: impl FnMut(J) + Send + 'static,
) -> Lowered<J> {
    let (tx, rx) = sync_channel::<J>(queue);
    let started = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            lower_priority();
            while let Ok(job) = rx.recv() {
                serve(job);
            }
        });
    let thread = started
        .map_err(|e| tracing::warn!("thread {name} not started: {e}"))
        .ok();
    Lowered {
        tx: thread.is_some().then_some(tx),
        thread,
    }
}

/// A thread of [`lowered_thread`]'s. Dropping it ends the thread and waits for it, so
/// what `serve` holds (the warm store, a file) is let go before the drop returns: let go
/// by a thread left running, the last handle on RocksDB closed it while the process's
/// exit tore down RocksDB's statics (a crash at the end of a test, 1 run in 40).
pub(crate) struct Lowered<J> {
    tx: Option<SyncSender<J>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl<J> Lowered<J> {
    /// Sends `job`, waiting for room; `Err` if the thread is gone.
    pub(crate) fn send(&self, job: J) -> std::result::Result<(), J> {
        match &self.tx {
            Some(tx) => tx.send(job).map_err(|e| e.0),
            None => Err(job),
        }
    }

    /// Sends `job` if there is room; `Err` if not, or if the thread is gone.
    pub(crate) fn try_send(&self, job: J) -> std::result::Result<(), J> {
        match &self.tx {
            Some(tx) => tx.try_send(job).map_err(|e| match e {
                std::sync::mpsc::TrySendError::Full(j)
                | std::sync::mpsc::TrySendError::Disconnected(j) => j,
            }),
            None => Err(job),
        }
    }
}

impl<J> Drop for Lowered<J> {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            // Dropped by a job of its own thread: that thread ends after the job.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
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

    #[test]
    fn a_client_thread_asks_for_a_short_slice_and_keeps_its_nice_value() {
        std::thread::spawn(|| {
            let before = super::sched_attr().expect("sched_getattr");
            // Before Linux 6.12 a fair thread reports no slice and none can be set.
            if before.sched_runtime == 0 {
                eprintln!("this kernel has no custom time slices; nothing to check");
                return;
            }
            assert!(
                before.sched_runtime > super::CLIENT_SLICE_NS,
                "{}",
                before.sched_runtime
            );
            super::serve_clients_promptly();
            let after = super::sched_attr().expect("sched_getattr");
            assert_eq!(after.sched_runtime, super::CLIENT_SLICE_NS);
            assert_eq!(after.sched_policy, libc::SCHED_OTHER as u32);
            assert_eq!(after.sched_nice, before.sched_nice);
            // Background threads started from it go back to the default slice.
            std::thread::spawn(move || {
                let inherited = super::sched_attr().expect("sched_getattr");
                assert_eq!(inherited.sched_runtime, super::CLIENT_SLICE_NS);
                super::lower_priority();
                let lowered = super::sched_attr().expect("sched_getattr");
                assert_eq!(lowered.sched_runtime, before.sched_runtime);
                assert_eq!(lowered.sched_nice, super::NICE);
            })
            .join()
            .unwrap();
        })
        .join()
        .unwrap();
    }

    /// Works on the calling thread until more than a give-way period has passed.
    fn work_a_period() {
        let start = std::time::Instant::now();
        while start.elapsed() <= super::GIVE_WAY_EVERY {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn a_lowered_thread_gives_way_after_a_period_of_work_and_a_client_thread_never() {
        std::thread::spawn(|| {
            // How many calls, each after `work`, until the thread gives way (`None`: not
            // within a few clock readings).
            let calls_until_it_gives_way = |work: fn()| {
                (1..=4 * super::GIVE_WAY_CALLS_PER_CHECK).find(|_| {
                    work();
                    super::give_way()
                })
            };
            let period = super::GIVE_WAY_CALLS_PER_CHECK;
            assert_eq!(
                calls_until_it_gives_way(work_a_period),
                None,
                "a client's thread never gives way"
            );
            super::lower_priority();
            // It reads the clock every `period` calls, and gives way at the first reading
            // past a period of work; then the count starts again. (Nothing here asserts
            // that it does not give way after too little work: that would depend on how
            // long the test thread waits for a core.)
            let first = calls_until_it_gives_way(work_a_period).expect("it gives way");
            assert!(first <= period, "{first}");
            assert_eq!(calls_until_it_gives_way(work_a_period), Some(period));
            assert_eq!(calls_until_it_gives_way(work_a_period), Some(period));
        })
        .join()
        .unwrap();
    }
}
