//! W-TinyLFU (Einziger et al.): a 1% LRU window, then admission into a segmented LRU main
//! cache only when the candidate's estimated frequency beats the main victim's. Frequencies
//! come from the shared count-min sketch (`sketch.rs`).

use crate::sketch::Sketch;
use crate::BlockCache;

/// The window and the segmented main cache (probation, protected), each an LRU kept as
/// stamp-ordered maps.
pub struct WTinyLfu {
    window_cap: usize,
    protected_cap: usize,
    main_cap: usize,
    sketch: Sketch,
    clock: usize,
    /// Keys currently in window, probation and protected, for eviction bookkeeping.
    window_keys: std::collections::BTreeMap<usize, u64>,
    window_stamp: std::collections::HashMap<u64, usize>,
    probation_keys: std::collections::BTreeMap<usize, u64>,
    probation_stamp: std::collections::HashMap<u64, usize>,
    protected_keys: std::collections::BTreeMap<usize, u64>,
    protected_stamp: std::collections::HashMap<u64, usize>,
}

fn touch(
    keys: &mut std::collections::BTreeMap<usize, u64>,
    stamps: &mut std::collections::HashMap<u64, usize>,
    key: u64,
    clock: usize,
) {
    if let Some(old) = stamps.insert(key, clock) {
        keys.remove(&old);
    }
    keys.insert(clock, key);
}

fn remove(
    keys: &mut std::collections::BTreeMap<usize, u64>,
    stamps: &mut std::collections::HashMap<u64, usize>,
    key: u64,
) {
    if let Some(old) = stamps.remove(&key) {
        keys.remove(&old);
    }
}

fn oldest(keys: &std::collections::BTreeMap<usize, u64>) -> Option<u64> {
    keys.first_key_value().map(|(_, &k)| k)
}

impl WTinyLfu {
    pub fn new(capacity: usize) -> Self {
        let window_cap = (capacity / 100).max(1);
        let main_cap = capacity.saturating_sub(window_cap).max(1);
        WTinyLfu {
            window_cap,
            protected_cap: (main_cap * 8 / 10).max(1),
            main_cap,
            sketch: Sketch::new(capacity),
            clock: 0,
            window_keys: Default::default(),
            window_stamp: Default::default(),
            probation_keys: Default::default(),
            probation_stamp: Default::default(),
            protected_keys: Default::default(),
            protected_stamp: Default::default(),
        }
    }

    fn main_len(&self) -> usize {
        self.probation_stamp.len() + self.protected_stamp.len()
    }

    /// Moves the window's oldest entry toward the main cache, through admission.
    fn spill_window(&mut self) {
        let Some(cand) = oldest(&self.window_keys) else {
            return;
        };
        remove(&mut self.window_keys, &mut self.window_stamp, cand);
        if self.main_len() < self.main_cap {
            touch(
                &mut self.probation_keys,
                &mut self.probation_stamp,
                cand,
                self.clock,
            );
            return;
        }
        let victim = oldest(&self.probation_keys).or_else(|| oldest(&self.protected_keys));
        let Some(victim) = victim else { return };
        if self.sketch.estimate(cand) > self.sketch.estimate(victim) {
            remove(&mut self.probation_keys, &mut self.probation_stamp, victim);
            remove(&mut self.protected_keys, &mut self.protected_stamp, victim);
            touch(
                &mut self.probation_keys,
                &mut self.probation_stamp,
                cand,
                self.clock,
            );
        }
    }
}

impl BlockCache for WTinyLfu {
    fn contains(&self, key: u64) -> bool {
        self.window_stamp.contains_key(&key)
            || self.probation_stamp.contains_key(&key)
            || self.protected_stamp.contains_key(&key)
    }

    fn access(&mut self, key: u64, _t: usize) {
        self.clock += 1;
        let _ = self.sketch.add(key);
        if self.window_stamp.contains_key(&key) {
            touch(
                &mut self.window_keys,
                &mut self.window_stamp,
                key,
                self.clock,
            );
        } else if self.probation_stamp.contains_key(&key) {
            remove(&mut self.probation_keys, &mut self.probation_stamp, key);
            touch(
                &mut self.protected_keys,
                &mut self.protected_stamp,
                key,
                self.clock,
            );
            if self.protected_stamp.len() > self.protected_cap {
                if let Some(demoted) = oldest(&self.protected_keys) {
                    remove(&mut self.protected_keys, &mut self.protected_stamp, demoted);
                    touch(
                        &mut self.probation_keys,
                        &mut self.probation_stamp,
                        demoted,
                        self.clock,
                    );
                }
            }
        } else if self.protected_stamp.contains_key(&key) {
            touch(
                &mut self.protected_keys,
                &mut self.protected_stamp,
                key,
                self.clock,
            );
        } else {
            touch(
                &mut self.window_keys,
                &mut self.window_stamp,
                key,
                self.clock,
            );
            if self.window_stamp.len() > self.window_cap {
                self.spill_window();
            }
        }
    }
}
