//! Shipping to the bucket log: a task takes what changed since its last round (keys marked
//! by every write under their stripe locks, before their tickets), reads each key's state
//! now (its value, the index entry of a value in a segment, or its absence) and writes them
//! as the log's next object (`bucket`). With `durability = bucket` a round runs every
//! `bucket_flush_ms` and a write is acknowledged once the round that covers its ticket has
//! written its object; otherwise (a cluster sharing its bucket) a round runs every
//! `bucket_lag_ms_max`, behind the replies. A key changed many times between rounds ships
//! once, as it stands.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strata_format::bucket_log::Record;
use strata_format::{Key, Kind};

use crate::bucket::{BucketLog, Changed, Flush};
use crate::core::Core;
use crate::settings::Durability;
use crate::stats::add;
use crate::warm::{Loc, Want};
use crate::Result;

/// A key's state as a round reads it.
pub(crate) enum State {
    Put {
        kind: Kind,
        expire_ms: u64,
        value: Bytes,
    },
    Delete,
    Cold(Vec<u8>),
}

/// How long between rounds.
fn period(core: &Core) -> Duration {
    let b = &core.settings.bucket;
    Duration::from_millis(match core.settings.warm.durability {
        Durability::Bucket => b.bucket_flush_ms,
        _ => b.bucket_lag_ms_max,
    })
}

/// Starts the shipping task of `core`'s bucket log, if it has one; it ends with `shutdown`.
pub(crate) fn start(core: &Arc<Core>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let Some(log) = core.bucket.clone() else {
        return;
    };
    let core = Arc::clone(core);
    tokio::spawn(async move {
        // A round starts every period, however long the last took (its PUT's time is
        // inside the period, not added to it).
        let mut tick = tokio::time::interval(period(&core));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => {}
            }
            if let Err(e) = round(&core, &log).await {
                if log.fenced() {
                    core.poisoned.set(e.to_string());
                    return;
                }
                add(&core.counters.bucket_log_errors);
                tracing::warn!(error = %e, "a bucket log round failed; the next ships what it did not");
            }
        }
    });
}

/// One round: what changed since the last, as it stands now, into the log's next object.
pub(crate) async fn round(core: &Arc<Core>, log: &BucketLog) -> Result<()> {
    let this = log.begin_round();
    // Tickets up to here belong to writes that marked their keys before taking them.
    let target = core.group.as_ref().map_or(0, |g| g.requested());
    let changed = log.take();
    if changed.is_empty() {
        log.shipped(target);
        log.end_round(this);
        return Ok(());
    }
    let states = match states_of(core, &changed.keys).await {
        Ok(s) => s,
        Err(e) => {
            remark(log, changed);
            return Err(e);
        }
    };
    let records = records(&changed, &states);
    if let Err(e) = log.write(&records).await {
        remark(log, changed);
        return Err(e);
    }
    add(&core.counters.bucket_log_objects);
    log.shipped(target);
    log.end_round(this);
    Ok(())
}

/// Puts back what a failed round took, for the next.
fn remark(log: &BucketLog, changed: Changed) {
    for f in changed.flushes {
        log.mark_flush(f);
    }
    for k in &changed.keys {
        log.mark(k);
    }
}

fn records<'a>(changed: &'a Changed, states: &'a [(Key, State)]) -> Vec<Record<'a>> {
    let flushes = changed.flushes.iter().map(|f| match f {
        Flush::Db(db) => Record::FlushDb { db: *db },
        Flush::All => Record::FlushAll,
    });
    flushes.chain(states.iter().map(record_of)).collect()
}

/// The record that says `key` is in `state`.
pub(crate) fn record_of((key, state): &(Key, State)) -> Record<'_> {
    match state {
        State::Put {
            kind,
            expire_ms,
            value,
        } => Record::Put {
            key: key.stored(),
            kind: *kind,
            expire_ms: *expire_ms,
            value,
        },
        State::Delete => Record::Delete { key: key.stored() },
        State::Cold(entry) => Record::Cold {
            key: key.stored(),
            entry,
        },
    }
}

/// Each key's state now.
pub(crate) async fn states_of<'k>(
    core: &Arc<Core>,
    keys: impl IntoIterator<Item = &'k Key>,
) -> Result<Vec<(Key, State)>> {
    let mut out = Vec::new();
    for key in keys {
        let state = match state_now(core, key)? {
            Some(s) => s,
            // Stored as parts: put together outside the stripe lock.
            None => match crate::read::get(core, key).await? {
                Some((value, kind)) => State::Put {
                    kind,
                    expire_ms: crate::read::expire_time_ms(core, key)?.unwrap_or(0),
                    value,
                },
                None => State::Delete,
            },
        };
        out.push((key.clone(), state));
    }
    Ok(out)
}

/// `key`'s state, read under its stripe lock (its live value folded into its stored form
/// first); `None` for a value stored as parts.
fn state_now(core: &Core, key: &Key) -> Result<Option<State>> {
    let _g = core.locks.lock(key);
    crate::fold::fold_locked(core, key, false)?;
    let now = core.now_ms();
    if let Some((value, expire_ms, tag, dirty)) = core.hot.current(key.stored(), now) {
        if strata_format::is_live(expire_ms, now) {
            let kind = Kind::from_u8(tag)?;
            return Ok(Some(State::Put {
                kind,
                expire_ms,
                value,
            }));
        }
        if dirty {
            return Ok(Some(State::Delete));
        }
    }
    let Some(stored) = core.lookup(key, Want::ValueUnlessParted)? else {
        return Ok(Some(State::Delete));
    };
    if !stored.is_live(now) {
        return Ok(Some(State::Delete));
    }
    Ok(match stored.loc {
        Loc::Warm { value: Some(v), .. } => Some(State::Put {
            kind: stored.kind,
            expire_ms: stored.expire_ms,
            value: v,
        }),
        Loc::Warm { .. } => None,
        Loc::Cold(r) => Some(State::Cold(r.encode())),
    })
}
