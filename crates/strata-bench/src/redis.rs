//! `redis-benchmark` against a real `redis-server` and against `strata serve`, in one run on
//! one machine, reported side by side as Strata/Redis ratios.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context};
use serde::Serialize;

use crate::servers::{free_port, redis_server_with, strata_server, wait_port};

#[derive(Debug, Clone, Serialize)]
struct Figures {
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
struct Row {
    test: String,
    value_bytes: usize,
    clients: u32,
    pipeline: u32,
    redis: Figures,
    strata: Figures,
    /// Strata/Redis throughput: above 1 means Strata is faster.
    rps_ratio: f64,
    /// Strata/Redis p50 latency: below 1 means Strata is faster.
    p50_ratio: f64,
}

/// Runs one redis-benchmark invocation and returns figures per test name.
fn bench(port: u16, args: &[String]) -> anyhow::Result<Vec<(String, Figures)>> {
    let out = Command::new("redis-benchmark")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "--csv",
            "-r",
            "100000",
        ])
        .args(args)
        .stderr(Stdio::null())
        .output()
        .context("redis-benchmark must be installed (Debian redis-tools)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut rows = Vec::new();
    for line in text.lines().skip(1) {
        let cols: Vec<String> = line
            .split("\",\"")
            .map(|c| c.trim_matches('"').to_string())
            .collect();
        if cols.len() < 8 {
            continue;
        }
        let f = |i: usize| cols[i].parse::<f64>().unwrap_or(f64::NAN);
        let name = cols[0].split_whitespace().next().unwrap_or("").to_string();
        rows.push((
            name,
            Figures {
                rps: f(1),
                p50_ms: f(4),
                p99_ms: f(6),
            },
        ));
    }
    if rows.is_empty() {
        bail!("redis-benchmark printed no results: {text}");
    }
    Ok(rows)
}

/// What one run compares: the servers' settings, and the tests and shapes it runs.
struct Mode {
    report: &'static str,
    redis: Vec<String>,
    strata_durability: &'static str,
    tests: &'static str,
    /// MGET of 10 keys (`-t mget` reads one key ten times) or MSET of 10.
    multi: &'static str,
    sizes: &'static [usize],
    /// (clients, pipeline, requests divisor).
    shapes: &'static [(u32, u32, u64)],
    about: &'static str,
}

impl Mode {
    fn new(durable: bool, aof_dir: &Path) -> Mode {
        match durable {
            false => Mode {
                report: "redis-benchmark",
                redis: vec!["--appendonly".into(), "no".into()],
                strata_durability: "none",
                tests: "set,get,incr",
                multi: "MGET",
                sizes: &[3, 1024],
                shapes: &[(50, 1, 1), (50, 16, 1), (1, 1, 10)],
                about: "Redis 7 with persistence off (`--save '' --appendonly no`);\nStrata with `durability=none` (writes still go through RocksDB's WAL, unsynced)",
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
                tests: "set,incr",
                multi: "MSET",
                sizes: &[3],
                shapes: &[(50, 1, 1), (50, 16, 1), (1, 1, 10), (1, 16, 10)],
                about: "Durable writes: Redis 7 with `--appendonly yes --appendfsync always` (a reply is sent\nafter the AOF is fsynced) and Strata with its default `durability=group` (a reply is sent\nafter the group commit's fsync covers the write)",
            },
        }
    }
}

pub fn run(requests: u64, strata_bin: &Path, durable: bool, out: &Path) -> anyhow::Result<()> {
    let started = Instant::now();
    let dir = tempfile::tempdir()?;
    let mode = Mode::new(durable, dir.path());
    let redis_port = free_port()?;
    let redis_args: Vec<&str> = mode.redis.iter().map(String::as_str).collect();
    let _redis = redis_server_with(redis_port, &redis_args)?;
    let strata_port = free_port()?;
    let _strata = strata_server(
        strata_bin,
        dir.path(),
        strata_port,
        [format!("durability={}", mode.strata_durability)],
    )?;
    wait_port(redis_port)?;
    wait_port(strata_port)?;

    // Throughput at 50 clients, latency with one client (a tenth of the requests).
    let shapes: Vec<(u32, u32, u64)> = mode
        .shapes
        .iter()
        .map(|&(c, p, div)| (c, p, (requests / div).max(1000)))
        .collect();
    let sizes = mode.sizes;
    let total = shapes.len() * sizes.len() * 2;
    let mut step = 0;
    let mut rows = Vec::new();
    for &size in sizes {
        for &(clients, pipeline, n) in &shapes {
            let mut per_server = Vec::new();
            for (name, port) in [("redis", redis_port), ("strata", strata_port)] {
                step += 1;
                crate::report::progress(
                    step,
                    total,
                    &format!("{name}: {n} requests, {clients} clients, -P {pipeline}, {size} B"),
                );
                let common = vec![
                    "-n".into(),
                    n.to_string(),
                    "-c".into(),
                    clients.to_string(),
                    "-P".into(),
                    pipeline.to_string(),
                    "-d".into(),
                    size.to_string(),
                ];
                let mut args = common.clone();
                args.extend(["-t".into(), mode.tests.into()]);
                let mut figs = bench(port, &args)?;
                let mut margs = common;
                // Ten random keys (and, for MSET, a value of the row's size after each).
                let value = "x".repeat(size);
                margs.push(mode.multi.into());
                for _ in 0..10 {
                    margs.push("key:__rand_int__".into());
                    if mode.multi == "MSET" {
                        margs.push(value.clone());
                    }
                }
                figs.extend(bench(port, &margs)?);
                per_server.push(figs);
            }
            for (test, r) in &per_server[0] {
                let Some((_, s)) = per_server[1].iter().find(|(t, _)| t == test) else {
                    continue;
                };
                let row = Row {
                    test: test.clone(),
                    value_bytes: size,
                    clients,
                    pipeline,
                    redis: r.clone(),
                    strata: s.clone(),
                    rps_ratio: s.rps / r.rps,
                    p50_ratio: s.p50_ms / r.p50_ms.max(0.0005),
                };
                eprintln!(
                    "  {:<5} {:>5} B c={:<2} P={:<2} redis {:>10.0} ops/s p50 {:.3} ms | strata {:>10.0} ops/s p50 {:.3} ms | ratio {:.2}",
                    row.test, size, clients, pipeline, r.rps, r.p50_ms, s.rps, s.p50_ms, row.rps_ratio
                );
                rows.push(row);
            }
        }
    }
    let mut md = String::from("# redis-benchmark: Strata beside Redis\n\n");
    md.push_str(&format!(
        "Same machine, same run, loopback. {}. Keys drawn from\n100,000 (`-r 100000`); {} takes 10 keys. {requests} requests per test at 50 clients; a tenth of that\nfor the one-client rows. Ratios are Strata/Redis: throughput above 1 and p50 below 1\nmean Strata is ahead. One round, servers and client unpinned (a quick look); the\nhot-path protocol (both servers on one core, the client on the other, five alternating\nrounds, medians, server CPU) is `scripts/ab.py --old redis`.\n\n",
        mode.about, mode.multi
    ));
    md.push_str("| test | value | clients | pipeline | Redis ops/s | Strata ops/s | ops ratio | Redis p50 ms | Strata p50 ms | p50 ratio | Redis p99 ms | Strata p99 ms |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in &rows {
        md.push_str(&format!(
            "| {} | {} B | {} | {} | {:.0} | {:.0} | {:.2} | {:.3} | {:.3} | {:.2} | {:.3} | {:.3} |\n",
            r.test, r.value_bytes, r.clients, r.pipeline, r.redis.rps, r.strata.rps, r.rps_ratio, r.redis.p50_ms, r.strata.p50_ms, r.p50_ratio, r.redis.p99_ms, r.strata.p99_ms
        ));
    }
    md.push_str(&format!(
        "\nCommand: `cargo run --release -p strata-bench -- redis --requests {requests}{}` ({:.0} s). Chart: `{}.png`.\n",
        if durable { " --durable" } else { "" },
        started.elapsed().as_secs_f64(),
        mode.report
    ));
    crate::report::write(out, mode.report, &md, &rows)?;
    crate::report::plot(out, "scripts/plot_redis_bench.py", mode.report);
    Ok(())
}
