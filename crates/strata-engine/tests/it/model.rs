//! Model test: random operations against a `BTreeMap`, with budgets so small that demotion
//! and promotion happen all the time, a manual clock for TTLs, and restarts; and the same
//! with failures injected into the warm store's writes and the object store's requests
//! (each fails with a fixed chance while a fault phase lasts, as redb's fuzzer fails I/O).
//! Under faults an operation may fail, but then it changed nothing; it never returns wrong
//! bytes, and nothing acknowledged is lost.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use strata_engine::{Condition, Error, Expire, ManualClock, PutOptions};

use crate::support::{key as skey, open_failing, small_options, Acked, Faults, Rng};

#[derive(Clone, Debug)]
struct Entry {
    value: Vec<u8>,
    expire_ms: u64,
}

struct Model {
    map: BTreeMap<Vec<u8>, Entry>,
}

impl Model {
    fn live(&self, key: &[u8], now: u64) -> Option<&Entry> {
        self.map
            .get(key)
            .filter(|e| e.expire_ms == 0 || e.expire_ms > now)
    }
    fn live_keys(&self, prefix: &[u8], now: u64) -> Vec<Vec<u8>> {
        self.map
            .iter()
            .filter(|(k, e)| k.starts_with(prefix) && (e.expire_ms == 0 || e.expire_ms > now))
            .map(|(k, _)| k.clone())
            .collect()
    }
}

/// Whether `e` is a failure an injected fault explains (the write or read did nothing).
fn injected(e: &Error) -> bool {
    matches!(e, Error::Storage(_) | Error::ColdUnavailable(_))
}

/// The result of an operation, or `None` when a fault phase explains its failure.
fn unless_injected<T: std::fmt::Debug>(
    got: Result<T, Error>,
    faulty: bool,
    ctx: &str,
) -> Option<Result<T, Error>> {
    match got {
        Err(e) if faulty && injected(&e) => None,
        Err(e) if injected(&e) => panic!("{ctx}: {e} with no fault injected"),
        other => Some(other),
    }
}

async fn run_model(steps: usize, test: &str, with_faults: bool) {
    let mut rng = Rng::from_env(test);
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let warm_faults = Faults::new(rng.below(u64::MAX), 12);
    let cold_faults = Faults::new(rng.below(u64::MAX), 4);
    let open = |clock: Arc<ManualClock>| {
        let o = small_options(dir.path());
        let (w, c) = (Arc::clone(&warm_faults), Arc::clone(&cold_faults));
        async move { open_failing(o, clock, w, c).await.unwrap() }
    };
    let mut faulty = false;
    let mut engine = open(clock.clone()).await;
    let mut model = Model {
        map: BTreeMap::new(),
    };
    let mut restarts = 0;
    let mut demotions = 0;
    for step in 0..steps {
        let now = clock.now_ms_pub();
        let key = format!("k:{:03}", rng.below(80)).into_bytes();
        let sk = skey(&key);
        let ctx = format!("step {step} key {}", String::from_utf8_lossy(&key));
        if with_faults && rng.below(25) == 0 {
            // A fault phase starts or ends.
            faulty = !faulty;
            warm_faults.set(faulty);
            cold_faults.set(faulty);
        }
        match rng.below(100) {
            0..=29 => {
                let len = match rng.below(10) {
                    0 => 0,
                    1..=6 => rng.below(200) as usize,
                    _ => 200 + rng.below(1500) as usize,
                };
                let value = rng.bytes(len);
                let expire = match rng.below(10) {
                    0 => Expire::AtMs(now + 1 + rng.below(5_000)),
                    1 => Expire::Keep,
                    _ => Expire::Persist,
                };
                let condition = match rng.below(8) {
                    0 => Condition::IfAbsent,
                    1 => Condition::IfPresent,
                    2 => Condition::IfEquals(Bytes::from(
                        model
                            .live(&key, now)
                            .map(|e| e.value.clone())
                            .unwrap_or_default(),
                    )),
                    _ => Condition::Always,
                };
                let return_old = rng.below(4) == 0;
                let cur = model.live(&key, now).cloned();
                let ok = match &condition {
                    Condition::Always => true,
                    Condition::IfAbsent => cur.is_none(),
                    Condition::IfPresent => cur.is_some(),
                    Condition::IfEquals(v) => cur.as_ref().is_some_and(|c| c.value == v.as_ref()),
                };
                let r = engine
                    .put(
                        &sk,
                        Bytes::from(value.clone()),
                        PutOptions {
                            expire,
                            condition,
                            return_old,
                        },
                    )
                    .await
                    .acked(&engine)
                    .await;
                let Some(r) = unless_injected(r, faulty, &ctx) else {
                    continue;
                };
                let r = r.unwrap();
                assert_eq!(r.written, ok, "{ctx}");
                if return_old {
                    assert_eq!(
                        r.old.as_deref(),
                        cur.as_ref().map(|c| c.value.as_slice()),
                        "{ctx}"
                    );
                }
                if ok {
                    let expire_ms = match expire {
                        Expire::Persist => 0,
                        Expire::Keep => cur.map_or(0, |c| c.expire_ms),
                        Expire::AtMs(t) => t,
                    };
                    model.map.insert(key, Entry { value, expire_ms });
                }
            }
            30..=54 => {
                let Some(got) = unless_injected(engine.get(&sk).await, faulty, &ctx) else {
                    continue;
                };
                let got = got.unwrap();
                assert_eq!(
                    got.as_deref(),
                    model.live(&key, now).map(|e| e.value.as_slice()),
                    "{ctx}"
                );
            }
            55..=59 => {
                let keys: Vec<Vec<u8>> = (0..1 + rng.below(20))
                    .map(|_| format!("k:{:03}", rng.below(80)).into_bytes())
                    .collect();
                let stored: Vec<_> = keys.iter().map(skey).collect();
                let refs: Vec<_> = stored.iter().collect();
                let Some(got) = unless_injected(engine.get_many(&refs).await, faulty, &ctx) else {
                    continue;
                };
                let got = got.unwrap();
                for (k, g) in keys.iter().zip(got) {
                    assert_eq!(
                        g.as_deref(),
                        model.live(k, now).map(|e| e.value.as_slice()),
                        "{ctx} batch key {k:?}"
                    );
                }
            }
            60..=67 => {
                let existed = model.live(&key, now).is_some();
                let got = engine.delete(&sk).await.acked(&engine).await;
                let Some(got) = unless_injected(got, faulty, &ctx) else {
                    continue;
                };
                assert_eq!(got.unwrap(), existed, "{ctx}");
                model.map.remove(&key);
            }
            68..=73 => {
                let delta = rng.below(1000) as i64 - 500;
                let cur = model.live(&key, now).cloned();
                let want = match &cur {
                    None => Ok(delta),
                    Some(e) => match strata_engine::parse_i64(&e.value) {
                        None => Err(Error::NotInteger),
                        Some(v) => v.checked_add(delta).ok_or(Error::Overflow),
                    },
                };
                let got = engine.incr_by(&sk, delta).await.acked(&engine).await;
                let Some(got) = unless_injected(got, faulty, &ctx) else {
                    continue;
                };
                assert_eq!(got, want, "{ctx}");
                if let Ok(n) = got {
                    let expire_ms = cur.map_or(0, |c| c.expire_ms);
                    model.map.insert(
                        key,
                        Entry {
                            value: n.to_string().into_bytes(),
                            expire_ms,
                        },
                    );
                }
            }
            74..=77 => {
                let at = if rng.below(3) == 0 {
                    0
                } else {
                    now + 1 + rng.below(3_000)
                };
                let exists = model.live(&key, now).is_some();
                let got = engine.set_expire(&sk, at).await.acked(&engine).await;
                let Some(got) = unless_injected(got, faulty, &ctx) else {
                    continue;
                };
                assert_eq!(got.unwrap(), exists, "{ctx}");
                if exists {
                    model.map.get_mut(&key).unwrap().expire_ms = at;
                }
                let want = model.live(&key, now).map(|e| e.expire_ms);
                assert_eq!(engine.expire_time_ms(&sk).await.unwrap(), want, "{ctx}");
            }
            78..=79 if rng.below(2) == 0 => {
                // An ordered range with its values (`STRATA.RANGE`), either way round.
                let bound = |rng: &mut Rng| {
                    let k = format!("k:{:03}", rng.below(80)).into_bytes();
                    (k, rng.below(2) == 0)
                };
                let (a, b) = (bound(&mut rng), bound(&mut rng));
                let (lo, hi) = if a.0 <= b.0 { (a, b) } else { (b, a) };
                let (rev, limit) = (rng.below(2) == 0, 1 + rng.below(30) as usize);
                let lo_b = Some((&lo.0[..], lo.1));
                let hi_b = Some((&hi.0[..], hi.1));
                let got = engine.range(0, lo_b, hi_b, limit, rev, u64::MAX).await;
                if let Some(got) = unless_injected(got, faulty, &ctx) {
                    let inside = |k: &Vec<u8>| {
                        (if lo.1 { *k >= lo.0 } else { *k > lo.0 })
                            && (if hi.1 { *k <= hi.0 } else { *k < hi.0 })
                    };
                    let mut want: Vec<(Bytes, Bytes)> = model
                        .map
                        .iter()
                        .filter(|(k, e)| inside(k) && (e.expire_ms == 0 || e.expire_ms > now))
                        .map(|(k, e)| (Bytes::from(k.clone()), Bytes::from(e.value.clone())))
                        .collect();
                    if rev {
                        want.reverse();
                    }
                    want.truncate(limit);
                    assert_eq!(got.unwrap(), want, "{ctx} range {lo:?} {hi:?} rev {rev}");
                }
            }
            78..=80 => {
                let prefix = format!("k:0{}", rng.below(8)).into_bytes();
                let mut got = Vec::new();
                let mut cursor: Option<Bytes> = None;
                let mut whole = true;
                loop {
                    // A scan first writes what write-back holds to the warm store: a write
                    // that can fail.
                    let page = engine.scan_prefix(
                        0,
                        &prefix,
                        cursor.as_deref(),
                        1 + rng.below(6) as usize,
                    );
                    let Some(page) = unless_injected(page, faulty, &ctx) else {
                        whole = false;
                        break;
                    };
                    let page = page.unwrap();
                    got.extend(page.items.iter().map(|i| i.key.to_vec()));
                    match page.next {
                        Some(n) => cursor = Some(n),
                        None => break,
                    }
                }
                if whole {
                    assert_eq!(got, model.live_keys(&prefix, now), "{ctx} scan {prefix:?}");
                }
            }
            81..=85 => clock.advance_ms(rng.below(700)),
            86..=92 => {
                // A background round stops at its first failure and is retried later.
                let r = engine.run_background_once().await;
                assert!(r.is_ok() || faulty, "{ctx}: {r:?}");
            }
            93..=96 => engine.clear_hot(),
            _ => {
                demotions += engine.stats().demotions;
                engine.close().await.unwrap();
                drop(engine);
                engine = open(clock.clone()).await;
                restarts += 1;
            }
        }
    }
    // Everything the model holds is readable after a final restart, from whichever tier.
    warm_faults.set(false);
    cold_faults.set(false);
    demotions += engine.stats().demotions;
    engine.close().await.unwrap();
    drop(engine);
    let engine = open(clock.clone()).await;
    let now = clock.now_ms_pub();
    for (k, e) in &model.map {
        let got = engine.get(&skey(k)).await.unwrap();
        let want = (e.expire_ms == 0 || e.expire_ms > now).then_some(e.value.as_slice());
        assert_eq!(got.as_deref(), want, "final check of {k:?}");
    }
    let st = engine.stats();
    let injected = warm_faults
        .injected
        .load(std::sync::atomic::Ordering::Relaxed)
        + cold_faults
            .injected
            .load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("{test}: restarts={restarts} injected={injected} stats={st:?}");
    assert_eq!(injected > 0, with_faults, "faults injected: {injected}");
    assert!(
        demotions > 0 && st.cold_hits > 0,
        "the model never exercised demotion: {demotions} {st:?}"
    );
    assert!(restarts > 0);
}

trait NowPub {
    fn now_ms_pub(&self) -> u64;
}

impl NowPub for ManualClock {
    fn now_ms_pub(&self) -> u64 {
        strata_engine::Clock::now_ms(self)
    }
}

#[tokio::test]
async fn model_random_operations_match_a_btreemap() {
    run_model(4000, "model_random_operations_match_a_btreemap", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_on_a_multithreaded_runtime() {
    run_model(2000, "model_on_a_multithreaded_runtime", false).await;
}

#[tokio::test]
async fn model_with_failing_warm_writes_and_object_store_requests() {
    run_model(
        5000,
        "model_with_failing_warm_writes_and_object_store_requests",
        true,
    )
    .await;
}
