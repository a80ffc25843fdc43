//! The value of a sorted set ([`crate::Kind::ZSet`]): members with their scores, sorted by
//! score and then by member bytes (Redis's order).
//!
//! ```text
//! zset   = ver u8 (1) | count u32 | entry × count
//! entry  = score f64 (IEEE 754 bits, LE) | len u32 | member
//! ```
//!
//! One stored value, like a hash ([`crate::hash`]): a change rewrites it whole, and a range
//! read decodes the set.

use std::cmp::Ordering;

use crate::{Reader, Result};

const ZSET_VERSION: u8 = 1;
/// Bytes of a sorted set with no members.
pub const ZSET_HEADER_BYTES: usize = 1 + 4;
/// Bytes in front of each member.
pub const ENTRY_HEADER_BYTES: usize = 8 + 4;

/// Redis's order of a sorted set's entries: by score, then by member bytes.
pub fn order(a: &(f64, impl AsRef<[u8]>), b: &(f64, impl AsRef<[u8]>)) -> Ordering {
    a.0.partial_cmp(&b.0)
        .unwrap_or(Ordering::Equal)
        .then_with(|| a.1.as_ref().cmp(b.1.as_ref()))
}

/// Decodes a sorted set's `(score, member)` entries, in order.
pub fn decode_zset(b: &[u8]) -> Result<Vec<(f64, &[u8])>> {
    let mut r = Reader::new(b, "sorted set");
    let count = r.collection_header(ZSET_VERSION, ENTRY_HEADER_BYTES)?;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let score = f64::from_bits(r.u64()?);
        let len = r.u32()? as usize;
        out.push((score, r.bytes(len)?));
    }
    r.finish()?;
    Ok(out)
}

/// Encodes `entries` (already in order, members distinct).
pub fn encode_zset<M: AsRef<[u8]>>(entries: &[(f64, M)]) -> Vec<u8> {
    let len = ZSET_HEADER_BYTES
        + entries
            .iter()
            .map(|(_, m)| ENTRY_HEADER_BYTES + m.as_ref().len())
            .sum::<usize>();
    let mut out = crate::collection_buf(ZSET_VERSION, entries.len(), len);
    for (score, m) in entries {
        let m = m.as_ref();
        out.extend_from_slice(&score.to_bits().to_le_bytes());
        out.extend_from_slice(&(m.len() as u32).to_le_bytes());
        out.extend_from_slice(m);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorted_sets_round_trip_and_damage_is_refused() {
        let entries: Vec<(f64, &[u8])> = vec![
            (f64::NEG_INFINITY, b"a"),
            (-0.5, b""),
            (1.0, b"x"),
            (1.0, b"y"),
        ];
        let enc = encode_zset(&entries);
        assert_eq!(decode_zset(&enc).unwrap(), entries);
        for cut in 0..enc.len() {
            assert!(decode_zset(&enc[..cut]).is_err(), "cut at {cut}");
        }
        let mut padded = enc;
        padded.push(0);
        assert!(decode_zset(&padded).is_err());
    }
}
