//! The command table and dispatch: arity, authentication, roles, `MULTI` queueing and
//! metrics happen here, once, for every command.

mod keys;
mod kvc;
mod server;
mod strata;
mod strings;
mod txn;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use bytes::Bytes;
use strata_engine::Error;
use strata_resp::Reply;

use crate::auth::Role;
use crate::conn::Conn;
use crate::Shared;

pub(crate) const WRITE: u32 = 1;
pub(crate) const READ: u32 = 2;
pub(crate) const ADMIN: u32 = 4;
/// Allowed before authentication.
pub(crate) const NOAUTH: u32 = 8;
/// Runs immediately even inside `MULTI`.
pub(crate) const NOQUEUE: u32 = 16;
/// Runs while no other command runs (holds the server's gate for writing).
pub(crate) const EXCLUSIVE: u32 = 32;
pub(crate) const FAST: u32 = 64;
/// Connection commands: allowed to every role.
pub(crate) const CONN: u32 = 128;

/// One command: Redis's arity convention (negative = at least), flags and key positions.
pub(crate) struct Spec {
    pub(crate) name: &'static str,
    pub(crate) arity: i32,
    pub(crate) flags: u32,
    pub(crate) first_key: i32,
    pub(crate) last_key: i32,
    pub(crate) step: i32,
}

const fn c(
    name: &'static str,
    arity: i32,
    flags: u32,
    first_key: i32,
    last_key: i32,
    step: i32,
) -> Spec {
    Spec {
        name,
        arity,
        flags,
        first_key,
        last_key,
        step,
    }
}

pub(crate) static COMMANDS: &[Spec] = &[
    // Connection.
    c("ping", -1, CONN | FAST, 0, 0, 0),
    c("echo", 2, CONN | FAST, 0, 0, 0),
    c("hello", -1, CONN | NOAUTH | FAST, 0, 0, 0),
    c("auth", -2, CONN | NOAUTH | FAST, 0, 0, 0),
    c("select", 2, CONN | FAST, 0, 0, 0),
    c("quit", -1, CONN | NOAUTH | FAST | NOQUEUE, 0, 0, 0),
    c("reset", 1, CONN | NOAUTH | FAST | NOQUEUE, 0, 0, 0),
    c("client", -2, CONN, 0, 0, 0),
    c("command", -1, CONN, 0, 0, 0),
    // Strings.
    c("get", 2, READ | FAST, 1, 1, 1),
    c("set", -3, WRITE, 1, 1, 1),
    c("setnx", 3, WRITE | FAST, 1, 1, 1),
    c("setex", 4, WRITE, 1, 1, 1),
    c("psetex", 4, WRITE, 1, 1, 1),
    c("getex", -2, WRITE | FAST, 1, 1, 1),
    c("getdel", 2, WRITE | FAST, 1, 1, 1),
    c("getset", 3, WRITE | FAST, 1, 1, 1),
    c("mget", -2, READ | FAST, 1, -1, 1),
    c("mset", -3, WRITE | EXCLUSIVE, 1, -1, 2),
    c("msetnx", -3, WRITE | EXCLUSIVE, 1, -1, 2),
    c("strlen", 2, READ | FAST, 1, 1, 1),
    c("append", 3, WRITE, 1, 1, 1),
    c("getrange", 4, READ, 1, 1, 1),
    c("substr", 4, READ, 1, 1, 1),
    c("setrange", 4, WRITE, 1, 1, 1),
    c("incr", 2, WRITE | FAST, 1, 1, 1),
    c("decr", 2, WRITE | FAST, 1, 1, 1),
    c("incrby", 3, WRITE | FAST, 1, 1, 1),
    c("decrby", 3, WRITE | FAST, 1, 1, 1),
    c("incrbyfloat", 3, WRITE | FAST, 1, 1, 1),
    // Keys.
    c("del", -2, WRITE, 1, -1, 1),
    c("unlink", -2, WRITE | FAST, 1, -1, 1),
    c("exists", -2, READ | FAST, 1, -1, 1),
    c("expire", -3, WRITE | FAST, 1, 1, 1),
    c("pexpire", -3, WRITE | FAST, 1, 1, 1),
    c("expireat", -3, WRITE | FAST, 1, 1, 1),
    c("pexpireat", -3, WRITE | FAST, 1, 1, 1),
    c("expiretime", 2, READ | FAST, 1, 1, 1),
    c("pexpiretime", 2, READ | FAST, 1, 1, 1),
    c("ttl", 2, READ | FAST, 1, 1, 1),
    c("pttl", 2, READ | FAST, 1, 1, 1),
    c("persist", 2, WRITE | FAST, 1, 1, 1),
    c("type", 2, READ | FAST, 1, 1, 1),
    c("rename", 3, WRITE | EXCLUSIVE, 1, 2, 1),
    c("renamenx", 3, WRITE | EXCLUSIVE, 1, 2, 1),
    c("scan", -2, READ, 0, 0, 0),
    c("keys", 2, READ, 0, 0, 0),
    c("dbsize", 1, READ | FAST, 0, 0, 0),
    c("randomkey", 1, READ, 0, 0, 0),
    c("flushdb", -1, WRITE | ADMIN | EXCLUSIVE, 0, 0, 0),
    c("flushall", -1, WRITE | ADMIN | EXCLUSIVE, 0, 0, 0),
    // Transactions.
    c("multi", 1, CONN | FAST | NOQUEUE, 0, 0, 0),
    c("exec", 1, CONN | NOQUEUE | EXCLUSIVE, 0, 0, 0),
    c("discard", 1, CONN | FAST | NOQUEUE, 0, 0, 0),
    c("watch", -2, CONN | FAST | NOQUEUE, 1, -1, 1),
    c("unwatch", 1, CONN | FAST | NOQUEUE, 0, 0, 0),
    // Server.
    c("info", -1, READ, 0, 0, 0),
    c("config", -2, ADMIN, 0, 0, 0),
    c("debug", -2, ADMIN, 0, 0, 0),
    c("shutdown", -1, ADMIN | NOQUEUE, 0, 0, 0),
    c("time", 1, CONN | FAST, 0, 0, 0),
    c("wait", 3, CONN, 0, 0, 0),
    c("lastsave", 1, CONN | FAST, 0, 0, 0),
    // Strata's own.
    c("tier", 2, READ | FAST, 1, 1, 1),
    c("strata.stats", 1, READ, 0, 0, 0),
    c("pin", 2, WRITE | ADMIN, 0, 0, 0),
    c("unpin", 2, WRITE | ADMIN, 0, 0, 0),
    c("pins", 1, READ, 0, 0, 0),
    c("strata.backup", 2, ADMIN, 0, 0, 0),
    // The KV-cache pool (one round trip each).
    c("kvc.put", -4, WRITE, 0, 0, 0),
    c("kvc.get", -3, READ, 0, 0, 0),
    c("kvc.match", -3, READ, 0, 0, 0),
    c("kvc.locate", -3, READ, 0, 0, 0),
];

fn table() -> &'static HashMap<&'static str, usize> {
    static T: OnceLock<HashMap<&'static str, usize>> = OnceLock::new();
    T.get_or_init(|| {
        COMMANDS
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name, i))
            .collect()
    })
}

/// Finds a command by name, in any letter case.
pub(crate) fn lookup(name: &[u8]) -> Option<usize> {
    if name.len() > 32 {
        return None;
    }
    let mut lower = [0u8; 32];
    for (d, s) in lower.iter_mut().zip(name) {
        *d = s.to_ascii_lowercase();
    }
    let s = std::str::from_utf8(&lower[..name.len()]).ok()?;
    table().get(s).copied()
}

/// Whether this request must run alone (it holds the gate for writing).
pub(crate) fn is_exclusive(args: &[Bytes], conn: &Conn) -> bool {
    let Some(i) = args.first().and_then(|n| lookup(n)) else {
        return false;
    };
    let spec = &COMMANDS[i];
    // Inside MULTI most commands are only queued; EXEC itself is exclusive.
    if conn.multi.is_some() && spec.flags & NOQUEUE == 0 {
        return false;
    }
    spec.flags & EXCLUSIVE != 0
}

/// `ERR wrong number of arguments for 'x' command`.
pub(crate) fn wrong_args(name: &str) -> Reply {
    Reply::err(format!(
        "ERR wrong number of arguments for '{name}' command"
    ))
}

pub(crate) fn syntax_error() -> Reply {
    Reply::err("ERR syntax error")
}

pub(crate) fn not_integer() -> Reply {
    Reply::err("ERR value is not an integer or out of range")
}

/// Maps an engine error to a Redis error reply.
pub(crate) fn engine_error(e: &Error) -> Reply {
    match e {
        Error::NotInteger => not_integer(),
        Error::Overflow => Reply::err("ERR increment or decrement would overflow"),
        Error::Invalid(m) => Reply::err(format!("ERR {m}")),
        Error::ColdUnavailable(m) => Reply::err(format!("TRYAGAIN cold tier unavailable: {m}")),
        Error::Storage(m) => Reply::err(format!("ERR storage unavailable: {m}")),
        Error::Data(m) => Reply::err(format!("ERR data error: {m}")),
        Error::WarmFull(m) => Reply::err(format!("OOM {m}")),
        Error::DiskFull(m) => Reply::err(format!("ERR {m}")),
        Error::Closed => Reply::err("ERR server is shutting down"),
        Error::Poisoned(m) => Reply::err(format!(
            "MISCONF writes are refused because a WAL sync failed: {m}"
        )),
        Error::Internal(m) => Reply::err(format!("ERR internal error: {m}")),
    }
}

pub(crate) fn parse_int(b: &[u8]) -> Option<i64> {
    strata_engine::parse_i64(b)
}

/// Most commands one `MULTI` may queue.
const MULTI_QUEUED_MAX: usize = 100_000;

/// Context handed to command implementations.
pub(crate) struct Ctx<'a> {
    pub(crate) shared: &'a Arc<Shared>,
    pub(crate) conn: &'a mut Conn,
}

impl Ctx<'_> {
    /// The most bytes of values one reply may carry (`client-output-buffer-limit`).
    pub(crate) fn reply_bytes_max(&self) -> u64 {
        self.shared.cfg.read().client_output_buffer_limit
    }
}

fn unknown_command(args: &[Bytes]) -> Reply {
    let name = String::from_utf8_lossy(&args[0]);
    let rest: String = args[1..]
        .iter()
        .take(8)
        .map(|a| format!("'{}' ", String::from_utf8_lossy(a)))
        .collect();
    Reply::err(format!(
        "ERR unknown command '{name}', with args beginning with: {rest}"
    ))
}

fn role_allows(role: Role, flags: u32) -> bool {
    if flags & CONN != 0 {
        return true;
    }
    match role {
        Role::Admin => true,
        Role::ReadWrite => flags & ADMIN == 0,
        Role::ReadOnly => flags & (WRITE | ADMIN) == 0,
    }
}

/// Runs one request and returns its reply.
pub(crate) async fn execute(shared: &Arc<Shared>, conn: &mut Conn, args: Vec<Bytes>) -> Reply {
    if args.is_empty() {
        return Reply::Array(vec![]);
    }
    let Some(idx) = lookup(&args[0]) else {
        if conn.multi.is_some() {
            conn.multi_failed = true;
        }
        return unknown_command(&args);
    };
    let spec = &COMMANDS[idx];
    let n = args.len() as i32;
    if (spec.arity > 0 && n != spec.arity) || (spec.arity < 0 && n < -spec.arity) {
        if conn.multi.is_some() {
            conn.multi_failed = true;
        }
        return wrong_args(spec.name);
    }
    match &conn.user {
        None if spec.flags & NOAUTH == 0 => return Reply::err("NOAUTH Authentication required."),
        Some((user, role)) if !role_allows(*role, spec.flags) => {
            if conn.multi.is_some() {
                conn.multi_failed = true;
            }
            return Reply::err(format!(
                "NOPERM User {user} has no permissions to run the '{}' command",
                spec.name
            ));
        }
        _ => {}
    }
    if let Some(queue) = conn.multi.as_mut().filter(|_| spec.flags & NOQUEUE == 0) {
        // The queue lives until EXEC: it gets the query buffer's limit.
        let bytes: usize = args.iter().map(|a| a.len()).sum();
        let bytes_max = shared.cfg.read().client_query_buffer_limit as usize;
        if queue.len() >= MULTI_QUEUED_MAX || conn.multi_bytes + bytes > bytes_max {
            conn.multi_failed = true;
            return Reply::err(format!(
                "ERR MULTI queue full ({MULTI_QUEUED_MAX} commands or client-query-buffer-limit \
                 bytes); the transaction will be discarded"
            ));
        }
        conn.multi_bytes += bytes;
        queue.push(args);
        return Reply::Simple("QUEUED".into());
    }
    let start = Instant::now();
    let reply = dispatch(&mut Ctx { shared, conn }, idx, &args).await;
    shared
        .metrics
        .record(idx, start.elapsed(), reply.is_error());
    shared.total_commands.fetch_add(1, Ordering::Relaxed);
    reply
}

/// Runs a command already checked for arity, auth and queueing.
pub(crate) async fn dispatch(ctx: &mut Ctx<'_>, idx: usize, a: &[Bytes]) -> Reply {
    let name = COMMANDS[idx].name;
    if COMMANDS[idx].flags & WRITE != 0 {
        touch_keys(ctx, idx, a);
    }
    match name {
        "ping" | "echo" | "hello" | "auth" | "select" | "quit" | "reset" | "client" | "command"
        | "info" | "config" | "debug" | "shutdown" | "time" | "wait" | "lastsave" => {
            server::run(ctx, name, a).await
        }
        "multi" | "exec" | "discard" | "watch" | "unwatch" => txn::run(ctx, name, a).await,
        "tier" | "strata.stats" | "pin" | "unpin" | "pins" | "strata.backup" => {
            strata::run(ctx, name, a).await
        }
        "kvc.put" | "kvc.get" | "kvc.match" | "kvc.locate" => kvc::run(ctx, name, a).await,
        "del" | "unlink" | "exists" | "expire" | "pexpire" | "expireat" | "pexpireat"
        | "expiretime" | "pexpiretime" | "ttl" | "pttl" | "persist" | "type" | "rename"
        | "renamenx" | "scan" | "keys" | "dbsize" | "randomkey" | "flushdb" | "flushall" => {
            keys::run(ctx, name, a).await
        }
        _ => strings::run(ctx, name, a).await,
    }
}

/// Bumps the `WATCH` version of every key a write command names.
fn touch_keys(ctx: &Ctx<'_>, idx: usize, a: &[Bytes]) {
    let s = &COMMANDS[idx];
    if s.first_key <= 0 {
        return;
    }
    let last = if s.last_key < 0 {
        a.len() as i32 + s.last_key
    } else {
        s.last_key
    };
    let mut i = s.first_key;
    while i <= last && (i as usize) < a.len() {
        ctx.shared.watches.touch(&a[i as usize]);
        i += s.step.max(1);
    }
}
