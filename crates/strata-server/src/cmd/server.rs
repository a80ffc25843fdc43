//! Connection and server commands: PING, HELLO, AUTH, CLIENT, COMMAND, INFO, CONFIG, ...

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use strata_resp::Reply;

use super::{not_integer, parse_int, syntax_error, wrong_args, Ctx, COMMANDS};
use crate::auth::{constant_time_eq, Role};
use crate::conn::Peer;
use strata_engine::glob::glob_match;

/// The Redis version Strata answers to, for clients that check it.
pub(crate) const REDIS_VERSION: &str = "7.0.0";

fn lower(a: &[u8]) -> String {
    String::from_utf8_lossy(a).to_ascii_lowercase()
}

pub(crate) async fn run(ctx: &mut Ctx<'_>, name: &str, a: &[Bytes]) -> Reply {
    match name {
        "ping" => match a.len() {
            1 => Reply::Simple("PONG".into()),
            2 => Reply::Bulk(a[1].clone()),
            _ => wrong_args("ping"),
        },
        "echo" => Reply::Bulk(a[1].clone()),
        "hello" => hello(ctx, a),
        "auth" => match a.len() {
            2 => auth(ctx, None, &a[1]),
            3 => auth(ctx, Some(&a[1]), &a[2]),
            _ => syntax_error(),
        },
        "select" => match parse_int(&a[1]) {
            Some(0) => Reply::ok(),
            Some(_) => Reply::err("ERR DB index is out of range"),
            None => not_integer(),
        },
        "quit" => {
            ctx.conn.quit = true;
            Reply::ok()
        }
        "reset" => {
            ctx.conn.multi = None;
            ctx.conn.multi_failed = false;
            ctx.shared.watches.unwatch(&mut ctx.conn.watched);
            ctx.conn.proto = 2;
            ctx.conn.name.clear();
            let cfg = ctx.shared.cfg.read();
            let open = cfg.requirepass.is_empty() && cfg.users.is_empty();
            ctx.conn.user = open.then(|| ("default".to_string(), Role::Admin));
            Reply::Simple("RESET".into())
        }
        "client" => client(ctx, a),
        "command" => command(a),
        "info" => Reply::Verbatim(info(ctx, a)),
        "config" => config(ctx, a),
        "debug" => match lower(&a[1]).as_str() {
            "sleep" if a.len() == 3 => {
                let secs: f64 = std::str::from_utf8(&a[2])
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0.0);
                tokio::time::sleep(std::time::Duration::from_secs_f64(secs.clamp(0.0, 60.0))).await;
                Reply::ok()
            }
            _ => Reply::err(
                "ERR DEBUG subcommand not supported by Strata; only DEBUG SLEEP <seconds>",
            ),
        },
        "shutdown" => {
            tracing::info!(client = ctx.conn.id, "SHUTDOWN requested");
            ctx.shared.shutdown.send_replace(true);
            ctx.conn.quit = true;
            // Redis closes the connection without a reply; clients expect exactly that.
            Reply::NoReply
        }
        "time" => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            Reply::Array(vec![
                Reply::bulk(now.as_secs().to_string()),
                Reply::bulk(now.subsec_micros().to_string()),
            ])
        }
        "wait" => Reply::Integer(0),
        "lastsave" => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            Reply::Integer((now.as_secs() - ctx.shared.started.elapsed().as_secs()) as i64)
        }
        _ => Reply::err(format!("ERR unknown command '{name}'")),
    }
}

fn auth(ctx: &mut Ctx<'_>, user: Option<&Bytes>, pass: &Bytes) -> Reply {
    let cfg = ctx.shared.cfg.read();
    let ip = ctx.conn.peer.ip();
    if let Some(wait) = ctx
        .shared
        .auth_limiter
        .blocked(ip, cfg.auth_failures_per_minute_max)
    {
        ctx.shared
            .guard
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
            Reply::ok()
        }
        None => {
            ctx.shared.auth_limiter.failed(ip);
            ctx.shared
                .guard
                .auth_failures
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(client = ctx.conn.id, peer = %ctx.conn.peer, user, "authentication failed");
            Reply::err("WRONGPASS invalid username-password pair or user is disabled.")
        }
    }
}

fn hello(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
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
                let r = auth(ctx, Some(&a[i + 1]), &a[i + 2]);
                if r.is_error() {
                    return r;
                }
                i += 3;
            }
            "setname" if i + 1 < a.len() => {
                ctx.conn.name = String::from_utf8_lossy(&a[i + 1]).into_owned();
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

fn client_line(ctx: &Ctx<'_>, id: u64) -> Option<String> {
    let clients = ctx.shared.clients.lock();
    let c = clients.get(&id)?;
    let age = c.created.elapsed().as_secs();
    let me = id == ctx.conn.id;
    let (resp, user) = if me {
        (
            ctx.conn.proto,
            ctx.conn
                .user
                .as_ref()
                .map_or("default".to_string(), |u| u.0.clone()),
        )
    } else {
        (2, "default".to_string())
    };
    let name = if me {
        ctx.conn.name.clone()
    } else {
        c.name.clone()
    };
    let cmd = if c.last_cmd.is_empty() {
        "NULL"
    } else {
        &c.last_cmd
    };
    Some(format!(
        "id={id} addr={} laddr={} fd=0 name={name} age={age} idle=0 flags=N db=0 sub=0 psub=0 ssub=0 multi=-1 qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem=0 tot-mem=0 events=r cmd={cmd} user={user} redir=-1 resp={resp}\n",
        c.peer,
        match &c.peer {
            Peer::Tcp(_) => "127.0.0.1:0".to_string(),
            unix => unix.to_string(),
        }
    ))
}

fn client(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let sub = lower(&a[1]);
    match sub.as_str() {
        "setname" if a.len() == 3 => {
            if a[2].iter().any(|&b| b <= b' ' || b > b'~') {
                return Reply::err(
                    "ERR Client names cannot contain spaces, newlines or special characters.",
                );
            }
            ctx.conn.name = String::from_utf8_lossy(&a[2]).into_owned();
            if let Some(c) = ctx.shared.clients.lock().get_mut(&ctx.conn.id) {
                c.name = ctx.conn.name.clone();
            }
            Reply::ok()
        }
        "getname" if a.len() == 2 => {
            if ctx.conn.name.is_empty() {
                Reply::Null
            } else {
                Reply::bulk(ctx.conn.name.clone())
            }
        }
        "id" if a.len() == 2 => Reply::Integer(ctx.conn.id as i64),
        "info" if a.len() == 2 => {
            Reply::Verbatim(client_line(ctx, ctx.conn.id).unwrap_or_default())
        }
        "list" => {
            let ids: Vec<u64> = {
                let mut v: Vec<u64> = ctx.shared.clients.lock().keys().copied().collect();
                v.sort();
                v
            };
            let text: String = ids.iter().filter_map(|&id| client_line(ctx, id)).collect();
            Reply::Verbatim(text)
        }
        "kill" if a.len() >= 3 => {
            let mut by_id = None;
            let mut by_addr = None;
            if a.len() == 3 {
                by_addr = Some(String::from_utf8_lossy(&a[2]).into_owned());
            } else {
                for pair in a[2..].chunks(2) {
                    if pair.len() != 2 {
                        return syntax_error();
                    }
                    match lower(&pair[0]).as_str() {
                        "id" => match parse_int(&pair[1]) {
                            Some(n) => by_id = Some(n as u64),
                            None => return not_integer(),
                        },
                        "addr" => by_addr = Some(String::from_utf8_lossy(&pair[1]).into_owned()),
                        "skipme" | "type" | "user" | "laddr" | "maxage" => {}
                        _ => return syntax_error(),
                    }
                }
            }
            let mut killed = 0;
            for (id, c) in ctx.shared.clients.lock().iter() {
                let hit = by_id.is_some_and(|b| b == *id)
                    || by_addr.as_ref().is_some_and(|b| *b == c.peer.to_string());
                if hit {
                    c.killed.store(true, Ordering::Release);
                    c.kill_wake.notify_one();
                    killed += 1;
                }
            }
            if a.len() == 3 {
                if killed == 0 {
                    return Reply::err("ERR No such client");
                }
                return Reply::ok();
            }
            Reply::Integer(killed)
        }
        "setinfo" | "no-evict" | "no-touch" if a.len() >= 3 => Reply::ok(),
        _ => Reply::err(format!(
            "ERR unknown subcommand or wrong number of arguments for '{sub}'. Try CLIENT HELP."
        )),
    }
}

fn command_info(i: usize) -> Reply {
    let s = &COMMANDS[i];
    let mut flags = Vec::new();
    if s.flags & super::WRITE != 0 {
        flags.push(Reply::Simple("write".into()));
    }
    if s.flags & super::READ != 0 {
        flags.push(Reply::Simple("readonly".into()));
    }
    if s.flags & super::ADMIN != 0 {
        flags.push(Reply::Simple("admin".into()));
    }
    if s.flags & super::FAST != 0 {
        flags.push(Reply::Simple("fast".into()));
    }
    Reply::Array(vec![
        Reply::bulk(s.name),
        Reply::Integer(s.arity as i64),
        Reply::Set(flags),
        Reply::Integer(s.first_key as i64),
        Reply::Integer(s.last_key as i64),
        Reply::Integer(s.step as i64),
        Reply::Set(vec![]),
        Reply::Set(vec![]),
        Reply::Array(vec![]),
        Reply::Array(vec![]),
    ])
}

fn command(a: &[Bytes]) -> Reply {
    if a.len() == 1 {
        return Reply::Array((0..COMMANDS.len()).map(command_info).collect());
    }
    match lower(&a[1]).as_str() {
        "count" => Reply::Integer(COMMANDS.len() as i64),
        "info" => Reply::Array(
            a[2..]
                .iter()
                .map(|n| super::lookup(n).map_or(Reply::Null, command_info))
                .collect(),
        ),
        "docs" => Reply::Map(vec![]),
        "list" => Reply::Array(COMMANDS.iter().map(|s| Reply::bulk(s.name)).collect()),
        sub => Reply::err(format!("ERR unknown subcommand '{sub}'. Try COMMAND HELP.")),
    }
}

fn info(ctx: &Ctx<'_>, a: &[Bytes]) -> String {
    let want: Vec<String> = a[1..].iter().map(|s| lower(s)).collect();
    let all = want.is_empty()
        || want
            .iter()
            .any(|w| w == "all" || w == "everything" || w == "default");
    let show = |s: &str| all || want.iter().any(|w| w == s);
    let sh = ctx.shared;
    let st = sh.engine.stats();
    let mut o = String::new();
    if show("server") {
        let _ = write!(
            o,
            "# Server\r\nredis_version:{REDIS_VERSION}\r\nstrata_version:{}\r\nredis_mode:standalone\r\nos:{}\r\narch_bits:64\r\nprocess_id:{}\r\ntcp_port:0\r\nuptime_in_seconds:{}\r\n\r\n",
            env!("CARGO_PKG_VERSION"),
            std::env::consts::OS,
            std::process::id(),
            sh.started.elapsed().as_secs()
        );
    }
    if show("clients") {
        let cfg = sh.cfg.read();
        let _ = write!(
            o,
            "# Clients\r\nconnected_clients:{}\r\nmaxclients:{}\r\nblocked_clients:0\r\n\r\n",
            sh.clients.lock().len(),
            cfg.maxclients
        );
    }
    if show("memory") {
        let _ = write!(
            o,
            "# Memory\r\nused_memory:{}\r\nmaxmemory:{}\r\nmaxmemory_policy:strata-tiered\r\n\r\n",
            st.hot.bytes, st.hot.bytes_max
        );
    }
    if show("stats") {
        let _ = write!(
            o,
            "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\nrejected_connections:{}\r\nkeyspace_hits:{}\r\nkeyspace_misses:{}\r\nexpired_keys:{}\r\nevicted_keys:0\r\nauth_failures:{}\r\nauth_refused:{}\r\nprotected_mode_denied:{}\r\nclients_cut_off_slow_request:{}\r\nclients_cut_off_not_reading:{}\r\nclients_cut_off_protocol_error:{}\r\n\r\n",
            sh.total_connections.load(Ordering::Relaxed),
            sh.total_commands.load(Ordering::Relaxed),
            sh.rejected_connections.load(Ordering::Relaxed),
            st.hot.hits + st.warm.hits + st.cold.hits,
            st.misses,
            st.expired,
            sh.guard.auth_failures.load(Ordering::Relaxed),
            sh.guard.auth_refused.load(Ordering::Relaxed),
            sh.guard.protected_denied.load(Ordering::Relaxed),
            sh.guard.slow_requests.load(Ordering::Relaxed),
            sh.guard.stalled_writes.load(Ordering::Relaxed),
            sh.guard.protocol_errors.load(Ordering::Relaxed),
        );
    }
    if show("commandstats") {
        o.push_str("# Commandstats\r\n");
        for (name, calls, errors, us) in sh.metrics.command_totals() {
            let per = if calls > 0 {
                us as f64 / calls as f64
            } else {
                0.0
            };
            let _ = write!(o, "cmdstat_{name}:calls={calls},usec={us},usec_per_call={per:.2},rejected_calls=0,failed_calls={errors}\r\n");
        }
        o.push_str("\r\n");
    }
    if show("keyspace") {
        o.push_str("# Keyspace\r\n");
        let keys = st.warm.entries + st.cold.entries;
        if keys > 0 {
            let _ = write!(o, "db0:keys={keys},expires=0,avg_ttl=0\r\n");
        }
        o.push_str("\r\n");
    }
    if show("persistence") {
        let b = sh.backup.lock();
        let _ = write!(
            o,
            "# Persistence\r\nloading:0\r\nbackup_in_progress:{}\r\nbackup_url:{}\r\nbackup_done_bytes:{}\r\nbackup_total_bytes:{}\r\nlast_backup_status:{}\r\n\r\n",
            b.running as u8,
            b.url,
            b.done_bytes,
            b.total_bytes,
            if b.status.is_empty() { "none" } else { &b.status }
        );
    }
    if show("strata") {
        let c = &st.cold_requests;
        let _ = write!(
            o,
            "# Strata\r\nhot_entries:{}\r\nhot_bytes:{}\r\nhot_bytes_max:{}\r\nhot_hits:{}\r\nwarm_entries:{}\r\nwarm_bytes:{}\r\nwarm_bytes_max:{}\r\nwarm_hits:{}\r\ncold_entries:{}\r\ncold_bytes:{}\r\ncold_hits:{}\r\nmisses:{}\r\ndemotions:{}\r\npromotions:{}\r\nreturns_to_warm:{}\r\nprefetches:{}\r\nprefetch_used:{}\r\nprefetch_precision:{:.3}\r\nprefetch_coverage:{:.3}\r\nchecksum_errors:{}\r\nwal_bytes_dropped:{}\r\nsegments_written:{}\r\nsegments_deleted:{}\r\nvlog_files:{}\r\nvlog_bytes:{}\r\nvlog_files_collected:{}\r\nobject_store_gets:{}\r\nobject_store_puts:{}\r\nobject_store_deletes:{}\r\nobject_store_errors:{}\r\nobject_store_read_waits:{}\r\ncold_url:{}\r\ndurability:{}\r\n\r\n",
            st.hot.entries, st.hot.bytes, st.hot.bytes_max, st.hot.hits, st.warm.entries, st.warm.bytes, st.warm.bytes_max,
            st.warm.hits, st.cold.entries, st.cold.bytes, st.cold.hits, st.misses, st.demotions, st.promotions, st.returns_to_warm,
            st.prefetch_issued, st.prefetch_used,
            st.prefetch_precision(),
            st.prefetch_coverage(),
            st.checksum_errors, st.wal_bytes_dropped, st.segments_written, st.segments_deleted, st.vlog_files, st.vlog_bytes, st.vlog_files_collected, c.gets, c.puts, c.deletes, c.errors, c.read_waits, st.cold_url, st.durability
        );
    }
    o
}

/// The parameters `CONFIG GET` knows, with their current values.
fn config_params(ctx: &Ctx<'_>) -> Vec<(&'static str, String)> {
    let cfg = ctx.shared.cfg.read();
    let st = ctx.shared.engine.stats();
    vec![
        ("maxclients", cfg.maxclients.to_string()),
        ("timeout", cfg.timeout_secs.to_string()),
        ("requirepass", cfg.requirepass.clone()),
        (
            "protected-mode",
            if cfg.protected_mode { "yes" } else { "no" }.into(),
        ),
        ("proto-max-bulk-len", cfg.proto_max_bulk_len.to_string()),
        (
            "client-query-buffer-limit",
            cfg.client_query_buffer_limit.to_string(),
        ),
        (
            "client-output-buffer-limit",
            format!(
                "normal {0} 0 0 replica {0} 0 0 pubsub 33554432 8388608 60",
                cfg.client_output_buffer_limit
            ),
        ),
        ("maxmemory", st.hot.bytes_max.to_string()),
        ("maxmemory-policy", "strata-tiered".into()),
        ("save", String::new()),
        ("appendonly", "no".into()),
        ("appendfsync", st.durability.clone()),
        ("databases", "1".into()),
        ("cluster-enabled", "no".into()),
    ]
}

fn config(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    match lower(&a[1]).as_str() {
        "get" if a.len() >= 3 => {
            let params = config_params(ctx);
            let mut out = Vec::new();
            for (k, v) in params {
                if a[2..]
                    .iter()
                    .any(|p| glob_match(&p.to_ascii_lowercase(), k.as_bytes()))
                {
                    out.push((Reply::bulk(k), Reply::bulk(v)));
                }
            }
            Reply::Map(out)
        }
        "set" if a.len() >= 4 && a.len().is_multiple_of(2) => {
            let mut cfg = ctx.shared.cfg.write();
            for pair in a[2..].chunks(2) {
                let key = lower(&pair[0]);
                let val = String::from_utf8_lossy(&pair[1]).into_owned();
                let int = || val.parse::<u64>().ok();
                let bad = || {
                    Reply::err(format!("ERR CONFIG SET failed (possibly related to argument '{key}') - argument couldn't be parsed into an integer"))
                };
                match key.as_str() {
                    "maxclients" => {
                        cfg.maxclients = match int() {
                            Some(n) if n > 0 => n,
                            _ => return bad(),
                        }
                    }
                    "timeout" => {
                        cfg.timeout_secs = match int() {
                            Some(n) => n,
                            None => return bad(),
                        }
                    }
                    "requirepass" => cfg.requirepass = val,
                    "protected-mode" => {
                        cfg.protected_mode = match val.to_ascii_lowercase().as_str() {
                            "yes" => true,
                            "no" => false,
                            _ => return Reply::err(format!("ERR CONFIG SET failed (possibly related to argument '{key}') - argument must be 'yes' or 'no'")),
                        }
                    }
                    "proto-max-bulk-len" => {
                        cfg.proto_max_bulk_len = match int() {
                            Some(n) if n >= 1024 => n.min(512 << 20),
                            _ => return bad(),
                        }
                    }
                    "client-query-buffer-limit" => {
                        cfg.client_query_buffer_limit = match int() {
                            Some(n) if n >= 1 << 20 => n,
                            _ => return bad(),
                        }
                    }
                    "client-output-buffer-limit" => {
                        cfg.client_output_buffer_limit = match output_limit(&val) {
                            Some(n) => n,
                            None => return Reply::err(format!("ERR CONFIG SET failed (possibly related to argument '{key}') - give a byte count of at least 1048576, or 'normal <hard> <soft> <seconds>' with such a hard limit")),
                        }
                    }
                    "save" | "appendonly" => {}
                    _ => {
                        return Reply::err(format!(
                            "ERR Unknown option or number of arguments for CONFIG SET - '{key}'"
                        ))
                    }
                }
            }
            Reply::ok()
        }
        "resetstat" => Reply::ok(),
        "rewrite" => {
            Reply::err("ERR CONFIG REWRITE is not supported; edit the TOML configuration file")
        }
        sub => Reply::err(format!(
            "ERR unknown subcommand or wrong number of arguments for '{sub}'. Try CONFIG HELP."
        )),
    }
}

/// The reply limit a `CONFIG SET client-output-buffer-limit` asks for: a byte count, or
/// Redis's `normal <hard> <soft> <seconds>` form (other classes, which Strata has no
/// clients of, are ignored). At least 1 MiB: every reply must fit one large value's worth.
fn output_limit(val: &str) -> Option<u64> {
    let words: Vec<&str> = val.split_whitespace().collect();
    let hard = match words.as_slice() {
        [n] => n.parse::<u64>().ok()?,
        _ => {
            let at = words
                .chunks(4)
                .find(|c| c.len() == 4 && c[0].eq_ignore_ascii_case("normal"))?;
            at[1].parse::<u64>().ok()?
        }
    };
    (hard >= 1 << 20).then_some(hard)
}
