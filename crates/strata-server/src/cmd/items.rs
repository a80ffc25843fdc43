//! What a live collection's items are, whatever its kind: the [`Items`] a write changes
//! (a `Vec`, a list's `Deque`, a hash's or set's `Indexed`), the [`Touched`] names a delta
//! carries, and the name table and thresholds the item containers share.

use std::collections::HashMap;

use bytes::Bytes;

/// What a write changes a collection's items in: a `Vec`, or for lists (pushed at both
/// ends) a [`Deque`].
pub(crate) trait Items<I>: Send + 'static {
    /// Bytes an item costs beside itself (a lookup table's entry).
    const EXTRA_BYTES: usize = 0;
    fn from_vec(items: Vec<I>) -> Self;
    fn len(&self) -> usize;
    /// `encode` of the items, in order.
    fn encode_with(&self, encode: fn(&[I]) -> Vec<u8>) -> Vec<u8>;
    /// The changes since the items were last stored or asked this, as a
    /// `strata_format::delta` (`encode` makes the value of the items set), or `None` when
    /// they were not noted (the caller stores the items whole). Forgotten either way.
    fn delta(&mut self, _encode: fn(&[I]) -> Vec<u8>) -> Option<Vec<u8>> {
        None
    }
    /// The items were stored whole: the changes noted so far are in what was stored.
    fn stored(&mut self) {}
    /// [`strata_engine::LiveValue::moves`].
    fn moves(&self) -> usize {
        0
    }
    /// The memory the items hold, when they count it themselves (in constant time); `None`
    /// counts each item at its size and its share of the stored value.
    fn live_bytes(&self) -> Option<usize> {
        None
    }
    /// [`Items::encode_with`] as the engine stores it (the items may keep a share of it).
    fn encode_stored(&mut self, encode: fn(&[I]) -> Vec<u8>) -> Bytes {
        Bytes::from(self.encode_with(encode))
    }
    /// The items of the stored value `value`, read where they lie (sharing its buffer),
    /// when the container can and the value allows it; `None`: decode it instead.
    fn from_stored(_value: &Bytes) -> strata_format::Result<Option<Self>>
    where
        Self: Sized,
    {
        Ok(None)
    }
}

/// Which items of a live value changed since it was last stored or its changes were taken
/// ([`Items::delta`]): the names set and the names removed. Past a quarter of the items a
/// delta saves little: it notes that the value changed whole, and nothing more until then.
#[derive(Default)]
pub(crate) struct Touched {
    set: std::collections::HashSet<Bytes, ahash::RandomState>,
    removed: Vec<Bytes>,
    whole: bool,
}

/// Changes a delta may carry whatever the collection's size.
const TOUCHED_MIN: usize = 16;

/// Whether `noted` changes of a collection of `len` items are too many for a delta (past a
/// quarter of the items, and [`TOUCHED_MIN`]): `Touched`'s rule (a delta looks each
/// name up).
fn past_delta(noted: usize, len: usize) -> bool {
    noted > (len / 4).max(TOUCHED_MIN)
}

/// Whether `noted` changes of a list of `len` elements are too many for a delta. A list's
/// changes are encoded in order, element for element as the whole list is, with no
/// look-ups: a delta costs less until it holds as many as the list (a list growing by
/// more than a quarter a commit would otherwise be stored whole at every commit).
pub(crate) fn past_list_delta(noted: usize, len: usize) -> bool {
    noted > len.max(TOUCHED_MIN)
}

impl Touched {
    /// The item named `name` was set or changed; the collection holds `len` items.
    pub(crate) fn set(&mut self, name: &[u8], len: usize) {
        if !self.whole {
            if !self.set.contains(name) {
                self.set.insert(Bytes::copy_from_slice(name));
            }
            self.check(len);
        }
    }

    /// The item named `name` was removed.
    pub(crate) fn removed(&mut self, name: &[u8], len: usize) {
        if !self.whole {
            self.removed.push(Bytes::copy_from_slice(name));
            self.check(len);
        }
    }

    /// Any change at all.
    fn whole(&mut self) {
        self.whole = true;
        self.set = Default::default();
        self.removed = Vec::new();
    }

    fn check(&mut self, len: usize) {
        if past_delta(self.set.len() + self.removed.len(), len) {
            self.whole();
        }
    }

    /// What was noted (`None`: a whole change), forgotten.
    #[allow(clippy::type_complexity)]
    pub(crate) fn take(&mut self) -> Option<(Vec<Bytes>, Vec<Bytes>)> {
        let whole = std::mem::take(&mut self.whole);
        let set = std::mem::take(&mut self.set);
        let removed = std::mem::take(&mut self.removed);
        (!whole).then(|| (set.into_iter().collect(), removed))
    }
}

impl<I: Send + 'static> Items<I> for Vec<I> {
    fn from_vec(items: Vec<I>) -> Self {
        items
    }
    fn len(&self) -> usize {
        Vec::len(self)
    }
    fn encode_with(&self, encode: fn(&[I]) -> Vec<u8>) -> Vec<u8> {
        encode(self)
    }
}

/// `b` in memory of its own. What a live value gains (a member, a field, an element) is
/// copied out of the command's arguments first: an argument shares the connection's read
/// buffer (64 KiB, filled by many requests), and a value that kept it would keep that
/// buffer alive for as long as the item lives, uncounted: a list `LPUSH`ed three bytes at a
/// time held its requests' 40 bytes each, and a set gaining a member now and then, a
/// whole buffer per member.
pub(crate) fn own(b: &[u8]) -> Bytes {
    Bytes::copy_from_slice(b)
}

/// Longest name a [`NameTable`] holds in its own slot.
const INLINE_NAME_MAX: usize = 22;

/// A name as a [`NameTable`] keeps it: short ones in the slot, longer ones shared with the
/// item that bears them.
#[derive(Clone)]
enum TableName {
    Inline {
        len: u8,
        bytes: [u8; INLINE_NAME_MAX],
    },
    Shared(Bytes),
}

impl TableName {
    fn new(name: &Bytes) -> Self {
        if name.len() <= INLINE_NAME_MAX {
            let mut bytes = [0; INLINE_NAME_MAX];
            bytes[..name.len()].copy_from_slice(name);
            TableName::Inline {
                len: name.len() as u8,
                bytes,
            }
        } else {
            TableName::Shared(name.clone())
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            TableName::Inline { len, bytes } => &bytes[..*len as usize],
            TableName::Shared(b) => b,
        }
    }
}

impl std::borrow::Borrow<[u8]> for TableName {
    fn borrow(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl std::hash::Hash for TableName {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl PartialEq for TableName {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for TableName {}

/// A lookup table from an item's name to `V` (a member's score in a sorted set). A name of up to [`INLINE_NAME_MAX`] bytes (a feature's field, a member
/// like `user:000012345`) lies in the table's slot, so a look-up reads the table and no
/// other memory: a cache miss fewer than a pointer to the name, in a value of thousands.
pub(crate) struct NameTable<V>(HashMap<TableName, V, ahash::RandomState>);

impl<V> NameTable<V> {
    pub(crate) fn with_capacity(n: usize) -> Self {
        NameTable(HashMap::with_capacity_and_hasher(
            n,
            ahash::RandomState::new(),
        ))
    }

    pub(crate) fn get(&self, name: &[u8]) -> Option<&V> {
        self.0.get(name)
    }

    pub(crate) fn insert(&mut self, name: &Bytes, v: V) {
        self.0.insert(TableName::new(name), v);
    }

    pub(crate) fn remove(&mut self, name: &[u8]) -> Option<V> {
        self.0.remove(name)
    }
}

/// Values up to this many items are searched by comparing names; a table costs more.
pub(crate) const LINEAR_ITEMS_MAX: usize = 32;

/// Values up to this many items keep their order through removals (Redis keeps hashes of up
/// to 128 entries in insertion order); larger ones fill a gap with their last item.
pub(crate) const ORDERED_ITEMS_MAX: usize = 128;

/// Whether a live value of `len` items with no lookup table yet should build one now: it
/// is past [`LINEAR_ITEMS_MAX`] and this is its second lookup (`lookups` counts them).
/// `Indexed`'s table and `Scored`'s follow this one rule.
pub(crate) fn table_due(len: usize, lookups: &mut u32) -> bool {
    if len <= LINEAR_ITEMS_MAX {
        return false;
    }
    *lookups += 1;
    *lookups > 1
}

/// The next number of a seeded pseudo-random sequence (a linear congruential step), for
/// the item containers' tests.
#[cfg(test)]
pub(crate) fn next_random(x: u64) -> u64 {
    x.wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    #[test]
    fn a_name_table_holds_short_names_in_its_slots_and_finds_every_name() {
        // A short name in the slot costs no more room than a shared one.
        assert_eq!(
            std::mem::size_of::<TableName>(),
            std::mem::size_of::<Bytes>()
        );
        let mut t = NameTable::with_capacity(4);
        let names: Vec<Bytes> = [0, 1, INLINE_NAME_MAX, INLINE_NAME_MAX + 1, 100]
            .iter()
            .map(|&n| Bytes::from(vec![b'x'; n]))
            .collect();
        for (i, n) in names.iter().enumerate() {
            t.insert(n, i);
        }
        assert!(matches!(
            TableName::new(&names[2]),
            TableName::Inline { .. }
        ));
        assert!(matches!(TableName::new(&names[3]), TableName::Shared(_)));
        for (i, n) in names.iter().enumerate() {
            assert_eq!(t.get(n), Some(&i), "{} bytes", n.len());
        }
        t.insert(&names[2], 7);
        assert_eq!((t.get(&names[2]), t.get(&names[3])), (Some(&7), Some(&3)));
        assert_eq!(t.remove(&names[4]), Some(4));
        assert_eq!(t.get(&names[4]), None);
        assert_eq!(t.get(b"y"), None);
    }
}
