//! The value of a set or a list ([`crate::Kind::Set`], [`crate::Kind::List`]): byte strings
//! in order (a set's in the order they were added, a list's head first).
//!
//! ```text
//! members = ver u8 (2) | count varint | member × count
//! member  = len varint | bytes
//! ```
//!
//! Values written before (version 1: `count u32`, `len u32` in front of each member) are
//! still read.
//!
//! One stored value, like a hash ([`crate::hash`]): a change rewrites it whole, unless a set
//! is large enough to be stored as parts ([`crate::parts`]).

use crate::{put_varint, varint_len, Reader, Result, COLLECTION_V1};

/// Bytes of a value with no members.
pub const MEMBERS_HEADER_BYTES: usize = 1 + 1;

/// Decodes a set's or a list's members, in order.
pub fn decode_members(b: &[u8]) -> Result<Vec<&[u8]>> {
    let mut r = Reader::new(b, "members");
    let (ver, count) = r.collection_header(|ver| if ver == COLLECTION_V1 { 4 } else { 1 })?;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let len = match ver {
            COLLECTION_V1 => r.u32()? as usize,
            _ => r.len()?,
        };
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
    let len = MEMBERS_HEADER_BYTES
        + members
            .clone()
            .map(|m| varint_len(m.len() as u64) + m.len())
            .sum::<usize>();
    let mut out = crate::collection_buf(members.len(), len);
    for m in members {
        put_member(&mut out, m);
    }
    out
}

/// Appends `m` as a member in the current encoding: a value of members is its header
/// ([`crate::collection_buf`]) and its members so written, in order.
pub fn put_member(out: &mut Vec<u8>, m: &[u8]) {
    put_varint(out, m.len() as u64);
    out.extend_from_slice(m);
}

/// The member [`put_member`] wrote at the start of `b`, and the bytes it takes.
#[inline]
pub fn member_at(b: &[u8]) -> Result<(&[u8], usize)> {
    // Most members are under 128 bytes: their length is one byte.
    if let Some(&len) = b.first() {
        let end = 1 + usize::from(len);
        if len < 0x80 && end <= b.len() {
            return Ok((&b[1..end], end));
        }
    }
    let mut r = Reader::new(b, "member");
    let len = r.len()?;
    let m = r.bytes(len)?;
    Ok((m, b.len() - r.remaining()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_put_one_by_one_read_back_one_by_one_and_make_the_value() {
        let members: [&[u8]; 3] = [b"b", b"", &[7u8; 200]];
        let mut value = crate::collection_buf(members.len(), 0);
        let start = value.len();
        for m in members {
            put_member(&mut value, m);
        }
        assert_eq!(value, encode_members(&members));
        let (mut at, mut got) = (start, Vec::new());
        while at < value.len() {
            let (m, len) = member_at(&value[at..]).unwrap();
            got.push(m);
            at += len;
        }
        assert_eq!(got, members);
        let last = value.len() - 202;
        assert!(
            member_at(&value[last..value.len() - 1]).is_err(),
            "cut short"
        );
    }

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
        let mut huge = enc.clone();
        huge.splice(1..2, [0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert!(decode_members(&huge).is_err());
        // One byte in front of a short member, two from 128 bytes.
        assert_eq!(
            enc.len(),
            2 + 3 + members.iter().map(|m| m.len()).sum::<usize>()
        );
        let long = vec![7u8; 300];
        let enc = encode_members(&[&long[..]]);
        assert_eq!(enc.len(), 2 + 2 + 300);
        assert_eq!(decode_members(&enc).unwrap(), [&long[..]]);
    }

    #[test]
    fn members_written_in_the_first_encoding_are_still_read() {
        let members: [&[u8]; 3] = [b"b", b"", b"a longer member"];
        let mut v1 = vec![COLLECTION_V1];
        v1.extend_from_slice(&3u32.to_le_bytes());
        for m in members {
            v1.extend_from_slice(&(m.len() as u32).to_le_bytes());
            v1.extend_from_slice(m);
        }
        assert_eq!(decode_members(&v1).unwrap(), members);
        for cut in 0..v1.len() {
            assert!(decode_members(&v1[..cut]).is_err(), "cut at {cut}");
        }
        v1[1..5].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_members(&v1).is_err());
    }
}
