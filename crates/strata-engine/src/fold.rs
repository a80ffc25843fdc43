//! Folding: a live value stored (encoded, and written through write-back or the warm
//! store) or its changes logged as a delta, under the key's stripe lock, before anything
//! that needs its stored form (`live` tells when); and the live values' budget, which a
//! fold keeps by letting the least recently used go.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use strata_format::{Key, Kind};

use crate::commit::Change;
use crate::core::Core;
use crate::live::state::*;
use crate::stats::add;
use crate::writeback;
use crate::Result;

/// Most bytes the live values may hold: half of write-back's budget, where they are
/// folded to, or, while one value alone is live, its bytes up to [`alone_max`].
pub(crate) fn bytes_max(core: &Core) -> usize {
    let max = shared_max(core);
    let live = &core.live;
    match live.held() {
        1 => max.max(live.bytes().min(alone_max(core))),
        _ => max,
    }
}

/// Half of write-back's budget: what the live values may hold together.
pub(crate) fn shared_max(core: &Core) -> usize {
    (core.writeback.bytes_max() / 2) as usize
}

/// The most bytes one live value may count when no other is live: DRAM's budget.
pub(crate) fn alone_max(core: &Core) -> usize {
    core.hot.bytes_max()
}

/// Whether a value of `bytes` may be made live: the live values are under their budget and
/// it fits in it alone, or no value is live and it fits in [`alone_max`]. Past the budget,
/// the next fold or read lets the least recently used go ([`make_room`]), so a large
/// collection newly in use takes the place of ones idle, and the live values pass their
/// budget by about one value's bytes until then.
pub(crate) fn admits(core: &Core, bytes: usize) -> bool {
    let max = bytes_max(core);
    (core.live.bytes() < max && bytes <= max) || (core.live.held() == 0 && bytes <= alone_max(core))
}

/// Whether a value of `bytes` is live only alone: larger than the live values' shared
/// budget, within [`alone_max`].
pub(crate) fn alone(core: &Core, bytes: usize) -> bool {
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
pub(crate) fn make_room(core: &Core, room: Room<'_>, budget: usize) -> Result<()> {
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
pub(crate) enum Room<'k> {
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
pub(crate) fn allowed(core: &Core) -> bool {
    core.writeback.bytes_max() > 0 && !core.syncs_client_writes()
}
