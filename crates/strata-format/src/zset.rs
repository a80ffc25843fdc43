//! The value of a sorted set ([`crate::Kind::ZSet`]): members with their scores, sorted by
//! score and then by member bytes (Redis's order).
//!
//! ```text
//! zset   = ver u8 (2) | count varint | entry × count
//! entry  = head varint (len << 1 | integral) | score | member
//! score  = zigzag varint of the integer (integral: a whole number within ±2^53, not -0)
//!        | f64 (IEEE 754 bits, LE) (any other)
//! ```
//!
//! A whole score costs one byte up to ±63 (a rank), six for a millisecond timestamp.
//! Sets written before (version 1: `count u32`, and `score f64 | len u32` in front of each
//! member) are still read.
//!
//! One stored value, like a hash ([`crate::hash`]): a change rewrites it whole, and a range
//! read decodes the set; past a size, parts ([`crate::parts`]), one per member.

use std::cmp::Ordering;

use crate::{flagged, put_varint, varint_len, Reader, Result, COLLECTION_V1};

/// Bytes of a sorted set with no members.
pub const ZSET_HEADER_BYTES: usize = 1 + 1;

/// Redis's order of a sorted set's entries: by score, then by member bytes.
pub fn order(a: &(f64, impl AsRef<[u8]>), b: &(f64, impl AsRef<[u8]>)) -> Ordering {
    a.0.partial_cmp(&b.0)
        .unwrap_or(Ordering::Equal)
        .then_with(|| a.1.as_ref().cmp(b.1.as_ref()))
}

/// The largest magnitude of a score written as an integer: every whole number up to it is
/// an `f64` exactly.
const INTEGRAL_MAX: f64 = (1u64 << 53) as f64;

/// `score` as the integer it is, when it is written as one.
fn integral(score: f64) -> Option<i64> {
    let whole = score.fract() == 0.0 && score.abs() <= INTEGRAL_MAX;
    (whole && !(score == 0.0 && score.is_sign_negative())).then_some(score as i64)
}

fn zigzag(i: i64) -> u64 {
    ((i << 1) ^ (i >> 63)) as u64
}

fn unzigzag(z: u64) -> i64 {
    (z >> 1) as i64 ^ -((z & 1) as i64)
}

/// Bytes an entry of `member` with `score` takes.
fn entry_len(score: f64, member: &[u8]) -> usize {
    let whole = integral(score);
    let score_len = whole.map_or(8, |i| varint_len(zigzag(i)));
    varint_len(flagged(member.len(), whole.is_some())) + score_len + member.len()
}

/// Decodes a sorted set's `(score, member)` entries, in order.
pub fn decode_zset(b: &[u8]) -> Result<Vec<(f64, &[u8])>> {
    let mut r = Reader::new(b, "sorted set");
    let (ver, count) = r.collection_header(|ver| if ver == COLLECTION_V1 { 12 } else { 2 })?;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        if ver == COLLECTION_V1 {
            let score = f64::from_bits(r.u64()?);
            let len = r.u32()? as usize;
            out.push((score, r.bytes(len)?));
            continue;
        }
        out.push(read_entry(&mut r)?);
    }
    r.finish()?;
    Ok(out)
}

/// One entry of the current encoding.
fn read_entry<'a>(r: &mut Reader<'a>) -> Result<(f64, &'a [u8])> {
    let (len, whole) = r.flagged_len()?;
    let score = if whole {
        let i = unzigzag(r.varint()?);
        if i.unsigned_abs() > 1 << 53 {
            return Err(crate::FormatError::Bad {
                what: "sorted set",
                detail: format!("integral score {i}"),
            });
        }
        i as f64
    } else {
        f64::from_bits(r.u64()?)
    };
    Ok((score, r.bytes(len)?))
}

/// The entry at the start of `b` (the current encoding's items, as
/// [`crate::parts`] cuts them): its score and member, and how many bytes it takes.
pub fn entry_at(b: &[u8]) -> Result<((f64, &[u8]), usize)> {
    let mut r = Reader::new(b, "sorted set entry");
    let entry = read_entry(&mut r)?;
    Ok((entry, b.len() - r.remaining()))
}

/// The score and member of one entry `item` (a part's item), all of it.
pub fn decode_entry(item: &[u8]) -> Result<(f64, &[u8])> {
    let mut r = Reader::new(item, "sorted set entry");
    let entry = read_entry(&mut r)?;
    r.finish()?;
    Ok(entry)
}

/// A score bound of a range read (`ZRANGEBYSCORE` and friends): `(` makes it exclusive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoreBound {
    pub value: f64,
    pub exclusive: bool,
}

impl ScoreBound {
    /// Whether `score` is at or above this bound as a minimum.
    pub fn admits_above(&self, score: f64) -> bool {
        if self.exclusive {
            score > self.value
        } else {
            score >= self.value
        }
    }

    /// Whether `score` is at or below this bound as a maximum.
    pub fn admits_below(&self, score: f64) -> bool {
        if self.exclusive {
            score < self.value
        } else {
            score <= self.value
        }
    }
}

/// A member bound of a lex range (`ZRANGEBYLEX` and friends): `-`, `+`, `[m` or `(m`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberBound<'a> {
    Min,
    Max,
    Incl(&'a [u8]),
    Excl(&'a [u8]),
}

impl MemberBound<'_> {
    /// Whether `member` is at or above this bound as a minimum.
    pub fn admits_above(&self, member: &[u8]) -> bool {
        match self {
            MemberBound::Min => true,
            MemberBound::Max => false,
            MemberBound::Incl(x) => member >= *x,
            MemberBound::Excl(x) => member > *x,
        }
    }

    /// Whether `member` is at or below this bound as a maximum.
    pub fn admits_below(&self, member: &[u8]) -> bool {
        match self {
            MemberBound::Min => false,
            MemberBound::Max => true,
            MemberBound::Incl(x) => member <= *x,
            MemberBound::Excl(x) => member < *x,
        }
    }
}

/// Which entries of a sorted set a range read answers with, in the order it answers
/// (`rev`: from the highest score down).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoreWindow<'a> {
    pub pick: Pick<'a>,
    pub rev: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pick<'a> {
    /// Ranks as [`rank_window`] reads them (counted from the end the walk starts at).
    Ranks { start: i64, stop: i64 },
    /// Scores from `min` to `max`; of those, `count` (all if `None`) after `offset`.
    Scores {
        min: ScoreBound,
        max: ScoreBound,
        offset: usize,
        count: Option<usize>,
    },
    /// Members from `min` to `max` of a set whose entries all have one score (what a lex
    /// range assumes); of those, `count` (all if `None`) after `offset`.
    Members {
        min: MemberBound<'a>,
        max: MemberBound<'a>,
        offset: usize,
        count: Option<usize>,
    },
}

/// The ranks `start..=stop` of a set of `len` entries (or a list's indexes: `LRANGE` reads
/// them alike) as Redis reads them (negative ranks count from the end; only the start is
/// clamped to 0), in ascending order: `None` if they hold nothing.
pub fn rank_window(len: usize, start: i64, stop: i64) -> Option<(usize, usize)> {
    let len = len as i64;
    let norm = |i: i64| if i < 0 { len + i } else { i };
    let (s, e) = (norm(start).max(0), norm(stop));
    if s > e || s >= len {
        return None;
    }
    Some((s as usize, e.min(len - 1) as usize))
}

/// Encodes `entries` (already in order, members distinct).
pub fn encode_zset<M: AsRef<[u8]>>(entries: &[(f64, M)]) -> Vec<u8> {
    let len = ZSET_HEADER_BYTES
        + entries
            .iter()
            .map(|(score, m)| entry_len(*score, m.as_ref()))
            .sum::<usize>();
    let mut out = crate::collection_buf(entries.len(), len);
    for (score, m) in entries {
        let m = m.as_ref();
        let whole = integral(*score);
        put_varint(&mut out, flagged(m.len(), whole.is_some()));
        match whole {
            Some(i) => put_varint(&mut out, zigzag(i)),
            None => out.extend_from_slice(&score.to_bits().to_le_bytes()),
        }
        out.extend_from_slice(m);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorted_sets_round_trip_and_damage_is_refused() {
        let entries: Vec<(f64, &[u8])> = vec![
            (f64::NEG_INFINITY, b"a"),
            (-0.5, b""),
            (1.0, b"x"),
            (1.0, b"y"),
        ];
        let enc = encode_zset(&entries);
        assert_eq!(decode_zset(&enc).unwrap(), entries);
        for cut in 0..enc.len() {
            assert!(decode_zset(&enc[..cut]).is_err(), "cut at {cut}");
        }
        let mut padded = enc.clone();
        padded.push(0);
        assert!(decode_zset(&padded).is_err());
        // Two bytes in front of a short member with a whole score, nine with another.
        assert_eq!(enc.len(), 2 + (9 + 1) + 9 + (2 + 1) + (2 + 1));
    }

    #[test]
    fn whole_scores_are_written_short_and_read_back_exactly() {
        let big = (1u64 << 53) as f64;
        let scores = [
            0.0,
            -0.0,
            1.0,
            -1.0,
            63.0,
            -64.0,
            64.0,
            1.7e12,
            big,
            -big,
            big * 2.0,
            0.5,
            f64::MAX,
            f64::MIN_POSITIVE,
            f64::INFINITY,
            f64::NEG_INFINITY,
            1e300,
        ];
        for score in scores {
            let enc = encode_zset(&[(score, b"m")]);
            let back = decode_zset(&enc).unwrap();
            assert_eq!(back[0].0.to_bits(), score.to_bits(), "{score}");
            assert_eq!(enc.len(), ZSET_HEADER_BYTES + entry_len(score, b"m"));
        }
        assert_eq!(entry_len(5.0, b"m"), 3);
        assert_eq!(entry_len(-0.0, b"m"), 10, "-0 keeps its sign as an f64");
        assert_eq!(entry_len(1.7e12, b"m"), 8);
        assert_eq!(entry_len(big * 2.0, b"m"), 10);
        // An integer past 2^53 is refused: it has no exact f64.
        let mut bad = crate::collection_buf(1, 16);
        put_varint(&mut bad, flagged(1, true));
        put_varint(&mut bad, zigzag((1 << 53) + 1));
        bad.push(b'm');
        assert!(decode_zset(&bad).is_err());
    }

    #[test]
    fn sorted_sets_written_in_the_first_encoding_are_still_read() {
        let entries: Vec<(f64, &[u8])> = vec![(-0.5, b""), (1.0, b"x")];
        let mut v1 = vec![COLLECTION_V1];
        v1.extend_from_slice(&2u32.to_le_bytes());
        for (score, m) in &entries {
            v1.extend_from_slice(&score.to_bits().to_le_bytes());
            v1.extend_from_slice(&(m.len() as u32).to_le_bytes());
            v1.extend_from_slice(m);
        }
        assert_eq!(decode_zset(&v1).unwrap(), entries);
        for cut in 0..v1.len() {
            assert!(decode_zset(&v1[..cut]).is_err(), "cut at {cut}");
        }
    }
}
