//! Memory per key beside Redis: the same keys (strings, or collections of `--items` items
//! each: the feature store's hash per entity) written to a real `redis-server` (persistence
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
    /// Bytes per value: a string's, or each item's (a hash field's value, a member, an
    /// element).
    #[arg(long, default_value_t = 100)]
    value_bytes: usize,
    /// What each key holds: a string (`SET`), or a hash (`HSET` of `--items` fields named
    /// `f<n>`), a set (`SADD`), a sorted set (`ZADD`, whole scores) or a list (`RPUSH`) of
    /// `--items` items, written by one command per key.
    #[arg(long, value_enum, default_value_t = Shape::String)]
    kind: Shape,
    /// Items per collection (not for strings).
    #[arg(long, default_value_t = 20)]
    items: usize,
    /// The strata binary to measure.
    #[arg(long, default_value = "target/release/strata")]
    strata: PathBuf,
    /// Extra Strata settings (`key=value`), repeatable.
    #[arg(long = "strata-set")]
    strata_set: Vec<String>,
}

impl Args {
    /// Items per key: `--items`, or 1 for strings.
    fn items(&self) -> usize {
        match self.kind {
            Shape::String => 1,
            _ => self.items,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum Shape {
    String,
    Hash,
    Set,
    Zset,
    List,
}

impl Shape {
    /// Its name on the command line.
    fn command_name(self) -> &'static str {
        match self {
            Shape::String => "string",
            Shape::Hash => "hash",
            Shape::Set => "set",
            Shape::Zset => "zset",
            Shape::List => "list",
        }
    }

    fn command(self) -> &'static str {
        match self {
            Shape::String => "SET",
            Shape::Hash => "HSET",
            Shape::Set => "SADD",
            Shape::Zset => "ZADD",
            Shape::List => "RPUSH",
        }
    }

    /// The arguments after the key of key number `i`'s write: `items` items of `value_bytes`
    /// bytes each (a string's value alone).
    fn args(self, i: u64, items: usize, value_bytes: usize) -> Vec<Vec<u8>> {
        // An item of `value_bytes` bytes that differs by `j` (and, for values, by key).
        let item = |j: u64| -> Vec<u8> {
            let digits = format!("{j}");
            let mut v = vec![b'v'; value_bytes.saturating_sub(digits.len())];
            v.extend_from_slice(&digits.as_bytes()[..digits.len().min(value_bytes)]);
            v
        };
        match self {
            Shape::String => vec![vec![b'v'; value_bytes]],
            Shape::Hash => (0..items as u64)
                .flat_map(|j| [format!("f{j}").into_bytes(), item(i ^ j)])
                .collect(),
            Shape::Set | Shape::List => (0..items as u64).map(item).collect(),
            Shape::Zset => (0..items as u64)
                .flat_map(|j| [format!("{}", (i + j) % 1000).into_bytes(), item(j)])
                .collect(),
        }
    }

    /// The bytes a key's items hold (what the DRAM budget must fit, before overhead).
    fn payload(self, items: usize, value_bytes: usize) -> u64 {
        match self {
            Shape::String => value_bytes as u64,
            _ => (items * (value_bytes + 8)) as u64,
        }
    }
}

/// Writes sent per round trip.
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
    kind: Shape,
    /// Items per key (1 for strings).
    items: usize,
    rows: Vec<Row>,
    /// Strata's RssAnon growth per key over Redis's.
    ratio: f64,
}

pub fn run(a: Args, out: &Path) -> anyhow::Result<()> {
    let started = Instant::now();
    let dir = tempfile::tempdir()?;
    let mut rows = Vec::new();
    let items = a.items();
    for (i, server) in ["redis", "strata"].into_iter().enumerate() {
        let what = format!("{} {}s", a.keys, a.kind.command());
        report::progress(i + 1, 2, &format!("{server}: {what}"));
        let port = free_port()?;
        let proc = match server {
            "redis" => redis_server(port)?,
            _ => {
                // Every key fits in DRAM: keys, values and the tier's overhead, twice over.
                let hot = a.keys * (a.kind.payload(items, a.value_bytes) + 300) * 2;
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
    let shape = match a.kind {
        Shape::String => String::new(),
        k => format!(" --kind {} --items {items}", k.command_name()),
    };
    let command = format!(
        "strata-bench memory --keys {} --value-bytes {}{shape} --strata {}{}",
        a.keys,
        a.value_bytes,
        a.strata.display(),
        a.strata_set
            .iter()
            .map(|s| format!(" --strata-set {s}"))
            .collect::<String>()
    );
    let held = match a.kind {
        Shape::String => format!("{} B values", a.value_bytes),
        k => format!(
            "{} of {items} items of {} B each",
            k.command_name(),
            a.value_bytes
        ),
    };
    let mut md = format!(
        "# Memory per key: Strata beside Redis\n\n{} distinct keys, each a {held}, written \
         through pipelines of {PIPELINE} `{}`s to `redis-server` (persistence off) and to \
         `strata serve` (`durability=none`, every key in DRAM); anonymous resident memory \
         (`RssAnon`) of each process before and after, Strata's once quiet (no write to \
         RocksDB for {} s).\n\n| server | RssAnon before | RssAnon after | bytes per key | counted by \
         the server, per key | write s |\n|---|---:|---:|---:|---:|---:|\n",
        a.keys,
        a.kind.command(),
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
        kind: a.kind,
        items,
        rows,
        ratio,
    };
    let name = match a.kind {
        Shape::String => "memory".to_string(),
        k => format!("memory-{}", k.command_name()),
    };
    report::write(out, &name, &md, &r)
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
    let command = a.kind.command();
    let items = a.items();
    let mut reply = Vec::new();
    let mut sent = 0;
    while sent < a.keys {
        let n = PIPELINE.min(a.keys - sent);
        for i in sent..sent + n {
            let key = format!("key:{i:010}");
            let args = a.kind.args(i, items, a.value_bytes);
            write!(
                w,
                "*{}\r\n${}\r\n{command}\r\n${}\r\n{key}\r\n",
                args.len() + 2,
                command.len(),
                key.len(),
            )?;
            for arg in &args {
                write!(w, "${}\r\n", arg.len())?;
                w.write_all(arg)?;
                w.write_all(b"\r\n")?;
            }
        }
        w.flush()?;
        for _ in 0..n {
            reply.clear();
            std::io::BufRead::read_until(&mut r, b'\n', &mut reply)?;
            anyhow::ensure!(
                reply.first().is_some_and(|b| matches!(b, b'+' | b':')),
                "{server} refused a {command}: {}",
                String::from_utf8_lossy(&reply)
            );
        }
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
