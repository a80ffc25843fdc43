//! Mutation fuzzing of Strata's decoders on stable Rust: one target per decoder.
//!
//! Each target starts from valid inputs, mutates them (bit flips, byte changes, truncation,
//! splices, repeated runs) with a seeded RNG, and feeds them to the decoder, which must
//! return an error or a value and never panic, loop or allocate without bound. Run longer
//! campaigns with `cargo run --release -p strata-fuzz -- <target> <iterations> [seed]`.

use bytes::BytesMut;

pub use strata_testkit::Rng;

/// Applies one to four random mutations.
pub fn mutate(rng: &mut Rng, input: &[u8], dictionary: &[&[u8]]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..1 + rng.index(4) {
        match rng.index(7) {
            0 if !v.is_empty() => {
                let i = rng.index(v.len());
                v[i] ^= 1 << rng.index(8);
            }
            1 if !v.is_empty() => {
                let i = rng.index(v.len());
                v[i] = rng.next_u64() as u8;
            }
            2 => v.truncate(rng.index(v.len() + 1)),
            3 => {
                let i = rng.index(v.len() + 1);
                let word = dictionary[rng.index(dictionary.len())];
                v.splice(i..i, word.iter().copied());
            }
            4 if !v.is_empty() => {
                let i = rng.index(v.len());
                let n = rng.index(64);
                let b = v[i];
                v.splice(i..i, std::iter::repeat_n(b, n));
            }
            5 if !v.is_empty() => {
                let i = rng.index(v.len());
                v.remove(i);
            }
            _ => v.extend((0..rng.index(16)).map(|_| rng.next_u64() as u8)),
        }
    }
    v
}

const RESP_SEEDS: &[&[u8]] = &[
    b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n",
    b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*1\r\n$4\r\nPING\r\n",
    b"PING\r\nSET a \"x y\" 'z'\r\n",
    b"*0\r\n\r\n*-1\r\n",
];
const RESP_WORDS: &[&[u8]] = &[
    b"\r\n",
    b"*",
    b"$",
    b"-1",
    b"99999999999",
    b"\"",
    b"'",
    b"\\x4",
    b"*2\r\n",
    b"$0\r\n\r\n",
];

/// Whether `consumed` holds only requests without arguments, which the parser skips:
/// blank inline lines and multibulk headers counting none (`*0`, `*-3`).
fn only_empty_requests(consumed: &[u8]) -> bool {
    consumed.split(|&b| b == b'\n').all(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let count = || {
            std::str::from_utf8(line.get(1..)?)
                .ok()?
                .parse::<i64>()
                .ok()
        };
        line.iter().all(u8::is_ascii_whitespace)
            || (line.first() == Some(&b'*') && count().is_some_and(|n| n <= 0))
    })
}

/// Feeds one input to the RESP request parser, in random-sized pieces.
pub fn resp_one(rng: &mut Rng, input: &[u8]) {
    let limits = strata_resp::Limits {
        bulk_bytes_max: 1 << 16,
        arg_count_max: 1 << 12,
        inline_bytes_max: 1 << 12,
    };
    let mut buf = BytesMut::new();
    let mut fed = 0;
    while fed < input.len() {
        let n = 1 + rng.index(input.len() - fed);
        buf.extend_from_slice(&input[fed..fed + n]);
        fed += n;
        loop {
            let before = buf.len();
            let snapshot = buf.clone();
            match strata_resp::parse_request(&mut buf, &limits) {
                Ok(Some(args)) => {
                    assert!(buf.len() < before, "a parsed request must consume input");
                    assert!(args
                        .iter()
                        .all(|a| a.len() <= limits.bulk_bytes_max.max(limits.inline_bytes_max)));
                }
                Ok(None) => {
                    let consumed = &snapshot[..before - buf.len()];
                    assert!(
                        only_empty_requests(consumed),
                        "an incomplete request consumed {consumed:?}"
                    );
                    break;
                }
                Err(_) => return,
            }
        }
    }
}

/// Runs the RESP target; returns the number of executions.
pub fn fuzz_resp(iterations: usize, seed: u64) -> usize {
    let mut rng = Rng::new(seed);
    for _ in 0..iterations {
        let base = RESP_SEEDS[rng.index(RESP_SEEDS.len())];
        let input = mutate(&mut rng, base, RESP_WORDS);
        resp_one(&mut rng, &input);
    }
    iterations
}

fn seed_segment() -> strata_format::Segment {
    let mut b = strata_format::SegmentBuilder::new(42, 256, 1);
    for i in 0..20u32 {
        let kind = [strata_format::Kind::String, strata_format::Kind::Hash][i as usize % 2];
        b.push(
            kind,
            format!("key:{i:03}").as_bytes(),
            &vec![i as u8; (i * 13) as usize],
            i as u64,
        )
        .expect("valid entry");
    }
    b.finish().expect("valid segment")
}

/// Feeds one (possibly corrupted) segment to every segment and block decoder.
pub fn segment_one(seg: &[u8], refs: &[strata_format::BlockRef]) {
    if let Ok(footer) = strata_format::decode_footer(seg) {
        for (i, b) in footer.blocks.iter().enumerate() {
            let r = footer.block_ref(i, strata_format::Kind::String, 0, 0);
            let end = (b.offset as usize).saturating_add(b.len as usize);
            if end <= seg.len() {
                if let Ok(raw) = strata_format::decode_block(&r, &seg[b.offset as usize..end]) {
                    for e in strata_format::iter_block(&raw) {
                        if e.is_err() {
                            break;
                        }
                    }
                }
            }
        }
    }
    for r in refs {
        let end = (r.offset as usize)
            .saturating_add(r.len as usize)
            .min(seg.len());
        let start = (r.offset as usize).min(end);
        if let Ok(raw) = strata_format::decode_block(r, &seg[start..end]) {
            let _ = strata_format::find_in_block(&raw, b"key:007");
        }
    }
    let _ = strata_format::BlockRef::decode(&seg[..seg.len().min(45)]);
    let _ = strata_format::WarmRecord::decode(b"k", seg);
}

/// Runs the segment target; returns the number of executions.
pub fn fuzz_segment(iterations: usize, seed: u64) -> usize {
    let mut rng = Rng::new(seed);
    let seg = seed_segment();
    let refs: Vec<_> = seg.refs.iter().map(|(_, r)| *r).collect();
    let words: &[&[u8]] = &[b"STRSEGv1", &[0xff; 8], &[0; 8]];
    for _ in 0..iterations {
        let input = mutate(&mut rng, &seg.bytes, words);
        segment_one(&input, &refs);
    }
    iterations
}

/// Valid collection values of every kind, in the current encoding and in version 1 (the
/// mutations' starting points).
fn collection_seeds() -> Vec<(strata_format::Kind, Vec<u8>)> {
    use strata_format::hash::{encode_hash, Field};
    use strata_format::Kind;
    let field = |name: &'static [u8], value: &'static [u8], expire_ms| Field {
        name,
        value,
        expire_ms,
    };
    let long = &[b'n'; 200][..];
    let hash = encode_hash(&[
        field(b"a", b"1", 0),
        field(long, b"", 7),
        field(b"", b"v", 0),
    ]);
    let members = strata_format::members::encode_members(&[&b"x"[..], b"", long]);
    let zset = strata_format::zset::encode_zset(&[
        (f64::NEG_INFINITY, &b"a"[..]),
        (-0.0, b"b"),
        (3.0, b"c"),
        (1.7e12, long),
        (0.25, b"d"),
    ]);
    let mut v1 = vec![1u8];
    v1.extend_from_slice(&2u32.to_le_bytes());
    for m in [&b"x"[..], b"yy"] {
        v1.extend_from_slice(&(m.len() as u32).to_le_bytes());
        v1.extend_from_slice(m);
    }
    vec![
        (Kind::Hash, hash),
        (Kind::Set, members.clone()),
        (Kind::List, members),
        (Kind::ZSet, zset),
        (Kind::Set, v1),
    ]
}

/// Decodes one (possibly corrupted) value of `kind`; what decodes must encode to a value
/// that decodes to the same items (version 1 or 2 in, version 2 out).
pub fn collection_one(kind: strata_format::Kind, value: &[u8]) {
    use strata_format::{hash, members, zset, Kind};
    match kind {
        Kind::Hash | Kind::VectorSet => {
            if let Ok(fields) = hash::decode_hash(value) {
                let again = hash::encode_hash(&fields);
                assert_eq!(hash::decode_hash(&again).expect("re-encoded hash"), fields);
                let _ = hash::all_fields_expire_ms(value);
            }
        }
        Kind::Set | Kind::List => {
            if let Ok(items) = members::decode_members(value) {
                let again = members::encode_members(&items);
                assert_eq!(members::decode_members(&again).expect("re-encoded"), items);
            }
        }
        Kind::ZSet => {
            if let Ok(entries) = zset::decode_zset(value) {
                let again = zset::encode_zset(&entries);
                let back = zset::decode_zset(&again).expect("re-encoded sorted set");
                let bits = |e: &[(f64, &[u8])]| -> Vec<(u64, Vec<u8>)> {
                    e.iter().map(|(s, m)| (s.to_bits(), m.to_vec())).collect()
                };
                assert_eq!(bits(&back), bits(&entries), "scores come back bit for bit");
            }
        }
        Kind::String => {}
    }
    let _ = strata_format::dump::decode_dump(&strata_format::dump::encode_dump(kind, value));
}

pub fn fuzz_collections(iterations: usize, seed: u64) -> usize {
    let mut rng = Rng::new(seed);
    let seeds = collection_seeds();
    let words: &[&[u8]] = &[&[0x80], &[0xff; 5], &[0x7f], &[1], &[2], &[0; 8]];
    for _ in 0..iterations {
        let (kind, base) = &seeds[rng.index(seeds.len())];
        collection_one(*kind, &mutate(&mut rng, base, words));
    }
    iterations
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A short fuzzing run on every test invocation (CI runs it too); the seed varies with
    /// the clock and is printed, so a failure can be replayed.
    #[test]
    fn short_fuzz_runs_find_no_panics() {
        let seed = strata_testkit::Rng::from_env("fuzz").next_u64();
        assert_eq!(fuzz_resp(20_000, seed), 20_000);
        assert_eq!(fuzz_segment(3_000, seed), 3_000);
        assert_eq!(fuzz_collections(20_000, seed), 20_000);
    }
}
