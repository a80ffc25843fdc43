//! One shard: a hash table of slot numbers over a dense array of entries, each entry
//! carrying its own eviction state (a priority and a small frequency count), so a hit reads
//! the table, the entry and its block and nothing else, and the policy costs no memory of
//! its own. Eviction samples entries at random and takes the lowest priority (Redis's
//! approximation of LRU and LFU), exactly when the shard holds few entries.

use bytes::Bytes;
use hashbrown::HashTable;

use crate::entry::Data;
use crate::PolicyKind;

/// Entries looked at to choose one victim.
const SAMPLES: usize = 10;
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
}

pub(crate) struct Shard {
    /// Its place in `HotCache::shards` (and `loads`).
    pub(crate) index: usize,
    /// Slot numbers, hashed by their entries' keys.
    table: HashTable<u32>,
    /// Dense: a removal moves the last entry into the hole.
    pub(crate) entries: Vec<Entry>,
    pub(crate) bytes: usize,
    policy: PolicyKind,
    /// `Lru`: counts touches. `Strata`: the priority of the last victim (the inflation).
    clock: u32,
    rng: u64,
}

impl Shard {
    pub(crate) fn new(index: usize, policy: PolicyKind) -> Shard {
        Shard {
            index,
            table: HashTable::new(),
            entries: Vec::new(),
            bytes: 0,
            policy,
            clock: 0,
            rng: 0x9E37_79B9_7F4A_7C15 ^ index as u64,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The slot of `key`, hashed to `hash`.
    pub(crate) fn find(&self, hash: u64, key: &[u8]) -> Option<usize> {
        let entries = &self.entries;
        self.table
            .find(hash, |&s| entries[s as usize].data.key() == key)
            .map(|&s| s as usize)
    }

    pub(crate) fn entry(&self, slot: usize) -> &Entry {
        &self.entries[slot]
    }

    /// Records an access of `slot`.
    pub(crate) fn touch(&mut self, slot: usize) {
        let e = &mut self.entries[slot];
        match self.policy {
            PolicyKind::Lru => {
                self.clock += 1;
                e.prio = self.clock;
            }
            PolicyKind::Strata => {
                e.frequency = (e.frequency + 1).min(FREQUENCY_MAX);
                e.prio = self.clock + weight(e.frequency);
            }
        }
        if self.clock >= CLOCK_REBASE_AT {
            self.rebase();
        }
    }

    pub(crate) fn entry_mut(&mut self, slot: usize) -> &mut Entry {
        &mut self.entries[slot]
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
        let e = &mut self.entries[slot];
        e.tag = tag;
        let was_dirty = std::mem::replace(&mut e.dirty, dirty);
        let old = std::mem::replace(&mut e.data, data);
        self.touch(slot);
        (old, was_dirty)
    }

    /// Adds an entry for a key the shard does not hold, as its first access.
    pub(crate) fn insert(
        &mut self,
        hash: u64,
        data: Data,
        tag: u8,
        dirty: bool,
        hasher: &ahash::RandomState,
    ) {
        let slot = self.entries.len() as u32;
        self.entries.push(Entry {
            data,
            prio: 0,
            frequency: 0,
            tag,
            dirty,
        });
        let entries = &self.entries;
        self.table.insert_unique(hash, slot, |&s| {
            hasher.hash_one(entries[s as usize].data.key())
        });
        self.touch(slot as usize);
    }

    /// Takes `slot` out (the last entry moves into its place) and returns it.
    pub(crate) fn remove(&mut self, slot: usize, hasher: &ahash::RandomState) -> Entry {
        let hash = hasher.hash_one(self.entries[slot].data.key());
        self.table
            .find_entry(hash, |&s| s as usize == slot)
            .expect("a live slot is in the table")
            .remove();
        let last = self.entries.len() - 1;
        if slot != last {
            let moved = hasher.hash_one(self.entries[last].data.key());
            *self
                .table
                .find_mut(moved, |&s| s as usize == last)
                .expect("a live slot is in the table") = slot as u32;
        }
        let gone = self.entries.swap_remove(slot);
        // Give back what a shard that held far more than it does now no longer needs.
        if self.entries.capacity() > 64 && self.entries.len() < self.entries.capacity() / 4 {
            self.entries.shrink_to(self.entries.len() * 2);
            let entries = &self.entries;
            self.table.shrink_to(entries.len(), |&s| {
                hasher.hash_one(entries[s as usize].data.key())
            });
        }
        gone
    }

    /// Chooses the slot to evict next: the lowest priority among a sample of clean entries
    /// (or among all, in a small shard). Under `Strata` the shard's inflation rises to the
    /// victim's priority, so entries not touched since fall behind the ones touched.
    pub(crate) fn victim(&mut self) -> Option<usize> {
        let n = self.entries.len();
        let entries = &self.entries;
        let lowest = |slots: &mut dyn Iterator<Item = usize>| {
            slots
                .filter(|&s| !entries[s].dirty)
                .min_by_key(|&s| entries[s].prio)
        };
        let mut slot = None;
        if n > 2 * SAMPLES {
            let picks: [usize; SAMPLES] = std::array::from_fn(|_| {
                self.rng ^= self.rng << 13;
                self.rng ^= self.rng >> 7;
                self.rng ^= self.rng << 17;
                (self.rng % n as u64) as usize
            });
            slot = lowest(&mut picks.into_iter());
        }
        // A small shard, or a sample of dirty entries only: look at every entry.
        let slot = match slot {
            Some(s) => s,
            None => lowest(&mut (0..n))?,
        };
        if self.policy == PolicyKind::Strata {
            self.clock = self.clock.max(self.entries[slot].prio);
            if self.clock >= CLOCK_REBASE_AT {
                self.rebase();
            }
        }
        Some(slot)
    }

    /// Lowers every priority and the clock by the same amount, keeping their order but for
    /// the oldest entries, which become equally old.
    fn rebase(&mut self) {
        let by = self.clock / 2;
        self.clock -= by;
        for e in &mut self.entries {
            e.prio = e.prio.saturating_sub(by);
        }
    }

    /// Takes out every entry for which `drop` says so; returns them.
    pub(crate) fn remove_where(
        &mut self,
        drop: impl Fn(&Entry) -> bool,
        hasher: &ahash::RandomState,
    ) -> Vec<Entry> {
        if self.entries.iter().all(&drop) {
            self.table = HashTable::new();
            return std::mem::take(&mut self.entries);
        }
        let mut gone = Vec::new();
        let mut slot = 0;
        while slot < self.entries.len() {
            if drop(&self.entries[slot]) {
                gone.push(self.remove(slot, hasher));
            } else {
                slot += 1;
            }
        }
        gone
    }
}

impl Entry {
    pub(crate) fn value(&self) -> Bytes {
        self.data.value_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_three_words() {
        assert!(std::mem::size_of::<Entry>() <= 24);
    }

    #[test]
    fn removal_keeps_the_table_and_the_dense_array_in_step() {
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
        s.clock = CLOCK_REBASE_AT - 2;
        s.touch(2);
        s.touch(1);
        assert!(s.clock < CLOCK_REBASE_AT);
        assert_eq!(s.victim(), Some(0));
        assert!(s.entries[2].prio < s.entries[1].prio);
    }
}
