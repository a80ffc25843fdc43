//! Backup and restore. A backup is a consistent snapshot of the warm tier (a checkpoint of
//! the warm store, which also holds the cold index and the segment records) plus a copy of
//! every segment that snapshot can reference, written under one directory or object-store
//! prefix:
//!
//! ```text
//! <to>/warm/<rocksdb files>      the checkpoint
//! <to>/vlog/<id>.vlog            the value-log files (large warm values) it can point into
//! <to>/segments/<id>.seg         the segments it references
//! <to>/MANIFEST.json             written last: a backup without it is incomplete
//! ```
//!
//! Segment and value-log collection are paused while a backup copies, so nothing the
//! checkpoint references is deleted under it (value-log files only grow meanwhile: the copy
//! holds every value appended before the checkpoint). A restore writes the warm files into an empty data directory and the segments
//! into the configured cold tier, so it works on a fresh machine with another cold URL.

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

use crate::cold::{open_store, segment_path, url_for, Cold};
use crate::core::Core;
use crate::settings::Settings;
use crate::{Error, Result};

const FORMAT: &str = "strata-backup-v1";
const MANIFEST: &str = "MANIFEST.json";
/// Files at least this large are uploaded in parts of this size.
const PART_BYTES: usize = 8 << 20;

#[derive(Debug, Serialize, Deserialize)]
struct Manifest {
    format: String,
    created_unix_ms: u64,
    /// RocksDB checkpoint files: name and size.
    warm_files: Vec<(String, u64)>,
    /// Value-log files: name and bytes copied (absent in backups from before the value log).
    #[serde(default)]
    vlog_files: Vec<(String, u64)>,
    segments: Vec<u64>,
}

/// What a backup or restore moved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackupSummary {
    /// RocksDB checkpoint files and value-log files.
    pub warm_files: u64,
    pub segments: u64,
    pub bytes: u64,
}

/// Called with (bytes done, bytes in all) as a backup or restore runs.
pub type Progress<'a> = &'a (dyn Fn(u64, u64) + Send + Sync);

fn store_err(what: &str) -> impl Fn(object_store::Error) -> Error + '_ {
    move |e| Error::ColdUnavailable(format!("{what}: {e}"))
}

fn io_err(what: String) -> impl Fn(std::io::Error) -> Error {
    move |e| Error::Storage(format!("{what}: {e}"))
}

async fn upload_file(store: &dyn ObjectStore, from: &FsPath, to: &Path) -> Result<u64> {
    let what = format!("backup upload of {}", from.display());
    let mut f = tokio::fs::File::open(from)
        .await
        .map_err(io_err(what.clone()))?;
    let len = f.metadata().await.map_err(io_err(what.clone()))?.len();
    if len < PART_BYTES as u64 {
        let bytes = tokio::fs::read(from).await.map_err(io_err(what.clone()))?;
        store
            .put(to, PutPayload::from(bytes))
            .await
            .map_err(store_err(&what))?;
        return Ok(len);
    }
    let upload = store.put_multipart(to).await.map_err(store_err(&what))?;
    let mut w = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
    let mut buf = vec![0u8; PART_BYTES];
    loop {
        let n = tokio::io::AsyncReadExt::read(&mut f, &mut buf)
            .await
            .map_err(io_err(what.clone()))?;
        if n == 0 {
            break;
        }
        w.wait_for_capacity(2).await.map_err(store_err(&what))?;
        w.write(&buf[..n]);
    }
    w.finish().await.map_err(store_err(&what))?;
    Ok(len)
}

async fn download_file(store: &dyn ObjectStore, from: &Path, to: &FsPath) -> Result<u64> {
    let what = format!("restore of {from}");
    let mut stream = store
        .get(from)
        .await
        .map_err(store_err(&what))?
        .into_stream();
    let mut f = tokio::fs::File::create(to)
        .await
        .map_err(io_err(what.clone()))?;
    let mut n = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(store_err(&what))?;
        f.write_all(&chunk).await.map_err(io_err(what.clone()))?;
        n += chunk.len() as u64;
    }
    f.sync_all().await.map_err(io_err(what))?;
    Ok(n)
}

/// Writes a consistent snapshot of the store to `to` (`file:///dir` or
/// `s3://bucket/prefix`, with this store's S3 settings). Runs while the store serves.
pub(crate) async fn backup(
    core: &Arc<Core>,
    to: &str,
    progress: Progress<'_>,
) -> Result<BackupSummary> {
    let dest = open_store(to, &core.settings.cold)?;
    // No segment may be deleted between the checkpoint and the end of the copy.
    let _no_gc = core.gc_gate.read().await;
    let staging = core
        .data_dir
        .join(format!("backup-staging-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    let me = Arc::clone(core);
    let stage = staging.clone();
    let (files, segments) =
        crate::offload::run("checkpoint", move || checkpoint(&me, &stage)).await??;
    let vlog_dir = core.data_dir.join("vlog");
    let vlog_files: Vec<(String, u64)> = crate::vlog::list(&vlog_dir)?
        .into_iter()
        .map(|(id, len)| (format!("{id:016x}.vlog"), len))
        .collect();
    let result = copy_out(
        core,
        dest.as_ref(),
        &staging,
        &files,
        (&vlog_dir, &vlog_files),
        &segments,
        progress,
    )
    .await;
    let _ = std::fs::remove_dir_all(&staging);
    result
}

/// Files (name, length) of a checkpoint, and the segments it references.
type Checkpoint = (Vec<(String, u64)>, Vec<u64>);

/// A checkpoint of the warm store in `stage`: its files and the segments it references.
fn checkpoint(core: &Core, stage: &FsPath) -> Result<Checkpoint> {
    core.warm.store.checkpoint(stage)?;
    // Ids below the counter at checkpoint time with a record are what it references; later
    // ones are demotions the snapshot does not know.
    let next_id = *core.next_segment_id.lock();
    let mut segments: Vec<u64> = core
        .warm
        .segments()?
        .into_keys()
        .filter(|&id| id < next_id)
        .collect();
    segments.sort_unstable();
    let mut files = Vec::new();
    for e in std::fs::read_dir(stage).map_err(io_err("checkpoint".into()))? {
        let e = e.map_err(io_err("checkpoint".into()))?;
        let len = e.metadata().map_err(io_err("checkpoint".into()))?.len();
        files.push((e.file_name().to_string_lossy().into_owned(), len));
    }
    files.sort();
    Ok((files, segments))
}

async fn copy_out(
    core: &Core,
    dest: &dyn ObjectStore,
    staging: &FsPath,
    files: &[(String, u64)],
    (vlog_dir, vlog_files): (&FsPath, &[(String, u64)]),
    segments: &[u64],
    progress: Progress<'_>,
) -> Result<BackupSummary> {
    let mut sum = BackupSummary::default();
    let seg_estimate = core.sizes.get().cold_bytes as u64;
    let total = files.iter().chain(vlog_files).map(|f| f.1).sum::<u64>() + seg_estimate;
    for (name, _) in files {
        let path = Path::from(format!("warm/{name}"));
        sum.bytes += upload_file(dest, &staging.join(name), &path).await?;
        sum.warm_files += 1;
        progress(sum.bytes, total.max(sum.bytes));
    }
    let mut vlog_copied = Vec::new();
    for (name, _) in vlog_files {
        let path = Path::from(format!("vlog/{name}"));
        let n = upload_file(dest, &vlog_dir.join(name), &path).await?;
        vlog_copied.push((name.clone(), n));
        sum.bytes += n;
        sum.warm_files += 1;
        progress(sum.bytes, total.max(sum.bytes));
    }
    for &id in segments {
        let bytes = core.cold.get_segment(id).await?;
        sum.bytes += bytes.len() as u64;
        dest.put(&segment_path(id), PutPayload::from(bytes))
            .await
            .map_err(store_err("backup of a segment"))?;
        sum.segments += 1;
        progress(sum.bytes, total.max(sum.bytes));
    }
    let manifest = Manifest {
        format: FORMAT.into(),
        created_unix_ms: core.now_ms(),
        warm_files: files.to_vec(),
        vlog_files: vlog_copied,
        segments: segments.to_vec(),
    };
    let json = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| Error::Internal(format!("manifest: {e}")))?;
    dest.put(&Path::from(MANIFEST), PutPayload::from(json))
        .await
        .map_err(store_err("backup manifest"))?;
    progress(sum.bytes, sum.bytes);
    Ok(sum)
}

/// Restores the backup at `from` into `data_dir` (which must not hold a store yet) and the
/// cold tier `settings` names. Open the engine afterwards as usual.
pub async fn restore(
    from: &str,
    data_dir: &FsPath,
    settings: &Settings,
    progress: Progress<'_>,
) -> Result<BackupSummary> {
    let src = open_store(from, &settings.cold)?;
    let raw = src
        .get(&Path::from(MANIFEST))
        .await
        .map_err(|e| {
            Error::Invalid(format!(
                "no complete backup at {from} ({MANIFEST} unreadable: {e})"
            ))
        })?
        .bytes()
        .await
        .map_err(store_err("backup manifest"))?;
    let m: Manifest = serde_json::from_slice(&raw)
        .map_err(|e| Error::Data(format!("backup manifest at {from}: {e}")))?;
    if m.format != FORMAT {
        return Err(Error::Invalid(format!(
            "backup at {from} has format '{}', this Strata reads '{FORMAT}'",
            m.format
        )));
    }
    let warm: PathBuf = crate::warm_dir(data_dir);
    if warm.join("CURRENT").exists() {
        return Err(Error::Invalid(format!(
            "{} already holds a store; restore into an empty data directory",
            data_dir.display()
        )));
    }
    std::fs::create_dir_all(&warm).map_err(io_err(format!("create {}", warm.display())))?;
    let vlog = data_dir.join("vlog");
    std::fs::create_dir_all(&vlog).map_err(io_err(format!("create {}", vlog.display())))?;
    let total = m
        .warm_files
        .iter()
        .chain(&m.vlog_files)
        .map(|f| f.1)
        .sum::<u64>();
    let mut sum = BackupSummary::default();
    let files = m.warm_files.iter().map(|f| ("warm", &f.0, &warm));
    for (prefix, name, dir) in files.chain(m.vlog_files.iter().map(|f| ("vlog", &f.0, &vlog))) {
        let from = Path::from(format!("{prefix}/{name}"));
        sum.bytes += download_file(src.as_ref(), &from, &dir.join(name)).await?;
        sum.warm_files += 1;
        progress(sum.bytes, total.max(sum.bytes));
    }
    let url = url_for(&settings.cold, data_dir)?;
    let counters = Default::default();
    let cold = Cold::new(
        open_store(&url, &settings.cold)?,
        url,
        &settings.cold,
        counters,
    );
    for &id in &m.segments {
        let bytes = src
            .get(&segment_path(id))
            .await
            .map_err(store_err("restore of a segment"))?
            .bytes()
            .await
            .map_err(store_err("restore of a segment"))?;
        sum.bytes += bytes.len() as u64;
        cold.put_segment(id, bytes.to_vec()).await?;
        sum.segments += 1;
        progress(sum.bytes, total.max(sum.bytes));
    }
    progress(sum.bytes, sum.bytes);
    Ok(sum)
}
