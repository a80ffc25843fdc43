//! The cold tier: immutable segment objects in an object store (any [`ObjectStore`], handed
//! in: a local directory, S3, or a test's failing store), read by ranged GETs of one block,
//! or of a run of blocks that lie end to end (prefetch's).
//!
//! Nothing here waits on the object store without a timeout, and concurrent reads of the
//! same block share one GET (a single-flight map keyed by segment and block).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt, Shared};
use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use parking_lot::Mutex;
use strata_format::segment_ids::epoch_of;
use strata_format::BlockRef;

use crate::settings::ColdSettings;
use crate::stats::{add, Counters};
use crate::{Error, Result};

type BlockFuture = Shared<BoxFuture<'static, Result<Bytes>>>;

pub(crate) struct Cold {
    store: Arc<dyn ObjectStore>,
    timeout: Duration,
    inflight: Mutex<HashMap<(u64, u32), BlockFuture>>,
    /// One permit per object-store read in flight (`cold_reads_max`).
    read_slots: tokio::sync::Semaphore,
    read_slots_max: usize,
    /// Most reads ever in flight at once.
    reads_in_flight_peak: AtomicU64,
    counters: Arc<Counters>,
    /// Where the objects are, as `INFO` shows it.
    pub(crate) url: String,
}

/// Where the segments of writer epoch `epoch` are: `segments/` for epoch 0 (as every store
/// before epochs), `epochs/<epoch>/segments/` otherwise.
fn segments_prefix(epoch: u64) -> Path {
    match epoch {
        0 => Path::from("segments"),
        e => Path::from(format!("epochs/{e:010}/segments")),
    }
}

pub(crate) fn segment_path(id: u64) -> Path {
    segments_prefix(epoch_of(id)).join(format!("{id:016x}.seg"))
}

fn parse_segment_path(p: &Path) -> Option<u64> {
    let name = p.filename()?;
    let hex = name.strip_suffix(".seg")?;
    u64::from_str_radix(hex, 16).ok()
}

impl Cold {
    /// The cold tier over `store` (described by `url` for `INFO`).
    pub(crate) fn new(
        store: Arc<dyn ObjectStore>,
        url: String,
        s: &ColdSettings,
        counters: Arc<Counters>,
    ) -> Self {
        Cold {
            store,
            timeout: Duration::from_millis(s.cold_request_timeout_ms.max(1)),
            inflight: Mutex::new(HashMap::new()),
            read_slots: tokio::sync::Semaphore::new(s.cold_reads_max.max(1)),
            read_slots_max: s.cold_reads_max.max(1),
            reads_in_flight_peak: AtomicU64::new(0),
            counters,
            url,
        }
    }

    /// The object store itself.
    pub(crate) fn store(&self) -> Arc<dyn ObjectStore> {
        Arc::clone(&self.store)
    }

    /// Most object-store reads ever in flight at once.
    pub(crate) fn reads_in_flight_peak(&self) -> u64 {
        self.reads_in_flight_peak.load(Ordering::Relaxed)
    }

    async fn timed<T>(
        &self,
        what: &str,
        f: impl std::future::Future<Output = object_store::Result<T>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.timeout, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(object_store::Error::NotFound { path, .. })) => {
                add(&self.counters.object_store_errors);
                Err(Error::ColdUnavailable(format!(
                    "{what}: object {path} not found"
                )))
            }
            Ok(Err(e)) => {
                add(&self.counters.object_store_errors);
                Err(Error::ColdUnavailable(format!("{what}: {e}")))
            }
            Err(_) => {
                add(&self.counters.object_store_errors);
                Err(Error::ColdUnavailable(format!(
                    "{what}: no answer within {} ms",
                    self.timeout.as_millis()
                )))
            }
        }
    }

    /// Uploads a whole segment. Idempotent: the same id always carries the same bytes.
    pub(crate) async fn put_segment(&self, id: u64, bytes: Vec<u8>) -> Result<()> {
        let n = bytes.len() as u64;
        add(&self.counters.object_store_puts);
        let payload = PutPayload::from(bytes);
        self.timed("segment upload", self.store.put(&segment_path(id), payload))
            .await?;
        self.counters
            .object_store_put_bytes
            .fetch_add(n, Ordering::Relaxed);
        Ok(())
    }

    /// Fetches a whole segment object (for rewriting it).
    pub(crate) async fn get_segment(&self, id: u64) -> Result<Bytes> {
        add(&self.counters.object_store_gets);
        let path = segment_path(id);
        let _slot = self.read_slot().await?;
        let res = self.timed("segment read", self.store.get(&path)).await?;
        let bytes = self.timed("segment read", res.bytes()).await?;
        self.counters
            .object_store_get_bytes
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(bytes)
    }

    pub(crate) async fn delete_segment(&self, id: u64) -> Result<()> {
        add(&self.counters.object_store_deletes);
        self.timed("segment delete", self.store.delete(&segment_path(id)))
            .await
    }

    /// The segments of writer epoch `epoch` (never another writer's).
    pub(crate) async fn list_segments(&self, epoch: u64) -> Result<Vec<u64>> {
        add(&self.counters.object_store_lists);
        let prefix = segments_prefix(epoch);
        let metas: Vec<_> = self
            .timed("segment list", self.store.list(Some(&prefix)).try_collect())
            .await?;
        Ok(metas
            .iter()
            .filter_map(|m| parse_segment_path(&m.location))
            .filter(|&id| epoch_of(id) == epoch)
            .collect())
    }

    /// Whether a GET of block `r` is in flight (a [`Cold::get_block`] of it now joins that).
    pub(crate) fn fetching(&self, r: &BlockRef) -> bool {
        self.inflight.lock().contains_key(&r.id())
    }

    /// Fetches, verifies and decompresses one block; concurrent calls for the same block
    /// share one request.
    pub(crate) async fn get_block(self: &Arc<Self>, r: &BlockRef) -> Result<Bytes> {
        let mut got = self.get_blocks(std::slice::from_ref(r)).await;
        got.pop()
            .unwrap_or_else(|| Err(Error::Internal("a block asked for went unanswered".into())))
    }

    /// Fetches, verifies and decompresses `refs`, each block's result in their order. Blocks
    /// of one segment that follow each other end to end (in `refs`' order) come in one
    /// ranged GET of at most [`RUN_BYTES_MAX`], as a prefetch of a session's next keys
    /// wants them; a block another read is fetching already is joined, not asked for again
    /// (so a run with such a block in its middle takes two GETs).
    pub(crate) async fn get_blocks(self: &Arc<Self>, refs: &[BlockRef]) -> Vec<Result<Bytes>> {
        let waits: Vec<BlockFuture> = {
            let mut map = self.inflight.lock();
            let mut waits = Vec::with_capacity(refs.len());
            let mut i = 0;
            while i < refs.len() {
                if let Some(f) = map.get(&refs[i].id()) {
                    add(&self.counters.object_store_shared_fetches);
                    waits.push(f.clone());
                    i += 1;
                    continue;
                }
                let mut j = i + 1;
                let mut bytes = u64::from(refs[i].len);
                while j < refs.len()
                    && extends_run(&refs[j - 1], &refs[j], bytes)
                    && !map.contains_key(&refs[j].id())
                {
                    bytes += u64::from(refs[j].len);
                    j += 1;
                }
                let run = refs[i..j].to_vec();
                let this = Arc::clone(self);
                let whole = async move {
                    let out = this.fetch_run(&run).await;
                    let mut map = this.inflight.lock();
                    for r in &run {
                        map.remove(&r.id());
                    }
                    out.map(Arc::new)
                }
                .boxed()
                .shared();
                for (n, r) in refs[i..j].iter().enumerate() {
                    let one: BlockFuture = whole
                        .clone()
                        .map(move |out| out.and_then(|blocks| blocks[n].clone()))
                        .boxed()
                        .shared();
                    map.insert(r.id(), one.clone());
                    waits.push(one);
                }
                i = j;
            }
            waits
        };
        futures::future::join_all(waits).await
    }

    /// Waits for a turn to read from the object store, at most the request timeout (so a
    /// read waits at most twice that in all).
    async fn read_slot(&self) -> Result<tokio::sync::SemaphorePermit<'_>> {
        if self.read_slots.available_permits() == 0 {
            add(&self.counters.object_store_read_waits);
        }
        let slot = match tokio::time::timeout(self.timeout, self.read_slots.acquire()).await {
            Ok(Ok(slot)) => slot,
            Ok(Err(_)) => return Err(Error::Internal("object-store read slots closed".into())),
            Err(_) => {
                add(&self.counters.object_store_errors);
                return Err(Error::ColdUnavailable(format!(
                    "all {} object-store read slots stayed busy for {} ms",
                    self.read_slots_max,
                    self.timeout.as_millis()
                )));
            }
        };
        let in_flight = (self.read_slots_max - self.read_slots.available_permits()) as u64;
        self.reads_in_flight_peak
            .fetch_max(in_flight, Ordering::Relaxed);
        Ok(slot)
    }

    /// One ranged GET of `run`'s blocks (of one segment, end to end), each verified and
    /// decompressed: the GET's error, or each block's own result (a damaged block fails
    /// alone).
    async fn fetch_run(&self, run: &[BlockRef]) -> Result<Vec<Result<Bytes>>> {
        let (Some(first), Some(last)) = (run.first().copied(), run.last()) else {
            return Ok(Vec::new());
        };
        let _slot = self.read_slot().await?;
        let start = Instant::now();
        add(&self.counters.object_store_gets);
        let stored = self
            .timed(
                "block read",
                self.store.get_range(
                    &segment_path(first.segment_id),
                    first.offset..last.offset + last.len as u64,
                ),
            )
            .await?;
        self.counters
            .object_store_get_bytes
            .fetch_add(stored.len() as u64, Ordering::Relaxed);
        self.counters
            .object_store_get_micros
            .fetch_add(start.elapsed().as_micros() as u64, Ordering::Relaxed);
        // More than a megabyte to decompress goes off the runtime's threads.
        let big = run.iter().map(|r| u64::from(r.raw_len)).sum::<u64>() > 1 << 20;
        let run = run.to_vec();
        let decode = move || -> Vec<Result<Bytes>> {
            run.iter()
                .map(|r| {
                    let at = (r.offset - first.offset) as usize;
                    // A short answer leaves a block short: decoding says it is truncated.
                    let bytes = stored.get(at..at + r.len as usize).unwrap_or_default();
                    Ok(Bytes::from(strata_format::decode_block(r, bytes)?))
                })
                .collect()
        };
        if big {
            tokio::task::spawn_blocking(decode)
                .await
                .map_err(|e| Error::Internal(format!("block decode task: {e}")))
        } else {
            Ok(decode())
        }
    }
}

/// Most bytes one ranged GET of a run of blocks asks for (a larger block comes alone): a
/// run shares one request timeout, and a client's read that joins it waits for all of it.
const RUN_BYTES_MAX: u64 = 4 << 20;

/// Whether block `next` may join a run of `bytes` that ends with block `last`: it starts
/// where `last` ends, in the same segment, and the run stays within [`RUN_BYTES_MAX`].
pub(crate) fn extends_run(last: &BlockRef, next: &BlockRef, bytes: u64) -> bool {
    last.segment_id == next.segment_id
        && last.offset + u64::from(last.len) == next.offset
        && bytes + u64::from(next.len) <= RUN_BYTES_MAX
}

/// The object store `url` names (`file:///path` or `s3://bucket/prefix`, with the S3
/// settings of `s`), created if it is a directory that does not exist.
pub fn open_store(url: &str, s: &ColdSettings) -> Result<Arc<dyn ObjectStore>> {
    let parsed = url::Url::parse(url).map_err(|e| {
        Error::Invalid(format!(
            "cold_url '{url}' is not a URL: {e}; use file:///path or s3://bucket/prefix"
        ))
    })?;
    match parsed.scheme() {
        "file" => {
            let dir = std::path::PathBuf::from(parsed.path());
            std::fs::create_dir_all(&dir).map_err(|e| {
                Error::Invalid(format!(
                    "cannot create cold directory {}: {e}",
                    dir.display()
                ))
            })?;
            // Synced: an object in the directory is one the machine's crash keeps (a segment
            // the index points into, a bucket log object a write was acknowledged for).
            let fs = object_store::local::LocalFileSystem::new_with_prefix(&dir)
                .map_err(|e| Error::Invalid(format!("cold directory {}: {e}", dir.display())))?
                .with_fsync(true);
            Ok(Arc::new(fs))
        }
        "s3" => {
            let bucket = parsed
                .host_str()
                .ok_or_else(|| Error::Invalid(format!("cold_url '{url}' names no bucket")))?;
            let timeout = Duration::from_millis(s.cold_request_timeout_ms.max(1));
            let client = object_store::ClientOptions::new()
                .with_timeout(timeout)
                .with_connect_timeout(timeout.min(Duration::from_secs(5)))
                .with_allow_http(s.s3_allow_http);
            let retry = object_store::RetryConfig {
                backoff: object_store::BackoffConfig::default(),
                max_retries: 2,
                retry_timeout: timeout,
            };
            let mut b = AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .with_client_options(client)
                .with_retry(retry)
                .with_allow_http(s.s3_allow_http);
            // Empty settings fall back to the AWS_* variables read by `from_env`.
            if !s.s3_endpoint.is_empty() {
                b = b.with_endpoint(&s.s3_endpoint);
            }
            if !s.s3_region.is_empty() {
                b = b.with_region(&s.s3_region);
            }
            if !s.s3_access_key_id.is_empty() {
                b = b.with_access_key_id(&s.s3_access_key_id);
            }
            if !s.s3_secret_access_key.is_empty() {
                b = b.with_secret_access_key(&s.s3_secret_access_key);
            }
            let s3 = b
                .build()
                .map_err(|e| Error::Invalid(format!("S3 cold tier: {e}")))?;
            let prefix = parsed.path().trim_matches('/');
            if prefix.is_empty() {
                Ok(Arc::new(s3))
            } else {
                Ok(Arc::new(object_store::prefix::PrefixStore::new(s3, prefix)))
            }
        }
        other => Err(Error::Invalid(format!(
            "cold_url scheme '{other}' is not supported; use file:///path or s3://bucket/prefix"
        ))),
    }
}

/// The URL of the cold tier: `cold_url`, or `file://<data_dir>/cold` (created) when unset.
pub(crate) fn url_for(s: &ColdSettings, data_dir: &std::path::Path) -> Result<String> {
    if !s.cold_url.is_empty() {
        return Ok(s.cold_url.clone());
    }
    let dir = data_dir.join("cold");
    std::fs::create_dir_all(&dir).map_err(|e| {
        Error::Invalid(format!(
            "cannot create cold directory {}: {e}",
            dir.display()
        ))
    })?;
    let dir = dir
        .canonicalize()
        .map_err(|e| Error::Invalid(format!("cold directory {}: {e}", dir.display())))?;
    Ok(format!("file://{}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_format::{find_in_block, Kind, SegmentBuilder};

    /// Entry `i`'s value: `len` bytes that do not compress.
    fn value(i: u8, len: usize) -> Vec<u8> {
        let mut x = u64::from(i) + 1;
        (0..len)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 56) as u8
            })
            .collect()
    }

    /// A segment of `n` entries of `len` bytes, one per block, in an in-memory store; the
    /// refs of its blocks. `damaged`: a block whose first stored byte is flipped.
    async fn segment(
        n: u8,
        len: usize,
        damaged: Option<usize>,
    ) -> (Arc<Cold>, Arc<Counters>, Vec<BlockRef>) {
        let mut b = SegmentBuilder::new(7, 64, 1);
        for i in 0..n {
            b.push(Kind::String, &[b'k', i], &value(i, len), 0).unwrap();
        }
        let seg = b.finish().unwrap();
        let refs: Vec<BlockRef> = seg.refs.iter().map(|(_, r)| *r).collect();
        let mut bytes = seg.bytes;
        if let Some(d) = damaged {
            bytes[refs[d].offset as usize] ^= 0xff;
        }
        let store = Arc::new(object_store::memory::InMemory::new());
        store
            .put(&segment_path(7), PutPayload::from(bytes))
            .await
            .unwrap();
        let counters = Arc::new(Counters::default());
        let s = ColdSettings::default();
        let cold = Cold::new(store, "memory".into(), &s, Arc::clone(&counters));
        (Arc::new(cold), counters, refs)
    }

    fn gets(c: &Counters) -> u64 {
        c.object_store_gets.load(Ordering::Relaxed)
    }

    #[tokio::test]
    async fn blocks_end_to_end_come_in_one_get_and_a_damaged_one_fails_alone() {
        let (cold, counters, refs) = segment(4, 100, Some(2)).await;
        assert_eq!(refs.len(), 4);
        let got = cold.get_blocks(&refs).await;
        assert_eq!(gets(&counters), 1);
        for (i, g) in got.iter().enumerate() {
            if i == 2 {
                assert!(g.is_err(), "the damaged block read back");
                continue;
            }
            let raw = g.as_ref().unwrap();
            let e = find_in_block(raw, &[b'k', i as u8]).unwrap().unwrap();
            assert_eq!(e.value, value(i as u8, 100));
        }
        // Blocks that do not follow each other are asked for apart.
        let got = cold.get_blocks(&[refs[3], refs[0]]).await;
        assert!(got.iter().all(|g| g.is_ok()));
        assert_eq!(gets(&counters), 3);
        assert!(cold.inflight.lock().is_empty());
    }

    #[tokio::test]
    async fn a_run_asks_for_at_most_run_bytes_max_at_once() {
        // Three blocks of 1.5 MiB: the first two fit in one GET, the third takes another.
        let (cold, counters, refs) = segment(3, 3 << 19, None).await;
        let got = cold.get_blocks(&refs).await;
        for (i, g) in got.iter().enumerate() {
            let raw = g.as_ref().unwrap();
            let e = find_in_block(raw, &[b'k', i as u8]).unwrap().unwrap();
            assert_eq!(e.value, value(i as u8, 3 << 19));
        }
        assert_eq!(gets(&counters), 2);
    }
}
