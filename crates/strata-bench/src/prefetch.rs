//! Cold reads of a session-sequential workload with prefetch off and on, beside plain
//! object-store GETs of values of the same size, all against one S3-compatible server
//! (moto on loopback) in the same run.
//!
//! Many sessions each read their keys in order (`sess:<s>:<i>`), a few at a time, with a
//! think time between reads (an inference step). Every key starts in the cold tier. The
//! figure that matters is the p50 of those reads with prefetch on, as a ratio of the p50 of
//! a plain GET of one value from the same server.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use object_store::{ObjectStoreExt, PutPayload};
use serde::Serialize;
use strata_engine::{Engine, Key, PutOptions, Settings, Tier};

use crate::report::{self, Summary};
use crate::servers::{Moto, S3_KEY, S3_REGION};

#[derive(clap::Args)]
pub struct Args {
    /// Sessions, each reading its keys in order.
    #[arg(long, default_value_t = 64)]
    sessions: u32,
    /// Keys per session.
    #[arg(long, default_value_t = 16)]
    keys: u32,
    /// Bytes per value, in KiB (64 KiB is one value per cold block: only the Markov model
    /// can predict the next one).
    #[arg(long, default_value_t = 64)]
    value_kib: usize,
    /// Milliseconds between a session's reads (an inference step).
    #[arg(long, default_value_t = 10)]
    think_ms: u64,
    /// Sessions running at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Largest segment Strata writes, in KiB (a ranged GET into a large object can cost
    /// more than a GET of a small one on some servers).
    #[arg(long, default_value_t = 8192)]
    segment_kib: u64,
}

#[derive(Serialize)]
struct Row {
    name: String,
    reads: Summary,
    /// The reads the object store served (for the plain GETs, all of them).
    misses: Summary,
    prefetch_issued: u64,
    prefetch_used: u64,
    cold_hits: u64,
    prefetch_precision: f64,
    prefetch_coverage: f64,
    /// GET requests sent to the object store while reading.
    object_store_gets: u64,
    /// Prefetch GETs allowed in flight at the end of the run.
    prefetch_fetch_window: u64,
}

/// Settings whose cold tier is `moto`, under `prefix`.
fn s3_settings(moto: &Moto, prefix: &str) -> Settings {
    let mut s = Settings::default();
    let c = &mut s.cold;
    c.cold_url = moto.cold_url(prefix);
    c.s3_endpoint = moto.endpoint();
    c.s3_region = S3_REGION.into();
    c.s3_access_key_id = S3_KEY.into();
    c.s3_secret_access_key = S3_KEY.into();
    c.s3_allow_http = true;
    s
}

fn value(s: u32, i: u32, len: usize) -> Bytes {
    let mut v = vec![0u8; len];
    let mut x = (u64::from(s) << 32 | u64::from(i)).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for b in v.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    Bytes::from(v)
}

fn key(s: u32, i: u32) -> Key {
    Key::new(0, 0, format!("sess:{s}:{i:04}").as_bytes())
}

/// Runs items `0..n` on `concurrency` tasks, each taking the next item when done with one;
/// `work(i)` returns the latencies it measured, each with whether the object store served
/// it. Returns them all.
async fn share_work<F, Fut>(
    concurrency: usize,
    n: u32,
    work: F,
) -> anyhow::Result<Vec<(Duration, bool)>>
where
    F: Fn(u32) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<Vec<(Duration, bool)>>> + Send,
{
    let next = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (next, work) = (Arc::clone(&next), work.clone());
        workers.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return Ok::<_, anyhow::Error>(lat);
                }
                lat.extend(work(i).await?);
            }
        }));
    }
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.await??);
    }
    Ok(all)
}

/// Runs the sessions against `e`; returns the latencies of reads of keys that were cold,
/// each with whether the object store served it (a true miss).
async fn sessions(e: &Engine, a: &Args, label: &str) -> anyhow::Result<Vec<(Duration, bool)>> {
    let (n, keys, think, len) = (a.sessions, a.keys, a.think_ms, a.value_kib << 10);
    let e = e.clone();
    let all = share_work(a.concurrency, n, move |s| {
        let e = e.clone();
        async move {
            let mut lat = Vec::new();
            for i in 0..keys {
                let k = key(s, i);
                e.note_access(u64::from(s), &k);
                let t = Instant::now();
                let (v, tier) = e
                    .get_many_tiered(&[&k])
                    .await?
                    .pop()
                    .flatten()
                    .ok_or_else(|| anyhow::anyhow!("key lost"))?;
                lat.push((t.elapsed(), tier == Tier::Cold));
                anyhow::ensure!(v == value(s, i, len), "wrong bytes for {s}/{i}");
                tokio::time::sleep(Duration::from_millis(think)).await;
            }
            if (s + 1) % 16 == 0 {
                eprintln!("  {s}/{n} sessions read");
            }
            Ok(lat)
        }
    })
    .await?;
    eprintln!("{label}: {} reads", all.len());
    Ok(all)
}

async fn strata_run(a: &Args, moto: &Moto, prefetch: bool) -> anyhow::Result<Row> {
    let dir = tempfile::tempdir()?;
    let mut o = s3_settings(moto, if prefetch { "on" } else { "off" });
    o.prefetch.prefetch = prefetch;
    o.hot.hot_bytes_max = 1 << 30;
    o.warm.warm_bytes_max = 1 << 20;
    o.warm.warm_bytes_hard_max = 1 << 40;
    o.cold.segment_bytes_max = a.segment_kib << 10;
    o.warm.background_interval_ms = 3_600_000;
    let e = crate::engine::open_engine(dir.path(), o).await?;
    let len = a.value_kib << 10;
    for s in 0..a.sessions {
        for i in 0..a.keys {
            e.put(&key(s, i), value(s, i, len), PutOptions::default())
                .await?
                .durable(&e)
                .await?;
        }
    }
    while e.stats().warm_bytes > 1 << 20 {
        e.run_background_once().await?;
    }
    e.clear_hot();
    let mut cold = 0;
    for s in 0..a.sessions {
        for i in 0..a.keys {
            cold += usize::from(e.tier_of(&key(s, i)).await? == Some(Tier::Cold));
        }
    }
    eprintln!(
        "prefetch {}: {cold} of {} keys in the cold tier",
        if prefetch { "on" } else { "off" },
        a.sessions * a.keys
    );
    let gets_before = e.stats().object_store_gets;
    let lat = sessions(
        &e,
        a,
        if prefetch {
            "prefetch on"
        } else {
            "prefetch off"
        },
    )
    .await?;
    let st = e.stats();
    e.close().await?;
    Ok(Row {
        name: format!(
            "strata cold reads, prefetch {}",
            if prefetch { "on" } else { "off" }
        ),
        reads: report::summarize(lat.iter().map(|l| l.0).collect()),
        misses: report::summarize(lat.iter().filter(|l| l.1).map(|l| l.0).collect()),
        prefetch_issued: st.prefetch_issued,
        prefetch_used: st.prefetch_used,
        cold_hits: st.cold_hits,
        prefetch_precision: st.prefetch_precision(),
        prefetch_coverage: st.prefetch_coverage(),
        object_store_gets: st.object_store_gets - gets_before,
        prefetch_fetch_window: st.prefetch_fetch_window,
    })
}

async fn plain_gets(a: &Args, moto: &Moto) -> anyhow::Result<Row> {
    let store = moto.store()?;
    let len = a.value_kib << 10;
    let n = (a.sessions * a.keys).min(256);
    for i in 0..n {
        let p = object_store::path::Path::from(format!("plain/{i}"));
        store.put(&p, PutPayload::from(value(0, i, len))).await?;
    }
    // Same concurrency and think time as the sessions.
    let think = a.think_ms;
    let all = share_work(a.concurrency, n, move |i| {
        let store = Arc::clone(&store);
        async move {
            let p = object_store::path::Path::from(format!("plain/{i}"));
            let t = Instant::now();
            let got = store.get(&p).await?.bytes().await?;
            let took = t.elapsed();
            anyhow::ensure!(got.len() == len, "short read");
            tokio::time::sleep(Duration::from_millis(think)).await;
            Ok(vec![(took, true)])
        }
    })
    .await?;
    eprintln!("plain GET: {} reads", all.len());
    let all_len = all.len() as u64;
    Ok(Row {
        name: "object-store GET of one value".into(),
        reads: report::summarize(all.iter().map(|l| l.0).collect()),
        misses: report::summarize(all.into_iter().map(|l| l.0).collect()),
        prefetch_issued: 0,
        prefetch_used: 0,
        cold_hits: 0,
        prefetch_precision: 0.0,
        prefetch_coverage: 0.0,
        object_store_gets: all_len,
        prefetch_fetch_window: 0,
    })
}

pub async fn run(a: Args, out: &Path) -> anyhow::Result<()> {
    let moto = Moto::start()?;
    let started = Instant::now();
    report::progress(1, 3, "plain object-store GETs");
    let base = plain_gets(&a, &moto).await?;
    report::progress(2, 3, "strata, prefetch off");
    let off = strata_run(&a, &moto, false).await?;
    report::progress(3, 3, "strata, prefetch on");
    let on = strata_run(&a, &moto, true).await?;
    let ratio = on.reads.p50_us / base.reads.p50_us;
    let ratio_off = off.reads.p50_us / base.reads.p50_us;
    let (precision, coverage) = (on.prefetch_precision, on.prefetch_coverage);
    let cmd = format!(
        "strata-bench prefetch --sessions {} --keys {} --value-kib {} --think-ms {} --concurrency {} --segment-kib {}",
        a.sessions, a.keys, a.value_kib, a.think_ms, a.concurrency, a.segment_kib
    );
    let mut md = format!(
        "# Prefetch: cold reads of a session-sequential workload\n\n{} sessions × {} keys of {} KiB, {} sessions at a time, {} ms between a session's reads; every key starts in the cold tier (S3 on moto, loopback). Same server, same run.\n\n| reads | count | p50 µs | p99 µs | mean µs | true misses | their p50 / p99 µs | object-store GETs |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
        a.sessions, a.keys, a.value_kib, a.concurrency, a.think_ms
    );
    for r in [&base, &off, &on] {
        md.push_str(&format!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {} | {:.0} / {:.0} | {} |\n",
            r.name,
            r.reads.count,
            r.reads.p50_us,
            r.reads.p99_us,
            r.reads.mean_us,
            r.misses.count,
            r.misses.p50_us,
            r.misses.p99_us,
            r.object_store_gets
        ));
    }
    md.push_str(&format!(
        "\nCold-read p50 with prefetch / plain GET p50: **{ratio:.3}** (goal ≤ 0.3); without prefetch: {ratio_off:.2} (p50 {:+.1} ms beside the plain GET's, p99 {:.2}× its p99). With prefetch, p99 of the true misses / plain GET p99: **{:.2}**.\nPrefetch: {} values issued, {} used before eviction (precision {:.2}), {} reads still served from the object store (coverage {:.2}); prefetch GETs allowed in flight at the end: {} of `prefetch_fetches_max` {} (the window halves when clients' reads from the store beside prefetch GETs take half again their usual time).\n\nPrefetch can only hide the object store's latency while the store keeps up with the offered load: with 8 sessions at 2 ms think time (256 MB/s of 64 KiB reads against moto) every read waits on the store, prefetch or not.\n\nCommand: `{cmd}` ({:.0} s).\n",
        (off.reads.p50_us - base.reads.p50_us) / 1000.0,
        off.reads.p99_us / base.reads.p99_us,
        on.misses.p99_us / base.reads.p99_us,
        on.prefetch_issued,
        on.prefetch_used,
        precision,
        on.cold_hits,
        coverage,
        on.prefetch_fetch_window,
        strata_engine::Settings::default().prefetch.prefetch_fetches_max,
        started.elapsed().as_secs_f64()
    ));
    #[derive(Serialize)]
    struct Report<'a> {
        rows: [&'a Row; 3],
        p50_ratio_prefetch_vs_get: f64,
        p50_ratio_no_prefetch_vs_get: f64,
        precision: f64,
        coverage: f64,
        command: String,
    }
    report::write(
        out,
        "prefetch",
        &md,
        &Report {
            rows: [&base, &off, &on],
            p50_ratio_prefetch_vs_get: ratio,
            p50_ratio_no_prefetch_vs_get: ratio_off,
            precision,
            coverage,
            command: cmd,
        },
    )
}
