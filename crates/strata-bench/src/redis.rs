//! `redis-benchmark` against a real `redis-server` and against `strata serve`, in one run
//! on one machine, with the hot-path protocol: both servers started on CPU 0 (so each sizes
//! its threads for the one CPU it has, as under `taskset -c 0`), `redis-benchmark` on CPU 1,
//! several rounds in which the two take turns going first, medians. Reported per row as
//! Strata/Redis ratios of throughput, p99 and server CPU per operation, beside the goals.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context};
use serde::Serialize;

use crate::resp::Client;
use crate::servers::{
    free_port, on_server_core, redis_server_with, strata_server, wait_port, Proc,
};

#[derive(Debug, Clone, Copy, Serialize)]
struct Figures {
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// The CPU time of the server's threads over the test, per request.
    cpu_us_per_op: f64,
}

#[derive(Debug, Clone, Serialize)]
struct Row {
    test: String,
    value_bytes: usize,
    clients: u32,
    pipeline: u32,
    /// Medians over the rounds.
    redis: Figures,
    strata: Figures,
    /// Strata/Redis throughput: above 1 means Strata is faster.
    rps_ratio: f64,
    /// Strata/Redis p50 latency: below 1 means Strata is faster.
    p50_ratio: f64,
    p99_ratio: f64,
    cpu_ratio: f64,
    /// (max − min) / median of Redis's own throughput over the rounds: the machine's noise.
    redis_spread: f64,
}

/// One test: its name in the report, what `redis-benchmark` is asked to send, and how many
/// distinct keys it draws from.
struct Test {
    name: &'static str,
    /// Reads: the keyspace is written first with the row's value size, so every read hits.
    read: bool,
    keyspace: u64,
    args: fn(usize) -> Vec<String>,
}

/// Keys the tests draw from (`-r`): `key:` and twelve digits.
const KEYSPACE: u64 = 100_000;
/// The wide write's keyspace: beyond what write-back's coalescing absorbs.
const WIDE_KEYSPACE: u64 = 10_000_000;
/// (clients, pipeline): 50 clients and one, without and with pipelining.
const SHAPES: [(u32, u32); 4] = [(50, 1), (50, 16), (1, 1), (1, 16)];

fn multi(command: &str, keys: usize, value: Option<usize>) -> Vec<String> {
    let mut a = vec![command.to_string()];
    for _ in 0..keys {
        a.push("key:__rand_int__".into());
        if let Some(size) = value {
            a.push("x".repeat(size));
        }
    }
    a
}

fn tests(durable: bool) -> Vec<Test> {
    let t = |name, read, keyspace, args| Test {
        name,
        read,
        keyspace,
        args,
    };
    if durable {
        return vec![
            t("set", false, KEYSPACE, |_| vec!["-t".into(), "set".into()]),
            t("incr", false, KEYSPACE, |_| {
                vec!["-t".into(), "incr".into()]
            }),
            t("mset", false, KEYSPACE, |size| {
                multi("MSET", 10, Some(size))
            }),
        ];
    }
    vec![
        t("set", false, KEYSPACE, |_| vec!["-t".into(), "set".into()]),
        t("get", true, KEYSPACE, |_| vec!["-t".into(), "get".into()]),
        t("incr", false, KEYSPACE, |_| {
            vec!["-t".into(), "incr".into()]
        }),
        t("mget", true, KEYSPACE, |_| multi("MGET", 10, None)),
        t("mget100", true, KEYSPACE, |_| multi("MGET", 100, None)),
        t("setwide", false, WIDE_KEYSPACE, |_| {
            vec!["-t".into(), "set".into()]
        }),
    ]
}

/// The rows of a run: (test index, value bytes, clients, pipeline), a value size at a
/// time, its reads first (so one fill of the keyspace serves them all).
fn rows(tests: &[Test], durable: bool) -> Vec<(usize, usize, u32, u32)> {
    let sizes: &[usize] = if durable { &[3] } else { &[3, 1024] };
    let mut out = Vec::new();
    for &size in sizes {
        for read in [true, false] {
            for (i, t) in tests.iter().enumerate().filter(|(_, t)| t.read == read) {
                // A counter's value is its digits; the wide write is one row.
                if (t.name == "incr" || t.name == "setwide") && size != 3 {
                    continue;
                }
                for &(clients, pipeline) in &SHAPES {
                    if t.name == "setwide" && (clients, pipeline) != (50, 16) {
                        continue;
                    }
                    out.push((i, size, clients, pipeline));
                }
            }
        }
    }
    out
}

/// CPU seconds the threads of process `pid` have run so far (the scheduler's own count in
/// nanoseconds, `/proc/PID/task/*/schedstat`: clock ticks would be too coarse for a test of
/// a tenth of a second).
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    let ns: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 / 1e9
}

/// Runs one redis-benchmark invocation (on this process's CPU) and returns its figures.
fn bench(
    port: u16,
    test: &Test,
    size: usize,
    shape: (u32, u32),
    n: u64,
) -> anyhow::Result<Figures> {
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "--csv"])
        .args(["-r", &test.keyspace.to_string(), "-n", &n.to_string()])
        .args(["-c", &shape.0.to_string(), "-P", &shape.1.to_string()])
        .args(["-d", &size.to_string()])
        .args((test.args)(size))
        .stderr(Stdio::null())
        .output()
        .context("redis-benchmark must be installed (Debian redis-tools)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text.lines().skip(1) {
        let cols: Vec<&str> = line.split("\",\"").map(|c| c.trim_matches('"')).collect();
        if cols.len() < 8 {
            continue;
        }
        let f = |i: usize| cols[i].parse::<f64>().unwrap_or(f64::NAN);
        return Ok(Figures {
            rps: f(1),
            p50_ms: f(4),
            p99_ms: f(6),
            cpu_us_per_op: 0.0,
        });
    }
    bail!(
        "redis-benchmark printed no results for {}: {text}",
        test.name
    )
}

/// Writes every key of the keyspace with a value of `size` bytes, so reads hit.
fn prefill(port: u16, size: usize) -> anyhow::Result<()> {
    let mut c = Client::connect(port)?;
    let value = vec![b'v'; size];
    let keys: Vec<String> = (0..KEYSPACE).map(|i| format!("key:{i:012}")).collect();
    for chunk in keys.chunks(1000) {
        let cmds: Vec<Vec<&[u8]>> = chunk
            .iter()
            .map(|k| vec![&b"SET"[..], k.as_bytes(), &value])
            .collect();
        c.pipeline(&cmds)?;
    }
    Ok(())
}

/// What one run compares: the servers' settings.
struct Mode {
    report: &'static str,
    redis: Vec<String>,
    strata_durability: &'static str,
    about: &'static str,
}

impl Mode {
    fn new(durable: bool, aof_dir: &Path) -> Mode {
        match durable {
            false => Mode {
                report: "redis-benchmark",
                redis: vec!["--appendonly".into(), "no".into()],
                strata_durability: "none",
                about: "Redis 7 with persistence off (`--save '' --appendonly no`) beside Strata with \
                        `durability=none` (a SIGKILL may lose up to `none_flush_ms` of acknowledged writes)",
            },
            true => Mode {
                report: "redis-benchmark-durable",
                redis: vec![
                    "--appendonly".into(),
                    "yes".into(),
                    "--appendfsync".into(),
                    "always".into(),
                    "--dir".into(),
                    aof_dir.display().to_string(),
                ],
                strata_durability: "group",
                about: "Durable writes: Redis 7 with `--appendonly yes --appendfsync always` (a reply is sent \
                        after the AOF is fsynced) beside Strata with its default `durability=group` (a reply \
                        is sent after the group commit's fsync covers the write)",
            },
        }
    }
}

/// The two servers of one round, fresh, each started on the servers' CPU.
fn start(mode: &Mode, strata_bin: &Path, dir: &Path) -> anyhow::Result<[(Proc, u16); 2]> {
    let redis_port = free_port()?;
    let strata_port = free_port()?;
    let redis_args: Vec<&str> = mode.redis.iter().map(String::as_str).collect();
    let redis = on_server_core(|| redis_server_with(redis_port, &redis_args))?;
    let strata = on_server_core(|| {
        strata_server(
            strata_bin,
            dir,
            strata_port,
            [format!("durability={}", mode.strata_durability)],
        )
    })?;
    wait_port(redis_port)?;
    wait_port(strata_port)?;
    Ok([(redis, redis_port), (strata, strata_port)])
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    match xs.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => xs[n / 2],
        n => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

fn medians(fs: &[Figures]) -> Figures {
    let m = |f: fn(&Figures) -> f64| median(fs.iter().map(f).collect());
    Figures {
        rps: m(|f| f.rps),
        p50_ms: m(|f| f.p50_ms),
        p99_ms: m(|f| f.p99_ms),
        cpu_us_per_op: m(|f| f.cpu_us_per_op),
    }
}

fn geomean(xs: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = xs.fold((0.0, 0usize), |(s, n), x| (s + x.ln(), n + 1));
    (sum / n.max(1) as f64).exp()
}

pub fn run(
    requests: u64,
    rounds: usize,
    strata_bin: &Path,
    durable: bool,
    out: &Path,
) -> anyhow::Result<()> {
    anyhow::ensure!(rounds >= 1, "--rounds must be at least 1");
    let started = Instant::now();
    let tests = tests(durable);
    let rows = rows(&tests, durable);
    // figures[row][server] over the rounds; server 0 is Redis, 1 Strata.
    let mut figures: Vec<[Vec<Figures>; 2]> = vec![[Vec::new(), Vec::new()]; rows.len()];
    let total = rounds * rows.len();
    let mut step = 0;
    for round in 0..rounds {
        let dir = tempfile::tempdir()?;
        let mode = Mode::new(durable, dir.path());
        let servers = start(&mode, strata_bin, dir.path())?;
        // The servers take turns going first: Redis in even rounds.
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        let mut filled = None;
        for (r, &(t, size, clients, pipeline)) in rows.iter().enumerate() {
            let test = &tests[t];
            step += 1;
            crate::report::progress(
                step,
                total,
                &format!(
                    "round {}/{rounds}: {} {size} B, {clients} clients, -P {pipeline}",
                    round + 1,
                    test.name
                ),
            );
            if test.read && filled != Some(size) {
                for (_, port) in &servers {
                    prefill(*port, size)?;
                }
                filled = Some(size);
            } else if !test.read {
                filled = None;
            }
            // A tenth of the requests for one client.
            let n = if clients > 1 {
                requests
            } else {
                (requests / 10).max(1000)
            };
            for &s in &order {
                let (proc, port) = &servers[s];
                let pid = proc.0.id();
                let cpu = cpu_seconds(pid);
                let mut f = bench(*port, test, size, (clients, pipeline), n)?;
                f.cpu_us_per_op = (cpu_seconds(pid) - cpu) * 1e6 / n as f64;
                figures[r][s].push(f);
            }
            let [redis, strata] = &figures[r];
            eprintln!(
                "  redis {:>9.0}/s  strata {:>9.0}/s  ratio {:.2}",
                redis[round].rps,
                strata[round].rps,
                strata[round].rps / redis[round].rps
            );
        }
    }
    let mut report = Vec::new();
    for (r, &(t, size, clients, pipeline)) in rows.iter().enumerate() {
        let [redis_all, strata_all] = &figures[r];
        let (redis, strata) = (medians(redis_all), medians(strata_all));
        let rps: Vec<f64> = redis_all.iter().map(|f| f.rps).collect();
        let spread = (rps.iter().cloned().fold(f64::MIN, f64::max)
            - rps.iter().cloned().fold(f64::MAX, f64::min))
            / redis.rps;
        report.push(Row {
            test: tests[t].name.to_string(),
            value_bytes: size,
            clients,
            pipeline,
            redis,
            strata,
            rps_ratio: strata.rps / redis.rps,
            p50_ratio: strata.p50_ms / redis.p50_ms.max(0.0005),
            p99_ratio: strata.p99_ms / redis.p99_ms.max(0.0005),
            cpu_ratio: strata.cpu_us_per_op / redis.cpu_us_per_op,
            redis_spread: spread,
        });
    }
    // The settings as the report describes them (the AOF's directory is gone by now).
    let mode = Mode::new(durable, Path::new("."));
    let md = markdown(
        &mode, &report, requests, rounds, durable, strata_bin, started,
    );
    crate::report::write(out, mode.report, &md, &report)?;
    crate::report::plot(out, "scripts/plot_redis_bench.py", mode.report);
    Ok(())
}

fn markdown(
    mode: &Mode,
    rows: &[Row],
    requests: u64,
    rounds: usize,
    durable: bool,
    strata_bin: &Path,
    started: Instant,
) -> String {
    let mut md = String::from("# redis-benchmark: Strata beside Redis\n\n");
    md += &format!(
        "{}. Same machine, same run, loopback: both servers on CPU 0 (started there), \
         `redis-benchmark` on CPU 1; {rounds} rounds with fresh servers, the two taking turns \
         going first; medians. Keys drawn from {KEYSPACE} (`-r`), written first with the row's \
         value size before the read rows, so reads hit; `setwide` writes over {WIDE_KEYSPACE} \
         keys; `mget`/`mset` take 10 keys, `mget100` 100. {requests} requests per test at 50 \
         clients, a tenth for one client. Ratios are Strata/Redis: throughput above 1, latency \
         and CPU per operation below 1 mean Strata is ahead. `spread`: (max − min) / median of \
         Redis's own throughput over the rounds.\n\n",
        mode.about
    );
    let ratios: Vec<f64> = rows.iter().map(|r| r.rps_ratio).collect();
    let gm = geomean(ratios.iter().copied());
    let below: Vec<String> = rows
        .iter()
        .filter(|r| r.rps_ratio < 0.95)
        .map(|r| format!("{} ({:.2})", label(r), r.rps_ratio))
        .collect();
    md += "## Goals\n\n";
    if durable {
        md += &format!(
            "- Throughput, geometric mean of the ratios ≥ 1.0: **{gm:.2}** ({}).\n",
            if gm >= 1.0 { "met" } else { "missed" }
        );
    } else {
        let p99: Vec<String> = rows
            .iter()
            .filter(|r| r.p99_ratio > 1.1)
            .map(|r| format!("{} ({:.2})", label(r), r.p99_ratio))
            .collect();
        let cpu: Vec<&Row> = rows.iter().filter(|r| r.pipeline == 16).collect();
        let cpu_over: Vec<String> = cpu
            .iter()
            .filter(|r| r.cpu_ratio > 1.25)
            .map(|r| format!("{} ({:.2})", label(r), r.cpu_ratio))
            .collect();
        md += &format!(
            "- Throughput, every ratio ≥ 0.95: {} of {} rows{}; geometric mean ≥ 1.0: **{gm:.2}**.\n",
            rows.len() - below.len(),
            rows.len(),
            list(&below)
        );
        md += &format!(
            "- p99 ≤ 1.1× Redis's: {} of {} rows{}.\n",
            rows.len() - p99.len(),
            rows.len(),
            list(&p99)
        );
        md += &format!(
            "- Server CPU per operation ≤ 1.25× Redis's on the `-P 16` rows: {} of {}{}; \
             geometric mean of those ratios {:.2}.\n",
            cpu.len() - cpu_over.len(),
            cpu.len(),
            list(&cpu_over),
            geomean(cpu.iter().map(|r| r.cpu_ratio))
        );
    }
    md += "\n| test | value | clients | pipeline | Redis ops/s | Strata ops/s | ops ratio | spread | Redis p50 ms | Strata p50 ms | Redis p99 ms | Strata p99 ms | p99 ratio | Redis CPU µs/op | Strata CPU µs/op | CPU ratio |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for r in rows {
        md += &format!(
            "| {} | {} B | {} | {} | {:.0} | {:.0} | {:.2} | {:.2} | {:.3} | {:.3} | {:.3} | {:.3} | {:.2} | {:.2} | {:.2} | {:.2} |\n",
            r.test, r.value_bytes, r.clients, r.pipeline, r.redis.rps, r.strata.rps, r.rps_ratio,
            r.redis_spread, r.redis.p50_ms, r.strata.p50_ms, r.redis.p99_ms, r.strata.p99_ms,
            r.p99_ratio, r.redis.cpu_us_per_op, r.strata.cpu_us_per_op, r.cpu_ratio
        );
    }
    md += &format!(
        "\nCommand: `strata-bench redis --requests {requests} --rounds {rounds} --strata {}{}` \
         ({:.0} s). Chart: `{}.png`.\n",
        strata_bin.display(),
        if durable { " --durable" } else { "" },
        started.elapsed().as_secs_f64(),
        mode.report
    );
    md
}

fn label(r: &Row) -> String {
    format!(
        "{} {} B c{} P{}",
        r.test, r.value_bytes, r.clients, r.pipeline
    )
}

/// The rows a goal's count leaves out, named after it; nothing when it leaves out none.
fn list(items: &[String]) -> String {
    if items.is_empty() {
        String::new()
    } else {
        format!(" (not: {})", items.join(", "))
    }
}
