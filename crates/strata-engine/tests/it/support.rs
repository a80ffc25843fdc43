//! Shared helpers: keys of database 0, small-budget options, the real warm store, a seeded
//! RNG, and an S3 server on loopback.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use strata_engine::{Clock, Engine, Key, Parts, PutOptions, Settings};

/// The members (or list elements) of a stored set or list value, each owned.
pub fn members(value: &[u8]) -> Vec<Vec<u8>> {
    strata_format::members::decode_members(value)
        .unwrap()
        .into_iter()
        .map(<[u8]>::to_vec)
        .collect()
}

/// The live value `v` as the test type `T` it was made as.
pub fn live_as<T: strata_engine::LiveValue>(v: &mut dyn strata_engine::LiveValue) -> &mut T {
    let any: &mut dyn std::any::Any = v;
    any.downcast_mut::<T>().expect("the test's own live value")
}

/// The key `client` of database 0.
pub fn key(client: impl AsRef<[u8]>) -> Key {
    Key::new(0, 0, client.as_ref())
}

/// Writes `key:0000` .. `key:{n-1}`, `value_bytes` each, every byte the key's number mod 251.
pub async fn fill(engine: &Engine, n: usize, value_bytes: usize) {
    fill_range(engine, 0..n, value_bytes).await;
}

/// [`fill`] of the keys numbered `keys`.
pub async fn fill_range(engine: &Engine, keys: std::ops::Range<usize>, value_bytes: usize) {
    for i in keys {
        let v = Bytes::from(vec![(i % 251) as u8; value_bytes]);
        engine
            .put(&key(format!("key:{i:04}")), v, PutOptions::default())
            .await
            .unwrap()
            .durable(engine)
            .await
            .unwrap();
    }
}

/// Deletes the keys numbered `keys` (as [`fill`] names them), each acknowledged.
pub async fn delete_numbered(engine: &Engine, keys: impl IntoIterator<Item = usize>) {
    for i in keys {
        engine
            .delete(&key(format!("key:{i:04}")))
            .await
            .acked(engine)
            .await
            .unwrap();
    }
}

/// [`fill`], then one background round, which demotes what the warm budget does not hold.
pub async fn fill_and_demote(engine: &Engine, n: usize, value_bytes: usize) {
    fill(engine, n, value_bytes).await;
    engine.run_background_once().await.unwrap();
}

/// A store's directory and settings.
#[derive(Clone)]
pub struct Opts {
    pub dir: PathBuf,
    pub s: Settings,
    /// Whether the engine runs its own background task (off: the test runs rounds).
    pub background: bool,
}

/// Opens the store of `o` on the real warm store (RocksDB).
pub async fn open(o: Opts) -> strata_engine::Result<Engine> {
    Engine::open_with(parts(o)).await
}

/// As [`open`], with time from `clock`.
pub async fn open_with_clock(o: Opts, clock: Arc<dyn Clock>) -> strata_engine::Result<Engine> {
    let mut p = parts(o);
    p.clock = clock;
    Engine::open_with(p).await
}

/// The real warm store (RocksDB) of the store in `dir`.
pub fn rocks(dir: &Path) -> strata_rocks::RocksWarm {
    strata_rocks::RocksWarm::open(
        &strata_engine::warm_dir(dir),
        &strata_rocks::RocksSettings {
            rocksdb_block_cache_bytes: 1 << 20,
            ..Default::default()
        },
    )
    .expect("open RocksDB")
}

/// The parts of the store of `o`, with RocksDB as its warm store.
pub fn parts(o: Opts) -> Parts {
    let warm = rocks(&o.dir);
    let mut p = Parts::new(o.dir, o.s, Arc::new(warm));
    p.background = o.background;
    p
}

/// Options with budgets small enough that demotion happens after a few KiB, and no
/// background task (tests run background rounds explicitly, so runs replay exactly).
pub fn small_options(dir: &Path) -> Opts {
    let mut s = Settings::default();
    s.hot.hot_bytes_max = 16 << 10;
    s.hot.hot_shard_count = 2;
    s.warm.warm_bytes_max = 8 << 10;
    // Tests write far past the budget between explicit demotion rounds; the hard limit has
    // its own test against the binary (tests/python/test_faults.py).
    s.warm.warm_bytes_hard_max = 1 << 30;
    // Prefetch fills DRAM in the background; these tests check tiers exactly, so it is off
    // here and tested on its own (prefetch.rs).
    s.prefetch.prefetch = false;
    s.cold.block_bytes = 1024;
    s.cold.segment_bytes_max = 4 << 10;
    s.warm.background_interval_ms = 3_600_000;
    Opts {
        dir: dir.to_path_buf(),
        s,
        background: false,
    }
}

pub use strata_testkit::{free_port, Rng};

/// A moto S3 server on loopback, killed when dropped.
pub struct S3Server {
    child: Child,
    pub port: u16,
}

impl S3Server {
    pub fn start() -> S3Server {
        let port = free_port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("moto_server must be installed (pip install 'moto[server]'); scripts/install-deps does it");
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "moto_server did not start on port {port}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        S3Server { child, port }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Creates a bucket with one unsigned PUT (moto accepts it).
    pub fn create_bucket(&self, name: &str) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(s, "PUT /{name} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        assert!(
            resp.starts_with("HTTP/1.1 200"),
            "bucket creation failed: {resp}"
        );
    }

    /// Counts the objects under `prefix` in `bucket` (an unsigned ListObjectsV2).
    pub fn object_count(&self, bucket: &str, prefix: &str) -> usize {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(s, "GET /{bucket}?list-type=2&prefix={prefix} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        resp.matches("<Key>").count()
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for a write's ticket, as a client's acknowledgement would: turns the result of a
/// write into what it returned once durable.
pub trait Acked<T> {
    fn acked(self, engine: &Engine) -> impl std::future::Future<Output = strata_engine::Result<T>>;
}

impl<T> Acked<T> for strata_engine::Result<strata_engine::Written<T>> {
    async fn acked(self, engine: &Engine) -> strata_engine::Result<T> {
        self?.durable(engine).await
    }
}

/// Injected failures: while on, each operation fails with probability 1 / `one_in`, drawn
/// from a seeded generator (so a failing run replays from its seed).
#[derive(Debug)]
pub struct Faults {
    on: std::sync::atomic::AtomicBool,
    one_in: u64,
    state: std::sync::Mutex<u64>,
    pub injected: std::sync::atomic::AtomicU64,
    /// While set, every sync of the warm store's log fails (as a failing disk's fsync).
    pub syncs_fail: std::sync::atomic::AtomicBool,
    /// While set, an object PUT lands and then reports a failure (a reply lost on the way).
    pub puts_land_then_fail: std::sync::atomic::AtomicBool,
}

impl Faults {
    pub fn new(seed: u64, one_in: u64) -> Arc<Faults> {
        Arc::new(Faults {
            on: false.into(),
            one_in: one_in.max(1),
            state: std::sync::Mutex::new(seed | 1),
            injected: 0.into(),
            syncs_fail: false.into(),
            puts_land_then_fail: false.into(),
        })
    }

    pub fn set(&self, on: bool) {
        self.on.store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether the operation about to run fails.
    pub fn fail(&self) -> bool {
        if !self.on.load(std::sync::atomic::Ordering::SeqCst) {
            return false;
        }
        let mut x = self.state.lock().unwrap();
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        let fail = (*x).is_multiple_of(self.one_in);
        if fail {
            self.injected
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        fail
    }
}

/// The real warm store (RocksDB) whose batch writes fail when `faults` says so, before
/// anything is written (as a full or failing disk refuses a write).
pub struct FailingWarm {
    pub inner: strata_rocks::RocksWarm,
    pub faults: Arc<Faults>,
}

impl strata_warm::WarmStore for FailingWarm {
    fn get(&self, f: strata_warm::Family, key: &[u8]) -> strata_warm::Result<Option<Bytes>> {
        self.inner.get(f, key)
    }
    fn multi_get(
        &self,
        f: strata_warm::Family,
        keys: &[&[u8]],
    ) -> Vec<strata_warm::Result<Option<Bytes>>> {
        self.inner.multi_get(f, keys)
    }
    fn batch(&self) -> Box<dyn strata_warm::Batch> {
        self.inner.batch()
    }
    fn write(&self, batch: Box<dyn strata_warm::Batch>, sync: bool) -> strata_warm::Result<()> {
        if self.faults.fail() {
            return Err(strata_warm::StoreError::Unavailable(
                "injected write failure".into(),
            ));
        }
        self.inner.write(batch, sync)
    }
    fn cursor<'a>(
        &'a self,
        f: strata_warm::Family,
        bounds: strata_warm::Bounds,
        view: Option<&'a dyn strata_warm::View>,
    ) -> Box<dyn strata_warm::Cursor + 'a> {
        self.inner.cursor(f, bounds, view)
    }
    fn view(&self) -> Arc<dyn strata_warm::View> {
        self.inner.view()
    }
    fn sync_log(&self) -> strata_warm::Result<()> {
        if self
            .faults
            .syncs_fail
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(strata_warm::StoreError::Unavailable(
                "injected fsync failure".into(),
            ));
        }
        self.inner.sync_log()
    }
    fn flush_log(&self) -> strata_warm::Result<()> {
        self.inner.flush_log()
    }
    fn flush(&self) -> strata_warm::Result<()> {
        self.inner.flush()
    }
    fn checkpoint(&self, dir: &Path) -> strata_warm::Result<()> {
        self.inner.checkpoint(dir)
    }
    fn last_sequence(&self) -> u64 {
        self.inner.last_sequence()
    }
    fn changes_after(
        &self,
        after: u64,
    ) -> strata_warm::Result<Box<dyn Iterator<Item = strata_warm::Result<strata_warm::Changes>> + '_>>
    {
        self.inner.changes_after(after)
    }
    fn log_bytes_dropped_at_open(&self) -> u64 {
        self.inner.log_bytes_dropped_at_open()
    }
}

/// An object store whose requests fail when `faults` says so, before they reach `inner`
/// (as an unreachable or erroring S3 endpoint does).
#[derive(Debug)]
pub struct FailingStore {
    pub inner: Arc<dyn object_store::ObjectStore>,
    pub faults: Arc<Faults>,
}

impl std::fmt::Display for FailingStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FailingStore({})", self.inner)
    }
}

fn injected() -> object_store::Error {
    object_store::Error::Generic {
        store: "FailingStore",
        source: "injected request failure".into(),
    }
}

#[async_trait::async_trait]
impl object_store::ObjectStore for FailingStore {
    async fn put_opts(
        &self,
        location: &object_store::path::Path,
        payload: object_store::PutPayload,
        opts: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        if self.faults.fail() {
            return Err(injected());
        }
        let put = self.inner.put_opts(location, payload, opts).await;
        let lost = &self.faults.puts_land_then_fail;
        if put.is_ok() && lost.swap(false, std::sync::atomic::Ordering::SeqCst) {
            self.faults
                .injected
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Err(injected());
        }
        put
    }
    async fn put_multipart_opts(
        &self,
        location: &object_store::path::Path,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        if self.faults.fail() {
            return Err(injected());
        }
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(
        &self,
        location: &object_store::path::Path,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        if self.faults.fail() {
            return Err(injected());
        }
        self.inner.get_opts(location, options).await
    }
    fn delete_stream(
        &self,
        locations: futures::stream::BoxStream<
            'static,
            object_store::Result<object_store::path::Path>,
        >,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::path::Path>> {
        use futures::StreamExt;
        if self.faults.fail() {
            return locations.map(|_| Err(injected())).boxed();
        }
        self.inner.delete_stream(locations)
    }
    fn list(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        use futures::StreamExt;
        if self.faults.fail() {
            return futures::stream::once(async { Err(injected()) }).boxed();
        }
        self.inner.list(prefix)
    }
    async fn list_with_delimiter(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> object_store::Result<object_store::ListResult> {
        if self.faults.fail() {
            return Err(injected());
        }
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(
        &self,
        from: &object_store::path::Path,
        to: &object_store::path::Path,
        options: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        if self.faults.fail() {
            return Err(injected());
        }
        self.inner.copy_opts(from, to, options).await
    }
}

/// Opens the store of `o` with `faults` injected into its warm writes and its object store
/// (a local directory under the store's own).
pub async fn open_failing(
    o: Opts,
    clock: Arc<dyn Clock>,
    warm_faults: Arc<Faults>,
    cold_faults: Arc<Faults>,
) -> strata_engine::Result<Engine> {
    let inner = rocks(&o.dir);
    let cold_dir = o.dir.join("cold");
    let background = o.background;
    let mut p = Parts::new(
        o.dir,
        o.s,
        Arc::new(FailingWarm {
            inner,
            faults: warm_faults,
        }),
    );
    std::fs::create_dir_all(&cold_dir).unwrap();
    let local = object_store::local::LocalFileSystem::new_with_prefix(&cold_dir).unwrap();
    p.cold = Some(Arc::new(FailingStore {
        inner: Arc::new(local),
        faults: cold_faults,
    }));
    p.clock = clock;
    p.background = background;
    Engine::open_with(p).await
}
