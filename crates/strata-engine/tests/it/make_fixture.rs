//! Writes the layout-1 store that `tests/fixtures/layout-1` holds (run once, by hand, with
//! the code of the commit that added it; later code writes layout 2):
//! `STRATA_FIXTURE_DIR=/tmp/fx cargo nextest run -p strata-engine --run-ignored only make_fixture`

use bytes::Bytes;
use strata_engine::{Engine, EngineOptions, Expire, PutOptions};

/// The value of fixture key number `i`: `len` bytes derived from `i`.
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

#[tokio::test]
#[ignore]
async fn make_fixture() {
    let dir = std::env::var("STRATA_FIXTURE_DIR").expect("STRATA_FIXTURE_DIR");
    let mut o = EngineOptions::new(&dir);
    o.hot_bytes_max = 64 << 10;
    o.hot_shard_count = 2;
    o.warm_bytes_max = 24 << 10;
    o.warm_bytes_hard_max = 1 << 30;
    o.prefetch = false;
    o.block_bytes = 2048;
    o.segment_bytes_max = 8 << 10;
    o.background_interval_ms = 3_600_000;
    o.rocksdb_block_cache_bytes = 1 << 20;
    o.disk_free_min_bytes = 0;
    let e = Engine::open(o).await.unwrap();
    let far = 4_102_444_800_000; // 2100-01-01
    e.pin(b"big:").await.unwrap();
    e.pin(b"blob:*").await.unwrap();
    // 200 small strings; most end up in the object store.
    for i in 0..200u64 {
        let opts = PutOptions {
            expire: if i % 7 == 0 {
                Expire::AtMs(far + i)
            } else {
                Expire::Persist
            },
            ..Default::default()
        };
        e.put(format!("str:{i:04}").as_bytes(), value(i, 100), opts)
            .await
            .unwrap();
    }
    // Pinned, so warm: one value in a RocksDB blob file, two in the value log.
    e.put(b"blob:8k", value(1000, 8 << 10), PutOptions::default())
        .await
        .unwrap();
    for (i, k) in [(1001u64, "big:66k"), (1002, "big:70k")] {
        let len = if i == 1001 { 66_000 } else { 70_000 };
        let opts = PutOptions {
            expire: Expire::AtMs(far + i),
            ..Default::default()
        };
        e.put(k.as_bytes(), value(i, len), opts).await.unwrap();
    }
    e.incr_by(b"counter", 41).await.unwrap();
    e.run_background_once().await.unwrap();
    let st = e.stats();
    println!(
        "warm {} entries, cold {} entries, segments {}",
        st.warm.entries, st.cold.entries, st.segments_written
    );
    assert!(st.cold.entries > 100, "most small strings demoted");
    e.close().await.unwrap();
}
