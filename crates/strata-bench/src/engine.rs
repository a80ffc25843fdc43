//! Engine benchmark: get from each tier and put, beside the simplest alternative on the same
//! medium, measured in the same run.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use bytes::Bytes;
use object_store::ObjectStoreExt;
use serde::Serialize;
use strata_engine::{Durability, Engine, Key, PutOptions, Settings, Tier};

use crate::report::{progress, summarize, Summary};

#[derive(Serialize)]
struct Row {
    op: String,
    value_bytes: usize,
    strata: Summary,
    baseline_name: String,
    baseline: Summary,
    /// strata p50 / baseline p50: below 1 means Strata is faster.
    p50_ratio: f64,
}

fn value(i: usize, len: usize) -> Bytes {
    let mut x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    Bytes::from(
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect::<Vec<u8>>(),
    )
}

fn key(i: usize) -> String {
    format!("bench:{i:08}")
}

fn stored(i: usize) -> Key {
    Key::new(0, 0, key(i).as_bytes())
}

/// Opens a store in `dir` with these budgets, writes acknowledged without waiting for disk.
async fn open(dir: &Path, hot_bytes_max: u64, warm_bytes_max: u64) -> anyhow::Result<Engine> {
    let mut s = Settings::default();
    s.hot.hot_bytes_max = hot_bytes_max;
    s.warm.warm_bytes_max = warm_bytes_max;
    s.warm.durability = Durability::None;
    s.warm.background_interval_ms = 3_600_000;
    open_engine(dir, s).await
}

async fn time_each<F, Fut>(n: usize, mut f: F) -> anyhow::Result<Summary>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        f(i).await?;
        lat.push(t.elapsed());
    }
    Ok(summarize(lat))
}

/// Times `engine.get` of keys `0..n`, each of which must be present.
async fn time_gets(engine: &Engine, n: usize) -> anyhow::Result<Summary> {
    time_each(n, |i| async move {
        std::hint::black_box(engine.get(&stored(i)).await?.expect("present"));
        Ok(())
    })
    .await
}

fn row(
    op: &str,
    value_bytes: usize,
    strata: Summary,
    baseline_name: &str,
    baseline: Summary,
) -> Row {
    eprintln!(
        "  {op:<9} {value_bytes:>8} B  strata p50 {:>9.1} µs p99 {:>9.1} µs | {baseline_name} p50 {:>9.1} µs p99 {:>9.1} µs",
        strata.p50_us, strata.p99_us, baseline.p50_us, baseline.p99_us
    );
    Row {
        op: op.into(),
        value_bytes,
        strata,
        baseline_name: baseline_name.into(),
        baseline,
        p50_ratio: strata.p50_us / baseline.p50_us.max(0.001),
    }
}

async fn one_size(
    value_bytes: usize,
    n: usize,
    step: &mut usize,
    total: usize,
) -> anyhow::Result<Vec<Row>> {
    let dir = tempfile::tempdir()?;
    let files = dir.path().join("files");
    let objects = dir.path().join("objects");
    std::fs::create_dir_all(&files)?;
    std::fs::create_dir_all(&objects)?;
    let values: Vec<Bytes> = (0..n).map(|i| value(i, value_bytes)).collect();
    let mut rows = Vec::new();

    *step += 1;
    progress(*step, total, &format!("put {n} × {value_bytes} B"));
    let engine = open(&dir.path().join("strata"), 8 << 30, 64 << 30).await?;
    let s = time_each(n, |i| {
        let (e, v) = (&engine, values[i].clone());
        async move {
            e.put(&stored(i), v, PutOptions::default())
                .await?
                .durable(e)
                .await?;
            Ok(())
        }
    })
    .await?;
    let b = time_each(n, |i| {
        let (p, v) = (files.join(key(i)), values[i].clone());
        async move {
            std::fs::write(p, &v)?;
            Ok(())
        }
    })
    .await?;
    rows.push(row("put", value_bytes, s, "file write", b));

    *step += 1;
    progress(*step, total, &format!("get from DRAM, {value_bytes} B"));
    let map: Mutex<HashMap<String, Bytes>> =
        Mutex::new((0..n).map(|i| (key(i), values[i].clone())).collect());
    let s = time_gets(&engine, n).await?;
    let b = time_each(n, |i| {
        let m = &map;
        async move {
            std::hint::black_box(m.lock().unwrap().get(&key(i)).cloned());
            Ok(())
        }
    })
    .await?;
    rows.push(row("get hot", value_bytes, s, "Mutex<HashMap>", b));
    engine.close().await?;
    drop(engine);

    *step += 1;
    progress(*step, total, &format!("get from RocksDB, {value_bytes} B"));
    // A DRAM budget too small to admit anything keeps every read on the warm tier.
    let engine = open(&dir.path().join("strata"), 1024, 64 << 30).await?;
    let s = time_gets(&engine, n).await?;
    let b = time_each(n, |i| {
        let p = files.join(key(i));
        async move {
            std::hint::black_box(std::fs::read(p)?);
            Ok(())
        }
    })
    .await?;
    rows.push(row("get warm", value_bytes, s, "file read", b));
    engine.close().await?;
    drop(engine);

    *step += 1;
    progress(
        *step,
        total,
        &format!("demote and get from the cold tier, {value_bytes} B"),
    );
    let engine = open(&dir.path().join("strata"), 1024, 1).await?;
    engine.run_background_once().await?;
    anyhow::ensure!(
        engine.tier_of(&stored(0)).await? == Some(Tier::Cold),
        "demotion did not happen"
    );
    let store = object_store::local::LocalFileSystem::new_with_prefix(&objects)?;
    for (i, v) in values.iter().enumerate() {
        store
            .put(&object_store::path::Path::from(key(i)), v.clone().into())
            .await?;
    }
    let s = time_gets(&engine, n).await?;
    let b = time_each(n, |i| {
        let st = &store;
        async move {
            let r = st.get(&object_store::path::Path::from(key(i))).await?;
            std::hint::black_box(r.bytes().await?);
            Ok(())
        }
    })
    .await?;
    rows.push(row("get cold", value_bytes, s, "object per key", b));
    engine.close().await?;
    Ok(rows)
}

pub async fn run(ops: usize, out: &Path) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut rows = Vec::new();
    let mut step = 0;
    let sizes = [(100usize, ops), (1 << 20, (ops / 100).max(50))];
    let total = sizes.len() * 4;
    for (size, n) in sizes {
        rows.extend(one_size(size, n, &mut step, total).await?);
    }
    let mut md = String::from("# Engine benchmark\n\n");
    md.push_str("Each Strata figure is measured beside a baseline on the same medium, in the same run, one\noperation at a time. Strata runs with `durability = none` so that put compares with an\nunsynced file write. The cold tier is a local directory. Ratio = Strata p50 / baseline p50.\n\n");
    md.push_str("| op | value | Strata p50 µs | Strata p99 µs | baseline | baseline p50 µs | baseline p99 µs | p50 ratio |\n|---|---:|---:|---:|---|---:|---:|---:|\n");
    for r in &rows {
        let size = if r.value_bytes >= 1 << 20 {
            format!("{} MiB", r.value_bytes >> 20)
        } else {
            format!("{} B", r.value_bytes)
        };
        md.push_str(&format!(
            "| {} | {} | {:.1} | {:.1} | {} | {:.1} | {:.1} | {:.2} |\n",
            r.op,
            size,
            r.strata.p50_us,
            r.strata.p99_us,
            r.baseline_name,
            r.baseline.p50_us,
            r.baseline.p99_us,
            r.p50_ratio
        ));
    }
    md.push_str(&format!(
        "\nCommand: `cargo run --release -p strata-bench -- engine --ops {ops}` ({:.0} s).\n",
        started.elapsed().as_secs_f64()
    ));
    crate::report::write(out, "engine", &md, &rows)
}

/// Opens an engine in `dir` on RocksDB (the in-process benchmarks).
pub(crate) async fn open_engine(
    dir: &std::path::Path,
    settings: strata_engine::Settings,
) -> anyhow::Result<strata_engine::Engine> {
    std::fs::create_dir_all(dir)?;
    let warm = strata_rocks::RocksWarm::open(&strata_engine::warm_dir(dir), &Default::default())?;
    let parts = strata_engine::Parts::new(dir, settings, std::sync::Arc::new(warm));
    Ok(strata_engine::Engine::open_with(parts).await?)
}
