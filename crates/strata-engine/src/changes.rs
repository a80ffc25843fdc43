//! The change log in the engine's terms: every committed batch of the warm store has a
//! sequence number, and [`changes_after`] reads the batches after any sequence as changes
//! to keys, values in the value log included. Nothing ships it yet; a replica or a slot
//! move will (it is the store's own log read back, so it costs the write path nothing).

use std::collections::HashMap;

use bytes::Bytes;
use strata_format::{BlockRef, Key, Kind, WarmRecord, WarmValue};
use strata_warm::{Family, RawChange};

use crate::core::Core;
use crate::{Error, Result};

/// What one committed batch did to one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyChange {
    /// The key holds `value`, of `kind`, now, expiring at `expire_ms` (0: never).
    Set {
        kind: Kind,
        value: Bytes,
        expire_ms: u64,
    },
    /// The key's value, unchanged, is in the object store now (or still, at a new place or
    /// with a new expiry): where `block` says, expiring at `block.expire_ms`.
    Cold { block: BlockRef },
    /// The key holds nothing now.
    Deleted,
}

/// The changes of one committed batch, in key order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeEvent {
    /// The batch's sequence number: pass it back to read what follows.
    pub sequence: u64,
    /// Every key was deleted first (`FLUSHALL`).
    pub cleared: bool,
    pub keys: Vec<(Key, KeyChange)>,
}

/// Most batches one call reads.
pub(crate) const BATCHES_MAX: usize = 4096;

/// The batches committed after sequence `after` (at most `batches_max`, oldest first),
/// leaving out those that changed no key (counters, segment records, pins).
pub(crate) fn changes_after(
    core: &Core,
    after: u64,
    batches_max: usize,
) -> Result<Vec<ChangeEvent>> {
    let mut out = Vec::new();
    for batch in core.warm.store.changes_after(after)? {
        if out.len() >= batches_max.min(BATCHES_MAX) {
            break;
        }
        let batch = batch?;
        // The batch's last sequence, so that a reader that passes it back gets what follows.
        let sequence = batch.last_sequence();
        let event = to_event(core, sequence, batch.changes)?;
        if event.cleared || !event.keys.is_empty() {
            out.push(event);
        }
    }
    Ok(out)
}

/// What a batch's raw changes did to each key.
fn to_event(core: &Core, sequence: u64, raw: Vec<RawChange>) -> Result<ChangeEvent> {
    #[derive(Default)]
    struct Seen {
        record: Option<Option<Vec<u8>>>,
        cold: Option<Option<Vec<u8>>>,
    }
    let mut cleared = false;
    let mut by_key: HashMap<Vec<u8>, Seen> = HashMap::new();
    for c in raw {
        match c {
            RawChange::Put {
                family: Family::Records,
                key,
                value,
            } => {
                by_key.entry(key).or_default().record = Some(Some(value));
            }
            RawChange::Delete {
                family: Family::Records,
                key,
            } => {
                by_key.entry(key).or_default().record = Some(None);
            }
            RawChange::Put {
                family: Family::Cold,
                key,
                value,
            } => {
                by_key.entry(key).or_default().cold = Some(Some(value));
            }
            RawChange::Delete {
                family: Family::Cold,
                key,
            } => {
                by_key.entry(key).or_default().cold = Some(None);
            }
            RawChange::DeleteRange {
                family: Family::Records,
                ..
            } => cleared = true,
            _ => {}
        }
    }
    let mut keys = Vec::with_capacity(by_key.len());
    for (stored, seen) in by_key {
        let key = Key::from_stored(&stored)?;
        let change = match (seen.record, seen.cold) {
            (Some(Some(rec)), _) => set(core, &key, &rec)?,
            (_, Some(Some(r))) => KeyChange::Cold {
                block: BlockRef::decode(&r)?,
            },
            (Some(None), _) | (None, Some(None)) => KeyChange::Deleted,
            (None, None) => continue,
        };
        keys.push((key, change));
    }
    keys.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(ChangeEvent {
        sequence,
        cleared,
        keys,
    })
}

/// The value a record written to the log holds, read from the value log if it is there.
fn set(core: &Core, key: &Key, rec: &[u8]) -> Result<KeyChange> {
    let r = WarmRecord::decode(key.client(), rec)?;
    let value = match r.value {
        WarmValue::Inline(v) => Bytes::copy_from_slice(v),
        WarmValue::Logged(at) => core.vlog.read_checked(key.client(), &r, at).map_err(|e| {
            Error::Invalid(format!(
                "the change log points at a value the value log no longer holds ({e}); read a backup instead"
            ))
        })?,
        // The parts as they are now: a later change to them shows here too.
        WarmValue::Parted(at) => core.warm.assemble(key, r.kind, at).map_err(|e| {
            Error::Invalid(format!(
                "the change log points at parts the warm store no longer holds ({e}); read a backup instead"
            ))
        })?,
    };
    Ok(KeyChange::Set {
        kind: r.kind,
        value,
        expire_ms: r.expire_ms,
    })
}
