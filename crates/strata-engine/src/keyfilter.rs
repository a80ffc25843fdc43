//! The key filter: a Bloom filter in memory of every key the warm store's records and the
//! cold index hold, so a read of a key that is in neither (a cache's miss) is answered
//! without a read of RocksDB, as Redis answers it with one hash probe.
//!
//! A key is added before the batch that puts its record is written, so a look-up that
//! follows the write sees the key. Deletions leave their bits set: a stale bit only costs
//! the read the filter would have spared. The filter is built by a scan of both families
//! (at open, on the first background round) and built again when more keys were added than
//! it was sized for; until the first build ends it answers "maybe" for every key, and a
//! build that fails (its scan reads the values RocksDB keeps in blob files, and a corrupt
//! one fails it) leaves it as it was. Writes
//! add their keys to the filter being built too, under the read side of a lock the build
//! takes to start, so a key is either added by its write or seen by the build's scan. (The
//! build takes that lock twice, each time after the batches being written; the lock is
//! fair, so reads that probe meanwhile wait too: a pause of one write, twice per build.)
//!
//! Each key sets [`BITS_PER_KEY`] bits of one 64-bit word, so a probe is one cache miss. At
//! [`CAPACITY_BITS`] bits per key of capacity about 2–4% of absent keys still go to
//! RocksDB; a build sizes the filter for twice the keys the store counts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock, RwLockReadGuard};

/// Bits a key sets, within one word.
const BITS_PER_KEY: u32 = 4;
/// Bits of filter per key it is sized for.
const CAPACITY_BITS: u64 = 8;
/// The fewest keys a filter is sized for (1 MiB of bits).
const CAPACITY_MIN: u64 = 1 << 20;
/// The most (4 GiB of bits), whatever the store's count says.
const CAPACITY_MAX: u64 = 1 << 32;
/// A store whose warm tier holds at most this much, and at most [`OPEN_BUILD_KEYS_MAX`]
/// keys in all, is scanned as it opens (well under a second); a larger one's filter is
/// built by the first background round.
pub(crate) const OPEN_BUILD_BYTES_MAX: u64 = 64 << 20;
pub(crate) const OPEN_BUILD_KEYS_MAX: u64 = 1 << 20;

/// The hash every key is filtered by: fixed for the life of the process.
fn hash(key: &[u8]) -> u64 {
    const HASHER: ahash::RandomState =
        ahash::RandomState::with_seeds(0x5374_7261, 0x7461_4b65, 0x7946_696c, 0x7465_7221);
    HASHER.hash_one(key)
}

/// The bits of one filter.
struct Bits {
    words: Box<[AtomicU64]>,
    /// The keys it was sized for.
    capacity: u64,
    /// Keys that set a bit not set before (about the distinct keys added).
    added: AtomicU64,
}

impl Bits {
    fn new(capacity: u64) -> Bits {
        let capacity = capacity.max(CAPACITY_MIN);
        let words = (capacity * CAPACITY_BITS).div_ceil(64);
        Bits {
            words: (0..words).map(|_| AtomicU64::new(0)).collect(),
            capacity,
            added: AtomicU64::new(0),
        }
    }

    /// The word of hash `h` and the bits it sets there.
    fn place(&self, h: u64) -> (usize, u64) {
        let word = (((h >> 32) * self.words.len() as u64) >> 32) as usize;
        let mut mask = 0u64;
        for i in 0..BITS_PER_KEY {
            mask |= 1 << ((h >> (6 * i)) & 63);
        }
        (word, mask)
    }

    fn add(&self, h: u64) {
        let (word, mask) = self.place(h);
        let old = self.words[word].fetch_or(mask, Ordering::Relaxed);
        if old & mask != mask {
            self.added.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn may_hold(&self, h: u64) -> bool {
        let (word, mask) = self.place(h);
        self.words[word].load(Ordering::Relaxed) & mask == mask
    }

    fn bytes(&self) -> u64 {
        self.words.len() as u64 * 8
    }
}

#[derive(Default)]
struct State {
    /// The filter reads ask; none until the first build ends.
    current: Option<Arc<Bits>>,
    /// The filter a build is filling.
    next: Option<Arc<Bits>>,
}

/// After a build fails (a read error of the scan), the next is not tried for this long.
const RETRY_AFTER: Duration = Duration::from_secs(600);

/// See the module's text.
#[derive(Default)]
pub(crate) struct KeyFilter {
    state: RwLock<State>,
    /// When the last build failed, if it did.
    failed_at: Mutex<Option<Instant>>,
}

/// A build in progress: dropped before it finishes (a panic), it takes its filter out of
/// `next`, so writes stop adding to it and a later build can start.
struct Building<'a>(&'a KeyFilter, Arc<Bits>);

impl Building<'_> {
    /// Takes the build's filter out of `state.next`, under the lock the caller holds.
    fn finish(self, state: &mut State) -> Option<Arc<Bits>> {
        let taken = take_if_same(state, &self.1);
        std::mem::forget(self);
        taken
    }
}

impl Drop for Building<'_> {
    fn drop(&mut self) {
        take_if_same(&mut self.0.state.write(), &self.1);
    }
}

fn take_if_same(state: &mut State, bits: &Arc<Bits>) -> Option<Arc<Bits>> {
    match &state.next {
        Some(n) if Arc::ptr_eq(n, bits) => state.next.take(),
        _ => None,
    }
}

/// The hashes of the keys a batch puts records for.
#[derive(Default)]
pub(crate) struct Added(Vec<u64>);

impl Added {
    pub(crate) fn push(&mut self, key: &[u8]) {
        self.0.push(hash(key));
    }
}

/// The filter as it stands, for the keys of one read.
pub(crate) struct Probe<'a>(RwLockReadGuard<'a, State>);

impl Probe<'_> {
    /// False only if `key` is surely in neither the records nor the cold index.
    pub(crate) fn may_hold(&self, key: &[u8]) -> bool {
        match &self.0.current {
            Some(bits) => bits.may_hold(hash(key)),
            None => true,
        }
    }
}

impl KeyFilter {
    pub(crate) fn probe(&self) -> Probe<'_> {
        Probe(self.state.read())
    }

    /// Adds `added`'s keys, then runs `write` (the batch that puts their records) before a
    /// build can start or end.
    pub(crate) fn adding<R>(&self, added: &Added, write: impl FnOnce() -> R) -> R {
        let state = self.state.read();
        for &h in &added.0 {
            for bits in state.current.iter().chain(state.next.iter()) {
                bits.add(h);
            }
        }
        write()
    }

    /// The keys a build should size the filter for, if one is due: none has ended yet, or
    /// more keys were added than the filter was sized for. `keys` is the store's count.
    pub(crate) fn build_due(&self, keys: u64) -> Option<u64> {
        if self
            .failed_at
            .lock()
            .is_some_and(|t| t.elapsed() < RETRY_AFTER)
        {
            return None;
        }
        let state = self.state.read();
        if state.next.is_some() {
            return None;
        }
        let wanted = keys.saturating_mul(2).clamp(CAPACITY_MIN, CAPACITY_MAX);
        match &state.current {
            None => Some(wanted),
            Some(b) if b.added.load(Ordering::Relaxed) > b.capacity => Some(wanted),
            Some(_) => None,
        }
    }

    /// Builds a filter for `capacity` keys: `scan` is called once writes add their keys to
    /// it too, and must add every key stored from then on (it reads the families as they
    /// stand after it was called). The new filter replaces the old once `scan` returns
    /// `Ok`; after an error the old one stays and no build is due for [`RETRY_AFTER`].
    pub(crate) fn build<E>(
        &self,
        capacity: u64,
        scan: impl FnOnce(&mut dyn FnMut(&[u8])) -> Result<(), E>,
    ) -> Result<(), E> {
        let bits = Arc::new(Bits::new(capacity));
        self.state.write().next = Some(Arc::clone(&bits));
        // Whatever ends the scan (an error, a panic), `next` is taken down with it.
        let building = Building(self, Arc::clone(&bits));
        let scanned = scan(&mut |key| bits.add(hash(key)));
        let mut state = self.state.write();
        drop(building.finish(&mut state));
        match scanned {
            Ok(()) => state.current = Some(bits),
            Err(_) => *self.failed_at.lock() = Some(Instant::now()),
        }
        scanned
    }

    /// Forgets every key (`FLUSHALL` emptied both families): from here on the filter holds
    /// what is written next. Called with every key's lock held, so nothing is written
    /// meanwhile.
    pub(crate) fn clear(&self) {
        let mut state = self.state.write();
        if let Some(old) = &state.current {
            state.current = Some(Arc::new(Bits::new(old.capacity)));
        }
    }

    /// Bytes the filters hold.
    pub(crate) fn bytes(&self) -> u64 {
        let state = self.state.read();
        state
            .current
            .iter()
            .chain(state.next.iter())
            .map(|b| b.bytes())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u64) -> Vec<u8> {
        format!("key:{i}").into_bytes()
    }

    #[test]
    fn answers_maybe_until_built_then_no_for_most_absent_keys() {
        let f = KeyFilter::default();
        assert!(f.probe().may_hold(b"anything"));
        let n = 100_000u64;
        f.build::<()>(n, |add| {
            for i in 0..n {
                add(&key(i));
            }
            Ok(())
        })
        .unwrap();
        let p = f.probe();
        assert!(
            (0..n).all(|i| p.may_hold(&key(i))),
            "a stored key was filtered"
        );
        let false_maybes = (n..2 * n).filter(|&i| p.may_hold(&key(i))).count();
        // Sized for CAPACITY_MIN keys, a tenth full: far fewer than at capacity.
        assert!(false_maybes < n as usize / 100, "{false_maybes} of {n}");
    }

    #[test]
    fn a_write_during_a_build_is_kept_and_a_failed_build_changes_nothing() {
        let f = KeyFilter::default();
        f.build::<()>(0, |add| {
            add(b"scanned");
            // A write while the scan runs adds to the filter being built.
            let mut a = Added::default();
            a.push(b"written");
            f.adding(&a, || ());
            Ok(())
        })
        .unwrap();
        let p = f.probe();
        assert!(p.may_hold(b"scanned") && p.may_hold(b"written"));
        drop(p);
        let e = f.build(0, |add| {
            add(b"other");
            Err("scan failed")
        });
        assert_eq!(e, Err("scan failed"));
        assert!(
            f.probe().may_hold(b"written"),
            "a failed build replaced the filter"
        );
        assert_eq!(f.build_due(u64::MAX), None, "tried again at once");
        assert_eq!(f.bytes(), CAPACITY_MIN * CAPACITY_BITS / 8);
    }

    #[test]
    fn a_panicking_scan_leaves_no_build_behind_and_clear_forgets_every_key() {
        let f = KeyFilter::default();
        f.build::<()>(0, |add| {
            add(b"kept");
            Ok(())
        })
        .unwrap();
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = f.build::<()>(0, |_| panic!("scan"));
        }));
        assert!(panicked.is_err());
        assert!(
            f.state.read().next.is_none(),
            "the panicked build is still filled"
        );
        assert!(f.probe().may_hold(b"kept"));
        f.clear();
        assert!(!f.probe().may_hold(b"kept"));
        assert_eq!(f.bytes(), CAPACITY_MIN * CAPACITY_BITS / 8);
    }

    #[test]
    fn a_build_falls_due_once_more_keys_were_added_than_it_was_sized_for() {
        let f = KeyFilter::default();
        assert_eq!(f.build_due(10), Some(CAPACITY_MIN));
        f.build::<()>(0, |_| Ok(())).unwrap();
        assert_eq!(f.build_due(10), None);
        let mut a = Added::default();
        for i in 0..CAPACITY_MIN + CAPACITY_MIN / 2 {
            a.push(&key(i));
        }
        f.adding(&a, || ());
        assert_eq!(f.build_due(3 * CAPACITY_MIN), Some(6 * CAPACITY_MIN));
    }
}
