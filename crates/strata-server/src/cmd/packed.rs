//! [`Indexed`]: the items of a live hash or set packed as their stored value holds them,
//! back to back in one buffer, with the place of each, and a table from name to position
//! once the value is looked up often enough. A field of a 13-byte name and a 7-byte value
//! costs its 22 stored bytes, 4 for its place and about 6 of table; as two `Bytes` and an
//! expiry with a table of names it cost about 155 (`reports/findings-2026-12-06-large-collections.md`).
//! Encoding the value is copying the buffer behind a header.
//!
//! Positions are what commands see: an item keeps its position until one before it is
//! removed (in a value of up to [`ORDERED_ITEMS_MAX`] items) or it is the last and fills a
//! gap (in a larger one), so no item moves to a later position ([`ScanOptions::page`]). An
//! item changed to another length is packed again at the end and its old bytes are left as
//! garbage, which is dropped once it passes half the buffer.
//!
//! [`ScanOptions::page`]: super::typed::ScanOptions::page

use std::marker::PhantomData;

use hashbrown::HashTable;
use strata_format::VALUE_BYTES_MAX;

use super::typed::{table_due, Items, Touched, ORDERED_ITEMS_MAX};

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
    /// The item `put` wrote at the start of `b`, and its length.
    fn at(b: &[u8]) -> (Self::Ref<'_>, usize);
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
    fn at(b: &[u8]) -> (&[u8], usize) {
        strata_format::members::member_at(b).expect("an Indexed holds the members it packed")
    }
}

/// Items looked up by name, packed ([`Pack`]; see the module doc). Looked up by comparing
/// names, or through a table from name to position once the value is looked up again (a
/// live value, kept between commands) and holds more than [`super::typed::LINEAR_ITEMS_MAX`] items.
/// Changes are noted by name ([`Touched`]), so a large value's few changes are logged as a
/// delta.
pub(crate) struct Indexed<P: Pack> {
    /// The items as stored, back to back, with the garbage of changed and removed ones.
    bytes: Vec<u8>,
    /// Where each item starts in `bytes`, by position.
    starts: Vec<u32>,
    /// Positions, hashed by the name of the item at each.
    index: Option<(HashTable<u32>, ahash::RandomState)>,
    /// Bytes of `bytes` no item holds.
    garbage: usize,
    /// `bytes` holds the items in position order with no garbage: it is the stored value's
    /// body as it stands.
    in_order: bool,
    lookups: u32,
    touched: Touched,
    pack: PhantomData<P>,
}

/// The item at position `i` (free of `self`, for the table's closures).
fn item_at<'b, P: Pack>(bytes: &'b [u8], starts: &[u32], i: usize) -> P::Ref<'b> {
    P::at(&bytes[starts[i] as usize..]).0
}

/// The refusal of a collection grown past what one value may hold (`max` bytes).
fn too_large(bytes: usize, max: usize) -> strata_engine::Error {
    strata_engine::Error::Invalid(format!(
        "collection of {bytes} bytes exceeds the limit of {max}"
    ))
}

impl<P: Pack> Indexed<P> {
    /// How many items it holds.
    pub(crate) fn len(&self) -> usize {
        self.starts.len()
    }

    /// The item at position `i`.
    pub(crate) fn get(&self, i: usize) -> P::Ref<'_> {
        item_at::<P>(&self.bytes, &self.starts, i)
    }

    /// The items, in order.
    pub(crate) fn iter(&self) -> impl ExactSizeIterator<Item = P::Ref<'_>> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }

    /// The stored bytes of the item at `i`.
    fn packed(&self, i: usize) -> &[u8] {
        let start = self.starts[i] as usize;
        let len = P::at(&self.bytes[start..]).1;
        &self.bytes[start..start + len]
    }

    /// Where the item named `name` is.
    pub(crate) fn position(&mut self, name: &[u8]) -> Option<usize> {
        self.index_when_due();
        match &self.index {
            Some((table, hasher)) => table
                .find(hasher.hash_one(name), |&p| {
                    Named::name(item_at::<P>(&self.bytes, &self.starts, p as usize)) == name
                })
                .map(|&p| p as usize),
            None => (0..self.len()).find(|&i| Named::name(self.get(i)) == name),
        }
    }

    pub(crate) fn contains(&mut self, name: &[u8]) -> bool {
        self.position(name).is_some()
    }

    /// Builds the table from name to position when [`table_due`] says so (each call counts
    /// as a lookup): before removals by position of a value that may stay live (`SPOP`).
    pub(crate) fn index_when_due(&mut self) {
        if self.index.is_some() || !table_due(self.len(), &mut self.lookups) {
            return;
        }
        let hasher = ahash::RandomState::new();
        let mut table = HashTable::with_capacity(self.len());
        let (bytes, starts) = (&self.bytes, &self.starts);
        let hash = |p: &u32| hasher.hash_one(Named::name(item_at::<P>(bytes, starts, *p as usize)));
        for p in 0..self.len() as u32 {
            table.insert_unique(hash(&p), p, hash);
        }
        self.index = Some((table, hasher));
    }

    /// Appends `item`, whose name none of the items has. Refused, changing nothing, when the
    /// value would pass [`VALUE_BYTES_MAX`].
    pub(crate) fn push(&mut self, item: P::Ref<'_>) -> strata_engine::Result<()> {
        self.room_for(P::len(item))?;
        let start = self.bytes.len();
        P::put(&mut self.bytes, item);
        let p = self.starts.len() as u32;
        self.starts.push(start as u32);
        if let Some((table, hasher)) = &mut self.index {
            let (bytes, starts) = (&self.bytes, &self.starts);
            let hash =
                |p: &u32| hasher.hash_one(Named::name(item_at::<P>(bytes, starts, *p as usize)));
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
        let live = self.bytes.len() - self.garbage + more;
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
        let (old, old_len) = P::at(&self.bytes[start..]);
        let mut new = Vec::with_capacity(old_len + 8);
        f(old, &mut new);
        debug_assert_eq!(
            Named::name(P::at(&new).0),
            Named::name(old),
            "a change keeps the name"
        );
        self.touched.set(Named::name(old), self.starts.len());
        if new.len() == old_len {
            self.bytes[start..start + old_len].copy_from_slice(&new);
            return Ok(());
        }
        self.room_for(new.len().saturating_sub(old_len))?;
        self.starts[i] = self.bytes.len() as u32;
        self.bytes.extend_from_slice(&new);
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
        let (item, len) = P::at(&self.bytes[start..]);
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
                let (bytes, starts) = (&self.bytes, &self.starts);
                if let Some((table, hasher)) = &mut self.index {
                    let name = Named::name(item_at::<P>(bytes, starts, i));
                    if let Some(p) = table.find_mut(hasher.hash_one(name), |&p| p as usize == last)
                    {
                        *p = i as u32;
                    }
                }
            }
        }
        if i == last && start + len == self.bytes.len() {
            self.bytes.truncate(start);
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
        if self.garbage <= self.bytes.len() / 2 {
            return;
        }
        let mut bytes = Vec::with_capacity(self.bytes.len() - self.garbage);
        for i in 0..self.len() {
            let start = bytes.len() as u32;
            bytes.extend_from_slice(self.packed(i));
            self.starts[i] = start;
        }
        self.bytes = bytes;
        self.garbage = 0;
        self.in_order = true;
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
        Indexed {
            bytes,
            starts,
            index: None,
            garbage: 0,
            in_order: true,
            lookups: 0,
            touched: Touched::default(),
            pack: PhantomData,
        }
    }
    fn len(&self) -> usize {
        self.starts.len()
    }
    fn encode_with(&self, _encode: fn(&[P::Item]) -> Vec<u8>) -> Vec<u8> {
        if self.in_order {
            let mut out = strata_format::collection_buf(self.len(), 16 + self.bytes.len());
            out.extend_from_slice(&self.bytes);
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
    /// The items' bytes, their places and the table's slots (a `u32` and a control byte
    /// each, at the table's load): what they hold, not the room their buffers grew to, so a
    /// value counts the same grown in place or decoded.
    fn live_bytes(&self) -> Option<usize> {
        let table = self.index.as_ref().map_or(0, |(t, _)| t.capacity() * 6);
        Some(std::mem::size_of::<Self>() + self.bytes.len() + self.starts.len() * 4 + table)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use bytes::Bytes;

    use super::super::typed::tests::next_random;
    use super::super::typed::LINEAR_ITEMS_MAX;
    use super::*;

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
                    let before = set.bytes.len();
                    set.push(&m).unwrap();
                    model.push(m);
                    let last = set.len() - 1;
                    set.remove(last.min(i));
                    model.swap_remove(last.min(i));
                    if set.bytes.len() < before {
                        collected += 1;
                    }
                }
            }
            garbage_seen = garbage_seen.max(set.garbage);
            assert!(
                set.garbage <= set.bytes.len() / 2,
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
        fn at(b: &[u8]) -> (Keyed<'_>, usize) {
            let (m, len) = MemberPack::at(b);
            (Keyed(m), len)
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
        let live = set.bytes.len() - set.garbage;
        assert!(set.room_within(10, live + 10).is_ok());
        let e = set.room_within(11, live + 10).unwrap_err();
        assert!(e.to_string().contains("exceeds the limit"), "{e}");
    }
}
