//! Server commands: COMMAND, CONFIG, DEBUG, SHUTDOWN, TIME, WAIT, SAVE, BGSAVE, LASTSAVE.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use strata_engine::glob::glob_match;
use strata_resp::Reply;

use super::ctx::{lower, not_integer, parse_int, Commands, Ctx};

pub(crate) async fn command(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    command_reply(ctx.commands, a)
}

pub(crate) async fn config(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    config_reply(ctx, a)
}

/// Longest `DEBUG SLEEP`, in seconds.
const DEBUG_SLEEP_SECS_MAX: f64 = 60.0;

pub(crate) async fn debug(_ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    match lower(&a[1]).as_str() {
        "sleep" if a.len() == 3 => {
            let secs: f64 = std::str::from_utf8(&a[2])
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0.0);
            let secs = secs.clamp(0.0, DEBUG_SLEEP_SECS_MAX);
            tokio::time::sleep(std::time::Duration::from_secs_f64(secs)).await;
            Reply::ok()
        }
        _ => Reply::err("ERR DEBUG subcommand not supported by Strata; only DEBUG SLEEP <seconds>"),
    }
}

pub(crate) async fn shutdown(ctx: &mut Ctx<'_>, _a: &[Bytes]) -> Reply {
    tracing::info!(client = ctx.conn.id, "SHUTDOWN requested");
    // A script past the busy threshold stops now, written or not (`SHUTDOWN NOSAVE`).
    ctx.shared.script.stop();
    ctx.shared.shutdown.send_replace(true);
    ctx.conn.quit = true;
    // Redis closes the connection without a reply; clients expect exactly that.
    Reply::NoReply
}

fn unix_now() -> std::time::Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

pub(crate) async fn time(_ctx: &mut Ctx<'_>, _a: &[Bytes]) -> Reply {
    let now = unix_now();
    Reply::Array(vec![
        Reply::bulk(now.as_secs().to_string()),
        Reply::bulk(now.subsec_micros().to_string()),
    ])
}

/// Longest `WAIT` (its timeout of 0 means as long as it takes: here, this long). It holds
/// the server's gate for reading meanwhile, as every command does, so commands that run
/// alone wait for it; a bucket log that answers ships within its `bucket_flush_ms` or
/// `bucket_lag_ms_max`.
const WAIT_MS_MAX: u64 = 10_000;

/// `WAIT numreplicas timeout`: the bucket log stands for a replica. 1 once it holds every
/// write acknowledged before the call (within `timeout` ms; 0: as long as it takes), 0 if
/// it did not in time, or for a node that ships to no bucket (as a Redis without replicas
/// answers).
pub(crate) async fn wait(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let (Some(wanted), Some(ms)) = (parse_int(&a[1]), parse_int(&a[2])) else {
        return not_integer();
    };
    if ms < 0 {
        return Reply::err("ERR timeout is negative");
    }
    let ms = match (wanted, ms) {
        (..=0, _) => 0,
        (_, 0) => WAIT_MS_MAX,
        (_, ms) => (ms as u64).min(WAIT_MS_MAX),
    };
    let held = ctx
        .shared
        .engine
        .wait_bucket(std::time::Duration::from_millis(ms))
        .await;
    Reply::Integer(held as i64)
}

/// `LASTSAVE`: when the last `SAVE` finished, or, before any, when the server started
/// (what it held then was on disk).
pub(crate) async fn lastsave(ctx: &mut Ctx<'_>, _a: &[Bytes]) -> Reply {
    let started = unix_now().as_secs() - ctx.shared.started.elapsed().as_secs();
    let saved = ctx.shared.last_save_secs.load(Ordering::Relaxed);
    Reply::Integer(started.max(saved) as i64)
}

/// `SAVE`: returns once every write acknowledged before it is durable, whatever
/// `durability` says (Strata writes no snapshot file: its tiers are its files).
pub(crate) async fn save(ctx: &mut Ctx<'_>, _a: &[Bytes]) -> Reply {
    let Some(turn) = SaveTurn::take(ctx.shared) else {
        return save_in_progress();
    };
    match turn.save().await {
        Ok(()) => Reply::ok(),
        Err(e) => super::ctx::engine_error(&e),
    }
}

/// `BGSAVE [SCHEDULE]`: `SAVE` without waiting for it.
pub(crate) async fn bgsave(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    if a.len() > 2 || a.get(1).is_some_and(|o| lower(o) != "schedule") {
        return super::ctx::syntax_error();
    }
    let Some(turn) = SaveTurn::take(ctx.shared) else {
        return save_in_progress();
    };
    tokio::spawn(async move {
        if let Err(e) = turn.save().await {
            tracing::warn!(error = %e, "BGSAVE failed");
        }
    });
    Reply::Simple("Background saving started".into())
}

fn save_in_progress() -> Reply {
    Reply::err("ERR Background save already in progress")
}

/// The one `SAVE` or `BGSAVE` that runs at a time (as Redis has one): taken, or refused
/// while another runs; given back when dropped.
struct SaveTurn(std::sync::Arc<crate::shared::Shared>);

impl SaveTurn {
    fn take(shared: &std::sync::Arc<crate::shared::Shared>) -> Option<SaveTurn> {
        let taken = shared.saving.swap(true, Ordering::AcqRel);
        (!taken).then(|| SaveTurn(std::sync::Arc::clone(shared)))
    }

    async fn save(self) -> strata_engine::Result<()> {
        self.0.engine.save().await?;
        self.0
            .last_save_secs
            .store(unix_now().as_secs(), Ordering::Relaxed);
        Ok(())
    }
}

impl Drop for SaveTurn {
    fn drop(&mut self) {
        self.0.saving.store(false, Ordering::Release);
    }
}

/// The command a subcommand is, for `COMMAND INFO` and `COMMAND LIST`: its own name, arity
/// and flags; its container's group, key positions and handler.
fn sub_spec(container: &super::ctx::Spec, sub: &super::docs::Sub) -> super::ctx::Spec {
    super::ctx::Spec {
        name: sub.name,
        group: container.group,
        arity: sub.arity(),
        flags: sub.flags,
        first_key: container.first_key,
        last_key: container.last_key,
        step: container.step,
        run: container.run,
    }
}

/// `COMMAND INFO`'s entry of `s`: Redis's ten fields, the last its subcommands' entries.
pub(super) fn command_info(s: &super::ctx::Spec) -> Reply {
    let mut flags = Vec::new();
    if s.flags & super::ctx::WRITE != 0 {
        flags.push(Reply::Simple("write".into()));
    }
    if s.flags & super::ctx::READ != 0 {
        flags.push(Reply::Simple("readonly".into()));
    }
    if s.flags & super::ctx::ADMIN != 0 {
        flags.push(Reply::Simple("admin".into()));
    }
    if s.flags & super::ctx::FAST != 0 {
        flags.push(Reply::Simple("fast".into()));
    }
    if s.flags & super::ctx::NOSCRIPT != 0 {
        flags.push(Reply::Simple("noscript".into()));
    }
    if s.flags & super::ctx::NOMULTI != 0 {
        flags.push(Reply::Simple("no_multi".into()));
    }
    if s.flags & super::ctx::BLOCKING != 0 {
        flags.push(Reply::Simple("blocking".into()));
    }
    if super::spec::movable_keys(s) {
        flags.push(Reply::Simple("movablekeys".into()));
    }
    Reply::Array(vec![
        Reply::bulk(s.name),
        Reply::Integer(s.arity as i64),
        Reply::Set(flags),
        Reply::Integer(s.first_key as i64),
        Reply::Integer(s.last_key as i64),
        Reply::Integer(s.step as i64),
        Reply::Set(
            acl_categories(s)
                .map(|c| Reply::Simple(format!("@{c}")))
                .collect(),
        ),
        Reply::Set(vec![]),
        Reply::Array(vec![]),
        Reply::Array(
            super::docs::subcommands(s.name)
                .map(|sub| command_info(&sub_spec(s, &sub)))
                .collect(),
        ),
    ])
}

/// `COMMAND INFO`'s entry of the command or subcommand (`client|kill`) `name` names; nil
/// for neither.
fn info_of(commands: &dyn Commands, name: &[u8]) -> Reply {
    if let Some(i) = commands.lookup(name) {
        return command_info(&commands.specs()[i]);
    }
    let sub = super::docs::subcommand(name);
    sub.and_then(|sub| {
        let (container, _) = sub.name.split_once('|')?;
        let s = &commands.specs()[commands.lookup(container.as_bytes())?];
        Some(command_info(&sub_spec(s, &sub)))
    })
    .unwrap_or(Reply::Null)
}

/// Redis's ACL categories, in the order `COMMAND INFO` lists them.
const ACL_CATEGORIES: [&str; 21] = [
    "keyspace",
    "read",
    "write",
    "set",
    "sortedset",
    "list",
    "hash",
    "string",
    "bitmap",
    "hyperloglog",
    "geo",
    "stream",
    "pubsub",
    "admin",
    "fast",
    "slow",
    "blocking",
    "dangerous",
    "connection",
    "transaction",
    "scripting",
];

/// The ACL categories of command or subcommand `s` (`COMMAND INFO`, `COMMAND LIST
/// FILTERBY ACLCAT`): Strata has no ACL rules of its own, so they follow from its flags and
/// its group: its type's category, `read`/`write` (not for scripts, whose calls say; a
/// `FUNCTION` subcommand that changes the libraries is `write`), `fast` or else `slow`,
/// `admin` and `dangerous` for the administrator's commands, `blocking`, and the group's
/// (`keyspace` for the generic commands and the database-wide ones, `connection` (also
/// `COMMAND` and its subcommands), `transaction`, `scripting`). A command with subcommands
/// is only `slow` (and `COMMAND` `connection`), as in Redis. Where Redis's own differ from
/// these rules, [`CATEGORY_EXCEPTIONS`] says so.
pub(super) fn acl_categories(s: &super::ctx::Spec) -> impl Iterator<Item = &'static str> + '_ {
    let (added, removed) = CATEGORY_EXCEPTIONS
        .iter()
        .find(|(name, ..)| *name == s.name)
        .map_or((&[][..], &[][..]), |&(_, added, removed)| (added, removed));
    let script = s.group == "scripting" && !s.name.contains('|');
    let flag = move |f: u32| s.flags & f != 0;
    let container = flag(super::ctx::CONTAINER);
    // SORT reads lists, sets and sorted sets.
    let sorts = ["sort", "sort_ro"].contains(&s.name);
    let keyspace = (s.group == "generic" && s.name != "wait" && !sorts)
        || ["flushdb", "flushall", "dbsize", "swapdb"].contains(&s.name);
    let of_group =
        move |g: &str| s.group == g || sorts && ["set", "sorted-set", "list"].contains(&g);
    ACL_CATEGORIES.into_iter().filter(move |&c| match c {
        _ if removed.contains(&c) => false,
        _ if added.contains(&c) => true,
        "connection" if s.name.starts_with("command|") => true,
        _ if container => c == "slow",
        "keyspace" => keyspace,
        "read" => flag(super::ctx::READ) && !script,
        "write" => flag(super::ctx::WRITE) && !script,
        "set" => of_group("set"),
        "sortedset" => of_group("sorted-set"),
        "list" => of_group("list"),
        "hash" => of_group("hash"),
        "string" => of_group("string"),
        "bitmap" => of_group("bitmap"),
        "admin" | "dangerous" => flag(super::ctx::ADMIN),
        "fast" => flag(super::ctx::FAST),
        "slow" => !flag(super::ctx::FAST),
        "blocking" => flag(super::ctx::BLOCKING),
        "connection" => of_group("connection") || s.name == "wait",
        "transaction" => of_group("transactions"),
        "scripting" => of_group("scripting"),
        _ => false,
    })
}

/// The commands whose ACL categories in redis-server 7.0.15 are not what [`acl_categories`]'
/// rules give: the name, the categories to add and those to leave out. (`FLUSHALL` and
/// `FLUSHDB` are `admin` in Strata's roles, not in Redis's categories.)
const CATEGORY_EXCEPTIONS: &[(&str, &[&str], &[&str])] = &[
    ("command", &["connection"], &[]),
    ("asking", &["connection"], &[]),
    ("readonly", &["connection"], &[]),
    ("readwrite", &["connection"], &[]),
    ("lastsave", &["admin", "dangerous"], &[]),
    ("info", &["dangerous"], &["read"]),
    ("keys", &["dangerous"], &[]),
    ("restore", &["dangerous"], &[]),
    ("sort", &["dangerous"], &[]),
    ("sort_ro", &["dangerous"], &[]),
    ("swapdb", &["dangerous"], &[]),
    ("flushall", &[], &["admin"]),
    ("flushdb", &[], &["admin"]),
];

/// `COMMAND LIST [FILTERBY MODULE name | ACLCAT category | PATTERN pattern]`: the names of
/// the commands and their subcommands (`client|kill`), all of them or those the filter
/// keeps. Strata loads no modules, so `MODULE` keeps none; a subcommand is kept by
/// its own categories; an unknown category keeps none, as in Redis.
pub(super) fn command_list(commands: &dyn Commands, filter: &[Bytes]) -> Reply {
    // Every command, and each subcommand as the command it is.
    let specs = commands.specs().iter().flat_map(|s| {
        std::iter::once(*s)
            .chain(super::docs::subcommands(s.name).map(move |sub| sub_spec(s, &sub)))
    });
    enum Keep {
        All,
        Category(String),
        Matching(Vec<u8>),
        None,
    }
    let keep = match filter {
        [] => Keep::All,
        [by, kind, value] if by.eq_ignore_ascii_case(b"filterby") => match lower(kind).as_str() {
            "module" => Keep::None,
            "aclcat" => Keep::Category(lower(value)),
            "pattern" => Keep::Matching(lower(value).into_bytes()),
            _ => return super::ctx::syntax_error(),
        },
        _ => return super::ctx::syntax_error(),
    };
    Reply::Array(
        specs
            .filter(|s| match &keep {
                Keep::All => true,
                Keep::Category(cat) => acl_categories(s).any(|c| c == cat),
                Keep::Matching(pattern) => glob_match(pattern, s.name.as_bytes()),
                Keep::None => false,
            })
            .map(|s| Reply::bulk(s.name))
            .collect(),
    )
}

fn command_reply(commands: &dyn Commands, a: &[Bytes]) -> Reply {
    let specs = commands.specs();
    if a.len() == 1 {
        return Reply::Array(specs.iter().map(command_info).collect());
    }
    match lower(&a[1]).as_str() {
        "count" => Reply::Integer(specs.len() as i64),
        "info" => Reply::Array(a[2..].iter().map(|n| info_of(commands, n)).collect()),
        "docs" => super::docs::docs(commands, &a[2..]),
        "list" => command_list(commands, &a[2..]),
        "getkeys" if a.len() >= 3 => getkeys(commands, &a[2..]),
        sub => Reply::err(format!("ERR unknown subcommand '{sub}'. Try COMMAND HELP.")),
    }
}

/// `COMMAND GETKEYS cmd args...`: the keys a command names (scripts and functions: the
/// `numkeys` that follow their name).
fn getkeys(commands: &dyn Commands, cmd: &[Bytes]) -> Reply {
    let Some(i) = commands.lookup(&cmd[0]) else {
        return Reply::err("ERR Invalid command specified");
    };
    let s = &commands.specs()[i];
    if !s.accepts(cmd.len()) {
        return Reply::err("ERR Invalid number of arguments specified for command");
    }
    let Ok(at) = super::spec::key_positions(s, cmd) else {
        return Reply::err("ERR Invalid arguments specified for command");
    };
    let keys: Vec<Bytes> = at.into_iter().map(|i| cmd[i].clone()).collect();
    if keys.is_empty() {
        return Reply::err("ERR The command has no key arguments");
    }
    Reply::Array(keys.into_iter().map(Reply::Bulk).collect())
}

/// Redis's thresholds between its encodings of small and large values, with Redis's
/// defaults. Strata keeps one encoding per kind, so they change nothing: `CONFIG GET` and
/// `CONFIG SET` accept them (as integers) so that tools and tests written for Redis run.
pub(crate) const ENCODING_PARAMS: &[(&str, i64)] = &[
    ("hash-max-listpack-entries", 128),
    ("hash-max-listpack-value", 64),
    ("hash-max-ziplist-entries", 128),
    ("hash-max-ziplist-value", 64),
    ("set-max-intset-entries", 512),
    ("zset-max-listpack-entries", 128),
    ("zset-max-listpack-value", 64),
    ("zset-max-ziplist-entries", 128),
    ("zset-max-ziplist-value", 64),
    ("list-max-listpack-size", -2),
    ("list-max-ziplist-size", -2),
    ("list-compress-depth", 0),
];

/// The parameters `CONFIG GET` knows, with their current values.
fn config_params(ctx: &Ctx<'_>) -> Vec<(&'static str, String)> {
    let cfg = ctx.shared.cfg.read();
    let es = ctx.shared.engine.settings();
    let encodings = ctx.shared.encoding_params.lock();
    let mut params = vec![
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
        ("maxmemory", cfg.maxmemory.to_string()),
        ("maxmemory-policy", "strata-tiered".into()),
        ("save", String::new()),
        ("appendonly", "no".into()),
        ("appendfsync", es.warm.durability.as_str().into()),
        ("databases", cfg.databases.to_string()),
        (
            "busy-reply-threshold",
            cfg.busy_reply_threshold_ms.to_string(),
        ),
        ("lua-time-limit", cfg.busy_reply_threshold_ms.to_string()),
        (
            "cluster-enabled",
            if ctx.shared.cluster.is_some() {
                "yes"
            } else {
                "no"
            }
            .into(),
        ),
    ];
    params.extend(encodings.iter().map(|(k, v)| (*k, v.to_string())));
    params
}

fn config_reply(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
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
                    "busy-reply-threshold" | "lua-time-limit" => {
                        cfg.busy_reply_threshold_ms = match int() {
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
                            Some(n) if n >= 1024 => n.min(strata_format::VALUE_BYTES_MAX as u64),
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
                    // The memory governor (`memory.rs`) holds the process to the new limit
                    // from its next look.
                    "maxmemory" => {
                        let Some(n) = strata_settings::parse_size(&val) else {
                            return Reply::err(format!("ERR CONFIG SET failed (possibly related to argument '{key}') - argument must be a memory value"));
                        };
                        if let Err(e) = crate::config::check_maxmemory(n) {
                            return Reply::err(format!("ERR CONFIG SET failed (possibly related to argument '{key}') - {e}"));
                        }
                        cfg.maxmemory = n;
                    }
                    k if ENCODING_PARAMS.iter().any(|(name, _)| *name == k) => {
                        let Ok(n) = val.parse::<i64>() else {
                            return bad();
                        };
                        let name = ENCODING_PARAMS.iter().find(|(p, _)| *p == k).expect("found").0;
                        ctx.shared.encoding_params.lock().insert(name, n);
                    }
                    _ => {
                        return Reply::err(format!(
                            "ERR Unknown option or number of arguments for CONFIG SET - '{key}'"
                        ))
                    }
                }
            }
            Reply::ok()
        }
        // The error counts start again; the other figures are counters that only grow
        // (Prometheus scrapes them).
        "resetstat" => {
            ctx.shared.metrics.reset_error_codes();
            Reply::ok()
        }
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
pub(super) fn output_limit(val: &str) -> Option<u64> {
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
