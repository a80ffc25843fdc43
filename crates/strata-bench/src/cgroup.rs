//! KV-cache reads with each contender in a memory cgroup smaller than its working set:
//! Strata, redis-server and one file per chunk, each with its client
//! (`scripts/kvcache_workload.py`: Strata through `KVCacheClient`, as LMCache's plugin reads
//! it) in a fresh cgroup of the same limit, one after the other. The page cache the files
//! contender reads through is charged to its cgroup, so it reads from disk as it would on a
//! node whose memory is spoken for. cgroup v2 (`memory.max`) or v1
//! (`memory.limit_in_bytes`), written directly; where neither can be made the rows are
//! skipped and the report says why.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::Context;
use serde::Serialize;

use crate::report::progress;
use crate::servers::{free_port, pin, redis_args, wait_port, Proc};

/// Progress steps this part takes.
pub const STEPS: usize = 3;

/// The workload client, carried in the binary so the benchmark runs from any directory.
const WORKLOAD: &str = include_str!("../../../scripts/kvcache_workload.py");

/// Memory a contender's server and client need beside the client's read buffers (the
/// interpreter, one chunk being written, an empty server): the data budget of Strata and
/// Redis is the limit less this and the buffers.
const HEADROOM: u64 = 48 << 20;

#[derive(Serialize, Clone)]
pub struct KvRow {
    pub contender: String,
    pub memory_limit_bytes: u64,
    pub working_set_bytes: u64,
    /// Strata's and Redis's `maxmemory`: the limit less the client's buffers and headroom.
    pub data_budget_bytes: u64,
    pub cached_tokens_per_sec: f64,
    pub read_p50_ms: f64,
    pub read_p95_ms: f64,
    pub hit_rate: f64,
    /// The most the cgroup held at once (anonymous memory and page cache).
    pub peak_bytes: u64,
}

/// A memory cgroup made for one contender, removed when dropped.
struct Cgroup {
    dir: PathBuf,
    v2: bool,
}

impl Cgroup {
    fn new(name: &str, limit: u64) -> anyhow::Result<Cgroup> {
        let v2_root = Path::new("/sys/fs/cgroup");
        let v1_root = Path::new("/sys/fs/cgroup/memory");
        let controllers = std::fs::read_to_string(v2_root.join("cgroup.controllers"));
        let (dir, v2) = if controllers.is_ok_and(|c| c.split_whitespace().any(|x| x == "memory")) {
            // The memory controller must be on for the root's children.
            let _ = std::fs::write(v2_root.join("cgroup.subtree_control"), "+memory");
            (v2_root.join(name), true)
        } else if v1_root.join("memory.limit_in_bytes").exists() {
            (v1_root.join(name), false)
        } else {
            anyhow::bail!("no memory cgroup: neither cgroup v2 with the memory controller nor v1's memory hierarchy is mounted under /sys/fs/cgroup");
        };
        std::fs::create_dir(&dir)
            .with_context(|| format!("cannot create the cgroup {} (needs root)", dir.display()))?;
        let cg = Cgroup { dir, v2 };
        let file = if v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        std::fs::write(cg.dir.join(file), limit.to_string())
            .with_context(|| format!("cannot set {file}"))?;
        Ok(cg)
    }

    /// Runs `program args` inside this cgroup (a shell joins it, then becomes the program).
    fn command(&self, program: &str) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(r#"echo $$ > "$0" && exec "$@""#)
            .arg(self.dir.join("cgroup.procs"))
            .arg(program);
        c
    }

    fn peak(&self) -> u64 {
        let file = if self.v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        };
        std::fs::read_to_string(self.dir.join(file))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Its processes are gone by now (their `Proc`s dropped first); v1 may need a moment
        // to see it.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

/// The sizes: the limit, and the workload's shape (users, turns, chunks per turn, chunk
/// bytes), its working set three halves of the limit or more.
fn shape(quick: bool) -> (u64, [usize; 4]) {
    if quick {
        (160 << 20, [5, 4, 10, 1 << 20])
    } else {
        (320 << 20, [8, 6, 8, 2 << 20])
    }
}

/// What the limit leaves out of the servers' data budget: `HEADROOM` and the client's read
/// buffers (as many chunks as the longest prefix).
fn headroom(quick: bool) -> u64 {
    let (_, [_, turns, per_turn, chunk]) = shape(quick);
    HEADROOM + ((turns - 1) * per_turn * chunk) as u64
}

fn run_one(name: &str, strata: &Path, quick: bool, dir: &Path) -> anyhow::Result<KvRow> {
    let (limit, [users, turns, per_turn, chunk]) = shape(quick);
    let cg = Cgroup::new(
        &format!("strata-bench-{}-{name}", std::process::id()),
        limit,
    )?;
    let port = free_port()?;
    let budget = limit - headroom(quick);
    let server = match name {
        "strata" => {
            let mut c = cg.command(&strata.to_string_lossy());
            c.args(["serve", "--data-dir"])
                .arg(dir.join("strata"))
                .args(["--port", &port.to_string(), "--set", "metrics_port=0"])
                .args(["--set", &format!("maxmemory={budget}")])
                .env("STRATA_LOG_LEVEL", "warn");
            Some(c)
        }
        "redis" => {
            let mut c = cg.command("redis-server");
            c.args(redis_args(port))
                .args(["--appendonly", "no", "--maxmemory", &budget.to_string()])
                .args(["--maxmemory-policy", "allkeys-lru"]);
            Some(c)
        }
        _ => None,
    };
    let _server = match server {
        Some(mut c) => {
            let child = c
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .with_context(|| format!("cannot start the {name} server"))?;
            let p = Proc(child);
            // Servers on core 0, clients on core 1, as in the rest of the run.
            pin(p.0.id(), 0);
            wait_port(port)?;
            Some(p)
        }
        None => None,
    };
    let files = dir.join("files");
    std::fs::create_dir_all(&files)?;
    let script = dir.join("kvcache_workload.py");
    std::fs::write(&script, WORKLOAD)?;
    let out = cg
        .command("python3")
        .arg(&script)
        .args(["--backend", name, "--port", &port.to_string(), "--dir"])
        .arg(&files)
        .args(["--users", &users.to_string(), "--turns", &turns.to_string()])
        .args(["--chunks-per-turn", &per_turn.to_string()])
        .args(["--chunk-bytes", &chunk.to_string()])
        .stderr(Stdio::inherit())
        .output()
        .context("cannot run python3")?;
    anyhow::ensure!(
        out.status.success(),
        "the {name} workload failed ({}); was it killed at the memory limit?",
        out.status
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("the {name} workload printed no result"))?;
    let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
    let peak = cg.peak();
    Ok(KvRow {
        contender: match name {
            "strata" => "strata (KVCacheClient)".into(),
            "redis" => "redis-server (MGET, allkeys-lru)".into(),
            _ => "one file per chunk".into(),
        },
        memory_limit_bytes: limit,
        working_set_bytes: f("working_set_bytes") as u64,
        data_budget_bytes: budget,
        cached_tokens_per_sec: f("cached_tokens_per_sec"),
        read_p50_ms: f("read_p50_ms"),
        read_p95_ms: f("read_p95_ms"),
        hit_rate: f("hit_rate"),
        peak_bytes: peak,
    })
}

/// The three rows, one contender after the other.
pub async fn run(
    strata: &Path,
    quick: bool,
    step: &mut usize,
    total: usize,
) -> anyhow::Result<Vec<KvRow>> {
    let mut rows = Vec::new();
    for name in ["strata", "redis", "files"] {
        *step += 1;
        progress(
            *step,
            total,
            &format!("KV-cache reads in a memory cgroup: {name}"),
        );
        let dir = tempfile::tempdir()?;
        let (strata, dir_path) = (strata.to_path_buf(), dir.path().to_path_buf());
        let row =
            tokio::task::spawn_blocking(move || run_one(name, &strata, quick, &dir_path)).await??;
        rows.push(row);
    }
    Ok(rows)
}

pub fn markdown(rows: &[KvRow], skipped: Option<&str>) -> String {
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let mut md = String::from("\n## KV-cache reads in a memory cgroup\n\n");
    if let Some(why) = skipped {
        md += &format!("Skipped: {why}.\n");
        return md;
    }
    let Some(first) = rows.first() else {
        return md;
    };
    md += &format!(
        "Each contender and its client in a fresh memory cgroup of {:.0} MiB (anonymous \
         memory and page cache together), one after the other; working set {:.0} MiB of \
         chunks of 256 tokens. Strata `maxmemory` and Redis `maxmemory` (`allkeys-lru`) are \
         the limit less {:.0} MiB (the client's read buffers and an allowance for the interpreter and an empty server); the files are read through the page cache the limit \
         bounds. Each turn reads its conversation's whole earlier prefix (cached tokens: \
         leading chunks found), then writes its new chunks.\n\n\
         | contender | cached tokens/s | read p50 ms | read p95 ms | hit rate | cgroup peak MiB |\n\
         |---|---:|---:|---:|---:|---:|\n",
        mib(first.memory_limit_bytes),
        mib(first.working_set_bytes),
        mib(first.memory_limit_bytes - first.data_budget_bytes),
    );
    for r in rows {
        md += &format!(
            "| {} | {:.0} | {:.2} | {:.2} | {:.1}% | {:.0} |\n",
            r.contender,
            r.cached_tokens_per_sec,
            r.read_p50_ms,
            r.read_p95_ms,
            r.hit_rate * 100.0,
            mib(r.peak_bytes)
        );
    }
    md
}
