//! String commands.

use bytes::{Bytes, BytesMut};
use strata_engine::{Change, Condition, Expire, PutOptions};
use strata_resp::Reply;

use super::{engine_error, not_integer, parse_int, syntax_error, Ctx};

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

fn lower(a: &[u8]) -> String {
    String::from_utf8_lossy(a).to_ascii_lowercase()
}

pub(crate) async fn run(ctx: &mut Ctx<'_>, name: &str, a: &[Bytes]) -> Reply {
    let engine = &ctx.shared.engine;
    match name {
        "get" => {
            engine.note_access(ctx.conn.id, &a[1]);
            match engine.get(&a[1]).await {
                Ok(Some(v)) => Reply::Bulk(v),
                Ok(None) => Reply::Null,
                Err(e) => engine_error(&e),
            }
        }
        "mget" => {
            let keys: Vec<&[u8]> = a[1..].iter().map(|k| k.as_ref()).collect();
            for k in &keys {
                engine.note_access(ctx.conn.id, k);
            }
            match engine.get_many_limited(&keys, ctx.reply_bytes_max()).await {
                Ok(vals) => Reply::Array(
                    vals.into_iter()
                        .map(|v| v.map_or(Reply::Null, Reply::Bulk))
                        .collect(),
                ),
                Err(e) => engine_error(&e),
            }
        }
        "set" => set(ctx, a).await,
        "setnx" => {
            put(
                ctx,
                &a[1],
                a[2].clone(),
                PutOptions {
                    condition: Condition::IfAbsent,
                    ..Default::default()
                },
                |r| Reply::Integer(r.written as i64),
            )
            .await
        }
        "setex" | "psetex" => {
            let kind = if name == "setex" { "ex" } else { "px" };
            let at = match expire_at(kind, &a[2], engine.now_ms(), name) {
                Ok(t) => t,
                Err(r) => return r,
            };
            put(
                ctx,
                &a[1],
                a[3].clone(),
                PutOptions {
                    expire: Expire::AtMs(at),
                    ..Default::default()
                },
                |_| Reply::ok(),
            )
            .await
        }
        "getset" => {
            put(
                ctx,
                &a[1],
                a[2].clone(),
                PutOptions {
                    return_old: true,
                    ..Default::default()
                },
                |r| r.old.map_or(Reply::Null, Reply::Bulk),
            )
            .await
        }
        "getdel" => {
            let r = engine
                .update(&a[1], true, |cur| match cur {
                    None => Ok((None, None)),
                    Some(c) => Ok((Some(Change::Delete), c.value.cloned())),
                })
                .await;
            match r {
                Ok(v) => v.map_or(Reply::Null, Reply::Bulk),
                Err(e) => engine_error(&e),
            }
        }
        "getex" => getex(ctx, a).await,
        "mset" | "msetnx" => {
            if a.len().is_multiple_of(2) {
                return super::wrong_args(name);
            }
            if name == "msetnx" {
                for pair in a[1..].chunks(2) {
                    match engine.exists(&pair[0]).await {
                        Ok(true) => return Reply::Integer(0),
                        Ok(false) => {}
                        Err(e) => return engine_error(&e),
                    }
                }
            }
            let pairs: Vec<(&[u8], Bytes)> = a[1..]
                .chunks(2)
                .map(|p| (p[0].as_ref(), p[1].clone()))
                .collect();
            if let Err(e) = engine.put_many(&pairs, 0).await {
                return engine_error(&e);
            }
            if name == "mset" {
                Reply::ok()
            } else {
                Reply::Integer(1)
            }
        }
        "strlen" => match engine
            .update(&a[1], false, |cur| {
                Ok((None, cur.map_or(0, |c| c.value_len)))
            })
            .await
        {
            Ok(n) => Reply::Integer(n as i64),
            Err(e) => engine_error(&e),
        },
        "append" => {
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
        "getrange" | "substr" => {
            let (Some(start), Some(end)) = (parse_int(&a[2]), parse_int(&a[3])) else {
                return not_integer();
            };
            match engine.get(&a[1]).await {
                Ok(Some(v)) => Reply::Bulk(range_of(&v, start, end)),
                Ok(None) => Reply::bulk(""),
                Err(e) => engine_error(&e),
            }
        }
        "setrange" => setrange(ctx, a).await,
        "incr" | "decr" | "incrby" | "decrby" => {
            let delta = match name {
                "incr" => 1,
                "decr" => -1,
                _ => match parse_int(&a[2]) {
                    Some(d) if name == "incrby" => d,
                    Some(d) => match d.checked_neg() {
                        Some(n) => n,
                        None => return Reply::err("ERR decrement would overflow"),
                    },
                    None => return not_integer(),
                },
            };
            engine
                .incr_by(&a[1], delta)
                .await
                .map_or_else(|e| engine_error(&e), Reply::Integer)
        }
        "incrbyfloat" => incrbyfloat(ctx, a).await,
        _ => Reply::err(format!("ERR unknown command '{name}'")),
    }
}

async fn put(
    ctx: &Ctx<'_>,
    key: &Bytes,
    value: Bytes,
    opts: PutOptions,
    f: impl FnOnce(strata_engine::PutResult) -> Reply,
) -> Reply {
    let limit = ctx.shared.cfg.read().proto_max_bulk_len as usize;
    if value.len() > limit {
        return Reply::err("ERR string exceeds maximum allowed size (proto-max-bulk-len)");
    }
    match ctx.shared.engine.put(key, value, opts).await {
        Ok(r) => f(r),
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

async fn set(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
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

async fn getex(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let engine = &ctx.shared.engine;
    let now = engine.now_ms();
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
    let r = engine
        .update(&a[1], true, move |cur| match cur {
            None => Ok((None, None)),
            Some(c) => {
                let change = match new_expire {
                    Some(t) if t != c.expire_ms => Some(Change::SetExpire(t)),
                    _ => None,
                };
                Ok((change, c.value.cloned()))
            }
        })
        .await;
    match r {
        Ok(v) => v.map_or(Reply::Null, Reply::Bulk),
        Err(e) => engine_error(&e),
    }
}

async fn setrange(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let Some(offset) = parse_int(&a[2]) else {
        return not_integer();
    };
    if offset < 0 {
        return Reply::err("ERR offset is out of range");
    }
    let limit = ctx.shared.cfg.read().proto_max_bulk_len as usize;
    let offset = offset as usize;
    if offset.saturating_add(a[3].len()) > limit {
        return Reply::err("ERR string exceeds maximum allowed size (proto-max-bulk-len)");
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
    ctx: &Ctx<'_>,
    key: &[u8],
    f: impl FnOnce(Option<&Bytes>) -> Result<Option<BytesMut>, strata_engine::Error>,
) -> Reply {
    let r = ctx
        .shared
        .engine
        .update(key, true, move |cur| {
            let expire_ms = cur.as_ref().map_or(0, |c| c.expire_ms);
            let old = cur.as_ref().and_then(|c| c.value);
            let old_len = old.map_or(0, |v| v.len()) as i64;
            match f(old)? {
                Some(v) => {
                    let n = v.len() as i64;
                    Ok((
                        Some(Change::Put {
                            value: v.freeze(),
                            expire_ms,
                        }),
                        n,
                    ))
                }
                None => Ok((None, old_len)),
            }
        })
        .await;
    r.map_or_else(|e| engine_error(&e), Reply::Integer)
}

/// Parses a float the way Redis accepts it: no spaces, finite, not empty.
fn parse_float(b: &[u8]) -> Option<f64> {
    let s = std::str::from_utf8(b).ok()?;
    if s.is_empty() || s.trim() != s || s.eq_ignore_ascii_case("nan") {
        return None;
    }
    s.parse::<f64>().ok().filter(|f| !f.is_nan())
}

async fn incrbyfloat(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let Some(delta) = parse_float(&a[2]) else {
        return Reply::err("ERR value is not a valid float");
    };
    let r = ctx
        .shared
        .engine
        .update(&a[1], true, move |cur| {
            let (old, expire_ms) = match &cur {
                Some(c) => match parse_float(c.value.expect("value")) {
                    Some(f) => (f, c.expire_ms),
                    None => {
                        return Err(strata_engine::Error::Invalid(
                            "value is not a valid float".into(),
                        ))
                    }
                },
                None => (0.0, 0),
            };
            let new = old + delta;
            if !new.is_finite() {
                return Err(strata_engine::Error::Invalid(
                    "increment would produce NaN or Infinity".into(),
                ));
            }
            let text = Bytes::from(strata_resp::format_double(new));
            Ok((
                Some(Change::Put {
                    value: text.clone(),
                    expire_ms,
                }),
                text,
            ))
        })
        .await;
    r.map_or_else(|e| engine_error(&e), Reply::Bulk)
}
