//! `LCS key1 key2 [LEN] [IDX] [MINMATCHLEN len] [WITHMATCHLEN]`: the longest common
//! subsequence of two strings, its length, or the ranges it matches in each, as Redis
//! answers them (ranges from the end of the strings back).

use bytes::Bytes;
use strata_resp::Reply;

use super::ctx::{engine_error, lower, not_integer, parse_int, syntax_error, Ctx};

/// One run of the subsequence: where it is in each string (inclusive), from the table.
#[derive(Debug, PartialEq)]
struct Run {
    a: (usize, usize),
    b: (usize, usize),
}

/// The common subsequence of `a` and `b` and its runs, found by walking back through the
/// table of prefix LCS lengths (Redis's walk, so ties resolve as Redis resolves them).
fn lcs(a: &[u8], b: &[u8]) -> (Vec<u8>, Vec<Run>) {
    let w = b.len() + 1;
    let mut t = vec![0u32; (a.len() + 1) * w];
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            t[i * w + j] = if a[i - 1] == b[j - 1] {
                t[(i - 1) * w + j - 1] + 1
            } else {
                t[(i - 1) * w + j].max(t[i * w + j - 1])
            };
        }
    }
    let mut seq = Vec::with_capacity(t[a.len() * w + b.len()] as usize);
    let mut runs = Vec::new();
    let mut open: Option<Run> = None;
    let (mut i, mut j) = (a.len(), b.len());
    while i > 0 && j > 0 {
        if a[i - 1] == b[j - 1] {
            seq.push(a[i - 1]);
            match &mut open {
                // Contiguous with the run under way: it grows backward.
                Some(r) if r.a.0 == i && r.b.0 == j => {
                    r.a.0 -= 1;
                    r.b.0 -= 1;
                }
                Some(_) => runs.extend(open.take()),
                None => {
                    open = Some(Run {
                        a: (i - 1, i - 1),
                        b: (j - 1, j - 1),
                    })
                }
            }
            i -= 1;
            j -= 1;
            if open.as_ref().is_some_and(|r| r.a.0 == 0 || r.b.0 == 0) {
                runs.extend(open.take());
            }
        } else {
            if t[(i - 1) * w + j] > t[i * w + j - 1] {
                i -= 1;
            } else {
                j -= 1;
            }
            runs.extend(open.take());
        }
    }
    seq.reverse();
    (seq, runs)
}

pub(crate) async fn lcs_cmd(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let mut values = Vec::with_capacity(2);
    for k in &a[1..3] {
        let key = ctx.key(k);
        match ctx.shared.engine.get(&key).await {
            Ok(v) => values.push(v.unwrap_or_default()),
            Err(strata_engine::Error::WrongType) => {
                return Reply::err("ERR The specified keys must contain string values")
            }
            Err(e) => return engine_error(&e),
        }
    }
    let (mut len, mut idx, mut withmatchlen, mut minmatchlen) = (false, false, false, 0usize);
    let mut i = 3;
    while i < a.len() {
        match lower(&a[i]).as_str() {
            "idx" => idx = true,
            "len" => len = true,
            "withmatchlen" => withmatchlen = true,
            "minmatchlen" if i + 1 < a.len() => {
                let Some(n) = parse_int(&a[i + 1]) else {
                    return not_integer();
                };
                minmatchlen = n.max(0) as usize;
                i += 1;
            }
            _ => return syntax_error(),
        }
        i += 1;
    }
    if len && idx {
        return Reply::err("ERR If you want both the length and indexes, please just use IDX.");
    }
    let (x, y) = (&values[0], &values[1]);
    // The table is the command's transient memory, bounded as a value is.
    let table = (x.len() as u128 + 1) * (y.len() as u128 + 1) * 4;
    if table > ctx.shared.cfg.read().proto_max_bulk_len as u128 {
        return Reply::err(
            "ERR Insufficient memory, transient memory for LCS exceeds proto-max-bulk-len",
        );
    }
    let (seq, runs) = lcs(x, y);
    if len {
        return Reply::Integer(seq.len() as i64);
    }
    if !idx {
        return Reply::Bulk(Bytes::from(seq));
    }
    let pair = |(s, e): (usize, usize)| {
        Reply::Array(vec![Reply::Integer(s as i64), Reply::Integer(e as i64)])
    };
    let matches = runs
        .into_iter()
        .filter(|r| r.a.1 - r.a.0 + 1 >= minmatchlen)
        .map(|r| {
            let n = r.a.1 - r.a.0 + 1;
            let mut m = vec![pair(r.a), pair(r.b)];
            if withmatchlen {
                m.push(Reply::Integer(n as i64));
            }
            Reply::Array(m)
        })
        .collect();
    Reply::Map(vec![
        (Reply::bulk("matches"), Reply::Array(matches)),
        (Reply::bulk("len"), Reply::Integer(seq.len() as i64)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_subsequence_and_its_runs_match_redis_documentation() {
        let (seq, runs) = lcs(b"ohmytext", b"mynewtext");
        assert_eq!(seq, b"mytext");
        assert_eq!(
            runs,
            vec![
                Run {
                    a: (4, 7),
                    b: (5, 8)
                },
                Run {
                    a: (2, 3),
                    b: (0, 1)
                }
            ]
        );
        assert_eq!(lcs(b"", b"abc").0, b"");
        assert_eq!(lcs(b"abc", b"xyz").1, vec![]);
    }
}
