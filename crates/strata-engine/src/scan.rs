//! Ordered scans over the keyspace of all tiers, with a resumable cursor.

use bytes::Bytes;
use rocksdb::ReadOptions;
use strata_format::{BlockRef, WarmRecord};

use crate::engine::Engine;
use crate::warm::{CF_DATA, CF_INDEX};
use crate::{Result, Tier};

/// One key found by a scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanItem {
    pub key: Bytes,
    /// Warm or cold: where the durable copy lives.
    pub tier: Tier,
    pub expire_ms: u64,
    pub value_len: u64,
}

/// A page of a scan; pass `next` back as the start to continue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanPage {
    pub items: Vec<ScanItem>,
    /// The first key not yet returned, or `None` when the range is exhausted.
    pub next: Option<Bytes>,
}

/// The smallest key greater than every key starting with `prefix`, if any.
pub(crate) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

impl Engine {
    /// Up to `count_max` live keys in `[start, end)` in key order, merged from the warm and
    /// cold tiers under one RocksDB snapshot (a key moving between tiers is seen once).
    pub fn scan(&self, start: &[u8], end: Option<&[u8]>, count_max: usize) -> Result<ScanPage> {
        let inner = &self.inner;
        let db = &inner.warm.db;
        let snap = db.snapshot();
        let now = inner.now_ms();
        let mk = |cf| {
            let mut ro = ReadOptions::default();
            ro.set_snapshot(&snap);
            if let Some(e) = end {
                ro.set_iterate_upper_bound(e.to_vec());
            }
            let mut it = db.raw_iterator_cf_opt(inner.warm.cf(cf), ro);
            it.seek(start);
            it
        };
        let mut warm = mk(CF_DATA);
        let mut cold = mk(CF_INDEX);
        let mut page = ScanPage::default();
        loop {
            let take_warm = match (warm.valid(), cold.valid()) {
                (false, false) => break,
                (true, false) => true,
                (false, true) => false,
                (true, true) => warm.key() <= cold.key(),
            };
            let (key, item) = if take_warm {
                let k = warm.key().expect("valid");
                let rec = WarmRecord::decode_unverified(warm.value().expect("valid"))?;
                let item = (rec.expire_ms, rec.value_len(), Tier::Warm);
                (k, item)
            } else {
                let k = cold.key().expect("valid");
                let r = BlockRef::decode(cold.value().expect("valid"))?;
                (k, (r.expire_ms, r.value_len as u64, Tier::Cold))
            };
            if page.items.len() >= count_max {
                page.next = Some(Bytes::copy_from_slice(key));
                break;
            }
            let (expire_ms, value_len, tier) = item;
            if expire_ms == 0 || expire_ms > now {
                page.items.push(ScanItem {
                    key: Bytes::copy_from_slice(key),
                    tier,
                    expire_ms,
                    value_len,
                });
            }
            if take_warm {
                warm.next();
            } else {
                cold.next();
            }
        }
        warm.status()?;
        cold.status()?;
        Ok(page)
    }

    /// A page of keys starting with `prefix`, resuming at `cursor` (a previous page's `next`).
    pub fn scan_prefix(
        &self,
        prefix: &[u8],
        cursor: Option<&[u8]>,
        count_max: usize,
    ) -> Result<ScanPage> {
        let end = prefix_end(prefix);
        let start = cursor.filter(|c| *c > prefix).unwrap_or(prefix);
        self.scan(start, end.as_deref(), count_max)
    }
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    #[test]
    fn prefix_end_carries_over_ff() {
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(&[b'a', 0xff]), Some(vec![b'b']));
        assert_eq!(prefix_end(&[0xff, 0xff]), None);
        assert_eq!(prefix_end(b""), None);
    }
}
