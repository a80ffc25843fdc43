//! Model test: random operations against a `BTreeMap`, with budgets so small that demotion
//! and promotion happen all the time, a manual clock for TTLs, and restarts.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use strata_engine::{Condition, Engine, Error, Expire, ManualClock, PutOptions};

use crate::support::{small_options, Rng};

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

async fn run_model(steps: usize, test: &str) {
    let mut rng = Rng::from_env(test);
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let open = |clock: Arc<ManualClock>| {
        let o = small_options(dir.path());
        async move { Engine::open_with_clock(o, clock).await.unwrap() }
    };
    let mut engine = open(clock.clone()).await;
    let mut model = Model {
        map: BTreeMap::new(),
    };
    let mut restarts = 0;
    let mut demotions = 0;
    for step in 0..steps {
        let now = clock.now_ms_pub();
        let key = format!("k:{:03}", rng.below(80)).into_bytes();
        let ctx = format!("step {step} key {}", String::from_utf8_lossy(&key));
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
                        &key,
                        Bytes::from(value.clone()),
                        PutOptions {
                            expire,
                            condition,
                            return_old,
                        },
                    )
                    .await
                    .unwrap();
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
                let got = engine.get(&key).await.unwrap();
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
                let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
                let got = engine.get_many(&refs).await.unwrap();
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
                assert_eq!(engine.delete(&key).await.unwrap(), existed, "{ctx}");
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
                let got = engine.incr_by(&key, delta).await;
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
                assert_eq!(engine.set_expire(&key, at).await.unwrap(), exists, "{ctx}");
                if exists {
                    model.map.get_mut(&key).unwrap().expire_ms = at;
                }
                let want = model.live(&key, now).map(|e| e.expire_ms);
                assert_eq!(engine.expire_time_ms(&key).await.unwrap(), want, "{ctx}");
            }
            78..=80 => {
                let prefix = format!("k:0{}", rng.below(8)).into_bytes();
                let mut got = Vec::new();
                let mut cursor: Option<Bytes> = None;
                loop {
                    let page = engine
                        .scan_prefix(&prefix, cursor.as_deref(), 1 + rng.below(6) as usize)
                        .unwrap();
                    got.extend(page.items.iter().map(|i| i.key.to_vec()));
                    match page.next {
                        Some(n) => cursor = Some(n),
                        None => break,
                    }
                }
                assert_eq!(got, model.live_keys(&prefix, now), "{ctx} scan {prefix:?}");
            }
            81..=85 => clock.advance_ms(rng.below(700)),
            86..=92 => {
                engine.run_background_once().await.unwrap();
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
    demotions += engine.stats().demotions;
    engine.close().await.unwrap();
    drop(engine);
    let engine = open(clock.clone()).await;
    let now = clock.now_ms_pub();
    for (k, e) in &model.map {
        let got = engine.get(k).await.unwrap();
        let want = (e.expire_ms == 0 || e.expire_ms > now).then_some(e.value.as_slice());
        assert_eq!(got.as_deref(), want, "final check of {k:?}");
    }
    let st = engine.stats();
    eprintln!("{test}: restarts={restarts} stats={st:?}");
    assert!(
        demotions > 0 && st.cold.hits > 0,
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
    run_model(4000, "model_random_operations_match_a_btreemap").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_on_a_multithreaded_runtime() {
    run_model(2000, "model_on_a_multithreaded_runtime").await;
}
