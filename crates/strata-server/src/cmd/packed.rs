//! [`Indexed`]: the items of a live hash or set packed as their stored value holds them,
//! back to back in one buffer, with the place of each, and a table from name to position
//! once the value is looked up often enough. A field of a 13-byte name and a 7-byte value
//! costs its 22 stored bytes, 4 for its place and about 6 of table; as two `Bytes` and an
//! expiry with a table of names it cost about 155 (`reports/findings-2026-12-06-large-collections.md`).
//! Encoding the value is copying the buffer behind a header.
//!
//! A value made live from its stored form (version 2, no field with an expiry), or just
//! encoded, reads its items from that stored value itself, shared with DRAM's copy, until
//! a change copies them to a buffer of its own: a value read in place costs no copy of its
//! items, and its replies share the stored buffer ([`Indexed::share`], [`Indexed::bulks`]).
//!
//! Positions are what commands see: an item keeps its position until one before it is
//! removed (in a value of up to [`ORDERED_ITEMS_MAX`] items) or it is the last and fills a
//! gap (in a larger one), so no item moves to a later position ([`ScanOptions::page`]). An
//! item changed to another length is packed again at the end and its old bytes are left as
//! garbage, which is dropped once it passes half the buffer.
//!
//! [`ScanOptions::page`]: super::typed::ScanOptions::page

use std::marker::PhantomData;

use bytes::Bytes;
use hashbrown::HashTable;
use strata_format::VALUE_BYTES_MAX;
use strata_resp::Reply;

use super::items::{table_due, Items, Touched, ORDERED_ITEMS_MAX};

/// How a kind's items are packed in an [`Indexed`]: as its stored value's format writes
/// them ([`strata_format::collection_buf`] and the items after it), so the packed items
/// behind a header are the value.
pub(crate) trait Pack: Send + 'static {
    /// An item as the whole-value way holds it ([`super::typed::Codec::Item`]).
    type Item: Send + 'static;
    /// An item read in place.
    type Ref<'a>: Named<'a>;
    fn as_ref(item: &Self::Item) -> Self::Ref<'_>;
    /// Bytes `put` writes for `item`.
    fn len(item: Self::Ref<'_>) -> usize;
    /// Appends `item` as the stored value holds it.
    fn put(out: &mut Vec<u8>, item: Self::Ref<'_>);
    /// The item at the start of `b` (a stored value's, or what `put` wrote), and its length.
    fn try_at(b: &[u8]) -> strata_format::Result<(Self::Ref<'_>, usize)>;
    /// The item `put` wrote at the start of `b`, and its length.
    #[inline]
    fn at(b: &[u8]) -> (Self::Ref<'_>, usize) {
        Self::try_at(b).expect("an Indexed holds the items it packed")
    }
    /// Whether `item` expires on its own (a hash field with a TTL): such a value is not
    /// read in place.
    fn timed(_item: Self::Ref<'_>) -> bool {
        false
    }
}

/// An item read in place, by the name that identifies it in its collection: a hash
/// field's name, a set's member.
pub(crate) trait Named<'a>: Copy {
    fn name(self) -> &'a [u8];
}

impl<'a> Named<'a> for &'a [u8] {
    fn name(self) -> &'a [u8] {
        self
    }
}

/// A set's members (or any collection of plain byte strings) packed as
/// [`strata_format::members`] stores them.
pub(crate) struct MemberPack;

impl Pack for MemberPack {
    type Item = bytes::Bytes;
    type Ref<'a> = &'a [u8];
    fn as_ref(item: &bytes::Bytes) -> &[u8] {
        item
    }
    fn len(item: &[u8]) -> usize {
        strata_format::varint_len(item.len() as u64) + item.len()
    }
    fn put(out: &mut Vec<u8>, item: &[u8]) {
        strata_format::members::put_member(out, item);
    }
    #[inline]
    fn try_at(b: &[u8]) -> strata_format::Result<(&[u8], usize)> {
        strata_format::members::member_at(b)
    }
}

/// Items looked up by name, packed ([`Pack`]; see the module doc). Looked up by comparing
/// names, or through a table from name to position once the value is looked up again (a
/// live value, kept between commands) and holds more than [`super::items::LINEAR_ITEMS_MAX`] items.
/// Changes are noted by name ([`Touched`]), so a large value's few changes are logged as a
/// delta.
pub(crate) struct Indexed<P: Pack> {
    /// The items as stored, back to back, with the garbage of changed and removed ones.
    body: Body,
    /// Where each item starts in the body, by position.
    starts: Vec<u32>,
    /// Positions, hashed by the name of the item at each.
    index: Option<(HashTable<u32>, ahash::RandomState)>,
    /// Bytes of the body no item holds.
    garbage: usize,
    /// The body holds the items in position order with no garbage: it is the stored
    /// value's body as it stands.
    in_order: bool,
    lookups: u32,
    touched: Touched,
    pack: PhantomData<P>,
}

/// Where an [`Indexed`]'s items lie.
enum Body {
    /// In a buffer of their own.
    Own(Vec<u8>),
    /// In a stored value, from this offset on: shared with it until a change.
    Shared(Bytes, usize),
}

impl Body {
    fn as_slice(&self) -> &[u8] {
        match self {
            Body::Own(v) => v,
            Body::Shared(b, from) => &b[*from..],
        }
    }

    /// The buffer to change, copied out of the stored value first if shared.
    fn own(&mut self) -> &mut Vec<u8> {
        if let Body::Shared(..) = self {
            *self = Body::Own(self.as_slice().to_vec());
        }
        match self {
            Body::Own(v) => v,
            Body::Shared(..) => unreachable!("made its own above"),
        }
    }
}

/// The items' buffer as one `Bytes` ([`Indexed::cutter`]), to cut replies from.
pub(crate) struct Cutter {
    bytes: Bytes,
    /// Where the items' buffer starts in memory: a part's offset in `bytes` is its
    /// address less this.
    base: usize,
}

impl Cutter {
    /// `part` (of one of the items) as a share of the buffer.
    pub(crate) fn cut(&self, part: &[u8]) -> Bytes {
        let at = part.as_ptr() as usize - self.base;
        self.bytes.slice(at..at + part.len())
    }
}

/// The item at position `i` (free of `self`, for the table's closures).
#[inline]
fn item_at<'b, P: Pack>(bytes: &'b [u8], starts: &[u32], i: usize) -> P::Ref<'b> {
    P::at(&bytes[starts[i] as usize..]).0
}

/// The table's hash of the item at position `p` (by its name).
fn hash_at<P: Pack>(hasher: &ahash::RandomState, bytes: &[u8], starts: &[u32], p: u32) -> u64 {
    hasher.hash_one(Named::name(item_at::<P>(bytes, starts, p as usize)))
}

/// The refusal of a collection grown past what one value may hold (`max` bytes).
fn too_large(bytes: usize, max: usize) -> strata_engine::Error {
    strata_engine::Error::Invalid(format!(
        "collection of {bytes} bytes exceeds the limit of {max}"
    ))
}

impl<P: Pack> Indexed<P> {
    /// The items in `body` at `starts`, in order, with no table yet.
    fn new(body: Body, starts: Vec<u32>) -> Self {
        Indexed {
            body,
            starts,
            index: None,
            garbage: 0,
            in_order: true,
            lookups: 0,
            touched: Touched::default(),
            pack: PhantomData,
        }
    }

    /// How many items it holds.
    pub(crate) fn len(&self) -> usize {
        self.starts.len()
    }

    /// The item at position `i`.
    pub(crate) fn get(&self, i: usize) -> P::Ref<'_> {
        item_at::<P>(self.body.as_slice(), &self.starts, i)
    }

    /// The items, in order.
    pub(crate) fn iter(&self) -> impl ExactSizeIterator<Item = P::Ref<'_>> + Clone + '_ {
        (0..self.len()).map(|i| self.get(i))
    }

    /// The stored bytes of the item at `i`.
    fn packed(&self, i: usize) -> &[u8] {
        let (body, start) = (self.body.as_slice(), self.starts[i] as usize);
        let len = P::at(&body[start..]).1;
        &body[start..start + len]
    }

    /// Where the item named `name` is.
    pub(crate) fn position(&mut self, name: &[u8]) -> Option<usize> {
        self.find(name).map(|(i, _)| i)
    }

    /// The item named `name` and where it is (a lookup: see [`Indexed::index_when_due`]).
    pub(crate) fn find(&mut self, name: &[u8]) -> Option<(usize, P::Ref<'_>)> {
        self.index_when_due();
        self.lookup(name)
    }

    /// [`Indexed::find`] through the table if there is one, else by comparing names; for
    /// many lookups of one command, after one [`Indexed::index_for`].
    pub(crate) fn lookup(&self, name: &[u8]) -> Option<(usize, P::Ref<'_>)> {
        let (bytes, starts) = (self.body.as_slice(), &self.starts);
        let named = |i: usize| {
            let item = item_at::<P>(bytes, starts, i);
            (Named::name(item) == name).then_some((i, item))
        };
        match &self.index {
            Some((table, hasher)) => {
                let mut found = None;
                table.find(hasher.hash_one(name), |&p| {
                    found = named(p as usize);
                    found.is_some()
                })?;
                found
            }
            None => (0..starts.len()).find_map(named),
        }
    }

    pub(crate) fn contains(&mut self, name: &[u8]) -> bool {
        self.position(name).is_some()
    }

    /// Builds the table from name to position when [`table_due`] says so (each call counts
    /// as a lookup): before removals by position of a value that may stay live (`SPOP`).
    pub(crate) fn index_when_due(&mut self) {
        self.index_for(1);
    }

    /// [`Indexed::index_when_due`] for a command about to look up `lookups` names (each
    /// counts, as if looked up one by one).
    pub(crate) fn index_for(&mut self, lookups: usize) {
        for _ in 0..lookups.min(2) {
            if self.index.is_some() {
                return;
            }
            if table_due(self.len(), &mut self.lookups) {
                self.build_index();
            }
        }
    }

    fn build_index(&mut self) {
        let hasher = ahash::RandomState::new();
        let mut table = HashTable::with_capacity(self.len());
        let (bytes, starts) = (self.body.as_slice(), &self.starts);
        let hash = |p: &u32| hash_at::<P>(&hasher, bytes, starts, *p);
        for p in 0..self.len() as u32 {
            table.insert_unique(hash(&p), p, hash);
        }
        self.index = Some((table, hasher));
    }

    /// Appends `item`, whose name none of the items has. Refused, changing nothing, when the
    /// value would pass [`VALUE_BYTES_MAX`].
    pub(crate) fn push(&mut self, item: P::Ref<'_>) -> strata_engine::Result<()> {
        self.room_for(P::len(item))?;
        let bytes = self.body.own();
        let start = bytes.len();
        P::put(bytes, item);
        let p = self.starts.len() as u32;
        self.starts.push(start as u32);
        if let Some((table, hasher)) = &mut self.index {
            let (bytes, starts) = (self.body.as_slice(), &self.starts);
            let hash = |p: &u32| hash_at::<P>(hasher, bytes, starts, *p);
            table.insert_unique(hash(&p), p, hash);
        }
        self.touched.set(Named::name(item), self.starts.len());
        Ok(())
    }

    /// Fails if `more` bytes of items would take the value past [`VALUE_BYTES_MAX`] (which
    /// also keeps every place within a `u32`: garbage never passes half the buffer).
    pub(crate) fn room_for(&self, more: usize) -> strata_engine::Result<()> {
        self.room_within(more, VALUE_BYTES_MAX)
    }

    fn room_within(&self, more: usize, max: usize) -> strata_engine::Result<()> {
        let live = self.body.as_slice().len() - self.garbage + more;
        match live > max {
            true => Err(too_large(live, max)),
            false => Ok(()),
        }
    }

    /// Replaces the item at `i` by what `f` packs from it (`f` appends one item, of the
    /// same name, with [`Pack::put`]). Refused, changing nothing, when the value would
    /// pass [`VALUE_BYTES_MAX`].
    pub(crate) fn replace(
        &mut self,
        i: usize,
        f: impl FnOnce(P::Ref<'_>, &mut Vec<u8>),
    ) -> strata_engine::Result<()> {
        let start = self.starts[i] as usize;
        let (old, old_len) = P::at(&self.body.as_slice()[start..]);
        let mut new = Vec::with_capacity(old_len + 8);
        f(old, &mut new);
        debug_assert_eq!(
            Named::name(P::at(&new).0),
            Named::name(old),
            "a change keeps the name"
        );
        if new.len() != old_len {
            self.room_for(new.len().saturating_sub(old_len))?;
        }
        self.touched.set(Named::name(old), self.starts.len());
        if new.len() == old_len {
            self.body.own()[start..start + old_len].copy_from_slice(&new);
            return Ok(());
        }
        let bytes = self.body.own();
        self.starts[i] = bytes.len() as u32;
        bytes.extend_from_slice(&new);
        self.garbage += old_len;
        self.in_order = false;
        self.collect_when_due();
        Ok(())
    }

    /// Removes the item at `i`. A value of up to [`ORDERED_ITEMS_MAX`] items keeps the
    /// others' order (as Redis's compact encodings do); in a larger one the last item takes
    /// its place, so a removal costs a lookup in the table, not a shift of every item after
    /// it. Either way no item moves to a later position: what
    /// [`super::typed::ScanOptions::page`] relies on.
    pub(crate) fn remove(&mut self, i: usize) {
        let start = self.starts[i] as usize;
        let (item, len) = P::at(&self.body.as_slice()[start..]);
        let last = self.starts.len() - 1;
        self.touched.removed(Named::name(item), last);
        if let Some((table, hasher)) = &mut self.index {
            let gone = table.find_entry(hasher.hash_one(Named::name(item)), |&p| p as usize == i);
            if let Ok(entry) = gone {
                entry.remove();
            }
        }
        if self.starts.len() <= ORDERED_ITEMS_MAX {
            self.starts.remove(i);
            if let Some((table, _)) = &mut self.index {
                for p in table.iter_mut().filter(|p| **p as usize > i) {
                    *p -= 1;
                }
            }
        } else {
            self.starts.swap_remove(i);
            if i < last {
                // The item that was last is now at `i`.
                let (bytes, starts) = (self.body.as_slice(), &self.starts);
                if let Some((table, hasher)) = &mut self.index {
                    let name = Named::name(item_at::<P>(bytes, starts, i));
                    if let Some(p) = table.find_mut(hasher.hash_one(name), |&p| p as usize == last)
                    {
                        *p = i as u32;
                    }
                }
            }
        }
        if i == last && start + len == self.body.as_slice().len() {
            self.body.own().truncate(start);
        } else {
            self.garbage += len;
            self.in_order = false;
            self.collect_when_due();
        }
    }

    /// Removes the items named in `names` (each found through [`Indexed::position`]); how
    /// many there were.
    pub(crate) fn remove_named<'n>(&mut self, names: impl IntoIterator<Item = &'n [u8]>) -> usize {
        let mut gone = 0;
        for name in names {
            if let Some(i) = self.position(name) {
                self.remove(i);
                gone += 1;
            }
        }
        gone
    }

    /// Packs the items again, in position order, once garbage passes half the buffer.
    fn collect_when_due(&mut self) {
        let len = self.body.as_slice().len();
        if self.garbage <= len / 2 {
            return;
        }
        let mut bytes = Vec::with_capacity(len - self.garbage);
        for i in 0..self.len() {
            let start = bytes.len() as u32;
            bytes.extend_from_slice(self.packed(i));
            self.starts[i] = start;
        }
        self.body = Body::Own(bytes);
        self.garbage = 0;
        self.in_order = true;
    }

    /// `part` (of one of the items) as a reply's bytes: a share of the stored value the
    /// items lie in, or a copy when they have a buffer of their own.
    pub(crate) fn share(&self, part: &[u8]) -> Bytes {
        match &self.body {
            Body::Shared(value, _) => value.slice_ref(part),
            Body::Own(_) => Bytes::copy_from_slice(part),
        }
    }

    /// What cuts every item's parts out of one buffer, for a reply of all of them
    /// (`HGETALL`, `SMEMBERS`): the stored value the items lie in, or one copy of their
    /// buffer (garbage and all) when they have their own.
    pub(crate) fn cutter(&self) -> Cutter {
        let body = self.body.as_slice();
        let bytes = match &self.body {
            Body::Shared(value, from) => value.slice(*from..),
            Body::Own(v) => Bytes::copy_from_slice(v),
        };
        Cutter {
            bytes,
            base: body.as_ptr() as usize,
        }
    }

    /// Bulk replies of `parts` (of the items; `None`: a null bulk): shares of the stored
    /// value the items lie in ([`Indexed::share`]), or, when they have a buffer of their
    /// own, slices of one copy of all the parts (one allocation for a reply of many items,
    /// where a copy apiece took one each).
    pub(crate) fn replies<'a>(
        &'a self,
        parts: impl Iterator<Item = Option<&'a [u8]>> + Clone + 'a,
    ) -> impl Iterator<Item = Reply> + 'a {
        let copy = match &self.body {
            Body::Shared(..) => None,
            Body::Own(_) => {
                let mut buf = Vec::with_capacity(parts.clone().flatten().map(<[u8]>::len).sum());
                for p in parts.clone().flatten() {
                    buf.extend_from_slice(p);
                }
                Some(Bytes::from(buf))
            }
        };
        let mut at = 0;
        parts.map(move |p| {
            let Some(p) = p else {
                return Reply::Null;
            };
            Reply::Bulk(match &copy {
                Some(buf) => {
                    at += p.len();
                    buf.slice(at - p.len()..at)
                }
                None => self.share(p),
            })
        })
    }

    /// The value of the items at `positions`, in that order.
    fn value_of(&self, positions: impl ExactSizeIterator<Item = usize> + Clone) -> Vec<u8> {
        let body: usize = positions.clone().map(|i| self.packed(i).len()).sum();
        let mut out = strata_format::collection_buf(positions.len(), 16 + body);
        for i in positions {
            out.extend_from_slice(self.packed(i));
        }
        out
    }
}

impl<P: Pack> Items<P::Item> for Indexed<P> {
    fn from_vec(items: Vec<P::Item>) -> Self {
        let body = items.iter().map(|i| P::len(P::as_ref(i))).sum();
        let mut bytes = Vec::with_capacity(body);
        let mut starts = Vec::with_capacity(items.len());
        for item in &items {
            starts.push(bytes.len() as u32);
            P::put(&mut bytes, P::as_ref(item));
        }
        Indexed::new(Body::Own(bytes), starts)
    }
    fn len(&self) -> usize {
        self.starts.len()
    }
    fn encode_with(&self, _encode: fn(&[P::Item]) -> Vec<u8>) -> Vec<u8> {
        if self.in_order {
            let body = self.body.as_slice();
            let mut out = strata_format::collection_buf(self.len(), 16 + body.len());
            out.extend_from_slice(body);
            return out;
        }
        self.value_of(0..self.len())
    }
    fn delta(&mut self, _encode: fn(&[P::Item]) -> Vec<u8>) -> Option<Vec<u8>> {
        let (set, removed) = self.touched.take()?;
        // The items set, in the order they stand (new ones last, as they were added).
        let mut at: Vec<usize> = set.iter().filter_map(|n| self.position(n)).collect();
        at.sort_unstable();
        let value = self.value_of(at.into_iter());
        Some(strata_format::delta::encode_delta(&value, &removed))
    }
    fn stored(&mut self) {
        self.touched.take();
    }
    fn encode_stored(&mut self, _encode: fn(&[P::Item]) -> Vec<u8>) -> Bytes {
        let body = self.body.as_slice().len() - self.garbage;
        let mut out = strata_format::collection_buf(self.len(), 16 + body);
        let from = out.len();
        for i in 0..self.len() {
            let start = (out.len() - from) as u32;
            out.extend_from_slice(self.packed(i));
            self.starts[i] = start;
        }
        let value = Bytes::from(out);
        self.body = Body::Shared(value.clone(), from);
        self.garbage = 0;
        self.in_order = true;
        value
    }
    fn from_stored(value: &Bytes) -> strata_format::Result<Option<Self>> {
        let Some((count, from)) = strata_format::collection_items(value)? else {
            return Ok(None);
        };
        let body = &value[from..];
        let mut starts = Vec::with_capacity(count);
        let mut at = 0;
        for _ in 0..count {
            let (item, len) = P::try_at(&body[at..])?;
            if P::timed(item) {
                return Ok(None);
            }
            starts.push(at as u32);
            at += len;
        }
        if at != body.len() {
            // Bytes after the last item: the whole decode says what is wrong.
            return Ok(None);
        }
        Ok(Some(Indexed::new(
            Body::Shared(value.clone(), from),
            starts,
        )))
    }
    /// The items' bytes, their places and the table's slots (a `u32` and a control byte
    /// each, at the table's load): what they hold, not the room their buffers grew to, so a
    /// value counts the same grown in place or decoded.
    fn live_bytes(&self) -> Option<usize> {
        let table = self.index.as_ref().map_or(0, |(t, _)| t.capacity() * 6);
        let body = self.body.as_slice().len();
        Some(std::mem::size_of::<Self>() + body + self.starts.len() * 4 + table)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use bytes::Bytes;

    use super::super::items::LINEAR_ITEMS_MAX;
    use super::*;
    use crate::cmd::items::next_random;

    /// The members of `set`, in order.
    fn members(set: &Indexed<MemberPack>) -> Vec<Bytes> {
        set.iter().map(Bytes::copy_from_slice).collect()
    }

    #[test]
    fn indexed_items_answer_alike_by_comparing_and_by_their_table() {
        let name = |i: usize| Bytes::from(format!("m{i}"));
        let mut by_table =
            <Indexed<MemberPack> as Items<Bytes>>::from_vec((0..100).map(name).collect());
        // The first lookup compares; the second builds the table (past 32 items).
        assert_eq!(by_table.position(b"m7"), Some(7));
        assert!(by_table.index.is_none());
        assert_eq!(by_table.position(b"m99"), Some(99));
        assert!(by_table.index.is_some());
        // Appends keep the table.
        by_table.push(&name(100)).unwrap();
        assert!(by_table.index.is_some());
        let mut by_comparing = <Indexed<MemberPack> as Items<Bytes>>::from_vec(members(&by_table));
        assert_eq!(by_table.remove_named([&b"gone"[..]]), 0);
        by_table.push(&name(200)).unwrap();
        assert_eq!(by_table.remove_named([&name(200)[..]]), 1);
        assert!(by_table.index.is_some(), "a removal keeps the table");
        assert_eq!(by_table.position(b"m1"), Some(1));
        assert_eq!(by_table.position(b"m2"), Some(2));
        for i in 0..110 {
            let n = format!("m{i}");
            let want = (i <= 100).then_some(i);
            assert_eq!(by_table.position(n.as_bytes()), want);
            by_comparing.lookups = 0;
            assert_eq!(by_comparing.position(n.as_bytes()), want);
            assert!(by_comparing.index.is_none());
        }
        // A small value never builds one.
        let mut small = <Indexed<MemberPack> as Items<Bytes>>::from_vec(
            (0..LINEAR_ITEMS_MAX).map(name).collect(),
        );
        for _ in 0..3 {
            assert!(small.contains(b"m3") && !small.contains(b"x"));
        }
        assert!(small.index.is_none());
    }

    #[test]
    fn removals_from_a_large_set_keep_its_table_and_move_no_member_later() {
        let name = |i: u64| Bytes::from(format!("m{i}"));
        let mut set: Indexed<MemberPack> = Items::from_vec((0..2000).map(name).collect());
        let mut x = 11u64;
        let mut model: HashSet<Bytes> = (0..2000).map(name).collect();
        // The table comes with the second lookup.
        set.position(b"m0");
        set.position(b"m1");
        for _ in 0..3000 {
            x = next_random(x);
            let m = name((x >> 33) % 2500);
            let before: HashMap<Bytes, usize> = members(&set)
                .into_iter()
                .enumerate()
                .map(|(i, m)| (m, i))
                .collect();
            if x.is_multiple_of(3) {
                let gone = set.remove_named([&m[..]]);
                assert_eq!(gone == 1, model.remove(&m));
                assert!(set.index.is_some(), "a removal keeps the table");
            } else if model.insert(m.clone()) {
                set.push(&m).unwrap();
            }
            for (i, m) in members(&set).iter().enumerate() {
                assert!(
                    before.get(m).is_none_or(|&was| i <= was),
                    "{m:?} moved later"
                );
            }
        }
        assert_eq!(set.len(), model.len());
        for m in &model {
            let i = set.position(m).expect("every member is found");
            assert_eq!(set.get(i), &m[..], "the table points at the member");
        }
        assert_eq!(set.position(b"absent"), None);
    }

    #[test]
    fn removals_from_a_value_of_up_to_128_items_keep_the_others_order() {
        let name = |i: usize| Bytes::from(format!("m{i}"));
        let mut set: Indexed<MemberPack> =
            Items::from_vec((0..ORDERED_ITEMS_MAX).map(name).collect());
        set.position(b"m0");
        set.position(b"m1");
        assert!(set.index.is_some());
        assert_eq!(set.remove_named([&b"m0"[..], &b"m50"[..]]), 2);
        let want: Vec<Bytes> = (1..ORDERED_ITEMS_MAX)
            .filter(|&i| i != 50)
            .map(name)
            .collect();
        assert_eq!(members(&set), want, "in the order they were added");
        for (i, m) in want.iter().enumerate() {
            assert_eq!(set.position(m), Some(i), "the table follows the shift");
        }
    }

    #[test]
    fn items_changed_to_other_lengths_are_packed_again_and_the_garbage_is_dropped() {
        let name = |i: u64| Bytes::from(format!("m{i}"));
        let mut set: Indexed<MemberPack> = Items::from_vec((0..300).map(name).collect());
        let mut model: Vec<Bytes> = (0..300).map(name).collect();
        set.position(b"m0");
        set.position(b"m1");
        let mut x = 3u64;
        let (mut collected, mut garbage_seen) = (0, 0);
        for step in 0..5000 {
            x = next_random(x);
            let i = (x >> 33) as usize % model.len();
            let m = name((x >> 20) % 100_000);
            if model.contains(&m) {
                continue;
            }
            match step % 3 {
                // A new name of another length takes the item's place (a test of the
                // buffer alone: a command keeps the name).
                0 => {
                    set.remove(i);
                    model.swap_remove(i);
                    set.push(&m).unwrap();
                    model.push(m);
                }
                _ => {
                    let before = set.body.as_slice().len();
                    set.push(&m).unwrap();
                    model.push(m);
                    let last = set.len() - 1;
                    set.remove(last.min(i));
                    model.swap_remove(last.min(i));
                    if set.body.as_slice().len() < before {
                        collected += 1;
                    }
                }
            }
            garbage_seen = garbage_seen.max(set.garbage);
            assert!(
                set.garbage <= set.body.as_slice().len() / 2,
                "garbage is dropped past half"
            );
        }
        assert!(
            collected > 0 && garbage_seen > 0,
            "{collected} {garbage_seen}"
        );
        assert_eq!(members(&set), model);
        for (i, m) in model.iter().enumerate() {
            assert_eq!(set.position(m), Some(i));
        }
        // The stored value is the same whether the buffer is in order or not.
        let want = strata_format::members::encode_members(&model);
        assert_eq!(set.encode_with(|_| unreachable!()), want);
        set.collect_when_due();
        let in_order = <Indexed<MemberPack> as Items<Bytes>>::from_vec(model.clone());
        assert!(in_order.in_order);
        assert_eq!(in_order.encode_with(|_| unreachable!()), want);
    }

    /// A test item: its first byte names it, the rest is its value.
    #[derive(Clone, Copy)]
    struct Keyed<'a>(&'a [u8]);

    impl<'a> Named<'a> for Keyed<'a> {
        fn name(self) -> &'a [u8] {
            &self.0[..1]
        }
    }

    struct KeyedPack;

    impl Pack for KeyedPack {
        type Item = Bytes;
        type Ref<'a> = Keyed<'a>;
        fn as_ref(item: &Bytes) -> Keyed<'_> {
            Keyed(item)
        }
        fn len(item: Keyed<'_>) -> usize {
            MemberPack::len(item.0)
        }
        fn put(out: &mut Vec<u8>, item: Keyed<'_>) {
            MemberPack::put(out, item.0)
        }
        fn try_at(b: &[u8]) -> strata_format::Result<(Keyed<'_>, usize)> {
            let (m, len) = MemberPack::try_at(b)?;
            Ok((Keyed(m), len))
        }
    }

    #[test]
    fn a_replaced_item_keeps_its_place_and_the_value_its_limit() {
        let b = |s: &str| Bytes::from(s.to_string());
        let mut set: Indexed<KeyedPack> = Items::from_vec(vec![b("a1"), b("b22"), b("c3")]);
        let values = |set: &Indexed<KeyedPack>| -> Vec<Vec<u8>> {
            set.iter().map(|k| k.0.to_vec()).collect()
        };
        // Same length: in place. Another length: packed at the end, its old bytes garbage.
        set.replace(1, |_, out| KeyedPack::put(out, Keyed(b"bxx")))
            .unwrap();
        assert_eq!((set.garbage, set.in_order), (0, true));
        set.replace(1, |_, out| KeyedPack::put(out, Keyed(b"bxyz")))
            .unwrap();
        assert_eq!((set.garbage, set.in_order), (4, false));
        assert_eq!(
            values(&set),
            vec![b"a1".to_vec(), b"bxyz".to_vec(), b"c3".to_vec()]
        );
        assert_eq!(set.position(b"b"), Some(1));
        let want = strata_format::members::encode_members(&[&b"a1"[..], b"bxyz", b"c3"]);
        assert_eq!(set.encode_with(|_| unreachable!()), want);
        // What would pass the limit is refused before anything changes.
        let live = set.body.as_slice().len() - set.garbage;
        assert!(set.room_within(10, live + 10).is_ok());
        let e = set.room_within(11, live + 10).unwrap_err();
        assert!(e.to_string().contains("exceeds the limit"), "{e}");
    }

    #[test]
    fn replies_of_a_buffer_of_its_own_share_one_copy_and_keep_nulls_and_empty_values() {
        let items: Vec<Bytes> = ["ab", "", "cde"].iter().map(|m| Bytes::from(*m)).collect();
        let set = <Indexed<MemberPack> as Items<Bytes>>::from_vec(items);
        assert!(matches!(set.body, Body::Own(_)));
        let parts = [
            Some(set.get(0)),
            None,
            Some(set.get(1)),
            Some(set.get(2)),
            None,
        ];
        let got: Vec<Reply> = set.replies(parts.into_iter()).collect();
        let want: Vec<Reply> = parts
            .iter()
            .map(|p| p.map_or(Reply::Null, |p| Reply::Bulk(Bytes::copy_from_slice(p))))
            .collect();
        assert_eq!(got, want);
        let (Reply::Bulk(a), Reply::Bulk(c)) = (&got[0], &got[3]) else {
            panic!("bulks")
        };
        assert_eq!(
            a.as_ptr().wrapping_add(2),
            c.as_ptr(),
            "one buffer, in order"
        );
        assert_eq!(set.replies(std::iter::empty()).count(), 0);
    }

    #[test]
    fn a_stored_value_is_read_in_place_until_a_change_copies_it() {
        let names: Vec<Bytes> = (0..50).map(|i| Bytes::from(format!("m{i}"))).collect();
        let value = Bytes::from(strata_format::members::encode_members(&names));
        let mut set = <Indexed<MemberPack> as Items<Bytes>>::from_stored(&value)
            .unwrap()
            .expect("version 2: read in place");
        assert!(matches!(set.body, Body::Shared(..)));
        assert_eq!(members(&set), names);
        assert_eq!(set.position(b"m49"), Some(49));
        // Replies share the stored value's buffer.
        let shared = set.share(set.get(3));
        assert_eq!(&shared[..], b"m3");
        let in_value = value.as_ptr_range();
        assert!(in_value.contains(&shared.as_ptr()), "a share, not a copy");
        let Some(Reply::Bulk(b)) = set.replies([Some(set.get(7))].into_iter()).next() else {
            panic!("a bulk")
        };
        assert!(in_value.contains(&b.as_ptr()));
        let c = set.cutter();
        let cut = c.cut(set.get(9));
        assert_eq!(&cut[..], b"m9");
        assert!(in_value.contains(&cut.as_ptr()), "the stored value, cut");
        // A change copies the items out first; the shares stay as they were.
        set.push(b"new").unwrap();
        let c = set.cutter();
        let all: Vec<Bytes> = set.iter().map(|m| c.cut(m)).collect();
        assert_eq!(all, members(&set), "cut from one copy of its own buffer");
        assert!(matches!(set.body, Body::Own(_)));
        assert_eq!(&shared[..], b"m3");
        let copied = set.share(set.get(3));
        assert!(
            !in_value.contains(&copied.as_ptr()),
            "a copy of its own buffer"
        );
        // Encoding for the store shares the result again, in position order.
        set.remove(0);
        let stored = set.encode_stored(|_| unreachable!());
        assert!(matches!(set.body, Body::Shared(..)) && set.in_order);
        let mut want = names[1..].to_vec();
        want.push(Bytes::from_static(b"new"));
        let got = strata_format::members::decode_members(&stored).unwrap();
        assert_eq!(got, want);
        assert_eq!(members(&set), want);
        assert_eq!(set.position(b"new"), Some(set.len() - 1));
        // What cannot be read in place is decoded instead: trailing bytes; damage is an error.
        let mut trailing = value.to_vec();
        trailing.push(0);
        let trailing = Bytes::from(trailing);
        assert!(
            <Indexed<MemberPack> as Items<Bytes>>::from_stored(&trailing)
                .unwrap()
                .is_none()
        );
        let cut = value.slice(..value.len() - 1);
        assert!(<Indexed<MemberPack> as Items<Bytes>>::from_stored(&cut).is_err());
    }
}
