//! Committing writes: every mutation is a read-modify-write under the key's stripe lock,
//! committed as one batch of the warm store that also moves the persistent counters and
//! the expiry index. A write is staged ([`stage`]: one key's changes into a batch) and
//! committed ([`commit_staged`]: limit checks, value-log appends, one batch, DRAM); it
//! hands back the [`Ticket`] to wait for before anyone is told it happened. The commands'
//! writes (`write`), write-back's settling, folds and returns all end here.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use bytes::Bytes;
use strata_format::{
    entry_checksum, hash, zset, Key, Kind, WarmRecord, KEY_BYTES_MAX, VALUE_BYTES_MAX,
};

use crate::core::Core;
use crate::durability::Ticket;
use crate::stats::add;
use crate::warm::{warm_charge, Batch, Counts, Loc, Stored, Want};
use crate::{Error, Result};

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
    /// Whether the change deletes a key that was there.
    deletes: bool,
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
    let (change, fields_expire) = as_of(change, core.now_ms());
    let old_expire = old.map_or(0, |s| s.expire_ms);
    let mut staged = Staged {
        key,
        hot_value: None,
        kind: old.map_or(Kind::String, |s| s.kind),
        new_expire: 0,
        to_log: None,
        deletes: false,
    };
    match (&change, old.map(|s| &s.loc)) {
        (Change::SetExpire(_), None) => return Ok(None),
        (Change::SetExpire(e), Some(loc)) => {
            stage_expiry(core, key, staged.kind, *e, loc, batch, d)?;
            staged.new_expire = *e;
        }
        (Change::Parts { .. }, _) => {
            staged.new_expire = stage_parts(core, key, old, &change, batch, d)?;
        }
        (
            Change::Put {
                kind,
                value,
                expire_ms,
            },
            loc,
        ) => {
            stage_put(core, &mut staged, *kind, value, *expire_ms, batch, d)?;
            remove_old(batch, d, key, loc, false);
        }
        (Change::Delete, loc) => {
            staged.deletes = loc.is_some();
            remove_old(batch, d, key, loc, true)
        }
    }
    index_expiry(batch, &staged, &change, old_expire, fields_expire);
    Ok(Some(staged))
}

/// `change` as it stands at `now`: a value or expiry already past is a delete, and so is a
/// hash whose fields have all expired. Also when a hash's fields all expire, if they do.
fn as_of(change: Change, now: u64) -> (Change, Option<u64>) {
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
    (change, fields_expire)
}

/// Stages a new expiry `e` of `key`, stored at `loc` as a value of `kind`: the value stays
/// where it is.
fn stage_expiry(
    core: &Core,
    key: &Key,
    kind: Kind,
    e: u64,
    loc: &Loc,
    batch: &mut Batch,
    d: &mut Counts,
) -> Result<()> {
    match loc {
        Loc::Cold(r) => {
            let mut r = *r;
            r.expire_ms = e;
            batch.put_cold(key, &r);
        }
        Loc::Warm {
            parted: Some(at), ..
        } => {
            // The parts stay; the record's checksum covers the expiry.
            let seq = next_write_seq(core);
            batch.put_record(
                key,
                &WarmRecord::encode_parted(kind, key.client(), e, seq, *at),
            );
        }
        Loc::Warm {
            value,
            charge,
            logged,
            ..
        } => {
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
                    let crc = entry_checksum(kind, key.client(), e, value);
                    WarmRecord::encode_logged(kind, e, seq, crc, *at)
                }
                None => WarmRecord::encode(kind, key.client(), e, seq, value),
            };
            d.warm_bytes += warm_charge(key, value.len() as u64) as i64 - *charge as i64;
            batch.put_record(key, &rec);
        }
    }
    Ok(())
}

/// Stages a new value of `kind` for `staged`'s key: as parts when it is that large, in the
/// value log (once the write is allowed), or in its record.
fn stage_put(
    core: &Core,
    staged: &mut Staged<'_>,
    kind: Kind,
    value: &Bytes,
    expire_ms: u64,
    batch: &mut Batch,
    d: &mut Counts,
) -> Result<()> {
    let key = staged.key;
    let seq = next_write_seq(core);
    staged.kind = kind;
    if core.settings.warm.stores_parts(kind, value.len()) {
        stage_whole_parts(core, key, kind, value, expire_ms, seq, batch)?;
    } else if logs_value(core, value) {
        // Appended once the write is known to be allowed (in commit_staged).
        staged.to_log = Some((value.clone(), expire_ms, seq));
    } else {
        batch.put_record(
            key,
            &WarmRecord::encode(kind, key.client(), expire_ms, seq, value),
        );
    }
    d.warm_bytes += warm_charge(key, value.len() as u64) as i64;
    d.warm_entries += 1;
    batch.count_key(key.db(), 1);
    staged.new_expire = expire_ms;
    staged.hot_value = Some(value.clone());
    Ok(())
}

/// Stages `value` whole as parts at a new version `seq`: every item a part (a sorted set's
/// scores indexed too), and a record that names the version. The old version's parts (if
/// any) go with `remove_old`, all at once.
fn stage_whole_parts(
    core: &Core,
    key: &Key,
    kind: Kind,
    value: &Bytes,
    expire_ms: u64,
    seq: u64,
    batch: &mut Batch,
) -> Result<()> {
    let bad = |e| Error::Invalid(format!("a {} to store as parts: {e}", kind.name()));
    let current = strata_format::parts::in_current_encoding(kind, value).map_err(bad)?;
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
        &WarmRecord::encode_parted(kind, key.client(), expire_ms, seq, at),
    );
    Ok(())
}

/// Moves `staged`'s key in the expiry index from `old_expire` to its new expiry, and adds
/// the entry of a hash whose fields all expire (`fields_expire`).
fn index_expiry(
    batch: &mut Batch,
    staged: &Staged<'_>,
    change: &Change,
    old_expire: u64,
    fields_expire: Option<u64>,
) {
    let (key, new_expire) = (staged.key, staged.new_expire);
    if old_expire != new_expire {
        // A hash's own expiry changing: its fields' entry may be the same entry (the same
        // millisecond), so the old one stays, and the sweep drops it as stale.
        let stays_hash = matches!(change, Change::SetExpire(_)) && staged.kind == Kind::Hash;
        if old_expire != 0 && !stays_hash {
            batch.remove_expiry(old_expire, key);
        }
        if new_expire != 0 {
            batch.add_expiry(new_expire, key);
        }
    }
    if let (Some(at), Change::Put { .. }) = (fields_expire, change) {
        // After any removal above: the entry may be the old expiry's.
        batch.add_expiry(at, key);
    }
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
    for s in &staged {
        core.changed(s.key);
    }
    let committing = core.locks.begin_commit(staged.iter().map(|s| s.key));
    let committed = commit_batch(core, batch, d, sync);
    drop(committing);
    if let Err(e) = committed {
        count_unreferenced(core, &appended);
        return Err(e);
    }
    if let Some(w) = core.tier_watch.get() {
        for s in staged.iter().filter(|s| s.deletes) {
            w.note(s.key, crate::tierwatch::Move::Deleted);
        }
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
pub(crate) fn start_demotion_if_over(core: &Core) {
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
pub(crate) fn same_state(a: Option<&Stored>, b: Option<&Stored>) -> bool {
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
