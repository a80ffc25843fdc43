//! Shared helpers: small-budget options, a seeded RNG, and an S3 server on loopback.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use strata_engine::{Engine, EngineOptions, PutOptions};

/// Writes `key:0000` .. `key:{n-1}`, `value_bytes` each, every byte the key's number mod 251.
pub async fn fill(engine: &Engine, n: usize, value_bytes: usize) {
    for i in 0..n {
        let v = Bytes::from(vec![(i % 251) as u8; value_bytes]);
        engine
            .put(format!("key:{i:04}").as_bytes(), v, PutOptions::default())
            .await
            .unwrap();
    }
}

/// [`fill`], then one background round, which demotes what the warm budget does not hold.
pub async fn fill_and_demote(engine: &Engine, n: usize, value_bytes: usize) {
    fill(engine, n, value_bytes).await;
    engine.run_background_once().await.unwrap();
}

/// Options with budgets small enough that demotion happens after a few KiB, and no
/// background timer (tests run background rounds explicitly, so runs replay exactly).
pub fn small_options(dir: &Path) -> EngineOptions {
    let mut o = EngineOptions::new(dir);
    o.hot_bytes_max = 16 << 10;
    o.hot_shard_count = 2;
    o.warm_bytes_max = 8 << 10;
    // Tests write far past the budget between explicit demotion rounds; the hard limit has
    // its own test against the binary (tests/python/test_faults.py).
    o.warm_bytes_hard_max = 1 << 30;
    // Prefetch fills DRAM in the background; these tests check tiers exactly, so it is off
    // here and tested on its own (prefetch.rs).
    o.prefetch = false;
    o.block_bytes = 1024;
    o.segment_bytes_max = 4 << 10;
    o.background_interval_ms = 3_600_000;
    o.rocksdb_block_cache_bytes = 1 << 20;
    o
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
