//! Pins: key patterns whose keys stay in the warm tier (never demoted). A pattern with
//! glob characters (`*`, `?`, `[`) is a glob; otherwise it is a prefix. Pins persist in the
//! meta column family and are bounded by `pinned_bytes_max`.

use bytes::Bytes;
use rocksdb::WriteBatch;

use crate::engine::Inner;
use crate::glob::{glob_match, literal_prefix};
use crate::warm::CF_META;
use crate::{Change, Engine, Error, Result, Tier};

const PIN_PREFIX: &[u8] = b"pin/";

fn is_glob(p: &[u8]) -> bool {
    p.iter().any(|c| matches!(c, b'*' | b'?' | b'['))
}

pub(crate) fn pattern_matches(pattern: &[u8], key: &[u8]) -> bool {
    if is_glob(pattern) {
        glob_match(pattern, key)
    } else {
        key.starts_with(pattern)
    }
}

pub(crate) fn load(inner: &Inner) -> Result<Vec<Bytes>> {
    let mut out = Vec::new();
    let mut it = inner.warm.db.raw_iterator_cf(inner.warm.cf(CF_META));
    it.seek(PIN_PREFIX);
    while it.valid() {
        let k = it.key().expect("valid iterator");
        if !k.starts_with(PIN_PREFIX) {
            break;
        }
        out.push(Bytes::copy_from_slice(&k[PIN_PREFIX.len()..]));
        it.next();
    }
    it.status()?;
    Ok(out)
}

impl Inner {
    pub(crate) fn is_pinned(&self, key: &[u8]) -> bool {
        let pins = self.pins.read();
        !pins.is_empty() && pins.iter().any(|p| pattern_matches(p, key))
    }
}

impl Engine {
    /// Keys matching `pattern`, with their tier and value size.
    fn matching(&self, pattern: &[u8]) -> Result<Vec<(Bytes, Tier, u64)>> {
        let prefix = if is_glob(pattern) {
            literal_prefix(pattern)
        } else {
            pattern.to_vec()
        };
        let mut out = Vec::new();
        let mut cursor: Option<Bytes> = None;
        loop {
            let page = self.scan_prefix(&prefix, cursor.as_deref(), 10_000)?;
            out.extend(
                page.items
                    .into_iter()
                    .filter(|i| pattern_matches(pattern, &i.key))
                    .map(|i| (i.key, i.tier, i.value_len)),
            );
            match page.next {
                Some(n) => cursor = Some(n),
                None => return Ok(out),
            }
        }
    }

    /// Pins `pattern`: its keys stay warm from now on, and keys already cold are brought
    /// back. Refused when all pins together would hold more than `pinned_bytes_max`.
    /// Returns the value bytes the pattern holds.
    pub async fn pin(&self, pattern: &[u8]) -> Result<u64> {
        let inner = &self.inner;
        inner.check_writable()?;
        if pattern.is_empty() || pattern.len() > 1024 {
            return Err(Error::Invalid("pin pattern must be 1 to 1024 bytes".into()));
        }
        let keys = self.matching(pattern)?;
        let new_bytes: u64 = keys.iter().map(|k| k.2).sum();
        let mut held = 0u64;
        for p in inner.pins.read().iter().filter(|p| p.as_ref() != pattern) {
            held += self
                .matching(p)?
                .iter()
                .filter(|k| !pattern_matches(pattern, &k.0))
                .map(|k| k.2)
                .sum::<u64>();
        }
        let max = inner.opts.pinned_bytes_max;
        if held + new_bytes > max {
            return Err(Error::Invalid(format!(
                "pin refused: pinned keys would hold {} bytes, over pinned_bytes_max ({max}); unpin something or raise the quota",
                held + new_bytes
            )));
        }
        let mut key = PIN_PREFIX.to_vec();
        key.extend_from_slice(pattern);
        let mut b = WriteBatch::default();
        b.put_cf(inner.warm.cf(CF_META), key, b"");
        inner.warm.write(b, true)?;
        {
            let mut pins = inner.pins.write();
            if !pins.iter().any(|p| p.as_ref() == pattern) {
                pins.push(Bytes::copy_from_slice(pattern));
            }
        }
        for (k, tier, _) in keys.into_iter().filter(|k| k.1 == Tier::Cold) {
            let _ = tier;
            // Rewrite the value into the warm tier, keeping its expiry.
            self.update(&k, true, |cur| match cur {
                Some(c) => {
                    let value = c.value.cloned().expect("value requested");
                    Ok((
                        Some(Change::Put {
                            value,
                            expire_ms: c.expire_ms,
                        }),
                        (),
                    ))
                }
                None => Ok((None, ())),
            })
            .await?;
        }
        Ok(new_bytes)
    }

    /// Removes a pin; returns whether it existed.
    pub fn unpin(&self, pattern: &[u8]) -> Result<bool> {
        let inner = &self.inner;
        let mut key = PIN_PREFIX.to_vec();
        key.extend_from_slice(pattern);
        let mut b = WriteBatch::default();
        b.delete_cf(inner.warm.cf(CF_META), key);
        inner.warm.write(b, true)?;
        let mut pins = inner.pins.write();
        let before = pins.len();
        pins.retain(|p| p.as_ref() != pattern);
        Ok(pins.len() != before)
    }

    /// The current pins.
    pub fn pins(&self) -> Vec<Bytes> {
        self.inner.pins.read().clone()
    }
}
