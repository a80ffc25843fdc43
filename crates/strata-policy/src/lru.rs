//! Least recently used.

use std::collections::{BTreeMap, HashMap};

use crate::BlockCache;

pub struct Lru {
    capacity: usize,
    /// key -> last access stamp
    stamp: HashMap<u64, u64>,
    /// stamp -> key, oldest first
    order: BTreeMap<u64, u64>,
    clock: u64,
}

impl Lru {
    pub fn new(capacity: usize) -> Self {
        Lru {
            capacity,
            stamp: HashMap::new(),
            order: BTreeMap::new(),
            clock: 0,
        }
    }
}

impl BlockCache for Lru {
    fn contains(&self, key: u64) -> bool {
        self.stamp.contains_key(&key)
    }

    fn access(&mut self, key: u64, _t: usize) {
        self.clock += 1;
        if let Some(old) = self.stamp.insert(key, self.clock) {
            self.order.remove(&old);
        } else if self.stamp.len() > self.capacity {
            let (_, victim) = self.order.pop_first().expect("non-empty");
            self.stamp.remove(&victim);
        }
        self.order.insert(self.clock, key);
    }
}
