//! Databases: each a keyspace of its own in every tier, counted per database across
//! restarts, flushed alone.

use bytes::Bytes;
use strata_engine::{Engine, Key, PutOptions, Tier};

use crate::support::{open, small_options, Acked};

fn k(db: u8, i: usize) -> Key {
    Key::new(db, 0, format!("key:{i:04}").as_bytes())
}

async fn put(engine: &Engine, key: &Key, v: &[u8]) {
    engine
        .put(key, Bytes::copy_from_slice(v), PutOptions::default())
        .await
        .acked(engine)
        .await
        .unwrap();
}

#[tokio::test]
async fn databases_keep_apart_in_every_tier_count_their_keys_and_flush_alone() {
    let dir = tempfile::tempdir().unwrap();
    let o = small_options(dir.path());
    let engine = open(o.clone()).await.unwrap();
    // The same client keys in databases 0, 1 and 9, with values that name the database.
    for db in [0u8, 1, 9] {
        for i in 0..150 {
            put(&engine, &k(db, i), &vec![db; 300]).await;
        }
    }
    engine.run_background_once().await.unwrap();
    assert!(
        engine.stats().cold_entries > 100,
        "the small budget demotes"
    );
    assert_eq!(
        [0, 1, 9, 2].map(|db| engine.keys_in(db)),
        [150, 150, 150, 0]
    );
    // Deleting and overwriting move only their own database's count.
    engine.delete(&k(1, 0)).await.acked(&engine).await.unwrap();
    put(&engine, &k(9, 1), b"again").await;
    assert_eq!([0, 1, 9].map(|db| engine.keys_in(db)), [150, 149, 150]);
    engine.close().await.unwrap();
    drop(engine);

    let engine = open(o.clone()).await.unwrap();
    assert_eq!([0, 1, 9].map(|db| engine.keys_in(db)), [150, 149, 150]);
    let mut cold = 0;
    for i in 0..150 {
        if engine.tier_of(&k(1, i)).await.unwrap() == Some(Tier::Cold) {
            cold += 1;
        }
    }
    assert!(cold > 0, "database 1 has keys in the cold tier");
    engine.flush_db(1).await.acked(&engine).await.unwrap();
    assert_eq!([0, 1, 9].map(|db| engine.keys_in(db)), [150, 0, 150]);
    for i in 0..150 {
        assert_eq!(engine.get(&k(1, i)).await.unwrap(), None, "db 1 key {i}");
        assert_eq!(
            engine.get(&k(0, i)).await.unwrap(),
            Some(Bytes::from(vec![0u8; 300])),
            "db 0 key {i}"
        );
    }
    let st = engine.stats();
    assert_eq!(st.warm_entries + st.cold_entries, 300, "{st:?}");
    engine.flush_all().await.acked(&engine).await.unwrap();
    assert_eq!([0, 1, 9].map(|db| engine.keys_in(db)), [0, 0, 0]);
    put(&engine, &k(9, 3), b"x").await;
    engine.close().await.unwrap();
    drop(engine);
    let engine = open(o).await.unwrap();
    assert_eq!([0, 1, 9].map(|db| engine.keys_in(db)), [0, 0, 1]);
}

/// The string under client key `client` of database `db`.
async fn read(engine: &Engine, db: u8, client: &[u8]) -> Option<Bytes> {
    engine.get(&engine.key(db, client)).await.unwrap()
}

#[tokio::test]
async fn swapped_databases_trade_contents_in_every_tier_and_stay_swapped_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let o = small_options(dir.path());
    let engine = open(o.clone()).await.unwrap();
    for i in 0..150 {
        put(
            &engine,
            &engine.key(1, format!("key:{i:04}").as_bytes()),
            &[1; 300],
        )
        .await;
    }
    put(&engine, &engine.key(9, b"only-in-9"), b"nine").await;
    engine.run_background_once().await.unwrap();
    assert!(
        engine.stats().cold_entries > 100,
        "the small budget demotes"
    );
    engine.swap_dbs(1, 9).unwrap();
    let check = |engine: &Engine| {
        assert_eq!([1, 9].map(|db| engine.keys_in(db)), [1, 150]);
    };
    check(&engine);
    assert_eq!(
        read(&engine, 1, b"only-in-9").await.as_deref(),
        Some(&b"nine"[..])
    );
    assert_eq!(read(&engine, 9, b"only-in-9").await, None);
    // A key read from the cold tier under its new database.
    assert_eq!(
        read(&engine, 9, b"key:0000").await.as_deref(),
        Some(&[1u8; 300][..])
    );
    let page = engine.scan(9, b"", None, 1000).unwrap();
    assert_eq!(page.items.len(), 150);
    engine.close().await.unwrap();
    drop(engine);

    let engine = open(o).await.unwrap();
    check(&engine);
    assert_eq!(
        read(&engine, 1, b"only-in-9").await.as_deref(),
        Some(&b"nine"[..])
    );
    // Flushing database 9 now empties what was written to database 1.
    engine.flush_db(9).await.acked(&engine).await.unwrap();
    assert_eq!([1, 9].map(|db| engine.keys_in(db)), [1, 0]);
    assert_eq!(read(&engine, 9, b"key:0001").await, None);
    engine.swap_dbs(1, 9).unwrap();
    assert_eq!(
        read(&engine, 9, b"only-in-9").await.as_deref(),
        Some(&b"nine"[..])
    );
}
