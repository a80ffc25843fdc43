//! The bucket log, a component the core holds: which keys changed since the last round, and
//! the log of objects in the bucket (`epochs/<epoch>/log/<number>.log`, the format in
//! `strata_format::bucket_log`) each round writes. Objects are written one at a time,
//! numbered from the first free number with no gaps, create-only: if a name is taken, the
//! object there is this writer's own (a PUT that landed after it timed out: the same
//! nonce), or the writer is fenced (the cluster gave its slots to others) and never writes
//! or acknowledges again. What a round ships, and when, is `ship`'s.
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
    /// Ship `kvc:` keys too.
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

/// The first number of `epoch`'s log with no object: the log has no gaps, so it follows
/// the run from 1.
pub(crate) async fn first_free(store: &dyn ObjectStore, epoch: u64) -> Result<u64> {
    let mut next = 1;
    for n in numbers(store, epoch).await? {
        if n == next {
            next += 1;
        } else if n > next {
            break;
        }
    }
    Ok(next)
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

fn is_fence(bytes: &[u8]) -> bool {
    matches!(bucket_log::decode(bytes), Ok(Object::Fence { .. }))
}

async fn get(store: &dyn ObjectStore, path: &Path) -> Result<Bytes> {
    let got = store.get(path).await.map_err(|e| store_error("read", e))?;
    got.bytes().await.map_err(|e| store_error("read", e))
}

/// The objects of writer epoch `epoch`'s log up to its fence (or its last object), in
/// order, from number `from` on.
pub async fn read(store: &dyn ObjectStore, epoch: u64, from: u64) -> Result<Vec<Bytes>> {
    let mut out = Vec::new();
    let mut n = from.max(1);
    loop {
        let bytes = match store.get(&log_path(epoch, n)).await {
            Ok(got) => got.bytes().await.map_err(|e| store_error("read", e))?,
            Err(object_store::Error::NotFound { .. }) => return Ok(out),
            Err(e) => return Err(store_error("read", e)),
        };
        match bucket_log::decode(&bytes).map_err(|e| Error::Data(format!("bucket log {n}: {e}")))? {
            Object::Fence { .. } => return Ok(out),
            Object::Log { .. } => out.push(bytes),
        }
        n += 1;
    }
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
        })
    }

    /// Notes that `key` changed (under its stripe lock, before the write's ticket).
    pub(crate) fn mark(&self, key: &Key) {
        if !self.kvcache && key.client().starts_with(b"kvc:") {
            return;
        }
        self.changed.lock().keys.insert(key.clone());
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
            let path = log_path(self.epoch, *next);
            let put = self
                .store
                .put_opts(&path, PutPayload::from(body), PutMode::Create.into());
            match tokio::time::timeout(self.timeout, put).await {
                Ok(Ok(_)) => {
                    *next += 1;
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
