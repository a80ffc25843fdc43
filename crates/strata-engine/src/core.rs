//! The coordinator's state: the tiers, each a component with one job, and the little they
//! share (stripe locks, counters, settings, time). What the engine does with them lives in
//! its own modules as functions of `&Core`: `read`, `write`, `hook` (what a read leaves
//! behind), `returns`, `prefetch`, `background`, `pins`, `scan`, `backup`, `changes`; none
//! of them is imported here, so the modules form layers, not a circle.
//!
//! The one direction between tiers: values move down only through demotion (warm → cold,
//! `background::demote`) and up only through reads (cold → warm → DRAM, `hook`); DRAM holds
//! copies of what the warm store holds or indexes, or of what write-back holds for it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use strata_format::{BlockRef, Key, Kind};
use strata_hot::{Got, HotCache};
use tokio::sync::Notify;

use crate::access::AccessCounts;
use crate::bucket::{BucketLog, Flush};
use crate::cold::Cold;
use crate::disk::DiskGuard;
use crate::durability::{GroupCommit, Ticket};
use crate::loadtime::LoadModel;
use crate::locks::Stripes;
use crate::settings::{Durability, Settings};
use crate::stats::{add, Counters};
use crate::vlog::ValueLog;
use crate::warm::{Counts, Stored, Want, Warm};
use crate::writeback::state::WriteBack;
use crate::{Clock, Error, Result};

/// What [`Core::hot_get_many`] found for one key.
pub(crate) enum HotGot {
    /// A live value in DRAM and its kind.
    Value(Bytes, Kind),
    /// A dirty entry past its expiry: the key is gone, whatever the warm store holds.
    Expired,
    /// Nothing in DRAM and nothing write-back holds.
    Missing,
}

fn hot_got(g: Got) -> Result<HotGot> {
    Ok(match g {
        Got::Value(v, _, tag) => HotGot::Value(v, Kind::from_u8(tag)?),
        Got::Expired => HotGot::Expired,
        Got::Missing => HotGot::Missing,
    })
}

/// The sizes of the warm and cold tiers, kept in memory beside their persistent copy (the
/// `Meta` counters, moved in the same batch as the data they count).
#[derive(Default)]
pub(crate) struct TierSizes {
    pub(crate) warm_bytes: AtomicI64,
    pub(crate) warm_entries: AtomicI64,
    pub(crate) cold_bytes: AtomicI64,
    pub(crate) cold_entries: AtomicI64,
}

impl TierSizes {
    pub(crate) fn set(&self, c: Counts) {
        self.warm_bytes.store(c.warm_bytes, Ordering::Relaxed);
        self.warm_entries.store(c.warm_entries, Ordering::Relaxed);
        self.cold_bytes.store(c.cold_bytes, Ordering::Relaxed);
        self.cold_entries.store(c.cold_entries, Ordering::Relaxed);
    }
    pub(crate) fn add(&self, d: &Counts) {
        self.warm_bytes.fetch_add(d.warm_bytes, Ordering::Relaxed);
        self.warm_entries
            .fetch_add(d.warm_entries, Ordering::Relaxed);
        self.cold_bytes.fetch_add(d.cold_bytes, Ordering::Relaxed);
        self.cold_entries
            .fetch_add(d.cold_entries, Ordering::Relaxed);
    }
    pub(crate) fn warm_bytes(&self) -> u64 {
        self.warm_bytes.load(Ordering::Relaxed).max(0) as u64
    }
    pub(crate) fn get(&self) -> Counts {
        let ld = |a: &AtomicI64| a.load(Ordering::Relaxed).max(0);
        Counts {
            warm_bytes: ld(&self.warm_bytes),
            warm_entries: ld(&self.warm_entries),
            cold_bytes: ld(&self.cold_bytes),
            cold_entries: ld(&self.cold_entries),
        }
    }
}

pub(crate) struct Core {
    pub(crate) settings: Settings,
    pub(crate) data_dir: PathBuf,
    pub(crate) clock: Arc<dyn Clock>,
    /// DRAM: copies of what the warm store holds or indexes, and write-back's dirty values.
    pub(crate) hot: Arc<HotCache>,
    /// The warm store and the engine's key layout on it.
    pub(crate) warm: Warm,
    /// Large warm values, beside the warm store.
    pub(crate) vlog: Arc<ValueLog>,
    /// The object store.
    pub(crate) cold: Arc<Cold>,
    pub(crate) locks: Stripes,
    pub(crate) counters: Arc<Counters>,
    pub(crate) sizes: TierSizes,
    /// Group commit, when `durability = group` or `bucket`.
    pub(crate) group: Option<Arc<GroupCommit>>,
    /// The bucket log, when this node ships its changes to the bucket.
    pub(crate) bucket: Option<Arc<BucketLog>>,
    /// Why writes are refused, after a failed sync.
    pub(crate) poisoned: Poison,
    pub(crate) closed: AtomicBool,
    /// The warm tier's clock hand: per-key read counts, and where the hand stopped.
    pub(crate) access: AccessCounts,
    pub(crate) demote_cursor: Mutex<Vec<u8>>,
    pub(crate) next_segment_id: Mutex<u64>,
    /// Wakes the background task early: the warm tier passed its budget, or a flush.
    pub(crate) background_wake: Notify,
    /// Held for the whole of each background round (the task's, or one run on request):
    /// rounds never overlap, so a segment id below `next_segment_id` without a record is
    /// an orphan, never another round's upload in flight.
    pub(crate) rounds: tokio::sync::Mutex<()>,
    /// Notified after each demotion commit: writes waiting at the hard limit look again.
    pub(crate) room: Notify,
    /// Why the last background round failed (cleared by the next one that succeeds): what a
    /// write refused at the hard limit says.
    pub(crate) background_error: Mutex<Option<String>>,
    /// Key patterns whose keys are never demoted.
    pub(crate) pins: parking_lot::RwLock<Vec<Bytes>>,
    /// Keys that may not be demoted before the given Unix ms (KV-cache leases).
    pub(crate) leases: Mutex<std::collections::HashMap<Key, u64>>,
    /// Whoever watches the tier changes of a key prefix (`Engine::watch_tiers`).
    pub(crate) tier_watch: std::sync::OnceLock<crate::tierwatch::TierWatch>,
    pub(crate) load_model: LoadModel,
    pub(crate) disk: DiskGuard,
    /// Held for reading by a backup while it copies; segment collection skips its round
    /// while it cannot take it for writing.
    pub(crate) gc_gate: tokio::sync::RwLock<()>,
    /// What reads leave behind, done after them (see `hook`).
    pub(crate) after_read: crate::queue::AfterRead,
    pub(crate) prefetch: crate::prefetcher::Prefetcher,
    /// Values written to DRAM and the hot log, not yet to the warm store.
    pub(crate) writeback: WriteBack,
    /// Collections changed in place, ahead of what is stored (see `live`).
    pub(crate) live: crate::live::state::Live,
    /// Sequence of per-write ids: only needs to differ from every earlier record's.
    pub(crate) write_seq: AtomicU64,
    /// Average size of recent warm values (decides whether a warm batch is split).
    pub(crate) warm_value_bytes_avg: AtomicU64,
}

impl Core {
    /// The stored key of `client` in stored database `db`: in cluster mode with its slot,
    /// otherwise in slot 0.
    pub(crate) fn key(&self, db: u8, client: &[u8]) -> Key {
        let slot = if self.settings.key_slots {
            strata_format::keys::slot_of(client)
        } else {
            0
        };
        Key::new(db, slot, client)
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The clock as [`LazyNow`]: read when first asked.
    pub(crate) fn lazy_now(&self) -> LazyNow<'_> {
        LazyNow {
            core: self,
            at: std::cell::Cell::new(None),
        }
    }

    pub(crate) fn check_writable(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        self.poisoned.check()
    }

    /// Whether a client's write is synced before it returns (`durability = sync`).
    pub(crate) fn syncs_client_writes(&self) -> bool {
        self.settings.warm.durability == Durability::Sync
    }

    /// The ticket of a write just committed (empty unless group commit covers it).
    pub(crate) fn ticket(&self) -> Ticket {
        self.group.as_ref().map_or(Ticket::NONE, |g| g.request())
    }

    /// Waits until the group commit has synced `ticket`, and with `durability = bucket`
    /// until the bucket log holds it too.
    pub(crate) async fn wait(&self, ticket: Ticket) -> Result<()> {
        let (Some(g), false) = (&self.group, ticket.is_none()) else {
            return Ok(());
        };
        let poison = |e: &Error| {
            if let Error::Poisoned(m) = e {
                self.poisoned.set(m.clone());
            }
        };
        g.wait(ticket).await.inspect_err(poison)?;
        match (&self.bucket, self.settings.warm.durability) {
            (Some(b), Durability::Bucket) => b.wait(ticket.0).await.inspect_err(poison),
            _ => Ok(()),
        }
    }

    /// Notes for the bucket log that `key` changed (under its stripe lock, before the
    /// write's ticket is taken).
    pub(crate) fn changed(&self, key: &Key) {
        if let Some(b) = &self.bucket {
            b.mark(key);
        }
    }

    /// Notes for the bucket log a flush of stored database `db` (`None`: all of them).
    pub(crate) fn flushed(&self, db: Option<u8>) {
        if let Some(b) = &self.bucket {
            b.mark_flush(db.map_or(Flush::All, Flush::Db));
        }
    }

    /// Makes every write so far durable: the value log first, then the log whose records
    /// point into it.
    pub(crate) fn sync_values_and_log(&self) -> Result<()> {
        self.vlog.sync()?;
        self.warm.sync_log()
    }

    pub(crate) fn is_leased(&self, key: &Key, now_ms: u64) -> bool {
        let l = self.leases.lock();
        !l.is_empty() && l.get(key).is_some_and(|&t| t > now_ms)
    }

    /// Puts a value read from warm or cold into DRAM, unless a write touched the key since
    /// `seen_version` was read (then the value may be stale). Says whether it went in.
    pub(crate) fn insert_hot_if_unchanged(
        &self,
        key: &Key,
        seen_version: u64,
        value: Bytes,
        kind: Kind,
        expire_ms: u64,
    ) -> bool {
        let _g = self.locks.lock(key);
        self.locks.version(key) == seen_version
            && !self.writeback.has_dirty(key)
            && self
                .hot
                .insert_tagged(key.stored(), value, expire_ms, kind as u8)
    }

    /// [`Core::hot_get`] of many keys, in one pass over DRAM's shards; a key with no live
    /// value says whether write-back holds it as expired ([`HotGot::Expired`]).
    pub(crate) fn hot_get_many(&self, keys: &[&Key], now_ms: u64) -> Result<Vec<HotGot>> {
        let stored: Vec<&[u8]> = keys.iter().map(|k| k.stored()).collect();
        self.hot
            .get_many(&stored, now_ms)
            .into_iter()
            .map(hot_got)
            .collect()
    }

    /// The DRAM copy of `key`, live at `now_ms`, or whether write-back holds it as expired.
    pub(crate) fn hot_get(&self, key: &Key, now_ms: u64) -> Result<HotGot> {
        hot_got(self.hot.find(key.stored(), now_ms))
    }

    /// The stored entry of `key` (expired or not), with what `want` asks of a warm entry's
    /// value, verified (a failure counts as a checksum error).
    ///
    /// The record and the index entry are two reads: a write that moves the key from the
    /// index to a record between them (a cold value's return) would leave neither seen. A
    /// commit keeps the key's stripe version odd while it runs and moves it, so when neither
    /// is found and the version was odd or moved, the lookup is done again; the third time
    /// under the stripe lock (callers that hold it never get there: nothing moves the
    /// version under them).
    pub(crate) fn lookup(&self, key: &Key, want: Want) -> Result<Option<Stored>> {
        let once = || {
            self.warm
                .lookup(key, want, &self.vlog)
                .inspect_err(|e| self.count_data_error(e))
        };
        for _ in 0..2 {
            let seen = self.locks.version(key);
            let got = once()?;
            if got.is_some() || self.locks.unchanged(key, seen) {
                return Ok(got);
            }
        }
        let _g = self.locks.lock(key);
        once()
    }

    /// Counts `e` as a checksum error if it is one: stored bytes that failed verification.
    pub(crate) fn count_data_error(&self, e: &Error) {
        if matches!(e, Error::Data(_)) {
            add(&self.counters.checksum_errors);
        }
    }

    /// The stored entries of many keys, without values (see [`Core::lookup`]).
    pub(crate) fn lookup_many(&self, keys: &[&Key]) -> Result<Vec<Option<Stored>>> {
        self.warm
            .lookup_many(keys, &self.vlog)
            .inspect_err(|e| self.count_data_error(e))
    }

    /// Fetches a cold key's value through its block; with it, the whole decompressed block.
    pub(crate) async fn fetch_cold(&self, key: &Key, r: &BlockRef) -> Result<(Bytes, Bytes)> {
        let block = self
            .cold
            .get_block(r)
            .await
            .inspect_err(|e| self.count_data_error(e))?;
        Ok((self.value_in_block(key, r, &block)?, block))
    }

    /// `key`'s value in `block`, the decompressed block `r` names (a copy).
    pub(crate) fn value_in_block(&self, key: &Key, r: &BlockRef, block: &Bytes) -> Result<Bytes> {
        match strata_format::find_in_block(block, entry_key(r, key)) {
            Ok(Some(e)) if e.kind == r.kind => Ok(Bytes::copy_from_slice(e.value)),
            Ok(Some(e)) => {
                add(&self.counters.checksum_errors);
                Err(Error::Data(format!(
                    "segment {:016x} block {} holds a {} where the index says {}",
                    r.segment_id,
                    r.block,
                    e.kind.name(),
                    r.kind.name()
                )))
            }
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
}

/// The key under which a segment of `r`'s layout holds `key`: the stored key, or in
/// segments of layout 1 the client's key.
pub(crate) fn entry_key<'a>(r: &BlockRef, key: &'a Key) -> &'a [u8] {
    match r.layout {
        1 => key.client(),
        _ => key.stored(),
    }
}

/// The stored key of an entry of a block of `r`'s layout.
pub(crate) fn key_of_entry(r: &BlockRef, entry_key: &[u8]) -> Result<Key> {
    match r.layout {
        1 => Ok(Key::from_layout_1(entry_key)),
        _ => Ok(Key::from_stored(entry_key)?),
    }
}

/// Why writes are refused after a failed sync, if they are: a flag every write reads (no
/// lock on the write's path) and the reason beside it.
#[derive(Default)]
pub(crate) struct Poison {
    set: AtomicBool,
    why: Mutex<Option<String>>,
}

impl Poison {
    pub(crate) fn set(&self, why: String) {
        *self.why.lock() = Some(why);
        self.set.store(true, Ordering::Release);
    }

    /// `Err(Poisoned)` once [`Poison::set`].
    pub(crate) fn check(&self) -> Result<()> {
        if !self.set.load(Ordering::Acquire) {
            return Ok(());
        }
        let why = self.why.lock().clone().unwrap_or_default();
        Err(Error::Poisoned(why))
    }
}

/// The clock, read once, and only if something asks (most keys do not expire).
pub(crate) struct LazyNow<'a> {
    core: &'a Core,
    at: std::cell::Cell<Option<u64>>,
}

impl LazyNow<'_> {
    pub(crate) fn get(&self) -> u64 {
        match self.at.get() {
            Some(now) => now,
            None => {
                let now = self.core.now_ms();
                self.at.set(Some(now));
                now
            }
        }
    }
}
