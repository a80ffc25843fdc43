//! Ordered scans over the keyspace of one database in the warm and cold tiers, with a
//! resumable cursor.

use bytes::Bytes;
use strata_format::{keys, BlockRef, Key, Kind, WarmRecord};
use strata_warm::{Bounds, Family};

use crate::core::Core;
use crate::tier::Tier;
use crate::Result;

/// Entries a filtered page (a prefix in cluster mode) may pass over per key it asks for
/// before it ends early with a cursor.
const FILTERED_VISITS_PER_KEY: usize = 16;

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

/// Where a scan reads: the stored keys from `lo` (inclusive) to `hi` (the end of the
/// range's prefix when `None`), keeping only client keys that start with `filter`, and
/// ending a page after `visit_max` entries even if few were kept.
struct Range<'a> {
    prefix: Vec<u8>,
    lo: Key,
    hi: Option<Vec<u8>>,
    filter: &'a [u8],
    visit_max: usize,
}

/// Up to `count_max` live keys of database `db` from `start` up to `end` (client keys) in
/// the order the warm store keeps them (key order outside cluster mode; slot, then key, in
/// it), merged from the warm and cold tiers under one view of the warm store (a key moving
/// between tiers is seen once).
pub(crate) fn scan(
    core: &Core,
    db: u8,
    start: &[u8],
    end: Option<&[u8]>,
    count_max: usize,
) -> Result<ScanPage> {
    let prefix = if core.settings.key_slots {
        keys::db_prefix(db).to_vec()
    } else {
        keys::slot_prefix(db, 0).to_vec()
    };
    let hi = match end {
        Some(e) => Some(core.key(db, e).stored().to_vec()),
        None => strata_warm::prefix_end(&prefix),
    };
    let range = Range {
        prefix,
        lo: core.key(db, start),
        hi,
        filter: b"",
        visit_max: usize::MAX,
    };
    scan_range(core, &range, count_max)
}

/// Up to `count_max` live keys of slot `slot` of database `db` (cluster mode), from
/// `start` on.
pub(crate) fn scan_slot(
    core: &Core,
    db: u8,
    slot: u16,
    start: &[u8],
    count_max: usize,
) -> Result<ScanPage> {
    let prefix = keys::slot_prefix(db, slot).to_vec();
    let range = Range {
        hi: strata_warm::prefix_end(&prefix),
        lo: Key::new(db, slot, start),
        prefix,
        filter: b"",
        visit_max: usize::MAX,
    };
    scan_range(core, &range, count_max)
}

/// Expiry, value length, tier and kind of the entry under the warm cursor (`take_warm`) or
/// the cold one.
fn entry_at(
    take_warm: bool,
    warm: &dyn strata_warm::Cursor,
    cold: &dyn strata_warm::Cursor,
) -> Result<(u64, u64, Tier, Kind)> {
    Ok(if take_warm {
        let rec = WarmRecord::decode_unverified(warm.value())?;
        (rec.expire_ms, rec.value_len(), Tier::Warm, rec.kind)
    } else {
        let r = BlockRef::decode(cold.value())?;
        (r.expire_ms, r.value_len as u64, Tier::Cold, r.kind)
    })
}

fn scan_range(core: &Core, range: &Range<'_>, count_max: usize) -> Result<ScanPage> {
    let view = core.warm.store.view();
    let now = core.now_ms();
    let mk = |family| {
        let bounds = Bounds {
            lower: Some(range.prefix.clone()),
            upper: range.hi.clone(),
        };
        let mut c = core.warm.cursor(family, bounds, Some(view.as_ref()));
        c.seek(range.lo.stored());
        c
    };
    let mut warm = mk(Family::Records);
    let mut cold = mk(Family::Cold);
    let mut page = ScanPage::default();
    let mut visited = 0usize;
    loop {
        let take_warm = match (warm.valid(), cold.valid()) {
            (false, false) => break,
            (true, false) => true,
            (false, true) => false,
            (true, true) => warm.key() <= cold.key(),
        };
        let stored = if take_warm { warm.key() } else { cold.key() };
        let client = &stored[keys::STORED_KEY_PREFIX_BYTES..];
        if page.items.len() >= count_max || visited >= range.visit_max {
            page.next = Some(Bytes::copy_from_slice(client));
            break;
        }
        visited += 1;
        if client.starts_with(range.filter) {
            let (expire_ms, value_len, tier, kind) =
                entry_at(take_warm, warm.as_ref(), cold.as_ref())?;
            if strata_format::is_live(expire_ms, now) {
                page.items.push(ScanItem {
                    key: Bytes::copy_from_slice(client),
                    tier,
                    expire_ms,
                    value_len,
                    kind,
                });
            }
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
    if core.settings.key_slots {
        // Keys of one prefix are spread over the slots: read the database, keep the prefix.
        let db_prefix = keys::db_prefix(db).to_vec();
        let range = Range {
            hi: strata_warm::prefix_end(&db_prefix),
            prefix: db_prefix,
            lo: core.key(db, cursor.unwrap_or(b"")),
            filter: prefix,
            visit_max: count_max.saturating_mul(FILTERED_VISITS_PER_KEY),
        };
        return scan_range(core, &range, count_max);
    }
    let end = strata_warm::prefix_end(prefix);
    let start = cursor.filter(|c| *c > prefix).unwrap_or(prefix);
    scan(core, db, start, end.as_deref(), count_max)
}

/// The first and the last client key of database `db` in key order, of any kind, live or
/// not, from the warm and cold tiers (`None`: neither holds one). Outside cluster mode only
/// (there the stored order is by slot first).
pub(crate) fn key_ends(core: &Core, db: u8) -> Result<Option<(Bytes, Bytes)>> {
    let prefix = keys::slot_prefix(db, 0);
    let bounds = Bounds {
        lower: Some(prefix.to_vec()),
        upper: strata_warm::prefix_end(&prefix),
    };
    let view = core.warm.store.view();
    let (mut first, mut last): (Option<Vec<u8>>, Option<Vec<u8>>) = (None, None);
    for family in [Family::Records, Family::Cold] {
        let mut c = core
            .warm
            .cursor(family, bounds.clone(), Some(view.as_ref()));
        c.seek_to_first();
        if c.valid() && first.as_deref().is_none_or(|f| c.key() < f) {
            first = Some(c.key().to_vec());
        }
        c.seek_to_last();
        if c.valid() && last.as_deref().is_none_or(|l| c.key() > l) {
            last = Some(c.key().to_vec());
        }
        c.status()?;
    }
    let client = |k: Vec<u8>| Bytes::copy_from_slice(&k[keys::STORED_KEY_PREFIX_BYTES..]);
    Ok(first.zip(last).map(|(f, l)| (client(f), client(l))))
}

/// One end of an ordered key range ([`crate::Engine::range`]), on client keys: `None`
/// unbounded, `(key, true)` including the key, `(key, false)` excluding it.
pub type RangeBound<'a> = Option<(&'a [u8], bool)>;

/// Up to `count_max` live string keys of database `db` from `lo` to `hi`, in key order or
/// (`rev`) the reverse, merged from the warm and cold tiers under one view of the warm
/// store, each warm key with its value (read from the record the scan is on, verified);
/// a cold key's value is for the caller to fetch. Keys of other kinds are passed over.
/// Refused as soon as the values found hold more than `bytes_max` (one alone may), before
/// more are read. Outside cluster mode only (there every key is in slot 0, so the stored
/// order is the client keys' order).
pub(crate) fn range_keys(
    core: &Core,
    db: u8,
    lo: RangeBound<'_>,
    hi: RangeBound<'_>,
    count_max: usize,
    rev: bool,
    bytes_max: u64,
) -> Result<Vec<(ScanItem, Option<Bytes>)>> {
    let prefix = keys::slot_prefix(db, 0);
    let stored = |k: &[u8], past: bool| {
        let mut s = Key::new(db, 0, k).stored().to_vec();
        if past {
            // The smallest stored key after `k`.
            s.push(0);
        }
        s
    };
    let lower = match lo {
        None => prefix.to_vec(),
        Some((k, included)) => stored(k, !included),
    };
    let upper = match hi {
        None => strata_warm::prefix_end(&prefix),
        Some((k, included)) => Some(stored(k, included)),
    };
    let mut out = Vec::new();
    if upper.as_ref().is_some_and(|u| *u <= lower) || count_max == 0 {
        return Ok(out);
    }
    let view = core.warm.store.view();
    let now = core.now_ms();
    let mk = |family| {
        let bounds = Bounds {
            lower: Some(lower.clone()),
            upper: upper.clone(),
        };
        let mut c = core.warm.cursor(family, bounds, Some(view.as_ref()));
        match rev {
            false => c.seek_to_first(),
            true => c.seek_to_last(),
        }
        c
    };
    let mut warm = mk(Family::Records);
    let mut cold = mk(Family::Cold);
    let mut reply = crate::read::ReplyBytes::new(bytes_max);
    while out.len() < count_max {
        let take_warm = match (warm.valid(), cold.valid()) {
            (false, false) => break,
            (true, false) => true,
            (false, true) => false,
            // A key moving between tiers is in one of them under the view.
            (true, true) => (warm.key() <= cold.key()) != rev,
        };
        let (expire_ms, value_len, tier, kind) = entry_at(take_warm, warm.as_ref(), cold.as_ref())?;
        if kind == Kind::String && strata_format::is_live(expire_ms, now) {
            if !reply.fits(value_len) {
                return Err(crate::read::too_many_bytes(bytes_max));
            }
            let stored = if take_warm { warm.key() } else { cold.key() };
            let client = Bytes::copy_from_slice(&stored[keys::STORED_KEY_PREFIX_BYTES..]);
            let value = match take_warm {
                true => {
                    let rec = Bytes::copy_from_slice(warm.value());
                    let key = Key::new(db, 0, &client);
                    let (v, _) = crate::warm::record_value(&key, &rec, &core.vlog, &core.warm)
                        .inspect_err(|_| crate::stats::add(&core.counters.checksum_errors))?;
                    Some(v)
                }
                false => None,
            };
            let item = ScanItem {
                key: client,
                tier,
                expire_ms,
                value_len,
                kind,
            };
            out.push((item, value));
        }
        let c = if take_warm { &mut warm } else { &mut cold };
        match rev {
            false => c.next(),
            true => c.prev(),
        }
    }
    warm.status()?;
    cold.status()?;
    Ok(out)
}
