//! What every policy is: a cache of block ids ([`BlockCache`]), and the map policies key
//! their state by.

/// Hashes the `u64` keys policies are keyed by (block ids, key hashes) with one folded
/// multiply: no SipHash on a DRAM hit's path, and the same layout in every run.
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, v: u64) {
        const K: u128 = 0x9e37_79b9_7f4a_7c15;
        let m = u128::from(v ^ self.0) * K;
        self.0 = (m as u64) ^ ((m >> 64) as u64);
    }
}

/// A map keyed by block id or key hash, hashed with [`IdHasher`].
pub type IdMap<V> = std::collections::HashMap<u64, V, std::hash::BuildHasherDefault<IdHasher>>;

/// A cache of block ids with a fixed capacity in blocks.
pub trait BlockCache {
    /// Whether `key` is cached (no side effects).
    fn contains(&self, key: u64) -> bool;
    /// Records an access at position `t` of the flattened trace: a hit refreshes the
    /// entry, a miss inserts it (evicting, or declining to admit it).
    fn access(&mut self, key: u64, t: usize);
    /// Called before the blocks of a new request are accessed, so that a policy can learn
    /// the chain (each block's parent is the block before it in its request).
    fn begin_request(&mut self) {}
}
