//! Strata's warm store on RocksDB, and the only crate of Strata that links the C++ library.
//!
//! One column family per [`Family`]; the engine decides what their keys and values mean
//! (`docs/formats.md`). What this crate adds is RocksDB's side of it: per-family options
//! (blob files for large records, bloom filters, the add merge operator of `Meta`), point
//! reads that hand out large values without a copy, and the change log read back from the
//! write-ahead log ([`changes`]).
//!
//! What it is not: the engine. It knows no key layout and no tier; it stores bytes.
//!
//! ```no_run
//! use strata_warm::{Family, WarmStore};
//! let store = strata_rocks::RocksWarm::open("/tmp/warm".as_ref(), &Default::default()).unwrap();
//! let mut b = store.batch();
//! b.put(Family::Records, b"k", b"v");
//! store.write(b, true).unwrap();
//! assert_eq!(store.get(Family::Records, b"k").unwrap().unwrap(), "v");
//! ```

mod changes;

use std::any::Any;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use rocksdb::{
    AsColumnFamilyRef, BlockBasedOptions, Cache, ColumnFamily, ColumnFamilyDescriptor,
    DBPinnableSlice, MergeOperands, Options, WriteBatch, WriteOptions, DB,
};
use serde::{Deserialize, Serialize};
use strata_warm::{
    Batch, Bounds, Changes, Cursor, Family, MemoryShares, Result, StoreError, View, WarmStore,
};

/// RocksDB's settings, as the configuration file names them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RocksSettings {
    /// RocksDB's block cache (shared by every family).
    #[serde(with = "strata_settings::size")]
    pub rocksdb_block_cache_bytes: u64,
    /// Records at least this large go to RocksDB blob files instead of the LSM tree.
    #[serde(with = "strata_settings::size")]
    pub blob_bytes_min: u64,
    /// RocksDB's rate limiter for flushes and compactions.
    #[serde(with = "strata_settings::size")]
    pub compaction_bytes_per_sec: u64,
    /// Write-ahead log kept after its writes reached the tables, so that the change log can
    /// be read that far back (0 keeps only the live log).
    #[serde(with = "strata_settings::size")]
    pub change_log_bytes_max: u64,
    /// Memory all memtables together may hold before RocksDB flushes the largest (0: each
    /// family's own limit, two memtables of 64 MiB for records).
    #[serde(with = "strata_settings::size")]
    pub rocksdb_memtables_bytes_max: u64,
}

impl Default for RocksSettings {
    fn default() -> Self {
        RocksSettings {
            rocksdb_block_cache_bytes: 64 << 20,
            blob_bytes_min: 4096,
            compaction_bytes_per_sec: 256 << 20,
            change_log_bytes_max: 64 << 20,
            rocksdb_memtables_bytes_max: 0,
        }
    }
}

/// Size of a memtable of the records family.
const MEMTABLE_BYTES: usize = 64 << 20;
/// Size of a memtable's key bloom filter, as a fraction of the memtable's size.
const MEMTABLE_BLOOM_RATIO: f64 = 0.02;
/// Most files RocksDB keeps open: they share the process's descriptors with client
/// connections.
const OPEN_FILES_MAX: i32 = 512;
/// Values at least this long are handed out without a copy (see [`value_bytes`]).
const PIN_BYTES_MIN: usize = 64 * 1024;
/// The merge operator's name, as RocksDB records it in the store's options.
const MERGE_OPERATOR: &str = "strata_add_i64";

fn err(e: rocksdb::Error) -> StoreError {
    let text = format!("rocksdb: {e}");
    match e.kind() {
        rocksdb::ErrorKind::Corruption => StoreError::Corruption(text),
        rocksdb::ErrorKind::InvalidArgument => StoreError::Invalid(text),
        _ if text.contains("No space left on device") => StoreError::NoSpace(text),
        _ => StoreError::Unavailable(text),
    }
}

fn add_merge(_key: &[u8], existing: Option<&[u8]>, ops: &MergeOperands) -> Option<Vec<u8>> {
    Some(strata_warm::add_i64s(existing, ops.iter()))
}

/// The warm store: one RocksDB database, one column family per family.
pub struct RocksWarm {
    db: Arc<DB>,
    /// Families present in this database (those of layout 1 only in older stores).
    present: Vec<Family>,
    /// RocksDB's column family ids, for reading the write-ahead log back.
    ids: HashMap<u32, Family>,
    log_bytes_dropped_at_open: u64,
    /// The block cache every family shares.
    cache: Cache,
    /// What the memtables and the block cache may hold now.
    shares: std::sync::Mutex<MemoryShares>,
}

/// Size of one memtable of family `f` when all memtables together may hold `total` bytes
/// (0: no total): 64 MiB at most; the records family's (two of them at most) a quarter of
/// the total, each other family's, rarely written to, a sixteenth.
fn memtable_bytes(f: Family, total: u64) -> usize {
    let share = match f {
        Family::Records | Family::Layout1Data => total / 4,
        _ => total / 16,
    };
    match total {
        0 => MEMTABLE_BYTES,
        _ => MEMTABLE_BYTES.min(share as usize).max(1 << 20),
    }
}

fn family_options(f: Family, s: &RocksSettings, cache: &Cache) -> Options {
    let table = |bloom: bool| {
        let mut t = BlockBasedOptions::default();
        t.set_block_cache(cache);
        if bloom {
            t.set_bloom_filter(10.0, false);
        }
        t
    };
    let mut o = Options::default();
    o.set_write_buffer_size(memtable_bytes(f, s.rocksdb_memtables_bytes_max));
    match f {
        Family::Records | Family::Layout1Data => {
            o.set_block_based_table_factory(&table(true));
            o.set_enable_blob_files(true);
            o.set_min_blob_size(s.blob_bytes_min);
            o.set_enable_blob_gc(true);
            // Every read that misses DRAM, and every write (which reads the key's record
            // first), looks the key up here and in the cold index: a bloom filter over each
            // memtable's keys turns look-ups of absent keys into a few bit tests instead of
            // a skiplist search. About 1.3 MiB per 64 MiB memtable.
            o.set_memtable_prefix_bloom_ratio(MEMTABLE_BLOOM_RATIO);
            o.set_memtable_whole_key_filtering(true);
        }
        Family::Cold | Family::Layout1Index => {
            o.set_block_based_table_factory(&table(true));
            o.set_memtable_prefix_bloom_ratio(MEMTABLE_BLOOM_RATIO);
            o.set_memtable_whole_key_filtering(true);
        }
        Family::Parts => o.set_block_based_table_factory(&table(true)),
        Family::Scores | Family::Expiry | Family::Layout1Ttl => {
            o.set_block_based_table_factory(&table(false))
        }
        Family::Meta => o.set_merge_operator_associative(MERGE_OPERATOR, add_merge),
    }
    o
}

impl RocksWarm {
    /// An integer property of RocksDB summed over the open families.
    fn property_sum(&self, property: &str) -> u64 {
        self.present
            .iter()
            .filter_map(|&f| self.cf(f))
            .filter_map(|cf| self.db.property_int_value_cf(cf, property).ok().flatten())
            .sum()
    }

    /// Opens (or creates) the store in `dir`. A store of layout 1 opens with its old
    /// families beside the new ones, for the engine to migrate; old families left empty by
    /// a migration are dropped here.
    pub fn open(dir: &Path, s: &RocksSettings) -> Result<RocksWarm> {
        Self::open_with_log(dir, s, false)
    }

    /// As [`RocksWarm::open`]; with `buffered_log`, writes that are not synced leave their
    /// log records in the process (RocksDB's manual WAL flush) until [`WarmStore::flush_log`]
    /// or a sync hands them to the operating system: one `write` per flush instead of one
    /// per batch, for stores whose writes are not durable anyway (`durability = none`).
    pub fn open_with_log(dir: &Path, s: &RocksSettings, buffered_log: bool) -> Result<RocksWarm> {
        let cache = Cache::new_lru_cache(s.rocksdb_block_cache_bytes as usize).map_err(err)?;
        let mut db_opts = Options::default();
        db_opts.create_if_missing(true);
        db_opts.create_missing_column_families(true);
        db_opts.set_max_background_jobs(2);
        // Flushes and compactions yield the CPU to the threads serving clients (nice 19 and
        // idle I/O priority on RocksDB's own pools), so they do not spike read tails.
        let mut env = rocksdb::Env::new().map_err(err)?;
        env.lower_thread_pool_cpu_priority();
        env.lower_high_priority_thread_pool_cpu_priority();
        env.lower_thread_pool_io_priority();
        env.lower_high_priority_thread_pool_io_priority();
        db_opts.set_env(&env);
        let rate = i64::try_from(s.compaction_bytes_per_sec)
            .map_err(|_| StoreError::Invalid("compaction_bytes_per_sec is too large".into()))?;
        db_opts.set_ratelimiter(rate.max(1), 100_000, 10);
        db_opts.set_bytes_per_sync(1 << 20);
        db_opts.set_max_open_files(OPEN_FILES_MAX);
        db_opts.set_allow_mmap_reads(true);
        // A torn record at the WAL's tail (a crash mid-append, a truncated file) ends
        // recovery there: everything before it is replayed, nothing after it is guessed at.
        db_opts.set_wal_recovery_mode(rocksdb::DBRecoveryMode::PointInTime);
        db_opts.set_manual_wal_flush(buffered_log);
        db_opts.set_db_write_buffer_size(s.rocksdb_memtables_bytes_max as usize);
        if s.change_log_bytes_max > 0 {
            db_opts.set_wal_size_limit_mb((s.change_log_bytes_max >> 20).max(1));
        }
        let existing = DB::list_cf(&db_opts, dir).unwrap_or_default();
        let mut present: Vec<Family> = Family::CURRENT.to_vec();
        for f in Family::LAYOUT_1 {
            if existing.iter().any(|n| n == f.name()) || f == Family::Layout1Data {
                present.push(f);
            }
        }
        let cfs: Vec<ColumnFamilyDescriptor> = present
            .iter()
            .map(|&f| ColumnFamilyDescriptor::new(f.name(), family_options(f, s, &cache)))
            .collect();
        let mut db = DB::open_cf_descriptors(&db_opts, dir, cfs).map_err(err)?;
        // Layout-1 families the engine has emptied are not needed again.
        for f in [Family::Layout1Index, Family::Layout1Ttl] {
            if present.contains(&f) && is_empty(&db, f)? {
                db.drop_cf(f.name()).map_err(err)?;
                present.retain(|&p| p != f);
                tracing::info!(family = f.name(), "dropped an emptied layout-1 family");
            }
        }
        let ids = present
            .iter()
            .map(|&f| {
                let cf = db.cf_handle(f.name()).expect("family opened above");
                // SAFETY: `cf` is a live handle of the open database.
                let id = unsafe { librocksdb_sys::rocksdb_column_family_handle_get_id(cf.inner()) };
                (id, f)
            })
            .collect();
        Ok(RocksWarm {
            db: Arc::new(db),
            present,
            ids,
            log_bytes_dropped_at_open: wal_bytes_dropped_at_open(dir),
            cache,
            shares: std::sync::Mutex::new(MemoryShares {
                memtables_bytes_max: s.rocksdb_memtables_bytes_max,
                block_cache_bytes: s.rocksdb_block_cache_bytes,
            }),
        })
    }

    fn cf(&self, f: Family) -> Option<&ColumnFamily> {
        self.db.cf_handle(f.name())
    }
}

fn is_empty(db: &DB, f: Family) -> Result<bool> {
    let cf = db.cf_handle(f.name()).expect("family opened");
    let mut it = db.raw_iterator_cf(cf);
    it.seek_to_first();
    it.status().map_err(err)?;
    Ok(!it.valid())
}

/// Bytes of WAL that RocksDB dropped while recovering at open (a torn or truncated tail),
/// read from the info log it wrote during this open: RocksDB reports them nowhere else.
fn wal_bytes_dropped_at_open(dir: &Path) -> u64 {
    let Ok(log) = std::fs::read_to_string(dir.join("LOG")) else {
        return 0;
    };
    let mut dropped = 0;
    for line in log.lines().filter(|l| l.contains("Corruption")) {
        // "...000004.log: dropping 493 bytes; Corruption: truncated record body"
        if let Some(rest) = line.split(": dropping ").nth(1) {
            let n = rest.split(' ').next().and_then(|n| n.parse::<u64>().ok());
            dropped += n.unwrap_or(0);
            tracing::warn!(line, "WAL recovery dropped a torn or corrupt tail");
        }
    }
    dropped
}

/// Options for point reads. Every record the engine stores carries its own checksum, which
/// it verifies; RocksDB's block and blob checksums would check the same bytes a second time
/// (with a slower checksum in Debian's portable build), so point reads skip them. Cursors
/// and compactions still verify.
fn point_read_options() -> rocksdb::ReadOptions {
    let mut ro = rocksdb::ReadOptions::default();
    ro.set_verify_checksums(false);
    ro
}

/// A value RocksDB returned in a pinnable slice, kept with the database it came from so
/// that the slice can outlive the call that produced it.
struct Pinned {
    // Declared first, so dropped before the database handle.
    slice: DBPinnableSlice<'static>,
    _db: Arc<DB>,
}

impl AsRef<[u8]> for Pinned {
    fn as_ref(&self) -> &[u8] {
        &self.slice
    }
}

/// The bytes of `slice` as `Bytes`. A large value is not copied: the `Bytes` owns the slice
/// and a handle on the database. In RocksDB 7.8 a blob or memtable value sits in the
/// slice's own buffer, so holding it (in DRAM, for example) pins nothing else; smaller
/// values may pin a whole table block, so they are copied.
fn value_bytes(db: &Arc<DB>, slice: DBPinnableSlice<'_>) -> Bytes {
    if slice.len() < PIN_BYTES_MIN {
        return Bytes::copy_from_slice(&slice);
    }
    // SAFETY: the lifetime ties the slice to the database it came from; `Pinned` keeps
    // that database open (an `Arc`) for as long as the slice lives, and drops the slice
    // first. The slice itself is `Send` and `Sync`.
    let slice: DBPinnableSlice<'static> = unsafe { std::mem::transmute(slice) };
    Bytes::from_owner(Pinned {
        slice,
        _db: Arc::clone(db),
    })
}

struct RocksBatch {
    batch: WriteBatch,
    db: Arc<DB>,
    /// A family this store does not have, if an op named one: the write then fails.
    missing: Option<Family>,
}

impl Batch for RocksBatch {
    fn put(&mut self, f: Family, key: &[u8], value: &[u8]) {
        match self.db.cf_handle(f.name()) {
            Some(cf) => self.batch.put_cf(cf, key, value),
            None => self.missing = Some(f),
        }
    }
    fn delete(&mut self, f: Family, key: &[u8]) {
        match self.db.cf_handle(f.name()) {
            Some(cf) => self.batch.delete_cf(cf, key),
            None => self.missing = Some(f),
        }
    }
    fn merge(&mut self, f: Family, key: &[u8], operand: &[u8]) {
        match self.db.cf_handle(f.name()) {
            Some(cf) => self.batch.merge_cf(cf, key, operand),
            None => self.missing = Some(f),
        }
    }
    fn delete_range(&mut self, f: Family, from: &[u8], to: &[u8]) {
        match self.db.cf_handle(f.name()) {
            Some(cf) => self.batch.delete_range_cf(cf, from, to),
            None => self.missing = Some(f),
        }
    }
    fn count(&self) -> usize {
        self.batch.len()
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
}

// SAFETY: a RocksDB write batch is a plain buffer owned by this value; RocksDB does not
// tie it to a thread.
unsafe impl Send for RocksBatch {}

struct RocksCursor<'a>(rocksdb::DBRawIteratorWithThreadMode<'a, DB>);

impl Cursor for RocksCursor<'_> {
    fn seek(&mut self, key: &[u8]) {
        self.0.seek(key)
    }
    fn seek_to_first(&mut self) {
        self.0.seek_to_first()
    }
    fn seek_to_last(&mut self) {
        self.0.seek_to_last()
    }
    fn valid(&self) -> bool {
        self.0.valid()
    }
    fn key(&self) -> &[u8] {
        self.0.key().expect("cursor is valid")
    }
    fn value(&self) -> &[u8] {
        self.0.value().expect("cursor is valid")
    }
    fn next(&mut self) {
        self.0.next()
    }
    fn prev(&mut self) {
        self.0.prev()
    }
    fn status(&self) -> Result<()> {
        self.0.status().map_err(err)
    }
}

/// A cursor over a family this store does not have: empty.
struct EmptyCursor;

impl Cursor for EmptyCursor {
    fn seek(&mut self, _key: &[u8]) {}
    fn seek_to_first(&mut self) {}
    fn seek_to_last(&mut self) {}
    fn valid(&self) -> bool {
        false
    }
    fn key(&self) -> &[u8] {
        panic!("an empty cursor has no key")
    }
    fn value(&self) -> &[u8] {
        panic!("an empty cursor has no value")
    }
    fn next(&mut self) {}
    fn prev(&mut self) {}
    fn status(&self) -> Result<()> {
        Ok(())
    }
}

/// A snapshot, kept with the database it belongs to.
struct RocksView {
    // Declared first, so released before the database handle.
    snap: rocksdb::SnapshotWithThreadMode<'static, DB>,
    _db: Arc<DB>,
}

impl View for RocksView {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl WarmStore for RocksWarm {
    fn get(&self, f: Family, key: &[u8]) -> Result<Option<Bytes>> {
        let Some(cf) = self.cf(f) else {
            return Ok(None);
        };
        let got = self
            .db
            .get_pinned_cf_opt(cf, key, &point_read_options())
            .map_err(err)?;
        Ok(got.map(|p| value_bytes(&self.db, p)))
    }

    fn multi_get(&self, f: Family, keys: &[&[u8]]) -> Vec<Result<Option<Bytes>>> {
        let Some(cf) = self.cf(f) else {
            return keys.iter().map(|_| Ok(None)).collect();
        };
        self.db
            .batched_multi_get_cf_opt(cf, keys.iter(), false, &point_read_options())
            .into_iter()
            .map(|r| r.map(|o| o.map(|p| value_bytes(&self.db, p))).map_err(err))
            .collect()
    }

    fn batch(&self) -> Box<dyn Batch> {
        Box::new(RocksBatch {
            batch: WriteBatch::default(),
            db: Arc::clone(&self.db),
            missing: None,
        })
    }

    fn write(&self, batch: Box<dyn Batch>, sync: bool) -> Result<()> {
        let batch = batch
            .into_any()
            .downcast::<RocksBatch>()
            .map_err(|_| StoreError::Invalid("a batch made by another store".into()))?;
        if let Some(f) = batch.missing {
            return Err(StoreError::Invalid(format!(
                "a batch names the family '{}', which this store does not have",
                f.name()
            )));
        }
        let mut wo = WriteOptions::default();
        wo.set_sync(sync);
        self.db.write_opt(batch.batch, &wo).map_err(err)
    }

    fn cursor<'a>(
        &'a self,
        f: Family,
        bounds: Bounds,
        view: Option<&'a dyn View>,
    ) -> Box<dyn Cursor + 'a> {
        let Some(cf) = self.cf(f) else {
            return Box::new(EmptyCursor);
        };
        let mut ro = rocksdb::ReadOptions::default();
        if let Some(l) = bounds.lower {
            ro.set_iterate_lower_bound(l);
        }
        if let Some(u) = bounds.upper {
            ro.set_iterate_upper_bound(u);
        }
        if let Some(v) = view.and_then(|v| v.as_any().downcast_ref::<RocksView>()) {
            ro.set_snapshot(&v.snap);
        }
        Box::new(RocksCursor(self.db.raw_iterator_cf_opt(cf, ro)))
    }

    fn view(&self) -> Arc<dyn View> {
        let snap = self.db.snapshot();
        // SAFETY: the snapshot borrows the database; `RocksView` keeps the database open
        // (an `Arc`) for as long as the snapshot lives, and releases the snapshot first.
        let snap: rocksdb::SnapshotWithThreadMode<'static, DB> =
            unsafe { std::mem::transmute(snap) };
        Arc::new(RocksView {
            snap,
            _db: Arc::clone(&self.db),
        })
    }

    fn sync_log(&self) -> Result<()> {
        self.db.flush_wal(true).map_err(err)
    }

    fn flush_log(&self) -> Result<()> {
        self.db.flush_wal(false).map_err(err)
    }

    fn flush(&self) -> Result<()> {
        for &f in &self.present {
            let cf = self.cf(f).expect("present family");
            self.db.flush_cf(cf).map_err(err)?;
        }
        Ok(())
    }

    fn checkpoint(&self, dir: &Path) -> Result<()> {
        rocksdb::checkpoint::Checkpoint::new(&self.db)
            .and_then(|c| c.create_checkpoint(dir))
            .map_err(err)
    }

    fn last_sequence(&self) -> u64 {
        self.db.latest_sequence_number()
    }

    fn changes_after(&self, after: u64) -> Result<Box<dyn Iterator<Item = Result<Changes>> + '_>> {
        changes::after(&self.db, &self.ids, after)
    }

    fn log_bytes_dropped_at_open(&self) -> u64 {
        self.log_bytes_dropped_at_open
    }

    fn memory_bytes(&self) -> u64 {
        self.unflushed_bytes()
            + self.property_sum("rocksdb.estimate-table-readers-mem")
            + self.cache.get_usage() as u64
    }

    fn unflushed_bytes(&self) -> u64 {
        self.property_sum("rocksdb.cur-size-all-mem-tables")
    }

    fn memory_shares(&self) -> MemoryShares {
        *self.shares.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The total set at open (`db_write_buffer_size`) stays as RocksDB's own bound; each
    /// family's memtable size follows the new total (RocksDB's C API of this version
    /// cannot change the bound itself).
    fn set_memory_shares(&self, shares: MemoryShares) -> Result<()> {
        let mut now = self.shares.lock().unwrap_or_else(|p| p.into_inner());
        self.cache
            .clone()
            .set_capacity(shares.block_cache_bytes as usize);
        for &f in &self.present {
            let Some(cf) = self.cf(f) else { continue };
            let size = memtable_bytes(f, shares.memtables_bytes_max).to_string();
            self.db
                .set_options_cf(cf, &[("write_buffer_size", size.as_str())])
                .map_err(err)?;
        }
        *now = shares;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &Path) -> RocksWarm {
        RocksWarm::open(dir, &RocksSettings::default()).unwrap()
    }

    #[test]
    fn families_are_separate_keyspaces_and_batches_are_atomic() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(dir.path());
        let mut b = s.batch();
        b.put(Family::Records, b"k", b"record");
        b.put(Family::Cold, b"k", b"index");
        b.merge(Family::Meta, b"n", &5i64.to_le_bytes());
        b.merge(Family::Meta, b"n", &7i64.to_le_bytes());
        assert_eq!(b.count(), 4);
        s.write(b, true).unwrap();
        assert_eq!(s.get(Family::Records, b"k").unwrap().unwrap(), "record");
        assert_eq!(s.get(Family::Cold, b"k").unwrap().unwrap(), "index");
        assert_eq!(s.get(Family::Expiry, b"k").unwrap(), None);
        assert_eq!(
            s.get(Family::Meta, b"n").unwrap().unwrap(),
            12i64.to_le_bytes().to_vec()
        );
        // Layout-1 families a new store does not have read as empty; writing to them fails
        // as a whole.
        assert_eq!(s.get(Family::Layout1Index, b"k").unwrap(), None);
        let mut b = s.batch();
        b.put(Family::Records, b"other", b"x");
        b.put(Family::Layout1Ttl, b"k", b"");
        assert!(matches!(s.write(b, false), Err(StoreError::Invalid(_))));
        assert_eq!(s.get(Family::Records, b"other").unwrap(), None);
    }

    #[test]
    fn memory_shares_changed_while_open_bound_the_block_cache_and_memtables() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(dir.path());
        let records = |p: &str| {
            let cf = s.cf(Family::Records).unwrap();
            s.db.property_int_value_cf(cf, p).unwrap().unwrap()
        };
        assert_eq!(records("rocksdb.block-cache-capacity"), 64 << 20);
        let small = MemoryShares {
            memtables_bytes_max: 8 << 20,
            block_cache_bytes: 1 << 20,
        };
        s.set_memory_shares(small).unwrap();
        assert_eq!(s.memory_shares(), small);
        assert_eq!(records("rocksdb.block-cache-capacity"), 1 << 20);
        // 6 MiB of records: the records family's memtables are now 2 MiB each, so no
        // memtable holds them all (at 64 MiB one would).
        let value = vec![7u8; 1000];
        for batch in 0..96 {
            let mut b = s.batch();
            for i in 0..64 {
                b.put(
                    Family::Records,
                    format!("k{batch:03}{i:02}").as_bytes(),
                    &value,
                );
            }
            s.write(b, false).unwrap();
        }
        let active = records("rocksdb.cur-size-active-mem-table");
        assert!(active < 3 << 20, "active memtable {active} bytes");
        assert_eq!(s.get(Family::Records, b"k00000").unwrap().unwrap(), value);
        assert_eq!(s.get(Family::Records, b"k09563").unwrap().unwrap(), value);
    }

    #[test]
    fn cursors_respect_bounds_and_views_see_no_later_write() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(dir.path());
        let mut b = s.batch();
        for k in ["a", "b1", "b2", "c"] {
            b.put(Family::Records, k.as_bytes(), k.as_bytes());
        }
        s.write(b, false).unwrap();
        let view = s.view();
        let mut b = s.batch();
        b.put(Family::Records, b"b3", b"later");
        b.delete(Family::Records, b"b1");
        s.write(b, false).unwrap();
        let keys = |view: Option<&dyn View>| {
            let mut c = s.cursor(Family::Records, Bounds::prefix(b"b"), view);
            c.seek_to_first();
            let mut out = Vec::new();
            while c.valid() {
                out.push(String::from_utf8(c.key().to_vec()).unwrap());
                c.next();
            }
            c.status().unwrap();
            out
        };
        assert_eq!(keys(Some(view.as_ref())), vec!["b1", "b2"]);
        assert_eq!(keys(None), vec!["b2", "b3"]);
        // Backwards from the last key inside the bounds ("c" is past them).
        let mut c = s.cursor(Family::Records, Bounds::prefix(b"b"), Some(view.as_ref()));
        c.seek_to_last();
        let mut back = Vec::new();
        while c.valid() {
            back.push(String::from_utf8(c.key().to_vec()).unwrap());
            c.prev();
        }
        c.status().unwrap();
        assert_eq!(back, vec!["b2", "b1"]);
    }

    #[test]
    fn large_values_are_shared_not_copied_and_outlive_the_call() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(dir.path());
        let big = vec![7u8; 1 << 20];
        let mut b = s.batch();
        b.put(Family::Records, b"big", &big);
        s.write(b, false).unwrap();
        let got = s.multi_get(Family::Records, &[b"big", b"none"]);
        let v = got[0].as_ref().unwrap().clone().unwrap();
        assert!(got[1].as_ref().unwrap().is_none());
        drop(got);
        assert_eq!(v.len(), big.len());
        assert!(v.iter().all(|&x| x == 7));
    }
}
