//! Strata's DRAM tier: a concurrent, sharded cache with an honest byte budget.
//!
//! The cache holds copies of values whose durable home is the warm or the cold tier, so an
//! eviction never loses data and needs no write-back. Each shard is a hash map plus an
//! eviction [`Policy`] that sees only slot numbers; later policies (prefix-aware,
//! chain-aware, admission filters) plug in through that trait. What it is not: a store.
//! It does no I/O, knows nothing of RocksDB, and keeps nothing across restarts.
//!
//! ```
//! use strata_hot::{HotCache, Lru};
//! let cache = HotCache::new(1 << 20, 4, || Box::new(Lru::default()));
//! cache.insert(b"k", bytes::Bytes::from_static(b"v"), 0);
//! assert_eq!(cache.get(b"k", 0).unwrap().0, "v");
//! ```

mod lru;
mod strata;

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;

pub use lru::Lru;
pub use strata::StrataHot;

/// Bytes charged per entry on top of key and value: the map slot, the slab slot with its
/// two `Bytes` handles, the policy's links and the allocator's headers.
pub const ENTRY_OVERHEAD_BYTES: usize = 128;

/// An eviction policy over the slots of one shard.
///
/// The shard calls `on_insert` once per new slot (with a hash of its key, stable for the
/// process's life), `on_hit` on every read hit, and `on_remove` when a slot leaves for any
/// reason other than being chosen by `victim`.
pub trait Policy: Send + 'static {
    fn name(&self) -> &'static str;
    fn on_insert(&mut self, slot: u32, key_hash: u64);
    fn on_hit(&mut self, slot: u32);
    fn on_remove(&mut self, slot: u32);
    /// Chooses and forgets the slot to evict next, or `None` if the shard is empty.
    fn victim(&mut self) -> Option<u32>;
}

struct Slot {
    key: Bytes,
    value: Bytes,
    expire_ms: u64,
    charge: usize,
    /// What the caller says the value is (the engine: its kind); returned with it.
    tag: u8,
}

struct Shard {
    /// Its place in `HotCache::shards` (and `loads`).
    index: usize,
    map: std::collections::HashMap<Bytes, u32, ahash::RandomState>,
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    bytes: usize,
    policy: Box<dyn Policy>,
}

impl Shard {
    fn remove_slot(&mut self, slot: u32) -> Slot {
        let s = self.slots[slot as usize].take().expect("live slot");
        self.map.remove(&s.key);
        self.free.push(slot);
        self.bytes -= s.charge;
        s
    }
}

/// A snapshot of the cache's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HotStats {
    pub entries: u64,
    pub bytes: u64,
    pub bytes_max: u64,
    pub evictions: u64,
    pub rejected: u64,
}

/// The sharded DRAM cache.
pub struct HotCache {
    shards: Box<[Mutex<Shard>]>,
    hasher: ahash::RandomState,
    bytes_max: usize,
    /// Bytes held by all shards together; the budget is global, so one large value may
    /// take more than its shard's share.
    used: std::sync::atomic::AtomicUsize,
    /// Bytes held by each shard, as of its last change (read without its lock, to find
    /// the shard that should give way).
    loads: Box<[std::sync::atomic::AtomicUsize]>,
    evictions: AtomicU64,
    rejected: AtomicU64,
}

impl HotCache {
    /// A cache of at most `bytes_max` bytes (keys, values and [`ENTRY_OVERHEAD_BYTES`] each),
    /// split over `shard_count` shards, each with its own policy from `policy`.
    pub fn new(bytes_max: usize, shard_count: usize, policy: impl Fn() -> Box<dyn Policy>) -> Self {
        let shard_count = shard_count.clamp(1, 1024);
        let shards = (0..shard_count)
            .map(|index| {
                Mutex::new(Shard {
                    index,
                    map: Default::default(),
                    slots: Vec::new(),
                    free: Vec::new(),
                    bytes: 0,
                    policy: policy(),
                })
            })
            .collect();
        HotCache {
            shards,
            hasher: ahash::RandomState::new(),
            bytes_max,
            used: std::sync::atomic::AtomicUsize::new(0),
            loads: (0..shard_count).map(|_| Default::default()).collect(),
            evictions: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
        }
    }

    fn shard(&self, key: &[u8]) -> &Mutex<Shard> {
        self.shard_of(self.hasher.hash_one(key))
    }

    fn shard_of(&self, hash: u64) -> &Mutex<Shard> {
        &self.shards[(hash % self.shards.len() as u64) as usize]
    }

    /// Records `sh`'s bytes for `trim` (called with its lock held, after every change).
    fn publish(&self, sh: &Shard) {
        self.loads[sh.index].store(sh.bytes, Ordering::Relaxed);
    }

    /// The value, expiry and tag of `key`, if cached and not expired at `now_ms`.
    pub fn get(&self, key: &[u8], now_ms: u64) -> Option<(Bytes, u64, u8)> {
        let mut sh = self.shard(key).lock();
        let slot = *sh.map.get(key)?;
        let s = sh.slots[slot as usize]
            .as_ref()
            .expect("mapped slot is live");
        if s.expire_ms != 0 && s.expire_ms <= now_ms {
            sh.policy.on_remove(slot);
            let gone = sh.remove_slot(slot);
            self.used.fetch_sub(gone.charge, Ordering::Relaxed);
            self.publish(&sh);
            return None;
        }
        let out = (s.value.clone(), s.expire_ms, s.tag);
        sh.policy.on_hit(slot);
        Some(out)
    }

    /// The value and tag of `key` if cached and live at `now_ms`, without touching the
    /// policy.
    pub fn peek(&self, key: &[u8], now_ms: u64) -> Option<(Bytes, u8)> {
        let sh = self.shard(key).lock();
        let slot = *sh.map.get(key)?;
        let s = sh.slots[slot as usize]
            .as_ref()
            .expect("mapped slot is live");
        (s.expire_ms == 0 || s.expire_ms > now_ms).then(|| (s.value.clone(), s.tag))
    }

    /// Whether `key` is cached (expired entries count as absent); does not count as a hit.
    pub fn contains(&self, key: &[u8], now_ms: u64) -> bool {
        self.value_len(key, now_ms).is_some()
    }

    /// The length of `key`'s value if it is held and live, without touching the policy.
    pub fn value_len(&self, key: &[u8], now_ms: u64) -> Option<usize> {
        self.peek(key, now_ms).map(|(v, _)| v.len())
    }

    /// [`HotCache::insert_tagged`] with tag 0.
    pub fn insert(&self, key: &[u8], value: Bytes, expire_ms: u64) -> bool {
        self.insert_tagged(key, value, expire_ms, 0)
    }

    /// Caches `value` (with `tag`) for `key`, replacing any cached value, evicting as needed.
    /// Returns false (and caches nothing) when the entry is too large for the cache to be
    /// useful.
    pub fn insert_tagged(&self, key: &[u8], value: Bytes, expire_ms: u64, tag: u8) -> bool {
        let charge = key.len() + value.len() + ENTRY_OVERHEAD_BYTES;
        let hash = self.hasher.hash_one(key);
        let mut sh = self.shard_of(hash).lock();
        if let Some(&slot) = sh.map.get(key) {
            if charge <= self.bytes_max / 2 {
                // An overwrite keeps its slot: the new value takes the old one's place, and
                // the write counts as an access.
                let s = sh.slots[slot as usize]
                    .as_mut()
                    .expect("mapped slot is live");
                let old_charge = std::mem::replace(&mut s.charge, charge);
                s.value = value;
                s.expire_ms = expire_ms;
                s.tag = tag;
                sh.bytes = sh.bytes - old_charge + charge;
                self.used.fetch_add(charge, Ordering::Relaxed);
                self.used.fetch_sub(old_charge, Ordering::Relaxed);
                sh.policy.on_hit(slot);
                self.publish(&sh);
                drop(sh);
                self.trim();
                return true;
            }
            sh.policy.on_remove(slot);
            let gone = sh.remove_slot(slot);
            self.used.fetch_sub(gone.charge, Ordering::Relaxed);
        }
        if charge > self.bytes_max / 2 {
            self.publish(&sh);
            self.rejected.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        // Make room in this shard while it holds its share of the budget or more; past that
        // the shards holding the most give way, once this lock is released. (Evicting only
        // from the shard written to would let shard sizes drift apart for good: one whose
        // space was freed by removals keeps it, and a shard's policy would decide for a
        // cache of any size.)
        let share = self.bytes_max / self.shards.len();
        while self.used.load(Ordering::Relaxed) + charge > self.bytes_max
            && sh.bytes + charge > share
        {
            let Some(victim) = sh.policy.victim() else {
                break;
            };
            let gone = sh.remove_slot(victim);
            self.used.fetch_sub(gone.charge, Ordering::Relaxed);
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
        let key = Bytes::copy_from_slice(key);
        let slot = match sh.free.pop() {
            Some(s) => s,
            None => {
                sh.slots.push(None);
                (sh.slots.len() - 1) as u32
            }
        };
        sh.slots[slot as usize] = Some(Slot {
            key: key.clone(),
            value,
            expire_ms,
            charge,
            tag,
        });
        sh.map.insert(key, slot);
        sh.bytes += charge;
        self.used.fetch_add(charge, Ordering::Relaxed);
        sh.policy.on_insert(slot, hash);
        self.publish(&sh);
        drop(sh);
        self.trim();
        true
    }

    /// Drops `key` from the cache if present.
    pub fn remove(&self, key: &[u8]) {
        let mut sh = self.shard(key).lock();
        if let Some(&slot) = sh.map.get(key) {
            sh.policy.on_remove(slot);
            let gone = sh.remove_slot(slot);
            self.used.fetch_sub(gone.charge, Ordering::Relaxed);
            self.publish(&sh);
        }
    }

    /// Evicts until under the budget, each time from the shard holding the most bytes, one
    /// lock at a time.
    fn trim(&self) {
        if self.used.load(Ordering::Relaxed) <= self.bytes_max {
            return;
        }
        let mut stuck = vec![false; self.shards.len()];
        while self.used.load(Ordering::Relaxed) > self.bytes_max {
            let Some(i) = (0..self.shards.len())
                .filter(|&i| !stuck[i])
                .max_by_key(|&i| self.loads[i].load(Ordering::Relaxed))
            else {
                return;
            };
            let mut sh = self.shards[i].lock();
            match sh.policy.victim() {
                Some(victim) => {
                    let gone = sh.remove_slot(victim);
                    self.used.fetch_sub(gone.charge, Ordering::Relaxed);
                    self.evictions.fetch_add(1, Ordering::Relaxed);
                }
                None => stuck[i] = true,
            }
            self.publish(&sh);
        }
    }

    /// Drops everything.
    pub fn clear(&self) {
        for m in self.shards.iter() {
            let mut sh = m.lock();
            let slots: Vec<u32> = sh.map.values().copied().collect();
            for slot in slots {
                sh.policy.on_remove(slot);
                let gone = sh.remove_slot(slot);
                self.used.fetch_sub(gone.charge, Ordering::Relaxed);
            }
            self.publish(&sh);
        }
    }

    pub fn stats(&self) -> HotStats {
        let mut st = HotStats {
            bytes_max: self.bytes_max as u64,
            evictions: self.evictions.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            ..Default::default()
        };
        for m in self.shards.iter() {
            let sh = m.lock();
            st.entries += sh.map.len() as u64;
            st.bytes += sh.bytes as u64;
        }
        st
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(bytes: usize) -> HotCache {
        HotCache::new(bytes, 1, || Box::new(Lru::default()))
    }

    /// A cache of `shards` with the policy named `policy` ("lru" or "strata").
    fn cache_with(policy: &str, bytes: usize, shards: usize) -> HotCache {
        let lru = policy == "lru";
        HotCache::new(bytes, shards, move || -> Box<dyn Policy> {
            if lru {
                Box::new(Lru::default())
            } else {
                Box::new(StrataHot::new(64))
            }
        })
    }

    #[test]
    fn strata_policy_keeps_reused_entries_through_a_scan() {
        let each = ENTRY_OVERHEAD_BYTES + 6;
        for (name, make) in [
            (
                "lru",
                Box::new(|| Box::new(Lru::default()) as Box<dyn Policy>)
                    as Box<dyn Fn() -> Box<dyn Policy>>,
            ),
            (
                "strata",
                Box::new(|| Box::new(StrataHot::new(64)) as Box<dyn Policy>),
            ),
        ] {
            let c = HotCache::new(10 * each, 1, make);
            for _ in 0..3 {
                for k in 0..5u8 {
                    if c.get(&[b'h', k], 0).is_none() {
                        c.insert(&[b'h', k], Bytes::from_static(b"v"), 0);
                    }
                }
            }
            for n in 0..10u32 {
                c.insert(format!("s{n:03}").as_bytes(), Bytes::from_static(b"v"), 0);
            }
            let kept = (0..5u8).filter(|&k| c.get(&[b'h', k], 0).is_some()).count();
            match name {
                "lru" => assert_eq!(kept, 0, "LRU loses the reused keys to a scan"),
                _ => assert_eq!(kept, 5, "Strata's policy keeps the reused keys"),
            }
        }
    }

    #[test]
    fn shards_keep_their_share_when_space_is_freed_in_one_of_them() {
        // Keys removed from shard 0 free space there; new keys in other shards must not keep
        // it (evicting only from the shard written to let shard 0 drain to nothing).
        for policy in ["lru", "strata"] {
            let each = ENTRY_OVERHEAD_BYTES + 6 + 1;
            let c = cache_with(policy, 400 * each, 4);
            let in_shard_0 = |k: &[u8]| std::ptr::eq(c.shard(k), &c.shards[0]);
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
            let held: Vec<usize> = c.shards.iter().map(|s| s.lock().map.len()).collect();
            assert!(
                held.iter().all(|&n| n >= 80),
                "{policy}: entries per shard {held:?}"
            );
            assert!(c.stats().bytes <= c.stats().bytes_max);
        }
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
        for policy in ["lru", "strata"] {
            let each = ENTRY_OVERHEAD_BYTES + 4 + 10;
            let c = cache_with(policy, 10 * each, 1);
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
            assert_eq!(c.stats().entries, 10, "{policy}");
            assert_eq!(c.stats().bytes, 10 * each as u64, "{policy}");
            // Larger: the budget holds, by evicting.
            assert!(c.insert(b"k004", Bytes::from(vec![3u8; 100]), 0));
            let st = c.stats();
            assert!(st.bytes <= st.bytes_max, "{policy}: {st:?}");
            assert!(st.evictions > 0, "{policy}: {st:?}");
            // Smaller: the bytes shrink with it.
            let before = c.stats().bytes;
            if c.get(b"k003", 0).is_some() {
                assert!(c.insert(b"k003", Bytes::from_static(b"x"), 0));
                assert_eq!(c.stats().bytes, before - 9, "{policy}");
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
}
