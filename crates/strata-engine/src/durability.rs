//! Durability: every write hands back a [`Ticket`], and is acknowledged to anyone only once
//! its ticket is waited for ([`crate::Engine::wait`]). With `durability = group`, writers
//! append to the log without syncing and wait for one shared fsync that covers their
//! write (group commit); with `sync` the write synced itself and with `none` nothing is
//! waited for, so their tickets are empty. A failed fsync poisons the engine; it is never
//! retried. With `none`, the warm store may keep log records in the process; a task hands
//! them to the operating system every `none_flush_ms` ([`flush_log_every`]), which bounds
//! what a killed process loses.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use strata_warm::WarmStore;
use tokio::sync::watch;

use crate::stats::{add, Counters};
use crate::vlog::ValueLog;
use crate::writeback::log::HotLog;
use crate::{Error, Result};

/// What a write must wait for before it is acknowledged: the group commit that covers it.
/// Tickets are ordered; waiting for one covers every earlier one, so a caller that made
/// many writes keeps the largest (`Ord::max`) and waits once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket(pub(crate) u64);

impl Ticket {
    /// Nothing to wait for.
    pub const NONE: Ticket = Ticket(0);

    pub fn is_none(self) -> bool {
        self.0 == 0
    }
}

/// A write's result and the ticket to wait for before acknowledging it.
#[must_use = "a write may be acknowledged only once its ticket is waited for"]
#[derive(Debug)]
pub struct Written<T> {
    pub value: T,
    pub ticket: Ticket,
}

impl<T> Written<T> {
    pub(crate) fn new(value: T, ticket: Ticket) -> Self {
        Written { value, ticket }
    }

    /// Adds the ticket to `pending` (to be waited for once, later, with others) and hands
    /// back the result.
    pub fn defer(self, pending: &mut Ticket) -> T {
        *pending = (*pending).max(self.ticket);
        self.value
    }
}

/// Writes no one waits for (a settle's records, expiry, a cold value's return, a caller
/// that deferred its ticket) are synced at most this long after they were logged, so the
/// hot log's buffer does not grow while no client writes.
const UNWAITED_SYNC_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// Why tickets above the synced one will never be synced.
#[derive(Debug, Clone)]
enum Stopped {
    /// A sync failed (the engine is poisoned).
    Failed(String),
    /// The engine closed.
    Closed,
}

#[derive(Default)]
struct Requests {
    /// Tickets handed out: writes in the logs.
    requested: u64,
    /// The highest ticket someone waits for. The sync starts once a writer waits, not when
    /// it writes: a connection waits after the requests that arrived with its own ran (see
    /// the server's `conn.rs`), so one sync covers them all, as Redis's one `fsync` per
    /// turn of its event loop does.
    wanted: u64,
    stop: bool,
}

pub(crate) struct GroupCommit {
    requests: Mutex<Requests>,
    wake: Condvar,
    /// (highest synced ticket, why no higher one will be).
    synced: watch::Sender<(u64, Option<Stopped>)>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl GroupCommit {
    pub(crate) fn start(
        warm: Arc<dyn WarmStore>,
        vlog: Arc<ValueLog>,
        hot: Arc<HotLog>,
        counters: Arc<Counters>,
    ) -> Arc<Self> {
        let (tx, _rx) = watch::channel((0, None));
        let gc = Arc::new(GroupCommit {
            requests: Mutex::default(),
            wake: Condvar::new(),
            synced: tx,
            thread: Mutex::new(None),
        });
        let me = Arc::clone(&gc);
        let handle = std::thread::Builder::new()
            .name("strata-group-commit".into())
            .spawn(move || me.run(warm.as_ref(), &vlog, &hot, &counters))
            .expect("spawn group commit thread");
        *gc.thread.lock() = Some(handle);
        gc
    }

    fn run(&self, warm: &dyn WarmStore, vlog: &ValueLog, hot: &HotLog, counters: &Counters) {
        let mut synced = 0;
        // The warm store's sequence when its log was last synced here: a write that was
        // committed before a ticket was asked for has a sequence at or below what the store
        // reports after, so while that has not moved its log holds nothing new to sync (a
        // run of write-back `SET`s writes only the hot log). The first round always syncs.
        let mut warm_synced = None;
        loop {
            let target = {
                let mut r = self.requests.lock();
                while r.wanted <= synced && !r.stop {
                    let waited = self.wake.wait_for(&mut r, UNWAITED_SYNC_AFTER);
                    if waited.timed_out() && r.requested > synced {
                        break;
                    }
                }
                if r.requested == synced && r.stop {
                    return;
                }
                r.requested
            };
            if let Err(e) = sync_logs(warm, vlog, hot, &mut warm_synced, counters) {
                let e = e.to_string();
                tracing::error!(error = %e, "log fsync failed; refusing further writes");
                self.synced.send_replace((synced, Some(Stopped::Failed(e))));
                // The thread keeps the stores until the engine stops it: if it let them go
                // now, the last handle to the warm store could close it on this thread
                // while the process exits (a crash in RocksDB's teardown).
                let mut r = self.requests.lock();
                while !r.stop {
                    self.wake.wait(&mut r);
                }
                return;
            }
            synced = target;
            add(&counters.group_commits);
            self.synced.send_replace((synced, None));
        }
    }

    /// The last ticket handed out.
    pub(crate) fn requested(&self) -> u64 {
        self.requests.lock().requested
    }

    /// Registers a write already in the log; returns the ticket to wait for.
    pub(crate) fn request(&self) -> Ticket {
        let mut r = self.requests.lock();
        r.requested += 1;
        Ticket(r.requested)
    }

    pub(crate) async fn wait(&self, ticket: Ticket) -> Result<()> {
        let mut rx = self.synced.subscribe();
        if rx.borrow().0 < ticket.0 {
            let mut r = self.requests.lock();
            if r.wanted < ticket.0 {
                r.wanted = ticket.0;
                self.wake.notify_one();
            }
        }
        let state = rx
            .wait_for(|(s, err)| *s >= ticket.0 || err.is_some())
            .await
            .map_err(|_| Error::Closed)?;
        match &state.1 {
            _ if state.0 >= ticket.0 => Ok(()),
            Some(Stopped::Failed(e)) => Err(Error::Poisoned(e.clone())),
            Some(Stopped::Closed) => Err(Error::Closed),
            None => Ok(()),
        }
    }

    /// Syncs what is pending, stops the thread and waits for it (it holds the store).
    pub(crate) fn stop(&self) {
        self.requests.lock().stop = true;
        self.wake.notify_one();
        if let Some(h) = self.thread.lock().take() {
            let _ = h.join();
        }
        // A write that raced the close may have taken a ticket after the last sync: its
        // wait ends with an error instead of never.
        self.synced.send_modify(|(_, why)| {
            why.get_or_insert(Stopped::Closed);
        });
    }
}

/// Makes every write so far durable (the group commit's round, and `SAVE`): live values'
/// changes and unlogged dirty values into the logs first (see `live`, `writeback`), a buffer
/// at a time; values before the records that point at them (see `vlog`); the hot log after
/// the warm store's, up to where it stood before. `warm_synced` is the warm store's
/// sequence at its last sync here: while the store's has not moved, its log holds nothing
/// new and is not synced again.
pub(crate) fn sync_logs(
    warm: &dyn WarmStore,
    vlog: &ValueLog,
    hot: &HotLog,
    warm_synced: &mut Option<u64>,
    counters: &Counters,
) -> Result<()> {
    loop {
        let all = hot.log_deferred()?;
        let hot_upto = hot.mark();
        vlog.sync()?;
        let seq = warm.last_sequence();
        if *warm_synced != Some(seq) {
            warm.sync_log()?;
            *warm_synced = Some(seq);
            add(&counters.group_commits_warm);
        }
        hot.write_out(hot_upto, true)?;
        if all {
            return Ok(());
        }
    }
}

/// Hands the warm store's buffered log to the operating system every `period` until
/// `shutdown` (`durability = none`: what a killed process may lose is at most one period of
/// acknowledged writes). A failed flush is retried on the next tick; it is not a sync, and
/// nothing was promised durable.
///
/// A period's writes can take a while to copy into the page cache: the hand-off runs off
/// the runtime's workers, on a thread of its own at the background work's priority, so on
/// a busy core the requests served beside it run first (at a client's priority it held
/// each woken request for the rest of its time slice: GET p99 of milliseconds beside a
/// fast writer, `reports/tails-fast-writer.md`). Past half the period clients' writes wait
/// for it ([`HotLog::pace`]); what is left after a whole period goes on at a client's
/// priority: the period still bounds what a kill loses.
pub(crate) async fn flush_log_every(
    warm: Arc<dyn WarmStore>,
    hot: Arc<HotLog>,
    period: std::time::Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let low = low_hand_off(Arc::clone(&warm), Arc::clone(&hot));
    loop {
        // Live values are stored, and dirty values logged, on the tick, which bounds what a
        // kill loses; not when the buffer fills early (their records fill it, so each would
        // call for the next).
        let fold = tokio::select! {
            _ = shutdown.changed() => return,
            _ = tick.tick() => true,
            _ = hot.full.notified() => false,
        };
        let until = std::time::Instant::now() + period;
        let (done, finished) = tokio::sync::oneshot::channel();
        let lowered = match low.send((fold, until, done)) {
            Ok(()) => {
                tokio::pin!(finished);
                let on_time = tokio::time::timeout(period / 2, &mut finished).await;
                match on_time {
                    Ok(r) => r.unwrap_or(false),
                    Err(_) => {
                        hot.begin_late();
                        finished.await.unwrap_or(false)
                    }
                }
            }
            Err(_) => false,
        };
        let flushed = match lowered {
            true => Ok(true),
            false => {
                let (w, h) = (Arc::clone(&warm), Arc::clone(&hot));
                tokio::task::spawn_blocking(move || hand_off(&*w, &h, fold, None)).await
            }
        };
        hot.end_late();
        if flushed.is_err() {
            tracing::warn!("the log flush task panicked");
        }
    }
}

/// A hand-off job: `fold`, the instant to stop at, and where to say whether it finished.
type HandOffJob = (bool, std::time::Instant, tokio::sync::oneshot::Sender<bool>);

/// Starts the thread that runs the hand-offs at the background work's priority (a thread
/// of its own: on the shared pool one could wait seconds behind a background round). It
/// ends, and is waited for, when the returned handle is dropped. If it could not start,
/// every send fails and hand-offs run at a client's priority.
fn low_hand_off(warm: Arc<dyn WarmStore>, hot: Arc<HotLog>) -> crate::offload::Lowered<HandOffJob> {
    crate::offload::lowered_thread("strata-log", 1, move |(fold, until, done): HandOffJob| {
        let _ = done.send(hand_off(&*warm, &hot, fold, Some(until)));
    })
}

/// Logs what DRAM holds unlogged (with `fold`, live values' changes too) and hands both
/// logs to the operating system, a buffer at a time; a failure leaves the rest for the next
/// tick. With `until`, stops once that instant has passed and says whether it finished
/// (true also after a failure: nothing more is tried this tick).
fn hand_off(
    warm: &dyn WarmStore,
    hot: &HotLog,
    fold: bool,
    until: Option<std::time::Instant>,
) -> bool {
    loop {
        // Live values' changes and unlogged dirty values into the logs first (see `live`,
        // `writeback`); a failure leaves them as they are, for the next tick.
        let all = if fold { hot.log_deferred() } else { Ok(true) };
        let all = all.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "storing live values failed; retrying");
            true
        });
        let hot_upto = hot.mark();
        if let Err(e) = warm.flush_log() {
            tracing::warn!(error = %e, "handing the write-ahead log to the OS failed; retrying");
            return true;
        } else if let Err(e) = hot.write_out(hot_upto, false) {
            // Those records are dropped from the log; their values stay dirty in memory
            // until a checkpoint writes them.
            tracing::warn!(error = %e, "handing the hot log to the OS failed");
        }
        if all {
            return true;
        }
        crate::offload::give_way();
        if until.is_some_and(|t| std::time::Instant::now() >= t) {
            return false;
        }
    }
}
