//! A large hash or set stored as parts: one record of the warm store's `parts` family per
//! field or member, under the part key of [`crate::keys::part_key`], and a record in the
//! `records` family that says where they are ([`crate::WarmValue::Parted`]). A change to one
//! field writes that field's part and the record, not the whole value.
//!
//! ```text
//! part key   = the value's parts prefix (key and version) | name
//! part value = crc32c u32 (of part key || item) | item
//! item       = the field or member as the whole value's encoding (version 2) writes it
//!              (hash::put_field, members::put_member)
//! ```
//!
//! The whole value is the collection's header and its items in the order of their part
//! keys (by name), so reading it back is one pass over a prefix of the family.

use crate::hash::{decode_hash, put_field};
use crate::members::{decode_members, put_member};
use crate::{collection_items, FormatError, Kind, Result};

/// The kinds stored as parts when large: those whose items have names of their own.
pub fn kind_has_parts(kind: Kind) -> bool {
    matches!(kind, Kind::Hash | Kind::Set)
}

/// A part's value: its checksum (over `part_key` and `item`), then `item`.
pub fn encode_part(part_key: &[u8], item: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + item.len());
    out.extend_from_slice(&part_checksum(part_key, item).to_le_bytes());
    out.extend_from_slice(item);
    out
}

/// The item of a part read under `part_key`, its checksum verified.
pub fn decode_part<'a>(part_key: &[u8], b: &'a [u8]) -> Result<&'a [u8]> {
    if b.len() < 4 {
        return Err(FormatError::Truncated {
            what: "part",
            need: 4,
            have: b.len(),
        });
    }
    let (crc, item) = b.split_at(4);
    if u32::from_le_bytes(crc.try_into().expect("4 bytes")) != part_checksum(part_key, item) {
        return Err(FormatError::Checksum { what: "part" });
    }
    Ok(item)
}

fn part_checksum(part_key: &[u8], item: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(part_key), item)
}

/// Calls `f` with each item of the value `b` of `kind` (a hash or a set, either encoding),
/// as its name and its bytes in the current encoding, in order; returns how many there
/// were.
pub fn for_each_item(kind: Kind, b: &[u8], mut f: impl FnMut(&[u8], &[u8])) -> Result<usize> {
    if let Some((count, start)) = collection_items(b)? {
        let mut at = start;
        for _ in 0..count {
            let rest = &b[at..];
            let (name, len) = match kind {
                Kind::Hash => crate::hash::field_at(rest).map(|(f, len)| (f.name, len))?,
                _ => crate::members::member_at(rest)?,
            };
            f(name, &rest[..len]);
            at += len;
        }
        if at != b.len() {
            return Err(FormatError::Bad {
                what: "collection",
                detail: format!("{} bytes after the last item", b.len() - at),
            });
        }
        return Ok(count);
    }
    // The first encoding: each item written again in the current one.
    let mut item = Vec::new();
    let n = match kind {
        Kind::Hash => {
            let fields = decode_hash(b)?;
            for field in &fields {
                item.clear();
                put_field(&mut item, field);
                f(field.name, &item);
            }
            fields.len()
        }
        _ => {
            let members = decode_members(b)?;
            for m in &members {
                item.clear();
                put_member(&mut item, m);
                f(m, &item);
            }
            members.len()
        }
    };
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::{encode_hash, Field};
    use crate::members::encode_members;

    #[test]
    fn a_part_read_under_another_key_or_changed_fails() {
        let p = encode_part(b"k1", b"item");
        assert_eq!(decode_part(b"k1", &p).unwrap(), b"item");
        assert!(decode_part(b"k2", &p).is_err());
        let mut bad = p.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert!(decode_part(b"k1", &bad).is_err());
        assert!(decode_part(b"k1", &p[..3]).is_err());
    }

    #[test]
    fn items_are_cut_from_a_value_and_add_up_to_it() {
        let fields = [
            Field {
                name: b"a",
                value: b"1",
                expire_ms: 0,
            },
            Field {
                name: b"bb",
                value: b"22",
                expire_ms: 7,
            },
        ];
        let v = encode_hash(&fields);
        let mut names = Vec::new();
        let mut again = crate::collection_buf(2, v.len());
        let n = for_each_item(Kind::Hash, &v, |name, item| {
            names.push(name.to_vec());
            again.extend_from_slice(item);
        })
        .unwrap();
        assert_eq!((n, names), (2, vec![b"a".to_vec(), b"bb".to_vec()]));
        assert_eq!(again, v);

        let s = encode_members(&[b"x".as_slice(), b"yy"]);
        let mut again = crate::collection_buf(2, s.len());
        for_each_item(Kind::Set, &s, |_, item| again.extend_from_slice(item)).unwrap();
        assert_eq!(again, s);
    }
}
