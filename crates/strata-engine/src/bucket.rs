//! The bucket log, a component the core holds: which keys changed since the last round, and
//! the log of objects in the bucket (`epochs/<epoch>/log/<number>.log`, the format in
//! `strata_format::bucket_log`) each round writes. Objects are written one at a time,
//! numbered from the first free number with no gaps, create-only: if a name is taken, the
//! object there is this writer's own (a PUT that landed after it timed out: the same
//! nonce), or the writer is fenced (the cluster gave its slots to others) and never writes
//! or acknowledges again. What a round ships, and when, is `ship`'s; `snapshot` bounds
//! the log (a snapshot of every key, then the objects it covers deleted), and `replay`
//! here reads what a lost node's new owners replay.
//!
//! The protocol is SlateDB's for its write-ahead log (numbered create-only objects, a fence
//! object at the first free number ends a writer), without the rest of that engine: Strata
//! keeps its data in RocksDB and its segments, and ships each changed key's state.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutPayload};
use parking_lot::Mutex;
use strata_format::bucket_log::{self, Header, Object, Record};
use strata_format::Key;
use tokio::sync::watch;

use crate::{Error, Result};

/// Names of the log objects listed at once while looking for the first free number.
const LIST_PAGE_MAX: usize = 100_000;

/// A flush since the last round (shipped before the keys' states, which follow it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flush {
    Db(u8),
    All,
}

/// What changed since the last round.
#[derive(Default)]
pub(crate) struct Changed {
    pub(crate) keys: HashSet<Key, ahash::RandomState>,
    pub(crate) flushes: Vec<Flush>,
}

impl Changed {
    pub(crate) fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.flushes.is_empty()
    }
}

pub(crate) struct BucketLog {
    store: Arc<dyn ObjectStore>,
    epoch: u64,
    nonce: u64,
    timeout: Duration,
    /// Ship `kvc:` (and `kvt:`) keys too.
    kvcache: bool,
    /// The next object's number; held by the one round that writes at a time.
    next: tokio::sync::Mutex<u64>,
    changed: Mutex<Changed>,
    /// The highest ticket every write of which the log holds, and why no higher one will be.
    shipped: watch::Sender<(u64, Option<String>)>,
    fenced: AtomicBool,
    /// Rounds begun, and rounds done (in order: one task runs them): a round that begins
    /// after a write was acknowledged ships it.
    begun: AtomicU64,
    done: watch::Sender<u64>,
    /// Bytes of log objects written since the last snapshot began, and that snapshot's
    /// bytes: the next is due once the log has grown by as much (`snapshot_due`).
    since_snapshot: AtomicU64,
    snapshot_bytes: AtomicU64,
}

/// The prefix of writer epoch `epoch`'s log objects.
fn log_prefix(epoch: u64) -> Path {
    Path::from(format!("epochs/{epoch:010}/log"))
}

/// The object of number `n` of epoch `epoch`'s log.
pub(crate) fn log_path(epoch: u64, n: u64) -> Path {
    log_prefix(epoch).join(format!("{n:020}.log"))
}

fn store_error(what: &str, e: object_store::Error) -> Error {
    Error::ColdUnavailable(format!("bucket log {what}: {e}"))
}

/// The numbers of the objects of `epoch`'s log, sorted.
pub(crate) async fn numbers(store: &dyn ObjectStore, epoch: u64) -> Result<Vec<u64>> {
    let metas: Vec<_> = store
        .list(Some(&log_prefix(epoch)))
        .take(LIST_PAGE_MAX)
        .try_collect()
        .await
        .map_err(|e| store_error("list", e))?;
    let mut ns: Vec<u64> = metas
        .iter()
        .filter_map(|m| m.location.filename()?.strip_suffix(".log")?.parse().ok())
        .collect();
    ns.sort_unstable();
    Ok(ns)
}

/// The number after the highest of `epoch`'s log (1 if it has none). The log has no gaps
/// above its start (a snapshot's clean-up deletes the objects below it, lowest first), and
/// a writer only ever writes above what it wrote: nothing can be written below this number
/// again.
pub(crate) async fn first_free(store: &dyn ObjectStore, epoch: u64) -> Result<u64> {
    Ok(numbers(store, epoch).await?.last().map_or(1, |n| n + 1))
}

/// Ends writer epoch `epoch`'s log: a fence object (by `by`) at its first free number, so
/// the writer's next object cannot be written; returns that number (objects below it are
/// the log). Done again, it finds its fence and returns its number.
pub async fn fence(store: &dyn ObjectStore, epoch: u64, by: &str) -> Result<u64> {
    let mut n = first_free(store, epoch).await?;
    if n > 1 && is_fence(&get(store, &log_path(epoch, n - 1)).await?) {
        return Ok(n - 1);
    }
    loop {
        let body = bucket_log::encode_fence(epoch, n, by);
        let put = store
            .put_opts(
                &log_path(epoch, n),
                PutPayload::from(body),
                PutMode::Create.into(),
            )
            .await;
        match put {
            Ok(_) => return Ok(n),
            Err(object_store::Error::AlreadyExists { .. }) => {
                if is_fence(&get(store, &log_path(epoch, n)).await?) {
                    return Ok(n);
                }
                // The writer wrote this one just now: the next is free.
                n += 1;
            }
            Err(e) => return Err(store_error("fence", e)),
        }
    }
}

/// Deletes what writer epoch `epoch` wrote to the bucket (its log, snapshots and
/// segments) once no one reads it: its node was lost, and its slots' new owners adopted
/// it. The fence, the log's last object, stays: were the node only paused, a write it
/// took before the pause must still find its log ended.
pub async fn retire(store: &dyn ObjectStore, epoch: u64) -> Result<()> {
    let fence = numbers(store, epoch)
        .await?
        .last()
        .map(|&n| log_path(epoch, n));
    let prefix = Path::from(format!("epochs/{epoch:010}"));
    let paths: Vec<Path> = store
        .list(Some(&prefix))
        .map_ok(|m| m.location)
        .try_collect()
        .await
        .map_err(|e| store_error("list", e))?;
    for path in paths.into_iter().filter(|p| Some(p) != fence.as_ref()) {
        match store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(store_error("delete", e)),
        }
    }
    Ok(())
}

fn is_fence(bytes: &[u8]) -> bool {
    matches!(bucket_log::decode(bytes), Ok(Object::Fence { .. }))
}

async fn get(store: &dyn ObjectStore, path: &Path) -> Result<Bytes> {
    let got = store.get(path).await.map_err(|e| store_error("read", e))?;
    got.bytes().await.map_err(|e| store_error("read", e))
}

/// What a new owner replays of a lost node's log, in order: `epochs` are the node's writer
/// epochs, oldest first, each read up to its fence; the replay starts at the last snapshot
/// among them (its parts, then the objects after what it covers), or at the start.
pub async fn replay(store: &dyn ObjectStore, epochs: &[u64]) -> Result<Vec<Bytes>> {
    let mut newer: Vec<Bytes> = Vec::new();
    for &epoch in epochs.iter().rev() {
        let (snapshot, mut objects) = tail(store, epoch).await?;
        objects.append(&mut newer);
        match snapshot {
            Some((covers, parts)) => {
                let mut out = read_snapshot(store, epoch, covers, parts).await?;
                out.append(&mut objects);
                return Ok(out);
            }
            None => newer = objects,
        }
    }
    Ok(newer)
}

/// The objects of `epoch`'s log after its last snapshot (every one, without a snapshot) up
/// to its fence, in order; and that snapshot's record (what it covers, its parts). Read
/// from the highest number down, so that a clean-up below the snapshot (its writer's,
/// running on) never stands in the way.
async fn tail(store: &dyn ObjectStore, epoch: u64) -> Result<(Option<(u64, u32)>, Vec<Bytes>)> {
    let numbers = numbers(store, epoch).await?;
    let mut out = Vec::new();
    let mut snapshot: Option<(u64, u32)> = None;
    for &n in numbers.iter().rev() {
        if snapshot.is_some_and(|(covers, _)| n <= covers) {
            break;
        }
        let bytes = get(store, &log_path(epoch, n)).await?;
        let decoded = bucket_log::decode(&bytes)
            .map_err(|e| Error::Data(format!("bucket log {epoch}/{n}: {e}")))?;
        match decoded {
            // Nothing lies beyond a fence.
            Object::Fence { .. } => out.clear(),
            Object::Log { records, .. } => {
                if snapshot.is_none() {
                    snapshot = last_snapshot(&records);
                }
                out.push(bytes);
            }
        }
    }
    if snapshot.is_none() && numbers.first().is_some_and(|&n| n > 1) {
        return Err(Error::Data(format!(
            "the bucket log of epoch {epoch} starts at object {} and holds no snapshot",
            numbers[0]
        )));
    }
    out.reverse();
    Ok((snapshot, out))
}

fn last_snapshot(records: &[Record<'_>]) -> Option<(u64, u32)> {
    records.iter().rev().find_map(|r| match *r {
        Record::Snapshot { covers, parts } => Some((covers, parts)),
        _ => None,
    })
}

/// The prefix of writer epoch `epoch`'s snapshots.
pub(crate) fn snapshots_prefix(epoch: u64) -> Path {
    Path::from(format!("epochs/{epoch:010}/snapshots"))
}

/// Part `i` of the snapshot of `epoch` that covers its log up to `covers`.
pub(crate) fn snapshot_part(epoch: u64, covers: u64, i: u32) -> Path {
    snapshots_prefix(epoch)
        .join(format!("{covers:020}"))
        .join(format!("{i:06}.log"))
}

async fn read_snapshot(
    store: &dyn ObjectStore,
    epoch: u64,
    covers: u64,
    parts: u32,
) -> Result<Vec<Bytes>> {
    let mut out = Vec::with_capacity(parts as usize);
    for i in 0..parts {
        out.push(get(store, &snapshot_part(epoch, covers, i)).await?);
    }
    Ok(out)
}

impl BucketLog {
    /// The log of writer epoch `epoch` in `store`, going on from its first free number.
    pub(crate) async fn open(
        store: Arc<dyn ObjectStore>,
        epoch: u64,
        timeout: Duration,
        kvcache: bool,
    ) -> Result<BucketLog> {
        let next = first_free(store.as_ref(), epoch).await?;
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ (std::process::id() as u64) << 32;
        Ok(BucketLog {
            store,
            epoch,
            nonce,
            timeout,
            kvcache,
            next: tokio::sync::Mutex::new(next),
            changed: Mutex::default(),
            shipped: watch::channel((0, None)).0,
            fenced: AtomicBool::new(false),
            begun: AtomicU64::new(0),
            done: watch::channel(0).0,
            since_snapshot: AtomicU64::new(0),
            snapshot_bytes: AtomicU64::new(0),
        })
    }

    /// Whether the log carries `key` (KV-cache chunks, and the tokens kept beside them, only
    /// with `bucket_kvcache`).
    pub(crate) fn carries(&self, key: &Key) -> bool {
        let k = key.client();
        self.kvcache || !(k.starts_with(b"kvc:") || k.starts_with(b"kvt:"))
    }

    /// Notes that `key` changed (under its stripe lock, before the write's ticket).
    pub(crate) fn mark(&self, key: &Key) {
        if self.carries(key) {
            self.changed.lock().keys.insert(key.clone());
        }
    }

    pub(crate) fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The highest number written (0 before the first object): every round that wrote at
    /// or below it is done.
    pub(crate) async fn written(&self) -> u64 {
        *self.next.lock().await - 1
    }

    /// Whether the log grew, since the last snapshot began, by as much as that snapshot
    /// held (and by `min` at least).
    pub(crate) fn snapshot_due(&self, min: u64) -> bool {
        let last = self.snapshot_bytes.load(Ordering::Relaxed);
        self.since_snapshot.load(Ordering::Relaxed) >= last.max(min)
    }

    /// A snapshot begins: the log's growth is counted from here.
    pub(crate) fn snapshot_begins(&self) {
        self.since_snapshot.store(0, Ordering::Relaxed);
    }

    /// A snapshot of `bytes` is complete.
    pub(crate) fn snapshot_done(&self, bytes: u64) {
        self.snapshot_bytes.store(bytes, Ordering::Relaxed);
    }

    pub(crate) fn mark_flush(&self, f: Flush) {
        self.changed.lock().flushes.push(f);
    }

    /// What changed since the last call.
    pub(crate) fn take(&self) -> Changed {
        std::mem::take(&mut *self.changed.lock())
    }

    /// A round begins: its number.
    pub(crate) fn begin_round(&self) -> u64 {
        self.begun.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Round `n` shipped everything it took.
    pub(crate) fn end_round(&self, n: u64) {
        self.done.send_modify(|d| *d = (*d).max(n));
    }

    /// Waits (at most `timeout`) until a round that began after the call is done: every
    /// write acknowledged before the call is in the log then. Whether one was.
    pub(crate) async fn flushed_within(&self, timeout: Duration) -> bool {
        let after = self.begun.load(Ordering::Acquire) + 1;
        let mut rx = self.done.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|&d| d >= after))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Whether the cluster fenced this writer.
    pub(crate) fn fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }

    /// Writes `records` as the log's next object. A name found taken by this writer's own
    /// object (an earlier round's PUT that landed after it was given up on: it holds an
    /// older state of some keys) moves the write to the next number; taken by any other
    /// object (the controller's fence), it fences this writer for good.
    pub(crate) async fn write(&self, records: &[Record<'_>]) -> Result<()> {
        if self.fenced() {
            return Err(fenced());
        }
        let mut next = self.next.lock().await;
        loop {
            let header = Header {
                epoch: self.epoch,
                number: *next,
                nonce: self.nonce,
            };
            let body = bucket_log::encode_log(&header, records);
            let bytes = body.len() as u64;
            let path = log_path(self.epoch, *next);
            let put = self
                .store
                .put_opts(&path, PutPayload::from(body), PutMode::Create.into());
            match tokio::time::timeout(self.timeout, put).await {
                Ok(Ok(_)) => {
                    *next += 1;
                    self.since_snapshot.fetch_add(bytes, Ordering::Relaxed);
                    return Ok(());
                }
                Ok(Err(object_store::Error::AlreadyExists { .. })) => {
                    self.taken(&path).await?;
                    *next += 1;
                }
                Ok(Err(e)) => return Err(store_error("write", e)),
                Err(_) => return Err(Error::ColdUnavailable("bucket log write timed out".into())),
            }
        }
    }

    /// The object at `path` was there: this writer's own (an earlier PUT of it landed), or
    /// the end of its log.
    async fn taken(&self, path: &Path) -> Result<()> {
        let bytes = get(self.store.as_ref(), path).await?;
        match bucket_log::decode(&bytes) {
            Ok(Object::Log { header, .. }) if header.nonce == self.nonce => Ok(()),
            _ => {
                self.fenced.store(true, Ordering::Release);
                self.fail(fenced().to_string());
                Err(fenced())
            }
        }
    }

    /// Every write with a ticket up to `ticket` is in the log.
    pub(crate) fn shipped(&self, ticket: u64) {
        self.shipped.send_modify(|(s, _)| *s = (*s).max(ticket));
    }

    /// No later write will reach the log (`why`): its waiters fail.
    pub(crate) fn fail(&self, why: String) {
        self.shipped.send_modify(|(_, e)| {
            e.get_or_insert(why);
        });
    }

    /// Waits until the log holds every write up to `ticket`.
    pub(crate) async fn wait(&self, ticket: u64) -> Result<()> {
        let mut rx = self.shipped.subscribe();
        let state = rx
            .wait_for(|(s, e)| *s >= ticket || e.is_some())
            .await
            .map_err(|_| Error::Closed)?;
        match &state.1 {
            _ if state.0 >= ticket => Ok(()),
            Some(why) => Err(Error::Poisoned(why.clone())),
            None => Ok(()),
        }
    }
}

fn fenced() -> Error {
    Error::Poisoned(
        "this node was fenced: the cluster gave its slots to other nodes; restart it to rejoin"
            .into(),
    )
}
