//! Keys of LLM KV-cache chunks: a namespace and a chained hash of the token prefix.
//!
//! Two processes (in any language) with the same prompt and namespace produce the same
//! keys; different models, revisions, dtypes, layouts, parallelism or chunk sizes never
//! share a key. The scheme, also implemented by `clients/python/strata_client/kvcache.py`
//! and checked against the shared vectors in `tests/vectors/kvcache.json`:
//!
//! ```text
//! canonical = "strata-kvc-v1|model=<m>|revision=<r>|dtype=<d>|layout=<l>|tp=<world>/<rank>|chunk=<tokens>"
//! ns_id     = hex(sha256(canonical))[..32]
//! h_0       = sha256(canonical)
//! h_i       = sha256(h_{i-1} || tokens of chunk i as u32 little-endian)
//! key_i     = "kvc:" + ns_id + ":" + hex(h_i)
//! ```
//!
//! Only whole chunks get keys; a trailing partial chunk is recomputed, never cached.
//!
//! In a cluster, chunks go in groups of `G` (`kvc_group_chunks`, [`GROUP_CHUNKS_DEFAULT`]):
//! chunk `i` carries the group tag `hex(h_j)` with `j = ⌊i/G⌋·G` (the hash of its group's
//! first chunk), so its key is `"kvc:" + ns_id + ":{" + hex(h_j) + "}" + hex(h_i)` and a
//! group's chunks share one slot: a prefix of `n` chunks spans at most `⌈n/G⌉` slots.
//!
//! ```
//! use strata_kvcache::Namespace;
//! let ns = Namespace::new("meta-llama/Llama-3.1-8B", "main", "bf16", "vllm", 1, 0, 4);
//! let keys = ns.chunk_keys(&[1, 2, 3, 4, 5, 6, 7, 8, 9]);
//! assert_eq!(keys.len(), 2);
//! assert!(keys[0].starts_with(&format!("kvc:{}:", ns.id())));
//! ```

use sha2::{Digest, Sha256};

pub mod quota;
pub use quota::{Quotas, SpaceFigures};

/// Chunks per group in a cluster (`kvc_group_chunks`): the chunks of a group share a slot.
pub const GROUP_CHUNKS_DEFAULT: usize = 16;

/// The index of the first chunk of chunk `i`'s group of `group_chunks`: its hash is the
/// group tag of chunk `i`.
pub fn group_start(i: usize, group_chunks: usize) -> usize {
    let g = group_chunks.max(1);
    i / g * g
}

/// The runs of `n` chunks that share a group: `(first, end)` index pairs, in order.
pub fn groups(n: usize, group_chunks: usize) -> Vec<(usize, usize)> {
    let g = group_chunks.max(1);
    (0..n).step_by(g).map(|s| (s, (s + g).min(n))).collect()
}

/// Everything that makes two KV caches incompatible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    canonical: String,
    chunk_tokens: usize,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Namespace {
    pub fn new(
        model: &str,
        revision: &str,
        dtype: &str,
        layout: &str,
        tp_world: u32,
        tp_rank: u32,
        chunk_tokens: usize,
    ) -> Self {
        let clean = |s: &str| s.replace('|', "%7C");
        let canonical = format!(
            "strata-kvc-v1|model={}|revision={}|dtype={}|layout={}|tp={tp_world}/{tp_rank}|chunk={chunk_tokens}",
            clean(model),
            clean(revision),
            clean(dtype),
            clean(layout)
        );
        Namespace {
            canonical,
            chunk_tokens: chunk_tokens.max(1),
        }
    }

    /// The namespace whose canonical text is `canonical` (as [`Namespace::canonical`] gives
    /// it), for a server that hashes tokens a client sends; `None` unless it is one.
    pub fn from_canonical(canonical: &str) -> Option<Self> {
        let rest = canonical.strip_prefix("strata-kvc-v1|")?;
        let chunk = rest.rsplit('|').next()?.strip_prefix("chunk=")?;
        let chunk_tokens: usize = chunk.parse().ok().filter(|&n| n > 0)?;
        Some(Namespace {
            canonical: canonical.to_string(),
            chunk_tokens,
        })
    }

    /// The canonical text the namespace hashes.
    pub fn canonical(&self) -> &str {
        &self.canonical
    }

    /// The namespace id used in keys and in `KVC.*` commands: 32 hex digits.
    pub fn id(&self) -> String {
        hex(&Sha256::digest(self.canonical.as_bytes()))[..32].to_string()
    }

    pub fn chunk_tokens(&self) -> usize {
        self.chunk_tokens
    }

    /// The chained hashes of every whole chunk of `tokens`, as hex.
    pub fn chunk_hashes(&self, tokens: &[u32]) -> Vec<String> {
        let mut h: [u8; 32] = Sha256::digest(self.canonical.as_bytes()).into();
        tokens
            .chunks_exact(self.chunk_tokens)
            .map(|chunk| {
                let mut d = Sha256::new();
                d.update(h);
                for t in chunk {
                    d.update(t.to_le_bytes());
                }
                h = d.finalize().into();
                hex(&h)
            })
            .collect()
    }

    /// The storage key of a chunk hash in this namespace.
    pub fn key_of(&self, chunk_hash: &str) -> String {
        format!("kvc:{}:{chunk_hash}", self.id())
    }

    /// The keys of every whole chunk of `tokens`.
    pub fn chunk_keys(&self, tokens: &[u32]) -> Vec<String> {
        self.chunk_hashes(tokens)
            .iter()
            .map(|h| self.key_of(h))
            .collect()
    }

    /// The keys of every whole chunk of `tokens` as a cluster stores them: each with its
    /// group's tag, in groups of `group_chunks`.
    pub fn grouped_keys(&self, tokens: &[u32], group_chunks: usize) -> Vec<String> {
        let hashes = self.chunk_hashes(tokens);
        let id = self.id();
        (0..hashes.len())
            .map(|i| {
                let tag = &hashes[group_start(i, group_chunks)];
                format!("kvc:{id}:{{{tag}}}{}", hashes[i])
            })
            .collect()
    }
}

/// What every chunk key starts with.
pub const CHUNK_PREFIX: &[u8] = b"kvc:";
/// What the key of every chunk's tokens starts with (then the rest of the chunk's key).
pub const TOKENS_PREFIX: &[u8] = b"kvt:";

/// The storage key for a namespace id, an optional group tag and a chunk hash given on the
/// wire: `kvc:<ns>:<hash>`, or with a tag `kvc:<ns>:{<tag>}<hash>`, so that every chunk of
/// one group hashes to the slot of `{<tag>}` in a cluster.
pub fn key_for(ns_id: &[u8], tag: Option<&[u8]>, chunk_hash: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + ns_id.len() + chunk_hash.len() + tag.map_or(0, |t| t.len()));
    k.extend_from_slice(CHUNK_PREFIX);
    k.extend_from_slice(ns_id);
    k.push(b':');
    if let Some(t) = tag {
        k.push(b'{');
        k.extend_from_slice(t);
        k.push(b'}');
    }
    k.extend_from_slice(chunk_hash);
    k
}

/// The key a chunk's tokens are kept under, beside the chunk (`kvt:` for `kvc:`, the same
/// group tag, so the same slot): the chunk's own value stays the client's bytes.
pub fn tokens_key_for(ns_id: &[u8], tag: Option<&[u8]>, chunk_hash: &[u8]) -> Vec<u8> {
    tokens_key_of(&key_for(ns_id, tag, chunk_hash))
}

/// The key of the tokens of the chunk stored under `chunk_key` (`kvc:...`).
pub fn tokens_key_of(chunk_key: &[u8]) -> Vec<u8> {
    let rest = chunk_key.get(CHUNK_PREFIX.len()..).unwrap_or_default();
    [TOKENS_PREFIX, rest].concat()
}

/// The parts of a chunk key `kvc:<ns>:[{<tag>}]<hash>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkKey<'a> {
    pub ns: &'a [u8],
    pub tag: Option<&'a [u8]>,
    pub hash: &'a [u8],
}

/// A chunk key's parts (the namespace ends at its first `:`); `None` for a key that is not
/// a chunk's.
pub fn split_chunk_key(key: &[u8]) -> Option<ChunkKey<'_>> {
    let rest = key.strip_prefix(CHUNK_PREFIX)?;
    let colon = rest.iter().position(|&b| b == b':')?;
    let (ns, rest) = (&rest[..colon], &rest[colon + 1..]);
    let (tag, hash) = match rest.iter().position(|&b| b == b'}') {
        Some(end) if rest.first() == Some(&b'{') => (Some(&rest[1..end]), &rest[end + 1..]),
        _ => (None, rest),
    };
    Some(ChunkKey { ns, tag, hash })
}

/// What is kept under a chunk's [`tokens_key_for`]: the hash of the chunk before it (empty
/// for a prompt's first chunk) and its tokens, as `parent length (u16 LE) || parent ||
/// tokens (u32 LE each)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkTokens {
    pub parent: Vec<u8>,
    pub tokens: Vec<u32>,
}

/// A parent chunk's hash as `KVC.PUT ... TOKENS` and [`ChunkTokens`] carry it: empty for a
/// prompt's first chunk, which has none.
pub fn parent_hash(parent: &[u8]) -> Option<&[u8]> {
    (!parent.is_empty()).then_some(parent)
}

impl ChunkTokens {
    /// The record of `parent` and `tokens`, given as u32 LE bytes.
    pub fn encode(parent: &[u8], tokens_le: &[u8]) -> Vec<u8> {
        let mut v = Vec::with_capacity(2 + parent.len() + tokens_le.len());
        v.extend_from_slice(&(parent.len() as u16).to_le_bytes());
        v.extend_from_slice(parent);
        v.extend_from_slice(tokens_le);
        v
    }

    pub fn decode(record: &[u8]) -> Option<ChunkTokens> {
        let n = u16::from_le_bytes(record.get(..2)?.try_into().ok()?) as usize;
        let parent = record.get(2..2 + n)?.to_vec();
        Some(ChunkTokens {
            parent,
            tokens: tokens_from_le(&record[2 + n..])?,
        })
    }
}

/// Tokens given as u32 little-endian bytes (how `KVC.PUT ... TOKENS` takes them).
pub fn tokens_from_le(bytes: &[u8]) -> Option<Vec<u32>> {
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    Some(
        bytes
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect(),
    )
}

/// A key whose cluster slot is that of group tag `tag` (every chunk key with this tag has it).
pub fn group_key(tag: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(tag.len() + 2);
    k.push(b'{');
    k.extend_from_slice(tag);
    k.push(b'}');
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_tokens_round_trip_beside_their_chunk() {
        assert_eq!(tokens_key_for(b"ns", Some(b"g"), b"h"), b"kvt:ns:{g}h");
        let k = split_chunk_key(b"kvc:ns:{g}h1").unwrap();
        assert_eq!(
            (k.ns, k.tag, k.hash),
            (&b"ns"[..], Some(&b"g"[..]), &b"h1"[..])
        );
        let k = split_chunk_key(b"kvc:ns:h2").unwrap();
        assert_eq!((k.ns, k.tag, k.hash), (&b"ns"[..], None, &b"h2"[..]));
        assert_eq!(split_chunk_key(b"kvt:ns:h2"), None);
        let le: Vec<u8> = [5u32, 70_000]
            .iter()
            .flat_map(|t| t.to_le_bytes())
            .collect();
        let rec = ChunkTokens::encode(b"parent", &le);
        let got = ChunkTokens::decode(&rec).unwrap();
        assert_eq!(parent_hash(&got.parent), Some(&b"parent"[..]));
        assert_eq!(parent_hash(b""), None);
        assert_eq!(got.tokens, [5, 70_000]);
        assert!(ChunkTokens::decode(&rec[..rec.len() - 1]).is_none());
        assert!(ChunkTokens::decode(&[9, 0, 1]).is_none());
    }

    #[test]
    fn shared_test_vectors_match() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/vectors/kvcache.json"
        );
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let cases = v["cases"].as_array().unwrap();
        assert!(cases.len() >= 4);
        let mut grouped_cases = 0;
        for c in cases {
            let n = &c["namespace"];
            let ns = Namespace::new(
                n["model"].as_str().unwrap(),
                n["revision"].as_str().unwrap(),
                n["dtype"].as_str().unwrap(),
                n["layout"].as_str().unwrap(),
                n["tp_world"].as_u64().unwrap() as u32,
                n["tp_rank"].as_u64().unwrap() as u32,
                n["chunk_tokens"].as_u64().unwrap() as usize,
            );
            let tokens: Vec<u32> = c["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as u32)
                .collect();
            let want: Vec<String> = c["keys"]
                .as_array()
                .unwrap()
                .iter()
                .map(|k| k.as_str().unwrap().to_string())
                .collect();
            assert_eq!(ns.id(), c["ns_id"].as_str().unwrap());
            assert_eq!(ns.chunk_keys(&tokens), want, "case {}", c["name"]);
            let g = c["group_chunks"].as_u64().unwrap() as usize;
            let grouped: Vec<String> = c["grouped_keys"]
                .as_array()
                .unwrap()
                .iter()
                .map(|k| k.as_str().unwrap().to_string())
                .collect();
            assert_eq!(ns.grouped_keys(&tokens, g), grouped, "case {}", c["name"]);
            let again = Namespace::from_canonical(c["canonical"].as_str().unwrap()).unwrap();
            assert_eq!(again, ns, "case {}", c["name"]);
            grouped_cases += usize::from(tokens.len() / ns.chunk_tokens() > g);
        }
        assert!(grouped_cases > 0, "no case spans two groups");
    }

    #[test]
    fn groups_start_at_multiples_of_their_size() {
        assert_eq!(group_start(0, 16), 0);
        assert_eq!(group_start(15, 16), 0);
        assert_eq!(group_start(16, 16), 16);
        assert_eq!(group_start(37, 16), 32);
        assert_eq!(group_start(5, 0), 5, "a group size of 0 counts as 1");
        assert_eq!(groups(5, 2), vec![(0, 2), (2, 4), (4, 5)]);
        assert!(groups(0, 16).is_empty());
        let ns = Namespace::new("m", "r", "bf16", "vllm", 1, 0, 1);
        let keys = ns.grouped_keys(&[1, 2, 3, 4, 5], 2);
        let tag = |k: &str| k[k.find('{').unwrap()..=k.find('}').unwrap()].to_string();
        assert_eq!(tag(&keys[0]), tag(&keys[1]));
        assert_ne!(tag(&keys[1]), tag(&keys[2]));
        assert!(keys[2].contains(&format!("{{{}}}", ns.chunk_hashes(&[1, 2, 3])[2])));
        assert_eq!(
            Namespace::from_canonical("strata-kvc-v1|model=m|chunk=0"),
            None
        );
        assert_eq!(Namespace::from_canonical("other|chunk=4"), None);
    }

    #[test]
    fn prefixes_share_keys_and_namespaces_never_collide() {
        let a = Namespace::new("m", "r", "bf16", "vllm", 1, 0, 2);
        let long = a.chunk_keys(&[1, 2, 3, 4, 5, 6]);
        let short = a.chunk_keys(&[1, 2, 3, 4, 9]);
        assert_eq!(
            long[..2],
            short[..2],
            "a shared prefix shares its chunk keys"
        );
        let other = [
            Namespace::new("m", "r", "fp16", "vllm", 1, 0, 2),
            Namespace::new("m", "r2", "bf16", "vllm", 1, 0, 2),
            Namespace::new("m", "r", "bf16", "vllm", 2, 0, 2),
            Namespace::new("m", "r", "bf16", "vllm", 2, 1, 2),
            Namespace::new("m", "r", "bf16", "sglang", 1, 0, 2),
            Namespace::new("m2", "r", "bf16", "vllm", 1, 0, 2),
        ];
        for o in &other {
            assert_ne!(o.id(), a.id());
            assert_ne!(o.chunk_keys(&[1, 2])[0], long[0]);
        }
        assert_ne!(
            a.chunk_keys(&[1, 2, 3, 4])[1],
            a.chunk_keys(&[3, 4, 1, 2])[1],
            "order matters"
        );
    }
}
