//! Live values (collections changed in place): a fold encodes its value with the live
//! values' map let go, so one large value's encode stalls its own key alone.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use strata_engine::{Durability, Kind, LiveValue};

use crate::support::{key, live_as, members, open, small_options};

/// A live value whose encode waits for a word on `release` (a collection of millions
/// takes that long), telling `encoding` first.
struct Slow {
    items: Vec<u8>,
    encoding: mpsc::Sender<()>,
    release: Arc<Mutex<mpsc::Receiver<()>>>,
}

impl LiveValue for Slow {
    fn encode(&mut self) -> bytes::Bytes {
        let _ = self.encoding.send(());
        let _ = self
            .release
            .lock()
            .unwrap()
            .recv_timeout(Duration::from_secs(20));
        strata_format::members::encode_members(&[&self.items[..]]).into()
    }
    fn bytes(&self) -> usize {
        64 + self.items.len()
    }
    fn is_empty(&self) -> bool {
        false
    }
}

/// The set of one member, `m`.
struct Quick(Vec<u8>);

impl LiveValue for Quick {
    fn encode(&mut self) -> bytes::Bytes {
        strata_format::members::encode_members(&[&self.0[..]]).into()
    }
    fn bytes(&self) -> usize {
        64 + self.0.len()
    }
    fn is_empty(&self) -> bool {
        false
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fold_encoding_one_large_value_leaves_the_other_live_values_usable() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = small_options(dir.path());
    o.s.hot.hot_bytes_max = 64 << 20;
    o.s.warm.durability = Durability::None;
    let engine = open(o).await.unwrap();
    let (big, small) = (key("big"), key("small"));
    let (encoding_tx, encoding) = mpsc::channel();
    let (release, release_rx) = mpsc::channel();
    let release_rx = Arc::new(Mutex::new(release_rx));
    let slow = move |_: Option<&Bytes>| -> strata_engine::Result<Box<dyn LiveValue>> {
        Ok(Box::new(Slow {
            items: b"old".to_vec(),
            encoding: encoding_tx.clone(),
            release: release_rx.clone(),
        }))
    };
    let quick = |_: Option<&Bytes>| -> strata_engine::Result<Box<dyn LiveValue>> {
        Ok(Box::new(Quick(b"m".to_vec())))
    };
    let set_items = |v: &mut dyn LiveValue, to: &[u8]| {
        live_as::<Slow>(v).items = to.to_vec();
    };
    let _ = engine
        .update_live(&big, Kind::Set, slow, |v| {
            set_items(v, b"new");
            Ok((true, ()))
        })
        .await
        .unwrap();
    let _ = engine
        .update_live(&small, Kind::Set, quick, |_| Ok((true, ())))
        .await
        .unwrap();

    // A read of the large value's stored form folds it first: its encode now waits.
    let reader = engine.clone();
    let big_read = tokio::spawn(async move {
        reader
            .get_value_with(&key("big"), |_, s| Ok(s.bytes().to_vec()))
            .await
    });
    encoding
        .recv_timeout(Duration::from_secs(10))
        .expect("the fold started");

    // Meanwhile the other live value answers reads in place, and takes writes (on a thread
    // of its own: a wait for the map's lock would hold a worker).
    let other = engine.clone();
    let small_ops = tokio::task::spawn_blocking(move || {
        let small = key("small");
        let len = other
            .read_live(
                &small,
                Kind::Set,
                |_| unreachable!("live already"),
                |v| v.bytes(),
            )
            .unwrap();
        let write = other.update_live(&small, Kind::Set, quick, |_| Ok((true, ())));
        let _ = tokio::runtime::Handle::current().block_on(write).unwrap();
        len
    });
    let seen = tokio::time::timeout(Duration::from_secs(5), small_ops)
        .await
        .expect("the small value waited for the large one's encode")
        .unwrap();
    assert_eq!(seen, Some(65));

    // A read of the large value in place waits for its fold and sees its newest state.
    let engine2 = engine.clone();
    let big_live = tokio::task::spawn_blocking(move || {
        engine2.read_live(
            &key("big"),
            Kind::Set,
            |_| unreachable!("live already"),
            |v| live_as::<Slow>(v).items.clone(),
        )
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !big_live.is_finished(),
        "a read of the value away waits for its fold"
    );
    release.send(()).unwrap();
    let stored = big_read.await.unwrap().unwrap().unwrap();
    assert_eq!(members(&stored), [b"new".to_vec()]);
    let live = big_live.await.unwrap().unwrap();
    assert_eq!(live, Some(b"new".to_vec()));
}
