//! The warm record: what RocksDB holds for a key in the warm tier.
//!
//! ```text
//! +---------+----------------+---------------+-------------+-------------+
//! | ver: u8 | expire_ms: u64 | write_seq: u64| crc32c: u32 | value bytes |
//! +---------+----------------+---------------+-------------+-------------+
//! crc32c covers key || expire_ms || value, so a record read under another key fails.
//! ```

use crate::{FormatError, Reader, Result};

const WARM_VERSION: u8 = 1;
/// Bytes in front of the value in a warm record.
pub const WARM_HEADER_BYTES: usize = 1 + 8 + 8 + 4;

/// Checksum of one stored entry, shared by warm records and segment entries.
pub fn entry_checksum(key: &[u8], expire_ms: u64, value: &[u8]) -> u32 {
    let c = crc32c::crc32c(key);
    let c = crc32c::crc32c_append(c, &expire_ms.to_le_bytes());
    crc32c::crc32c_append(c, value)
}

/// A decoded warm record, borrowing its value from the stored bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WarmRecord<'a> {
    /// Absolute expiry in Unix milliseconds; 0 means no expiry.
    pub expire_ms: u64,
    /// Engine-wide write sequence of the write that stored this record; demotion uses it to
    /// tell whether a record changed after it was packed.
    pub write_seq: u64,
    pub value: &'a [u8],
}

impl<'a> WarmRecord<'a> {
    /// Encodes a record for `key` into a fresh buffer.
    pub fn encode(key: &[u8], expire_ms: u64, write_seq: u64, value: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(WARM_HEADER_BYTES + value.len());
        out.push(WARM_VERSION);
        out.extend_from_slice(&expire_ms.to_le_bytes());
        out.extend_from_slice(&write_seq.to_le_bytes());
        out.extend_from_slice(&entry_checksum(key, expire_ms, value).to_le_bytes());
        out.extend_from_slice(value);
        out
    }

    /// Decodes and verifies a record stored under `key`.
    pub fn decode(key: &[u8], bytes: &'a [u8]) -> Result<Self> {
        let rec = Self::decode_unverified(bytes)?;
        let stored = u32::from_le_bytes(bytes[17..21].try_into().expect("4 bytes"));
        if stored != entry_checksum(key, rec.expire_ms, rec.value) {
            return Err(FormatError::Checksum {
                what: "warm record",
            });
        }
        Ok(rec)
    }

    /// Decodes the header without checking the checksum (for scans that skip the value).
    pub fn decode_unverified(bytes: &'a [u8]) -> Result<Self> {
        let mut r = Reader::new(bytes, "warm record");
        let ver = r.u8()?;
        if ver != WARM_VERSION {
            return Err(FormatError::Bad {
                what: "warm record",
                detail: format!("version {ver}"),
            });
        }
        let expire_ms = r.u64()?;
        let write_seq = r.u64()?;
        let _crc = r.u32()?;
        Ok(WarmRecord {
            expire_ms,
            write_seq,
            value: &bytes[WARM_HEADER_BYTES..],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warm_record_round_trips_and_binds_key() {
        let enc = WarmRecord::encode(b"k", 42, 7, b"value");
        let rec = WarmRecord::decode(b"k", &enc).unwrap();
        assert_eq!(
            (rec.expire_ms, rec.write_seq, rec.value),
            (42, 7, &b"value"[..])
        );
        assert_eq!(
            WarmRecord::decode(b"other", &enc),
            Err(FormatError::Checksum {
                what: "warm record"
            })
        );
    }

    #[test]
    fn warm_record_detects_flipped_bit_and_truncation() {
        let mut enc = WarmRecord::encode(b"k", 0, 1, b"value");
        let last = enc.len() - 1;
        enc[last] ^= 1;
        assert!(WarmRecord::decode(b"k", &enc).is_err());
        assert!(matches!(
            WarmRecord::decode(b"k", &enc[..5]),
            Err(FormatError::Truncated { .. })
        ));
    }
}
