//! Values of every kind move through the tiers with their kind: DRAM, warm records (inline
//! and in the value log), segments and the cold index, returns to warm, restarts and the
//! change log; string reads refuse the other kinds.

use bytes::Bytes;
use strata_engine::{Change, Engine, Error, Key, KeyChange, Kind, PutOptions, Tier};

use crate::support::{key, open, small_options, Acked};

const KINDS: [Kind; 5] = [Kind::String, Kind::Hash, Kind::Set, Kind::ZSet, Kind::List];

fn value_of(i: usize, len: usize) -> Bytes {
    Bytes::from(vec![(i % 251) as u8; len])
}

async fn put_kind(engine: &Engine, k: &Key, kind: Kind, value: Bytes) {
    engine
        .update(k, false, move |_| {
            let change = Change::Put {
                kind,
                value,
                expire_ms: 0,
            };
            Ok((Some(change), ()))
        })
        .await
        .acked(engine)
        .await
        .unwrap();
}

async fn check_all(engine: &Engine, n: usize, when: &str) {
    for i in 0..n {
        let k = key(format!("key:{i:04}"));
        let kind = KINDS[i % KINDS.len()];
        let got = engine.get_value(&k).await.unwrap();
        assert_eq!(got, Some((kind, value_of(i, 300))), "key {i} {when}");
        assert_eq!(
            engine.kind_of(&k).await.unwrap(),
            Some(kind),
            "key {i} {when}"
        );
        let s = engine.get(&k).await;
        if kind == Kind::String {
            assert_eq!(s, Ok(Some(value_of(i, 300))), "key {i} {when}");
        } else {
            assert_eq!(s, Err(Error::WrongType), "key {i} {when}");
        }
    }
}

#[tokio::test]
async fn every_kind_keeps_its_kind_in_every_tier_and_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = small_options(dir.path());
    // A value log for values from 1 KiB: the large one below goes there.
    o.s.vlog.vlog_value_bytes_min = 1024;
    let engine = open(o.clone()).await.unwrap();
    const N: usize = 200;
    for i in 0..N {
        let k = key(format!("key:{i:04}"));
        put_kind(&engine, &k, KINDS[i % KINDS.len()], value_of(i, 300)).await;
    }
    let big = key("big hash");
    put_kind(&engine, &big, Kind::Hash, value_of(7, 4096)).await;
    check_all(&engine, N, "in DRAM").await;
    engine.run_background_once().await.unwrap();
    engine.clear_hot();
    let mut cold = [0usize; 5];
    for i in 0..N {
        let k = key(format!("key:{i:04}"));
        if engine.tier_of(&k).await.unwrap() == Some(Tier::Cold) {
            cold[i % KINDS.len()] += 1;
        }
    }
    assert!(
        cold.iter().all(|&c| c > 5),
        "every kind was demoted: {cold:?}"
    );
    check_all(&engine, N, "read from warm and cold").await;
    check_all(&engine, N, "read again (DRAM, returned to warm)").await;
    // A multi-key string read answers nothing for the other kinds.
    let keys: Vec<Key> = (0..5).map(|i| key(format!("key:{i:04}"))).collect();
    let refs: Vec<&Key> = keys.iter().collect();
    let got = engine.get_many(&refs).await.unwrap();
    assert_eq!(got[0], Some(value_of(0, 300)));
    assert!(got[1..].iter().all(Option::is_none), "{got:?}");
    // A string write replaces a value of any kind.
    engine
        .put(
            &keys[1],
            Bytes::from_static(b"now a string"),
            PutOptions::default(),
        )
        .await
        .acked(&engine)
        .await
        .unwrap();
    assert_eq!(engine.kind_of(&keys[1]).await.unwrap(), Some(Kind::String));
    put_kind(&engine, &keys[1], Kind::Hash, value_of(1, 300)).await;
    let start = engine.last_sequence();
    put_kind(&engine, &key("logged"), Kind::List, value_of(3, 50)).await;
    let changes = engine.changes_after(start, 16).unwrap();
    assert!(
        changes
            .iter()
            .flat_map(|c| &c.keys)
            .any(|(k, c)| k.client() == b"logged"
                && matches!(
                    c,
                    KeyChange::Set {
                        kind: Kind::List,
                        ..
                    }
                )),
        "{changes:?}"
    );
    engine.close().await.unwrap();
    drop(engine);

    let engine = open(o).await.unwrap();
    check_all(&engine, N, "after a restart").await;
    assert_eq!(
        engine.get_value(&big).await.unwrap(),
        Some((Kind::Hash, value_of(7, 4096)))
    );
    assert_eq!(engine.get(&big).await, Err(Error::WrongType));
}
