//! The value of a hash ([`crate::Kind::Hash`]): its fields in the order they were first set
//! (as Redis keeps a small hash), each with its own expiry.
//!
//! ```text
//! hash   = ver u8 (2) | count varint | field × count
//! field  = head varint (name_len << 1 | timed) | value_len varint
//!          | expire_ms u64 (only if timed) | name | value
//! ```
//!
//! A field with short name and value costs 2 bytes beside them, 10 with an expiry. Hashes
//! written before (version 1: `count u32`, and `name_len u32 | value_len u32 | expire_ms
//! u64` in front of every field, 0 for no expiry) are still read.
//!
//! Below `parts_bytes_min` the whole value is one stored value (its record's checksum covers
//! it), so a change to one field rewrites the hash; a larger one is stored as parts, one
//! field each ([`crate::parts`]).

use crate::{flagged, put_varint, varint_len, Reader, Result, COLLECTION_V1};

/// Bytes of a hash with no fields.
pub const HASH_HEADER_BYTES: usize = 1 + 1;
/// Bytes in front of each field's name and value in version 1.
const V1_FIELD_HEADER_BYTES: usize = 4 + 4 + 8;
/// The fewest bytes a field takes in each version (what a count is checked against).
fn field_bytes_min(ver: u8) -> usize {
    match ver {
        COLLECTION_V1 => V1_FIELD_HEADER_BYTES,
        _ => 2,
    }
}

/// One field of a hash, borrowed from its encoded value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field<'a> {
    pub name: &'a [u8],
    pub value: &'a [u8],
    /// Absolute expiry in Unix milliseconds; 0 means none.
    pub expire_ms: u64,
}

impl Field<'_> {
    /// Whether the field is live at `now_ms`.
    pub fn is_live(&self, now_ms: u64) -> bool {
        crate::is_live(self.expire_ms, now_ms)
    }

    /// The field's head: its name's length and whether it has an expiry.
    fn head(&self) -> u64 {
        flagged(self.name.len(), self.expire_ms != 0)
    }

    /// Bytes the field takes in an encoded hash.
    pub fn encoded_len(&self) -> usize {
        let expiry = if self.expire_ms != 0 { 8 } else { 0 };
        varint_len(self.head())
            + varint_len(self.value.len() as u64)
            + expiry
            + self.name.len()
            + self.value.len()
    }
}

/// Reads one field's header (either version): its name's and value's lengths and expiry.
fn field_header(r: &mut Reader<'_>, ver: u8) -> Result<(usize, usize, u64)> {
    if ver == COLLECTION_V1 {
        let name_len = r.u32()? as usize;
        let value_len = r.u32()? as usize;
        return Ok((name_len, value_len, r.u64()?));
    }
    let (name_len, timed) = r.flagged_len()?;
    let value_len = r.len()?;
    let expire_ms = if timed { r.u64()? } else { 0 };
    Ok((name_len, value_len, expire_ms))
}

/// Decodes a hash value into its fields, in order.
pub fn decode_hash(b: &[u8]) -> Result<Vec<Field<'_>>> {
    let mut r = Reader::new(b, "hash");
    let (ver, count) = r.collection_header(field_bytes_min)?;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let (name_len, value_len, expire_ms) = field_header(&mut r, ver)?;
        out.push(Field {
            name: r.bytes(name_len)?,
            value: r.bytes(value_len)?,
            expire_ms,
        });
    }
    r.finish()?;
    Ok(out)
}

/// When every field of the hash value `b` will have expired, read from the fields' headers
/// alone: `None` when some field never expires (or there is none).
pub fn all_fields_expire_ms(b: &[u8]) -> Result<Option<u64>> {
    let mut r = Reader::new(b, "hash");
    let (ver, count) = r.collection_header(field_bytes_min)?;
    let (mut last, mut untimed) = (0, count == 0);
    for _ in 0..count {
        let (name_len, value_len, expire_ms) = field_header(&mut r, ver)?;
        r.bytes(name_len.saturating_add(value_len))?;
        untimed |= expire_ms == 0;
        last = last.max(expire_ms);
    }
    r.finish()?;
    Ok((!untimed).then_some(last))
}

/// Encodes `fields` (names distinct, in the order given) as a hash value.
pub fn encode_hash(fields: &[Field<'_>]) -> Vec<u8> {
    let len = HASH_HEADER_BYTES + fields.iter().map(Field::encoded_len).sum::<usize>();
    let mut out = crate::collection_buf(fields.len(), len);
    for f in fields {
        put_field(&mut out, f);
    }
    out
}

/// Appends `f` as a field of a hash value in the current encoding: a hash is its header
/// ([`crate::collection_buf`]) and its fields so written, in order.
pub fn put_field(out: &mut Vec<u8>, f: &Field<'_>) {
    put_varint(out, f.head());
    put_varint(out, f.value.len() as u64);
    if f.expire_ms != 0 {
        out.extend_from_slice(&f.expire_ms.to_le_bytes());
    }
    out.extend_from_slice(f.name);
    out.extend_from_slice(f.value);
}

/// The field [`put_field`] wrote at the start of `b`, and the bytes it takes.
#[inline]
pub fn field_at(b: &[u8]) -> Result<(Field<'_>, usize)> {
    // Most fields: a name under 64 bytes and a value under 128, each length one byte.
    if let [head, value_len, ..] = *b {
        if head < 0x80 && value_len < 0x80 {
            let at = if head & 1 == 1 { 10 } else { 2 };
            let name_end = at + usize::from(head >> 1);
            let end = name_end + usize::from(value_len);
            if end <= b.len() {
                let expire_ms = match at {
                    10 => u64::from_le_bytes(b[2..10].try_into().expect("8 bytes")),
                    _ => 0,
                };
                let f = Field {
                    name: &b[at..name_end],
                    value: &b[name_end..end],
                    expire_ms,
                };
                return Ok((f, end));
            }
        }
    }
    long_field_at(b)
}

/// [`field_at`] of a field whose lengths take more than a byte (or of too few bytes).
fn long_field_at(b: &[u8]) -> Result<(Field<'_>, usize)> {
    let mut r = Reader::new(b, "hash field");
    let (name_len, value_len, expire_ms) = field_header(&mut r, crate::COLLECTION_V2)?;
    let name = r.bytes(name_len)?;
    let value = r.bytes(value_len)?;
    let f = Field {
        name,
        value,
        expire_ms,
    };
    Ok((f, b.len() - r.remaining()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f<'a>(name: &'a str, value: &'a str, expire_ms: u64) -> Field<'a> {
        Field {
            name: name.as_bytes(),
            value: value.as_bytes(),
            expire_ms,
        }
    }

    #[test]
    fn fields_put_one_by_one_read_back_one_by_one_and_make_the_value() {
        // Short lengths (one byte each) and long ones, with and without an expiry.
        let (long_name, long_value) = ("n".repeat(70), "v".repeat(200));
        let fields = [
            f("b", "2", 0),
            f("a", "", 7),
            f("", "empty name", 0),
            f(&long_name, "x", 9),
            f("y", &long_value, 0),
        ];
        let mut body = Vec::new();
        for x in &fields {
            put_field(&mut body, x);
        }
        let (mut at, mut got) = (0, Vec::new());
        while at < body.len() {
            let (x, len) = field_at(&body[at..]).unwrap();
            assert_eq!(len, x.encoded_len());
            got.push(x);
            at += len;
        }
        assert_eq!(got, fields);
        let mut value = crate::collection_buf(fields.len(), 0);
        value.extend_from_slice(&body);
        assert_eq!(value, encode_hash(&fields));
        assert!(field_at(&body[..body.len() - 1][..3]).is_err());
    }

    #[test]
    fn hashes_round_trip_in_order() {
        let fields = [f("b", "2", 0), f("a", "", 7), f("", "empty name", 0)];
        let enc = encode_hash(&fields);
        assert_eq!(
            enc.len(),
            HASH_HEADER_BYTES + fields.iter().map(Field::encoded_len).sum::<usize>()
        );
        assert_eq!(decode_hash(&enc).unwrap(), fields);
        // Short untimed fields cost two bytes beside their name and value, timed ones ten.
        assert_eq!(f("b", "2", 0).encoded_len(), 4);
        assert_eq!(f("a", "", 7).encoded_len(), 11);
        let long = "n".repeat(200);
        let field = f(&long, "v", 0);
        assert_eq!(field.encoded_len(), 2 + 1 + 201);
        assert_eq!(decode_hash(&encode_hash(&[field])).unwrap(), [field]);
        assert_eq!(decode_hash(&encode_hash(&[])).unwrap(), vec![]);
        assert!(f("a", "", 7).is_live(6) && !f("a", "", 7).is_live(7) && f("a", "", 0).is_live(9));
    }

    #[test]
    fn all_fields_expire_when_the_last_timed_one_does_unless_one_never_does() {
        assert_eq!(
            all_fields_expire_ms(&encode_hash(&[f("a", "1", 0)])).unwrap(),
            None
        );
        assert_eq!(all_fields_expire_ms(&encode_hash(&[])).unwrap(), None);
        let some = encode_hash(&[f("a", "1", 9), f("b", "2", 0), f("c", "3", 4)]);
        assert_eq!(all_fields_expire_ms(&some).unwrap(), None);
        let all = encode_hash(&[f("a", "1", 9), f("c", "3", 4)]);
        assert_eq!(all_fields_expire_ms(&all).unwrap(), Some(9));
        assert!(all_fields_expire_ms(&all[..all.len() - 1]).is_err());
        assert!(all_fields_expire_ms(b"not a hash").is_err());
    }

    #[test]
    fn truncated_padded_and_lying_hashes_are_refused() {
        let enc = encode_hash(&[f("name", "value", 0), f("x", "y", 0)]);
        for cut in 0..enc.len() {
            assert!(decode_hash(&enc[..cut]).is_err(), "cut at {cut}");
        }
        let mut padded = enc.clone();
        padded.push(0);
        assert!(decode_hash(&padded).is_err());
        let mut huge = enc.clone();
        huge.splice(1..2, [0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert!(decode_hash(&huge).is_err());
        let mut overlong = enc.clone();
        overlong.splice(1..2, [0x82, 0x00]);
        assert!(decode_hash(&overlong).is_err(), "a count written long");
        let mut ver = enc;
        ver[0] = 9;
        assert!(decode_hash(&ver).is_err());
    }

    /// A hash in the first encoding, as Strata wrote it before the current one.
    fn encode_v1(fields: &[Field<'_>]) -> Vec<u8> {
        let mut out = vec![COLLECTION_V1];
        out.extend_from_slice(&(fields.len() as u32).to_le_bytes());
        for f in fields {
            out.extend_from_slice(&(f.name.len() as u32).to_le_bytes());
            out.extend_from_slice(&(f.value.len() as u32).to_le_bytes());
            out.extend_from_slice(&f.expire_ms.to_le_bytes());
            out.extend_from_slice(f.name);
            out.extend_from_slice(f.value);
        }
        out
    }

    #[test]
    fn hashes_written_in_the_first_encoding_are_still_read() {
        let fields = [f("b", "2", 0), f("a", "", 7), f("", "empty name", 0)];
        let v1 = encode_v1(&fields);
        assert_eq!(decode_hash(&v1).unwrap(), fields);
        assert_eq!(all_fields_expire_ms(&v1).unwrap(), None);
        let timed = encode_v1(&[f("a", "1", 9), f("c", "3", 4)]);
        assert_eq!(all_fields_expire_ms(&timed).unwrap(), Some(9));
        assert!(encode_hash(&fields).len() < v1.len());
        for cut in 0..v1.len() {
            assert!(decode_hash(&v1[..cut]).is_err(), "cut at {cut}");
        }
        let mut huge = v1;
        huge[1..5].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_hash(&huge).is_err());
    }
}
