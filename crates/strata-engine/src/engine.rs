//! The engine: one handle over the three tiers, its reads, and its lifecycle.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::{Mutex, MutexGuard};
use strata_format::{BlockRef, ValuePointer, WarmRecord, WarmValue};
use strata_hot::{HotCache, Lru};
use tokio::sync::{watch, Notify};

use crate::cold::Cold;
use crate::durability::GroupCommit;
use crate::stats::{add, Counters};
use crate::warm::{self, Warm, CF_DATA, CF_INDEX};
use crate::write::Change;
use crate::{Clock, Durability, EngineOptions, EngineStats, Error, Result, SystemClock, TierStats};

const STRIPE_COUNT: usize = 4096;
const ACCESS_SLOTS: usize = 1 << 20;

/// Which tier holds a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    Hot,
    Warm,
    Cold,
}

impl Tier {
    pub fn as_str(&self) -> &'static str {
        match self {
            Tier::Hot => "hot",
            Tier::Warm => "warm",
            Tier::Cold => "cold",
        }
    }
}

/// Where a value lies in the value log (see [`Engine::locate_local`]): `len` bytes at
/// `offset` of the file at `path`. `checksum` is the record's CRC-32C of the key, the expiry
/// (`expire_ms`, 8 bytes little-endian) and the value, in that order
/// (`strata_format::entry_checksum`), so the reader can verify what it maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalValue {
    pub path: std::path::PathBuf,
    pub offset: u64,
    pub len: u64,
    pub expire_ms: u64,
    pub checksum: u32,
}

/// Where a stored entry lives, as read under its stripe lock.
pub(crate) enum Loc {
    /// `charge` is what the entry counts against the warm budget; `logged` is where the
    /// value-log holds the value, if it does; `checksum` is the record's.
    Warm {
        charge: u64,
        value: Option<Bytes>,
        logged: Option<ValuePointer>,
        checksum: u32,
    },
    Cold(BlockRef),
}

/// What a warm entry counts against the warm budget: key, record header and value, wherever
/// the value is kept.
pub(crate) fn warm_charge(key: &[u8], value_len: u64) -> u64 {
    (key.len() + strata_format::WARM_HEADER_BYTES) as u64 + value_len
}

pub(crate) struct Stored {
    pub(crate) loc: Loc,
    pub(crate) expire_ms: u64,
    pub(crate) value_len: u64,
}

impl Stored {
    pub(crate) fn is_live(&self, now_ms: u64) -> bool {
        self.expire_ms == 0 || self.expire_ms > now_ms
    }
}

/// Per-key access counts for the warm tier's clock hand (hashed, one byte each): a read adds
/// one (up to `ACCESS_COUNT_MAX`; which reads count: [`Inner::count_read`]), each pass of
/// the hand over a key takes one away, and the hand demotes a key whose count is zero. So
/// a key survives as many passes as it had recent reads: frequency-weighted aging, the rule
/// Strata's DRAM policy follows (GCLOCK), without the chain links (the warm tier does not
/// learn them).
pub(crate) struct AccessCounts(Box<[std::sync::atomic::AtomicU8]>);

/// Most passes of the clock hand a key's reads can buy it.
const ACCESS_COUNT_MAX: u8 = 15;

impl AccessCounts {
    fn new() -> Self {
        AccessCounts(
            (0..ACCESS_SLOTS)
                .map(|_| std::sync::atomic::AtomicU8::new(0))
                .collect(),
        )
    }
    fn slot(&self, key: &[u8]) -> &std::sync::atomic::AtomicU8 {
        let h = (crc32c::crc32c(key) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
        &self.0[h as usize % ACCESS_SLOTS]
    }
    pub(crate) fn mark(&self, key: &[u8]) {
        let c = self.slot(key);
        let v = c.load(Ordering::Relaxed);
        if v < ACCESS_COUNT_MAX {
            c.store(v + 1, Ordering::Relaxed);
        }
    }
    /// One pass of the hand over `key`: takes one count away and says whether it had any.
    pub(crate) fn take(&self, key: &[u8]) -> bool {
        let c = self.slot(key);
        let v = c.load(Ordering::Relaxed);
        if v > 0 {
            c.store(v - 1, Ordering::Relaxed);
        }
        v > 0
    }
}

pub(crate) struct Inner {
    pub(crate) opts: EngineOptions,
    pub(crate) warm: Warm,
    pub(crate) vlog: Arc<crate::vlog::ValueLog>,
    pub(crate) cold: Arc<Cold>,
    pub(crate) hot: HotCache,
    pub(crate) clock: Arc<dyn Clock>,
    stripes: Box<[Mutex<()>]>,
    stripe_versions: Box<[AtomicU64]>,
    pub(crate) access: AccessCounts,
    pub(crate) write_seq: AtomicU64,
    pub(crate) counters: Counters,
    pub(crate) group: Option<Arc<GroupCommit>>,
    pub(crate) poisoned: Mutex<Option<String>>,
    pub(crate) next_segment_id: Mutex<u64>,
    pub(crate) demote_cursor: Mutex<Vec<u8>>,
    pub(crate) background_wake: Notify,
    pub(crate) closed: AtomicBool,
    pub(crate) pins: parking_lot::RwLock<Vec<Bytes>>,
    /// Keys that may not be demoted before the given Unix ms (KV-cache leases).
    pub(crate) leases: Mutex<std::collections::HashMap<Bytes, u64>>,
    pub(crate) load_model: crate::loadtime::LoadModel,
    pub(crate) disk: crate::disk::DiskGuard,
    /// Held for reading by a backup while it copies; segment collection skips its round
    /// while it cannot take it for writing.
    pub(crate) gc_gate: tokio::sync::RwLock<()>,
    pub(crate) prefetch: crate::prefetch::Prefetcher,
    /// Average size of recent warm values (decides whether a warm batch is split).
    warm_value_bytes_avg: AtomicU64,
}

/// What a warm multi-get found for one key.
enum WarmGot {
    Value(Bytes, u64),
    Expired,
    Absent,
}

/// Multi-key warm reads use two threads once warm values average this many bytes.
const SPLIT_VALUE_BYTES_MIN: u64 = 256 * 1024;

/// A handle to an open Strata store. Cheap to clone; all clones share one store.
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
    background: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
    shutdown: Arc<watch::Sender<bool>>,
}

fn stripe_of(key: &[u8]) -> usize {
    crc32c::crc32c(key) as usize % STRIPE_COUNT
}

impl Inner {
    pub(crate) fn lock(&self, key: &[u8]) -> MutexGuard<'_, ()> {
        self.stripes[stripe_of(key)].lock()
    }

    /// Locks the stripes of all `keys` in a fixed order (so two batches cannot deadlock).
    pub(crate) fn lock_many<'a>(
        &'a self,
        keys: impl Iterator<Item = &'a [u8]>,
    ) -> Vec<MutexGuard<'a, ()>> {
        let set: std::collections::BTreeSet<usize> = keys.map(stripe_of).collect();
        set.into_iter().map(|i| self.stripes[i].lock()).collect()
    }

    /// Locks every stripe (for operations on the whole keyspace).
    pub(crate) fn lock_all(&self) -> Vec<MutexGuard<'_, ()>> {
        self.stripes.iter().map(|m| m.lock()).collect()
    }

    pub(crate) fn bump_all(&self) {
        for v in self.stripe_versions.iter() {
            v.fetch_add(1, Ordering::AcqRel);
        }
    }

    pub(crate) fn stripe_version(&self, key: &[u8]) -> u64 {
        self.stripe_versions[stripe_of(key)].load(Ordering::Acquire)
    }

    /// Called by writers, under the stripe lock, before they touch the hot tier.
    pub(crate) fn bump_stripe(&self, key: &[u8]) {
        self.stripe_versions[stripe_of(key)].fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Reads the stored entry for `key` (expired or not). With `want_value`, a warm entry's
    /// value is read and verified.
    pub(crate) fn read_stored(&self, key: &[u8], want_value: bool) -> Result<Option<Stored>> {
        if let Some(p) = self.warm.db.get_pinned_cf_opt(
            self.warm.cf(CF_DATA),
            key,
            &crate::warm::read_options(),
        )? {
            let rec = WarmRecord::decode_unverified(&p)?;
            let value_len = rec.value_len();
            let expire_ms = rec.expire_ms;
            let checksum = rec.checksum;
            let logged = match rec.value {
                WarmValue::Logged(at) => Some(at),
                WarmValue::Inline(_) => None,
            };
            let charge = warm_charge(key, value_len);
            let value = match want_value {
                true => Some(self.warm_value(key, p)?),
                false => None,
            };
            let loc = Loc::Warm {
                charge,
                value,
                logged,
                checksum,
            };
            return Ok(Some(Stored {
                loc,
                expire_ms,
                value_len,
            }));
        }
        match self.warm.db.get_pinned_cf(self.warm.cf(CF_INDEX), key)? {
            Some(p) => {
                let r = BlockRef::decode(&p)?;
                Ok(Some(Stored {
                    loc: Loc::Cold(r),
                    expire_ms: r.expire_ms,
                    value_len: r.value_len as u64,
                }))
            }
            None => Ok(None),
        }
    }

    /// Fetches a cold key's value through its block.
    pub(crate) async fn read_cold(&self, key: &[u8], r: &BlockRef) -> Result<Bytes> {
        Ok(self.read_cold_block(key, r).await?.0)
    }

    /// As [`Inner::read_cold`], also returning the whole decompressed block.
    async fn read_cold_block(&self, key: &[u8], r: &BlockRef) -> Result<(Bytes, Bytes)> {
        let block = self.cold.get_block(r).await.inspect_err(|e| {
            if matches!(e, Error::Data(_)) {
                add(&self.counters.checksum_errors);
            }
        })?;
        match strata_format::find_in_block(&block, key) {
            Ok(Some(e)) => Ok((Bytes::copy_from_slice(e.value), block.clone())),
            Ok(None) => {
                add(&self.counters.checksum_errors);
                Err(Error::Data(format!(
                    "key not found in segment {:016x} block {} where the index points",
                    r.segment_id, r.block
                )))
            }
            Err(e) => {
                add(&self.counters.checksum_errors);
                Err(e.into())
            }
        }
    }

    /// One multi-get of `keys` from the warm tier's data family, values verified.
    fn read_warm(&self, keys: &[&[u8]], now: u64) -> Result<Vec<WarmGot>> {
        let got = self.warm.db.batched_multi_get_cf_opt(
            self.warm.cf(CF_DATA),
            keys.iter(),
            false,
            &crate::warm::read_options(),
        );
        keys.iter()
            .zip(got)
            .map(|(key, res)| {
                let Some(p) = res? else {
                    return Ok(WarmGot::Absent);
                };
                let expire_ms = WarmRecord::decode_unverified(&p)?.expire_ms;
                if expire_ms != 0 && expire_ms <= now {
                    return Ok(WarmGot::Expired);
                }
                Ok(WarmGot::Value(self.warm_value(key, p)?, expire_ms))
            })
            .collect()
    }

    /// The verified value of the warm record `p` read for `key`: RocksDB's buffer for an
    /// inline value, the mapped value-log bytes for a logged one.
    pub(crate) fn warm_value(&self, key: &[u8], p: rocksdb::DBPinnableSlice<'_>) -> Result<Bytes> {
        let bad = || add(&self.counters.checksum_errors);
        let rec = WarmRecord::decode(key, &p).inspect_err(|_| bad())?;
        match rec.value {
            WarmValue::Inline(v) => {
                let range = crate::warm::range_in(&p, v);
                Ok(self.warm.value_bytes(p, range))
            }
            WarmValue::Logged(at) => self.vlog.read_checked(key, &rec, at).inspect_err(|_| bad()),
        }
    }

    /// Puts a value read from warm or cold into hot, unless a write touched the key since
    /// `seen_version` was read (then the value may be stale). Says whether it went in.
    pub(crate) fn insert_hot_if_unchanged(
        &self,
        key: &[u8],
        seen_version: u64,
        value: Bytes,
        expire_ms: u64,
    ) -> bool {
        let _g = self.lock(key);
        self.stripe_version(key) == seen_version && self.hot.insert(key, value, expire_ms)
    }

    /// Writes a value just read from the object store back to the warm tier (and DRAM), if
    /// `cold_reads_return_to_warm` is on and the key still points at the block it was read
    /// from. Best effort: past halfway to the warm tier's hard limit, or when the write is
    /// refused (out of disk, read-only), the value stays where it is. Says whether it went
    /// back.
    fn return_to_warm(&self, key: &[u8], seen_version: u64, r: &BlockRef, value: &Bytes) -> bool {
        if !self.opts.cold_reads_return_to_warm {
            return false;
        }
        let _g = self.lock(key);
        if self.stripe_version(key) != seen_version {
            return false;
        }
        let stored = match self.read_stored(key, false) {
            Ok(Some(s)) if matches!(s.loc, Loc::Cold(now_r) if now_r == *r) => s,
            _ => return false,
        };
        let back = self.return_to_warm_locked(key, &stored, value);
        if back {
            add(&self.counters.promotions);
            self.prefetch.forget(key);
        }
        back
    }

    /// A value prefetched into DRAM was read from there: it goes back to the warm tier as a
    /// value read from the object store does (the DRAM copy is the value the index points
    /// at: a write replaces or drops it under the same stripe lock).
    pub(crate) fn return_prefetched_to_warm(&self, key: &[u8]) -> bool {
        if !self.opts.cold_reads_return_to_warm {
            return false;
        }
        let _g = self.lock(key);
        let now = self.now_ms();
        let stored = match self.read_stored(key, false) {
            Ok(Some(s)) if s.is_live(now) && matches!(s.loc, Loc::Cold(_)) => s,
            _ => return false,
        };
        match self.hot.peek(key, now) {
            Some(value) => self.return_to_warm_locked(key, &stored, &value),
            None => false,
        }
    }

    /// Writes `value`, the value of the cold entry `stored`, to the warm tier; the caller
    /// holds the key's stripe lock. Not synced even with `durability = sync`: the object
    /// store still holds the value, and collection syncs before it deletes a segment.
    /// Returns stop halfway from `warm_bytes_max` to the hard limit, so that when demotion
    /// falls behind, the rest of the headroom is left to clients' writes.
    fn return_to_warm_locked(&self, key: &[u8], stored: &Stored, value: &Bytes) -> bool {
        let (soft, hard) = (self.opts.warm_bytes_max, self.opts.warm_hard_limit());
        let warm = self.counters.warm_bytes.load(Ordering::Relaxed).max(0) as u64;
        if warm + warm_charge(key, value.len() as u64) > soft + hard.saturating_sub(soft) / 2 {
            return false;
        }
        let change = Change::Put {
            value: value.clone(),
            expire_ms: stored.expire_ms,
        };
        match self.apply_locked_with(key, Some(stored), change, false) {
            Ok(_) => {
                add(&self.counters.returns_to_warm);
                true
            }
            Err(e) => {
                tracing::debug!(key = %String::from_utf8_lossy(key), error = %e, "a cold value stays cold");
                false
            }
        }
    }

    /// Counts a read of `key` for the warm tier's clock. With values returning to warm, only
    /// reads that found the key count. Without, every read counts: a key written after a
    /// read that missed it starts with one, which keeps new keys through a pass of the clock
    /// (the only reuse the warm tier can see then; measured on the conversation trace:
    /// RocksDB served 20,600 blocks this way and 13,800 counting found keys only).
    pub(crate) fn count_read(&self, key: &[u8], found: bool) {
        if found || !self.opts.cold_reads_return_to_warm {
            self.access.mark(key);
        }
    }

    /// Makes every write so far durable: the value log first, then the WAL whose records
    /// point into it.
    pub(crate) fn sync_values_and_wal(&self) -> Result<()> {
        self.vlog.sync()?;
        self.warm.db.flush_wal(true)?;
        Ok(())
    }

    /// Copies a value read from warm or cold into hot, unless a write raced with the read.
    fn promote(&self, key: &[u8], seen_version: u64, value: Bytes, expire_ms: u64) {
        if self.insert_hot_if_unchanged(key, seen_version, value, expire_ms) {
            add(&self.counters.promotions);
            self.prefetch.forget(key);
        }
    }

    /// The slow path of a read: warm, then the index and the cold tier.
    async fn get_uncached(&self, key: &[u8]) -> Result<Option<Bytes>> {
        for _attempt in 0..3 {
            let seen = self.stripe_version(key);
            let now = self.now_ms();
            let started = std::time::Instant::now();
            let stored = match self.read_stored(key, true)? {
                Some(s) if s.is_live(now) => s,
                _ => {
                    add(&self.counters.misses);
                    return Ok(None);
                }
            };
            match stored.loc {
                Loc::Warm { value, .. } => {
                    let v = value.expect("value requested");
                    self.load_model
                        .record(Tier::Warm, v.len() as u64, started.elapsed());
                    add(&self.counters.warm_hits);
                    self.promote(key, seen, v.clone(), stored.expire_ms);
                    return Ok(Some(v));
                }
                Loc::Cold(r) => match self.read_cold_block(key, &r).await {
                    Ok((v, block)) => {
                        self.load_model
                            .record(Tier::Cold, v.len() as u64, started.elapsed());
                        add(&self.counters.cold_hits);
                        if !self.return_to_warm(key, seen, &r, &v) {
                            self.promote(key, seen, v.clone(), r.expire_ms);
                        }
                        self.prefetch.submit(crate::prefetch::Job {
                            key: Bytes::copy_from_slice(key),
                            block: Some((r, block)),
                        });
                        return Ok(Some(v));
                    }
                    // The segment may have been rewritten under us: retry if the index moved.
                    Err(e) if matches!(e, Error::ColdUnavailable(_)) => {
                        let moved = match self.read_stored(key, false)? {
                            Some(Stored {
                                loc: Loc::Cold(now_r),
                                ..
                            }) => now_r != r,
                            _ => true,
                        };
                        if !moved {
                            return Err(e);
                        }
                    }
                    Err(e) => return Err(e),
                },
            }
        }
        Err(Error::Internal(
            "key kept moving between tiers during a read".into(),
        ))
    }

    pub(crate) fn is_leased(&self, key: &[u8], now_ms: u64) -> bool {
        let l = self.leases.lock();
        !l.is_empty() && l.get(key).is_some_and(|&t| t > now_ms)
    }

    pub(crate) fn check_writable(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if let Some(e) = &*self.poisoned.lock() {
            return Err(Error::Poisoned(e.clone()));
        }
        Ok(())
    }
}

impl Engine {
    /// Opens (or creates) the store described by `opts`. Must run inside a tokio runtime:
    /// it starts the background task that demotes, expires and collects segments.
    pub async fn open(opts: EngineOptions) -> Result<Engine> {
        Self::open_with_clock(opts, Arc::new(SystemClock)).await
    }

    /// As [`Engine::open`], with time from `clock` (tests use a manual clock).
    pub async fn open_with_clock(opts: EngineOptions, clock: Arc<dyn Clock>) -> Result<Engine> {
        opts.validate()?;
        std::fs::create_dir_all(&opts.data_dir).map_err(|e| {
            Error::Invalid(format!(
                "cannot create data directory {}: {e}",
                opts.data_dir.display()
            ))
        })?;
        let warm_dir = opts.data_dir.join("warm");
        let warm = Warm::open(&warm_dir, &opts)?;
        let vlog = Arc::new(crate::vlog::ValueLog::open(
            &opts.data_dir.join("vlog"),
            opts.vlog_file_bytes,
            opts.vlog_writeback_bytes,
        )?);
        let opts_disk_free_min = opts.disk_free_min_bytes;
        let cold = Arc::new(Cold::open(&opts)?);
        // A first guess at 1 KiB per entry; a shard's policy resizes itself to the entries
        // it holds when it first evicts (strata_hot::StrataHot).
        let shard_entries =
            (opts.hot_bytes_max / 1024 / opts.hot_shard_count as u64).clamp(64, 1 << 20) as usize;
        let hot = match opts.hot_policy {
            crate::HotPolicy::Lru => {
                HotCache::new(opts.hot_bytes_max as usize, opts.hot_shard_count, || {
                    Box::new(Lru::default())
                })
            }
            crate::HotPolicy::Strata => {
                HotCache::new(opts.hot_bytes_max as usize, opts.hot_shard_count, || {
                    Box::new(strata_hot::StrataHot::new(shard_entries))
                })
            }
        };
        let counters = Counters::default();
        counters.wal_bytes_dropped.store(
            warm::wal_bytes_dropped_at_open(&warm_dir),
            Ordering::Relaxed,
        );
        let [warm_bytes, warm_entries, cold_bytes, cold_entries] = warm.counts()?;
        counters.warm_bytes.store(warm_bytes, Ordering::Relaxed);
        counters.warm_entries.store(warm_entries, Ordering::Relaxed);
        counters.cold_bytes.store(cold_bytes, Ordering::Relaxed);
        counters.cold_entries.store(cold_entries, Ordering::Relaxed);
        let next_segment_id = warm.counter(warm::NEXT_SEGMENT_ID)?.max(1) as u64;
        let group = (opts.durability == Durability::Group)
            .then(|| GroupCommit::start(Arc::clone(&warm.db), Arc::clone(&vlog)));
        // Write sequences only need to differ from every earlier record's; microseconds since
        // the epoch at start-up are larger than any sequence a previous run could reach.
        let seq_start = clock.now_ms().saturating_mul(1000);
        let inner = Arc::new(Inner {
            opts,
            warm,
            vlog,
            cold,
            hot,
            clock,
            stripes: (0..STRIPE_COUNT).map(|_| Mutex::new(())).collect(),
            stripe_versions: (0..STRIPE_COUNT).map(|_| AtomicU64::new(0)).collect(),
            access: AccessCounts::new(),
            write_seq: AtomicU64::new(seq_start),
            counters,
            group,
            poisoned: Mutex::new(None),
            next_segment_id: Mutex::new(next_segment_id),
            demote_cursor: Mutex::new(Vec::new()),
            background_wake: Notify::new(),
            closed: AtomicBool::new(false),
            pins: parking_lot::RwLock::new(Vec::new()),
            leases: Mutex::new(std::collections::HashMap::new()),
            load_model: crate::loadtime::LoadModel::default(),
            disk: crate::disk::DiskGuard::new(&warm_dir, opts_disk_free_min),
            gc_gate: tokio::sync::RwLock::new(()),
            prefetch: crate::prefetch::Prefetcher::new(),
            warm_value_bytes_avg: AtomicU64::new(0),
        });
        *inner.pins.write() = crate::pins::load(&inner)?;
        let (tx, rx) = watch::channel(false);
        let handle = tokio::spawn(crate::background::run(Arc::clone(&inner), rx));
        crate::prefetch::Prefetcher::start(&inner);
        Ok(Engine {
            inner,
            background: Arc::new(Mutex::new(Some(handle))),
            shutdown: Arc::new(tx),
        })
    }

    /// Stops background work, syncs the WAL and flushes memtables. Later calls fail with
    /// [`Error::Closed`]. Data is safe without calling this; restart is just faster.
    pub async fn close(&self) -> Result<()> {
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.shutdown.send_replace(true);
        let handle = self.background.lock().take();
        if let Some(h) = handle {
            let _ = h.await;
        }
        if let Some(g) = &self.inner.group {
            g.stop();
        }
        self.inner.sync_values_and_wal()?;
        self.inner.warm.db.flush()?;
        // Large values in DRAM hold the database open (they are RocksDB's own buffers).
        self.inner.hot.clear();
        Ok(())
    }

    /// The options the engine was opened with.
    pub fn options(&self) -> &EngineOptions {
        &self.inner.opts
    }

    pub fn now_ms(&self) -> u64 {
        self.inner.now_ms()
    }

    /// Reads `key` from the first tier that holds it.
    pub async fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        let inner = &self.inner;
        let got = match inner.hot.get(key, inner.now_ms()) {
            Some((v, _)) => {
                add(&inner.counters.hot_hits);
                inner.prefetch.on_hot_hit(key);
                Some(v)
            }
            None => inner.get_uncached(key).await?,
        };
        inner.count_read(key, got.is_some());
        Ok(got)
    }

    /// Reads many keys at once: hot for all, then one RocksDB multi-get, then the cold
    /// blocks concurrently (keys sharing a block share its fetch).
    pub async fn get_many(&self, keys: &[&[u8]]) -> Result<Vec<Option<Bytes>>> {
        self.get_many_limited(keys, u64::MAX).await
    }

    /// Reads `keys` from the warm tier. When recent warm values were large, the second half
    /// of the batch is read (copied out of RocksDB and its checksums verified) on a blocking
    /// thread while this one reads the first half, so a large multi-key read uses two cores.
    async fn read_warm_batch(&self, keys: &[&[u8]], now: u64) -> Result<Vec<WarmGot>> {
        let inner = &self.inner;
        let split = keys.len() >= 2
            && inner.warm_value_bytes_avg.load(Ordering::Relaxed) >= SPLIT_VALUE_BYTES_MIN;
        let got = if split {
            add(&inner.counters.warm_batches_split);
            let half = keys.len() / 2;
            let second: Vec<Bytes> = keys[half..]
                .iter()
                .map(|k| Bytes::copy_from_slice(k))
                .collect();
            let other = inner.clone();
            let task = tokio::task::spawn_blocking(move || {
                let refs: Vec<&[u8]> = second.iter().map(|k| &k[..]).collect();
                other.read_warm(&refs, now)
            });
            let mut got = inner.read_warm(&keys[..half], now)?;
            got.extend(
                task.await
                    .map_err(|e| Error::Data(format!("warm read task failed: {e}")))??,
            );
            got
        } else {
            inner.read_warm(keys, now)?
        };
        let (bytes, values) = got.iter().fold((0u64, 0u64), |(b, n), g| match g {
            WarmGot::Value(v, _) => (b + v.len() as u64, n + 1),
            _ => (b, n),
        });
        if let Some(avg) = bytes.checked_div(values) {
            let old = inner.warm_value_bytes_avg.load(Ordering::Relaxed);
            let new = if old == 0 { avg } else { (old * 3 + avg) / 4 };
            inner.warm_value_bytes_avg.store(new, Ordering::Relaxed);
        }
        Ok(got)
    }

    /// As [`Engine::get_many`], also saying which tier served each value.
    pub async fn get_many_tiered(&self, keys: &[&[u8]]) -> Result<Vec<Option<(Bytes, Tier)>>> {
        self.read_many(keys, false, u64::MAX).await
    }

    /// As [`Engine::get_many`], but refused (`Error::Invalid`) when two or more values found
    /// hold more than `bytes_max` bytes in all, before any of them is fetched from the object
    /// store: one read's memory stays bounded.
    pub async fn get_many_limited(
        &self,
        keys: &[&[u8]],
        bytes_max: u64,
    ) -> Result<Vec<Option<Bytes>>> {
        Ok(self
            .read_many(keys, false, bytes_max)
            .await?
            .into_iter()
            .map(|v| v.map(|(b, _)| b))
            .collect())
    }

    /// The values of the leading keys of `keys` that hold one, up to the first that does
    /// not (a KV-cache prefix is usable only contiguously), and no more than `bytes_max`
    /// bytes of them: the reply stops before the value that would pass it (but always holds
    /// the first value present), so a caller that gets fewer values than keys asks again from
    /// where it stopped. Nothing after the cut is fetched from the object store.
    pub async fn get_prefix(&self, keys: &[&[u8]], bytes_max: u64) -> Result<Vec<Bytes>> {
        let got = self.read_many(keys, true, bytes_max).await?;
        Ok(got.into_iter().map_while(|v| v.map(|(b, _)| b)).collect())
    }

    /// Reads `keys` through the tiers; with `prefix`, nothing after the first key found in
    /// no tier is returned. At most `bytes_max` bytes of values: with `prefix` the read stops
    /// before the value that would pass it, without it the read is refused; either way
    /// before the object store is asked (the index knows each cold value's length).
    async fn read_many(
        &self,
        keys: &[&[u8]],
        prefix: bool,
        bytes_max: u64,
    ) -> Result<Vec<Option<(Bytes, Tier)>>> {
        let (mut out, cold_len, first_miss) = self.read_near(keys).await?;
        let len_of = |i: usize| out[i].as_ref().map(|(v, _)| v.len() as u64).or(cold_len[i]);
        let end = if prefix {
            first_miss.min(keys.len())
        } else {
            keys.len()
        };
        let mut cut = end;
        let mut total = 0u64;
        let mut values = 0;
        for i in 0..end {
            let Some(len) = len_of(i) else { continue };
            total += len;
            values += 1;
            // One value alone may be larger than the limit: the reply carries it.
            if total > bytes_max && values > 1 {
                if !prefix {
                    return Err(Error::Invalid(format!(
                        "the values asked for hold more than {bytes_max} bytes, the most one \
                         reply may carry; ask for fewer keys at a time"
                    )));
                }
                cut = i;
                break;
            }
        }
        for slot in &mut out[cut..] {
            *slot = None;
        }
        let cold: Vec<usize> = (0..cut)
            .filter(|&i| out[i].is_none() && cold_len[i].is_some())
            .collect();
        // The first failure ends the read: the fetches still waiting for a read slot are
        // dropped rather than each waiting out its own timeout.
        let fetched =
            futures::future::try_join_all(cold.iter().map(|&i| self.inner.get_uncached(keys[i])))
                .await?;
        for (&i, v) in cold.iter().zip(fetched) {
            out[i] = v.map(|v| (v, Tier::Cold));
        }
        Ok(out)
    }

    /// The first steps of [`Engine::read_many`]: the values DRAM and the warm tier hold, the
    /// length of each value the index places in the object store (not fetched), and the
    /// position of the first key held by no tier (`usize::MAX` if none).
    async fn read_near(
        &self,
        keys: &[&[u8]],
    ) -> Result<(Vec<Option<(Bytes, Tier)>>, Vec<Option<u64>>, usize)> {
        let inner = &self.inner;
        let now = inner.now_ms();
        let mut out: Vec<Option<(Bytes, Tier)>> = vec![None; keys.len()];
        let mut cold_len = vec![None; keys.len()];
        // The first key no tier holds (expired in warm or cold, or absent).
        let mut first_miss = usize::MAX;
        let mut pending = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            match inner.hot.get(k, now) {
                Some((v, _)) => {
                    inner.count_read(k, true);
                    add(&inner.counters.hot_hits);
                    inner.prefetch.on_hot_hit(k);
                    out[i] = Some((v, Tier::Hot));
                }
                None => pending.push(i),
            }
        }
        if pending.is_empty() {
            return Ok((out, cold_len, first_miss));
        }
        let versions: Vec<u64> = pending
            .iter()
            .map(|&i| inner.stripe_version(keys[i]))
            .collect();
        let pending_keys: Vec<&[u8]> = pending.iter().map(|&i| keys[i]).collect();
        let got = self.read_warm_batch(&pending_keys, now).await?;
        let mut not_warm = Vec::new();
        for ((&i, got), &seen) in pending.iter().zip(got).zip(&versions) {
            match got {
                WarmGot::Value(v, expire_ms) => {
                    inner.count_read(keys[i], true);
                    add(&inner.counters.warm_hits);
                    inner.promote(keys[i], seen, v.clone(), expire_ms);
                    out[i] = Some((v, Tier::Warm));
                }
                WarmGot::Expired => {
                    inner.count_read(keys[i], false);
                    add(&inner.counters.misses);
                    first_miss = first_miss.min(i);
                }
                WarmGot::Absent => not_warm.push(i),
            }
        }
        if not_warm.is_empty() {
            return Ok((out, cold_len, first_miss));
        }
        let index_cf = inner.warm.cf(CF_INDEX);
        let got =
            inner
                .warm
                .db
                .batched_multi_get_cf(index_cf, not_warm.iter().map(|&i| keys[i]), false);
        for (&i, res) in not_warm.iter().zip(got) {
            match res? {
                Some(p) => {
                    let r = BlockRef::decode(&p)?;
                    if r.expire_ms != 0 && r.expire_ms <= now {
                        inner.count_read(keys[i], false);
                        add(&inner.counters.misses);
                        first_miss = first_miss.min(i);
                    } else {
                        inner.count_read(keys[i], true);
                        cold_len[i] = Some(r.value_len as u64);
                    }
                }
                None => {
                    inner.count_read(keys[i], false);
                    add(&inner.counters.misses);
                    first_miss = first_miss.min(i);
                }
            }
        }
        Ok((out, cold_len, first_miss))
    }

    /// Whether `key` holds a live value, without reading a cold value.
    pub async fn exists(&self, key: &[u8]) -> Result<bool> {
        let inner = &self.inner;
        let now = inner.now_ms();
        if inner.hot.contains(key, now) {
            return Ok(true);
        }
        Ok(inner
            .read_stored(key, false)?
            .is_some_and(|s| s.is_live(now)))
    }

    /// The absolute expiry of `key` in Unix ms: `None` if absent, `Some(0)` if it never expires.
    pub async fn expire_time_ms(&self, key: &[u8]) -> Result<Option<u64>> {
        let now = self.inner.now_ms();
        Ok(self
            .inner
            .read_stored(key, false)?
            .filter(|s| s.is_live(now))
            .map(|s| s.expire_ms))
    }

    /// Tells the prefetcher that client stream `stream` (a connection) read `key`: the
    /// transitions between a stream's keys train the Markov model.
    pub fn note_access(&self, stream: u64, key: &[u8]) {
        if self.inner.opts.prefetch {
            self.inner.prefetch.note_access(stream, key);
        }
    }

    /// Forgets a stream's last key (its connection closed).
    pub fn end_stream(&self, stream: u64) {
        self.inner.prefetch.end_stream(stream);
    }

    /// Which tier serves `key` now, if any.
    pub async fn tier_of(&self, key: &[u8]) -> Result<Option<Tier>> {
        Ok(self.locate(key).await?.map(|(t, _)| t))
    }

    /// Which tier serves `key` now and how many bytes its value holds, without reading it.
    pub async fn locate(&self, key: &[u8]) -> Result<Option<(Tier, u64)>> {
        let inner = &self.inner;
        let now = inner.now_ms();
        // DRAM holds only copies of stored, live keys: a hit there needs no RocksDB read
        // (which would copy a large value out of the memtable or a blob file).
        if let Some(len) = inner.hot.value_len(key, now) {
            return Ok(Some((Tier::Hot, len as u64)));
        }
        let Some(s) = inner.read_stored(key, false)?.filter(|s| s.is_live(now)) else {
            return Ok(None);
        };
        let tier = match s.loc {
            Loc::Warm { .. } => Tier::Warm,
            Loc::Cold(_) => Tier::Cold,
        };
        Ok(Some((tier, s.value_len)))
    }

    /// For each leading key of `keys` that holds a live value, where that value lies in the
    /// value log (`None` if it is elsewhere: in the object store, or small enough to live in
    /// its record), for a reader on the same machine that maps the files itself; stops at
    /// the first key with no live value. Value-log entries are never changed in place, so a
    /// location stays valid for as long as its file exists (a reader with the file mapped
    /// keeps it after collection deletes it).
    pub fn locate_local(&self, keys: &[&[u8]]) -> Result<Vec<Option<LocalValue>>> {
        let inner = &self.inner;
        let now = inner.now_ms();
        let mut out = Vec::with_capacity(keys.len());
        for &key in keys {
            let Some(s) = inner.read_stored(key, false)?.filter(|s| s.is_live(now)) else {
                break;
            };
            inner.count_read(key, true);
            out.push(match s.loc {
                Loc::Warm {
                    logged: Some(at),
                    checksum,
                    ..
                } => Some(LocalValue {
                    path: inner.vlog.path_of(at.file),
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

    /// Expected microseconds to load values of these sizes from these tiers, from measured
    /// per-tier read costs (the formula is in `loadtime.rs` and the README).
    pub fn expected_load_us(&self, reads: &[(Tier, u64)]) -> u64 {
        self.inner.load_model.estimate_us(reads)
    }

    /// Keeps `keys` from being demoted to the cold tier until `until_ms` (a lease taken by a
    /// KV-cache prefix match, so the matched chunks stay quick to load). At most
    /// `LEASES_MAX` keys are leased at once; beyond that the oldest-expiring leases go.
    pub fn lease(&self, keys: &[&[u8]], until_ms: u64) {
        const LEASES_MAX: usize = 1 << 20;
        let mut l = self.inner.leases.lock();
        let now = self.inner.now_ms();
        if l.len() + keys.len() > LEASES_MAX {
            l.retain(|_, &mut t| t > now);
        }
        for k in keys.iter().take(LEASES_MAX.saturating_sub(l.len())) {
            let e = l.entry(Bytes::copy_from_slice(k)).or_insert(0);
            *e = (*e).max(until_ms);
        }
    }

    /// Figures for every tier.
    pub fn stats(&self) -> EngineStats {
        let c = &self.inner.counters;
        let cc = &self.inner.cold.counters;
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let hot = self.inner.hot.stats();
        let vlog_files = self.inner.vlog.files().unwrap_or_default();
        EngineStats {
            hot: TierStats {
                entries: hot.entries,
                bytes: hot.bytes,
                bytes_max: hot.bytes_max,
                hits: ld(&c.hot_hits),
            },
            warm: TierStats {
                entries: c.warm_entries.load(Ordering::Relaxed).max(0) as u64,
                bytes: c.warm_bytes.load(Ordering::Relaxed).max(0) as u64,
                bytes_max: self.inner.opts.warm_bytes_max,
                hits: ld(&c.warm_hits),
            },
            cold: TierStats {
                entries: c.cold_entries.load(Ordering::Relaxed).max(0) as u64,
                bytes: c.cold_bytes.load(Ordering::Relaxed).max(0) as u64,
                bytes_max: 0,
                hits: ld(&c.cold_hits),
            },
            misses: ld(&c.misses),
            hot_evictions: hot.evictions,
            demotions: ld(&c.demotions),
            promotions: ld(&c.promotions),
            returns_to_warm: ld(&c.returns_to_warm),
            expired: ld(&c.expired),
            checksum_errors: ld(&c.checksum_errors),
            segments_written: ld(&c.segments_written),
            segments_deleted: ld(&c.segments_deleted),
            segments_rewritten: ld(&c.segments_rewritten),
            demotion_errors: ld(&c.demotion_errors),
            writes: ld(&c.writes),
            writes_refused_full: ld(&c.writes_refused_full),
            prefetch_issued: ld(&self.inner.prefetch.issued),
            prefetch_used: ld(&self.inner.prefetch.used),
            prefetch_dropped: ld(&self.inner.prefetch.dropped),
            warm_batches_split: ld(&c.warm_batches_split),
            wal_bytes_dropped: ld(&c.wal_bytes_dropped),
            vlog_files: vlog_files.len() as u64,
            vlog_bytes: vlog_files.iter().map(|f| f.1).sum(),
            vlog_files_collected: ld(&c.vlog_files_collected),
            warm_bytes_hard_max: self.inner.opts.warm_hard_limit(),
            cold_requests: crate::stats::ColdRequestStats {
                gets: ld(&cc.gets),
                puts: ld(&cc.puts),
                deletes: ld(&cc.deletes),
                lists: ld(&cc.lists),
                errors: ld(&cc.errors),
                get_bytes: ld(&cc.get_bytes),
                put_bytes: ld(&cc.put_bytes),
                get_micros_total: ld(&cc.get_micros_total),
                shared_fetches: ld(&cc.shared_fetches),
                read_waits: ld(&cc.read_waits),
                reads_in_flight_peak: ld(&cc.reads_in_flight_peak),
            },
            cold_url: self.inner.cold.url.clone(),
            durability: format!("{:?}", self.inner.opts.durability).to_lowercase(),
        }
    }

    /// Drops every cached value from DRAM (tests use it to force reads from lower tiers).
    pub fn clear_hot(&self) {
        self.inner.hot.clear();
    }

    /// Runs one round of background work now: expire, demote until warm is under budget,
    /// collect segments. Returns the number of keys demoted.
    pub async fn run_background_once(&self) -> Result<u64> {
        crate::background::round(&self.inner, true).await
    }
}
