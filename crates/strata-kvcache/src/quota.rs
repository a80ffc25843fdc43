//! Quotas per namespace: the bytes each namespace's chunks take on this node (every tier
//! counted), its chunks from least to most recently used, and the quota that caps it.
//!
//! Each namespace has a lock of its own, and every operation on it is a constant number of
//! hash-map steps (a linked hash map keeps the order of use), so a write costs the same
//! however many chunks a namespace holds and never waits for another namespace. A chunk
//! stored that takes its namespace past its quota hands back the namespace's least
//! recently used chunks, already taken off the ledger, for the caller to delete: a
//! namespace over its quota gives up its own chunks, never another's. A namespace without
//! a quota is only counted.
//!
//! `K` is how the caller names a chunk (the server: its stored key).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

use hashlink::LinkedHashMap;
use parking_lot::{Mutex, RwLock};

/// Longest namespace a quota may be saved for (a namespace is a short id).
pub const NAMESPACE_BYTES_MAX: usize = 1024;

/// One namespace's ledger, behind its own lock.
type SpaceCell<K> = Arc<Mutex<Space<K>>>;

/// The ledger of every namespace.
pub struct Quotas<K> {
    spaces: RwLock<HashMap<Vec<u8>, SpaceCell<K>>>,
}

/// One namespace: its quota (0: none), the bytes its chunks take, the chunks oldest use
/// first, and how many were dropped for the quota.
struct Space<K> {
    quota: u64,
    used: u64,
    chunks: LinkedHashMap<K, u64>,
    dropped: u64,
}

/// What a namespace holds, for `INFO`, `/metrics` and `KVC.QUOTA`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpaceFigures {
    pub namespace: Vec<u8>,
    /// 0: no quota.
    pub quota: u64,
    pub used_bytes: u64,
    pub chunks: u64,
    /// Chunks dropped because the namespace was over its quota, since the start.
    pub dropped: u64,
}

impl SpaceFigures {
    /// The namespace as `INFO` and `/metrics` name it: its bytes, each one outside
    /// `[A-Za-z0-9._-]` shown as `_`.
    pub fn label(&self) -> String {
        self.namespace
            .iter()
            .map(|&b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-' => b as char,
                _ => '_',
            })
            .collect()
    }
}

impl<K: Hash + Eq + Clone> Default for Quotas<K> {
    fn default() -> Self {
        Quotas {
            spaces: RwLock::new(HashMap::new()),
        }
    }
}

impl<K> Space<K> {
    fn figures(&self, ns: &[u8]) -> SpaceFigures {
        SpaceFigures {
            namespace: ns.to_vec(),
            quota: self.quota,
            used_bytes: self.used,
            chunks: self.chunks.len() as u64,
            dropped: self.dropped,
        }
    }
}

impl<K: Hash + Eq + Clone> Space<K> {
    /// Takes the least recently used chunks off until the namespace is within its quota.
    fn over_quota(&mut self) -> Vec<K> {
        let mut victims = Vec::new();
        while self.quota > 0 && self.used > self.quota {
            let Some((k, bytes)) = self.chunks.pop_front() else {
                break;
            };
            self.used -= bytes;
            self.dropped += 1;
            victims.push(k);
        }
        victims
    }
}

impl<K: Hash + Eq + Clone> Quotas<K> {
    /// Namespace `ns`'s ledger, made on first use.
    fn space(&self, ns: &[u8]) -> SpaceCell<K> {
        if let Some(s) = self.spaces.read().get(ns) {
            return Arc::clone(s);
        }
        let mut all = self.spaces.write();
        let s = all.entry(ns.to_vec()).or_insert_with(|| {
            Arc::new(Mutex::new(Space {
                quota: 0,
                used: 0,
                chunks: LinkedHashMap::new(),
                dropped: 0,
            }))
        });
        Arc::clone(s)
    }

    /// Chunks `stored` (each with its bytes) of namespace `ns` were written: they count,
    /// as its most recently used. Returns the chunks to drop to bring `ns` within its
    /// quota (already off the ledger), least recently used first.
    pub fn stored(&self, ns: &[u8], stored: impl IntoIterator<Item = (K, u64)>) -> Vec<K> {
        let space = self.space(ns);
        let mut s = space.lock();
        for (k, bytes) in stored {
            if let Some(old) = s.chunks.remove(&k) {
                s.used -= old;
            }
            s.used += bytes;
            s.chunks.insert(k, bytes);
        }
        s.over_quota()
    }

    /// Chunks `read` of namespace `ns` were used: they become its most recently used.
    pub fn used<'a>(&self, ns: &[u8], read: impl IntoIterator<Item = &'a K>)
    where
        K: 'a,
    {
        let Some(space) = self.spaces.read().get(ns).cloned() else {
            return;
        };
        let mut s = space.lock();
        for k in read {
            s.chunks.to_back(k);
        }
    }

    /// Chunk `k` of namespace `ns` is gone (deleted, expired, moved to another node).
    pub fn removed(&self, ns: &[u8], k: &K) {
        let Some(space) = self.spaces.read().get(ns).cloned() else {
            return;
        };
        let mut s = space.lock();
        if let Some(bytes) = s.chunks.remove(k) {
            s.used -= bytes;
        }
    }

    /// Sets namespace `ns`'s quota (0: none). Returns the chunks to drop to bring it
    /// within the new quota, as [`Quotas::stored`] does.
    pub fn set_quota(&self, ns: &[u8], bytes: u64) -> Vec<K> {
        let space = self.space(ns);
        let mut s = space.lock();
        s.quota = bytes;
        s.over_quota()
    }

    /// Every chunk `gone` says is gone (a whole database flushed) off the ledger; the
    /// quotas stay.
    pub fn forget(&self, gone: impl Fn(&K) -> bool) {
        for space in self.spaces.read().values() {
            let mut s = space.lock();
            let before = s.chunks.len();
            s.chunks.retain(|k, _| !gone(k));
            if s.chunks.len() != before {
                s.used = s.chunks.values().sum();
            }
        }
    }

    /// Namespace `ns`'s figures (zeros for one never seen).
    pub fn figures_of(&self, ns: &[u8]) -> SpaceFigures {
        match self.spaces.read().get(ns) {
            Some(s) => s.lock().figures(ns),
            None => SpaceFigures {
                namespace: ns.to_vec(),
                ..Default::default()
            },
        }
    }

    /// Every namespace's figures, in namespace order.
    pub fn figures(&self) -> Vec<SpaceFigures> {
        let mut out: Vec<SpaceFigures> = self
            .spaces
            .read()
            .iter()
            .map(|(ns, s)| s.lock().figures(ns))
            .collect();
        out.sort_by(|a, b| a.namespace.cmp(&b.namespace));
        out
    }

    /// Every quota set, to be saved (see [`encode_quotas`]).
    pub fn quotas(&self) -> Vec<(Vec<u8>, u64)> {
        self.figures()
            .into_iter()
            .filter(|f| f.quota > 0)
            .map(|f| (f.namespace, f.quota))
            .collect()
    }
}

/// The saved form of the quotas: per namespace, its length (u16 LE), the namespace and the
/// quota (u64 LE).
pub fn encode_quotas(quotas: &[(Vec<u8>, u64)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (ns, bytes) in quotas {
        out.extend_from_slice(&(ns.len() as u16).to_le_bytes());
        out.extend_from_slice(ns);
        out.extend_from_slice(&bytes.to_le_bytes());
    }
    out
}

/// The quotas [`encode_quotas`] saved; `None` if the bytes are not its form.
pub fn decode_quotas(mut saved: &[u8]) -> Option<Vec<(Vec<u8>, u64)>> {
    let mut out = Vec::new();
    while !saved.is_empty() {
        let len = u16::from_le_bytes(saved.get(..2)?.try_into().ok()?) as usize;
        let ns = saved.get(2..2 + len)?.to_vec();
        let bytes = u64::from_le_bytes(saved.get(2 + len..10 + len)?.try_into().ok()?);
        out.push((ns, bytes));
        saved = &saved[10 + len..];
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_over_its_quota_drops_its_own_least_recently_used_chunks() {
        let q: Quotas<u32> = Quotas::default();
        assert!(q.set_quota(b"noisy", 300).is_empty());
        assert!(q.stored(b"quiet", [(100, 500), (101, 500)]).is_empty());
        assert!(q
            .stored(b"noisy", [(1, 100), (2, 100), (3, 100)])
            .is_empty());
        q.used(b"noisy", [&1]);
        // 4 takes noisy past 300: its least recently used chunk (2, since 1 was read) goes.
        assert_eq!(q.stored(b"noisy", [(4, 100)]), vec![2]);
        let noisy = q.figures_of(b"noisy");
        assert_eq!((noisy.used_bytes, noisy.chunks, noisy.dropped), (300, 3, 1));
        // The namespace without a quota is untouched.
        assert_eq!(q.figures_of(b"quiet").used_bytes, 1000);
        // A lower quota drops at once, oldest use first.
        assert_eq!(q.set_quota(b"noisy", 100), vec![3, 1]);
        assert_eq!(q.figures_of(b"noisy").used_bytes, 100);
    }

    #[test]
    fn rewrites_and_removals_keep_the_count_exact() {
        let q: Quotas<u32> = Quotas::default();
        q.stored(b"a", [(1, 10), (2, 20)]);
        q.stored(b"a", [(1, 15)]);
        q.removed(b"a", &2);
        q.removed(b"a", &2);
        q.removed(b"never", &2);
        assert_eq!(q.figures_of(b"a").used_bytes, 15);
        q.stored(b"b", [(7, 5), (8, 5)]);
        q.forget(|k| *k == 7 || *k == 1);
        assert_eq!(q.figures_of(b"a").used_bytes, 0);
        assert_eq!(q.figures_of(b"b").used_bytes, 5);
    }

    #[test]
    fn a_chunk_larger_than_the_quota_is_dropped_itself() {
        let q: Quotas<u32> = Quotas::default();
        q.set_quota(b"a", 10);
        assert_eq!(q.stored(b"a", [(1, 11)]), vec![1]);
        assert_eq!(q.figures_of(b"a").used_bytes, 0);
    }

    #[test]
    fn saved_quotas_read_back() {
        let q: Quotas<u32> = Quotas::default();
        q.set_quota(b"m1", 1 << 30);
        q.set_quota(b"m2", 5);
        q.set_quota(b"gone", 7);
        q.set_quota(b"gone", 0);
        let saved = encode_quotas(&q.quotas());
        assert_eq!(
            decode_quotas(&saved).unwrap(),
            vec![(b"m1".to_vec(), 1 << 30), (b"m2".to_vec(), 5)]
        );
        assert_eq!(decode_quotas(&saved[..saved.len() - 1]), None);
    }
}
