//! The warm tier: RocksDB, and the only module in Strata that touches it.
//!
//! Column families:
//! - `default`: key -> [`WarmRecord`](strata_format::WarmRecord) (large values in blob files);
//! - `index`: key -> [`BlockRef`](strata_format::BlockRef) for keys demoted to the cold tier;
//! - `ttl`: expire_ms (big-endian) || key -> empty, so expired keys are found without a scan;
//! - `meta`: counters (merged atomically with every data change), segment records, pins.
//!
//! Invariant: a key is in at most one of `default` and `index`.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamily, ColumnFamilyDescriptor, DBPinnableSlice, MergeOperands,
    Options, WriteBatch, WriteOptions, DB,
};

use crate::{EngineOptions, Result};

pub(crate) const CF_DATA: &str = "default";
pub(crate) const CF_INDEX: &str = "index";
pub(crate) const CF_TTL: &str = "ttl";
pub(crate) const CF_META: &str = "meta";

/// Meta key of the persistent counters: warm bytes, warm entries, cold bytes, cold entries,
/// four i64 kept by the add merge operator, moved by one merge operand per write batch.
pub(crate) const COUNTERS: &[u8] = b"counters";
pub(crate) const NEXT_SEGMENT_ID: &[u8] = b"next_segment_id";
pub(crate) const SEGMENT_PREFIX: &[u8] = b"segment/";
/// Meta key prefix of each value-log file's garbage bytes (id big-endian; the first of four
/// counters kept by the add merge operator).
pub(crate) const VLOG_GARBAGE_PREFIX: &[u8] = b"vlog_garbage/";

/// Four i64 counters, little-endian.
pub(crate) type Counts = [i64; 4];

fn decode_counts(b: &[u8]) -> Counts {
    let mut out = [0i64; 4];
    for (i, c) in b.chunks_exact(8).take(4).enumerate() {
        out[i] = i64::from_le_bytes(c.try_into().expect("8 bytes"));
    }
    out
}

fn encode_counts(c: &Counts) -> Vec<u8> {
    c.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn add_merge(_key: &[u8], existing: Option<&[u8]>, ops: &MergeOperands) -> Option<Vec<u8>> {
    let mut sum = existing.map(decode_counts).unwrap_or_default();
    for op in ops {
        for (s, d) in sum.iter_mut().zip(decode_counts(op)) {
            *s = s.wrapping_add(d);
        }
    }
    Some(encode_counts(&sum))
}

pub(crate) struct Warm {
    pub(crate) db: Arc<DB>,
}

/// Bytes of WAL that RocksDB dropped while recovering at open (a torn or truncated tail),
/// read from the info log it wrote during this open: RocksDB reports them nowhere else.
pub(crate) fn wal_bytes_dropped_at_open(dir: &Path) -> u64 {
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

/// Size of a memtable's key bloom filter, as a fraction of the memtable's size.
const MEMTABLE_BLOOM_RATIO: f64 = 0.02;

impl Warm {
    pub(crate) fn open(path: &Path, o: &EngineOptions) -> Result<Self> {
        let cache = Cache::new_lru_cache(o.rocksdb_block_cache_bytes)?;
        let table = |bloom: bool| {
            let mut t = BlockBasedOptions::default();
            t.set_block_cache(&cache);
            if bloom {
                t.set_bloom_filter(10.0, false);
            }
            t
        };
        let mut db_opts = Options::default();
        db_opts.create_if_missing(true);
        db_opts.create_missing_column_families(true);
        db_opts.set_max_background_jobs(2);
        db_opts.set_ratelimiter(o.compaction_bytes_per_sec, 100_000, 10);
        db_opts.set_bytes_per_sync(1 << 20);
        // RocksDB's files share the process's descriptors with client connections.
        db_opts.set_max_open_files(512);
        db_opts.set_allow_mmap_reads(true);
        // A torn record at the WAL's tail (a crash mid-append, a truncated file) ends
        // recovery there: everything before it is replayed, nothing after it is guessed at.
        db_opts.set_wal_recovery_mode(rocksdb::DBRecoveryMode::PointInTime);

        let mut data = Options::default();
        data.set_block_based_table_factory(&table(true));
        data.set_enable_blob_files(true);
        data.set_min_blob_size(o.blob_bytes_min);
        data.set_enable_blob_gc(true);
        data.set_write_buffer_size(64 << 20);
        let mut index = Options::default();
        index.set_block_based_table_factory(&table(true));
        // Every read of a key that is not in DRAM, and every write (which reads the key's
        // record first), looks the key up in both column families: a bloom filter over each
        // memtable's keys turns the look-ups of absent keys (all misses, and every key not
        // demoted in the index) into a few bit tests instead of a skiplist search. About
        // 1.3 MiB per 64 MiB memtable.
        for cf in [&mut data, &mut index] {
            cf.set_memtable_prefix_bloom_ratio(MEMTABLE_BLOOM_RATIO);
            cf.set_memtable_whole_key_filtering(true);
        }
        let mut ttl = Options::default();
        ttl.set_block_based_table_factory(&table(false));
        let mut meta = Options::default();
        meta.set_merge_operator_associative("strata_add_i64", add_merge);

        let cfs = vec![
            ColumnFamilyDescriptor::new(CF_DATA, data),
            ColumnFamilyDescriptor::new(CF_INDEX, index),
            ColumnFamilyDescriptor::new(CF_TTL, ttl),
            ColumnFamilyDescriptor::new(CF_META, meta),
        ];
        let db = DB::open_cf_descriptors(&db_opts, path, cfs)?;
        Ok(Warm { db: Arc::new(db) })
    }

    pub(crate) fn cf(&self, name: &str) -> &ColumnFamily {
        self.db
            .cf_handle(name)
            .expect("column family created at open")
    }

    pub(crate) fn counter(&self, key: &[u8]) -> Result<i64> {
        Ok(self
            .db
            .get_cf(self.cf(CF_META), key)?
            .and_then(|b| b.as_slice().try_into().ok().map(i64::from_le_bytes))
            .unwrap_or(0))
    }

    /// The persistent counters ([`COUNTERS`]).
    pub(crate) fn counts(&self) -> Result<Counts> {
        Ok(self
            .db
            .get_cf(self.cf(CF_META), COUNTERS)?
            .map(|b| decode_counts(&b))
            .unwrap_or_default())
    }

    /// Adds `delta` to the persistent counters within `batch`.
    pub(crate) fn merge_counts(&self, batch: &mut WriteBatch, delta: &Counts) {
        if delta.iter().any(|&d| d != 0) {
            batch.merge_cf(self.cf(CF_META), COUNTERS, encode_counts(delta));
        }
    }

    /// Sets the persistent counters to zero within `batch`.
    pub(crate) fn reset_counts(&self, batch: &mut WriteBatch) {
        batch.put_cf(self.cf(CF_META), COUNTERS, encode_counts(&[0; 4]));
    }

    fn garbage_key(file: u64) -> Vec<u8> {
        let mut k = VLOG_GARBAGE_PREFIX.to_vec();
        k.extend_from_slice(&file.to_be_bytes());
        k
    }

    /// Counts the value-log entry of `key` at `at` (no record points at it any more) as
    /// garbage of its file within `batch`.
    pub(crate) fn add_vlog_garbage(
        &self,
        batch: &mut WriteBatch,
        key: &[u8],
        at: strata_format::ValuePointer,
    ) {
        let delta = [crate::vlog::entry_bytes(key.len(), at.len) as i64, 0, 0, 0];
        batch.merge_cf(
            self.cf(CF_META),
            Self::garbage_key(at.file),
            encode_counts(&delta),
        );
    }

    /// Sets file `file`'s garbage to `bytes` within `batch` (all of it, after `FLUSHALL`).
    pub(crate) fn set_vlog_garbage(&self, batch: &mut WriteBatch, file: u64, bytes: u64) {
        let counts = [bytes as i64, 0, 0, 0];
        batch.put_cf(
            self.cf(CF_META),
            Self::garbage_key(file),
            encode_counts(&counts),
        );
    }

    /// Forgets file `file`'s garbage count (the file is gone) within `batch`.
    pub(crate) fn drop_vlog_garbage(&self, batch: &mut WriteBatch, file: u64) {
        batch.delete_cf(self.cf(CF_META), Self::garbage_key(file));
    }

    /// Garbage bytes per value-log file.
    pub(crate) fn vlog_garbage(&self) -> Result<std::collections::HashMap<u64, u64>> {
        let mut out = std::collections::HashMap::new();
        let mut it = self.db.raw_iterator_cf(self.cf(CF_META));
        it.seek(VLOG_GARBAGE_PREFIX);
        while it.valid() {
            let k = it.key().expect("valid iterator");
            if !k.starts_with(VLOG_GARBAGE_PREFIX) {
                break;
            }
            if let Ok(id) = k[VLOG_GARBAGE_PREFIX.len()..]
                .try_into()
                .map(u64::from_be_bytes)
            {
                let bytes = decode_counts(it.value().expect("valid iterator"))[0];
                out.insert(id, bytes.max(0) as u64);
            }
            it.next();
        }
        it.status()?;
        Ok(out)
    }

    pub(crate) fn write(&self, batch: WriteBatch, sync: bool) -> Result<()> {
        let mut wo = WriteOptions::default();
        wo.set_sync(sync);
        self.db.write_opt(batch, &wo)?;
        Ok(())
    }
}

/// Values at least this long are handed out without a copy (see [`Warm::value_bytes`]).
const PIN_BYTES_MIN: usize = 64 * 1024;

/// A value RocksDB returned in a pinnable slice, kept with the database it came from so that
/// the slice can outlive the call that produced it.
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

impl Warm {
    /// The bytes at `range` of `slice` (a record's value) as `Bytes`. A large value is not
    /// copied: the `Bytes` owns the slice and a handle on the database. In RocksDB 7.8 a blob
    /// or memtable value sits in the slice's own buffer, so holding it (in DRAM, for example)
    /// pins nothing else; smaller values may pin a whole table block, so they are copied.
    pub(crate) fn value_bytes(
        &self,
        slice: DBPinnableSlice<'_>,
        range: std::ops::Range<usize>,
    ) -> Bytes {
        if range.len() < PIN_BYTES_MIN {
            return Bytes::copy_from_slice(&slice[range]);
        }
        assert!(range.end <= slice.len(), "value lies inside its slice");
        // SAFETY: the lifetime ties the slice to the database it came from; `Pinned` keeps
        // that database open (an `Arc`) for as long as the slice lives, and drops the slice
        // first. The slice itself is `Send` and `Sync`.
        let slice: DBPinnableSlice<'static> = unsafe { std::mem::transmute(slice) };
        let owner = Pinned {
            slice,
            _db: self.db.clone(),
        };
        Bytes::from_owner(owner).slice(range)
    }
}

/// Where `inner` (borrowed from `outer`) lies in `outer`.
pub(crate) fn range_in(outer: &[u8], inner: &[u8]) -> std::ops::Range<usize> {
    let start = inner.as_ptr() as usize - outer.as_ptr() as usize;
    debug_assert!(start + inner.len() <= outer.len());
    start..start + inner.len()
}

/// Options for point reads of warm records. Every record carries its own crc32c over key
/// and value, which the engine verifies; RocksDB's block and blob checksums would check the
/// same bytes a second time (with a slower checksum in Debian's portable build), so point
/// reads skip them. Scans and compactions still verify.
pub(crate) fn read_options() -> rocksdb::ReadOptions {
    let mut ro = rocksdb::ReadOptions::default();
    ro.set_verify_checksums(false);
    ro
}

/// The `ttl` column family key for a key expiring at `expire_ms`.
pub(crate) fn ttl_key(expire_ms: u64, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + key.len());
    k.extend_from_slice(&expire_ms.to_be_bytes());
    k.extend_from_slice(key);
    k
}

pub(crate) fn segment_meta_key(id: u64) -> Vec<u8> {
    let mut k = SEGMENT_PREFIX.to_vec();
    k.extend_from_slice(&id.to_be_bytes());
    k
}

/// What the meta family records of a committed segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SegmentMeta {
    pub(crate) entries: u64,
    pub(crate) value_bytes: u64,
}

impl SegmentMeta {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = self.entries.to_le_bytes().to_vec();
        v.extend_from_slice(&self.value_bytes.to_le_bytes());
        v
    }
    pub(crate) fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != 16 {
            return None;
        }
        Some(SegmentMeta {
            entries: u64::from_le_bytes(b[..8].try_into().ok()?),
            value_bytes: u64::from_le_bytes(b[8..].try_into().ok()?),
        })
    }
}
