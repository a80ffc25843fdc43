//! `strata-bench`: benchmarks that print figures and write Markdown and JSON reports, each
//! with its baseline measured in the same run.
//!
//! - `engine`: get from each tier and put, for 100 B and 1 MiB values, against the simplest
//!   alternative on the same medium (a locked `HashMap` for DRAM, one file per key for local
//!   disk, one object per key read through the same object store for the cold tier).
//! - `redis`: `redis-benchmark` against a real `redis-server` and against `strata serve`,
//!   both on one CPU and the client on the other, in interleaved rounds.
//! - `kvcache`: multi-turn conversations reading their KV prefix back, on Strata, Redis,
//!   local files and the object store, beside loopback and memcpy ceilings.
//! - `memory`: resident memory per key after a million SETs (or `--kind hash`, `zset`,
//!   `list`, `set`: a million small collections), beside `redis-server`.
//! - `tails`: GET p99.9 idle and while a writer pushes the warm tier past its budget.
//! - `compare`: the headline table: Strata beside a DRAM cache and a filesystem cache in
//!   front of the same object store, and the object store read directly.

mod cgroup;
mod compare;
mod engine;
mod kvcache;
mod memory;
mod prefetch;
mod redis;
mod report;
mod resp;
mod servers;
mod tails;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "strata-bench",
    about = "Benchmarks of Strata beside their baselines"
)]
struct Cli {
    /// Directory for reports.
    #[arg(long, default_value = "reports", global = true)]
    out: std::path::PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Engine get per tier and put, beside in-process baselines.
    Engine {
        /// Operations per measurement for 100-byte values (1 MiB values use a tenth).
        #[arg(long, default_value_t = 20_000)]
        ops: usize,
    },
    /// Multi-turn KV-cache workload (after MLPerf Storage's KV-cache test) on Strata,
    /// redis-server, one file per chunk, and the object store read directly.
    Kvcache(kvcache::Args),
    /// Resident memory per key after writing many keys, beside redis-server.
    Memory(memory::Args),
    /// GET tails idle and while a writer pushes the warm tier past its budget.
    Tails(tails::Args),
    /// Cold reads of a session-sequential workload with prefetch off and on, beside plain
    /// GETs from the same S3-compatible server (moto).
    Prefetch(prefetch::Args),
    /// The headline table: Strata, a Redis cache and a file cache (both cache-aside in front
    /// of the same object store) and the object store itself, on this machine, in one run.
    Compare(compare::Args),
    /// redis-benchmark against redis-server and against strata, same machine, same run: the
    /// hot-path protocol (servers on CPU 0, the client on CPU 1, interleaved rounds, medians).
    Redis {
        /// Requests per redis-benchmark test at 50 clients (a tenth with one client).
        #[arg(long, default_value_t = 100_000)]
        requests: u64,
        /// Rounds, each with fresh servers; the report gives the medians.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// The strata binary to benchmark.
        #[arg(long, default_value = "target/release/strata")]
        strata: std::path::PathBuf,
        /// Durable writes instead: Strata with its default `durability=group` beside Redis
        /// with `appendfsync always` (both acknowledge a write only once it is fsynced), SET,
        /// INCR and MSET of 10 keys; report `redis-benchmark-durable`.
        #[arg(long)]
        durable: bool,
    },
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    std::fs::create_dir_all(&cli.out)?;
    match cli.command {
        Command::Engine { ops } => runtime()?.block_on(engine::run(ops, &cli.out)),
        Command::Redis {
            requests,
            rounds,
            strata,
            durable,
        } => redis::run(requests, rounds, &strata, durable, &cli.out),
        Command::Prefetch(args) => runtime()?.block_on(prefetch::run(args, &cli.out)),
        Command::Kvcache(args) => runtime()?.block_on(kvcache::run(args, &cli.out)),
        Command::Memory(args) => memory::run(args, &cli.out),
        Command::Tails(args) => tails::run(args, &cli.out),
        Command::Compare(args) => runtime()?.block_on(compare::run(args, &cli.out)),
    }
}
