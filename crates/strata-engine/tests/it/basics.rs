//! Behaviour of each operation through all three tiers.

use std::sync::Arc;

use bytes::Bytes;
use strata_engine::{Condition, Engine, Error, Expire, Key, ManualClock, PutOptions, Tier};

use crate::support::{
    delete_numbered, fill, fill_and_demote, fill_range, key, open, open_with_clock, small_options,
    Acked,
};

/// Small options with budgets write-back works within (its share is a part of DRAM's and
/// of warm's).
fn write_back_options(dir: &std::path::Path) -> crate::support::Opts {
    let mut o = small_options(dir);
    o.s.hot.hot_bytes_max = 4 << 20;
    o.s.warm.warm_bytes_max = 64 << 20;
    o
}

fn put_opts(condition: Condition, expire: Expire) -> PutOptions {
    PutOptions {
        expire,
        condition,
        return_old: false,
    }
}

#[tokio::test]
async fn demoted_keys_read_back_from_the_cold_tier_and_promote_to_hot() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(small_options(dir.path())).await.unwrap();
    fill(&engine, 200, 300).await;
    let demoted = engine.run_background_once().await.unwrap();
    let st = engine.stats();
    assert!(demoted > 100, "demoted only {demoted}");
    assert!(
        st.warm_bytes <= 8 << 10,
        "warm over budget: {}",
        st.warm_bytes
    );
    assert_eq!(st.cold_entries + st.warm_entries, 200);
    assert!(st.segments_written >= 1);
    engine.clear_hot();
    assert_eq!(
        engine.tier_of(&key(b"key:0000")).await.unwrap(),
        Some(Tier::Cold)
    );
    for i in 0..200 {
        let got = engine
            .get(&key(format!("key:{i:04}").as_bytes()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, vec![(i % 251) as u8; 300]);
    }
    let st2 = engine.stats();
    assert!(st2.cold_hits > 100, "cold hits {}", st2.cold_hits);
    assert!(st2.object_store_gets > 0);
    assert_eq!(
        engine.tier_of(&key(b"key:0199")).await.unwrap(),
        Some(Tier::Hot),
        "the last read is promoted"
    );
    engine.close().await.unwrap();
}

#[tokio::test]
async fn get_many_spans_tiers_and_keeps_order() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(small_options(dir.path())).await.unwrap();
    fill_and_demote(&engine, 100, 200).await;
    engine.clear_hot();
    engine.get(&key(b"key:0099")).await.unwrap();
    let keys: Vec<Vec<u8>> = (0..100)
        .rev()
        .map(|i| format!("key:{i:04}").into_bytes())
        .chain([b"absent".to_vec()])
        .collect();
    let refs_stored: Vec<Key> = keys.iter().map(key).collect();
    let refs: Vec<&Key> = refs_stored.iter().collect();
    let got = engine.get_many(&refs).await.unwrap();
    for (j, i) in (0..100).rev().enumerate() {
        assert_eq!(
            got[j].as_deref(),
            Some(&vec![(i % 251) as u8; 200][..]),
            "key {i}"
        );
    }
    assert_eq!(got[100], None);
    let st = engine.stats();
    assert!(st.cold_hits > 0 && st.hot_hits > 0, "{st:?}");
    assert!(
        st.object_store_gets < 100,
        "keys in one block share a fetch: {} gets",
        st.object_store_gets
    );
}

#[tokio::test]
async fn conditional_puts_and_return_old() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(small_options(dir.path())).await.unwrap();
    let nx = put_opts(Condition::IfAbsent, Expire::Persist);
    assert!(
        engine
            .put(&key(b"a"), "1".into(), nx.clone())
            .await
            .acked(&engine)
            .await
            .unwrap()
            .written
    );
    assert!(
        !engine
            .put(&key(b"a"), "2".into(), nx)
            .await
            .acked(&engine)
            .await
            .unwrap()
            .written
    );
    assert!(
        !engine
            .put(
                &key(b"b"),
                "1".into(),
                put_opts(Condition::IfPresent, Expire::Persist)
            )
            .await
            .acked(&engine)
            .await
            .unwrap()
            .written
    );
    assert!(
        engine
            .put(
                &key(b"a"),
                "3".into(),
                put_opts(Condition::IfPresent, Expire::Persist)
            )
            .await
            .acked(&engine)
            .await
            .unwrap()
            .written
    );
    let ifeq = |v: &'static str| {
        put_opts(
            Condition::IfEquals(Bytes::from_static(v.as_bytes())),
            Expire::Persist,
        )
    };
    assert!(
        !engine
            .put(&key(b"a"), "4".into(), ifeq("1"))
            .await
            .acked(&engine)
            .await
            .unwrap()
            .written
    );
    assert!(
        engine
            .put(&key(b"a"), "4".into(), ifeq("3"))
            .await
            .acked(&engine)
            .await
            .unwrap()
            .written
    );
    let r = engine
        .put(
            &key(b"a"),
            "5".into(),
            PutOptions {
                return_old: true,
                ..Default::default()
            },
        )
        .await
        .acked(&engine)
        .await
        .unwrap();
    assert_eq!(r.old.as_deref(), Some(&b"4"[..]));
    // A demoted key keeps its conditional semantics (its value comes from the cold tier).
    fill_and_demote(&engine, 100, 300).await;
    engine.clear_hot();
    assert_eq!(engine.tier_of(&key(b"a")).await.unwrap(), Some(Tier::Cold));
    assert!(
        engine
            .put(&key(b"a"), "6".into(), ifeq("5"))
            .await
            .acked(&engine)
            .await
            .unwrap()
            .written
    );
    assert_eq!(engine.tier_of(&key(b"a")).await.unwrap(), Some(Tier::Hot));
    engine.clear_hot();
    assert_eq!(
        engine.tier_of(&key(b"a")).await.unwrap(),
        Some(Tier::Warm),
        "an overwrite brings a key back to warm"
    );
    assert_eq!(engine.get(&key(b"a")).await.unwrap().unwrap(), "6");
}

#[tokio::test]
async fn incr_parses_strictly_and_detects_overflow() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(small_options(dir.path())).await.unwrap();
    assert_eq!(
        engine
            .incr_by(&key(b"n"), 5)
            .await
            .acked(&engine)
            .await
            .unwrap(),
        5
    );
    assert_eq!(
        engine
            .incr_by(&key(b"n"), -7)
            .await
            .acked(&engine)
            .await
            .unwrap(),
        -2
    );
    engine
        .put(&key(b"s"), "abc".into(), PutOptions::default())
        .await
        .acked(&engine)
        .await
        .unwrap();
    assert_eq!(
        engine.incr_by(&key(b"s"), 1).await.acked(&engine).await,
        Err(Error::NotInteger)
    );
    engine
        .put(
            &key(b"m"),
            i64::MAX.to_string().into(),
            PutOptions::default(),
        )
        .await
        .acked(&engine)
        .await
        .unwrap();
    assert_eq!(
        engine.incr_by(&key(b"m"), 1).await.acked(&engine).await,
        Err(Error::Overflow)
    );
    assert_eq!(
        engine.get(&key(b"m")).await.unwrap().unwrap(),
        i64::MAX.to_string()
    );
}

#[tokio::test]
async fn counters_rewritten_in_dram_keep_their_expiry_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000));
    let engine = open_with_clock(write_back_options(dir.path()), clock.clone())
        .await
        .unwrap();
    let incr = |k: &'static [u8], by: i64| {
        let engine = &engine;
        async move { engine.incr_by(&key(k), by).await.acked(engine).await }
    };
    // A clean DRAM copy (settled into warm) is rewritten in place through write-back;
    // `stats` settles what write-back holds, so each round starts clean again.
    let at = put_opts(Condition::Always, Expire::AtMs(1_050_000));
    engine
        .put(&key(b"ttl"), "10".into(), at)
        .await
        .acked(&engine)
        .await
        .unwrap();
    for want in 11..=16 {
        assert_eq!(incr(b"ttl", 1).await.unwrap(), want);
        if want % 2 == 0 {
            let st = engine.stats();
            assert_eq!((st.hot_dirty_bytes, st.hot_entries), (0, 1));
        }
    }
    assert!(
        engine.stats().writes_back >= 6,
        "write-back took the counter"
    );
    assert_eq!(
        engine.expire_time_ms(&key(b"ttl")).await.unwrap(),
        Some(1_050_000)
    );
    // Digits that change in number, a sign, and errors that leave the value as it was.
    assert_eq!(incr(b"n", 99).await.unwrap(), 99);
    assert_eq!(incr(b"n", 1).await.unwrap(), 100);
    assert_eq!(incr(b"n", -101).await.unwrap(), -1);
    assert_eq!(incr(b"n", -8).await.unwrap(), -9);
    engine
        .put(
            &key(b"big"),
            (i64::MAX - 1).to_string().into(),
            PutOptions::default(),
        )
        .await
        .acked(&engine)
        .await
        .unwrap();
    assert_eq!(incr(b"big", 1).await.unwrap(), i64::MAX);
    assert_eq!(incr(b"big", 1).await, Err(Error::Overflow));
    engine
        .put(&key(b"word"), "ab".into(), PutOptions::default())
        .await
        .acked(&engine)
        .await
        .unwrap();
    assert_eq!(incr(b"word", 1).await, Err(Error::NotInteger));
    assert_eq!(engine.get(&key(b"word")).await.unwrap().unwrap(), "ab");
    // Past its expiry a counter starts again from nothing, without an expiry.
    clock.advance_ms(60_000);
    assert_eq!(incr(b"ttl", 1).await.unwrap(), 1);
    assert_eq!(engine.expire_time_ms(&key(b"ttl")).await.unwrap(), Some(0));
    assert_eq!(incr(b"ttl", 2).await.unwrap(), 3);
    engine.close().await.unwrap();
    drop(engine);
    let engine = open_with_clock(small_options(dir.path()), clock)
        .await
        .unwrap();
    for (k, want) in [
        (&b"ttl"[..], "3"),
        (b"n", "-9"),
        (b"big", &i64::MAX.to_string()),
    ] {
        assert_eq!(engine.get(&key(k)).await.unwrap().unwrap(), want);
    }
}

/// A key whose newest value write-back holds, past its expiry, is gone: a read (alone or
/// with others, from DRAM's one look-up) must not fall through to the older value the warm
/// store still holds. Absent keys around it are answered too.
#[tokio::test]
async fn a_value_expired_in_write_back_hides_the_older_stored_one() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000));
    let engine = open_with_clock(write_back_options(dir.path()), clock.clone())
        .await
        .unwrap();
    let k = key(b"feature");
    engine
        .put(&k, "old".into(), PutOptions::default())
        .await
        .acked(&engine)
        .await
        .unwrap();
    // `stats` settles write-back: "old" is in the warm store, and DRAM lets its copy go.
    let before = engine.stats().writes_back;
    engine.clear_hot();
    assert_eq!(engine.tier_of(&k).await.unwrap(), Some(Tier::Warm));
    let soon = put_opts(Condition::Always, Expire::AtMs(1_001_000));
    engine
        .put(&k, "new".into(), soon)
        .await
        .acked(&engine)
        .await
        .unwrap();
    assert_eq!(engine.get(&k).await.unwrap().unwrap(), "new");
    clock.advance_ms(5_000);
    let absent = key(b"never");
    assert_eq!(engine.get(&k).await.unwrap(), None);
    assert_eq!(
        engine.get_many(&[&absent, &k, &absent]).await.unwrap(),
        vec![None, None, None]
    );
    assert_eq!(engine.get_value(&k).await.unwrap(), None);
    // The expired value was write-back's (else the warm store would answer on its own).
    assert!(engine.stats().writes_back > before);
    assert_eq!(engine.get(&k).await.unwrap(), None);
    engine.close().await.unwrap();
}

#[tokio::test]
async fn ttl_holds_in_every_tier_and_expired_keys_are_never_demoted() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000));
    let engine = open_with_clock(small_options(dir.path()), clock.clone())
        .await
        .unwrap();
    let at = |ms: u64| put_opts(Condition::Always, Expire::AtMs(1_000_000 + ms));
    engine
        .put(&key(b"warm-ttl"), "v".into(), at(100))
        .await
        .acked(&engine)
        .await
        .unwrap();
    engine
        .put(&key(b"cold-ttl"), Bytes::from(vec![1u8; 300]), at(200))
        .await
        .acked(&engine)
        .await
        .unwrap();
    engine
        .put(&key(b"short"), Bytes::from(vec![1u8; 300]), at(50))
        .await
        .acked(&engine)
        .await
        .unwrap();
    fill(&engine, 60, 300).await;
    let before = engine.stats().expired;
    clock.advance_ms(60);
    engine.run_background_once().await.unwrap();
    assert_eq!(
        engine.stats().expired,
        before + 1,
        "the sweeper removes 'short'"
    );
    engine.clear_hot();
    assert_eq!(
        engine.tier_of(&key(b"cold-ttl")).await.unwrap(),
        Some(Tier::Cold)
    );
    assert_eq!(
        engine.expire_time_ms(&key(b"cold-ttl")).await.unwrap(),
        Some(1_000_200)
    );
    assert!(engine.get(&key(b"cold-ttl")).await.unwrap().is_some());
    clock.advance_ms(100);
    assert_eq!(engine.get(&key(b"warm-ttl")).await.unwrap(), None);
    clock.advance_ms(100);
    assert_eq!(
        engine.get(&key(b"cold-ttl")).await.unwrap(),
        None,
        "expired in hot and cold"
    );
    engine.clear_hot();
    assert_eq!(engine.get(&key(b"cold-ttl")).await.unwrap(), None);
    assert!(!engine.exists(&key(b"cold-ttl")).await.unwrap());
    // Expiry can be set and removed on a cold key without fetching it.
    engine.clear_hot();
    assert_eq!(
        engine.tier_of(&key(b"key:0000")).await.unwrap(),
        Some(Tier::Cold)
    );
    assert!(engine
        .set_expire(&key(b"key:0000"), 1_000_500)
        .await
        .acked(&engine)
        .await
        .unwrap());
    assert_eq!(
        engine.expire_time_ms(&key(b"key:0000")).await.unwrap(),
        Some(1_000_500)
    );
    assert!(engine
        .set_expire(&key(b"key:0000"), 0)
        .await
        .acked(&engine)
        .await
        .unwrap());
    clock.advance_ms(1000);
    assert!(engine.exists(&key(b"key:0000")).await.unwrap());
}

#[tokio::test]
async fn scan_merges_tiers_in_order_with_a_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(small_options(dir.path())).await.unwrap();
    fill(&engine, 150, 200).await;
    engine
        .put(&key(b"other"), "x".into(), PutOptions::default())
        .await
        .acked(&engine)
        .await
        .unwrap();
    engine.run_background_once().await.unwrap();
    let mut seen = Vec::new();
    let mut cursor: Option<Bytes> = None;
    let mut tiers = std::collections::HashSet::new();
    loop {
        let page = engine
            .scan_prefix(0, b"key:", cursor.as_deref(), 7)
            .unwrap();
        for it in &page.items {
            seen.push(it.key.clone());
            tiers.insert(it.tier);
        }
        match page.next {
            Some(n) => cursor = Some(n),
            None => break,
        }
    }
    let want: Vec<Bytes> = (0..150)
        .map(|i| Bytes::from(format!("key:{i:04}")))
        .collect();
    assert_eq!(seen, want);
    assert!(
        tiers.contains(&Tier::Warm) && tiers.contains(&Tier::Cold),
        "{tiers:?}"
    );
}

#[tokio::test]
async fn key_ranges_read_string_values_from_every_tier_in_either_order() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(small_options(dir.path())).await.unwrap();
    fill_and_demote(&engine, 150, 200).await;
    // The newest writes stay in DRAM; one key of another kind and one expired key are in
    // the range too, and are passed over.
    for i in [150, 151] {
        let k = format!("key:{i:04}");
        let v = Bytes::from(vec![(i % 251) as u8; 200]);
        engine
            .put(&key(k.as_bytes()), v, PutOptions::default())
            .await
            .acked(&engine)
            .await
            .unwrap();
    }
    engine
        .update(&key(b"key:0003"), false, |_| {
            let change = strata_engine::Change::Put {
                kind: strata_engine::Kind::Hash,
                value: Bytes::from_static(b"not a string"),
                expire_ms: 0,
            };
            Ok((Some(change), ()))
        })
        .await
        .acked(&engine)
        .await
        .unwrap();
    engine
        .put(
            &key(b"key:0004"),
            "gone".into(),
            put_opts(Condition::Always, Expire::AtMs(1)),
        )
        .await
        .acked(&engine)
        .await
        .unwrap();
    let want = |i: usize| {
        (
            Bytes::from(format!("key:{i:04}")),
            Bytes::from(vec![(i % 251) as u8; 200]),
        )
    };
    let strings: Vec<usize> = (0..152).filter(|i| *i != 3 && *i != 4).collect();
    let all = engine
        .range(0, None, None, 1000, false, u64::MAX)
        .await
        .unwrap();
    assert_eq!(all, strings.iter().map(|&i| want(i)).collect::<Vec<_>>());
    let tiers: std::collections::HashSet<Tier> = tiers_of(&engine, &strings).await;
    assert!(
        tiers.contains(&Tier::Hot) && tiers.contains(&Tier::Warm) && tiers.contains(&Tier::Cold),
        "{tiers:?}"
    );
    // Bounds included and excluded, a limit, and the reverse order.
    let lo = Some((&b"key:0002"[..], false));
    let hi = Some((&b"key:0008"[..], true));
    let got = engine.range(0, lo, hi, 3, false, u64::MAX).await.unwrap();
    assert_eq!(got, vec![want(5), want(6), want(7)]);
    let got = engine.range(0, lo, hi, 100, true, u64::MAX).await.unwrap();
    assert_eq!(got, vec![want(8), want(7), want(6), want(5)]);
    let newest = engine
        .range(0, None, None, 2, true, u64::MAX)
        .await
        .unwrap();
    assert_eq!(newest, vec![want(151), want(150)]);
    let empty = Some((&b"key:0005"[..], false));
    assert!(engine
        .range(
            0,
            empty,
            Some((&b"key:0005"[..], true)),
            10,
            false,
            u64::MAX
        )
        .await
        .unwrap()
        .is_empty());
    // Another database holds none of them.
    assert!(engine
        .range(1, None, None, 10, false, u64::MAX)
        .await
        .unwrap()
        .is_empty());
    // Values past the reply's limit are refused, whichever tier holds them; one alone fits.
    let e = engine
        .range(0, None, None, 10, false, 1000)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("more than 1000 bytes"), "{e}");
    assert_eq!(
        engine
            .range(0, None, None, 1, false, 1)
            .await
            .unwrap()
            .len(),
        1
    );
}

/// The tiers that serve `keys` (numbers of `key:NNNN`) now.
async fn tiers_of(engine: &Engine, keys: &[usize]) -> std::collections::HashSet<Tier> {
    let mut tiers = std::collections::HashSet::new();
    for i in keys {
        if let Some(t) = engine.tier_of(&key(format!("key:{i:04}"))).await.unwrap() {
            tiers.insert(t);
        }
    }
    tiers
}

#[tokio::test]
async fn overwrite_and_delete_of_cold_keys_drop_index_entries_and_segments_get_collected() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(small_options(dir.path())).await.unwrap();
    fill_and_demote(&engine, 100, 300).await;
    let cold_before = engine.stats().cold_entries;
    assert!(cold_before > 50);
    for i in 0..100 {
        let k = format!("key:{i:04}");
        if i % 2 == 0 {
            engine
                .delete(&key(k.as_bytes()))
                .await
                .acked(&engine)
                .await
                .unwrap();
        } else {
            engine
                .put(&key(k.as_bytes()), "new".into(), PutOptions::default())
                .await
                .acked(&engine)
                .await
                .unwrap();
        }
    }
    let st = engine.stats();
    assert_eq!(st.cold_entries, 0);
    assert_eq!(st.cold_bytes, 0);
    assert_eq!(st.warm_entries, 50);
    engine.run_background_once().await.unwrap();
    let segs = std::fs::read_dir(dir.path().join("cold/segments"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(segs, 0, "segments without live keys are deleted");
    assert!(engine.stats().segments_deleted > 0);
}

#[tokio::test]
async fn sparse_segments_are_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = small_options(dir.path());
    o.s.cold.segment_bytes_max = 64 << 10;
    o.s.warm.warm_bytes_max = 4 << 10;
    let engine = open(o).await.unwrap();
    fill_and_demote(&engine, 100, 300).await;
    assert_eq!(engine.stats().segments_written, 1);
    delete_numbered(&engine, 0..70).await;
    engine.run_background_once().await.unwrap();
    let st = engine.stats();
    assert_eq!(st.segments_rewritten, 1, "{st:?}");
    engine.clear_hot();
    for i in 70..100 {
        let v = engine
            .get(&key(format!("key:{i:04}").as_bytes()))
            .await
            .unwrap();
        assert_eq!(
            v.as_deref(),
            Some(&vec![(i % 251) as u8; 300][..]),
            "key {i}"
        );
    }
}

/// A demotion and a segment rewrite of more keys than one background batch locks
/// (`BATCH_KEYS_MAX`, 512) commit batch by batch: every key reads back, and the rewritten
/// segment's record counts what it holds (the next round leaves it be).
#[tokio::test]
async fn demotions_and_rewrites_of_many_keys_commit_in_batches_and_keep_every_key() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = small_options(dir.path());
    o.s.cold.segment_bytes_max = 1 << 20;
    o.s.warm.warm_bytes_max = 4 << 10;
    let engine = open(o).await.unwrap();
    fill_and_demote(&engine, 2000, 100).await;
    let st = engine.stats();
    assert_eq!(st.segments_written, 1, "{st:?}");
    assert!(st.cold_entries > 1500, "{st:?}");
    delete_numbered(&engine, (0..2000).filter(|i| i % 3 != 0)).await;
    engine.run_background_once().await.unwrap();
    let st = engine.stats();
    assert_eq!(st.segments_rewritten, 1, "{st:?}");
    assert!(st.cold_entries > 600, "{st:?}");
    engine.clear_hot();
    for i in 0..2000 {
        let v = engine
            .get(&key(format!("key:{i:04}").as_bytes()))
            .await
            .unwrap();
        let want = (i % 3 == 0).then(|| vec![(i % 251) as u8; 100]);
        assert_eq!(v.as_deref(), want.as_deref(), "key {i}");
    }
    engine.run_background_once().await.unwrap();
    assert_eq!(
        engine.stats().segments_rewritten,
        1,
        "the new segment is not sparse"
    );
}

#[tokio::test]
async fn restart_keeps_every_tier_and_counters() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(small_options(dir.path())).await.unwrap();
    fill_and_demote(&engine, 120, 250).await;
    let st = engine.stats();
    engine.close().await.unwrap();
    assert!(matches!(
        engine
            .put(&key(b"x"), "y".into(), PutOptions::default())
            .await
            .acked(&engine)
            .await,
        Err(Error::Closed)
    ));
    drop(engine);
    let engine = open(small_options(dir.path())).await.unwrap();
    let st2 = engine.stats();
    assert_eq!(
        (st2.warm_entries, st2.cold_entries, st2.warm_bytes),
        (st.warm_entries, st.cold_entries, st.warm_bytes)
    );
    assert_eq!(st2.hot_entries, 0, "the hot tier starts empty");
    for i in 0..120 {
        assert!(
            engine
                .get(&key(format!("key:{i:04}").as_bytes()))
                .await
                .unwrap()
                .is_some(),
            "key {i}"
        );
    }
}

#[tokio::test]
async fn oversized_keys_and_values_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let o = small_options(dir.path());
    let engine = open(o).await.unwrap();
    // Zeroed memory the kernel hands out lazily: no 512 MiB are touched.
    let e = engine
        .put(
            &key(b"k"),
            Bytes::from(vec![0u8; strata_format::VALUE_BYTES_MAX + 1]),
            PutOptions::default(),
        )
        .await
        .acked(&engine)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Invalid(_)), "{e}");
    let e = engine
        .put(&key(vec![b'k'; 70_000]), "v".into(), PutOptions::default())
        .await
        .acked(&engine)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Invalid(_)), "{e}");
}

#[tokio::test]
async fn flush_all_empties_every_tier() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(small_options(dir.path())).await.unwrap();
    fill_and_demote(&engine, 100, 300).await;
    engine.flush_all().await.acked(&engine).await.unwrap();
    let st = engine.stats();
    assert_eq!(
        (
            st.warm_entries,
            st.cold_entries,
            st.hot_entries,
            st.warm_bytes
        ),
        (0, 0, 0, 0)
    );
    assert_eq!(engine.get(&key(b"key:0001")).await.unwrap(), None);
    assert!(engine.scan(0, b"", None, 10).unwrap().items.is_empty());
    engine
        .put(&key(b"after"), "1".into(), PutOptions::default())
        .await
        .acked(&engine)
        .await
        .unwrap();
    assert_eq!(engine.stats().warm_entries, 1);
}

/// Warm → cold follows frequency-weighted aging: a key read often survives more passes of
/// the demotion hand than a key read once (a one-bit second chance would treat them alike).
#[tokio::test]
async fn often_read_keys_outlive_once_read_keys_in_the_warm_tier() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(small_options(dir.path())).await.unwrap();
    fill(&engine, 16, 400).await;
    let key = |i: usize| crate::support::key(format!("key:{i:04}"));
    for _ in 0..6 {
        for i in 0..4 {
            engine.get(&key(i)).await.unwrap();
        }
    }
    for i in 4..8 {
        engine.get(&key(i)).await.unwrap();
    }
    // Rounds of new writes, each pushing warm over budget, until the hand has demoted most
    // of the once-read keys.
    for round in 0..40 {
        if cold_count(&engine, 4..8).await >= 3 {
            break;
        }
        for j in 0..20 {
            engine
                .put(
                    &crate::support::key(format!("new:{round}:{j:02}")),
                    Bytes::from(vec![1u8; 400]),
                    PutOptions::default(),
                )
                .await
                .acked(&engine)
                .await
                .unwrap();
        }
        engine.run_background_once().await.unwrap();
    }
    for i in 0..4 {
        assert_ne!(
            engine.tier_of(&key(i)).await.unwrap(),
            Some(Tier::Cold),
            "key {i}, read 6 times, was demoted"
        );
    }
    let demoted_once_read = cold_count(&engine, 4..8).await;
    assert!(
        demoted_once_read >= 3,
        "only {demoted_once_read} of 4 once-read keys demoted"
    );
}

async fn cold_count(engine: &Engine, range: std::ops::Range<usize>) -> usize {
    let mut n = 0;
    for i in range {
        if engine
            .tier_of(&key(format!("key:{i:04}").as_bytes()))
            .await
            .unwrap()
            == Some(Tier::Cold)
        {
            n += 1;
        }
    }
    n
}

#[tokio::test]
async fn large_warm_values_read_back_intact_through_a_split_batch_and_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = small_options(dir.path());
    opts.s.warm.warm_bytes_max = 1 << 30;
    let value = |i: usize| {
        Bytes::from(
            (0..300 << 10)
                .map(|j| (i * 7 + j) as u8)
                .collect::<Vec<u8>>(),
        )
    };
    let keys: Vec<Vec<u8>> = (0..12)
        .map(|i| format!("big:{i:02}").into_bytes())
        .collect();
    {
        let engine = open(opts.clone()).await.unwrap();
        for (i, k) in keys.iter().enumerate() {
            engine
                .put(&key(k), value(i), PutOptions::default())
                .await
                .acked(&engine)
                .await
                .unwrap();
        }
        engine
            .put(&key(b"small"), "s".into(), PutOptions::default())
            .await
            .acked(&engine)
            .await
            .unwrap();
        // Values of 300 KiB are too large for this DRAM budget: every read is warm. The first
        // batch teaches the engine that warm values are large, so the next ones are split
        // over two threads.
        let mut ask: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
        ask.insert(5, b"absent");
        ask.insert(9, b"small");
        let ask_keys: Vec<Key> = ask.iter().map(key).collect();
        let ask_refs: Vec<&Key> = ask_keys.iter().collect();
        for _ in 0..3 {
            let got = engine.get_many_tiered(&ask_refs).await.unwrap();
            assert_eq!(got.len(), ask.len());
            for (k, g) in ask.iter().zip(&got) {
                match *k {
                    b"absent" => assert!(g.is_none()),
                    b"small" => assert_eq!(g.as_ref().unwrap().0, Bytes::from("s")),
                    _ => {
                        let i: usize = std::str::from_utf8(&k[4..]).unwrap().parse().unwrap();
                        let (v, tier) = g.as_ref().unwrap();
                        assert_eq!(*tier, Tier::Warm);
                        assert!(*v == value(i), "value of {}", String::from_utf8_lossy(k));
                    }
                }
            }
        }
        assert_eq!(
            engine.stats().warm_batches_split,
            2,
            "the last two batches split"
        );
        // A value handed out shares RocksDB's buffer; it stays valid after close.
        let kept = engine.get(&key(&keys[3])).await.unwrap().unwrap();
        engine.close().await.unwrap();
        drop(engine);
        assert!(kept == value(3));
    }
    let engine = open(opts).await.unwrap();
    for (i, k) in keys.iter().enumerate() {
        assert!(engine.get(&key(k)).await.unwrap().unwrap() == value(i));
    }
}

#[tokio::test]
async fn a_prefix_read_fetches_nothing_from_the_object_store_after_its_first_miss() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(small_options(dir.path())).await.unwrap();
    fill_and_demote(&engine, 200, 300).await;
    engine.clear_hot();
    let mut cold = Vec::new();
    // Keys far apart, so that they sit in different blocks (one GET each).
    for i in (0..200).step_by(40) {
        let k = format!("key:{i:04}");
        if engine.tier_of(&key(k.as_bytes())).await.unwrap() == Some(Tier::Cold) {
            cold.push(k);
        }
        if cold.len() == 3 {
            break;
        }
    }
    assert_eq!(cold.len(), 3, "not enough cold keys");
    let warm_or_cold = cold[0].as_bytes();
    let keys: Vec<Key> = [
        warm_or_cold,
        b"absent",
        cold[1].as_bytes(),
        cold[2].as_bytes(),
    ]
    .iter()
    .map(key)
    .collect();
    let keys: Vec<&Key> = keys.iter().collect();
    let gets = engine.stats().object_store_gets;
    let got = engine.get_prefix(&keys, u64::MAX).await.unwrap();
    assert_eq!(got.len(), 1, "stops at the first miss");
    assert_eq!(got[0], Bytes::from(vec![got[0][0]; 300]));
    let after_prefix = engine.stats().object_store_gets;
    assert!(
        after_prefix - gets <= 1,
        "{} object-store GETs for one leading cold key",
        after_prefix - gets
    );
    // The plain multi-get reads every key, so the keys after the miss cost GETs there.
    engine.clear_hot();
    let all = engine.get_many(&keys).await.unwrap();
    assert!(all[1].is_none() && all[2].is_some() && all[3].is_some());
    assert!(engine.stats().object_store_gets > after_prefix);
}

/// Cold keys of `fill`ed 300-byte values, far apart so that each sits in a block of its own.
async fn cold_keys(engine: &Engine, n: usize) -> Vec<String> {
    let mut cold = Vec::new();
    for i in (0..200).step_by(20) {
        let k = format!("key:{i:04}");
        if engine.tier_of(&key(k.as_bytes())).await.unwrap() == Some(Tier::Cold) {
            cold.push(k);
        }
        if cold.len() == n {
            return cold;
        }
    }
    panic!("only {} cold keys", cold.len());
}

#[tokio::test]
async fn one_read_carries_at_most_its_byte_limit_and_asks_the_object_store_for_no_more() {
    let dir = tempfile::tempdir().unwrap();
    // The values stay in the object store when read, so each read below asks it again.
    let mut o = small_options(dir.path());
    o.s.warm.cold_reads_return_to_warm = false;
    let engine = open(o).await.unwrap();
    fill_and_demote(&engine, 200, 300).await;
    engine.clear_hot();
    let cold = cold_keys(&engine, 6).await;
    let keys: Vec<Key> = cold.iter().map(key).collect();
    let keys: Vec<&Key> = keys.iter().collect();

    // A prefix read stops before the value that would pass the limit: 3 × 300 ≤ 1000.
    let gets = engine.stats().object_store_gets;
    let got = engine.get_prefix(&keys, 1000).await.unwrap();
    assert_eq!(got.len(), 3);
    assert_eq!(
        engine.stats().object_store_gets - gets,
        3,
        "values after the cut are not fetched"
    );
    // Asking again from where it stopped reads the rest; one value always comes back,
    // even one larger than the limit.
    assert_eq!(engine.get_prefix(&keys[3..], 1000).await.unwrap().len(), 3);
    assert_eq!(engine.get_prefix(&keys, 10).await.unwrap().len(), 1);
    assert_eq!(engine.get_prefix(&keys, u64::MAX).await.unwrap().len(), 6);

    // A multi-get over the limit is refused before the object store is asked.
    engine.clear_hot();
    let gets = engine.stats().object_store_gets;
    let err = engine.get_many_limited(&keys, 1000).await.unwrap_err();
    assert!(
        matches!(err, Error::Invalid(ref m) if m.contains("1000 bytes")),
        "{err}"
    );
    assert_eq!(engine.stats().object_store_gets, gets);
    assert_eq!(
        engine.get_many_limited(&keys[..1], 10).await.unwrap().len(),
        1
    );

    // Within the limit, all six.
    engine.clear_hot();
    let gets = engine.stats().object_store_gets;
    let got = engine.get_many_limited(&keys, 1800).await.unwrap();
    assert!(got
        .iter()
        .all(|v| v.as_ref().is_some_and(|v| v.len() == 300)));
    assert_eq!(engine.stats().object_store_gets - gets, 6);
}

#[tokio::test]
async fn a_value_read_from_the_object_store_returns_to_the_warm_tier_unless_turned_off() {
    for back in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let mut o = small_options(dir.path());
        o.s.warm.cold_reads_return_to_warm = back;
        let engine = open(o).await.unwrap();
        fill_and_demote(&engine, 200, 300).await;
        engine.clear_hot();
        let cold = cold_keys(&engine, 3).await;
        let before = engine.stats();
        // One read through `get`, two through a multi-key read.
        assert_eq!(
            engine
                .get(&key(cold[0].as_bytes()))
                .await
                .unwrap()
                .unwrap()
                .len(),
            300
        );
        let many: Vec<Key> = cold[1..].iter().map(key).collect();
        let many: Vec<&Key> = many.iter().collect();
        assert!(engine
            .get_many(&many)
            .await
            .unwrap()
            .iter()
            .all(Option::is_some));
        // Returns happen after the reads, off their path.
        engine.settle().await;
        engine.clear_hot();
        let after = engine.stats();
        for k in &cold {
            let tier = engine.tier_of(&key(k.as_bytes())).await.unwrap();
            let want = if back { Tier::Warm } else { Tier::Cold };
            assert_eq!(tier, Some(want), "{k}, return to warm {back}");
        }
        let returned = if back { 3 } else { 0 };
        assert_eq!(after.returns_to_warm - before.returns_to_warm, returned);
        assert_eq!(before.cold_entries - after.cold_entries, returned);
        assert_eq!(after.warm_entries - before.warm_entries, returned);
        // Read again: no object-store request when the values came back.
        let gets = engine.stats().object_store_gets;
        for k in &cold {
            assert_eq!(
                engine.get(&key(k.as_bytes())).await.unwrap().unwrap().len(),
                300
            );
        }
        let asked = engine.stats().object_store_gets - gets;
        assert_eq!(
            asked == 0,
            back,
            "{asked} object-store GETs, return to warm {back}"
        );
        // The index entries they left are garbage for segment collection (a background
        // round), and the values survive it and a restart.
        engine.run_background_once().await.unwrap();
        engine.close().await.unwrap();
        drop(engine);
        let engine = open(small_options(dir.path())).await.unwrap();
        for k in &cold {
            assert_eq!(
                engine.get(&key(k.as_bytes())).await.unwrap().unwrap().len(),
                300
            );
        }
        engine.close().await.unwrap();
    }
}

#[tokio::test]
async fn a_cold_value_stays_cold_once_warm_is_halfway_to_its_hard_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = small_options(dir.path());
    // warm_bytes_max is 8 KiB: returns stop at 8 + (64 - 8) / 2 = 36 KiB.
    o.s.warm.warm_bytes_hard_max = 64 << 10;
    let engine = open(o).await.unwrap();
    fill_and_demote(&engine, 40, 300).await;
    let mut i = 0;
    while engine.stats().warm_bytes < 40 << 10 {
        let k = format!("fill:{i:05}");
        let v = Bytes::from(vec![7u8; 300]);
        engine
            .put(&key(k.as_bytes()), v, PutOptions::default())
            .await
            .acked(&engine)
            .await
            .unwrap();
        i += 1;
    }
    engine.clear_hot();
    let mut read = 0;
    for i in 0..40 {
        let k = format!("key:{i:04}");
        if engine.tier_of(&key(k.as_bytes())).await.unwrap() == Some(Tier::Cold) {
            assert_eq!(
                engine.get(&key(k.as_bytes())).await.unwrap().unwrap().len(),
                300
            );
            assert_eq!(
                engine.tier_of(&key(k.as_bytes())).await.unwrap(),
                Some(Tier::Hot)
            );
            read += 1;
        }
    }
    assert!(read > 0, "nothing was demoted");
    assert_eq!(engine.stats().returns_to_warm, 0);
    // The headroom left is the clients': their writes still go in.
    let v = Bytes::from(vec![1u8; 300]);
    engine
        .put(&key(b"client"), v, PutOptions::default())
        .await
        .acked(&engine)
        .await
        .unwrap();
}

#[tokio::test]
async fn put_many_writes_like_separate_puts_with_the_last_value_of_a_repeated_key() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = small_options(dir.path());
    o.s.vlog.vlog_value_bytes_min = 1024;
    let engine = open(o).await.unwrap();
    // Cold keys, a key with a TTL, and a key whose value sits in the value log.
    fill_and_demote(&engine, 200, 300).await;
    let cold = cold_keys(&engine, 3).await;
    assert_eq!(cold.len(), 3, "the fill demoted keys");
    let far = engine.now_ms() + 3_600_000;
    engine
        .put(
            &key(b"ttl"),
            "t".into(),
            put_opts(Condition::Always, Expire::AtMs(far)),
        )
        .await
        .acked(&engine)
        .await
        .unwrap();
    let big = Bytes::from(vec![5u8; 4000]);
    engine
        .put(&key(b"logged"), big.clone(), PutOptions::default())
        .await
        .acked(&engine)
        .await
        .unwrap();
    let big2 = Bytes::from(vec![6u8; 5000]);
    let mut named: Vec<(Key, Bytes)> = cold
        .iter()
        .map(|k| (key(k), Bytes::from_static(b"was cold")))
        .collect();
    named.push((key(b"ttl"), "no ttl now".into()));
    named.push((key(b"logged"), big2.clone()));
    named.push((key(b"new"), "first".into()));
    named.push((key(b"new"), "last".into()));
    let pairs: Vec<(&Key, Bytes)> = named.iter().map(|(k, v)| (k, v.clone())).collect();
    let before = engine.stats();
    engine
        .put_many(&pairs, 0)
        .await
        .acked(&engine)
        .await
        .unwrap();
    let st = engine.stats();
    assert_eq!(
        st.cold_entries,
        before.cold_entries - 3,
        "cold index entries dropped"
    );
    assert_eq!(
        st.warm_entries,
        before.warm_entries + 4,
        "3 from cold, 1 new"
    );
    assert_eq!(st.writes, before.writes + 6, "one per distinct key");
    for k in &cold {
        assert_eq!(
            engine.get(&key(k.as_bytes())).await.unwrap().unwrap(),
            "was cold"
        );
        assert_eq!(
            engine.tier_of(&key(k.as_bytes())).await.unwrap(),
            Some(Tier::Hot)
        );
    }
    assert_eq!(engine.expire_time_ms(&key(b"ttl")).await.unwrap(), Some(0));
    assert_eq!(engine.get(&key(b"new")).await.unwrap().unwrap(), "last");
    // The same after a restart, read from RocksDB and the value log.
    engine.close().await.unwrap();
    drop(engine);
    let engine = open(small_options(dir.path())).await.unwrap();
    let st2 = engine.stats();
    assert_eq!(
        (st2.warm_entries, st2.cold_entries, st2.warm_bytes),
        (st.warm_entries, st.cold_entries, st.warm_bytes)
    );
    assert_eq!(engine.get(&key(b"logged")).await.unwrap().unwrap(), big2);
    assert_eq!(engine.get(&key(b"new")).await.unwrap().unwrap(), "last");
    assert_eq!(
        engine.get(&key(b"ttl")).await.unwrap().unwrap(),
        "no ttl now"
    );
    assert_eq!(engine.expire_time_ms(&key(b"ttl")).await.unwrap(), Some(0));
    // With an expiry, every key gets it (KVC.PUT ... TTL).
    let (e1, e2) = (key(b"e1"), key(b"e2"));
    let pairs: Vec<(&Key, Bytes)> = vec![(&e1, "1".into()), (&e2, "2".into())];
    engine
        .put_many(&pairs, far)
        .await
        .acked(&engine)
        .await
        .unwrap();
    assert_eq!(engine.expire_time_ms(&key(b"e2")).await.unwrap(), Some(far));
}

#[tokio::test]
async fn put_many_is_refused_as_a_whole_at_the_warm_hard_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = small_options(dir.path());
    o.s.warm.warm_bytes_hard_max = 16 << 10;
    let engine = open(o).await.unwrap();
    // 10 KiB in, 6 KiB of headroom: 8 KiB more must go in whole or not at all.
    fill(&engine, 10, 1000).await;
    let keys: Vec<String> = (0..8).map(|i| format!("batch:{i}")).collect();
    let stored: Vec<Key> = keys.iter().map(key).collect();
    let pairs: Vec<(&Key, Bytes)> = stored
        .iter()
        .map(|k| (k, Bytes::from(vec![1u8; 1000])))
        .collect();
    let err = engine
        .put_many(&pairs, 0)
        .await
        .acked(&engine)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::WarmFull(_)), "{err:?}");
    for k in &keys {
        assert_eq!(
            engine.get(&key(k.as_bytes())).await.unwrap(),
            None,
            "{k} went in alone"
        );
    }
    // A batch that fits goes in.
    engine
        .put_many(&pairs[..4], 0)
        .await
        .acked(&engine)
        .await
        .unwrap();
    assert!(engine.get(&key(b"batch:3")).await.unwrap().is_some());
}

#[tokio::test]
async fn writes_are_applied_at_once_and_hand_back_the_ticket_to_wait_for() {
    use strata_engine::{Durability, Ticket};
    for (durability, tickets) in [
        (Durability::Group, true),
        (Durability::Sync, false),
        (Durability::None, false),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut o = small_options(dir.path());
        o.s.warm.durability = durability;
        let engine = open(o).await.unwrap();
        let mut pending = Ticket::NONE;
        let mut last = Ticket::NONE;
        for i in 0..10 {
            let k = format!("d:{i}");
            let w = engine
                .put(&key(k), "v".into(), PutOptions::default())
                .await
                .unwrap();
            assert!(w.ticket > last || !tickets, "tickets grow");
            last = w.ticket;
            w.defer(&mut pending);
        }
        let m = key(b"m");
        engine
            .put_many(&[(&m, "w".into())], 0)
            .await
            .unwrap()
            .defer(&mut pending);
        // Eleven writes, each with its group commit's ticket (none under sync and none):
        // applied at once, and acknowledged once the newest ticket is waited for.
        assert_eq!(pending.is_none(), !tickets, "{durability:?}");
        assert_eq!(engine.get(&key(b"d:9")).await.unwrap().unwrap(), "v");
        assert_eq!(engine.get(&m).await.unwrap().unwrap(), "w");
        engine.wait(pending).await.unwrap();
        engine
            .put(&key(b"after"), "x".into(), PutOptions::default())
            .await
            .acked(&engine)
            .await
            .unwrap();
        engine.close().await.unwrap();
    }
}

/// Group commit syncs when someone waits, not at each write: the writes of many clients made
/// before the first of them waits are one sync. A round whose writes all went to the hot
/// log (write-back) does not sync the warm store's log; one with a warm write does.
#[tokio::test]
async fn one_group_commit_covers_the_writes_made_before_anyone_waits() {
    use strata_engine::Ticket;
    let dir = tempfile::tempdir().unwrap();
    let mut o = small_options(dir.path());
    // Room for write-back to hold every write (past three quarters of its budget it would
    // write some to the warm store).
    o.s.warm.warm_bytes_max = 1 << 20;
    let engine = open(o.clone()).await.unwrap();
    engine
        .put(&key("first"), "v".into(), PutOptions::default())
        .await
        .acked(&engine)
        .await
        .unwrap();
    let (groups, warm) = (
        engine.stats_now().group_commits,
        engine.stats_now().group_commits_warm,
    );
    assert!(groups >= 1);
    let mut pending = Ticket::NONE;
    for i in 0..20 {
        let k = key(format!("k:{i}"));
        let w = engine.put(&k, "v".into(), PutOptions::default()).await;
        w.unwrap().defer(&mut pending);
    }
    // (Writes no one waits for are synced a second after, which this does not reach.)
    assert_eq!(
        engine.stats_now().group_commits,
        groups,
        "synced with no one waiting"
    );
    engine.wait(pending).await.unwrap();
    assert_eq!(
        engine.stats_now().group_commits,
        groups + 1,
        "one sync for 20 writes"
    );
    assert_eq!(
        engine.stats_now().writes_back,
        21,
        "the puts were written back"
    );
    assert_eq!(
        engine.stats_now().group_commits_warm,
        warm,
        "the warm log held nothing new"
    );
    let deleted = engine
        .delete(&key("k:0"))
        .await
        .acked(&engine)
        .await
        .unwrap();
    assert!(deleted);
    assert_eq!(engine.stats_now().group_commits, groups + 2);
    assert_eq!(
        engine.stats_now().group_commits_warm,
        warm + 1,
        "a delete goes to the warm store"
    );
    engine.close().await.unwrap();
    drop(engine);
    // The values are there after a restart (`close` wrote them to the warm store; the
    // crash tests kill the process instead).
    let engine = open(o).await.unwrap();
    assert_eq!(engine.get(&key("k:0")).await.unwrap(), None);
    for i in 1..20 {
        assert!(engine.get(&key(format!("k:{i}"))).await.unwrap().is_some());
    }
    engine.close().await.unwrap();
}

#[tokio::test]
async fn incr_many_runs_in_order_over_every_tier() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(small_options(dir.path())).await.unwrap();
    let put = |k: Key, v: &'static str| {
        let e = engine.clone();
        async move {
            e.put(&k, Bytes::from_static(v.as_bytes()), PutOptions::default())
                .await
                .acked(&e)
                .await
                .unwrap()
        }
    };
    // "a:0" sorts first: the clock hand demotes it before the filler.
    put(key("a:0"), "0").await;
    fill(&engine, 20, 1000).await;
    engine.run_background_once().await.unwrap();
    engine.clear_hot();
    let cold = key("a:0");
    assert_eq!(engine.tier_of(&cold).await.unwrap(), Some(Tier::Cold));
    let (warm, word, fresh) = (key("z:warm"), key("z:word"), key("z:fresh"));
    put(warm.clone(), "39000").await;
    put(word.clone(), "abc").await;
    // With no cold key the batch is one write; with one, the items run one by one. Both
    // give each item the result it would get alone.
    for (round, with_cold) in [(0, false), (1, true)] {
        let mut items: Vec<(&Key, i64)> = vec![(&warm, 1), (&fresh, 5), (&warm, 2), (&word, 1)];
        if with_cold {
            items.push((&cold, 7));
        }
        let got = engine.incr_many(&items).await.acked(&engine).await.unwrap();
        let base = 39_000 + round * 3;
        assert_eq!(got[0], Ok(base + 1));
        assert_eq!(got[1], Ok(5 * (round + 1)));
        assert_eq!(got[2], Ok(base + 3));
        assert_eq!(got[3], Err(Error::NotInteger));
        if with_cold {
            assert_eq!(got[4], Ok(7));
        }
    }
    assert_eq!(engine.get(&warm).await.unwrap().unwrap(), "39006");
    // A run whose first items are rewritten in place (DRAM holds them, their digits keep
    // their count) and whose later ones are not (one grows a digit, one is cold) goes on
    // the other way from there, in order.
    let nine = key("z:nine");
    put(nine.clone(), "9").await;
    let items: Vec<(&Key, i64)> = vec![(&warm, 1), (&warm, 1), (&nine, 1), (&warm, 1), (&nine, -2)];
    let got = engine.incr_many(&items).await.acked(&engine).await.unwrap();
    assert_eq!(got, vec![Ok(39_007), Ok(39_008), Ok(10), Ok(39_009), Ok(8)]);
    let items: Vec<(&Key, i64)> = vec![(&nine, 1), (&cold, 1), (&warm, -9)];
    let got = engine.incr_many(&items).await.acked(&engine).await.unwrap();
    assert_eq!(got, vec![Ok(9), Ok(8), Ok(39_000)]);
    assert_eq!(engine.get(&nine).await.unwrap().unwrap(), "9");
    assert_eq!(engine.get(&cold).await.unwrap().unwrap(), "8");
    assert_eq!(engine.get(&warm).await.unwrap().unwrap(), "39000");
    assert_eq!(engine.get(&fresh).await.unwrap().unwrap(), "10");
    assert_eq!(engine.get(&word).await.unwrap().unwrap(), "abc");
    // Nothing changed leaves nothing to wait for.
    let w = engine.incr_many(&[(&word, 1)]).await.unwrap();
    assert!(w.ticket.is_none());
}

/// A cold value's return moves its key from the cold index to a record in one commit; a
/// read that looked for the record before that commit and for the index entry after it must
/// still find the value (the lookup sees the stripe version move and looks again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_racing_cold_values_returning_to_the_warm_tier_always_find_them() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(open(small_options(dir.path())).await.unwrap());
    fill_and_demote(&engine, 200, 300).await;
    let keys: Vec<Key> = (0..200).map(|i| key(format!("key:{i:04}"))).collect();
    let mut returned = 0;
    for round in 0..40 {
        // Demote again what the last round brought back.
        engine.run_background_once().await.unwrap();
        engine.clear_hot();
        let readers: Vec<_> = (0..2)
            .map(|r| {
                let (engine, keys) = (Arc::clone(&engine), keys.clone());
                tokio::spawn(async move {
                    for pass in 0..6 {
                        let what = format!("round {round}");
                        read_every_key(&engine, &keys, r, pass, &what).await;
                        engine.clear_hot();
                    }
                })
            })
            .collect();
        for r in readers {
            r.await.unwrap();
        }
        engine.settle().await;
        returned = engine.stats().returns_to_warm;
    }
    assert!(returned > 0, "no cold value returned to the warm tier");
}

/// One pass of a reader racing the tiers' moves: every key in one multi-key read, and one
/// key (by `reader` and `pass`) alone; each must find its value.
async fn read_every_key(engine: &Engine, keys: &[Key], reader: usize, pass: usize, what: &str) {
    let refs: Vec<&Key> = keys.iter().collect();
    let got = engine.get_many(&refs).await.unwrap();
    for (k, v) in keys.iter().zip(&got) {
        assert!(v.is_some(), "{what} reader {reader} pass {pass}: {k:?}");
    }
    let k = &keys[(pass * 37 + reader * 11) % keys.len()];
    assert!(engine.get(k).await.unwrap().is_some(), "{k:?}");
}

/// A store that never demoted answers a look-up of an absent key from its records alone
/// (no read of the cold index). Reads racing the first demotion, which moves records into
/// the cold index, must still find every value, and so must reads after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_racing_the_first_demotion_always_find_their_values() {
    let dir = tempfile::tempdir().unwrap();
    let o = small_options(dir.path());
    let engine = Arc::new(open(o.clone()).await.unwrap());
    fill(&engine, 200, 300).await;
    engine.settle().await;
    assert_eq!(engine.get(&key("absent")).await.unwrap(), None);
    let keys: Vec<Key> = (0..200).map(|i| key(format!("key:{i:04}"))).collect();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (engine, keys, stop) = (Arc::clone(&engine), keys.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut passes = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || passes < 2 {
                    engine.clear_hot();
                    read_every_key(&engine, &keys, r, passes, "").await;
                    passes += 1;
                }
            })
        })
        .collect();
    engine.run_background_once().await.unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        r.await.unwrap();
    }
    assert!(engine.stats().demotions > 0, "nothing was demoted");
    // The readers' reads return cold values to the warm tier: on a slow machine all of them
    // may be back. Demoted again with no reader, they stay cold for the restart.
    engine.settle().await;
    engine.run_background_once().await.unwrap();
    let cold = engine.stats().cold_entries;
    assert!(cold > 0, "nothing is cold before the restart");
    Arc::try_unwrap(engine).ok().unwrap().close().await.unwrap();
    let engine = open(o).await.unwrap();
    // (Reads return cold values to the warm tier after their replies: a few may have.)
    assert!(
        engine.stats().cold_entries > 0,
        "{cold} cold before the restart"
    );
    for (i, k) in keys.iter().enumerate() {
        let v = engine.get(k).await.unwrap();
        assert_eq!(v.as_deref(), Some(&vec![(i % 251) as u8; 300][..]), "{k:?}");
    }
    assert_eq!(engine.get(&key("absent")).await.unwrap(), None);
    engine.close().await.unwrap();
}

/// Reads `key:0000..key:{n-1}` (as [`fill`] wrote them) one by one and all at once.
async fn read_filled(engine: &Engine, n: usize, value_bytes: usize, what: &str) {
    let keys: Vec<Key> = (0..n).map(|i| key(format!("key:{i:04}"))).collect();
    let refs: Vec<&Key> = keys.iter().collect();
    let many = engine.get_many(&refs).await.unwrap();
    for (i, k) in keys.iter().enumerate() {
        let want = vec![(i % 251) as u8; value_bytes];
        assert_eq!(many[i].as_deref(), Some(&want[..]), "{what}: get_many {i}");
        engine.clear_hot();
        let one = engine.get(k).await.unwrap();
        assert_eq!(one.as_deref(), Some(&want[..]), "{what}: get {i}");
    }
}

/// Reads `absent` (keys no one wrote) every way a look-up goes, and checks the key filter
/// answered nearly all of them without a read of RocksDB.
async fn assert_misses_answered_by_the_filter(engine: &Engine, absent: &[&Key]) {
    let before = engine.stats().key_filter_answers;
    engine.clear_hot();
    let got = engine.get_many(absent).await.unwrap();
    assert!(got.iter().all(Option::is_none));
    assert_eq!(engine.get(absent[0]).await.unwrap(), None);
    assert!(engine.tier_of(absent[1]).await.unwrap().is_none());
    let answered = engine.stats().key_filter_answers - before;
    // A few may pass as false "maybe"s (and are read from RocksDB).
    let asked = absent.len() as u64 + 2;
    assert!(
        answered >= asked * 95 / 100,
        "{answered} of {asked} answered"
    );
}

#[tokio::test]
async fn absent_keys_are_answered_by_the_key_filter_and_every_stored_key_passes_it() {
    let dir = tempfile::tempdir().unwrap();
    let o = small_options(dir.path());
    let engine = open(o.clone()).await.unwrap();
    // A store of few keys builds its filter as it opens.
    assert_eq!(engine.stats().key_filter_builds, 1);
    assert!(engine.stats().key_filter_bytes >= 1 << 20);
    fill(&engine, 150, 300).await;
    let absent: Vec<Key> = (0..500).map(|i| key(format!("absent:{i}"))).collect();
    let absent: Vec<&Key> = absent.iter().collect();
    engine.run_background_once().await.unwrap();
    let st = engine.stats();
    assert!(st.cold_entries > 50, "nothing demoted: {st:?}");
    // Keys written after the build pass it too, in every tier.
    fill_range(&engine, 150..200, 300).await;
    engine.run_background_once().await.unwrap();
    assert_eq!(
        engine.stats().key_filter_builds,
        1,
        "built again while far from full"
    );
    engine.clear_hot();
    read_filled(&engine, 200, 300, "after the build").await;
    assert_misses_answered_by_the_filter(&engine, &absent).await;
    // A deleted key leaves its bits: still absent, through a read of RocksDB.
    engine
        .delete(&key("key:0000"))
        .await
        .acked(&engine)
        .await
        .unwrap();
    engine.clear_hot();
    assert_eq!(engine.get(&key("key:0000")).await.unwrap(), None);
    engine.close().await.unwrap();
    drop(engine);

    // After a restart the filter is built again from what the tiers hold.
    let engine = open(o).await.unwrap();
    assert_eq!(engine.stats().key_filter_builds, 1);
    assert_misses_answered_by_the_filter(&engine, &absent).await;
    assert_eq!(engine.get(&key("key:0000")).await.unwrap(), None);
    let keys: Vec<Key> = (1..200).map(|i| key(format!("key:{i:04}"))).collect();
    for (i, k) in keys.iter().enumerate() {
        let want = vec![((i + 1) % 251) as u8; 300];
        assert_eq!(
            engine.get(k).await.unwrap().as_deref(),
            Some(&want[..]),
            "{i}"
        );
    }
    engine.close().await.unwrap();
}
