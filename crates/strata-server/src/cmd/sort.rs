//! `SORT` and `SORT_RO` over a list, a set or a sorted set's members: numerically (each
//! element read as a float; ties by bytes, as Redis keeps the result deterministic) or with
//! `ALPHA` by bytes, `ASC`/`DESC`, `LIMIT offset count`, `STORE` into a list; `BY pattern`
//! sorts by other keys' values (`weight_*`, or a hash field: `h_*->field`), and `GET
//! pattern` (repeatable, `#` the element itself) answers other keys' values instead. A `BY`
//! without `*` names no key: a list or sorted set keeps its own order, a set's members are
//! ordered by their bytes (the order Redis gives scripts and `STORE`).

use bytes::Bytes;
use strata_engine::Kind;
use strata_format::members::decode_members;
use strata_format::zset::decode_zset;
use strata_resp::Reply;

use super::ctx::{engine_error, lower, parse_int, syntax_error, wrong_type, Ctx};
use super::typed::{store_items, ListCodec};

pub(crate) async fn sort(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    sort_command(ctx, a, true).await
}

pub(crate) async fn sort_ro(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    sort_command(ctx, a, false).await
}

async fn sort_command(ctx: &mut Ctx<'_>, a: &[Bytes], may_store: bool) -> Reply {
    let (mut desc, mut alpha, mut limit, mut store) = (false, false, None, None);
    let (mut by, mut gets): (Option<Bytes>, Vec<Bytes>) = (None, Vec::new());
    let mut i = 2;
    while i < a.len() {
        let left = a.len() - i - 1;
        match lower(&a[i]).as_str() {
            "asc" => desc = false,
            "desc" => desc = true,
            "alpha" => alpha = true,
            "limit" if left >= 2 => {
                let (Some(o), Some(n)) = (parse_int(&a[i + 1]), parse_int(&a[i + 2])) else {
                    return super::ctx::not_integer();
                };
                limit = Some((o, n));
                i += 2;
            }
            "store" if may_store && left >= 1 => {
                store = Some(a[i + 1].clone());
                i += 1;
            }
            "by" if left >= 1 => {
                by = Some(a[i + 1].clone());
                i += 1;
            }
            "get" if left >= 1 => {
                gets.push(a[i + 1].clone());
                i += 1;
            }
            _ => return syntax_error(),
        }
        i += 1;
    }
    let key = ctx.key(&a[1]);
    ctx.shared.engine.note_access(ctx.conn.id, &key);
    let value = ctx.shared.engine.get_value(&key).await;
    let is_set = matches!(value, Ok(Some((Kind::Set, _))));
    let elements: Vec<Bytes> = match value {
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
    let weights = match &by {
        // A constant pattern: no key to read.
        Some(p) if !p.contains(&b'*') => {
            if !is_set {
                return finish(ctx, elements, false, limit, store, &gets).await;
            }
            alpha = true;
            None
        }
        Some(p) => {
            let mut w = Vec::with_capacity(elements.len());
            for e in &elements {
                w.push(pattern_value(ctx, p, e).await.unwrap_or_default());
            }
            Some(w)
        }
        None => None,
    };
    let elements = match weights {
        // Sorted by weight, the element's bytes breaking ties (as below).
        Some(w) => {
            let mut pairs: Vec<(Bytes, Bytes)> = w.into_iter().zip(elements).collect();
            if alpha {
                pairs.sort();
            } else {
                let mut scored = Vec::with_capacity(pairs.len());
                for (w, e) in pairs {
                    match score_of(&w) {
                        Some(x) => scored.push((x, e)),
                        None => {
                            return Reply::err(
                                "ERR One or more scores can't be converted into double",
                            )
                        }
                    }
                }
                scored.sort_by(|x, y| {
                    x.0.partial_cmp(&y.0)
                        .unwrap_or(std::cmp::Ordering::Equal)
                        .then_with(|| x.1.cmp(&y.1))
                });
                pairs = scored.into_iter().map(|(_, e)| (Bytes::new(), e)).collect();
            }
            let sorted: Vec<Bytes> = pairs.into_iter().map(|(_, e)| e).collect();
            return finish(ctx, sorted, desc, limit, store, &gets).await;
        }
        None => elements,
    };
    let sorted = if alpha {
        let mut v = elements;
        v.sort();
        v
    } else {
        let mut scored = Vec::with_capacity(elements.len());
        for e in elements {
            match score_of(&e) {
                Some(x) => scored.push((x, e)),
                None => return Reply::err("ERR One or more scores can't be converted into double"),
            }
        }
        scored.sort_by(|x, y| {
            x.0.partial_cmp(&y.0)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then_with(|| x.1.cmp(&y.1))
        });
        scored.into_iter().map(|(_, e)| e).collect()
    };
    finish(ctx, sorted, desc, limit, store, &gets).await
}

/// An element or weight as a number, as strtod reads it: leading spaces skipped, and
/// nothing at all is 0.
fn score_of(e: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(e).ok().map(str::trim_start);
    let score = match text {
        Some("") => Some(0.0),
        t => t.and_then(|t| t.parse::<f64>().ok()),
    };
    score.filter(|x| !x.is_nan())
}

/// The value `pattern` names for element `e`: `#` is the element; otherwise the first `*`
/// is replaced by it, and `key->field` reads a hash's field. `None` when there is no such
/// key (or no `*` to replace).
async fn pattern_value(ctx: &mut Ctx<'_>, pattern: &[u8], e: &[u8]) -> Option<Bytes> {
    if pattern == b"#" {
        return Some(Bytes::copy_from_slice(e));
    }
    let star = pattern.iter().position(|&b| b == b'*')?;
    let arrow = pattern[star..]
        .windows(2)
        .position(|w| w == b"->")
        .map(|p| p + star)
        .filter(|&p| p + 2 < pattern.len());
    let key_pattern = arrow.map_or(pattern, |p| &pattern[..p]);
    let mut key = key_pattern[..star].to_vec();
    key.extend_from_slice(e);
    key.extend_from_slice(&key_pattern[star + 1..]);
    let reply = match arrow {
        Some(p) => {
            let args = [
                Bytes::from_static(b"hget"),
                key.into(),
                Bytes::copy_from_slice(&pattern[p + 2..]),
            ];
            super::hashes::hget(ctx, &args).await
        }
        None => super::strings::get(ctx, &[Bytes::from_static(b"get"), key.into()]).await,
    };
    match reply {
        Reply::Bulk(b) => Some(b),
        _ => None,
    }
}

async fn finish(
    ctx: &mut Ctx<'_>,
    mut sorted: Vec<Bytes>,
    desc: bool,
    limit: Option<(i64, i64)>,
    store: Option<Bytes>,
    gets: &[Bytes],
) -> Reply {
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
    if gets.is_empty() {
        return match store {
            Some(dst) => store_items::<ListCodec>(ctx, &dst, &sorted).await,
            None => Reply::Array(sorted.into_iter().map(Reply::Bulk).collect()),
        };
    }
    let mut values = Vec::with_capacity(sorted.len() * gets.len());
    for e in &sorted {
        for g in gets {
            values.push(pattern_value(ctx, g, e).await);
        }
    }
    match store {
        // A missing value is stored as an empty string, as Redis does.
        Some(dst) => {
            let items: Vec<Bytes> = values.into_iter().map(Option::unwrap_or_default).collect();
            store_items::<ListCodec>(ctx, &dst, &items).await
        }
        None => Reply::Array(
            values
                .into_iter()
                .map(|v| v.map_or(Reply::Null, Reply::Bulk))
                .collect(),
        ),
    }
}
