//! Keyspace commands: deletion, expiry, renames, scans.

use bytes::Bytes;
use strata_engine::{Change, Expire, PutOptions};
use strata_resp::Reply;

use super::{engine_error, not_integer, parse_int, syntax_error, Ctx};
use strata_engine::glob::{glob_match, literal_prefix};

pub(crate) async fn run(ctx: &mut Ctx<'_>, name: &str, a: &[Bytes]) -> Reply {
    let engine = &ctx.shared.engine;
    match name {
        "del" | "unlink" => {
            let mut n = 0;
            for k in &a[1..] {
                match engine.delete(k).await {
                    Ok(true) => n += 1,
                    Ok(false) => {}
                    Err(e) => return engine_error(&e),
                }
            }
            Reply::Integer(n)
        }
        "exists" => {
            let mut n = 0;
            for k in &a[1..] {
                match engine.exists(k).await {
                    Ok(true) => n += 1,
                    Ok(false) => {}
                    Err(e) => return engine_error(&e),
                }
            }
            Reply::Integer(n)
        }
        "expire" | "pexpire" | "expireat" | "pexpireat" => expire(ctx, name, a).await,
        "ttl" | "pttl" | "expiretime" | "pexpiretime" => match engine.expire_time_ms(&a[1]).await {
            Ok(None) => Reply::Integer(-2),
            Ok(Some(0)) => Reply::Integer(-1),
            Ok(Some(at)) => {
                let left = at.saturating_sub(engine.now_ms()) as i64;
                Reply::Integer(match name {
                    "ttl" => (left + 500) / 1000,
                    "pttl" => left,
                    "expiretime" => (at / 1000) as i64,
                    _ => at as i64,
                })
            }
            Err(e) => engine_error(&e),
        },
        "persist" => {
            let r = engine
                .update(&a[1], false, |cur| match cur {
                    Some(c) if c.expire_ms != 0 => Ok((Some(Change::SetExpire(0)), 1)),
                    _ => Ok((None, 0)),
                })
                .await;
            r.map_or_else(|e| engine_error(&e), Reply::Integer)
        }
        "type" => match engine.exists(&a[1]).await {
            Ok(true) => Reply::Simple("string".into()),
            Ok(false) => Reply::Simple("none".into()),
            Err(e) => engine_error(&e),
        },
        "rename" | "renamenx" => rename(ctx, name == "renamenx", a).await,
        "scan" => scan(ctx, a).await,
        "keys" => {
            let pattern = &a[1];
            let prefix = literal_prefix(pattern);
            let mut out = Vec::new();
            let mut cursor: Option<Bytes> = None;
            let bytes_max = ctx.reply_bytes_max();
            let mut bytes = 0u64;
            loop {
                let page = match engine.scan_prefix(&prefix, cursor.as_deref(), 10_000) {
                    Ok(p) => p,
                    Err(e) => return engine_error(&e),
                };
                for i in page.items {
                    if glob_match(pattern, &i.key) {
                        bytes += i.key.len() as u64;
                        out.push(Reply::Bulk(i.key));
                    }
                }
                if bytes > bytes_max {
                    return Reply::err(format!(
                        "ERR KEYS would reply with more than {bytes_max} bytes \
                         (client-output-buffer-limit); use SCAN"
                    ));
                }
                match page.next {
                    Some(n) => cursor = Some(n),
                    None => break,
                }
            }
            Reply::Array(out)
        }
        "dbsize" => {
            let st = engine.stats();
            Reply::Integer((st.warm.entries + st.cold.entries) as i64)
        }
        "randomkey" => {
            let seed = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let start = [(seed % 256) as u8];
            for (from, to) in [(&start[..], None), (&b""[..], Some(&start[..]))] {
                match engine.scan(from, to, 1) {
                    Ok(p) if !p.items.is_empty() => return Reply::Bulk(p.items[0].key.clone()),
                    Ok(_) => {}
                    Err(e) => return engine_error(&e),
                }
            }
            Reply::Null
        }
        "flushdb" | "flushall" => {
            if a.len() > 2
                || (a.len() == 2
                    && !matches!(a[1].to_ascii_lowercase().as_slice(), b"async" | b"sync"))
            {
                return syntax_error();
            }
            ctx.shared.watches.touch_all();
            match engine.flush_all().await {
                Ok(()) => Reply::ok(),
                Err(e) => engine_error(&e),
            }
        }
        _ => Reply::err(format!("ERR unknown command '{name}'")),
    }
}

async fn expire(ctx: &mut Ctx<'_>, name: &str, a: &[Bytes]) -> Reply {
    let engine = &ctx.shared.engine;
    let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
    for opt in &a[3..] {
        match opt.to_ascii_lowercase().as_slice() {
            b"nx" => nx = true,
            b"xx" => xx = true,
            b"gt" => gt = true,
            b"lt" => lt = true,
            _ => {
                return Reply::err(format!(
                    "ERR Unsupported option {}",
                    String::from_utf8_lossy(opt)
                ))
            }
        }
    }
    if nx && (xx || gt || lt) {
        return Reply::err("ERR NX and XX, GT or LT options at the same time are not compatible");
    }
    if gt && lt {
        return Reply::err("ERR GT and LT options at the same time are not compatible");
    }
    let Some(n) = parse_int(&a[2]) else {
        return not_integer();
    };
    let now = engine.now_ms() as i64;
    let at = match name {
        "expire" => n.checked_mul(1000).and_then(|ms| ms.checked_add(now)),
        "pexpire" => n.checked_add(now),
        "expireat" => n.checked_mul(1000),
        _ => Some(n),
    };
    let Some(at) = at else {
        return Reply::err(format!("ERR invalid expire time in '{name}' command"));
    };
    // A time in the past deletes the key; 0 means "no expiry" to the engine, so use 1.
    let at = at.max(1) as u64;
    let r = engine
        .update(&a[1], false, move |cur| {
            let Some(c) = cur else { return Ok((None, 0)) };
            let current = if c.expire_ms == 0 {
                u64::MAX
            } else {
                c.expire_ms
            };
            let ok = (!nx || c.expire_ms == 0)
                && (!xx || c.expire_ms != 0)
                && (!gt || at > current)
                && (!lt || at < current);
            if !ok {
                return Ok((None, 0));
            }
            Ok((Some(Change::SetExpire(at)), 1))
        })
        .await;
    r.map_or_else(|e| engine_error(&e), Reply::Integer)
}

async fn rename(ctx: &mut Ctx<'_>, nx: bool, a: &[Bytes]) -> Reply {
    let engine = &ctx.shared.engine;
    let src = match engine
        .update(&a[1], true, |cur| {
            Ok((None, cur.map(|c| (c.value.cloned(), c.expire_ms))))
        })
        .await
    {
        Ok(Some((Some(v), e))) => (v, e),
        Ok(_) => return Reply::err("ERR no such key"),
        Err(e) => return engine_error(&e),
    };
    if a[1] == a[2] {
        return if nx { Reply::Integer(0) } else { Reply::ok() };
    }
    if nx {
        match engine.exists(&a[2]).await {
            Ok(true) => return Reply::Integer(0),
            Ok(false) => {}
            Err(e) => return engine_error(&e),
        }
    }
    let expire = if src.1 == 0 {
        Expire::Persist
    } else {
        Expire::AtMs(src.1)
    };
    if let Err(e) = engine
        .put(
            &a[2],
            src.0,
            PutOptions {
                expire,
                ..Default::default()
            },
        )
        .await
    {
        return engine_error(&e);
    }
    ctx.shared.watches.touch(&a[2]);
    if let Err(e) = engine.delete(&a[1]).await {
        return engine_error(&e);
    }
    if nx {
        Reply::Integer(1)
    } else {
        Reply::ok()
    }
}

async fn scan(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let cursor: u64 = match std::str::from_utf8(&a[1]).ok().and_then(|s| s.parse().ok()) {
        Some(c) => c,
        None => return Reply::err("ERR invalid cursor"),
    };
    let mut pattern: Option<Bytes> = None;
    let mut count = 10usize;
    let mut type_ok = true;
    let mut i = 2;
    while i < a.len() {
        if i + 1 >= a.len() {
            return syntax_error();
        }
        match a[i].to_ascii_lowercase().as_slice() {
            b"match" => pattern = Some(a[i + 1].clone()),
            b"count" => match parse_int(&a[i + 1]) {
                Some(n) if n >= 1 => count = (n as usize).min(100_000),
                Some(_) => return syntax_error(),
                None => return not_integer(),
            },
            b"type" => type_ok = a[i + 1].eq_ignore_ascii_case(b"string"),
            _ => return syntax_error(),
        }
        i += 2;
    }
    let prefix = pattern.as_deref().map(literal_prefix).unwrap_or_default();
    let start = if cursor == 0 {
        None
    } else {
        match ctx.conn.scan_cursors.remove(&cursor) {
            Some(k) => Some(k),
            None => return Reply::Array(vec![Reply::bulk("0"), Reply::Array(vec![])]),
        }
    };
    let page = match ctx
        .shared
        .engine
        .scan_prefix(&prefix, start.as_deref(), count)
    {
        Ok(p) => p,
        Err(e) => return engine_error(&e),
    };
    let keys = page
        .items
        .into_iter()
        .filter(|it| type_ok && pattern.as_ref().is_none_or(|p| glob_match(p, &it.key)))
        .map(|it| Reply::Bulk(it.key))
        .collect();
    let next = match page.next {
        Some(k) => ctx.conn.save_cursor(k),
        None => 0,
    };
    Reply::Array(vec![Reply::bulk(next.to_string()), Reply::Array(keys)])
}
