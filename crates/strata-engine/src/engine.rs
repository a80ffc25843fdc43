//! The engine's handle: its parts, its lifecycle, and every operation it offers, each a
//! thin call into the module that does it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use object_store::ObjectStore;
use parking_lot::Mutex;
use strata_format::{Key, Kind};
use strata_hot::{HotCache, PolicyKind};
use strata_warm::{MemoryShares, WarmStore};
use tokio::sync::{watch, Notify};

use crate::access::AccessCounts;
use crate::backup::{BackupSummary, Progress};
use crate::changes::ChangeEvent;
use crate::cold::{open_store, url_for, Cold};
use crate::commit::Change;
use crate::core::{Core, TierSizes};
use crate::disk::DiskGuard;
use crate::durability::{GroupCommit, Ticket, Written};
use crate::live::state::LiveValue;
use crate::locks::Stripes;
use crate::read::{Answer, LocalValue, Source};
use crate::scan::ScanPage;
use crate::settings::{Durability, HotPolicy, Settings};
use crate::stats::{Counters, Stats};
use crate::tier::Tier;
use crate::vlog::ValueLog;
use crate::warm::{Saved, Warm};
use crate::write::{Existing, PutOptions, PutResult};
use crate::writeback::state::WriteBack;
use crate::{Clock, Result, SystemClock};

/// What an engine is made of: its directory and settings, the warm store (opened by the
/// caller: `strata_rocks::RocksWarm` in production, in [`warm_dir`]), and the seams tests
/// replace: the object store and the clock.
pub struct Parts {
    /// Root of the engine's local state: the value log in `vlog/`, the default cold tier
    /// in `cold/`.
    pub data_dir: PathBuf,
    pub settings: Settings,
    pub warm: Arc<dyn WarmStore>,
    /// The cold tier's object store; `None` opens the one the settings name (`cold_url`, or
    /// `<data_dir>/cold`).
    pub cold: Option<Arc<dyn ObjectStore>>,
    pub clock: Arc<dyn Clock>,
    /// Whether the engine runs its background task (expiry, demotion, collection); tests
    /// that drive rounds themselves ([`Engine::run_background_once`]) turn it off.
    pub background: bool,
}

impl Parts {
    pub fn new(
        data_dir: impl Into<PathBuf>,
        settings: Settings,
        warm: Arc<dyn WarmStore>,
    ) -> Parts {
        Parts {
            data_dir: data_dir.into(),
            settings,
            warm,
            cold: None,
            clock: Arc::new(SystemClock),
            background: true,
        }
    }
}

/// A handle to an open Strata store. Cheap to clone; all clones share one store.
#[derive(Clone)]
pub struct Engine {
    core: Arc<Core>,
    background: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
    shutdown: Arc<watch::Sender<bool>>,
}

fn hot_cache(s: &Settings) -> HotCache {
    let h = &s.hot;
    let policy = match h.hot_policy {
        HotPolicy::Lru => PolicyKind::Lru,
        HotPolicy::Strata => PolicyKind::Strata,
    };
    HotCache::new(h.hot_bytes_max as usize, h.hot_shard_count, policy)
}

/// A multi-key read's value if it is a string (`MGET` answers nil for a key of another
/// kind, as Redis does).
fn strings_only(v: Option<(Bytes, Tier, Kind)>) -> Option<(Bytes, Tier)> {
    match v {
        Some((b, t, Kind::String)) => Some((b, t)),
        _ => None,
    }
}

/// The next segment id of a store that had allocated up to `stored` and now writes under
/// writer epoch `epoch`: the stored counter if it is this epoch's, the epoch's first id if
/// the epoch is new (a cluster gives each start an epoch of its own).
fn next_segment_id(stored: u64, epoch: u64) -> Result<u64> {
    let was = strata_format::segment_ids::epoch_of(stored);
    match was.cmp(&epoch) {
        std::cmp::Ordering::Equal => Ok(stored),
        std::cmp::Ordering::Less => Ok(strata_format::segment_ids::first_segment_id(epoch)),
        // An epoch before the store's own: its ids may be in use already.
        std::cmp::Ordering::Greater => Err(crate::Error::Invalid(format!(
            "this store wrote segments under writer epoch {was}; open it with that cluster"
        ))),
    }
}

impl<T> Written<T> {
    /// Waits until the write is durable, then hands back its result.
    pub async fn durable(self, engine: &Engine) -> Result<T> {
        engine.wait(self.ticket).await?;
        Ok(self.value)
    }
}

impl Engine {
    /// Opens (or creates) the store made of `parts`, bringing its key layout up to date.
    /// Must run inside a tokio runtime: it starts the background task that demotes, expires
    /// and collects, and the worker of what reads leave behind.
    pub async fn open_with(parts: Parts) -> Result<Engine> {
        let Parts {
            data_dir,
            settings,
            warm,
            cold,
            clock,
            background,
        } = parts;
        settings.validate()?;
        std::fs::create_dir_all(&data_dir).map_err(|e| {
            crate::Error::Invalid(format!(
                "cannot create data directory {}: {e}",
                data_dir.display()
            ))
        })?;
        let counters = Arc::new(Counters::default());
        let warm_tier = Warm::new(Arc::clone(&warm), Arc::clone(&counters));
        crate::migrate::to_current(&warm_tier)?;
        crate::migrate::check_key_slots(&warm_tier, settings.key_slots)?;
        warm_tier.load_cold_may_hold()?;
        let v = &settings.vlog;
        let vlog = Arc::new(ValueLog::open(
            &data_dir.join("vlog"),
            v.vlog_file_bytes,
            v.vlog_writeback_bytes,
        )?);
        let (store, url) = match cold {
            Some(store) => (store, "(handed in)".to_string()),
            None => {
                let url = url_for(&settings.cold, &data_dir)?;
                (open_store(&url, &settings.cold)?, url)
            }
        };
        let bucket = match settings.ships_to_bucket() {
            true => Some(Arc::new(
                crate::bucket::BucketLog::open(
                    Arc::clone(&store),
                    settings.writer_epoch,
                    std::time::Duration::from_millis(settings.cold.cold_request_timeout_ms),
                    settings.bucket.bucket_kvcache,
                )
                .await?,
            )),
            false => None,
        };
        let cold = Arc::new(Cold::new(store, url, &settings.cold, Arc::clone(&counters)));
        let sizes = TierSizes::default();
        let counts = warm_tier.counts()?;
        sizes.set(counts);
        warm_tier.load_key_counts(counts.warm_entries + counts.cold_entries)?;
        warm_tier.load_db_map()?;
        if counts.warm_bytes.max(0) as u64 <= crate::keyfilter::OPEN_BUILD_BYTES_MAX
            && (counts.warm_entries + counts.cold_entries).max(0) as u64
                <= crate::keyfilter::OPEN_BUILD_KEYS_MAX
        {
            warm_tier.build_key_filter_if_due();
        }
        let hot = Arc::new(hot_cache(&settings));
        let writeback = WriteBack::open(
            &data_dir,
            settings.hot.hot_dirty_fraction,
            settings.warm.warm_bytes_max,
            settings.warm.durability == Durability::None,
            Arc::clone(&hot),
        )?;
        let grouped = matches!(
            settings.warm.durability,
            Durability::Group | Durability::Bucket
        );
        let group = grouped.then(|| {
            let hot_log = Arc::clone(writeback.log());
            GroupCommit::start(
                Arc::clone(&warm),
                Arc::clone(&vlog),
                hot_log,
                Arc::clone(&counters),
            )
        });
        // Write sequences only need to differ from every earlier record's; microseconds since
        // the epoch at start-up are larger than any sequence a previous run could reach.
        let seq_start = clock.now_ms().saturating_mul(1000);
        let core = Arc::new(Core {
            hot,
            access: AccessCounts::new(settings.warm.cold_reads_return_to_warm),
            disk: DiskGuard::new(&data_dir, settings.warm.disk_free_min_bytes),
            prefetch: crate::prefetcher::Prefetcher::new(
                settings.prefetch.prefetch,
                settings.prefetch.prefetch_fetches_max,
            ),
            next_segment_id: Mutex::new(next_segment_id(
                warm_tier.next_segment_id()?,
                settings.writer_epoch,
            )?),
            pins: parking_lot::RwLock::new(warm_tier.pins()?),
            settings,
            data_dir,
            clock,
            warm: warm_tier,
            vlog,
            cold,
            locks: Stripes::new(),
            counters,
            sizes,
            group,
            bucket,
            poisoned: Default::default(),
            closed: AtomicBool::new(false),
            demote_cursor: Mutex::new(Vec::new()),
            background_wake: Notify::new(),
            room: Notify::new(),
            rounds: tokio::sync::Mutex::new(()),
            background_error: Mutex::new(None),
            leases: Mutex::new(std::collections::HashMap::new()),
            tier_watch: Default::default(),
            load_model: Default::default(),
            gc_gate: tokio::sync::RwLock::new(()),
            after_read: Default::default(),
            writeback,
            live: Default::default(),
            write_seq: AtomicU64::new(seq_start),
            warm_value_bytes_avg: AtomicU64::new(0),
        });
        crate::settle::recover(&core)?;
        let weak = Arc::downgrade(&core);
        core.writeback
            .log()
            .set_deferred(Box::new(move || match weak.upgrade() {
                Some(core) => {
                    crate::fold::fold_all(&core, crate::fold::Fold::Logged)?;
                    Ok(crate::writeback::log_unlogged(&core))
                }
                None => Ok(true),
            }));
        let (tx, rx) = watch::channel(false);
        if core.settings.warm.durability == Durability::None {
            let period = std::time::Duration::from_millis(core.settings.warm.none_flush_ms);
            let hot_log = Arc::clone(core.writeback.log());
            let flush =
                crate::durability::flush_log_every(Arc::clone(&warm), hot_log, period, rx.clone());
            tokio::spawn(flush);
        }
        crate::ship::start(&core, rx.clone());
        crate::snapshot::start(&core, rx.clone());
        let handle =
            background.then(|| tokio::spawn(crate::background::run(Arc::clone(&core), rx)));
        crate::prefetch::start(&core);
        Ok(Engine {
            core,
            background: Arc::new(Mutex::new(handle)),
            shutdown: Arc::new(tx),
        })
    }

    /// Stops background work, syncs the log and flushes the warm store's memory to its
    /// files. Later calls fail with [`crate::Error::Closed`]. Data is safe without calling
    /// this; restart is just faster.
    pub async fn close(&self) -> Result<()> {
        let core = &self.core;
        if core.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.shutdown.send_replace(true);
        let handle = self.background.lock().take();
        if let Some(h) = handle {
            let _ = h.await;
        }
        core.after_read.settle().await;
        if let Some(b) = &core.bucket {
            // What changed since the last round reaches the bucket before the node goes.
            if let Err(e) = crate::ship::round(core, b).await {
                tracing::warn!(error = %e, "the bucket log's last round at close failed");
            }
        }
        // The hot log's values into the warm store, so a restart has nothing to replay; if
        // that fails, they stay in the hot log, which the next open replays.
        if let Err(e) = crate::settle::checkpoint(core) {
            tracing::warn!(error = %e, "checkpoint at close failed; the hot log keeps the values");
        }
        if let Some(g) = &core.group {
            g.stop();
        }
        let hot_log = core.writeback.log();
        hot_log.write_out(hot_log.mark(), true)?;
        core.sync_values_and_log()?;
        core.warm.store.flush()?;
        // Large values in DRAM hold the store open (they are its own buffers).
        core.hot.clear();
        Ok(())
    }

    /// Makes every write acknowledged before the call durable, whatever `durability` says
    /// (`SAVE`): DRAM's changes not yet logged are logged, then the value log, the warm
    /// store's log and the hot log are synced, in the order the group commit syncs them.
    pub async fn save(&self) -> Result<()> {
        self.core.check_writable()?;
        if let Some(g) = &self.core.group {
            // A round of the group commit covers every write so far, and a failed one stops
            // it (a second sync of the same logs, here, could succeed after the kernel
            // reported the first failure once, and acknowledge lost writes).
            return self.core.wait(g.request()).await;
        }
        let core = Arc::clone(&self.core);
        crate::offload::run("save", move || {
            let synced = crate::durability::sync_logs(
                core.warm.store.as_ref(),
                &core.vlog,
                core.writeback.log(),
                &mut None,
                &core.counters,
            );
            // As a failed group commit does: a write acknowledged after it may not be
            // durable, so no write is taken any more.
            synced.map_err(|e| {
                let e = e.to_string();
                tracing::error!(error = %e, "SAVE's fsync failed; refusing further writes");
                core.poisoned.set(e.clone());
                crate::Error::Poisoned(e)
            })
        })
        .await?
    }

    /// The settings the engine was opened with.
    pub fn settings(&self) -> &Settings {
        &self.core.settings
    }

    pub fn now_ms(&self) -> u64 {
        self.core.now_ms()
    }

    /// The stored key of `client` in database `db`.
    pub fn key(&self, db: u8, client: &[u8]) -> Key {
        self.core.key(self.core.warm.stored_db(db), client)
    }

    /// Databases `a` and `b` trade contents (`SWAPDB`): every tier's keys stay where they
    /// are, a durable map from client to stored database changes. The caller keeps other
    /// commands out while it runs.
    pub fn swap_dbs(&self, a: u8, b: u8) -> Result<()> {
        self.core.warm.swap_dbs(a, b)
    }

    /// What the server saved as `what` (an opaque payload), if anything.
    pub fn saved(&self, what: Saved) -> Result<Option<Bytes>> {
        self.core.warm.saved(what)
    }

    /// Saves the server's `what` durably (`None`: nothing); it is in backups with the rest
    /// of the warm store.
    pub fn save_server(&self, what: Saved, payload: Option<&[u8]>) -> Result<()> {
        self.core.warm.save(what, payload)
    }

    // Reads.

    /// Reads the string `key` from the first tier that holds it; a key of another kind is
    /// [`crate::Error::WrongType`].
    pub async fn get(&self, key: &Key) -> Result<Option<Bytes>> {
        match crate::read::get(&self.core, key).await? {
            Some((v, Kind::String)) => Ok(Some(v)),
            Some(_) => Err(crate::Error::WrongType),
            None => Ok(None),
        }
    }

    /// Reads `key`, of any kind, from the first tier that holds it: its kind and the
    /// value's bytes (what they mean for each kind is the caller's encoding).
    pub async fn get_value(&self, key: &Key) -> Result<Option<(Kind, Bytes)>> {
        Ok(crate::read::get(&self.core, key)
            .await?
            .map(|(v, kind)| (kind, v)))
    }

    /// [`Engine::get_value`] for a read that answers with a part of the value: `f` sees it
    /// lent from DRAM (under a lock: keep `f` short) or shared, never copied whole.
    pub async fn get_value_with<R>(
        &self,
        key: &Key,
        f: impl FnOnce(Kind, Source<'_>) -> Result<R>,
    ) -> Result<Option<R>> {
        crate::read::get_with(&self.core, key, f).await
    }

    /// [`Engine::get_value_with`] for a read of the items named `names` of a hash or a set
    /// (`HGET`, `HMGET`, `SISMEMBER`): a value stored as parts is read by those names, and
    /// `f` sees a value of its kind holding the ones found, not the whole value.
    pub async fn get_named_with<R, N: AsRef<[u8]>>(
        &self,
        key: &Key,
        names: &[N],
        f: impl FnOnce(Kind, Source<'_>) -> Result<R>,
    ) -> Result<Option<R>> {
        crate::read::get_named_with(&self.core, key, names, f).await
    }

    /// [`Engine::get_value_with`] for a read that a value stored as parts answers from
    /// what `asked` reads of it: its count from its record (`SCARD`, `ZCARD`, `LLEN`), a
    /// window of a sorted set from its score index (`ZRANGE`, `ZRANGEBYSCORE`, `ZCOUNT`:
    /// a walk of those entries alone), a span of a list from those parts (`LRANGE`,
    /// `LINDEX`). Then `f` is not called, and the [`Answer`] says what they gave.
    pub async fn get_asked_with<R>(
        &self,
        key: &Key,
        asked: crate::Asked<'_>,
        f: impl FnOnce(Kind, Source<'_>) -> Result<R>,
    ) -> Result<Option<Answer<R>>> {
        crate::read::get_asked_with(&self.core, key, asked, f).await
    }

    /// The kind of value `key` holds, if it holds a live one, without reading the value.
    pub async fn kind_of(&self, key: &Key) -> Result<Option<Kind>> {
        crate::read::kind_of(&self.core, key)
    }

    /// Reads many keys at once: DRAM for all, then one multi-get of the warm store, then
    /// the cold blocks concurrently (keys sharing a block share its fetch).
    /// [`Engine::get_value`] of many keys in one read (DRAM's shards in one pass, one
    /// multi-get per family for the rest): a pipeline's consecutive `GET`s. Refused as
    /// [`Engine::get_many_limited`] is past `bytes_max`.
    pub async fn get_values(
        &self,
        keys: &[&Key],
        bytes_max: u64,
    ) -> Result<Vec<Option<(Kind, Bytes)>>> {
        let got = crate::read::read_many(&self.core, keys, false, bytes_max).await?;
        Ok(got
            .into_iter()
            .map(|g| g.map(|(v, _, kind)| (kind, v)))
            .collect())
    }

    pub async fn get_many(&self, keys: &[&Key]) -> Result<Vec<Option<Bytes>>> {
        self.get_many_limited(keys, u64::MAX).await
    }

    /// As [`Engine::get_many`], also saying which tier served each value.
    pub async fn get_many_tiered(&self, keys: &[&Key]) -> Result<Vec<Option<(Bytes, Tier)>>> {
        let got = crate::read::read_many(&self.core, keys, false, u64::MAX).await?;
        Ok(got.into_iter().map(strings_only).collect())
    }

    /// As [`Engine::get_many`], but refused (`Error::Invalid`) when two or more values found
    /// hold more than `bytes_max` bytes in all, before any of them is fetched from the
    /// object store: one read's memory stays bounded.
    pub async fn get_many_limited(
        &self,
        keys: &[&Key],
        bytes_max: u64,
    ) -> Result<Vec<Option<Bytes>>> {
        let got = crate::read::read_many(&self.core, keys, false, bytes_max).await?;
        Ok(got
            .into_iter()
            .map(|v| strings_only(v).map(|(b, _)| b))
            .collect())
    }

    /// The values of the leading keys of `keys` that hold one, up to the first that does
    /// not (a KV-cache prefix is usable only contiguously), and no more than `bytes_max`
    /// bytes of them: the reply stops before the value that would pass it (but always
    /// holds the first value present), so a caller that gets fewer values than keys asks
    /// again from where it stopped. Nothing after the cut is fetched from the object store.
    pub async fn get_prefix(&self, keys: &[&Key], bytes_max: u64) -> Result<Vec<Bytes>> {
        let got = crate::read::read_many(&self.core, keys, true, bytes_max).await?;
        Ok(got
            .into_iter()
            .map_while(|v| strings_only(v).map(|(b, _)| b))
            .collect())
    }

    /// Whether `key` holds a live value, without reading a cold value.
    pub async fn exists(&self, key: &Key) -> Result<bool> {
        crate::read::exists(&self.core, key)
    }

    /// The absolute expiry of `key` in Unix ms: `None` if absent, `Some(0)` if it never
    /// expires.
    pub async fn expire_time_ms(&self, key: &Key) -> Result<Option<u64>> {
        crate::read::expire_time_ms(&self.core, key)
    }

    /// Which tier serves `key` now, if any.
    pub async fn tier_of(&self, key: &Key) -> Result<Option<Tier>> {
        Ok(self.locate(key).await?.map(|(t, _)| t))
    }

    /// Which tier serves `key` now and how many bytes its value holds, without reading it.
    pub async fn locate(&self, key: &Key) -> Result<Option<(Tier, u64)>> {
        crate::read::locate(&self.core, key)
    }

    /// For each leading key of `keys` that holds a live value, where that value lies in the
    /// value log (`None` if it is elsewhere: in the object store, or small enough to live
    /// in its record), for a reader on the same machine that maps the files itself; stops
    /// at the first key with no live value. Value-log entries are never changed in place,
    /// so a location stays valid for as long as its file exists (a reader with the file
    /// mapped keeps it after collection deletes it).
    pub fn locate_local(&self, keys: &[&Key]) -> Result<Vec<Option<LocalValue>>> {
        crate::read::locate_local(&self.core, keys)
    }

    /// Up to `count_max` live keys of database `db` in `[start, end)` in key order.
    pub fn scan(
        &self,
        db: u8,
        start: &[u8],
        end: Option<&[u8]>,
        count_max: usize,
    ) -> Result<ScanPage> {
        self.settle_writes()?;
        let db = self.core.warm.stored_db(db);
        crate::scan::scan(&self.core, db, start, end, count_max)
    }

    /// Up to `count_max` live string keys of database `db` from `lo` to `hi` with their
    /// values, in key order or (`rev`) the reverse, from every tier (`STRATA.RANGE`). Keys
    /// of other kinds are passed over, as is a key deleted between finding it and reading
    /// it. Refused as [`Engine::get_many_limited`] is past `bytes_max`, and in cluster mode
    /// (keys are kept by slot there, not in one order).
    pub async fn range(
        &self,
        db: u8,
        lo: crate::scan::RangeBound<'_>,
        hi: crate::scan::RangeBound<'_>,
        count_max: usize,
        rev: bool,
        bytes_max: u64,
    ) -> Result<Vec<(Bytes, Bytes)>> {
        if self.core.settings.key_slots {
            return Err(crate::Error::Invalid(
                "key ranges are not available in cluster mode (keys are kept by slot)".into(),
            ));
        }
        self.settle_beside().await;
        self.settle_writes()?;
        let stored_db = self.core.warm.stored_db(db);
        let found =
            crate::scan::range_keys(&self.core, stored_db, lo, hi, count_max, rev, bytes_max)?;
        // The warm keys' values came with the scan; the cold ones' are fetched, together.
        let cold: Vec<Key> = found
            .iter()
            .filter(|(_, v)| v.is_none())
            .map(|(f, _)| self.core.key(stored_db, &f.key))
            .collect();
        let refs: Vec<&Key> = cold.iter().collect();
        let mut fetched = crate::read::read_many(&self.core, &refs, false, bytes_max)
            .await?
            .into_iter();
        Ok(found
            .into_iter()
            .filter_map(|(f, v)| match v {
                Some(v) => Some((f.key, v)),
                // A key deleted (or rewritten as another kind) since the scan is passed over.
                None => match fetched.next().flatten() {
                    Some((v, _, Kind::String)) => Some((f.key, v)),
                    _ => None,
                },
            })
            .collect())
    }

    /// The first and the last key of database `db` in key order (any kind, live or not;
    /// `None` if it holds none), what `RANDOMKEY` draws a point between. What write-back
    /// holds is not there until it settles (as for [`Engine::scan`]). `None` in cluster
    /// mode, where keys are kept by slot, not in one order.
    pub fn key_ends(&self, db: u8) -> Result<Option<(Bytes, Bytes)>> {
        if self.core.settings.key_slots {
            return Ok(None);
        }
        self.settle_writes()?;
        crate::scan::key_ends(&self.core, self.core.warm.stored_db(db))
    }

    /// A page of keys of database `db` starting with `prefix`, resuming at `cursor` (a
    /// previous page's `next`).
    pub fn scan_prefix(
        &self,
        db: u8,
        prefix: &[u8],
        cursor: Option<&[u8]>,
        count_max: usize,
    ) -> Result<ScanPage> {
        self.settle_writes()?;
        let db = self.core.warm.stored_db(db);
        crate::scan::scan_prefix(&self.core, db, prefix, cursor, count_max)
    }

    /// A page of the keys of cluster slot `slot` in database `db` (cluster mode; outside
    /// it every key is in slot 0), resuming at `cursor` (a previous page's `next`).
    pub fn scan_slot(
        &self,
        db: u8,
        slot: u16,
        cursor: Option<&[u8]>,
        count_max: usize,
    ) -> Result<ScanPage> {
        self.settle_writes()?;
        let db = self.core.warm.stored_db(db);
        crate::scan::scan_slot(&self.core, db, slot, cursor.unwrap_or(b""), count_max)
    }

    // Writes: each hands back its result with the ticket to wait for before it is
    // acknowledged ([`Written::durable`], or [`Written::defer`] and [`Engine::wait`]).

    /// Waits until every write that returned `ticket` (or an earlier one) is durable. An
    /// error means the sync failed: those writes must not be acknowledged.
    pub async fn wait(&self, ticket: Ticket) -> Result<()> {
        self.core.wait(ticket).await
    }

    /// The general atomic read-modify-write. `f` sees the live entry (with its value when
    /// `want_value`; a cold value is fetched first) and returns the change to make, if any,
    /// and a result. `f` runs under the key's lock: keep it short.
    pub async fn update<R>(
        &self,
        key: &Key,
        want_value: bool,
        f: impl FnOnce(Option<Existing<'_>>) -> Result<(Option<Change>, R)>,
    ) -> Result<Written<R>> {
        crate::write::update(&self.core, key, want_value, f).await
    }

    /// The read-modify-write of a collection of `kind` at `key`, changed in place while it
    /// stays live in memory (see [`LiveValue`]): `decode` makes the value from its stored
    /// form (`None`: the key holds nothing), `f` changes it and says whether it did, and
    /// must change nothing when it fails. A value left empty deletes its key; the key keeps
    /// its expiry; another kind there is [`crate::Error::WrongType`].
    pub async fn update_live<R>(
        &self,
        key: &Key,
        kind: Kind,
        decode: impl Fn(Option<&Bytes>) -> Result<Box<dyn LiveValue>>,
        f: impl FnOnce(&mut dyn LiveValue) -> Result<(bool, R)>,
    ) -> Result<Written<R>> {
        crate::write::update_live(&self.core, key, kind, decode, f).await
    }

    /// A read of the collection of `kind` at `key` from its live value, which the read may
    /// create (a key read again soon): `f` sees it, under a lock (keep `f` short).
    /// `Ok(None)`: it has none, read the stored value ([`Engine::get_value_with`]).
    pub fn read_live<R>(
        &self,
        key: &Key,
        kind: Kind,
        decode: impl FnOnce(Option<&Bytes>) -> Result<Box<dyn LiveValue>>,
        f: impl FnOnce(&mut dyn LiveValue) -> R,
    ) -> Result<Option<R>> {
        crate::read::read_live(&self.core, key, kind, decode, f)
    }

    /// Stores `value` under `key`.
    pub async fn put(
        &self,
        key: &Key,
        value: Bytes,
        opts: PutOptions,
    ) -> Result<Written<PutResult>> {
        crate::write::put(&self.core, key, value, opts).await
    }

    /// Stores every pair, expiring at `expire_ms` (Unix ms; 0: never, what Redis's `MSET`
    /// does), in one batch: of a key given twice the last value wins; after a crash either
    /// all of them are there or none; and the batch costs one write and one durability wait
    /// instead of one per key.
    pub async fn put_many(&self, pairs: &[(&Key, Bytes)], expire_ms: u64) -> Result<Written<()>> {
        crate::write::put_many(&self.core, pairs, |_| expire_ms).await
    }

    /// [`Engine::put_many`] where only the first `expiring` pairs expire at `expire_ms`; the
    /// rest never do (a KV chunk's tokens, kept until the chunk's deletion is announced).
    pub async fn put_many_lasting(
        &self,
        pairs: &[(&Key, Bytes)],
        expire_ms: u64,
        expiring: usize,
    ) -> Result<Written<()>> {
        let expire_of = |i: usize| if i < expiring { expire_ms } else { 0 };
        crate::write::put_many(&self.core, pairs, expire_of).await
    }

    /// Deletes `key`; returns whether it held a live value.
    pub async fn delete(&self, key: &Key) -> Result<Written<bool>> {
        self.update(key, false, |cur| {
            Ok((cur.is_some().then_some(Change::Delete), cur.is_some()))
        })
        .await
    }

    /// Deletes each of `keys` (none named twice) in one batch; returns how many held a live
    /// value.
    pub fn delete_many(&self, keys: &[&Key]) -> Result<Written<usize>> {
        crate::write::delete_many(&self.core, keys)
    }

    /// Atomically adds `delta` to the integer stored at `key` (absent counts as 0) and
    /// returns the new value. Keeps the key's expiry.
    pub async fn incr_by(&self, key: &Key, delta: i64) -> Result<Written<i64>> {
        crate::write::incr_by(&self.core, key, delta).await
    }

    /// [`Engine::incr_by`] of many keys in order, as one batch (pipelined `INCR`s); each item
    /// has its own result.
    pub async fn incr_many(&self, items: &[(&Key, i64)]) -> Result<Written<Vec<Result<i64>>>> {
        crate::write::incr_many(&self.core, items).await
    }

    /// Sets (or with 0 removes) the absolute expiry of a live key; returns whether it
    /// exists.
    pub async fn set_expire(&self, key: &Key, expire_ms: u64) -> Result<Written<bool>> {
        self.update_expiry(key, move |cur| match cur {
            None => (None, false),
            Some(_) => (Some(expire_ms), true),
        })
        .await
    }

    /// Sets `key`'s absolute expiry (Unix ms) as `f` decides from the current one (`None`:
    /// absent; 0: none): `f` returns the new one (0: none; a past one deletes the key), or
    /// `None` to leave it, and a result. Cheaper than [`Engine::update`] for a key in DRAM
    /// or live (no write of the warm store). `f` may run twice: a function of the expiry
    /// alone.
    pub async fn update_expiry<R>(
        &self,
        key: &Key,
        f: impl Fn(Option<u64>) -> (Option<u64>, R),
    ) -> Result<Written<R>> {
        crate::write::update_expiry(&self.core, key, f).await
    }

    /// Deletes every key in every tier. Segments are collected by the background task.
    pub async fn flush_all(&self) -> Result<Written<()>> {
        crate::write::flush_all(&self.core)
    }

    /// Deletes every key of database `db` in every tier, a chunk of keys per batch; the
    /// other databases are untouched.
    pub async fn flush_db(&self, db: u8) -> Result<Written<()>> {
        crate::write::flush_db(&self.core, self.core.warm.stored_db(db)).await
    }

    /// Keys of database `db`, in both tiers (`DBSIZE`; a key past its expiry counts until
    /// it is removed, as in Redis).
    pub fn keys_in(&self, db: u8) -> u64 {
        let _ = self.settle_writes();
        self.core.warm.keys_in(self.core.warm.stored_db(db))
    }

    /// The keys of each client database below `databases` as they stand, writing nothing
    /// (`INFO`'s keyspace; [`Engine::keys_in`] settles write-back first and is exact): the
    /// warm store's count of records and cold index entries, plus write-back's live dirty
    /// keys that the key filter says the warm store does not hold. Off by the new keys the
    /// filter cannot rule out (a few in a hundred), the keys whose dirty value expired
    /// (still counted), and collections made in DRAM since the last group commit or tick.
    pub fn keys_by_db_now(&self, databases: usize) -> Vec<u64> {
        let core = &self.core;
        let mut client_of = [None; 256];
        let mut keys: Vec<u64> = (0..databases.min(256))
            .map(|db| {
                let stored = core.warm.stored_db(db as u8);
                client_of[stored as usize] = Some(db);
                core.warm.keys_in(stored)
            })
            .collect();
        let now = core.now_ms();
        for shard in 0..core.hot.shard_count() {
            core.hot.each_live_dirty_key_in(shard, now, |k| {
                let db = k.first().and_then(|&d| client_of[d as usize]);
                if let Some(db) = db.filter(|_| core.warm.surely_lacks(k)) {
                    keys[db] += 1;
                }
            });
        }
        keys
    }

    /// Before a client's write: waits while the `none` log hand-off runs late (past half
    /// its period), at most a period, so writes slow down instead of outrunning it; says
    /// whether it waited. No wait otherwise (one atomic load).
    pub async fn pace_writes(&self) -> bool {
        let period = std::time::Duration::from_millis(self.core.settings.warm.none_flush_ms);
        self.core.writeback.log().pace(period).await
    }

    /// Writes what write-back holds to the warm store on the runtime's blocking pool, so
    /// the clients served beside the caller go on meanwhile (a settle of a few hundred
    /// megabytes takes seconds, and on one core would hold up every client); the
    /// whole-keyspace reads that follow ([`Engine::keys_in`], the scans) then find little
    /// or nothing left to settle on the caller's thread. Nothing when nothing is held.
    pub async fn settle_beside(&self) {
        let core = &self.core;
        if core.writeback.dirty_bytes() == 0 && core.live.held() == 0 {
            return;
        }
        let core = Arc::clone(core);
        match tokio::task::spawn_blocking(move || crate::settle::settle_all(&core)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "write-back could not settle"),
            Err(e) => tracing::warn!(error = %e, "the settle task failed"),
        }
    }

    /// Writes what write-back holds to the warm store, before an operation that reads the
    /// warm store as a whole (scans, counts, backups, the change log).
    fn settle_writes(&self) -> Result<()> {
        crate::settle::settle_all(&self.core)
            .map(|_| ())
            .inspect_err(|e| tracing::warn!(error = %e, "write-back could not settle"))
    }

    // Tiering.

    /// Pins `pattern`: its keys stay warm from now on, and keys already cold are brought
    /// back. Refused when all pins together would hold more than `pinned_bytes_max`.
    /// Returns the value bytes the pattern holds.
    pub async fn pin(&self, pattern: &[u8]) -> Result<u64> {
        self.settle_beside().await;
        self.settle_writes()?;
        crate::pins::pin(&self.core, pattern).await
    }

    /// Removes a pin; returns whether it existed.
    pub fn unpin(&self, pattern: &[u8]) -> Result<bool> {
        crate::pins::unpin(&self.core, pattern)
    }

    /// The current pins.
    pub fn pins(&self) -> Vec<Bytes> {
        self.core.pins.read().clone()
    }

    /// Watches the keys starting with `prefix`: each one deleted, demoted to the object store
    /// or returned from it is handed to the receiver once committed (at most `bound` wait;
    /// more are dropped and counted, [`Engine::tier_changes_dropped`]). One watch per
    /// engine: `None` if there is one already.
    pub fn watch_tiers(
        &self,
        prefix: &[u8],
        bound: usize,
    ) -> Option<tokio::sync::mpsc::Receiver<crate::TierChange>> {
        let (w, rx) = crate::tierwatch::TierWatch::new(prefix, bound);
        self.core.tier_watch.set(w).ok().map(|_| rx)
    }

    /// Tier changes the watch dropped because its receiver fell behind.
    pub fn tier_changes_dropped(&self) -> u64 {
        self.core
            .tier_watch
            .get()
            .map_or(0, |w| w.dropped.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Keeps `keys` from being demoted to the cold tier until `until_ms` (a lease taken by
    /// a KV-cache prefix match, so the matched chunks stay quick to load). At most
    /// `LEASES_MAX` keys are leased at once; beyond that the oldest-expiring leases go.
    pub fn lease(&self, keys: &[&Key], until_ms: u64) {
        const LEASES_MAX: usize = 1 << 20;
        let mut l = self.core.leases.lock();
        let now = self.core.now_ms();
        if l.len() + keys.len() > LEASES_MAX {
            l.retain(|_, &mut t| t > now);
        }
        for k in keys.iter().take(LEASES_MAX.saturating_sub(l.len())) {
            let e = l.entry((*k).clone()).or_insert(0);
            *e = (*e).max(until_ms);
        }
    }

    /// Tells the prefetcher that client stream `stream` (a connection) read `key`: the
    /// transitions between a stream's keys train the Markov model. While the cold tier is
    /// empty there is nothing to prefetch, and reads pay nothing for it.
    pub fn note_access(&self, stream: u64, key: &Key) {
        if self.core.sizes.cold_entries.load(Ordering::Relaxed) > 0 {
            self.core.prefetch.note_access(stream, key);
        }
    }

    /// Forgets a stream's last key (its connection closed).
    pub fn end_stream(&self, stream: u64) {
        self.core.prefetch.end_stream(stream);
    }

    /// Expected microseconds to load values of these sizes from these tiers, from measured
    /// per-tier read costs (the formula is in `loadtime.rs` and `docs/kvcache.md`).
    pub fn expected_load_us(&self, reads: &[(Tier, u64)]) -> u64 {
        self.core.load_model.estimate_us(reads)
    }

    // Operations.

    /// Every figure the engine reports (see [`crate::stats::STATS`]), once what write-back
    /// holds is written to the warm store (so the warm tier's figures count it): for tests
    /// and tools. A server answers `INFO` and scrapes with [`Engine::stats_now`].
    pub fn stats(&self) -> Stats {
        let _ = self.settle_writes();
        self.stats_now()
    }

    /// Every figure as it stands, writing nothing: what write-back holds counts in
    /// `hot_dirty_bytes` and in the warm tier's figures only once written there. A scrape
    /// or an `INFO` costs no write, however much write-back holds.
    pub fn stats_now(&self) -> Stats {
        let core = &self.core;
        let mut s = Stats::default();
        core.counters.load_into(&mut s);
        let hot = core.hot.stats();
        let sizes = core.sizes.get();
        let vlog_files = core.vlog.files().unwrap_or_default();
        s.hot_entries = hot.entries;
        s.hot_bytes = hot.bytes;
        s.hot_bytes_max = hot.bytes_max;
        s.hot_dirty_bytes = core.writeback.dirty_bytes();
        s.live_values = core.live.held() as u64;
        s.live_bytes = core.live.bytes() as u64;
        s.warm_memory_bytes = core.warm.store.memory_bytes();
        let shares = core.warm.store.memory_shares();
        s.warm_memtables_bytes_max = shares.memtables_bytes_max;
        s.warm_block_cache_bytes_max = shares.block_cache_bytes;
        s.key_filter_bytes = core.warm.key_filter_bytes();
        s.hot_evictions = hot.evictions;
        s.warm_entries = sizes.warm_entries as u64;
        s.warm_bytes = sizes.warm_bytes as u64;
        s.warm_bytes_max = core.settings.warm.warm_bytes_max;
        s.warm_bytes_hard_max = core.settings.warm.warm_hard_limit();
        s.cold_entries = sizes.cold_entries as u64;
        s.cold_bytes = sizes.cold_bytes as u64;
        s.vlog_files = vlog_files.len() as u64;
        s.vlog_bytes = vlog_files.iter().map(|f| f.1).sum();
        s.wal_bytes_dropped = core.warm.store.log_bytes_dropped_at_open();
        s.object_store_reads_in_flight_peak = core.cold.reads_in_flight_peak();
        s.prefetch_fetch_window = core.prefetch.fetch_limit() as u64;
        s.change_log_sequence = core.warm.store.last_sequence();
        s
    }

    /// Where the cold tier is, as `INFO` shows it.
    pub fn cold_url(&self) -> &str {
        &self.core.cold.url
    }

    /// DRAM's budget now.
    pub fn hot_bytes_max(&self) -> u64 {
        self.core.hot.bytes_max() as u64
    }

    /// Sets DRAM's budget (at most `hot_bytes_max`) and evicts down to it: what a process
    /// memory limit moves under pressure. Write-back's share follows it.
    pub fn set_hot_bytes_max(&self, bytes: u64) {
        self.core.hot.set_bytes_max(bytes as usize);
    }

    /// Bytes DRAM holds now.
    pub fn hot_bytes(&self) -> u64 {
        self.core.hot.bytes() as u64
    }

    /// Moves DRAM's small entries to fresh allocations, so the allocator can pack them onto
    /// fewer pages (`HotCache::relocate`); `between` runs after each chunk of entries, with
    /// no lock held. Returns the bytes moved.
    pub fn relocate_hot(&self, between: &dyn Fn()) -> u64 {
        self.core.hot.relocate(between) as u64
    }

    /// What the warm store's memtables and block cache may hold now.
    pub fn warm_memory_shares(&self) -> MemoryShares {
        self.core.warm.store.memory_shares()
    }

    /// Changes what the warm store's memtables and block cache may hold (a process memory
    /// limit changed at run time).
    pub fn set_warm_memory_shares(&self, shares: MemoryShares) -> Result<()> {
        Ok(self.core.warm.store.set_memory_shares(shares)?)
    }

    /// Drops every cached value from DRAM (tests use it to force reads from lower tiers).
    pub fn clear_hot(&self) {
        let _ = self.settle_writes();
        self.core.hot.clear();
    }

    /// Writes into this store what a lost node's bucket log leaves the keys of the slots
    /// `wanted` accepts holding: `objects` are what [`crate::bucket_replay`] reads of its
    /// log. Each key is written as this node's own write, and acknowledged as durable.
    /// Returns how many keys it wrote or deleted.
    pub async fn adopt(
        &self,
        objects: &[Bytes],
        wanted: &(dyn Fn(u16) -> bool + Sync),
    ) -> Result<u64> {
        crate::adopt::adopt(&self.core, objects, wanted).await
    }

    /// Waits (at most `timeout`) until the bucket log holds every write acknowledged
    /// before the call (`WAIT`); whether it does. `false` at once for a store that ships
    /// to no bucket.
    pub async fn wait_bucket(&self, timeout: std::time::Duration) -> bool {
        match &self.core.bucket {
            Some(b) => b.flushed_within(timeout).await,
            None => false,
        }
    }

    /// The object store of the cold tier (and of the bucket log).
    pub fn bucket(&self) -> Arc<dyn ObjectStore> {
        self.core.cold.store()
    }

    /// Runs one round of background work now: expire, demote until warm is under budget,
    /// collect segments. Returns the number of keys demoted.
    pub async fn run_background_once(&self) -> Result<u64> {
        crate::settle::checkpoint(&self.core)?;
        crate::background::round(&self.core, true).await
    }

    /// Compacts write-back's log now: the dirty values logged again into a new file, the
    /// older files deleted, nothing written to the warm store (the background task does
    /// this when the log grows; tests call it to see it happen). Returns how many values it
    /// logged again.
    pub fn compact_hot_log(&self) -> Result<u64> {
        crate::settle::compact(&self.core)
    }

    /// Waits until what reads left to do after them (returns to the warm tier, prefetches)
    /// is done: tests and replays use it to see the state reads leave.
    pub async fn settle(&self) {
        self.core.after_read.settle().await;
    }

    /// Writes a consistent snapshot of the store to `to` (`file:///dir` or
    /// `s3://bucket/prefix`, with this store's S3 settings). Runs while the store serves.
    pub async fn backup(&self, to: &str, progress: Progress<'_>) -> Result<BackupSummary> {
        self.settle_writes()?;
        crate::backup::backup(&self.core, to, progress).await
    }

    /// The sequence number of the latest committed change.
    pub fn last_sequence(&self) -> u64 {
        let _ = self.settle_writes();
        self.core.warm.store.last_sequence()
    }

    /// The changes committed after sequence `after`, at most `batches_max` batches, oldest
    /// first; pass the last one's `sequence` back to read on. Values in the value log are
    /// read out; an error says when the log no longer reaches back that far.
    pub fn changes_after(&self, after: u64, batches_max: usize) -> Result<Vec<ChangeEvent>> {
        self.settle_writes()?;
        crate::changes::changes_after(&self.core, after, batches_max)
    }
}
