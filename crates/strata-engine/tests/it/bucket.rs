//! The bucket log: with `durability = bucket` a write is acknowledged only once the log in
//! the shared bucket holds it, so a node that takes over the writer's slots (adopting its
//! log) serves every acknowledged write; a fence ends a writer's log, and the fenced writer
//! acknowledges nothing more.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use strata_engine::{Durability, Engine, Kind};

use crate::support::*;

fn bucket_store(bucket: &Path) -> Arc<dyn object_store::ObjectStore> {
    Arc::new(object_store::local::LocalFileSystem::new_with_prefix(bucket).unwrap())
}

/// Options of a store in `dir` sharing the directory `bucket`, under writer epoch `epoch`.
fn sharing(dir: &Path, bucket: &Path, epoch: u64, durability: Durability) -> Opts {
    let mut o = small_options(dir);
    o.s.cold.cold_url = format!("file://{}", bucket.display());
    o.s.writer_epoch = epoch;
    o.s.warm.durability = durability;
    o
}

/// What a new owner replays of `epoch`'s log, in order, up to its fence.
async fn log_of(bucket: &Path, epoch: u64) -> Vec<Bytes> {
    strata_engine::bucket_replay(bucket_store(bucket).as_ref(), &[epoch])
        .await
        .unwrap()
}

/// What the acknowledged writes below leave: key → (kind, value) or absent.
type Expect = Vec<(String, Option<(Kind, Vec<u8>)>)>;

/// Writes every kind of change a client makes, each acknowledged; what they leave.
async fn write_everything(e: &Engine) -> Expect {
    let mut want: Expect = Vec::new();
    for i in 0..50 {
        let v = format!("value-{i}").into_bytes();
        e.put(&key(format!("s:{i}")), v.clone().into(), Default::default())
            .await
            .unwrap()
            .durable(e)
            .await
            .unwrap();
        want.push((format!("s:{i}"), Some((Kind::String, v))));
    }
    // A large value (the value log's), an overwrite, a delete, a counter, a hash.
    let big = vec![7u8; 300 << 10];
    e.put(&key("big"), big.clone().into(), Default::default())
        .await
        .unwrap()
        .durable(e)
        .await
        .unwrap();
    want.push(("big".into(), Some((Kind::String, big))));
    e.put(
        &key("s:3"),
        Bytes::from_static(b"again"),
        Default::default(),
    )
    .await
    .unwrap()
    .durable(e)
    .await
    .unwrap();
    want.retain(|(k, _)| k != "s:3");
    want.push(("s:3".into(), Some((Kind::String, b"again".to_vec()))));
    e.delete(&key("s:4"))
        .await
        .unwrap()
        .durable(e)
        .await
        .unwrap();
    want.retain(|(k, _)| k != "s:4");
    want.push(("s:4".into(), None));
    for _ in 0..3 {
        e.incr_by(&key("n"), 2)
            .await
            .unwrap()
            .durable(e)
            .await
            .unwrap();
    }
    want.push(("n".into(), Some((Kind::String, b"6".to_vec()))));
    let hash = strata_format::hash::encode_hash(&[strata_format::hash::Field {
        name: b"f",
        value: b"v",
        expire_ms: 0,
    }]);
    let hk = key("h");
    e.update(&hk, false, |_| {
        let change = strata_engine::Change::Put {
            kind: Kind::Hash,
            value: Bytes::from(hash.clone()),
            expire_ms: 0,
        };
        Ok((Some(change), ()))
    })
    .await
    .unwrap()
    .durable(e)
    .await
    .unwrap();
    want.push(("h".into(), Some((Kind::Hash, hash))));
    want
}

/// Whether `e` acknowledges a write of `k` (as durable).
async fn acknowledged(e: &Engine, k: &str) -> bool {
    match e
        .put(&key(k), Bytes::from_static(b"x"), Default::default())
        .await
    {
        Ok(w) => w.durable(e).await.is_ok(),
        Err(_) => false,
    }
}

/// A store in `dir` sharing `bucket` under writer epoch `epoch` that adopted `objects`.
async fn adopted_by(dir: &Path, bucket: &Path, epoch: u64, objects: &[Bytes]) -> Engine {
    let e = open(sharing(dir, bucket, epoch, Durability::Bucket))
        .await
        .unwrap();
    e.adopt(objects, &|_| true).await.unwrap();
    e
}

async fn holds_exactly(e: &Engine, want: &Expect) {
    for (k, v) in want {
        let got = e.get_value(&key(k)).await.unwrap();
        let got = got.map(|(kind, bytes)| (kind, bytes.to_vec()));
        assert_eq!(&got, v, "{k}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_write_is_in_the_bucket_and_another_node_adopts_it() {
    let root = tempfile::tempdir().unwrap();
    let bucket = root.path().join("bucket");
    std::fs::create_dir_all(&bucket).unwrap();
    let a = open(sharing(
        &root.path().join("a"),
        &bucket,
        5,
        Durability::Bucket,
    ))
    .await
    .unwrap();
    let want = write_everything(&a).await;
    // Some of it demoted: the log's later rounds see those keys cold.
    a.run_background_once().await.unwrap();
    // Nothing of the node but the bucket: another store adopts its log (the node is left
    // as a kill leaves it, never closed).
    let objects = log_of(&bucket, 5).await;
    assert!(!objects.is_empty());
    let b = open(sharing(
        &root.path().join("b"),
        &bucket,
        6,
        Durability::Bucket,
    ))
    .await
    .unwrap();
    let n = b.adopt(&objects, &|_| true).await.unwrap();
    assert!(n >= want.len() as u64, "{n}");
    holds_exactly(&b, &want).await;
    // The adopted keys are b's own now: in b's log too.
    let bs = log_of(&bucket, 6).await;
    assert!(!bs.is_empty());
    let c = open(sharing(
        &root.path().join("c"),
        &bucket,
        7,
        Durability::Bucket,
    ))
    .await
    .unwrap();
    c.adopt(&bs, &|_| true).await.unwrap();
    holds_exactly(&c, &want).await;
    std::mem::forget(a);
    b.close().await.unwrap();
    c.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_writer_acknowledges_nothing_more() {
    let root = tempfile::tempdir().unwrap();
    let bucket = root.path().join("bucket");
    std::fs::create_dir_all(&bucket).unwrap();
    let a = open(sharing(
        &root.path().join("a"),
        &bucket,
        9,
        Durability::Bucket,
    ))
    .await
    .unwrap();
    let want = write_everything(&a).await;
    let store = bucket_store(&bucket);
    let at = strata_engine::fence_bucket_log(store.as_ref(), 9, "controller")
        .await
        .unwrap();
    // Fenced again: the same fence.
    let again = strata_engine::fence_bucket_log(store.as_ref(), 9, "controller")
        .await
        .unwrap();
    assert_eq!(at, again);
    // The writer's next write cannot reach its log: it is refused, never acknowledged.
    assert!(
        !acknowledged(&a, "late").await,
        "a write after the fence was acknowledged"
    );
    let refused = a
        .put(&key("later"), Bytes::from_static(b"x"), Default::default())
        .await;
    assert!(refused.is_err(), "a fenced writer refuses writes");
    // The log up to the fence holds everything acknowledged, and nothing after it.
    let objects = log_of(&bucket, 9).await;
    let b = adopted_by(&root.path().join("b"), &bucket, 10, &objects).await;
    holds_exactly(&b, &want).await;
    assert_eq!(b.get(&key("late")).await.unwrap(), None);
    std::mem::forget(a);
    b.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_that_landed_but_lost_its_reply_is_not_a_fence() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("a");
    let mut o = small_options(&dir);
    o.s.warm.durability = Durability::Bucket;
    // Rounds far enough apart for the test to write between them.
    o.s.bucket.bucket_flush_ms = 500;
    let cold_faults = Faults::new(1, 1_000_000);
    let clock: Arc<dyn strata_engine::Clock> = Arc::new(strata_engine::SystemClock);
    let a = open_failing(
        o,
        clock,
        Faults::new(1, 1_000_000),
        Arc::clone(&cold_faults),
    )
    .await
    .unwrap();
    a.put(&key("one"), Bytes::from_static(b"1"), Default::default())
        .await
        .unwrap()
        .durable(&a)
        .await
        .unwrap();
    cold_faults
        .puts_land_then_fail
        .store(true, std::sync::atomic::Ordering::SeqCst);
    // A round ships "two" = 2a: its PUT lands, its reply is lost. The key changes again
    // before the next round, which finds its own object at that number and writes the
    // newer state at the next.
    let first = a
        .put(&key("two"), Bytes::from_static(b"2a"), Default::default())
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    let injected = cold_faults
        .injected
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(injected >= 1, "no reply was lost");
    a.put(&key("two"), Bytes::from_static(b"2"), Default::default())
        .await
        .unwrap()
        .durable(&a)
        .await
        .unwrap();
    first.durable(&a).await.unwrap();
    a.put(&key("three"), Bytes::from_static(b"3"), Default::default())
        .await
        .unwrap()
        .durable(&a)
        .await
        .unwrap();
    let objects = log_of(&dir.join("cold"), 0).await;
    let b = open(small_options(&root.path().join("b"))).await.unwrap();
    b.adopt(&objects, &|_| true).await.unwrap();
    for (k, v) in [("one", "1"), ("two", "2"), ("three", "3")] {
        assert_eq!(b.get(&key(k)).await.unwrap().as_deref(), Some(v.as_bytes()));
    }
    a.close().await.unwrap();
    b.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_writes_reach_the_bucket_behind_the_reply() {
    let root = tempfile::tempdir().unwrap();
    let bucket = root.path().join("bucket");
    std::fs::create_dir_all(&bucket).unwrap();
    let mut o = sharing(&root.path().join("a"), &bucket, 12, Durability::Group);
    o.s.bucket.bucket_lag_ms_max = 50;
    let a = open(o).await.unwrap();
    a.put(&key("k"), Bytes::from_static(b"v"), Default::default())
        .await
        .unwrap()
        .durable(&a)
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while log_of(&bucket, 12).await.is_empty() {
        assert!(std::time::Instant::now() < deadline, "never shipped");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let b = open(sharing(
        &root.path().join("b"),
        &bucket,
        13,
        Durability::Group,
    ))
    .await
    .unwrap();
    b.adopt(&log_of(&bucket, 12).await, &|_| true)
        .await
        .unwrap();
    assert_eq!(b.get(&key("k")).await.unwrap().as_deref(), Some(&b"v"[..]));
    assert!(b.tier_of(&key("k")).await.unwrap().is_some());
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// The names of the files under `dir` (none if it is absent).
fn names_under(dir: &Path) -> Vec<String> {
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            let mut out: Vec<String> = entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            out.sort();
            out
        }
        Err(_) => Vec::new(),
    }
}

/// Waits until `e` has written `n` snapshots of its bucket log.
async fn snapshots_reach(e: &Engine, n: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while e.stats().bucket_snapshots < n {
        assert!(std::time::Instant::now() < deadline, "no snapshot {n}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

async fn acked_put(e: &Engine, k: &str, v: Vec<u8>, want: &mut Expect) {
    e.put(&key(k), v.clone().into(), Default::default())
        .await
        .unwrap()
        .durable(e)
        .await
        .unwrap();
    want.retain(|(w, _)| w != k);
    want.push((k.into(), Some((Kind::String, v))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_bounds_the_log_and_replays_to_the_same_keys() {
    let root = tempfile::tempdir().unwrap();
    let bucket = root.path().join("bucket");
    std::fs::create_dir_all(&bucket).unwrap();
    let dir = root.path().join("a");
    // The node's first start, epoch 19: its log holds everything below.
    let first = open(sharing(&dir, &bucket, 19, Durability::Bucket))
        .await
        .unwrap();
    let mut want = write_everything(&first).await;
    first.close().await.unwrap();
    drop(first);
    // Started again under epoch 20: its store holds epoch 19's data.
    let mut o = sharing(&dir, &bucket, 20, Durability::Bucket);
    o.s.bucket.bucket_snapshot_bytes_min = 4096;
    o.s.earlier_epochs = vec![19];
    let a = open(o).await.unwrap();
    for i in 0..8 {
        acked_put(&a, &format!("fill:{i}"), vec![b'f'; 1024], &mut want).await;
    }
    // Some keys cold: the snapshot names them by their index entries.
    a.run_background_once().await.unwrap();
    snapshots_reach(&a, 1).await;
    // Epoch 19's log is gone, and epoch 20's up to the snapshot.
    let logs = |e: u64| names_under(&bucket.join(format!("epochs/{e:010}/log")));
    assert_eq!(logs(19), Vec::<String>::new());
    let first_left = logs(20).first().cloned().unwrap();
    assert_ne!(first_left, format!("{:020}.log", 1), "{:?}", logs(20));
    // After the snapshot: an overwrite, a delete, and enough for a second snapshot.
    acked_put(&a, "s:5", b"after".to_vec(), &mut want).await;
    a.delete(&key("s:6"))
        .await
        .unwrap()
        .durable(&a)
        .await
        .unwrap();
    want.retain(|(k, _)| k != "s:6");
    want.push(("s:6".into(), None));
    acked_put(&a, "big2", vec![9u8; 400 << 10], &mut want).await;
    snapshots_reach(&a, 2).await;
    acked_put(&a, "s:7", b"last".to_vec(), &mut want).await;
    // Only the newest snapshot is left (the local store leaves emptied folders).
    let snapshots_dir = bucket.join("epochs/0000000020/snapshots");
    let mut snapshots = names_under(&snapshots_dir);
    snapshots.retain(|s| !names_under(&snapshots_dir.join(s)).is_empty());
    assert_eq!(snapshots.len(), 1, "{snapshots:?}");
    // A new owner replays the node's epochs: the snapshot, then the log after it.
    let objects = strata_engine::bucket_replay(bucket_store(&bucket).as_ref(), &[19, 20])
        .await
        .unwrap();
    let b = adopted_by(&root.path().join("b"), &bucket, 21, &objects).await;
    holds_exactly(&b, &want).await;
    // Fenced and retired: nothing of epoch 20 is left in the bucket but its fence.
    let segments = bucket.join("epochs/0000000020/segments");
    assert!(!names_under(&segments).is_empty(), "nothing went cold");
    let store = bucket_store(&bucket);
    let at = strata_engine::fence_bucket_log(store.as_ref(), 20, "controller")
        .await
        .unwrap();
    strata_engine::retire_bucket_epoch(store.as_ref(), 20)
        .await
        .unwrap();
    assert_eq!(logs(20), vec![format!("{at:020}.log")]);
    assert!(names_under(&segments).is_empty());
    let mut snapshots = names_under(&snapshots_dir);
    snapshots.retain(|s| !names_under(&snapshots_dir.join(s)).is_empty());
    assert!(snapshots.is_empty(), "{snapshots:?}");
    // The writer, still running, acknowledges nothing more.
    assert!(
        !acknowledged(&a, "late").await,
        "a write after the retired fence was acknowledged"
    );
    std::mem::forget(a);
    b.close().await.unwrap();
}
