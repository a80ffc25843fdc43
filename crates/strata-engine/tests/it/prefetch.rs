//! Speculative prefetch: after a cold read, the Markov model's predicted next keys and the
//! block's neighbours arrive in DRAM before they are read.

use std::time::{Duration, Instant};

use bytes::Bytes;
use strata_engine::{Engine, Key, PutOptions, Tier};

use crate::support::{open, small_options, Acked};

fn key(session: u32, i: u32) -> Key {
    Key::new(0, 0, format!("sess:{session}:{i:03}").as_bytes())
}

/// Sessions of keys demoted to the cold tier; values of `value_bytes` each.
async fn cold_sessions(dir: &std::path::Path, prefetch: bool, value_bytes: usize) -> Engine {
    cold_sessions_of(dir, prefetch, value_bytes, 8, 4 << 20).await
}

/// Six sessions of `keys` keys each, demoted to the cold tier; key `i` of session `s`
/// holds `value_bytes` bytes of `s * keys + i`. `bytes_max`: `prefetch_bytes_max`.
async fn cold_sessions_of(
    dir: &std::path::Path,
    prefetch: bool,
    value_bytes: usize,
    keys: u32,
    bytes_max: u64,
) -> Engine {
    let mut o = small_options(dir);
    o.s.prefetch.prefetch = prefetch;
    o.s.prefetch.prefetch_bytes_max = bytes_max;
    // Room for the prefetch window (an eighth of DRAM per cold read).
    o.s.hot.hot_bytes_max = 1 << 20;
    o.s.warm.warm_bytes_max = 2 << 10;
    o.s.cold.segment_bytes_max = 1 << 20;
    let e = open(o).await.unwrap();
    for s in 0..6 {
        for i in 0..keys {
            let v = Bytes::from(vec![(s * keys + i) as u8; value_bytes]);
            e.put(&key(s, i), v, PutOptions::default())
                .await
                .acked(&e)
                .await
                .unwrap();
        }
    }
    e.run_background_once().await.unwrap();
    e.clear_hot();
    e
}

async fn wait_for_tier(e: &Engine, k: &Key, want: Tier, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if e.tier_of(k).await.unwrap() == Some(want) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// Waits until no prefetch has been issued for 300 ms; the stats then.
async fn prefetches_done(e: &Engine) -> strata_engine::Stats {
    let mut last = e.stats();
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = e.stats();
        if now.prefetch_issued == last.prefetch_issued {
            return now;
        }
        last = now;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predicted_next_keys_reach_dram_before_they_are_read() {
    let dir = tempfile::tempdir().unwrap();
    // One value per block (values larger than the block target): neighbours cannot explain it.
    let e = cold_sessions(dir.path(), true, 2000).await;
    for i in 0..8 {
        assert_eq!(e.tier_of(&key(5, i)).await.unwrap(), Some(Tier::Cold));
    }
    // Four sessions read their keys in order, each on its own stream.
    for s in 0..4 {
        for i in 0..8 {
            e.note_access(100 + s as u64, &(key(s, i)));
            e.get(&key(s, i)).await.unwrap().unwrap();
        }
    }
    // Let the training's own prefetches finish, then start from an empty DRAM.
    prefetches_done(&e).await;
    e.clear_hot();
    // A new session's first read is a cold miss; its next keys are predicted and fetched.
    let start = e.stats();
    e.note_access(7, &(key(5, 0)));
    assert_eq!(e.get(&key(5, 0)).await.unwrap().unwrap()[0], 40);
    assert!(
        wait_for_tier(&e, &key(5, 1), Tier::Hot, Duration::from_secs(5)).await,
        "the predicted next key was not prefetched into DRAM"
    );
    for i in 2..8 {
        assert!(wait_for_tier(&e, &key(5, i), Tier::Hot, Duration::from_secs(5)).await);
    }
    // The seven predicted keys lie in blocks end to end in one segment: one ranged GET
    // brought them, besides the miss's own GET.
    let fetched = prefetches_done(&e).await;
    assert_eq!(
        fetched.prefetch_issued - start.prefetch_issued,
        7,
        "{fetched:?}"
    );
    assert_eq!(
        fetched.object_store_gets - start.object_store_gets,
        2,
        "{fetched:?}"
    );
    let before = e.stats();
    for i in 1..4 {
        e.note_access(7, &(key(5, i)));
        assert_eq!(e.get(&key(5, i)).await.unwrap().unwrap()[0], 40 + i as u8);
    }
    let after = e.stats();
    assert_eq!(
        after.cold_hits, before.cold_hits,
        "prefetched keys were read from cold"
    );
    assert!(after.prefetch_used >= 3, "{after:?}");
    assert!(after.prefetch_issued >= after.prefetch_used);
    // Another session's keys were not pulled in: predictions follow the stream.
    assert_eq!(e.tier_of(&key(4, 1)).await.unwrap(), Some(Tier::Cold));
    // The prefetched values that were read go back to the warm tier, as values read from
    // the object store do (off the read's path, in the prefetch task).
    let deadline = Instant::now() + Duration::from_secs(5);
    while e.stats().returns_to_warm < before.returns_to_warm + 3 {
        assert!(Instant::now() < deadline, "{:?}", e.stats());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Prefetch jobs of the reads above may still be running (a loaded machine runs them
    // late); one that finishes after the DRAM is cleared would put a key back.
    e.settle().await;
    e.clear_hot();
    for i in 1..4 {
        assert_eq!(
            e.tier_of(&key(5, i)).await.unwrap(),
            Some(Tier::Warm),
            "key {i}"
        );
    }
}

/// Sessions of 24 keys of 2000 bytes, one per block, demoted; the model trained on four
/// of them with prefetch on, then DRAM emptied.
async fn trained_sessions(dir: &std::path::Path, bytes_max: u64) -> Engine {
    let e = cold_sessions_of(dir, true, 2000, 24, bytes_max).await;
    for s in 0..4 {
        for i in 0..24 {
            e.note_access(100 + s as u64, &key(s, i));
            e.get(&key(s, i)).await.unwrap().unwrap();
        }
    }
    prefetches_done(&e).await;
    e.clear_hot();
    e
}

/// Reads session 5's 24 keys in order, each once what the read before left to do is
/// done; after each read, the next `lead` keys (or those left) must be in DRAM already.
/// The object-store GETs the reads cost.
async fn read_in_order(e: &Engine, lead: u32) -> u64 {
    let start = e.stats();
    for i in 0..24 {
        e.note_access(7, &key(5, i));
        assert_eq!(e.get(&key(5, i)).await.unwrap().unwrap()[0], 120 + i as u8);
        e.settle().await;
        for j in i + 1..=(i + lead).min(23) {
            let tier = e.tier_of(&key(5, j)).await.unwrap();
            assert_eq!(tier, Some(Tier::Hot), "key {j} after the read of {i}");
        }
    }
    let end = e.stats();
    assert_eq!(
        end.cold_hits - start.cold_hits,
        1,
        "only the first read missed"
    );
    end.object_store_gets - start.object_store_gets
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_read_in_order_is_prefetched_by_runs_not_a_get_per_read() {
    let dir = tempfile::tempdir().unwrap();
    // Three times the window of 8 predicted keys; the window is asked for again once half
    // of it has been read, so the stream stays at least 4 keys ahead at a GET for every
    // four reads or so (a GET per read before), and the first read's own.
    let e = trained_sessions(dir.path(), 4 << 20).await;
    let gets = read_in_order(&e, 4).await;
    assert!(
        gets <= 9,
        "{gets} GETs for 24 reads in order: {:?}",
        e.stats()
    );
    // A budget of three values narrows the window to what it covers; the stream still
    // stays ahead.
    let dir = tempfile::tempdir().unwrap();
    let e = trained_sessions(dir.path(), 6500).await;
    let gets = read_in_order(&e, 2).await;
    assert!(
        gets <= 13,
        "{gets} GETs for 24 reads in order: {:?}",
        e.stats()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_neighbours_are_prefetched_and_prefetch_can_be_turned_off() {
    for on in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        // Small values: many share a block.
        let e = cold_sessions(dir.path(), on, 100).await;
        assert_eq!(e.tier_of(&key(2, 3)).await.unwrap(), Some(Tier::Cold));
        e.get(&key(2, 3)).await.unwrap().unwrap();
        let got = wait_for_tier(
            &e,
            &key(2, 4),
            Tier::Hot,
            Duration::from_millis(if on { 5000 } else { 500 }),
        )
        .await;
        assert_eq!(got, on, "prefetch={on}");
        if !on {
            assert_eq!(e.stats().prefetch_issued, 0);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_after_a_prefetch_wins() {
    let dir = tempfile::tempdir().unwrap();
    let e = cold_sessions(dir.path(), true, 100).await;
    e.get(&key(1, 0)).await.unwrap().unwrap();
    assert!(wait_for_tier(&e, &key(1, 1), Tier::Hot, Duration::from_secs(5)).await);
    e.put(
        &key(1, 1),
        Bytes::from_static(b"new"),
        PutOptions::default(),
    )
    .await
    .acked(&e)
    .await
    .unwrap();
    assert_eq!(e.get(&key(1, 1)).await.unwrap().unwrap(), "new");
}
