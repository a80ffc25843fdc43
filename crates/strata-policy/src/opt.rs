//! Belady's offline optimum: evict the block whose next use is furthest in the future.

use std::collections::{BTreeSet, HashMap};

use crate::BlockCache;

pub struct Opt {
    capacity: usize,
    /// next_use[t]: the position of the next access of the key accessed at t (or MAX).
    next_use: Vec<usize>,
    /// key -> its next use, for keys in the cache
    cached: HashMap<u64, usize>,
    by_next: BTreeSet<(usize, u64)>,
}

impl Opt {
    /// Precomputes next uses over the flattened access sequence the replay will make.
    pub fn new(capacity: usize, accesses: &[u64]) -> Self {
        let mut next_use = vec![usize::MAX; accesses.len()];
        let mut seen: HashMap<u64, usize> = HashMap::new();
        for (t, &k) in accesses.iter().enumerate().rev() {
            if let Some(&n) = seen.get(&k) {
                next_use[t] = n;
            }
            seen.insert(k, t);
        }
        Opt {
            capacity,
            next_use,
            cached: HashMap::new(),
            by_next: BTreeSet::new(),
        }
    }
}

impl BlockCache for Opt {
    fn contains(&self, key: u64) -> bool {
        self.cached.contains_key(&key)
    }

    fn access(&mut self, key: u64, t: usize) {
        let next = self.next_use.get(t).copied().unwrap_or(usize::MAX);
        if let Some(old) = self.cached.insert(key, next) {
            self.by_next.remove(&(old, key));
            self.by_next.insert((next, key));
            return;
        }
        if self.cached.len() > self.capacity {
            // Bypass: if the new block is the one used furthest away, do not keep it.
            let &(far, victim) = self.by_next.last().expect("non-empty");
            if far >= next {
                self.by_next.remove(&(far, victim));
                self.cached.remove(&victim);
            } else {
                self.cached.remove(&key);
                return;
            }
        }
        self.by_next.insert((next, key));
    }
}
