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
//!   ([`fold_all`], from `crate::settle::settle_all`);
//! - before any other write of the key, which also drops the live value
//!   (`crate::settle::settle_many_locked`, `put_locked`, `current_locked` call
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

pub(crate) mod state;

use bytes::Bytes;
use strata_format::{Key, Kind};

use crate::commit::Change;
use crate::core::Core;
use crate::durability::{Ticket, Written};
use crate::fold::allowed;
use crate::stats::add;
use crate::warm::{Loc, Want};
use crate::writeback;
use crate::Result;
use state::*;

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
pub(crate) fn adoptable_parted(
    core: &Core,
    key: &Key,
    now: u64,
    whole_parts: bool,
) -> Result<Option<Option<(Bytes, u64, Kind, StoredAs)>>> {
    if let Some(known) = crate::settle::current_locked(core, key, now)? {
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
pub(crate) fn stored_as_parts(core: &Core, key: &Key) -> Result<bool> {
    Ok(core
        .lookup(key, Want::Entry)?
        .is_some_and(|s| s.parted().is_some()))
}

/// After a live value changed (its stripe lock held): the write's ticket.
pub(crate) fn changed_locked(core: &Core, key: &Key) -> Ticket {
    add(&core.counters.writes);
    add(&core.counters.live_writes);
    core.locks.bump(key);
    core.changed(key);
    core.ticket()
}

/// Deletes `key`'s stored state (its live value is gone; its stripe lock held; client
/// writes are not synced one by one, or it would not have had one).
pub(crate) fn delete_locked(core: &Core, key: &Key) -> Result<Ticket> {
    core.check_writable()?;
    writeback::settle_into_locked(core, key, Change::Delete)?;
    core.hot.remove(key.stored());
    add(&core.counters.writes);
    core.locks.bump(key);
    core.changed(key);
    Ok(core.ticket())
}
