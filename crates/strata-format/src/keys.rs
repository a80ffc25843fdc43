//! The key layout (layout 2): how a client's key, its logical database and its cluster
//! slot become the keys of the warm store's families. Drawn in `docs/formats.md`.
//!
//! ```text
//! stored key   = db u8 | slot u16 BE | client key                       (records, cold)
//! part key     = db u8 | slot u16 BE | key_len u32 BE | client key | version u64 BE | part
//! score key    = db u8 | slot u16 BE | key_len u32 BE | client key | version u64 BE
//!                | score (8 bytes, ordered) | member
//! expiry key   = expire_ms u64 BE | stored key
//! ```
//!
//! The database comes first, then the slot, so one database's keys of one slot are one
//! range of every family: a database is flushed, and (in cluster mode) a slot shipped or
//! dropped, by its prefix. Outside cluster mode the slot is always 0, so a database's keys
//! sort by the client's key (ordered range reads). The length in part and score keys keeps
//! the parts of key `a` apart from those of key `ab`; the version (from the key's metadata
//! record) makes the parts of a deleted or overwritten value unreachable at once, to be
//! collected later.

use crate::{FormatError, Result, KEY_BYTES_MAX};
use smallvec::SmallVec;

/// The key layout this crate writes (what segments and value-log entries say of their keys).
pub const LAYOUT_VERSION: u32 = 2;
/// The layout a store records (its meta key `layout`): 3 is layout 2's keys with values of
/// every kind up to vector sets (kind 5), which a Strata that reads layouts up to 2 could
/// not decode: it refuses such a store at open instead.
pub const STORE_LAYOUT: u32 = 3;
/// Bytes in front of the client's key in a stored key.
pub const STORED_KEY_PREFIX_BYTES: usize = 3;
/// Largest stored key: a client key with its database and slot.
pub const STORED_KEY_BYTES_MAX: usize = KEY_BYTES_MAX + STORED_KEY_PREFIX_BYTES;
/// Slots of Redis Cluster.
pub const SLOT_COUNT: u16 = 16384;

/// Stored keys up to this many bytes (the client's key and the three-byte prefix) are held
/// inline, with no allocation of their own: most keys of a command's batch.
const KEY_INLINE_BYTES: usize = 32;

/// A key as the warm store holds it: database, slot and the client's key.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(SmallVec<[u8; KEY_INLINE_BYTES]>);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Key(db {}, slot {}, {:?})",
            self.db(),
            self.slot(),
            String::from_utf8_lossy(self.client())
        )
    }
}

impl Key {
    /// The stored key of `client` in database `db` and slot `slot`.
    pub fn new(db: u8, slot: u16, client: &[u8]) -> Key {
        let len = STORED_KEY_PREFIX_BYTES + client.len();
        if len <= KEY_INLINE_BYTES {
            let mut b = [0u8; KEY_INLINE_BYTES];
            b[0] = db;
            b[1..3].copy_from_slice(&slot.to_be_bytes());
            b[3..len].copy_from_slice(client);
            return Key(SmallVec::from_buf_and_len(b, len));
        }
        let mut v = Vec::with_capacity(len);
        v.push(db);
        v.extend_from_slice(&slot.to_be_bytes());
        v.extend_from_slice(client);
        Key(SmallVec::from_vec(v))
    }

    /// Reads a stored key back (from a family, a segment, the value log).
    pub fn from_stored(stored: &[u8]) -> Result<Key> {
        if stored.len() < STORED_KEY_PREFIX_BYTES {
            return Err(FormatError::Truncated {
                what: "stored key",
                need: STORED_KEY_PREFIX_BYTES,
                have: stored.len(),
            });
        }
        Ok(Key(SmallVec::from_slice(stored)))
    }

    /// The key of layout 1, where keys were stored as the client sent them: database 0,
    /// slot 0.
    pub fn from_layout_1(client: &[u8]) -> Key {
        Key::new(0, 0, client)
    }

    pub fn db(&self) -> u8 {
        self.0[0]
    }

    pub fn slot(&self) -> u16 {
        u16::from_be_bytes([self.0[1], self.0[2]])
    }

    /// The key as the client sent it.
    pub fn client(&self) -> &[u8] {
        &self.0[STORED_KEY_PREFIX_BYTES..]
    }

    /// The bytes the warm store holds.
    pub fn stored(&self) -> &[u8] {
        &self.0
    }

    /// The same client key in another database (`MOVE`, `COPY ... DB`).
    pub fn in_db(&self, db: u8) -> Key {
        let mut v = self.0.clone();
        v[0] = db;
        Key(v)
    }
}

impl AsRef<[u8]> for Key {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// The prefix every stored key of database `db` starts with.
pub fn db_prefix(db: u8) -> [u8; 1] {
    [db]
}

/// The prefix every stored key of database `db` and slot `slot` starts with.
pub fn slot_prefix(db: u8, slot: u16) -> [u8; 3] {
    let s = slot.to_be_bytes();
    [db, s[0], s[1]]
}

/// The prefix of every part (or score) key of `key` at `version`.
pub fn parts_prefix(key: &Key, version: u64) -> Vec<u8> {
    let client = key.client();
    debug_assert!(client.len() <= KEY_BYTES_MAX);
    let mut v = Vec::with_capacity(STORED_KEY_PREFIX_BYTES + 4 + client.len() + 8);
    v.extend_from_slice(&key.0[..STORED_KEY_PREFIX_BYTES]);
    v.extend_from_slice(&(client.len() as u32).to_be_bytes());
    v.extend_from_slice(client);
    v.extend_from_slice(&version.to_be_bytes());
    v
}

/// The key of part `part` (a hash field, a set member, a list position) of `key` at
/// `version`.
pub fn part_key(key: &Key, version: u64, part: &[u8]) -> Vec<u8> {
    let mut v = parts_prefix(key, version);
    v.extend_from_slice(part);
    v
}

/// Splits a part key into its stored key, version and part.
pub fn decode_part_key(b: &[u8]) -> Result<(Key, u64, &[u8])> {
    let short = |need| FormatError::Truncated {
        what: "part key",
        need,
        have: b.len(),
    };
    let head = STORED_KEY_PREFIX_BYTES + 4;
    if b.len() < head {
        return Err(short(head));
    }
    let len = u32::from_be_bytes(b[3..7].try_into().expect("4 bytes")) as usize;
    let need = head + len + 8;
    if b.len() < need {
        return Err(short(need));
    }
    let key = Key::new(b[0], u16::from_be_bytes([b[1], b[2]]), &b[head..head + len]);
    let version = u64::from_be_bytes(b[head + len..need].try_into().expect("8 bytes"));
    Ok((key, version, &b[need..]))
}

/// A sorted-set score as 8 bytes whose byte order is the numeric order (negative scores
/// have every bit flipped, others only the sign bit; -0 sorts as 0).
pub fn encode_score(score: f64) -> [u8; 8] {
    let score = if score == 0.0 { 0.0 } else { score };
    let bits = score.to_bits();
    let ordered = if bits >> 63 == 1 {
        !bits
    } else {
        bits | 1 << 63
    };
    ordered.to_be_bytes()
}

/// The score [`encode_score`] wrote.
pub fn decode_score(b: [u8; 8]) -> f64 {
    let ordered = u64::from_be_bytes(b);
    let bits = if ordered >> 63 == 1 {
        ordered & !(1 << 63)
    } else {
        !ordered
    };
    f64::from_bits(bits)
}

/// The score-index key of `member` with `score` in the sorted set `key` at `version`.
pub fn score_key(key: &Key, version: u64, score: f64, member: &[u8]) -> Vec<u8> {
    let mut v = parts_prefix(key, version);
    v.extend_from_slice(&encode_score(score));
    v.extend_from_slice(member);
    v
}

/// The expiry-family key of `stored` expiring at `expire_ms`: keys sort by time.
pub fn expiry_key(expire_ms: u64, stored: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + stored.len());
    k.extend_from_slice(&expire_ms.to_be_bytes());
    k.extend_from_slice(stored);
    k
}

/// Splits an expiry-family key into the time and the stored key.
pub fn decode_expiry_key(b: &[u8]) -> Result<(u64, &[u8])> {
    if b.len() < 8 {
        return Err(FormatError::Truncated {
            what: "expiry key",
            need: 8,
            have: b.len(),
        });
    }
    Ok((
        u64::from_be_bytes(b[..8].try_into().expect("8 bytes")),
        &b[8..],
    ))
}

/// Redis Cluster's slot of a client key: CRC16 (XMODEM) of the key, or of the part between
/// the first `{` and the next `}` when that part is not empty (a hash tag), mod 16384.
pub fn slot_of(client: &[u8]) -> u16 {
    let hashed = match client.iter().position(|&c| c == b'{') {
        Some(open) => match client[open + 1..].iter().position(|&c| c == b'}') {
            Some(len) if len > 0 => &client[open + 1..open + 1 + len],
            _ => client,
        },
        None => client,
    };
    crc16(hashed) % SLOT_COUNT
}

/// CRC16-XMODEM (polynomial 0x1021, initial 0), as Redis Cluster uses it.
fn crc16(b: &[u8]) -> u16 {
    let mut crc = 0u16;
    for &byte in b {
        crc ^= (byte as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_keys_carry_db_and_slot_and_sort_by_db_slot_then_key() {
        let k = Key::new(3, 500, b"user:1");
        assert_eq!((k.db(), k.slot(), k.client()), (3, 500, &b"user:1"[..]));
        assert_eq!(k.stored(), b"\x03\x01\xf4user:1");
        assert_eq!(Key::from_stored(k.stored()).unwrap(), k);
        assert!(Key::from_stored(b"\x00\x00").is_err());
        assert_eq!(Key::from_layout_1(b"a"), Key::new(0, 0, b"a"));
        let mut keys = [
            Key::new(1, 0, b"a"),
            Key::new(0, 1, b"a"),
            Key::new(0, 0, b"b"),
            Key::new(0, 0, b"a"),
        ];
        keys.sort();
        assert_eq!(keys[0], Key::new(0, 0, b"a"));
        assert_eq!(keys[3], Key::new(1, 0, b"a"));
        assert!(k.stored().starts_with(&slot_prefix(3, 500)));
        assert!(k.stored().starts_with(&db_prefix(3)));
        assert_eq!(k.in_db(4).db(), 4);
    }

    #[test]
    fn keys_held_inline_and_on_the_heap_read_and_compare_alike() {
        // Client keys on both sides of what fits inline, and the same bytes built either way.
        let inline = KEY_INLINE_BYTES - STORED_KEY_PREFIX_BYTES;
        for len in [0, 1, inline - 1, inline, inline + 1, 300] {
            let client: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let k = Key::new(2, 0x1234, &client);
            assert_eq!((k.db(), k.slot(), k.client()), (2, 0x1234, &client[..]));
            assert_eq!(k.stored().len(), STORED_KEY_PREFIX_BYTES + len);
            assert_eq!(Key::from_stored(k.stored()).unwrap(), k);
            assert_eq!(k.in_db(5).client(), &client[..]);
            let mut longer = client.clone();
            longer.push(0);
            assert!(k < Key::new(2, 0x1234, &longer));
        }
    }

    #[test]
    fn parts_of_a_key_never_mix_with_those_of_a_longer_key() {
        let a = Key::new(0, 0, b"a");
        let ab = Key::new(0, 0, b"ab");
        let pa = part_key(&a, 1, b"bc");
        let pab = part_key(&ab, 1, b"c");
        assert!(!pab.starts_with(&parts_prefix(&a, 1)));
        assert!(pa.starts_with(&parts_prefix(&a, 1)));
        assert!(
            !pa.starts_with(&parts_prefix(&a, 2)),
            "a new version hides old parts"
        );
        let (k, v, part) = decode_part_key(&pa).unwrap();
        assert_eq!((k, v, part), (a.clone(), 1, &b"bc"[..]));
        assert!(decode_part_key(&pa[..8]).is_err());
    }

    #[test]
    fn scores_sort_as_numbers() {
        let mut xs = [
            3.5,
            -1.0,
            0.0,
            -0.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -1e300,
            1e-300,
            2.0,
        ];
        let mut enc: Vec<[u8; 8]> = xs.iter().map(|&x| encode_score(x)).collect();
        enc.sort();
        xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let back: Vec<f64> = enc.into_iter().map(decode_score).collect();
        for (a, b) in xs.iter().zip(&back) {
            assert_eq!(a, b);
        }
        let k = Key::new(0, 0, b"z");
        assert!(score_key(&k, 1, -2.0, b"m") < score_key(&k, 1, 1.0, b"a"));
    }

    #[test]
    fn expiry_keys_sort_by_time() {
        let a = expiry_key(5, b"\0\0\0zzz");
        let b = expiry_key(256, b"\0\0\0a");
        assert!(a < b);
        assert_eq!(decode_expiry_key(&b).unwrap(), (256, &b"\0\0\0a"[..]));
        assert!(decode_expiry_key(b"short").is_err());
    }

    #[test]
    fn slots_match_redis_cluster() {
        // Values from Redis's CLUSTER KEYSLOT.
        assert_eq!(slot_of(b"123456789"), 12739);
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"bar"), 5061);
        assert_eq!(slot_of(b"user1000"), 3443);
        assert_eq!(slot_of(b"{user1000}.following"), 3443);
        assert_eq!(
            slot_of(b"foo{}{bar}"),
            8363,
            "an empty tag hashes the whole key"
        );
        assert_eq!(slot_of(b"foo{{bar}}zap"), 4015);
        assert_eq!(slot_of(b"{bar"), 4015);
        assert_eq!(slot_of(b"foo{bar}{zap}"), 5061, "only the first tag counts");
        assert_eq!(slot_of(b""), 0);
    }
}
