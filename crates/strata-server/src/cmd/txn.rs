//! `MULTI`/`EXEC`/`DISCARD`/`WATCH`/`UNWATCH` with Redis's optimistic semantics. `EXEC`
//! holds the server's gate for writing, so the queued commands run with nothing between.

use bytes::Bytes;
use strata_engine::Key;
use strata_resp::Reply;

use super::ctx::{engine_error, Ctx};

pub(crate) async fn multi(ctx: &mut Ctx<'_>, _a: &[Bytes]) -> Reply {
    if ctx.conn.multi.is_some() {
        return Reply::err("ERR MULTI calls can not be nested");
    }
    ctx.conn.multi = Some(Vec::new());
    ctx.conn.multi_bytes = 0;
    ctx.conn.multi_failed = false;
    ctx.conn.multi_slot = None;
    Reply::ok()
}

pub(crate) async fn discard(ctx: &mut Ctx<'_>, _a: &[Bytes]) -> Reply {
    if ctx.conn.multi.take().is_none() {
        return Reply::err("ERR DISCARD without MULTI");
    }
    ctx.shared.watches.unwatch(&mut ctx.conn.watched);
    Reply::ok()
}

pub(crate) async fn watch(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    if ctx.conn.multi.is_some() {
        return Reply::err("ERR WATCH inside MULTI is not allowed");
    }
    let keys: Vec<(Key, u64)> = a[1..].iter().map(|k| (ctx.key(k), 0)).collect();
    let fresh: Vec<bool> = keys
        .iter()
        .map(|(k, _)| !ctx.conn.watched.keys.contains_key(k.stored()))
        .collect();
    if !ctx.shared.watches.watch(&mut ctx.conn.watched, &keys) {
        return Reply::err(format!(
            "ERR a client may watch at most {} keys",
            crate::watch::WATCHED_KEYS_MAX
        ));
    }
    // Each live key's expiry, read once it is watched (an expiry set meanwhile touches it):
    // its expiring later counts as a change.
    // A key watched before keeps what was seen then.
    for ((key, _), _) in keys.iter().zip(fresh).filter(|(_, fresh)| *fresh) {
        let expire_ms = match ctx.shared.engine.expire_time_ms(key).await {
            Ok(t) => t.unwrap_or(0),
            Err(e) => return engine_error(&e),
        };
        if let Some(seen) = ctx.conn.watched.keys.get_mut(key.stored()) {
            seen.expire_ms = expire_ms;
        }
    }
    Reply::ok()
}

pub(crate) async fn unwatch(ctx: &mut Ctx<'_>, _a: &[Bytes]) -> Reply {
    ctx.shared.watches.unwatch(&mut ctx.conn.watched);
    Reply::ok()
}

pub(crate) async fn exec(ctx: &mut Ctx<'_>, _a: &[Bytes]) -> Reply {
    let Some(queued) = ctx.conn.multi.take() else {
        return Reply::err("ERR EXEC without MULTI");
    };
    let now = ctx.shared.engine.now_ms();
    let unchanged = ctx.shared.watches.unchanged(&ctx.conn.watched, now);
    ctx.shared.watches.unwatch(&mut ctx.conn.watched);
    if std::mem::take(&mut ctx.conn.multi_failed) {
        return Reply::err("EXECABORT Transaction discarded because of previous errors.");
    }
    if !unchanged {
        return Reply::NullArray;
    }
    // Every command runs (the transaction is all or nothing), but the reply carries at most
    // client-output-buffer-limit bytes: past it, a command's reply is an error instead.
    let bytes_max = ctx.reply_bytes_max();
    let mut bytes = 0u64;
    let mut replies = Vec::with_capacity(queued.len());
    ctx.conn.exec_commands = Some(queued.len());
    for args in queued {
        let commands = ctx.commands;
        let idx = commands
            .lookup(&args[0])
            .expect("queued commands were looked up");
        let reply = commands.dispatch(ctx, idx, &args).await;
        let size = reply.payload_bytes();
        if replies.is_empty() || bytes + size <= bytes_max {
            bytes += size;
            replies.push(reply);
        } else {
            replies.push(Reply::err(format!(
                "ERR this reply would take EXEC's past {bytes_max} bytes \
                 (client-output-buffer-limit); the command ran, its reply is dropped"
            )));
        }
    }
    ctx.conn.exec_commands = None;
    Reply::Array(replies)
}

/// Ends the connection's transaction unrun because `EXEC` itself was refused with
/// `reason`: `EXECABORT` with the reason, as Redis answers.
pub(crate) fn abort(
    shared: &crate::shared::Shared,
    conn: &mut crate::session::Conn,
    reason: &Reply,
) -> Reply {
    conn.multi = None;
    conn.multi_failed = false;
    shared.watches.unwatch(&mut conn.watched);
    let why = match reason {
        Reply::Error(e) => e.as_str(),
        _ => "",
    };
    Reply::err(format!("EXECABORT Transaction discarded because of: {why}"))
}
