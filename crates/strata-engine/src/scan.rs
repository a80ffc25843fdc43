//! Ordered scans over the keyspace of one database in the warm and cold tiers, with a
//! resumable cursor.

use bytes::Bytes;
use strata_format::{keys, BlockRef, Key, Kind, WarmRecord};
use strata_warm::{Bounds, Family};

use crate::core::Core;
use crate::tier::Tier;
use crate::Result;

/// One key found by a scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanItem {
    /// The key as the client named it.
    pub key: Bytes,
    /// Warm or cold: where the durable copy lives.
    pub tier: Tier,
    pub expire_ms: u64,
    pub value_len: u64,
    pub kind: Kind,
}

/// A page of a scan; pass `next` back as the start to continue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanPage {
    pub items: Vec<ScanItem>,
    /// The first client key not yet returned, or `None` when the range is exhausted.
    pub next: Option<Bytes>,
}

/// Up to `count_max` live keys of database `db` in `[start, end)` (client keys) in key
/// order, merged from the warm and cold tiers under one view of the warm store (a key
/// moving between tiers is seen once).
pub(crate) fn scan(
    core: &Core,
    db: u8,
    start: &[u8],
    end: Option<&[u8]>,
    count_max: usize,
) -> Result<ScanPage> {
    let view = core.warm.store.view();
    let now = core.now_ms();
    let lo = Key::new(db, 0, start);
    let prefix = keys::slot_prefix(db, 0);
    let hi: Option<Vec<u8>> = match end {
        Some(e) => Some(Key::new(db, 0, e).stored().to_vec()),
        None => strata_warm::prefix_end(&prefix),
    };
    let mk = |family| {
        let bounds = Bounds {
            lower: Some(prefix.to_vec()),
            upper: hi.clone(),
        };
        let mut c = core.warm.cursor(family, bounds, Some(view.as_ref()));
        c.seek(lo.stored());
        c
    };
    let mut warm = mk(Family::Records);
    let mut cold = mk(Family::Cold);
    let mut page = ScanPage::default();
    loop {
        let take_warm = match (warm.valid(), cold.valid()) {
            (false, false) => break,
            (true, false) => true,
            (false, true) => false,
            (true, true) => warm.key() <= cold.key(),
        };
        let (stored, item) = if take_warm {
            let rec = WarmRecord::decode_unverified(warm.value())?;
            (
                warm.key(),
                (rec.expire_ms, rec.value_len(), Tier::Warm, rec.kind),
            )
        } else {
            let r = BlockRef::decode(cold.value())?;
            (
                cold.key(),
                (r.expire_ms, r.value_len as u64, Tier::Cold, r.kind),
            )
        };
        let client = Bytes::copy_from_slice(&stored[keys::STORED_KEY_PREFIX_BYTES..]);
        if page.items.len() >= count_max {
            page.next = Some(client);
            break;
        }
        let (expire_ms, value_len, tier, kind) = item;
        if strata_format::is_live(expire_ms, now) {
            page.items.push(ScanItem {
                key: client,
                tier,
                expire_ms,
                value_len,
                kind,
            });
        }
        if take_warm {
            warm.next();
        } else {
            cold.next();
        }
    }
    warm.status()?;
    cold.status()?;
    Ok(page)
}

/// A page of keys of database `db` starting with `prefix`, resuming at `cursor` (a previous
/// page's `next`).
pub(crate) fn scan_prefix(
    core: &Core,
    db: u8,
    prefix: &[u8],
    cursor: Option<&[u8]>,
    count_max: usize,
) -> Result<ScanPage> {
    let end = strata_warm::prefix_end(prefix);
    let start = cursor.filter(|c| *c > prefix).unwrap_or(prefix);
    scan(core, db, start, end.as_deref(), count_max)
}
