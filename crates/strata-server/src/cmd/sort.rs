//! `SORT` and `SORT_RO` over a list, a set or a sorted set's members: numerically (each
//! element read as a float; ties by bytes, as Redis keeps the result deterministic) or with
//! `ALPHA` by bytes, `ASC`/`DESC`, `LIMIT offset count`, `STORE` into a list. `BY` and
//! `GET` patterns (reads of other keys) are not built: refused with an error that says so.

use bytes::Bytes;
use strata_engine::Kind;
use strata_format::members::decode_members;
use strata_format::zset::decode_zset;
use strata_resp::Reply;

use super::typed::{store_items, MembersCodec};
use super::{engine_error, lower, parse_int, syntax_error, wrong_type, Ctx};

pub(crate) async fn sort(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    sort_command(ctx, a, true).await
}

pub(crate) async fn sort_ro(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    sort_command(ctx, a, false).await
}

async fn sort_command(ctx: &mut Ctx<'_>, a: &[Bytes], may_store: bool) -> Reply {
    let (mut desc, mut alpha, mut limit, mut store) = (false, false, None, None);
    let mut i = 2;
    while i < a.len() {
        let left = a.len() - i - 1;
        match lower(&a[i]).as_str() {
            "asc" => desc = false,
            "desc" => desc = true,
            "alpha" => alpha = true,
            "limit" if left >= 2 => {
                let (Some(o), Some(n)) = (parse_int(&a[i + 1]), parse_int(&a[i + 2])) else {
                    return super::not_integer();
                };
                limit = Some((o, n));
                i += 2;
            }
            "store" if may_store && left >= 1 => {
                store = Some(a[i + 1].clone());
                i += 1;
            }
            "by" | "get" if left >= 1 => {
                return Reply::err(
                    "ERR SORT with BY or GET patterns is not supported by Strata yet",
                )
            }
            _ => return syntax_error(),
        }
        i += 1;
    }
    let key = ctx.key(&a[1]);
    ctx.shared.engine.note_access(ctx.conn.id, &key);
    let elements: Vec<Bytes> = match ctx.shared.engine.get_value(&key).await {
        Ok(None) => Vec::new(),
        Ok(Some((Kind::List | Kind::Set, v))) => match decode_members(&v) {
            Ok(m) => m.into_iter().map(|m| v.slice_ref(m)).collect(),
            Err(e) => return engine_error(&super::typed::corrupt(Kind::List, e)),
        },
        Ok(Some((Kind::ZSet, v))) => match decode_zset(&v) {
            Ok(e) => e.into_iter().map(|(_, m)| v.slice_ref(m)).collect(),
            Err(e) => return engine_error(&super::typed::corrupt(Kind::ZSet, e)),
        },
        Ok(Some(_)) => return wrong_type(),
        Err(e) => return engine_error(&e),
    };
    let mut sorted = if alpha {
        let mut v = elements;
        v.sort();
        v
    } else {
        let mut scored = Vec::with_capacity(elements.len());
        for e in elements {
            // As strtod reads it: leading spaces skipped, and nothing at all is 0.
            let text = std::str::from_utf8(&e).ok().map(str::trim_start);
            let score = match text {
                Some("") => Some(0.0),
                t => t.and_then(|t| t.parse::<f64>().ok()),
            };
            match score {
                Some(x) if !x.is_nan() => scored.push((x, e)),
                _ => return Reply::err("ERR One or more scores can't be converted into double"),
            }
        }
        scored.sort_by(|x, y| {
            x.0.partial_cmp(&y.0)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then_with(|| x.1.cmp(&y.1))
        });
        scored.into_iter().map(|(_, e)| e).collect()
    };
    if desc {
        sorted.reverse();
    }
    if let Some((offset, count)) = limit {
        let start = (offset.max(0) as usize).min(sorted.len());
        let end = if count < 0 {
            sorted.len()
        } else {
            start.saturating_add(count as usize).min(sorted.len())
        };
        sorted = sorted[start..end].to_vec();
    }
    match store {
        Some(dst) => store_items::<MembersCodec<true>>(ctx, &dst, &sorted).await,
        None => Reply::Array(sorted.into_iter().map(Reply::Bulk).collect()),
    }
}
