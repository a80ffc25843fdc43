//! GET tails under background work: one client reads keys that DRAM holds, first with the
//! server idle, then for as long as a pipelined writer takes to push the warm tier far past
//! its budget (so write-back settles, the hot log compacts, demotion uploads segments and
//! RocksDB flushes and compacts). Servers start on CPU 0 (so they size their threads for
//! it), the clients run on CPU 1. The report gives the reader's p50/p99/p99.9 in both
//! phases and their ratio, and the disk bytes the server wrote per byte the writer sent (`/proc/PID/io`).
//! The same two phases run against `redis-server` (persistence off) in the same run, as the
//! reference for what a second client's load alone does to the reader's tail.

use std::io::{BufReader, BufWriter, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::report;
use crate::resp::Client;
use crate::servers::{free_port, on_server_core, redis_server, strata_server, wait_port, Proc};

#[derive(clap::Args)]
pub struct Args {
    /// GETs measured idle (under load the reader reads until the writer is done).
    #[arg(long, default_value_t = 100_000)]
    reads: usize,
    /// Keys the reader reads (all in DRAM), of 100 bytes each.
    #[arg(long, default_value_t = 10_000)]
    read_keys: usize,
    /// Bytes the writer sends in the loaded phase (1 KiB values over distinct keys).
    #[arg(long, default_value = "512MiB", value_parser = parse_size)]
    write_bytes: u64,
    /// Strata's warm budget: the writer goes this far past it many times over.
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    warm_bytes_max: u64,
    /// The strata binary to measure.
    #[arg(long, default_value = "target/release/strata")]
    strata: PathBuf,
}

fn parse_size(s: &str) -> Result<u64, String> {
    strata_settings::parse_size(s).ok_or_else(|| format!("not a size: {s}"))
}

/// Value bytes the writer sends per key.
const WRITE_VALUE_BYTES: usize = 1024;
/// SETs per pipelined round trip of the writer.
const WRITE_PIPELINE: usize = 100;
/// How long after the writer stops its disk writes are still counted.
const SETTLE: Duration = Duration::from_secs(5);

#[derive(Serialize, Clone, Copy)]
struct Tail {
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
}

#[derive(Serialize)]
struct Row {
    server: String,
    idle: Tail,
    loaded: Tail,
    /// Loaded p99.9 over idle p99.9.
    p999_ratio: f64,
    /// GETs measured while the writer ran.
    loaded_reads: usize,
    written_bytes: u64,
    /// Bytes the server wrote to disk while loaded, per byte the writer sent.
    disk_bytes_per_user_byte: f64,
    writer_seconds: f64,
}

pub fn run(a: Args, out: &Path) -> anyhow::Result<()> {
    let started = Instant::now();
    let dir = tempfile::tempdir()?;
    let mut rows = Vec::new();
    for (i, server) in ["redis", "strata"].into_iter().enumerate() {
        report::progress(i + 1, 2, &format!("{server}: idle, then under a writer"));
        let port = free_port()?;
        let proc = on_server_core(|| match server {
            "redis" => redis_server(port),
            _ => strata_server(
                &a.strata,
                dir.path(),
                port,
                [
                    "durability=none".to_string(),
                    format!("warm_bytes_max={}", a.warm_bytes_max),
                ],
            ),
        })?;
        wait_port(port)?;
        rows.push(measure(&a, server, &proc, port)?);
    }
    let command = format!(
        "strata-bench tails --reads {} --read-keys {} --write-bytes {} --warm-bytes-max {} \
         --strata {}",
        a.reads,
        a.read_keys,
        a.write_bytes,
        a.warm_bytes_max,
        a.strata.display()
    );
    let mut md = format!(
        "# GET tails under background work\n\nOne client GETs {} keys of 100 B held in DRAM, \
         {} times idle, then over and over while a second client writes {} MiB of 1 KiB values \
         over distinct keys in pipelines of {WRITE_PIPELINE} (Strata: `durability=none`, \
         `warm_bytes_max` {} MiB, so write-back settles, demotion and RocksDB compaction run \
         throughout; Redis: persistence off, the reference for what the second client's load \
         alone does). Servers on CPU 0, both clients on CPU 1.\n\n| server | idle p50 / p99 / p99.9 µs | loaded p50 / p99 / p99.9 µs \
         | p99.9 loaded/idle | loaded reads | disk bytes per user byte | writer s |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
        a.read_keys,
        a.reads,
        a.write_bytes >> 20,
        a.warm_bytes_max >> 20
    );
    for r in &rows {
        md += &format!(
            "| {} | {:.0} / {:.0} / {:.0} | {:.0} / {:.0} / {:.0} | {:.2} | {} | {:.2} | {:.1} |\n",
            r.server,
            r.idle.p50_us,
            r.idle.p99_us,
            r.idle.p999_us,
            r.loaded.p50_us,
            r.loaded.p99_us,
            r.loaded.p999_us,
            r.p999_ratio,
            r.loaded_reads,
            r.disk_bytes_per_user_byte,
            r.writer_seconds
        );
    }
    md += &format!(
        "\nCommand: `{command}` ({:.0} s). Disk bytes are the server's `write_bytes` in \
         `/proc/PID/io` over the loaded phase.\n",
        started.elapsed().as_secs_f64()
    );
    report::write(out, "tails", &md, &rows)
}

/// Bytes process `pid` has caused to be written to storage (`write_bytes` of /proc/PID/io).
fn disk_written(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("write_bytes:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

fn measure(a: &Args, server: &str, proc: &Proc, port: u16) -> anyhow::Result<Row> {
    let pid = proc.0.id();
    let mut reader = Client::connect(port)?;
    let value = vec![b'r'; 100];
    for i in 0..a.read_keys {
        reader.call(&[b"SET", format!("read:{i:08}").as_bytes(), &value])?;
    }
    let (idle, _) = read_tail(&mut reader, a, None::<&std::thread::JoinHandle<()>>)?;
    eprintln!("  {server}: idle p99.9 {:.0} µs", idle.p999_us);
    let sent = Arc::new(AtomicU64::new(0));
    let disk_before = disk_written(pid);
    let writer = {
        let (sent, total) = (Arc::clone(&sent), a.write_bytes);
        std::thread::spawn(move || write_load(port, total, &sent))
    };
    let (loaded, loaded_reads) = read_tail(&mut reader, a, Some(&writer))?;
    let writer_seconds = writer.join().expect("the writer thread")?;
    let written = sent.load(Ordering::Relaxed);
    // What the writes set going (settles, compactions, demotion) finishes meanwhile.
    std::thread::sleep(SETTLE);
    let disk = disk_written(pid).saturating_sub(disk_before);
    eprintln!(
        "  {server}: loaded p99.9 {:.0} µs, {} MiB written",
        loaded.p999_us,
        written >> 20
    );
    Ok(Row {
        server: server.into(),
        idle,
        loaded,
        p999_ratio: loaded.p999_us / idle.p999_us.max(1.0),
        loaded_reads,
        written_bytes: written,
        disk_bytes_per_user_byte: disk as f64 / written.max(1) as f64,
        writer_seconds,
    })
}

/// GETs of the read keys, one at a time: `a.reads` of them, or with `until` as many as fit
/// before that thread ends; their latency percentiles and count.
fn read_tail<T>(
    c: &mut Client,
    a: &Args,
    until: Option<&std::thread::JoinHandle<T>>,
) -> anyhow::Result<(Tail, usize)> {
    let mut lat = Vec::with_capacity(a.reads);
    let mut i = 0;
    while match until {
        Some(w) => !w.is_finished(),
        None => i < a.reads,
    } {
        let key = format!("read:{:08}", (i * 7919) % a.read_keys);
        let t = Instant::now();
        c.call(&[b"GET", key.as_bytes()])?;
        lat.push(t.elapsed());
        i += 1;
        if i % 25_000 == 0 {
            eprintln!("    {i} reads");
        }
    }
    anyhow::ensure!(!lat.is_empty(), "no read was measured");
    lat.sort();
    let at = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)].as_secs_f64() * 1e6;
    let tail = Tail {
        p50_us: at(0.50),
        p99_us: at(0.99),
        p999_us: at(0.999),
    };
    Ok((tail, lat.len()))
}

/// Writes `total` bytes of 1 KiB values over distinct keys in pipelines; returns the
/// seconds it took.
fn write_load(port: u16, total: u64, sent: &AtomicU64) -> anyhow::Result<f64> {
    let t = Instant::now();
    let s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_nodelay(true)?;
    let mut r = BufReader::new(s.try_clone()?);
    let mut w = BufWriter::with_capacity(1 << 20, s);
    let value = vec![b'w'; WRITE_VALUE_BYTES];
    let mut replies = vec![0u8; WRITE_PIPELINE * 5];
    let mut n = 0u64;
    while sent.load(Ordering::Relaxed) < total {
        for _ in 0..WRITE_PIPELINE {
            let key = format!("write:{n:012}");
            n += 1;
            write!(
                w,
                "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${WRITE_VALUE_BYTES}\r\n",
                key.len()
            )?;
            w.write_all(&value)?;
            w.write_all(b"\r\n")?;
        }
        w.flush()?;
        r.read_exact(&mut replies)?;
        anyhow::ensure!(
            replies.chunks(5).all(|c| c == b"+OK\r\n"),
            "a SET was refused: {}",
            String::from_utf8_lossy(&replies[..replies.len().min(120)])
        );
        sent.fetch_add(
            (WRITE_PIPELINE * WRITE_VALUE_BYTES) as u64,
            Ordering::Relaxed,
        );
    }
    Ok(t.elapsed().as_secs_f64())
}
