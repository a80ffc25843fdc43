//! Reads, in three steps: lookup (where is the key: DRAM, the warm store's records, the cold
//! index), fetch (the bytes: the record's value, or one block from the object store), and
//! the hook (`hook::after_read`: what the read leaves behind). A multi-key read does each
//! step for all its keys at once: one multi-get per family, then the cold blocks
//! concurrently, each fetched through the index entry the lookup already decoded.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use strata_format::{BlockRef, Key, Kind, WarmRecord};

use crate::core::{Core, HotGot};
use crate::fold::{admits, allowed, alone, bytes_max, make_room, Room};
use crate::hook::{after_read, Read};
use crate::live::adoptable_parted;
use crate::live::state::{LiveValue, Slot};
use crate::stats::add;
use crate::tier::Tier;
use crate::warm::{record_value, Loc, Stored, Want};
use crate::{Error, Result};
use strata_format::zset::ScoreWindow;
use strata_hot::Got;

/// Where a value lies in the value log (see [`crate::Engine::locate_local`]): `len` bytes
/// at `offset` of the file at `path`. `checksum` is the record's CRC-32C of the client's
/// key, the expiry (`expire_ms`, 8 bytes little-endian) and the value, in that order
/// (`strata_format::entry_checksum`), so the reader can verify what it maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalValue {
    pub path: std::path::PathBuf,
    pub offset: u64,
    pub len: u64,
    pub expire_ms: u64,
    pub checksum: u32,
}

/// Multi-key warm reads use two threads once warm values average this many bytes.
const SPLIT_VALUE_BYTES_MIN: u64 = 256 * 1024;

/// DRAM hits of which one counts for the warm tier's clock hand (each count is a cache miss
/// in its table): a key read often from DRAM still builds a count.
const HOT_HITS_PER_COUNT: u32 = 8;

thread_local! {
    static HOT_HITS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// A DRAM hit's bookkeeping: the hit counts, a prefetched value counts as used, and one hit
/// in [`HOT_HITS_PER_COUNT`] counts as a read for the warm tier.
pub(crate) fn hot_hit(core: &Core, key: &Key) {
    hot_hits(core, &[key]);
}

/// [`hot_hit`] of a batch's hits: the counter moves once, and the keys that count for the
/// warm tier are counted together, so the processor overlaps the count table's cache
/// misses.
fn hot_hits(core: &Core, keys: &[&Key]) {
    if keys.is_empty() {
        return;
    }
    core.counters
        .hot_hits
        .fetch_add(keys.len() as u64, std::sync::atomic::Ordering::Relaxed);
    let mut counted: smallvec::SmallVec<[&Key; 16]> = smallvec::SmallVec::new();
    HOT_HITS.with(|c| {
        let mut n = c.get();
        for &key in keys {
            crate::hook::on_hot_hit(core, key);
            n = n.wrapping_add(1);
            if n.is_multiple_of(HOT_HITS_PER_COUNT) {
                counted.push(key);
            }
        }
        c.set(n);
    });
    core.access.count_reads_found(&counted);
}

/// Reads `key` (its value and kind) from the first tier that holds it.
pub(crate) async fn get(core: &Core, key: &Key) -> Result<Option<(Bytes, Kind)>> {
    crate::fold::fold_keys(core, &[key])?;
    let now = core.now_ms();
    match core.hot_get(key, now)? {
        HotGot::Value(v, kind) => {
            hot_hit(core, key);
            return Ok(Some((v, kind)));
        }
        HotGot::Expired => {
            add(&core.counters.misses);
            return Ok(None);
        }
        HotGot::Missing => {}
    }
    // As in `lookup_many`: a key the key filter rules out is in no tier.
    if core.warm.rules_out(key) {
        core.access.count_read(key, false);
        add(&core.counters.misses);
        return Ok(None);
    }
    let got = get_uncached(core, key, None).await?;
    core.access.count_read(key, got.is_some());
    Ok(got)
}

/// [`get`] that lends the value to `f` when DRAM holds it (under its shard's lock, no copy)
/// and hands it over otherwise: for reads that answer with a part of a value.
pub(crate) async fn get_with<R>(
    core: &Core,
    key: &Key,
    f: impl FnOnce(Kind, Source<'_>) -> Result<R>,
) -> Result<Option<R>> {
    let got = get_or_parts_with::<R, &[u8]>(core, key, Ask::Whole, f).await?;
    Ok(got.map(Answer::read))
}

/// [`get_with`] of a read that needs the items named `names` alone (of a hash, a set or a
/// sorted set): when the value is stored as parts and neither DRAM nor a live value holds
/// it, `f` sees a value of its kind made of those items (the ones found), read by name,
/// not the whole.
pub(crate) async fn get_named_with<R, N: AsRef<[u8]>>(
    core: &Core,
    key: &Key,
    names: &[N],
    f: impl FnOnce(Kind, Source<'_>) -> Result<R>,
) -> Result<Option<R>> {
    let got = get_or_parts_with(core, key, Ask::Named(names), f).await?;
    Ok(got.map(Answer::read))
}

/// [`get_with`] of a read that a value stored as parts (when neither DRAM nor a live
/// value holds it) answers from what `asked` reads of it, not the whole
/// ([`Answer::Items`], [`Answer::Entries`], [`Answer::Elements`]).
pub(crate) async fn get_asked_with<R>(
    core: &Core,
    key: &Key,
    asked: Asked<'_>,
    f: impl FnOnce(Kind, Source<'_>) -> Result<R>,
) -> Result<Option<Answer<R>>> {
    get_or_parts_with::<R, &[u8]>(core, key, Ask::Asked(asked), f).await
}

/// What a read needs of a value stored as parts.
#[derive(Clone, Copy)]
enum Ask<'a, N> {
    Whole,
    /// The items of these names.
    Named(&'a [N]),
    Asked(Asked<'a>),
}

/// What a read of a value stored as parts may read of it instead of the whole
/// ([`crate::Engine::get_asked_with`]).
#[derive(Debug, Clone, Copy)]
pub enum Asked<'a> {
    /// How many items it holds (`SCARD`, `ZCARD`, `LLEN`): its record's count.
    Count,
    /// The entries of a sorted set this picks (`ZRANGE`, `ZRANGEBYSCORE`, `ZRANGEBYLEX`,
    /// `ZCOUNT`, `ZLEXCOUNT`): a walk of its score index (a lex range's, when every entry
    /// has one score; else the whole set answers).
    Window(&'a ScoreWindow<'a>),
    /// A list's elements from the first index to the second (`LRANGE`, `LINDEX`; negative
    /// from the end): those parts.
    Span(i64, i64),
}

/// What [`get_asked_with`] answers with: the read's own result, or what a value stored as
/// parts gave: the kind and the count of items its record holds, the entries a window
/// picked from its score index, or a list's elements.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer<R> {
    Read(R),
    Items(Kind, u64),
    Entries(Kind, Vec<(f64, Bytes)>),
    Elements(Kind, Vec<Bytes>),
}

impl<R> Answer<R> {
    fn read(self) -> R {
        match self {
            Answer::Read(r) => r,
            Answer::Items(..) | Answer::Entries(..) | Answer::Elements(..) => {
                unreachable!("only a read asking for a count, a window or a span gets one")
            }
        }
    }

    /// The kind of the value whose parts answered (`None`: the read's own result).
    pub fn kind(&self) -> Option<Kind> {
        match self {
            Answer::Read(_) => None,
            Answer::Items(k, _) | Answer::Entries(k, _) | Answer::Elements(k, _) => Some(*k),
        }
    }
}

async fn get_or_parts_with<R, N: AsRef<[u8]>>(
    core: &Core,
    key: &Key,
    ask: Ask<'_, N>,
    f: impl FnOnce(Kind, Source<'_>) -> Result<R>,
) -> Result<Option<Answer<R>>> {
    crate::fold::fold_keys(core, &[key])?;
    let mut f = Some(f);
    let lent = core
        .hot
        .read_with_or_why(key.stored(), core.now_ms(), |v, tag| {
            let f = f.take().expect("called once");
            Kind::from_u8(tag)
                .map_err(Error::from)
                .and_then(|k| f(k, Source::lent(v)))
        });
    match lent {
        Ok(r) => {
            hot_hit(core, key);
            return r.map(|r| Some(Answer::Read(r)));
        }
        // DRAM's newer state says the key is gone: what is stored below is older.
        Err(Got::Expired) => {
            add(&core.counters.misses);
            return Ok(None);
        }
        Err(_) => {}
    }
    let f = f.take().expect("not called");
    let read = |got: Option<(Bytes, Kind)>| match got {
        Some((v, kind)) => f(kind, Source::shared(&v)).map(|r| Some(Answer::Read(r))),
        None => Ok(None),
    };
    let mut first = None;
    let parts = core.settings.warm.parts_bytes_min > 0 && !matches!(ask, Ask::Whole);
    if parts && !core.warm.rules_out(key) {
        match named_parts(core, key, ask)? {
            Named::Parts(got) => {
                core.access.count_read(key, got.is_some());
                return read(got);
            }
            Named::Count(kind, n) => {
                core.access.count_read(key, true);
                return Ok(Some(Answer::Items(kind, n)));
            }
            Named::Entries(kind, entries) => {
                core.access.count_read(key, true);
                return Ok(Some(Answer::Entries(kind, entries)));
            }
            Named::Elements(kind, elements) => {
                core.access.count_read(key, true);
                return Ok(Some(Answer::Elements(kind, elements)));
            }
            Named::Whole(looked) => first = Some(looked),
            Named::ReadWhole => {}
        }
    }
    let got = match first {
        // What `get` does past DRAM and the key filter, from the lookup already made.
        Some(first) => {
            let got = get_uncached(core, key, Some(first)).await?;
            core.access.count_read(key, got.is_some());
            got
        }
        None => get(core, key).await?,
    };
    read(got)
}

/// A lookup of a key, when it started and the stripe version it saw.
struct Looked {
    started: Instant,
    seen: u64,
    stored: Option<Stored>,
}

impl Looked {
    fn now(core: &Core, key: &Key, want: Want) -> Result<Looked> {
        let started = Instant::now();
        let seen = core.locks.version(key);
        let stored = core.lookup(key, want)?;
        Ok(Looked {
            started,
            seen,
            stored,
        })
    }
}

/// What [`named_parts`] found.
enum Named {
    /// The value is stored as parts: those named that were found, as a value of its kind
    /// (`None`: the key expired).
    Parts(Option<(Bytes, Kind)>),
    /// It is stored as parts of this kind, this many.
    Count(Kind, u64),
    /// A sorted set stored as parts: the entries the window picked.
    Entries(Kind, Vec<(f64, Bytes)>),
    /// A list stored as parts: the elements of the span.
    Elements(Kind, Vec<Bytes>),
    /// It is not: the lookup (a warm value read whole).
    Whole(Looked),
    /// The whole value answers: it kept changing between the record and the parts, or
    /// the parts cannot answer what was asked.
    ReadWhole,
}

/// What `ask` needs of `key`'s value if it is stored as parts: the items it names, their
/// count, a window of a sorted set's entries or a span of a list's elements. The record and the parts are read as one
/// state: no commit touched the key's stripe between the first read and the check after
/// the last (every change of parts commits its record with them).
fn named_parts<N: AsRef<[u8]>>(core: &Core, key: &Key, ask: Ask<'_, N>) -> Result<Named> {
    for _attempt in 0..3 {
        let looked = Looked::now(core, key, Want::ValueUnlessParted)?;
        let Some(at) = looked.stored.as_ref().and_then(Stored::parted) else {
            return Ok(Named::Whole(looked));
        };
        let (seen, stored) = (looked.seen, looked.stored.expect("parted"));
        if !stored.is_live(core.now_ms()) {
            add(&core.counters.misses);
            return Ok(Named::Parts(None));
        }
        // What the parts say, and how many of them it asked for.
        let (asked, got) = match ask {
            Ask::Asked(Asked::Count) => return Ok(Named::Count(stored.kind, at.count)),
            // Not a sorted set or a list: the caller answers that it is of the wrong kind.
            Ask::Asked(Asked::Window(_)) if stored.kind != Kind::ZSet => {
                return Ok(Named::Entries(stored.kind, Vec::new()))
            }
            Ask::Asked(Asked::Span(..)) if stored.kind != Kind::List => {
                return Ok(Named::Elements(stored.kind, Vec::new()))
            }
            Ask::Whole => return Ok(Named::ReadWhole),
            Ask::Asked(Asked::Span(start, stop)) => {
                match list_span(core, key, at, seen, start, stop)? {
                    Some(elements) => (elements.len(), Named::Elements(stored.kind, elements)),
                    // A write between the record and the parts: read again.
                    None => continue,
                }
            }
            Ask::Asked(Asked::Window(window)) => {
                let entries = core
                    .warm
                    .score_window(key, at, window)
                    .inspect_err(|e| core.count_data_error(e))?;
                let Some(entries) = entries else {
                    return Ok(Named::ReadWhole);
                };
                (entries.len(), Named::Entries(stored.kind, entries))
            }
            Ask::Named(names) => (names.len(), named_items(core, key, at, stored.kind, names)?),
        };
        if !core.locks.unchanged(key, seen) {
            continue;
        }
        add(&core.counters.warm_hits);
        core.counters
            .parts_read
            .fetch_add(asked as u64, Ordering::Relaxed);
        crate::live::read_from_parts(core, key, at);
        return Ok(got);
    }
    Ok(Named::ReadWhole)
}

/// The elements at positions `start..=stop` of a list stored as parts at `at`; `None`
/// when a write came between the record (read at stripe version `seen`) and the parts.
fn list_span(
    core: &Core,
    key: &Key,
    at: strata_format::Parted,
    seen: u64,
    start: i64,
    stop: i64,
) -> Result<Option<Vec<Bytes>>> {
    let elements = core
        .warm
        .list_span(key, at, start, stop)
        .inspect_err(|e| core.count_data_error(e))?;
    if elements.is_some() || !core.locks.unchanged(key, seen) {
        return Ok(elements);
    }
    // With no write between, the parts do not add up to their record.
    let e = Error::Data(format!(
        "{key:?}: its list parts are not the {} positions its record counts",
        at.count
    ));
    core.count_data_error(&e);
    Err(e)
}

/// The items `names` names of a value of `kind` stored as parts at `at`, as a value of
/// that kind holding them alone.
fn named_items<N: AsRef<[u8]>>(
    core: &Core,
    key: &Key,
    at: strata_format::Parted,
    kind: Kind,
    names: &[N],
) -> Result<Named> {
    let (found, items) = core
        .warm
        .named_parts(key, at.version, names)
        .inspect_err(|e| core.count_data_error(e))?;
    let mut v = strata_format::collection_buf(found, items.len() + 10);
    v.extend_from_slice(&items);
    let v = strata_format::parts::in_order(kind, v)
        .map_err(|e| Error::Data(format!("{key:?}: its parts: {e}")))?;
    Ok(Named::Parts(Some((Bytes::from(v), kind))))
}

/// A value a read sees: shared (parts are cut from it without a copy) or lent from DRAM
/// (the first [`LENT_CUTS_MAX`] parts are copied out one by one; past them the value is
/// copied once and the rest cut from the copy, so a read of many parts pays one copy, not
/// one allocation per part).
pub struct Source<'a> {
    bytes: &'a [u8],
    shared: Option<&'a Bytes>,
    cuts: std::cell::Cell<usize>,
    whole: std::cell::OnceCell<Bytes>,
}

/// Parts of a lent value copied out one by one before it is copied whole.
const LENT_CUTS_MAX: usize = 8;

impl<'a> Source<'a> {
    pub fn shared(b: &'a Bytes) -> Self {
        Source {
            bytes: b,
            shared: Some(b),
            cuts: Default::default(),
            whole: Default::default(),
        }
    }

    pub fn lent(b: &'a [u8]) -> Self {
        Source {
            bytes: b,
            shared: None,
            cuts: Default::default(),
            whole: Default::default(),
        }
    }

    pub fn bytes(&self) -> &[u8] {
        self.bytes
    }

    /// `part` (a slice of [`Source::bytes`]) as `Bytes`.
    pub fn cut(&self, part: &[u8]) -> Bytes {
        if let Some(b) = self.shared {
            return b.slice_ref(part);
        }
        let n = self.cuts.get();
        if n < LENT_CUTS_MAX && self.whole.get().is_none() {
            self.cuts.set(n + 1);
            return Bytes::copy_from_slice(part);
        }
        let whole = self
            .whole
            .get_or_init(|| Bytes::copy_from_slice(self.bytes));
        let at = part.as_ptr() as usize - self.bytes.as_ptr() as usize;
        whole.slice(at..at + part.len())
    }
}

/// The slow path of a read: the warm store, then the cold index and the object store.
async fn get_uncached(
    core: &Core,
    key: &Key,
    mut first: Option<Looked>,
) -> Result<Option<(Bytes, Kind)>> {
    for _attempt in 0..3 {
        let Looked {
            started,
            seen,
            stored,
        } = match first.take() {
            Some(made) => made,
            None => Looked::now(core, key, Want::Value)?,
        };
        let now = core.now_ms();
        let stored = match stored {
            Some(s) if s.is_live(now) => s,
            _ => {
                add(&core.counters.misses);
                return Ok(None);
            }
        };
        match stored.loc {
            Loc::Warm { value, .. } => {
                let value = value.expect("value requested");
                core.load_model
                    .record(Tier::Warm, value.len() as u64, started.elapsed());
                add(&core.counters.warm_hits);
                let (expire_ms, kind) = (stored.expire_ms, stored.kind);
                after_read(
                    core,
                    key,
                    Read::Warm {
                        seen,
                        value: value.clone(),
                        kind,
                        expire_ms,
                    },
                );
                return Ok(Some((value, kind)));
            }
            Loc::Cold(r) => match fetch_cold(core, key, seen, r, started).await {
                Err(Error::ColdUnavailable(m)) if moved(core, key, &r)? => {
                    tracing::debug!(reason = m, "the index moved during a cold read; again");
                }
                other => return other.map(|v| Some((v, r.kind))),
            },
        }
    }
    Err(Error::Internal(
        "key kept moving between tiers during a read".into(),
    ))
}

/// Fetches `key`'s value from block `r` (the lookup saw it at stripe version `seen`), and
/// hands the read to the hook.
async fn fetch_cold(
    core: &Core,
    key: &Key,
    seen: u64,
    r: BlockRef,
    started: Instant,
) -> Result<Bytes> {
    let demand = core.prefetch.demand_read(core.cold.fetching(&r));
    let (value, block) = core.fetch_cold(key, &r).await?;
    drop(demand);
    core.load_model
        .record(Tier::Cold, value.len() as u64, started.elapsed());
    add(&core.counters.cold_hits);
    let read = Read::Cold {
        seen,
        r,
        value: value.clone(),
        block,
    };
    after_read(core, key, read);
    Ok(value)
}

/// Whether the index stopped pointing at `r` (the segment may have been rewritten while it
/// was read).
fn moved(core: &Core, key: &Key, r: &BlockRef) -> Result<bool> {
    Ok(!matches!(core.warm.cold_ref(key)?, Some(now) if now == *r))
}

/// What a lookup found for one key of a multi-key read.
enum Found {
    Value(Bytes, Tier, Kind),
    /// In the object store, not fetched yet: its index entry and the stripe version seen.
    Cold(BlockRef, u64),
    /// In no tier (absent or expired).
    Missing,
}

/// Reads `keys` through the tiers; with `prefix`, nothing after the first key found in no
/// tier is returned. At most `bytes_max` bytes of values: with `prefix` the read stops
/// before the value that would pass it, without it the read is refused; either way before
/// the object store is asked (the index knows each cold value's length).
pub(crate) async fn read_many(
    core: &Arc<Core>,
    keys: &[&Key],
    prefix: bool,
    bytes_max: u64,
) -> Result<Vec<Option<(Bytes, Tier, Kind)>>> {
    crate::fold::fold_keys(core, keys)?;
    let mut found = lookup_many(core, keys).await?;
    let first_miss = found
        .iter()
        .position(|f| matches!(f, Found::Missing))
        .unwrap_or(keys.len());
    let end = if prefix { first_miss } else { keys.len() };
    let cut = cut_at(&found[..end], bytes_max, prefix)?;
    for f in &mut found[cut..] {
        *f = Found::Missing;
    }
    // The first failure ends the read: the fetches still waiting for a read slot are
    // dropped rather than each waiting out its own timeout.
    let started = Instant::now();
    let cold: Vec<(usize, BlockRef, u64)> = found
        .iter()
        .enumerate()
        .filter_map(|(i, f)| match f {
            Found::Cold(r, seen) => Some((i, *r, *seen)),
            _ => None,
        })
        .collect();
    let fetched = futures::future::try_join_all(cold.iter().map(|&(i, r, seen)| async move {
        match fetch_cold(core, keys[i], seen, r, started).await {
            Err(Error::ColdUnavailable(_)) if moved(core, keys[i], &r)? => {
                get_uncached(core, keys[i], None).await
            }
            other => other.map(|v| Some((v, r.kind))),
        }
    }))
    .await?;
    for (&(i, _, _), v) in cold.iter().zip(fetched) {
        found[i] = match v {
            Some((v, kind)) => Found::Value(v, Tier::Cold, kind),
            None => Found::Missing,
        };
    }
    Ok(found
        .into_iter()
        .map(|f| match f {
            Found::Value(v, t, kind) => Some((v, t, kind)),
            _ => None,
        })
        .collect())
}

/// Where the values of `found` stop fitting in `bytes_max` (one value alone may be larger:
/// the reply carries it). Without `prefix`, passing the limit is an error.
fn cut_at(found: &[Found], bytes_max: u64, prefix: bool) -> Result<usize> {
    let mut reply = ReplyBytes::new(bytes_max);
    for (i, f) in found.iter().enumerate() {
        let len = match f {
            Found::Value(v, _, _) => v.len() as u64,
            Found::Cold(r, _) => r.value_len as u64,
            Found::Missing => continue,
        };
        if !reply.fits(len) {
            return match prefix {
                true => Ok(i),
                false => Err(too_many_bytes(bytes_max)),
            };
        }
    }
    Ok(found.len())
}

/// The values one reply carries, held to a limit in all (a value alone may pass it).
pub(crate) struct ReplyBytes {
    max: u64,
    total: u64,
    values: usize,
}

impl ReplyBytes {
    pub(crate) fn new(max: u64) -> ReplyBytes {
        ReplyBytes {
            max,
            total: 0,
            values: 0,
        }
    }

    /// Counts a value of `len` bytes; false once the values counted pass the limit.
    pub(crate) fn fits(&mut self, len: u64) -> bool {
        self.total = self.total.saturating_add(len);
        self.values += 1;
        self.total <= self.max || self.values == 1
    }
}

/// The refusal of a multi-key read whose values hold more than `bytes_max`.
pub(crate) fn too_many_bytes(bytes_max: u64) -> Error {
    Error::Invalid(format!(
        "the values asked for hold more than {bytes_max} bytes, the most one reply may \
         carry; ask for fewer keys at a time"
    ))
}

/// The lookup of many keys: DRAM for all (one pass over its shards), then one multi-get of
/// the warm records of the rest (with their values), then one of the cold index entries of
/// those not warm.
async fn lookup_many(core: &Arc<Core>, keys: &[&Key]) -> Result<Vec<Found>> {
    let now = core.now_ms();
    let mut found: Vec<Found> = Vec::with_capacity(keys.len());
    let mut pending = look_in_dram(core, keys, now, &mut found)?;
    rule_out(core, keys, &mut pending);
    if pending.is_empty() {
        return Ok(found);
    }
    let not_warm = look_in_warm(core, keys, &pending, now, &mut found).await?;
    if !not_warm.is_empty() {
        look_in_cold(core, keys, &not_warm, now, &mut found).await?;
    }
    Ok(found)
}

/// [`lookup_many`]'s first pass: what DRAM holds into `found`; the positions of the keys
/// to look for further.
fn look_in_dram(
    core: &Core,
    keys: &[&Key],
    now: u64,
    found: &mut Vec<Found>,
) -> Result<Vec<usize>> {
    let mut pending = Vec::new();
    let mut hits = Vec::with_capacity(keys.len());
    // A key write-back writes after this pass is read as it was before the write.
    for (i, (&k, hot)) in keys.iter().zip(core.hot_get_many(keys, now)?).enumerate() {
        found.push(Found::Missing);
        match hot {
            HotGot::Value(v, kind) => {
                hits.push(k);
                found[i] = Found::Value(v, Tier::Hot, kind);
            }
            HotGot::Expired => add(&core.counters.misses),
            HotGot::Missing => pending.push(i),
        }
    }
    hot_hits(core, &hits);
    Ok(pending)
}

/// Drops from `pending` the keys the key filter rules out: they are in no tier (a key is
/// added before its record is written, and DRAM was looked at first), so they need no
/// version and no read of RocksDB.
fn rule_out(core: &Core, keys: &[&Key], pending: &mut Vec<usize>) {
    if pending.is_empty() {
        return;
    }
    let pending_keys: Vec<&Key> = pending.iter().map(|&i| keys[i]).collect();
    let maybe = core.warm.may_hold(&pending_keys);
    if maybe.iter().all(|&m| m) {
        return;
    }
    for (&i, _) in pending.iter().zip(&maybe).filter(|(_, &m)| !m) {
        core.access.count_read(keys[i], false);
        add(&core.counters.misses);
    }
    let mut m = maybe.iter();
    pending.retain(|_| *m.next().expect("one answer per key"));
}

/// [`lookup_many`]'s warm pass over the keys at `pending`: their records' values into
/// `found`; the keys the warm store has no record of, with their stripe versions.
async fn look_in_warm(
    core: &Arc<Core>,
    keys: &[&Key],
    pending: &[usize],
    now: u64,
    found: &mut [Found],
) -> Result<Vec<(usize, u64)>> {
    let pending_keys: Vec<&Key> = pending.iter().map(|&i| keys[i]).collect();
    let versions: Vec<u64> = pending
        .iter()
        .map(|&i| core.locks.version(keys[i]))
        .collect();
    let records = read_warm_batch(core, &pending_keys, now).await?;
    let mut not_warm = Vec::new();
    for ((&i, got), &seen) in pending.iter().zip(records).zip(&versions) {
        match got {
            WarmGot::Value(value, expire_ms, kind) => {
                core.access.count_read(keys[i], true);
                add(&core.counters.warm_hits);
                let read = Read::Warm {
                    seen,
                    value: value.clone(),
                    kind,
                    expire_ms,
                };
                after_read(core, keys[i], read);
                found[i] = Found::Value(value, Tier::Warm, kind);
            }
            WarmGot::Expired => {
                core.access.count_read(keys[i], false);
                add(&core.counters.misses);
            }
            WarmGot::Absent => not_warm.push((i, seen)),
        }
    }
    Ok(not_warm)
}

/// [`lookup_many`]'s last pass: the cold index's entries of the keys `not_warm` names
/// into `found`, and the keys a write moved between the two passes read again alone.
async fn look_in_cold(
    core: &Arc<Core>,
    keys: &[&Key],
    not_warm: &[(usize, u64)],
    now: u64,
    found: &mut [Found],
) -> Result<()> {
    let cold_keys: Vec<&Key> = not_warm.iter().map(|&(i, _)| keys[i]).collect();
    let mut moved_between = Vec::new();
    for (&(i, seen), r) in not_warm.iter().zip(core.warm.cold_refs(&cold_keys)) {
        match r? {
            Some(r) if strata_format::is_live(r.expire_ms, now) => {
                core.access.count_read(keys[i], true);
                found[i] = Found::Cold(r, seen);
            }
            // A write committed between the two multi-gets (a cold value's return may have
            // moved the key from the index to a record): the key is read again alone.
            None if !core.locks.unchanged(keys[i], seen) => moved_between.push(i),
            _ => {
                core.access.count_read(keys[i], false);
                add(&core.counters.misses);
            }
        }
    }
    for i in moved_between {
        let got = get_uncached(core, keys[i], None).await?;
        core.access.count_read(keys[i], got.is_some());
        if let Some((v, kind)) = got {
            found[i] = Found::Value(v, Tier::Warm, kind);
        }
    }
    Ok(())
}

/// What a warm multi-get found for one key.
enum WarmGot {
    Value(Bytes, u64, Kind),
    Expired,
    Absent,
}

/// One multi-get of `keys`' warm records, values verified.
fn read_warm(core: &Core, keys: &[&Key], now: u64) -> Result<Vec<WarmGot>> {
    keys.iter()
        .zip(core.warm.records(keys))
        .map(|(key, rec)| {
            let Some(rec) = rec? else {
                return Ok(WarmGot::Absent);
            };
            let expire_ms = WarmRecord::decode_unverified(&rec)?.expire_ms;
            if !strata_format::is_live(expire_ms, now) {
                return Ok(WarmGot::Expired);
            }
            let (value, kind) =
                record_value(key, &rec, &core.vlog, &core.warm).inspect_err(|_| {
                    add(&core.counters.checksum_errors);
                })?;
            Ok(WarmGot::Value(value, expire_ms, kind))
        })
        .collect()
}

/// Reads `keys` from the warm store. When recent warm values were large, the second half
/// of the batch is read (copied and its checksums verified) on a blocking thread while this
/// one reads the first half, so a large multi-key read uses two cores.
async fn read_warm_batch(core: &Arc<Core>, keys: &[&Key], now: u64) -> Result<Vec<WarmGot>> {
    let split = keys.len() >= 2
        && core.warm_value_bytes_avg.load(Ordering::Relaxed) >= SPLIT_VALUE_BYTES_MIN;
    let got = if split {
        add(&core.counters.warm_batches_split);
        let half = keys.len() / 2;
        let second: Vec<Key> = keys[half..].iter().map(|k| (*k).clone()).collect();
        let other = Arc::clone(core);
        let task = tokio::task::spawn_blocking(move || {
            let refs: Vec<&Key> = second.iter().collect();
            read_warm(&other, &refs, now)
        });
        let mut got = read_warm(core, &keys[..half], now)?;
        got.extend(
            task.await
                .map_err(|e| Error::Data(format!("warm read task failed: {e}")))??,
        );
        got
    } else {
        read_warm(core, keys, now)?
    };
    let (bytes, values) = got.iter().fold((0u64, 0u64), |(b, n), g| match g {
        WarmGot::Value(v, _, _) => (b + v.len() as u64, n + 1),
        _ => (b, n),
    });
    if let Some(avg) = bytes.checked_div(values) {
        let old = core.warm_value_bytes_avg.load(Ordering::Relaxed);
        let new = if old == 0 { avg } else { (old * 3 + avg) / 4 };
        core.warm_value_bytes_avg.store(new, Ordering::Relaxed);
    }
    Ok(got)
}

/// The live stored entry of `key`, without its value.
fn live(core: &Core, key: &Key) -> Result<Option<Stored>> {
    let now = core.now_ms();
    if let Some(d) = core.writeback.get(key) {
        // Stands for the value write-back holds: never written, never located.
        let stored = Stored {
            loc: Loc::Warm {
                charge: 0,
                value: None,
                logged: None,
                parted: None,
                checksum: 0,
            },
            kind: d.kind,
            expire_ms: d.expire_ms,
            value_len: d.value.len() as u64,
        };
        return Ok(Some(stored).filter(|s| s.is_live(now)));
    }
    Ok(core.lookup(key, Want::Entry)?.filter(|s| s.is_live(now)))
}

/// Whether `key` holds a live value, without reading a cold value.
pub(crate) fn exists(core: &Core, key: &Key) -> Result<bool> {
    // A live value answers for its key without being folded (a large one would be
    // encoded whole for a yes or no); so for the kind and the expiry below.
    if let Some(known) = crate::live::peek(core, key) {
        return Ok(known.is_some());
    }
    crate::fold::fold_keys(core, &[key])?;
    if core.hot.contains(key.stored(), core.now_ms()) {
        return Ok(true);
    }
    Ok(live(core, key)?.is_some())
}

/// The kind of value `key` holds, if live, without reading the value.
pub(crate) fn kind_of(core: &Core, key: &Key) -> Result<Option<Kind>> {
    if let Some(known) = crate::live::peek(core, key) {
        return Ok(known.map(|(kind, _)| kind));
    }
    crate::fold::fold_keys(core, &[key])?;
    if let Some((_, tag)) = core.hot.peek(key.stored(), core.now_ms()) {
        return Ok(Some(Kind::from_u8(tag)?));
    }
    Ok(live(core, key)?.map(|s| s.kind))
}

/// The absolute expiry of `key` in Unix ms: `None` if absent, `Some(0)` if it never expires.
pub(crate) fn expire_time_ms(core: &Core, key: &Key) -> Result<Option<u64>> {
    if let Some(known) = crate::live::peek(core, key) {
        return Ok(known.map(|(_, expire_ms)| expire_ms));
    }
    crate::fold::fold_keys(core, &[key])?;
    Ok(live(core, key)?.map(|s| s.expire_ms))
}

/// Which tier serves `key` now and how many bytes its value holds, without reading it.
pub(crate) fn locate(core: &Core, key: &Key) -> Result<Option<(Tier, u64)>> {
    crate::fold::fold_keys(core, &[key])?;
    // DRAM holds only copies of stored, live keys: a hit there needs no warm read (which
    // would copy a large value out of a memtable or a blob file).
    let now = core.now_ms();
    if let Some(len) = core.hot.value_len(key.stored(), now) {
        return Ok(Some((Tier::Hot, len as u64)));
    }
    if let Some(d) = core.writeback.get(key) {
        return Ok(d.is_live(now).then(|| (Tier::Hot, d.value.len() as u64)));
    }
    Ok(live(core, key)?.map(|s| {
        let tier = match s.loc {
            Loc::Warm { .. } => Tier::Warm,
            Loc::Cold(_) => Tier::Cold,
        };
        (tier, s.value_len)
    }))
}

/// For each leading key of `keys` that holds a live value, where that value lies in the
/// value log (`None` if elsewhere); stops at the first key with no live value.
pub(crate) fn locate_local(core: &Core, keys: &[&Key]) -> Result<Vec<Option<LocalValue>>> {
    crate::fold::fold_keys(core, keys)?;
    let mut out = Vec::with_capacity(keys.len());
    for &key in keys {
        let Some(s) = live(core, key)?.filter(|s| s.kind == Kind::String) else {
            break;
        };
        core.access.count_read(key, true);
        out.push(match s.loc {
            Loc::Warm {
                logged: Some(at),
                checksum,
                ..
            } => Some(LocalValue {
                path: core.vlog.path_of(at.file),
                offset: at.offset,
                len: at.len,
                expire_ms: s.expire_ms,
                checksum,
            }),
            _ => None,
        });
    }
    Ok(out)
}

/// A read of the collection of `kind` at `key` from its live value, if it has one or gets
/// one now: `f` sees it (under the map's lock: keep `f` short), `Ok(None)` sends the
/// caller to the stored value (no live value; the key is absent, expired or cold; live
/// values are off or full). A key read a second time running ([`Live::seen`]) is made live
/// with `decode`, as a write makes it. Another kind there is [`Error::WrongType`].
pub(crate) fn read_live<R>(
    core: &Core,
    key: &Key,
    kind: Kind,
    decode: impl FnOnce(Option<&Bytes>) -> Result<Box<dyn LiveValue>>,
    f: impl FnOnce(&mut dyn LiveValue) -> R,
) -> Result<Option<R>> {
    let out = read_in_place(core, key, kind, decode, f)?;
    if out.is_some() {
        // A hit, counted once the live values' lock is let go (it may queue a job).
        add(&core.counters.live_reads);
        crate::read::hot_hit(core, key);
    }
    Ok(out)
}

/// [`read_live`] up to its answer, under the locks it takes.
fn read_in_place<R>(
    core: &Core,
    key: &Key,
    kind: Kind,
    decode: impl FnOnce(Option<&Bytes>) -> Result<Box<dyn LiveValue>>,
    f: impl FnOnce(&mut dyn LiveValue) -> R,
) -> Result<Option<R>> {
    if !allowed(core) {
        return Ok(None);
    }
    let live = &core.live;
    if live.may_hold(key.stored()) {
        let mut slots = live.slots.lock();
        if let Some(slot) = slots.get_mut(key.stored()) {
            if !slot.away {
                return read_slot(core, slot, kind, f);
            }
            // Being folded: its folder holds the stripe lock.
            drop(slots);
            let _g = core.locks.lock(key);
            return match live.slots.lock().get_mut(key.stored()) {
                Some(slot) => read_slot(core, slot, kind, f),
                // Folded and let go: its stored form is its newest state.
                None => Ok(None),
            };
        }
    }
    if !live.seen_again(key.stored()) {
        return Ok(None);
    }
    if live.bytes() >= bytes_max(core) {
        // No fold may come soon (reads alone commit nothing): make room now.
        make_room(core, Room::Idle, bytes_max(core))?;
        if live.bytes() >= bytes_max(core) {
            return Ok(None);
        }
    }
    let _g = core.locks.lock(key);
    if let Some(slot) = live.slots.lock().get_mut(key.stored()) {
        return read_slot(core, slot, kind, f);
    }
    let now = core.now_ms();
    // Not a value stored as parts, put together from them: a read of a few of its items
    // reads those alone ([`crate::read::get_named_with`]), and one of all of them pays
    // for itself alone.
    let (value, expire_ms, stored) = match adoptable_parted(core, key, now, false)? {
        Some(Some((v, e, k, p))) if k == kind => (v, e, p),
        Some(Some(_)) => return Err(Error::WrongType),
        // Absent, cold or parts: the stored value answers.
        Some(None) | None => return Ok(None),
    };
    let obj = decode(Some(&value))?;
    if obj.stays() && alone(core, obj.bytes()) && !admits(core, obj.bytes()) {
        // Live only alone: the unchanged others go (a read commits nothing).
        make_room(core, Room::Aside(key), 0)?;
    }
    if !obj.stays() || obj.is_empty() || !admits(core, obj.bytes()) {
        return Ok(None);
    }
    live.hold(key, Slot::new(kind, expire_ms, obj, stored, now), false);
    let mut slots = live.slots.lock();
    let slot = slots
        .get_mut(key.stored())
        .expect("held under the stripe lock");
    read_slot(core, slot, kind, f)
}

/// [`read_live`] of the live value in `slot` (the map's lock held): `Ok(None)` if it
/// expired (the key is gone: the stored value says so too).
fn read_slot<R>(
    core: &Core,
    slot: &mut Slot,
    kind: Kind,
    f: impl FnOnce(&mut dyn LiveValue) -> R,
) -> Result<Option<R>> {
    let now = slot.now(core.clock.as_ref());
    if !strata_format::is_live(slot.expire_ms, now) {
        return Ok(None);
    }
    if slot.kind != kind {
        return Err(Error::WrongType);
    }
    slot.used_ms = now;
    Ok(Some(f(slot.value.as_mut())))
}

#[cfg(test)]
mod source_tests {
    use super::Source;
    use bytes::Bytes;

    #[test]
    fn parts_cut_from_a_lent_value_match_those_cut_from_a_shared_one() {
        let value = Bytes::from((0..=255u8).collect::<Vec<u8>>());
        let (lent, shared) = (Source::lent(&value), Source::shared(&value));
        // Past LENT_CUTS_MAX parts the lent value is copied once and cut from the copy.
        for i in 0..40 {
            let part = &value[i * 5..i * 5 + 7];
            assert_eq!(lent.cut(part), shared.cut(part));
        }
        assert!(lent.whole.get().is_some());
        assert_eq!(lent.cut(&value[..0]), Bytes::new());
    }
}
