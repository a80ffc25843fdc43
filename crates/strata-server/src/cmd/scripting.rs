//! `EVAL`, `EVALSHA`, `EVAL_RO`, `EVALSHA_RO`, `SCRIPT`, `FCALL`, `FCALL_RO` and
//! `FUNCTION`: Lua through `strata_script`. A script runs on the client's task's thread;
//! each `redis.call` runs there through the command table as the client's own command
//! would (checks, `WATCH` touches, durability of its writes before the reply). The command
//! holds the server's gate for writing, so no other client's command runs between a
//! script's calls; past `busy-reply-threshold` other clients get `-BUSY` (see `conn.rs`)
//! and `SCRIPT KILL`/`FUNCTION KILL` may stop it if it has not written. Function
//! libraries are saved through the engine after every change and loaded at start.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use strata_resp::Reply;
use strata_script::{Flags, RestorePolicy};

use super::ctx::{lower, not_integer, parse_int, syntax_error, Ctx};
use crate::shared::Shared;

/// What a script is named by: its body (`EVAL`), its SHA1 (`EVALSHA`) or a function's
/// name (`FCALL`).
enum Target {
    Body(Bytes),
    Sha(String),
    Function(Bytes),
}

pub(crate) async fn eval(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    run(ctx, a, Target::Body(a[1].clone()), false).await
}

pub(crate) async fn evalsha(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    run(ctx, a, sha_of(&a[1]), false).await
}

pub(crate) async fn eval_ro(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    run(ctx, a, Target::Body(a[1].clone()), true).await
}

pub(crate) async fn evalsha_ro(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    run(ctx, a, sha_of(&a[1]), true).await
}

pub(crate) async fn fcall(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    run(ctx, a, Target::Function(a[1].clone()), false).await
}

pub(crate) async fn fcall_ro(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    run(ctx, a, Target::Function(a[1].clone()), true).await
}

fn sha_of(b: &[u8]) -> Target {
    Target::Sha(String::from_utf8_lossy(b).to_ascii_lowercase())
}

/// `KEYS` and `ARGV` of `EVAL`/`FCALL name numkeys key... arg...`.
fn keys_and_args(a: &[Bytes], function: bool) -> Result<(Vec<Bytes>, Vec<Bytes>), Reply> {
    let n = match parse_int(&a[2]) {
        Some(n) if n < 0 => return Err(Reply::err("ERR Number of keys can't be negative")),
        Some(n) if n as usize > a.len() - 3 => {
            return Err(Reply::err(
                "ERR Number of keys can't be greater than number of args",
            ))
        }
        Some(n) => n as usize,
        None if function => return Err(Reply::err("ERR Bad number of keys provided")),
        None => return Err(not_integer()),
    };
    Ok((a[3..3 + n].to_vec(), a[3 + n..].to_vec()))
}

async fn run(ctx: &mut Ctx<'_>, a: &[Bytes], target: Target, read_only: bool) -> Reply {
    let (keys, argv) = match keys_and_args(a, matches!(target, Target::Function(_))) {
        Ok(ka) => ka,
        Err(r) => return r,
    };
    let limit = Duration::from_millis(ctx.shared.cfg.read().busy_reply_threshold_ms);
    let busy_after = (!limit.is_zero()).then_some(limit);
    let shared = Arc::clone(ctx.shared);
    let handle = tokio::runtime::Handle::current();
    // A script's SELECT lasts for the script only, as in Redis.
    let db = ctx.conn.db;
    // The script runs right here, in this task's poll, and so does each call (see
    // `run_now`): no handoff between threads unless a call must wait, or the script turns
    // busy (then the runtime moves this worker's other tasks to another thread).
    let reply = (|| match target {
        Target::Body(_) | Target::Sha(_) => {
            let mut vm = shared.scripts.lock();
            let sha = match target {
                Target::Body(body) => match vm.load(&body) {
                    Ok(sha) => sha,
                    Err(r) => return r,
                },
                Target::Sha(sha) => sha,
                Target::Function(_) => unreachable!("matched above"),
            };
            let read_only =
                read_only || vm.flags(&sha).is_some_and(|f| f.contains(Flags::NO_WRITES));
            let _running = Running::start(&shared, &sha, a, None);
            let mut call =
                |args: &[Bytes]| run_now(&handle, call_from_script(ctx, &shared, args, read_only));
            vm.run(&sha, &keys, &argv, &mut call, busy_after)
        }
        Target::Function(name) => {
            let mut functions = shared.functions.lock();
            let Some(info) = functions.function(&name) else {
                return Reply::err("ERR Function not found");
            };
            let no_writes = info.flags.contains(Flags::NO_WRITES);
            if read_only && !no_writes {
                return Reply::err(
                    "ERR Can not execute a script with write flag using *_ro command.",
                );
            }
            let fname = info.name.clone();
            let counts = functions.counts();
            let _running = Running::start(&shared, &fname, a, Some(counts));
            let mut call =
                |args: &[Bytes]| run_now(&handle, call_from_script(ctx, &shared, args, no_writes));
            functions.call(&name, &keys, &argv, &mut call, busy_after)
        }
    })();
    if ctx.conn.db != db {
        ctx.conn.db = db;
        super::connection::publish(ctx);
    }
    reply
}

/// Runs one call of a script to its end from synchronous code inside the client's task:
/// most calls finish on their first poll (values in DRAM, writes that wait for nothing);
/// one that must wait (a read from disk or the object store, a lock) finishes in
/// `block_in_place`, which hands this worker's other tasks to another thread meanwhile.
fn run_now<F: std::future::Future<Output = Reply>>(
    handle: &tokio::runtime::Handle,
    fut: F,
) -> Reply {
    let mut fut = std::pin::pin!(fut);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(r) => r,
        std::task::Poll::Pending => tokio::task::block_in_place(|| handle.block_on(fut)),
    }
}

/// The running script as `FUNCTION STATS` shows it, cleared when the run ends.
struct Running<'a>(&'a Shared);

impl<'a> Running<'a> {
    fn start(
        shared: &'a Shared,
        name: &str,
        command: &[Bytes],
        counts: Option<(usize, usize)>,
    ) -> Running<'a> {
        *shared.running_script.lock() = Some(crate::shared::RunningScript {
            name: name.to_string(),
            command: command.to_vec(),
            started: Instant::now(),
            counts,
        });
        Running(shared)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        *self.0.running_script.lock() = None;
    }
}

/// One `redis.call` of a script, as the client would run it; what a script may not run
/// (transactions, scripts, blocking waits) is refused.
async fn call_from_script(
    ctx: &mut Ctx<'_>,
    shared: &Shared,
    args: &[Bytes],
    read_only: bool,
) -> Reply {
    let commands = ctx.commands;
    let Some(idx) = commands.lookup(&args[0]) else {
        return Reply::err("ERR Unknown Redis command called from script");
    };
    let spec = &commands.specs()[idx];
    // `CLUSTER RESET` alone of `CLUSTER`'s subcommands, as in Redis.
    let cluster_reset = spec.name == "cluster"
        && args
            .get(1)
            .is_some_and(|a| a.eq_ignore_ascii_case(b"reset"));
    // Redis's order: the arity (a subcommand's own too), then whether scripts may call it.
    if !spec.accepts(args.len()) || commands.subcommand_misfit(spec, args).is_some() {
        return Reply::err("ERR Wrong number of args calling Redis command from script");
    }
    // The blocking commands Redis allows (`BLMPOP`, `BZMPOP`) try once, as inside `MULTI`.
    if spec.flags & super::ctx::NOSCRIPT != 0 || cluster_reset {
        return Reply::err("ERR This Redis command is not allowed from script");
    }
    if spec.flags & super::ctx::WRITE != 0 {
        if read_only {
            return Reply::err("ERR Write commands are not allowed from read-only scripts.");
        }
        shared.script.note_write();
    }
    if let Some(r) = commands.refusal(ctx.conn, spec, args) {
        return r;
    }
    let keys_at = |c| {
        super::spec::key_positions(spec, args)
            .ok()
            .map(|at| (c, at))
    };
    if let Some((c, at)) = shared.cluster.as_ref().and_then(keys_at) {
        let slot = |i: usize| strata_format::keys::slot_of(&args[i]);
        // The script's own keys passed the routing check (with the client's ASKING).
        let write = spec.flags & super::ctx::WRITE != 0;
        let elsewhere = |i: usize| super::cluster::route_reply(c, slot(i), write, true).is_some();
        if at.iter().any(|&i| elsewhere(i)) {
            return Reply::err("ERR Script attempted to access a non local key in a cluster node");
        }
    }
    // Timed from here: the script's own work before the call is not the command's.
    ctx.conn.lap = None;
    commands.dispatch_counted(ctx, idx, args).await
}

/// `SCRIPT LOAD|EXISTS|FLUSH|KILL|HELP`.
pub(crate) async fn script(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let sub = lower(&a[1]);
    match (sub.as_str(), a.len()) {
        ("load", 3) => match ctx.shared.scripts.lock().load(&a[2]) {
            Ok(sha) => Reply::bulk(sha),
            Err(r) => r,
        },
        ("exists", n) if n >= 3 => {
            let vm = ctx.shared.scripts.lock();
            Reply::Array(
                a[2..]
                    .iter()
                    .map(|s| Reply::Integer(vm.exists(s) as i64))
                    .collect(),
            )
        }
        ("flush", 2) | ("flush", 3) => {
            if a.len() == 3 && !["async", "sync"].contains(&lower(&a[2]).as_str()) {
                return syntax_error();
            }
            ctx.shared.scripts.lock().flush();
            Reply::ok()
        }
        // Runs beside the busy script (it does not take the gate).
        ("kill", 2) => match ctx.shared.script.kill(false) {
            Ok(()) => Reply::ok(),
            Err(r) => r,
        },
        ("help", 2) => help(&[
            "SCRIPT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
            "EXISTS <sha1> [<sha1> ...]",
            "FLUSH [ASYNC|SYNC]",
            "KILL",
            "LOAD <script>",
        ]),
        _ => unknown_sub("SCRIPT", &sub),
    }
}

fn help(lines: &[&str]) -> Reply {
    Reply::Array(lines.iter().map(|s| Reply::Simple((*s).into())).collect())
}

fn unknown_sub(cmd: &str, sub: &str) -> Reply {
    Reply::err(format!(
        "ERR unknown subcommand or wrong number of arguments for '{sub}'. Try {cmd} HELP."
    ))
}

/// Saves the libraries through the engine after a change (they survive a restart and are
/// in backups).
fn save(ctx: &Ctx<'_>, functions: &strata_script::Functions) -> Result<(), Reply> {
    let payload = (functions.counts().0 > 0).then(|| functions.dump());
    ctx.shared
        .engine
        .save_server(strata_engine::Saved::Functions, payload.as_deref())
        .map_err(|e| super::ctx::engine_error(&e))
}

/// Loads the libraries the engine saved (at start).
pub(crate) fn restore_saved(shared: &Shared) -> Result<(), String> {
    let Some(payload) = shared
        .engine
        .saved(strata_engine::Saved::Functions)
        .map_err(|e| e.to_string())?
    else {
        return Ok(());
    };
    shared
        .functions
        .lock()
        .restore(&payload, RestorePolicy::Flush)
        .map_err(|r| format!("saved functions do not load: {r:?}"))
}

/// `FUNCTION LOAD|DELETE|FLUSH|LIST|DUMP|RESTORE|STATS|KILL|HELP`.
pub(crate) async fn function(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let sub = lower(&a[1]);
    let changed = |ctx: &Ctx<'_>, f: &strata_script::Functions, r: Reply| match save(ctx, f) {
        Ok(()) => r,
        Err(e) => e,
    };
    match (sub.as_str(), a.len()) {
        ("load", 3) | ("load", 4) => {
            let replace = a.len() == 4;
            if replace && !a[2].eq_ignore_ascii_case(b"replace") {
                return Reply::err(format!(
                    "ERR Unknown option given: {}",
                    String::from_utf8_lossy(&a[2])
                ));
            }
            let mut f = ctx.shared.functions.lock();
            match f.load(&a[a.len() - 1], replace) {
                Ok(name) => changed(ctx, &f, Reply::bulk(name)),
                Err(r) => r,
            }
        }
        ("load", n) if n > 4 => Reply::err(format!(
            "ERR Unknown option given: {}",
            String::from_utf8_lossy(&a[2])
        )),
        ("delete", 3) => {
            let mut f = ctx.shared.functions.lock();
            match f.delete(&a[2]) {
                Ok(()) => changed(ctx, &f, Reply::ok()),
                Err(r) => r,
            }
        }
        ("flush", 2) | ("flush", 3) => {
            if a.len() == 3 && !matches!(lower(&a[2]).as_str(), "async" | "sync") {
                return Reply::err("ERR FUNCTION FLUSH only supports SYNC|ASYNC option");
            }
            let mut f = ctx.shared.functions.lock();
            f.flush();
            changed(ctx, &f, Reply::ok())
        }
        ("list", _) => list(ctx, &a[2..]),
        ("dump", 2) => Reply::Bulk(ctx.shared.functions.lock().dump().into()),
        ("restore", 3) | ("restore", 4) => {
            let policy = match a.get(3).map(|p| lower(p)) {
                None => RestorePolicy::Append,
                Some(p) if p == "append" => RestorePolicy::Append,
                Some(p) if p == "replace" => RestorePolicy::Replace,
                Some(p) if p == "flush" => RestorePolicy::Flush,
                Some(_) => return Reply::err("ERR Wrong restore policy given, value should be either FLUSH, APPEND or REPLACE."),
            };
            let mut f = ctx.shared.functions.lock();
            match f.restore(&a[2], policy) {
                Ok(()) => changed(ctx, &f, Reply::ok()),
                Err(r) => r,
            }
        }
        ("stats", 2) => stats(ctx.shared),
        // Runs beside the busy function (it does not take the gate).
        ("kill", 2) => match ctx.shared.script.kill(true) {
            Ok(()) => Reply::ok(),
            Err(r) => r,
        },
        ("help", 2) => help(&[
            "FUNCTION <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
            "LOAD [REPLACE] <FUNCTION CODE>",
            "DELETE <LIBRARY NAME>",
            "LIST [LIBRARYNAME PATTERN] [WITHCODE]",
            "FCALL <FUNCTION NAME> <NUMBER OF KEYS> [<KEY NAME> ...] [<ARG> ...]",
            "FCALL_RO <FUNCTION NAME> <NUMBER OF KEYS> [<KEY NAME> ...] [<ARG> ...]",
            "KILL",
            "FLUSH [ASYNC|SYNC]",
            "STATS",
            "DUMP",
            "RESTORE <PAYLOAD> [FLUSH|APPEND|REPLACE]",
        ]),
        _ => unknown_sub("FUNCTION", &sub),
    }
}

/// `FUNCTION LIST [WITHCODE] [LIBRARYNAME pattern]`.
fn list(ctx: &Ctx<'_>, opts: &[Bytes]) -> Reply {
    let (mut with_code, mut pattern) = (false, None);
    let mut i = 0;
    while i < opts.len() {
        match lower(&opts[i]).as_str() {
            "withcode" if !with_code => with_code = true,
            "libraryname" if pattern.is_none() => {
                let Some(p) = opts.get(i + 1) else {
                    return Reply::err("ERR library name argument was not given");
                };
                pattern = Some(p.clone());
                i += 1;
            }
            _ => {
                return Reply::err(format!(
                    "ERR Unknown argument {}",
                    String::from_utf8_lossy(&opts[i])
                ))
            }
        }
        i += 1;
    }
    let f = ctx.shared.functions.lock();
    let libs = f
        .libraries()
        .filter(|l| {
            pattern
                .as_ref()
                .is_none_or(|p| strata_engine::glob::glob_match(p, l.name.as_bytes()))
        })
        .map(|l| {
            let functions = l
                .functions
                .iter()
                .map(|fi| {
                    Reply::Map(vec![
                        (Reply::bulk("name"), Reply::bulk(fi.name.clone())),
                        (
                            Reply::bulk("description"),
                            fi.description.clone().map_or(Reply::Null, Reply::bulk),
                        ),
                        (
                            Reply::bulk("flags"),
                            Reply::Set(
                                fi.flags
                                    .names()
                                    .into_iter()
                                    .map(|n| Reply::Simple(n.into()))
                                    .collect(),
                            ),
                        ),
                    ])
                })
                .collect();
            let mut fields = vec![
                (Reply::bulk("library_name"), Reply::bulk(l.name.clone())),
                (Reply::bulk("engine"), Reply::bulk("LUA")),
                (Reply::bulk("functions"), Reply::Array(functions)),
            ];
            if with_code {
                fields.push((Reply::bulk("library_code"), Reply::Bulk(l.code.clone())));
            }
            Reply::Map(fields)
        })
        .collect();
    Reply::Array(libs)
}

/// `FUNCTION STATS`: the running script, and how many libraries and functions exist.
fn stats(shared: &Shared) -> Reply {
    let running = shared.running_script.lock().clone();
    // While a function runs, its VM is locked: its counts come from the run's start.
    let counts = match shared.functions.try_lock() {
        Some(f) => f.counts(),
        None => running.as_ref().and_then(|r| r.counts).unwrap_or_default(),
    };
    let running = match running {
        Some(r) => Reply::Map(vec![
            (Reply::bulk("name"), Reply::bulk(r.name)),
            (
                Reply::bulk("command"),
                Reply::Array(r.command.into_iter().map(Reply::Bulk).collect()),
            ),
            (
                Reply::bulk("duration_ms"),
                Reply::Integer(r.started.elapsed().as_millis() as i64),
            ),
        ]),
        None => Reply::Null,
    };
    Reply::Map(vec![
        (Reply::bulk("running_script"), running),
        (
            Reply::bulk("engines"),
            Reply::Map(vec![(
                Reply::bulk("LUA"),
                Reply::Map(vec![
                    (
                        Reply::bulk("libraries_count"),
                        Reply::Integer(counts.0 as i64),
                    ),
                    (
                        Reply::bulk("functions_count"),
                        Reply::Integer(counts.1 as i64),
                    ),
                ]),
            )]),
        ),
    ])
}

/// Whether a request runs beside a busy script, without the gate: the commands that
/// stop it or look at it, and those that only change the connection's own state (as
/// Redis's `allow_busy` commands: a client may open a transaction meanwhile).
pub(crate) fn runs_while_busy(args: &[Bytes]) -> bool {
    let sub = |w: &[u8]| args.get(1).is_some_and(|a| a.eq_ignore_ascii_case(w));
    let name = &args[0];
    const OWN_STATE: [&[u8]; 8] = [
        b"multi", b"discard", b"watch", b"unwatch", b"reset", b"auth", b"hello", b"quit",
    ];
    OWN_STATE.iter().any(|c| name.eq_ignore_ascii_case(c))
        || (name.eq_ignore_ascii_case(b"script") && sub(b"kill"))
        || (name.eq_ignore_ascii_case(b"function") && (sub(b"kill") || sub(b"stats")))
        || (name.eq_ignore_ascii_case(b"shutdown") && sub(b"nosave"))
}
