//! Background work, one task per engine: expire due keys (`expire`), demote warm entries to
//! the cold tier when warm is over budget (`demote`), and collect or rewrite segments and
//! value-log files (`collect`).

mod collect;
mod demote;
mod expire;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::core::Core;
use crate::stats::add;
use crate::writeback::state::Due;
use crate::Result;

/// Collection runs on every this many rounds.
const COLLECT_EVERY_ROUNDS: u64 = 30;
/// A failing round is retried after twice the last wait, up to this long.
const BACKOFF_MS_MAX: u64 = 30_000;
/// After this many rounds in a row with no write to the warm store, its memtables are
/// written out: they repeat what DRAM holds (write-back's settled values) or what the files
/// will, and a quiet store then spends no memory on them.
const QUIET_ROUNDS_BEFORE_FLUSH: u32 = 5;
/// ... when they hold at least this much.
const QUIET_FLUSH_BYTES_MIN: u64 = 1 << 20;

/// How long the warm store has gone without a write, in rounds.
struct Quiet {
    sequence: u64,
    rounds: u32,
}

impl Quiet {
    /// Counts one round; writes the memtables out once the store has been quiet long
    /// enough.
    async fn round(&mut self, core: &Arc<Core>) -> Result<()> {
        let sequence = core.warm.store.last_sequence();
        if sequence != self.sequence {
            *self = Quiet {
                sequence,
                rounds: 0,
            };
            return Ok(());
        }
        self.rounds = self.rounds.saturating_add(1);
        if self.rounds < QUIET_ROUNDS_BEFORE_FLUSH
            || core.warm.store.unflushed_bytes() < QUIET_FLUSH_BYTES_MIN
        {
            return Ok(());
        }
        let me = Arc::clone(core);
        crate::offload::run("idle flush", move || me.warm.store.flush()).await??;
        add(&core.counters.idle_flushes);
        Ok(())
    }
}

pub(crate) async fn run(core: Arc<Core>, mut shutdown: watch::Receiver<bool>) {
    let interval_ms = core.settings.warm.background_interval_ms;
    let mut rounds = 0u64;
    let mut backoff_ms = interval_ms;
    let mut quiet = Quiet {
        sequence: core.warm.store.last_sequence(),
        rounds: 0,
    };
    loop {
        let wait = Duration::from_millis(backoff_ms.max(1));
        // While rounds fail, writes over budget do not wake it: the backoff holds.
        let failing = backoff_ms != interval_ms;
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tokio::time::sleep(wait) => {}
            _ = core.background_wake.notified(), if !failing => {}
        }
        if *shutdown.borrow() {
            return;
        }
        rounds += 1;
        let done = match round(&core, rounds % COLLECT_EVERY_ROUNDS == 1).await {
            Ok(_) => quiet.round(&core).await,
            e => e.map(drop),
        };
        match done {
            Ok(_) => {
                backoff_ms = interval_ms;
                *core.background_error.lock() = None;
            }
            Err(e) => {
                add(&core.counters.demotion_errors);
                *core.background_error.lock() = Some(e.to_string());
                core.room.notify_waiters();
                // Exponential, capped at 30 s or 100 rounds' worth of interval.
                let cap = interval_ms.saturating_mul(100).min(BACKOFF_MS_MAX);
                backoff_ms = (backoff_ms * 2).min(cap.max(1));
                tracing::warn!(error = %e, retry_ms = backoff_ms, "background round failed; will retry");
            }
        }
    }
}

/// One round: expire, demote until under budget, optionally collect. Returns the number of
/// keys demoted.
pub(crate) async fn round(core: &Arc<Core>, collect: bool) -> Result<u64> {
    let _one_at_a_time = core.rounds.lock().await;
    let due = core.writeback.due();
    if due != Due::Nothing {
        // Many warm-store writes or a long sequential write: off the runtime's workers.
        let me = Arc::clone(core);
        crate::offload::run("write-back", move || match due {
            Due::Settle => crate::settle::settle_colder_half(&me),
            _ => crate::settle::compact(&me),
        })
        .await??;
    }
    expire::sweep(core).await?;
    if core.warm.key_filter_build_due() {
        let me = Arc::clone(core);
        crate::offload::run("key filter", move || me.warm.build_key_filter_if_due()).await?;
    }
    let now = core.now_ms();
    core.leases.lock().retain(|_, &mut until| until > now);
    let mut demoted = 0;
    loop {
        let n = demote::once(core).await?;
        demoted += n;
        if n == 0 {
            break;
        }
    }
    if collect {
        collect::segments(core).await?;
        collect::value_log(core).await?;
    }
    Ok(demoted)
}
