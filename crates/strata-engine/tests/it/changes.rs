//! The change log: every committed write has a sequence number, and the changes after any
//! sequence read back as changes to keys, values in the value log included.

use bytes::Bytes;
use strata_engine::{ChangeEvent, Engine, KeyChange, Kind, PutOptions};

use crate::support::{key, open, small_options, Acked};

/// Every key change after `after`, in order, read a few batches at a time.
fn all_after(e: &Engine, mut after: u64) -> Vec<ChangeEvent> {
    let mut out = Vec::new();
    loop {
        let got = e.changes_after(after, 3).unwrap();
        let Some(last) = got.last() else {
            return out;
        };
        after = last.sequence;
        out.extend(got);
    }
}

#[tokio::test]
async fn every_write_reads_back_from_its_sequence_with_logged_values() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = small_options(dir.path());
    o.s.vlog.vlog_value_bytes_min = 1024;
    // The change log is in the order the warm store saw writes: with write-back on, plain
    // writes reach it when they settle (each key's changes in order, keys interleaved as
    // they settle). This test checks the exact order of every kind of write, so it is off.
    o.s.hot.hot_dirty_fraction = 0.0;
    let e = open(o).await.unwrap();
    let start = e.last_sequence();
    let big = Bytes::from(vec![7u8; 5000]);
    e.put(&key(b"a"), "1".into(), PutOptions::default())
        .await
        .acked(&e)
        .await
        .unwrap();
    e.put(&key(b"big"), big.clone(), PutOptions::default())
        .await
        .acked(&e)
        .await
        .unwrap();
    let (b1, b2) = (key(b"b1"), key(b"b2"));
    e.put_many(&[(&b1, "x".into()), (&b2, "y".into())], 0)
        .await
        .acked(&e)
        .await
        .unwrap();
    e.set_expire(&key(b"a"), e.now_ms() + 60_000)
        .await
        .acked(&e)
        .await
        .unwrap();
    e.delete(&key(b"b1")).await.acked(&e).await.unwrap();
    let mid = e.last_sequence();
    assert!(mid > start);

    let got = all_after(&e, start);
    let seen: Vec<(String, KeyChange)> = got
        .iter()
        .flat_map(|ev| ev.keys.iter())
        .map(|(k, c)| (String::from_utf8_lossy(k.client()).into_owned(), c.clone()))
        .collect();
    let set = |v: &str, at: u64| KeyChange::Set {
        kind: Kind::String,
        value: Bytes::from(v.to_string()),
        expire_ms: at,
    };
    assert_eq!(seen[0], ("a".into(), set("1", 0)));
    assert_eq!(
        seen[1],
        (
            "big".into(),
            KeyChange::Set {
                kind: Kind::String,
                value: big.clone(),
                expire_ms: 0
            }
        ),
        "a value in the value log is read out"
    );
    assert_eq!(seen[2], ("b1".into(), set("x", 0)));
    assert_eq!(seen[3], ("b2".into(), set("y", 0)));
    assert!(
        matches!(&seen[4], (k, KeyChange::Set { expire_ms, .. }) if k == "a" && *expire_ms > 0)
    );
    assert_eq!(seen[5], ("b1".into(), KeyChange::Deleted));
    assert_eq!(seen.len(), 6);
    assert_eq!(got[2].keys.len(), 2, "one batch, two keys (MSET)");
    let seqs: Vec<u64> = got.iter().map(|g| g.sequence).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");

    // From any point: what follows it, and nothing after the last.
    let rest = all_after(&e, got[3].sequence);
    assert_eq!(rest.len(), got.len() - 4);
    assert!(e.changes_after(e.last_sequence(), 10).unwrap().is_empty());

    // Demotion moves values to the object store: the log says where.
    for i in 0..60 {
        e.put(
            &key(format!("f:{i:03}")),
            Bytes::from(vec![1u8; 300]),
            PutOptions::default(),
        )
        .await
        .acked(&e)
        .await
        .unwrap();
    }
    let before = e.last_sequence();
    assert!(e.run_background_once().await.unwrap() > 0);
    let demoted = all_after(&e, before);
    assert!(
        demoted
            .iter()
            .flat_map(|ev| &ev.keys)
            .any(|(_, c)| matches!(c, KeyChange::Cold { .. })),
        "{demoted:?}"
    );
    // FLUSHALL is one event that clears everything.
    let before = e.last_sequence();
    e.flush_all().await.acked(&e).await.unwrap();
    let flushed = all_after(&e, before);
    assert!(flushed.iter().any(|ev| ev.cleared), "{flushed:?}");
    e.close().await.unwrap();
}
