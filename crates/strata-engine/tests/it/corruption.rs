//! Flipped bits are detected by checksums that cover the key, reported, and never returned.

use bytes::Bytes;
use strata_engine::{ErrorKind, PutOptions, Tier};

use crate::support::{key, open, small_options, Acked};

#[tokio::test]
async fn flipped_byte_in_a_segment_is_a_data_error_not_wrong_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(small_options(dir.path())).await.unwrap();
    for i in 0..100 {
        engine
            .put(
                &key(format!("key:{i:04}").as_bytes()),
                Bytes::from(vec![7u8; 300]),
                PutOptions::default(),
            )
            .await
            .acked(&engine)
            .await
            .unwrap();
    }
    engine.run_background_once().await.unwrap();
    engine.clear_hot();
    assert_eq!(
        engine.tier_of(&key(b"key:0000")).await.unwrap(),
        Some(Tier::Cold)
    );
    let seg_dir = dir.path().join("cold/segments");
    let mut segs: Vec<_> = std::fs::read_dir(&seg_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    segs.sort();
    let mut bytes = std::fs::read(&segs[0]).unwrap();
    bytes[10] ^= 0x01;
    std::fs::write(&segs[0], bytes).unwrap();
    let err = engine.get(&key(b"key:0000")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Data, "{err}");
    assert!(engine.stats().checksum_errors >= 1);
    // Keys in other blocks or tiers are still served.
    let mut served = 0;
    for i in 0..100 {
        if engine
            .get(&key(format!("key:{i:04}").as_bytes()))
            .await
            .is_ok()
        {
            served += 1;
        }
    }
    assert!(
        served > 50,
        "only {served} keys served after one flipped byte"
    );
}

/// Stores one value of `len` bytes, flips a bit of it in the file under `subdir` with
/// extension `ext` where it landed, and checks both read paths report a data error.
async fn flipped_byte_in_a_stored_value_is_a_data_error(len: u32, subdir: &str, ext: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut o = small_options(dir.path());
    o.s.warm.warm_bytes_max = 1 << 30;
    let engine = open(o.clone()).await.unwrap();
    let value: Vec<u8> = (0..len)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    engine
        .put(
            &key(b"victim"),
            Bytes::from(value.clone()),
            PutOptions::default(),
        )
        .await
        .acked(&engine)
        .await
        .unwrap();
    engine.close().await.unwrap();
    drop(engine);
    let mut hit = false;
    for e in std::fs::read_dir(dir.path().join(subdir)).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == ext) {
            let mut b = std::fs::read(&p).unwrap();
            if let Some(pos) = b.windows(32).position(|w| w == &value[1000..1032]) {
                b[pos + 5] ^= 0x10;
                std::fs::write(&p, b).unwrap();
                hit = true;
            }
        }
    }
    assert!(hit, "value not found in any .{ext} file under {subdir}");
    let engine = open(o).await.unwrap();
    let err = engine.get(&key(b"victim")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Data, "{err}");
    // The multi-key path (MGET, KVC.GET) checks the same.
    let victim = key(b"victim");
    let err = engine.get_many(&[&victim, &victim]).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Data, "{err}");
    assert!(engine.stats().checksum_errors >= 2);
}

#[tokio::test]
async fn flipped_byte_in_a_rocksdb_value_is_a_data_error() {
    // Below vlog_value_bytes_min: the value sits in a RocksDB blob file.
    flipped_byte_in_a_stored_value_is_a_data_error(16 * 1024, "warm", "blob").await;
}

#[tokio::test]
async fn flipped_byte_in_a_value_log_value_is_a_data_error() {
    flipped_byte_in_a_stored_value_is_a_data_error(64 * 1024, "vlog", "vlog").await;
}
