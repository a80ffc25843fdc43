//! Adoption: a lost node's writes, read back from its bucket log, written into this store
//! for the slots it takes over. The objects of each of the lost node's writer epochs are
//! read in order (up to the fence that ended the last), each key's last record decides
//! what it holds, and that is written here as this node's own write (so it enters this
//! node's log, and its acknowledgement is this node's to give).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use strata_format::bucket_log::{self, Object, Record};
use strata_format::{BlockRef, Key, Kind};

use crate::commit::Change;
use crate::core::Core;
use crate::durability::Ticket;
use crate::{Error, Result};

/// What the log says a key holds, last.
enum Last {
    Put {
        kind: Kind,
        expire_ms: u64,
        value: Bytes,
    },
    Cold(BlockRef),
    Gone,
}

/// Strings adopted with one call of the write path (one batch, one log record).
const STRINGS_PER_CALL: usize = 512;

/// Writes into `core` what the log `objects` (in order) leave the keys whose slot `wanted`
/// accepts holding; returns how many keys it wrote or deleted.
pub(crate) async fn adopt(
    core: &Arc<Core>,
    objects: &[Bytes],
    wanted: &(dyn Fn(u16) -> bool + Sync),
) -> Result<u64> {
    let last = last_states(objects, wanted)?;
    let n = last.len() as u64;
    let mut ticket = Ticket::NONE;
    // Strings without an expiry go in runs (most of what a node holds); the rest one by one.
    let mut strings: Vec<(Key, Bytes)> = Vec::new();
    for (stored, state) in last {
        let key = Key::from_stored(&stored)?;
        let change = change_of(core, &key, state).await?;
        if let Change::Put {
            kind: Kind::String,
            value,
            expire_ms: 0,
        } = change
        {
            strings.push((key, value));
            continue;
        }
        let written = crate::write::update(core, &key, false, |cur| {
            let change = match (&change, cur) {
                (Change::Delete, None) => None,
                (c, _) => Some(c.clone()),
            };
            Ok((change, ()))
        })
        .await?;
        // One wait at the end covers every write before it.
        ticket = ticket.max(written.ticket);
    }
    for run in strings.chunks(STRINGS_PER_CALL) {
        let pairs: Vec<(&Key, Bytes)> = run.iter().map(|(k, v)| (k, v.clone())).collect();
        let written = crate::write::put_many(core, &pairs, |_| 0).await?;
        ticket = ticket.max(written.ticket);
    }
    core.wait(ticket).await?;
    Ok(n)
}

/// The change that leaves `key` as the log's `state` says (a cold key's value fetched from
/// the lost node's segment).
async fn change_of(core: &Core, key: &Key, state: Last) -> Result<Change> {
    Ok(match state {
        Last::Put {
            kind,
            expire_ms,
            value,
        } => Change::Put {
            kind,
            value,
            expire_ms,
        },
        Last::Cold(r) => {
            let (value, _) = core.fetch_cold(key, &r).await?;
            Change::Put {
                kind: r.kind,
                value,
                expire_ms: r.expire_ms,
            }
        }
        Last::Gone => Change::Delete,
    })
}

/// Each wanted key's last state in `objects`, flushes applied in their place.
fn last_states(
    objects: &[Bytes],
    wanted: &(dyn Fn(u16) -> bool + Sync),
) -> Result<HashMap<Vec<u8>, Last>> {
    let mut last: HashMap<Vec<u8>, Last> = HashMap::new();
    for bytes in objects {
        let decoded =
            bucket_log::decode(bytes).map_err(|e| Error::Data(format!("bucket log: {e}")))?;
        let Object::Log { records, .. } = decoded else {
            // A fence ends the log.
            break;
        };
        for r in records {
            apply(&mut last, r, wanted)?;
        }
    }
    Ok(last)
}

fn apply(
    last: &mut HashMap<Vec<u8>, Last>,
    r: Record<'_>,
    wanted: &(dyn Fn(u16) -> bool + Sync),
) -> Result<()> {
    let keep = |stored: &[u8]| -> Result<bool> { Ok(wanted(Key::from_stored(stored)?.slot())) };
    match r {
        Record::Put {
            key,
            kind,
            expire_ms,
            value,
        } if keep(key)? => {
            let state = Last::Put {
                kind,
                expire_ms,
                value: Bytes::copy_from_slice(value),
            };
            last.insert(key.to_vec(), state);
        }
        Record::Delete { key } if keep(key)? => {
            last.insert(key.to_vec(), Last::Gone);
        }
        Record::Cold { key, entry } if keep(key)? => {
            let r = BlockRef::decode(entry).map_err(|e| Error::Data(format!("bucket log: {e}")))?;
            last.insert(key.to_vec(), Last::Cold(r));
        }
        Record::FlushDb { db } => {
            for (k, v) in last.iter_mut() {
                if k.first() == Some(&db) {
                    *v = Last::Gone;
                }
            }
        }
        Record::FlushAll => {
            for v in last.values_mut() {
                *v = Last::Gone;
            }
        }
        _ => {}
    }
    Ok(())
}
