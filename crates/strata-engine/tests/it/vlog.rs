//! The value log: large values written once beside RocksDB, read through a memory map,
//! garbage counted and collected, kept across restarts, demoted to the cold tier, and
//! emptied by FLUSHALL. Against real RocksDB and real files.

use std::collections::BTreeMap;

use bytes::Bytes;
use strata_engine::{Engine, Key, PutOptions, Tier};

use crate::support::{key, open, small_options, Acked, Rng};

fn options(dir: &std::path::Path) -> crate::support::Opts {
    let mut o = small_options(dir);
    o.s.vlog.vlog_value_bytes_min = 16 << 10;
    o.s.vlog.vlog_file_bytes = 1 << 20;
    o.s.warm.warm_bytes_max = 1 << 30;
    o
}

fn value(seed: u64, len: usize) -> Bytes {
    Rng::new(seed).bytes(len).into()
}

/// Reads every key of `model` from a cold DRAM tier, one by one and in one batch.
async fn check_all(engine: &Engine, model: &BTreeMap<Vec<u8>, Bytes>, what: &str) {
    engine.clear_hot();
    for (k, v) in model {
        let got = engine.get(&key(k)).await.unwrap();
        assert_eq!(
            got.as_ref(),
            Some(v),
            "{what}: {}",
            String::from_utf8_lossy(k)
        );
    }
    engine.clear_hot();
    let keys_stored: Vec<Key> = model.keys().map(key).collect();
    let keys: Vec<&Key> = keys_stored.iter().collect();
    let got = engine.get_many(&keys).await.unwrap();
    for ((k, v), g) in model.iter().zip(got) {
        assert_eq!(
            g.as_ref(),
            Some(v),
            "{what} (batch): {}",
            String::from_utf8_lossy(k)
        );
    }
}

#[tokio::test]
async fn large_values_live_in_the_value_log_and_survive_overwrite_collection_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let o = options(dir.path());
    let engine = open(o.clone()).await.unwrap();
    let mut model = BTreeMap::new();
    // 40 values of 100 KiB: about four files of 1 MiB; plus small values kept inline.
    for i in 0..40u64 {
        let k = format!("big:{i:02}").into_bytes();
        let v = value(i, 100 << 10);
        engine
            .put(&key(&k), v.clone(), PutOptions::default())
            .await
            .acked(&engine)
            .await
            .unwrap();
        model.insert(k, v);
        let k = format!("small:{i:02}").into_bytes();
        let v = value(1000 + i, 100);
        engine
            .put(&key(&k), v.clone(), PutOptions::default())
            .await
            .acked(&engine)
            .await
            .unwrap();
        model.insert(k, v);
    }
    let s = engine.stats();
    assert!(s.vlog_files >= 4, "{} value-log files", s.vlog_files);
    assert!(
        s.vlog_bytes >= 40 * (100 << 10),
        "{} value-log bytes",
        s.vlog_bytes
    );
    assert_eq!(s.warm_entries, 80);
    check_all(&engine, &model, "after writes").await;

    // Overwrite most big values and delete some: their old entries become garbage.
    for i in 0..30u64 {
        let k = format!("big:{i:02}").into_bytes();
        if i % 5 == 0 {
            assert!(engine.delete(&key(&k)).await.acked(&engine).await.unwrap());
            model.remove(&k);
        } else {
            let v = value(100 + i, 100 << 10);
            engine
                .put(&key(&k), v.clone(), PutOptions::default())
                .await
                .acked(&engine)
                .await
                .unwrap();
            model.insert(k, v);
        }
    }
    // An expiry changes the record's checksum (it covers the expiry), not the value's place.
    let far = engine.now_ms() + 3_600_000;
    assert!(engine
        .set_expire(&key(b"big:35"), far)
        .await
        .acked(&engine)
        .await
        .unwrap());
    assert_eq!(
        engine.expire_time_ms(&key(b"big:35")).await.unwrap(),
        Some(far)
    );
    check_all(&engine, &model, "after overwrites").await;

    let before = engine.stats().vlog_bytes;
    engine.run_background_once().await.unwrap();
    let s = engine.stats();
    assert!(
        s.vlog_files_collected >= 3,
        "{} files collected",
        s.vlog_files_collected
    );
    // What is left: the live big values, and at most one file's worth of garbage (a sealed
    // file under half garbage stays, and so does the file being appended to).
    let live: u64 = model
        .iter()
        .filter(|(k, _)| k.starts_with(b"big:"))
        .map(|(_, v)| v.len() as u64 + 32)
        .sum();
    assert!(
        s.vlog_bytes <= live + (1 << 20) && s.vlog_bytes < before,
        "collection left {} bytes of {before}; {live} live",
        s.vlog_bytes
    );
    assert_eq!(s.checksum_errors, 0);
    check_all(&engine, &model, "after collection").await;

    engine.close().await.unwrap();
    drop(engine);
    let engine = open(o).await.unwrap();
    check_all(&engine, &model, "after restart").await;
    assert_eq!(
        engine.expire_time_ms(&key(b"big:35")).await.unwrap(),
        Some(far)
    );
    // New writes after a restart go to a new file and read back too.
    let v = value(7, 300 << 10);
    engine
        .put(&key(b"big:new"), v.clone(), PutOptions::default())
        .await
        .acked(&engine)
        .await
        .unwrap();
    model.insert(b"big:new".to_vec(), v);
    check_all(&engine, &model, "after a write past restart").await;

    // FLUSHALL makes every entry garbage; the next collection deletes every sealed file.
    engine.flush_all().await.acked(&engine).await.unwrap();
    engine.run_background_once().await.unwrap();
    let s = engine.stats();
    assert_eq!(s.vlog_bytes, 0, "{} files left", s.vlog_files);
    assert_eq!(engine.get(&key(b"big:new")).await.unwrap(), None);
}

#[tokio::test]
async fn logged_values_demote_to_the_cold_tier_and_their_files_are_collected() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(dir.path());
    o.s.warm.warm_bytes_max = 512 << 10;
    o.s.cold.segment_bytes_max = 1 << 20;
    let engine = open(o).await.unwrap();
    let mut model = BTreeMap::new();
    for i in 0..30u64 {
        let k = format!("chunk:{i:02}").into_bytes();
        let v = value(i, 64 << 10);
        engine
            .put(&key(&k), v.clone(), PutOptions::default())
            .await
            .acked(&engine)
            .await
            .unwrap();
        model.insert(k, v);
    }
    let demoted = engine.run_background_once().await.unwrap();
    assert!(demoted >= 20, "{demoted} keys demoted");
    let mut cold = 0;
    for k in model.keys() {
        if engine.tier_of(&key(k)).await.unwrap() == Some(Tier::Cold) {
            cold += 1;
        }
    }
    assert_eq!(cold as u64, demoted);
    check_all(&engine, &model, "after demotion").await;
    // Demotion counted the demoted entries as garbage: a second round deletes the sealed
    // files that held only them (the newest file is still being appended to).
    engine.run_background_once().await.unwrap();
    let s = engine.stats();
    assert!(
        s.vlog_files_collected >= 1,
        "{} files collected",
        s.vlog_files_collected
    );
    let live = (30 - demoted) * ((64 << 10) + 32);
    assert!(
        s.vlog_bytes <= live + (1 << 20),
        "{} bytes left",
        s.vlog_bytes
    );
    check_all(&engine, &model, "after collection").await;
}

/// A value that names its key and version, so a reader can tell a torn or misplaced value
/// from a current one.
fn versioned(key: u64, version: u64) -> Bytes {
    let mut v = Rng::new(key * 1_000_003 + version).bytes(64 << 10);
    v[..16].copy_from_slice(&[key.to_le_bytes(), version.to_le_bytes()].concat());
    v.into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_racing_overwrites_and_collection_always_get_a_whole_current_value() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(options(dir.path())).await.unwrap();
    const KEYS: u64 = 20;
    for k in 0..KEYS {
        let name = format!("race:{k}");
        engine
            .put(
                &key(name.as_bytes()),
                versioned(k, 0),
                PutOptions::default(),
            )
            .await
            .acked(&engine)
            .await
            .unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let writer = {
        let engine = engine.clone();
        tokio::spawn(async move {
            let mut version = 1;
            while std::time::Instant::now() < deadline {
                for k in 0..KEYS {
                    let name = format!("race:{k}");
                    let v = versioned(k, version);
                    engine
                        .put(&key(name.as_bytes()), v, PutOptions::default())
                        .await
                        .acked(&engine)
                        .await
                        .unwrap();
                }
                version += 1;
            }
            version
        })
    };
    let collector = {
        let engine = engine.clone();
        tokio::spawn(async move {
            let mut rounds = 0;
            while std::time::Instant::now() < deadline {
                engine.run_background_once().await.unwrap();
                rounds += 1;
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            rounds
        })
    };
    let mut reads = 0u64;
    while std::time::Instant::now() < deadline {
        engine.clear_hot();
        for k in 0..KEYS {
            let name = format!("race:{k}");
            let v = engine
                .get(&key(name.as_bytes()))
                .await
                .unwrap()
                .expect("never deleted");
            let version = u64::from_le_bytes(v[8..16].try_into().unwrap());
            assert_eq!(v, versioned(k, version), "key {k} version {version}");
            reads += 1;
        }
    }
    let versions = writer.await.unwrap();
    let rounds = collector.await.unwrap();
    let s = engine.stats();
    assert_eq!(s.checksum_errors, 0);
    assert!(
        versions > 5 && rounds > 5 && reads > 100,
        "{versions} versions, {rounds} rounds, {reads} reads"
    );
    assert!(
        s.vlog_files_collected > 0,
        "nothing collected in {rounds} rounds"
    );
}

#[tokio::test]
async fn locate_local_names_where_logged_values_lie_and_stops_at_the_first_absent_key() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(dir.path());
    o.s.warm.warm_bytes_max = 512 << 10;
    o.s.cold.segment_bytes_max = 1 << 20;
    let engine = open(o).await.unwrap();
    let keys: Vec<Vec<u8>> = (0..4u64).map(|i| format!("c:{i}").into_bytes()).collect();
    let values: Vec<Bytes> = (0..4u64).map(|i| value(100 + i, 40 << 10)).collect();
    for (k, v) in keys.iter().zip(&values) {
        engine
            .put(&key(k), v.clone(), PutOptions::default())
            .await
            .acked(&engine)
            .await
            .unwrap();
    }
    engine
        .put(
            &key(b"small"),
            Bytes::from_static(b"inline"),
            PutOptions::default(),
        )
        .await
        .acked(&engine)
        .await
        .unwrap();
    let refs_stored: Vec<Key> = keys.iter().map(key).collect();
    let refs: Vec<&Key> = refs_stored.iter().collect();
    let found = engine.locate_local(&refs).unwrap();
    assert_eq!(found.len(), 4);
    for ((l, k), v) in found.iter().zip(&keys).zip(&values) {
        let l = l.as_ref().expect("a logged value is located");
        assert!(l.path.is_absolute(), "{}", l.path.display());
        let file = std::fs::read(&l.path).unwrap();
        let at = &file[l.offset as usize..(l.offset + l.len) as usize];
        assert_eq!(at, &v[..], "the bytes at the location are the value");
        assert_eq!(
            strata_format::entry_checksum(strata_format::Kind::String, k, l.expire_ms, at),
            l.checksum
        );
    }
    // The prefix ends at an absent key; a value that lives in its record is present but not
    // located.
    let (absent, small) = (key(b"absent"), key(b"small"));
    let with_gap: Vec<&Key> = vec![refs[0], &absent, refs[1]];
    assert_eq!(engine.locate_local(&with_gap).unwrap().len(), 1);
    let with_small: Vec<&Key> = vec![refs[0], refs[1], &small, refs[2]];
    let got = engine.locate_local(&with_small).unwrap();
    let located: Vec<bool> = got.iter().map(|l| l.is_some()).collect();
    assert_eq!(located, [true, true, false, true]);
    // After an overwrite, the new value's place.
    let newer = value(7, 40 << 10);
    engine
        .put(&key(&keys[0]), newer.clone(), PutOptions::default())
        .await
        .acked(&engine)
        .await
        .unwrap();
    let l = engine.locate_local(&refs[..1]).unwrap()[0].clone().unwrap();
    let file = std::fs::read(&l.path).unwrap();
    assert_eq!(
        &file[l.offset as usize..(l.offset + l.len) as usize],
        &newer[..]
    );
    // Values demoted to the object store are present but not in the log.
    let chunks: Vec<Vec<u8>> = (0..30u64)
        .map(|i| format!("chunk:{i:02}").into_bytes())
        .collect();
    for (i, k) in chunks.iter().enumerate() {
        engine
            .put(&key(k), value(i as u64, 40 << 10), PutOptions::default())
            .await
            .acked(&engine)
            .await
            .unwrap();
    }
    // Reads keep the first five warm through the demotion round (the clock hand spares
    // recently read keys); later ones go.
    for _ in 0..3 {
        for k in &chunks[..5] {
            engine.get(&key(k)).await.unwrap();
        }
    }
    assert!(engine.run_background_once().await.unwrap() > 0);
    let mut first_cold = None;
    for (i, k) in chunks.iter().enumerate() {
        if engine.tier_of(&key(k)).await.unwrap() == Some(Tier::Cold) {
            first_cold = Some(i);
            break;
        }
    }
    let first_cold = first_cold.expect("demotion moved some chunks");
    let refs_stored: Vec<Key> = chunks.iter().map(key).collect();
    let refs: Vec<&Key> = refs_stored.iter().collect();
    assert!(first_cold >= 1, "the read chunks stayed warm");
    let got = engine.locate_local(&refs).unwrap();
    assert_eq!(got.len(), chunks.len(), "every chunk is present somewhere");
    for (i, (l, k)) in got.iter().zip(&chunks).enumerate() {
        let cold = engine.tier_of(&key(k)).await.unwrap() == Some(Tier::Cold);
        assert_eq!(
            l.is_none(),
            cold,
            "chunk {i}: located {}, cold {cold}",
            l.is_some()
        );
    }
    assert!(got[first_cold].is_none());
}

/// Mappings of deleted files under `dir` that this process still holds.
fn deleted_maps_under(dir: &std::path::Path) -> Vec<String> {
    let dir = dir.canonicalize().unwrap();
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.ends_with("(deleted)") && l.contains(&*dir.to_string_lossy()))
        .map(str::to_string)
        .collect()
}

/// After a collection: runs background rounds until no deleted value-log file under `dir`
/// is mapped (a deleted file's own map serves reads in flight for a grace period), failing
/// after 30 s; then checks DRAM still holds every value of `model`, exactly.
async fn wait_until_no_deleted_file_is_mapped(
    engine: &Engine,
    dir: &std::path::Path,
    model: &BTreeMap<Vec<u8>, Bytes>,
) {
    let collected = engine.stats().vlog_files_collected;
    assert!(collected >= 1, "{collected} files collected");
    let since = std::time::Instant::now();
    loop {
        engine.run_background_once().await.unwrap();
        let left = deleted_maps_under(dir);
        if left.is_empty() {
            break;
        }
        assert!(
            since.elapsed() < std::time::Duration::from_secs(30),
            "deleted value-log files still mapped: {left:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    assert_eq!(
        engine.stats().hot_entries,
        model.len() as u64,
        "DRAM kept every value"
    );
    for (k, v) in model {
        let got = engine.get(&key(k)).await.unwrap();
        assert_eq!(got.as_ref(), Some(v), "{}", String::from_utf8_lossy(k));
    }
}

/// Writes `n` values of 64 KiB (`chunk:NN`, seeds from `seed`) into `model`.
async fn put_chunks(engine: &Engine, model: &mut BTreeMap<Vec<u8>, Bytes>, n: u64, seed: u64) {
    for i in 0..n {
        let k = format!("chunk:{i:02}").into_bytes();
        let v = value(seed + i, 64 << 10);
        engine
            .put(&key(&k), v.clone(), PutOptions::default())
            .await
            .acked(engine)
            .await
            .unwrap();
        model.insert(k, v);
    }
}

// DRAM holds a logged value as a view of its file's pages (no copy of its own): when
// collection deletes a file, the values DRAM still holds from it must not keep the file,
// and its disk space, alive.

/// An engine whose DRAM holds the 40 values of 64 KiB it was given (files of 1 MiB hold
/// 15 each), with `warm_bytes_max` as given.
async fn dram_holding_chunks(
    dir: &std::path::Path,
    warm_bytes_max: u64,
) -> (Engine, BTreeMap<Vec<u8>, Bytes>) {
    let mut o = options(dir);
    o.s.hot.hot_bytes_max = 16 << 20;
    o.s.warm.warm_bytes_max = warm_bytes_max;
    o.s.cold.segment_bytes_max = 1 << 20;
    let engine = open(o).await.unwrap();
    let mut model = BTreeMap::new();
    put_chunks(&engine, &mut model, 40, 0).await;
    assert_eq!(engine.stats().hot_entries, 40, "DRAM holds every value");
    (engine, model)
}

#[tokio::test]
async fn values_dram_holds_follow_their_entries_when_collection_moves_them() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, mut model) = dram_holding_chunks(dir.path(), 1 << 30).await;
    // Rewriting 8 of the first file's 15 values leaves it mostly garbage, and its other 7
    // live, in DRAM; the round collects it.
    put_chunks(&engine, &mut model, 8, 100).await;
    engine.run_background_once().await.unwrap();
    wait_until_no_deleted_file_is_mapped(&engine, dir.path(), &model).await;
}

#[tokio::test]
async fn values_dram_holds_get_a_copy_when_their_entries_are_demoted_and_collected() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, model) = dram_holding_chunks(dir.path(), 512 << 10).await;
    // Demotion leaves the older files garbage while DRAM still holds their values; the
    // next round collects them.
    let demoted = engine.run_background_once().await.unwrap();
    assert!(demoted >= 20, "{demoted} keys demoted");
    engine.run_background_once().await.unwrap();
    wait_until_no_deleted_file_is_mapped(&engine, dir.path(), &model).await;
}
