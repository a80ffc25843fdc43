//! S3-FIFO (Yang et al., SOSP'23): a small FIFO that filters one-hit wonders, a main FIFO
//! with 2-bit frequencies and reinsertion, and a ghost FIFO of recently evicted keys.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::BlockCache;

pub struct S3Fifo {
    small_cap: usize,
    main_cap: usize,
    small: VecDeque<u64>,
    main: VecDeque<u64>,
    ghost: VecDeque<u64>,
    ghost_set: HashSet<u64>,
    /// key -> (frequency 0..=3, in main)
    entries: HashMap<u64, (u8, bool)>,
}

impl S3Fifo {
    pub fn new(capacity: usize) -> Self {
        let small_cap = (capacity / 10).max(1);
        S3Fifo {
            small_cap,
            main_cap: capacity.saturating_sub(small_cap).max(1),
            small: VecDeque::new(),
            main: VecDeque::new(),
            ghost: VecDeque::new(),
            ghost_set: HashSet::new(),
            entries: HashMap::new(),
        }
    }

    fn push_ghost(&mut self, key: u64) {
        self.ghost.push_back(key);
        self.ghost_set.insert(key);
        while self.ghost.len() > self.main_cap {
            if let Some(g) = self.ghost.pop_front() {
                self.ghost_set.remove(&g);
            }
        }
    }

    fn evict_main(&mut self) {
        while let Some(k) = self.main.pop_front() {
            let e = self.entries.get_mut(&k).expect("main key has an entry");
            if e.0 > 0 {
                e.0 -= 1;
                self.main.push_back(k);
            } else {
                self.entries.remove(&k);
                return;
            }
        }
    }

    fn evict_small(&mut self) {
        while let Some(k) = self.small.pop_front() {
            let e = self.entries.get_mut(&k).expect("small key has an entry");
            if e.0 > 0 {
                e.0 = 0;
                e.1 = true;
                self.main.push_back(k);
                if self.main.len() > self.main_cap {
                    self.evict_main();
                }
            } else {
                self.entries.remove(&k);
                self.push_ghost(k);
                return;
            }
        }
    }
}

impl BlockCache for S3Fifo {
    fn contains(&self, key: u64) -> bool {
        self.entries.contains_key(&key)
    }

    fn access(&mut self, key: u64, _t: usize) {
        if let Some(e) = self.entries.get_mut(&key) {
            e.0 = (e.0 + 1).min(3);
            return;
        }
        if self.ghost_set.remove(&key) {
            if let Some(pos) = self.ghost.iter().position(|&g| g == key) {
                self.ghost.remove(pos);
            }
            if self.main.len() >= self.main_cap {
                self.evict_main();
            }
            self.main.push_back(key);
            self.entries.insert(key, (0, true));
        } else {
            if self.small.len() >= self.small_cap {
                self.evict_small();
            }
            self.small.push_back(key);
            self.entries.insert(key, (0, false));
        }
    }
}
