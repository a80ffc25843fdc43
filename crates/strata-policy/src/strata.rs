//! Strata's policy: frequency-weighted aging (in the GreedyDual-Size-Frequency family),
//! chain awareness, and an admission filter, tuned online by miniature simulations.
//!
//! Each cached block has a priority `H = L + w(f)`, where `L` is the priority of the last
//! evicted block (so priorities of idle blocks fall behind as the cache turns over) and
//! `w(f)` grows with the block's estimated access frequency `f`; a block seen once gets a
//! lower weight. Frequencies come from a count-min sketch that halves itself every
//! `10 × capacity` accesses, so memory stays bounded and old popularity fades.
//!
//! Chain awareness: when a block is evicted, its cached children (learned from request
//! order) can no longer be hit, so they are evicted first; a block stored after a parent
//! that was not admitted is useless too and goes first.
//!
//! Admission (TinyLFU's rule): a new block that is not estimated more frequent than the block
//! it would displace is dropped instead. That protects a small cache from one-hit wonders,
//! but in a large cache it refuses blocks that would have been reused.
//!
//! Which setting fits depends on the workload and the capacity (one setting weighs every
//! block the same, which is LRU, for workloads where only recency matters), so the policy
//! does not guess: a [`Tuner`] replays a hash-sampled fraction of the keys through one small copy of
//! the policy per candidate setting (a miniature simulation, as in SHARDS), keeps decayed
//! hit counts, and the real cache follows the best copy. Its memory is bounded by
//! `MINI_CAPACITY_MAX` entries per copy.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use crate::sketch::Sketch;
use crate::BlockCache;
use crate::IdMap;

/// One setting of the policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Setting {
    /// Drop a new block unless it is estimated more frequent than the victim.
    pub admission: bool,
    /// The weight of a block seen once, relative to one unit per access for the others.
    pub first_weight: f64,
    /// Frequencies above this count the same. With 1 (and a first weight of 1) every block
    /// weighs the same and the policy is LRU (with chains evicted tail-first).
    pub frequency_max: u8,
}

/// The settings the tuner chooses among; the first is the starting one.
pub const SETTINGS: [Setting; 4] = [
    Setting {
        admission: false,
        first_weight: 0.5,
        frequency_max: 8,
    },
    Setting {
        admission: true,
        first_weight: 0.5,
        frequency_max: 8,
    },
    Setting {
        admission: false,
        first_weight: 0.1,
        frequency_max: 8,
    },
    Setting {
        admission: false,
        first_weight: 1.0,
        frequency_max: 1,
    },
];

/// Priorities are kept as integers (micro-units) so they order in a `BTreeSet`.
fn units(x: f64) -> u64 {
    (x * 1e6) as u64
}

/// Where a block stands in the eviction order: (priority, Reverse(depth in its chain),
/// touch stamp, key); lower goes first.
type Rank = (u64, Reverse<u32>, u64, u64);

/// A cached block's rank now, and the rank its entry in the order carries. A touch that
/// only raises the rank (the usual case) leaves the entry where it is; eviction re-files
/// a stale entry when it comes first. An entry never ranks above its block, so the first
/// entry that is up to date is the true lowest: the victims are those of eager updates.
#[derive(Clone, Copy)]
struct Ranks {
    now: Rank,
    filed: Rank,
}

impl Ranks {
    /// Moves the block's entry in `order` to its rank now.
    fn refile(&mut self, order: &mut BTreeSet<Rank>) {
        order.remove(&self.filed);
        order.insert(self.now);
        self.filed = self.now;
    }
}

/// The policy with one fixed setting (what the tuner's miniature copies run).
struct Gdsf {
    capacity: usize,
    setting: Setting,
    inflation: u64,
    /// key -> its rank (priority, depth in its chain, touch stamp).
    priority: IdMap<Ranks>,
    /// Eviction order: lowest priority first; among equals the deepest block (chain tails
    /// before heads), then the least recently touched. One entry per block, possibly
    /// lower than its rank now (see [`Ranks`]).
    order: BTreeSet<Rank>,
    /// Counts touches (recency for the order's last tie-break).
    stamp: u64,
    sketch: Sketch,
    /// The block inserted last and not judged by admission yet.
    newcomer: Option<u64>,
    /// Parent of each cached block (the block before it in the request that stored it).
    parent: IdMap<u64>,
    children: IdMap<Vec<u64>>,
    orphans: Vec<u64>,
    prev_in_request: Option<u64>,
    depth_in_request: u32,
    in_request: bool,
}

impl Gdsf {
    fn new(capacity: usize, setting: Setting) -> Self {
        Self::with_sketch(capacity, setting, Sketch::new(capacity))
    }

    fn with_sketch(capacity: usize, setting: Setting, sketch: Sketch) -> Self {
        Gdsf {
            capacity: capacity.max(1),
            setting,
            inflation: 0,
            priority: IdMap::default(),
            order: BTreeSet::new(),
            stamp: 0,
            sketch,
            newcomer: None,
            parent: IdMap::default(),
            children: IdMap::default(),
            orphans: Vec::new(),
            prev_in_request: None,
            depth_in_request: 0,
            in_request: false,
        }
    }

    fn begin_request(&mut self) {
        self.prev_in_request = None;
        self.depth_in_request = 0;
        self.in_request = true;
    }

    fn end_request(&mut self) {
        self.in_request = false;
        self.prev_in_request = None;
        self.depth_in_request = 0;
    }

    fn touch(&mut self, key: u64) {
        let f = self.sketch.add(key).min(self.setting.frequency_max);
        let weight = if f <= 1 {
            self.setting.first_weight
        } else {
            f as f64
        };
        let p = self.inflation + units(weight);
        let depth = self.depth_in_request;
        if self.in_request {
            self.depth_in_request += 1;
        }
        self.stamp += 1;
        let now = (p, Reverse(depth), self.stamp, key);
        match self.priority.get_mut(&key) {
            // Raised: the entry stays where it is until eviction reaches it.
            Some(r) if r.filed < now => r.now = now,
            Some(r) => {
                r.now = now;
                r.refile(&mut self.order);
            }
            None => {
                self.priority.insert(key, Ranks { now, filed: now });
                self.order.insert(now);
                self.newcomer = Some(key);
            }
        }
        if !self.in_request {
            return;
        }
        let Some(parent) = self.prev_in_request.replace(key) else {
            return;
        };
        if !self.priority.contains_key(&parent) {
            // The parent was not admitted (or is gone): this block cannot be hit.
            self.orphans.push(key);
        } else if let std::collections::hash_map::Entry::Vacant(e) = self.parent.entry(key) {
            e.insert(parent);
            self.children.entry(parent).or_default().push(key);
        }
    }

    /// Evicts until the cache is within its capacity.
    fn trim(&mut self) {
        while self.priority.len() > self.capacity {
            self.pop_victim();
        }
    }

    fn remove(&mut self, key: u64) {
        if let Some(r) = self.priority.remove(&key) {
            self.order.remove(&r.filed);
        }
        if let Some(kids) = self.children.remove(&key) {
            self.orphans
                .extend(kids.into_iter().filter(|k| self.priority.contains_key(k)));
        }
        if let Some(p) = self.parent.remove(&key) {
            if let Some(siblings) = self.children.get_mut(&p) {
                siblings.retain(|&c| c != key);
            }
        }
    }

    fn pop_victim(&mut self) -> Option<u64> {
        while let Some(o) = self.orphans.pop() {
            let orphaned = self.priority.contains_key(&o)
                && self
                    .parent
                    .get(&o)
                    .is_none_or(|p| !self.priority.contains_key(p));
            if orphaned {
                self.remove(o);
                return Some(o);
            }
        }
        // Re-file stale entries until the first one is up to date.
        let (p, lowest) = loop {
            let first = *self.order.first()?;
            let r = self
                .priority
                .get_mut(&first.3)
                .expect("ordered blocks are cached");
            if r.filed == r.now {
                break (first.0, first.3);
            }
            r.refile(&mut self.order);
        };
        let mut victim = lowest;
        if let Some(n) = self.newcomer.take() {
            if self.setting.admission
                && n != lowest
                && self.priority.contains_key(&n)
                && self.sketch.estimate(n) <= self.sketch.estimate(lowest)
            {
                victim = n;
            }
        }
        if victim == lowest {
            self.inflation = self.inflation.max(p);
        }
        self.remove(victim);
        Some(victim)
    }
}

/// Miniature simulations of every setting in [`SETTINGS`] over a hash-sampled fraction of the
/// keys, with hit counts that halve every epoch.
struct Tuner {
    minis: Vec<Gdsf>,
    hits: Vec<f64>,
    /// A key is sampled when `mix(key) < threshold` (out of 2^32).
    threshold: u64,
    sampled: usize,
    epoch: usize,
    best: usize,
}

/// A miniature copy holds at most this many entries (and at least `MINI_CAPACITY_MIN`,
/// unless the cache itself is smaller).
const MINI_CAPACITY_MAX: usize = 2048;
const MINI_CAPACITY_MIN: usize = 256;

fn mix(key: u64) -> u64 {
    let mut h = key.wrapping_add(0x9E37_79B9_7F4A_7C15);
    h = (h ^ (h >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (h ^ (h >> 31)) >> 32
}

/// For a cache on a request's path, a miniature copy holds at most this fraction of the
/// cache (and at least `LIGHT_MINI_CAPACITY_MIN` entries), so that few accesses pay for
/// the four copies.
const LIGHT_SAMPLE_DIVISOR: usize = 32;
const LIGHT_MINI_CAPACITY_MIN: usize = 32;

impl Tuner {
    /// `light`: sample at most 1/`LIGHT_SAMPLE_DIVISOR` of the keys.
    fn new(capacity: usize, light: bool) -> Self {
        let mut mini = (capacity / 8)
            .clamp(MINI_CAPACITY_MIN, MINI_CAPACITY_MAX)
            .min(capacity);
        if light {
            mini = mini.min((capacity / LIGHT_SAMPLE_DIVISOR).max(LIGHT_MINI_CAPACITY_MIN));
        }
        Tuner {
            minis: SETTINGS.iter().map(|&s| Gdsf::new(mini, s)).collect(),
            hits: vec![0.0; SETTINGS.len()],
            threshold: ((mini as u128) << 32) as u64 / capacity as u64,
            sampled: 0,
            epoch: mini * 4,
            best: 0,
        }
    }

    /// Feeds one access; returns the index of the setting that is currently best.
    fn observe(&mut self, key: u64) -> usize {
        if mix(key) >= self.threshold {
            return self.best;
        }
        for (m, hits) in self.minis.iter_mut().zip(&mut self.hits) {
            if m.priority.contains_key(&key) {
                *hits += 1.0;
            }
            m.touch(key);
            m.trim();
        }
        self.sampled += 1;
        if self.sampled.is_multiple_of(self.epoch) {
            let best = self.hits[self.best];
            // Switch only for a clear winner (2% more hits), so noise does not flip-flop.
            if let Some((i, _)) = self
                .hits
                .iter()
                .enumerate()
                .filter(|&(_, &h)| h > best * 1.02)
                .max_by(|a, b| a.1.total_cmp(b.1))
            {
                self.best = i;
            }
            self.hits.iter_mut().for_each(|h| *h *= 0.5);
        }
        self.best
    }
}

pub struct StrataPolicy {
    main: Gdsf,
    tuner: Tuner,
    light: bool,
}

/// The light policy's sketch: two counters per entry and row (the sketch of a 16,384-entry
/// shard is 128 KiB), but no fewer than 4,096: a small shard's sketch is small anyway.
const LIGHT_SKETCH: (usize, usize) = (2, 4096);

/// The sketch's counters per entry and row, and the fewest per row.
fn sketch_width(light: bool) -> (usize, usize) {
    match light {
        true => LIGHT_SKETCH,
        false => crate::sketch::FULL_WIDTH,
    }
}

impl StrataPolicy {
    pub fn new(capacity: usize) -> Self {
        Self::sized(capacity, false)
    }

    /// As [`StrataPolicy::new`], with a tuner that samples fewer keys (at most 1 in 32 for
    /// large caches, so its miniature copies cost little per access) and a smaller
    /// frequency sketch, for a cache on a request's path such as the DRAM tier; replays use
    /// the full version.
    pub fn light(capacity: usize) -> Self {
        Self::sized(capacity, true)
    }

    fn sized(capacity: usize, light: bool) -> Self {
        let (per_entry, min_width) = sketch_width(light);
        let sketch = Sketch::with_width(capacity, per_entry, min_width);
        StrataPolicy {
            main: Gdsf::with_sketch(capacity, SETTINGS[0], sketch),
            tuner: Tuner::new(capacity.max(1), light),
            light,
        }
    }

    /// The number of entries the policy is sized for.
    pub fn capacity(&self) -> usize {
        self.main.capacity
    }

    /// Sizes the policy for a cache of `capacity` entries, for a cache that learns how many
    /// it holds rather than knowing it (a DRAM shard under a byte budget holds as many as
    /// fit): the frequency sketch ages over that many accesses and the tuner's miniature
    /// copies model a cache of that size (they start afresh; the setting in force stays).
    pub fn resize(&mut self, capacity: usize) {
        let capacity = capacity.max(1);
        if capacity == self.main.capacity {
            return;
        }
        self.main.capacity = capacity;
        let (per_entry, min_width) = sketch_width(self.light);
        self.main.sketch.resize(capacity, per_entry, min_width);
        let best = self.tuner.best;
        self.tuner = Tuner::new(capacity, self.light);
        self.tuner.best = best;
    }

    /// Starts a request: the keys touched until `end_request` form one chain, in order.
    pub fn begin_request(&mut self) {
        self.main.begin_request();
    }

    /// Ends a request: later touches are not chained to it.
    pub fn end_request(&mut self) {
        self.main.end_request();
    }

    /// Number of keys tracked.
    pub fn len(&self) -> usize {
        self.main.priority.len()
    }

    pub fn is_empty(&self) -> bool {
        self.main.priority.is_empty()
    }

    /// The setting the cache follows now.
    pub fn setting(&self) -> Setting {
        self.main.setting
    }

    /// Records an access of `key` (inserting it if new).
    pub fn touch(&mut self, key: u64) {
        self.main.setting = SETTINGS[self.tuner.observe(key)];
        self.main.touch(key);
    }

    /// Forgets `key` (it left the cache for a reason of its own); its cached children
    /// become orphans, the first to be evicted.
    pub fn remove(&mut self, key: u64) {
        self.main.remove(key);
    }

    /// Chooses, forgets and returns the key to evict next (with admission on, that can be
    /// the key just inserted).
    pub fn pop_victim(&mut self) -> Option<u64> {
        self.main.pop_victim()
    }
}

impl BlockCache for StrataPolicy {
    fn contains(&self, key: u64) -> bool {
        self.main.priority.contains_key(&key)
    }

    fn begin_request(&mut self) {
        StrataPolicy::begin_request(self);
    }

    fn access(&mut self, key: u64, _t: usize) {
        self.touch(key);
        self.main.trim();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(c: &mut StrataPolicy, blocks: &[u64]) {
        c.begin_request();
        for &b in blocks {
            c.access(b, 0);
        }
    }

    #[test]
    fn chains_are_evicted_tail_first() {
        let mut c = StrataPolicy::new(3);
        request(&mut c, &[1, 2, 3]);
        request(&mut c, &[10]);
        assert!(
            c.contains(1) && c.contains(2) && !c.contains(3),
            "the tail goes first"
        );
        request(&mut c, &[11]);
        assert!(c.contains(1) && !c.contains(2));
    }

    #[test]
    fn a_block_touched_again_is_not_evicted_by_its_old_place_in_the_order() {
        for light in [false, true] {
            let mut c = if light {
                StrataPolicy::light(2)
            } else {
                StrataPolicy::new(2)
            };
            c.access(1, 0);
            c.access(2, 0);
            // 1 now ranks above 2, though its entry in the order still sits before 2's.
            c.access(1, 0);
            c.access(3, 0);
            assert!(c.contains(1) && !c.contains(2), "light: {light}");
        }
    }

    #[test]
    fn orphaned_descendants_go_before_anything_else() {
        let mut c = StrataPolicy::new(4);
        request(&mut c, &[1, 2, 3]);
        request(&mut c, &[1, 2, 3]);
        request(&mut c, &[7]);
        // Block 7 is the cheapest to evict, but evicting the head 1 by hand leaves 2 and 3
        // useless: they go before 7.
        c.remove(1);
        request(&mut c, &[8, 9]);
        assert!(
            !c.contains(2),
            "the orphan 2 should have been evicted first"
        );
        assert!(c.contains(7) && c.contains(8) && c.contains(9));
    }

    /// Fills a fixed-setting cache of 4 with keys 1..=4 seen once each, then offers key 100
    /// once: whether it stays is the admission decision (all priorities tie).
    fn offer_newcomer(admission: bool) -> bool {
        let mut c = Gdsf::new(
            4,
            Setting {
                admission,
                first_weight: 0.5,
                frequency_max: 8,
            },
        );
        for k in 1..=4 {
            c.touch(k);
        }
        c.touch(100);
        c.trim();
        c.priority.contains_key(&100)
    }

    #[test]
    fn admission_drops_a_newcomer_no_more_frequent_than_the_victim() {
        assert!(
            !offer_newcomer(true),
            "with admission the one-off key is dropped"
        );
        assert!(
            offer_newcomer(false),
            "without admission it displaces key 1"
        );
    }

    /// Runs `keys` through the tuned policy of `capacity`: its hits and final setting.
    fn run(capacity: usize, keys: &[u64]) -> (usize, Setting) {
        let mut c = StrataPolicy::new(capacity);
        let mut hits = 0;
        for &k in keys {
            hits += c.contains(k) as usize;
            c.access(k, 0);
        }
        (hits, c.setting())
    }

    /// Runs `keys` through the policy held at one setting: its hits.
    fn run_fixed(capacity: usize, setting: Setting, keys: &[u64]) -> usize {
        let mut c = Gdsf::new(capacity, setting);
        let mut hits = 0;
        for &k in keys {
            hits += c.priority.contains_key(&k) as usize;
            c.touch(k);
            c.trim();
        }
        hits
    }

    #[test]
    fn the_tuner_turns_admission_on_when_one_hit_wonders_flood_a_small_cache() {
        // A skewed set of 2,000 keys (read every third access) among one-off keys, cache 256.
        let mut x = 7u64;
        let keys: Vec<u64> = (0..200_000u64)
            .map(|i| {
                if i % 3 != 0 {
                    return 1_000_000 + i;
                }
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = (x >> 11) as f64 / (1u64 << 53) as f64;
                (u.powi(3) * 2000.0) as u64
            })
            .collect();
        let off = run_fixed(256, SETTINGS[0], &keys);
        let on = run_fixed(256, SETTINGS[1], &keys);
        assert!(on > off * 6 / 5, "admission should win here: {on} vs {off}");
        let (tuned, setting) = run(256, &keys);
        assert!(setting.admission, "{setting:?}");
        assert!(tuned > off * 6 / 5, "tuned {tuned}, admission off {off}");
    }

    #[test]
    fn the_tuner_leaves_admission_off_when_new_keys_come_back_soon() {
        // Every key is read twice, 50 accesses apart, and never again: admission would drop
        // each key at its first access and miss its second.
        let keys: Vec<u64> = (0..200_000u64)
            .map(|i| 100 + i / 2 - if i % 2 == 0 { 0 } else { 25 })
            .collect();
        assert!(run_fixed(256, SETTINGS[1], &keys) < 10_000);
        let (hits, setting) = run(256, &keys);
        assert!(!setting.admission, "{setting:?}");
        assert!(hits > 90_000, "the second reads should hit: {hits}");
    }

    #[test]
    fn the_tuner_falls_back_to_lru_when_only_recency_matters() {
        // New keys keep arriving and are reused a few times while among the 200 newest, then
        // never again: frequency only keeps stale keys, LRU is what works.
        let mut x = 11u64;
        let mut rnd = move |n: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % n
        };
        let mut next = 0u64;
        let keys: Vec<u64> = (0..100_000)
            .map(|_| {
                if next < 200 || rnd(10) < 3 {
                    next += 1;
                    next
                } else {
                    next - rnd(200)
                }
            })
            .collect();
        for capacity in [100, 300] {
            let mut lru = crate::Lru::new(capacity);
            let mut lru_hits = 0;
            for &k in &keys {
                lru_hits += lru.contains(k) as usize;
                lru.access(k, 0);
            }
            let (hits, setting) = run(capacity, &keys);
            assert!(
                hits as f64 >= lru_hits as f64 - 0.005 * keys.len() as f64,
                "capacity {capacity}: {hits} hits vs LRU {lru_hits} ({setting:?})"
            );
            assert_eq!(setting.frequency_max, 1, "{setting:?}");
        }
    }

    #[test]
    fn reused_blocks_outlive_one_hit_wonders() {
        let mut c = StrataPolicy::new(10);
        for _ in 0..3 {
            request(&mut c, &[1, 2, 3, 4, 5]);
        }
        // LRU would have dropped the prefix after five one-off blocks.
        for noise in 100..110 {
            request(&mut c, &[noise]);
        }
        assert!(
            (1..=5).all(|b| c.contains(b)),
            "a reused prefix survives a scan of one-off blocks"
        );
    }
}
