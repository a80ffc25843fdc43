//! String commands.

use bytes::{Bytes, BytesMut};
use strata_engine::{Change, Condition, Expire, Key, Kind, PutOptions, PutResult};
use strata_resp::Reply;

use crate::longdouble::{LongDouble, Sum};

use super::ctx::{engine_error, lower, not_integer, parse_int, string_only, syntax_error, Ctx};

/// Parses an expiry argument (`EX`/`PX`/`EXAT`/`PXAT`) into absolute Unix ms.
pub(crate) fn expire_at(kind: &str, arg: &[u8], now_ms: u64, cmd: &str) -> Result<u64, Reply> {
    let n = parse_int(arg).ok_or_else(not_integer)?;
    let invalid = || Reply::err(format!("ERR invalid expire time in '{cmd}' command"));
    if n <= 0 {
        return Err(invalid());
    }
    let n = n as u64;
    let at = match kind {
        "ex" => n.checked_mul(1000).and_then(|ms| ms.checked_add(now_ms)),
        "px" => n.checked_add(now_ms),
        "exat" => n.checked_mul(1000),
        _ => Some(n),
    };
    at.filter(|&t| t < i64::MAX as u64).ok_or_else(invalid)
}

fn too_long() -> Reply {
    Reply::err("ERR string exceeds maximum allowed size (proto-max-bulk-len)")
}

pub(crate) async fn get(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let key = ctx.key(&a[1]);
    let engine = &ctx.shared.engine;
    engine.note_access(ctx.conn.id, &key);
    match engine.get(&key).await {
        Ok(Some(v)) => Reply::Bulk(v),
        Ok(None) => Reply::Null,
        Err(e) => engine_error(&e),
    }
}

/// A pipeline's consecutive `GET key`s as one read of the engine (see `cmd::execute_run`):
/// each still gets its own reply (a value, nil, or `-WRONGTYPE`). If the read fails as a
/// whole, or its values pass one reply's limit together, each key is read on its own, so a
/// failure stays with its own command.
pub(crate) async fn get_run(ctx: &mut Ctx<'_>, cmds: &[&[Bytes]]) -> Vec<Reply> {
    let keys: Vec<Key> = cmds.iter().map(|a| ctx.key(&a[1])).collect();
    let engine = &ctx.shared.engine;
    for k in &keys {
        engine.note_access(ctx.conn.id, k);
    }
    let refs: Vec<&Key> = keys.iter().collect();
    if let Ok(values) = engine.get_values(&refs, ctx.reply_bytes_max()).await {
        return values
            .into_iter()
            .map(|v| match v {
                Some((Kind::String, b)) => Reply::Bulk(b),
                Some(_) => engine_error(&strata_engine::Error::WrongType),
                None => Reply::Null,
            })
            .collect();
    }
    let mut out = Vec::with_capacity(keys.len());
    for k in &keys {
        out.push(match engine.get(k).await {
            Ok(Some(v)) => Reply::Bulk(v),
            Ok(None) => Reply::Null,
            Err(e) => engine_error(&e),
        });
    }
    out
}

pub(crate) async fn mget(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let keys: Vec<Key> = a[1..].iter().map(|k| ctx.key(k)).collect();
    let engine = &ctx.shared.engine;
    for k in &keys {
        engine.note_access(ctx.conn.id, k);
    }
    let refs: Vec<&Key> = keys.iter().collect();
    match engine.get_many_limited(&refs, ctx.reply_bytes_max()).await {
        Ok(vals) => Reply::Array(
            vals.into_iter()
                .map(|v| v.map_or(Reply::Null, Reply::Bulk))
                .collect(),
        ),
        Err(e) => engine_error(&e),
    }
}

pub(crate) async fn set(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let now = ctx.shared.engine.now_ms();
    let mut opts = PutOptions::default();
    let mut expire_set = false;
    let mut cond_set = false;
    let mut i = 3;
    while i < a.len() {
        let opt = lower(&a[i]);
        let has_next = i + 1 < a.len();
        match opt.as_str() {
            "nx" | "xx" if !cond_set => {
                opts.condition = if opt == "nx" {
                    Condition::IfAbsent
                } else {
                    Condition::IfPresent
                };
                cond_set = true;
            }
            "ifeq" if !cond_set && has_next => {
                opts.condition = Condition::IfEquals(a[i + 1].clone());
                cond_set = true;
                i += 1;
            }
            "get" => opts.return_old = true,
            "keepttl" if !expire_set => {
                opts.expire = Expire::Keep;
                expire_set = true;
            }
            "ex" | "px" | "exat" | "pxat" if !expire_set && has_next => {
                match expire_at(&opt, &a[i + 1], now, "set") {
                    Ok(t) => opts.expire = Expire::AtMs(t),
                    Err(r) => return r,
                }
                expire_set = true;
                i += 1;
            }
            _ => return syntax_error(),
        }
        i += 1;
    }
    let return_old = opts.return_old;
    put(ctx, &a[1], a[2].clone(), opts, |r| {
        if return_old {
            r.old.map_or(Reply::Null, Reply::Bulk)
        } else if r.written {
            Reply::ok()
        } else {
            Reply::Null
        }
    })
    .await
}

pub(crate) async fn setnx(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let opts = PutOptions {
        condition: Condition::IfAbsent,
        ..Default::default()
    };
    put(ctx, &a[1], a[2].clone(), opts, |r| {
        Reply::Integer(r.written as i64)
    })
    .await
}

pub(crate) async fn setex(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    set_expiring(ctx, a, "ex", "setex").await
}

pub(crate) async fn psetex(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    set_expiring(ctx, a, "px", "psetex").await
}

/// `SETEX`/`PSETEX key time value`: `kind` says the time's unit.
async fn set_expiring(ctx: &mut Ctx<'_>, a: &[Bytes], kind: &str, cmd: &str) -> Reply {
    let at = match expire_at(kind, &a[2], ctx.shared.engine.now_ms(), cmd) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let opts = PutOptions {
        expire: Expire::AtMs(at),
        ..Default::default()
    };
    put(ctx, &a[1], a[3].clone(), opts, |_| Reply::ok()).await
}

pub(crate) async fn getset(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let opts = PutOptions {
        return_old: true,
        ..Default::default()
    };
    put(ctx, &a[1], a[2].clone(), opts, |r| {
        r.old.map_or(Reply::Null, Reply::Bulk)
    })
    .await
}

pub(crate) async fn getdel(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let key = ctx.key(&a[1]);
    let shared = ctx.shared;
    let r = shared
        .engine
        .update(&key, true, |cur| {
            string_only(&cur)?;
            match cur {
                None => Ok((None, None)),
                Some(c) => Ok((Some(Change::Delete), c.value.cloned())),
            }
        })
        .await;
    match r {
        Ok(w) => ctx.defer(w).map_or(Reply::Null, Reply::Bulk),
        Err(e) => engine_error(&e),
    }
}

pub(crate) async fn getex(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let shared = ctx.shared;
    let now = shared.engine.now_ms();
    // None: leave the expiry alone; Some(0): persist; Some(t): expire at t.
    let mut new_expire: Option<u64> = None;
    let mut i = 2;
    while i < a.len() {
        let opt = lower(&a[i]);
        match opt.as_str() {
            "persist" if new_expire.is_none() => new_expire = Some(0),
            "ex" | "px" | "exat" | "pxat" if new_expire.is_none() && i + 1 < a.len() => {
                match expire_at(&opt, &a[i + 1], now, "getex") {
                    Ok(t) => new_expire = Some(t),
                    Err(r) => return r,
                }
                i += 1;
            }
            _ => return syntax_error(),
        }
        i += 1;
    }
    let key = ctx.key(&a[1]);
    let r = shared
        .engine
        .update(&key, true, move |cur| {
            string_only(&cur)?;
            match cur {
                None => Ok((None, None)),
                Some(c) => {
                    let change = match new_expire {
                        Some(t) if t != c.expire_ms => Some(Change::SetExpire(t)),
                        _ => None,
                    };
                    Ok((change, c.value.cloned()))
                }
            }
        })
        .await;
    match r {
        Ok(w) => ctx.defer(w).map_or(Reply::Null, Reply::Bulk),
        Err(e) => engine_error(&e),
    }
}

pub(crate) async fn mset(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    set_many(ctx, a, false).await
}

pub(crate) async fn msetnx(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    set_many(ctx, a, true).await
}

/// `MSET` (and with `only_new`, `MSETNX`): every pair in one batch.
async fn set_many(ctx: &mut Ctx<'_>, a: &[Bytes], only_new: bool) -> Reply {
    if a.len().is_multiple_of(2) {
        return super::ctx::wrong_args(if only_new { "msetnx" } else { "mset" });
    }
    let shared = ctx.shared;
    let keys: Vec<Key> = a[1..].iter().step_by(2).map(|k| ctx.key(k)).collect();
    if only_new {
        for k in &keys {
            match shared.engine.exists(k).await {
                Ok(true) => return Reply::Integer(0),
                Ok(false) => {}
                Err(e) => return engine_error(&e),
            }
        }
    }
    let pairs: Vec<(&Key, Bytes)> = keys
        .iter()
        .zip(a[2..].iter().step_by(2))
        .map(|(k, v)| (k, v.clone()))
        .collect();
    match shared.engine.put_many(&pairs, 0).await {
        Ok(w) => ctx.defer(w),
        Err(e) => return engine_error(&e),
    }
    if only_new {
        Reply::Integer(1)
    } else {
        Reply::ok()
    }
}

pub(crate) async fn strlen(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let key = ctx.key(&a[1]);
    let r = ctx
        .shared
        .engine
        .update(&key, false, |cur| {
            string_only(&cur)?;
            Ok((None, cur.map_or(0, |c| c.value_len)))
        })
        .await;
    match r {
        // Nothing changed: no ticket to wait for.
        Ok(w) => Reply::Integer(ctx.defer(w) as i64),
        Err(e) => engine_error(&e),
    }
}

pub(crate) async fn append(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let add = a[2].clone();
    let limit = ctx.shared.cfg.read().proto_max_bulk_len as usize;
    edit_value(ctx, &a[1], move |old| {
        let mut v = BytesMut::from(old.map_or(&b""[..], |o| o.as_ref()));
        if v.len() + add.len() > limit {
            return Err(too_big());
        }
        v.extend_from_slice(&add);
        Ok(Some(v))
    })
    .await
}

pub(crate) async fn getrange(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let (Some(start), Some(end)) = (parse_int(&a[2]), parse_int(&a[3])) else {
        return not_integer();
    };
    match ctx.shared.engine.get(&ctx.key(&a[1])).await {
        Ok(Some(v)) => Reply::Bulk(range_of(&v, start, end)),
        Ok(None) => Reply::bulk(""),
        Err(e) => engine_error(&e),
    }
}

pub(crate) async fn incr(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    incr_by(ctx, &a[1], 1).await
}

pub(crate) async fn decr(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    incr_by(ctx, &a[1], -1).await
}

pub(crate) async fn incrby(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    match parse_int(&a[2]) {
        Some(d) => incr_by(ctx, &a[1], d).await,
        None => not_integer(),
    }
}

pub(crate) async fn decrby(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    match parse_int(&a[2]).map(i64::checked_neg) {
        Some(Some(d)) => incr_by(ctx, &a[1], d).await,
        Some(None) => Reply::err("ERR decrement would overflow"),
        None => not_integer(),
    }
}

/// The delta of `INCR`, `DECR`, `INCRBY` or `DECRBY` `a`, or the reply refusing it.
fn delta_of(a: &[Bytes]) -> Result<i64, Reply> {
    let name = &a[0];
    if name.eq_ignore_ascii_case(b"incr") {
        Ok(1)
    } else if name.eq_ignore_ascii_case(b"decr") {
        Ok(-1)
    } else if name.eq_ignore_ascii_case(b"incrby") {
        parse_int(&a[2]).ok_or_else(not_integer)
    } else {
        match parse_int(&a[2]).map(i64::checked_neg) {
            Some(Some(d)) => Ok(d),
            Some(None) => Err(Reply::err("ERR decrement would overflow")),
            None => Err(not_integer()),
        }
    }
}

/// Pipelined `INCR`s, `DECR`s, `INCRBY`s and `DECRBY`s, in order, as one batch of the
/// engine; each gets the reply it would get alone.
pub(crate) async fn incr_run(ctx: &mut Ctx<'_>, cmds: &[&[Bytes]]) -> Vec<Reply> {
    let deltas: Vec<Result<i64, Reply>> = cmds.iter().map(|a| delta_of(a)).collect();
    let keys: Vec<Key> = cmds.iter().map(|a| ctx.key(&a[1])).collect();
    let items: Vec<(&Key, i64)> = keys
        .iter()
        .zip(&deltas)
        .filter_map(|(k, d)| Some((k, *d.as_ref().ok()?)))
        .collect();
    let mut results = match ctx.shared.engine.incr_many(&items).await {
        Ok(w) => ctx.defer(w).into_iter().map(|r| match r {
            Ok(n) => Reply::Integer(n),
            Err(e) => engine_error(&e),
        }),
        Err(e) => {
            let r = engine_error(&e);
            return deltas
                .into_iter()
                .map(|d| d.err().unwrap_or(r.clone()))
                .collect();
        }
    };
    deltas
        .into_iter()
        .map(|d| match d {
            Ok(_) => results.next().expect("one result per item"),
            Err(r) => r,
        })
        .collect()
}

async fn incr_by(ctx: &mut Ctx<'_>, key: &[u8], delta: i64) -> Reply {
    let key = ctx.key(key);
    match ctx.shared.engine.incr_by(&key, delta).await {
        Ok(w) => Reply::Integer(ctx.defer(w)),
        Err(e) => engine_error(&e),
    }
}

/// Plain `SET key value`s of one pipeline, in order, as one batch of the engine (the last of a repeated
/// key wins, as it would one by one); a value over `proto-max-bulk-len` is refused alone.
pub(crate) async fn set_run(ctx: &mut Ctx<'_>, sets: &[&[Bytes]]) -> Vec<Reply> {
    let limit = ctx.shared.cfg.read().proto_max_bulk_len as usize;
    let keys: Vec<Key> = sets.iter().map(|a| ctx.key(&a[1])).collect();
    let pairs: Vec<(&Key, Bytes)> = keys
        .iter()
        .zip(sets)
        .filter(|(_, a)| a[2].len() <= limit)
        .map(|(k, a)| (k, a[2].clone()))
        .collect();
    let done = match ctx.shared.engine.put_many(&pairs, 0).await {
        Ok(w) => {
            ctx.defer(w);
            Reply::ok()
        }
        Err(e) => engine_error(&e),
    };
    sets.iter()
        .map(|a| {
            if a[2].len() > limit {
                too_long()
            } else {
                done.clone()
            }
        })
        .collect()
}

/// Stores `value` under the client key `key` as `opts` says; `f` makes the reply.
async fn put(
    ctx: &mut Ctx<'_>,
    key: &Bytes,
    value: Bytes,
    opts: PutOptions,
    f: impl FnOnce(PutResult) -> Reply,
) -> Reply {
    let limit = ctx.shared.cfg.read().proto_max_bulk_len as usize;
    if value.len() > limit {
        return too_long();
    }
    let key = ctx.key(key);
    match ctx.shared.engine.put(&key, value, opts).await {
        Ok(w) => f(ctx.defer(w)),
        Err(e) => engine_error(&e),
    }
}

/// The bytes of `v` between `start` and `end` inclusive, with Redis's negative indexes.
pub(crate) fn range_of(v: &Bytes, start: i64, end: i64) -> Bytes {
    let len = v.len() as i64;
    if len == 0 || (start < 0 && end < 0 && start > end) {
        return Bytes::new();
    }
    let mut s = if start < 0 { len + start } else { start };
    let mut e = if end < 0 { len + end } else { end };
    s = s.max(0);
    e = e.max(0).min(len - 1);
    if s > e {
        return Bytes::new();
    }
    v.slice(s as usize..=e as usize)
}

pub(crate) async fn setrange(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let Some(offset) = parse_int(&a[2]) else {
        return not_integer();
    };
    if offset < 0 {
        return Reply::err("ERR offset is out of range");
    }
    let limit = ctx.shared.cfg.read().proto_max_bulk_len as usize;
    let offset = offset as usize;
    if offset.saturating_add(a[3].len()) > limit {
        return too_long();
    }
    let patch = a[3].clone();
    edit_value(ctx, &a[1], move |old| {
        if patch.is_empty() {
            return Ok(None);
        }
        let mut v = BytesMut::from(old.map_or(&b""[..], |o| o.as_ref()));
        if v.len() < offset + patch.len() {
            v.resize(offset + patch.len(), 0);
        }
        v[offset..offset + patch.len()].copy_from_slice(&patch);
        Ok(Some(v))
    })
    .await
}

fn too_big() -> strata_engine::Error {
    strata_engine::Error::Invalid("string exceeds maximum allowed size (proto-max-bulk-len)".into())
}

/// Rewrites a string in place, keeping its expiry: `f` gets the current value (`None` if
/// absent) and returns the new one, or `None` to leave the key alone. Replies with the
/// resulting length, as APPEND and SETRANGE do.
async fn edit_value(
    ctx: &mut Ctx<'_>,
    key: &[u8],
    f: impl FnOnce(Option<&Bytes>) -> Result<Option<BytesMut>, strata_engine::Error>,
) -> Reply {
    let key = ctx.key(key);
    let r = ctx
        .shared
        .engine
        .update(&key, true, move |cur| {
            string_only(&cur)?;
            let expire_ms = cur.as_ref().map_or(0, |c| c.expire_ms);
            let old = cur.as_ref().and_then(|c| c.value);
            let old_len = old.map_or(0, |v| v.len()) as i64;
            match f(old)? {
                Some(v) => {
                    let n = v.len() as i64;
                    let value = v.freeze();
                    let change = Change::Put {
                        kind: Kind::String,
                        value,
                        expire_ms,
                    };
                    Ok((Some(change), n))
                }
                None => Ok((None, old_len)),
            }
        })
        .await;
    match r {
        Ok(w) => Reply::Integer(ctx.defer(w)),
        Err(e) => engine_error(&e),
    }
}

/// Parses a float the way Redis accepts it: no spaces, finite, not empty.
/// `old` (a float's text; absent is 0) plus `delta` (as [`parse_float`] read it), in
/// Redis's long double, as the text `INCRBYFLOAT` stores; `not_float` is the error when
/// `old` is not a float. Checked in Redis's order: `old`, then `delta`, then the sum.
pub(crate) fn float_plus(
    old: Option<&[u8]>,
    delta: Option<Result<LongDouble, ()>>,
    not_float: &str,
) -> strata_engine::Result<Bytes> {
    let invalid = |m: &str| strata_engine::Error::Invalid(m.into());
    let old = match old {
        None => Ok(LongDouble::ZERO),
        Some(v) => LongDouble::parse(v).ok_or_else(|| invalid(not_float))?,
    };
    let delta = delta.ok_or_else(|| invalid("value is not a valid float"))?;
    let not_finite =
        || strata_engine::Error::Invalid("increment would produce NaN or Infinity".into());
    match (old, delta) {
        (Ok(a), Ok(b)) => match a.add(b) {
            Sum::Finite(v) => Ok(Bytes::from(v.to_text())),
            Sum::NotFinite => Err(not_finite()),
        },
        _ => Err(not_finite()),
    }
}

/// A float argument as Redis reads one (`Err` for an infinity).
pub(crate) fn parse_float(b: &[u8]) -> Option<Result<LongDouble, ()>> {
    LongDouble::parse(b)
}

pub(crate) async fn incrbyfloat(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let delta = parse_float(&a[2]);
    let key = ctx.key(&a[1]);
    let r = ctx
        .shared
        .engine
        .update(&key, true, move |cur| {
            string_only(&cur)?;
            let old = cur.as_ref().and_then(|c| c.value);
            let expire_ms = cur.as_ref().map_or(0, |c| c.expire_ms);
            let old = old.map(|v| &v[..]);
            let text = float_plus(old, delta, "value is not a valid float")?;
            let change = Change::Put {
                kind: Kind::String,
                value: text.clone(),
                expire_ms,
            };
            Ok((Some(change), text))
        })
        .await;
    match r {
        Ok(w) => Reply::Bulk(ctx.defer(w)),
        Err(e) => engine_error(&e),
    }
}
