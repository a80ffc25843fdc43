//! Keys whose moves between tiers someone watches: the KV-cache pool's chunks (`kvc:`),
//! whose event feed announces each chunk in its tier. A commit that deletes such a key, a
//! demotion that moves it to the object store and a return that brings it back each hand
//! the watcher a [`TierChange`] after the change is committed, never waiting: past the
//! channel's bound the change is dropped and counted.

use std::sync::atomic::{AtomicU64, Ordering};

use strata_format::Key;
use tokio::sync::mpsc;

/// What happened to a watched key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// Deleted (by a command, its expiry, or a slot moving away).
    Deleted,
    /// Moved from the warm store to the object store.
    Demoted,
    /// Read back from the object store into the warm store.
    Returned,
}

/// One change of a watched key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierChange {
    pub key: Key,
    pub what: Move,
}

/// The watch: keys starting with `prefix` (as clients name them), changes sent on `tx`.
pub(crate) struct TierWatch {
    prefix: Vec<u8>,
    tx: mpsc::Sender<TierChange>,
    pub(crate) dropped: AtomicU64,
}

impl TierWatch {
    pub(crate) fn new(prefix: &[u8], bound: usize) -> (TierWatch, mpsc::Receiver<TierChange>) {
        let (tx, rx) = mpsc::channel(bound.max(1));
        let w = TierWatch {
            prefix: prefix.to_vec(),
            tx,
            dropped: AtomicU64::new(0),
        };
        (w, rx)
    }

    /// Hands the watcher `what` happened to `key`, if it is watched.
    pub(crate) fn note(&self, key: &Key, what: Move) {
        if !key.client().starts_with(&self.prefix) {
            return;
        }
        let change = TierChange {
            key: key.clone(),
            what,
        };
        if let Err(mpsc::error::TrySendError::Full(_)) = self.tx.try_send(change) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_watched_keys_are_handed_over_and_a_full_channel_drops_and_counts() {
        let (w, mut rx) = TierWatch::new(b"kvc:", 1);
        w.note(&Key::new(0, 0, b"other"), Move::Deleted);
        w.note(&Key::new(0, 0, b"kvc:a"), Move::Demoted);
        w.note(&Key::new(0, 0, b"kvc:b"), Move::Returned);
        let got = rx.try_recv().unwrap();
        assert_eq!((got.key.client(), got.what), (&b"kvc:a"[..], Move::Demoted));
        assert!(rx.try_recv().is_err());
        assert_eq!(w.dropped.load(Ordering::Relaxed), 1);
    }
}
