//! The live values' state, a component the engine's core holds: each live value's slot
//! (its decoded collection, whether its stored form is older, when it was last used) and
//! the counts that let a key without one skip the map. What is done with them is `live`'s,
//! `fold`'s, and the live reads' and writes' in `read` and `write`.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use strata_format::{Key, Kind};

use crate::Clock;

/// A live value no command used for this long is dropped at the next fold (stored whole
/// first if its stored form is older), unless it is large ([`LARGE_BYTES_MIN`]).
pub const IDLE_MS: u64 = 1000;

/// A live value counting this many bytes or more stays for [`LARGE_IDLE_MS`] unused: its
/// decode costs milliseconds (a million members, tens of them), a lookup in it under a
/// microsecond, so a collection used every few seconds stays decoded. Few values are this
/// large, so the folds' pass over the live values stays short.
pub const LARGE_BYTES_MIN: usize = 1 << 20;

/// How long a large live value stays unused (sooner, least recently used first, when the
/// live values pass their budget).
pub const LARGE_IDLE_MS: u64 = 60_000;

/// A live value stored as parts is folded by the command that leaves this many commands'
/// changes unfolded: a fold writes its delta's parts holding the key's stripe lock, and a
/// second's worth of changes (tens of thousands) held it for hundreds of milliseconds.
pub const PARTS_FOLD_COMMANDS: u32 = 256;

/// A decoded collection the server changes in place (see the module doc). Its methods run
/// under the key's stripe lock: keep them short.
pub trait LiveValue: Any + Send {
    /// The stored form of the value now; the changes so far are in it. (The value may keep
    /// a share of it, to read its items from while nothing changes.)
    fn encode(&mut self) -> Bytes;
    /// The changes since it was last encoded or asked this, as a [`strata_format::delta`]
    /// of its kind, or `None` when it did not note them one by one (it is encoded whole).
    /// Forgotten either way.
    fn delta(&mut self) -> Option<Vec<u8>> {
        None
    }
    /// About how many bytes of memory it holds (what the live values' budget counts). Runs
    /// after every change: constant time.
    fn bytes(&self) -> usize;
    /// Whether it holds nothing (then its key is deleted, as Redis deletes an empty
    /// collection).
    fn is_empty(&self) -> bool;
    /// How many items it holds, if it counts them: a large collection is stored as parts
    /// only then, and its folds write its [`LiveValue::delta`] alone.
    fn items(&self) -> Option<usize> {
        None
    }
    /// How many items its noted changes move besides those they name (a list's inserts
    /// and removals in the middle move the elements on their shorter side): one stored as
    /// parts is folded whole instead of by its delta once they pass [`LiveValue::items`].
    fn moves(&self) -> usize {
        0
    }
    /// Whether it may stay decoded between commands; `false` sends each write of it the
    /// whole-value way.
    fn stays(&self) -> bool {
        true
    }
}

/// What a live value was last stored as (or made from).
#[derive(Clone, Copy, Default)]
pub(crate) struct StoredAs {
    /// Parts ([`strata_format::parts`]): a fold writes its delta alone into them
    /// ([`Change::Parts`]).
    pub(crate) parted: bool,
    /// About the stored form's bytes: what its last whole fold stored (or it was made
    /// from), plus the deltas logged since. Past `parts_bytes_min` a value logged as
    /// deltas is folded whole, into parts.
    pub(crate) len: usize,
}

pub(crate) struct Slot {
    pub(crate) kind: Kind,
    pub(crate) expire_ms: u64,
    pub(crate) value: Box<dyn LiveValue>,
    /// The value is away: its folder, holding the key's stripe lock, encodes it with the
    /// map let go, and [`Away`] stands in. Only a read may find it so (every other use of
    /// a slot's value holds the stripe lock); it waits for that lock.
    pub(crate) away: bool,
    /// Changed since it was last folded or its changes logged.
    pub(crate) changed: bool,
    /// Its changes since it was last folded whole are in the hot log as deltas only: DRAM
    /// and the warm store hold an older value.
    pub(crate) logged: bool,
    /// Its last fold went through write-back: the hot log has a record of it whole and DRAM
    /// holds it dirty, so deltas may follow (cleared when that value settles elsewhere).
    pub(crate) based: bool,
    /// What it was last stored as.
    pub(crate) stored: StoredAs,
    /// Commands that changed it since it was last folded (counted while it is stored as
    /// parts: [`PARTS_FOLD_COMMANDS`]).
    pub(crate) unfolded: u32,
    /// When a command last used it, changing it, reading it or neither (Unix ms).
    pub(crate) used_ms: u64,
    /// What it counted against the budget when it last changed.
    pub(crate) bytes: usize,
}

impl Slot {
    /// The slot of a value about to be made live, used at `now`.
    pub(crate) fn new(
        kind: Kind,
        expire_ms: u64,
        value: Box<dyn LiveValue>,
        stored: StoredAs,
        now: u64,
    ) -> Slot {
        Slot {
            kind,
            expire_ms,
            value,
            away: false,
            changed: false,
            logged: false,
            based: false,
            stored,
            unfolded: 0,
            used_ms: now,
            bytes: 0,
        }
    }

    /// Newer than its stored form: changes not yet folded, or logged as deltas only.
    pub(crate) fn stale(&self) -> bool {
        self.changed || self.logged
    }

    /// The time a command on this value goes by: the clock itself when the value has an
    /// expiry, else the coarse clock (it only dates the last use, which idle drops judge by
    /// the second).
    pub(crate) fn now(&self, clock: &dyn Clock) -> u64 {
        match self.expire_ms {
            0 => clock.coarse_ms(),
            _ => clock.now_ms(),
        }
    }
}

/// The live values, by stored key.
pub(crate) struct Live {
    pub(crate) slots: Mutex<HashMap<Vec<u8>, Slot, ahash::RandomState>>,
    /// Slots held, and of those newer than their stored form (`changed` or `logged`): 0 lets
    /// every check skip the map.
    pub(crate) held: AtomicUsize,
    pub(crate) stale: AtomicUsize,
    pub(crate) bytes: AtomicUsize,
    /// Slots held per bucket of the keys' hashes ([`Live::may_hold`]): a write or read of a
    /// key that has no live value, a string's, skips the map's lock.
    pub(crate) held_in: Box<[AtomicU32]>,
    /// The reads' doorkeeper: the hash of the last key read with no live value, per
    /// bucket. A read that finds its own key's hash there makes the value live; a key read
    /// once, or among many others, is not decoded for nothing.
    pub(crate) seen: Box<[AtomicU64]>,
    /// Reads answered from the parts of a value stored as parts, per key, for
    /// [`read_from_parts`] (at most [`PARTED_READ_KEYS`] keys: cleared when full).
    pub(crate) parted_reads: Mutex<HashMap<Vec<u8>, u32, ahash::RandomState>>,
    pub(crate) hasher: ahash::RandomState,
}

/// Buckets of [`Live::seen`].
pub(crate) const SEEN_BUCKETS: usize = 4096;

/// A value stored as parts whose parts answered this many reads is put together into
/// DRAM in the background ([`read_from_parts`]); fewer reads cost less from the parts.
pub(crate) const PUT_TOGETHER_READS: u32 = 32;

/// Keys [`Live::parted_reads`] counts at most.
pub(crate) const PARTED_READ_KEYS: usize = 4096;

impl Default for Live {
    fn default() -> Self {
        Live {
            slots: Default::default(),
            held: Default::default(),
            stale: Default::default(),
            bytes: Default::default(),
            held_in: (0..SEEN_BUCKETS).map(|_| AtomicU32::new(0)).collect(),
            seen: (0..SEEN_BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            parted_reads: Default::default(),
            hasher: Default::default(),
        }
    }
}

/// What a slot holds while its value is away being encoded ([`fold_slot`]).
pub(crate) struct Away;

impl Live {
    pub(crate) fn set_state(&self, slot: &mut Slot, changed: bool, logged: bool) {
        let was = slot.stale();
        (slot.changed, slot.logged) = (changed, logged);
        let now = slot.stale();
        if was != now {
            if now {
                self.stale.fetch_add(1, Ordering::SeqCst);
            } else {
                self.stale.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// `key`'s value left write-back for the warm store (its stripe lock held): its live
    /// value's next fold is whole.
    pub(crate) fn unbase(&self, key: &Key) {
        if self.may_hold(key.stored()) {
            if let Some(s) = self.slots.lock().get_mut(key.stored()) {
                s.based = false;
            }
        }
    }

    pub(crate) fn set_bytes(&self, slot: &mut Slot, bytes: usize) {
        // One atomic add a change (none when the size holds: a member set again).
        if bytes > slot.bytes {
            self.bytes.fetch_add(bytes - slot.bytes, Ordering::Relaxed);
        } else if bytes < slot.bytes {
            self.bytes.fetch_sub(slot.bytes - bytes, Ordering::Relaxed);
        }
        slot.bytes = bytes;
    }

    /// Drops `key`'s live value, changed or not (a write replaces it; its stripe lock held).
    pub(crate) fn forget(&self, key: &Key) {
        if self.may_hold(key.stored()) {
            self.remove(key.stored());
        }
    }

    pub(crate) fn remove(&self, key: &[u8]) {
        if let Some(mut s) = self.slots.lock().remove(key) {
            self.set_state(&mut s, false, false);
            self.set_bytes(&mut s, 0);
            self.held_in(key).fetch_sub(1, Ordering::SeqCst);
            self.held.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Keeps `slot`'s value live for `key`, which has no live value (its stripe lock held).
    pub(crate) fn hold(&self, key: &Key, mut slot: Slot, changed: bool) {
        self.set_state(&mut slot, changed, false);
        let bytes = slot.value.bytes();
        self.set_bytes(&mut slot, bytes);
        self.held_in(key.stored()).fetch_add(1, Ordering::SeqCst);
        self.slots.lock().insert(key.stored().to_vec(), slot);
        self.held.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn held_in(&self, key: &[u8]) -> &AtomicU32 {
        let h = self.hasher.hash_one(key);
        &self.held_in[h as usize % SEEN_BUCKETS]
    }

    /// Whether `key` may have a live value: `false` is sure, and costs a hash, not the
    /// map's lock. [`Live::hold`] raises the counts and [`Live::remove`] lowers them, both
    /// under the key's stripe lock, so a caller holding it is never told `false` about a
    /// slot there (one without it may miss a slot going in: its read comes before that
    /// write, which is not acknowledged yet).
    pub(crate) fn may_hold(&self, key: &[u8]) -> bool {
        self.held() != 0 && self.held_in(key).load(Ordering::SeqCst) != 0
    }

    /// Whether a read of `key` (which has no live value) is the second one running: its
    /// bucket of [`Live::seen`] holds its hash from the last read.
    pub(crate) fn seen_again(&self, key: &[u8]) -> bool {
        let h = self.hasher.hash_one(key) | 1;
        self.seen[h as usize % SEEN_BUCKETS].swap(h, Ordering::Relaxed) == h
    }

    /// How many values are live now.
    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Forgets every live value (`FLUSHALL`, every stripe locked).
    pub(crate) fn clear(&self) {
        let mut slots = self.slots.lock();
        for (k, mut s) in slots.drain() {
            self.set_state(&mut s, false, false);
            self.set_bytes(&mut s, 0);
            self.held_in(&k).fetch_sub(1, Ordering::SeqCst);
            self.held.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl LiveValue for Away {
    fn encode(&mut self) -> Bytes {
        unreachable!("a value away is encoded by its folder alone")
    }
    fn bytes(&self) -> usize {
        0
    }
    fn is_empty(&self) -> bool {
        false
    }
}
