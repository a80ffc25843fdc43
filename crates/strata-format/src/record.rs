//! The warm record: what RocksDB holds for a key in the warm tier. A value is either inline
//! (version 1) or, when large, in the value log with the record pointing at it (version 2).
//!
//! ```text
//! +---------+----------------+---------------+-------------+-------------+
//! | ver: 1  | expire_ms: u64 | write_seq: u64| crc32c: u32 | value bytes |
//! +---------+----------------+---------------+-------------+-------------+
//! | ver: 2  | expire_ms: u64 | write_seq: u64| crc32c: u32 | file: u64 | offset: u64 | len: u64 |
//! +---------+----------------+---------------+-------------+-------------+
//! crc32c covers key || expire_ms || value in both, so a record read under another key, or
//! a logged value read from the wrong place, fails.
//! ```
//!
//! The version byte's high four bits are the value's [`Kind`] (0 for strings, so records
//! written before other types existed read as strings); for any other kind the checksum
//! also covers the kind's byte.

use crate::{FormatError, Reader, Result};

const INLINE_VERSION: u8 = 1;
const LOGGED_VERSION: u8 = 2;
const PARTED_VERSION: u8 = 3;
/// Bytes in front of the value in a warm record.
pub const WARM_HEADER_BYTES: usize = 1 + 8 + 8 + 4;

/// The Redis type a stored value holds. The engine moves a value's bytes between tiers as
/// they are; what they mean for each kind is the server's encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
#[repr(u8)]
pub enum Kind {
    #[default]
    String = 0,
    Hash = 1,
    Set = 2,
    ZSet = 3,
    List = 4,
    /// A vector set (Redis 8): stored as a hash's fields are, each element's name with its
    /// record (`strata_vector::set::encode_element`).
    VectorSet = 5,
}

impl Kind {
    /// The kind of a stored kind number (the high four bits of a version byte).
    pub fn from_u8(b: u8) -> Result<Kind> {
        Ok(match b {
            0 => Kind::String,
            1 => Kind::Hash,
            2 => Kind::Set,
            3 => Kind::ZSet,
            4 => Kind::List,
            5 => Kind::VectorSet,
            _ => {
                return Err(FormatError::Bad {
                    what: "value kind",
                    detail: format!("kind {b}"),
                })
            }
        })
    }

    /// Whether values of this kind are stored as parts when large: every collection's are.
    pub fn has_parts(self) -> bool {
        matches!(
            self,
            Kind::Hash | Kind::Set | Kind::ZSet | Kind::List | Kind::VectorSet
        )
    }

    /// The name `TYPE` answers.
    pub fn name(self) -> &'static str {
        match self {
            Kind::String => "string",
            Kind::Hash => "hash",
            Kind::Set => "set",
            Kind::ZSet => "zset",
            Kind::List => "list",
            Kind::VectorSet => "vectorset",
        }
    }

    /// A version byte: `base` in the low four bits, the kind in the high four.
    pub(crate) fn tag(self, base: u8) -> u8 {
        base | (self as u8) << 4
    }

    /// Splits a version byte into its base and kind.
    pub(crate) fn untag(b: u8) -> Result<(u8, Kind)> {
        Ok((b & 0x0f, Kind::from_u8(b >> 4)?))
    }
}

/// Checksum of one stored entry, shared by warm records and segment entries: over key,
/// expiry and value, and for a kind other than a string also the kind's byte.
pub fn entry_checksum(kind: Kind, key: &[u8], expire_ms: u64, value: &[u8]) -> u32 {
    let c = crc32c::crc32c(key);
    let c = crc32c::crc32c_append(c, &expire_ms.to_le_bytes());
    let c = crc32c::crc32c_append(c, value);
    match kind {
        Kind::String => c,
        k => crc32c::crc32c_append(c, &[k as u8]),
    }
}

/// Checksum of a parts record: key, expiry, kind, write sequence and where its parts are.
fn parted_checksum(kind: Kind, key: &[u8], expire_ms: u64, write_seq: u64, at: &Parted) -> u32 {
    let mut c = entry_checksum(kind, key, expire_ms, &write_seq.to_le_bytes());
    for v in at.fields(kind) {
        c = crc32c::crc32c_append(c, &v.to_le_bytes());
    }
    c
}

/// Where a logged value lies: value-log file id, byte offset of the value, its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ValuePointer {
    pub file: u64,
    pub offset: u64,
    pub len: u64,
}

/// A warm record's value: in the record itself, or in the value log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarmValue<'a> {
    Inline(&'a [u8]),
    Logged(ValuePointer),
    /// A hash or set stored as parts ([`crate::parts`]).
    Parted(Parted),
}

/// Where a value stored as parts is, and what they add up to: the record's checksum covers
/// these (and the write sequence, so each write's record differs), each part has its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Parted {
    /// The version in every part's key ([`crate::keys::parts_prefix`]).
    pub version: u64,
    /// How many parts there are.
    pub count: u64,
    /// About how many bytes the whole value takes (what the warm tier counts it at).
    pub bytes: u64,
    /// A list's first position ([`crate::parts`]): its parts stand at `head..head +
    /// count`. 0 for the other kinds (not stored).
    pub head: u64,
}

impl Parted {
    /// What the record stores of it for a value of `kind`: the head for a list alone.
    fn fields(&self, kind: Kind) -> impl Iterator<Item = u64> {
        let head = (kind == Kind::List).then_some(self.head);
        [self.version, self.count, self.bytes]
            .into_iter()
            .chain(head)
    }
}

/// A decoded warm record, borrowing an inline value from the stored bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WarmRecord<'a> {
    pub kind: Kind,
    /// Absolute expiry in Unix milliseconds; 0 means no expiry.
    pub expire_ms: u64,
    /// Engine-wide write sequence of the write that stored this record; demotion uses it to
    /// tell whether a record changed after it was packed.
    pub write_seq: u64,
    /// [`entry_checksum`] of key, expiry and value.
    pub checksum: u32,
    pub value: WarmValue<'a>,
}

fn header(ver: u8, expire_ms: u64, write_seq: u64, checksum: u32, extra: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(WARM_HEADER_BYTES + extra);
    out.push(ver);
    out.extend_from_slice(&expire_ms.to_le_bytes());
    out.extend_from_slice(&write_seq.to_le_bytes());
    out.extend_from_slice(&checksum.to_le_bytes());
    out
}

impl<'a> WarmRecord<'a> {
    /// Encodes a record holding `value` (of `kind`) inline, for `key`, into a fresh buffer.
    pub fn encode(kind: Kind, key: &[u8], expire_ms: u64, write_seq: u64, value: &[u8]) -> Vec<u8> {
        let crc = entry_checksum(kind, key, expire_ms, value);
        let ver = kind.tag(INLINE_VERSION);
        let mut out = header(ver, expire_ms, write_seq, crc, value.len());
        out.extend_from_slice(value);
        out
    }

    /// Encodes a record whose value is in the value log at `at`; `checksum` is the
    /// [`entry_checksum`] of key, `expire_ms` and that value.
    pub fn encode_logged(
        kind: Kind,
        expire_ms: u64,
        write_seq: u64,
        checksum: u32,
        at: ValuePointer,
    ) -> Vec<u8> {
        let ver = kind.tag(LOGGED_VERSION);
        let mut out = header(ver, expire_ms, write_seq, checksum, 24);
        for v in [at.file, at.offset, at.len] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out
    }

    /// Encodes a record of a value of `kind` stored as parts (`at`).
    pub fn encode_parted(
        kind: Kind,
        key: &[u8],
        expire_ms: u64,
        write_seq: u64,
        at: Parted,
    ) -> Vec<u8> {
        let crc = parted_checksum(kind, key, expire_ms, write_seq, &at);
        let mut out = header(kind.tag(PARTED_VERSION), expire_ms, write_seq, crc, 32);
        for v in at.fields(kind) {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out
    }

    /// Decodes a record stored under `key`, verifying an inline value. A logged value is
    /// not here to verify: check it with [`WarmRecord::verify`] once it is read.
    pub fn decode(key: &[u8], bytes: &'a [u8]) -> Result<Self> {
        let rec = Self::decode_unverified(bytes)?;
        match rec.value {
            WarmValue::Inline(v) => rec.verify(key, v)?,
            WarmValue::Parted(at)
                if rec.checksum
                    != parted_checksum(rec.kind, key, rec.expire_ms, rec.write_seq, &at) =>
            {
                return Err(FormatError::Checksum {
                    what: "warm record",
                })
            }
            _ => {}
        }
        Ok(rec)
    }

    /// Checks `value` against the record's checksum for `key`.
    pub fn verify(&self, key: &[u8], value: &[u8]) -> Result<()> {
        if self.checksum != entry_checksum(self.kind, key, self.expire_ms, value) {
            return Err(FormatError::Checksum {
                what: "warm record",
            });
        }
        Ok(())
    }

    /// The value's length, wherever it is.
    pub fn value_len(&self) -> u64 {
        match self.value {
            WarmValue::Inline(v) => v.len() as u64,
            WarmValue::Logged(p) => p.len,
            WarmValue::Parted(p) => p.bytes,
        }
    }

    /// Decodes the header without checking the checksum (for scans that skip the value).
    pub fn decode_unverified(bytes: &'a [u8]) -> Result<Self> {
        let mut r = Reader::new(bytes, "warm record");
        let (ver, kind) = Kind::untag(r.u8()?)?;
        let expire_ms = r.u64()?;
        let write_seq = r.u64()?;
        let checksum = r.u32()?;
        let value = match ver {
            INLINE_VERSION => WarmValue::Inline(&bytes[WARM_HEADER_BYTES..]),
            LOGGED_VERSION => {
                let at = ValuePointer {
                    file: r.u64()?,
                    offset: r.u64()?,
                    len: r.u64()?,
                };
                if r.remaining() != 0 {
                    return Err(FormatError::Bad {
                        what: "warm record",
                        detail: format!("{} bytes after a value pointer", r.remaining()),
                    });
                }
                WarmValue::Logged(at)
            }
            PARTED_VERSION => {
                let mut at = Parted {
                    version: r.u64()?,
                    count: r.u64()?,
                    bytes: r.u64()?,
                    head: 0,
                };
                if kind == Kind::List {
                    at.head = r.u64()?;
                }
                if r.remaining() != 0 || !kind.has_parts() {
                    return Err(FormatError::Bad {
                        what: "warm record",
                        detail: format!(
                            "parts record of a {} ({} bytes after)",
                            kind.name(),
                            r.remaining()
                        ),
                    });
                }
                WarmValue::Parted(at)
            }
            _ => {
                return Err(FormatError::Bad {
                    what: "warm record",
                    detail: format!("version {ver}"),
                })
            }
        };
        Ok(WarmRecord {
            kind,
            expire_ms,
            write_seq,
            checksum,
            value,
        })
    }
}

/// Bytes of the header in front of each value-log entry.
pub const LOG_HEADER_BYTES: usize = 4 + 4 + 8 + 4;
/// Entries whose key is a stored key (layout 2).
const LOG_MAGIC: u32 = 0x5354_5632; // "STV2"
/// Entries whose key is the client's key (layout 1).
const LOG_MAGIC_LAYOUT_1: u32 = 0x5354_564c; // "STVL"

/// The header of a value-log entry: `magic | key_len: u32 | value_len: u64 | crc32c of the
/// first 16 bytes`, followed by the key (a stored key, [`crate::Key::stored`]) and the
/// value. The value's own checksum lives in the warm record that points at it; this one
/// lets a reader walking the file find where the entries end (a torn tail after a crash
/// fails it).
pub fn encode_log_header(key_len: usize, value_len: usize) -> [u8; LOG_HEADER_BYTES] {
    let mut h = [0u8; LOG_HEADER_BYTES];
    h[..4].copy_from_slice(&LOG_MAGIC.to_le_bytes());
    h[4..8].copy_from_slice(&(key_len as u32).to_le_bytes());
    h[8..16].copy_from_slice(&(value_len as u64).to_le_bytes());
    let crc = crc32c::crc32c(&h[..16]);
    h[16..].copy_from_slice(&crc.to_le_bytes());
    h
}

/// A decoded value-log entry header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogHeader {
    pub key_len: usize,
    pub value_len: u64,
    /// 2 when the key is a stored key; 1 for entries written before databases and slots,
    /// whose key is the client's.
    pub layout: u8,
}

/// Decodes a value-log entry header.
pub fn decode_log_header(b: &[u8]) -> Result<LogHeader> {
    let mut r = Reader::new(b, "value log entry");
    let magic = r.u32()?;
    let key_len = r.u32()? as usize;
    let value_len = r.u64()?;
    let crc = r.u32()?;
    let layout = match magic {
        LOG_MAGIC => 2,
        LOG_MAGIC_LAYOUT_1 => 1,
        _ => 0,
    };
    if layout == 0 || crc != crc32c::crc32c(&b[..16]) {
        return Err(FormatError::Checksum {
            what: "value log entry header",
        });
    }
    Ok(LogHeader {
        key_len,
        value_len,
        layout,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warm_record_round_trips_and_binds_key() {
        let enc = WarmRecord::encode(Kind::String, b"k", 42, 7, b"value");
        let rec = WarmRecord::decode(b"k", &enc).unwrap();
        assert_eq!(
            (rec.expire_ms, rec.write_seq, rec.value),
            (42, 7, WarmValue::Inline(&b"value"[..]))
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
        let mut enc = WarmRecord::encode(Kind::String, b"k", 0, 1, b"value");
        let last = enc.len() - 1;
        enc[last] ^= 1;
        assert!(WarmRecord::decode(b"k", &enc).is_err());
        assert!(matches!(
            WarmRecord::decode(b"k", &enc[..5]),
            Err(FormatError::Truncated { .. })
        ));
    }

    #[test]
    fn a_record_keeps_its_kind_and_a_flipped_kind_fails_the_checksum() {
        let enc = WarmRecord::encode(Kind::Hash, b"k", 0, 1, b"fields");
        let rec = WarmRecord::decode(b"k", &enc).unwrap();
        assert_eq!(
            (rec.kind, rec.value),
            (Kind::Hash, WarmValue::Inline(&b"fields"[..]))
        );
        let mut as_string = enc.clone();
        as_string[0] &= 0x0f;
        assert!(WarmRecord::decode(b"k", &as_string).is_err());
        let mut unknown = enc;
        unknown[0] |= 0xf0;
        assert!(WarmRecord::decode(b"k", &unknown).is_err());
        // A string written before kinds existed (version byte 1) still reads.
        let old = WarmRecord::encode(Kind::String, b"k", 0, 1, b"v");
        assert_eq!(old[0], 1);
        assert_eq!(WarmRecord::decode(b"k", &old).unwrap().kind, Kind::String);
    }

    #[test]
    fn logged_record_points_and_verifies_the_value_it_points_at() {
        let at = ValuePointer {
            file: 3,
            offset: 4096,
            len: 5,
        };
        let enc = WarmRecord::encode_logged(
            Kind::String,
            9,
            2,
            entry_checksum(Kind::String, b"k", 9, b"value"),
            at,
        );
        let rec = WarmRecord::decode(b"k", &enc).unwrap();
        assert_eq!(rec.value, WarmValue::Logged(at));
        assert_eq!(rec.value_len(), 5);
        rec.verify(b"k", b"value").unwrap();
        assert!(rec.verify(b"k", b"valuf").is_err());
        assert!(rec.verify(b"j", b"value").is_err());
        assert!(WarmRecord::decode(b"k", &enc[..enc.len() - 1]).is_err());
    }

    #[test]
    fn log_header_round_trips_and_rejects_zeros_and_flips() {
        let h = encode_log_header(12, 3 << 20);
        let d = decode_log_header(&h).unwrap();
        assert_eq!((d.key_len, d.value_len, d.layout), (12, 3 << 20, 2));
        // An entry of layout 1 (magic "STVL") still reads.
        let mut old = h;
        old[..4].copy_from_slice(&0x5354_564cu32.to_le_bytes());
        let crc = crc32c::crc32c(&old[..16]);
        old[16..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(decode_log_header(&old).unwrap().layout, 1);
        assert!(decode_log_header(&[0u8; LOG_HEADER_BYTES]).is_err());
        let mut bad = h;
        bad[9] ^= 1;
        assert!(decode_log_header(&bad).is_err());
        assert!(decode_log_header(&h[..10]).is_err());
    }

    #[test]
    fn a_parts_record_keeps_a_lists_head_and_checks_it() {
        let at = Parted {
            version: 7,
            count: 3,
            bytes: 99,
            head: (1 << 63) - 2,
        };
        let list = WarmRecord::encode_parted(Kind::List, b"k", 5, 11, at);
        let rec = WarmRecord::decode(b"k", &list).unwrap();
        assert_eq!(rec.value, WarmValue::Parted(at));
        // Other kinds store no head.
        let hash = WarmRecord::encode_parted(Kind::Hash, b"k", 5, 11, at);
        assert_eq!(hash.len() + 8, list.len());
        let rec = WarmRecord::decode(b"k", &hash).unwrap();
        assert_eq!(rec.value, WarmValue::Parted(Parted { head: 0, ..at }));
        // A changed head fails the checksum; a list record without one is refused.
        let mut bad = list.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert!(WarmRecord::decode(b"k", &bad).is_err());
        assert!(WarmRecord::decode(b"k", &list[..list.len() - 8]).is_err());
    }
}
