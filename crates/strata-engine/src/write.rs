//! Writes: every mutation is a read-modify-write under the key's stripe lock, committed as
//! one RocksDB write batch that also moves the persistent counters and the TTL index.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use rocksdb::WriteBatch;
use strata_format::{entry_checksum, WarmRecord};

use crate::engine::{warm_charge, Inner, Loc, Stored};
use crate::stats::add;
use crate::warm::{self, ttl_key, CF_DATA, CF_INDEX, CF_META, CF_TTL};
use crate::{Durability, Engine, Error, Result};

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

/// A live entry as an [`Engine::update`] closure sees it.
#[derive(Debug)]
pub struct Existing<'a> {
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
        value: Bytes,
        expire_ms: u64,
    },
    Delete,
    /// New absolute expiry (0 removes it); the value stays where it is.
    SetExpire(u64),
}

/// Counter movements of one batch.
#[derive(Default)]
struct Deltas {
    warm_bytes: i64,
    warm_entries: i64,
    cold_bytes: i64,
    cold_entries: i64,
}

/// One key's write, staged into a batch by [`Inner::stage`] and finished once the batch
/// is committed.
struct Staged<'k> {
    key: &'k [u8],
    /// The new value, for DRAM; `None` when the key is deleted or only its expiry changed
    /// (DRAM drops it).
    hot_value: Option<Bytes>,
    new_expire: u64,
    /// A value bound for the value log: value, expiry, write sequence.
    to_log: Option<(Bytes, u64, u64)>,
}

/// Strict Redis integer parsing: optional '-', no '+', no leading zeros, no spaces.
pub fn parse_i64(b: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(b).ok()?;
    let digits = s.strip_prefix('-').unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    if digits.len() > 1 && digits.starts_with('0') || s == "-0" {
        return None;
    }
    s.parse().ok()
}

impl Inner {
    fn check_sizes(&self, key: &[u8], value: Option<&[u8]>) -> Result<()> {
        if key.len() > self.opts.key_bytes_max {
            return Err(Error::Invalid(format!(
                "key of {} bytes exceeds key_bytes_max ({})",
                key.len(),
                self.opts.key_bytes_max
            )));
        }
        if let Some(v) = value {
            if v.len() > self.opts.value_bytes_max {
                return Err(Error::Invalid(format!(
                    "value of {} bytes exceeds value_bytes_max ({})",
                    v.len(),
                    self.opts.value_bytes_max
                )));
            }
        }
        Ok(())
    }

    /// Applies `change` to `key`, whose stored state is `old`. The caller holds the stripe
    /// lock. Returns a group-commit ticket to wait for, if any.
    pub(crate) fn apply_locked(
        &self,
        key: &[u8],
        old: Option<&Stored>,
        change: Change,
    ) -> Result<Option<u64>> {
        self.apply_locked_with(key, old, change, self.syncs_client_writes())
    }

    /// Whether a client's write is synced before it returns (`durability = sync`).
    fn syncs_client_writes(&self) -> bool {
        self.opts.durability == Durability::Sync
    }

    /// As [`Inner::apply_locked`]; `sync`: whether the write is made durable before it
    /// returns (what `durability = sync` asks of a client's write; a copy the engine makes
    /// for itself, such as a value returned to the warm tier, need not be).
    pub(crate) fn apply_locked_with(
        &self,
        key: &[u8],
        old: Option<&Stored>,
        change: Change,
        sync: bool,
    ) -> Result<Option<u64>> {
        self.check_writable()?;
        let mut batch = WriteBatch::default();
        let mut d = Deltas::default();
        match self.stage(key, old, change, &mut batch, &mut d)? {
            Some(staged) => self.commit_staged(vec![staged], batch, &d, sync),
            None => Ok(None),
        }
    }

    /// Adds what `change` does to `key` (whose stored state is `old`) to `batch` and `d`;
    /// `None` when it does nothing. The caller holds the key's stripe lock; nothing is
    /// written until [`Inner::commit_staged`].
    fn stage<'k>(
        &self,
        key: &'k [u8],
        old: Option<&Stored>,
        change: Change,
        batch: &mut WriteBatch,
        d: &mut Deltas,
    ) -> Result<Option<Staged<'k>>> {
        let now = self.now_ms();
        let change = match change {
            Change::Put { expire_ms, .. } | Change::SetExpire(expire_ms)
                if expire_ms != 0 && expire_ms <= now =>
            {
                Change::Delete
            }
            c => c,
        };
        let w = &self.warm;
        let old_expire = old.map_or(0, |s| s.expire_ms);
        let mut new_expire = 0;
        let mut hot_value = None;
        let mut to_log = None;
        match (&change, old.map(|s| &s.loc)) {
            (Change::SetExpire(e), Some(Loc::Cold(r))) => {
                let mut r = *r;
                r.expire_ms = *e;
                batch.put_cf(w.cf(CF_INDEX), key, r.encode());
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
                        loaded = self.read_stored(key, true)?.and_then(|s| match s.loc {
                            Loc::Warm { value, .. } => value,
                            Loc::Cold(_) => None,
                        });
                        loaded.as_ref().ok_or_else(|| {
                            Error::Internal("warm record vanished under its lock".into())
                        })?
                    }
                };
                let seq = self.write_seq.fetch_add(1, Ordering::Relaxed);
                let rec = match logged {
                    // The value stays where it is; only the checksum (which covers the
                    // expiry) changes.
                    Some(at) => {
                        let crc = entry_checksum(key, *e, value);
                        WarmRecord::encode_logged(*e, seq, crc, *at)
                    }
                    None => WarmRecord::encode(key, *e, seq, value),
                };
                d.warm_bytes += warm_charge(key, value.len() as u64) as i64 - *charge as i64;
                batch.put_cf(w.cf(CF_DATA), key, rec);
                new_expire = *e;
            }
            (Change::SetExpire(_), None) => return Ok(None),
            (Change::Put { value, expire_ms }, loc) => {
                let seq = self.write_seq.fetch_add(1, Ordering::Relaxed);
                if self.logs_value(value) {
                    // Appended once the write is known to be allowed (in commit_staged).
                    to_log = Some((value.clone(), *expire_ms, seq));
                } else {
                    let rec = WarmRecord::encode(key, *expire_ms, seq, value);
                    batch.put_cf(w.cf(CF_DATA), key, rec);
                }
                d.warm_bytes += warm_charge(key, value.len() as u64) as i64;
                d.warm_entries += 1;
                new_expire = *expire_ms;
                hot_value = Some(value.clone());
                self.remove_old(batch, d, key, loc, false);
            }
            (Change::Delete, loc) => self.remove_old(batch, d, key, loc, true),
        }
        if old_expire != new_expire {
            if old_expire != 0 {
                batch.delete_cf(w.cf(CF_TTL), ttl_key(old_expire, key));
            }
            if new_expire != 0 {
                batch.put_cf(w.cf(CF_TTL), ttl_key(new_expire, key), b"");
            }
        }
        Ok(Some(Staged {
            key,
            hot_value,
            new_expire,
            to_log,
        }))
    }

    /// Commits `batch`, holding the staged writes of `staged` (their keys' stripe locks
    /// held): refused as a whole past the warm tier's hard limit or the disk's reserve;
    /// otherwise values bound for the value log are appended, the batch is written, and
    /// DRAM follows. Returns a group-commit ticket to wait for, if any.
    fn commit_staged(
        &self,
        staged: Vec<Staged<'_>>,
        mut batch: WriteBatch,
        d: &Deltas,
        sync: bool,
    ) -> Result<Option<u64>> {
        if d.warm_bytes > 0 {
            let warm = self.counters.warm_bytes.load(Ordering::Relaxed).max(0) as u64;
            let hard = self.opts.warm_hard_limit();
            if warm + d.warm_bytes as u64 > hard {
                add(&self.counters.writes_refused_full);
                return Err(Error::WarmFull(format!(
                    "command not allowed: the warm tier holds {warm} bytes, at its hard limit of {hard} (demotion to the object store is behind or failing); deletes work, writes resume as it drains"
                )));
            }
            self.disk.claim(d.warm_bytes as u64)?;
        }
        let mut appended = Vec::new();
        let logged = staged
            .iter()
            .filter_map(|s| Some((s.key, s.to_log.as_ref()?)));
        for (key, (value, expire_ms, seq)) in logged {
            let at = match self.vlog.append(key, value) {
                Ok(at) => at,
                Err(e) => {
                    self.count_unreferenced(&appended);
                    return Err(e);
                }
            };
            let crc = entry_checksum(key, *expire_ms, value);
            batch.put_cf(
                self.warm.cf(CF_DATA),
                key,
                WarmRecord::encode_logged(*expire_ms, *seq, crc, at),
            );
            appended.push((key, at));
        }
        if sync && !appended.is_empty() {
            if let Err(e) = self.vlog.sync() {
                self.count_unreferenced(&appended);
                return Err(e);
            }
        }
        if let Err(e) = self.commit_batch(batch, d, sync) {
            self.count_unreferenced(&appended);
            return Err(e);
        }
        for s in staged {
            add(&self.counters.writes);
            self.bump_stripe(s.key);
            match s.hot_value {
                Some(v) => {
                    self.hot.insert(s.key, v, s.new_expire);
                }
                None => self.hot.remove(s.key),
            }
        }
        Ok(self.group.as_ref().map(|g| g.request()))
    }

    /// Counts value-log entries that no record points at (their write failed) as garbage,
    /// if the count itself can be written.
    fn count_unreferenced(&self, appended: &[(&[u8], strata_format::ValuePointer)]) {
        if appended.is_empty() {
            return;
        }
        let mut b = WriteBatch::default();
        for &(key, at) in appended {
            self.warm.add_vlog_garbage(&mut b, key, at);
        }
        let _ = self.warm.write(b, false);
    }

    /// Whether `value` goes to the value log rather than into its RocksDB record.
    fn logs_value(&self, value: &[u8]) -> bool {
        let min = self.opts.vlog_value_bytes_min;
        min > 0 && value.len() as u64 >= min
    }

    fn remove_old(
        &self,
        batch: &mut WriteBatch,
        d: &mut Deltas,
        key: &[u8],
        old: Option<&Loc>,
        delete_warm: bool,
    ) {
        match old {
            Some(Loc::Warm { charge, logged, .. }) => {
                d.warm_bytes -= *charge as i64;
                d.warm_entries -= 1;
                if let Some(at) = logged {
                    self.warm.add_vlog_garbage(batch, key, *at);
                }
                if delete_warm {
                    batch.delete_cf(self.warm.cf(CF_DATA), key);
                }
            }
            Some(Loc::Cold(r)) => {
                d.cold_bytes -= r.value_len as i64;
                d.cold_entries -= 1;
                batch.delete_cf(self.warm.cf(CF_INDEX), key);
            }
            None => {}
        }
    }

    /// Writes `batch` with the counter merges of `d`, then moves the in-memory counters.
    fn commit_batch(&self, mut batch: WriteBatch, d: &Deltas, sync: bool) -> Result<()> {
        let w = &self.warm;
        w.merge_counts(
            &mut batch,
            &[d.warm_bytes, d.warm_entries, d.cold_bytes, d.cold_entries],
        );
        w.write(batch, sync)?;
        let c = &self.counters;
        c.warm_bytes.fetch_add(d.warm_bytes, Ordering::Relaxed);
        c.warm_entries.fetch_add(d.warm_entries, Ordering::Relaxed);
        c.cold_bytes.fetch_add(d.cold_bytes, Ordering::Relaxed);
        c.cold_entries.fetch_add(d.cold_entries, Ordering::Relaxed);
        Ok(())
    }

    /// Commits a demotion or segment rewrite: `moves` are keys whose warm record (checked
    /// against `header`) or whose old index entry is replaced by a new index entry.
    pub(crate) fn commit_moves(
        &self,
        batch: WriteBatch,
        warm_removed: (i64, i64),
        cold_added: (i64, i64),
    ) -> Result<()> {
        let d = Deltas {
            warm_bytes: -warm_removed.0,
            warm_entries: -warm_removed.1,
            cold_bytes: cold_added.0,
            cold_entries: cold_added.1,
        };
        self.commit_batch(batch, &d, false)
    }

    /// Waits for the group commit of a write that returned `ticket`, unless the caller runs
    /// inside [`Engine::deferring_durability`]: then the ticket is left for it to wait for.
    pub(crate) async fn wait_durable(&self, ticket: Option<u64>) -> Result<()> {
        if let (Some(_), Some(t)) = (&self.group, ticket) {
            if DEFERRED.try_with(|d| d.set(d.get().max(t))).is_ok() {
                return Ok(());
            }
        }
        self.wait_synced(ticket).await
    }

    /// Waits until the group commit has synced `ticket`.
    async fn wait_synced(&self, ticket: Option<u64>) -> Result<()> {
        match (&self.group, ticket) {
            (Some(g), Some(t)) => g.wait(t).await.inspect_err(|e| {
                if let Error::Poisoned(m) = e {
                    *self.poisoned.lock() = Some(m.clone());
                }
            }),
            _ => Ok(()),
        }
    }

    /// Deletes `key` if it is stored and expired at `expire_ms` (the TTL sweeper's step).
    pub(crate) fn expire_if_due(&self, key: &[u8], expire_ms: u64) -> Result<bool> {
        let _g = self.lock(key);
        let now = self.now_ms();
        match self.read_stored(key, false)? {
            Some(s) if s.expire_ms == expire_ms && !s.is_live(now) => {
                self.apply_locked(key, Some(&s), Change::Delete)?;
                add(&self.counters.expired);
                Ok(true)
            }
            Some(s) if s.expire_ms == expire_ms => Ok(false),
            _ => {
                // A TTL entry whose key moved on: drop it.
                let mut b = WriteBatch::default();
                b.delete_cf(self.warm.cf(CF_TTL), ttl_key(expire_ms, key));
                self.warm.write(b, false)?;
                Ok(false)
            }
        }
    }
}

tokio::task_local! {
    /// Inside [`Engine::deferring_durability`]: the highest group-commit ticket a write
    /// returned without waiting for.
    static DEFERRED: std::cell::Cell<u64>;
}

impl Engine {
    /// Runs `f` with writes that return once applied, without waiting for their group
    /// commit (`durability = group`; with `sync` or `none` nothing waits anyway), and returns
    /// `f`'s output with the ticket to pass to [`Engine::wait_durable_ticket`] before any of
    /// those writes is acknowledged to anyone (0: nothing to wait for). A server runs each
    /// command of a pipeline this way and waits once, before it sends the replies: the
    /// pipeline's writes share one sync instead of queueing for one each.
    pub async fn deferring_durability<F: std::future::Future>(&self, f: F) -> (F::Output, u64) {
        let run = async {
            let out = f.await;
            (out, DEFERRED.with(std::cell::Cell::get))
        };
        DEFERRED.scope(std::cell::Cell::new(0), run).await
    }

    /// Waits until every write that returned `ticket` (or an earlier one) is durable. An
    /// error means the sync failed: those writes must not be acknowledged.
    pub async fn wait_durable_ticket(&self, ticket: u64) -> Result<()> {
        match ticket {
            0 => Ok(()),
            t => self.inner.wait_synced(Some(t)).await,
        }
    }

    /// The general atomic read-modify-write. `f` sees the live entry (with its value when
    /// `want_value`; a cold value is fetched first) and returns the change to make, if any,
    /// and a result. `f` runs under the key's lock: keep it short.
    pub async fn update<R>(
        &self,
        key: &[u8],
        want_value: bool,
        f: impl FnOnce(Option<Existing<'_>>) -> Result<(Option<Change>, R)>,
    ) -> Result<R> {
        let inner = &self.inner;
        inner.check_sizes(key, None)?;
        let mut f = Some(f);
        let mut fetched: Option<(strata_format::BlockRef, Bytes)> = None;
        for _attempt in 0..8 {
            let ticket;
            let out;
            {
                let _g = inner.lock(key);
                let now = inner.now_ms();
                let stored = inner.read_stored(key, want_value)?;
                let live = stored.as_ref().filter(|s| s.is_live(now));
                let existing = match live {
                    None => None,
                    Some(s) => match &s.loc {
                        Loc::Warm { value, .. } => Some(Existing {
                            value: value.as_ref(),
                            expire_ms: s.expire_ms,
                            value_len: s.value_len,
                        }),
                        Loc::Cold(r) if want_value => match &fetched {
                            Some((fr, v)) if fr == r => Some(Existing {
                                value: Some(v),
                                expire_ms: s.expire_ms,
                                value_len: s.value_len,
                            }),
                            _ => {
                                let r = *r;
                                drop(_g);
                                fetched = Some((r, inner.read_cold(key, &r).await?));
                                continue;
                            }
                        },
                        Loc::Cold(_) => Some(Existing {
                            value: None,
                            expire_ms: s.expire_ms,
                            value_len: s.value_len,
                        }),
                    },
                };
                let f = f.take().expect("update closure runs once");
                let (change, r) = f(existing)?;
                if let Some(Change::Put { value, .. }) = &change {
                    inner.check_sizes(key, Some(value))?;
                }
                ticket = match change {
                    Some(c) => inner.apply_locked(key, stored.as_ref(), c)?,
                    None => None,
                };
                out = r;
            }
            inner.wait_durable(ticket).await?;
            return Ok(out);
        }
        Err(Error::Internal(
            "key kept changing while its cold value was fetched".into(),
        ))
    }

    /// Stores `value` under `key`. Acknowledged once the configured durability is met.
    pub async fn put(&self, key: &[u8], value: Bytes, opts: PutOptions) -> Result<PutResult> {
        self.inner.check_sizes(key, Some(&value))?;
        let want_value = opts.return_old || matches!(opts.condition, Condition::IfEquals(_));
        self.update(key, want_value, move |cur| {
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
            Ok((
                Some(Change::Put { value, expire_ms }),
                PutResult { written: true, old },
            ))
        })
        .await
    }

    /// Stores every pair, expiring at `expire_ms` (Unix ms; 0: never, what Redis's `MSET`
    /// does), in one RocksDB batch: of a key given twice the last value wins; after a crash
    /// either all of them are there or none; and the batch costs one write and one durability
    /// wait instead of one per key. Acknowledged once the configured durability is met.
    pub async fn put_many(&self, pairs: &[(&[u8], Bytes)], expire_ms: u64) -> Result<()> {
        let inner = &self.inner;
        for (k, v) in pairs {
            inner.check_sizes(k, Some(v))?;
        }
        let last: std::collections::HashMap<&[u8], usize> = pairs
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (*k, i))
            .collect();
        let ticket = {
            let _locks = inner.lock_many(pairs.iter().map(|(k, _)| *k));
            inner.check_writable()?;
            let mut batch = WriteBatch::default();
            let mut d = Deltas::default();
            let mut staged = Vec::with_capacity(last.len());
            for (i, (k, v)) in pairs.iter().enumerate() {
                if last[k] != i {
                    continue;
                }
                let old = inner.read_stored(k, false)?;
                let change = Change::Put {
                    value: v.clone(),
                    expire_ms,
                };
                staged.extend(inner.stage(k, old.as_ref(), change, &mut batch, &mut d)?);
            }
            inner.commit_staged(staged, batch, &d, inner.syncs_client_writes())?
        };
        inner.wait_durable(ticket).await
    }

    /// Deletes `key`; returns whether it held a live value.
    pub async fn delete(&self, key: &[u8]) -> Result<bool> {
        self.update(key, false, |cur| {
            Ok((cur.is_some().then_some(Change::Delete), cur.is_some()))
        })
        .await
    }

    /// Atomically adds `delta` to the integer stored at `key` (absent counts as 0) and
    /// returns the new value. Keeps the key's expiry.
    pub async fn incr_by(&self, key: &[u8], delta: i64) -> Result<i64> {
        self.update(key, true, move |cur| {
            let (old, expire_ms) = match &cur {
                None => (0, 0),
                Some(c) => (
                    parse_i64(c.value.expect("value requested")).ok_or(Error::NotInteger)?,
                    c.expire_ms,
                ),
            };
            let new = old.checked_add(delta).ok_or(Error::Overflow)?;
            let value = Bytes::from(new.to_string());
            Ok((Some(Change::Put { value, expire_ms }), new))
        })
        .await
    }

    /// Sets (or with 0 removes) the absolute expiry of a live key; returns whether it exists.
    pub async fn set_expire(&self, key: &[u8], expire_ms: u64) -> Result<bool> {
        self.update(key, false, move |cur| match cur {
            None => Ok((None, false)),
            Some(_) => Ok((Some(Change::SetExpire(expire_ms)), true)),
        })
        .await
    }

    /// Deletes every key in every tier. Segments are collected by the background task.
    pub async fn flush_all(&self) -> Result<()> {
        let inner = &self.inner;
        inner.check_writable()?;
        let _all = inner.lock_all();
        let w = &inner.warm;
        let hi = vec![0xffu8; inner.opts.key_bytes_max + 9];
        for cf in [CF_DATA, CF_INDEX, CF_TTL] {
            w.db.delete_range_cf(w.cf(cf), b"".as_slice(), hi.as_slice())?;
        }
        let mut seg_hi = warm::SEGMENT_PREFIX.to_vec();
        seg_hi.extend_from_slice(&[0xff; 9]);
        w.db.delete_range_cf(w.cf(CF_META), warm::SEGMENT_PREFIX, seg_hi.as_slice())?;
        let mut b = WriteBatch::default();
        w.reset_counts(&mut b);
        // Every logged value is garbage now: seal the newest file and let collection
        // delete them all.
        inner.vlog.roll()?;
        let active = inner.vlog.active_id();
        for (id, len) in inner.vlog.files()?.into_iter().filter(|f| f.0 < active) {
            w.set_vlog_garbage(&mut b, id, len);
        }
        w.write(b, true)?;
        for c in [
            &inner.counters.warm_bytes,
            &inner.counters.warm_entries,
            &inner.counters.cold_bytes,
            &inner.counters.cold_entries,
        ] {
            c.store(0, Ordering::Relaxed);
        }
        inner.hot.clear();
        inner.bump_all();
        inner.background_wake.notify_one();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::parse_i64;

    #[test]
    fn integers_parse_like_redis() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"-12"), Some(-12));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        for bad in [
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
