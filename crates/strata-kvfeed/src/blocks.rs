//! A chunk announced as blocks: routers hash token blocks of their own size, so a chunk of
//! `n` tokens goes out as `⌈n / block_size⌉` blocks, each with a 63-bit id of Strata's own
//! (a chained chunk hash cannot be cut into block hashes a router could recompute; the
//! consumers key on the tokens, the ids only name what a later removal removes).

use sha2::{Digest, Sha256};

/// The id of block `index` of the chunk whose hash (as the client names it) is `chunk`:
/// `splitmix64(c + index)` with `c` the first 8 bytes (big-endian) of
/// `sha256("strata-block" || chunk)`, top bit cleared (so signed and unsigned decoders read
/// the same number). One SHA-256 per chunk, not per block.
pub fn block_id(chunk: &[u8], index: u32) -> u64 {
    block_id_of(chunk_seed(chunk), index)
}

fn chunk_seed(chunk: &[u8]) -> u64 {
    let mut d = Sha256::new();
    d.update(b"strata-block");
    d.update(chunk);
    u64::from_be_bytes(d.finalize()[..8].try_into().expect("8 bytes"))
}

/// SplitMix64's finalizer over the chunk's seed plus the block's index.
fn block_id_of(seed: u64, index: u32) -> u64 {
    let mut z = seed.wrapping_add(index as u64);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) & (u64::MAX >> 1)
}

/// How many blocks a chunk of `tokens` tokens is announced as.
pub fn block_count(tokens: usize, block_size: u32) -> u32 {
    tokens.div_ceil(block_size.max(1) as usize) as u32
}

/// The ids of the `count` blocks of chunk `chunk`.
pub fn block_ids(chunk: &[u8], count: u32) -> Vec<u64> {
    let seed = chunk_seed(chunk);
    (0..count).map(|i| block_id_of(seed, i)).collect()
}

/// The parent of a chunk's first block: the last block of its parent chunk (of `count`
/// blocks, as every whole chunk of a namespace has), or none for a prompt's first chunk.
pub fn parent_id(parent_chunk: Option<&[u8]>, count: u32) -> Option<u64> {
    parent_chunk.map(|p| block_id(p, count.max(1) - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_chain_across_chunks() {
        let (a, b) = (b"aa".as_slice(), b"bb".as_slice());
        assert_eq!(block_count(256, 16), 16);
        assert_eq!(block_count(250, 16), 16);
        assert_eq!(block_count(0, 16), 0);
        let ids_a = block_ids(a, 16);
        assert_eq!(parent_id(Some(a), 16), Some(ids_a[15]));
        assert_eq!(parent_id(None, 16), None);
        assert_ne!(block_id(a, 0), block_id(b, 0));
        assert!(ids_a.iter().all(|&id| id < 1 << 63));
        let mut unique = ids_a.clone();
        unique.dedup();
        assert_eq!(unique.len(), 16);
    }
}
