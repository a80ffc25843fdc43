//! The value of a set or a list ([`crate::Kind::Set`], [`crate::Kind::List`]): byte strings
//! in order (a set's in the order they were added, a list's head first).
//!
//! ```text
//! members = ver u8 (1) | count u32 | member × count
//! member  = len u32 | bytes
//! ```
//!
//! One stored value, like a hash ([`crate::hash`]): a change rewrites it whole.

use crate::{Reader, Result};

const MEMBERS_VERSION: u8 = 1;
/// Bytes of a value with no members.
pub const MEMBERS_HEADER_BYTES: usize = 1 + 4;

/// Decodes a set's or a list's members, in order.
pub fn decode_members(b: &[u8]) -> Result<Vec<&[u8]>> {
    let mut r = Reader::new(b, "members");
    let count = r.collection_header(MEMBERS_VERSION, 4)?;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let len = r.u32()? as usize;
        out.push(r.bytes(len)?);
    }
    r.finish()?;
    Ok(out)
}

/// Encodes `members`, in the order given.
pub fn encode_members<M: AsRef<[u8]>>(members: &[M]) -> Vec<u8> {
    encode_members_from(members.iter().map(|m| m.as_ref()))
}

/// [`encode_members`] of the members `members` yields, in that order.
pub fn encode_members_from<'a>(
    members: impl ExactSizeIterator<Item = &'a [u8]> + Clone,
) -> Vec<u8> {
    let len = MEMBERS_HEADER_BYTES + members.clone().map(|m| 4 + m.len()).sum::<usize>();
    let mut out = crate::collection_buf(MEMBERS_VERSION, members.len(), len);
    for m in members {
        out.extend_from_slice(&(m.len() as u32).to_le_bytes());
        out.extend_from_slice(m);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_round_trip_and_damage_is_refused() {
        let members: [&[u8]; 3] = [b"b", b"", b"a longer member"];
        let enc = encode_members(&members);
        assert_eq!(decode_members(&enc).unwrap(), members);
        assert!(decode_members(&encode_members::<&[u8]>(&[]))
            .unwrap()
            .is_empty());
        for cut in 0..enc.len() {
            assert!(decode_members(&enc[..cut]).is_err(), "cut at {cut}");
        }
        let mut padded = enc.clone();
        padded.push(1);
        assert!(decode_members(&padded).is_err());
        let mut huge = enc;
        huge[1..5].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_members(&huge).is_err());
    }
}
