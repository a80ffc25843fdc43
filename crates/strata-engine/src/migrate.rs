//! The key layout, brought up to date at open. A store of layout 1 (keys stored as the
//! client sent them, in the families `default`, `index` and `ttl`) is copied into the
//! families of the current layout (`docs/formats.md`) with database 0 and slot 0 in front of
//! every key; records, index entries and the value log are copied byte for byte (their
//! checksums cover the client's key, and segments and value-log entries say which layout
//! their keys follow). The last batch records the new layout, synced; only then are the old
//! families emptied (the store drops them at its next open). A crash part-way leaves the
//! old families whole: the next open starts the copy again from a clean slate.

use strata_format::keys::{self, STORE_LAYOUT};
use strata_format::Key;
use strata_warm::{Bounds, Family};

use crate::warm::{Counts, Warm};
use crate::{Error, Result};

/// Entries copied per batch.
const BATCH_ENTRIES: usize = 10_000;

/// Brings the warm store to the current layout; returns the keys migrated (0 if none).
pub(crate) fn to_current(warm: &Warm) -> Result<u64> {
    match warm.layout()? {
        Some(STORE_LAYOUT) => {
            // A crash after the layout was recorded may have left the old families full.
            clear_layout_1(warm)?;
            Ok(0)
        }
        // Layout 2 has layout 3's keys: only the record changes (older Strata then refuse
        // the store, which may hold kinds they cannot read).
        Some(2) => {
            clear_layout_1(warm)?;
            let mut b = warm.batch();
            b.set_layout(STORE_LAYOUT);
            warm.write(b, true)?;
            Ok(0)
        }
        Some(v) => Err(Error::Invalid(format!(
            "the store has key layout {v}; this Strata reads layouts 1 to {STORE_LAYOUT}"
        ))),
        None if layout_1_is_empty(warm)? => {
            let mut b = warm.batch();
            b.set_layout(STORE_LAYOUT);
            warm.write(b, true)?;
            Ok(0)
        }
        None => from_layout_1(warm),
    }
}

/// Records whether keys carry their cluster slot in a store that holds no keys yet, and
/// refuses to open a store in the other mode: its keys would sit in the wrong slots.
pub(crate) fn check_key_slots(warm: &Warm, want: bool) -> Result<()> {
    let mode = |on: bool| {
        if on {
            "cluster mode"
        } else {
            "single-node mode"
        }
    };
    let c = warm.counts()?;
    let empty = c.warm_entries == 0 && c.cold_entries == 0;
    let have = warm.key_slots()?;
    if have == Some(want) {
        return Ok(());
    }
    if empty {
        let mut b = warm.batch();
        b.set_key_slots(want);
        return warm.write(b, true);
    }
    // A store without the record was written before cluster mode existed: single-node.
    let have = have.unwrap_or(false);
    if have == want {
        return Ok(());
    }
    Err(Error::Invalid(format!(
        "this data directory holds keys written in {}; it cannot be opened in {} (start the \
         node on an empty data_dir)",
        mode(have),
        mode(want)
    )))
}

fn layout_1_is_empty(warm: &Warm) -> Result<bool> {
    for f in Family::LAYOUT_1 {
        let mut c = warm.cursor(f, Bounds::all(), None);
        c.seek_to_first();
        c.status()?;
        if c.valid() {
            return Ok(false);
        }
    }
    Ok(true)
}

fn clear_layout_1(warm: &Warm) -> Result<()> {
    if layout_1_is_empty(warm)? {
        return Ok(());
    }
    let mut b = warm.batch();
    for f in Family::LAYOUT_1 {
        b.clear(f);
    }
    warm.write(b, true)
}

fn from_layout_1(warm: &Warm) -> Result<u64> {
    tracing::info!("the store has key layout 1: copying it to layout {STORE_LAYOUT}");
    let mut b = warm.batch();
    for f in Family::CURRENT.into_iter().filter(|&f| f != Family::Meta) {
        b.clear(f);
    }
    warm.write(b, false)?;
    let records = copy(warm, Family::Layout1Data, Family::Records, |k| {
        Ok(Key::from_layout_1(k).stored().to_vec())
    })?;
    let cold = copy(warm, Family::Layout1Index, Family::Cold, |k| {
        Ok(Key::from_layout_1(k).stored().to_vec())
    })?;
    copy(warm, Family::Layout1Ttl, Family::Expiry, |k| {
        let (at, client) = keys::decode_expiry_key(k)?;
        Ok(keys::expiry_key(at, Key::from_layout_1(client).stored()))
    })?;
    // A warm entry counts its key against the budget: each key is longer by its prefix.
    let mut b = warm.batch();
    b.add_counts(&Counts {
        warm_bytes: (records * keys::STORED_KEY_PREFIX_BYTES as u64) as i64,
        ..Counts::default()
    });
    b.set_layout(STORE_LAYOUT);
    warm.write(b, true)?;
    clear_layout_1(warm)?;
    tracing::info!(records, cold, "key layout {STORE_LAYOUT} in place");
    Ok(records + cold)
}

/// Copies every entry of `from` into `to` under the key `rekey` makes of it; returns how
/// many.
fn copy(
    warm: &Warm,
    from: Family,
    to: Family,
    rekey: impl Fn(&[u8]) -> Result<Vec<u8>>,
) -> Result<u64> {
    let mut n = 0u64;
    let mut c = warm.cursor(from, Bounds::all(), None);
    c.seek_to_first();
    let mut b = warm.batch();
    while c.valid() {
        b.put_raw(to, &rekey(c.key())?, c.value());
        n += 1;
        if n.is_multiple_of(BATCH_ENTRIES as u64) {
            warm.write(std::mem::replace(&mut b, warm.batch()), false)?;
            tracing::info!(family = from.name(), copied = n, "migrating the key layout");
        }
        c.next();
    }
    c.status()?;
    if !b.is_empty() {
        warm.write(b, false)?;
    }
    Ok(n)
}
