//! `WATCH` support: versions of the keys some client watches, bumped by every write.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use strata_engine::Key;

#[derive(Default)]
pub(crate) struct WatchRegistry {
    /// stored key -> (version, number of clients watching it).
    keys: Mutex<HashMap<Bytes, (u64, usize)>>,
    watched: AtomicUsize,
    /// Bumped by FLUSHALL/FLUSHDB: every watch taken before it fails.
    epoch: AtomicU64,
}

/// Most keys one client may watch at once.
pub(crate) const WATCHED_KEYS_MAX: usize = 100_000;

/// What one client watches: keys with the versions seen at `WATCH` time.
#[derive(Default)]
pub(crate) struct Watched {
    pub(crate) keys: HashMap<Bytes, u64>,
    pub(crate) epoch: u64,
}

impl WatchRegistry {
    /// Watches `keys` for `w`, unless that would take it past [`WATCHED_KEYS_MAX`] keys
    /// (then nothing changes and the answer is false).
    pub(crate) fn watch(&self, w: &mut Watched, keys: &[Key]) -> bool {
        let new = keys
            .iter()
            .filter(|k| !w.keys.contains_key(k.stored()))
            .count();
        if w.keys.len() + new > WATCHED_KEYS_MAX {
            return false;
        }
        if w.keys.is_empty() {
            w.epoch = self.epoch.load(Ordering::Acquire);
        }
        let mut m = self.keys.lock();
        for key in keys {
            let key = Bytes::copy_from_slice(key.stored());
            if w.keys.contains_key(&key) {
                continue;
            }
            let e = m.entry(key.clone()).or_insert((0, 0));
            e.1 += 1;
            w.keys.insert(key, e.0);
            self.watched.fetch_add(1, Ordering::Release);
        }
        true
    }

    /// Whether nothing watched by `w` changed since it was watched.
    pub(crate) fn unchanged(&self, w: &Watched) -> bool {
        if w.keys.is_empty() {
            return true;
        }
        if self.epoch.load(Ordering::Acquire) != w.epoch {
            return false;
        }
        let m = self.keys.lock();
        w.keys
            .iter()
            .all(|(k, v)| m.get(k).is_some_and(|e| e.0 == *v))
    }

    pub(crate) fn unwatch(&self, w: &mut Watched) {
        if w.keys.is_empty() {
            return;
        }
        let mut m = self.keys.lock();
        for (k, _) in w.keys.drain() {
            if let Some(e) = m.get_mut(&k) {
                e.1 -= 1;
                if e.1 == 0 {
                    m.remove(&k);
                }
            }
            self.watched.fetch_sub(1, Ordering::Release);
        }
    }

    /// Whether no client watches anything (then writes need not say what they touch).
    pub(crate) fn idle(&self) -> bool {
        self.watched.load(Ordering::Acquire) == 0
    }

    /// Records a write to `key`. Free when no client watches anything.
    pub(crate) fn touch(&self, key: &Key) {
        if self.idle() {
            return;
        }
        if let Some(e) = self.keys.lock().get_mut(key.stored()) {
            e.0 += 1;
        }
    }

    pub(crate) fn touch_all(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }
}
