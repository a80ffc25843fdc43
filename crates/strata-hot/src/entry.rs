//! What one cached entry holds: its key, value and expiry. A small value is packed with its
//! key into one allocation of exactly their size, so an entry costs one heap block and a
//! cached value never keeps alive a larger buffer it was cut from (a client's input buffer,
//! a decompressed block). A large value stays the `Bytes` it was handed in as, uncopied.
//!
//! Packed layout: `flags u8 | key_len u32 LE | [expire_ms u64 LE, if flags & HAS_EXPIRY] |
//! key | value`.

use bytes::Bytes;

/// Values up to this many bytes are copied into the entry's own allocation; larger ones are
/// kept as handed in (a copy would cost more than the buffer it frees).
pub const INLINE_VALUE_BYTES_MAX: usize = 16 << 10;

const HAS_EXPIRY: u8 = 1;
const HEAD_BYTES: usize = 1 + 4;

pub(crate) enum Data {
    Packed(Box<[u8]>),
    Apart(Box<Apart>),
}

pub(crate) struct Apart {
    key: Box<[u8]>,
    value: Bytes,
    expire_ms: u64,
}

impl Data {
    pub(crate) fn new(key: &[u8], value: Bytes, expire_ms: u64) -> Data {
        if value.len() > INLINE_VALUE_BYTES_MAX || key.len() > u32::MAX as usize {
            return Data::Apart(Box::new(Apart {
                key: key.into(),
                value,
                expire_ms,
            }));
        }
        Data::packed(key, &value, expire_ms)
    }

    /// [`Data::new`] of a copy of `value` (a large one is copied into its own buffer, so
    /// that it keeps nothing else alive).
    pub(crate) fn copied(key: &[u8], value: &[u8], expire_ms: u64) -> Data {
        if value.len() > INLINE_VALUE_BYTES_MAX || key.len() > u32::MAX as usize {
            return Data::new(key, Bytes::copy_from_slice(value), expire_ms);
        }
        Data::packed(key, value, expire_ms)
    }

    /// A small value packed with its key in one allocation.
    fn packed(key: &[u8], value: &[u8], expire_ms: u64) -> Data {
        let expiry_bytes = if expire_ms != 0 { 8 } else { 0 };
        let mut b = Vec::with_capacity(HEAD_BYTES + expiry_bytes + key.len() + value.len());
        b.push(if expire_ms != 0 { HAS_EXPIRY } else { 0 });
        b.extend_from_slice(&(key.len() as u32).to_le_bytes());
        if expire_ms != 0 {
            b.extend_from_slice(&expire_ms.to_le_bytes());
        }
        b.extend_from_slice(key);
        b.extend_from_slice(value);
        Data::Packed(b.into_boxed_slice())
    }

    /// Writes `value` and `expire_ms` over a packed value of the same length whose block
    /// has room for the expiry (or needs none): no allocation. False, and nothing changed,
    /// otherwise.
    pub(crate) fn overwrite(&mut self, value: &[u8], expire_ms: u64) -> bool {
        let Data::Packed(b) = self else {
            return false;
        };
        let (at, key_len) = Self::packed_key(b);
        let has_expiry = b[0] & HAS_EXPIRY != 0;
        if b.len() - at - key_len != value.len() || has_expiry != (expire_ms != 0) {
            return false;
        }
        if has_expiry {
            b[HEAD_BYTES..HEAD_BYTES + 8].copy_from_slice(&expire_ms.to_le_bytes());
        }
        b[at + key_len..].copy_from_slice(value);
        true
    }

    /// Where the key starts in a packed block, and its length.
    fn packed_key(b: &[u8]) -> (usize, usize) {
        let key_len = u32::from_le_bytes(b[1..5].try_into().expect("4 bytes")) as usize;
        let at = HEAD_BYTES + if b[0] & HAS_EXPIRY != 0 { 8 } else { 0 };
        (at, key_len)
    }

    pub(crate) fn key(&self) -> &[u8] {
        match self {
            Data::Packed(b) => {
                let (at, len) = Self::packed_key(b);
                &b[at..at + len]
            }
            Data::Apart(a) => &a.key,
        }
    }

    pub(crate) fn value(&self) -> &[u8] {
        match self {
            Data::Packed(b) => {
                let (at, len) = Self::packed_key(b);
                &b[at + len..]
            }
            Data::Apart(a) => &a.value,
        }
    }

    /// A packed value, to change in place (it keeps its length); `None` for one apart.
    pub(crate) fn value_mut(&mut self) -> Option<&mut [u8]> {
        match self {
            Data::Packed(b) => {
                let (at, len) = Self::packed_key(b);
                Some(&mut b[at + len..])
            }
            Data::Apart(_) => None,
        }
    }

    /// The value as `Bytes`: a copy of a packed value, the shared handle of one apart.
    pub(crate) fn value_bytes(&self) -> Bytes {
        match self {
            Data::Packed(_) => Bytes::copy_from_slice(self.value()),
            Data::Apart(a) => a.value.clone(),
        }
    }

    /// The value's own shared handle, if it is kept apart (a packed value has none).
    pub(crate) fn shared(&self) -> Option<&Bytes> {
        match self {
            Data::Packed(_) => None,
            Data::Apart(a) => Some(&a.value),
        }
    }

    pub(crate) fn expire_ms(&self) -> u64 {
        match self {
            Data::Packed(b) if b[0] & HAS_EXPIRY != 0 => {
                u64::from_le_bytes(b[HEAD_BYTES..HEAD_BYTES + 8].try_into().expect("8 bytes"))
            }
            Data::Packed(_) => 0,
            Data::Apart(a) => a.expire_ms,
        }
    }

    pub(crate) fn is_live(&self, now_ms: u64) -> bool {
        let e = self.expire_ms();
        e == 0 || e > now_ms
    }

    /// Asks the processor to start loading the entry's block (its head and key), without
    /// waiting for it: a batch of look-ups prefetches every entry before comparing any key.
    pub(crate) fn prefetch(&self) {
        let at: *const u8 = match self {
            Data::Packed(b) => b.as_ptr(),
            Data::Apart(a) => a.key.as_ptr(),
        };
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

    /// Key and value bytes: what the budget charges beside the fixed overhead.
    pub(crate) fn len(&self) -> usize {
        match self {
            Data::Packed(b) => b.len() - Self::packed_key(b).0,
            Data::Apart(a) => a.key.len() + a.value.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            assert_eq!(
                matches!(d, Data::Packed(_)),
                value.len() <= INLINE_VALUE_BYTES_MAX
            );
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
    fn an_entry_is_two_words() {
        assert_eq!(std::mem::size_of::<Data>(), 16);
    }
}
