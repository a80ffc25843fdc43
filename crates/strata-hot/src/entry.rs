//! What one cached entry holds: its key, value and expiry, behind one pointer (an entry of
//! the shard's table is two words). A small value is packed with its key into one
//! allocation of exactly their size, so an entry costs one heap block and a cached value
//! never keeps alive a larger buffer it was cut from (a client's input buffer, a
//! decompressed block). A large value stays the `Bytes` it was handed in as, uncopied.
//!
//! Packed layout: `flags u8 | key_len LEB128 | value_len LEB128 | [expire_ms u64 LE, if
//! flags & HAS_EXPIRY] | key | value` (the lengths take one byte each below 128).

use std::alloc::Layout;
use std::ptr::NonNull;

use bytes::Bytes;

/// Values up to this many bytes are copied into the entry's own allocation; larger ones are
/// kept as handed in (a copy would cost more than the buffer it frees).
pub const INLINE_VALUE_BYTES_MAX: usize = 16 << 10;

const HAS_EXPIRY: u8 = 1;
/// The low bit of [`Data`]'s pointer: set for an [`Apart`], clear for a packed block.
const APART_TAG: usize = 1;
/// Packed blocks are aligned so the tag bit of their address is free.
const BLOCK_ALIGN: usize = 2;
/// Keys up to this long are packed (their length fits the block's head).
const PACKED_KEY_BYTES_MAX: usize = u32::MAX as usize;

/// A key with its value and expiry: a packed block, or an [`Apart`] for a large value.
pub(crate) struct Data {
    /// A packed block's address, or a `Box<Apart>`'s plus [`APART_TAG`].
    ptr: NonNull<u8>,
}

// SAFETY: a `Data` owns what it points to as a `Box` would (nothing else reaches it), and
// the `Bytes` an `Apart` holds is itself `Send` and `Sync`.
unsafe impl Send for Data {}
// SAFETY: as above; `&Data` gives only shared reads.
unsafe impl Sync for Data {}

pub(crate) struct Apart {
    key: Box<[u8]>,
    value: Bytes,
    expire_ms: u64,
}

/// Where things are in a packed block.
#[derive(Clone, Copy)]
struct Head {
    expiry: bool,
    /// Where the key starts (after the head and any expiry).
    at: usize,
    key_len: usize,
    value_len: usize,
}

impl Head {
    fn of(key_len: usize, value_len: usize, expiry: bool) -> Head {
        let at = 1 + leb_len(key_len) + leb_len(value_len) + if expiry { 8 } else { 0 };
        Head {
            expiry,
            at,
            key_len,
            value_len,
        }
    }

    fn total(&self) -> usize {
        self.at + self.key_len + self.value_len
    }

    fn layout(&self) -> Layout {
        Layout::from_size_align(self.total(), BLOCK_ALIGN).expect("a packed block's size")
    }

    /// Reads the head at the start of the packed block at `p`.
    ///
    /// # Safety
    /// `p` is the address of a live packed block (written by [`Data::packed`]).
    unsafe fn read(p: *const u8) -> Head {
        let mut at = 1;
        let mut leb = || {
            let mut n = 0usize;
            let mut shift = 0;
            loop {
                // SAFETY: the block's head is whole, and a length's last byte has its
                // high bit clear: the reads stay within the head.
                let b = unsafe { *p.add(at) };
                at += 1;
                n |= usize::from(b & 0x7f) << shift;
                if b & 0x80 == 0 {
                    return n;
                }
                shift += 7;
            }
        };
        let key_len = leb();
        let value_len = leb();
        // SAFETY: the caller's promise.
        let expiry = unsafe { *p } & HAS_EXPIRY != 0;
        Head::of(key_len, value_len, expiry)
    }
}

/// Bytes of `n` written as LEB128.
fn leb_len(n: usize) -> usize {
    1 + (usize::BITS - (n | 1).leading_zeros()).saturating_sub(1) as usize / 7
}

fn put_leb(b: &mut [u8], mut at: usize, mut n: usize) -> usize {
    while n >= 0x80 {
        b[at] = (n as u8 & 0x7f) | 0x80;
        n >>= 7;
        at += 1;
    }
    b[at] = n as u8;
    at + 1
}

/// What a [`Data`] points to.
enum View<'a> {
    Packed(Head, &'a [u8]),
    Apart(&'a Apart),
}

impl Data {
    pub(crate) fn new(key: &[u8], value: Bytes, expire_ms: u64) -> Data {
        if value.len() > INLINE_VALUE_BYTES_MAX || key.len() > PACKED_KEY_BYTES_MAX {
            return Data::apart(Apart {
                key: key.into(),
                value,
                expire_ms,
            });
        }
        Data::packed(key, &value, expire_ms)
    }

    /// [`Data::new`] of a copy of `value` (a large one is copied into its own buffer, so
    /// that it keeps nothing else alive).
    pub(crate) fn copied(key: &[u8], value: &[u8], expire_ms: u64) -> Data {
        if value.len() > INLINE_VALUE_BYTES_MAX || key.len() > PACKED_KEY_BYTES_MAX {
            return Data::new(key, Bytes::copy_from_slice(value), expire_ms);
        }
        Data::packed(key, value, expire_ms)
    }

    fn apart(a: Apart) -> Data {
        let p = Box::into_raw(Box::new(a)).cast::<u8>();
        // `Apart` is aligned to 8: its address has the tag bit clear, and the tagged address
        // stays inside its allocation (so it is never null).
        Data {
            ptr: NonNull::new(p.wrapping_add(APART_TAG)).expect("a boxed address"),
        }
    }

    /// A small value packed with its key in one allocation.
    fn packed(key: &[u8], value: &[u8], expire_ms: u64) -> Data {
        let head = Head::of(key.len(), value.len(), expire_ms != 0);
        let ptr = alloc_block(head);
        let p = ptr.as_ptr();
        // SAFETY: `p` is a fresh allocation of `head.total()` bytes, written whole below
        // before anything reads it.
        let b = unsafe { std::slice::from_raw_parts_mut(p, head.total()) };
        b[0] = if head.expiry { HAS_EXPIRY } else { 0 };
        let at = put_leb(b, 1, key.len());
        let mut at = put_leb(b, at, value.len());
        if head.expiry {
            b[at..at + 8].copy_from_slice(&expire_ms.to_le_bytes());
            at += 8;
        }
        debug_assert_eq!(at, head.at);
        b[at..at + key.len()].copy_from_slice(key);
        b[at + key.len()..].copy_from_slice(value);
        Data { ptr }
    }

    fn view(&self) -> View<'_> {
        let p = self.ptr.as_ptr();
        if p as usize & APART_TAG != 0 {
            // SAFETY: a tagged address is a `Box<Apart>`'s plus the tag (see `apart`),
            // alive while `self` is.
            View::Apart(unsafe { &*p.wrapping_sub(APART_TAG).cast::<Apart>() })
        } else {
            // SAFETY: an untagged address is a live packed block whose head gives its
            // length, alive and unchanged while `self` is borrowed.
            unsafe {
                let head = Head::read(p);
                View::Packed(head, std::slice::from_raw_parts(p, head.total()))
            }
        }
    }

    /// A packed block copied into a fresh allocation (`None` for a value kept apart): swapped
    /// in for this one, it lets the allocator pack what survives random evictions into
    /// fewer pages (`HotCache::relocate`).
    pub(crate) fn relocated(&self) -> Option<Data> {
        let View::Packed(head, bytes) = self.view() else {
            return None;
        };
        let ptr = alloc_block(head);
        // SAFETY: `ptr` is a fresh allocation of `bytes.len()` bytes, apart from `bytes`.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr.as_ptr(), bytes.len()) };
        Some(Data { ptr })
    }

    /// The packed block's head and bytes, to change (`None` for a value kept apart).
    fn packed_mut(&mut self) -> Option<(Head, &mut [u8])> {
        let p = self.ptr.as_ptr();
        if p as usize & APART_TAG != 0 {
            return None;
        }
        // SAFETY: as in `view`; `&mut self` makes the borrow unique.
        unsafe {
            let head = Head::read(p);
            Some((head, std::slice::from_raw_parts_mut(p, head.total())))
        }
    }

    /// Writes `value` and `expire_ms` over a packed value of the same length whose block
    /// has room for the expiry (or needs none): no allocation. False, and nothing changed,
    /// otherwise.
    pub(crate) fn overwrite(&mut self, value: &[u8], expire_ms: u64) -> bool {
        let Some((head, b)) = self.packed_mut() else {
            return false;
        };
        if head.value_len != value.len() || head.expiry != (expire_ms != 0) {
            return false;
        }
        if head.expiry {
            b[head.at - 8..head.at].copy_from_slice(&expire_ms.to_le_bytes());
        }
        b[head.at + head.key_len..].copy_from_slice(value);
        true
    }

    pub(crate) fn key(&self) -> &[u8] {
        match self.view() {
            View::Packed(h, b) => &b[h.at..h.at + h.key_len],
            View::Apart(a) => &a.key,
        }
    }

    pub(crate) fn value(&self) -> &[u8] {
        match self.view() {
            View::Packed(h, b) => &b[h.at + h.key_len..],
            View::Apart(a) => &a.value,
        }
    }

    /// A packed value, to change in place (it keeps its length); `None` for one apart.
    pub(crate) fn value_mut(&mut self) -> Option<&mut [u8]> {
        self.packed_mut().map(|(h, b)| &mut b[h.at + h.key_len..])
    }

    /// The value as `Bytes`: a copy of a packed value, the shared handle of one apart.
    pub(crate) fn value_bytes(&self) -> Bytes {
        match self.view() {
            View::Packed(..) => Bytes::copy_from_slice(self.value()),
            View::Apart(a) => a.value.clone(),
        }
    }

    /// The value's own shared handle, if it is kept apart (a packed value has none).
    pub(crate) fn shared(&self) -> Option<&Bytes> {
        match self.view() {
            View::Packed(..) => None,
            View::Apart(a) => Some(&a.value),
        }
    }

    pub(crate) fn expire_ms(&self) -> u64 {
        match self.view() {
            View::Packed(h, b) if h.expiry => {
                u64::from_le_bytes(b[h.at - 8..h.at].try_into().expect("8 bytes"))
            }
            View::Packed(..) => 0,
            View::Apart(a) => a.expire_ms,
        }
    }

    pub(crate) fn is_live(&self, now_ms: u64) -> bool {
        let e = self.expire_ms();
        e == 0 || e > now_ms
    }

    /// Asks the processor to start loading the entry's block (its head and key), without
    /// waiting for it: a batch of look-ups prefetches every entry before comparing any key.
    pub(crate) fn prefetch(&self) {
        prefetch(self.ptr.as_ptr());
    }

    /// Key and value bytes: what the budget charges beside the fixed overhead.
    pub(crate) fn len(&self) -> usize {
        match self.view() {
            View::Packed(h, _) => h.key_len + h.value_len,
            View::Apart(a) => a.key.len() + a.value.len(),
        }
    }

    /// Whether the value is packed with its key.
    #[cfg(test)]
    fn is_packed(&self) -> bool {
        matches!(self.view(), View::Packed(..))
    }
}

/// A fresh, unwritten allocation for a packed block of `head`'s size.
fn alloc_block(head: Head) -> NonNull<u8> {
    let layout = head.layout();
    // SAFETY: the layout's size is at least 3 (a flags byte and two lengths).
    let p = unsafe { std::alloc::alloc(layout) };
    NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout))
}

impl Drop for Data {
    fn drop(&mut self) {
        let p = self.ptr.as_ptr();
        if p as usize & APART_TAG != 0 {
            // SAFETY: the tagged address of a `Box<Apart>` (see `apart`), dropped once.
            drop(unsafe { Box::from_raw(p.wrapping_sub(APART_TAG).cast::<Apart>()) });
        } else {
            // SAFETY: a packed block allocated by `packed` with the layout its head gives.
            unsafe { std::alloc::dealloc(p, Head::read(p).layout()) };
        }
    }
}

/// Asks the processor to fetch the cache line at `at` into its cache, without waiting for
/// it (a load would hold up the instructions after it until the line arrived): for look-ups
/// done ahead of a batch, so their cache misses overlap.
pub fn prefetch<T>(at: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it reads nothing the program sees and cannot fault,
    // whatever the address. `sse` is part of every x86_64 target.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(at.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relocated_packed_entry_holds_the_same_key_value_and_expiry() {
        let d = Data::new(b"key", Bytes::from_static(b"value"), 42);
        let moved = d.relocated().expect("a packed entry moves");
        drop(d);
        assert_eq!(moved.key(), b"key");
        assert_eq!(moved.value(), b"value");
        assert_eq!(moved.expire_ms(), 42);
        let big = Bytes::from(vec![1u8; INLINE_VALUE_BYTES_MAX + 1]);
        assert!(Data::new(b"k", big, 0).relocated().is_none(), "kept apart");
    }

    #[test]
    fn packed_and_apart_entries_give_back_what_went_in() {
        for (value, expire) in [
            (Bytes::from_static(b""), 0),
            (Bytes::from_static(b"v"), 77),
            (Bytes::from(vec![7u8; INLINE_VALUE_BYTES_MAX]), 0),
            (Bytes::from(vec![8u8; INLINE_VALUE_BYTES_MAX + 1]), u64::MAX),
        ] {
            let d = Data::new(b"some key", value.clone(), expire);
            assert_eq!(d.key(), b"some key");
            assert_eq!(d.value(), &value[..]);
            assert_eq!(d.value_bytes(), value);
            assert_eq!(d.expire_ms(), expire);
            assert_eq!(d.len(), 8 + value.len());
            assert_eq!(d.is_packed(), value.len() <= INLINE_VALUE_BYTES_MAX);
        }
    }

    #[test]
    fn a_packed_value_does_not_keep_its_source_buffer() {
        let buffer = Bytes::from(vec![1u8; 1 << 20]);
        let d = Data::new(b"k", buffer.slice(10..110), 0);
        assert!(buffer.is_unique(), "the entry copied its 100 bytes");
        assert_eq!(d.value(), &[1u8; 100][..]);
        let large = Data::new(b"k", buffer.slice(..), 0);
        assert!(!buffer.is_unique(), "a large value is kept without a copy");
        drop(large);
    }

    #[test]
    fn an_entry_is_one_word() {
        assert_eq!(std::mem::size_of::<Data>(), 8);
    }

    #[test]
    fn lengths_past_one_byte_and_expiries_round_trip_and_overwrite_in_place() {
        for key_len in [0, 1, 127, 128, 300, 16_384, 70_000] {
            for value_len in [0, 5, 127, 128, 16_383, INLINE_VALUE_BYTES_MAX] {
                for expire in [0, 1, u64::MAX] {
                    let key = vec![b'k'; key_len];
                    let value = vec![b'v'; value_len];
                    let mut d = Data::copied(&key, &value, expire);
                    assert!(d.is_packed());
                    assert_eq!((d.key(), d.value()), (&key[..], &value[..]));
                    assert_eq!(d.expire_ms(), expire);
                    assert_eq!(d.len(), key_len + value_len);
                    let other = vec![b'w'; value_len];
                    assert!(d.overwrite(&other, expire));
                    assert_eq!((d.key(), d.value()), (&key[..], &other[..]));
                    assert_eq!(d.expire_ms(), expire);
                    // A different length or a new expiry needs a new block.
                    assert!(!d.overwrite(&vec![b'x'; value_len + 1], expire));
                    assert!(!d.overwrite(&other, if expire == 0 { 9 } else { 0 }));
                    if let Some(v) = d.value_mut() {
                        v.fill(b'z');
                    }
                    assert!(d.value().iter().all(|&b| b == b'z'));
                }
            }
        }
    }
}
