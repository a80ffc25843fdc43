//! Blocking work the engine does for itself (write-back settles and compactions, demotion,
//! segment rewrites, backups) runs here, on threads of its own in the scheduler's idle
//! class (`SCHED_IDLE`): a thread serving clients that wakes takes the CPU from them at
//! once, so on a busy core background work only takes the time clients leave. (At nice 10
//! it held a woken client for the rest of its time slice, milliseconds: GET p99 2 ms
//! beside a writer, `reports/tails.md`.) While a client waits for background work (a write
//! at the warm tier's hard limit waits for demotion: [`urgent`]) a thread at nice 10 takes
//! the queued jobs too, so a core kept busy by other clients cannot starve that work, and
//! the idle threads are raised to nice 10 where the process may raise them (root or
//! `CAP_SYS_NICE`; elsewhere a job an idle thread already runs waits for a free moment).
//! RocksDB's own flush and compaction threads are lowered in `strata-rocks` (nice 19);
//! the `none` log hand-off runs on a nice-10 thread of its own
//! (`durability::flush_log_every`), which clients' writes wait for when it is late. Work
//! a client waits for runs on the runtime's blocking pool instead.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::OnceLock;

use parking_lot::{Condvar, Mutex};

use crate::{Error, Result};

/// Idle-class threads of the pool: background rounds run one at a time, beside a backup.
const IDLE_THREADS: usize = 2;
/// Nice-10 threads that take the pool's jobs while a client waits for them.
const URGENT_THREADS: usize = 1;
/// The nice value of the threads that are not idle-class (0 is a client's; 19 the lowest).
/// At 10 the scheduler gives a busy core's client threads about ten times their share.
const NICE: i32 = 10;
/// Jobs waiting for a thread; the callers await each job, so at most a few ever wait.
const QUEUE_JOBS_MAX: usize = 64;

type Job = Box<dyn FnOnce() + Send>;

/// The pool's queue, shared by its idle and urgent threads.
struct Pool {
    jobs: Mutex<VecDeque<Job>>,
    /// A job was queued (the idle threads wait here).
    queued: Condvar,
    /// A job was queued while clients wait, or they began to (the urgent threads).
    hurry: Condvar,
    /// A job left the queue (a full queue's sender waits here).
    taken: Condvar,
    /// Clients waiting for background work now ([`Urgent`] guards).
    waiting: AtomicUsize,
    /// The idle threads' ids, raised while clients wait.
    idle_tids: Mutex<Vec<libc::pid_t>>,
}

/// How a thread of its own is scheduled ([`lowered_thread`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Class {
    /// Nice [`NICE`]: about a tenth of a busy core.
    Low,
    /// The idle class: only what clients leave.
    Idle,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<&'static Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let pool: &'static Pool = Box::leak(Box::new(Pool {
            jobs: Mutex::new(VecDeque::new()),
            queued: Condvar::new(),
            hurry: Condvar::new(),
            taken: Condvar::new(),
            waiting: AtomicUsize::new(0),
            idle_tids: Mutex::new(Vec::new()),
        }));
        for i in 0..IDLE_THREADS + URGENT_THREADS {
            let urgent = i >= IDLE_THREADS;
            let name = match urgent {
                false => format!("strata-bg-{i}"),
                true => format!("strata-bg-urgent-{}", i - IDLE_THREADS),
            };
            std::thread::Builder::new()
                .name(name)
                .spawn(move || {
                    if urgent {
                        set_class(Class::Low);
                    } else {
                        set_class(Class::Idle);
                        pool.idle_tids.lock().push(gettid());
                    }
                    loop {
                        let job = {
                            let mut q = pool.jobs.lock();
                            loop {
                                let may = !urgent || pool.waiting.load(Ordering::Acquire) > 0;
                                if let Some(job) = may.then(|| q.pop_front()).flatten() {
                                    break job;
                                }
                                match urgent {
                                    false => pool.queued.wait(&mut q),
                                    true => pool.hurry.wait(&mut q),
                                }
                            }
                        };
                        pool.taken.notify_one();
                        job();
                    }
                })
                .expect("starting a background thread");
        }
        pool
    })
}

fn gettid() -> libc::pid_t {
    // SAFETY: a plain syscall with no arguments.
    unsafe { libc::gettid() }
}

/// Schedules thread `tid` of this process as `class` (best effort: a failure leaves it as
/// it was; leaving the idle class needs the right to raise a priority). The nice value
/// comes first: a thread later raised out of the idle class is at nice 10.
fn set_class_of(tid: libc::pid_t, class: Class) {
    let param = libc::sched_param { sched_priority: 0 };
    let policy = match class {
        Class::Low => libc::SCHED_OTHER,
        Class::Idle => libc::SCHED_IDLE,
    };
    // SAFETY: scheduling calls on a thread id of this process; they change only how it is
    // scheduled.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, NICE);
        libc::sched_setscheduler(tid, policy, &param);
    }
}

/// Schedules the calling thread as `class`.
pub(crate) fn set_class(class: Class) {
    set_class_of(gettid(), class);
}

/// While held, a client waits for background work: queued jobs also go to the nice-10
/// thread, and the idle threads are raised where allowed (see the module).
pub(crate) struct Urgent(());

/// Marks that a client waits for background work until the guard drops.
pub(crate) fn urgent() -> Urgent {
    let pool = pool();
    if pool.waiting.fetch_add(1, Ordering::AcqRel) == 0 {
        reclass(pool);
    }
    // Under the queue's lock, so an urgent thread between its look and its wait hears it.
    let _q = pool.jobs.lock();
    pool.hurry.notify_all();
    Urgent(())
}

impl Drop for Urgent {
    fn drop(&mut self) {
        let pool = pool();
        if pool.waiting.fetch_sub(1, Ordering::AcqRel) == 1 {
            reclass(pool);
        }
    }
}

/// Gives the idle threads the class that fits whether clients wait now (under the list's
/// lock, so of a guard's raise and another's lowering the later look wins).
fn reclass(pool: &Pool) {
    let tids = pool.idle_tids.lock();
    let class = match pool.waiting.load(Ordering::Acquire) {
        0 => Class::Idle,
        _ => Class::Low,
    };
    for &tid in tids.iter() {
        set_class_of(tid, class);
    }
}

/// Starts a thread of its own named `name`, scheduled as `class`, that passes every job
/// sent on the returned channel (at most `queue` waiting) to `serve`, and ends once the
/// sender is dropped. If the thread cannot start, the failure is logged and every send
/// fails (the receiver is gone): callers treat that as the thread's absence.
pub(crate) fn lowered_thread<J: Send + 'static>(
    name: &str,
    class: Class,
    queue: usize,
    mut serve: impl FnMut(J) + Send + 'static,
) -> SyncSender<J> {
    let (tx, rx) = sync_channel::<J>(queue);
    let started = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            set_class(class);
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
    // The queue is far from full (see QUEUE_JOBS_MAX): a sender waits only in theory.
    let pool = pool();
    {
        let mut q = pool.jobs.lock();
        while q.len() >= QUEUE_JOBS_MAX {
            pool.taken.wait(&mut q);
        }
        q.push_back(job);
        pool.queued.notify_one();
        if pool.waiting.load(Ordering::Acquire) > 0 {
            pool.hurry.notify_one();
        }
    }
    match rx.await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(_)) => Err(Error::Internal(format!("{what}: the task panicked"))),
        Err(_) => Err(Error::Internal(format!("{what}: the task was dropped"))),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    /// The pool is the process's: these tests take turns (under `cargo test` they share it).
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    /// This thread's scheduling policy and nice value.
    fn class_here() -> (i32, i32) {
        // SAFETY: reading this thread's own scheduling.
        unsafe {
            (
                libc::sched_getscheduler(0),
                libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t),
            )
        }
    }

    #[tokio::test]
    async fn work_runs_in_the_idle_class_and_a_panic_is_an_error() {
        let _serial = SERIAL.lock().await;
        let (policy, nice) = super::run("test", class_here).await.unwrap();
        assert_eq!(policy, libc::SCHED_IDLE);
        assert_eq!(nice, super::NICE);
        let e = super::run::<(), _>("a panicking job", || panic!("boom"))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("a panicking job"), "{e}");
        // The pool still works after a panic.
        assert_eq!(super::run("test", || 2 + 2).await.unwrap(), 4);
    }

    /// Idle threads that never get the CPU (here: held busy) must not hold up work a
    /// client waits for: while an [`super::Urgent`] guard lives, the nice-10 thread takes
    /// queued jobs; without one it leaves them to the idle threads.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiting_client_gets_background_work_past_starved_idle_threads() {
        let _serial = SERIAL.lock().await;
        let (release, held) = std::sync::mpsc::channel::<()>();
        let held = std::sync::Arc::new(parking_lot::Mutex::new(held));
        let mut busy = Vec::new();
        for _ in 0..super::IDLE_THREADS {
            let held = std::sync::Arc::clone(&held);
            busy.push(tokio::spawn(super::run("busy", move || {
                let _ = held.lock().recv();
            })));
        }
        // Both idle threads taken (one holds the lock, the other waits for it).
        tokio::time::sleep(Duration::from_millis(100)).await;
        let queued = tokio::spawn(super::run("queued", class_here));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !queued.is_finished(),
            "only an idle thread may take it without a waiting client"
        );
        let urgent = super::urgent();
        let (policy, nice) = tokio::time::timeout(Duration::from_secs(10), queued)
            .await
            .expect("the urgent thread takes the job")
            .unwrap()
            .unwrap();
        assert_eq!((policy, nice), (libc::SCHED_OTHER, super::NICE));
        drop(urgent);
        for _ in 0..super::IDLE_THREADS {
            release.send(()).unwrap();
        }
        for b in busy {
            b.await.unwrap().unwrap();
        }
    }
}
