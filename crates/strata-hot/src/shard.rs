//! One shard: a hash table of compact entries, each carrying its own eviction state (a
//! priority and a small frequency count), so a hit reads the table, the entry and its block
//! and nothing else, and the policy costs no memory of its own. Eviction samples entries
//! at random (buckets of the table) and takes the lowest priority (Redis's approximation of
//! LRU and LFU), exactly when the shard holds few entries. A slot is a bucket of the table:
//! valid until the next insert or removal.

use bytes::Bytes;
use hashbrown::HashTable;

use crate::entry::Data;

/// How a shard chooses what to evict. Both keep their state in the entries (a priority
/// and a frequency count) and evict the lowest priority among a random sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyKind {
    /// The entry read or written least recently.
    Lru,
    /// Frequency-weighted aging: an entry's priority is the shard's inflation (the last
    /// victim's priority) at its last access plus a weight that grows with how often it
    /// was accessed; an entry seen once weighs least, so a scan does not push out reused
    /// entries, and entries not touched for a while fall behind.
    Strata,
}

/// Entries looked at to choose one victim.
pub(crate) const SAMPLES: usize = 10;
/// Victims a look at every entry (when a sample found no clean one) sets aside for the
/// next evictions, so that clean entries among mostly dirty ones cost one look at the
/// shard per this many evictions, not one each.
const SPARE_VICTIMS_MAX: usize = 256;
/// Priorities are rebased when the shard's clock passes this (so they never wrap).
const CLOCK_REBASE_AT: u32 = 1 << 31;
/// Under `Strata`, frequencies above this count the same.
const FREQUENCY_MAX: u8 = 8;

/// What a touch adds to an entry's priority under `Strata` (frequency-weighted aging, in the
/// GreedyDual-Size-Frequency family): an entry seen once weighs half of one seen twice, and
/// weight grows with frequency up to `FREQUENCY_MAX`.
fn weight(frequency: u8) -> u32 {
    match frequency {
        0 | 1 => 1,
        f => 2 * u32::from(f),
    }
}

pub(crate) struct Entry {
    pub(crate) data: Data,
    /// Lower is evicted first. `Lru`: the shard's clock at the last touch. `Strata`: the
    /// shard's inflation at the last touch plus the weight of the entry's frequency.
    prio: u32,
    frequency: u8,
    pub(crate) tag: u8,
    /// The only copy of an acknowledged write (the engine's write-back): never evicted.
    pub(crate) dirty: bool,
    /// Dirty, and the log has no record of this value yet (see `HotCache::drain_unlogged`).
    pub(crate) unlogged: bool,
}

pub(crate) struct Shard {
    /// Its place in `HotCache::shards` (and `loads`).
    pub(crate) index: usize,
    table: HashTable<Entry>,
    pub(crate) bytes: usize,
    policy: PolicyKind,
    /// `Lru`: counts touches. `Strata`: the priority of the last victim (the inflation).
    clock: u32,
    rng: u64,
    /// Hashes of entries marked unlogged since the last drain (some may since be logged,
    /// clean or gone: a drain checks the mark).
    pub(crate) unlogged: Vec<u64>,
    /// How many entries are dirty: with all of them, there is nothing to evict, and
    /// [`Shard::victim`] says so without looking.
    dirty_entries: usize,
    /// Priorities and slots of clean entries of the lowest priorities the last look at
    /// every entry found (the lowest last), and of entries written back while the cache was
    /// over budget. A slot may since hold another entry, or be dirty or touched: taken only
    /// if it still holds a clean entry of that priority.
    spare_victims: Vec<(u32, usize)>,
}

impl Shard {
    pub(crate) fn new(index: usize, policy: PolicyKind) -> Shard {
        Shard {
            index,
            table: HashTable::new(),
            bytes: 0,
            policy,
            clock: 0,
            rng: 0x9E37_79B9_7F4A_7C15 ^ index as u64,
            unlogged: Vec::new(),
            dirty_entries: 0,
            spare_victims: Vec::new(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    /// The slot of `key`, hashed to `hash`.
    pub(crate) fn find(&self, hash: u64, key: &[u8]) -> Option<usize> {
        self.table.find_bucket_index(hash, |e| e.data.key() == key)
    }

    /// Starts loading what [`Shard::find`] of a key hashed to `hash` reads, waiting for
    /// none of it: the table's group and buckets (probed, so the processor overlaps the
    /// probes of a batch) and the blocks of the entries whose tags match (prefetched).
    pub(crate) fn prefetch(&self, hash: u64) {
        self.table.find(hash, |e| {
            e.data.prefetch();
            false
        });
    }

    pub(crate) fn entry(&self, slot: usize) -> &Entry {
        self.table.get_bucket(slot).expect("a live slot")
    }

    pub(crate) fn entry_mut(&mut self, slot: usize) -> &mut Entry {
        self.table.get_bucket_mut(slot).expect("a live slot")
    }

    /// The priority an access gives `e` now (moving the shard's clock, under `Lru`).
    fn touched(&mut self, frequency: u8) -> (u32, u8) {
        if self.clock >= CLOCK_REBASE_AT {
            self.rebase();
        }
        match self.policy {
            PolicyKind::Lru => {
                self.clock += 1;
                (self.clock, frequency)
            }
            PolicyKind::Strata => {
                let f = (frequency + 1).min(FREQUENCY_MAX);
                (self.clock + weight(f), f)
            }
        }
    }

    /// Records an access of `slot`.
    pub(crate) fn touch(&mut self, slot: usize) {
        let (prio, frequency) = self.touched(self.entry(slot).frequency);
        let e = self.entry_mut(slot);
        e.prio = prio;
        e.frequency = frequency;
    }

    /// Gives `slot` new contents, as an access; returns its old data and whether it was
    /// dirty.
    pub(crate) fn replace(
        &mut self,
        slot: usize,
        data: Data,
        tag: u8,
        dirty: bool,
    ) -> (Data, bool) {
        self.touch(slot);
        let was_dirty = self.set_dirty(slot, dirty);
        let e = self.entry_mut(slot);
        e.tag = tag;
        e.unlogged &= dirty;
        let old = std::mem::replace(&mut e.data, data);
        (old, was_dirty)
    }

    /// Offers `slot` (a clean entry) as a victim for when a sample finds none.
    pub(crate) fn offer_victim(&mut self, slot: usize) {
        if self.spare_victims.len() < SPARE_VICTIMS_MAX {
            self.spare_victims.push((self.entry(slot).prio, slot));
        }
    }

    /// How many entries are dirty.
    #[cfg(test)]
    pub(crate) fn dirty_entries(&self) -> usize {
        self.dirty_entries
    }

    /// Marks `slot` dirty or clean; returns whether it was dirty.
    pub(crate) fn set_dirty(&mut self, slot: usize, dirty: bool) -> bool {
        let was = std::mem::replace(&mut self.entry_mut(slot).dirty, dirty);
        if was != dirty {
            if dirty {
                self.dirty_entries += 1;
            } else {
                self.dirty_entries -= 1;
            }
        }
        was
    }

    /// Adds an entry for a key the shard does not hold, as its first access; returns its
    /// slot.
    pub(crate) fn insert(
        &mut self,
        hash: u64,
        data: Data,
        tag: u8,
        dirty: bool,
        hasher: &ahash::RandomState,
    ) -> usize {
        let (prio, frequency) = self.touched(0);
        self.dirty_entries += usize::from(dirty);
        let e = Entry {
            data,
            prio,
            frequency,
            tag,
            dirty,
            unlogged: false,
        };
        self.table
            .insert_unique(hash, e, |e| hasher.hash_one(e.data.key()))
            .bucket_index()
    }

    /// The entries of keys hashed to `hash`.
    pub(crate) fn entries_of(&mut self, hash: u64) -> impl Iterator<Item = &mut Entry> {
        self.table.iter_hash_mut(hash)
    }

    /// Takes `slot` out and returns it.
    pub(crate) fn remove(&mut self, slot: usize, hasher: &ahash::RandomState) -> Entry {
        let gone = match self.table.get_bucket_entry(slot) {
            Ok(e) => e.remove().0,
            Err(_) => panic!("a live slot"),
        };
        self.dirty_entries -= usize::from(gone.dirty);
        // Give back what a shard that held far more than it does now no longer needs.
        if self.table.capacity() > 64 && self.table.len() < self.table.capacity() / 4 {
            let len = self.table.len();
            self.table
                .shrink_to(len * 2, |e| hasher.hash_one(e.data.key()));
            self.spare_victims.clear();
        }
        gone
    }

    /// The next random bucket number.
    fn random_bucket(&mut self) -> usize {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng % self.table.num_buckets() as u64) as usize
    }

    /// Chooses the slot to evict next: the lowest priority among a sample of clean entries
    /// (or among all, in a small shard). Under `Strata` the shard's inflation rises to the
    /// victim's priority, so entries not touched since fall behind the ones touched.
    pub(crate) fn victim(&mut self) -> Option<usize> {
        fn consider(best: &mut Option<(u32, usize)>, slot: usize, e: &Entry) {
            if !e.dirty && best.is_none_or(|(p, _)| e.prio < p) {
                *best = Some((e.prio, slot));
            }
        }
        if self.dirty_entries == self.table.len() {
            return None;
        }
        let mut best = None;
        if self.table.len() > 2 * SAMPLES {
            // Each sample is the first occupied bucket from a random one (the table is at
            // least 3/8 full, so a few steps at most). When the best of the first round is
            // an entry seen more than once, a second round looks further: evicting a reused
            // entry while entries seen once remain would, under `Strata`, raise the
            // inflation past the other reused entries and let a scan push them all out.
            for i in 0..2 * SAMPLES {
                if i == SAMPLES && best.is_some_and(|(_, s)| self.entry(s).frequency <= 1) {
                    break;
                }
                let mut b = self.random_bucket();
                loop {
                    if let Some(e) = self.table.get_bucket(b) {
                        consider(&mut best, b, e);
                        break;
                    }
                    b = (b + 1) % self.table.num_buckets();
                }
            }
        }
        let small = self.table.len() <= 2 * SAMPLES;
        while best.is_none() && !small {
            let Some((prio, slot)) = self.spare_victims.pop() else {
                break;
            };
            if let Some(e) = self.table.get_bucket(slot).filter(|e| e.prio == prio) {
                consider(&mut best, slot, e);
            }
        }
        if best.is_none() {
            // A small shard, or a sample of dirty entries only: look at every entry, and
            // keep the next victims.
            let mut lowest = std::collections::BinaryHeap::new();
            for b in 0..self.table.num_buckets() {
                if let Some(e) = self.table.get_bucket(b).filter(|e| !e.dirty) {
                    lowest.push((e.prio, b));
                    if lowest.len() > SPARE_VICTIMS_MAX + 1 {
                        lowest.pop();
                    }
                }
            }
            let mut spare = lowest.into_sorted_vec();
            spare.reverse();
            best = spare.pop();
            self.spare_victims = spare;
        }
        let (prio, slot) = best?;
        if self.policy == PolicyKind::Strata {
            self.clock = self.clock.max(prio);
        }
        Some(slot)
    }

    /// Lowers every priority and the clock by the same amount, keeping their order but for
    /// the oldest entries, which become equally old.
    fn rebase(&mut self) {
        let by = self.clock / 2;
        self.clock -= by;
        for e in self.table.iter_mut() {
            e.prio = e.prio.saturating_sub(by);
        }
    }

    /// Every entry, for reading.
    pub(crate) fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.table.iter()
    }

    /// Moves the packed entries among `count` entries from the `from`th (in the table's
    /// order) to fresh allocations: all the new blocks are taken before any old one is
    /// freed, so none lands in a hole the previous move just left. Returns the bytes moved,
    /// and where the next such call starts (`None`: the table's end).
    pub(crate) fn relocate(&mut self, from: usize, count: usize) -> (usize, Option<usize>) {
        let moved: Vec<Option<Data>> = self
            .table
            .iter()
            .skip(from)
            .take(count)
            .map(|e| e.data.relocated())
            .collect();
        let next = (from + count < self.table.len()).then_some(from + count);
        let mut old = Vec::with_capacity(moved.len());
        let mut bytes = 0;
        for (e, new) in self.table.iter_mut().skip(from).zip(moved) {
            if let Some(new) = new {
                bytes += new.key().len() + new.value().len();
                old.push(std::mem::replace(&mut e.data, new));
            }
        }
        drop(old);
        (bytes, next)
    }

    /// Takes out every entry for which `drop` says so; returns them.
    pub(crate) fn remove_where(
        &mut self,
        drop: impl Fn(&Entry) -> bool,
        hasher: &ahash::RandomState,
    ) -> Vec<Entry> {
        let gone: Vec<Entry> = self.table.extract_if(|e| drop(e)).collect();
        self.dirty_entries -= gone.iter().filter(|e| e.dirty).count();
        let len = self.table.len();
        self.table.shrink_to(len, |e| hasher.hash_one(e.data.key()));
        self.spare_victims.clear();
        gone
    }
}

impl Entry {
    /// Its priority: lower is evicted (or, dirty, written back) first.
    pub(crate) fn prio(&self) -> u32 {
        self.prio
    }

    pub(crate) fn value(&self) -> Bytes {
        self.data.value_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_two_words() {
        assert_eq!(std::mem::size_of::<Entry>(), 16);
    }

    #[test]
    fn removal_keeps_every_other_entry_findable() {
        let h = ahash::RandomState::with_seeds(1, 2, 3, 4);
        let mut s = Shard::new(0, PolicyKind::Lru);
        let key = |i: u32| format!("key{i}").into_bytes();
        for i in 0..1000 {
            s.insert(
                h.hash_one(key(i)),
                Data::new(&key(i), Bytes::new(), 0),
                0,
                false,
                &h,
            );
        }
        for i in (0..1000).step_by(3) {
            let slot = s.find(h.hash_one(key(i)), &key(i)).expect("held");
            assert_eq!(s.remove(slot, &h).data.key(), &key(i)[..]);
        }
        for i in 0..1000 {
            let found = s.find(h.hash_one(key(i)), &key(i));
            assert_eq!(found.is_some(), i % 3 != 0, "key {i}");
            if let Some(slot) = found {
                assert_eq!(s.entry(slot).data.key(), &key(i)[..]);
            }
        }
        assert_eq!(s.len(), 666);
    }

    #[test]
    fn rebasing_keeps_the_order_of_recent_entries() {
        let h = ahash::RandomState::with_seeds(1, 2, 3, 4);
        let mut s = Shard::new(0, PolicyKind::Lru);
        for i in 0..3u8 {
            s.insert(
                h.hash_one([i]),
                Data::new(&[i], Bytes::new(), 0),
                0,
                false,
                &h,
            );
        }
        s.clock = CLOCK_REBASE_AT;
        let slot = |s: &Shard, i: u8| s.find(h.hash_one([i]), &[i]).unwrap();
        s.touch(slot(&s, 2));
        s.touch(slot(&s, 1));
        assert!(s.clock < CLOCK_REBASE_AT);
        assert_eq!(s.victim(), Some(slot(&s, 0)));
        assert!(s.entry(slot(&s, 2)).prio < s.entry(slot(&s, 1)).prio);
    }

    #[test]
    fn clean_entries_among_dirty_ones_are_all_evicted_and_then_none() {
        let h = ahash::RandomState::with_seeds(1, 2, 3, 4);
        let mut s = Shard::new(0, PolicyKind::Lru);
        let key = |i: u32| format!("key{i}").into_bytes();
        // 5,000 entries, one in a hundred clean: a sample of 20 finds none most times.
        for i in 0..5000 {
            let data = Data::new(&key(i), Bytes::new(), 0);
            s.insert(h.hash_one(key(i)), data, 0, i % 100 != 0, &h);
        }
        assert_eq!(s.dirty_entries(), 4950);
        let mut evicted = Vec::new();
        while let Some(slot) = s.victim() {
            assert!(!s.entry(slot).dirty);
            evicted.push(s.remove(slot, &h).data.key().to_vec());
        }
        // Every clean entry (in about the order they came: a sample that finds one takes
        // the best it saw), and the dirty ones stay.
        let mut clean: Vec<Vec<u8>> = (0..5000).step_by(100).map(key).collect();
        clean.sort();
        evicted.sort();
        assert_eq!(evicted, clean);
        assert_eq!((s.len(), s.dirty_entries()), (4950, 4950));
        // One written back becomes the next victim.
        let slot = s.find(h.hash_one(key(7)), &key(7)).unwrap();
        assert!(s.set_dirty(slot, false));
        assert_eq!(s.victim(), Some(slot));
        assert_eq!(s.dirty_entries(), 4949);
    }

    #[test]
    fn a_victim_set_aside_and_touched_since_is_not_taken_before_older_ones() {
        let h = ahash::RandomState::with_seeds(1, 2, 3, 4);
        let mut s = Shard::new(0, PolicyKind::Lru);
        let key = |i: u32| format!("key{i}").into_bytes();
        // Two clean entries among 5,000: the older is the victim, the newer set aside.
        for i in 0..5000 {
            let data = Data::new(&key(i), Bytes::new(), 0);
            s.insert(h.hash_one(key(i)), data, 0, i != 10 && i != 20, &h);
        }
        let slot = |s: &Shard, i: u32| s.find(h.hash_one(key(i)), &key(i)).unwrap();
        assert_eq!(s.victim(), Some(slot(&s, 10)));
        s.remove(slot(&s, 10), &h);
        // The one set aside is read (now the most recent), and an older one is written back:
        // the older one goes first.
        s.touch(slot(&s, 20));
        s.set_dirty(slot(&s, 5), false);
        assert_eq!(s.victim(), Some(slot(&s, 5)));
    }
}
