//! A large hash, set or sorted set stored as parts: one record of the warm store's `parts`
//! family per field or member, under the part key of [`crate::keys::part_key`], and a
//! record in the `records` family that says where they are ([`crate::WarmValue::Parted`]).
//! A change to one field writes that field's part and the record, not the whole value.
//!
//! ```text
//! part key   = the value's parts prefix (key and version) | name
//! part value = crc32c u32 (of part key || item) | item
//! item       = the field, member or entry as the whole value's encoding (version 2)
//!              writes it (hash::put_field, members::put_member, a zset entry)
//! ```
//!
//! The whole value is the collection's header and its items in the order of their part
//! keys (by name), so reading it back is one pass over a prefix of the family; a sorted
//! set's entries are then sorted by score ([`in_order`]).
//!
//! A sorted set stored as parts also keeps a score index (family `scores`), one entry per
//! member under the same prefix, so a range read walks the entries it answers with:
//!
//! ```text
//! score key   = the value's parts prefix | score (keys::encode_score, 8 bytes) | member
//! score value = crc32c u32 (of the score key)
//! ```

use std::borrow::Cow;

use crate::hash::decode_hash;
use crate::members::decode_members;
use crate::{collection_items, FormatError, Kind, Result};

/// The kinds stored as parts when large: those whose items have names of their own.
pub fn kind_has_parts(kind: Kind) -> bool {
    matches!(kind, Kind::Hash | Kind::Set | Kind::ZSet)
}

/// The value of `kind` made of a header and items in the order of their names (what the
/// parts add up to) put in the order its encoding keeps: a sorted set's entries by score,
/// others as they are.
pub fn in_order(kind: Kind, value: Vec<u8>) -> Result<Vec<u8>> {
    if kind != Kind::ZSet {
        return Ok(value);
    }
    let mut entries = crate::zset::decode_zset(&value)?;
    entries.sort_by(crate::zset::order);
    Ok(crate::zset::encode_zset(&entries))
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

/// The value of a score-index entry (family `scores`, key [`crate::keys::score_key`]):
/// the checksum of its key, which holds the score and the member.
pub fn encode_score_entry(score_key: &[u8]) -> [u8; 4] {
    crc32c::crc32c(score_key).to_le_bytes()
}

/// The score and member of the score-index entry `score_key` of a value whose parts start
/// with `prefix`, its checksum (`value`) verified.
pub fn decode_score_entry<'a>(
    prefix: &[u8],
    score_key: &'a [u8],
    value: &[u8],
) -> Result<(f64, &'a [u8])> {
    if value != encode_score_entry(score_key) {
        return Err(FormatError::Checksum {
            what: "score entry",
        });
    }
    let rest = score_key.strip_prefix(prefix).filter(|r| r.len() >= 8);
    let Some(rest) = rest else {
        return Err(FormatError::Truncated {
            what: "score entry",
            need: prefix.len() + 8,
            have: score_key.len(),
        });
    };
    let (score, member) = rest.split_at(8);
    let score = crate::keys::decode_score(score.try_into().expect("8 bytes"));
    Ok((score, member))
}

fn part_checksum(part_key: &[u8], item: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(part_key), item)
}

/// The value `b` of `kind` (a hash, a set or a sorted set) in the current encoding
/// (version 2): as it is, or written again from the first.
pub fn in_current_encoding(kind: Kind, b: &[u8]) -> Result<Cow<'_, [u8]>> {
    if collection_items(b)?.is_some() {
        return Ok(Cow::Borrowed(b));
    }
    Ok(Cow::Owned(match kind {
        Kind::Hash => crate::hash::encode_hash(&decode_hash(b)?),
        Kind::ZSet => crate::zset::encode_zset(&crate::zset::decode_zset(b)?),
        _ => crate::members::encode_members(&decode_members(b)?),
    }))
}

/// The items of the value `b` of `kind` in the current encoding ([`in_current_encoding`]):
/// each as its name and its bytes, in order.
pub fn items(kind: Kind, b: &[u8]) -> Result<Vec<(&[u8], &[u8])>> {
    let Some((count, start)) = collection_items(b)? else {
        return Err(FormatError::Bad {
            what: "collection",
            detail: "not in the current encoding".into(),
        });
    };
    let mut out = Vec::with_capacity(count);
    let mut at = start;
    for _ in 0..count {
        let rest = &b[at..];
        let (name, len) = match kind {
            Kind::Hash => crate::hash::field_at(rest).map(|(f, len)| (f.name, len))?,
            Kind::ZSet => crate::zset::entry_at(rest).map(|((_, m), len)| (m, len))?,
            _ => crate::members::member_at(rest)?,
        };
        out.push((name, &rest[..len]));
        at += len;
    }
    if at != b.len() {
        return Err(FormatError::Bad {
            what: "collection",
            detail: format!("{} bytes after the last item", b.len() - at),
        });
    }
    Ok(out)
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
        let got = items(Kind::Hash, &v).unwrap();
        let names: Vec<&[u8]> = got.iter().map(|i| i.0).collect();
        assert_eq!(names, [&b"a"[..], b"bb"]);
        let mut again = crate::collection_buf(2, v.len());
        got.iter().for_each(|i| again.extend_from_slice(i.1));
        assert_eq!(again, v);

        let s = encode_members(&[b"x".as_slice(), b"yy"]);
        let mut again = crate::collection_buf(2, s.len());
        for (_, item) in items(Kind::Set, &s).unwrap() {
            again.extend_from_slice(item);
        }
        assert_eq!(again, s);
        assert!(items(Kind::Set, &s[..s.len() - 1]).is_err());
    }

    #[test]
    fn a_sorted_sets_entries_by_name_are_put_back_in_score_order() {
        let entries: Vec<(f64, &[u8])> = vec![(-1.5, b"z"), (2.0, b"a"), (2.0, b"b"), (9.0, b"c")];
        let v = crate::zset::encode_zset(&entries);
        let mut got = items(Kind::ZSet, &v).unwrap();
        let names: Vec<&[u8]> = got.iter().map(|i| i.0).collect();
        assert_eq!(names, [&b"z"[..], b"a", b"b", b"c"]);
        // As the parts hold them: by name.
        got.sort_by(|a, b| a.0.cmp(b.0));
        let mut by_name = crate::collection_buf(got.len(), v.len());
        got.iter().for_each(|i| by_name.extend_from_slice(i.1));
        assert_ne!(by_name, v);
        assert_eq!(in_order(Kind::ZSet, by_name).unwrap(), v);
        assert!(items(Kind::ZSet, &v[..v.len() - 1]).is_err());
        // Other kinds keep the order they are given.
        assert_eq!(in_order(Kind::Set, vec![2, 0]).unwrap(), vec![2, 0]);
    }
}
