//! `strata trace replay`: hit rates of cache policies on a trace, beside Belady's optimum.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use strata_policy::{load_trace, PolicyKind};

#[derive(clap::Args)]
pub struct ReplayArgs {
    /// The trace file.
    #[arg(long)]
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
}

#[derive(serde::Serialize)]
struct Row {
    policy: &'static str,
    capacity_blocks: usize,
    hit_rate: f64,
    hits: u64,
    blocks: u64,
}

pub fn replay(args: &ReplayArgs) -> Result<()> {
    let trace = load_trace(&args.trace).map_err(anyhow::Error::msg)?;
    if trace.is_empty() {
        bail!("trace {} holds no requests", args.trace.display());
    }
    let policies: Vec<PolicyKind> = if args.policy == "all" {
        PolicyKind::ALL.to_vec()
    } else {
        vec![args.policy.parse().map_err(anyhow::Error::msg)?]
    };
    let caps = if args.capacity_blocks.is_empty() {
        vec![1000, 2000, 5859, 10000, 20000]
    } else {
        args.capacity_blocks.clone()
    };
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
