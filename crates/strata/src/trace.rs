//! `strata trace replay`: hit rates of cache policies on a trace, beside Belady's optimum.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use strata_policy::{load_trace, PolicyKind};

#[derive(clap::Args)]
pub struct ReplayArgs {
    /// The trace file: Mooncake JSON lines, or one key per line.
    #[arg(long, default_value = "traces/conversation_trace.jsonl")]
    trace: PathBuf,
    /// lru, s3fifo, wtinylfu, strata, opt, or all.
    #[arg(long, default_value = "all")]
    policy: String,
    /// Cache capacities in blocks (repeatable); default 1000 2000 5859 10000 20000.
    #[arg(long = "capacity-blocks")]
    capacity_blocks: Vec<usize>,
    /// Print one JSON object per result instead of the table (for scripts).
    #[arg(long)]
    json: bool,
    /// Where the Markdown, JSON and PNG reports go.
    #[arg(long, default_value = "reports")]
    out: PathBuf,
    /// Replay against the real engine (RocksDB and a local object-store directory in a
    /// temporary directory) and report which tier served each block.
    #[arg(long)]
    engine: bool,
    /// With --engine: DRAM capacity in blocks.
    #[arg(long, default_value_t = 1000)]
    hot_blocks: u64,
    /// With --engine: RocksDB capacity in blocks (the rest is demoted to the cold tier).
    #[arg(long, default_value_t = 5859)]
    warm_blocks: u64,
    /// With --engine: bytes stored per block (a 512-token Llama-3.1-8B block is 64 MiB).
    #[arg(long, default_value_t = 256)]
    value_bytes: usize,
    /// With --engine: the DRAM policy, lru or strata.
    #[arg(long, default_value = "strata")]
    hot_policy: String,
    /// A namespace sharing one pool with the others, as NAME=TRACE[@RATE] (repeatable;
    /// RATE: its requests per round, 1 unless given). With namespaces the replay reports
    /// each one's hit rate alone, sharing the pool, and sharing it with the --quota given.
    #[arg(long = "namespace")]
    namespaces: Vec<String>,
    /// With --namespace: a namespace's quota, as NAME=BLOCKS or NAME=PERCENT% of the
    /// capacity (repeatable).
    #[arg(long = "quota")]
    quotas: Vec<String>,
}

/// The capacities asked for, or the default ones.
fn capacities(args: &ReplayArgs) -> Vec<usize> {
    if args.capacity_blocks.is_empty() {
        vec![1000, 2000, 5859, 10000, 20000]
    } else {
        args.capacity_blocks.clone()
    }
}

#[derive(serde::Serialize)]
struct Row {
    policy: &'static str,
    capacity_blocks: usize,
    hit_rate: f64,
    hits: u64,
    blocks: u64,
}

/// `cfg`: the settings `--engine` starts from (`--set` and the configuration file apply);
/// the replay's own flags, a temporary data directory and a local object-store directory
/// in it take precedence. `sets`: the `--set` flags, for the report's command line.
pub fn replay(args: &ReplayArgs, cfg: &crate::config::Config, sets: &[String]) -> Result<()> {
    if !args.namespaces.is_empty() {
        let caps = capacities(args);
        return crate::namespaces::replay(
            &args.namespaces,
            &args.quotas,
            &caps,
            args.json,
            &args.out,
        );
    }
    let trace = load_trace(&args.trace).map_err(anyhow::Error::msg)?;
    if trace.is_empty() {
        bail!("trace {} holds no requests", args.trace.display());
    }
    if args.engine {
        return crate::runtime::runtime()?.block_on(replay_engine(args, cfg, sets, &trace));
    }
    let policies: Vec<PolicyKind> = if args.policy == "all" {
        PolicyKind::ALL.to_vec()
    } else {
        vec![args.policy.parse().map_err(anyhow::Error::msg)?]
    };
    let caps = capacities(args);
    let started = Instant::now();
    let total = policies.len() * caps.len();
    let mut rows = Vec::new();
    for (i, (&cap, &p)) in caps
        .iter()
        .flat_map(|c| policies.iter().map(move |p| (c, p)))
        .enumerate()
    {
        if !args.json {
            eprintln!("[{}/{total}] {} at {cap} blocks", i + 1, p.name());
        }
        let r = strata_policy::replay(&trace, p, cap);
        let row = Row {
            policy: p.name(),
            capacity_blocks: cap,
            hit_rate: r.hit_rate(),
            hits: r.hits,
            blocks: r.blocks,
        };
        if args.json {
            println!("{}", serde_json::to_string(&row)?);
        }
        rows.push(row);
    }
    if args.json {
        return Ok(());
    }
    let ceiling = strata_policy::replay(&trace, PolicyKind::Lru, usize::MAX / 2).hit_rate();
    let mut md = format!(
        "# Trace replay: {}\n\n{} requests, {} blocks. A block hits only if every earlier block of its request hit;\nafter each request all its blocks are stored. One cache tier. Ceiling (unlimited capacity): {:.1}%.\n\n| capacity (blocks) |",
        args.trace.display(),
        trace.len(),
        rows.first().map_or(0, |r| r.blocks),
        ceiling * 100.0
    );
    for p in &policies {
        md.push_str(&format!(" {} |", p.name()));
    }
    md.push_str("\n|---:|");
    md.push_str(&"---:|".repeat(policies.len()));
    md.push('\n');
    for &cap in &caps {
        md.push_str(&format!("| {cap} |"));
        for p in &policies {
            let r = rows
                .iter()
                .find(|r| r.capacity_blocks == cap && r.policy == p.name())
                .expect("measured");
            md.push_str(&format!(" {:.1}% |", r.hit_rate * 100.0));
        }
        md.push('\n');
    }
    md.push_str(&format!(
        "\nCommand: `strata trace replay --trace {}` ({:.1} s). Chart: `trace-replay.png`.\n",
        args.trace.display(),
        started.elapsed().as_secs_f64()
    ));
    std::fs::create_dir_all(&args.out)?;
    std::fs::write(args.out.join("trace-replay.md"), &md)?;
    let json = args.out.join("trace-replay.json");
    std::fs::write(&json, serde_json::to_string_pretty(&rows)?)?;
    print!("{md}");
    let png = args.out.join("trace-replay.png");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/plot_trace_replay.py"
    );
    match std::process::Command::new("python3")
        .arg(script)
        .arg(&json)
        .arg(&png)
        .status()
    {
        Ok(s) if s.success() => {}
        _ => eprintln!("chart not drawn (needs python3 with matplotlib)"),
    }
    Ok(())
}

#[derive(serde::Serialize, Default)]
struct TierCounts {
    hot_policy: String,
    hot_blocks: u64,
    warm_blocks: u64,
    value_bytes: usize,
    blocks: u64,
    hot: u64,
    warm: u64,
    cold: u64,
    miss: u64,
    demotions: u64,
    /// Values read from the object store (or prefetched and read) written back to warm.
    returns_to_warm: u64,
    /// The `--set` flags the engine ran with.
    settings: Vec<String>,
}

/// Replays the trace against the real engine: per request, one batch read of its blocks
/// (a block counts only if its whole prefix was found), then the missing blocks are written.
async fn replay_engine(
    args: &ReplayArgs,
    cfg: &crate::config::Config,
    sets: &[String],
    trace: &[strata_policy::Request],
) -> Result<()> {
    use strata_engine::{PutOptions, Tier};
    let dir = tempfile::tempdir()?;
    // A stored key: 3 bytes of database and slot, then "blk:" and 16 hex digits.
    let key_bytes = 23u64;
    let mut o = cfg.clone();
    o.node.data_dir = dir.path().to_path_buf();
    let e = &mut o.engine;
    e.cold.cold_url = String::new();
    e.hot.hot_policy = args
        .hot_policy
        .parse()
        .map_err(|e: strata_engine::Error| anyhow::anyhow!("{e}"))?;
    e.hot.hot_shard_count = 4;
    e.hot.hot_bytes_max = args.hot_blocks
        * (key_bytes + args.value_bytes as u64 + strata_engine::HOT_ENTRY_OVERHEAD_BYTES as u64);
    e.warm.warm_bytes_max = args.warm_blocks
        * (key_bytes * 2 + args.value_bytes as u64 + strata_format::WARM_HEADER_BYTES as u64);
    e.warm.durability = strata_engine::Durability::None;
    e.warm.background_interval_ms = 3_600_000;
    let engine = o.open_engine().await?;
    let value = bytes::Bytes::from(vec![0x5au8; args.value_bytes]);
    let mut c = TierCounts {
        hot_policy: args.hot_policy.clone(),
        hot_blocks: args.hot_blocks,
        warm_blocks: args.warm_blocks,
        value_bytes: args.value_bytes,
        ..Default::default()
    };
    let started = Instant::now();
    let step = (trace.len() / 20).max(1);
    for (n, req) in trace.iter().enumerate() {
        let keys: Vec<strata_engine::Key> = req
            .blocks
            .iter()
            .map(|b| engine.key(0, format!("blk:{b:016x}").as_bytes()))
            .collect();
        let refs: Vec<&strata_engine::Key> = keys.iter().collect();
        let got = engine.get_many_tiered(&refs).await?;
        // What the reads left to do (returns to the warm tier, prefetches) is done before the
        // request's writes, as if the next request came a moment later.
        engine.settle().await;
        let mut prefix = true;
        for g in &got {
            c.blocks += 1;
            match g {
                Some((_, t)) if prefix => match t {
                    Tier::Hot => c.hot += 1,
                    Tier::Warm => c.warm += 1,
                    Tier::Cold => c.cold += 1,
                },
                _ => {
                    prefix = false;
                    c.miss += 1;
                }
            }
        }
        for (k, g) in keys.iter().zip(&got) {
            if g.is_none() {
                // Nothing waits for durability: the replay runs with durability none.
                let _ = engine.put(k, value.clone(), PutOptions::default()).await?;
            }
        }
        if n % 16 == 15 {
            engine.run_background_once().await?;
        }
        if !args.json && n % step == 0 {
            eprintln!("[{}/{}] requests replayed", n + 1, trace.len());
        }
    }
    let st = engine.stats();
    c.demotions = st.demotions;
    c.returns_to_warm = st.returns_to_warm;
    c.settings = sets.to_vec();
    engine.close().await?;
    if args.json {
        println!("{}", serde_json::to_string(&c)?);
        return Ok(());
    }
    let pct = |x: u64| x as f64 * 100.0 / c.blocks.max(1) as f64;
    let md = format!(
        "# Engine trace replay: {}\n\nReal engine (RocksDB + local object-store directory), DRAM policy `{}`, {} DRAM blocks, {} RocksDB blocks, {} B per block. A block counts for a tier only if every earlier block of its request was found.\n\n| served from | blocks | share |\n|---|---:|---:|\n| DRAM | {} | {:.1}% |\n| RocksDB | {} | {:.1}% |\n| object store | {} | {:.1}% |\n| miss | {} | {:.1}% |\n\n{} keys demoted, {} values returned to RocksDB. Command: `strata trace replay --engine --trace {} --hot-blocks {} --warm-blocks {} --value-bytes {} --hot-policy {}{}` ({:.0} s).\n",
        args.trace.display(), c.hot_policy, c.hot_blocks, c.warm_blocks, c.value_bytes,
        c.hot, pct(c.hot), c.warm, pct(c.warm), c.cold, pct(c.cold), c.miss, pct(c.miss),
        c.demotions, c.returns_to_warm, args.trace.display(), c.hot_blocks, c.warm_blocks, c.value_bytes, c.hot_policy,
        c.settings.iter().map(|kv| format!(" --set {kv}")).collect::<String>(),
        started.elapsed().as_secs_f64()
    );
    std::fs::create_dir_all(&args.out)?;
    let name = format!("engine-replay-{}", c.hot_policy);
    std::fs::write(args.out.join(format!("{name}.md")), &md)?;
    std::fs::write(
        args.out.join(format!("{name}.json")),
        serde_json::to_string_pretty(&c)?,
    )?;
    print!("{md}");
    Ok(())
}
