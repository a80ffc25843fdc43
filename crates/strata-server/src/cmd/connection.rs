//! Connection commands: PING, ECHO, HELLO, AUTH, SELECT, QUIT, RESET, CLIENT.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use strata_resp::Reply;

use super::ctx::{lower, not_integer, parse_int, syntax_error, wrong_args, Ctx};
use crate::auth::{constant_time_eq, Role};

pub(crate) use strata_resp::REDIS_VERSION;

pub(crate) async fn ping(_ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    match a.len() {
        1 => Reply::Simple("PONG".into()),
        2 => Reply::Bulk(a[1].clone()),
        _ => wrong_args("ping"),
    }
}

pub(crate) async fn echo(_ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    Reply::Bulk(a[1].clone())
}

pub(crate) async fn auth(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    match a.len() {
        2 => check_auth(ctx, None, &a[1]),
        3 => check_auth(ctx, Some(&a[1]), &a[2]),
        _ => syntax_error(),
    }
}

pub(crate) async fn select(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let db = super::ctx::parse_db(ctx, &a[1]);
    if ctx.shared.cluster.is_some() && !matches!(db, Ok(0)) {
        return Reply::err("ERR SELECT is not allowed in cluster mode");
    }
    match db {
        Ok(db) => {
            ctx.conn.db = db;
            publish(ctx);
            Reply::ok()
        }
        Err(r) => r,
    }
}

pub(crate) async fn quit(ctx: &mut Ctx<'_>, _a: &[Bytes]) -> Reply {
    ctx.conn.quit = true;
    Reply::ok()
}

pub(crate) async fn reset(ctx: &mut Ctx<'_>, _a: &[Bytes]) -> Reply {
    ctx.conn.multi = None;
    ctx.conn.multi_failed = false;
    ctx.shared.watches.unwatch(&mut ctx.conn.watched);
    ctx.conn.proto = 2;
    ctx.conn.name.clear();
    ctx.conn.db = 0;
    let cfg = ctx.shared.cfg.read();
    let open = cfg.is_open();
    ctx.conn.user = open.then(|| ("default".to_string(), Role::Admin));
    drop(cfg);
    publish(ctx);
    Reply::Simple("RESET".into())
}

pub(crate) async fn hello(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    hello_reply(ctx, a)
}

pub(crate) async fn client(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    client_reply(ctx, a)
}

fn check_auth(ctx: &mut Ctx<'_>, user: Option<&Bytes>, pass: &Bytes) -> Reply {
    let cfg = ctx.shared.cfg.read();
    let ip = ctx.conn.peer.ip();
    if let Some(wait) = ctx
        .shared
        .auth_limiter
        .blocked(ip, cfg.auth_failures_per_minute_max)
    {
        ctx.shared
            .counters
            .auth_refused
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(client = ctx.conn.id, peer = %ctx.conn.peer, "AUTH refused: too many failed attempts from this address");
        return Reply::Error(format!(
            "ERR too many failed AUTH attempts from this address; try again in {wait} seconds"
        ));
    }
    let user = user
        .map(|u| String::from_utf8_lossy(u).into_owned())
        .unwrap_or_else(|| "default".into());
    let role = if user == "default" {
        if cfg.requirepass.is_empty() {
            if cfg.users.is_empty() {
                return Reply::err("ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?");
            }
            None
        } else {
            constant_time_eq(cfg.requirepass.as_bytes(), pass).then_some(Role::Admin)
        }
    } else {
        cfg.users
            .iter()
            .find(|u| u.name == user)
            .and_then(|u| constant_time_eq(u.password.as_bytes(), pass).then_some(u.role))
    };
    match role {
        Some(r) => {
            ctx.conn.user = Some((user, r));
            drop(cfg);
            publish(ctx);
            Reply::ok()
        }
        None => {
            ctx.shared.auth_limiter.failed(ip);
            ctx.shared
                .counters
                .auth_failures
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(client = ctx.conn.id, peer = %ctx.conn.peer, user, "authentication failed");
            Reply::err("WRONGPASS invalid username-password pair or user is disabled.")
        }
    }
}

fn hello_reply(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let reply = hello_options(ctx, a);
    // A name set before a later option failed stays, as in Redis.
    publish(ctx);
    reply
}

/// Names the connection (`CLIENT SETNAME`, `HELLO ... SETNAME`), if `name` has no space,
/// newline or other special character.
fn set_name(ctx: &mut Ctx<'_>, name: &[u8]) -> Result<(), Reply> {
    if name.iter().any(|&b| b <= b' ' || b > b'~') {
        return Err(Reply::err(
            "ERR Client names cannot contain spaces, newlines or special characters.",
        ));
    }
    ctx.conn.name = String::from_utf8_lossy(name).into_owned();
    Ok(())
}

fn hello_options(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let mut proto = ctx.conn.proto;
    let mut i = 1;
    if a.len() > 1 {
        match parse_int(&a[1]) {
            Some(2) => proto = 2,
            Some(3) => proto = 3,
            Some(_) => return Reply::err("NOPROTO unsupported protocol version"),
            None => return Reply::err("ERR Protocol version is not an integer or out of range"),
        }
        i = 2;
    }
    while i < a.len() {
        match lower(&a[i]).as_str() {
            "auth" if i + 2 < a.len() => {
                let r = check_auth(ctx, Some(&a[i + 1]), &a[i + 2]);
                if r.is_error() {
                    return r;
                }
                i += 3;
            }
            "setname" if i + 1 < a.len() => {
                if let Err(r) = set_name(ctx, &a[i + 1]) {
                    return r;
                }
                i += 2;
            }
            _ => {
                return Reply::err(format!(
                    "ERR Syntax error in HELLO option '{}'",
                    String::from_utf8_lossy(&a[i])
                ))
            }
        }
    }
    if ctx.conn.user.is_none() {
        return Reply::err("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time");
    }
    ctx.conn.proto = proto;
    let s = |k: &str, v: &str| (Reply::bulk(k.to_string()), Reply::bulk(v.to_string()));
    Reply::Map(vec![
        s("server", "redis"),
        s("version", REDIS_VERSION),
        (Reply::bulk("proto"), Reply::Integer(proto as i64)),
        (Reply::bulk("id"), Reply::Integer(ctx.conn.id as i64)),
        s("mode", "standalone"),
        s("role", "master"),
        (Reply::bulk("modules"), Reply::Array(vec![])),
    ])
}

/// `CLIENT LIST [TYPE type | ID client-id...]`: every connection, or those of one type
/// (all of them are `normal`: Strata has no replica, master or pub/sub connections), or
/// those with the ids given (in that order), a line each. As in Redis 7.0, one filter at
/// most.
fn client_list(ctx: &Ctx<'_>, filter: &[Bytes]) -> Reply {
    let only: Option<Vec<u64>> = match filter {
        [] => None,
        [t, kind] if t.eq_ignore_ascii_case(b"type") => match is_normal(kind) {
            Ok(true) => None,
            Ok(false) => Some(Vec::new()),
            Err(r) => return r,
        },
        [t, ids @ ..] if t.eq_ignore_ascii_case(b"id") && !ids.is_empty() => {
            let mut only = Vec::with_capacity(ids.len());
            for id in ids {
                match parse_int(id) {
                    Some(n) if n > 0 => only.push(n as u64),
                    _ => return Reply::err("ERR Invalid client ID"),
                }
            }
            Some(only)
        }
        _ => return syntax_error(),
    };
    let ids: Vec<u64> = match only {
        None => {
            let mut all: Vec<u64> = ctx.shared.clients.lock().keys().copied().collect();
            all.sort_unstable();
            all
        }
        // In the order given, an id named twice listed twice, as Redis does.
        Some(only) => only,
    };
    let text: String = ids
        .iter()
        .filter_map(|&id| client_line(ctx, id, "client|list"))
        .collect();
    Reply::Verbatim(text)
}

/// Whether client type `kind` (`CLIENT LIST TYPE`, `CLIENT KILL TYPE`) is `normal`, the
/// type of every Strata connection (it has no master, replica or pub/sub connections).
fn is_normal(kind: &[u8]) -> Result<bool, Reply> {
    match lower(kind).as_str() {
        "normal" => Ok(true),
        "master" | "replica" | "slave" | "pubsub" => Ok(false),
        _ => Err(Reply::err(format!(
            "ERR Unknown client type '{}'",
            String::from_utf8_lossy(kind)
        ))),
    }
}

/// Connection `id`'s line of `CLIENT LIST`; its `cmd` is its last command, or `running`
/// for the caller's own line (the command that asks, as Redis shows it; from a
/// transaction, `exec`, the count of its commands in `multi` and the flag `x`).
fn client_line(ctx: &Ctx<'_>, id: u64, running: &str) -> Option<String> {
    let clients = ctx.shared.clients.lock();
    let c = clients.get(&id)?;
    let age = c.created.elapsed().as_secs();
    let exec = ctx.conn.exec_commands.filter(|_| id == ctx.conn.id);
    let multi = exec.map_or(-1, |n| n as i64);
    let cmd = match c.last_cmd.load(std::sync::atomic::Ordering::Relaxed) {
        _ if exec.is_some() => "exec",
        _ if id == ctx.conn.id => running,
        0 => "NULL",
        i => ctx.commands.specs()[i - 1].name,
    };
    let flags = if c.unblock.waiting.load(Ordering::Relaxed) {
        "b"
    } else if exec.is_some() {
        "x"
    } else {
        "N"
    };
    Some(format!(
        "id={id} addr={} laddr={} fd=0 name={} age={age} idle=0 flags={flags} db={} sub=0 psub=0 ssub=0 multi={multi} qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem=0 tot-mem=0 events=r cmd={cmd} user={} redir=-1 resp={}\n",
        c.peer,
        c.peer.local(),
        c.name,
        c.db,
        c.user,
        c.proto,
    ))
}

/// `CLIENT KILL ip:port` (`OK`, or an error when no client has that address), or `CLIENT
/// KILL filter value...` (how many were closed): the connections that match every filter
/// given (`ID`, `TYPE`, `USER`, `ADDR`, `LADDR`), not this one unless `SKIPME no`. As in
/// Redis 7.0, a connection that closes itself gets its reply first.
fn client_kill(ctx: &mut Ctx<'_>, filters: &[Bytes]) -> Reply {
    // Closing other users' connections is the administrator's, as in Redis.
    if let Some((user, role)) = &ctx.conn.user {
        if *role != Role::Admin {
            return super::ctx::no_permission(user, "client|kill");
        }
    }
    let text = |b: &Bytes| String::from_utf8_lossy(b).into_owned();
    let mut id = None;
    let mut only_normal = true;
    let mut user = None;
    let mut addr = None;
    let mut laddr = None;
    let mut skip_me = true;
    match filters {
        [] => return wrong_args("client|kill"),
        [old] => {
            addr = Some(text(old));
            // The old form may close the caller.
            skip_me = false;
        }
        _ => {
            for pair in filters.chunks(2) {
                let [option, value] = pair else {
                    return syntax_error();
                };
                match lower(option).as_str() {
                    "id" => match parse_int(value) {
                        Some(n) if n > 0 => id = Some(n as u64),
                        _ => return Reply::err("ERR client-id should be greater than 0"),
                    },
                    "type" => match is_normal(value) {
                        Ok(normal) => only_normal = normal,
                        Err(r) => return r,
                    },
                    "user" => {
                        let name = text(value);
                        let known = name == "default"
                            || ctx.shared.cfg.read().users.iter().any(|u| u.name == name);
                        if !known {
                            return Reply::err(format!("ERR No such user '{name}'"));
                        }
                        user = Some(name);
                    }
                    "addr" => addr = Some(text(value)),
                    "laddr" => laddr = Some(text(value)),
                    "skipme" => match lower(value).as_str() {
                        "yes" => skip_me = true,
                        "no" => skip_me = false,
                        _ => return syntax_error(),
                    },
                    _ => return syntax_error(),
                }
            }
        }
    }
    let mut killed = 0;
    if only_normal {
        for (&cid, c) in ctx.shared.clients.lock().iter() {
            let hit = id.is_none_or(|id| id == cid)
                && user.as_ref().is_none_or(|u| *u == c.user)
                && addr.as_ref().is_none_or(|a| *a == c.peer.to_string())
                && laddr.as_ref().is_none_or(|a| *a == c.peer.local())
                && !(skip_me && cid == ctx.conn.id);
            if hit {
                c.killed.store(true, Ordering::Release);
                c.kill_wake.notify_one();
                killed += 1;
            }
        }
    }
    match filters {
        [_] if killed == 0 => Reply::err("ERR No such client"),
        [_] => Reply::ok(),
        _ => Reply::Integer(killed),
    }
}

/// Copies what `CLIENT LIST` shows of this connection (name, user, database, protocol)
/// to its entry, after a command changed one of them.
pub(crate) fn publish(ctx: &Ctx<'_>) {
    if let Some(c) = ctx.shared.clients.lock().get_mut(&ctx.conn.id) {
        c.name.clone_from(&ctx.conn.name);
        c.user = ctx
            .conn
            .user
            .as_ref()
            .map_or_else(|| "default".to_string(), |u| u.0.clone());
        c.db = ctx.conn.db;
        c.proto = ctx.conn.proto;
    }
}

fn client_reply(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let sub = lower(&a[1]);
    match sub.as_str() {
        "setname" if a.len() == 3 => match set_name(ctx, &a[2]) {
            Ok(()) => {
                publish(ctx);
                Reply::ok()
            }
            Err(r) => r,
        },
        "getname" if a.len() == 2 => {
            if ctx.conn.name.is_empty() {
                Reply::Null
            } else {
                Reply::bulk(ctx.conn.name.clone())
            }
        }
        "id" if a.len() == 2 => Reply::Integer(ctx.conn.id as i64),
        "info" if a.len() == 2 => {
            Reply::Verbatim(client_line(ctx, ctx.conn.id, "client|info").unwrap_or_default())
        }
        "list" => client_list(ctx, &a[2..]),
        "kill" => client_kill(ctx, &a[2..]),
        "unblock" if (3..=4).contains(&a.len()) => {
            let Some(id) = parse_int(&a[2]) else {
                return not_integer();
            };
            let as_error = match a.get(3).map(|m| lower(m)) {
                None => false,
                Some(m) if m == "timeout" => false,
                Some(m) if m == "error" => true,
                Some(_) => {
                    return Reply::err("ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR")
                }
            };
            let clients = ctx.shared.clients.lock();
            match clients.get(&(id as u64)) {
                Some(c) if c.unblock.waiting.load(Ordering::Relaxed) => {
                    c.unblock.as_error.store(as_error, Ordering::Relaxed);
                    c.unblock.notify.notify_one();
                    Reply::Integer(1)
                }
                _ => Reply::Integer(0),
            }
        }
        "setinfo" | "no-evict" | "no-touch" if a.len() >= 3 => Reply::ok(),
        _ => Reply::err(format!(
            "ERR unknown subcommand or wrong number of arguments for '{sub}'. Try CLIENT HELP."
        )),
    }
}
