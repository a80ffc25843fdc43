//! A change to a collection (hash, set, sorted set) as the hot log records it: the items
//! set or changed, and the names removed, instead of the whole value again. A record of a
//! thousand-member change to a million-member set costs the thousand.
//!
//! ```text
//! delta = ver u8 (1) | puts_len u32 | puts | removed
//! puts    = the kind's own value of the items set or changed (a hash's fields, a set's
//!           members, a sorted set's entries), in the order they stand in the collection
//! removed = a members value (crate::members) of the names removed
//! ```
//!
//! [`apply`] removes the names first, then sets the items: one set where the name is, added
//! at the end (a hash, a set) or in order (a sorted set) where it is not. A name removed and
//! set again since the last record is in both, so it goes to the end as it did live.
//!
//! A list's elements have no names: its delta ([`ListDelta`]) is what its commands did, in
//! order.
//!
//! ```text
//! list delta = ver u8 (2) | op*
//! op = 1 | len u32 | element     pushed at the head
//!    | 2 | len u32 | element     pushed at the tail
//!    | 3 | n u32                 n popped from the head
//!    | 4 | n u32                 n popped from the tail
//!    | 5 | index u32 | len u32 | element    set at index
//!    | 6 | index u32 | len u32 | element    inserted before index (at the end if it is
//!                                           the length)
//!    | 7 | index u32                        removed from index
//! ```

use std::collections::{HashMap, VecDeque};

use crate::hash::{decode_hash, encode_hash};
use crate::members::{decode_members, encode_members};
use crate::zset::{decode_zset, encode_zset, order};
use crate::{FormatError, Kind, Reader, Result};

const DELTA_VERSION: u8 = 1;
const LIST_DELTA_VERSION: u8 = 2;
const PUSH_FRONT: u8 = 1;
const PUSH_BACK: u8 = 2;
const POP_FRONT: u8 = 3;
const POP_BACK: u8 = 4;
const SET_AT: u8 = 5;
const INSERT_AT: u8 = 6;
const REMOVE_AT: u8 = 7;

/// What a list's commands did since its last record, in order (see the module doc).
#[derive(Debug, Clone, Default)]
pub struct ListDelta {
    ops: Vec<u8>,
}

impl ListDelta {
    pub fn push_front(&mut self, element: &[u8]) {
        self.element(PUSH_FRONT, element);
    }

    pub fn push_back(&mut self, element: &[u8]) {
        self.element(PUSH_BACK, element);
    }

    pub fn pop_front(&mut self, n: usize) {
        self.ops.push(POP_FRONT);
        self.ops.extend_from_slice(&(n as u32).to_le_bytes());
    }

    pub fn pop_back(&mut self, n: usize) {
        self.ops.push(POP_BACK);
        self.ops.extend_from_slice(&(n as u32).to_le_bytes());
    }

    pub fn set(&mut self, index: usize, element: &[u8]) {
        self.at(SET_AT, index, element);
    }

    /// `element` went in before `index` (`LINSERT`); at the end if `index` is the length.
    pub fn insert(&mut self, index: usize, element: &[u8]) {
        self.at(INSERT_AT, index, element);
    }

    /// The element at `index` went (`LREM`).
    pub fn remove(&mut self, index: usize) {
        self.ops.push(REMOVE_AT);
        self.ops.extend_from_slice(&(index as u32).to_le_bytes());
    }

    fn at(&mut self, op: u8, index: usize, element: &[u8]) {
        self.ops.push(op);
        self.ops.extend_from_slice(&(index as u32).to_le_bytes());
        self.ops
            .extend_from_slice(&(element.len() as u32).to_le_bytes());
        self.ops.extend_from_slice(element);
    }

    fn element(&mut self, op: u8, element: &[u8]) {
        self.ops.push(op);
        self.ops
            .extend_from_slice(&(element.len() as u32).to_le_bytes());
        self.ops.extend_from_slice(element);
    }

    /// The delta's bytes.
    pub fn finish(self) -> Vec<u8> {
        let mut out = Vec::with_capacity(1 + self.ops.len());
        out.push(LIST_DELTA_VERSION);
        out.extend_from_slice(&self.ops);
        out
    }
}

/// One operation of a [`ListDelta`], as read back by [`list_ops`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListOp<'a> {
    PushFront(&'a [u8]),
    PushBack(&'a [u8]),
    PopFront(usize),
    PopBack(usize),
    /// The element at this index set to this one.
    Set(usize, &'a [u8]),
    /// This element inserted before this index (at the end if it is the length).
    Insert(usize, &'a [u8]),
    /// The element at this index removed.
    Remove(usize),
}

/// The operations of the list delta `d`, in order. Whether they fit the list is for
/// whoever applies them to say.
pub fn list_ops(d: &[u8]) -> Result<Vec<ListOp<'_>>> {
    let mut r = Reader::new(d, "list delta");
    if r.u8()? != LIST_DELTA_VERSION {
        return Err(FormatError::Bad {
            what: "list delta",
            detail: "not a list delta".into(),
        });
    }
    let mut ops = Vec::new();
    while r.remaining() > 0 {
        let op = r.u8()?;
        let index = match op {
            SET_AT | INSERT_AT | REMOVE_AT => r.u32()? as usize,
            _ => 0,
        };
        ops.push(match op {
            PUSH_FRONT | PUSH_BACK | SET_AT | INSERT_AT => {
                let len = r.u32()? as usize;
                let e = r.bytes(len)?;
                match op {
                    PUSH_FRONT => ListOp::PushFront(e),
                    PUSH_BACK => ListOp::PushBack(e),
                    SET_AT => ListOp::Set(index, e),
                    _ => ListOp::Insert(index, e),
                }
            }
            POP_FRONT => ListOp::PopFront(r.u32()? as usize),
            POP_BACK => ListOp::PopBack(r.u32()? as usize),
            REMOVE_AT => ListOp::Remove(index),
            op => {
                return Err(FormatError::Bad {
                    what: "list delta",
                    detail: format!("unknown op {op}"),
                })
            }
        });
    }
    Ok(ops)
}

/// `base`, a list's value, with the list deltas `deltas` applied in order.
fn apply_list(base: &[u8], deltas: &[&[u8]]) -> Result<Vec<u8>> {
    let bad = |detail: &str| FormatError::Bad {
        what: "list delta",
        detail: detail.to_string(),
    };
    let mut list: VecDeque<&[u8]> = decode_members(base)?.into();
    for d in deltas {
        for op in list_ops(d)? {
            match op {
                ListOp::PushFront(e) => list.push_front(e),
                ListOp::PushBack(e) => list.push_back(e),
                ListOp::PopFront(n) | ListOp::PopBack(n) if n > list.len() => {
                    return Err(bad("pops more elements than the list holds"))
                }
                ListOp::PopFront(n) => drop(list.drain(..n)),
                ListOp::PopBack(n) => list.truncate(list.len() - n),
                ListOp::Set(i, e) => {
                    *list.get_mut(i).ok_or_else(|| bad("sets past the end"))? = e;
                }
                ListOp::Insert(i, _) if i > list.len() => return Err(bad("inserts past the end")),
                ListOp::Insert(i, e) => list.insert(i, e),
                ListOp::Remove(i) => {
                    list.remove(i).ok_or_else(|| bad("removes past the end"))?;
                }
            }
        }
    }
    let list: Vec<&[u8]> = list.into_iter().collect();
    Ok(encode_members(&list))
}

/// Encodes a delta: `puts`, the kind's value of the items set, and `removed`, the names
/// removed.
pub fn encode_delta<M: AsRef<[u8]>>(puts: &[u8], removed: &[M]) -> Vec<u8> {
    let removed = encode_members(removed);
    let mut out = Vec::with_capacity(1 + 4 + puts.len() + removed.len());
    out.push(DELTA_VERSION);
    out.extend_from_slice(&(puts.len() as u32).to_le_bytes());
    out.extend_from_slice(puts);
    out.extend_from_slice(&removed);
    out
}

/// The two parts of a delta: the kind's value of the items set, and the names removed.
pub fn decode_delta(b: &[u8]) -> Result<(&[u8], Vec<&[u8]>)> {
    let mut r = Reader::new(b, "delta");
    let version = r.u8()?;
    if version != DELTA_VERSION {
        return Err(FormatError::Bad {
            what: "delta",
            detail: format!("unknown version {version}"),
        });
    }
    let puts_len = r.u32()? as usize;
    let puts = r.bytes(puts_len)?;
    let rest = r.remaining();
    let removed = decode_members(r.bytes(rest)?)?;
    Ok((puts, removed))
}

/// Items in order by name, with removals as holes until the end.
struct Ordered<T> {
    items: Vec<Option<(Vec<u8>, T)>>,
    at: HashMap<Vec<u8>, usize>,
}

impl<T> Ordered<T> {
    fn new(items: impl Iterator<Item = (Vec<u8>, T)>) -> Self {
        let mut o = Ordered {
            items: Vec::new(),
            at: HashMap::new(),
        };
        for (name, item) in items {
            o.set(name, item);
        }
        o
    }

    fn remove(&mut self, name: &[u8]) {
        if let Some(i) = self.at.remove(name) {
            self.items[i] = None;
        }
    }

    fn set(&mut self, name: Vec<u8>, item: T) {
        match self.at.get(&name) {
            Some(&i) => self.items[i] = Some((name, item)),
            None => {
                self.at.insert(name.clone(), self.items.len());
                self.items.push(Some((name, item)));
            }
        }
    }

    fn into_items(self) -> impl Iterator<Item = (Vec<u8>, T)> {
        self.items.into_iter().flatten()
    }
}

/// `base`, a stored value of `kind`, with `deltas` applied in order: the stored value they
/// stand for. Strings have no deltas.
pub fn apply(kind: Kind, base: &[u8], deltas: &[&[u8]]) -> Result<Vec<u8>> {
    if kind == Kind::List {
        return apply_list(base, deltas);
    }
    let parts = deltas
        .iter()
        .map(|d| decode_delta(d))
        .collect::<Result<Vec<_>>>()?;
    match kind {
        Kind::Hash | Kind::VectorSet => {
            let fields = decode_hash(base)?.into_iter();
            let mut o =
                Ordered::new(fields.map(|f| (f.name.to_vec(), (f.value.to_vec(), f.expire_ms))));
            for (puts, removed) in &parts {
                removed.iter().for_each(|n| o.remove(n));
                for f in decode_hash(puts)? {
                    o.set(f.name.to_vec(), (f.value.to_vec(), f.expire_ms));
                }
            }
            let items: Vec<_> = o.into_items().collect();
            let fields: Vec<crate::hash::Field<'_>> = items
                .iter()
                .map(|(name, (value, expire_ms))| crate::hash::Field {
                    name,
                    value,
                    expire_ms: *expire_ms,
                })
                .collect();
            Ok(encode_hash(&fields))
        }
        Kind::Set => {
            let mut o = Ordered::new(decode_members(base)?.into_iter().map(|m| (m.to_vec(), ())));
            for (puts, removed) in &parts {
                removed.iter().for_each(|n| o.remove(n));
                for m in decode_members(puts)? {
                    o.set(m.to_vec(), ());
                }
            }
            let members: Vec<Vec<u8>> = o.into_items().map(|(m, ())| m).collect();
            Ok(encode_members(&members))
        }
        Kind::ZSet => {
            let mut scores: HashMap<Vec<u8>, f64> = decode_zset(base)?
                .into_iter()
                .map(|(s, m)| (m.to_vec(), s))
                .collect();
            for (puts, removed) in &parts {
                removed.iter().for_each(|n| {
                    scores.remove(*n);
                });
                for (s, m) in decode_zset(puts)? {
                    scores.insert(m.to_vec(), s);
                }
            }
            let mut entries: Vec<(f64, Vec<u8>)> =
                scores.into_iter().map(|(m, s)| (s, m)).collect();
            entries.sort_by(order);
            Ok(encode_zset(&entries))
        }
        other => Err(FormatError::Bad {
            what: "delta",
            detail: format!("a {} value has no deltas", other.name()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::Field;

    #[test]
    fn a_list_replays_its_pushes_pops_and_sets_in_order() {
        let base = encode_members(&["b", "c", "d"]);
        let mut d = ListDelta::default();
        d.push_front(b"a");
        d.push_back(b"e");
        d.pop_front(2);
        d.set(1, b"D");
        d.pop_back(1);
        d.push_front(b"x");
        let got = apply(Kind::List, &base, &[&d.finish()]).unwrap();
        assert_eq!(decode_members(&got).unwrap(), vec![&b"x"[..], b"c", b"D"]);
        for op in [POP_FRONT, POP_BACK] {
            let mut too_many = vec![LIST_DELTA_VERSION, op];
            too_many.extend_from_slice(&4u32.to_le_bytes());
            assert!(apply(Kind::List, &base, &[&too_many]).is_err());
        }
        let mut past = ListDelta::default();
        past.set(3, b"z");
        assert!(apply(Kind::List, &base, &[&past.finish()]).is_err());
        let whole = ListDelta::default().finish();
        for cut in 0..2 {
            let mut d = ListDelta::default();
            d.push_back(b"tail");
            let d = d.finish();
            assert!(apply(Kind::List, &base, &[&d[..d.len() - 1 - cut]]).is_err());
        }
        assert_eq!(apply(Kind::List, &base, &[&whole]).unwrap(), base);
    }

    fn field<'a>(name: &'a str, value: &'a str) -> Field<'a> {
        Field {
            name: name.as_bytes(),
            value: value.as_bytes(),
            expire_ms: 0,
        }
    }

    #[test]
    fn a_hash_keeps_its_fields_places_and_a_field_set_again_after_removal_goes_last() {
        let base = encode_hash(&[field("a", "1"), field("b", "2"), field("c", "3")]);
        let d1 = encode_delta(&encode_hash(&[field("b", "20"), field("d", "4")]), &["a"]);
        let d2 = encode_delta(&encode_hash(&[field("a", "10")]), &["c", "a", "absent"]);
        let got = apply(Kind::Hash, &base, &[&d1, &d2]).unwrap();
        assert_eq!(
            decode_hash(&got).unwrap(),
            vec![field("b", "20"), field("d", "4"), field("a", "10")]
        );
        assert_eq!(apply(Kind::Hash, &base, &[]).unwrap(), base);
    }

    #[test]
    fn a_set_adds_at_the_end_and_removes_in_place() {
        let base = encode_members(&["x", "y", "z"]);
        let d = encode_delta(&encode_members(&["w", "y"]), &["x"]);
        let got = apply(Kind::Set, &base, &[&d]).unwrap();
        assert_eq!(decode_members(&got).unwrap(), vec![&b"y"[..], b"z", b"w"]);
    }

    #[test]
    fn a_sorted_set_moves_members_to_their_new_scores_order() {
        let base = encode_zset(&[(1.0, "a"), (2.0, "b"), (3.0, "c")]);
        let d = encode_delta(&encode_zset(&[(0.5, "c"), (2.0, "bb")]), &["a"]);
        let got = apply(Kind::ZSet, &base, &[&d]).unwrap();
        assert_eq!(
            decode_zset(&got).unwrap(),
            vec![(0.5, &b"c"[..]), (2.0, b"b"), (2.0, b"bb")]
        );
    }

    #[test]
    fn damaged_deltas_and_kinds_without_deltas_are_refused() {
        let base = encode_members(&["x"]);
        let d = encode_delta(&encode_members(&["w"]), &["x"]);
        for cut in 0..d.len() {
            assert!(
                apply(Kind::Set, &base, &[&d[..cut]]).is_err(),
                "cut at {cut}"
            );
        }
        let mut bad = d.clone();
        bad[0] = 9;
        assert!(apply(Kind::Set, &base, &[&bad]).is_err());
        assert!(
            apply(Kind::List, &base, &[&d]).is_err(),
            "a set's delta on a list"
        );
        assert!(apply(Kind::String, b"v", &[&d]).is_err());
    }
}
