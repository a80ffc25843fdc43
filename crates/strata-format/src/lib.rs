//! Byte formats of everything Strata stores, and nothing else.
//!
//! This crate encodes and decodes:
//! - the key layout ([`keys`], [`Key`]): database, slot and client key as the warm store
//!   holds them, the keys of a value's parts, sortable scores, expiry keys, cluster slots;
//! - [`WarmRecord`]: the value stored in RocksDB for a key in the warm tier;
//! - [`BlockRef`]: the cold-tier index entry (`key -> segment, block`) kept in RocksDB;
//! - segments: immutable objects of zstd-compressed blocks with a footer
//!   ([`SegmentBuilder`], [`decode_block`], [`decode_footer`]);
//! - value-log entry headers ([`encode_log_header`]);
//! - the values of the other kinds ([`Kind`]): [`hash`], [`members`] (sets, lists), [`zset`],
//!   and the hot log's changes to them ([`delta`]); large hashes and sets as [`parts`].
//!
//! It does no I/O and knows nothing about RocksDB or object stores. Every checksum covers
//! the key, so a record read back under the wrong key, or a block fetched from the wrong
//! place, is detected rather than returned. Layouts are drawn in `docs/formats.md`.
//!
//! ```
//! use strata_format::{Kind, SegmentBuilder, decode_block, find_in_block};
//! let mut b = SegmentBuilder::new(7, 64 * 1024, 3);
//! b.push(Kind::String, b"user:1", b"alice", 0).unwrap();
//! let seg = b.finish().unwrap();
//! let r = &seg.refs[0];
//! let raw = &seg.bytes[r.1.offset as usize..(r.1.offset + r.1.len as u64) as usize];
//! let block = decode_block(&r.1, raw).unwrap();
//! let entry = find_in_block(&block, b"user:1").unwrap().unwrap();
//! assert_eq!(entry.value, b"alice");
//! ```

mod block;
pub mod bucket_log;
pub mod delta;
pub mod dump;
pub mod hash;
pub mod keys;
pub mod members;
pub mod parts;
mod record;
pub mod segment_ids;
pub mod zset;

pub use block::{
    decode_block, decode_footer, find_in_block, iter_block, BlockEntry, BlockRef, Footer,
    FooterBlock, Segment, SegmentBuilder, FOOTER_TRAILER_BYTES,
};
pub use keys::{Key, STORED_KEY_BYTES_MAX};
pub use record::{
    decode_log_header, encode_log_header, entry_checksum, Kind, LogHeader, Parted, ValuePointer,
    WarmRecord, WarmValue, LOG_HEADER_BYTES, WARM_HEADER_BYTES,
};

/// Largest key a client may use (Redis allows 512 MiB keys; nothing real needs more).
pub const KEY_BYTES_MAX: usize = 64 * 1024;
/// Largest value Strata stores; matches Redis's default `proto-max-bulk-len`.
pub const VALUE_BYTES_MAX: usize = 512 * 1024 * 1024;

/// Whether something expiring at `expire_ms` (absolute Unix milliseconds; 0: never) is
/// still live at `now_ms`.
pub fn is_live(expire_ms: u64, now_ms: u64) -> bool {
    expire_ms == 0 || expire_ms > now_ms
}

/// A decoding failure: the bytes are not what the writer wrote.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum FormatError {
    #[error("truncated {what}: need {need} bytes, have {have}")]
    Truncated {
        what: &'static str,
        need: usize,
        have: usize,
    },
    #[error("checksum mismatch in {what}")]
    Checksum { what: &'static str },
    #[error("bad {what}: {detail}")]
    Bad { what: &'static str, detail: String },
    #[error("{what} too large: {len} bytes, limit {max}")]
    TooLarge {
        what: &'static str,
        len: usize,
        max: usize,
    },
}

pub type Result<T> = std::result::Result<T, FormatError>;

/// The first encoding of a collection value (hash, set, list, sorted set): fixed-width
/// lengths (`u32`) and, in a hash, an expiry (`u64`) in front of every field. Still read.
pub(crate) const COLLECTION_V1: u8 = 1;
/// The encoding written now: the item count and every length a varint, a hash field's
/// expiry only where it has one (16 bytes in front of a field became 2 for short ones).
pub(crate) const COLLECTION_V2: u8 = 2;

/// A buffer for a collection value of `count` items and about `bytes` bytes in all, its
/// header (version byte, item count) written in the current encoding ([`COLLECTION_V2`]).
/// The items follow as [`hash::put_field`] or [`members::put_member`] write them.
pub fn collection_buf(count: usize, bytes: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes);
    out.push(COLLECTION_V2);
    put_varint(&mut out, count as u64);
    out
}

/// Where the items of the collection value `b` start and how many there are, when it is
/// in the current encoding ([`COLLECTION_V2`]; `None` for the first). The count is checked
/// against the bytes left (at least one an item); the items are not read.
pub fn collection_items(b: &[u8]) -> Result<Option<(usize, usize)>> {
    let mut r = Reader::new(b, "collection");
    let (ver, count) = r.collection_header(|_| 1)?;
    Ok((ver == COLLECTION_V2).then(|| (count, b.len() - r.remaining())))
}

/// Appends `v` as a varint (LEB128: seven bits a byte, the low ones first, the high bit set
/// on every byte but the last).
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A length with a flag in its low bit, written as one varint: a hash field's name and
/// whether it has an expiry, a sorted-set member and whether its score is whole.
pub(crate) fn flagged(len: usize, flag: bool) -> u64 {
    (len as u64) << 1 | u64::from(flag)
}

/// Bytes [`put_varint`] writes for `v`.
pub fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// A little-endian reader over a byte slice that reports truncation instead of panicking.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], what: &'static str) -> Self {
        Reader { buf, pos: 0, what }
    }
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.remaining() < n {
            return Err(FormatError::Truncated {
                what: self.what,
                need: n,
                have: self.remaining(),
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.bytes(1)?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(
            self.bytes(2)?.try_into().expect("2 bytes"),
        ))
    }
    pub(crate) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.bytes(4)?.try_into().expect("4 bytes"),
        ))
    }
    /// A varint ([`put_varint`]); one written longer than it needs to be is refused, so a
    /// value has one encoding.
    #[inline]
    pub(crate) fn varint(&mut self) -> Result<u64> {
        // Most lengths are under 128: one byte, read without the loop.
        if let Some(&b) = self.buf.get(self.pos) {
            if b < 0x80 {
                self.pos += 1;
                return Ok(u64::from(b));
            }
        }
        self.long_varint()
    }
    /// [`Reader::varint`] of two bytes or more, or of none left.
    fn long_varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.u8()?;
            // The tenth byte holds bit 63 alone.
            let fits = i < 9 || b <= 1;
            if !fits || (i > 0 && b == 0) {
                return Err(FormatError::Bad {
                    what: self.what,
                    detail: "a malformed varint".into(),
                });
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        unreachable!("the tenth byte ends the varint or is refused")
    }
    /// A length written as a varint.
    #[inline]
    pub(crate) fn len(&mut self) -> Result<usize> {
        let v = self.varint()?;
        usize::try_from(v).map_err(|_| FormatError::Bad {
            what: self.what,
            detail: format!("length {v}"),
        })
    }
    /// A length and its flag, written as one varint ([`flagged`]).
    pub(crate) fn flagged_len(&mut self) -> Result<(usize, bool)> {
        let v = self.varint()?;
        Ok((usize::try_from(v >> 1).unwrap_or(usize::MAX), v & 1 == 1))
    }
    /// The header of a collection value: its version byte ([`COLLECTION_V1`] or
    /// [`COLLECTION_V2`]) and its item count, which must fit the bytes left at `item_bytes_min`
    /// bytes per item in that version (so a lying count cannot make the caller allocate).
    pub(crate) fn collection_header(
        &mut self,
        item_bytes_min: impl Fn(u8) -> usize,
    ) -> Result<(u8, usize)> {
        let ver = self.u8()?;
        let count = match ver {
            COLLECTION_V1 => self.u32()? as usize,
            COLLECTION_V2 => self.len()?,
            _ => {
                return Err(FormatError::Bad {
                    what: self.what,
                    detail: format!("version {ver}"),
                })
            }
        };
        if count > self.remaining() / item_bytes_min(ver) {
            return Err(FormatError::Bad {
                what: self.what,
                detail: format!("{count} items in {} bytes", self.remaining()),
            });
        }
        Ok((ver, count))
    }
    /// Fails unless every byte was read.
    pub(crate) fn finish(&self) -> Result<()> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(FormatError::Bad {
                what: self.what,
                detail: format!("{n} bytes after the last item"),
            }),
        }
    }
    pub(crate) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.bytes(8)?.try_into().expect("8 bytes"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip_and_have_one_encoding_each() {
        for v in [
            0,
            1,
            127,
            128,
            300,
            16_383,
            16_384,
            u32::MAX as u64,
            u64::MAX,
        ] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out.len(), varint_len(v), "{v}");
            let mut r = Reader::new(&out, "varint");
            assert_eq!(r.varint().unwrap(), v);
            r.finish().unwrap();
            for cut in 0..out.len() {
                assert!(Reader::new(&out[..cut], "varint").varint().is_err());
            }
        }
        assert_eq!(varint_len(127), 1);
        assert_eq!(varint_len(128), 2);
        // 1 written in two bytes; a tenth byte past bit 63; eleven bytes.
        for bad in [
            &[0x81u8, 0x00][..],
            &[0xff; 9].iter().chain(&[0x02]).copied().collect::<Vec<_>>(),
            &[0x80; 11],
        ] {
            assert!(Reader::new(bad, "varint").varint().is_err(), "{bad:?}");
        }
    }
}
