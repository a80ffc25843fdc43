//! Writes: every mutation is a read-modify-write under the key's stripe lock, committed as
//! one batch of the warm store that also moves the persistent counters and the expiry
//! index. A write is staged ([`stage`]: one key's changes into a batch) and committed
//! ([`commit_staged`]: limit checks, value-log appends, one batch, DRAM); it hands back the
//! [`Ticket`] to wait for before anyone is told it happened.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use bytes::Bytes;
use strata_format::{
    entry_checksum, hash, zset, Key, Kind, WarmRecord, KEY_BYTES_MAX, VALUE_BYTES_MAX,
};
use strata_warm::Family;

use crate::core::Core;
use crate::durability::{Ticket, Written};
use crate::stats::add;
use crate::warm::{warm_charge, Batch, Counts, Loc, Stored, Want};
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

/// What an update does to its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Put {
        kind: Kind,
        value: Bytes,
        expire_ms: u64,
    },
    Delete,
    /// New absolute expiry (0 removes it); the value stays where it is.
    SetExpire(u64),
    /// Changes to a value stored as parts ([`strata_format::parts`]; its record must say
    /// so): a [`strata_format::delta`] of its kind, and how many items and about how many
    /// bytes the value holds after it. Only the items the delta names are written.
    Parts {
        delta: Bytes,
        count: u64,
        bytes: u64,
        expire_ms: u64,
    },
}

/// One key's write, staged into a batch by [`stage`] and finished once the batch is
/// committed.
pub(crate) struct Staged<'k> {
    key: &'k Key,
    /// The new value, for DRAM; `None` when the key is deleted or only its expiry changed
    /// (DRAM drops it).
    hot_value: Option<Bytes>,
    kind: Kind,
    new_expire: u64,
    /// A value bound for the value log: value, expiry, write sequence.
    to_log: Option<(Bytes, u64, u64)>,
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

/// Refuses keys and values past the format's limits.
pub(crate) fn check_sizes(key: &Key, value: Option<&[u8]>) -> Result<()> {
    if key.client().len() > KEY_BYTES_MAX {
        return Err(Error::Invalid(format!(
            "key of {} bytes exceeds the limit of {KEY_BYTES_MAX}",
            key.client().len()
        )));
    }
    if let Some(v) = value {
        if v.len() > VALUE_BYTES_MAX {
            return Err(Error::Invalid(format!(
                "value of {} bytes exceeds the limit of {VALUE_BYTES_MAX}",
                v.len()
            )));
        }
    }
    Ok(())
}

/// Applies `change` to `key`, whose stored state is `old`; the caller holds the stripe
/// lock. `sync`: whether the write is made durable before it returns (what `durability =
/// sync` asks of a client's write; a copy the engine makes for itself, such as a value
/// returned to the warm tier, need not be). Returns the ticket to wait for.
pub(crate) fn apply_locked(
    core: &Core,
    key: &Key,
    old: Option<&Stored>,
    change: Change,
    sync: bool,
) -> Result<Ticket> {
    core.check_writable()?;
    let mut batch = core.warm.batch();
    let mut d = Counts::default();
    match stage(core, key, old, change, &mut batch, &mut d)? {
        Some(staged) => commit_staged(core, vec![staged], batch, &d, sync),
        None => Ok(Ticket::NONE),
    }
}

/// Adds what `change` does to `key` (whose stored state is `old`) to `batch` and `d`;
/// `None` when it does nothing. The caller holds the key's stripe lock; nothing is written
/// until [`commit_staged`].
pub(crate) fn stage<'k>(
    core: &Core,
    key: &'k Key,
    old: Option<&Stored>,
    change: Change,
    batch: &mut Batch,
    d: &mut Counts,
) -> Result<Option<Staged<'k>>> {
    let now = core.now_ms();
    // A hash's fields may expire on their own: one whose fields have all expired is
    // deleted, and the sweep is told when the last field of one whose fields all expire
    // does (every change of a hash's fields is a `Put`, which tells it again).
    let fields_expire = match &change {
        Change::Put {
            kind: Kind::Hash,
            value,
            ..
        } => hash::all_fields_expire_ms(value).ok().flatten(),
        _ => None,
    };
    let fields_gone = fields_expire.is_some_and(|t| !strata_format::is_live(t, now));
    let change = match change {
        Change::Put { expire_ms, .. } | Change::SetExpire(expire_ms)
            if !strata_format::is_live(expire_ms, now) =>
        {
            Change::Delete
        }
        Change::Put { .. } if fields_gone => Change::Delete,
        c => c,
    };
    let old_expire = old.map_or(0, |s| s.expire_ms);
    let mut kind = old.map_or(Kind::String, |s| s.kind);
    let mut new_expire = 0;
    let mut hot_value = None;
    let mut to_log = None;
    match (&change, old.map(|s| &s.loc)) {
        (Change::SetExpire(e), Some(Loc::Cold(r))) => {
            let mut r = *r;
            r.expire_ms = *e;
            batch.put_cold(key, &r);
            new_expire = *e;
        }
        (
            Change::SetExpire(e),
            Some(Loc::Warm {
                parted: Some(at), ..
            }),
        ) => {
            // The parts stay; the record's checksum covers the expiry.
            let seq = next_write_seq(core);
            batch.put_record(
                key,
                &WarmRecord::encode_parted(kind, key.client(), *e, seq, *at),
            );
            new_expire = *e;
        }
        (
            Change::SetExpire(e),
            Some(Loc::Warm {
                value,
                charge,
                logged,
                ..
            }),
        ) => {
            let loaded;
            let value = match value {
                Some(v) => v,
                None => {
                    loaded = core.lookup(key, Want::Value)?.and_then(|s| match s.loc {
                        Loc::Warm { value, .. } => value,
                        Loc::Cold(_) => None,
                    });
                    loaded.as_ref().ok_or_else(|| {
                        Error::Internal("warm record vanished under its lock".into())
                    })?
                }
            };
            let seq = next_write_seq(core);
            let rec = match logged {
                // The value stays where it is; only the checksum (which covers the expiry)
                // changes.
                Some(at) => {
                    let crc = entry_checksum(kind, key.client(), *e, value);
                    WarmRecord::encode_logged(kind, *e, seq, crc, *at)
                }
                None => WarmRecord::encode(kind, key.client(), *e, seq, value),
            };
            d.warm_bytes += warm_charge(key, value.len() as u64) as i64 - *charge as i64;
            batch.put_record(key, &rec);
            new_expire = *e;
        }
        (Change::SetExpire(_), None) => return Ok(None),
        (Change::Parts { .. }, _) => {
            new_expire = stage_parts(core, key, old, &change, batch, d)?;
        }
        (
            Change::Put {
                kind: new_kind,
                value,
                expire_ms,
            },
            loc,
        ) => {
            let seq = next_write_seq(core);
            kind = *new_kind;
            if core.settings.warm.stores_parts(kind, value.len()) {
                // A new version: the old one's parts (if any) go below, all at once.
                let bad = |e| Error::Invalid(format!("a {} to store as parts: {e}", kind.name()));
                let current =
                    strata_format::parts::in_current_encoding(kind, value).map_err(bad)?;
                let items = strata_format::parts::items(kind, &current).map_err(bad)?;
                if kind == Kind::ZSet {
                    for (_, item) in &items {
                        let (score, member) = zset::decode_entry(item).map_err(bad)?;
                        batch.put_score(key, seq, score, member);
                    }
                }
                let count = items.len() as u64;
                put_parts(batch, key, seq, kind, items);
                core.counters.parts_written.fetch_add(count, Relaxed);
                let at = strata_format::Parted {
                    version: seq,
                    count,
                    bytes: value.len() as u64,
                    head: match kind {
                        Kind::List => strata_format::parts::LIST_HEAD,
                        _ => 0,
                    },
                };
                batch.put_record(
                    key,
                    &WarmRecord::encode_parted(kind, key.client(), *expire_ms, seq, at),
                );
            } else if logs_value(core, value) {
                // Appended once the write is known to be allowed (in commit_staged).
                to_log = Some((value.clone(), *expire_ms, seq));
            } else {
                batch.put_record(
                    key,
                    &WarmRecord::encode(kind, key.client(), *expire_ms, seq, value),
                );
            }
            d.warm_bytes += warm_charge(key, value.len() as u64) as i64;
            d.warm_entries += 1;
            batch.count_key(key.db(), 1);
            new_expire = *expire_ms;
            hot_value = Some(value.clone());
            remove_old(batch, d, key, loc, false);
        }
        (Change::Delete, loc) => remove_old(batch, d, key, loc, true),
    }
    if old_expire != new_expire {
        // A hash's own expiry changing: its fields' entry may be the same entry (the same
        // millisecond), so the old one stays, and the sweep drops it as stale.
        let stays_hash = matches!(change, Change::SetExpire(_)) && kind == Kind::Hash;
        if old_expire != 0 && !stays_hash {
            batch.remove_expiry(old_expire, key);
        }
        if new_expire != 0 {
            batch.add_expiry(new_expire, key);
        }
    }
    if let (Some(at), Change::Put { .. }) = (fields_expire, &change) {
        // After any removal above: the entry may be the old expiry's.
        batch.add_expiry(at, key);
    }
    Ok(Some(Staged {
        key,
        hot_value,
        kind,
        new_expire,
        to_log,
    }))
}

/// Puts the parts of a value of `kind` at `version` whose items are `items` (in the
/// value's order, each with its name): a list's element by its position from
/// [`strata_format::parts::LIST_HEAD`] on, any other's item by its name; in key order,
/// which RocksDB's memtable inserts one after another cheaply.
fn put_parts(
    batch: &mut Batch,
    key: &Key,
    version: u64,
    kind: Kind,
    mut items: Vec<(&[u8], &[u8])>,
) {
    if kind == Kind::List {
        for (p, (_, item)) in (strata_format::parts::LIST_HEAD..).zip(&items) {
            batch.put_part(key, version, &strata_format::parts::list_position(p), item);
        }
        return;
    }
    items.sort_unstable_by(|a, b| a.0.cmp(b.0));
    for (name, item) in &items {
        batch.put_part(key, version, name, item);
    }
}

/// [`stage_parts`] of a list: its delta's operations as the positions they change
/// ([`strata_format::parts::list_changes`], reading the elements an insert or a removal
/// moves). Returns how many parts it wrote and the list's head after them.
fn stage_list_parts(
    core: &Core,
    key: &Key,
    at: strata_format::Parted,
    delta: &[u8],
    count: u64,
    batch: &mut Batch,
) -> Result<(usize, u64)> {
    let bad = |e: strata_format::FormatError| Error::Data(format!("{key:?}: its list parts: {e}"));
    let ops = strata_format::delta::list_ops(delta)
        .map_err(|e| Error::Internal(format!("a delta of parts: {e}")))?;
    // A read that failed (not a part that is missing or damaged) is the error returned.
    let mut failed = None;
    let changes = strata_format::parts::list_changes(at.head, at.count, &ops, |p| {
        let name = strata_format::parts::list_position(p);
        let missing = |detail| strata_format::FormatError::Bad {
            what: "list parts",
            detail,
        };
        match core.warm.named_parts(key, at.version, &[name]) {
            Ok((1, item)) => Ok(item),
            Ok(_) => Err(missing(format!("no element at position {p}"))),
            Err(Error::Data(d)) => Err(missing(d)),
            Err(e) => {
                let detail = e.to_string();
                failed = Some(e);
                Err(missing(detail))
            }
        }
    });
    let changes = match (changes, failed) {
        (Err(_), Some(e)) => return Err(e),
        (changes, _) => changes.map_err(bad)?,
    };
    if changes.len != count {
        return Err(Error::Internal(format!(
            "{key:?}: a list delta leaves {} elements, its value {count}",
            changes.len
        )));
    }
    core.counters
        .parts_read
        .fetch_add(changes.read as u64, Relaxed);
    let written = changes.parts.len();
    for (p, item) in changes.parts {
        let name = strata_format::parts::list_position(p);
        match item {
            Some(item) => batch.put_part(key, at.version, &name, &item),
            None => batch.delete_part(key, at.version, &name),
        }
    }
    Ok((written, changes.head))
}

/// The score-index changes of a sorted set's parts `ops` (removals `None`, puts): the old
/// entry of every member named goes (its score read from its part as stored), the new one
/// of every member put comes.
fn stage_scores(
    core: &Core,
    key: &Key,
    version: u64,
    ops: &[(&[u8], Option<&[u8]>)],
    batch: &mut Batch,
) -> Result<()> {
    let bad = |e: strata_format::FormatError| Error::Data(format!("{key:?}: a part: {e}"));
    let names: Vec<&[u8]> = ops.iter().map(|(n, _)| *n).collect();
    let (found, old) = core.warm.named_parts(key, version, &names)?;
    let mut at = 0;
    for _ in 0..found {
        let ((score, member), len) = zset::entry_at(&old[at..]).map_err(bad)?;
        batch.delete_score(key, version, score, member);
        at += len;
    }
    for (_, item) in ops {
        if let Some(item) = item {
            let (score, member) = zset::decode_entry(item).map_err(bad)?;
            batch.put_score(key, version, score, member);
        }
    }
    Ok(())
}

/// [`stage`] of a [`Change::Parts`]: the delta's removals and puts as parts of the value's
/// version, and its record with the new count. Returns the new expiry.
fn stage_parts(
    core: &Core,
    key: &Key,
    old: Option<&Stored>,
    change: &Change,
    batch: &mut Batch,
    d: &mut Counts,
) -> Result<u64> {
    let (
        Change::Parts {
            delta,
            count,
            bytes,
            expire_ms,
        },
        Some(Stored {
            loc:
                Loc::Warm {
                    parted: Some(at),
                    charge,
                    ..
                },
            kind,
            ..
        }),
    ) = (change, old)
    else {
        return Err(Error::Internal(format!(
            "{key:?}: a change to parts of a value not stored as parts"
        )));
    };
    let (written, head) = match kind {
        Kind::List => stage_list_parts(core, key, *at, delta, *count, batch)?,
        _ => (stage_named_parts(core, key, *at, *kind, delta, batch)?, 0),
    };
    core.counters
        .parts_written
        .fetch_add(written as u64, Relaxed);
    let now = strata_format::Parted {
        version: at.version,
        count: *count,
        bytes: *bytes,
        head,
    };
    let seq = next_write_seq(core);
    batch.put_record(
        key,
        &WarmRecord::encode_parted(*kind, key.client(), *expire_ms, seq, now),
    );
    d.warm_bytes += warm_charge(key, *bytes) as i64 - *charge as i64;
    Ok(*expire_ms)
}

/// [`stage_parts`] of a hash, a set or a sorted set: the delta's removals and puts by
/// name. Returns how many parts it wrote.
fn stage_named_parts(
    core: &Core,
    key: &Key,
    at: strata_format::Parted,
    kind: Kind,
    delta: &[u8],
    batch: &mut Batch,
) -> Result<usize> {
    let bad = |e: strata_format::FormatError| Error::Internal(format!("a delta of parts: {e}"));
    let (puts, removed) = strata_format::delta::decode_delta(delta).map_err(bad)?;
    // Removals (`None`) before puts of the same name, all in key order: RocksDB's
    // memtable inserts one after another cheaply.
    let mut ops: Vec<(&[u8], Option<&[u8]>)> = removed.iter().map(|n| (*n, None)).collect();
    let puts = strata_format::parts::items(kind, puts).map_err(bad)?;
    ops.extend(puts.iter().map(|(n, item)| (*n, Some(*item))));
    ops.sort_by(|a, b| a.0.cmp(b.0));
    if kind == Kind::ZSet {
        stage_scores(core, key, at.version, &ops, batch)?;
    }
    // A field with an expiry of its own: the sweep is told (the stage of a whole hash
    // tells it of the last; here, of the first, and it moves the entry on).
    let mut first_expiry = u64::MAX;
    for (name, item) in &ops {
        let Some(item) = item else {
            batch.delete_part(key, at.version, name);
            continue;
        };
        batch.put_part(key, at.version, name, item);
        if kind == Kind::Hash {
            if let Ok((f, _)) = hash::field_at(item) {
                if f.expire_ms != 0 {
                    first_expiry = first_expiry.min(f.expire_ms);
                }
            }
        }
    }
    if first_expiry != u64::MAX {
        batch.add_expiry(first_expiry, key);
    }
    Ok(ops.len())
}

fn next_write_seq(core: &Core) -> u64 {
    core.write_seq
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Commits `batch`, holding the staged writes of `staged` (their keys' stripe locks held):
/// refused as a whole past the warm tier's hard limit or the disk's reserve; otherwise
/// values bound for the value log are appended, the batch is written, and DRAM follows.
pub(crate) fn commit_staged(
    core: &Core,
    staged: Vec<Staged<'_>>,
    batch: Batch,
    d: &Counts,
    sync: bool,
) -> Result<Ticket> {
    commit(core, staged, batch, d, sync, false)
}

/// [`commit_staged`] of writes already acknowledged (write-back's dirty values reaching the
/// warm store): not held to the hard limit, not synced here, and DRAM keeps what it has.
pub(crate) fn commit_acknowledged(
    core: &Core,
    staged: Vec<Staged<'_>>,
    batch: Batch,
    d: &Counts,
) -> Result<()> {
    commit(core, staged, batch, d, false, true).map(|_| ())
}

fn commit(
    core: &Core,
    mut staged: Vec<Staged<'_>>,
    mut batch: Batch,
    d: &Counts,
    sync: bool,
    acknowledged: bool,
) -> Result<Ticket> {
    if d.warm_bytes > 0 && acknowledged {
        core.disk.claim(d.warm_bytes as u64)?;
    } else if d.warm_bytes > 0 {
        // What write-back holds is bound for the warm tier too.
        let warm = core.sizes.warm_bytes() + core.writeback.dirty_bytes();
        if warm + d.warm_bytes as u64 > core.settings.warm.warm_hard_limit() {
            return Err(Error::WarmFull(String::new()));
        }
        core.disk.claim(d.warm_bytes as u64)?;
    }
    let mut appended = Vec::new();
    for s in staged.iter_mut() {
        let Some((value, expire_ms, seq)) = s.to_log.as_ref() else {
            continue;
        };
        let (key, kind) = (s.key, s.kind);
        let at = match core.vlog.append(key, value) {
            Ok(at) => at,
            Err(e) => {
                count_unreferenced(core, &appended);
                return Err(e);
            }
        };
        let crc = entry_checksum(kind, key.client(), *expire_ms, value);
        let record = WarmRecord::encode_logged(kind, *expire_ms, *seq, crc, at);
        batch.put_record(key, &record);
        appended.push((key, at));
        // DRAM holds the log's mapped bytes, not the request's buffer: the buffer is freed
        // with the request, and the next large argument is read into memory the allocator
        // already has, instead of pages the kernel must find and zero.
        if let (Some(v), Ok(mapped)) = (s.hot_value.as_mut(), core.vlog.read(at)) {
            *v = mapped;
        }
    }
    if sync && !appended.is_empty() {
        if let Err(e) = core.vlog.sync() {
            count_unreferenced(core, &appended);
            return Err(e);
        }
    }
    // Odd while the batch is written: a lookup that read the records before the commit and
    // the cold index after (an index entry moved into a record) sees the version move, or
    // saw it odd (`Core::lookup`).
    let committing = core.locks.begin_commit(staged.iter().map(|s| s.key));
    let committed = commit_batch(core, batch, d, sync);
    drop(committing);
    if let Err(e) = committed {
        count_unreferenced(core, &appended);
        return Err(e);
    }
    // Writes already acknowledged (write-back's values settling) are in DRAM already.
    for s in staged.into_iter().filter(|_| !acknowledged) {
        add(&core.counters.writes);
        match s.hot_value {
            Some(v) => {
                core.hot
                    .insert_tagged(s.key.stored(), v, s.new_expire, s.kind as u8);
            }
            None => core.hot.remove(s.key.stored()),
        }
    }
    Ok(core.ticket())
}

/// After a client's write: one that took the warm tier past its budget starts demotion now,
/// not on the background task's next tick. (Copies the engine makes for itself, such as
/// values read back from the object store, do not: they stop at their own ceiling, and
/// demoting while reads bring values back would fight them.)
fn start_demotion_if_over(core: &Core) {
    if core.sizes.warm_bytes() > core.settings.warm.warm_bytes_max {
        core.background_wake.notify_one();
    }
}

/// Waits (holding no lock) until the warm tier has room for `need` more bytes under its
/// hard limit, waking demotion, for at most `write_stall_ms_max` since `since`; then fails
/// with what kept demotion from making room. Writes slow down before they are refused.
pub(crate) async fn wait_for_room(core: &Core, need: u64, since: Instant) -> Result<()> {
    let hard = core.settings.warm.warm_hard_limit();
    let stall = Duration::from_millis(core.settings.warm.write_stall_ms_max);
    let mut counted = false;
    loop {
        let warm = core.sizes.warm_bytes() + core.writeback.dirty_bytes();
        if warm.saturating_add(need) <= hard {
            return Ok(());
        }
        let left = stall.saturating_sub(since.elapsed());
        if left.is_zero() {
            add(&core.counters.writes_refused_full);
            let why =
                core.background_error.lock().clone().unwrap_or_else(|| {
                    "demotion to the object store is behind the writes".to_string()
                });
            return Err(Error::WarmFull(format!(
                "command not allowed: the warm tier holds {warm} bytes, at its hard limit of {hard}, and demotion made no room in {} ms: {why}; deletes work, writes resume as it drains",
                stall.as_millis()
            )));
        }
        if !counted {
            add(&core.counters.writes_stalled);
            counted = true;
        }
        core.background_wake.notify_one();
        let room = core.room.notified();
        let _ = tokio::time::timeout(left.min(STALL_POLL), room).await;
    }
}

/// How often a write waiting for room looks again, if no demotion says so first.
const STALL_POLL: Duration = Duration::from_millis(10);

/// Whether `a` and `b` are the same stored state of a key: a change computed from one
/// applies to the other unchanged.
fn same_state(a: Option<&Stored>, b: Option<&Stored>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            a.expire_ms == b.expire_ms
                && a.value_len == b.value_len
                && match (&a.loc, &b.loc) {
                    (Loc::Warm { checksum: x, .. }, Loc::Warm { checksum: y, .. }) => x == y,
                    (Loc::Cold(x), Loc::Cold(y)) => x == y,
                    _ => false,
                }
        }
        _ => false,
    }
}

/// Counts value-log entries that no record points at (their write failed) as garbage, if
/// the count itself can be written.
fn count_unreferenced(core: &Core, appended: &[(&Key, strata_format::ValuePointer)]) {
    if appended.is_empty() {
        return;
    }
    let mut b = core.warm.batch();
    for &(key, at) in appended {
        b.add_vlog_garbage(key, at);
    }
    let _ = core.warm.write(b, false);
}

/// Whether `value` goes to the value log rather than into its record.
fn logs_value(core: &Core, value: &[u8]) -> bool {
    let min = core.settings.vlog.vlog_value_bytes_min;
    min > 0 && value.len() as u64 >= min
}

fn remove_old(batch: &mut Batch, d: &mut Counts, key: &Key, old: Option<&Loc>, delete_warm: bool) {
    match old {
        Some(Loc::Warm {
            charge,
            logged,
            parted,
            ..
        }) => {
            d.warm_bytes -= *charge as i64;
            d.warm_entries -= 1;
            batch.count_key(key.db(), -1);
            if let Some(at) = logged {
                batch.add_vlog_garbage(key, *at);
            }
            if let Some(at) = parted {
                batch.clear_parts(key, at.version);
            }
            if delete_warm {
                batch.delete_record(key);
            }
        }
        Some(Loc::Cold(r)) => {
            d.cold_bytes -= r.value_len as i64;
            d.cold_entries -= 1;
            batch.count_key(key.db(), -1);
            batch.delete_cold(key);
        }
        None => {}
    }
}

/// Writes `batch` with the counter movements of `d`, then moves the in-memory sizes.
pub(crate) fn commit_batch(core: &Core, mut batch: Batch, d: &Counts, sync: bool) -> Result<()> {
    batch.add_counts(d);
    core.warm.write(batch, sync)?;
    core.sizes.add(d);
    Ok(())
}

/// Deletes `key` if it is stored and expired at `expire_ms` (the expiry sweep's step), or
/// for an entry a hash's field left (`stage`), the hash's expired fields.
pub(crate) async fn expire_if_due(core: &Core, key: &Key, expire_ms: u64) -> Result<bool> {
    let fields = {
        let _g = core.locks.lock(key);
        writeback::settle_locked(core, key)?;
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
        writeback::settle_locked(core, key)?;
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
            writeback::settle_locked(core, key)?;
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

/// Stores every pair, expiring at `expire_ms`, in one batch (see [`crate::Engine::put_many`]).
pub(crate) async fn put_many(
    core: &Core,
    pairs: &[(&Key, Bytes)],
    expire_ms: u64,
) -> Result<Written<()>> {
    for (k, v) in pairs {
        check_sizes(k, Some(v))?;
    }
    let refs: Vec<(&Key, &[u8])> = pairs.iter().map(|(k, v)| (*k, &v[..])).collect();
    if writeback::takes(core, &refs, expire_ms) {
        core.check_writable()?;
        let _locks = core.locks.lock_many(pairs.iter().map(|(k, _)| *k));
        writeback::look_ahead(core, pairs.iter().map(|(k, _)| *k));
        for (k, v) in pairs {
            writeback::put_locked(core, k, Kind::String, v, expire_ms);
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
        writeback::settle_many_locked(core, &keys)?;
        let olds = core.lookup_many(&keys)?;
        for (i, ((k, v), old)) in pairs.iter().zip(olds).enumerate() {
            if last[k] != i {
                continue;
            }
            let change = Change::Put {
                kind: Kind::String,
                value: v.clone(),
                expire_ms,
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
    if let Some(known) = writeback::current_seen_locked(core, key, now, counter_start)? {
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
    crate::live::fold_locked(core, key, true)?;
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
        writeback::settle_locked(core, k)?;
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
    writeback::settle_all(core)?;
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
                writeback::settle_locked(core, key)?;
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
    core.background_wake.notify_one();
    Ok(Written::new((), Ticket::NONE))
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
