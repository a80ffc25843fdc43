//! Pins: key patterns whose keys stay in the warm tier (never demoted). A pattern with glob
//! characters (`*`, `?`, `[`) is a glob; otherwise it is a prefix. Patterns match the key
//! as the client named it, in every database. Pins persist in the meta family and are
//! bounded by `pinned_bytes_max`.

use bytes::Bytes;
use strata_format::Key;

use crate::commit::Change;
use crate::core::Core;
use crate::glob::{glob_match, literal_prefix};
use crate::tier::Tier;
use crate::write::update;
use crate::{Error, Result};

/// Longest pin pattern.
const PATTERN_BYTES_MAX: usize = 1024;
/// Keys read per page while a pattern's keys are listed.
const PAGE_KEYS: usize = 10_000;

fn is_glob(p: &[u8]) -> bool {
    p.iter().any(|c| matches!(c, b'*' | b'?' | b'['))
}

pub(crate) fn pattern_matches(pattern: &[u8], key: &[u8]) -> bool {
    if is_glob(pattern) {
        glob_match(pattern, key)
    } else {
        key.starts_with(pattern)
    }
}

/// Whether `key` matches a pin.
pub(crate) fn is_pinned(core: &Core, key: &[u8]) -> bool {
    let pins = core.pins.read();
    !pins.is_empty() && pins.iter().any(|p| pattern_matches(p, key))
}

/// Keys matching `pattern`, with their tier and value size.
fn matching(core: &Core, pattern: &[u8]) -> Result<Vec<(Key, Tier, u64)>> {
    let prefix = if is_glob(pattern) {
        literal_prefix(pattern)
    } else {
        pattern.to_vec()
    };
    let mut out = Vec::new();
    let mut cursor: Option<Bytes> = None;
    // Pins name keys of database 0.
    let db = core.warm.stored_db(0);
    loop {
        let page = crate::scan::scan_prefix(core, db, &prefix, cursor.as_deref(), PAGE_KEYS)?;
        out.extend(
            page.items
                .into_iter()
                .filter(|i| pattern_matches(pattern, &i.key))
                .map(|i| (core.key(db, &i.key), i.tier, i.value_len)),
        );
        match page.next {
            Some(n) => cursor = Some(n),
            None => return Ok(out),
        }
    }
}

/// Pins `pattern`: its keys stay warm from now on, and keys already cold are brought back.
/// Refused when all pins together would hold more than `pinned_bytes_max`. Returns the
/// value bytes the pattern holds.
pub(crate) async fn pin(core: &Core, pattern: &[u8]) -> Result<u64> {
    core.check_writable()?;
    if pattern.is_empty() || pattern.len() > PATTERN_BYTES_MAX {
        return Err(Error::Invalid(format!(
            "pin pattern must be 1 to {PATTERN_BYTES_MAX} bytes"
        )));
    }
    let keys = matching(core, pattern)?;
    let new_bytes: u64 = keys.iter().map(|k| k.2).sum();
    let mut held = 0u64;
    let others: Vec<Bytes> = core
        .pins
        .read()
        .iter()
        .filter(|p| p.as_ref() != pattern)
        .cloned()
        .collect();
    for p in others {
        held += matching(core, &p)?
            .iter()
            .filter(|k| !pattern_matches(pattern, k.0.client()))
            .map(|k| k.2)
            .sum::<u64>();
    }
    let max = core.settings.warm.pinned_bytes_max;
    if held + new_bytes > max {
        return Err(Error::Invalid(format!(
            "pin refused: pinned keys would hold {} bytes, over pinned_bytes_max ({max}); unpin something or raise the quota",
            held + new_bytes
        )));
    }
    let mut b = core.warm.batch();
    b.put_pin(pattern);
    core.warm.write(b, true)?;
    {
        let mut pins = core.pins.write();
        if !pins.iter().any(|p| p.as_ref() == pattern) {
            pins.push(Bytes::copy_from_slice(pattern));
        }
    }
    let mut ticket = crate::Ticket::NONE;
    for (k, _, _) in keys.into_iter().filter(|k| k.1 == Tier::Cold) {
        // Rewrite the value into the warm tier, keeping its expiry.
        update(core, &k, true, |cur| match cur {
            Some(c) => {
                let value = c.value.cloned().expect("value requested");
                let change = Change::Put {
                    kind: c.kind,
                    value,
                    expire_ms: c.expire_ms,
                };
                Ok((Some(change), ()))
            }
            None => Ok((None, ())),
        })
        .await?
        .defer(&mut ticket);
    }
    core.wait(ticket).await?;
    Ok(new_bytes)
}

/// Removes a pin; returns whether it existed.
pub(crate) fn unpin(core: &Core, pattern: &[u8]) -> Result<bool> {
    let mut b = core.warm.batch();
    b.delete_pin(pattern);
    core.warm.write(b, true)?;
    let mut pins = core.pins.write();
    let before = pins.len();
    pins.retain(|p| p.as_ref() != pattern);
    Ok(pins.len() != before)
}
