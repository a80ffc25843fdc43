//! The commands' writes: puts, conditional puts, updates, counters, expiries and flushes
//! of strings, and the read-modify-write of collections in place ([`update_live`]). Each
//! takes write-back's path when it can (`writeback`), and otherwise settles the key and
//! commits a batch (`commit`); it hands back the [`Ticket`] to wait for before anyone is
//! told it happened.

use std::time::Instant;

use bytes::Bytes;
use strata_format::{hash, Key, Kind};
use strata_warm::Family;

use crate::commit::{
    apply_locked, check_sizes, commit_staged, same_state, stage, start_demotion_if_over,
    wait_for_room, Change,
};
use crate::core::Core;
use crate::durability::{Ticket, Written};
use crate::fold::{admits, allowed, alone, fold_locked, make_room, shared_max, Room};
use crate::live::state::{LiveValue, Slot, StoredAs, LARGE_BYTES_MIN, PARTS_FOLD_COMMANDS};
use crate::live::{adoptable_parted, changed_locked, delete_locked};
use crate::stats::add;
use crate::warm::{warm_charge, Counts, Loc, Stored, Want};
use crate::writeback;
use crate::{Error, Result};

/// What a write does to a key's expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Expire {
    /// Remove any expiry (what Redis's `SET` does by default).
    #[default]
    Persist,
    /// Keep the current expiry (`KEEPTTL`).
    Keep,
    /// Expire at this Unix time in milliseconds.
    AtMs(u64),
}

/// When a put applies.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Condition {
    #[default]
    Always,
    /// Only if the key holds no live value (`NX`).
    IfAbsent,
    /// Only if the key holds a live value (`XX`).
    IfPresent,
    /// Only if the current value equals these bytes (Valkey's `IFEQ`).
    IfEquals(Bytes),
}

#[derive(Debug, Clone, Default)]
pub struct PutOptions {
    pub expire: Expire,
    pub condition: Condition,
    /// Return the previous value (`SET ... GET`).
    pub return_old: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutResult {
    pub written: bool,
    pub old: Option<Bytes>,
}

/// A live entry as an [`crate::Engine::update`] closure sees it.
#[derive(Debug)]
pub struct Existing<'a> {
    /// What kind of value the key holds.
    pub kind: Kind,
    /// The value, when the update asked for it.
    pub value: Option<&'a Bytes>,
    /// Absolute expiry in Unix ms, 0 for none.
    pub expire_ms: u64,
    pub value_len: u64,
}

/// Strict Redis integer parsing: optional '-', no '+', no leading zeros, no spaces.
pub fn parse_i64(b: &[u8]) -> Option<i64> {
    let (negative, digits) = match b.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, b),
    };
    // No sign but a leading '-', no leading zero (nor "-0"), at most 19 digits (which a
    // u64 holds whatever they are).
    if digits.is_empty() || digits.len() > 19 || digits[0] == b'0' && (digits.len() > 1 || negative)
    {
        return None;
    }
    let mut n: u64 = 0;
    for &c in digits {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        n = n * 10 + u64::from(d);
    }
    if negative {
        (n <= i64::MIN.unsigned_abs()).then(|| (n as i64).wrapping_neg())
    } else {
        i64::try_from(n).ok()
    }
}

/// Deletes `key` if it is stored and expired at `expire_ms` (the expiry sweep's step), or
/// for an entry a hash's field left (`stage`), the hash's expired fields.
pub(crate) async fn expire_if_due(core: &Core, key: &Key, expire_ms: u64) -> Result<bool> {
    let fields = {
        let _g = core.locks.lock(key);
        crate::settle::settle_locked(core, key)?;
        let now = core.now_ms();
        match core.lookup(key, Want::Entry)? {
            Some(s) if s.expire_ms == expire_ms && !s.is_live(now) => {
                // Not waited for: an expiry is not acknowledged to anyone.
                let _ = apply_locked(core, key, Some(&s), Change::Delete, false)?;
                add(&core.counters.expired);
                return Ok(true);
            }
            Some(s) if s.expire_ms == expire_ms => return Ok(false),
            Some(s) => s.kind == Kind::Hash && s.is_live(now),
            None => false,
        }
    };
    if fields {
        return expire_fields(core, key, expire_ms).await;
    }
    // An expiry entry whose key moved on: drop it.
    let mut b = core.warm.batch();
    b.remove_expiry(expire_ms, key);
    core.warm.write(b, false)?;
    Ok(false)
}

/// The sweep's step for the expiry-index entry at `at` the fields of the hash at `key` left
/// (`stage`: when its last field expires): a hash whose fields have all expired is deleted,
/// as Redis deletes a hash with its last field; otherwise (its fields changed since) the
/// entry moves to when they all will have expired, or goes if some field never expires.
/// Fields that expired are not cut out of the value (reads pass over them, the hash's next
/// write drops them), so a cold hash stays cold and DRAM is not filled. Says whether the
/// hash went.
async fn expire_fields(core: &Core, key: &Key, at: u64) -> Result<bool> {
    let checked = update(core, key, true, |cur| {
        let value = cur.filter(|c| c.kind == Kind::Hash).and_then(|c| c.value);
        // Gone, not a hash's encoding (the server writes none), or a field that never
        // expires: nothing to sweep, now or later.
        let Some(all_expire) = value.and_then(|v| hash::all_fields_expire_ms(v).ok().flatten())
        else {
            return Ok((None, (false, None)));
        };
        if !strata_format::is_live(all_expire, core.now_ms()) {
            return Ok((Some(Change::Delete), (true, None)));
        }
        Ok((None, (false, Some(all_expire))))
    })
    .await;
    let (gone, next) = match checked {
        Ok(w) => w.value,
        Err(e @ (Error::Closed | Error::Poisoned(_))) => return Err(e),
        // A cold hash whose block cannot be read now: tried again later, not every round.
        Err(e) => {
            tracing::warn!(error = %e, "a hash's expired fields could not be checked; retrying");
            (false, Some(core.now_ms() + FIELD_SWEEP_RETRY_MS))
        }
    };
    if gone {
        add(&core.counters.expired);
    }
    let mut b = core.warm.batch();
    b.remove_expiry(at, key);
    if let Some(next) = next {
        b.add_expiry(next, key);
    }
    core.warm.write(b, false)?;
    Ok(gone)
}

/// How long the sweep waits before it checks again a hash it could not read.
const FIELD_SWEEP_RETRY_MS: u64 = 60_000;

/// The general atomic read-modify-write. `f` sees the live entry (with its value when
/// `want_value`; a cold value is fetched first) and returns the change to make, if any,
/// and a result. `f` runs under the key's lock: keep it short.
pub(crate) async fn update<R>(
    core: &Core,
    key: &Key,
    want_value: bool,
    f: impl FnOnce(Option<Existing<'_>>) -> Result<(Option<Change>, R)>,
) -> Result<Written<R>> {
    check_sizes(key, None)?;
    let mut f = Some(f);
    let mut fetched: Option<(strata_format::BlockRef, Bytes)> = None;
    for _attempt in 0..8 {
        let _g = core.locks.lock(key);
        crate::settle::settle_locked(core, key)?;
        let now = core.now_ms();
        let want = if want_value { Want::Value } else { Want::Entry };
        let stored = core.lookup(key, want)?;
        let live = stored.as_ref().filter(|s| s.is_live(now));
        let existing = match live {
            None => None,
            Some(s) => match &s.loc {
                Loc::Warm { value, .. } => Some(Existing {
                    kind: s.kind,
                    value: value.as_ref(),
                    expire_ms: s.expire_ms,
                    value_len: s.value_len,
                }),
                Loc::Cold(r) if want_value => match &fetched {
                    Some((fr, v)) if fr == r => Some(Existing {
                        kind: s.kind,
                        value: Some(v),
                        expire_ms: s.expire_ms,
                        value_len: s.value_len,
                    }),
                    _ => {
                        let r = *r;
                        drop(_g);
                        fetched = Some((r, core.fetch_cold(key, &r).await?.0));
                        continue;
                    }
                },
                Loc::Cold(_) => Some(Existing {
                    kind: s.kind,
                    value: None,
                    expire_ms: s.expire_ms,
                    value_len: s.value_len,
                }),
            },
        };
        let f = f.take().expect("update closure runs once");
        let (change, out) = f(existing)?;
        let Some(change) = change else {
            return Ok(Written::new(out, Ticket::NONE));
        };
        if let Change::Put { value, .. } = &change {
            check_sizes(key, Some(value))?;
        }
        let sync = core.syncs_client_writes();
        let ticket = match apply_locked(core, key, stored.as_ref(), change.clone(), sync) {
            Err(Error::WarmFull(_)) => {
                drop(_g);
                apply_when_room(core, key, stored, change).await?
            }
            r => r?,
        };
        start_demotion_if_over(core);
        return Ok(Written::new(out, ticket));
    }
    Err(Error::Internal(
        "key kept changing while its cold value was fetched".into(),
    ))
}

/// Sets `key`'s expiry as `f` decides from the current one (`None`: the key is absent; 0:
/// it never expires): `f` returns the new expiry (0: none; a past one deletes the key), or
/// `None` to leave it, and a result. A key with a live value changes it there; one whose
/// value write-back takes is written back with its new expiry (a read of the warm store at
/// most, no write of it); the rest the general way. `f` may run twice (the first answer
/// not applied): make it a function of the expiry alone.
pub(crate) async fn update_expiry<R>(
    core: &Core,
    key: &Key,
    f: impl Fn(Option<u64>) -> (Option<u64>, R),
) -> Result<Written<R>> {
    check_sizes(key, None)?;
    {
        let _g = core.locks.lock(key);
        if let Some(done) = expiry_back_locked(core, key, &f)? {
            return Ok(done);
        }
    }
    Box::pin(update(core, key, false, move |cur| {
        let (new, out) = f(cur.map(|c| c.expire_ms));
        Ok((new.map(Change::SetExpire), out))
    }))
    .await
}

/// [`update_expiry`] without the warm store's write (its stripe lock held), or `None`.
fn expiry_back_locked<R>(
    core: &Core,
    key: &Key,
    f: &impl Fn(Option<u64>) -> (Option<u64>, R),
) -> Result<Option<Written<R>>> {
    let now = core.now_ms();
    if let Some(done) = crate::live::expiry_locked(core, key, now, |e| f(Some(e)))? {
        return Ok(Some(done));
    }
    // DRAM's or write-back's value, else one read of the warm store; a cold value is not.
    let Some(known) = crate::live::adoptable(core, key, now)? else {
        return Ok(None);
    };
    let (new, out) = f(known.as_ref().map(|k| k.1));
    let Some(new) = new else {
        return Ok(Some(Written::new(out, Ticket::NONE)));
    };
    let Some((value, _, kind)) = known else {
        return Ok(None);
    };
    if !strata_format::is_live(new, now) || !writeback::takes(core, &[(key, &value)], new) {
        return Ok(None);
    }
    core.check_writable()?;
    writeback::put_locked(core, key, kind, &value, new);
    Ok(Some(Written::new(out, core.ticket())))
}

/// Applies `change` to `key` once the warm tier has room: `change` was computed from
/// `stored` and refused at the hard limit, and the key's lock has been let go. Waits for
/// room, then applies it again if the key is as it was (a change computed from the same
/// state is the same change).
async fn apply_when_room(
    core: &Core,
    key: &Key,
    mut stored: Option<Stored>,
    change: Change,
) -> Result<Ticket> {
    let since = Instant::now();
    let need = match &change {
        Change::Put { value, .. } => warm_charge(key, value.len() as u64),
        _ => 0,
    };
    loop {
        wait_for_room(core, need, since).await?;
        let r = {
            let _g = core.locks.lock(key);
            crate::settle::settle_locked(core, key)?;
            let now = core.lookup(key, Want::Entry)?;
            if !same_state(stored.as_ref(), now.as_ref()) {
                // Another write changed the key meanwhile: what this change was computed
                // from is gone.
                add(&core.counters.writes_refused_full);
                return Err(Error::WarmFull(
                    "command not allowed: the warm tier is at its hard limit and the key changed while this write waited for room; retry it".into(),
                ));
            }
            stored = now;
            apply_locked(
                core,
                key,
                stored.as_ref(),
                change.clone(),
                core.syncs_client_writes(),
            )
        };
        match r {
            Err(Error::WarmFull(_)) => continue,
            r => return r,
        }
    }
}

/// Stores `value` under `key` as `opts` says.
pub(crate) async fn put(
    core: &Core,
    key: &Key,
    value: Bytes,
    opts: PutOptions,
) -> Result<Written<PutResult>> {
    check_sizes(key, Some(&value))?;
    let plain_expire = match opts.expire {
        Expire::Persist => Some(0),
        Expire::AtMs(t) => Some(t),
        Expire::Keep => None,
    };
    if let (Condition::Always, false, Some(expire_ms)) =
        (&opts.condition, opts.return_old, plain_expire)
    {
        if let Some(ticket) = writeback::try_put(core, key, Kind::String, &value, expire_ms)? {
            let done = PutResult {
                written: true,
                old: None,
            };
            return Ok(Written::new(done, ticket));
        }
    }
    let want_value = opts.return_old || matches!(opts.condition, Condition::IfEquals(_));
    update(core, key, want_value, move |cur| {
        if want_value && cur.as_ref().is_some_and(|c| c.kind != Kind::String) {
            return Err(Error::WrongType);
        }
        let ok = match (&opts.condition, &cur) {
            (Condition::Always, _) => true,
            (Condition::IfAbsent, c) => c.is_none(),
            (Condition::IfPresent, c) => c.is_some(),
            (Condition::IfEquals(want), Some(c)) => c.value.is_some_and(|v| v == want),
            (Condition::IfEquals(_), None) => false,
        };
        let old = if opts.return_old {
            cur.as_ref().and_then(|c| c.value.cloned())
        } else {
            None
        };
        if !ok {
            return Ok((
                None,
                PutResult {
                    written: false,
                    old,
                },
            ));
        }
        let expire_ms = match opts.expire {
            Expire::Persist => 0,
            Expire::Keep => cur.as_ref().map_or(0, |c| c.expire_ms),
            Expire::AtMs(t) => t,
        };
        let change = Change::Put {
            kind: Kind::String,
            value,
            expire_ms,
        };
        Ok((Some(change), PutResult { written: true, old }))
    })
    .await
}

/// Deletes `keys` (each named once) as [`update`] deletes one, in one batch committed
/// once; returns how many held a live value.
pub(crate) fn delete_many(core: &Core, keys: &[&Key]) -> Result<Written<usize>> {
    for k in keys {
        check_sizes(k, None)?;
    }
    let _locks = core.locks.lock_many(keys.iter().copied());
    core.check_writable()?;
    crate::settle::settle_many_locked(core, keys)?;
    let now = core.now_ms();
    let (mut batch, mut d) = (core.warm.batch(), Counts::default());
    let mut staged = Vec::with_capacity(keys.len());
    let mut deleted = 0;
    for (k, old) in keys.iter().zip(core.lookup_many(keys)?) {
        if let Some(old) = old {
            deleted += old.is_live(now) as usize;
            staged.extend(stage(
                core,
                k,
                Some(&old),
                Change::Delete,
                &mut batch,
                &mut d,
            )?);
        }
    }
    let ticket = commit_staged(core, staged, batch, &d, core.syncs_client_writes())?;
    Ok(Written::new(deleted, ticket))
}

/// Stores every pair in one batch, pair `i` expiring at `expire_of(i)` (see
/// [`crate::Engine::put_many`]).
pub(crate) async fn put_many(
    core: &Core,
    pairs: &[(&Key, Bytes)],
    expire_of: impl Fn(usize) -> u64,
) -> Result<Written<()>> {
    for (k, v) in pairs {
        check_sizes(k, Some(v))?;
    }
    let refs: Vec<(&Key, &[u8])> = pairs.iter().map(|(k, v)| (*k, &v[..])).collect();
    let soonest = (0..pairs.len()).map(&expire_of).filter(|&e| e != 0).min();
    if writeback::takes(core, &refs, soonest.unwrap_or(0)) {
        core.check_writable()?;
        let _locks = core.locks.lock_many(pairs.iter().map(|(k, _)| *k));
        writeback::look_ahead(core, pairs.iter().map(|(k, _)| *k));
        for (i, (k, v)) in pairs.iter().enumerate() {
            writeback::put_locked(core, k, Kind::String, v, expire_of(i));
        }
        return Ok(Written::new((), core.ticket()));
    }
    let last: std::collections::HashMap<&Key, usize> = pairs
        .iter()
        .enumerate()
        .map(|(i, (k, _))| (*k, i))
        .collect();
    let since = Instant::now();
    let need: u64 = pairs
        .iter()
        .map(|(k, v)| warm_charge(k, v.len() as u64))
        .sum();
    loop {
        let locks = core.locks.lock_many(pairs.iter().map(|(k, _)| *k));
        core.check_writable()?;
        let mut batch = core.warm.batch();
        let mut d = Counts::default();
        let mut staged = Vec::with_capacity(last.len());
        let keys: Vec<&Key> = pairs.iter().map(|(k, _)| *k).collect();
        crate::settle::settle_many_locked(core, &keys)?;
        let olds = core.lookup_many(&keys)?;
        for (i, ((k, v), old)) in pairs.iter().zip(olds).enumerate() {
            if last[k] != i {
                continue;
            }
            let change = Change::Put {
                kind: Kind::String,
                value: v.clone(),
                expire_ms: expire_of(i),
            };
            staged.extend(stage(core, k, old.as_ref(), change, &mut batch, &mut d)?);
        }
        match commit_staged(core, staged, batch, &d, core.syncs_client_writes()) {
            Err(Error::WarmFull(_)) => {
                drop(locks);
                wait_for_room(core, need, since).await?;
            }
            r => {
                let ticket = r?;
                start_demotion_if_over(core);
                return Ok(Written::new((), ticket));
            }
        }
    }
}

/// Atomically adds `delta` to the integer stored at `key` (absent counts as 0); keeps the
/// key's expiry.
pub(crate) async fn incr_by(core: &Core, key: &Key, delta: i64) -> Result<Written<i64>> {
    check_sizes(key, None)?;
    let back = {
        let _g = core.locks.lock(key);
        incr_one_back_locked(core, key, delta)?
    };
    if let Some((out, ticket)) = back {
        return Ok(Written::new(out?, ticket));
    }
    // Boxed: the read-modify-write's state is large, and the future of every `INCR` (a
    // script's calls too) would carry it, allocated past the allocator's small sizes.
    Box::pin(update(core, key, true, move |cur| {
        let live = cur
            .as_ref()
            .map(|c| (&c.value.expect("value requested")[..], c.expire_ms, c.kind));
        let (old, expire_ms) = counter_start(live);
        let new = counter_plus(old?, delta)?;
        let value = Bytes::from(new.to_string());
        let change = Change::Put {
            kind: Kind::String,
            value,
            expire_ms,
        };
        Ok((Some(change), new))
    }))
    .await
}

/// The integer a counter command reads from a stored value.
fn counter_of(value: &[u8]) -> Result<i64> {
    parse_i64(value).ok_or(Error::NotInteger)
}

/// `old + delta`, as a counter command adds.
fn counter_plus(old: i64, delta: i64) -> Result<i64> {
    old.checked_add(delta).ok_or(Error::Overflow)
}

/// Most bytes an integer's text takes (`-9223372036854775808`).
const COUNTER_BYTES_MAX: u64 = 20;

/// Adds each delta to its key's integer, in order (a key named twice sees its first
/// result), as one batch: one lock set, one commit, one ticket. Each item has its own
/// result (a value that is not an integer, or an overflow, fails that item only). A live
/// key in the cold tier needs its value fetched first: then the items run one by one.
pub(crate) async fn incr_many(
    core: &Core,
    items: &[(&Key, i64)],
) -> Result<Written<Vec<Result<i64>>>> {
    for (k, _) in items {
        check_sizes(k, None)?;
    }
    let back = {
        let _locks = core.locks.lock_many(items.iter().map(|(k, _)| *k));
        writeback::look_ahead(core, items.iter().map(|(k, _)| *k));
        incr_back_locked(core, items)?
    };
    if let Some((out, ticket)) = back {
        return Ok(Written::new(out, ticket));
    }
    let since = Instant::now();
    loop {
        let attempt = {
            let _locks = core.locks.lock_many(items.iter().map(|(k, _)| *k));
            incr_many_locked(core, items)?
        };
        match attempt {
            IncrMany::Done(w) => {
                start_demotion_if_over(core);
                return Ok(w);
            }
            IncrMany::Full => {
                let need = items
                    .iter()
                    .map(|(k, _)| warm_charge(k, COUNTER_BYTES_MAX))
                    .sum();
                wait_for_room(core, need, since).await?;
            }
            IncrMany::Cold => {
                let mut out = Vec::with_capacity(items.len());
                let mut ticket = Ticket::NONE;
                for &(k, d) in items {
                    out.push(incr_by(core, k, d).await.map(|w| w.defer(&mut ticket)));
                }
                return Ok(Written::new(out, ticket));
            }
        }
    }
}

/// Counter commands through write-back, when DRAM, write-back or a read of the warm store
/// gives every key's current value (their stripes locked; a cold value does not count) and
/// write-back takes the results: each item's result, and the ticket. `None`: nothing was
/// written; the caller goes through the warm store.
#[allow(clippy::type_complexity)]
fn incr_back_locked(
    core: &Core,
    items: &[(&Key, i64)],
) -> Result<Option<(Vec<Result<i64>>, Ticket)>> {
    let now = core.lazy_now();
    let counted = count(items, |k| {
        Ok(counter_known(core, k, &now)?.map(|(cur, expire_ms)| (cur, expire_ms, ())))
    })?;
    let Some((out, changed)) = counted else {
        return Ok(None);
    };
    if changed.is_empty() {
        return Ok(Some((out, Ticket::NONE)));
    }
    // Each integer's text, from a buffer on the stack (DRAM copies it).
    let mut digits: Vec<itoa::Buffer> = vec![itoa::Buffer::new(); changed.len()];
    let pairs: Vec<(&Key, &[u8])> = changed
        .iter()
        .zip(&mut digits)
        .map(|(c, d)| (c.0, d.format(c.1).as_bytes()))
        .collect();
    if !writeback::takes(core, &pairs, 0) {
        return Ok(None);
    }
    core.check_writable()?;
    for ((k, v), (_, _, e, ())) in pairs.iter().zip(&changed) {
        writeback::put_locked(core, k, Kind::String, v, *e);
    }
    Ok(Some((out, core.ticket())))
}

/// A counter's integer (or why it has none) and expiry as write-back or the warm store
/// knows it (its stripe lock held), or `None` if the value is cold.
fn counter_known(
    core: &Core,
    key: &Key,
    now: &crate::core::LazyNow<'_>,
) -> Result<Option<(Result<i64>, u64)>> {
    if let Some(known) = crate::settle::current_seen_locked(core, key, now, counter_start)? {
        return Ok(Some(known));
    }
    // Only the warm store knows: one read of it (no write) tells, unless the value is
    // cold.
    let known = match core
        .lookup(key, Want::Value)?
        .filter(|s| s.is_live(now.get()))
    {
        None => None,
        Some(s) => match s.loc {
            Loc::Warm { value: Some(v), .. } => Some((v, s.expire_ms, s.kind)),
            _ => return Ok(None),
        },
    };
    Ok(Some(counter_start(
        known.as_ref().map(|(v, e, kind)| (&v[..], *e, *kind)),
    )))
}

/// [`incr_back_locked`] of one key, with nothing collected (`INCR`, a script's calls).
fn incr_one_back_locked(
    core: &Core,
    key: &Key,
    delta: i64,
) -> Result<Option<(Result<i64>, Ticket)>> {
    if let Some(done) = incr_in_place_locked(core, key, delta)? {
        return Ok(Some(done));
    }
    let Some((cur, expire_ms)) = counter_known(core, key, &core.lazy_now())? else {
        return Ok(None);
    };
    let new = match cur.and_then(|n| counter_plus(n, delta)) {
        Ok(n) => n,
        Err(e) => return Ok(Some((Err(e), Ticket::NONE))),
    };
    let mut digits = itoa::Buffer::new();
    let value = digits.format(new).as_bytes();
    if !writeback::takes(core, &[(key, value)], 0) {
        return Ok(None);
    }
    core.check_writable()?;
    writeback::put_locked(core, key, Kind::String, value, expire_ms);
    Ok(Some((Ok(new), core.ticket())))
}

/// [`incr_one_back_locked`] when DRAM holds the counter and the new integer has as many
/// digits as the old (most increments): rewritten in its block under one look-up, then
/// logged. `None` (nothing changed) for everything else: the general path answers it.
fn incr_in_place_locked(
    core: &Core,
    key: &Key,
    delta: i64,
) -> Result<Option<(Result<i64>, Ticket)>> {
    crate::fold::fold_locked(core, key, true)?;
    let now = core.lazy_now();
    let mut buf = itoa::Buffer::new();
    let digits = &mut buf;
    let rewritten = core.hot.rewrite_dirty(
        key.stored(),
        !writeback::defers_log(core),
        || now.get(),
        move |value, expire_ms, tag| {
            if tag != Kind::String as u8 {
                return None;
            }
            let new = counter_plus(counter_of(value).ok()?, delta).ok()?;
            let text = digits.format(new).as_bytes();
            if text.len() != value.len()
                || !writeback::takes(core, &[(key, text)], expire_ms)
                || core.check_writable().is_err()
            {
                return None;
            }
            value.copy_from_slice(text);
            Some((new, expire_ms, text))
        },
    );
    let Some((new, expire_ms, value)) = rewritten else {
        return Ok(None);
    };
    writeback::put_in_place_locked(core, key, Kind::String, value, expire_ms);
    Ok(Some((Ok(new), core.ticket())))
}

/// A counter's integer (or why it has none) and expiry, from its live value (value,
/// expiry, kind), if any: an absent key counts as 0.
fn counter_start(live: Option<(&[u8], u64, Kind)>) -> (Result<i64>, u64) {
    match live {
        None => (Ok(0), 0),
        Some((_, _, kind)) if kind != Kind::String => (Err(Error::WrongType), 0),
        Some((v, e, _)) => (counter_of(v), e),
    }
}

/// A key's last eight bytes and its length, in one word: equal for equal keys.
fn key_tail(key: &Key) -> u64 {
    let b = key.stored();
    let mut last = [0u8; 8];
    let n = b.len().min(8);
    last[..n].copy_from_slice(&b[b.len() - n..]);
    u64::from_le_bytes(last) ^ (b.len() as u64).rotate_left(56)
}

/// Runs counter `items` in order (a key named twice sees its first result). `start` gives
/// a key's integer, expiry and whatever the caller keeps of its state, or `None` to give
/// up. Returns each item's result, and each key an item changed (in first-seen order) with
/// its new integer, its expiry and the kept state.
#[allow(clippy::type_complexity)]
fn count<'k, S>(
    items: &[(&'k Key, i64)],
    mut start: impl FnMut(&'k Key) -> Result<Option<(Result<i64>, u64, S)>>,
) -> Result<Option<(Vec<Result<i64>>, Vec<(&'k Key, i64, u64, S)>)>> {
    // Per key: its integer as the items so far left it, expiry, kept state, changed.
    let mut keys: Vec<(&'k Key, Result<i64>, u64, S, bool)> = Vec::new();
    // Where each key is in `keys`: a map only for long runs (a script's call, a lone INCR,
    // a pipeline's few keys are found faster by looking through them, their tails first:
    // keys that differ mostly differ there).
    let mut at: Option<std::collections::HashMap<&Key, usize>> =
        (items.len() > 16).then(std::collections::HashMap::new);
    let mut tails: Vec<u64> = Vec::new();
    let mut out = Vec::with_capacity(items.len());
    for &(k, delta) in items {
        let tail = key_tail(k);
        let seen = match &at {
            Some(at) => at.get(k).copied(),
            None => (0..keys.len()).find(|&i| tails[i] == tail && keys[i].0 == k),
        };
        let i = match seen {
            Some(i) => i,
            None => {
                let Some((cur, expire_ms, kept)) = start(k)? else {
                    return Ok(None);
                };
                keys.push((k, cur, expire_ms, kept, false));
                tails.push(tail);
                if let Some(at) = &mut at {
                    at.insert(k, keys.len() - 1);
                }
                keys.len() - 1
            }
        };
        let c = &mut keys[i];
        let r = match &c.1 {
            Ok(n) => counter_plus(*n, delta),
            Err(e) => Err(e.clone()),
        };
        if let Ok(n) = r {
            c.1 = Ok(n);
            c.4 = true;
        }
        out.push(r);
    }
    let changed = keys
        .into_iter()
        .filter_map(|(k, cur, e, kept, changed)| match (changed, cur) {
            (true, Ok(n)) => Some((k, n, e, kept)),
            _ => None,
        })
        .collect();
    Ok(Some((out, changed)))
}

enum IncrMany {
    Done(Written<Vec<Result<i64>>>),
    /// The warm tier is at its hard limit: nothing was written.
    Full,
    /// A live key is cold: nothing was written.
    Cold,
}

fn incr_many_locked(core: &Core, items: &[(&Key, i64)]) -> Result<IncrMany> {
    core.check_writable()?;
    let now = core.now_ms();
    let counted = count(items, |k| {
        crate::settle::settle_locked(core, k)?;
        let stored = core.lookup(k, Want::Value)?;
        let (cur, expire_ms) = match stored.as_ref().filter(|s| s.is_live(now)) {
            Some(s) => match &s.loc {
                Loc::Cold(_) => return Ok(None),
                Loc::Warm { value, .. } => {
                    let v = value.as_ref().expect("value requested");
                    counter_start(Some((v, s.expire_ms, s.kind)))
                }
            },
            None => counter_start(None),
        };
        Ok(Some((cur, expire_ms, stored)))
    })?;
    let Some((out, changed)) = counted else {
        return Ok(IncrMany::Cold);
    };
    let mut batch = core.warm.batch();
    let mut d = Counts::default();
    let mut staged = Vec::new();
    for (k, n, expire_ms, stored) in &changed {
        let change = Change::Put {
            kind: Kind::String,
            value: Bytes::from(n.to_string()),
            expire_ms: *expire_ms,
        };
        staged.extend(stage(core, k, stored.as_ref(), change, &mut batch, &mut d)?);
    }
    if staged.is_empty() {
        return Ok(IncrMany::Done(Written::new(out, Ticket::NONE)));
    }
    match commit_staged(core, staged, batch, &d, core.syncs_client_writes()) {
        Err(Error::WarmFull(_)) => Ok(IncrMany::Full),
        r => Ok(IncrMany::Done(Written::new(out, r?))),
    }
}

/// Keys deleted per batch by [`flush_db`].
const FLUSH_CHUNK_KEYS: usize = 1024;

/// Deletes every key of database `db`, through the delete path (counters, value-log
/// garbage, expiry entries), a chunk of keys per batch.
pub(crate) async fn flush_db(core: &Core, db: u8) -> Result<Written<()>> {
    core.check_writable()?;
    crate::settle::settle_all(core)?;
    let prefix = strata_format::keys::db_prefix(db);
    let mut ticket = Ticket::NONE;
    for family in [Family::Records, Family::Cold] {
        loop {
            let keys = first_keys(core, family, &prefix, FLUSH_CHUNK_KEYS)?;
            if keys.is_empty() {
                break;
            }
            let _held = core.locks.lock_many(keys.iter());
            let mut batch = core.warm.batch();
            let mut d = Counts::default();
            let mut staged = Vec::with_capacity(keys.len());
            for key in &keys {
                crate::settle::settle_locked(core, key)?;
                let old = core.lookup(key, Want::Entry)?;
                if let Some(s) = stage(core, key, old.as_ref(), Change::Delete, &mut batch, &mut d)?
                {
                    staged.push(s);
                }
            }
            ticket = commit_staged(core, staged, batch, &d, false)?;
        }
    }
    let mut b = core.warm.batch();
    for family in [Family::Parts, Family::Scores] {
        b.clear_prefix(family, &prefix);
    }
    core.warm.write(b, false)?;
    Ok(Written::new((), ticket))
}

/// Up to `n` stored keys of `family` that start with `prefix`.
fn first_keys(core: &Core, family: Family, prefix: &[u8], n: usize) -> Result<Vec<Key>> {
    let mut c = core
        .warm
        .cursor(family, strata_warm::Bounds::prefix(prefix), None);
    c.seek_to_first();
    let mut out = Vec::new();
    while c.valid() && out.len() < n {
        out.push(Key::from_stored(c.key())?);
        c.next();
    }
    c.status()?;
    Ok(out)
}

/// Deletes every key in every tier. Segments are collected by the background task.
pub(crate) fn flush_all(core: &Core) -> Result<Written<()>> {
    core.check_writable()?;
    let _all = core.locks.lock_all();
    writeback::flush_all_locked(core);
    let mut b = core.warm.batch();
    for f in [
        Family::Records,
        Family::Parts,
        Family::Scores,
        Family::Cold,
        Family::Expiry,
    ] {
        b.clear(f);
    }
    for (id, _) in core.warm.segments()? {
        b.delete_segment(id);
    }
    b.reset_counts();
    b.reset_key_counts();
    // Every logged value is garbage now: seal the newest file and let collection delete
    // them all.
    core.vlog.roll()?;
    let active = core.vlog.active_id();
    for (id, len) in core.vlog.files()?.into_iter().filter(|f| f.0 < active) {
        b.set_vlog_garbage(id, len);
    }
    core.warm.write(b, true)?;
    core.warm.clear_key_filter();
    core.sizes.set(Counts::default());
    core.hot.clear();
    core.locks.bump_all();
    core.flushed(None);
    core.background_wake.notify_one();
    // The flush is synced already; with a bucket log, its ticket waits for its round.
    let ticket = match core.bucket.is_some() {
        true => core.ticket(),
        false => Ticket::NONE,
    };
    Ok(Written::new((), ticket))
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
    let f = if allowed(core) {
        core.check_writable()?;
        let _g = core.locks.lock(key);
        let f = match change_held(core, key, kind, f)? {
            Ok(written) => return Ok(written),
            Err(f) => f,
        };
        match change_adopted(core, key, kind, &decode, f)? {
            Ok(written) => return Ok(written),
            Err(f) => f,
        }
    } else {
        f
    };
    // Boxed: the whole-value way's state is large; a write in place need not carry it.
    Box::pin(whole(core, key, kind, decode, f)).await
}

/// [`update_live`] of a key whose live value is held and has not expired (its stripe lock
/// held); `f` back if it has none.
fn change_held<R, F: FnOnce(&mut dyn LiveValue) -> Result<(bool, R)>>(
    core: &Core,
    key: &Key,
    kind: Kind,
    f: F,
) -> Result<std::result::Result<Written<R>, F>> {
    let live = &core.live;
    let mut slots = live.slots.lock();
    let Some(slot) = slots.get_mut(key.stored()) else {
        return Ok(Err(f));
    };
    let now = slot.now(core.clock.as_ref());
    if !strata_format::is_live(slot.expire_ms, now) {
        // Expired: the key is gone. `adoptable` folds it first (its expiry may be newer
        // than the stored form's: `expiry_locked`), and lets it go.
        return Ok(Err(f));
    }
    if slot.kind != kind {
        return Err(Error::WrongType);
    }
    slot.used_ms = now;
    let (changed, out) = f(slot.value.as_mut())?;
    if !changed {
        return Ok(Ok(Written::new(out, Ticket::NONE)));
    }
    if slot.value.is_empty() {
        drop(slots);
        live.remove(key.stored());
        return delete_locked(core, key).map(|t| Ok(Written::new(out, t)));
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
        // The change is made: a failed fold leaves it to the next one (whole), which
        // reports the failure to whoever waits for it.
        if let Err(e) = fold_locked(core, key, false) {
            tracing::warn!(error = %e, "a fold into parts failed; the next is whole");
        }
    }
    Ok(Ok(Written::new(out, changed_locked(core, key))))
}

/// [`update_live`] of a key with no live value: its value decoded, changed by `f` and kept
/// live (its stripe lock held); `f` back if it cannot be (cold, or no room for it).
fn change_adopted<R, F: FnOnce(&mut dyn LiveValue) -> Result<(bool, R)>>(
    core: &Core,
    key: &Key,
    kind: Kind,
    decode: &impl Fn(Option<&Bytes>) -> Result<Box<dyn LiveValue>>,
    f: F,
) -> Result<std::result::Result<Written<R>, F>> {
    let now = core.now_ms();
    let Some(current) = adoptable_parted(core, key, now, true)? else {
        return Ok(Err(f));
    };
    let (value, expire_ms, stored) = match current {
        Some((v, e, k, p)) if k == kind => (Some(v), e, p),
        Some(_) => return Err(Error::WrongType),
        None => (None, 0, StoredAs::default()),
    };
    let mut obj = decode(value.as_ref())?;
    let bytes = obj.bytes();
    if obj.stays() && bytes >= LARGE_BYTES_MIN && !admits(core, bytes) {
        // A large collection newly written past the budget: the whole-value way would cost
        // it milliseconds a command until the next fold lets one go, so the least recently
        // used go now (all of them for one live only alone).
        if alone(core, bytes) {
            make_room(core, Room::Beside(key), 0)?;
        } else if bytes <= shared_max(core) {
            make_room(core, Room::Beside(key), shared_max(core))?;
        }
    }
    if !(obj.stays() && admits(core, bytes)) {
        return Ok(Err(f));
    }
    let (changed, out) = f(obj.as_mut())?;
    if obj.is_empty() {
        return match changed {
            true => delete_locked(core, key).map(|t| Ok(Written::new(out, t))),
            false => Ok(Ok(Written::new(out, Ticket::NONE))),
        };
    }
    // Kept even when unchanged: the next write finds it decoded (a stream of `SADD`s of
    // members already there would decode the value every time).
    let slot = Slot::new(kind, expire_ms, obj, stored, now);
    core.live.hold(key, slot, changed);
    let ticket = match changed {
        true => changed_locked(core, key),
        false => Ticket::NONE,
    };
    Ok(Ok(Written::new(out, ticket)))
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

#[cfg(test)]
mod tests {
    use super::parse_i64;

    #[test]
    fn integers_parse_like_redis() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"-12"), Some(-12));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b"-9223372036854775809"[..],
            b"99999999999999999999",
            b"--1",
            b"1-",
            b"\xff1",
            &b""[..],
            b"-",
            b"+1",
            b"01",
            b"-0",
            b" 1",
            b"1 ",
            b"1.0",
            b"9223372036854775808",
            b"abc",
        ] {
            assert_eq!(parse_i64(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
