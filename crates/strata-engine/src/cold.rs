//! The cold tier: immutable segment objects in an object store, read one block at a time.
//!
//! Nothing here waits on the object store without a timeout, and concurrent misses on the
//! same block share one GET (a single-flight map keyed by segment and block).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt, Shared};
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use parking_lot::Mutex;
use strata_format::BlockRef;

use crate::{EngineOptions, Error, Result};

type BlockFuture = Shared<BoxFuture<'static, Result<Bytes>>>;

/// Object-store request counters.
#[derive(Debug, Default)]
pub(crate) struct ColdCounters {
    pub(crate) gets: AtomicU64,
    pub(crate) puts: AtomicU64,
    pub(crate) deletes: AtomicU64,
    pub(crate) lists: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) get_bytes: AtomicU64,
    pub(crate) put_bytes: AtomicU64,
    pub(crate) get_micros_total: AtomicU64,
    pub(crate) shared_fetches: AtomicU64,
    /// Reads that waited for a slot (`cold_reads_max` were in flight).
    pub(crate) read_waits: AtomicU64,
    /// Most reads ever in flight at once.
    pub(crate) reads_in_flight_peak: AtomicU64,
}

pub(crate) struct Cold {
    store: Arc<dyn ObjectStore>,
    timeout: Duration,
    inflight: Mutex<HashMap<(u64, u32), BlockFuture>>,
    /// One permit per object-store read in flight (`cold_reads_max`).
    read_slots: tokio::sync::Semaphore,
    read_slots_max: usize,
    pub(crate) counters: ColdCounters,
    pub(crate) url: String,
}

pub(crate) fn segment_path(id: u64) -> Path {
    Path::from(format!("segments/{id:016x}.seg"))
}

fn parse_segment_path(p: &Path) -> Option<u64> {
    let name = p.filename()?;
    let hex = name.strip_suffix(".seg")?;
    u64::from_str_radix(hex, 16).ok()
}

impl Cold {
    pub(crate) fn open(o: &EngineOptions) -> Result<Self> {
        let default_url;
        let url = match &o.cold_url {
            Some(u) => u.as_str(),
            None => {
                let dir = o.data_dir.join("cold");
                std::fs::create_dir_all(&dir).map_err(|e| {
                    Error::Invalid(format!(
                        "cannot create cold directory {}: {e}",
                        dir.display()
                    ))
                })?;
                let dir = dir
                    .canonicalize()
                    .map_err(|e| Error::Invalid(e.to_string()))?;
                default_url = format!("file://{}", dir.display());
                default_url.as_str()
            }
        };
        let store = build_store(url, o)?;
        Ok(Cold {
            store,
            timeout: Duration::from_millis(o.cold_request_timeout_ms.max(1)),
            inflight: Mutex::new(HashMap::new()),
            read_slots: tokio::sync::Semaphore::new(o.cold_reads_max.max(1)),
            read_slots_max: o.cold_reads_max.max(1),
            counters: ColdCounters::default(),
            url: url.to_string(),
        })
    }

    async fn timed<T>(
        &self,
        what: &str,
        f: impl std::future::Future<Output = object_store::Result<T>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.timeout, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(object_store::Error::NotFound { path, .. })) => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                Err(Error::ColdUnavailable(format!(
                    "{what}: object {path} not found"
                )))
            }
            Ok(Err(e)) => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                Err(Error::ColdUnavailable(format!("{what}: {e}")))
            }
            Err(_) => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
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
        self.counters.puts.fetch_add(1, Ordering::Relaxed);
        let payload = PutPayload::from(bytes);
        self.timed("segment upload", self.store.put(&segment_path(id), payload))
            .await?;
        self.counters.put_bytes.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }

    /// Fetches a whole segment object (for rewriting it).
    pub(crate) async fn get_segment(&self, id: u64) -> Result<Bytes> {
        self.counters.gets.fetch_add(1, Ordering::Relaxed);
        let path = segment_path(id);
        let _slot = self.read_slot().await?;
        let res = self.timed("segment read", self.store.get(&path)).await?;
        let bytes = self.timed("segment read", res.bytes()).await?;
        self.counters
            .get_bytes
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(bytes)
    }

    pub(crate) async fn delete_segment(&self, id: u64) -> Result<()> {
        self.counters.deletes.fetch_add(1, Ordering::Relaxed);
        self.timed("segment delete", self.store.delete(&segment_path(id)))
            .await
    }

    pub(crate) async fn list_segments(&self) -> Result<Vec<u64>> {
        self.counters.lists.fetch_add(1, Ordering::Relaxed);
        let prefix = Path::from("segments");
        let metas: Vec<_> = self
            .timed("segment list", self.store.list(Some(&prefix)).try_collect())
            .await?;
        Ok(metas
            .iter()
            .filter_map(|m| parse_segment_path(&m.location))
            .collect())
    }

    /// Fetches, verifies and decompresses one block; concurrent calls for the same block
    /// share one request.
    pub(crate) async fn get_block(self: &Arc<Self>, r: &BlockRef) -> Result<Bytes> {
        let key = (r.segment_id, r.block);
        let fut = {
            let mut map = self.inflight.lock();
            if let Some(f) = map.get(&key) {
                self.counters.shared_fetches.fetch_add(1, Ordering::Relaxed);
                f.clone()
            } else {
                let this = Arc::clone(self);
                let r = *r;
                let f = async move {
                    let out = this.fetch_block(&r).await;
                    this.inflight.lock().remove(&(r.segment_id, r.block));
                    out
                }
                .boxed()
                .shared();
                map.insert(key, f.clone());
                f
            }
        };
        fut.await
    }

    /// Waits for a turn to read from the object store, at most the request timeout (so a
    /// read waits at most twice that in all).
    async fn read_slot(&self) -> Result<tokio::sync::SemaphorePermit<'_>> {
        if self.read_slots.available_permits() == 0 {
            self.counters.read_waits.fetch_add(1, Ordering::Relaxed);
        }
        let slot = match tokio::time::timeout(self.timeout, self.read_slots.acquire()).await {
            Ok(Ok(slot)) => slot,
            Ok(Err(_)) => return Err(Error::Internal("object-store read slots closed".into())),
            Err(_) => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                return Err(Error::ColdUnavailable(format!(
                    "all {} object-store read slots stayed busy for {} ms",
                    self.read_slots_max,
                    self.timeout.as_millis()
                )));
            }
        };
        let in_flight = (self.read_slots_max - self.read_slots.available_permits()) as u64;
        self.counters
            .reads_in_flight_peak
            .fetch_max(in_flight, Ordering::Relaxed);
        Ok(slot)
    }

    async fn fetch_block(&self, r: &BlockRef) -> Result<Bytes> {
        let _slot = self.read_slot().await?;
        let start = Instant::now();
        self.counters.gets.fetch_add(1, Ordering::Relaxed);
        let stored = self
            .timed(
                "block read",
                self.store.get_range(&segment_path(r.segment_id), r.range()),
            )
            .await?;
        self.counters
            .get_bytes
            .fetch_add(stored.len() as u64, Ordering::Relaxed);
        self.counters
            .get_micros_total
            .fetch_add(start.elapsed().as_micros() as u64, Ordering::Relaxed);
        let r = *r;
        let raw = if stored.len() > 1 << 20 {
            tokio::task::spawn_blocking(move || strata_format::decode_block(&r, &stored))
                .await
                .map_err(|e| Error::Internal(format!("block decode task: {e}")))??
        } else {
            strata_format::decode_block(&r, &stored)?
        };
        Ok(Bytes::from(raw))
    }
}

pub(crate) fn build_store(url: &str, o: &EngineOptions) -> Result<Arc<dyn ObjectStore>> {
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
            let fs = object_store::local::LocalFileSystem::new_with_prefix(&dir)
                .map_err(|e| Error::Invalid(format!("cold directory {}: {e}", dir.display())))?;
            Ok(Arc::new(fs))
        }
        "s3" => {
            let bucket = parsed
                .host_str()
                .ok_or_else(|| Error::Invalid(format!("cold_url '{url}' names no bucket")))?;
            let timeout = Duration::from_millis(o.cold_request_timeout_ms.max(1));
            let client = object_store::ClientOptions::new()
                .with_timeout(timeout)
                .with_connect_timeout(timeout.min(Duration::from_secs(5)))
                .with_allow_http(o.s3.allow_http);
            let retry = object_store::RetryConfig {
                backoff: object_store::BackoffConfig::default(),
                max_retries: 2,
                retry_timeout: timeout,
            };
            let mut b = object_store::aws::AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .with_client_options(client)
                .with_retry(retry)
                .with_allow_http(o.s3.allow_http);
            if let Some(e) = &o.s3.endpoint {
                b = b.with_endpoint(e);
            }
            if let Some(r) = &o.s3.region {
                b = b.with_region(r);
            }
            if let Some(k) = &o.s3.access_key_id {
                b = b.with_access_key_id(k);
            }
            if let Some(k) = &o.s3.secret_access_key {
                b = b.with_secret_access_key(k);
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
