//! Strata's DRAM tier: a concurrent, sharded cache with an honest byte budget.
//!
//! The cache holds copies of values whose durable home is the warm or the cold tier, so an
//! eviction never loses data and needs no write-back. Each shard is a hash table over a
//! dense array of compact entries: a small value is packed with its key into one
//! allocation, and each entry carries its own eviction state ([`PolicyKind`]), so the policy
//! costs no memory or cache misses of its own. What it is not: a store. It does no I/O,
//! knows nothing of RocksDB, and keeps nothing across restarts.
//!
//! ```
//! use strata_hot::{HotCache, PolicyKind};
//! let cache = HotCache::new(1 << 20, 4, PolicyKind::Lru);
//! cache.insert(b"k", bytes::Bytes::from_static(b"v"), 0);
//! assert_eq!(cache.get(b"k", 0).unwrap().0, "v");
//! ```

mod entry;
mod shard;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;

use entry::Data;
pub use entry::{prefetch, INLINE_VALUE_BYTES_MAX};
pub use shard::PolicyKind;
use shard::Shard;

/// Bytes charged per entry on top of key and value: the entry (three words), its slot in
/// the hash table and the spare room of the table and the array, the packed block's header
/// and the allocator's. `strata-bench memory` measures what an entry really costs.
pub const ENTRY_OVERHEAD_BYTES: usize = 64;
/// Entries a drain of unlogged values visits per hold of a shard's lock.
const DRAIN_CHUNK: usize = 256;
/// How many entries ahead of the one it logs a drain fetches.
const DRAIN_AHEAD: usize = 8;
/// Stale hashes a shard's list of unlogged entries may hold beyond twice its entries.
const UNLOGGED_SLACK: usize = 1024;

/// A snapshot of the cache's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HotStats {
    pub entries: u64,
    pub bytes: u64,
    pub bytes_max: u64,
    pub evictions: u64,
    pub rejected: u64,
}

/// What [`HotCache::get_many`] found for one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Got {
    /// A live entry: its value, expiry and tag.
    Value(Bytes, u64, u8),
    /// A dirty entry past its expiry: write-back holds the key as gone.
    Expired,
    /// No entry (or a clean one past its expiry, dropped).
    Missing,
}

impl Got {
    /// The live value, expiry and tag, if any.
    pub fn live(self) -> Option<(Bytes, u64, u8)> {
        match self {
            Got::Value(v, e, t) => Some((v, e, t)),
            _ => None,
        }
    }
}

/// Entries [`HotCache::relocate`] moves under one hold of a shard's lock: a few
/// milliseconds of copying at most, and at most this many values' bytes held twice.
pub const RELOCATE_CHUNK: usize = 4096;

/// The sharded DRAM cache.
pub struct HotCache {
    shards: Box<[Mutex<Shard>]>,
    hasher: ahash::RandomState,
    /// The budget it was made with: the most `bytes_max` may be, and what decides whether an
    /// entry is small enough to hold ([`HotCache::fits`]).
    bytes_cap: usize,
    /// The budget now ([`HotCache::set_bytes_max`] lowers it under memory pressure).
    bytes_max: AtomicUsize,
    /// Bytes held by all shards together; the budget is global, so one large value may
    /// take more than its shard's share.
    used: AtomicUsize,
    /// Bytes held by each shard, as of its last change (read without its lock, to find
    /// the shard that should give way).
    loads: Box<[AtomicUsize]>,
    /// Bytes of dirty entries (included in `used`).
    dirty: AtomicUsize,
    /// Hashes in the shards' lists of unlogged entries (0: a drain has nothing to do).
    unlogged: AtomicUsize,
    evictions: AtomicU64,
    rejected: AtomicU64,
}

/// What an entry of `key_len` and `value_len` bytes counts against the budget.
pub fn charge(key_len: usize, value_len: usize) -> usize {
    key_len + value_len + ENTRY_OVERHEAD_BYTES
}

fn data_charge(data: &Data) -> usize {
    data.len() + ENTRY_OVERHEAD_BYTES
}

impl HotCache {
    /// A cache of at most `bytes_max` bytes (keys, values and [`ENTRY_OVERHEAD_BYTES`] each),
    /// split over `shard_count` shards, each evicting by `policy`.
    pub fn new(bytes_max: usize, shard_count: usize, policy: PolicyKind) -> Self {
        let shard_count = shard_count.clamp(1, 1024);
        HotCache {
            shards: (0..shard_count)
                .map(|i| Mutex::new(Shard::new(i, policy)))
                .collect(),
            hasher: ahash::RandomState::new(),
            bytes_cap: bytes_max,
            bytes_max: AtomicUsize::new(bytes_max),
            used: AtomicUsize::new(0),
            loads: (0..shard_count).map(|_| Default::default()).collect(),
            dirty: AtomicUsize::new(0),
            unlogged: AtomicUsize::new(0),
            evictions: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
        }
    }

    fn shard_of(&self, hash: u64) -> &Mutex<Shard> {
        &self.shards[self.shard_index(hash)]
    }

    fn shard_index(&self, hash: u64) -> usize {
        // The table uses the hash's low bits and its top seven; the shard takes others.
        ((hash >> 32) % self.shards.len() as u64) as usize
    }

    /// Records `sh`'s bytes for `trim` (called with its lock held, after every change).
    fn publish(&self, sh: &Shard) {
        self.loads[sh.index].store(sh.bytes, Ordering::Relaxed);
    }

    /// Takes `slot` out of `sh`, moving the figures.
    fn remove_slot(&self, sh: &mut Shard, slot: usize) {
        let gone = sh.remove(slot, &self.hasher);
        self.forget(sh, &gone);
    }

    /// Moves the figures for `gone`, taken out of `sh`.
    fn forget(&self, sh: &mut Shard, gone: &shard::Entry) {
        let c = data_charge(&gone.data);
        sh.bytes -= c;
        self.used.fetch_sub(c, Ordering::Relaxed);
        if gone.dirty {
            self.dirty.fetch_sub(c, Ordering::Relaxed);
        }
    }

    /// Runs `f` on `key`'s entry, with its shard locked.
    fn with_entry<T>(&self, key: &[u8], f: impl FnOnce(&mut Shard, usize) -> T) -> Option<T> {
        let hash = self.hasher.hash_one(key);
        let mut sh = self.shard_of(hash).lock();
        let slot = sh.find(hash, key)?;
        Some(f(&mut sh, slot))
    }

    /// Runs `f` on `key`'s live entry, with its shard locked. An expired clean entry is
    /// dropped; an expired dirty one stays (it says the key is gone) for its owner to settle.
    fn with_live<T>(
        &self,
        key: &[u8],
        now_ms: u64,
        f: impl FnOnce(&mut Shard, usize) -> T,
    ) -> Option<T> {
        self.with_live_or_why(key, now_ms, f).ok()
    }

    /// [`HotCache::with_live`] that says why there is no live entry: none
    /// ([`Got::Missing`]) or a dirty one past its expiry ([`Got::Expired`]).
    fn with_live_or_why<T>(
        &self,
        key: &[u8],
        now_ms: u64,
        f: impl FnOnce(&mut Shard, usize) -> T,
    ) -> Result<T, Got> {
        let hash = self.hasher.hash_one(key);
        let mut sh = self.shard_of(hash).lock();
        let Some(slot) = sh.find(hash, key) else {
            return Err(Got::Missing);
        };
        let e = sh.entry(slot);
        if !e.data.is_live(now_ms) {
            if e.dirty {
                return Err(Got::Expired);
            }
            self.remove_slot(&mut sh, slot);
            self.publish(&sh);
            return Err(Got::Missing);
        }
        Ok(f(&mut sh, slot))
    }

    /// The value, expiry and tag of `key`, if cached and not expired at `now_ms`; counts
    /// as an access.
    pub fn get(&self, key: &[u8], now_ms: u64) -> Option<(Bytes, u64, u8)> {
        self.find(key, now_ms).live()
    }

    /// [`HotCache::get`] that also says whether a dirty entry past its expiry is there
    /// ([`Got::Expired`]): a miss needs no second look-up.
    pub fn find(&self, key: &[u8], now_ms: u64) -> Got {
        let got = self.with_live_or_why(key, now_ms, |sh, slot| {
            sh.touch(slot);
            let e = sh.entry(slot);
            Got::Value(e.value(), e.data.expire_ms(), e.tag)
        });
        got.unwrap_or_else(|why| why)
    }

    /// [`HotCache::get`] that lends the value to `f` (with its tag) under the shard's lock
    /// instead of handing out a copy: for a read that answers with a part of it. Keep `f`
    /// short.
    pub fn read_with<T>(
        &self,
        key: &[u8],
        now_ms: u64,
        f: impl FnOnce(&[u8], u8) -> T,
    ) -> Option<T> {
        self.read_with_or_why(key, now_ms, f).ok()
    }

    /// [`HotCache::read_with`] that says why `f` did not run: no entry ([`Got::Missing`])
    /// or a dirty one past its expiry ([`Got::Expired`]: the key is gone, whatever the
    /// tiers below hold).
    pub fn read_with_or_why<T>(
        &self,
        key: &[u8],
        now_ms: u64,
        f: impl FnOnce(&[u8], u8) -> T,
    ) -> Result<T, Got> {
        self.with_live_or_why(key, now_ms, |sh, slot| {
            sh.touch(slot);
            let e = sh.entry(slot);
            f(e.data.value(), e.tag)
        })
    }

    /// [`HotCache::get`] of many keys at once. The shards they fall in are locked together
    /// (in shard order; no other path holds two), every key's entry is prefetched before
    /// any is compared, and every key is looked up before any value is copied out: the
    /// processor overlaps the batch's cache misses instead of waiting for one after
    /// another. Expired entries are dropped at the end. The small values found share one
    /// buffer: a caller that keeps one of them long should copy it. A key with no live
    /// entry says whether a dirty one past its expiry is there ([`Got::Expired`]), so a
    /// miss needs no second look-up.
    pub fn get_many(&self, keys: &[&[u8]], now_ms: u64) -> Vec<Got> {
        let (hashes, mut guards, guard_of) = self.lock_shards_of(keys);
        for (&h, &g) in hashes.iter().zip(&guard_of) {
            guards[g].prefetch(h);
        }
        let slots: Vec<Option<usize>> = keys
            .iter()
            .zip(&hashes)
            .zip(&guard_of)
            .map(|((k, &h), &g)| guards[g].find(h, k))
            .collect();
        let mut expired = Vec::new();
        let mut expired_dirty = Vec::new();
        let mut live = Vec::with_capacity(keys.len());
        let mut packed_bytes = 0;
        for (i, slot) in slots.into_iter().enumerate() {
            let sh = &mut guards[guard_of[i]];
            live.push(slot.filter(|&slot| {
                let e = sh.entry(slot);
                if !e.data.is_live(now_ms) {
                    match e.dirty {
                        true => expired_dirty.push(i),
                        false => expired.push(i),
                    }
                    return false;
                }
                if e.data.shared().is_none() {
                    packed_bytes += e.data.value().len();
                }
                sh.touch(slot);
                true
            }));
        }
        // Packed values are copied into one buffer that their handles share: one
        // allocation for the batch, not one per value.
        let mut arena = BytesMut::with_capacity(packed_bytes);
        let mut found = Vec::with_capacity(keys.len());
        for (i, slot) in live.into_iter().enumerate() {
            found.push(slot.map(|slot| {
                let e = guards[guard_of[i]].entry(slot);
                let value = match e.data.shared() {
                    Some(v) => Err(v.clone()),
                    None => {
                        let at = arena.len();
                        arena.extend_from_slice(e.data.value());
                        Ok(at..arena.len())
                    }
                };
                (value, e.data.expire_ms(), e.tag)
            }));
        }
        let arena = arena.freeze();
        let mut out: Vec<Got> = found
            .into_iter()
            .map(|f| match f {
                Some((v, expire_ms, tag)) => {
                    Got::Value(v.map_or_else(|v| v, |r| arena.slice(r)), expire_ms, tag)
                }
                None => Got::Missing,
            })
            .collect();
        for i in expired_dirty {
            out[i] = Got::Expired;
        }
        // A removal may rehash its shard: each expired key is looked up again.
        for i in expired {
            let sh = &mut guards[guard_of[i]];
            if let Some(slot) = sh.find(hashes[i], keys[i]) {
                if !sh.entry(slot).dirty && !sh.entry(slot).data.is_live(now_ms) {
                    self.remove_slot(sh, slot);
                    self.publish(sh);
                }
            }
        }
        out
    }

    /// Prefetches the entries of `keys` and changes nothing (no access counted), so that
    /// writes of them that follow at once find their entries in the CPU's cache: done for
    /// a batch, the look-ups' cache misses overlap instead of coming one after another.
    pub fn look_ahead(&self, keys: &[&[u8]]) {
        let (hashes, guards, guard_of) = self.lock_shards_of(keys);
        for (&h, &g) in hashes.iter().zip(&guard_of) {
            guards[g].prefetch(h);
        }
    }

    /// The hash of each key, the locks of every shard they fall in (taken in shard order),
    /// and which of those guards each key's shard is.
    #[allow(clippy::type_complexity)]
    fn lock_shards_of(
        &self,
        keys: &[&[u8]],
    ) -> (
        Vec<u64>,
        Vec<parking_lot::MutexGuard<'_, Shard>>,
        Vec<usize>,
    ) {
        let hashes: Vec<u64> = keys.iter().map(|k| self.hasher.hash_one(k)).collect();
        let shard_of: Vec<usize> = hashes.iter().map(|&h| self.shard_index(h)).collect();
        let mut locked: Vec<usize> = shard_of.clone();
        locked.sort_unstable();
        locked.dedup();
        let guards: Vec<_> = locked.iter().map(|&i| self.shards[i].lock()).collect();
        let guard_of: Vec<usize> = shard_of
            .iter()
            .map(|i| locked.binary_search(i).expect("locked"))
            .collect();
        (hashes, guards, guard_of)
    }

    /// The value and tag of `key` if cached and live at `now_ms`, without touching the
    /// policy.
    pub fn peek(&self, key: &[u8], now_ms: u64) -> Option<(Bytes, u8)> {
        self.with_live(key, now_ms, |sh, slot| {
            let e = sh.entry(slot);
            (e.value(), e.tag)
        })
    }

    /// Whether `key` is cached (expired entries count as absent); does not count as a hit.
    pub fn contains(&self, key: &[u8], now_ms: u64) -> bool {
        self.value_len(key, now_ms).is_some()
    }

    /// The length of `key`'s value if it is held and live, without touching the policy.
    pub fn value_len(&self, key: &[u8], now_ms: u64) -> Option<usize> {
        self.with_live(key, now_ms, |sh, slot| sh.entry(slot).data.value().len())
    }

    /// [`HotCache::insert_tagged`] with tag 0.
    pub fn insert(&self, key: &[u8], value: Bytes, expire_ms: u64) -> bool {
        self.insert_tagged(key, value, expire_ms, 0)
    }

    /// Whether an entry of `key_len` and `value_len` bytes is small enough to be held.
    pub fn fits(&self, key_len: usize, value_len: usize) -> bool {
        charge(key_len, value_len) <= self.bytes_cap / 2
    }

    /// Caches `value` (with `tag`) for `key`, replacing any cached value, evicting as needed.
    /// Returns false (and caches nothing) when the entry is too large for the cache to be
    /// useful. The caller must not replace a dirty entry this way (it would lose the only
    /// copy of its value): it settles the entry first.
    pub fn insert_tagged(&self, key: &[u8], value: Bytes, expire_ms: u64, tag: u8) -> bool {
        let len = value.len();
        self.put(key, len, || Data::new(key, value, expire_ms), tag, false)
    }

    /// Puts `value` in place of the value a clean entry of `key` holds (the same bytes, kept
    /// elsewhere: a value that moved within its file store); nothing if `key` is not held
    /// or its entry is dirty. Says whether it replaced one.
    pub fn replace_clean(&self, key: &[u8], value: Bytes, expire_ms: u64, tag: u8) -> bool {
        let hash = self.hasher.hash_one(key);
        let sh = self.shard_of(hash).lock();
        match sh.find(hash, key) {
            Some(slot) if !sh.entry(slot).dirty => {
                let data = self
                    .fits(key.len(), value.len())
                    .then(|| Data::new(key, value, expire_ms));
                self.place(sh, hash, Some(slot), data, tag, None)
            }
            _ => false,
        }
    }

    /// Gives `key`'s clean entry a copy of its value of its own, if `held` says so of the
    /// value it shares now (a view of a file about to be deleted, say, which it would keep
    /// on disk); an expired entry goes instead. Says whether it copied one.
    pub fn copy_clean_if(&self, key: &[u8], now_ms: u64, held: impl FnOnce(&[u8]) -> bool) -> bool {
        self.with_live_or_why(key, now_ms, |sh, slot| {
            let e = sh.entry_mut(slot);
            if e.dirty || !held(e.data.value()) {
                return false;
            }
            // The same length: the entry's charge does not change.
            e.data = Data::copied(key, e.data.value(), e.data.expire_ms());
            true
        })
        .unwrap_or(false)
    }

    /// Holds `value` for `key` as a dirty entry: the only copy of an acknowledged write,
    /// never evicted until [`HotCache::mark_clean`]. Returns false (and changes nothing)
    /// when it does not [`HotCache::fits`]; the caller checks that first. The entry holds a
    /// copy of `value`. `logged`: the caller's log has a record of the value; if not, the
    /// entry is marked for [`HotCache::drain_unlogged`].
    pub fn insert_dirty(
        &self,
        key: &[u8],
        value: &[u8],
        expire_ms: u64,
        tag: u8,
        logged: bool,
    ) -> bool {
        let hash = self.hasher.hash_one(key);
        let fits = self.fits(key.len(), value.len());
        let mut sh = self.shard_of(hash).lock();
        let held = sh.find(hash, key);
        // An overwrite of a value of the same length (a counter, a fixed-size feature)
        // takes the old value's place in its block.
        if let (true, Some(slot)) = (fits, held) {
            if sh.entry_mut(slot).data.overwrite(value, expire_ms) {
                self.dirtied(&mut sh, slot, hash, tag, logged);
                return true;
            }
        }
        let data = fits.then(|| Data::copied(key, value, expire_ms));
        self.place(sh, hash, held, data, tag, Some(logged))
    }

    /// Rewrites `key`'s live value in its block under one look-up (an `INCR` of a counter
    /// whose digits keep their count): `f` sees the value, its expiry and tag, and
    /// answers `Some` once it has written the new value over the old (same length), `None`
    /// having changed nothing. The entry is dirty afterwards, and the write counts as an
    /// access. `None` if DRAM holds no live value of `key` packed in its block. `logged` as
    /// in [`HotCache::insert_dirty`].
    pub fn rewrite_dirty<T>(
        &self,
        key: &[u8],
        logged: bool,
        now_ms: impl FnOnce() -> u64,
        f: impl FnOnce(&mut [u8], u64, u8) -> Option<T>,
    ) -> Option<T> {
        let hash = self.hasher.hash_one(key);
        let mut sh = self.shard_of(hash).lock();
        let slot = sh.find(hash, key)?;
        let e = sh.entry_mut(slot);
        let expire_ms = e.data.expire_ms();
        if expire_ms != 0 && !e.data.is_live(now_ms()) {
            return None;
        }
        let tag = e.tag;
        let out = f(e.data.value_mut()?, expire_ms, tag)?;
        self.dirtied(&mut sh, slot, hash, tag, logged);
        Some(out)
    }

    /// After `slot`'s value was written in its block: the entry is dirty with `tag`, the
    /// write counts as an access, and its bytes count as dirty if they did not yet.
    fn dirtied(&self, sh: &mut Shard, slot: usize, hash: u64, tag: u8, logged: bool) {
        sh.touch(slot);
        sh.entry_mut(slot).tag = tag;
        if !sh.set_dirty(slot, true) {
            self.dirty
                .fetch_add(data_charge(&sh.entry(slot).data), Ordering::Relaxed);
        }
        self.note_logged(sh, slot, hash, logged);
    }

    /// `slot` (of a key hashed to `hash`) now holds a dirty value the log has a record of
    /// (`logged`), or one it has none of: marked, and listed for the next drain.
    fn note_logged(&self, sh: &mut Shard, slot: usize, hash: u64, logged: bool) {
        let e = sh.entry_mut(slot);
        if logged {
            e.unlogged = false;
            return;
        }
        if std::mem::replace(&mut e.unlogged, true) {
            return;
        }
        sh.unlogged.push(hash);
        self.unlogged.fetch_add(1, Ordering::Relaxed);
        // Entries logged, cleaned or dropped since they were listed leave their hashes
        // behind; the list stays within a few times the entries the shard holds.
        if sh.unlogged.len() > 2 * sh.len() + UNLOGGED_SLACK {
            let before = sh.unlogged.len();
            let mut list = std::mem::take(&mut sh.unlogged);
            list.sort_unstable();
            list.dedup();
            list.retain(|&h| sh.entries_of(h).any(|e| e.unlogged));
            self.unlogged
                .fetch_sub(before - list.len(), Ordering::Relaxed);
            sh.unlogged = list;
        }
    }

    /// Hands the dirty values whose entries are marked unlogged to `log` (key, value,
    /// expiry, tag), clearing the mark, with the entry's shard locked: a writer of the key,
    /// which takes that lock, comes wholly before or after. A shard's lock is let go every
    /// [`DRAIN_CHUNK`] entries. `log` answers whether to go on; once it says no, the
    /// entries the current hash finds are finished (a few more calls), and the rest stay
    /// marked and listed for the next drain. Returns
    /// whether every marked entry was handed over.
    pub fn drain_unlogged(&self, mut log: impl FnMut(&[u8], &[u8], u64, u8) -> bool) -> bool {
        if self.unlogged.load(Ordering::Relaxed) == 0 {
            return true;
        }
        for m in self.shards.iter() {
            let list = {
                let mut sh = m.lock();
                let list = std::mem::take(&mut sh.unlogged);
                self.unlogged.fetch_sub(list.len(), Ordering::Relaxed);
                list
            };
            let mut at = 0;
            while at < list.len() {
                let mut sh = m.lock();
                let end = (at + DRAIN_CHUNK).min(list.len());
                // The entries (values written up to a tick ago, long out of the processor's
                // cache) are fetched [`DRAIN_AHEAD`] ahead of their turn, so their cache
                // misses overlap instead of stalling the drain one after another.
                for &h in &list[at..end.min(at + DRAIN_AHEAD)] {
                    sh.prefetch(h);
                }
                let mut more = true;
                while more && at < end {
                    if at + DRAIN_AHEAD < end {
                        sh.prefetch(list[at + DRAIN_AHEAD]);
                    }
                    for e in sh.entries_of(list[at]) {
                        if std::mem::take(&mut e.unlogged) {
                            more &= log(e.data.key(), e.data.value(), e.data.expire_ms(), e.tag);
                        }
                    }
                    at += 1;
                }
                if !more {
                    sh.unlogged.extend_from_slice(&list[at..]);
                    self.unlogged.fetch_add(list.len() - at, Ordering::Relaxed);
                    return false;
                }
            }
        }
        true
    }

    /// Holds the entry `data` makes (of a value of `value_len` bytes) for `key`.
    fn put(
        &self,
        key: &[u8],
        value_len: usize,
        data: impl FnOnce() -> Data,
        tag: u8,
        dirty: bool,
    ) -> bool {
        let hash = self.hasher.hash_one(key);
        let data = self.fits(key.len(), value_len).then(data);
        let sh = self.shard_of(hash).lock();
        let held = sh.find(hash, key);
        self.place(sh, hash, held, data, tag, dirty.then_some(true))
    }

    /// The rest of [`HotCache::put`], with `key`'s shard locked and its slot (`held`)
    /// found: `data` (`None`: too large to hold) takes the slot or a new one.
    fn place(
        &self,
        mut sh: parking_lot::MutexGuard<'_, Shard>,
        hash: u64,
        held: Option<usize>,
        data: Option<Data>,
        tag: u8,
        dirty: Option<bool>,
    ) -> bool {
        debug_assert!(
            dirty.is_some() || held.is_none_or(|s| !sh.entry(s).dirty),
            "a dirty entry replaced by a clean one"
        );
        let Some(data) = data else {
            if let Some(slot) = held {
                self.remove_slot(&mut sh, slot);
            }
            self.publish(&sh);
            self.rejected.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        let new = data_charge(&data);
        let slot = if let Some(slot) = held {
            // An overwrite keeps its slot: the new value takes the old one's place, and the
            // write counts as an access.
            let (old_data, was_dirty) = sh.replace(slot, data, tag, dirty.is_some());
            let old = data_charge(&old_data);
            sh.bytes = sh.bytes - old + new;
            self.used.fetch_add(new, Ordering::Relaxed);
            self.used.fetch_sub(old, Ordering::Relaxed);
            if was_dirty {
                self.dirty.fetch_sub(old, Ordering::Relaxed);
            }
            slot
        } else {
            self.make_room(&mut sh, new);
            let slot = sh.insert(hash, data, tag, dirty.is_some(), &self.hasher);
            sh.bytes += new;
            self.used.fetch_add(new, Ordering::Relaxed);
            slot
        };
        if let Some(logged) = dirty {
            self.dirty.fetch_add(new, Ordering::Relaxed);
            self.note_logged(&mut sh, slot, hash, logged);
        }
        self.publish(&sh);
        drop(sh);
        self.trim();
        true
    }

    /// `key`'s value, expiry, tag and whether it is dirty, in one look-up: a dirty entry
    /// live or not (an expired one says the key is gone), a clean one only if live (an
    /// expired clean entry is dropped). No access is counted.
    pub fn current(&self, key: &[u8], now_ms: u64) -> Option<(Bytes, u64, u8, bool)> {
        self.current_lent(
            key,
            || now_ms,
            |e| (e.value(), e.data.expire_ms(), e.tag, e.dirty),
        )
    }

    /// [`HotCache::current`] that lends the value to `see` (value, expiry, tag, dirty)
    /// instead of copying it, and reads the clock (`now_ms`) only for an entry that
    /// expires.
    pub fn current_seen<T>(
        &self,
        key: &[u8],
        now_ms: impl FnOnce() -> u64,
        see: impl FnOnce(&[u8], u64, u8, bool) -> T,
    ) -> Option<T> {
        self.current_lent(key, now_ms, |e| {
            see(e.data.value(), e.data.expire_ms(), e.tag, e.dirty)
        })
    }

    fn current_lent<T>(
        &self,
        key: &[u8],
        now_ms: impl FnOnce() -> u64,
        f: impl FnOnce(&shard::Entry) -> T,
    ) -> Option<T> {
        let hash = self.hasher.hash_one(key);
        let mut sh = self.shard_of(hash).lock();
        let slot = sh.find(hash, key)?;
        let e = sh.entry(slot);
        if e.dirty || e.data.expire_ms() == 0 || e.data.is_live(now_ms()) {
            return Some(f(e));
        }
        self.remove_slot(&mut sh, slot);
        self.publish(&sh);
        None
    }

    /// The value, expiry and tag of `key`'s dirty entry, live or not (an expired one says
    /// the key is gone); no access is counted.
    pub fn dirty(&self, key: &[u8]) -> Option<(Bytes, u64, u8)> {
        self.with_entry(key, |sh, slot| {
            let e = sh.entry(slot);
            e.dirty.then(|| (e.value(), e.data.expire_ms(), e.tag))
        })
        .flatten()
    }

    /// Whether `key` has a dirty entry.
    pub fn is_dirty(&self, key: &[u8]) -> bool {
        self.with_entry(key, |sh, slot| sh.entry(slot).dirty) == Some(true)
    }

    /// Whether `key`'s entry is dirty and its value was logged (not marked unlogged).
    pub fn is_logged_dirty(&self, key: &[u8]) -> bool {
        self.with_entry(key, |sh, slot| {
            let e = sh.entry(slot);
            e.dirty && !e.unlogged
        }) == Some(true)
    }

    /// `key`'s entry is a copy from now on (its value reached durable storage): it may be
    /// evicted. Returns whether it was marked unlogged (the mark goes too).
    pub fn mark_clean(&self, key: &[u8]) -> bool {
        let unlogged = self.with_entry(key, |sh, slot| {
            if sh.set_dirty(slot, false) {
                self.dirty
                    .fetch_sub(data_charge(&sh.entry(slot).data), Ordering::Relaxed);
            }
            // Dirty entries may have held the cache over its budget: this one can give
            // way now, unless a sample finds a better victim (a search among entries
            // mostly dirty would otherwise look at all of them, once per entry).
            if self.used.load(Ordering::Relaxed) > self.bytes_max() {
                sh.offer_victim(slot);
            }
            std::mem::take(&mut sh.entry_mut(slot).unlogged)
        });
        self.trim();
        unlogged == Some(true)
    }

    /// The number of shards (for walking the dirty keys a shard at a time).
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// The keys of the coldest dirty entries of shard `shard` (lowest priority first) that
    /// together hold at least `fraction` of its dirty bytes.
    pub fn coldest_dirty_keys_in(&self, shard: usize, fraction: f64) -> Vec<Vec<u8>> {
        let sh = self.shards[shard].lock();
        let mut dirty: Vec<(u32, usize, &[u8])> = sh
            .entries()
            .filter(|e| e.dirty)
            .map(|e| (e.prio(), data_charge(&e.data), e.data.key()))
            .collect();
        dirty.sort_unstable_by_key(|d| d.0);
        let want = (dirty.iter().map(|d| d.1).sum::<usize>() as f64 * fraction) as usize;
        let mut taken = 0;
        dirty
            .into_iter()
            .take_while(|d| {
                let more = taken < want;
                taken += d.1;
                more
            })
            .map(|d| d.2.to_vec())
            .collect()
    }

    /// The keys of the dirty entries of shard `shard`.
    pub fn dirty_keys_in(&self, shard: usize) -> Vec<Vec<u8>> {
        if self.dirty_bytes() == 0 {
            return Vec::new();
        }
        let sh = self.shards[shard].lock();
        sh.entries()
            .filter(|e| e.dirty)
            .map(|e| e.data.key().to_vec())
            .collect()
    }

    /// Shows `f` the key of each of shard `shard`'s dirty entries that are live at `now_ms`
    /// (a dirty entry past its expiry stands for a deleted key), under the shard's lock:
    /// nothing is copied.
    pub fn each_live_dirty_key_in(&self, shard: usize, now_ms: u64, mut f: impl FnMut(&[u8])) {
        if self.dirty_bytes() == 0 {
            return;
        }
        let sh = self.shards[shard].lock();
        sh.entries()
            .filter(|e| e.dirty && e.data.is_live(now_ms))
            .for_each(|e| f(e.data.key()));
    }

    /// Bytes of dirty entries, as the budget counts them.
    pub fn dirty_bytes(&self) -> usize {
        self.dirty.load(Ordering::Relaxed)
    }

    /// Evicts from `sh` while it holds its share of the budget or more and `new` more bytes
    /// would not fit; past that the shards holding the most give way, once this lock is
    /// released. (Evicting only from the shard written to would let shard sizes drift
    /// apart for good: one whose space was freed by removals keeps it, and a shard's
    /// policy would decide for a cache of any size.)
    fn make_room(&self, sh: &mut Shard, new: usize) {
        let bytes_max = self.bytes_max();
        let share = bytes_max / self.shards.len();
        while self.used.load(Ordering::Relaxed) + new > bytes_max && sh.bytes + new > share {
            let Some(victim) = sh.victim() else {
                break;
            };
            self.remove_slot(sh, victim);
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Bytes held, as the shards last published them (no lock taken).
    pub fn bytes(&self) -> usize {
        self.loads.iter().map(|l| l.load(Ordering::Relaxed)).sum()
    }

    /// The budget now.
    pub fn bytes_max(&self) -> usize {
        self.bytes_max.load(Ordering::Relaxed)
    }

    /// Sets the budget (at most the one the cache was made with) and evicts down to it.
    /// Dirty entries stay, so the cache may hold more than a budget below them.
    pub fn set_bytes_max(&self, bytes: usize) {
        self.bytes_max
            .store(bytes.min(self.bytes_cap), Ordering::Relaxed);
        self.trim();
    }

    /// Drops `key` from the cache if present. The caller settles a dirty entry first.
    pub fn remove(&self, key: &[u8]) {
        let hash = self.hasher.hash_one(key);
        let mut sh = self.shard_of(hash).lock();
        if let Some(slot) = sh.find(hash, key) {
            debug_assert!(!sh.entry(slot).dirty, "a dirty entry removed");
            self.remove_slot(&mut sh, slot);
            self.publish(&sh);
        }
    }

    /// Evicts until under the budget, each time from the shard holding the most bytes, one
    /// lock at a time.
    fn trim(&self) {
        let bytes_max = self.bytes_max();
        if self.used.load(Ordering::Relaxed) <= bytes_max {
            return;
        }
        let mut stuck = vec![false; self.shards.len()];
        while self.used.load(Ordering::Relaxed) > bytes_max {
            let Some(i) = (0..self.shards.len())
                .filter(|&i| !stuck[i])
                .max_by_key(|&i| self.loads[i].load(Ordering::Relaxed))
            else {
                return;
            };
            let mut sh = self.shards[i].lock();
            match sh.victim() {
                Some(victim) => {
                    self.remove_slot(&mut sh, victim);
                    self.evictions.fetch_add(1, Ordering::Relaxed);
                }
                None => stuck[i] = true,
            }
            self.publish(&sh);
        }
    }

    /// Drops every clean entry (dirty ones hold the only copy of their values).
    pub fn clear(&self) {
        self.remove_where(|e| !e.dirty);
    }

    /// Drops every entry, dirty ones too (`FLUSHALL`, or closing once their values are
    /// durable elsewhere).
    pub fn clear_all(&self) {
        self.remove_where(|_| true);
    }

    /// Moves every small entry to a fresh allocation, [`RELOCATE_CHUNK`] entries of a
    /// shard under one hold of its lock, calling `between` after each chunk (with no lock
    /// held). After random evictions have left a few entries on each of many pages, the
    /// allocator, which fills its fullest or oldest pages first, packs the moved entries
    /// onto few pages and the others empty, to go back to the system. An entry added or
    /// moved between two chunks may be moved twice or not at all. Returns the bytes moved.
    pub fn relocate(&self, between: &dyn Fn()) -> usize {
        let mut bytes = 0;
        for m in self.shards.iter() {
            let mut from = Some(0);
            while let Some(at) = from {
                let (moved, next) = m.lock().relocate(at, RELOCATE_CHUNK);
                bytes += moved;
                from = next;
                between();
            }
        }
        bytes
    }

    fn remove_where(&self, drop: impl Fn(&shard::Entry) -> bool) {
        for m in self.shards.iter() {
            let mut sh = m.lock();
            for gone in sh.remove_where(&drop, &self.hasher) {
                self.forget(&mut sh, &gone);
            }
            self.publish(&sh);
        }
    }

    pub fn stats(&self) -> HotStats {
        let mut st = HotStats {
            bytes_max: self.bytes_max() as u64,
            evictions: self.evictions.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            ..Default::default()
        };
        for m in self.shards.iter() {
            let sh = m.lock();
            st.entries += sh.len() as u64;
            st.bytes += sh.bytes as u64;
        }
        st
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(bytes: usize) -> HotCache {
        HotCache::new(bytes, 1, PolicyKind::Lru)
    }

    const POLICIES: [PolicyKind; 2] = [PolicyKind::Lru, PolicyKind::Strata];

    #[test]
    fn look_ahead_changes_nothing_and_takes_keys_of_any_shards_twice() {
        for policy in POLICIES {
            let c = HotCache::new(1 << 20, 4, policy);
            for i in 0..300u32 {
                c.insert(format!("k{i}").as_bytes(), Bytes::from(format!("v{i}")), 0);
            }
            c.insert_dirty(b"dirty", b"d", 0, 3, true);
            let before = c.stats();
            // Keys of every shard, some twice, some absent: one lock per shard, no deadlock.
            let names: Vec<String> = (0..400u32)
                .map(|i| format!("k{}", i % 350))
                .chain(["dirty".to_string()])
                .collect();
            let keys: Vec<&[u8]> = names.iter().map(|n| n.as_bytes()).collect();
            c.look_ahead(&keys);
            let after = c.stats();
            assert_eq!(
                (before.entries, before.bytes, before.evictions),
                (after.entries, after.bytes, after.evictions)
            );
            assert!(c.is_dirty(b"dirty"));
            for i in 0..350u32 {
                let want = (i < 300).then(|| Bytes::from(format!("v{i}")));
                assert_eq!(c.peek(format!("k{i}").as_bytes(), 0).map(|v| v.0), want);
            }
        }
    }

    #[test]
    fn relocation_goes_through_a_large_shard_in_chunks() {
        let c = HotCache::new(64 << 20, 1, PolicyKind::Lru);
        let n = 2 * RELOCATE_CHUNK as u32 + 10;
        for i in 0..n {
            c.insert(format!("k{i}").as_bytes(), Bytes::from(format!("v{i}")), 0);
        }
        let chunks = std::sync::atomic::AtomicUsize::new(0);
        let moved = c.relocate(&|| {
            chunks.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(chunks.into_inner(), 3);
        let bytes: usize = (0..n).map(|i| 2 * format!("{i}").len() + 2).sum();
        assert_eq!(moved, bytes, "every entry once");
        for i in 0..n {
            let got = c.get(format!("k{i}").as_bytes(), 0).map(|g| g.0);
            assert_eq!(got, Some(Bytes::from(format!("v{i}"))));
        }
    }

    #[test]
    fn relocated_entries_keep_their_values_expiries_and_marks() {
        let c = HotCache::new(16 << 20, 4, PolicyKind::Strata);
        let value = |i: u32| match i % 5 {
            0 => Bytes::from(vec![i as u8; INLINE_VALUE_BYTES_MAX + 1]),
            _ => Bytes::from(format!("v{i}")),
        };
        for i in 0..500u32 {
            c.insert(
                format!("k{i}").as_bytes(),
                value(i),
                u64::from(i % 3) * 1000,
            );
        }
        c.insert_dirty(b"dirty", b"d", 0, 3, true);
        let before = c.stats();
        let shards = std::sync::atomic::AtomicUsize::new(0);
        let moved = c.relocate(&|| {
            shards.fetch_add(1, Ordering::Relaxed);
        });
        // After each chunk: one per shard of at most RELOCATE_CHUNK entries.
        assert_eq!(shards.into_inner(), 4, "called after each chunk");
        // The 400 small values and the dirty one move; the large ones stay as they are.
        let small: usize = (0..500u32)
            .filter(|i| i % 5 != 0)
            .map(|i| format!("k{i}").len() + format!("v{i}").len())
            .sum();
        assert_eq!(moved, small + "dirty".len() + 1);
        let after = c.stats();
        assert_eq!((before.entries, before.bytes), (after.entries, after.bytes));
        assert_eq!(c.bytes() as u64, after.bytes);
        assert_eq!(
            c.dirty(b"dirty").map(|d| d.0),
            Some(Bytes::from_static(b"d"))
        );
        for i in 0..500u32 {
            let (v, expire, _) = c.get(format!("k{i}").as_bytes(), 0).unwrap();
            assert_eq!((v, expire), (value(i), u64::from(i % 3) * 1000));
        }
    }

    #[test]
    fn get_many_answers_as_get_does_key_by_key() {
        for policy in POLICIES {
            // Two caches alike: one read with get_many, its twin key by key.
            let filled = || {
                let c = HotCache::new(16 << 20, 4, policy);
                for i in 0..200u32 {
                    let expire = if i % 10 == 0 { 50 } else { 0 };
                    // Packed values (copied into one shared buffer), empty ones, and values
                    // past the inline limit (handed out as their own handles).
                    let v = match i % 7 {
                        0 => Bytes::from(vec![i as u8; INLINE_VALUE_BYTES_MAX + 1 + i as usize]),
                        1 => Bytes::new(),
                        _ => Bytes::from(format!("v{i}")),
                    };
                    c.insert(format!("k{i}").as_bytes(), v, expire);
                }
                c
            };
            let (c, twin) = (filled(), filled());
            c.insert_dirty(b"dirty-expired", b"d", 50, 0, true);
            let names: Vec<String> = (0..220u32)
                .map(|i| format!("k{}", i % 210))
                .chain(["dirty-expired".to_string(), "k5".to_string()])
                .collect();
            let keys: Vec<&[u8]> = names.iter().map(|n| n.as_bytes()).collect();
            let got = c.get_many(&keys, 100);
            assert_eq!(got.len(), keys.len());
            for (k, g) in keys.iter().zip(&got) {
                if *k == b"dirty-expired" {
                    assert_eq!(g, &Got::Expired);
                    continue;
                }
                assert_eq!(
                    g.clone().live(),
                    twin.get(k, 100),
                    "{}",
                    String::from_utf8_lossy(k)
                );
            }
            assert!(got.iter().filter(|g| matches!(g, Got::Value(..))).count() > 150);
            assert!(got.iter().any(|g| g == &Got::Missing));
            // Expired clean entries went; the expired dirty one stays (write-back owns it).
            assert_eq!(c.stats().entries, 180 + 1);
            assert!(c.is_dirty(b"dirty-expired"));
            assert!(c.get_many(&[], 100).is_empty());
        }
    }

    #[test]
    fn strata_policy_keeps_reused_entries_through_a_scan() {
        for policy in POLICIES {
            for shard_entries in [10, 1000] {
                // Half the cache reused three times, then a scan of as many new keys as the
                // cache holds.
                let each = ENTRY_OVERHEAD_BYTES + 6;
                let c = HotCache::new(shard_entries * each, 1, policy);
                let hot = shard_entries / 2;
                for _ in 0..3 {
                    for k in 0..hot {
                        let key = format!("h{k:04}");
                        if c.get(key.as_bytes(), 0).is_none() {
                            c.insert(key.as_bytes(), Bytes::from_static(b"v"), 0);
                        }
                    }
                }
                for n in 0..shard_entries {
                    c.insert(format!("s{n:04}").as_bytes(), Bytes::from_static(b"v"), 0);
                }
                let kept = (0..hot)
                    .filter(|k| c.get(format!("h{k:04}").as_bytes(), 0).is_some())
                    .count();
                match policy {
                    PolicyKind::Lru => {
                        assert!(
                            kept * 5 < hot,
                            "LRU loses the reused keys to a scan: kept {kept} of {hot}"
                        )
                    }
                    // A small shard looks at every entry and keeps them all. A large one
                    // samples at random, so an eviction may, rarely, find only reused
                    // entries in its sample (about one run in seventy loses one key of 500).
                    PolicyKind::Strata => assert!(
                        kept * 100 >= hot * 99
                            && (shard_entries > 2 * shard::SAMPLES || kept == hot),
                        "Strata's policy keeps the reused keys: kept {kept} of {hot}"
                    ),
                }
            }
        }
    }

    #[test]
    fn shards_keep_their_share_when_space_is_freed_in_one_of_them() {
        // Keys removed from shard 0 free space there; new keys in other shards must not keep
        // it (evicting only from the shard written to let shard 0 drain to nothing).
        for policy in POLICIES {
            let each = ENTRY_OVERHEAD_BYTES + 6 + 1;
            let c = HotCache::new(400 * each, 4, policy);
            let in_shard_0 =
                |k: &[u8]| std::ptr::eq(c.shard_of(c.hasher.hash_one(k)), &c.shards[0]);
            for i in 0..20_000u32 {
                let key = format!("k{i:05}");
                c.insert(key.as_bytes(), Bytes::from_static(b"v"), 0);
                // A third of shard 0's keys are removed once they are 50 inserts old.
                let j = i.saturating_sub(50);
                let old = format!("k{j:05}");
                if j % 3 == 0 && in_shard_0(old.as_bytes()) {
                    c.remove(old.as_bytes());
                }
            }
            let held: Vec<usize> = c.shards.iter().map(|s| s.lock().len()).collect();
            assert!(
                held.iter().all(|&n| n >= 80),
                "{policy:?}: entries per shard {held:?}"
            );
            assert!(c.stats().bytes <= c.stats().bytes_max);
        }
    }

    #[test]
    fn lru_evicts_close_to_the_least_recently_used_in_a_large_shard() {
        // 10,000 entries, then 1,000 more: sampling evicts old entries, almost never the
        // most recent half.
        let each = ENTRY_OVERHEAD_BYTES + 6 + 1;
        let c = HotCache::new(10_000 * each, 1, PolicyKind::Lru);
        for i in 0..11_000u32 {
            c.insert(format!("k{i:05}").as_bytes(), Bytes::from_static(b"v"), 0);
        }
        let recent_lost = (5_000..10_000u32)
            .filter(|i| !c.contains(format!("k{i:05}").as_bytes(), 0))
            .count();
        assert!(recent_lost < 50, "{recent_lost} of the newer half evicted");
    }

    #[test]
    fn budget_counts_keys_values_and_overhead() {
        let c = cache(10 * (ENTRY_OVERHEAD_BYTES + 100));
        for i in 0..100u32 {
            c.insert(format!("k{i:03}").as_bytes(), Bytes::from(vec![0u8; 96]), 0);
            assert!(c.stats().bytes <= c.stats().bytes_max);
        }
        let st = c.stats();
        assert_eq!(st.entries, 10);
        assert_eq!(st.bytes, 10 * (4 + 96 + ENTRY_OVERHEAD_BYTES as u64));
        assert_eq!(st.evictions, 90);
    }

    #[test]
    fn lru_keeps_recently_read_entries() {
        let c = cache(3 * (ENTRY_OVERHEAD_BYTES + 2));
        for k in [b"a", b"b", b"c"] {
            c.insert(k, Bytes::from_static(b"v"), 0);
        }
        assert!(c.get(b"a", 0).is_some());
        c.insert(b"d", Bytes::from_static(b"v"), 0);
        assert!(c.get(b"b", 0).is_none(), "b was least recently used");
        assert!(c.get(b"a", 0).is_some());
        assert!(c.get(b"c", 0).is_some());
        assert!(c.get(b"d", 0).is_some());
    }

    #[test]
    fn expired_entries_are_not_returned() {
        let c = cache(1 << 16);
        c.insert(b"k", Bytes::from_static(b"v"), 100);
        assert!(c.get(b"k", 99).is_some());
        assert!(c.get(b"k", 100).is_none());
        assert_eq!(c.stats().entries, 0);
    }

    #[test]
    fn oversized_entries_are_rejected_and_replace_drops_the_old_copy() {
        let c = cache(1000);
        c.insert(b"k", Bytes::from_static(b"small"), 0);
        assert!(!c.insert(b"k", Bytes::from(vec![0u8; 900]), 0));
        assert!(
            c.get(b"k", 0).is_none(),
            "a stale copy must not survive a rejected insert"
        );
        assert_eq!(c.stats().rejected, 1);
    }

    #[test]
    fn an_overwrite_replaces_in_place_and_keeps_the_budget() {
        for policy in POLICIES {
            let each = ENTRY_OVERHEAD_BYTES + 4 + 10;
            let c = HotCache::new(10 * each, 1, policy);
            for i in 0..10u32 {
                c.insert(format!("k{i:03}").as_bytes(), Bytes::from(vec![1u8; 10]), 0);
            }
            // Same size: nothing leaves, the new value and expiry are read back.
            assert!(c.insert(b"k003", Bytes::from(vec![2u8; 10]), 500));
            assert_eq!(
                c.get(b"k003", 0),
                Some((Bytes::from(vec![2u8; 10]), 500, 0))
            );
            assert!(c.insert_tagged(b"k003", Bytes::from(vec![2u8; 10]), 500, 3));
            assert_eq!(c.peek(b"k003", 0), Some((Bytes::from(vec![2u8; 10]), 3)));
            assert_eq!(c.stats().entries, 10, "{policy:?}");
            assert_eq!(c.stats().bytes, 10 * each as u64, "{policy:?}");
            // Larger: the budget holds, by evicting.
            assert!(c.insert(b"k004", Bytes::from(vec![3u8; 100]), 0));
            let st = c.stats();
            assert!(st.bytes <= st.bytes_max, "{policy:?}: {st:?}");
            assert!(st.evictions > 0, "{policy:?}: {st:?}");
            // Smaller: the bytes shrink with it.
            let before = c.stats().bytes;
            if c.get(b"k003", 0).is_some() {
                assert!(c.insert(b"k003", Bytes::from_static(b"x"), 0));
                assert_eq!(c.stats().bytes, before - 9, "{policy:?}");
            }
        }
    }

    #[test]
    fn remove_and_clear() {
        let c = cache(1 << 16);
        c.insert(b"a", Bytes::from_static(b"1"), 0);
        c.insert(b"b", Bytes::from_static(b"2"), 0);
        c.remove(b"a");
        assert!(c.get(b"a", 0).is_none());
        c.clear();
        assert_eq!(c.stats().entries, 0);
        assert_eq!(c.stats().bytes, 0);
        c.insert(b"c", Bytes::from_static(b"3"), 0);
        assert!(c.get(b"c", 0).is_some());
    }

    #[test]
    fn current_seen_lends_the_value_and_reads_the_clock_only_for_expiring_entries() {
        let c = cache(1 << 16);
        let mut big = vec![b'x'; INLINE_VALUE_BYTES_MAX + 10];
        assert!(c.insert_dirty(b"big", &big, 0, 1, true));
        big[0] = b'y';
        let no_clock = || -> u64 { panic!("the clock was read for an entry with no expiry") };
        let seen = c.current_seen(b"big", no_clock, |v, e, tag, dirty| {
            (v.to_vec(), e, tag, dirty)
        });
        assert_eq!(
            seen,
            Some((vec![b'x'; INLINE_VALUE_BYTES_MAX + 10], 0, 1, true)),
            "DRAM holds its own copy of the value"
        );
        c.insert(b"soon", Bytes::from_static(b"v"), 100);
        let mut read = false;
        let live = c.current_seen(
            b"soon",
            || {
                read = true;
                50
            },
            |v, e, _, dirty| (v.to_vec(), e, dirty),
        );
        assert!(read, "an expiring entry needs the clock");
        assert_eq!(live, Some((b"v".to_vec(), 100, false)));
        assert_eq!(c.current_seen(b"soon", || 100, |_, _, _, _| ()), None);
        assert_eq!(c.stats().entries, 1, "the expired clean entry was dropped");
    }

    #[test]
    fn dirty_entries_are_never_evicted_or_cleared_until_marked_clean() {
        for policy in POLICIES {
            let each = ENTRY_OVERHEAD_BYTES + 5 + 1;
            let c = HotCache::new(100 * each, 2, policy);
            for i in 0..20u32 {
                assert!(c.insert_dirty(format!("d{i:04}").as_bytes(), b"v", 50, 2, true));
            }
            assert_eq!(c.dirty_bytes(), 20 * each);
            for i in 0..5_000u32 {
                c.insert(format!("c{i:04}").as_bytes(), Bytes::from_static(b"v"), 0);
            }
            c.clear();
            // Expired, still there: a dirty entry says the key is gone until it is settled.
            assert!(c.get(b"d0003", 60).is_none());
            assert_eq!(c.dirty(b"d0003"), Some((Bytes::from_static(b"v"), 50, 2)));
            let dirty: usize = (0..c.shard_count()).map(|i| c.dirty_keys_in(i).len()).sum();
            assert_eq!(dirty, 20, "{policy:?}");
            assert_eq!(c.stats().entries, 20);
            // A dirty entry overwritten stays dirty once, counted once.
            assert!(c.insert_dirty(b"d0003", b"w", 0, 2, true));
            assert_eq!(c.dirty_bytes(), 20 * each);
            // Dirty entries past the budget: clean, the cache comes back under it.
            for i in 0..200u32 {
                let k = format!("e{i:04}");
                assert!(c.insert_dirty(k.as_bytes(), b"v", 0, 2, true));
            }
            assert!(c.stats().bytes > c.stats().bytes_max);
            for i in 0..200u32 {
                c.mark_clean(format!("e{i:04}").as_bytes());
            }
            assert!(c.stats().bytes <= c.stats().bytes_max);
            for i in 0..20u32 {
                c.mark_clean(format!("d{i:04}").as_bytes());
            }
            assert_eq!(c.dirty_bytes(), 0);
            assert!(!c.is_dirty(b"d0003"));
            c.clear();
            assert_eq!(c.stats().entries, 0);
            assert!(c.insert_dirty(b"x", b"v", 0, 0, true));
            c.clear_all();
            assert_eq!((c.stats().bytes, c.dirty_bytes()), (0, 0));
        }
    }

    #[test]
    fn a_dirty_value_of_the_same_length_is_written_in_place_and_counted_once() {
        for policy in POLICIES {
            let c = HotCache::new(1 << 20, 2, policy);
            c.insert(b"k", Bytes::from_static(b"10"), 0);
            let before = c.stats();
            // Clean to dirty in place: the same charge, now counted dirty.
            assert!(c.insert_dirty(b"k", b"11", 0, 0, true));
            let each = before.bytes as usize;
            assert_eq!((c.stats().bytes, c.dirty_bytes()), (before.bytes, each));
            assert_eq!(c.dirty(b"k"), Some((Bytes::from_static(b"11"), 0, 0)));
            // Dirty to dirty in place, a new tag; then with an expiry the block has no room
            // for (a new block), then in place again with another expiry.
            assert!(c.insert_dirty(b"k", b"12", 0, 3, true));
            assert_eq!(c.dirty(b"k"), Some((Bytes::from_static(b"12"), 0, 3)));
            assert!(c.insert_dirty(b"k", b"13", 500, 3, true));
            assert!(c.insert_dirty(b"k", b"14", 700, 3, true));
            assert_eq!(c.dirty(b"k"), Some((Bytes::from_static(b"14"), 700, 3)));
            // Longer and shorter values take new blocks; the charge follows the length.
            assert!(c.insert_dirty(b"k", b"100", 0, 0, true));
            assert!(c.insert_dirty(b"k", b"9", 0, 0, true));
            assert_eq!(c.dirty(b"k"), Some((Bytes::from_static(b"9"), 0, 0)));
            assert_eq!(c.dirty_bytes(), each - 1);
            assert_eq!(c.stats().entries, 1);
            c.mark_clean(b"k");
            assert_eq!((c.dirty_bytes(), c.stats().bytes as usize), (0, each - 1));
        }
    }

    #[test]
    fn unlogged_values_are_drained_once_each_newest_value_only() {
        for policy in POLICIES {
            let c = HotCache::new(1 << 20, 4, policy);
            let drain = |c: &HotCache| {
                let mut out = Vec::new();
                assert!(c.drain_unlogged(|k, v, e, t| {
                    out.push((k.to_vec(), v.to_vec(), e, t));
                    true
                }));
                out.sort();
                out
            };
            // Overwrites before a drain coalesce: one value per key, the newest.
            for i in 0..3u8 {
                for k in [&b"a"[..], b"b", b"c"] {
                    assert!(c.insert_dirty(k, &[b'0' + i], 0, 1, false));
                }
            }
            let rewritten = c.rewrite_dirty(
                b"b",
                false,
                || 0,
                |v, _, _| {
                    v.copy_from_slice(b"9");
                    Some(())
                },
            );
            assert_eq!(rewritten, Some(()));
            // A value logged by its writer, and one made clean, need no drain; one longer
            // value takes a new block and stays marked.
            assert!(c.insert_dirty(b"c", b"logged", 0, 1, true));
            assert!(c.insert_dirty(b"d", b"x", 0, 1, false));
            assert!(c.mark_clean(b"d"), "the mark goes with the dirt");
            assert!(!c.mark_clean(b"c"));
            assert!(c.insert_dirty(b"e", b"long value", 7, 2, false));
            let want = |k: &[u8], v: &[u8], e: u64, t: u8| (k.to_vec(), v.to_vec(), e, t);
            assert_eq!(
                drain(&c),
                vec![
                    want(b"a", b"2", 0, 1),
                    want(b"b", b"9", 0, 1),
                    want(b"e", b"long value", 7, 2)
                ],
                "{policy:?}"
            );
            assert!(drain(&c).is_empty(), "each value is drained once");
            // Still dirty: a drain logs, it does not clean.
            assert!(c.is_dirty(b"a") && c.is_dirty(b"e"));
            // Marked again by the next write; gone with the entry.
            assert!(c.insert_dirty(b"a", b"3", 0, 1, false));
            assert!(c.insert_dirty(b"f", b"1", 0, 1, false));
            c.clear_all();
            assert!(drain(&c).is_empty());
        }
    }

    #[test]
    fn a_drain_stopped_early_leaves_the_rest_for_the_next() {
        let c = HotCache::new(1 << 24, 3, PolicyKind::Strata);
        for i in 0..1000u32 {
            assert!(c.insert_dirty(format!("k{i}").as_bytes(), b"v", 0, 0, false));
        }
        let mut seen = std::collections::HashSet::new();
        let mut drains = 0;
        loop {
            drains += 1;
            let mut taken = 0;
            let done = c.drain_unlogged(|k, _, _, _| {
                assert!(seen.insert(k.to_vec()), "a value handed over twice");
                taken += 1;
                taken < 300
            });
            if done {
                break;
            }
            // The entries a listed hash finds (those whose tag matches in its probe, which
            // may be another key's) are all handed over once begun: a few past the stop.
            assert!((300..310).contains(&taken), "{taken}");
        }
        assert_eq!((seen.len(), drains), (1000, 4));
        assert_eq!(c.unlogged.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_list_of_unlogged_entries_stays_near_the_entries_it_names() {
        let c = HotCache::new(1 << 24, 1, PolicyKind::Lru);
        // Marked, then logged by the writer, many times over: the list sheds stale hashes.
        for round in 0..20_000u32 {
            let k = format!("k{}", round % 10);
            assert!(c.insert_dirty(k.as_bytes(), b"v", 0, 0, false));
            assert!(c.insert_dirty(k.as_bytes(), b"w", 0, 0, true));
        }
        let listed = c.shards[0].lock().unlogged.len();
        assert!(listed <= 2 * 10 + UNLOGGED_SLACK + 1, "{listed}");
        assert_eq!(c.unlogged.load(Ordering::Relaxed), listed);
        let mut n = 0;
        c.drain_unlogged(|_, _, _, _| {
            n += 1;
            true
        });
        assert_eq!((n, c.unlogged.load(Ordering::Relaxed)), (0, 0));
    }

    #[test]
    fn dirty_entries_above_a_lowered_budget_give_way_as_they_are_written_back() {
        for policy in POLICIES {
            let each = ENTRY_OVERHEAD_BYTES + 5 + 1;
            let c = HotCache::new(1000 * each, 4, policy);
            let counted = |c: &HotCache| {
                c.shards.iter().all(|sh| {
                    let sh = sh.lock();
                    sh.dirty_entries() == sh.entries().filter(|e| e.dirty).count()
                })
            };
            for i in 0..900u32 {
                assert!(c.insert_dirty(format!("d{i:04}").as_bytes(), b"v", 0, 2, true));
            }
            for i in 0..50u32 {
                c.insert(format!("c{i:04}").as_bytes(), Bytes::from_static(b"v"), 0);
            }
            // The budget falls below what the dirty entries hold: the clean ones go, the
            // dirty ones stay, and a search for a victim finds none.
            c.set_bytes_max(100 * each);
            assert_eq!(c.stats().entries, 900, "{policy:?}");
            assert!(c.shards.iter().all(|sh| sh.lock().victim().is_none()));
            assert!(counted(&c));
            // Each entry written back gives way at once while the cache is over budget.
            let evicted = c.stats().evictions;
            for i in 0..700u32 {
                c.mark_clean(format!("d{i:04}").as_bytes());
                assert_eq!(c.stats().entries, 900 - u64::from(i) - 1);
            }
            assert_eq!(c.stats().evictions, evicted + 700);
            assert!(counted(&c));
            // Under the budget again, the next ones stay as copies.
            for i in 700..900u32 {
                c.mark_clean(format!("d{i:04}").as_bytes());
            }
            assert!(c.stats().bytes <= c.stats().bytes_max);
            assert!(c.stats().entries >= 90);
            assert_eq!(c.dirty_bytes(), 0);
            assert!(counted(&c));
        }
    }

    #[test]
    fn a_lower_budget_evicts_down_to_it_and_never_past_the_first() {
        let each = ENTRY_OVERHEAD_BYTES + 5 + 1;
        let c = HotCache::new(1000 * each, 4, PolicyKind::Strata);
        for i in 0..1000u32 {
            c.insert(format!("k{i:04}").as_bytes(), Bytes::from_static(b"v"), 0);
        }
        c.set_bytes_max(100 * each);
        assert!(c.stats().bytes <= 100 * each as u64);
        assert!(c.stats().entries >= 90);
        c.set_bytes_max(1_000_000 * each);
        assert_eq!(c.bytes_max(), 1000 * each);
        assert!(c.fits(1, 400 * each), "what fits follows the first budget");
    }
}
