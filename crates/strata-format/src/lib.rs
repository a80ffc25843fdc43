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
//!   and the hot log's changes to them ([`delta`]).
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
pub mod delta;
pub mod dump;
pub mod hash;
pub mod keys;
pub mod members;
mod record;
pub mod zset;

pub use block::{
    decode_block, decode_footer, find_in_block, iter_block, BlockEntry, BlockRef, Footer,
    FooterBlock, Segment, SegmentBuilder, FOOTER_TRAILER_BYTES,
};
pub use keys::Key;
pub use record::{
    decode_log_header, encode_log_header, entry_checksum, Kind, LogHeader, ValuePointer,
    WarmRecord, WarmValue, LOG_HEADER_BYTES, WARM_HEADER_BYTES,
};

/// Largest key a client may use (Redis allows 512 MiB keys; nothing real needs more).
pub const KEY_BYTES_MAX: usize = 64 * 1024;
/// Largest stored key: a client key with its database and slot.
pub const STORED_KEY_BYTES_MAX: usize = KEY_BYTES_MAX + keys::STORED_KEY_PREFIX_BYTES;
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

/// A buffer for a collection value of `count` items and `bytes` bytes in all, its header
/// (version byte, item count) written.
pub(crate) fn collection_buf(version: u8, count: usize, bytes: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes);
    out.push(version);
    out.extend_from_slice(&(count as u32).to_le_bytes());
    out
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
    /// The header of a collection value: its version byte (which must be `version`) and its
    /// item count, which must fit the bytes left at `item_bytes_min` bytes per item (so a
    /// lying count cannot make the caller allocate).
    pub(crate) fn collection_header(
        &mut self,
        version: u8,
        item_bytes_min: usize,
    ) -> Result<usize> {
        let ver = self.u8()?;
        if ver != version {
            return Err(FormatError::Bad {
                what: self.what,
                detail: format!("version {ver}"),
            });
        }
        let count = self.u32()? as usize;
        if count > self.remaining() / item_bytes_min {
            return Err(FormatError::Bad {
                what: self.what,
                detail: format!("{count} items in {} bytes", self.remaining()),
            });
        }
        Ok(count)
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
