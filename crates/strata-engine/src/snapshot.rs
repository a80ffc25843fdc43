//! Snapshots of the bucket log, so that what a lost node's new owners read is bounded by
//! what the node holds, not by everything it ever wrote. Once the log has grown by as much
//! as the last snapshot held (`bucket_snapshot_bytes_min` at least), a task notes the
//! highest log number written (`covers`), writes every key the store holds, as it stands
//! (a value, or the index entry of one in a segment), into part objects under
//! `epochs/<epoch>/snapshots/<covers>/`, and then a log object naming the snapshot. Only
//! then does it delete the log objects it covers, older snapshots, and the logs of the
//! node's earlier epochs (`earlier_epochs`): their data is in the store, so in the
//! snapshot.
//!
//! The snapshot is no single moment's view: each key is read as it stands when the scan
//! reaches it. Every change after that read is shipped in an object numbered above
//! `covers` (rounds take what changed in order, and `covers` was written before the scan
//! began), so a replay of the parts and then the log after `covers` leaves each key as the
//! log's last word on it. A writer fenced before its snapshot's log object lands never
//! deletes anything: the object cannot be written.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use strata_format::bucket_log::{self, Header, Record};
use strata_format::Key;

use crate::bucket::{numbers, snapshot_part, snapshots_prefix, BucketLog};
use crate::core::Core;
use crate::ship::{record_of, states_of, State};
use crate::stats::add;
use crate::{Error, Result};

/// How often the task looks whether a snapshot is due.
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// Keys read per page of the scan.
const PAGE_KEYS: usize = 512;
/// A part is written once it holds this many bytes of values.
const PART_BYTES: usize = 8 << 20;

/// Starts the snapshot task of `core`'s bucket log, if it has one; it ends with `shutdown`.
pub(crate) fn start(core: &Arc<Core>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let Some(log) = core.bucket.clone() else {
        return;
    };
    let core = Arc::clone(core);
    let min = core.settings.bucket.bucket_snapshot_bytes_min;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(CHECK_EVERY) => {}
            }
            if !log.snapshot_due(min) {
                continue;
            }
            let run = snapshot(&core, &log);
            let done = tokio::select! {
                _ = shutdown.changed() => return,
                r = run => r,
            };
            if let Err(e) = done {
                if log.fenced() {
                    return;
                }
                add(&core.counters.bucket_log_errors);
                tracing::warn!(error = %e, "a bucket log snapshot failed; the next tries again");
            }
        }
    });
}

/// Writes a snapshot of every key `core` holds, names it in the log, and deletes what it
/// makes needless. Returns the bytes of its parts.
pub(crate) async fn snapshot(core: &Arc<Core>, log: &BucketLog) -> Result<u64> {
    let covers = log.written().await;
    log.snapshot_begins();
    // Write-back's values into the warm store, where the scan finds them.
    let settling = Arc::clone(core);
    tokio::task::spawn_blocking(move || crate::settle::settle_all(&settling))
        .await
        .map_err(|e| Error::Internal(format!("the settle task failed: {e}")))??;
    let mut parts = Parts {
        log,
        covers,
        states: Vec::new(),
        held: 0,
        written: 0,
        bytes: 0,
    };
    for db in 0..=u8::MAX {
        snapshot_db(core, &mut parts, db).await?;
    }
    parts.flush().await?;
    let (count, bytes) = (parts.written, parts.bytes);
    log.write(&[Record::Snapshot {
        covers,
        parts: count,
    }])
    .await?;
    log.snapshot_done(bytes);
    tracing::info!(covers, parts = count, bytes, "snapshotted the bucket log");
    let earlier = &core.settings.earlier_epochs;
    if let Err(e) = clean_up(log.store().as_ref(), log.epoch(), covers, earlier).await {
        tracing::warn!(error = %e, "deleting what a bucket log snapshot made needless failed");
    }
    // Counted once its clean-up is over, so that a reader of the count sees the bucket as
    // the snapshot leaves it.
    add(&core.counters.bucket_snapshots);
    Ok(bytes)
}

/// The parts of a snapshot being written: the states read since the last part.
struct Parts<'l> {
    log: &'l BucketLog,
    covers: u64,
    states: Vec<(Key, State)>,
    /// Value bytes in `states`.
    held: usize,
    written: u32,
    bytes: u64,
}

impl Parts<'_> {
    fn add(&mut self, key: Key, state: State) {
        self.held += match &state {
            State::Put { value, .. } => value.len(),
            State::Cold(entry) => entry.len(),
            State::Delete => return,
        } + key.stored().len();
        self.states.push((key, state));
    }

    /// Writes what it holds as the next part (nothing if it holds nothing).
    async fn flush(&mut self) -> Result<()> {
        if self.states.is_empty() {
            return Ok(());
        }
        let records: Vec<Record<'_>> = self.states.iter().map(record_of).collect();
        let header = Header {
            epoch: self.log.epoch(),
            number: self.covers,
            nonce: 0,
        };
        let body = Bytes::from(bucket_log::encode_log(&header, &records));
        drop(records);
        let path = snapshot_part(self.log.epoch(), self.covers, self.written);
        self.bytes += body.len() as u64;
        self.log
            .store()
            .put(&path, PutPayload::from(body))
            .await
            .map_err(|e| Error::ColdUnavailable(format!("bucket log snapshot write: {e}")))?;
        self.written += 1;
        self.states.clear();
        self.held = 0;
        Ok(())
    }
}

/// Adds every key of stored database `db` to `parts`, writing parts as they fill.
async fn snapshot_db(core: &Arc<Core>, parts: &mut Parts<'_>, db: u8) -> Result<()> {
    let mut start = Bytes::new();
    loop {
        let page = crate::scan::scan(core, db, &start, None, PAGE_KEYS)?;
        let keys: Vec<Key> = page
            .items
            .iter()
            .map(|item| core.key(db, &item.key))
            .filter(|k| parts.log.carries(k))
            .collect();
        for (key, state) in states_of(core, &keys).await? {
            parts.add(key, state);
            if parts.held >= PART_BYTES {
                parts.flush().await?;
            }
        }
        match page.next {
            Some(next) => start = next,
            None => return Ok(()),
        }
    }
}

/// Deletes the objects of `epoch`'s log that the snapshot covering up to `covers` holds
/// (lowest first, so what is left has no gap), its older snapshots, and the logs and
/// snapshots of the node's `earlier` epochs. Segments stay: the store's index points into
/// them.
async fn clean_up(store: &dyn ObjectStore, epoch: u64, covers: u64, earlier: &[u64]) -> Result<()> {
    let delete = |path: Path| async move {
        match store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(Error::ColdUnavailable(format!("bucket log delete: {e}"))),
        }
    };
    for n in numbers(store, epoch).await? {
        if n > covers {
            break;
        }
        delete(crate::bucket::log_path(epoch, n)).await?;
    }
    let keep = snapshots_prefix(epoch).join(format!("{covers:020}"));
    for path in list(store, &snapshots_prefix(epoch)).await? {
        if !path.prefix_matches(&keep) {
            delete(path).await?;
        }
    }
    for &e in earlier {
        for n in numbers(store, e).await? {
            delete(crate::bucket::log_path(e, n)).await?;
        }
        for path in list(store, &snapshots_prefix(e)).await? {
            delete(path).await?;
        }
    }
    Ok(())
}

async fn list(store: &dyn ObjectStore, prefix: &Path) -> Result<Vec<Path>> {
    store
        .list(Some(prefix))
        .map_ok(|m| m.location)
        .try_collect()
        .await
        .map_err(|e| Error::ColdUnavailable(format!("bucket log list: {e}")))
}
