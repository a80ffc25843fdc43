//! A bucket the nodes of a cluster share: each writer epoch writes its segments under a
//! prefix of its own, and collection lists and deletes its own alone, so two stores that
//! share one `cold_url` neither overwrite nor collect each other's segments.

use std::path::Path;

use strata_engine::{Engine, Tier};

use crate::support::*;

/// A store in `dir` (small budgets: every few KiB demote) whose cold tier is the shared
/// directory `bucket`, writing under writer epoch `epoch`.
async fn open_sharing(dir: &Path, bucket: &Path, epoch: u64) -> strata_engine::Result<Engine> {
    let mut o = small_options(dir);
    o.s.cold.cold_url = format!("file://{}", bucket.display());
    o.s.writer_epoch = epoch;
    open(o).await
}

/// The segment objects under `prefix` of the shared bucket.
fn objects(bucket: &Path, prefix: &str) -> Vec<String> {
    let dir = bucket.join(prefix);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".seg"))
        .collect();
    names.sort();
    names
}

async fn all_read_back(engine: &Engine, n: usize, value_bytes: usize) {
    for i in 0..n {
        let got = engine.get(&key(format!("key:{i:04}"))).await.unwrap();
        assert_eq!(got.map(|v| v.len()), Some(value_bytes), "key:{i:04}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_share_a_bucket_and_collect_only_their_own_segments() {
    let root = tempfile::tempdir().unwrap();
    let bucket = root.path().join("bucket");
    std::fs::create_dir_all(&bucket).unwrap();
    let a = open_sharing(&root.path().join("a"), &bucket, 1)
        .await
        .unwrap();
    let b = open_sharing(&root.path().join("b"), &bucket, 2)
        .await
        .unwrap();
    // Both demote the same keys' names into the one bucket.
    fill_and_demote(&a, 200, 100).await;
    fill_and_demote(&b, 200, 100).await;
    let (a_segs, b_segs) = (
        objects(&bucket, "epochs/0000000001/segments"),
        objects(&bucket, "epochs/0000000002/segments"),
    );
    assert!(
        !a_segs.is_empty() && !b_segs.is_empty(),
        "{a_segs:?} {b_segs:?}"
    );
    assert!(
        objects(&bucket, "segments").is_empty(),
        "no writer of epoch 0 here"
    );
    assert!(
        a_segs.iter().all(|n| n.starts_with("0000010")),
        "{a_segs:?}"
    );
    assert!(
        b_segs.iter().all(|n| n.starts_with("0000020")),
        "{b_segs:?}"
    );
    for _ in 0..2 {
        a.run_background_once().await.unwrap();
        b.run_background_once().await.unwrap();
    }
    let still =
        |prefix: &str, names: &[String]| names.iter().all(|n| bucket.join(prefix).join(n).exists());
    assert!(
        still("epochs/0000000002/segments", &b_segs),
        "a's collection took b's segments"
    );
    assert!(
        still("epochs/0000000001/segments", &a_segs),
        "b's collection took a's segments"
    );
    // Both still read every key, most of them from their own segments.
    all_read_back(&a, 200, 100).await;
    all_read_back(&b, 200, 100).await;
    assert_eq!(a.tier_of(&key("key:0000")).await.unwrap(), Some(Tier::Cold));
    // b's keys deleted, its collection deletes its empty segments, and a's stay.
    delete_numbered(&b, 0..200).await;
    b.run_background_once().await.unwrap();
    assert!(objects(&bucket, "epochs/0000000002/segments").is_empty());
    assert!(still("epochs/0000000001/segments", &a_segs));
    all_read_back(&a, 200, 100).await;
    a.close().await.unwrap();
    b.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_epoch_writes_under_its_own_prefix_and_an_older_one_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let bucket = root.path().join("bucket");
    std::fs::create_dir_all(&bucket).unwrap();
    let dir = root.path().join("node");
    let e = open_sharing(&dir, &bucket, 3).await.unwrap();
    fill_and_demote(&e, 100, 100).await;
    e.close().await.unwrap();
    drop(e);
    // A restart takes a newer epoch: new segments go under it, the old ones still answer.
    let e = open_sharing(&dir, &bucket, 4).await.unwrap();
    fill_range(&e, 100..200, 100).await;
    e.run_background_once().await.unwrap();
    assert!(!objects(&bucket, "epochs/0000000003/segments").is_empty());
    assert!(!objects(&bucket, "epochs/0000000004/segments").is_empty());
    all_read_back(&e, 200, 100).await;
    e.close().await.unwrap();
    drop(e);
    // An older epoch than the store's own could reuse its ids: refused.
    let err = open_sharing(&dir, &bucket, 2).await.err().expect("refused");
    assert!(err.to_string().contains("writer epoch 4"), "{err}");
}
