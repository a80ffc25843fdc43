//! The cold tier on a real S3-compatible server (moto) on loopback.

use strata_engine::{ErrorKind, Key, PutOptions, Tier};

use crate::support::{delete_numbered, fill_and_demote, key, open, small_options, Acked, S3Server};

/// Small-budget options whose cold tier is `url` on the moto server `s3`.
fn s3_options(dir: &std::path::Path, s3: &S3Server, url: &str) -> crate::support::Opts {
    let mut o = small_options(dir);
    let c = &mut o.s.cold;
    c.cold_url = url.into();
    c.s3_endpoint = s3.endpoint();
    c.s3_region = "us-east-1".into();
    c.s3_access_key_id = "test".into();
    c.s3_secret_access_key = "test".into();
    c.s3_allow_http = true;
    o
}

/// `key:0000` .. `key:{n-1}`.
fn key_names(n: usize) -> Vec<Vec<u8>> {
    (0..n).map(|i| format!("key:{i:04}").into_bytes()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demotion_reads_restart_and_collection_work_against_s3() {
    let s3 = S3Server::start();
    s3.create_bucket("strata-test");
    let dir = tempfile::tempdir().unwrap();
    let mut o = s3_options(dir.path(), &s3, "s3://strata-test/node-a");
    o.s.cold.cold_reads_max = 2;
    let engine = open(o.clone()).await.unwrap();
    fill_and_demote(&engine, 150, 400).await;
    let st = engine.stats();
    assert!(st.cold_entries > 100, "{st:?}");
    assert!(
        s3.object_count("strata-test", "node-a/segments/") >= 1,
        "no segment object in the bucket"
    );
    engine.clear_hot();
    assert_eq!(
        engine.tier_of(&key(b"key:0003")).await.unwrap(),
        Some(Tier::Cold)
    );
    let keys = key_names(150);
    let refs_stored: Vec<Key> = keys.iter().map(key).collect();
    let refs: Vec<&Key> = refs_stored.iter().collect();
    let got = engine.get_many(&refs).await.unwrap();
    for (i, v) in got.iter().enumerate() {
        assert_eq!(v.as_deref(), Some(&vec![i as u8; 400][..]), "key {i}");
    }
    // The multi-get wanted one GET per block at once; two at a time went out.
    let c = engine.stats();
    assert!(
        c.object_store_read_waits > 0 && c.object_store_reads_in_flight_peak == 2,
        "{c:?}"
    );
    engine.close().await.unwrap();
    drop(engine);

    let engine = open(o.clone()).await.unwrap();
    assert_eq!(
        engine.get(&key(b"key:0007")).await.unwrap().unwrap(),
        vec![7u8; 400]
    );
    delete_numbered(&engine, 0..150).await;
    engine.run_background_once().await.unwrap();
    assert_eq!(
        s3.object_count("strata-test", "node-a/segments/"),
        0,
        "empty segments are deleted from the bucket"
    );
    engine.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_object_store_fails_cold_reads_fast_and_keeps_warm_serving() {
    let s3 = S3Server::start();
    s3.create_bucket("strata-outage");
    let dir = tempfile::tempdir().unwrap();
    let mut o = s3_options(dir.path(), &s3, "s3://strata-outage");
    o.s.cold.cold_request_timeout_ms = 1500;
    let engine = open(o).await.unwrap();
    fill_and_demote(&engine, 100, 400).await;
    engine.clear_hot();
    drop(s3);
    let start = std::time::Instant::now();
    let err = engine.get(&key(b"key:0000")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(
        start.elapsed() < std::time::Duration::from_secs(10),
        "cold read hung for {:?}",
        start.elapsed()
    );
    engine
        .put(
            &key(b"fresh"),
            "still writable".into(),
            PutOptions::default(),
        )
        .await
        .acked(&engine)
        .await
        .unwrap();
    assert_eq!(
        engine.get(&key(b"fresh")).await.unwrap().unwrap(),
        "still writable"
    );
    assert!(engine.stats().object_store_errors > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_get_against_a_silent_object_store_fails_in_about_one_timeout() {
    let s3 = S3Server::start();
    s3.create_bucket("strata-silent");
    let dir = tempfile::tempdir().unwrap();
    let mut o = s3_options(dir.path(), &s3, "s3://strata-silent");
    o.s.cold.cold_request_timeout_ms = 1000;
    o.s.cold.cold_reads_max = 2;
    let engine = open(o.clone()).await.unwrap();
    fill_and_demote(&engine, 100, 400).await;
    engine.close().await.unwrap();
    drop(engine);
    // The same store reopened against a server that accepts connections and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    o.s.cold.s3_endpoint = format!("http://{}", silent.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in silent.incoming() {
            held.push(c);
        }
    });
    let engine = open(o).await.unwrap();
    let keys = key_names(100);
    let refs_stored: Vec<Key> = keys.iter().map(key).collect();
    let refs: Vec<&Key> = refs_stored.iter().collect();
    assert!(engine.stats().cold_entries > 50);
    let start = std::time::Instant::now();
    let err = engine.get_many(&refs).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    // Dozens of blocks through two slots would be dozens of timeouts one after another.
    assert!(
        start.elapsed() < std::time::Duration::from_secs(5),
        "the multi-get took {:?}",
        start.elapsed()
    );
}
