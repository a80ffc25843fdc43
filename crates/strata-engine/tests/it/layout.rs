//! The key layout: a store written before databases and slots (layout 1, the fixture in
//! `tests/fixtures/layout-1`, see its README) opens under the current layout with every
//! key, value, expiry, pin and counter intact, its old segments and value-log entries still
//! read, collected and rewritten; and a migration cut short by a crash starts again.

use bytes::Bytes;
use strata_engine::{Engine, PutOptions, Tier};

use crate::support::{key, open, small_options, Acked, Opts};

/// The fixture's values: `len` bytes derived from `i` (as its generator wrote them).
fn value(i: u64, len: usize) -> Bytes {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    Bytes::from(
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect::<Vec<u8>>(),
    )
}

const FAR: u64 = 4_102_444_800_000;

/// A copy of the layout-1 fixture in a new directory.
fn fixture() -> tempfile::TempDir {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/layout-1");
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&src, dir.path());
    dir
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

fn options(dir: &std::path::Path) -> Opts {
    let mut o = small_options(dir);
    o.s.warm.warm_bytes_max = 24 << 10;
    o.s.cold.block_bytes = 2048;
    o.s.cold.segment_bytes_max = 8 << 10;
    o.s.warm.disk_free_min_bytes = 0;
    // Reads leave cold keys cold, so that deletions leave the old segments sparse (and
    // rewritten) rather than emptied by returns to the warm tier.
    o.s.warm.cold_reads_return_to_warm = false;
    o
}

/// Checks every key the fixture holds.
async fn check_fixture(e: &Engine, what: &str) {
    for i in 0..200u64 {
        let k = key(format!("str:{i:04}"));
        assert_eq!(
            e.get(&k).await.unwrap(),
            Some(value(i, 100)),
            "{what}: str:{i:04}"
        );
        let expire = if i % 7 == 0 { FAR + i } else { 0 };
        assert_eq!(
            e.expire_time_ms(&k).await.unwrap(),
            Some(expire),
            "{what}: {i}"
        );
    }
    assert_eq!(
        e.get(&key(b"blob:8k")).await.unwrap(),
        Some(value(1000, 8192)),
        "{what}"
    );
    for (i, k, len) in [(1001, "big:66k", 66_000), (1002, "big:70k", 70_000)] {
        assert_eq!(
            e.get(&key(k)).await.unwrap(),
            Some(value(i, len)),
            "{what}: {k}"
        );
        assert_eq!(
            e.expire_time_ms(&key(k)).await.unwrap(),
            Some(FAR + i),
            "{what}"
        );
    }
    assert_eq!(
        e.get(&key(b"counter")).await.unwrap().unwrap(),
        "41",
        "{what}"
    );
}

#[tokio::test]
async fn a_layout_1_store_opens_migrated_with_everything_intact() {
    let dir = fixture();
    let e = open(options(dir.path())).await.unwrap();
    let st = e.stats();
    assert_eq!((st.warm_entries, st.cold_entries), (3, 201), "{st:?}");
    let mut pins = e.pins();
    pins.sort();
    assert_eq!(pins, vec![Bytes::from("big:"), Bytes::from("blob:*")]);
    e.clear_hot();
    assert_eq!(
        e.tier_of(&key(b"str:0005")).await.unwrap(),
        Some(Tier::Cold)
    );
    assert_eq!(e.tier_of(&key(b"big:66k")).await.unwrap(), Some(Tier::Warm));
    check_fixture(&e, "after migration").await;
    // The layout-1 value-log entries and segments are still found by the engine's own
    // housekeeping: an overwrite makes a logged value garbage, a collection round rewrites
    // sparse layout-1 segments into layout-2 ones, and nothing is lost.
    e.put(&key(b"big:66k"), value(7, 66_000), PutOptions::default())
        .await
        .acked(&e)
        .await
        .unwrap();
    for i in (0..200).filter(|i| i % 4 != 3) {
        e.delete(&key(format!("str:{i:04}")))
            .await
            .acked(&e)
            .await
            .unwrap();
    }
    e.run_background_once().await.unwrap();
    assert!(e.stats().segments_rewritten > 0, "{:?}", e.stats());
    e.close().await.unwrap();
    drop(e);
    // Reopened: no second migration, and the rewritten data reads back.
    let e = open(options(dir.path())).await.unwrap();
    e.clear_hot();
    for i in 0..200u64 {
        let got = e.get(&key(format!("str:{i:04}"))).await.unwrap();
        let want = (i % 4 == 3).then(|| value(i, 100));
        assert_eq!(got, want, "str:{i:04} after rewrite and restart");
    }
    assert_eq!(
        e.get(&key(b"big:66k")).await.unwrap(),
        Some(value(7, 66_000))
    );
    assert_eq!(
        e.get(&key(b"big:70k")).await.unwrap(),
        Some(value(1002, 70_000))
    );
    e.close().await.unwrap();
}

#[tokio::test]
async fn a_migration_cut_short_starts_again_and_finishes() {
    let dir = fixture();
    // A first open that copied part of the store and crashed before recording the layout:
    // what the copy left in the new families is thrown away and the copy done again.
    {
        let warm = strata_rocks::RocksWarm::open(
            &strata_engine::warm_dir(dir.path()),
            &Default::default(),
        )
        .unwrap();
        use strata_warm::WarmStore;
        let mut b = warm.batch();
        b.put(
            strata_warm::Family::Records,
            key(b"str:0001").stored(),
            b"half-copied junk",
        );
        b.put(
            strata_warm::Family::Records,
            key(b"zzz").stored(),
            b"not in the old store",
        );
        warm.write(b, true).unwrap();
    }
    let e = open(options(dir.path())).await.unwrap();
    check_fixture(&e, "after an interrupted migration").await;
    assert_eq!(e.get(&key(b"zzz")).await.unwrap(), None);
    assert_eq!(e.stats().warm_entries, 3);
    e.close().await.unwrap();
}

/// The layout the store in `dir` records, or sets it to `to`.
fn store_layout(dir: &std::path::Path, to: Option<u32>) -> Option<u32> {
    use strata_warm::WarmStore;
    let warm = crate::support::rocks(dir);
    if let Some(v) = to {
        let mut b = warm.batch();
        b.put(strata_warm::Family::Meta, b"layout", &v.to_le_bytes());
        warm.write(b, true).unwrap();
    }
    let got = warm.get(strata_warm::Family::Meta, b"layout").unwrap();
    got.map(|b| u32::from_le_bytes(b[..4].try_into().unwrap()))
}

#[tokio::test]
async fn a_layout_2_store_is_recorded_as_3_and_a_newer_layout_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(small_options(dir.path())).await.unwrap();
    e.put(&key(b"k"), Bytes::from("v"), PutOptions::default())
        .await
        .acked(&e)
        .await
        .unwrap();
    e.close().await.unwrap();
    drop(e);
    assert_eq!(store_layout(dir.path(), None), Some(3), "a new store");
    // A store an older Strata wrote: same keys, so only the record moves on.
    store_layout(dir.path(), Some(2));
    let e = open(small_options(dir.path())).await.unwrap();
    assert_eq!(e.get(&key(b"k")).await.unwrap(), Some(Bytes::from("v")));
    e.close().await.unwrap();
    drop(e);
    assert_eq!(store_layout(dir.path(), None), Some(3));
    // A store of a layout this Strata does not know (as layout 3 is to an older one).
    store_layout(dir.path(), Some(4));
    let err = open(small_options(dir.path()))
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("layout 4"), "{err}");
}
