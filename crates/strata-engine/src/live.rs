//! Live values: a collection (hash, set, sorted set, list) that its writes change in place,
//! decoded in memory, instead of each command decoding the stored value, changing it and
//! storing it whole again (a write to a thousand-field hash stored a hundred kilobytes).
//!
//! A key's live value, while it has one, is its newest state: DRAM, the hot log and the
//! warm store may hold an older one. The live value reaches them (is *folded*: encoded and
//! stored through write-back, or through the warm store when write-back cannot take it)
//! - before the logs are written out: a group commit folds before it syncs, the `none`
//!   flush before it hands the logs to the OS, so `durability` keeps its promises. A
//!   value whose last fold went through write-back (the hot log holds it whole, DRAM as a
//!   dirty value) and whose changes since are few has only those logged: a
//!   *delta* record ([`strata_format::delta`]) after it, which a replay applies. Its stored
//!   form is then older than the log; the other occasions below fold it whole;
//! - before anything else reads the key ([`fold_keys`]), or the whole keyspace
//!   ([`fold_all`], from `writeback::settle_all`);
//! - before any other write of the key, which also drops the live value
//!   (`writeback::settle_many_locked`, `put_locked`, `current_locked` call
//!   [`fold_locked`]).
//!
//! Every change happens under the key's stripe lock, and so does every fold. A fold
//! encodes with the live values' map let go (the value away from its slot), so one large
//! value's encode stalls its own key alone. Live values
//! are bounded by half of write-back's budget ([`admits`]: a value that does not fit goes
//! the whole-value way; past the budget the next fold, or a read that would make a value
//! live, drops the least recently used: [`make_room`]; a write of a large collection
//! that is not live drops them at once, changed or not: [`Room::Beside`]). A collection
//! larger than that budget may be live alone, up to DRAM's budget ([`alone_max`]): the
//! whole-value way would decode and encode all of it for every command, which holds as
//! much memory for the command's length. One that no command has used for
//! [`IDLE_MS`] is dropped at the next fold, a large one after [`LARGE_IDLE_MS`].
//!
//! Reads use a live value in place too ([`read_live`]: `SISMEMBER` finds the member
//! through its table instead of decoding the stored set), and a collection read again soon
//! (its key seen twice running in [`Live::seen`]) is made live by the read.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use strata_format::{Key, Kind};

use crate::core::Core;
use crate::durability::{Ticket, Written};
use crate::stats::add;
use crate::warm::{Loc, Want};
use crate::write::{check_sizes, update, Change};
use crate::writeback;
use crate::{Error, Result};

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

/// What a slot holds while its value is away being encoded ([`fold_slot`]).
struct Away;

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

/// What a live value was last stored as (or made from).
#[derive(Clone, Copy, Default)]
struct StoredAs {
    /// Parts ([`strata_format::parts`]): a fold writes its delta alone into them
    /// ([`Change::Parts`]).
    parted: bool,
    /// About the stored form's bytes: what its last whole fold stored (or it was made
    /// from), plus the deltas logged since. Past `parts_bytes_min` a value logged as
    /// deltas is folded whole, into parts.
    len: usize,
}

struct Slot {
    kind: Kind,
    expire_ms: u64,
    value: Box<dyn LiveValue>,
    /// The value is away: its folder, holding the key's stripe lock, encodes it with the
    /// map let go, and [`Away`] stands in. Only a read may find it so (every other use of
    /// a slot's value holds the stripe lock); it waits for that lock.
    away: bool,
    /// Changed since it was last folded or its changes logged.
    changed: bool,
    /// Its changes since it was last folded whole are in the hot log as deltas only: DRAM
    /// and the warm store hold an older value.
    logged: bool,
    /// Its last fold went through write-back: the hot log has a record of it whole and DRAM
    /// holds it dirty, so deltas may follow (cleared when that value settles elsewhere).
    based: bool,
    /// What it was last stored as.
    stored: StoredAs,
    /// Commands that changed it since it was last folded (counted while it is stored as
    /// parts: [`PARTS_FOLD_COMMANDS`]).
    unfolded: u32,
    /// When a command last used it, changing it, reading it or neither (Unix ms).
    used_ms: u64,
    /// What it counted against the budget when it last changed.
    bytes: usize,
}

impl Slot {
    /// The slot of a value about to be made live, used at `now`.
    fn new(
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
    fn stale(&self) -> bool {
        self.changed || self.logged
    }

    /// The time a command on this value goes by: the clock itself when the value has an
    /// expiry, else the coarse clock (it only dates the last use, which idle drops judge by
    /// the second).
    fn now(&self, core: &Core) -> u64 {
        match self.expire_ms {
            0 => core.coarse_ms(),
            _ => core.now_ms(),
        }
    }
}

/// The live values, by stored key.
pub(crate) struct Live {
    slots: Mutex<HashMap<Vec<u8>, Slot, ahash::RandomState>>,
    /// Slots held, and of those newer than their stored form (`changed` or `logged`): 0 lets
    /// every check skip the map.
    held: AtomicUsize,
    stale: AtomicUsize,
    bytes: AtomicUsize,
    /// Slots held per bucket of the keys' hashes ([`Live::may_hold`]): a write or read of a
    /// key that has no live value, a string's, skips the map's lock.
    held_in: Box<[AtomicU32]>,
    /// The reads' doorkeeper: the hash of the last key read with no live value, per
    /// bucket. A read that finds its own key's hash there makes the value live; a key read
    /// once, or among many others, is not decoded for nothing.
    seen: Box<[AtomicU64]>,
    /// Reads answered from the parts of a value stored as parts, per key, for
    /// [`read_from_parts`] (at most [`PARTED_READ_KEYS`] keys: cleared when full).
    parted_reads: Mutex<HashMap<Vec<u8>, u32, ahash::RandomState>>,
    hasher: ahash::RandomState,
}

/// Buckets of [`Live::seen`].
const SEEN_BUCKETS: usize = 4096;

/// A value stored as parts whose parts answered this many reads is put together into
/// DRAM in the background ([`read_from_parts`]); fewer reads cost less from the parts.
pub(crate) const PUT_TOGETHER_READS: u32 = 32;

/// Keys [`Live::parted_reads`] counts at most.
const PARTED_READ_KEYS: usize = 4096;

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

impl Live {
    fn set_state(&self, slot: &mut Slot, changed: bool, logged: bool) {
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

    fn set_bytes(&self, slot: &mut Slot, bytes: usize) {
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

    fn remove(&self, key: &[u8]) {
        if let Some(mut s) = self.slots.lock().remove(key) {
            self.set_state(&mut s, false, false);
            self.set_bytes(&mut s, 0);
            self.held_in(key).fetch_sub(1, Ordering::SeqCst);
            self.held.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Keeps `slot`'s value live for `key`, which has no live value (its stripe lock held).
    fn hold(&self, key: &Key, mut slot: Slot, changed: bool) {
        self.set_state(&mut slot, changed, false);
        let bytes = slot.value.bytes();
        self.set_bytes(&mut slot, bytes);
        self.held_in(key.stored()).fetch_add(1, Ordering::SeqCst);
        self.slots.lock().insert(key.stored().to_vec(), slot);
        self.held.fetch_add(1, Ordering::SeqCst);
    }

    fn held_in(&self, key: &[u8]) -> &AtomicU32 {
        let h = self.hasher.hash_one(key);
        &self.held_in[h as usize % SEEN_BUCKETS]
    }

    /// Whether `key` may have a live value: `false` is sure, and costs a hash, not the
    /// map's lock. [`Live::hold`] raises the counts and [`Live::remove`] lowers them, both
    /// under the key's stripe lock, so a caller holding it is never told `false` about a
    /// slot there (one without it may miss a slot going in: its read comes before that
    /// write, which is not acknowledged yet).
    fn may_hold(&self, key: &[u8]) -> bool {
        self.held() != 0 && self.held_in(key).load(Ordering::SeqCst) != 0
    }

    /// Whether a read of `key` (which has no live value) is the second one running: its
    /// bucket of [`Live::seen`] holds its hash from the last read.
    fn seen_again(&self, key: &[u8]) -> bool {
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

/// Most bytes the live values may hold: half of write-back's budget, where they are
/// folded to, or, while one value alone is live, its bytes up to [`alone_max`].
fn bytes_max(core: &Core) -> usize {
    let max = shared_max(core);
    let live = &core.live;
    match live.held() {
        1 => max.max(live.bytes().min(alone_max(core))),
        _ => max,
    }
}

/// Half of write-back's budget: what the live values may hold together.
fn shared_max(core: &Core) -> usize {
    (core.writeback.bytes_max() / 2) as usize
}

/// The most bytes one live value may count when no other is live: DRAM's budget.
fn alone_max(core: &Core) -> usize {
    core.hot.bytes_max()
}

/// Whether a value of `bytes` may be made live: the live values are under their budget and
/// it fits in it alone, or no value is live and it fits in [`alone_max`]. Past the budget,
/// the next fold or read lets the least recently used go ([`make_room`]), so a large
/// collection newly in use takes the place of ones idle, and the live values pass their
/// budget by about one value's bytes until then.
fn admits(core: &Core, bytes: usize) -> bool {
    let max = bytes_max(core);
    (core.live.bytes() < max && bytes <= max) || (core.live.held() == 0 && bytes <= alone_max(core))
}

/// Whether a value of `bytes` is live only alone: larger than the live values' shared
/// budget, within [`alone_max`].
fn alone(core: &Core, bytes: usize) -> bool {
    bytes > shared_max(core) && bytes <= alone_max(core)
}

/// What a fold must achieve.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fold {
    /// The stored form is the live value (before a read or write of the key, a settle, an
    /// operation on the whole keyspace).
    Stored,
    /// The hot log covers every change (before the logs are written out): a delta will do.
    Logged,
}

/// Folds `key`'s live value into its stored state if it is newer, and with `forget` drops
/// it; the caller holds the key's stripe lock. Returns whether it stored it.
pub(crate) fn fold_locked(core: &Core, key: &Key, forget: bool) -> Result<bool> {
    fold_slot(core, key, forget, Fold::Stored)
}

/// [`fold_locked`] to `how`'s end.
fn fold_slot(core: &Core, key: &Key, forget: bool, how: Fold) -> Result<bool> {
    let live = &core.live;
    if !live.may_hold(key.stored()) {
        return Ok(false);
    }
    let mut slots = live.slots.lock();
    let Some(slot) = slots.get_mut(key.stored()) else {
        return Ok(false);
    };
    let (kind, expire_ms) = (slot.kind, slot.expire_ms);
    // Stored as parts: its changes alone are written into them, whatever the fold is for.
    if slot.changed && slot.stored.parted {
        let count = slot.value.items();
        let count = count.filter(|&n| slot.value.moves() <= n);
        if let Some((count, delta)) = count.and_then(|n| Some((n, slot.value.delta()?))) {
            let bytes = slot.value.bytes();
            live.set_state(slot, false, false);
            slot.unfolded = 0;
            drop(slots);
            let r = store_parts_locked(core, key, delta, count, bytes, expire_ms);
            if r.is_err() {
                // Its noted changes are gone with the delta: whole next.
                if let Some(s) = live.slots.lock().get_mut(key.stored()) {
                    s.stored.parted = false;
                    live.set_state(s, true, false);
                }
            }
            r?;
            add(&core.counters.live_folds);
            if forget {
                live.remove(key.stored());
            }
            return Ok(true);
        }
    }
    // A delta only follows a record of the whole value: the dirty value DRAM holds, logged
    // already (with `none`, the tick logs it after the folds: not before its first tick).
    if how == Fold::Logged && slot.changed && slot.based && core.hot.is_logged_dirty(key.stored()) {
        if let Some(delta) = slot.value.delta() {
            slot.stored.len += delta.len();
            // Grown past `parts_bytes_min`, it is stored whole below, as parts (the delta's
            // changes are in the value).
            if !core.settings.warm.stores_parts(kind, slot.stored.len) {
                live.set_state(slot, false, true);
                drop(slots);
                writeback::log_delta_locked(core, key, kind, &delta, expire_ms);
                add(&core.counters.live_deltas);
                return Ok(false);
            }
        }
    }
    let mut stored = false;
    if slot.changed || (slot.logged && how == Fold::Stored) {
        // Changes of this key wait for its stripe lock, which the caller holds: the map is
        // let go while the value is encoded (a collection of millions takes a good part of
        // a second, and every other live value would wait) and stored. A read of this key
        // meanwhile finds it away or stale and waits for the lock rather than find DRAM's
        // older value.
        let mut value = std::mem::replace(&mut slot.value, Box::new(Away));
        slot.away = true;
        drop(slots);
        let encoded = value.encode();
        let len = encoded.len();
        if let Some(s) = live.slots.lock().get_mut(key.stored()) {
            s.value = value;
            s.away = false;
        }
        let r = store_locked(core, key, kind, encoded, expire_ms);
        if let Some(s) = live.slots.lock().get_mut(key.stored()) {
            // The encode counted the value again (one grown in place is larger than it was
            // counted).
            let bytes = s.value.bytes();
            live.set_bytes(s, bytes);
            match &r {
                Ok(how) => {
                    s.based = *how == Landed::WriteBack;
                    s.stored = StoredAs {
                        parted: *how == Landed::Parts,
                        len,
                    };
                    live.set_state(s, false, false);
                }
                // Its noted changes went into the value that was not stored: whole next.
                Err(_) => {
                    s.based = false;
                    s.stored.parted = false;
                    live.set_state(s, true, false);
                }
            }
        }
        r?;
        add(&core.counters.live_folds);
        stored = true;
    } else {
        drop(slots);
    }
    if forget {
        live.remove(key.stored());
    }
    Ok(stored)
}

/// Where a fold stored its value.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Landed {
    WriteBack,
    Warm,
    /// The warm store, as parts.
    Parts,
}

/// Stores a folded value as any write of it would be stored: through write-back when it
/// takes it (whatever its size: it is one value of many changes) and it is not large
/// enough to be stored as parts, else into the warm store, not held to the hard limit (its
/// changes were acknowledged).
fn store_locked(
    core: &Core,
    key: &Key,
    kind: Kind,
    value: Bytes,
    expire_ms: u64,
) -> Result<Landed> {
    let parts = core.settings.warm.stores_parts(kind, value.len());
    if !parts && writeback::takes_any_size(core, key, &value, expire_ms) {
        writeback::log_locked(core, key, kind, &value, expire_ms);
        return Ok(Landed::WriteBack);
    }
    let change = Change::Put {
        kind,
        value: value.clone(),
        expire_ms,
    };
    writeback::settle_into_locked(core, key, change)?;
    if strata_format::is_live(expire_ms, core.now_ms()) {
        core.hot
            .insert_tagged(key.stored(), value, expire_ms, kind as u8);
    } else {
        core.hot.remove(key.stored());
    }
    core.locks.bump(key);
    let live = strata_format::is_live(expire_ms, core.now_ms());
    Ok(match parts && live {
        true => Landed::Parts,
        false => Landed::Warm,
    })
}

/// Stores the changes of a live value stored as parts (`delta`, its count and bytes after
/// it) into its parts. DRAM's copy of the value, now older, goes.
fn store_parts_locked(
    core: &Core,
    key: &Key,
    delta: Vec<u8>,
    count: usize,
    bytes: usize,
    expire_ms: u64,
) -> Result<()> {
    let change = Change::Parts {
        delta: delta.into(),
        count: count as u64,
        bytes: bytes as u64,
        expire_ms,
    };
    writeback::settle_into_locked(core, key, change)?;
    core.hot.remove(key.stored());
    core.locks.bump(key);
    Ok(())
}

/// Before a read of `keys`: folds those with changes not yet folded, so that the read finds
/// their newest state where it looks.
pub(crate) fn fold_keys(core: &Core, keys: &[&Key]) -> Result<()> {
    let live = &core.live;
    if live.stale.load(Ordering::SeqCst) == 0 {
        return Ok(());
    }
    if !keys.iter().any(|k| live.may_hold(k.stored())) {
        return Ok(());
    }
    let changed: Vec<&Key> = {
        let slots = live.slots.lock();
        keys.iter()
            .copied()
            .filter(|k| slots.get(k.stored()).is_some_and(Slot::stale))
            .collect()
    };
    for k in changed {
        let _g = core.locks.lock(k);
        fold_locked(core, k, false)?;
    }
    Ok(())
}

/// Folds every live value to `how`'s end (before the logs are written out: `Logged`;
/// before an operation on the whole keyspace: `Stored`), and drops those unused for
/// [`IDLE_MS`] ([`LARGE_IDLE_MS`] if large) and, while the live values are over their
/// budget, unchanged ones least recently used first; stored whole first.
pub(crate) fn fold_all(core: &Core, how: Fold) -> Result<()> {
    let live = &core.live;
    if live.held() == 0 {
        return Ok(());
    }
    let now = core.now_ms();
    let mut due: Vec<(Vec<u8>, bool)> = Vec::new();
    for (k, s) in live.slots.lock().iter() {
        let idle_ms = if s.bytes >= LARGE_BYTES_MIN {
            LARGE_IDLE_MS
        } else {
            IDLE_MS
        };
        if !s.changed && now.saturating_sub(s.used_ms) >= idle_ms {
            due.push((k.clone(), true));
        } else if s.changed || (s.logged && how == Fold::Stored) {
            due.push((k.clone(), false));
        }
    }
    for (stored, forget) in due {
        let key = Key::from_stored(&stored)?;
        let _g = core.locks.lock(&key);
        let how = if forget { Fold::Stored } else { how };
        fold_slot(core, &key, forget, how)?;
    }
    make_room(core, Room::Idle, bytes_max(core))
}

/// Lets live values go, least recently used first, until they hold at most `budget` bytes
/// (each is stored whole first when its stored form is older).
///
/// - [`Room::Idle`]: the caller holds no stripe lock; only unchanged values go (one whose
///   changes are logged as deltas only counts as unchanged), each stripe waited for.
/// - [`Room::Beside`]: a value is about to be made live at this key, whose stripe lock the
///   caller holds; changed values go too, and a victim whose stripe someone holds (the
///   caller's among them) is skipped.
/// - [`Room::Aside`]: as `Beside`, but only unchanged values go (a read's).
fn make_room(core: &Core, room: Room<'_>, budget: usize) -> Result<()> {
    let over = core.live.bytes().saturating_sub(budget);
    let changed_too = matches!(room, Room::Beside(_));
    let candidates = least_recently_used(core, |s| changed_too || !s.changed);
    for stored in freeing(candidates, over) {
        let victim = Key::from_stored(&stored)?;
        let _g = match room {
            Room::Idle => core.locks.lock(&victim),
            Room::Beside(key) | Room::Aside(key) if stored == key.stored() => continue,
            Room::Beside(_) | Room::Aside(_) => match core.locks.try_lock(&victim) {
                Some(g) => g,
                None => continue,
            },
        };
        fold_slot(core, &victim, true, Fold::Stored)?;
    }
    Ok(())
}

/// Who makes room ([`make_room`]).
#[derive(Clone, Copy)]
enum Room<'k> {
    Idle,
    Beside(&'k Key),
    Aside(&'k Key),
}

/// The live values `pick` chooses, least recently used first: `(used, bytes, stored key)`.
fn least_recently_used(core: &Core, pick: impl Fn(&Slot) -> bool) -> Vec<(u64, usize, Vec<u8>)> {
    let mut v: Vec<(u64, usize, Vec<u8>)> = core
        .live
        .slots
        .lock()
        .iter()
        .filter(|(_, s)| pick(s))
        .map(|(k, s)| (s.used_ms, s.bytes, k.clone()))
        .collect();
    v.sort_unstable_by_key(|s| s.0);
    v
}

/// The keys of the first `candidates` whose bytes add up past `over` (none if `over` is 0).
fn freeing(candidates: Vec<(u64, usize, Vec<u8>)>, over: usize) -> Vec<Vec<u8>> {
    let mut freed = 0;
    let mut out = Vec::new();
    for (_, bytes, stored) in candidates {
        if over == 0 || freed > over {
            break;
        }
        freed += bytes;
        out.push(stored);
    }
    out
}

/// Whether writes may keep values live: write-back is on and client writes are not synced
/// one by one (a live value's changes reach the disk only when it is folded).
fn allowed(core: &Core) -> bool {
    core.writeback.bytes_max() > 0 && !core.syncs_client_writes()
}

/// The read-modify-write of a collection of `kind` at `key`, in place (see the module
/// doc). `decode` makes the live value from the stored form (`None`: the key holds
/// nothing); `f` changes it and says whether it did. A value left empty deletes its key;
/// the key keeps its expiry. Where the value cannot stay live (a cold value, the budget
/// full, `stays` false, live values off), the same closures change it the whole-value way.
pub(crate) async fn update_live<R>(
    core: &Core,
    key: &Key,
    kind: Kind,
    decode: impl Fn(Option<&Bytes>) -> Result<Box<dyn LiveValue>>,
    f: impl FnOnce(&mut dyn LiveValue) -> Result<(bool, R)>,
) -> Result<Written<R>> {
    check_sizes(key, None)?;
    if allowed(core) {
        core.check_writable()?;
        let _g = core.locks.lock(key);
        let live = &core.live;
        let mut slots = live.slots.lock();
        if let Some(slot) = slots.get_mut(key.stored()) {
            let now = slot.now(core);
            if slot.kind != kind && strata_format::is_live(slot.expire_ms, now) {
                return Err(Error::WrongType);
            }
            if strata_format::is_live(slot.expire_ms, now) {
                slot.used_ms = now;
                let (changed, out) = f(slot.value.as_mut())?;
                if !changed {
                    return Ok(Written::new(out, Ticket::NONE));
                }
                if slot.value.is_empty() {
                    drop(slots);
                    live.remove(key.stored());
                    return delete_locked(core, key).map(|t| Written::new(out, t));
                }
                let logged = slot.logged;
                live.set_state(slot, true, logged);
                let bytes = slot.value.bytes();
                live.set_bytes(slot, bytes);
                let fold_now = slot.stored.parted && {
                    slot.unfolded += 1;
                    slot.unfolded >= PARTS_FOLD_COMMANDS
                };
                drop(slots);
                if fold_now {
                    // The change is made: a failed fold leaves it to the next one (whole),
                    // which reports the failure to whoever waits for it.
                    if let Err(e) = fold_locked(core, key, false) {
                        tracing::warn!(error = %e, "a fold into parts failed; the next is whole");
                    }
                }
                return Ok(Written::new(out, changed_locked(core, key)));
            }
            // Expired: the key is gone. `adoptable` folds it first (its expiry may be newer
            // than the stored form's: `expiry_locked`), and lets it go.
            drop(slots);
        } else {
            drop(slots);
        }
        let now = core.now_ms();
        if let Some(current) = adoptable_parted(core, key, now, true)? {
            let (value, expire_ms, stored) = match current {
                Some((v, e, k, p)) if k == kind => (Some(v), e, p),
                Some(_) => return Err(Error::WrongType),
                None => (None, 0, StoredAs::default()),
            };
            let mut obj = decode(value.as_ref())?;
            let bytes = obj.bytes();
            if obj.stays() && bytes >= LARGE_BYTES_MIN && !admits(core, bytes) {
                // A large collection newly written past the budget: the whole-value way
                // would cost it milliseconds a command until the next fold lets one go, so
                // the least recently used go now (all of them for one live only alone).
                if alone(core, bytes) {
                    make_room(core, Room::Beside(key), 0)?;
                } else if bytes <= shared_max(core) {
                    make_room(core, Room::Beside(key), shared_max(core))?;
                }
            }
            if obj.stays() && admits(core, bytes) {
                let (changed, out) = f(obj.as_mut())?;
                if obj.is_empty() {
                    return match changed {
                        true => delete_locked(core, key).map(|t| Written::new(out, t)),
                        false => Ok(Written::new(out, Ticket::NONE)),
                    };
                }
                // Kept even when unchanged: the next write finds it decoded (a stream of
                // `SADD`s of members already there would decode the value every time).
                live.hold(key, Slot::new(kind, expire_ms, obj, stored, now), changed);
                let ticket = match changed {
                    true => changed_locked(core, key),
                    false => Ticket::NONE,
                };
                return Ok(Written::new(out, ticket));
            }
        }
    }
    // Boxed: the whole-value way's state is large; a write in place need not carry it.
    Box::pin(whole(core, key, kind, decode, f)).await
}

/// The expiry of `key` changed in its live value, if it has one (its stripe lock held):
/// `f` sees the expiry (0: none) and returns the new one, or `None` to leave it, and a
/// result. The change is the value's, logged with its next fold or delta. `Ok(None)` (and
/// `f` not run, or its answer not applied): no live value, it expired, live values are off,
/// or the new expiry is past (the caller deletes the key the general way).
pub(crate) fn expiry_locked<R>(
    core: &Core,
    key: &Key,
    now: u64,
    f: impl FnOnce(u64) -> (Option<u64>, R),
) -> Result<Option<Written<R>>> {
    let live = &core.live;
    if !live.may_hold(key.stored()) || !allowed(core) {
        return Ok(None);
    }
    let mut slots = live.slots.lock();
    let Some(slot) = slots.get_mut(key.stored()) else {
        return Ok(None);
    };
    if !strata_format::is_live(slot.expire_ms, now) {
        return Ok(None);
    }
    let (new, out) = f(slot.expire_ms);
    let Some(new) = new else {
        slot.used_ms = now;
        return Ok(Some(Written::new(out, Ticket::NONE)));
    };
    if !strata_format::is_live(new, now) {
        return Ok(None);
    }
    core.check_writable()?;
    slot.used_ms = now;
    slot.expire_ms = new;
    let logged = slot.logged;
    live.set_state(slot, true, logged);
    drop(slots);
    Ok(Some(Written::new(out, changed_locked(core, key))))
}

/// `key`'s kind and expiry (0: none) as its live value has them, without folding it:
/// `Some(None)` if it expired (the key is gone), `None` if it has no live value.
pub(crate) fn peek(core: &Core, key: &Key) -> Option<Option<(Kind, u64)>> {
    let live = &core.live;
    if !live.may_hold(key.stored()) {
        return None;
    }
    let slots = live.slots.lock();
    let s = slots.get(key.stored())?;
    Some(strata_format::is_live(s.expire_ms, core.now_ms()).then_some((s.kind, s.expire_ms)))
}

/// The current value of `key` (its stripe lock held) if one can be made live without
/// waiting: `Some(None)` if the key holds nothing, `None` if it is cold.
#[allow(clippy::type_complexity)]
pub(crate) fn adoptable(
    core: &Core,
    key: &Key,
    now: u64,
) -> Result<Option<Option<(Bytes, u64, Kind)>>> {
    Ok(adoptable_parted(core, key, now, true)?.map(|c| c.map(|(v, e, k, _)| (v, e, k))))
}

/// [`adoptable`], and what the value is stored as: parts only if no newer dirty value
/// stands in front of them. Without `whole_parts`, a value stored as parts and not in
/// DRAM is not put together (`None`: the stored value answers).
#[allow(clippy::type_complexity)]
fn adoptable_parted(
    core: &Core,
    key: &Key,
    now: u64,
    whole_parts: bool,
) -> Result<Option<Option<(Bytes, u64, Kind, StoredAs)>>> {
    if let Some(known) = writeback::current_locked(core, key, now)? {
        let Some((v, e, k)) = known else {
            return Ok(Some(None));
        };
        // DRAM's copy: of parts if it is clean, large and the record says so.
        let parted = core.settings.warm.stores_parts(k, v.len())
            && !core.hot.is_dirty(key.stored())
            && stored_as_parts(core, key)?;
        let len = v.len();
        return Ok(Some(Some((v, e, k, StoredAs { parted, len }))));
    }
    let want = match whole_parts {
        true => Want::Value,
        false => Want::ValueUnlessParted,
    };
    Ok(match core.lookup(key, want)? {
        None => Some(None),
        Some(s) if !s.is_live(now) => Some(None),
        Some(s) => match s.loc {
            Loc::Warm {
                value: Some(v),
                parted,
                ..
            } => {
                let stored = StoredAs {
                    parted: parted.is_some(),
                    len: v.len(),
                };
                Some(Some((v, s.expire_ms, s.kind, stored)))
            }
            _ => None,
        },
    })
}

/// A read of the collection of `kind` at `key` from its live value, if it has one or gets
/// one now: `f` sees it (under the map's lock: keep `f` short), `Ok(None)` sends the
/// caller to the stored value (no live value; the key is absent, expired or cold; live
/// values are off or full). A key read a second time running ([`Live::seen`]) is made live
/// with `decode`, as a write makes it. Another kind there is [`Error::WrongType`].
pub(crate) fn read_live<R>(
    core: &Core,
    key: &Key,
    kind: Kind,
    decode: impl FnOnce(Option<&Bytes>) -> Result<Box<dyn LiveValue>>,
    f: impl FnOnce(&mut dyn LiveValue) -> R,
) -> Result<Option<R>> {
    let out = read_in_place(core, key, kind, decode, f)?;
    if out.is_some() {
        // A hit, counted once the live values' lock is let go (it may queue a job).
        add(&core.counters.live_reads);
        crate::read::hot_hit(core, key);
    }
    Ok(out)
}

/// [`read_live`] up to its answer, under the locks it takes.
fn read_in_place<R>(
    core: &Core,
    key: &Key,
    kind: Kind,
    decode: impl FnOnce(Option<&Bytes>) -> Result<Box<dyn LiveValue>>,
    f: impl FnOnce(&mut dyn LiveValue) -> R,
) -> Result<Option<R>> {
    if !allowed(core) {
        return Ok(None);
    }
    let live = &core.live;
    if live.may_hold(key.stored()) {
        let mut slots = live.slots.lock();
        if let Some(slot) = slots.get_mut(key.stored()) {
            if !slot.away {
                return read_slot(core, slot, kind, f);
            }
            // Being folded: its folder holds the stripe lock.
            drop(slots);
            let _g = core.locks.lock(key);
            return match live.slots.lock().get_mut(key.stored()) {
                Some(slot) => read_slot(core, slot, kind, f),
                // Folded and let go: its stored form is its newest state.
                None => Ok(None),
            };
        }
    }
    if !live.seen_again(key.stored()) {
        return Ok(None);
    }
    if live.bytes() >= bytes_max(core) {
        // No fold may come soon (reads alone commit nothing): make room now.
        make_room(core, Room::Idle, bytes_max(core))?;
        if live.bytes() >= bytes_max(core) {
            return Ok(None);
        }
    }
    let _g = core.locks.lock(key);
    if let Some(slot) = live.slots.lock().get_mut(key.stored()) {
        return read_slot(core, slot, kind, f);
    }
    let now = core.now_ms();
    // Not a value stored as parts, put together from them: a read of a few of its items
    // reads those alone ([`crate::read::get_named_with`]), and one of all of them pays
    // for itself alone.
    let (value, expire_ms, stored) = match adoptable_parted(core, key, now, false)? {
        Some(Some((v, e, k, p))) if k == kind => (v, e, p),
        Some(Some(_)) => return Err(Error::WrongType),
        // Absent, cold or parts: the stored value answers.
        Some(None) | None => return Ok(None),
    };
    let obj = decode(Some(&value))?;
    if obj.stays() && alone(core, obj.bytes()) && !admits(core, obj.bytes()) {
        // Live only alone: the unchanged others go (a read commits nothing).
        make_room(core, Room::Aside(key), 0)?;
    }
    if !obj.stays() || obj.is_empty() || !admits(core, obj.bytes()) {
        return Ok(None);
    }
    live.hold(key, Slot::new(kind, expire_ms, obj, stored, now), false);
    let mut slots = live.slots.lock();
    let slot = slots
        .get_mut(key.stored())
        .expect("held under the stripe lock");
    read_slot(core, slot, kind, f)
}

/// Counts a read of `key`'s value, stored as parts at `at`, answered from its parts (a
/// read does not make such a value live: [`read_in_place`]). The
/// [`PUT_TOGETHER_READS`]th puts it together into DRAM after the reply, if DRAM can hold
/// it, so that a later read makes it live from there and reads no more parts.
pub(crate) fn read_from_parts(core: &Core, key: &Key, at: strata_format::Parted) {
    if !core.hot.fits(key.stored().len(), at.bytes as usize) {
        return;
    }
    let due = {
        let mut reads = core.live.parted_reads.lock();
        if reads.len() >= PARTED_READ_KEYS && !reads.contains_key(key.stored()) {
            reads.clear();
        }
        let n = reads.entry(key.stored().to_vec()).or_insert(0);
        *n += 1;
        let due = *n >= PUT_TOGETHER_READS;
        if due {
            reads.remove(key.stored());
        }
        due
    };
    if due {
        crate::hook::put_together(core, key);
    }
}

/// Whether the warm store holds `key`'s value as parts.
fn stored_as_parts(core: &Core, key: &Key) -> Result<bool> {
    Ok(core
        .lookup(key, Want::Entry)?
        .is_some_and(|s| s.parted().is_some()))
}

/// [`read_live`] of the live value in `slot` (the map's lock held): `Ok(None)` if it
/// expired (the key is gone: the stored value says so too).
fn read_slot<R>(
    core: &Core,
    slot: &mut Slot,
    kind: Kind,
    f: impl FnOnce(&mut dyn LiveValue) -> R,
) -> Result<Option<R>> {
    let now = slot.now(core);
    if !strata_format::is_live(slot.expire_ms, now) {
        return Ok(None);
    }
    if slot.kind != kind {
        return Err(Error::WrongType);
    }
    slot.used_ms = now;
    Ok(Some(f(slot.value.as_mut())))
}

/// After a live value changed (its stripe lock held): the write's ticket.
fn changed_locked(core: &Core, key: &Key) -> Ticket {
    add(&core.counters.writes);
    add(&core.counters.live_writes);
    core.locks.bump(key);
    core.ticket()
}

/// Deletes `key`'s stored state (its live value is gone; its stripe lock held; client
/// writes are not synced one by one, or it would not have had one).
fn delete_locked(core: &Core, key: &Key) -> Result<Ticket> {
    core.check_writable()?;
    writeback::settle_into_locked(core, key, Change::Delete)?;
    core.hot.remove(key.stored());
    add(&core.counters.writes);
    core.locks.bump(key);
    Ok(core.ticket())
}

/// [`update_live`] the whole-value way: the stored value decoded, changed and stored again.
async fn whole<R>(
    core: &Core,
    key: &Key,
    kind: Kind,
    decode: impl Fn(Option<&Bytes>) -> Result<Box<dyn LiveValue>>,
    f: impl FnOnce(&mut dyn LiveValue) -> Result<(bool, R)>,
) -> Result<Written<R>> {
    update(core, key, true, move |cur| {
        let (value, expire_ms) = match &cur {
            None => (None, 0),
            Some(c) if c.kind != kind => return Err(Error::WrongType),
            Some(c) => (c.value, c.expire_ms),
        };
        let mut obj = decode(value)?;
        let (changed, out) = f(obj.as_mut())?;
        let change = match (changed, obj.is_empty()) {
            (false, _) => None,
            (true, true) => cur.is_some().then_some(Change::Delete),
            (true, false) => Some(Change::Put {
                kind,
                value: obj.encode(),
                expire_ms,
            }),
        };
        Ok((change, out))
    })
    .await
}
