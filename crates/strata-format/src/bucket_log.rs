//! The bucket log's objects: what a node ships to the bucket its cluster shares, so that a
//! node that takes over its slots can serve every write it acknowledged. Each object is
//! one round of the shipper: the state, at that round, of every key changed since the last
//! (a key's whole value and expiry, an index entry for a key whose value is in a segment of
//! the bucket, or its deletion), and the flushes between. Objects are numbered from 1 per
//! writer epoch with no gaps, and written create-only; a *fence* object, written by the
//! cluster's controller at the first free number of a lost node's epoch, ends that log:
//! the node's next object cannot be written, and readers stop there.
//!
//! A *snapshot* bounds what a reader replays: the state of every key the node held, in
//! log objects of its own (`parts`, each an object of put and cold records, written under
//! the snapshot's directory), made once the log numbered up to `covers` was written, and
//! named by a snapshot record in a log object written after the parts (create-only like
//! any: a fenced writer cannot add one). A reader starts at the last snapshot record it
//! finds: its parts, then the log objects numbered above `covers`.
//!
//! ```text
//! log object   = "STRBLOG1" | epoch u64 | number u64 | nonce u64 | count u32 | record × count
//!                | crc32c(everything before) u32
//! record       = op u8 | kind u8 | expire_ms u64 | key_len u32 | key | value_len u32 | value
//!                op 1 put (key: stored key, value: the value), 2 delete, 3 cold (value: the
//!                index entry, `BlockRef::encode`), 4 flush db (key: [db]), 5 flush all,
//!                6 snapshot (expire_ms: the last log number it covers, value: parts u32)
//! fence object = "STRFENCE" | epoch u64 | number u64 | by_len u32 | by | crc32c u32
//! ```
//!
//! ```
//! use strata_format::bucket_log::{decode, encode_log, Header, Object, Record};
//! use strata_format::Kind;
//! let h = Header { epoch: 3, number: 1, nonce: 42 };
//! let bytes = encode_log(&h, &[Record::Put { key: b"k", kind: Kind::String, expire_ms: 0, value: b"v" }]);
//! let Object::Log { header, records } = decode(&bytes).unwrap() else { panic!() };
//! assert_eq!((header, records.len()), (h, 1));
//! ```

use crate::{FormatError, Kind, Reader, Result};

const LOG_MAGIC: &[u8; 8] = b"STRBLOG1";
const FENCE_MAGIC: &[u8; 8] = b"STRFENCE";
const OP_PUT: u8 = 1;
const OP_DELETE: u8 = 2;
const OP_COLD: u8 = 3;
const OP_FLUSH_DB: u8 = 4;
const OP_FLUSH_ALL: u8 = 5;
const OP_SNAPSHOT: u8 = 6;

/// Who wrote a log object, and where it stands in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub epoch: u64,
    /// Its number in the epoch's log, from 1.
    pub number: u64,
    /// A number the writer draws at start: a writer that finds its object's name taken
    /// reads it, and knows it as its own (a PUT that landed after it timed out) by this.
    pub nonce: u64,
}

/// One change a log object carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record<'a> {
    /// The key holds `value`, of `kind`, until `expire_ms` (0: no expiry).
    Put {
        key: &'a [u8],
        kind: Kind,
        expire_ms: u64,
        value: &'a [u8],
    },
    /// The key holds nothing.
    Delete { key: &'a [u8] },
    /// The key's value is in a segment of the bucket: its encoded index entry.
    Cold { key: &'a [u8], entry: &'a [u8] },
    /// Every key of stored database `db` went.
    FlushDb { db: u8 },
    /// Every key went.
    FlushAll,
    /// A snapshot of every key the writer held, made once its log up to number `covers`
    /// was written, is complete in `parts` objects.
    Snapshot { covers: u64, parts: u32 },
}

/// A decoded object of the log.
#[derive(Debug)]
pub enum Object<'a> {
    Log {
        header: Header,
        records: Vec<Record<'a>>,
    },
    /// The log ends here: the cluster took the writer's slots.
    Fence { epoch: u64, number: u64, by: String },
}

/// A log object of `records`.
pub fn encode_log(h: &Header, records: &[Record<'_>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + records.iter().map(record_bytes).sum::<usize>());
    out.extend_from_slice(LOG_MAGIC);
    out.extend_from_slice(&h.epoch.to_le_bytes());
    out.extend_from_slice(&h.number.to_le_bytes());
    out.extend_from_slice(&h.nonce.to_le_bytes());
    out.extend_from_slice(&(records.len() as u32).to_le_bytes());
    for r in records {
        put_record(&mut out, r);
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// A fence object at `number` of `epoch`'s log, written by `by` (the controller's id).
pub fn encode_fence(epoch: u64, number: u64, by: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + by.len());
    out.extend_from_slice(FENCE_MAGIC);
    out.extend_from_slice(&epoch.to_le_bytes());
    out.extend_from_slice(&number.to_le_bytes());
    out.extend_from_slice(&(by.len() as u32).to_le_bytes());
    out.extend_from_slice(by.as_bytes());
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn record_bytes(r: &Record<'_>) -> usize {
    let (key, value) = parts_of(r);
    // A snapshot record's four bytes of count are not in its fields.
    1 + 1 + 8 + 4 + key.len() + 4 + value.len().max(4)
}

/// A record's op, kind, expiry, key and value, as written.
fn fields<'r>(r: &'r Record<'_>) -> (u8, Kind, u64, &'r [u8], &'r [u8]) {
    match *r {
        Record::Put {
            key,
            kind,
            expire_ms,
            value,
        } => (OP_PUT, kind, expire_ms, key, value),
        Record::Delete { key } => (OP_DELETE, Kind::String, 0, key, &[]),
        Record::Cold { key, entry } => (OP_COLD, Kind::String, 0, key, entry),
        Record::FlushDb { ref db } => (OP_FLUSH_DB, Kind::String, 0, std::slice::from_ref(db), &[]),
        Record::FlushAll => (OP_FLUSH_ALL, Kind::String, 0, &[], &[]),
        // Its part count is written by `put_record`.
        Record::Snapshot { covers, .. } => (OP_SNAPSHOT, Kind::String, covers, &[], &[]),
    }
}

fn parts_of<'r>(r: &'r Record<'_>) -> (&'r [u8], &'r [u8]) {
    let (_, _, _, key, value) = fields(r);
    (key, value)
}

fn put_record(out: &mut Vec<u8>, r: &Record<'_>) {
    let (op, kind, expire_ms, key, mut value) = fields(r);
    let parts;
    if let Record::Snapshot { parts: n, .. } = r {
        parts = n.to_le_bytes();
        value = &parts;
    }
    out.push(op);
    out.push(kind as u8);
    out.extend_from_slice(&expire_ms.to_le_bytes());
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    out.extend_from_slice(value);
}

fn bad(detail: impl Into<String>) -> FormatError {
    FormatError::Bad {
        what: "bucket log object",
        detail: detail.into(),
    }
}

/// Decodes a log or fence object, checking its checksum.
pub fn decode(bytes: &[u8]) -> Result<Object<'_>> {
    if bytes.len() < 8 + 4 {
        return Err(bad("too short"));
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if crc32c::crc32c(body).to_le_bytes() != crc {
        return Err(bad("checksum mismatch"));
    }
    let mut r = Reader::new(&body[8..], "bucket log object");
    match &body[..8] {
        m if m == LOG_MAGIC => decode_log(&mut r),
        m if m == FENCE_MAGIC => {
            let (epoch, number) = (r.u64()?, r.u64()?);
            let len = r.u32()? as usize;
            let by = String::from_utf8_lossy(r.bytes(len)?).into_owned();
            Ok(Object::Fence { epoch, number, by })
        }
        _ => Err(bad("unknown magic")),
    }
}

fn decode_log<'a>(r: &mut Reader<'a>) -> Result<Object<'a>> {
    let header = Header {
        epoch: r.u64()?,
        number: r.u64()?,
        nonce: r.u64()?,
    };
    let count = r.u32()? as usize;
    let mut records = Vec::with_capacity(count.min(1 << 16));
    for _ in 0..count {
        records.push(decode_record(r)?);
    }
    if r.remaining() != 0 {
        return Err(bad("bytes after the last record"));
    }
    Ok(Object::Log { header, records })
}

fn decode_record<'a>(r: &mut Reader<'a>) -> Result<Record<'a>> {
    let op = r.u8()?;
    let kind = Kind::from_u8(r.u8()?)?;
    let expire_ms = r.u64()?;
    let key_len = r.u32()? as usize;
    let key = r.bytes(key_len)?;
    let value_len = r.u32()? as usize;
    let value = r.bytes(value_len)?;
    Ok(match op {
        OP_PUT => Record::Put {
            key,
            kind,
            expire_ms,
            value,
        },
        OP_DELETE => Record::Delete { key },
        OP_COLD => Record::Cold { key, entry: value },
        OP_FLUSH_DB if key.len() == 1 => Record::FlushDb { db: key[0] },
        OP_FLUSH_ALL => Record::FlushAll,
        OP_SNAPSHOT if value.len() == 4 => Record::Snapshot {
            covers: expire_ms,
            parts: u32::from_le_bytes(value.try_into().expect("four bytes")),
        },
        _ => return Err(bad(format!("record op {op}"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_record_reads_back_and_a_flipped_byte_is_refused() {
        let h = Header {
            epoch: 7,
            number: 12,
            nonce: 99,
        };
        let records = [
            Record::Put {
                key: b"\x00\x00\x01k",
                kind: Kind::Hash,
                expire_ms: 5,
                value: b"value",
            },
            Record::Delete { key: b"gone" },
            Record::Cold {
                key: b"c",
                entry: b"ref",
            },
            Record::FlushDb { db: 3 },
            Record::FlushAll,
            Record::Snapshot {
                covers: 11,
                parts: 3,
            },
        ];
        let bytes = encode_log(&h, &records);
        let Object::Log {
            header,
            records: got,
        } = decode(&bytes).unwrap()
        else {
            panic!("a log object")
        };
        assert_eq!(header, h);
        assert_eq!(got, records);
        for at in [0, 9, bytes.len() / 2, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[at] ^= 1;
            assert!(decode(&bad).is_err(), "flipped byte {at}");
        }
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
        let fence = encode_fence(7, 13, "controller");
        match decode(&fence).unwrap() {
            Object::Fence { epoch, number, by } => {
                assert_eq!((epoch, number, by.as_str()), (7, 13, "controller"))
            }
            other => panic!("{other:?}"),
        }
    }
}
