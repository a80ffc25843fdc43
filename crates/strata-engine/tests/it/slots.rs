//! Cluster mode's key layout: every key carries its Redis Cluster slot, so a slot is one
//! key range in every tier (warm and cold) that can be listed alone; scans still see every
//! key once; a store keeps the mode it was created in.

use std::collections::BTreeSet;

use bytes::Bytes;
use strata_engine::PutOptions;
use strata_format::keys::slot_of;

use crate::support::{open, small_options, Acked};

#[tokio::test]
async fn cluster_mode_keys_carry_their_slot_in_every_tier_and_scans_see_each_key_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = small_options(dir.path());
    o.s.key_slots = true;
    let engine = open(o.clone()).await.unwrap();
    let names: Vec<String> = (0..200).map(|i| format!("user:{i}")).collect();
    for n in &names {
        let key = engine.key(0, n.as_bytes());
        assert_eq!(key.slot(), slot_of(n.as_bytes()), "{n}");
        engine
            .put(&key, Bytes::from(vec![7u8; 300]), PutOptions::default())
            .await
            .acked(&engine)
            .await
            .unwrap();
    }
    // Hash tags put keys in one slot.
    assert_eq!(
        engine.key(0, b"{user:1}.a").slot(),
        engine.key(0, b"user:1").slot()
    );
    engine.run_background_once().await.unwrap();
    assert!(engine.stats().cold_entries > 50, "the small budget demotes");

    // A scan of the database, page by page, sees every key once, in slot order.
    let mut seen = Vec::new();
    let mut cursor: Option<Bytes> = None;
    loop {
        let page = engine
            .scan(0, cursor.as_deref().unwrap_or(b""), None, 17)
            .unwrap();
        seen.extend(page.items.iter().map(|i| i.key.clone()));
        match page.next {
            Some(n) => cursor = Some(n),
            None => break,
        }
    }
    assert_eq!(seen.len(), names.len());
    let slots: Vec<u16> = seen.iter().map(|k| slot_of(k)).collect();
    assert!(slots.windows(2).all(|w| w[0] <= w[1]), "slot order");
    // A prefix scan reads across slots.
    let mut with_prefix = BTreeSet::new();
    let mut cursor: Option<Bytes> = None;
    loop {
        let page = engine
            .scan_prefix(0, b"user:1", cursor.as_deref(), 5)
            .unwrap();
        with_prefix.extend(page.items.iter().map(|i| i.key.clone()));
        match page.next {
            Some(n) => cursor = Some(n),
            None => break,
        }
    }
    let want: BTreeSet<Bytes> = names
        .iter()
        .filter(|n| n.starts_with("user:1"))
        .map(|n| Bytes::from(n.clone()))
        .collect();
    assert_eq!(with_prefix, want);

    // One slot's keys, warm and cold, are one range.
    let slot = slot_of(b"user:7");
    let in_slot: BTreeSet<Bytes> = engine
        .scan_slot(0, slot, None, 1000)
        .unwrap()
        .items
        .into_iter()
        .map(|i| i.key)
        .collect();
    let want: BTreeSet<Bytes> = names
        .iter()
        .filter(|n| slot_of(n.as_bytes()) == slot)
        .map(|n| Bytes::from(n.clone()))
        .collect();
    assert!(!want.is_empty());
    assert_eq!(in_slot, want);
    engine.close().await.unwrap();
    drop(engine);

    // The store keeps its mode: single-node mode cannot open it.
    let mut single = o.clone();
    single.s.key_slots = false;
    let err = open(single).await.err().expect("refused").to_string();
    assert!(err.contains("cluster mode"), "{err}");
    let engine = open(o).await.unwrap();
    let v = engine.get(&engine.key(0, b"user:7")).await.unwrap();
    assert_eq!(v.map(|b| b.len()), Some(300));
}

#[tokio::test]
async fn a_single_node_store_with_keys_refuses_cluster_mode_and_an_empty_one_takes_it() {
    let dir = tempfile::tempdir().unwrap();
    let o = small_options(dir.path());
    let engine = open(o.clone()).await.unwrap();
    let key = engine.key(0, b"k");
    assert_eq!(key.slot(), 0);
    engine
        .put(&key, Bytes::from_static(b"v"), PutOptions::default())
        .await
        .acked(&engine)
        .await
        .unwrap();
    engine.close().await.unwrap();
    drop(engine);
    let mut cluster = o.clone();
    cluster.s.key_slots = true;
    let err = open(cluster).await.err().expect("refused").to_string();
    assert!(err.contains("single-node mode"), "{err}");

    let empty = tempfile::tempdir().unwrap();
    let mut o = small_options(empty.path());
    o.s.key_slots = true;
    let engine = open(o).await.unwrap();
    assert_eq!(engine.key(0, b"foo").slot(), 12182);
}
