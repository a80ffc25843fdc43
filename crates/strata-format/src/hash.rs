//! The value of a hash ([`crate::Kind::Hash`]): its fields in the order they were first set
//! (as Redis keeps a small hash), each with its own expiry.
//!
//! ```text
//! hash   = ver u8 (1) | count u32 | field × count
//! field  = name_len u32 | value_len u32 | expire_ms u64 (0 = none) | name | value
//! ```
//!
//! The whole value is one stored value (its record's checksum covers it), so a change to one
//! field rewrites the hash: the cost of a write grows with the hash.

use crate::{Reader, Result};

const HASH_VERSION: u8 = 1;
/// Bytes of a hash with no fields.
pub const HASH_HEADER_BYTES: usize = 1 + 4;
/// Bytes in front of each field's name and value.
pub const FIELD_HEADER_BYTES: usize = 4 + 4 + 8;

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

    /// Bytes the field takes in an encoded hash.
    pub fn encoded_len(&self) -> usize {
        FIELD_HEADER_BYTES + self.name.len() + self.value.len()
    }
}

/// Decodes a hash value into its fields, in order.
pub fn decode_hash(b: &[u8]) -> Result<Vec<Field<'_>>> {
    let mut r = Reader::new(b, "hash");
    let count = r.collection_header(HASH_VERSION, FIELD_HEADER_BYTES)?;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let name_len = r.u32()? as usize;
        let value_len = r.u32()? as usize;
        let expire_ms = r.u64()?;
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
    let count = r.collection_header(HASH_VERSION, FIELD_HEADER_BYTES)?;
    let (mut last, mut untimed) = (0, count == 0);
    for _ in 0..count {
        let name_len = r.u32()? as usize;
        let value_len = r.u32()? as usize;
        let expire_ms = r.u64()?;
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
    let mut out = crate::collection_buf(HASH_VERSION, fields.len(), len);
    for f in fields {
        out.extend_from_slice(&(f.name.len() as u32).to_le_bytes());
        out.extend_from_slice(&(f.value.len() as u32).to_le_bytes());
        out.extend_from_slice(&f.expire_ms.to_le_bytes());
        out.extend_from_slice(f.name);
        out.extend_from_slice(f.value);
    }
    out
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
    fn hashes_round_trip_in_order() {
        let fields = [f("b", "2", 0), f("a", "", 7), f("", "empty name", 0)];
        let enc = encode_hash(&fields);
        assert_eq!(
            enc.len(),
            HASH_HEADER_BYTES + fields.iter().map(Field::encoded_len).sum::<usize>()
        );
        assert_eq!(decode_hash(&enc).unwrap(), fields);
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
        huge[1..5].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_hash(&huge).is_err());
        let mut ver = enc;
        ver[0] = 9;
        assert!(decode_hash(&ver).is_err());
    }
}
