//! `strata backup` and `strata restore`: the operator's side of the engine's snapshots.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context, Result};

use crate::config::Config;

/// Prints "12.0/48.0 MiB (25%)" to stderr at most twice a second.
fn progress_printer(verb: &'static str) -> impl Fn(u64, u64) + Send + Sync {
    let start = Instant::now();
    let last = AtomicU64::new(0);
    move |done, total| {
        let ms = start.elapsed().as_millis() as u64;
        if done < total && ms < last.load(Ordering::Relaxed) + 500 {
            return;
        }
        last.store(ms, Ordering::Relaxed);
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        let pct = (done * 100).checked_div(total).unwrap_or(100);
        eprintln!("{verb}: {:.1}/{:.1} MiB ({pct}%)", mib(done), mib(total));
    }
}

/// Snapshots the store of `cfg` (which must not be open in a running server: there, use the
/// `STRATA.BACKUP url` command) to `to`.
pub fn backup(cfg: &Config, to: &str) -> Result<()> {
    let (dir, port) = (cfg.node.data_dir.display(), cfg.node.port);
    crate::runtime::runtime()?.block_on(async {
        let engine = cfg.open_engine().await.map_err(|e| {
            if e.to_string().contains("lock") {
                anyhow::anyhow!("the store in {dir} is in use by a running server; back it up through the server instead: redis-cli -p {port} STRATA.BACKUP {to}")
            } else {
                anyhow::anyhow!("cannot open the store in {dir}: {e}")
            }
        })?;
        let started = Instant::now();
        let sum = engine
            .backup(to, &progress_printer("backup"))
            .await
            .context("backup failed")?;
        engine.close().await?;
        println!(
            "backup to {to}: {} warm files, {} segments, {} bytes in {:.1} s",
            sum.warm_files,
            sum.segments,
            sum.bytes,
            started.elapsed().as_secs_f64()
        );
        Ok(())
    })
}

/// Restores the backup at `from` into `cfg`'s (empty) data directory and cold tier.
pub fn restore(cfg: &Config, from: &str) -> Result<()> {
    crate::runtime::runtime()?.block_on(async {
        let started = Instant::now();
        let progress = progress_printer("restore");
        let sum = strata_engine::restore(from, &cfg.node.data_dir, &cfg.engine, &progress)
            .await
            .context("restore failed")?;
        println!(
            "restored {from} into {}: {} warm files, {} segments, {} bytes in {:.1} s",
            cfg.node.data_dir.display(),
            sum.warm_files,
            sum.segments,
            sum.bytes,
            started.elapsed().as_secs_f64()
        );
        Ok(())
    })
}
