//! Sorted-set commands. A sorted set is one value of kind [`Kind::ZSet`]
//! (`strata_format::zset`: entries sorted by score, then member): read whole, changed under
//! the key's lock, deleted when left empty. Scores are `f64`, printed as Redis prints them
//! (`%.17g`).

use std::cmp::Ordering;
use std::collections::HashMap;

use bytes::Bytes;
use strata_engine::{Answer, Asked, Kind, Source};
use strata_format::members::decode_members;
use strata_format::zset::{
    decode_zset, encode_zset, order, rank_window, MemberBound, Pick, ScoreBound, ScoreWindow,
};
use strata_resp::Reply;

use super::ctx::{engine_error, lower, not_integer, parse_int, syntax_error, wrong_type, Ctx};
use super::items::{own, table_due, Items, NameTable, Touched};
use super::typed::{
    block_on, blocking_mpop_args, bulk, corrupt, keys_then_timeout, member_hash, mpop_args,
    pop_count, random_args, random_positions, read_asked, read_count, read_items, read_kind_with,
    read_live, read_named_with, reply, scan_options, scan_reply, store_items, write_items, Codec,
    ScanOptions,
};

type Entry = (f64, Bytes);

fn not_float() -> Reply {
    Reply::err("ERR value is not a valid float")
}

/// A score as Redis reads one (`strtod`): `inf` and `-inf` allowed, NaN, spaces and values
/// out of range refused.
pub(crate) fn parse_score(b: &[u8]) -> Option<f64> {
    // Most scores are small integers: up to 15 digits an `f64` holds exactly (`-0` is
    // left to the parser below, which keeps its sign).
    let digits = b.strip_prefix(b"-").unwrap_or(b);
    if (1..=15).contains(&digits.len()) && digits.iter().all(u8::is_ascii_digit) {
        let n = digits
            .iter()
            .fold(0i64, |n, d| n * 10 + i64::from(d - b'0'));
        if n != 0 || digits.len() == b.len() {
            return Some(if digits.len() == b.len() { n } else { -n } as f64);
        }
    }
    let s = std::str::from_utf8(b).ok()?;
    if s.is_empty() || s.trim() != s {
        return None;
    }
    let v: f64 = s.parse().ok()?;
    let is_inf_word = || {
        let word = s.trim_start_matches(['+', '-']);
        word.eq_ignore_ascii_case("inf") || word.eq_ignore_ascii_case("infinity")
    };
    if v.is_nan()
        || v.is_infinite() && !is_inf_word()
        || v == 0.0
            && s.bytes()
                .take_while(|&c| c != b'e' && c != b'E')
                .any(|c| (b'1'..=b'9').contains(&c))
    {
        return None;
    }
    Some(v)
}

/// A sorted set's entries, in order.
struct ZSetCodec;

impl Codec for ZSetCodec {
    type Item = Entry;
    type Items = Scored;
    const KIND: Kind = Kind::ZSet;
    fn decode(value: &Bytes, _now_ms: u64) -> strata_format::Result<Vec<Entry>> {
        Ok(decode_zset(value)?
            .into_iter()
            .map(|(s, m)| (s, value.slice_ref(m)))
            .collect())
    }
    fn encode(items: &[Entry]) -> Vec<u8> {
        encode_zset(items)
    }
}

/// Puts `member` at `score` in `entries`, keeping the order; its current score is `cur`
/// (`None`: not in `entries`), so its entry is found by its order. A member already there
/// moves: only the entries between its old and its new place shift, by one.
fn place_known(entries: &mut Vec<Entry>, cur: Option<f64>, score: f64, member: Bytes) {
    let e = (score, member);
    let Some(c) = cur else {
        let at = entries.partition_point(|x| order(x, &e) == Ordering::Less);
        entries.insert(at, e);
        return;
    };
    let i = entries.partition_point(|x| order(x, &(c, &e.1)) == Ordering::Less);
    debug_assert!(entries[i].1 == e.1, "the member is where its score puts it");
    if order(&e, &entries[i]) == Ordering::Less {
        let j = entries[..i].partition_point(|x| order(x, &e) == Ordering::Less);
        entries[j..=i].rotate_right(1);
        entries[j] = e;
    } else {
        let j = i + entries[i + 1..].partition_point(|x| order(x, &e) == Ordering::Less);
        entries[i..=j].rotate_left(1);
        entries[j] = e;
    }
}

/// Where `e` goes in `run`, or is: after every entry ordered before it.
fn position_in(run: &[Entry], e: &(f64, impl AsRef<[u8]>)) -> usize {
    run.partition_point(|x| order(x, e) == Ordering::Less)
}

/// The score a run ends with, as [`Scored::lasts`] keeps it (an empty run, the lone run of
/// an empty set, ends after every score).
fn last_score(run: &[Entry]) -> f64 {
    run.last().map_or(f64::INFINITY, |e| e.0)
}

/// Most entries a run of [`Scored`] holds while the set is written; a longer one splits in
/// two. A move shifts at most this many entries (40 bytes each), not the whole set.
const RUN_MAX: usize = 256;

/// Entries in order, read by position: a slice, or a live set's runs ([`Runs`]), so that a
/// range, a rank or a count costs a search and its result, not a join of the runs.
trait Ordered {
    type M: AsRef<[u8]> + Clone;
    fn len(&self) -> usize;
    fn at(&self, i: usize) -> &(f64, Self::M);
    /// The first position whose entry fails `pred`, which holds for a prefix of them.
    fn partition_point(&self, pred: impl FnMut(&(f64, Self::M)) -> bool) -> usize;
}

impl<M: AsRef<[u8]> + Clone> Ordered for [(f64, M)] {
    type M = M;
    fn len(&self) -> usize {
        <[(f64, M)]>::len(self)
    }
    fn at(&self, i: usize) -> &(f64, M) {
        &self[i]
    }
    fn partition_point(&self, pred: impl FnMut(&(f64, M)) -> bool) -> usize {
        <[(f64, M)]>::partition_point(self, pred)
    }
}

/// A [`Scored`]'s runs read as one sequence: positions found through the runs' counts.
struct Runs<'a> {
    runs: &'a [Vec<Entry>],
    counts: &'a RunCounts,
    len: usize,
}

impl Ordered for Runs<'_> {
    type M = Bytes;
    fn len(&self) -> usize {
        self.len
    }
    fn at(&self, i: usize) -> &Entry {
        let (r, offset) = self.counts.find(i);
        &self.runs[r][offset]
    }
    fn partition_point(&self, mut pred: impl FnMut(&Entry) -> bool) -> usize {
        let r = self
            .runs
            .partition_point(|run| run.last().is_some_and(&mut pred));
        match self.runs.get(r) {
            Some(run) => self.counts.before(r) + run.partition_point(pred),
            None => self.len,
        }
    }
}

/// How many entries each run of a [`Scored`] holds, summed by prefix in logarithmic time
/// (a Fenwick tree), so that a position or a rank costs no pass over thousands of runs.
/// Built from the runs when a read needs it; a change of a run's count updates it, a
/// change of the runs themselves (a split, a run gone) drops it.
struct RunCounts {
    /// 1-based: `tree[i]` sums the counts of the runs `i - lowbit(i) .. i`.
    tree: Vec<usize>,
}

impl RunCounts {
    fn new(runs: &[Vec<Entry>]) -> Self {
        let n = runs.len();
        let mut tree = vec![0; n + 1];
        for i in 1..=n {
            tree[i] += runs[i - 1].len();
            let up = i + (i & i.wrapping_neg());
            if up <= n {
                tree[up] += tree[i];
            }
        }
        RunCounts { tree }
    }

    /// Run `run` gained (or with a negative `delta` lost) entries.
    fn add(&mut self, run: usize, delta: isize) {
        let mut i = run + 1;
        while i < self.tree.len() {
            self.tree[i] = self.tree[i].wrapping_add_signed(delta);
            i += i & i.wrapping_neg();
        }
    }

    /// Entries in the runs before `run`.
    fn before(&self, run: usize) -> usize {
        let (mut i, mut sum) = (run, 0);
        while i > 0 {
            sum += self.tree[i];
            i -= i & i.wrapping_neg();
        }
        sum
    }

    /// The run holding position `pos` (below the total), and the position within it.
    fn find(&self, mut pos: usize) -> (usize, usize) {
        let n = self.tree.len() - 1;
        let mut at = 0;
        let mut step = if n == 0 { 0 } else { 1 << n.ilog2() };
        while step > 0 {
            if at + step <= n && self.tree[at + step] <= pos {
                at += step;
                pos -= self.tree[at];
            }
            step >>= 1;
        }
        (at, pos)
    }
}

/// A sorted set's entries in order, with a table from member to score once a value is
/// looked up again (a live value, kept between commands) and is large enough
/// ([`table_due`]), so `ZADD` finds a member's entry by its order. The table
/// holds through [`Scored::place`] and removals.
///
/// The entries are kept in runs, each sorted and each after the one before: one run as
/// decoded, runs of at most [`RUN_MAX`] once [`Scored::place`] changes a larger set, so
/// writes to a large live set cost a run. Reads and removals go through the runs as they
/// are ([`Scored::view`], [`Scored::take_range`], [`Scored::remove_members`]): a range
/// costs its result, a rank or a count a search. There is always at least one run, and
/// only a lone run is empty. Changes are noted by member ([`Touched`]), so a large set's
/// few changes are logged as a delta.
pub(crate) struct Scored {
    runs: Vec<Vec<Entry>>,
    /// Each run's last score ([`last_score`]), side by side: finding a run reads these,
    /// not the runs' entries (a cache miss per run looked at, in a set of thousands).
    lasts: Vec<f64>,
    /// The runs' counts, while no split or removal of a run changed them ([`Runs`]).
    counts: Option<RunCounts>,
    /// Entries in all runs (summing the runs' lengths costs a pass over thousands of them).
    count: usize,
    scores: Option<NameTable<f64>>,
    lookups: u32,
    touched: Touched,
}

impl Scored {
    /// The score of `member`, if it is in the set.
    fn score_of(&mut self, member: &[u8]) -> Option<f64> {
        if self.scores.is_none() && table_due(self.len(), &mut self.lookups) {
            let mut t = NameTable::with_capacity(self.len());
            for (s, m) in self.runs.iter().flatten() {
                t.insert(m, *s);
            }
            self.scores = Some(t);
        }
        match &self.scores {
            Some(t) => t.get(member).copied(),
            None => self
                .runs
                .iter()
                .flatten()
                .find(|(_, m)| &m[..] == member)
                .map(|(s, _)| *s),
        }
    }

    /// Puts `member` at `score`, whose current score is `cur` (from [`Scored::score_of`]).
    fn place(&mut self, cur: Option<f64>, score: f64, member: Bytes) {
        let member = own(&member);
        if let Some(t) = &mut self.scores {
            t.insert(&member, score);
        }
        self.count += usize::from(cur.is_none());
        self.touched.set(&member, self.count);
        if self.runs.len() == 1 && self.runs[0].len() <= RUN_MAX {
            self.counts = None;
            place_known(&mut self.runs[0], cur, score, member);
            self.lasts[0] = last_score(&self.runs[0]);
            return;
        }
        if self.runs.len() == 1 {
            let all = std::mem::take(&mut self.runs[0]);
            self.runs = all.chunks(RUN_MAX / 2).map(<[Entry]>::to_vec).collect();
            self.lasts = self.runs.iter().map(|r| last_score(r)).collect();
            self.counts = None;
        }
        if let Some(c) = cur {
            let old = (c, &member);
            let r = self.run_of(&old);
            let run = &mut self.runs[r];
            let i = position_in(run, &old);
            debug_assert!(run[i].1 == member, "the member is where its score puts it");
            run.remove(i);
            self.counted(r, -1);
        }
        let e = (score, member);
        let r = self.run_of(&(e.0, &e.1));
        let i = position_in(&self.runs[r], &e);
        self.runs[r].insert(i, e);
        self.counted(r, 1);
    }

    /// Run `r` gained or lost `delta` entries: the counts and last scores follow, and a
    /// run left empty goes (unless it is the only one) or one past [`RUN_MAX`] splits in
    /// two.
    fn counted(&mut self, r: usize, delta: isize) {
        let (len, runs) = (self.runs[r].len(), self.runs.len());
        if len == 0 && runs > 1 {
            self.runs.remove(r);
            self.lasts.remove(r);
            self.counts = None;
            return;
        }
        if len > RUN_MAX {
            let upper = self.runs[r].split_off(len / 2);
            self.lasts.insert(r + 1, last_score(&upper));
            self.runs.insert(r + 1, upper);
            self.counts = None;
        } else if let Some(c) = &mut self.counts {
            c.add(r, delta);
        }
        self.lasts[r] = last_score(&self.runs[r]);
    }

    /// The run an entry ordered as `e` belongs in: the first whose last entry is not
    /// before it (the last run if none).
    fn run_of(&self, e: &(f64, &Bytes)) -> usize {
        let (mut lo, mut hi) = (0, self.runs.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            // The run's entries are read only when its last score ties with `e`'s.
            let before = match self.lasts[mid].partial_cmp(&e.0) {
                Some(Ordering::Less) => true,
                Some(Ordering::Greater) => false,
                _ => self.runs[mid]
                    .last()
                    .is_some_and(|last| order(last, e) == Ordering::Less),
            };
            if before {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo.min(self.runs.len() - 1)
    }

    /// Every entry in order, read by position without joining the runs.
    fn view(&mut self) -> Runs<'_> {
        let counts = self
            .counts
            .get_or_insert_with(|| RunCounts::new(&self.runs));
        Runs {
            runs: &self.runs,
            counts,
            len: self.count,
        }
    }

    /// The position of `member` in order and its score, if it is in the set.
    fn rank_of(&mut self, member: &[u8]) -> Option<(usize, f64)> {
        let score = self.score_of(member)?;
        let e = (score, member);
        let rank = self
            .view()
            .partition_point(|x| order(x, &e) == Ordering::Less);
        Some((rank, score))
    }

    /// Every entry in order, as one slice (the runs joined, if there are several).
    #[cfg(test)]
    fn entries(&mut self) -> &[Entry] {
        if self.runs.len() > 1 {
            let all = self.runs.concat();
            self.lasts = vec![last_score(&all)];
            self.runs = vec![all];
            self.counts = None;
        }
        &self.runs[0]
    }

    /// Removes the entries of `gone`'s members; how many went. Each is found by its score
    /// in its run (the runs stay as they are).
    fn remove_members(&mut self, gone: &[Bytes]) -> usize {
        let mut removed: Vec<Bytes> = Vec::new();
        for m in gone {
            let Some(score) = self.score_of(m) else {
                continue;
            };
            let e = (score, m);
            let r = self.run_of(&e);
            let run = &mut self.runs[r];
            let i = position_in(run, &e);
            // Not there: named twice, and gone already (the table follows at the end).
            if run.get(i).is_some_and(|x| x.1 == m) {
                run.remove(i);
                self.counted(r, -1);
                removed.push(m.clone());
            }
        }
        self.removed(&removed);
        removed.len()
    }

    /// Removes and returns the entries at the positions `at`, in order, from the runs
    /// they are in.
    fn take_range(&mut self, at: std::ops::Range<usize>) -> Vec<Entry> {
        let mut out: Vec<Entry> = Vec::with_capacity(at.len());
        self.counts = None;
        let (mut start, mut r) = (0, 0);
        while r < self.runs.len() && start < at.end {
            let len = self.runs[r].len();
            let (lo, hi) = (at.start.max(start), at.end.min(start + len));
            if lo < hi {
                out.extend(self.runs[r].drain(lo - start..hi - start));
            }
            start += len;
            if self.runs[r].is_empty() && self.runs.len() > 1 {
                self.runs.remove(r);
                self.lasts.remove(r);
            } else {
                self.lasts[r] = last_score(&self.runs[r]);
                r += 1;
            }
        }
        let members: Vec<Bytes> = out.iter().map(|(_, m)| m.clone()).collect();
        self.removed(&members);
        out
    }

    /// After `members` were removed: the count, the table and the noted changes follow.
    fn removed(&mut self, members: &[Bytes]) {
        self.count -= members.len();
        if let Some(t) = &mut self.scores {
            for m in members {
                t.remove(m);
            }
        }
        let len = self.len();
        for m in members {
            self.touched.removed(m, len);
        }
    }
}

impl Items<Entry> for Scored {
    const EXTRA_BYTES: usize = 48;
    fn from_vec(entries: Vec<Entry>) -> Self {
        Scored {
            count: entries.len(),
            lasts: vec![last_score(&entries)],
            runs: vec![entries],
            counts: None,
            scores: None,
            lookups: 0,
            touched: Touched::default(),
        }
    }
    fn len(&self) -> usize {
        self.count
    }
    fn encode_with(&self, encode: fn(&[Entry]) -> Vec<u8>) -> Vec<u8> {
        match &self.runs[..] {
            [one] => encode(one),
            runs => encode(&runs.concat()),
        }
    }
    fn delta(&mut self, encode: fn(&[Entry]) -> Vec<u8>) -> Option<Vec<u8>> {
        let (set, removed) = self.touched.take()?;
        let mut entries: Vec<Entry> = set
            .into_iter()
            .filter_map(|m| Some((self.score_of(&m)?, m)))
            .collect();
        entries.sort_by(order);
        Some(strata_format::delta::encode_delta(
            &encode(&entries),
            &removed,
        ))
    }
    fn stored(&mut self) {
        self.touched.take();
    }
}

fn score_reply(s: f64) -> Reply {
    Reply::Double(s)
}

/// Entries as a reply: members, with their scores after each when `with_scores` (RESP3
/// gives pairs).
fn entries_reply<'a>(
    entries: impl Iterator<Item = &'a Entry>,
    with_scores: bool,
    resp3: bool,
) -> Reply {
    let mut out = Vec::new();
    for (s, m) in entries {
        match (with_scores, resp3) {
            (false, _) => out.push(Reply::Bulk(m.clone())),
            (true, false) => {
                out.push(Reply::Bulk(m.clone()));
                out.push(score_reply(*s));
            }
            (true, true) => out.push(Reply::Array(vec![Reply::Bulk(m.clone()), score_reply(*s)])),
        }
    }
    Reply::Array(out)
}

/// `ZADD key [NX|XX] [GT|LT] [CH] [INCR] score member [score member ...]`.
pub(crate) async fn zadd(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let (mut nx, mut xx, mut gt, mut lt, mut ch, mut incr) =
        (false, false, false, false, false, false);
    let mut i = 2;
    while i < a.len() {
        match lower(&a[i]).as_str() {
            "nx" => nx = true,
            "xx" => xx = true,
            "gt" => gt = true,
            "lt" => lt = true,
            "ch" => ch = true,
            "incr" => incr = true,
            _ => break,
        }
        i += 1;
    }
    let rest = &a[i..];
    if rest.is_empty() || !rest.len().is_multiple_of(2) {
        return syntax_error();
    }
    if nx && xx {
        return Reply::err("ERR XX and NX options at the same time are not compatible");
    }
    if (gt || lt) && nx || gt && lt {
        return Reply::err("ERR GT, LT, and/or NX options at the same time are not compatible");
    }
    if incr && rest.len() > 2 {
        return Reply::err("ERR INCR option supports a single increment-element pair");
    }
    let mut pairs = Vec::with_capacity(rest.len() / 2);
    for p in rest.chunks_exact(2) {
        let Some(score) = parse_score(&p[0]) else {
            return not_float();
        };
        pairs.push((score, p[1].clone()));
    }
    let key = ctx.key(&a[1]);
    let r = write_items::<ZSetCodec, _>(ctx, &key, move |entries| {
        let (mut added, mut changed) = (0i64, 0i64);
        let mut incr_result = None;
        for (score, member) in pairs {
            let cur = entries.score_of(&member);
            let new = match (cur, incr) {
                (Some(c), true) => c + score,
                _ => score,
            };
            if new.is_nan() {
                return Err(strata_engine::Error::Invalid(
                    "resulting score is not a number (NaN)".into(),
                ));
            }
            let allowed = match cur {
                None => !xx,
                Some(c) => !(nx || gt && new <= c || lt && new >= c),
            };
            if !allowed {
                continue;
            }
            incr_result = Some(new);
            match cur {
                None => added += 1,
                Some(c) if c != new => changed += 1,
                Some(_) => continue,
            }
            entries.place(cur, new, member);
        }
        let out = match incr {
            true => incr_result.map_or(Reply::Null, score_reply),
            false => Reply::Integer(if ch { added + changed } else { added }),
        };
        Ok((added + changed > 0, out))
    });
    reply(r.await, |r| r)
}

pub(crate) async fn zincrby(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let Some(delta) = parse_score(&a[2]) else {
        return not_float();
    };
    let (member, key) = (a[3].clone(), ctx.key(&a[1]));
    let r = write_items::<ZSetCodec, _>(ctx, &key, move |entries| {
        let cur = entries.score_of(&member);
        let new = cur.unwrap_or(0.0) + delta;
        if new.is_nan() {
            return Err(strata_engine::Error::Invalid(
                "resulting score is not a number (NaN)".into(),
            ));
        }
        entries.place(cur, new, member);
        Ok((true, new))
    });
    reply(r.await, score_reply)
}

pub(crate) async fn zrem(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let gone: Vec<Bytes> = a[2..].to_vec();
    let key = ctx.key(&a[1]);
    let r = write_items::<ZSetCodec, _>(ctx, &key, move |entries| {
        let n = entries.remove_members(&gone);
        Ok((n > 0, n as i64))
    });
    reply(r.await, Reply::Integer)
}

pub(crate) async fn zcard(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let key = ctx.key(&a[1]);
    if let Some(r) = read_live::<ZSetCodec, _>(ctx, &key, |z| z.len() as i64) {
        return reply(r, Reply::Integer);
    }
    read_count(ctx, &key, Kind::ZSet, |v| Ok(decode_zset(v)?.len())).await
}

pub(crate) async fn zscore(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let key = ctx.key(&a[1]);
    let live = read_live::<ZSetCodec, _>(ctx, &key, |z| {
        z.score_of(&a[2]).map_or(Reply::Null, score_reply)
    });
    if let Some(r) = live {
        return reply(r, |r| r);
    }
    let r = read_named_entries(ctx, &key, &a[2..3], |e| {
        e.iter()
            .find(|(_, m)| *m == &a[2][..])
            .map_or(Reply::Null, |(s, _)| score_reply(*s))
    });
    reply(r.await, |r| r)
}

pub(crate) async fn zmscore(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let key = ctx.key(&a[1]);
    let live = read_live::<ZSetCodec, _>(ctx, &key, |z| {
        let score = |m: &Bytes| z.score_of(m).map_or(Reply::Null, score_reply);
        Reply::Array(a[2..].iter().map(score).collect())
    });
    if let Some(r) = live {
        return reply(r, |r| r);
    }
    let r = read_named_entries(ctx, &key, &a[2..], |e| {
        let by: HashMap<&[u8], f64> = e.iter().map(|(s, m)| (*m, *s)).collect();
        Reply::Array(
            a[2..]
                .iter()
                .map(|m| by.get(&m[..]).map_or(Reply::Null, |s| score_reply(*s)))
                .collect(),
        )
    });
    reply(r.await, |r| r)
}

async fn rank(ctx: &mut Ctx<'_>, a: &[Bytes], rev: bool) -> Reply {
    let with_score = match a.len() {
        3 => false,
        4 if lower(&a[3]) == "withscore" => true,
        _ => return syntax_error(),
    };
    let resp3 = ctx.conn.proto == 3;
    let answer = |found: Option<(usize, f64)>, len: usize| {
        let Some((i, score)) = found else {
            return if with_score && resp3 {
                Reply::NullArray
            } else {
                Reply::Null
            };
        };
        let r = if rev { len - 1 - i } else { i } as i64;
        match with_score {
            false => Reply::Integer(r),
            true => Reply::Array(vec![Reply::Integer(r), score_reply(score)]),
        }
    };
    let key = ctx.key(&a[1]);
    let live = read_live::<ZSetCodec, _>(ctx, &key, |z| {
        let found = z.rank_of(&a[2]);
        answer(found, z.len())
    });
    if let Some(r) = live {
        return reply(r, |r| r);
    }
    let r = read_entries(ctx, &a[1], |e, _| {
        let found = e.iter().position(|(_, m)| *m == &a[2][..]);
        answer(found.map(|i| (i, e[i].0)), e.len())
    });
    reply(r.await, |r| r)
}

pub(crate) async fn zrank(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    rank(ctx, a, false).await
}

pub(crate) async fn zrevrank(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    rank(ctx, a, true).await
}

fn parse_score_bound(b: &[u8]) -> Option<ScoreBound> {
    let (exclusive, rest) = match b.first() {
        Some(b'(') => (true, &b[1..]),
        _ => (false, b),
    };
    let value = parse_score(rest)?;
    Some(ScoreBound { value, exclusive })
}

/// A lex bound of `ZRANGEBYLEX`: `[x` inclusive, `(x` exclusive, `-` and `+` the ends.
#[derive(Clone)]
pub(crate) enum LexBound {
    Min,
    Max,
    Incl(Bytes),
    Excl(Bytes),
}

pub(crate) fn parse_lex_bound(b: &Bytes) -> Option<LexBound> {
    match b.first() {
        Some(b'-') if b.len() == 1 => Some(LexBound::Min),
        Some(b'+') if b.len() == 1 => Some(LexBound::Max),
        Some(b'[') => Some(LexBound::Incl(b.slice(1..))),
        Some(b'(') => Some(LexBound::Excl(b.slice(1..))),
        _ => None,
    }
}

/// What a range selects.
#[derive(Clone)]
enum Range {
    /// Ranks, negative from the end, both ends included.
    Rank(i64, i64),
    Score(ScoreBound, ScoreBound),
    Lex(LexBound, LexBound),
}

impl LexBound {
    /// The bound as the score index's walk reads it.
    fn member_bound(&self) -> MemberBound<'_> {
        match self {
            LexBound::Min => MemberBound::Min,
            LexBound::Max => MemberBound::Max,
            LexBound::Incl(x) => MemberBound::Incl(x),
            LexBound::Excl(x) => MemberBound::Excl(x),
        }
    }
}

fn lex_above(m: &[u8], b: &LexBound) -> bool {
    b.member_bound().admits_above(m)
}

fn lex_below(m: &[u8], b: &LexBound) -> bool {
    b.member_bound().admits_below(m)
}

/// The positions `range` selects in `len` entries (in ascending order), before `REV` and
/// `LIMIT`. For `REV` the bounds come in as the client gave them (max first).
fn select<E: Ordered + ?Sized>(entries: &E, range: &Range, rev: bool) -> std::ops::Range<usize> {
    let len = entries.len() as i64;
    match range {
        Range::Rank(start, stop) => {
            let Some((s, e)) = rank_window(len as usize, *start, *stop) else {
                return 0..0;
            };
            let (s, e) = (s as i64, e as i64);
            if rev {
                (len - 1 - e) as usize..(len - s) as usize
            } else {
                s as usize..(e + 1) as usize
            }
        }
        Range::Score(a, b) => {
            let (min, max) = if rev { (*b, *a) } else { (*a, *b) };
            let lo = entries.partition_point(|(s, _)| !min.admits_above(*s));
            let hi = entries
                .partition_point(|(s, _)| max.admits_below(*s))
                .max(lo);
            lo..hi
        }
        Range::Lex(a, b) => {
            let (min, max) = if rev { (b, a) } else { (a, b) };
            match lex_walk(entries, min, max, false, 0, -1).as_slice() {
                [] => 0..0,
                [first, .., last] => *first..*last + 1,
                [one] => *one..*one + 1,
            }
        }
    }
}

/// Whether a lex range can hold anything: `min` not above `max`, and not equal with an end
/// excluded.
fn lex_range_possible(min: &LexBound, max: &LexBound) -> bool {
    use LexBound::*;
    let key = |b: &LexBound| match b {
        Min => (0, Bytes::new(), false),
        Max => (2, Bytes::new(), false),
        Incl(x) => (1, x.clone(), false),
        Excl(x) => (1, x.clone(), true),
    };
    let (a, b) = (key(min), key(max));
    match (a.0, &a.1).cmp(&(b.0, &b.1)) {
        Ordering::Greater => false,
        Ordering::Equal => !(a.2 || b.2) && a.0 == 1,
        Ordering::Less => true,
    }
}

/// The positions a lex range reads, as Redis walks a small sorted set (whose members need
/// not be in lex order when scores differ): forward from the first member at or above
/// `min`, skipping `offset`, then while members stay at or below `max` (backward from the
/// last member at or below `max`, while they stay at or above `min`, with `rev`); at most
/// `limit` (negative: all).
fn lex_walk<E: Ordered + ?Sized>(
    entries: &E,
    min: &LexBound,
    max: &LexBound,
    rev: bool,
    offset: i64,
    limit: i64,
) -> Vec<usize> {
    let len = entries.len();
    if len == 0
        || offset < 0
        || !lex_range_possible(min, max)
        || !lex_above(entries.at(len - 1).1.as_ref(), min)
        || !lex_below(entries.at(0).1.as_ref(), max)
    {
        return Vec::new();
    }
    let member = |i: usize| entries.at(i).1.as_ref();
    let start = if rev {
        match (0..len).rev().find(|&i| lex_below(member(i), max)) {
            Some(i) if lex_above(member(i), min) => i,
            _ => return Vec::new(),
        }
    } else {
        match (0..len).find(|&i| lex_above(member(i), min)) {
            Some(i) if lex_below(member(i), max) => i,
            _ => return Vec::new(),
        }
    };
    let order: Box<dyn Iterator<Item = usize>> = if rev {
        Box::new((0..=start).rev())
    } else {
        Box::new(start..len)
    };
    let in_range = |i: &usize| {
        let m = member(*i);
        if rev {
            lex_above(m, min)
        } else {
            lex_below(m, max)
        }
    };
    let it = order.skip(offset as usize).take_while(in_range);
    if limit < 0 {
        it.collect()
    } else {
        it.take(limit as usize).collect()
    }
}

/// The entries a range query returns, in reply order, after `REV` and `LIMIT offset count`:
/// only those are copied.
fn ranged<E: Ordered + ?Sized>(
    entries: &E,
    range: &Range,
    rev: bool,
    limit: Option<(i64, i64)>,
) -> Vec<(f64, E::M)> {
    let (offset, count) = limit.unwrap_or((0, -1));
    if let Range::Lex(a, b) = range {
        let (min, max) = if rev { (b, a) } else { (a, b) };
        return lex_walk(entries, min, max, rev, offset, count)
            .into_iter()
            .map(|i| entries.at(i).clone())
            .collect();
    }
    let sel = select(entries, range, rev);
    if offset < 0 || offset as usize >= sel.len() {
        return Vec::new();
    }
    let left = sel.len() - offset as usize;
    let n = if count < 0 {
        left
    } else {
        left.min(count as usize)
    };
    let at: Box<dyn Iterator<Item = usize>> = match rev {
        true => Box::new((sel.end - offset as usize - n..sel.end - offset as usize).rev()),
        false => Box::new(sel.start + offset as usize..sel.start + offset as usize + n),
    };
    at.map(|i| entries.at(i).clone()).collect()
}

/// The options after a range's bounds: `WITHSCORES`, `LIMIT offset count`, and (for
/// `ZRANGE`) `BYSCORE`, `BYLEX`, `REV`.
struct RangeOptions {
    with_scores: bool,
    limit: Option<(i64, i64)>,
    by: Option<&'static str>,
    rev: bool,
}

fn parse_range_options(args: &[Bytes], zrange: bool) -> Result<RangeOptions, Reply> {
    let mut o = RangeOptions {
        with_scores: false,
        limit: None,
        by: None,
        rev: false,
    };
    let mut i = 0;
    while i < args.len() {
        match lower(&args[i]).as_str() {
            "withscores" => o.with_scores = true,
            "limit" if i + 2 < args.len() => {
                let (Some(off), Some(n)) = (parse_int(&args[i + 1]), parse_int(&args[i + 2]))
                else {
                    return Err(not_integer());
                };
                o.limit = Some((off, n));
                i += 2;
            }
            "byscore" if zrange && o.by.is_none() => o.by = Some("score"),
            "bylex" if zrange && o.by.is_none() => o.by = Some("lex"),
            "rev" if zrange => o.rev = true,
            _ => return Err(syntax_error()),
        }
        i += 1;
    }
    Ok(o)
}

fn parse_range(by: Option<&str>, min: &Bytes, max: &Bytes) -> Result<Range, Reply> {
    match by {
        None => match (parse_int(min), parse_int(max)) {
            (Some(a), Some(b)) => Ok(Range::Rank(a, b)),
            _ => Err(not_integer()),
        },
        Some("score") => match (parse_score_bound(min), parse_score_bound(max)) {
            (Some(a), Some(b)) => Ok(Range::Score(a, b)),
            _ => Err(Reply::err("ERR min or max is not a float")),
        },
        _ => match (parse_lex_bound(min), parse_lex_bound(max)) {
            (Some(a), Some(b)) => Ok(Range::Lex(a, b)),
            _ => Err(Reply::err("ERR min or max not valid string range item")),
        },
    }
}

/// Every range read: `ZRANGE` (with `by` and `rev` from its options) and the older forms
/// (`by`, `rev` fixed by the command).
async fn range_command(
    ctx: &mut Ctx<'_>,
    a: &[Bytes],
    by: Option<&'static str>,
    rev: bool,
    zrange: bool,
) -> Reply {
    let mut o = match parse_range_options(&a[4..], zrange) {
        Ok(o) => o,
        Err(r) => return r,
    };
    if !zrange {
        o.by = by;
        o.rev = rev;
    }
    // As Redis: a LIMIT with a count of -1 (all) is allowed, and ignored, on ranks.
    if o.limit.is_some_and(|(_, n)| n != -1) && o.by.is_none() {
        return Reply::err(
            "ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX",
        );
    }
    if o.by.is_none() {
        o.limit = None;
    }
    if o.by == Some("lex") && o.with_scores {
        return Reply::err("ERR syntax error, WITHSCORES not supported in combination with BYLEX");
    }
    let range = match parse_range(o.by, &a[2], &a[3]) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let resp3 = ctx.conn.proto == 3;
    let key = ctx.key(&a[1]);
    let live = read_live::<ZSetCodec, _>(ctx, &key, |z| {
        let picked = ranged(&z.view(), &range, o.rev, o.limit);
        entries_reply(picked.iter(), o.with_scores, resp3)
    });
    if let Some(r) = live {
        return reply(r, |r| r);
    }
    let pick_entries = |e: &[(f64, &[u8])], v: &Source<'_>| {
        let picked: Vec<Entry> = ranged(e, &range, o.rev, o.limit)
            .into_iter()
            .map(|(s, m)| (s, v.cut(m)))
            .collect();
        entries_reply(picked.iter(), o.with_scores, resp3)
    };
    let Some(window) = score_window(&range, o.rev, o.limit) else {
        return reply(read_entries(ctx, &a[1], pick_entries).await, |r| r);
    };
    let picked = |p: Vec<Entry>| entries_reply(p.iter(), o.with_scores, resp3);
    read_window(ctx, &key, &window, pick_entries, picked).await
}

/// A range read of the sorted set at `key` past its live value: of a set stored as parts
/// (and not in memory), `parted` answers from the entries its score index picks for
/// `window`, having walked those alone; of any other, `whole` answers from its entries
/// and the value they are cut from.
async fn read_window(
    ctx: &mut Ctx<'_>,
    key: &strata_engine::Key,
    window: &ScoreWindow<'_>,
    whole: impl FnOnce(&[(f64, &[u8])], &Source<'_>) -> Reply + Send,
    parted: impl FnOnce(Vec<Entry>) -> Reply,
) -> Reply {
    let whole = |v: Option<&Source<'_>>| match v {
        Some(v) => {
            let e = decode_zset(v.bytes()).map_err(|e| corrupt(Kind::ZSet, e))?;
            Ok(whole(&e, v))
        }
        // Absent: what an empty set answers.
        None => Ok(whole(&[], &Source::lent(&[]))),
    };
    read_asked(
        ctx,
        key,
        Kind::ZSet,
        Asked::Window(window),
        whole,
        |a| match a {
            Answer::Entries(_, picked) => parted(picked),
            _ => wrong_type(),
        },
    )
    .await
}

/// The window of a range (with its `LIMIT`) a score index answers (a lex range's, when
/// every entry has one score); `None` for a negative offset (which picks nothing).
fn score_window(range: &Range, rev: bool, limit: Option<(i64, i64)>) -> Option<ScoreWindow<'_>> {
    let (offset, count) = limit.unwrap_or((0, -1));
    let (offset, count) = (usize::try_from(offset).ok()?, usize::try_from(count).ok());
    let pick = match range {
        Range::Rank(start, stop) => Pick::Ranks {
            start: *start,
            stop: *stop,
        },
        // As `select` reads them: the first bound is the maximum in reverse.
        Range::Score(min, max) => Pick::Scores {
            min: if rev { *max } else { *min },
            max: if rev { *min } else { *max },
            offset,
            count,
        },
        Range::Lex(min, max) => Pick::Members {
            min: if rev { max } else { min }.member_bound(),
            max: if rev { min } else { max }.member_bound(),
            offset,
            count,
        },
    };
    Some(ScoreWindow { pick, rev })
}

/// The entries of the sorted set at the client key `key` as slices of its value (no
/// `Bytes` per member), for the reads that answer with a few of them or a count: `f` sees
/// them (none if the key is absent) and the value they are cut from, to `cut` what the
/// reply returns.
/// [`read_entries`] of a read that needs the members `names` alone (`ZSCORE`, `ZMSCORE`):
/// of a set stored as parts and not held decoded, `f` sees those entries alone.
async fn read_named_entries<R>(
    ctx: &mut Ctx<'_>,
    key: &strata_engine::Key,
    names: &[Bytes],
    f: impl FnOnce(&[(f64, &[u8])]) -> R + Send,
) -> Result<R, Reply> {
    read_named_with(ctx, key, Kind::ZSet, Some(names), |v| match v {
        Some(v) => {
            let e = decode_zset(v.bytes()).map_err(|e| corrupt(Kind::ZSet, e))?;
            Ok(f(&e))
        }
        None => Ok(f(&[])),
    })
    .await
}

async fn read_entries<R>(
    ctx: &mut Ctx<'_>,
    key: &[u8],
    f: impl FnOnce(&[(f64, &[u8])], &Source<'_>) -> R + Send,
) -> Result<R, Reply> {
    let key = ctx.key(key);
    read_kind_with(ctx, &key, Kind::ZSet, |v| match v {
        Some(v) => {
            let e = decode_zset(v.bytes()).map_err(|e| corrupt(Kind::ZSet, e))?;
            Ok(f(&e, v))
        }
        None => Ok(f(&[], &Source::lent(&[]))),
    })
    .await
}

pub(crate) async fn zrange(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    range_command(ctx, a, None, false, true).await
}

pub(crate) async fn zrevrange(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    range_command(ctx, a, None, true, false).await
}

pub(crate) async fn zrangebyscore(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    range_command(ctx, a, Some("score"), false, false).await
}

pub(crate) async fn zrevrangebyscore(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    range_command(ctx, a, Some("score"), true, false).await
}

pub(crate) async fn zrangebylex(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    range_command(ctx, a, Some("lex"), false, false).await
}

pub(crate) async fn zrevrangebylex(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    range_command(ctx, a, Some("lex"), true, false).await
}

async fn count_in(ctx: &mut Ctx<'_>, a: &[Bytes], by: &'static str) -> Reply {
    let range = match parse_range(Some(by), &a[2], &a[3]) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let key = ctx.key(&a[1]);
    let live = read_live::<ZSetCodec, _>(ctx, &key, |z| select(&z.view(), &range, false).len());
    if let Some(r) = live {
        return reply(r, |n| Reply::Integer(n as i64));
    }
    let count =
        |e: &[(f64, &[u8])], _: &Source<'_>| Reply::Integer(select(e, &range, false).len() as i64);
    // A score range of a set stored as parts counts what its score index holds in it.
    match score_window(&range, false, None) {
        Some(window) => {
            let counted = |p: Vec<Entry>| Reply::Integer(p.len() as i64);
            read_window(ctx, &key, &window, count, counted).await
        }
        None => reply(read_entries(ctx, &a[1], count).await, |r| r),
    }
}

pub(crate) async fn zcount(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    count_in(ctx, a, "score").await
}

pub(crate) async fn zlexcount(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    count_in(ctx, a, "lex").await
}

async fn remove_range(ctx: &mut Ctx<'_>, a: &[Bytes], by: Option<&'static str>) -> Reply {
    let range = match parse_range(by, &a[2], &a[3]) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let key = ctx.key(&a[1]);
    let r = write_items::<ZSetCodec, _>(ctx, &key, move |entries| {
        let sel = select(&entries.view(), &range, false);
        let n = sel.len();
        entries.take_range(sel);
        Ok((n > 0, n as i64))
    });
    reply(r.await, Reply::Integer)
}

pub(crate) async fn zremrangebyscore(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    remove_range(ctx, a, Some("score")).await
}

pub(crate) async fn zremrangebyrank(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    remove_range(ctx, a, None).await
}

pub(crate) async fn zremrangebylex(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    remove_range(ctx, a, Some("lex")).await
}

/// The `n` lowest entries, or with `max` the `n` highest, highest first, taken off.
fn pop_entries(entries: &mut Scored, n: usize, max: bool) -> Vec<Entry> {
    let len = entries.len();
    match max {
        true => entries.take_range(len - n..len).into_iter().rev().collect(),
        false => entries.take_range(0..n),
    }
}

async fn pop(ctx: &mut Ctx<'_>, a: &[Bytes], max: bool) -> Reply {
    let count = match pop_count(a) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let resp3 = ctx.conn.proto == 3;
    let key = ctx.key(&a[1]);
    let r = write_items::<ZSetCodec, _>(ctx, &key, move |entries| {
        let n = count.unwrap_or(1).min(entries.len());
        Ok((n > 0, pop_entries(entries, n, max)))
    });
    reply(r.await, |popped| match (count, resp3) {
        // RESP3 answers one popped entry as a pair, several as pairs.
        (None, true) => popped.first().map_or(Reply::Array(Vec::new()), |(s, m)| {
            Reply::Array(vec![Reply::Bulk(m.clone()), score_reply(*s)])
        }),
        _ => entries_reply(popped.iter(), true, resp3),
    })
}

pub(crate) async fn zpopmin(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    pop(ctx, a, false).await
}

pub(crate) async fn zpopmax(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    pop(ctx, a, true).await
}

/// Up to `count` entries off one end of the first of `keys` whose sorted set has any, with
/// the key.
async fn zpop_first(
    ctx: &mut Ctx<'_>,
    keys: &[Bytes],
    max: bool,
    count: usize,
) -> Result<Option<(Bytes, Vec<Entry>)>, Reply> {
    for k in keys {
        let key = ctx.key(k);
        let popped = write_items::<ZSetCodec, _>(ctx, &key, move |entries| {
            let n = count.min(entries.len());
            Ok((n > 0, pop_entries(entries, n, max)))
        })
        .await?;
        if !popped.is_empty() {
            return Ok(Some((k.clone(), popped)));
        }
    }
    Ok(None)
}

/// `[key, [[member, score], ...]]`, as `ZMPOP` answers.
fn mpop_reply(key: Bytes, popped: Vec<Entry>) -> Reply {
    let items = popped
        .into_iter()
        .map(|(s, m)| Reply::Array(vec![Reply::Bulk(m), score_reply(s)]))
        .collect();
    Reply::Array(vec![Reply::Bulk(key), Reply::Array(items)])
}

/// `ZMPOP numkeys key [key ...] MIN|MAX [COUNT count]`.
pub(crate) async fn zmpop(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let (keys, min, count) = match mpop_args(a, 1, ["min", "max"]) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let r = zpop_first(ctx, &keys, !min, count).await;
    reply(r, |got| {
        got.map_or(Reply::NullArray, |(k, p)| mpop_reply(k, p))
    })
}

/// `BZMPOP timeout numkeys key [key ...] MIN|MAX [COUNT count]`.
pub(crate) async fn bzmpop(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let (timeout, keys, min, count) = match blocking_mpop_args(a, ["min", "max"]) {
        Ok(x) => x,
        Err(r) => return r,
    };
    block_on(ctx, &keys, &[], timeout, false, Reply::NullArray, |ctx| {
        let keys = keys.clone();
        Box::pin(async move {
            let got = zpop_first(ctx, &keys, !min, count).await?;
            Ok(got.map(|(k, p)| mpop_reply(k, p)))
        })
    })
    .await
}

/// `BZPOPMIN`/`BZPOPMAX key [key ...] timeout`: `[key, member, score]`.
async fn bzpop(ctx: &mut Ctx<'_>, a: &[Bytes], max: bool) -> Reply {
    let (keys, timeout) = match keys_then_timeout(a) {
        Ok(x) => x,
        Err(r) => return r,
    };
    block_on(ctx, &keys, &[], timeout, false, Reply::NullArray, |ctx| {
        let keys = keys.clone();
        Box::pin(async move {
            let got = zpop_first(ctx, &keys, max, 1).await?;
            Ok(got.map(|(k, mut p)| {
                let (s, m) = p.remove(0);
                Reply::Array(vec![Reply::Bulk(k), Reply::Bulk(m), score_reply(s)])
            }))
        })
    })
    .await
}

pub(crate) async fn bzpopmin(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    bzpop(ctx, a, false).await
}

pub(crate) async fn bzpopmax(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    bzpop(ctx, a, true).await
}

/// `ZSCAN key cursor [MATCH pattern] [COUNT n]`: a page of members (in score order) whose
/// hashes lie in the page's range ([`ScanOptions::hash_range`]): a walk meets every member
/// held throughout once, whatever scores change meanwhile. From the live set when there is
/// one (a scan reads its key again and again, which makes it live).
pub(crate) async fn zscan(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let o = match scan_options(a, false) {
        Ok(o) => o,
        Err(r) => return r,
    };
    let key = ctx.key(&a[1]);
    let live = read_live::<ZSetCodec, _>(ctx, &key, |z| {
        zscan_page(&o, z.len(), z.runs.iter().flatten())
    });
    if let Some(r) = live {
        return reply(r, |r| r);
    }
    let r = read_items::<ZSetCodec>(ctx, &a[1]).await;
    reply(r, |e| zscan_page(&o, e.len(), e.iter()))
}

/// A `ZSCAN` reply from the `len` entries of a set, in score order.
fn zscan_page<'e>(o: &ScanOptions, len: usize, entries: impl Iterator<Item = &'e Entry>) -> Reply {
    let (range, next) = o.hash_range(len);
    let mut out = Vec::new();
    for (s, m) in entries.filter(|(_, m)| range.contains(&member_hash(m)) && o.matches(m)) {
        out.push(bulk(m));
        out.push(Reply::Bulk(Bytes::from(strata_resp::format_double(*s))));
    }
    scan_reply(next, out)
}

pub(crate) async fn zrandmember(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let (count, with_scores) = match random_args(a, Some("withscores")) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let resp3 = ctx.conn.proto == 3;
    let pick = |e: &dyn Fn(usize) -> Entry, len: usize| match count {
        None if len == 0 => Reply::Null,
        None => Reply::Bulk(e(random_positions(len, -1)[0]).1),
        Some(n) => {
            let picked: Vec<Entry> = random_positions(len, n).into_iter().map(e).collect();
            entries_reply(picked.iter(), with_scores, resp3)
        }
    };
    let key = ctx.key(&a[1]);
    let live = read_live::<ZSetCodec, _>(ctx, &key, |z| {
        let v = z.view();
        pick(&|i| v.at(i).clone(), v.len())
    });
    if let Some(r) = live {
        return reply(r, |r| r);
    }
    let r = read_items::<ZSetCodec>(ctx, &a[1]).await;
    reply(r, |e| pick(&|i| e[i].clone(), e.len()))
}

/// How `ZUNIONSTORE` and `ZINTERSTORE` combine the scores of one member.
#[derive(Clone, Copy)]
enum Aggregate {
    Sum,
    Min,
    Max,
}

fn aggregate(agg: Aggregate, a: f64, b: f64) -> f64 {
    match agg {
        // inf + -inf is NaN, which Redis stores as 0.
        Aggregate::Sum => {
            let s = a + b;
            if s.is_nan() {
                0.0
            } else {
                s
            }
        }
        Aggregate::Min => a.min(b),
        Aggregate::Max => a.max(b),
    }
}

/// The entries of the sorted set, or the members of the set (score 1), at `key`.
async fn read_scored(ctx: &mut Ctx<'_>, key: &[u8]) -> Result<Vec<Entry>, Reply> {
    let k = ctx.key(key);
    ctx.shared.engine.note_access(ctx.conn.id, &k);
    match ctx.shared.engine.get_value(&k).await {
        Ok(None) => Ok(Vec::new()),
        Ok(Some((Kind::ZSet, v))) => {
            ZSetCodec::decode(&v, 0).map_err(|e| engine_error(&corrupt(Kind::ZSet, e)))
        }
        Ok(Some((Kind::Set, v))) => Ok(decode_members(&v)
            .map_err(|e| engine_error(&corrupt(Kind::Set, e)))?
            .into_iter()
            .map(|m| (1.0, v.slice_ref(m)))
            .collect()),
        Ok(Some(_)) => Err(wrong_type()),
        Err(e) => Err(engine_error(&e)),
    }
}

/// How several sorted sets combine.
#[derive(Clone, Copy, PartialEq)]
enum SetOp {
    Union,
    Inter,
    Diff,
}

/// What a combination does with its result.
#[derive(Clone, Copy, PartialEq)]
enum Output {
    /// Replies with it (`ZUNION`, `ZINTER`, `ZDIFF`; `WITHSCORES` allowed).
    Reply,
    /// Stores it at argument 1 and replies with its size (the `STORE` forms).
    Store,
    /// Replies with its size only (`ZINTERCARD`, `LIMIT` allowed).
    Count,
}

/// `ZUNION`/`ZINTER`/`ZDIFF` and their `STORE` forms, and `ZINTERCARD`, as Redis's
/// `zunionInterDiffGenericCommand`: `numkeys` at argument `at`, the keys after it (read
/// and their kinds checked first; a set counts with score 1), then the options.
async fn combine(ctx: &mut Ctx<'_>, a: &[Bytes], at: usize, op: SetOp, output: Output) -> Reply {
    let name = lower(&a[0]);
    let n = match parse_int(&a[at]) {
        Some(n) if n > 0 => n as usize,
        Some(_) => {
            return Reply::err(format!(
                "ERR at least 1 input key is needed for '{name}' command"
            ))
        }
        None => return not_integer(),
    };
    if n > a.len() - at - 1 {
        return syntax_error();
    }
    let mut inputs = Vec::with_capacity(n);
    for k in &a[at + 1..at + 1 + n] {
        match read_scored(ctx, k).await {
            Ok(e) => inputs.push(e),
            Err(r) => return r,
        }
    }
    let mut weights = vec![1.0; n];
    let (mut agg, mut with_scores, mut limit) = (Aggregate::Sum, false, 0usize);
    let mut i = at + 1 + n;
    let plain = op != SetOp::Diff && output != Output::Count;
    while i < a.len() {
        let left = a.len() - i;
        match lower(&a[i]).as_str() {
            "weights" if plain && left > n => {
                for (j, w) in weights.iter_mut().enumerate() {
                    match parse_score(&a[i + 1 + j]) {
                        Some(v) => *w = v,
                        None => return Reply::err("ERR weight value is not a float"),
                    }
                }
                i += n + 1;
            }
            "aggregate" if plain && left >= 2 => {
                agg = match lower(&a[i + 1]).as_str() {
                    "sum" => Aggregate::Sum,
                    "min" => Aggregate::Min,
                    "max" => Aggregate::Max,
                    _ => return syntax_error(),
                };
                i += 2;
            }
            "withscores" if output == Output::Reply => {
                with_scores = true;
                i += 1;
            }
            "limit" if output == Output::Count && left >= 2 => {
                limit = match parse_int(&a[i + 1]) {
                    Some(l) if l >= 0 => l as usize,
                    _ => return Reply::err("ERR LIMIT can't be negative"),
                };
                i += 2;
            }
            _ => return syntax_error(),
        }
    }
    let weigh = |s: f64, w: f64| {
        let v = s * w;
        if v.is_nan() {
            0.0
        } else {
            v
        }
    };
    let mut out: Vec<Entry> = if op == SetOp::Diff {
        let others: std::collections::HashSet<&Bytes> =
            inputs[1..].iter().flatten().map(|(_, m)| m).collect();
        inputs[0]
            .iter()
            .filter(|(_, m)| !others.contains(m))
            .cloned()
            .collect()
    } else {
        let mut acc: HashMap<Bytes, (f64, usize)> = HashMap::new();
        for (input, &w) in inputs.iter().zip(&weights) {
            for (s, m) in input {
                let v = weigh(*s, w);
                acc.entry(m.clone())
                    .and_modify(|(cur, seen)| {
                        *cur = aggregate(agg, *cur, v);
                        *seen += 1;
                    })
                    .or_insert((v, 1));
            }
        }
        acc.into_iter()
            .filter(|(_, (_, seen))| op == SetOp::Union || *seen == n)
            .map(|(m, (s, _))| (s, m))
            .collect()
    };
    out.sort_by(order);
    match output {
        Output::Store => store_items::<ZSetCodec>(ctx, &a[1], &out).await,
        Output::Count => {
            let len = if limit == 0 {
                out.len()
            } else {
                out.len().min(limit)
            };
            Reply::Integer(len as i64)
        }
        Output::Reply => entries_reply(out.iter(), with_scores, ctx.conn.proto == 3),
    }
}

pub(crate) async fn zunionstore(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    combine(ctx, a, 2, SetOp::Union, Output::Store).await
}

pub(crate) async fn zinterstore(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    combine(ctx, a, 2, SetOp::Inter, Output::Store).await
}

pub(crate) async fn zdiffstore(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    combine(ctx, a, 2, SetOp::Diff, Output::Store).await
}

pub(crate) async fn zunion(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    combine(ctx, a, 1, SetOp::Union, Output::Reply).await
}

pub(crate) async fn zinter(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    combine(ctx, a, 1, SetOp::Inter, Output::Reply).await
}

pub(crate) async fn zdiff(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    combine(ctx, a, 1, SetOp::Diff, Output::Reply).await
}

pub(crate) async fn zintercard(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    combine(ctx, a, 1, SetOp::Inter, Output::Count).await
}

/// `ZRANGESTORE dst src min max [BYSCORE|BYLEX] [REV] [LIMIT offset count]`.
pub(crate) async fn zrangestore(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let o = match parse_range_options(&a[5..], true) {
        Ok(o) if !o.with_scores => o,
        Ok(_) => return syntax_error(),
        Err(r) => return r,
    };
    if o.limit.is_some_and(|(_, n)| n != -1) && o.by.is_none() {
        return Reply::err(
            "ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX",
        );
    }
    let range = match parse_range(o.by, &a[3], &a[4]) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let src = match read_items::<ZSetCodec>(ctx, &a[2]).await {
        Ok(e) => e,
        Err(r) => return r,
    };
    let limit = if o.by.is_none() { None } else { o.limit };
    let mut picked = ranged(&src[..], &range, o.rev, limit);
    picked.sort_by(order);
    store_items::<ZSetCodec>(ctx, &a[1], &picked).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::items::next_random;

    fn e(items: &[(f64, &str)]) -> Vec<Entry> {
        items
            .iter()
            .map(|(s, m)| (*s, Bytes::from(m.to_string())))
            .collect()
    }

    fn names(v: &[Entry]) -> Vec<&str> {
        v.iter()
            .map(|(_, m)| std::str::from_utf8(m).unwrap())
            .collect()
    }

    #[test]
    fn ranges_select_as_redis_does() {
        let z = e(&[(1.0, "a"), (2.0, "b"), (2.0, "c"), (3.0, "d")]);
        let incl = |v| ScoreBound {
            value: v,
            exclusive: false,
        };
        let excl = |v| ScoreBound {
            value: v,
            exclusive: true,
        };
        assert_eq!(
            names(&ranged(&z[..], &Range::Rank(0, -1), false, None)),
            ["a", "b", "c", "d"]
        );
        assert_eq!(
            names(&ranged(&z[..], &Range::Rank(-2, 10), false, None)),
            ["c", "d"]
        );
        assert_eq!(
            names(&ranged(&z[..], &Range::Rank(0, 1), true, None)),
            ["d", "c"]
        );
        assert!(ranged(&z[..], &Range::Rank(3, 1), false, None).is_empty());
        assert_eq!(
            names(&ranged(
                &z[..],
                &Range::Score(excl(1.0), incl(2.0)),
                false,
                None
            )),
            ["b", "c"]
        );
        // REV takes max first.
        assert_eq!(
            names(&ranged(
                &z[..],
                &Range::Score(incl(3.0), excl(1.0)),
                true,
                Some((1, 1))
            )),
            ["c"]
        );
        let lex = Range::Lex(LexBound::Incl(Bytes::from("b")), LexBound::Max);
        assert_eq!(
            names(&ranged(&z[..], &lex, false, Some((0, -1)))),
            ["b", "c", "d"]
        );
        let mut z2 = Scored::from_vec(z.clone());
        let cur = z2.score_of(b"d");
        z2.place(cur, 0.5, Bytes::from("d"));
        assert_eq!(names(z2.entries()), ["d", "a", "b", "c"]);
    }

    #[test]
    fn scores_found_by_table_place_members_as_comparing_does() {
        let member = |i: u64| Bytes::from(format!("m{}", i % 97));
        let mut by_table = Scored::from_vec(Vec::new());
        let mut by_comparing = Scored::from_vec(Vec::new());
        let mut model = HashMap::new();
        let mut x = 7u64;
        for _ in 0..2000 {
            x = next_random(x);
            let (m, score) = (member(x >> 33), ((x >> 40) % 13) as f64);
            let cur = by_table.score_of(&m);
            by_table.place(cur, score, m.clone());
            by_comparing.lookups = 0;
            let cur2 = by_comparing.score_of(&m);
            assert_eq!(cur, cur2);
            by_comparing.place(cur2, score, m.clone());
            assert!(by_comparing.scores.is_none());
            assert_eq!(model.insert(m, score), cur);
        }
        assert!(by_table.scores.is_some(), "97 members: the table was built");
        assert_eq!(by_table.entries(), by_comparing.entries());
        let mut sorted: Vec<Entry> = model.into_iter().map(|(m, s)| (s, m)).collect();
        sorted.sort_by(order);
        assert_eq!(
            by_table.entries(),
            sorted,
            "each member once, at its last score"
        );
        let e = by_table.entries();
        assert!(e.windows(2).all(|w| order(&w[0], &w[1]) == Ordering::Less));
    }

    /// Also: the changes noted between two points, applied to the value stored at the
    /// first, give the value at the second (what a replay of the hot log's deltas does).
    /// Reads of a set kept in runs (ranges by rank, score and lex, with `REV` and `LIMIT`,
    /// ranks, counts) answer as the same reads of `want`, the entries in one slice.
    fn runs_read_as_one_slice(z: &mut Scored, want: &[Entry], seed: u64) {
        let view = z.view();
        assert_eq!(view.len(), want.len());
        let bound = |v: f64, exclusive| ScoreBound {
            value: v,
            exclusive,
        };
        let lex = |m: &Bytes| LexBound::Incl(m.clone());
        let mut x = seed;
        for _ in 0..40 {
            x = next_random(x);
            let (a, b) = ((x >> 20) % 60, (x >> 30) % 60);
            let (i, j) = (
                (x >> 40) as usize % want.len(),
                (x >> 10) as usize % want.len(),
            );
            let limit = match x % 3 {
                0 => None,
                1 => Some(((x >> 7) as i64 % 40, (x >> 13) as i64 % 30 - 1)),
                _ => Some((i as i64, 5)),
            };
            for range in [
                Range::Rank(a as i64 - 30, b as i64 * 30 - 300),
                Range::Score(
                    bound(a as f64, x.is_multiple_of(2)),
                    bound(b as f64, x.is_multiple_of(5)),
                ),
                Range::Lex(lex(&want[i.min(j)].1), lex(&want[i.max(j)].1)),
            ] {
                for rev in [false, true] {
                    assert_eq!(
                        ranged(&view, &range, rev, limit),
                        ranged(want, &range, rev, limit)
                    );
                    assert_eq!(select(&view, &range, rev), select(want, &range, rev));
                }
            }
        }
        for (i, e) in want.iter().enumerate().step_by(37) {
            assert_eq!(z.rank_of(&e.1), Some((i, e.0)));
        }
        assert_eq!(z.rank_of(b"absent"), None);
    }

    #[test]
    fn run_counts_sum_and_find_as_a_pass_over_the_runs_does() {
        let mut x = 5u64;
        let mut lens: Vec<usize> = (0..77).map(|i| i % 5 * 3).collect();
        let runs: Vec<Vec<Entry>> = lens.iter().map(|&n| vec![(0.0, Bytes::new()); n]).collect();
        let mut c = RunCounts::new(&runs);
        for _ in 0..2000 {
            x = next_random(x);
            let r = (x >> 20) as usize % lens.len();
            let delta = if lens[r] > 0 && x.is_multiple_of(2) {
                -1
            } else {
                1
            };
            lens[r] = lens[r].wrapping_add_signed(delta);
            c.add(r, delta);
            let total: usize = lens.iter().sum();
            for run in [0, r, lens.len()] {
                assert_eq!(c.before(run), lens[..run].iter().sum::<usize>());
            }
            let pos = (x >> 33) as usize % total;
            let mut want = (0, pos);
            while want.1 >= lens[want.0] {
                want = (want.0 + 1, want.1 - lens[want.0]);
            }
            assert_eq!(c.find(pos), want, "position {pos} of {lens:?}");
        }
    }

    /// [`Scored::lasts`] holds each run's last score, one per run.
    fn lasts_follow_the_runs(z: &Scored) {
        let want: Vec<f64> = z.runs.iter().map(|r| last_score(r)).collect();
        assert_eq!(z.lasts, want);
    }

    #[test]
    fn large_sets_written_in_runs_keep_one_order() {
        let member = |i: u64| Bytes::from(format!("m{}", i % 1500));
        let mut z = Scored::from_vec(Vec::new());
        let mut model: HashMap<Bytes, f64> = HashMap::new();
        let sorted = |model: &HashMap<Bytes, f64>| {
            let mut v: Vec<Entry> = model.iter().map(|(m, s)| (*s, m.clone())).collect();
            v.sort_by(order);
            v
        };
        let (mut x, mut most_runs) = (11u64, 0);
        let mut stored = z.encode_with(encode_zset);
        let mut deltas = 0;
        for step in 0..30_000 {
            x = next_random(x);
            let (m, score) = (member(x >> 33), ((x >> 40) % 50) as f64);
            let cur = z.score_of(&m);
            assert_eq!(cur, model.get(&m).copied());
            z.place(cur, score, m.clone());
            model.insert(m, score);
            most_runs = most_runs.max(z.runs.len());
            assert!(z.runs.iter().all(|r| r.len() <= RUN_MAX) || z.runs.len() == 1);
            assert_eq!(Items::len(&z), model.len());
            assert_eq!(z.count, z.runs.iter().map(Vec::len).sum::<usize>());
            lasts_follow_the_runs(&z);
            if step % 997 == 0 && z.runs.len() > 1 {
                runs_read_as_one_slice(&mut z, &sorted(&model), x);
            }
            match step % 5000 {
                // Joined (as the tests read them); the next writes split them again.
                1234 => assert_eq!(z.entries(), sorted(&model)),
                // Removals keep the table and the order.
                4321 => {
                    let gone: Vec<Bytes> = model
                        .iter()
                        .filter(|(_, s)| **s == 7.0)
                        .map(|(m, _)| m.clone())
                        .collect();
                    assert_eq!(z.remove_members(&gone), gone.len());
                    model.retain(|_, s| *s != 7.0);
                    z.take_range(0..1);
                    lasts_follow_the_runs(&z);
                    let first = sorted(&model)[0].1.clone();
                    model.remove(&first);
                }
                _ => {}
            }
            if step % 13 == 0 || step % 5000 == 4321 {
                let whole = z.encode_with(encode_zset);
                stored = match z.delta(encode_zset) {
                    Some(d) => {
                        deltas += 1;
                        strata_format::delta::apply(Kind::ZSet, &stored, &[&d]).unwrap()
                    }
                    None => whole.clone(),
                };
                assert_eq!(stored, whole, "step {step}");
            }
        }
        assert!(deltas > 2000, "{deltas} deltas");
        assert!(most_runs > 4, "1,500 members were written in runs");
        assert!(z.runs.len() > 1);
        runs_read_as_one_slice(&mut z, &sorted(&model), x);
        // Taking ranges and members out of the runs, against the model.
        let mut want = sorted(&model);
        for (at, len) in [(0, 3), (700, 300), (usize::MAX, 5), (0, 1)] {
            let at = at.min(want.len() - len); // MAX: the last ones
            assert_eq!(
                z.take_range(at..at + len),
                want.drain(at..at + len).collect::<Vec<_>>()
            );
            assert_eq!(z.view().len(), want.len());
            lasts_follow_the_runs(&z);
        }
        let gone: Vec<Bytes> = [10, 500, 10, 900]
            .iter()
            .map(|&i| want[i].1.clone())
            .collect();
        assert_eq!(z.remove_members(&gone), 3, "a member named twice goes once");
        want.retain(|(_, m)| !gone.contains(m));
        lasts_follow_the_runs(&z);
        assert_eq!(Items::len(&z), want.len());
        assert!(z.runs.len() > 1);
        runs_read_as_one_slice(&mut z, &want, x);
        assert!(z.runs.len() > 1);
        assert_eq!(z.encode_with(encode_zset), encode_zset(&want));
        assert_eq!(z.entries(), want);
        assert_eq!(z.runs.len(), 1, "read as one slice");
    }

    #[test]
    fn scores_parse_as_strtod_reads_them() {
        assert_eq!(parse_score(b"1.5"), Some(1.5));
        assert_eq!(parse_score(b"-inf"), Some(f64::NEG_INFINITY));
        assert_eq!(parse_score(b"+inf"), Some(f64::INFINITY));
        for bad in [&b"nan"[..], b"", b" 1", b"1e400", b"1e-400", b"x"] {
            assert_eq!(parse_score(bad), None, "{bad:?}");
        }
        assert_eq!(parse_score(b"0e5"), Some(0.0));
        assert_eq!(parse_score(b"-12"), Some(-12.0));
        assert_eq!(parse_score(b"007"), Some(7.0));
        assert_eq!(parse_score(b"123456789012345"), Some(123456789012345.0));
        assert_eq!(parse_score(b"12345678901234567"), Some(12345678901234567.0));
        assert!(
            parse_score(b"-0").unwrap().is_sign_negative(),
            "-0 keeps its sign"
        );
        assert!(parse_score(b"0").unwrap().is_sign_positive());
        assert_eq!(parse_score(b"-"), None);
        assert_eq!(parse_score(b"INF"), Some(f64::INFINITY));
    }
}
