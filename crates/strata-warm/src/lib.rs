//! What Strata's engine asks of the store that holds its warm tier, and nothing of how a
//! store does it: named [`Family`]s of ordered keys, atomic [`Batch`]es, [`Cursor`]s,
//! consistent [`View`]s, checkpoints, and a change log readable from any sequence number.
//!
//! What this crate is not: a store. The one implementation Strata ships is `strata-rocks`
//! (RocksDB), the only crate that links the C++ library; the engine, the server and the
//! benchmarks build against this interface alone. What the keys and values of each family
//! mean (the key layout, records, index entries) is the engine's business and is drawn in
//! `docs/formats.md`; a store keeps bytes.
//!
//! ```
//! use strata_warm::{add_i64s, Family};
//! // The one merge rule every store implements for `Family::Meta`: element-wise sums.
//! let a = 5i64.to_le_bytes();
//! let b = (-2i64).to_le_bytes();
//! assert_eq!(add_i64s(Some(&a), [&b[..]].into_iter()), 3i64.to_le_bytes().to_vec());
//! assert_eq!(Family::Records.name(), "records");
//! ```

use std::any::Any;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

/// A family of keys: one ordered keyspace of the store (a RocksDB column family).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// Key → record: a string's value (or where the value log holds it), or the metadata
    /// of a type whose value has parts.
    Records,
    /// Part key → part value: hash fields, set members, sorted-set members, list elements.
    Parts,
    /// Score key → empty: the score index of sorted sets.
    Scores,
    /// Key → where in the object store its value is (a cold index entry).
    Cold,
    /// Expiry time || key → empty: keys in the order they expire.
    Expiry,
    /// The engine's own metadata: counters (under the add merge rule), segment records,
    /// pins, the layout version.
    Meta,
    /// The families of stores written before the key layout carried databases and slots
    /// (layout 1). A store that has none reads them as empty; a store drops them at open once
    /// they are empty (the engine migrates their keys, then deletes them).
    Layout1Data,
    Layout1Index,
    Layout1Ttl,
}

impl Family {
    /// The families of the current layout.
    pub const CURRENT: [Family; 6] = [
        Family::Records,
        Family::Parts,
        Family::Scores,
        Family::Cold,
        Family::Expiry,
        Family::Meta,
    ];
    /// The families of layout 1 (`Meta` is shared by both layouts).
    pub const LAYOUT_1: [Family; 3] = [
        Family::Layout1Data,
        Family::Layout1Index,
        Family::Layout1Ttl,
    ];

    /// The family's name in the store.
    pub fn name(self) -> &'static str {
        match self {
            Family::Records => "records",
            Family::Parts => "parts",
            Family::Scores => "scores",
            Family::Cold => "cold",
            Family::Expiry => "expiry",
            Family::Meta => "meta",
            Family::Layout1Data => "default",
            Family::Layout1Index => "index",
            Family::Layout1Ttl => "ttl",
        }
    }
}

/// A store's failure, by what the caller can do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// Stored bytes are damaged.
    #[error("corruption: {0}")]
    Corruption(String),
    /// The request cannot work (a bad argument, a batch from another store).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The disk is full.
    #[error("no space left: {0}")]
    NoSpace(String),
    /// The change log no longer holds the changes asked for.
    #[error("changes no longer held: {0}")]
    Gone(String),
    /// Any other failure of the store or its disk (I/O errors, a store shut down).
    #[error("{0}")]
    Unavailable(String),
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// A batch of changes applied atomically by [`WarmStore::write`]: after a crash, all of
/// them are there or none.
pub trait Batch: Send {
    fn put(&mut self, family: Family, key: &[u8], value: &[u8]);
    fn delete(&mut self, family: Family, key: &[u8]);
    /// Adds `operand` to the value under `key` by the add merge rule ([`add_i64s`]). Only
    /// for [`Family::Meta`].
    fn merge(&mut self, family: Family, key: &[u8], operand: &[u8]);
    /// Deletes every key in `from .. to`.
    fn delete_range(&mut self, family: Family, from: &[u8], to: &[u8]);
    /// Changes in the batch.
    fn count(&self) -> usize;
    /// For the store that made the batch, to take it back.
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
}

/// An ordered cursor over one family, within the bounds it was made with.
pub trait Cursor {
    fn seek(&mut self, key: &[u8]);
    fn seek_to_first(&mut self);
    /// To the last key within the bounds (for walking backwards with [`Cursor::prev`]).
    fn seek_to_last(&mut self);
    fn valid(&self) -> bool;
    /// The current key; only while [`Cursor::valid`].
    fn key(&self) -> &[u8];
    /// The current value; only while [`Cursor::valid`].
    fn value(&self) -> &[u8];
    fn next(&mut self);
    fn prev(&mut self);
    /// Why the cursor stopped, once it is not valid: `Ok` at the end of its range.
    fn status(&self) -> Result<()>;
}

/// A consistent picture of the store as of the moment it was taken (a snapshot): cursors
/// made with it see no later write.
pub trait View: Send + Sync {
    /// For the store that made the view, to take it back.
    fn as_any(&self) -> &dyn Any;
}

/// Key bounds of a cursor: `lower` included, `upper` excluded; `None` is unbounded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bounds {
    pub lower: Option<Vec<u8>>,
    pub upper: Option<Vec<u8>>,
}

impl Bounds {
    /// Every key.
    pub fn all() -> Bounds {
        Bounds::default()
    }
    /// Every key below `upper` (when given).
    pub fn below(upper: Option<&[u8]>) -> Bounds {
        Bounds {
            lower: None,
            upper: upper.map(<[u8]>::to_vec),
        }
    }
    /// Every key that starts with `prefix`.
    pub fn prefix(prefix: &[u8]) -> Bounds {
        Bounds {
            lower: Some(prefix.to_vec()),
            upper: prefix_end(prefix),
        }
    }
}

/// The smallest key greater than every key that starts with `prefix`, if there is one.
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// One change as the change log holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawChange {
    Put {
        family: Family,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    Delete {
        family: Family,
        key: Vec<u8>,
    },
    Merge {
        family: Family,
        key: Vec<u8>,
        operand: Vec<u8>,
    },
    DeleteRange {
        family: Family,
        from: Vec<u8>,
        to: Vec<u8>,
    },
}

/// The changes of one committed batch. Each change has its own sequence number:
/// `sequence` is the first one's, the next change has `sequence + 1`, and so on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changes {
    pub sequence: u64,
    pub changes: Vec<RawChange>,
}

impl Changes {
    /// The sequence number of the batch's last change.
    pub fn last_sequence(&self) -> u64 {
        self.sequence + (self.changes.len() as u64).saturating_sub(1)
    }
}

/// The store of the warm tier. Every method may be called from many threads at once.
pub trait WarmStore: Send + Sync + 'static {
    /// The value under `key`; a large value is handed out without a copy.
    fn get(&self, family: Family, key: &[u8]) -> Result<Option<Bytes>>;
    /// The values under many keys of one family, in their order.
    fn multi_get(&self, family: Family, keys: &[&[u8]]) -> Vec<Result<Option<Bytes>>>;
    /// An empty batch for [`WarmStore::write`].
    fn batch(&self) -> Box<dyn Batch>;
    /// Applies `batch` atomically. With `sync`, it is durable (on disk, fsynced) when this
    /// returns; without, it survives a crash of the process but not of the machine.
    fn write(&self, batch: Box<dyn Batch>, sync: bool) -> Result<()>;
    /// A cursor over `family` within `bounds`, seeing the store as of `view` (now if none).
    fn cursor<'a>(
        &'a self,
        family: Family,
        bounds: Bounds,
        view: Option<&'a dyn View>,
    ) -> Box<dyn Cursor + 'a>;
    /// A consistent picture of the store as of now.
    fn view(&self) -> Arc<dyn View>;
    /// Makes every write so far durable.
    fn sync_log(&self) -> Result<()>;
    /// Hands log writes buffered in the process to the operating system (no fsync): after
    /// this, a killed process loses none of them. Nothing to do for a store that does not
    /// buffer its log.
    fn flush_log(&self) -> Result<()> {
        Ok(())
    }
    /// Writes what is buffered in memory to the store's files (a faster next open).
    fn flush(&self) -> Result<()>;
    /// Writes a consistent copy of the store into the new directory `dir`.
    fn checkpoint(&self, dir: &Path) -> Result<()>;
    /// The sequence number of the latest committed change (0 in an empty store). Every
    /// write moves it, by the time the write returns: while it has not moved, `sync_log`
    /// has nothing new to sync (the group commit relies on this).
    fn last_sequence(&self) -> u64;
    /// The committed batches that hold changes with sequence numbers above `after`, oldest
    /// first. [`StoreError::Gone`] when the store no longer holds the oldest of them.
    fn changes_after(&self, after: u64) -> Result<Box<dyn Iterator<Item = Result<Changes>> + '_>>;
    /// Bytes of the store's log that recovery dropped at open (a torn or corrupt tail).
    fn log_bytes_dropped_at_open(&self) -> u64;
    /// Bytes of memory the store holds (buffers, caches, indexes), as far as it knows.
    fn memory_bytes(&self) -> u64 {
        0
    }
    /// Of [`WarmStore::memory_bytes`], what writes not yet in the store's files hold (what
    /// [`WarmStore::flush`] lets go).
    fn unflushed_bytes(&self) -> u64 {
        0
    }
    /// What the store's memtables and its block cache may hold now.
    fn memory_shares(&self) -> MemoryShares {
        MemoryShares::default()
    }
    /// Changes what the memtables and the block cache may hold while the store is open (a
    /// memory limit changed at run time). The cache gives up blocks at once; memtables
    /// already full are written out as they would be, and new ones take the new size.
    fn set_memory_shares(&self, _shares: MemoryShares) -> Result<()> {
        Ok(())
    }
}

/// The memory a warm store's caches and write buffers may hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryShares {
    /// All memtables together, about (0: no total, each family's own limit).
    pub memtables_bytes_max: u64,
    /// The block cache every family shares.
    pub block_cache_bytes: u64,
}

/// The add merge rule of [`Family::Meta`]: the existing value and each operand are runs of
/// little-endian `i64`; the result is their element-wise sum (wrapping), as long as the
/// longest of them (missing elements count as 0; trailing bytes short of 8 are ignored).
pub fn add_i64s<'a>(existing: Option<&[u8]>, operands: impl Iterator<Item = &'a [u8]>) -> Vec<u8> {
    fn decode(b: &[u8]) -> impl Iterator<Item = i64> + '_ {
        b.chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
    }
    let mut sum: Vec<i64> = existing.map(|e| decode(e).collect()).unwrap_or_default();
    for op in operands {
        for (i, d) in decode(op).enumerate() {
            match sum.get_mut(i) {
                Some(s) => *s = s.wrapping_add(d),
                None => sum.push(d),
            }
        }
    }
    sum.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(v: &[i64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn add_rule_sums_elementwise_and_extends() {
        let got = add_i64s(
            Some(&enc(&[1, 2])),
            [&enc(&[10, 20, 30])[..], &enc(&[-1])[..]].into_iter(),
        );
        assert_eq!(got, enc(&[10, 22, 30]));
        assert_eq!(add_i64s(None, std::iter::empty()), Vec::<u8>::new());
        assert_eq!(
            add_i64s(None, [&enc(&[i64::MAX])[..], &enc(&[1])[..]].into_iter()),
            enc(&[i64::MIN])
        );
    }

    #[test]
    fn prefix_bounds_end_past_every_extension() {
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(&[b'a', 0xff]), Some(vec![b'b']));
        assert_eq!(prefix_end(&[0xff, 0xff]), None);
        assert_eq!(prefix_end(b""), None);
        let b = Bounds::prefix(b"k:");
        assert_eq!(b.lower.as_deref(), Some(&b"k:"[..]));
        assert_eq!(b.upper.as_deref(), Some(&b"k;"[..]));
    }

    #[test]
    fn family_names_are_distinct() {
        let mut names: Vec<&str> = Family::CURRENT
            .iter()
            .chain(&Family::LAYOUT_1)
            .map(|f| f.name())
            .collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 9);
    }
}
