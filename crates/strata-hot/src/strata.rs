//! Strata's policy (from `strata-policy`) over the slots of one shard: frequency-weighted
//! aging, with a low weight for keys seen once. Chains are not learned here: the keys of
//! one request spread over many shards.

use std::collections::HashMap;

use strata_policy::StrataPolicy;

use crate::Policy;

pub struct StrataHot {
    inner: StrataPolicy,
    /// Key hash of each live slot, by slot number (slots are dense).
    hash_of: Vec<Option<u64>>,
    slot_of: HashMap<u64, u32>,
}

impl StrataHot {
    /// `entries_hint`: about how many entries the shard holds (sizes the frequency sketch).
    pub fn new(entries_hint: usize) -> Self {
        StrataHot {
            inner: StrataPolicy::light(entries_hint.max(64)),
            hash_of: Vec::new(),
            slot_of: HashMap::new(),
        }
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
        while let Some(h) = self.inner.pop_victim() {
            if let Some(slot) = self.slot_of.remove(&h) {
                self.hash_of[slot as usize] = None;
                return Some(slot);
            }
        }
        None
    }
}
