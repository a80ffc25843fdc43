//! Memory per key beside Redis: the same keys written to a real `redis-server` (persistence
//! off) and to `strata serve` (`durability=none`, a DRAM budget that holds every key), each
//! server's anonymous resident memory (`RssAnon`) read before and after, Strata's once it
//! has gone quiet (RocksDB has taken no write for a while, and a quiet store's memtables
//! are written out). What each server says it holds (Redis's `used_memory`,
//! Strata's DRAM tier) is printed beside it.

use std::io::{BufReader, BufWriter, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::report;
use crate::servers::{free_port, redis_server, strata_server, wait_port, Proc};
use strata_server::rss_anon_bytes_of;

#[derive(clap::Args)]
pub struct Args {
    /// Distinct keys written to each server.
    #[arg(long, default_value_t = 1_000_000)]
    keys: u64,
    /// Bytes per value.
    #[arg(long, default_value_t = 100)]
    value_bytes: usize,
    /// The strata binary to measure.
    #[arg(long, default_value = "target/release/strata")]
    strata: PathBuf,
    /// Extra Strata settings (`key=value`), repeatable.
    #[arg(long = "strata-set")]
    strata_set: Vec<String>,
}

/// SETs sent per round trip.
const PIPELINE: u64 = 1000;
/// The longest wait for Strata to go quiet.
const SETTLE_WAIT: Duration = Duration::from_secs(90);
/// Strata is quiet once RocksDB has taken no write for this long (longer than the server
/// waits before it writes a quiet store's memtables out).
const QUIET: Duration = Duration::from_secs(8);

#[derive(Serialize)]
struct Row {
    server: String,
    rss_anon_before: u64,
    rss_anon_after: u64,
    bytes_per_key: f64,
    /// What the server says it holds: Redis's `used_memory`, Strata's DRAM tier.
    counted_bytes_per_key: f64,
    write_seconds: f64,
}

#[derive(Serialize)]
struct Report {
    command: String,
    keys: u64,
    value_bytes: usize,
    rows: Vec<Row>,
    /// Strata's RssAnon growth per key over Redis's.
    ratio: f64,
}

pub fn run(a: Args, out: &Path) -> anyhow::Result<()> {
    let started = Instant::now();
    let dir = tempfile::tempdir()?;
    let mut rows = Vec::new();
    for (i, server) in ["redis", "strata"].into_iter().enumerate() {
        report::progress(i + 1, 2, &format!("{server}: {} SETs", a.keys));
        let port = free_port()?;
        let proc = match server {
            "redis" => redis_server(port)?,
            _ => {
                // Every key fits in DRAM: keys, values and the tier's overhead, twice over.
                let hot = a.keys * (a.value_bytes as u64 + 300) * 2;
                let settings = [
                    "durability=none".to_string(),
                    format!("hot_bytes_max={hot}"),
                ];
                strata_server(
                    &a.strata,
                    dir.path(),
                    port,
                    settings.iter().chain(&a.strata_set),
                )?
            }
        };
        wait_port(port)?;
        rows.push(measure(&a, server, &proc, port)?);
    }
    let ratio = rows[1].bytes_per_key / rows[0].bytes_per_key.max(1.0);
    let command = format!(
        "strata-bench memory --keys {} --value-bytes {} --strata {}{}",
        a.keys,
        a.value_bytes,
        a.strata.display(),
        a.strata_set
            .iter()
            .map(|s| format!(" --strata-set {s}"))
            .collect::<String>()
    );
    let mut md = format!(
        "# Memory per key: Strata beside Redis\n\n{} distinct keys of {} B values written \
         through pipelines of {PIPELINE} SETs to `redis-server` (persistence off) and to \
         `strata serve` (`durability=none`, every key in DRAM); anonymous resident memory \
         (`RssAnon`) of each process before and after, Strata's once quiet (no write to \
         RocksDB for {} s).\n\n| server | RssAnon before | RssAnon after | bytes per key | counted by \
         the server, per key | write s |\n|---|---:|---:|---:|---:|---:|\n",
        a.keys,
        a.value_bytes,
        QUIET.as_secs()
    );
    for r in &rows {
        md += &format!(
            "| {} | {:.1} MiB | {:.1} MiB | {:.0} | {:.0} | {:.1} |\n",
            r.server,
            r.rss_anon_before as f64 / 1048576.0,
            r.rss_anon_after as f64 / 1048576.0,
            r.bytes_per_key,
            r.counted_bytes_per_key,
            r.write_seconds
        );
    }
    md += &format!(
        "\nStrata/Redis bytes per key: **{ratio:.2}**. \"Counted\" is Redis's `used_memory` \
         and Strata's DRAM tier (`hot_bytes`). Command: `{command}` ({:.0} s).\n",
        started.elapsed().as_secs_f64()
    );
    let r = Report {
        command,
        keys: a.keys,
        value_bytes: a.value_bytes,
        rows,
        ratio,
    };
    report::write(out, "memory", &md, &r)
}

fn measure(a: &Args, server: &str, proc: &Proc, port: u16) -> anyhow::Result<Row> {
    let pid = proc.0.id();
    let stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_nodelay(true)?;
    let mut r = BufReader::new(stream.try_clone()?);
    let mut w = BufWriter::with_capacity(1 << 20, stream);
    std::thread::sleep(Duration::from_secs(1));
    let before = rss_anon_bytes_of(pid);
    let t = Instant::now();
    let value = vec![b'v'; a.value_bytes];
    let mut replies = Vec::new();
    let mut sent = 0;
    while sent < a.keys {
        let n = PIPELINE.min(a.keys - sent);
        for i in sent..sent + n {
            let key = format!("key:{i:010}");
            write!(
                w,
                "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${}\r\n",
                key.len(),
                value.len()
            )?;
            w.write_all(&value)?;
            w.write_all(b"\r\n")?;
        }
        w.flush()?;
        replies.resize(n as usize * 5, 0);
        r.read_exact(&mut replies)?;
        anyhow::ensure!(
            replies.chunks(5).all(|c| c == b"+OK\r\n"),
            "{server} refused a SET: {}",
            String::from_utf8_lossy(&replies[..replies.len().min(200)])
        );
        sent += n;
        if sent % (a.keys / 10).max(1) < n {
            eprintln!("  {server}: {sent} keys written");
        }
    }
    let write_seconds = t.elapsed().as_secs_f64();
    let mut info = |section: &str| -> anyhow::Result<String> {
        write!(w, "*2\r\n$4\r\nINFO\r\n${}\r\n{section}\r\n", section.len())?;
        w.flush()?;
        let mut head = Vec::new();
        std::io::BufRead::read_until(&mut r, b'\n', &mut head)?;
        let len: usize = std::str::from_utf8(&head[1..head.len() - 2])?.parse()?;
        let mut body = vec![0; len + 2];
        r.read_exact(&mut body)?;
        Ok(String::from_utf8_lossy(&body).into_owned())
    };
    let field = |text: &str, name: &str| -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .and_then(|v| v.trim().parse().ok())
    };
    let counted = if server == "redis" {
        field(&info("memory")?, "used_memory").unwrap_or(0)
    } else {
        let deadline = Instant::now() + SETTLE_WAIT;
        let mut last = (None, Instant::now());
        loop {
            let s = info("strata")?;
            // Quiet: no write to RocksDB for a while (write-back's settles done, and the
            // memtables of a quiet store written out).
            let sequence = field(&s, "change_log_sequence");
            if sequence != last.0 {
                last = (sequence, Instant::now());
            }
            if last.1.elapsed() >= QUIET || Instant::now() > deadline {
                anyhow::ensure!(
                    field(&s, "hot_entries") == Some(a.keys),
                    "not every key is in Strata's DRAM tier: {:?}",
                    field(&s, "hot_entries")
                );
                break field(&s, "hot_bytes").unwrap_or(0);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    // Let what the last writes left behind (buffers, a checkpoint's lists) be freed.
    std::thread::sleep(Duration::from_secs(3));
    let after = rss_anon_bytes_of(pid);
    let per_key = |b: u64| b as f64 / a.keys as f64;
    eprintln!(
        "  {server}: RssAnon {:.1} -> {:.1} MiB, {:.0} bytes per key",
        before as f64 / 1048576.0,
        after as f64 / 1048576.0,
        per_key(after.saturating_sub(before))
    );
    Ok(Row {
        server: server.into(),
        rss_anon_before: before,
        rss_anon_after: after,
        bytes_per_key: per_key(after.saturating_sub(before)),
        counted_bytes_per_key: per_key(counted),
        write_seconds,
    })
}
