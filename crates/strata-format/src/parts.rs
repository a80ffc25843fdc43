//! A large hash, set, sorted set or list stored as parts: one record of the warm store's
//! `parts` family per field, member or element, under the part key of
//! [`crate::keys::part_key`], and a record in the `records` family that says where they are
//! ([`crate::WarmValue::Parted`]). A change to one field writes that field's part and the
//! record, not the whole value.
//!
//! ```text
//! part key   = the value's parts prefix (key and version) | name
//! name       = the field or member; a list element's position (u64 big-endian)
//! part value = crc32c u32 (of part key || item) | item
//! item       = the field, member, entry or element as the whole value's encoding
//!              (version 2) writes it (hash::put_field, members::put_member, a zset entry)
//! ```
//!
//! The whole value is the collection's header and its items in the order of their part
//! keys (by name), so reading it back is one pass over a prefix of the family; a sorted
//! set's entries are then sorted by score ([`in_order`]).
//!
//! A list's elements stand at consecutive positions, the first written whole at
//! [`LIST_HEAD`]: a push at the head takes the position below the first, one at the tail
//! the one past the last, so pushes and pops write the elements they move alone. An
//! insert or a removal in the middle moves the elements on its shorter side by one
//! ([`list_changes`]). The record keeps the head ([`crate::Parted::head`]), so neither a
//! read nor a change looks for it past the deletes its pops left.
//!
//! A sorted set stored as parts also keeps a score index (family `scores`), one entry per
//! member under the same prefix, so a range read walks the entries it answers with:
//!
//! ```text
//! score key   = the value's parts prefix | score (keys::encode_score, 8 bytes) | member
//! score value = crc32c u32 (of the score key and the sign) | sign u8 (1), for -0 alone
//! ```
//!
//! The key orders `-0` as `0` (Redis compares them equal, so their members sort by name);
//! the sign byte gives the score back as it was written.

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::delta::ListOp;
use crate::hash::decode_hash;
use crate::members::decode_members;
use crate::{collection_items, FormatError, Kind, Result};

/// The position of the first element of a list stored whole as parts: the middle of the
/// range, so either end has room to grow.
pub const LIST_HEAD: u64 = 1 << 63;

/// The part name of list position `p`: big-endian, so the parts sort in the list's order.
pub fn list_position(p: u64) -> [u8; 8] {
    p.to_be_bytes()
}

/// The list position a part name holds.
pub fn decode_list_position(name: &[u8]) -> Result<u64> {
    let b: [u8; 8] = name.try_into().map_err(|_| FormatError::Bad {
        what: "list part",
        detail: format!("a position of {} bytes", name.len()),
    })?;
    Ok(u64::from_be_bytes(b))
}

/// What a list delta's operations do to a list stored as parts at the positions
/// `head..head + len`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ListChanges {
    /// The first element's position after them.
    pub head: u64,
    /// How many elements there are after them.
    pub len: u64,
    /// Each position they change: its new item (an element as
    /// [`crate::members::put_member`] writes it), or `None` where none stands any more.
    pub parts: BTreeMap<u64, Option<Vec<u8>>>,
    /// How many stored items were read to move them.
    pub read: usize,
}

/// The changes `ops` make to a list stored as parts at `head..head + len`; `stored` reads
/// the item stored at a position (for the elements an insert or a removal moves: those on
/// its shorter side). An operation that does not fit the list is an error.
pub fn list_changes(
    head: u64,
    len: u64,
    ops: &[ListOp<'_>],
    mut stored: impl FnMut(u64) -> Result<Vec<u8>>,
) -> Result<ListChanges> {
    let mut c = ListChanges {
        head,
        len,
        ..Default::default()
    };
    for op in ops {
        c.apply(*op, &mut stored)?;
    }
    Ok(c)
}

impl ListChanges {
    fn apply(
        &mut self,
        op: ListOp<'_>,
        stored: &mut dyn FnMut(u64) -> Result<Vec<u8>>,
    ) -> Result<()> {
        let bad = |detail: &str| FormatError::Bad {
            what: "list delta",
            detail: detail.to_string(),
        };
        let item = |e: &[u8]| {
            let mut v = Vec::with_capacity(e.len() + 5);
            crate::members::put_member(&mut v, e);
            v
        };
        let len = self.len;
        match op {
            ListOp::PushFront(e) => {
                self.head = self
                    .head
                    .checked_sub(1)
                    .ok_or_else(|| bad("no room at the head"))?;
                self.parts.insert(self.head, Some(item(e)));
                self.len += 1;
            }
            ListOp::PushBack(e) => {
                let p = self.at(len)?;
                self.parts.insert(p, Some(item(e)));
                self.len += 1;
            }
            ListOp::PopFront(n) | ListOp::PopBack(n) if n as u64 > len => {
                return Err(bad("pops more elements than the list holds"))
            }
            ListOp::PopFront(n) => {
                for i in 0..n as u64 {
                    self.parts.insert(self.at(i)?, None);
                }
                self.head = self.at(n as u64)?;
                self.len -= n as u64;
            }
            ListOp::PopBack(n) => {
                for i in len - n as u64..len {
                    self.parts.insert(self.at(i)?, None);
                }
                self.len -= n as u64;
            }
            ListOp::Set(i, _) | ListOp::Remove(i) if i as u64 >= len => {
                return Err(bad("an index past the end"))
            }
            ListOp::Set(i, e) => {
                self.parts.insert(self.at(i as u64)?, Some(item(e)));
            }
            ListOp::Insert(i, _) if i as u64 > len => return Err(bad("inserts past the end")),
            ListOp::Insert(i, e) => {
                let i = i as u64;
                if i < len - i {
                    // The elements before it move one towards the head.
                    let head = self
                        .head
                        .checked_sub(1)
                        .ok_or_else(|| bad("no room at the head"))?;
                    for j in 0..i {
                        let v = self.get(self.at(j)?, stored)?;
                        self.parts.insert(head + j, Some(v));
                    }
                    self.head = head;
                } else {
                    // Those from it on move one towards the tail.
                    for j in (i..len).rev() {
                        let v = self.get(self.at(j)?, stored)?;
                        self.parts.insert(self.at(j + 1)?, Some(v));
                    }
                }
                self.parts.insert(self.at(i)?, Some(item(e)));
                self.len += 1;
            }
            ListOp::Remove(i) => {
                let i = i as u64;
                if i < len - 1 - i {
                    // The elements before it move one towards the tail.
                    for j in (0..i).rev() {
                        let v = self.get(self.at(j)?, stored)?;
                        self.parts.insert(self.at(j + 1)?, Some(v));
                    }
                    self.parts.insert(self.head, None);
                    self.head = self.at(1)?;
                } else {
                    for j in i + 1..len {
                        let v = self.get(self.at(j)?, stored)?;
                        self.parts.insert(self.at(j - 1)?, Some(v));
                    }
                    self.parts.insert(self.at(len - 1)?, None);
                }
                self.len -= 1;
            }
        }
        Ok(())
    }

    /// The position of index `i`.
    fn at(&self, i: u64) -> Result<u64> {
        self.head.checked_add(i).ok_or_else(|| FormatError::Bad {
            what: "list delta",
            detail: "no room at the tail".into(),
        })
    }

    /// The item at position `p`: as changed, or as stored.
    fn get(&mut self, p: u64, stored: &mut dyn FnMut(u64) -> Result<Vec<u8>>) -> Result<Vec<u8>> {
        match self.parts.get(&p) {
            Some(Some(v)) => Ok(v.clone()),
            Some(None) => Err(FormatError::Bad {
                what: "list delta",
                detail: format!("reads position {p}, which it emptied"),
            }),
            None => {
                self.read += 1;
                stored(p)
            }
        }
    }
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

/// The value of a score-index entry (family `scores`, key [`crate::keys::score_key`]) of
/// `score`: the checksum of its key, which holds the score and the member, and of
/// `score`'s sign when it is `-0` (which the key holds as `0`).
pub fn encode_score_entry(score_key: &[u8], score: f64) -> Vec<u8> {
    let negative_zero = score == 0.0 && score.is_sign_negative();
    let sign: &[u8] = if negative_zero { &[1] } else { &[] };
    let mut out = crc32c::crc32c_append(crc32c::crc32c(score_key), sign)
        .to_le_bytes()
        .to_vec();
    out.extend_from_slice(sign);
    out
}

/// The score and member of the score-index entry `score_key` of a value whose parts start
/// with `prefix`, its checksum (`value`) verified.
pub fn decode_score_entry<'a>(
    prefix: &[u8],
    score_key: &'a [u8],
    value: &[u8],
) -> Result<(f64, &'a [u8])> {
    let negative_zero = value.get(4) == Some(&1);
    let sign = if negative_zero { -0.0 } else { 0.0 };
    if value != encode_score_entry(score_key, sign) {
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
    if negative_zero && score != 0.0 {
        return Err(FormatError::Bad {
            what: "score entry",
            detail: format!("the sign of -0 on a score of {score}"),
        });
    }
    Ok((if negative_zero { -0.0 } else { score }, member))
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
        Kind::Hash | Kind::VectorSet => crate::hash::encode_hash(&decode_hash(b)?),
        Kind::ZSet => crate::zset::encode_zset(&crate::zset::decode_zset(b)?),
        _ => crate::members::encode_members(&decode_members(b)?),
    }))
}

/// The items of the value `b` of `kind` in the current encoding ([`in_current_encoding`]):
/// each as its name and its bytes, in order. (A list element's name is itself: its part's
/// is its position, [`list_position`].)
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
            Kind::Hash | Kind::VectorSet => {
                crate::hash::field_at(rest).map(|(f, len)| (f.name, len))?
            }
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

    #[test]
    fn list_operations_on_positions_leave_the_list_a_model_holds() {
        use crate::delta::ListOp;
        use std::collections::VecDeque;
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n.max(1)
        };
        let element = |i: u64| format!("e{i}").into_bytes();
        let item = |e: &[u8]| {
            let mut v = Vec::new();
            crate::members::put_member(&mut v, e);
            v
        };
        // The store: position -> item; the list as a model keeps it.
        let mut model: VecDeque<Vec<u8>> = (0..20).map(element).collect();
        let mut store: BTreeMap<u64, Vec<u8>> = (0..20)
            .map(|i| (LIST_HEAD + i, item(&element(i))))
            .collect();
        let (mut head, mut made) = (LIST_HEAD, 100);
        for round in 0..300 {
            let mut elements = Vec::new();
            let mut picks = Vec::new();
            for _ in 0..1 + next(6) {
                made += 1;
                elements.push(element(made));
                picks.push((next(7), next(1000)));
            }
            let mut ops = Vec::new();
            for ((what, r), e) in picks.iter().zip(&elements) {
                let len = model.len() as u64;
                let op = match what {
                    0 => ListOp::PushFront(e),
                    1 => ListOp::PushBack(e),
                    2 if len > 0 => ListOp::PopFront(1 + (*r % len.min(3)) as usize),
                    3 if len > 0 => ListOp::PopBack(1 + (*r % len.min(3)) as usize),
                    4 if len > 0 => ListOp::Set((*r % len) as usize, e),
                    5 => ListOp::Insert((*r % (len + 1)) as usize, e),
                    6 if len > 0 => ListOp::Remove((*r % len) as usize),
                    _ => ListOp::PushBack(e),
                };
                match op {
                    ListOp::PushFront(e) => model.push_front(e.to_vec()),
                    ListOp::PushBack(e) => model.push_back(e.to_vec()),
                    ListOp::PopFront(n) => drop(model.drain(..n)),
                    ListOp::PopBack(n) => model.truncate(model.len() - n),
                    ListOp::Set(i, e) => model[i] = e.to_vec(),
                    ListOp::Insert(i, e) => model.insert(i, e.to_vec()),
                    ListOp::Remove(i) => drop(model.remove(i)),
                }
                ops.push(op);
            }
            let len = store.len() as u64;
            let c = list_changes(head, len, &ops, |p| {
                Ok(store.get(&p).cloned().expect("a stored position"))
            })
            .unwrap();
            assert!(
                c.read as u64 <= len,
                "round {round}: read {} of {len}",
                c.read
            );
            for (p, v) in c.parts {
                match v {
                    Some(v) => store.insert(p, v),
                    None => store.remove(&p),
                };
            }
            head = c.head;
            assert_eq!(c.len, model.len() as u64);
            // Consecutive from the head, and the model's elements in order.
            let positions: Vec<u64> = store.keys().copied().collect();
            let expect: Vec<u64> = (head..head + c.len).collect();
            assert_eq!(positions, expect, "round {round}");
            let items: Vec<Vec<u8>> = model.iter().map(|e| item(e)).collect();
            assert_eq!(
                store.values().cloned().collect::<Vec<_>>(),
                items,
                "round {round}"
            );
        }
        // Operations that do not fit the list are errors.
        let none = |_| unreachable!("nothing is read");
        assert!(list_changes(LIST_HEAD, 2, &[ListOp::PopFront(3)], none).is_err());
        assert!(list_changes(LIST_HEAD, 2, &[ListOp::Set(2, b"x")], none).is_err());
        assert!(list_changes(LIST_HEAD, 2, &[ListOp::Insert(3, b"x")], none).is_err());
        assert!(list_changes(0, 0, &[ListOp::PushFront(b"x")], none).is_err());
        assert_eq!(decode_list_position(&list_position(7)).unwrap(), 7);
        assert!(decode_list_position(b"short").is_err());
    }

    #[test]
    fn a_score_entry_gives_back_minus_zero_and_checks_its_sign() {
        use crate::keys::{score_key, Key};
        let key = Key::new(0, 0, b"z");
        let k = score_key(&key, 1, -0.0, b"m");
        assert_eq!(k, score_key(&key, 1, 0.0, b"m"), "ordered as 0");
        let prefix = crate::keys::parts_prefix(&key, 1);
        for score in [-0.0, 0.0, -1.5, 2.0] {
            let k = score_key(&key, 1, score, b"m");
            let v = encode_score_entry(&k, score);
            let (back, member) = decode_score_entry(&prefix, &k, &v).unwrap();
            assert_eq!(back.to_bits(), score.to_bits(), "{score}");
            assert_eq!(member, b"m");
        }
        // The sign byte dropped or added without its checksum is caught.
        let v = encode_score_entry(&k, -0.0);
        assert!(decode_score_entry(&prefix, &k, &v[..4]).is_err());
        let mut plus = encode_score_entry(&k, 0.0);
        plus.push(1);
        assert!(decode_score_entry(&prefix, &k, &plus).is_err());
    }
}
