//! `WATCH` support: versions of the keys some client watches, bumped by every write.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use strata_engine::Key;

#[derive(Default)]
pub(crate) struct WatchRegistry {
    /// stored key -> (version, number of clients watching it).
    keys: Mutex<HashMap<Bytes, (u64, usize)>>,
    watched: AtomicUsize,
}

/// Most keys one client may watch at once.
pub(crate) const WATCHED_KEYS_MAX: usize = 100_000;

/// One watched key as `WATCH` saw it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen {
    /// The key's version.
    pub(crate) version: u64,
    /// When the key, live then, expires (0: never, or it did not exist): as in Redis, a
    /// watched key that expires counts as changed.
    pub(crate) expire_ms: u64,
}

/// What one client watches: keys (stored) as `WATCH` saw them.
#[derive(Default)]
pub(crate) struct Watched {
    pub(crate) keys: HashMap<Bytes, Seen>,
}

impl WatchRegistry {
    /// Watches `keys` for `w`, each with its expiry (0: none, or absent), unless that would
    /// take it past [`WATCHED_KEYS_MAX`] keys (then nothing changes and the answer is
    /// false).
    pub(crate) fn watch(&self, w: &mut Watched, keys: &[(Key, u64)]) -> bool {
        let new = keys
            .iter()
            .filter(|(k, _)| !w.keys.contains_key(k.stored()))
            .count();
        if w.keys.len() + new > WATCHED_KEYS_MAX {
            return false;
        }
        let mut m = self.keys.lock();
        for (key, expire_ms) in keys {
            let key = Bytes::copy_from_slice(key.stored());
            if w.keys.contains_key(&key) {
                continue;
            }
            let e = m.entry(key.clone()).or_insert((0, 0));
            e.1 += 1;
            let seen = Seen {
                version: e.0,
                expire_ms: *expire_ms,
            };
            w.keys.insert(key, seen);
            self.watched.fetch_add(1, Ordering::Release);
        }
        true
    }

    /// Whether nothing watched by `w` changed (was written, or expired) since it was
    /// watched, at `now_ms`.
    pub(crate) fn unchanged(&self, w: &Watched, now_ms: u64) -> bool {
        if w.keys.is_empty() {
            return true;
        }
        let m = self.keys.lock();
        w.keys.iter().all(|(k, seen)| {
            m.get(k).is_some_and(|e| e.0 == seen.version)
                && strata_format::is_live(seen.expire_ms, now_ms)
        })
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

    /// The watched keys of stored database `db` (every database: `None`), for a change of
    /// a whole database: `FLUSHDB` touches those that exist, `SWAPDB` all of them.
    pub(crate) fn watched_in(&self, db: Option<u8>) -> Vec<Key> {
        if self.idle() {
            return Vec::new();
        }
        self.keys
            .lock()
            .keys()
            .filter_map(|k| Key::from_stored(k).ok())
            .filter(|k| db.is_none_or(|db| k.db() == db))
            .collect()
    }
}
