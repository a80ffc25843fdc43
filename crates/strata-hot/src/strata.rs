//! Strata's policy (from `strata-policy`) over the slots of one shard: frequency-weighted
//! aging, with a low weight for keys seen once. Chains are not learned here: the keys of
//! one request spread over many shards.

use strata_policy::{IdMap, StrataPolicy};

use crate::Policy;

pub struct StrataHot {
    inner: StrataPolicy,
    /// Key hash of each live slot, by slot number (slots are dense).
    hash_of: Vec<Option<u64>>,
    slot_of: IdMap<u32>,
    /// Evictions until the policy's size is checked against the entries held again.
    until_sized: usize,
}

impl StrataHot {
    /// `entries_hint`: about how many entries the shard holds (sizes the frequency sketch).
    pub fn new(entries_hint: usize) -> Self {
        StrataHot {
            inner: StrataPolicy::light(entries_hint.max(64)),
            hash_of: Vec::new(),
            slot_of: IdMap::default(),
            until_sized: 0,
        }
    }

    /// The number of entries the policy is sized for now.
    pub fn capacity(&self) -> usize {
        self.inner.capacity()
    }

    /// A shard evicts when it holds its share of the byte budget, so the entries it holds
    /// then (and the one arriving) are its capacity, whatever the hint guessed from an
    /// assumed entry size. At the first eviction and then once per turnover of the shard,
    /// the policy is resized when it is off by more than a quarter: its frequency sketch
    /// ages over that many accesses and its tuner models a cache of that size.
    fn learn_capacity(&mut self) {
        if self.until_sized > 0 {
            self.until_sized -= 1;
            return;
        }
        let held = self.slot_of.len() + 1;
        let sized = self.inner.capacity();
        if held * 4 > sized * 5 || held * 5 < sized * 4 {
            self.inner.resize(held);
        }
        self.until_sized = self.inner.capacity();
    }
}

impl Policy for StrataHot {
    fn name(&self) -> &'static str {
        "strata"
    }

    fn on_insert(&mut self, slot: u32, key_hash: u64) {
        // Two live keys with one 64-bit hash would share an entry; the older one is
        // forgotten by the policy and stays until removed (a 2^-64 event per pair).
        if let Some(old) = self.slot_of.insert(key_hash, slot) {
            self.hash_of[old as usize] = None;
        }
        let i = slot as usize;
        if self.hash_of.len() <= i {
            self.hash_of.resize(i + 1, None);
        }
        self.hash_of[i] = Some(key_hash);
        self.inner.touch(key_hash);
    }

    fn on_hit(&mut self, slot: u32) {
        if let Some(&Some(h)) = self.hash_of.get(slot as usize) {
            self.inner.touch(h);
        }
    }

    fn on_remove(&mut self, slot: u32) {
        if let Some(h) = self.hash_of.get_mut(slot as usize).and_then(Option::take) {
            self.slot_of.remove(&h);
            self.inner.remove(h);
        }
    }

    fn victim(&mut self) -> Option<u32> {
        self.learn_capacity();
        while let Some(h) = self.inner.pop_victim() {
            if let Some(slot) = self.slot_of.remove(&h) {
                self.hash_of[slot as usize] = None;
                return Some(slot);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_is_sized_for_the_entries_the_shard_holds_not_the_hint() {
        // Hinted 64 entries; the byte budget holds 500 (smaller values than assumed).
        let mut p = StrataHot::new(64);
        let mut held = std::collections::HashSet::new();
        for i in 0..5_000u32 {
            if held.len() == 500 {
                let v = p.victim().expect("a victim");
                assert!(held.remove(&v));
            }
            p.on_insert(i, u64::from(i).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            held.insert(i);
        }
        assert!(
            (400..=625).contains(&p.capacity()),
            "sized for {} entries, holds 500",
            p.capacity()
        );
    }
}
