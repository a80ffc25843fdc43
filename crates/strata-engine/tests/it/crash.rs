//! SIGKILL during `sync` writes: every acknowledged write survives with exact bytes, whether
//! its value sits in RocksDB, in the value log, or (demoted) in the cold tier.
//!
//! The parent test re-runs this test binary as a child (`crash_child_writer`), which writes
//! and deletes keys in a deterministic order, printing `ack N` after each acknowledged
//! operation, with budgets small enough that keys are demoted to the cold tier while it
//! runs. The parent kills it with SIGKILL at a random moment and checks the store.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use strata_engine::{Durability, PutOptions};

use crate::support::{key, open, small_options, Acked, Rng};

const KEY_COUNT: u64 = 300;

/// Operation `i`: its key and the value it writes (`None` deletes).
fn op(i: u64) -> (Vec<u8>, Option<Vec<u8>>) {
    let key = format!("crash:{:04}", (i * 7919) % KEY_COUNT).into_bytes();
    if i % 7 == 3 {
        return (key, None);
    }
    let len = ((i * 37) % 3000) as usize;
    let mut v = format!("op{i}:").into_bytes();
    v.extend((0..len).map(|j| (i as usize + j) as u8));
    (key, Some(v))
}

fn options(dir: &std::path::Path) -> crate::support::Opts {
    let mut o = small_options(dir);
    o.s.warm.durability = Durability::Sync;
    o.s.warm.warm_bytes_max = 64 << 10;
    o.s.warm.background_interval_ms = 20;
    o.background = true;
    // Values of 1 KiB and more go to the value log (about two thirds of them), in files
    // small enough to roll and be collected while the writer runs.
    o.s.vlog.vlog_value_bytes_min = 1024;
    o.s.vlog.vlog_file_bytes = 1 << 20;
    o
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_child_writer() {
    let Ok(dir) = std::env::var("STRATA_CRASH_DIR") else {
        return;
    };
    let start: u64 = std::env::var("STRATA_CRASH_START")
        .unwrap()
        .parse()
        .unwrap();
    let engine = open(options(std::path::Path::new(&dir))).await.unwrap();
    let mut out = std::io::stdout().lock();
    for i in start.. {
        let (k, value) = op(i);
        match value {
            Some(v) => {
                engine
                    .put(&key(&k), Bytes::from(v), PutOptions::default())
                    .await
                    .acked(&engine)
                    .await
                    .unwrap();
            }
            None => {
                engine.delete(&key(&k)).await.acked(&engine).await.unwrap();
            }
        }
        writeln!(out, "ack {i}").unwrap();
        out.flush().unwrap();
    }
}

#[tokio::test]
async fn sigkill_during_sync_writes_loses_no_acknowledged_write() {
    let mut rng = Rng::from_env("sigkill_during_sync_writes_loses_no_acknowledged_write");
    let dir = tempfile::tempdir().unwrap();
    // What each key must hold: the value of its last applied operation.
    let mut state: HashMap<Vec<u8>, Option<Vec<u8>>> = HashMap::new();
    let mut next_op = 0u64;
    let mut checked = 0usize;
    let mut demoted_seen = false;
    // Five cycles, and more (up to twenty) until one ends with keys in the cold tier: on a
    // loaded machine the writer may die before its first demotion round.
    let mut cycles = 0;
    for cycle in 0..20 {
        if cycle >= 5 && demoted_seen {
            break;
        }
        cycles += 1;
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "crash::crash_child_writer",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("STRATA_CRASH_DIR", dir.path())
            .env("STRATA_CRASH_START", next_op.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let kill_after = 200 + rng.below(800);
        let mut last_ack: Option<u64> = None;
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut ack = |line: std::io::Result<String>| {
            let n = line
                .unwrap()
                .strip_prefix("ack ")
                .map(|n| n.parse::<u64>().unwrap());
            if n.is_some() {
                last_ack = n;
            }
            n
        };
        for line in lines.by_ref() {
            if ack(line).is_some_and(|n| n - next_op + 1 >= kill_after) || Instant::now() > deadline
            {
                break;
            }
        }
        // SIGKILL, not a polite shutdown.
        child.kill().unwrap();
        child.wait().unwrap();
        // Acks the child printed before it died count too: drain the pipe.
        for line in lines {
            ack(line);
        }
        let last_ack = last_ack.expect("the child acknowledged nothing");
        for i in next_op..=last_ack {
            let (k, v) = op(i);
            state.insert(k, v);
        }
        let engine = open(options(dir.path())).await.unwrap();
        // The operation after the last ack was in flight: it may or may not have landed.
        let (inflight_key, inflight_value) = op(last_ack + 1);
        for (k, want) in &state {
            let got = engine.get(&key(k)).await.unwrap().map(|b| b.to_vec());
            if *k == inflight_key && got == inflight_value {
                continue;
            }
            assert_eq!(
                &got,
                want,
                "cycle {cycle}: key {} lost or torn",
                String::from_utf8_lossy(k)
            );
            checked += 1;
        }
        let got = engine
            .get(&key(&inflight_key))
            .await
            .unwrap()
            .map(|b| b.to_vec());
        if got == inflight_value {
            state.insert(inflight_key, inflight_value);
        }
        demoted_seen |= engine.stats().cold_entries > 0;
        engine.close().await.unwrap();
        next_op = last_ack + 2;
    }
    eprintln!("checked {checked} acknowledged keys over {cycles} SIGKILL cycles");
    assert!(
        demoted_seen,
        "no key reached the cold tier during the crash test"
    );
}
