//! `strata-bench compare`: the table users choose a storage engine by. Every contender runs
//! the same workload on this machine in one run, in front of the same S3-compatible server
//! on loopback (moto):
//!
//! - Strata with its three tiers (DRAM, RocksDB, the object store) and its default policy,
//!   with prefetch on (the default) and off;
//! - a DRAM cache: `redis-server`, `maxmemory` = Strata's DRAM budget (plus what an empty
//!   Redis holds), `allkeys-lru`, cache-aside: a miss reads the object store and fills Redis,
//!   a write goes to the object store and then to Redis;
//! - a filesystem cache: one file per key, capped at Strata's warm budget, LRU, cache-aside
//!   the same way;
//! - the object store read directly.
//!
//! Rows: write throughput as the data outgrows DRAM and then the disk budget; hot and cold
//! reads; the effective hit rate on the conversation trace (a block counts only if loading
//! it beat recomputing it, the `KVC.MATCH LOADTIME` rule); bytes held per tier and their
//! cost; the physical references; and KV-cache reads with each contender in a memory cgroup
//! smaller than the working set (`cgroup.rs`).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::Serialize;

use crate::report::{self, progress, Summary};
use crate::resp::{Client, Value};
use crate::servers::{free_port, pin, redis_server_with, strata_server, wait_port, Moto, Proc};

#[derive(clap::Args)]
pub struct Args {
    /// Small sizes, done in under a minute: proves the command works (CI runs it); its
    /// figures mean little.
    #[arg(long)]
    quick: bool,
    /// The strata binary to run.
    #[arg(long, default_value = "target/release/strata")]
    strata: PathBuf,
    /// Prefill rate a cache must beat: a block found counts as a hit only if loading it took
    /// less than recomputing its tokens at this rate (tokens per second).
    #[arg(long, default_value_t = 8000.0)]
    prefill_tokens_per_sec: f64,
    /// The LLM serving trace (Mooncake's conversation trace, shipped in `traces/`).
    #[arg(long, default_value = "traces/conversation_trace.jsonl")]
    trace: PathBuf,
    /// Report file name (without extension).
    #[arg(long, default_value = "compare")]
    report: String,
}

/// The sizes of one run, printed in the report.
#[derive(Serialize, Clone, Copy)]
struct Sizes {
    value_bytes: usize,
    /// Strata's `hot_bytes_max`; Redis's `maxmemory` on top of an empty Redis.
    hot_bytes: u64,
    /// Strata's `warm_bytes_max`; the file cache's cap.
    warm_bytes: u64,
    /// Keys written: twice what DRAM and the disk budget hold together.
    keys: usize,
    /// Writes per pipeline (and object-store PUTs in flight at once).
    batch: usize,
    /// Cache-aside writes timed (their rate is the object store's whatever the cache holds).
    aside_writes: usize,
    hot_reads: usize,
    sessions: usize,
    session_keys: usize,
    think_ms: u64,
    trace_requests: usize,
    block_bytes: usize,
    block_tokens: usize,
}

impl Sizes {
    fn new(quick: bool) -> Sizes {
        let value_bytes = 1024;
        let (hot_bytes, warm_bytes) = if quick {
            (256 << 10, 512 << 10)
        } else {
            (2 << 20, 4 << 20)
        };
        Sizes {
            value_bytes,
            hot_bytes,
            warm_bytes,
            keys: (2 * (hot_bytes + warm_bytes) / value_bytes as u64) as usize,
            batch: 16,
            aside_writes: if quick { 64 } else { 512 },
            hot_reads: if quick { 200 } else { 2000 },
            sessions: if quick { 4 } else { 32 },
            session_keys: 16,
            think_ms: 2,
            trace_requests: if quick { 30 } else { 1000 },
            block_bytes: 4096,
            block_tokens: 16,
        }
    }

    /// Keys that fit in half of DRAM's budget (an entry costs its value, key and ~100 bytes).
    fn hot_set(&self) -> usize {
        (self.hot_bytes / (self.value_bytes as u64 + 128) / 2) as usize
    }

    /// Which stage key `i` is written in.
    fn stage_of(&self, i: usize) -> usize {
        let bytes = (i * self.value_bytes) as u64;
        if bytes < self.hot_bytes {
            0
        } else if bytes < self.hot_bytes + self.warm_bytes {
            1
        } else {
            2
        }
    }
}

const STAGES: [&str; 3] = [
    "data < DRAM",
    "DRAM < data < DRAM + disk",
    "data > DRAM + disk",
];

/// List prices the cost rows use, per GB-month and per million requests; printed beside the
/// figures (cloud list prices of 2026, rounded: memory of a memory-optimised instance,
/// local NVMe, S3 Standard).
const PRICES: Prices = Prices {
    dram_gb_month: 4.00,
    nvme_gb_month: 0.10,
    object_gb_month: 0.023,
    object_get_per_million: 0.40,
    object_put_per_million: 5.00,
};

#[derive(Serialize, Clone, Copy)]
struct Prices {
    dram_gb_month: f64,
    nvme_gb_month: f64,
    object_gb_month: f64,
    object_get_per_million: f64,
    object_put_per_million: f64,
}

/// Bytes a contender holds in each medium.
#[derive(Serialize, Default, Clone, Copy)]
struct Held {
    dram: u64,
    disk: u64,
    object: u64,
}

impl Held {
    /// Dollars per month for a million entries stored as these bytes hold `entries`.
    fn cost_per_million(&self, entries: usize) -> f64 {
        let gb = |b: u64| b as f64 / 1e9;
        let month = gb(self.dram) * PRICES.dram_gb_month
            + gb(self.disk) * PRICES.nvme_gb_month
            + gb(self.object) * PRICES.object_gb_month;
        month / entries.max(1) as f64 * 1e6
    }
}

/// A value's bytes: pseudo-random (as real data, incompressible), fixed by its key.
fn value_of(key: &str, len: usize) -> Bytes {
    let mut x = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    }) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    Bytes::from(v)
}

fn data_key(i: usize) -> String {
    format!("k{i:08}")
}

/// Where a cache-aside contender's read was served.
#[derive(Clone, Copy, PartialEq)]
enum From {
    Cache,
    Store,
    Missing,
}

/// The file cache: one file per key, least recently used evicted past `cap` bytes.
struct FileCache {
    dir: PathBuf,
    cap: u64,
    used: u64,
    tick: u64,
    entries: HashMap<String, (u64, u64)>,
    order: BTreeMap<u64, String>,
}

impl FileCache {
    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(key)
    }

    fn touch(&mut self, key: &str, len: u64) {
        self.tick += 1;
        if let Some((t, l)) = self.entries.insert(key.to_string(), (self.tick, len)) {
            self.order.remove(&t);
            self.used -= l;
        }
        self.order.insert(self.tick, key.to_string());
        self.used += len;
    }

    fn get(&mut self, key: &str) -> anyhow::Result<Option<Bytes>> {
        let Some(&(_, len)) = self.entries.get(key) else {
            return Ok(None);
        };
        let v = std::fs::read(self.path(key))?;
        self.touch(key, len);
        Ok(Some(Bytes::from(v)))
    }

    fn put(&mut self, key: &str, v: &[u8]) -> anyhow::Result<()> {
        std::fs::write(self.path(key), v)?;
        self.touch(key, v.len() as u64);
        while self.used > self.cap {
            let Some((_, old)) = self.order.pop_first() else {
                break;
            };
            if let Some((_, l)) = self.entries.remove(&old) {
                self.used -= l;
                std::fs::remove_file(self.path(&old))?;
            }
        }
        Ok(())
    }
}

enum Kind {
    Strata { port: u16, client: Client },
    Redis { client: Client },
    Files(FileCache),
    Direct,
}

/// One contender and its connection to the shared object store.
struct Contender {
    name: String,
    kind: Kind,
    store: Arc<dyn ObjectStore>,
    /// Where its own objects go (the data set itself is `data/`, written once by the direct
    /// contender, read by every cache-aside one).
    prefix: String,
    store_gets: u64,
    store_puts: u64,
    /// Keys it holds (entries, for the cost per million).
    entries: usize,
    _procs: Vec<Proc>,
}

fn object_path(dir: &str, key: &str) -> object_store::path::Path {
    object_store::path::Path::from(format!("{dir}/{key}"))
}

/// The object at `path`, or `None` if there is none.
async fn get_if_present(
    store: &Arc<dyn ObjectStore>,
    path: &object_store::path::Path,
) -> anyhow::Result<Option<Bytes>> {
    match store.get(path).await {
        Ok(r) => Ok(Some(r.bytes().await?)),
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

impl Contender {
    fn is_aside(&self) -> bool {
        matches!(self.kind, Kind::Redis { .. } | Kind::Files(_))
    }

    /// Writes `keys` (values from `value_of`): Strata in one pipeline of SETs; the others
    /// PUT every value to the object store under `dir` (all in flight at once), then the
    /// cache-aside ones fill their cache.
    async fn write(&mut self, dir: &str, keys: &[String], len: usize) -> anyhow::Result<()> {
        let vals: Vec<Bytes> = keys.iter().map(|k| value_of(k, len)).collect();
        if let Kind::Strata { client, .. } = &mut self.kind {
            let cmds: Vec<Vec<&[u8]>> = keys
                .iter()
                .zip(&vals)
                .map(|(k, v)| vec![&b"SET"[..], k.as_bytes(), v])
                .collect();
            client.pipeline(&cmds)?;
            return Ok(());
        }
        let store = &self.store;
        let puts = keys.iter().zip(&vals).map(|(k, v)| {
            let path = object_path(dir, k);
            let v = PutPayload::from(v.clone());
            async move { store.put(&path, v).await }
        });
        for r in crate::kvcache::join_in_batches(puts).await {
            r?;
        }
        self.store_puts += keys.len() as u64;
        self.fill(keys, &vals)
    }

    /// Puts values into a cache-aside contender's cache (nothing for the others).
    fn fill(&mut self, keys: &[String], vals: &[Bytes]) -> anyhow::Result<()> {
        match &mut self.kind {
            Kind::Redis { client } => {
                let cmds: Vec<Vec<&[u8]>> = keys
                    .iter()
                    .zip(vals)
                    .map(|(k, v)| vec![&b"SET"[..], k.as_bytes(), v])
                    .collect();
                client.pipeline(&cmds)?;
            }
            Kind::Files(fc) => {
                for (k, v) in keys.iter().zip(vals) {
                    fc.put(k, v)?;
                }
            }
            Kind::Strata { .. } | Kind::Direct => {}
        }
        Ok(())
    }

    async fn store_get(&mut self, dir: &str, key: &str) -> anyhow::Result<Option<Bytes>> {
        self.store_gets += 1;
        get_if_present(&self.store, &object_path(dir, key)).await
    }

    /// Reads one key: from the cache, else from the object store under `dir` (filling the
    /// cache); Strata reads it from whichever tier holds it.
    async fn read(&mut self, dir: &str, key: &str) -> anyhow::Result<(Option<Bytes>, From)> {
        let cached = match &mut self.kind {
            Kind::Strata { client, .. } => {
                return Ok(match client.call(&[b"GET", key.as_bytes()])? {
                    Value::Bulk(v) => (Some(Bytes::from(v)), From::Cache),
                    _ => (None, From::Missing),
                });
            }
            Kind::Redis { client } => match client.call(&[b"GET", key.as_bytes()])? {
                Value::Bulk(v) => Some(Bytes::from(v)),
                _ => None,
            },
            Kind::Files(fc) => fc.get(key)?,
            Kind::Direct => None,
        };
        if let Some(v) = cached {
            return Ok((Some(v), From::Cache));
        }
        match self.store_get(dir, key).await? {
            Some(v) => {
                self.fill(&[key.to_string()], std::slice::from_ref(&v))?;
                Ok((Some(v), From::Store))
            }
            None => Ok((None, From::Missing)),
        }
    }

    /// Reads a request's blocks in order and returns how many leading ones were found, and
    /// how many of those came from the cache (all of them for Strata, whose tiers the
    /// server's figures tell apart).
    async fn read_prefix(&mut self, dir: &str, keys: &[String]) -> anyhow::Result<(usize, usize)> {
        let leading = |vals: &[Option<Bytes>]| vals.iter().take_while(|v| v.is_some()).count();
        let mut cached = 0;
        match &mut self.kind {
            Kind::Strata { client, .. } => {
                let mut args: Vec<&[u8]> = vec![b"MGET"];
                args.extend(keys.iter().map(|k| k.as_bytes()));
                let found = client
                    .call_into_buffer(&args)?
                    .iter()
                    .take_while(|l| l.is_some())
                    .count();
                return Ok((found, found));
            }
            Kind::Redis { client } => {
                let mut args: Vec<&[u8]> = vec![b"MGET"];
                args.extend(keys.iter().map(|k| k.as_bytes()));
                cached = client
                    .call_into_buffer(&args)?
                    .iter()
                    .take_while(|l| l.is_some())
                    .count();
            }
            Kind::Files(fc) => {
                for k in keys {
                    if fc.get(k)?.is_none() {
                        break;
                    }
                    cached += 1;
                }
            }
            Kind::Direct => {}
        }
        // The rest from the object store in waves of 1, 2, 4, ... GETs at once (at most a
        // pipeline's worth), stopping after the first wave with a miss: a short prefix costs
        // one or two round trips, a long one is not read a block at a time.
        let rest = &keys[cached..];
        let mut vals: Vec<Option<Bytes>> = Vec::new();
        let mut wave = 1;
        while vals.len() < rest.len() && vals.iter().all(Option::is_some) {
            let store = &self.store;
            let next = &rest[vals.len()..(vals.len() + wave).min(rest.len())];
            let gets = next.iter().map(|k| {
                let path = object_path(dir, k);
                async move { get_if_present(store, &path).await }
            });
            for v in futures::future::join_all(gets).await {
                vals.push(v?);
            }
            self.store_gets += next.len() as u64;
            wave = (wave * 2).min(16);
        }
        let found = leading(&vals);
        let vals: Vec<Bytes> = vals.into_iter().take(found).flatten().collect();
        self.fill(&rest[..found], &vals)?;
        Ok((cached + found, cached))
    }

    /// Bytes held in each medium now.
    async fn held(&mut self, dirs: &[&str]) -> anyhow::Result<Held> {
        let mut held = Held::default();
        match &mut self.kind {
            Kind::Strata { client, .. } => {
                let st = strata_stats(client)?;
                held.dram = st.get("hot_bytes");
                held.disk = st.get("warm_bytes");
                held.object = st.get("cold_bytes");
                return Ok(held);
            }
            Kind::Redis { client } => held.dram = redis_used_memory(client)?,
            Kind::Files(fc) => held.disk = fc.used,
            Kind::Direct => {}
        }
        for dir in dirs {
            let prefix = object_store::path::Path::from(*dir);
            let metas: Vec<_> = self.store.list(Some(&prefix)).try_collect().await?;
            held.object += metas.iter().map(|m| m.size).sum::<u64>();
        }
        Ok(held)
    }
}

/// Strata's figures by name (`STRATA.STATS`).
struct Stats(HashMap<String, u64>);

impl Stats {
    fn get(&self, name: &str) -> u64 {
        self.0.get(name).copied().unwrap_or(0)
    }

    fn since(&self, before: &Stats, name: &str) -> u64 {
        self.get(name).saturating_sub(before.get(name))
    }
}

fn strata_stats(c: &mut Client) -> anyhow::Result<Stats> {
    let Value::Array(items) = c.call(&[b"STRATA.STATS"])? else {
        anyhow::bail!("STRATA.STATS: expected an array");
    };
    let mut m = HashMap::new();
    for pair in items.chunks(2) {
        if let [Value::Bulk(name), Value::Int(v)] = pair {
            m.insert(
                String::from_utf8_lossy(name).into_owned(),
                (*v).max(0) as u64,
            );
        }
    }
    Ok(Stats(m))
}

fn redis_used_memory(c: &mut Client) -> anyhow::Result<u64> {
    let Value::Bulk(info) = c.call(&[b"INFO", b"memory"])? else {
        anyhow::bail!("INFO memory: expected a bulk string");
    };
    let info = String::from_utf8_lossy(&info);
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("INFO memory has no used_memory"))
}

/// The physical references measured in the same run.
#[derive(Serialize, Default)]
struct References {
    memcpy_gib_per_sec: f64,
    loopback_round_trip_us: f64,
    loopback_gib_per_sec: f64,
    disk_write_mib_per_sec: f64,
    object_get_tiny_p50_ms: f64,
    object_get_tiny_p99_ms: f64,
}

/// Latencies at a spread of quantiles, in ms.
fn quantiles(lat: &[Duration]) -> Vec<(f64, f64)> {
    let mut ms: Vec<f64> = lat.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    [0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999]
        .iter()
        .filter_map(|&q| {
            let i = ((ms.len() as f64 * q) as usize).min(ms.len().checked_sub(1)?);
            Some((q, ms[i]))
        })
        .collect()
}

/// One-byte ping-pongs over loopback TCP: the median round trip in microseconds.
fn loopback_round_trip_us(n: usize) -> anyhow::Result<f64> {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = l.local_addr()?.port();
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = l.accept()?;
        s.set_nodelay(true)?;
        let mut b = [0u8; 1];
        while s.read(&mut b)? == 1 {
            s.write_all(&b)?;
        }
        Ok(())
    });
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_nodelay(true)?;
    let mut lat = Vec::with_capacity(n);
    let mut b = [7u8; 1];
    for _ in 0..n {
        let t = Instant::now();
        s.write_all(&b)?;
        s.read_exact(&mut b)?;
        lat.push(t.elapsed());
    }
    drop(s);
    let _ = echo.join();
    Ok(report::summarize(lat).p50_us)
}

/// Sequential writes of 1 MiB to a file, then one fsync: MiB per second to the disk.
fn disk_write_mib_per_sec(dir: &Path, mib: usize) -> anyhow::Result<f64> {
    use std::io::Write;
    let path = dir.join("disk-reference");
    let buf: Vec<u8> = value_of("disk", 1 << 20).to_vec();
    let t = Instant::now();
    let mut f = std::fs::File::create(&path)?;
    for _ in 0..mib {
        f.write_all(&buf)?;
    }
    f.sync_all()?;
    let secs = t.elapsed().as_secs_f64();
    std::fs::remove_file(&path)?;
    Ok(mib as f64 / secs)
}

async fn references(
    dir: &Path,
    store: &Arc<dyn ObjectStore>,
    quick: bool,
) -> anyhow::Result<References> {
    let path = object_path("reference", "tiny");
    store.put(&path, PutPayload::from_static(b"tiny")).await?;
    let mut lat = Vec::new();
    for _ in 0..if quick { 20 } else { 200 } {
        let t = Instant::now();
        store.get(&path).await?.bytes().await?;
        lat.push(t.elapsed());
    }
    let tiny = report::summarize(lat);
    Ok(References {
        memcpy_gib_per_sec: crate::kvcache::memcpy_gib_per_sec(),
        loopback_round_trip_us: loopback_round_trip_us(if quick { 2_000 } else { 20_000 })?,
        loopback_gib_per_sec: crate::kvcache::loopback_gib_per_sec(1 << 20)?,
        disk_write_mib_per_sec: disk_write_mib_per_sec(dir, if quick { 16 } else { 256 })?,
        object_get_tiny_p50_ms: tiny.p50_us / 1e3,
        object_get_tiny_p99_ms: tiny.p99_us / 1e3,
    })
}

/// What one contender measured.
#[derive(Serialize, Default)]
struct Row {
    contender: String,
    /// Writes per second in each stage (`STAGES`).
    writes_per_sec: [f64; 3],
    hot: Option<Summary>,
    /// (quantile, ms) points of the hot and cold read latencies, for the charts.
    hot_quantiles: Vec<(f64, f64)>,
    cold_quantiles: Vec<(f64, f64)>,
    /// Share of the hot reads DRAM (Strata) or the cache served.
    hot_from_memory: f64,
    cold: Option<Summary>,
    /// Share of the cold reads the object store served (Strata: reads its cold tier
    /// answered; prefetch turns some into DRAM reads).
    cold_from_object_store: f64,
    prefetch_used: u64,
    trace: TraceResult,
    held: Held,
    entries: usize,
    cost_per_million_entries_month: f64,
    /// Object-store GETs per 1,000 reads (hot, cold and trace reads together).
    object_gets_per_thousand_reads: f64,
}

#[derive(Serialize, Default, Clone)]
struct TraceResult {
    requests: usize,
    blocks: usize,
    /// Blocks found and loaded faster than recomputing them.
    hits: usize,
    /// Blocks found, but their request's load took longer than recomputing them.
    slower_than_recompute: usize,
    hit_rate: f64,
    /// Share of the hits each source served: Strata's tiers (hot, warm, cold) or the
    /// cache and the object store.
    sources: Vec<(String, f64)>,
    load_p50_ms: f64,
    load_p99_ms: f64,
}

/// The trace's first `n` requests, each a list of block ids.
fn read_trace(path: &Path, n: usize) -> anyhow::Result<Vec<Vec<u64>>> {
    #[derive(serde::Deserialize)]
    struct Request {
        hash_ids: Vec<u64>,
    }
    let text = std::fs::read_to_string(path).map_err(|e| {
        anyhow::anyhow!(
            "cannot read the trace {}: {e} (run from the repository's root, or pass --trace)",
            path.display()
        )
    })?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .take(n)
        .map(|l| Ok(serde_json::from_str::<Request>(l)?.hash_ids))
        .collect()
}

async fn write_rows(c: &mut Contender, s: &Sizes) -> anyhow::Result<[f64; 3]> {
    if c.is_aside() {
        // A write goes to the object store, then the cache: the object store sets its pace
        // whatever the cache holds, so one sample stands for every stage.
        let keys: Vec<String> = (0..s.aside_writes).map(|i| format!("w{i:06}")).collect();
        let dir = format!("{}/w", c.prefix);
        let t = Instant::now();
        for batch in keys.chunks(s.batch) {
            c.write(&dir, batch, s.value_bytes).await?;
        }
        let rate = keys.len() as f64 / t.elapsed().as_secs_f64();
        c.entries += keys.len();
        return Ok([rate; 3]);
    }
    let mut took = [Duration::ZERO; 3];
    let mut count = [0usize; 3];
    let keys: Vec<String> = (0..s.keys).map(data_key).collect();
    for (b, batch) in keys.chunks(s.batch).enumerate() {
        let stage = s.stage_of(b * s.batch);
        let t = Instant::now();
        c.write("data", batch, s.value_bytes).await?;
        took[stage] += t.elapsed();
        count[stage] += batch.len();
        if (b + 1) % (s.keys / s.batch / 4).max(1) == 0 {
            eprintln!(
                "  {}: {} of {} keys written",
                c.name,
                (b + 1) * s.batch,
                s.keys
            );
        }
    }
    c.entries += s.keys;
    Ok(std::array::from_fn(|i| {
        count[i] as f64 / took[i].as_secs_f64().max(1e-9)
    }))
}

/// Reads one key of the data set, checks its bytes, and says how long it took and where it
/// came from.
async fn timed_read(c: &mut Contender, s: &Sizes, key: &str) -> anyhow::Result<(Duration, From)> {
    let t = Instant::now();
    let (v, from) = c.read("data", key).await?;
    let took = t.elapsed();
    anyhow::ensure!(
        v.as_deref() == Some(&value_of(key, s.value_bytes)[..]),
        "{}: wrong value for {key}",
        c.name
    );
    Ok((took, from))
}

async fn hot_rows(c: &mut Contender, s: &Sizes, row: &mut Row) -> anyhow::Result<()> {
    let first = s.keys - s.hot_set();
    // One pass first: the cache-aside contenders fill their caches as a user's reads would.
    for i in first..s.keys {
        c.read("data", &data_key(i)).await?;
    }
    let before = match &mut c.kind {
        Kind::Strata { client, .. } => Some(strata_stats(client)?),
        _ => None,
    };
    let mut lat = Vec::with_capacity(s.hot_reads);
    let mut from_cache = 0;
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..s.hot_reads {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let key = data_key(first + (x % s.hot_set() as u64) as usize);
        let (took, from) = timed_read(c, s, &key).await?;
        lat.push(took);
        from_cache += usize::from(from == From::Cache);
    }
    row.hot_quantiles = quantiles(&lat);
    row.hot = Some(report::summarize(lat));
    row.hot_from_memory = match (&mut c.kind, before) {
        (Kind::Strata { client, .. }, Some(before)) => {
            strata_stats(client)?.since(&before, "hot_hits") as f64 / s.hot_reads as f64
        }
        (Kind::Direct, _) => 0.0,
        _ => from_cache as f64 / s.hot_reads as f64,
    };
    Ok(())
}

/// Sessions over the oldest keys (cold for every cache), each reading its keys in order with
/// a think time between reads, on a connection of its own.
async fn cold_rows(c: &mut Contender, s: &Sizes, row: &mut Row) -> anyhow::Result<()> {
    let before = match &mut c.kind {
        Kind::Strata { client, .. } => Some(strata_stats(client)?),
        _ => None,
    };
    let mut lat = Vec::new();
    let mut from_store = 0;
    for session in 0..s.sessions {
        if let Kind::Strata { port, client } = &mut c.kind {
            *client = Client::connect(*port)?;
        }
        for i in 0..s.session_keys {
            let key = data_key(session * s.session_keys + i);
            let (took, from) = timed_read(c, s, &key).await?;
            lat.push(took);
            from_store += usize::from(from == From::Store);
            tokio::time::sleep(Duration::from_millis(s.think_ms)).await;
        }
    }
    let reads = lat.len() as f64;
    row.cold_quantiles = quantiles(&lat);
    row.cold = Some(report::summarize(lat));
    row.cold_from_object_store = from_store as f64 / reads;
    if let (Kind::Strata { client, .. }, Some(before)) = (&mut c.kind, before) {
        let after = strata_stats(client)?;
        row.cold_from_object_store = after.since(&before, "cold_hits") as f64 / reads;
        row.prefetch_used = after.since(&before, "prefetch_used");
    }
    Ok(())
}

/// Replays the trace's requests: each reads its blocks in order (a block counts only if
/// every earlier block of the request was found), then writes the blocks it had to
/// recompute. Found blocks count as hits only if their load beat recomputing them.
async fn trace_rows(
    c: &mut Contender,
    s: &Sizes,
    trace: &[Vec<u64>],
    prefill_tokens_per_sec: f64,
) -> anyhow::Result<TraceResult> {
    let dir = format!("{}/blocks", c.prefix);
    let before = match &mut c.kind {
        Kind::Strata { client, .. } => Some(strata_stats(client)?),
        _ => None,
    };
    let recompute_per_block = s.block_tokens as f64 / prefill_tokens_per_sec;
    let mut r = TraceResult {
        requests: trace.len(),
        ..Default::default()
    };
    let (mut from_cache, mut lat) = (0usize, Vec::new());
    for (n, ids) in trace.iter().enumerate() {
        let keys: Vec<String> = ids.iter().map(|id| format!("blk{id:08}")).collect();
        let t = Instant::now();
        let (found, cached) = c.read_prefix(&dir, &keys).await?;
        let took = t.elapsed();
        r.blocks += keys.len();
        if found > 0 {
            lat.push(took);
            if took.as_secs_f64() < found as f64 * recompute_per_block {
                r.hits += found;
                from_cache += cached;
            } else {
                r.slower_than_recompute += found;
            }
        }
        for batch in keys[found..].chunks(s.batch) {
            c.write(&dir, batch, s.block_bytes).await?;
            c.entries += batch.len();
        }
        if (n + 1) % (trace.len() / 4).max(1) == 0 {
            eprintln!(
                "  {}: {} of {} requests replayed",
                c.name,
                n + 1,
                trace.len()
            );
        }
    }
    r.hit_rate = r.hits as f64 / r.blocks.max(1) as f64;
    let summary = report::summarize(lat);
    (r.load_p50_ms, r.load_p99_ms) = (summary.p50_us / 1e3, summary.p99_us / 1e3);
    r.sources = match (&mut c.kind, before) {
        (Kind::Strata { client, .. }, Some(before)) => {
            // The server counts every block a lookup found; the shares apply to the hits.
            let after = strata_stats(client)?;
            let tiers = ["hot_hits", "warm_hits", "cold_hits"].map(|t| after.since(&before, t));
            let all = tiers.iter().sum::<u64>().max(1) as f64;
            ["DRAM", "RocksDB", "object store"]
                .iter()
                .zip(tiers)
                .map(|(n, h)| (n.to_string(), h as f64 / all))
                .collect()
        }
        (Kind::Direct, _) => vec![("object store".into(), 1.0)],
        _ => {
            let hits = r.hits.max(1) as f64;
            vec![
                ("cache".into(), from_cache as f64 / hits),
                ("object store".into(), (r.hits - from_cache) as f64 / hits),
            ]
        }
    };
    Ok(r)
}

/// Starts the contender named `which`.
fn start(which: usize, a: &Args, s: &Sizes, moto: &Moto, dir: &Path) -> anyhow::Result<Contender> {
    let store = moto.store()?;
    let mut procs = Vec::new();
    let (name, prefix, kind) = match which {
        0 => ("object store direct", "direct", Kind::Direct),
        1 => {
            let port = free_port()?;
            procs.push(redis_server_with(port, &["--appendonly", "no"])?);
            wait_port(port)?;
            let mut client = Client::connect(port)?;
            // Redis holds about a megabyte empty; its budget for data is Strata's DRAM's.
            let empty = redis_used_memory(&mut client)?;
            let max = (empty + s.hot_bytes).to_string();
            client.call(&[b"CONFIG", b"SET", b"maxmemory", max.as_bytes()])?;
            client.call(&[b"CONFIG", b"SET", b"maxmemory-policy", b"allkeys-lru"])?;
            ("redis-server cache-aside", "redis", Kind::Redis { client })
        }
        2 => {
            let files = dir.join("files");
            std::fs::create_dir_all(&files)?;
            let fc = FileCache {
                dir: files,
                cap: s.warm_bytes,
                used: 0,
                tick: 0,
                entries: HashMap::new(),
                order: BTreeMap::new(),
            };
            ("files cache-aside", "files", Kind::Files(fc))
        }
        _ => {
            let prefetch = which == 3;
            let prefix = if prefetch {
                "strata"
            } else {
                "strata-noprefetch"
            };
            let port = free_port()?;
            let mut settings = moto.strata_settings(prefix);
            settings.extend([
                format!("hot_bytes_max={}", s.hot_bytes),
                format!("warm_bytes_max={}", s.warm_bytes),
                format!("prefetch={prefetch}"),
            ]);
            procs.push(strata_server(
                &a.strata,
                &dir.join(prefix),
                port,
                &settings,
            )?);
            wait_port(port)?;
            let client = Client::connect(port)?;
            let name = if prefetch {
                "strata (prefetch on)"
            } else {
                "strata (prefetch off)"
            };
            (name, prefix, Kind::Strata { port, client })
        }
    };
    for p in &procs {
        pin(p.0.id(), 0);
    }
    Ok(Contender {
        name: name.into(),
        kind,
        store,
        prefix: prefix.into(),
        store_gets: 0,
        store_puts: 0,
        entries: 0,
        _procs: procs,
    })
}

const CONTENDERS: usize = 5;

async fn measure(
    c: &mut Contender,
    a: &Args,
    s: &Sizes,
    trace: &[Vec<u64>],
    step: &mut usize,
    total: usize,
) -> anyhow::Result<Row> {
    let mut row = Row {
        contender: c.name.clone(),
        ..Default::default()
    };
    let mut next = |what: &str, c: &Contender| {
        *step += 1;
        progress(*step, total, &format!("{}: {what}", c.name));
    };
    next("writes", c);
    row.writes_per_sec = write_rows(c, s).await?;
    next("hot reads", c);
    hot_rows(c, s, &mut row).await?;
    next("cold reads", c);
    cold_rows(c, s, &mut row).await?;
    next("trace replay", c);
    row.trace = trace_rows(c, s, trace, a.prefill_tokens_per_sec).await?;
    let blocks = format!("{}/blocks", c.prefix);
    let own_writes = format!("{}/w", c.prefix);
    let dirs: Vec<&str> = match c.kind {
        Kind::Direct => vec!["data", &blocks],
        _ => vec!["data", &blocks, &own_writes],
    };
    row.held = c.held(&dirs).await?;
    if c.is_aside() {
        // The data set lives in the object store for them (written once, by the direct
        // contender); their caches hold copies of it.
        c.entries += s.keys;
    }
    row.entries = c.entries;
    row.cost_per_million_entries_month = row.held.cost_per_million(c.entries);
    let reads = s.hot_reads + s.sessions * s.session_keys + row.trace.blocks;
    let gets = match &mut c.kind {
        Kind::Strata { client, .. } => strata_stats(client)?.get("object_store_gets"),
        _ => c.store_gets,
    };
    row.object_gets_per_thousand_reads = gets as f64 * 1e3 / reads as f64;
    Ok(row)
}

/// The machine this ran on, for the report's header.
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = crate::servers::cpus_online();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").parse::<u64>().ok())
        })
        .map_or("unknown".into(), |kb| {
            format!("{:.1} GiB", kb as f64 / (1 << 20) as f64)
        });
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or("unknown".into(), |k| k.trim().to_string());
    format!("{cpu}, {cores} cores, {mem} RAM, Linux {kernel}")
}

#[derive(Serialize)]
struct Report<'a> {
    command: String,
    machine: String,
    quick: bool,
    sizes: Sizes,
    prices: Prices,
    prefill_tokens_per_sec: f64,
    references: References,
    rows: &'a [Row],
    kvcache: Vec<crate::cgroup::KvRow>,
    kvcache_skipped: Option<String>,
    seconds: f64,
}

fn markdown(r: &Report) -> String {
    let s = &r.sizes;
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let mut md = format!(
        "# Strata beside a DRAM cache, a filesystem cache and the object store\n\n\
         Command: `{}`  \nMachine: {}  \nRun time: {:.0} s{}\n\n\
         Every contender runs the same workload in this run, in front of the same \
         S3-compatible server on loopback (moto, in memory). Strata: DRAM budget \
         (`hot_bytes_max`) {:.2} MiB, RocksDB budget (`warm_bytes_max`) {:.2} MiB, cold tier \
         on that server, default policy and durability. redis-server: `maxmemory` = an empty \
         Redis plus {:.2} MiB, `allkeys-lru`, persistence off; files: one file per key, \
         {:.2} MiB, LRU. Both caches are cache-aside: a miss reads the object store and fills \
         the cache; a write goes to the object store, then the cache. Values {} B \
         (incompressible); {} keys written ({:.1} MiB, twice DRAM and disk together). \
         The servers (moto, Strata, Redis) run on core 0, the benchmark's client on core 1; \
         the file cache is read by the client itself (no network hop).\n\n",
        r.command,
        r.machine,
        r.seconds,
        if r.quick {
            " (`--quick`: small sizes, figures mean little)"
        } else {
            ""
        },
        mib(s.hot_bytes),
        mib(s.warm_bytes),
        mib(s.hot_bytes),
        mib(s.warm_bytes),
        s.value_bytes,
        s.keys,
        mib((s.keys * s.value_bytes) as u64),
    );
    let f = &r.references;
    md += &format!(
        "## Physical references (this run)\n\n| | |\n|---|---:|\n\
         | memory copy | {:.2} GiB/s |\n| loopback TCP round trip (1 byte) | {:.1} µs |\n\
         | loopback TCP bandwidth | {:.2} GiB/s |\n| disk sequential write + fsync | {:.0} MiB/s |\n\
         | object-store GET of a tiny object p50 / p99 | {:.2} / {:.2} ms |\n\n",
        f.memcpy_gib_per_sec,
        f.loopback_round_trip_us,
        f.loopback_gib_per_sec,
        f.disk_write_mib_per_sec,
        f.object_get_tiny_p50_ms,
        f.object_get_tiny_p99_ms,
    );
    let ms = |x: &Option<Summary>, p99: bool| {
        x.map_or("—".into(), |x| {
            format!("{:.3}", if p99 { x.p99_us } else { x.p50_us } / 1e3)
        })
    };
    md += &format!(
        "## Reads\n\nHot: {} GETs, one at a time, of keys that fit in DRAM (read once \
         before). Cold: {} sessions of {} keys each (the oldest written, which no cache holds \
         any more), read in order on a connection of their own, {} ms between reads.\n\n\
         | contender | hot p50 ms | hot p99 ms | hot from memory | cold p50 ms | cold p99 ms | cold from the object store | prefetched values read |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n",
        s.hot_reads, s.sessions, s.session_keys, s.think_ms
    );
    for row in r.rows {
        md += &format!(
            "| {} | {} | {} | {:.0}% | {} | {} | {:.0}% | {} |\n",
            row.contender,
            ms(&row.hot, false),
            ms(&row.hot, true),
            row.hot_from_memory * 100.0,
            ms(&row.cold, false),
            ms(&row.cold, true),
            row.cold_from_object_store * 100.0,
            row.prefetch_used,
        );
    }
    let t = r.rows.first().map(|r| &r.trace);
    md += &format!(
        "\n## Effective hit rate on the conversation trace\n\n\
         The first {} requests of `traces/conversation_trace.jsonl` ({} block reads); each \
         block a value of {} B standing for {} tokens. A request reads its blocks in order; \
         a block counts only if every earlier one was found, and only if the request's load \
         took less than recomputing its found blocks at {:.0} tokens/s ({:.2} ms per block, \
         the `KVC.MATCH LOADTIME` rule). Missing blocks are then written (recomputed).\n\n\
         | contender | effective hit rate | found but slower than recompute | load p50 ms | load p99 ms | hits served by |\n\
         |---|---:|---:|---:|---:|---|\n",
        t.map_or(0, |t| t.requests),
        t.map_or(0, |t| t.blocks),
        s.block_bytes,
        s.block_tokens,
        r.prefill_tokens_per_sec,
        s.block_tokens as f64 / r.prefill_tokens_per_sec * 1e3,
    );
    for row in r.rows {
        let t = &row.trace;
        let by = t
            .sources
            .iter()
            .map(|(n, x)| format!("{n} {:.0}%", x * 100.0))
            .collect::<Vec<_>>()
            .join(", ");
        md += &format!(
            "| {} | {:.1}% | {} | {:.2} | {:.2} | {by} |\n",
            row.contender,
            t.hit_rate * 100.0,
            t.slower_than_recompute,
            t.load_p50_ms,
            t.load_p99_ms,
        );
    }
    md += &format!(
        "\n## Writes ({} B values, pipelines of {})\n\nWrites per second while the data \
         written so far fits in DRAM, then in DRAM and the disk budget, then beyond. A \
         cache-aside write goes to the object store first, so its rate is the object \
         store's whatever the cache holds: one sample of {} writes stands for every stage.\n\n\
         | contender | {} | {} | {} |\n|---|---:|---:|---:|\n",
        s.value_bytes, s.batch, s.aside_writes, STAGES[0], STAGES[1], STAGES[2]
    );
    for row in r.rows {
        let w = row.writes_per_sec;
        md += &format!(
            "| {} | {:.0} | {:.0} | {:.0} |\n",
            row.contender, w[0], w[1], w[2]
        );
    }
    let p = &r.prices;
    md += &format!(
        "\n## Bytes held and cost\n\nAt the end of the run. Prices: DRAM ${:.2}, NVMe ${:.2}, \
         object storage ${:.3} per GB-month; object-store GETs ${:.2} and PUTs ${:.2} per \
         million (list prices, rounded). Cost per million entries is storage only; the \
         request column says how many object-store GETs the reads of this run cost.\n\n\
         | contender | DRAM MiB | disk MiB | object store MiB | entries | $ per million entries per month | object-store GETs per 1,000 reads |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
        p.dram_gb_month,
        p.nvme_gb_month,
        p.object_gb_month,
        p.object_get_per_million,
        p.object_put_per_million
    );
    for row in r.rows {
        let h = row.held;
        md += &format!(
            "| {} | {:.2} | {:.2} | {:.2} | {} | {:.4} | {:.0} |\n",
            row.contender,
            mib(h.dram),
            mib(h.disk),
            mib(h.object),
            row.entries,
            row.cost_per_million_entries_month,
            row.object_gets_per_thousand_reads,
        );
    }
    md += &crate::cgroup::markdown(&r.kvcache, r.kvcache_skipped.as_deref());
    md
}

pub async fn run(a: Args, out: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.strata.exists(),
        "{} not found; run `cargo build --release -p strata` first (or pass --strata)",
        a.strata.display()
    );
    let started = Instant::now();
    // Before the client is pinned to one core, which would hide the others.
    let machine = machine();
    let s = Sizes::new(a.quick);
    let trace = read_trace(&a.trace, s.trace_requests)?;
    let kv_steps = crate::cgroup::STEPS;
    let total = 2 + CONTENDERS * 4 + kv_steps;
    let mut step = 0;
    step += 1;
    progress(step, total, "object store (moto) on loopback");
    let moto = Moto::start()?;
    // The benchmark's protocol on two cores: servers (the object store among them) on core
    // 0, this client on core 1.
    pin(moto.pid(), 0);
    pin(0, 1);
    let dir = tempfile::tempdir()?;
    step += 1;
    progress(step, total, "physical references");
    let refs = references(dir.path(), &moto.store()?, a.quick).await?;
    let mut rows = Vec::new();
    for which in 0..CONTENDERS {
        let mut c = start(which, &a, &s, &moto, dir.path())?;
        rows.push(measure(&mut c, &a, &s, &trace, &mut step, total).await?);
    }
    let (kvcache, kvcache_skipped) =
        match crate::cgroup::run(&a.strata, a.quick, &mut step, total).await {
            Ok(rows) => (rows, None),
            Err(why) => {
                eprintln!("KV-cache rows in a memory cgroup skipped: {why:#}");
                (Vec::new(), Some(format!("{why:#}")))
            }
        };
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let r = Report {
        command,
        machine,
        quick: a.quick,
        sizes: s,
        prices: PRICES,
        prefill_tokens_per_sec: a.prefill_tokens_per_sec,
        references: refs,
        rows: &rows,
        kvcache,
        kvcache_skipped,
        seconds: started.elapsed().as_secs_f64(),
    };
    report::write(out, &a.report, &markdown(&r), &r)?;
    report::plot(out, "scripts/plot_compare.py", &a.report);
    Ok(())
}
