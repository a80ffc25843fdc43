//! The warm tier as the engine sees it: the warm store (any [`WarmStore`], RocksDB in
//! production) with the engine's key layout on top. This module is the one place that
//! knows which family holds what (`docs/formats.md`):
//!
//! - `Records`: stored key → [`WarmRecord`] (the value inline, or where the value log has it,
//!   or where a large hash's or set's parts are);
//! - `Parts`: part key → one field or member of such a value ([`strata_format::parts`]);
//! - `Cold`: stored key → [`BlockRef`] for keys demoted to the object store;
//! - `Expiry`: expire_ms (big-endian) || stored key → empty, so due keys are found in order;
//! - `Meta`: counters (moved by the add merge rule in the same batch as the data they
//!   count), segment records, pins, per-file value-log garbage, the layout version.
//!
//! Invariant: a key is in at most one of `Records` and `Cold`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use strata_format::keys::{self, Key};
use strata_format::zset::{MemberBound, Pick, ScoreBound, ScoreWindow};
use strata_format::{BlockRef, Kind, Parted, ValuePointer, WarmRecord, WarmValue};
use strata_warm::{Bounds, Cursor, Family, View, WarmStore};

use crate::keyfilter::{Added, KeyFilter};
use crate::stats::{add, Counters};
use crate::vlog::ValueLog;
use crate::{Error, Result};

/// Where the warm store keeps its files in a data directory.
pub fn warm_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("warm")
}

/// Meta key of the persistent counters: warm bytes, warm entries, cold bytes, cold entries.
const COUNTERS: &[u8] = b"counters";
const NEXT_SEGMENT_ID: &[u8] = b"next_segment_id";
const SEGMENT_PREFIX: &[u8] = b"segment/";
const PIN_PREFIX: &[u8] = b"pin/";
/// Meta key prefix of each value-log file's garbage bytes (file id big-endian).
const VLOG_GARBAGE_PREFIX: &[u8] = b"vlog_garbage/";
/// Meta key of the key layout the families follow (u32 LE; absent in layout 1).
pub(crate) const LAYOUT: &[u8] = b"layout";
/// Meta key prefix of each database's live key count (`db_keys/<db>`, i64 LE, moved by the
/// add merge rule in the batch that adds or removes the key).
const DB_KEYS_PREFIX: &[u8] = b"db_keys/";
/// Databases the layout can hold (the stored key's first byte).
pub(crate) const DB_COUNT: usize = 256;
/// Meta key of the database map (`SWAPDB`): byte `i` is the stored database that client
/// database `i` names. Absent until the first swap (each names itself).
const DB_MAP: &[u8] = b"db_map";
/// Meta key of the key mode: 1 if stored keys carry their cluster slot (cluster mode), 0
/// or absent if the slot is always 0.
const KEY_SLOTS: &[u8] = b"key_slots";

/// What the server saves through the engine, in its own encoding, each under a meta key
/// of its own (durable, in backups; not in the bucket log: it is this node's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Saved {
    /// The function libraries (`FUNCTION`).
    Functions,
    /// The KV-cache pool's quotas per namespace (`KVC.QUOTA`).
    KvcQuotas,
}

impl Saved {
    fn meta_key(self) -> &'static [u8] {
        match self {
            Saved::Functions => b"functions",
            Saved::KvcQuotas => b"kvc_quotas",
        }
    }
}

/// The persistent counters, in the order they are stored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) warm_bytes: i64,
    pub(crate) warm_entries: i64,
    pub(crate) cold_bytes: i64,
    pub(crate) cold_entries: i64,
}

impl Counts {
    fn encode(&self) -> Vec<u8> {
        [
            self.warm_bytes,
            self.warm_entries,
            self.cold_bytes,
            self.cold_entries,
        ]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect()
    }
    fn decode(b: &[u8]) -> Counts {
        let v: Vec<i64> = b
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
            .chain(std::iter::repeat(0))
            .take(4)
            .collect();
        Counts {
            warm_bytes: v[0],
            warm_entries: v[1],
            cold_bytes: v[2],
            cold_entries: v[3],
        }
    }
    pub(crate) fn is_zero(&self) -> bool {
        *self == Counts::default()
    }
}

/// What a warm entry counts against the warm budget: key, record header and value, wherever
/// the value is kept.
pub(crate) fn warm_charge(key: &Key, value_len: u64) -> u64 {
    (key.stored().len() + strata_format::WARM_HEADER_BYTES) as u64 + value_len
}

/// Where a stored entry lives, as read under its stripe lock.
pub(crate) enum Loc {
    /// `charge` is what the entry counts against the warm budget; `logged` is where the
    /// value log holds the value, if it does; `parted`, where its parts are, if it is
    /// stored as parts; `checksum` is the record's.
    Warm {
        charge: u64,
        value: Option<Bytes>,
        logged: Option<ValuePointer>,
        parted: Option<Parted>,
        checksum: u32,
    },
    Cold(BlockRef),
}

/// A stored entry: where it is, what kind of value, its expiry and its value's length.
pub(crate) struct Stored {
    pub(crate) loc: Loc,
    pub(crate) kind: Kind,
    pub(crate) expire_ms: u64,
    pub(crate) value_len: u64,
}

impl Stored {
    /// The entry a cold index entry describes.
    pub(crate) fn cold(r: BlockRef) -> Stored {
        Stored {
            loc: Loc::Cold(r),
            kind: r.kind,
            expire_ms: r.expire_ms,
            value_len: r.value_len as u64,
        }
    }
    pub(crate) fn is_live(&self, now_ms: u64) -> bool {
        strata_format::is_live(self.expire_ms, now_ms)
    }
    /// Where its parts are, if it is a warm value stored as parts.
    pub(crate) fn parted(&self) -> Option<Parted> {
        match self.loc {
            Loc::Warm { parted, .. } => parted,
            Loc::Cold(_) => None,
        }
    }
}

/// What a lookup reads of a warm entry besides its record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Want {
    /// The record alone.
    Entry,
    /// The value, verified (a value stored as parts is put together).
    Value,
    /// The value unless it is stored as parts: for reads that then read parts by name.
    ValueUnlessParted,
}

/// What the meta family records of a committed segment.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SegmentMeta {
    pub(crate) entries: u64,
    pub(crate) value_bytes: u64,
}

impl SegmentMeta {
    /// The record of a segment whose index entries are `refs`, all of them.
    pub(crate) fn of(refs: &[(Vec<u8>, BlockRef)]) -> Self {
        SegmentMeta {
            entries: refs.len() as u64,
            value_bytes: refs.iter().map(|(_, r)| u64::from(r.value_len)).sum(),
        }
    }

    fn encode(&self) -> Vec<u8> {
        let mut v = self.entries.to_le_bytes().to_vec();
        v.extend_from_slice(&self.value_bytes.to_le_bytes());
        v
    }
    fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != 16 {
            return None;
        }
        Some(SegmentMeta {
            entries: u64::from_le_bytes(b[..8].try_into().ok()?),
            value_bytes: u64::from_le_bytes(b[8..].try_into().ok()?),
        })
    }
}

fn prefixed(prefix: &[u8], rest: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(prefix.len() + rest.len());
    k.extend_from_slice(prefix);
    k.extend_from_slice(rest);
    k
}

fn segment_meta_key(id: u64) -> Vec<u8> {
    prefixed(SEGMENT_PREFIX, &id.to_be_bytes())
}

fn garbage_key(file: u64) -> Vec<u8> {
    prefixed(VLOG_GARBAGE_PREFIX, &file.to_be_bytes())
}

/// The warm tier: the store and the layout of its families, with each database's key
/// count in memory beside its persistent copy.
pub(crate) struct Warm {
    pub(crate) store: Arc<dyn WarmStore>,
    db_keys: Box<[AtomicI64]>,
    /// The database map in memory (see [`DB_MAP`]).
    db_map: Box<[std::sync::atomic::AtomicU8]>,
    /// Whether the cold index may hold an entry: false only while it has held none since
    /// the store opened empty of them, so a key missing from the records is then missing,
    /// with no read of the index (most look-ups of absent keys on a store that never
    /// demoted). Set before the batch that adds the first entry is written, so a look-up
    /// that sees that batch's removal of a record also sees the flag.
    cold_may_hold: AtomicBool,
    /// Which keys the records and the cold index may hold (see [`crate::keyfilter`]).
    filter: KeyFilter,
    counters: Arc<Counters>,
}

/// A batch of changes to the warm tier, in the engine's terms, with the key count each
/// database gains or loses by it, and whether it puts entries into the cold index (see
/// [`Warm::cold_may_hold`]), and the keys it puts records for (for the key filter).
pub(crate) struct Batch(Box<dyn strata_warm::Batch>, KeyTally, bool, Added);

/// Keys added (positive) or removed per database in one batch; a batch of one database
/// needs no allocation.
#[derive(Default)]
struct KeyTally {
    first: Option<(u8, i64)>,
    more: Vec<(u8, i64)>,
    /// Every count is reset to 0 before the tally applies (`FLUSHALL`).
    reset: bool,
}

impl KeyTally {
    fn add(&mut self, db: u8, n: i64) {
        match &mut self.first {
            None => self.first = Some((db, n)),
            Some((d, c)) if *d == db => *c += n,
            Some(_) => match self.more.iter_mut().find(|(d, _)| *d == db) {
                Some((_, c)) => *c += n,
                None => self.more.push((db, n)),
            },
        }
    }
    fn iter(&self) -> impl Iterator<Item = (u8, i64)> + '_ {
        self.first
            .iter()
            .chain(self.more.iter())
            .copied()
            .filter(|&(_, n)| n != 0)
    }
}

fn db_keys_key(db: u8) -> Vec<u8> {
    prefixed(DB_KEYS_PREFIX, &[db])
}

impl Batch {
    /// Counts a key of database `db` as added (`n` = 1) or removed (-1).
    pub(crate) fn count_key(&mut self, db: u8, n: i64) {
        self.1.add(db, n);
    }
    /// Sets every database's key count to 0 (with the families cleared).
    pub(crate) fn reset_key_counts(&mut self) {
        self.1 = KeyTally {
            reset: true,
            ..KeyTally::default()
        };
        for db in 0..DB_COUNT {
            self.0.delete(Family::Meta, &db_keys_key(db as u8));
        }
        // The marker that counts are kept (see `Warm::load_key_counts`).
        self.0
            .put(Family::Meta, &db_keys_key(0), &0i64.to_le_bytes());
    }
    pub(crate) fn put_record(&mut self, key: &Key, record: &[u8]) {
        self.3.push(key.stored());
        self.0.put(Family::Records, key.stored(), record);
    }
    pub(crate) fn delete_record(&mut self, key: &Key) {
        self.0.delete(Family::Records, key.stored());
    }
    /// Puts `item`, named `name`, as a part of `key`'s value at `version`.
    pub(crate) fn put_part(&mut self, key: &Key, version: u64, name: &[u8], item: &[u8]) {
        let k = keys::part_key(key, version, name);
        self.0.put(
            Family::Parts,
            &k,
            &strata_format::parts::encode_part(&k, item),
        );
    }
    pub(crate) fn delete_part(&mut self, key: &Key, version: u64, name: &[u8]) {
        self.0
            .delete(Family::Parts, &keys::part_key(key, version, name));
    }
    /// The score-index entry of `member` with `score` of the sorted set `key` stored as
    /// parts at `version`.
    pub(crate) fn put_score(&mut self, key: &Key, version: u64, score: f64, member: &[u8]) {
        let k = keys::score_key(key, version, score, member);
        let v = strata_format::parts::encode_score_entry(&k, score);
        self.0.put(Family::Scores, &k, &v);
    }
    pub(crate) fn delete_score(&mut self, key: &Key, version: u64, score: f64, member: &[u8]) {
        let k = keys::score_key(key, version, score, member);
        self.0.delete(Family::Scores, &k);
    }
    /// Deletes every part (and score-index entry) of `key`'s value at `version`.
    pub(crate) fn clear_parts(&mut self, key: &Key, version: u64) {
        let prefix = keys::parts_prefix(key, version);
        self.clear_prefix(Family::Parts, &prefix);
        self.clear_prefix(Family::Scores, &prefix);
    }
    pub(crate) fn put_cold(&mut self, key: &Key, r: &BlockRef) {
        self.2 = true;
        // Every key put here was a record first, so it is in the filter already; added
        // again so that the filter's invariant does not rest on that.
        self.3.push(key.stored());
        self.0.put(Family::Cold, key.stored(), &r.encode());
    }
    pub(crate) fn delete_cold(&mut self, key: &Key) {
        self.0.delete(Family::Cold, key.stored());
    }
    pub(crate) fn add_expiry(&mut self, expire_ms: u64, key: &Key) {
        self.0.put(
            Family::Expiry,
            &keys::expiry_key(expire_ms, key.stored()),
            b"",
        );
    }
    pub(crate) fn remove_expiry(&mut self, expire_ms: u64, key: &Key) {
        self.0
            .delete(Family::Expiry, &keys::expiry_key(expire_ms, key.stored()));
    }
    /// Moves the persistent counters by `d`.
    pub(crate) fn add_counts(&mut self, d: &Counts) {
        if !d.is_zero() {
            self.0.merge(Family::Meta, COUNTERS, &d.encode());
        }
    }
    pub(crate) fn reset_counts(&mut self) {
        self.0
            .put(Family::Meta, COUNTERS, &Counts::default().encode());
    }
    /// Counts the value-log entry of `key` at `at` (no record points at it any more) as
    /// garbage of its file.
    pub(crate) fn add_vlog_garbage(&mut self, key: &Key, at: ValuePointer) {
        let bytes = crate::vlog::entry_bytes(key.stored().len(), at.len) as i64;
        self.0
            .merge(Family::Meta, &garbage_key(at.file), &bytes.to_le_bytes());
    }
    /// Sets file `file`'s garbage to `bytes` (all of it, after `FLUSHALL`).
    pub(crate) fn set_vlog_garbage(&mut self, file: u64, bytes: u64) {
        self.0.put(
            Family::Meta,
            &garbage_key(file),
            &(bytes as i64).to_le_bytes(),
        );
    }
    /// Forgets file `file`'s garbage count (the file is gone).
    pub(crate) fn drop_vlog_garbage(&mut self, file: u64) {
        self.0.delete(Family::Meta, &garbage_key(file));
    }
    pub(crate) fn put_segment(&mut self, id: u64, meta: SegmentMeta) {
        self.0
            .put(Family::Meta, &segment_meta_key(id), &meta.encode());
    }
    pub(crate) fn delete_segment(&mut self, id: u64) {
        self.0.delete(Family::Meta, &segment_meta_key(id));
    }
    pub(crate) fn set_next_segment_id(&mut self, next: u64) {
        self.0
            .put(Family::Meta, NEXT_SEGMENT_ID, &(next as i64).to_le_bytes());
    }
    pub(crate) fn put_pin(&mut self, pattern: &[u8]) {
        self.0
            .put(Family::Meta, &prefixed(PIN_PREFIX, pattern), b"");
    }
    pub(crate) fn delete_pin(&mut self, pattern: &[u8]) {
        self.0.delete(Family::Meta, &prefixed(PIN_PREFIX, pattern));
    }
    pub(crate) fn set_key_slots(&mut self, on: bool) {
        self.0.put(Family::Meta, KEY_SLOTS, &[on as u8]);
    }
    pub(crate) fn set_layout(&mut self, version: u32) {
        self.0.put(Family::Meta, LAYOUT, &version.to_le_bytes());
    }
    /// Deletes every key of `family`: every key of every family is shorter than three
    /// stored keys, so all sort below that many 0xff bytes.
    pub(crate) fn clear(&mut self, family: Family) {
        let hi = vec![0xffu8; 3 * strata_format::STORED_KEY_BYTES_MAX];
        self.0.delete_range(family, b"", &hi);
    }
    /// Deletes every key of `family` that starts with `prefix`.
    pub(crate) fn clear_prefix(&mut self, family: Family, prefix: &[u8]) {
        let hi = strata_warm::prefix_end(prefix)
            .unwrap_or_else(|| vec![0xffu8; 3 * strata_format::STORED_KEY_BYTES_MAX]);
        self.0.delete_range(family, prefix, &hi);
    }
    /// Copies a raw entry (the layout migration).
    pub(crate) fn put_raw(&mut self, family: Family, key: &[u8], value: &[u8]) {
        self.2 |= family == Family::Cold;
        if matches!(family, Family::Records | Family::Cold) {
            self.3.push(key);
        }
        self.0.put(family, key, value);
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.0.count() == 0
    }
}

impl Warm {
    pub(crate) fn new(store: Arc<dyn WarmStore>, counters: Arc<Counters>) -> Warm {
        Warm {
            store,
            db_keys: (0..DB_COUNT).map(|_| AtomicI64::new(0)).collect(),
            db_map: (0..DB_COUNT)
                .map(|i| std::sync::atomic::AtomicU8::new(i as u8))
                .collect(),
            cold_may_hold: AtomicBool::new(true),
            filter: KeyFilter::default(),
            counters,
        }
    }

    pub(crate) fn batch(&self) -> Batch {
        Batch(
            self.store.batch(),
            KeyTally::default(),
            false,
            Added::default(),
        )
    }

    /// Whether a build of the key filter is due (see [`KeyFilter::build_due`]).
    pub(crate) fn key_filter_build_due(&self) -> bool {
        self.filter.build_due(self.keys()).is_some()
    }

    /// Builds the key filter if a build is due (see [`KeyFilter::build_due`]): a scan of
    /// the records and the cold index. A failed build is logged, not returned: reads go on
    /// without the filter's answers.
    pub(crate) fn build_key_filter_if_due(&self) {
        let Some(capacity) = self.filter.build_due(self.keys()) else {
            return;
        };
        let built = self.filter.build(capacity, |add_key| {
            for family in [Family::Records, Family::Cold] {
                let mut c = self.cursor(family, Bounds::all(), None);
                c.seek_to_first();
                while c.valid() {
                    add_key(c.key());
                    c.next();
                }
                c.status()?;
            }
            Ok::<_, Error>(())
        });
        match built {
            Ok(()) => add(&self.counters.key_filter_builds),
            Err(e) => {
                tracing::warn!(error = %e, "building the key filter failed; reads go on without it")
            }
        }
    }

    /// Empties the key filter (`FLUSHALL`, every key's lock held).
    pub(crate) fn clear_key_filter(&self) {
        self.filter.clear();
    }

    /// Bytes the key filter holds.
    pub(crate) fn key_filter_bytes(&self) -> u64 {
        self.filter.bytes()
    }

    /// Looks whether the cold index holds any entry (once, at open, after any migration).
    pub(crate) fn load_cold_may_hold(&self) -> Result<()> {
        let mut c = self.cursor(Family::Cold, Bounds::all(), None);
        c.seek_to_first();
        let any = c.valid();
        c.status()?;
        self.cold_may_hold.store(any, Ordering::SeqCst);
        Ok(())
    }

    /// Reads each database's key count. A store written before counts were kept has none:
    /// all its keys are in database 0 (`entries`, every key of both tiers), and that count
    /// is recorded.
    pub(crate) fn load_key_counts(&self, entries: i64) -> Result<()> {
        let counts = self.meta_prefixed(DB_KEYS_PREFIX)?;
        let found = !counts.is_empty();
        for (db, n) in counts {
            if let (Some(&db), Ok(n)) = (db.first(), <[u8; 8]>::try_from(n.as_slice())) {
                self.db_keys[db as usize].store(i64::from_le_bytes(n), Ordering::Relaxed);
            }
        }
        if !found {
            let mut b = self.store.batch();
            b.put(Family::Meta, &db_keys_key(0), &entries.to_le_bytes());
            self.store.write(b, true)?;
            self.db_keys[0].store(entries, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Reads the database map left by earlier swaps.
    pub(crate) fn load_db_map(&self) -> Result<()> {
        if let Some(map) = self.meta(DB_MAP)? {
            if map.len() != DB_COUNT {
                return Err(crate::Error::Data(format!(
                    "database map of {} bytes, not {DB_COUNT}",
                    map.len()
                )));
            }
            for (slot, &db) in self.db_map.iter().zip(map.iter()) {
                slot.store(db, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// The stored database that client database `db` names.
    pub(crate) fn stored_db(&self, db: u8) -> u8 {
        self.db_map[db as usize].load(Ordering::Relaxed)
    }

    /// Client databases `a` and `b` trade their stored databases, durably, in one write.
    /// The caller keeps every other command out meanwhile (the map is read per command).
    pub(crate) fn swap_dbs(&self, a: u8, b: u8) -> Result<()> {
        let mut map: Vec<u8> = self
            .db_map
            .iter()
            .map(|d| d.load(Ordering::Relaxed))
            .collect();
        map.swap(a as usize, b as usize);
        let mut batch = self.store.batch();
        batch.put(Family::Meta, DB_MAP, &map);
        self.store.write(batch, true)?;
        self.db_map[a as usize].store(map[a as usize], Ordering::Relaxed);
        self.db_map[b as usize].store(map[b as usize], Ordering::Relaxed);
        Ok(())
    }

    pub(crate) fn saved(&self, what: Saved) -> Result<Option<Bytes>> {
        self.meta(what.meta_key())
    }

    pub(crate) fn save(&self, what: Saved, payload: Option<&[u8]>) -> Result<()> {
        let mut batch = self.store.batch();
        match payload {
            Some(p) => batch.put(Family::Meta, what.meta_key(), p),
            None => batch.delete(Family::Meta, what.meta_key()),
        }
        Ok(self.store.write(batch, true)?)
    }

    /// Live keys of every database.
    pub(crate) fn keys(&self) -> u64 {
        (0..DB_COUNT).map(|db| self.keys_in(db as u8)).sum()
    }

    /// Live keys of stored database `db` (both tiers; keys past their expiry count until
    /// removed).
    pub(crate) fn keys_in(&self, db: u8) -> u64 {
        self.db_keys[db as usize].load(Ordering::Relaxed).max(0) as u64
    }

    pub(crate) fn write(&self, b: Batch, sync: bool) -> Result<()> {
        let Batch(mut inner, tally, cold_puts, added) = b;
        for (db, n) in tally.iter() {
            inner.merge(Family::Meta, &db_keys_key(db), &n.to_le_bytes());
        }
        if cold_puts {
            self.cold_may_hold.store(true, Ordering::SeqCst);
        }
        self.filter
            .adding(&added, || self.store.write(inner, sync))?;
        if tally.reset {
            for c in self.db_keys.iter() {
                c.store(0, Ordering::Relaxed);
            }
        }
        for (db, n) in tally.iter() {
            self.db_keys[db as usize].fetch_add(n, Ordering::Relaxed);
        }
        Ok(())
    }

    pub(crate) fn sync_log(&self) -> Result<()> {
        Ok(self.store.sync_log()?)
    }

    /// The record of `key`, as stored.
    pub(crate) fn record(&self, key: &Key) -> Result<Option<Bytes>> {
        if !self.filter.probe().may_hold(key.stored()) {
            add(&self.counters.key_filter_answers);
            return Ok(None);
        }
        Ok(self.store.get(Family::Records, key.stored())?)
    }

    /// The cold index entry of `key`.
    pub(crate) fn cold_ref(&self, key: &Key) -> Result<Option<BlockRef>> {
        if !self.cold_may_hold.load(Ordering::SeqCst) || !self.filter.probe().may_hold(key.stored())
        {
            return Ok(None);
        }
        match self.store.get(Family::Cold, key.stored())? {
            Some(b) => Ok(Some(BlockRef::decode(&b)?)),
            None => Ok(None),
        }
    }

    /// The records of many keys, in their order.
    pub(crate) fn records(&self, keys: &[&Key]) -> Vec<Result<Option<Bytes>>> {
        let (stored, maybe) = self.filtered(keys);
        self.count_filter_answers(keys.len() - stored.len());
        if stored.is_empty() {
            // A multi-get of nothing still costs RocksDB a look at its versions.
            return keys.iter().map(|_| Ok(None)).collect();
        }
        let mut got = self.store.multi_get(Family::Records, &stored).into_iter();
        maybe
            .iter()
            .map(|&m| match m {
                true => got.next().expect("one result per key").map_err(Error::from),
                false => Ok(None),
            })
            .collect()
    }

    /// For each of `keys`, false if the key filter says it is surely in neither the
    /// records nor the cold index (counted as the filter's answers).
    pub(crate) fn may_hold(&self, keys: &[&Key]) -> Vec<bool> {
        let probe = self.filter.probe();
        let maybe: Vec<bool> = keys.iter().map(|k| probe.may_hold(k.stored())).collect();
        self.count_filter_answers(maybe.iter().filter(|&&m| !m).count());
        maybe
    }

    /// Whether the key filter says the stored key `stored` is surely in neither the records
    /// nor the cold index (not counted among the filter's answers to reads).
    pub(crate) fn surely_lacks(&self, stored: &[u8]) -> bool {
        !self.filter.probe().may_hold(stored)
    }

    /// [`Warm::may_hold`] of one key, negated.
    pub(crate) fn rules_out(&self, key: &Key) -> bool {
        let out = self.surely_lacks(key.stored());
        self.count_filter_answers(out as usize);
        out
    }

    fn count_filter_answers(&self, n: usize) {
        if n > 0 {
            self.counters
                .key_filter_answers
                .fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// The stored keys of `keys` the key filter may hold, and for each key whether it is
    /// among them.
    fn filtered<'k>(&self, keys: &[&'k Key]) -> (Vec<&'k [u8]>, Vec<bool>) {
        let probe = self.filter.probe();
        let maybe: Vec<bool> = keys.iter().map(|k| probe.may_hold(k.stored())).collect();
        let stored = keys
            .iter()
            .zip(&maybe)
            .filter(|(_, &m)| m)
            .map(|(k, _)| k.stored())
            .collect();
        (stored, maybe)
    }

    /// The cold index entries of many keys, in their order.
    pub(crate) fn cold_refs(&self, keys: &[&Key]) -> Vec<Result<Option<BlockRef>>> {
        if !self.cold_may_hold.load(Ordering::SeqCst) {
            return keys.iter().map(|_| Ok(None)).collect();
        }
        let (stored, maybe) = self.filtered(keys);
        if stored.is_empty() {
            return keys.iter().map(|_| Ok(None)).collect();
        }
        let mut got = self.store.multi_get(Family::Cold, &stored).into_iter();
        maybe
            .iter()
            .map(|&m| {
                if !m {
                    return Ok(None);
                }
                match got.next().expect("one result per key")? {
                    Some(b) => Ok(Some(BlockRef::decode(&b)?)),
                    None => Ok(None),
                }
            })
            .collect()
    }

    /// Reads the stored entry of `key` (expired or not): its record, else its cold index
    /// entry; of a warm entry, what `want` says.
    pub(crate) fn lookup(&self, key: &Key, want: Want, vlog: &ValueLog) -> Result<Option<Stored>> {
        if let Some(rec) = self.record(key)? {
            return Ok(Some(stored_warm(key, rec, want, vlog, self)?));
        }
        Ok(self.cold_ref(key)?.map(Stored::cold))
    }

    /// [`Warm::lookup`] of many keys without their values: one multi-get of the records,
    /// one of the cold index for the keys not found there.
    pub(crate) fn lookup_many(
        &self,
        keys: &[&Key],
        vlog: &ValueLog,
    ) -> Result<Vec<Option<Stored>>> {
        let mut out = Vec::with_capacity(keys.len());
        let mut missing = Vec::new();
        for (i, (key, rec)) in keys.iter().zip(self.records(keys)).enumerate() {
            match rec? {
                Some(rec) => out.push(Some(stored_warm(key, rec, Want::Entry, vlog, self)?)),
                None => {
                    out.push(None);
                    missing.push(i);
                }
            }
        }
        if !missing.is_empty() {
            let cold_keys: Vec<&Key> = missing.iter().map(|&i| keys[i]).collect();
            for (&i, r) in missing.iter().zip(self.cold_refs(&cold_keys)) {
                out[i] = r?.map(Stored::cold);
            }
        }
        Ok(out)
    }

    /// A cursor over `family` within `bounds`, as of `view` (now if none).
    pub(crate) fn cursor<'a>(
        &'a self,
        family: Family,
        bounds: Bounds,
        view: Option<&'a dyn View>,
    ) -> Box<dyn Cursor + 'a> {
        self.store.cursor(family, bounds, view)
    }

    /// The whole value of `key` (of `kind`) stored as parts at `at`: its header and every
    /// part's item in the order of their keys, each verified (the count must match), put
    /// in the order its kind keeps ([`strata_format::parts::in_order`]).
    pub(crate) fn assemble(&self, key: &Key, kind: Kind, at: Parted) -> Result<Bytes> {
        let prefix = keys::parts_prefix(key, at.version);
        let mut out = strata_format::collection_buf(at.count as usize, at.bytes as usize);
        let mut found = 0u64;
        let mut c = self.cursor(Family::Parts, Bounds::prefix(&prefix), None);
        c.seek_to_first();
        while c.valid() {
            let item = strata_format::parts::decode_part(c.key(), c.value())?;
            out.extend_from_slice(item);
            found += 1;
            c.next();
        }
        c.status()?;
        if found != at.count {
            return Err(Error::Data(format!(
                "{key:?}: its record counts {} parts, its version {} has {found}",
                at.count, at.version
            )));
        }
        let out = strata_format::parts::in_order(kind, out)
            .map_err(|e| Error::Data(format!("{key:?}: its parts: {e}")))?;
        Ok(Bytes::from(out))
    }

    /// The items named `names` of `key`'s value stored as parts at `version`, those found,
    /// each verified, in the order of `names`: what they add up to is a value of its kind
    /// holding them alone.
    pub(crate) fn named_parts<N: AsRef<[u8]>>(
        &self,
        key: &Key,
        version: u64,
        names: &[N],
    ) -> Result<(usize, Vec<u8>)> {
        let part_keys: Vec<Vec<u8>> = names
            .iter()
            .map(|n| keys::part_key(key, version, n.as_ref()))
            .collect();
        let refs: Vec<&[u8]> = part_keys.iter().map(Vec::as_slice).collect();
        let (mut found, mut items) = (0, Vec::new());
        for (k, got) in refs.iter().zip(self.store.multi_get(Family::Parts, &refs)) {
            if let Some(part) = got? {
                items.extend_from_slice(strata_format::parts::decode_part(k, &part)?);
                found += 1;
            }
        }
        Ok((found, items))
    }

    /// The elements `start..=stop` (Redis's indexes: negative from the end) of the list
    /// `key` stored as parts at `at`, each verified: a seek to the first (from the head
    /// its record keeps) and a walk over those alone. `None` if the parts are not the consecutive positions `at` counts (a
    /// write since `at` was read, or damage: the caller tells them apart).
    pub(crate) fn list_span(
        &self,
        key: &Key,
        at: Parted,
        start: i64,
        stop: i64,
    ) -> Result<Option<Vec<Bytes>>> {
        let Some((s, e)) = strata_format::zset::rank_window(at.count as usize, start, stop) else {
            return Ok(Some(Vec::new()));
        };
        let prefix = keys::parts_prefix(key, at.version);
        let mut c = self.cursor(Family::Parts, Bounds::prefix(&prefix), None);
        let first = at.head + s as u64;
        c.seek(&keys::part_key(
            key,
            at.version,
            &strata_format::parts::list_position(first),
        ));
        let mut out = Vec::with_capacity(e - s + 1);
        while c.valid() && out.len() < e - s + 1 {
            if list_position(&prefix, c.key())? != first + out.len() as u64 {
                return Ok(None);
            }
            let item = strata_format::parts::decode_part(c.key(), c.value())?;
            let (element, _) = strata_format::members::member_at(item)?;
            out.push(Bytes::copy_from_slice(element));
            c.next();
        }
        c.status()?;
        Ok((out.len() == e - s + 1).then_some(out))
    }

    /// The entries of the sorted set `key` stored as parts at `at` that `window` picks, in
    /// the order it reads them, from its score index: a walk over those entries (and the
    /// ones a rank or an offset skips), not the set. `None` for a window of members when
    /// the set's entries do not all have one score (the index is not in member order then:
    /// the whole set answers).
    pub(crate) fn score_window(
        &self,
        key: &Key,
        at: Parted,
        window: &ScoreWindow<'_>,
    ) -> Result<Option<Vec<(f64, Bytes)>>> {
        let prefix = keys::parts_prefix(key, at.version);
        let mut c = self.cursor(Family::Scores, Bounds::prefix(&prefix), None);
        let mut rev = window.rev;
        // A rank window nearer the far end is walked from there, and turned round after.
        let mut turned = false;
        // The bound the walk starts from (a minimum, or in reverse a maximum) and the one it
        // stops at, where it seeks to, what it skips and how many it takes.
        let (from, to, skip, take) = match window.pick {
            Pick::Ranks { start, stop } => {
                let len = at.count as usize;
                let Some((s, e)) = strata_format::zset::rank_window(len, start, stop) else {
                    return Ok(Some(Vec::new()));
                };
                let mut skip = s;
                if len - 1 - e < s {
                    (turned, rev, skip) = (true, !rev, len - 1 - e);
                }
                match rev {
                    true => c.seek_to_last(),
                    false => c.seek_to_first(),
                }
                (None, None, skip, Some(e - s + 1))
            }
            Pick::Scores {
                min,
                max,
                offset,
                count,
            } => {
                let (from, to) = if rev { (max, min) } else { (min, max) };
                let mut seek = prefix.clone();
                seek.extend_from_slice(&keys::encode_score(from.value));
                match (rev, strata_warm::prefix_end(&seek)) {
                    // The last entry of the starting score or below it.
                    (true, Some(past)) => seek_before(&mut *c, &past),
                    (true, None) => c.seek_to_last(),
                    (false, _) => c.seek(&seek),
                }
                (Some(End::Score(from)), Some(End::Score(to)), offset, count)
            }
            Pick::Members {
                min,
                max,
                offset,
                count,
            } => {
                // One score from the first entry to the last, or no answer here.
                let mut scores = [None, None];
                for (i, s) in scores.iter_mut().enumerate() {
                    match i {
                        0 => c.seek_to_first(),
                        _ => c.seek_to_last(),
                    }
                    if c.valid() {
                        let (score, _) =
                            strata_format::parts::decode_score_entry(&prefix, c.key(), c.value())?;
                        *s = Some(keys::encode_score(score));
                    }
                }
                c.status()?;
                let Some(score) = scores[0] else {
                    return Ok(Some(Vec::new()));
                };
                if scores[1] != Some(score) {
                    return Ok(None);
                }
                let (from, to) = if rev { (max, min) } else { (min, max) };
                if matches!(
                    (rev, from),
                    (false, MemberBound::Max) | (true, MemberBound::Min)
                ) {
                    return Ok(Some(Vec::new()));
                }
                let mut seek = prefix.clone();
                seek.extend_from_slice(&score);
                match (rev, from) {
                    (false, MemberBound::Incl(m) | MemberBound::Excl(m)) => {
                        seek.extend_from_slice(m);
                        c.seek(&seek);
                    }
                    // The last entry at or below the member: before the first key past it.
                    (true, MemberBound::Incl(m) | MemberBound::Excl(m)) => {
                        seek.extend_from_slice(m);
                        seek.push(0);
                        seek_before(&mut *c, &seek);
                    }
                    (false, _) => c.seek_to_first(),
                    (true, _) => c.seek_to_last(),
                }
                (
                    Some(End::Member(from)),
                    Some(End::Member(to)),
                    offset,
                    count,
                )
            }
        };
        // Entries at the starting bound an exclusive bound leaves out.
        while let (true, Some(from)) = (c.valid(), from) {
            let (score, member) =
                strata_format::parts::decode_score_entry(&prefix, c.key(), c.value())?;
            if from.admits(!rev, score, member) {
                break;
            }
            step(&mut *c, rev);
        }
        let mut out = Vec::new();
        let mut skipped = 0;
        while c.valid() && take.is_none_or(|t| out.len() < t) {
            let (score, member) =
                strata_format::parts::decode_score_entry(&prefix, c.key(), c.value())?;
            if !to.is_none_or(|to| to.admits(rev, score, member)) {
                break;
            }
            if skipped < skip {
                skipped += 1;
            } else {
                out.push((score, Bytes::copy_from_slice(member)));
            }
            step(&mut *c, rev);
        }
        c.status()?;
        if turned {
            out.reverse();
        }
        Ok(Some(out))
    }

    fn meta(&self, key: &[u8]) -> Result<Option<Bytes>> {
        Ok(self.store.get(Family::Meta, key)?)
    }

    pub(crate) fn counts(&self) -> Result<Counts> {
        Ok(self
            .meta(COUNTERS)?
            .map(|b| Counts::decode(&b))
            .unwrap_or_default())
    }

    pub(crate) fn next_segment_id(&self) -> Result<u64> {
        let v = self
            .meta(NEXT_SEGMENT_ID)?
            .and_then(|b| b.as_ref().try_into().ok().map(i64::from_le_bytes))
            .unwrap_or(0);
        Ok(v.max(1) as u64)
    }

    /// The key layout the families follow (`None`: a store of layout 1, or a new one).
    pub(crate) fn layout(&self) -> Result<Option<u32>> {
        Ok(self
            .meta(LAYOUT)?
            .and_then(|b| b.as_ref().try_into().ok().map(u32::from_le_bytes)))
    }

    /// Whether stored keys carry their cluster slot (`None`: never recorded).
    pub(crate) fn key_slots(&self) -> Result<Option<bool>> {
        Ok(self.meta(KEY_SLOTS)?.map(|b| b.first() == Some(&1)))
    }

    /// Each key under `prefix` in the meta family, without the prefix, with its value.
    fn meta_prefixed(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        let mut c = self.cursor(Family::Meta, Bounds::prefix(prefix), None);
        c.seek_to_first();
        while c.valid() {
            out.push((c.key()[prefix.len()..].to_vec(), c.value().to_vec()));
            c.next();
        }
        c.status()?;
        Ok(out)
    }

    /// Committed segments and what they held when written.
    pub(crate) fn segments(&self) -> Result<HashMap<u64, SegmentMeta>> {
        Ok(self
            .meta_prefixed(SEGMENT_PREFIX)?
            .into_iter()
            .filter_map(|(k, v)| {
                let id = u64::from_be_bytes(k.as_slice().try_into().ok()?);
                Some((id, SegmentMeta::decode(&v)?))
            })
            .collect())
    }

    /// The pins, in key order.
    pub(crate) fn pins(&self) -> Result<Vec<Bytes>> {
        Ok(self
            .meta_prefixed(PIN_PREFIX)?
            .into_iter()
            .map(|(k, _)| Bytes::from(k))
            .collect())
    }

    /// Garbage bytes per value-log file.
    pub(crate) fn vlog_garbage(&self) -> Result<HashMap<u64, u64>> {
        Ok(self
            .meta_prefixed(VLOG_GARBAGE_PREFIX)?
            .into_iter()
            .filter_map(|(k, v)| {
                let id = u64::from_be_bytes(k.as_slice().try_into().ok()?);
                let bytes = i64::from_le_bytes(v.get(..8)?.try_into().ok()?);
                Some((id, bytes.max(0) as u64))
            })
            .collect())
    }

    /// Live entries and value bytes per segment, counted from the cold index.
    pub(crate) fn live_per_segment(&self) -> Result<HashMap<u64, (u64, u64)>> {
        let mut live: HashMap<u64, (u64, u64)> = HashMap::new();
        let mut c = self.cursor(Family::Cold, Bounds::all(), None);
        c.seek_to_first();
        while c.valid() {
            let r = BlockRef::decode(c.value())?;
            let e = live.entry(r.segment_id).or_default();
            e.0 += 1;
            e.1 += r.value_len as u64;
            c.next();
        }
        c.status()?;
        Ok(live)
    }
}

/// The stored entry of a warm `record` read for `key`, with what `want` asks of its value.
pub(crate) fn stored_warm(
    key: &Key,
    record: Bytes,
    want: Want,
    vlog: &ValueLog,
    warm: &Warm,
) -> Result<Stored> {
    let rec = WarmRecord::decode_unverified(&record)?;
    let value_len = rec.value_len();
    let expire_ms = rec.expire_ms;
    let kind = rec.kind;
    let checksum = rec.checksum;
    let (logged, parted) = match rec.value {
        WarmValue::Logged(at) => (Some(at), None),
        WarmValue::Parted(at) => (None, Some(at)),
        WarmValue::Inline(_) => (None, None),
    };
    let charge = warm_charge(key, value_len);
    let value = match want {
        Want::Value => Some(record_value(key, &record, vlog, warm)?.0),
        Want::ValueUnlessParted if parted.is_none() => {
            Some(record_value(key, &record, vlog, warm)?.0)
        }
        Want::Entry | Want::ValueUnlessParted => None,
    };
    Ok(Stored {
        loc: Loc::Warm {
            charge,
            value,
            logged,
            parted,
            checksum,
        },
        kind,
        expire_ms,
        value_len,
    })
}

/// The verified value of `record` (read for `key`) and its kind: a slice of the record's own
/// bytes for an inline value, the mapped value-log bytes for a logged one, the parts put
/// together for one stored as parts. Checksums cover the client's key, so a record read
/// under another key fails.
pub(crate) fn record_value(
    key: &Key,
    record: &Bytes,
    vlog: &ValueLog,
    warm: &Warm,
) -> Result<(Bytes, Kind)> {
    let rec = WarmRecord::decode(key.client(), record)?;
    let value = match rec.value {
        WarmValue::Inline(v) => {
            let start = v.as_ptr() as usize - record.as_ptr() as usize;
            record.slice(start..start + v.len())
        }
        WarmValue::Logged(at) => vlog.read_checked(key.client(), &rec, at)?,
        WarmValue::Parted(at) => warm.assemble(key, rec.kind, at)?,
    };
    Ok((value, rec.kind))
}

/// The list position of the part key `part_key` of a value whose parts start with `prefix`.
fn list_position(prefix: &[u8], part_key: &[u8]) -> Result<u64> {
    let name = part_key.strip_prefix(prefix).unwrap_or_default();
    Ok(strata_format::parts::decode_list_position(name)?)
}

/// A bound a walk of a score index starts or stops at.
#[derive(Clone, Copy)]
enum End<'a> {
    Score(ScoreBound),
    Member(MemberBound<'a>),
}

impl End<'_> {
    /// Whether the entry of `score` and `member` is on the inner side of this bound as a
    /// minimum (`lower`) or as a maximum.
    fn admits(&self, lower: bool, score: f64, member: &[u8]) -> bool {
        match (self, lower) {
            (End::Score(b), true) => b.admits_above(score),
            (End::Score(b), false) => b.admits_below(score),
            (End::Member(b), true) => b.admits_above(member),
            (End::Member(b), false) => b.admits_below(member),
        }
    }
}

/// A cursor one entry on, forwards or (`rev`) backwards.
fn step(c: &mut dyn Cursor, rev: bool) {
    match rev {
        true => c.prev(),
        false => c.next(),
    }
}

/// Puts `c` at the last key before `target` within its bounds (not valid if none).
fn seek_before(c: &mut dyn Cursor, target: &[u8]) {
    c.seek(target);
    match c.valid() {
        true => c.prev(),
        false => c.seek_to_last(),
    }
}
