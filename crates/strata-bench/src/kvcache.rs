//! Multi-turn KV-cache benchmark, after MLPerf Storage v3.0's KV-cache test: simulated users
//! hold conversations; each turn reads the whole prefix's KV chunks back (cached tokens) and
//! then writes the new turn's chunks (prefill). Strata, a real redis-server, one local file
//! per chunk, and the object store read directly run the same workload in the same run,
//! beside the loopback-TCP and memcpy ceilings.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use object_store::ObjectStoreExt;
use serde::Serialize;
use strata_kvcache::Namespace;

use crate::resp::{Client, Value};
use crate::servers::{free_port, redis_server, redis_server_with, strata_server, wait_port, Proc};
use strata_server::rss_anon_bytes_of;

#[derive(clap::Args)]
pub struct Args {
    /// Model whose KV size per token is used: llama-3.1-8b (128 KiB/token), llama-3.1-70b
    /// (320 KiB/token) or tiny (4 KiB/token, for quick runs).
    #[arg(long, default_value = "llama-3.1-8b")]
    model: String,
    /// Simulated users; each reads its prefix back at every turn after the first, so
    /// `users × (turns − 1)` timed reads feed the percentiles.
    #[arg(long, default_value_t = 16)]
    users: usize,
    #[arg(long, default_value_t = 4)]
    turns: usize,
    #[arg(long, default_value_t = 128)]
    tokens_per_turn: usize,
    /// Tokens per chunk (LMCache uses 256; 16 keeps chunks at 2 MiB for Llama-3.1-8B).
    #[arg(long, default_value_t = 16)]
    chunk_tokens: usize,
    /// Strata's DRAM budget in MiB; below the working set, reads come from RocksDB.
    #[arg(long, default_value_t = 64)]
    hot_mib: u64,
    #[arg(long, default_value = "target/release/strata")]
    strata: PathBuf,
    /// Extra server settings (`--strata-set vlog_value_bytes_min=0`).
    #[arg(long = "strata-set")]
    strata_set: Vec<String>,
    /// Also run a second Strata server with these settings on top, as one more backend of
    /// the same run (`--variant-set vlog_value_bytes_min=0`): an A/B that shares the run's
    /// conditions.
    #[arg(long = "variant-set")]
    variant_set: Vec<String>,
    /// Report file name (without extension), e.g. kvcache-dram for a run that fits in DRAM.
    #[arg(long, default_value = "kvcache")]
    report: String,
    /// Durable writes: Strata with `durability=group` beside Redis with `appendonly yes,
    /// appendfsync always` (each replies to a write once it is fsynced), instead of
    /// `durability=none` beside Redis with persistence off.
    #[arg(long)]
    durable: bool,
    /// Runs of the whole benchmark (fresh servers each time); the report gives each
    /// backend's median and every run's ratios, since one run on a shared machine is noisy.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
}

fn bytes_per_token(model: &str) -> anyhow::Result<usize> {
    Ok(match model {
        "llama-3.1-8b" => 32 * 2 * 8 * 128 * 2,
        "llama-3.1-70b" => 80 * 2 * 8 * 128 * 2,
        "tiny" => 4096,
        _ => anyhow::bail!("unknown model '{model}'; use llama-3.1-8b, llama-3.1-70b or tiny"),
    })
}

#[derive(Serialize, Clone)]
struct Row {
    backend: String,
    cached_tokens_per_sec: f64,
    read_gib_per_sec: f64,
    write_gib_per_sec: f64,
    read_p50_ms: f64,
    read_p95_ms: f64,
    read_p99_ms: f64,
    hit_rate: f64,
}

enum Backend {
    /// Client, namespace id, name in the report.
    Strata(Client, String, String),
    Redis(Client),
    /// Strata read from its own files by a client on the same machine (`KVC.LOCATE`, then
    /// the value-log files mapped here and each value's checksum verified). With a buffer,
    /// each value is then copied into it, as the files client reads into its own; without,
    /// the reader keeps views of the mapped files, as `KVCacheClient.retrieve_local` returns.
    StrataLocal {
        client: Client,
        ns: String,
        copy_into: Option<Vec<u8>>,
        maps: HashMap<Vec<u8>, memmap2::Mmap>,
    },
    /// The directory, and the buffer values are read into (reused, as the Strata and Redis
    /// clients reuse theirs).
    Files(PathBuf, Vec<u8>),
    /// The same kind of directory, each file mapped and read once (a CRC-32C over it), no
    /// copy: the files counterpart of the co-located client's views.
    FilesMapped(PathBuf),
    Object(object_store::local::LocalFileSystem),
}

impl Backend {
    fn name(&self) -> &str {
        match self {
            Backend::Strata(_, _, name) => name,
            Backend::Redis(_) => "redis-server (MGET)",
            Backend::StrataLocal {
                copy_into: Some(_), ..
            } => "strata co-located, copied (KVC.LOCATE)",
            Backend::StrataLocal {
                copy_into: None, ..
            } => "strata co-located, views (KVC.LOCATE)",
            Backend::Files(..) => "local files",
            Backend::FilesMapped(_) => "local files, mapped",
            Backend::Object(_) => "object store direct",
        }
    }

    async fn put(
        &mut self,
        hashes: &[String],
        keys: &[String],
        chunks: &[Bytes],
    ) -> anyhow::Result<()> {
        match self {
            Backend::Strata(c, ns, _) | Backend::StrataLocal { client: c, ns, .. } => {
                let mut args: Vec<&[u8]> = vec![b"KVC.PUT", ns.as_bytes()];
                for (h, v) in hashes.iter().zip(chunks) {
                    args.push(h.as_bytes());
                    args.push(v);
                }
                c.call(&args)?;
            }
            Backend::Redis(c) => {
                let mut args: Vec<&[u8]> = vec![b"MSET"];
                for (k, v) in keys.iter().zip(chunks) {
                    args.push(k.as_bytes());
                    args.push(v);
                }
                c.call(&args)?;
            }
            Backend::Files(dir, _) | Backend::FilesMapped(dir) => {
                for (k, v) in keys.iter().zip(chunks) {
                    std::fs::write(dir.join(k.replace(':', "_")), v)?;
                }
            }
            Backend::Object(store) => {
                let store = &*store;
                let puts = keys.iter().zip(chunks).map(|(k, v)| {
                    let path = object_store::path::Path::from(k.replace(':', "_"));
                    let v = v.clone();
                    async move { store.put(&path, v.into()).await }
                });
                for r in join_in_batches(puts).await {
                    r?;
                }
            }
        }
        Ok(())
    }

    /// Reads the prefix; returns (leading chunks found, bytes read).
    async fn get_prefix(
        &mut self,
        hashes: &[String],
        keys: &[String],
    ) -> anyhow::Result<(usize, usize)> {
        Ok(match self {
            Backend::Strata(c, ns, _) => {
                // A reply cut at the server's reply limit is followed by one for the rest
                // (each lands at the start of the one reused buffer).
                let mut lens = Vec::with_capacity(hashes.len());
                loop {
                    let mut args: Vec<&[u8]> = vec![b"KVC.GET", ns.as_bytes()];
                    args.extend(hashes[lens.len()..].iter().map(|h| h.as_bytes()));
                    let got = c.call_into_buffer(&args)?;
                    let cut = !got.is_empty() && got.len() < args.len() - 2;
                    lens.extend(got);
                    if !cut {
                        break;
                    }
                }
                leading_lens(lens)
            }
            Backend::Redis(c) => {
                let mut args: Vec<&[u8]> = vec![b"MGET"];
                args.extend(keys.iter().map(|k| k.as_bytes()));
                leading_lens(c.call_into_buffer(&args)?)
            }
            Backend::StrataLocal {
                client: c,
                ns,
                copy_into,
                maps,
            } => {
                let mut args: Vec<&[u8]> = vec![b"KVC.LOCATE", ns.as_bytes()];
                args.extend(hashes.iter().map(|h| h.as_bytes()));
                let Value::Array(found) = c.call(&args)? else {
                    anyhow::bail!("KVC.LOCATE did not reply with an array");
                };
                // Map what is not mapped yet (or has grown since) before taking any view.
                let mut places = Vec::with_capacity(found.len());
                for item in &found {
                    let place = located(item)?;
                    if let Some((path, offset, len, ..)) = place {
                        if maps.get(path).is_none_or(|m| m.len() < offset + len) {
                            let f = std::fs::File::open(std::str::from_utf8(path)?)?;
                            // SAFETY: value-log files are only appended to, never truncated
                            // or rewritten while the server runs.
                            maps.insert(path.to_vec(), unsafe { memmap2::Mmap::map(&f)? });
                        }
                    }
                    places.push(place);
                }
                let mut lens = Vec::with_capacity(found.len());
                let mut views: Vec<&[u8]> = Vec::with_capacity(found.len());
                let mut at = 0;
                for ((place, key), h) in places.into_iter().zip(keys).zip(hashes) {
                    let Some((path, offset, len, expire_ms, crc)) = place else {
                        // Present but not in the value log: read through the socket.
                        let got = c.call_into_buffer(&[b"KVC.GET", ns.as_bytes(), h.as_bytes()])?;
                        lens.push(got.first().copied().flatten());
                        continue;
                    };
                    let value = &maps[path][offset..offset + len];
                    anyhow::ensure!(
                        strata_format::entry_checksum(
                            strata_format::Kind::String,
                            key.as_bytes(),
                            expire_ms,
                            value
                        ) == crc,
                        "checksum mismatch at {offset} of {}",
                        String::from_utf8_lossy(path)
                    );
                    match copy_into {
                        Some(buffer) => slot(buffer, at, len).copy_from_slice(value),
                        None => views.push(value),
                    }
                    at += len;
                    lens.push(Some(len));
                }
                std::hint::black_box(&views);
                leading_lens(lens)
            }
            Backend::Files(dir, buffer) => {
                let mut lens = Vec::with_capacity(keys.len());
                let mut at = 0;
                for k in keys {
                    let Ok(mut f) = std::fs::File::open(dir.join(k.replace(':', "_"))) else {
                        lens.push(None);
                        continue;
                    };
                    let len = f.metadata()?.len() as usize;
                    f.read_exact(slot(buffer, at, len))?;
                    at += len;
                    lens.push(Some(len));
                }
                leading_lens(lens)
            }
            Backend::FilesMapped(dir) => {
                let mut lens = Vec::with_capacity(keys.len());
                for k in keys {
                    let Ok(f) = std::fs::File::open(dir.join(k.replace(':', "_"))) else {
                        lens.push(None);
                        continue;
                    };
                    // SAFETY: the benchmark alone writes these files, never while reading.
                    let map = unsafe { memmap2::Mmap::map(&f)? };
                    std::hint::black_box(crc32c::crc32c(&map));
                    lens.push(Some(map.len()));
                }
                leading_lens(lens)
            }
            Backend::Object(store) => {
                let store = &*store;
                let gets = keys.iter().map(|k| {
                    let path = object_store::path::Path::from(k.replace(':', "_"));
                    async move {
                        let r = store.get(&path).await.ok()?;
                        // The object store client reads each value into a buffer of its own.
                        r.bytes().await.ok().map(|b| b.len())
                    }
                });
                leading_lens(join_in_batches(gets).await)
            }
        })
    }
}

/// `len` bytes of the reused read buffer from `at`, grown as needed.
fn slot(buffer: &mut Vec<u8>, at: usize, len: usize) -> &mut [u8] {
    if buffer.len() < at + len {
        buffer.resize(at + len, 0);
    }
    &mut buffer[at..at + len]
}

/// One `KVC.LOCATE` entry: path, offset, length, expiry, checksum; `None` for a chunk that
/// is present but not in the value log.
type Located<'a> = (&'a [u8], usize, usize, u64, u32);

fn located(v: &Value) -> anyhow::Result<Option<Located<'_>>> {
    match v {
        Value::Nil => Ok(None),
        Value::Array(f) => match f.as_slice() {
            [Value::Bulk(p), Value::Int(o), Value::Int(l), Value::Int(e), Value::Int(c)] => {
                Ok(Some((p, *o as usize, *l as usize, *e as u64, *c as u32)))
            }
            _ => anyhow::bail!("KVC.LOCATE entry is not [path, offset, length, expiry, crc]"),
        },
        _ => anyhow::bail!("KVC.LOCATE entry is not an array"),
    }
}

/// Runs the futures sixteen at a time (as an object-store client would), keeping order.
pub(crate) async fn join_in_batches<F: std::future::Future>(
    it: impl Iterator<Item = F>,
) -> Vec<F::Output> {
    let mut out = Vec::new();
    let mut it = it.peekable();
    while it.peek().is_some() {
        let batch: Vec<F> = it.by_ref().take(16).collect();
        out.extend(futures::future::join_all(batch).await);
    }
    out
}

fn pct(mut xs: Vec<f64>, q: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[((xs.len() as f64 * q) as usize).min(xs.len() - 1)]
}

fn user_tokens(u: usize, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| {
            (u as u32)
                .wrapping_mul(1_000_003)
                .wrapping_add(i.wrapping_mul(7919))
                % 128_000
        })
        .collect()
}

/// How many leading values are present, and their bytes.
fn leading_lens(lens: Vec<Option<usize>>) -> (usize, usize) {
    let present: Vec<usize> = lens.into_iter().map_while(|l| l).collect();
    (present.len(), present.iter().sum())
}

async fn run_backend(
    b: &mut Backend,
    a: &Args,
    ns: &Namespace,
    chunk_bytes: usize,
    step: &mut usize,
    total: usize,
) -> anyhow::Result<Row> {
    let chunk = |u: usize, i: usize| Bytes::from(vec![(u * 31 + i) as u8; chunk_bytes]);
    let (mut read_s, mut write_s) = (0f64, 0f64);
    let (mut read_bytes, mut write_bytes, mut cached, mut wanted) =
        (0usize, 0usize, 0usize, 0usize);
    let mut lat = Vec::new();
    for turn in 0..a.turns {
        *step += 1;
        crate::report::progress(
            *step,
            total,
            &format!("{}: turn {}/{}", b.name(), turn + 1, a.turns),
        );
        for u in 0..a.users {
            let tokens = user_tokens(u, (turn + 1) * a.tokens_per_turn);
            let hashes = ns.chunk_hashes(&tokens);
            let keys: Vec<String> = hashes.iter().map(|h| ns.key_of(h)).collect();
            let prefix = hashes.len() - a.tokens_per_turn / a.chunk_tokens;
            if prefix > 0 {
                let t = Instant::now();
                let (n, bytes) = b.get_prefix(&hashes[..prefix], &keys[..prefix]).await?;
                let dt = t.elapsed().as_secs_f64();
                read_s += dt;
                lat.push(dt * 1e3);
                read_bytes += bytes;
                cached += n * a.chunk_tokens;
                wanted += prefix * a.chunk_tokens;
            }
            let chunks: Vec<Bytes> = (prefix..hashes.len()).map(|i| chunk(u, i)).collect();
            let t = Instant::now();
            b.put(&hashes[prefix..], &keys[prefix..], &chunks).await?;
            write_s += t.elapsed().as_secs_f64();
            write_bytes += chunks.len() * chunk_bytes;
        }
    }
    let gib = (1u64 << 30) as f64;
    Ok(Row {
        backend: b.name().to_string(),
        cached_tokens_per_sec: cached as f64 / read_s.max(1e-9),
        read_gib_per_sec: read_bytes as f64 / gib / read_s.max(1e-9),
        write_gib_per_sec: write_bytes as f64 / gib / write_s.max(1e-9),
        read_p50_ms: pct(lat.clone(), 0.50),
        read_p95_ms: pct(lat.clone(), 0.95),
        read_p99_ms: pct(lat, 0.99),
        hit_rate: cached as f64 / wanted.max(1) as f64,
    })
}

/// Server memory held per in-flight read: with the store already full, reads the longest
/// prefix `reps` times (one request in flight) while a thread samples the server's RSS every
/// millisecond; returns (RSS before, peak RSS during, bytes per read).
async fn inflight_memory(
    b: &mut Backend,
    pid: u32,
    hashes: &[String],
    keys: &[String],
    reps: usize,
) -> anyhow::Result<(u64, u64, usize)> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let base = rss_anon_bytes_of(pid);
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let peak = std::sync::Arc::new(AtomicU64::new(base));
    let sampler = {
        let (stop, peak) = (stop.clone(), peak.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(rss_anon_bytes_of(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let mut bytes = 0;
    for _ in 0..reps {
        bytes = b.get_prefix(hashes, keys).await?.1;
    }
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    Ok((base, peak.load(Ordering::Relaxed), bytes))
}

/// Loopback TCP bandwidth with one connection, in GiB/s: 2 GiB sent in writes of 1 MiB
/// and read in reads of 1 MiB, cycling through `span` bytes of source and destination
/// memory. With `span` = 1 MiB both buffers stay in the CPU cache (the classic figure);
/// with a span larger than the cache every byte comes from and goes to DRAM, as the bytes of
/// a 48 MiB prefix read must on both sides of a real server.
pub(crate) fn loopback_gib_per_sec(span: usize) -> anyhow::Result<f64> {
    const IO: usize = 1 << 20;
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = l.local_addr()?.port();
    let total = 2usize << 30;
    let reader = std::thread::spawn(move || -> std::io::Result<usize> {
        let (mut s, _) = l.accept()?;
        let mut buf = vec![0u8; span];
        let (mut n, mut at) = (0, 0);
        loop {
            let m = s.read(&mut buf[at..at + IO])?;
            if m == 0 {
                return Ok(n);
            }
            n += m;
            at = (at + m) % (span - IO + 1);
        }
    });
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    let buf = vec![1u8; span];
    let t = Instant::now();
    for i in 0..total / IO {
        let at = (i * IO) % span;
        s.write_all(&buf[at..at + IO])?;
    }
    drop(s);
    let got = reader
        .join()
        .map_err(|_| anyhow::anyhow!("reader thread panicked"))??;
    Ok(got as f64 / (1u64 << 30) as f64 / t.elapsed().as_secs_f64())
}

/// Memory copy bandwidth, in GiB/s.
pub(crate) fn memcpy_gib_per_sec() -> f64 {
    let src = vec![3u8; 256 << 20];
    let mut dst = vec![0u8; 256 << 20];
    let t = Instant::now();
    for _ in 0..8 {
        dst.copy_from_slice(&src);
        std::hint::black_box(&dst);
    }
    8.0 * 0.25 / t.elapsed().as_secs_f64()
}

/// Starts a Strata server on `port` with the benchmark's settings plus `extra`.
fn spawn_strata(a: &Args, dir: &Path, port: u16, extra: &[String]) -> anyhow::Result<Proc> {
    let hot = format!("hot_bytes_max={}", a.hot_mib << 20);
    let durability = if a.durable { "group" } else { "none" };
    let base = [format!("durability={durability}"), hot];
    strata_server(
        &a.strata,
        dir,
        port,
        base.iter().chain(&a.strata_set).chain(extra),
    )
}

/// One run of every backend against fresh servers: the rows, and the in-flight memory of the
/// two servers.
async fn run_once(
    a: &Args,
    chunk_bytes: usize,
    step: &mut usize,
    total: usize,
) -> anyhow::Result<(Vec<Row>, Vec<(String, u64, u64, usize)>)> {
    let dir = tempfile::tempdir()?;
    let (sp, rp) = (free_port()?, free_port()?);
    let _strata = spawn_strata(a, &dir.path().join("strata"), sp, &[])?;
    let variant = match a.variant_set.is_empty() {
        true => None,
        false => {
            let port = free_port()?;
            let p = spawn_strata(a, &dir.path().join("variant"), port, &a.variant_set)?;
            wait_port(port)?;
            Some((p, port))
        }
    };
    let _redis = match a.durable {
        true => {
            let aof = dir.path().join("redis");
            std::fs::create_dir_all(&aof)?;
            let aof = aof.to_string_lossy().into_owned();
            let durable = [
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--dir",
                &aof,
            ];
            redis_server_with(rp, &durable)?
        }
        false => redis_server(rp)?,
    };
    wait_port(sp)?;
    wait_port(rp)?;
    let ns = Namespace::new(&a.model, "main", "bf16", "bench", 1, 0, a.chunk_tokens);
    let files = dir.path().join("files");
    let objects = dir.path().join("objects");
    let files_mapped = dir.path().join("files-mapped");
    std::fs::create_dir_all(&files)?;
    std::fs::create_dir_all(&files_mapped)?;
    std::fs::create_dir_all(&objects)?;
    let mut backends = vec![
        Backend::Strata(Client::connect(sp)?, ns.id(), "strata (KVC.GET)".into()),
        Backend::Redis(Client::connect(rp)?),
        Backend::Files(files, Vec::new()),
        Backend::Object(object_store::local::LocalFileSystem::new_with_prefix(
            &objects,
        )?),
        Backend::StrataLocal {
            client: Client::connect(sp)?,
            ns: ns.id(),
            copy_into: Some(Vec::new()),
            maps: HashMap::new(),
        },
        Backend::StrataLocal {
            client: Client::connect(sp)?,
            ns: ns.id(),
            copy_into: None,
            maps: HashMap::new(),
        },
        Backend::FilesMapped(files_mapped),
    ];
    if let Some((_, port)) = &variant {
        let name = format!("strata, {} (KVC.GET)", a.variant_set.join(", "));
        backends.push(Backend::Strata(Client::connect(*port)?, ns.id(), name));
    }
    let mut rows = Vec::new();
    let mut memory = Vec::new();
    let pids = [_strata.0.id(), _redis.0.id()];
    for (i, b) in backends.iter_mut().enumerate() {
        let row = run_backend(b, a, &ns, chunk_bytes, step, total).await?;
        if let Some(&pid) = pids.get(i) {
            // The longest prefix the run read: every turn but the last, of user 0.
            let tokens = user_tokens(0, (a.turns - 1).max(1) * a.tokens_per_turn);
            let hashes = ns.chunk_hashes(&tokens);
            let keys: Vec<String> = hashes.iter().map(|h| ns.key_of(h)).collect();
            let (base, peak, bytes) = inflight_memory(b, pid, &hashes, &keys, 20).await?;
            memory.push((row.backend.clone(), base, peak, bytes));
        }
        eprintln!(
            "  {:<22} {:>12.0} cached tokens/s  read {:.2} GiB/s  write {:.2} GiB/s  p50 {:.1} ms p95 {:.1} ms  hit {:.0}%",
            row.backend, row.cached_tokens_per_sec, row.read_gib_per_sec, row.write_gib_per_sec, row.read_p50_ms, row.read_p95_ms, row.hit_rate * 100.0
        );
        rows.push(row);
    }
    Ok((rows, memory))
}

/// `f` of each run, to two decimals, comma-separated.
fn per_run<R>(runs: &[R], f: impl Fn(&R) -> f64) -> String {
    runs.iter()
        .map(|r| format!("{:.2}", f(r)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where the co-located Strata clients, the mapped files and the `--variant-set` server are
/// in a run's rows (after Strata, Redis, files and the object store).
const COLOCATED: usize = 4;
const COLOCATED_VIEWS: usize = 5;
const FILES_MAPPED: usize = 6;
const VARIANT: usize = 7;

/// Cached tokens/s of row `a` / row `b`.
fn tokens_over(rows: &[Row], a: usize, b: usize) -> f64 {
    rows[a].cached_tokens_per_sec / rows[b].cached_tokens_per_sec.max(1e-9)
}

/// Strata's read bandwidth / loopback, p95 / Redis p95, cached tokens/s / local files.
fn ratios(rows: &[Row], loopback: f64) -> [f64; 3] {
    let s = &rows[0];
    [
        s.read_gib_per_sec / loopback,
        s.read_p95_ms / rows[1].read_p95_ms.max(1e-9),
        tokens_over(rows, 0, 2),
    ]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Each backend's median of every figure over the runs.
fn median_rows(runs: &[Vec<Row>]) -> Vec<Row> {
    (0..runs[0].len())
        .map(|i| {
            let m = |f: fn(&Row) -> f64| median(runs.iter().map(|r| f(&r[i])).collect());
            Row {
                backend: runs[0][i].backend.clone(),
                cached_tokens_per_sec: m(|r| r.cached_tokens_per_sec),
                read_gib_per_sec: m(|r| r.read_gib_per_sec),
                write_gib_per_sec: m(|r| r.write_gib_per_sec),
                read_p50_ms: m(|r| r.read_p50_ms),
                read_p95_ms: m(|r| r.read_p95_ms),
                read_p99_ms: m(|r| r.read_p99_ms),
                hit_rate: m(|r| r.hit_rate),
            }
        })
        .collect()
}

pub async fn run(a: Args, out: &Path) -> anyhow::Result<()> {
    let per_token = bytes_per_token(&a.model)?;
    anyhow::ensure!(
        a.tokens_per_turn.is_multiple_of(a.chunk_tokens),
        "tokens_per_turn must be a multiple of chunk_tokens"
    );
    anyhow::ensure!(
        a.strata.exists(),
        "{} not found; build it with `cargo build --release -p strata`",
        a.strata.display()
    );
    let chunk_bytes = per_token * a.chunk_tokens;
    let working_set = a.users * a.turns * a.tokens_per_turn * per_token;
    let started = Instant::now();
    let backends = 7 + usize::from(!a.variant_set.is_empty());
    let total = (backends * a.turns + 1) * a.repeat.max(1);
    crate::report::progress(1, total, "measuring the loopback and memcpy ceilings");
    let loopback = loopback_gib_per_sec(1 << 20)?;
    let loopback_dram = loopback_gib_per_sec(256 << 20)?;
    let memcpy = memcpy_gib_per_sec();
    let mut step = 1;
    let mut runs = Vec::new();
    let mut memory = Vec::new();
    for _ in 0..a.repeat.max(1) {
        let (rows, mem) = run_once(&a, chunk_bytes, &mut step, total).await?;
        runs.push(rows);
        memory = mem;
    }
    let rows = median_rows(&runs);
    let ratios_per_run: Vec<[f64; 3]> = runs.iter().map(|r| ratios(r, loopback)).collect();
    let mut md = format!(
        "# KV-cache benchmark: multi-turn conversations\n\nModel {} ({} KiB of KV per token), {} users × {} turns × {} tokens per turn, chunks of {} tokens ({} MiB), working set {} MiB; Strata's DRAM budget {} MiB ({}), files and object store in a local directory (both read by the benchmark process itself, from the page cache, with no network hop: Strata and Redis are reached over loopback TCP). The Strata, Redis and files clients read values into one reused buffer each; the object-store client gets a buffer per value from `object_store`; the two co-located Strata clients ask the same Strata server where the chunks lie (`KVC.LOCATE`), map its value-log files and check each value's CRC-32C; one then copies each value into one reused buffer, the other keeps views of the mapped files (what `KVCacheClient.retrieve_local` returns: the bytes are read once, by the check, and a consumer copies them to where they go, a GPU for instance, from the page cache). The mapped-files client is the same trick without Strata: it maps each chunk's file and reads it once (a CRC-32C), with no copy. Each turn reads the whole earlier prefix back, then writes the new chunks. Same machine, same run; {}.\n\nCeilings measured in this run: loopback TCP {:.2} GiB/s (one connection, a 1 MiB buffer that stays in the CPU cache on both ends), loopback TCP {:.2} GiB/s from and to memory (the same through 256 MiB buffers, out of cache, as a real read's bytes are), memcpy {:.2} GiB/s (256 MiB).\n\n| backend | cached tokens/s | read GiB/s | write GiB/s | read p50 ms | p95 ms | p99 ms | hit rate |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
        a.model, per_token >> 10, a.users, a.turns, a.tokens_per_turn, a.chunk_tokens, chunk_bytes >> 20, working_set >> 20, a.hot_mib,
        match a.durable {
            true => "durability=group, beside Redis 7 with `appendonly yes, appendfsync always`: each replies to a write once it is fsynced",
            false => "durability=none, beside Redis 7 with persistence off",
        },
        if runs.len() > 1 { format!("each figure is the median of {} runs, each against fresh servers", runs.len()) } else { "one run".to_string() },
        loopback, loopback_dram, memcpy
    );
    for r in &rows {
        md.push_str(&format!(
            "| {} | {:.0} | {:.2} | {:.2} | {:.1} | {:.1} | {:.1} | {:.0}% |\n",
            r.backend,
            r.cached_tokens_per_sec,
            r.read_gib_per_sec,
            r.write_gib_per_sec,
            r.read_p50_ms,
            r.read_p95_ms,
            r.read_p99_ms,
            r.hit_rate * 100.0
        ));
    }
    md.push_str("\nServer memory per in-flight read (store full, one read of the longest prefix in flight, anonymous RSS (file-backed pages such as mmapped files left out) sampled every ms over 20 reads):\n\n| server | read MiB | RSS before MiB | peak RSS MiB | peak − before MiB |\n|---|---:|---:|---:|---:|\n");
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    for (name, base, peak, bytes) in &memory {
        md.push_str(&format!(
            "| {name} | {:.0} | {:.0} | {:.0} | {:.0} |\n",
            mib(*bytes as u64),
            mib(*base),
            mib(*peak),
            mib(peak.saturating_sub(*base))
        ));
    }
    let [bw, p95, files] = ratios(&rows, loopback);
    md.push_str(&format!(
        "\nStrata read bandwidth / loopback ceiling: {bw:.2} (the goal's figure; / the from-memory loopback: {:.2}). Strata p95 / Redis p95: {p95:.2}. Strata cached tokens/s / local files: {files:.2}.\n",
        rows[0].read_gib_per_sec / loopback_dram.max(1e-9)
    ));
    for (at, how) in [
        (COLOCATED, "copied into a buffer"),
        (COLOCATED_VIEWS, "views of the mapped files"),
    ] {
        md.push_str(&format!(
            "Strata co-located (KVC.LOCATE, reading the value log's files itself, {how}) cached tokens/s / local files: {:.2} (per run {}); read GiB/s / Strata over KVC.GET: {:.2}.\n",
            tokens_over(&rows, at, 2),
            per_run(&runs, |r| tokens_over(r, at, 2)),
            rows[at].read_gib_per_sec / rows[0].read_gib_per_sec.max(1e-9),
        ));
    }
    md.push_str(&format!(
        "Local files mapped (each file mapped and read once, as the views are) cached tokens/s / local files: {:.2} (per run {}); Strata co-located views / local files mapped: {:.2} (per run {}).\n",
        tokens_over(&rows, FILES_MAPPED, 2),
        per_run(&runs, |r| tokens_over(r, FILES_MAPPED, 2)),
        tokens_over(&rows, COLOCATED_VIEWS, FILES_MAPPED),
        per_run(&runs, |r| tokens_over(r, COLOCATED_VIEWS, FILES_MAPPED)),
    ));
    if let Some(v) = rows.get(VARIANT) {
        md.push_str(&format!(
            "Strata read GiB/s / {}: {:.2} (per run {}); p95: {:.2}; write GiB/s: {:.2}.\n",
            v.backend,
            rows[0].read_gib_per_sec / v.read_gib_per_sec.max(1e-9),
            per_run(&runs, |r| r[0].read_gib_per_sec
                / r[VARIANT].read_gib_per_sec.max(1e-9)),
            rows[0].read_p95_ms / v.read_p95_ms.max(1e-9),
            rows[0].write_gib_per_sec / v.write_gib_per_sec.max(1e-9),
        ));
    }
    if ratios_per_run.len() > 1 {
        let list = |k: usize| per_run(&ratios_per_run, |r| r[k]);
        md.push_str(&format!(
            "Per run: bandwidth / loopback {}; p95 / Redis p95 {}; tokens/s / local files {}.\n",
            list(0),
            list(1),
            list(2)
        ));
    }
    md.push_str(&format!(
        "\nCommand: `strata-bench kvcache --model {} --users {} --turns {} --tokens-per-turn {} --chunk-tokens {} --hot-mib {} --repeat {} --report {}{}{}` ({:.0} s). Chart: `{}.png`.\n",
        a.model, a.users, a.turns, a.tokens_per_turn, a.chunk_tokens, a.hot_mib, runs.len(), a.report,
        if a.durable { " --durable" } else { "" },
        a.strata_set.iter().map(|kv| format!(" --strata-set {kv}"))
            .chain(a.variant_set.iter().map(|kv| format!(" --variant-set {kv}")))
            .collect::<String>(),
        started.elapsed().as_secs_f64(), a.report
    ));
    #[derive(Serialize)]
    struct Report<'a> {
        /// Strata `durability=group` beside Redis `appendfsync always` (else `none` beside
        /// persistence off).
        durable: bool,
        loopback_gib_per_sec: f64,
        /// Loopback through 256 MiB buffers (out of the CPU cache).
        loopback_from_memory_gib_per_sec: f64,
        memcpy_gib_per_sec: f64,
        /// Each backend's median over the runs.
        rows: &'a [Row],
        runs: usize,
        /// Per run: Strata read bandwidth / loopback, p95 / Redis p95, tokens/s / files.
        ratios_per_run: &'a [[f64; 3]],
        /// (server, RSS before, peak RSS, bytes per read) of the in-flight memory test.
        inflight_memory: &'a [(String, u64, u64, usize)],
    }
    crate::report::write(
        out,
        &a.report,
        &md,
        &Report {
            durable: a.durable,
            loopback_gib_per_sec: loopback,
            loopback_from_memory_gib_per_sec: loopback_dram,
            memcpy_gib_per_sec: memcpy,
            rows: &rows,
            runs: runs.len(),
            ratios_per_run: &ratios_per_run,
            inflight_memory: &memory,
        },
    )?;
    crate::report::plot(out, "scripts/plot_kvcache.py", &a.report);
    Ok(())
}
