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

/// The fields of the hash at `k`, by name, with their expiries; `None` if it is gone.
async fn hash_fields(engine: &Engine, k: &Key) -> Option<Vec<(String, u64)>> {
    let (kind, value) = engine.get_value(k).await.unwrap()?;
    assert_eq!(kind, Kind::Hash);
    let fields = strata_format::hash::decode_hash(&value).unwrap();
    Some(
        fields
            .iter()
            .map(|f| (String::from_utf8_lossy(f.name).into_owned(), f.expire_ms))
            .collect(),
    )
}

/// Redis 7.4's field TTLs: the expiry sweep deletes a hash with its last field, in the warm
/// tier and in the cold one, without reading or rewriting a hash before then (a cold one
/// stays cold; reads pass over expired fields) or touching the hash's own TTL; a hash
/// written with every field expired is not stored.
#[tokio::test]
async fn hashes_go_with_their_last_field_in_every_tier() {
    use strata_format::hash::{encode_hash, Field};
    let dir = tempfile::tempdir().unwrap();
    let t0 = 1_000_000;
    let clock = std::sync::Arc::new(strata_engine::ManualClock::new(t0));
    let engine = crate::support::open_with_clock(small_options(dir.path()), clock.clone())
        .await
        .unwrap();
    let hash = |fields: &[(&str, u64)]| {
        let fields: Vec<Field<'_>> = fields
            .iter()
            .map(|(n, at)| Field {
                name: n.as_bytes(),
                value: b"v",
                expire_ms: *at,
            })
            .collect();
        Bytes::from(encode_hash(&fields))
    };
    let (stays, goes, cold) = (key("stays"), key("goes"), key("cold"));
    let stays_fields = [("a", t0 + 100), ("b", t0 + 200), ("c", 0)];
    put_kind(&engine, &stays, Kind::Hash, hash(&stays_fields)).await;
    engine
        .set_expire(&stays, t0 + 10_000)
        .await
        .acked(&engine)
        .await
        .unwrap();
    put_kind(
        &engine,
        &goes,
        Kind::Hash,
        hash(&[("a", t0 + 100), ("b", t0 + 200)]),
    )
    .await;
    put_kind(
        &engine,
        &cold,
        Kind::Hash,
        hash(&[("a", t0 + 100), ("b", t0 + 300)]),
    )
    .await;
    // Its own expiry set to its last field's millisecond, then removed: the fields' entry
    // (the same entry) is not lost with it.
    let same = key("same");
    put_kind(&engine, &same, Kind::Hash, hash(&[("a", t0 + 300)])).await;
    for at in [t0 + 300, 0] {
        engine
            .set_expire(&same, at)
            .await
            .acked(&engine)
            .await
            .unwrap();
    }
    crate::support::fill(&engine, 60, 300).await;
    engine.run_background_once().await.unwrap();
    engine.clear_hot();
    assert_eq!(engine.tier_of(&cold).await.unwrap(), Some(Tier::Cold));
    let keys = engine.keys_in(0);

    for _ in 0..2 {
        clock.advance_ms(100);
        engine.run_background_once().await.unwrap();
        assert_eq!(engine.tier_of(&cold).await.unwrap(), Some(Tier::Cold));
    }
    assert!(
        !engine.exists(&goes).await.unwrap(),
        "its last field expired"
    );
    assert_eq!(engine.keys_in(0), keys - 1);
    assert_eq!(
        hash_fields(&engine, &stays).await.unwrap().len(),
        3,
        "not rewritten"
    );
    assert_eq!(
        engine.expire_time_ms(&stays).await.unwrap(),
        Some(t0 + 10_000)
    );
    let expired = engine.stats().expired;
    clock.advance_ms(100);
    engine.run_background_once().await.unwrap();
    assert!(
        !engine.exists(&cold).await.unwrap(),
        "gone from the cold tier"
    );
    assert!(
        !engine.exists(&same).await.unwrap(),
        "gone though PERSIST came between"
    );
    assert_eq!(engine.keys_in(0), keys - 3);
    assert_eq!(engine.stats().expired, expired + 2);
    assert!(engine.exists(&stays).await.unwrap());

    // Written with every field expired (a late write of an old value): not stored.
    put_kind(&engine, &goes, Kind::Hash, hash(&[("a", t0 + 1)])).await;
    assert!(!engine.exists(&goes).await.unwrap());
    assert_eq!(engine.keys_in(0), keys - 3);
}
