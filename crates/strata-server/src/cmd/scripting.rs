//! `EVAL`, `EVALSHA`, `EVAL_RO`, `EVALSHA_RO` and `SCRIPT`: Lua through `strata_script`.
//! The script runs on the client's task's thread; each `redis.call` runs there through the
//! command table as the client's own command would (checks, `WATCH`
//! touches, durability of its writes before the reply). The command holds the server's gate
//! for writing, so no other client's command runs between a script's calls.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strata_resp::Reply;

use super::{lookup, lower, not_integer, parse_int, refusal, syntax_error, Ctx, COMMANDS};

/// What a script is named by: its body (`EVAL`) or its SHA1 (`EVALSHA`).
enum Source {
    Body(Bytes),
    Sha(String),
}

pub(crate) async fn eval(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    run(ctx, a, Source::Body(a[1].clone()), false).await
}

pub(crate) async fn evalsha(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    run(ctx, a, sha_of(&a[1]), false).await
}

pub(crate) async fn eval_ro(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    run(ctx, a, Source::Body(a[1].clone()), true).await
}

pub(crate) async fn evalsha_ro(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    run(ctx, a, sha_of(&a[1]), true).await
}

fn sha_of(b: &[u8]) -> Source {
    Source::Sha(String::from_utf8_lossy(b).to_ascii_lowercase())
}

async fn run(ctx: &mut Ctx<'_>, a: &[Bytes], source: Source, read_only: bool) -> Reply {
    let n = match parse_int(&a[2]) {
        Some(n) if n < 0 => return Reply::err("ERR Number of keys can't be negative"),
        Some(n) if n as usize > a.len() - 3 => {
            return Reply::err("ERR Number of keys can't be greater than number of args")
        }
        Some(n) => n as usize,
        None => return not_integer(),
    };
    let keys = a[3..3 + n].to_vec();
    let argv = a[3 + n..].to_vec();
    let limit = Duration::from_millis(ctx.shared.cfg.read().busy_reply_threshold_ms);
    let shared = Arc::clone(ctx.shared);
    let handle = tokio::runtime::Handle::current();
    // The script runs on this task's thread (the runtime moves its other tasks away), and
    // each call runs right here: no handoff between threads per call.
    tokio::task::block_in_place(|| {
        let mut vm = shared.scripts.lock();
        let sha = match source {
            Source::Body(body) => match vm.load(&body) {
                Ok(sha) => sha,
                Err(r) => return r,
            },
            Source::Sha(sha) => sha,
        };
        let mut call = |args: Vec<Bytes>| handle.block_on(call_from_script(ctx, args, read_only));
        vm.run(
            &sha,
            &keys,
            &argv,
            &mut call,
            (!limit.is_zero()).then_some(limit),
        )
    })
}

/// One `redis.call` of a script, as the client would run it; what a script may not run
/// (transactions, scripts, blocking waits) is refused.
async fn call_from_script(ctx: &mut Ctx<'_>, args: Vec<Bytes>, read_only: bool) -> Reply {
    let Some(idx) = lookup(&args[0]) else {
        return Reply::err("ERR Unknown Redis command called from script");
    };
    let spec = &COMMANDS[idx];
    if spec.flags & super::NOSCRIPT != 0 {
        return Reply::err("ERR This Redis command is not allowed from script");
    }
    if read_only && spec.flags & super::WRITE != 0 {
        return Reply::err("ERR Write commands are not allowed from read-only scripts.");
    }
    if let Some(r) = refusal(ctx.conn, spec, args.len()) {
        return r;
    }
    super::dispatch_counted(ctx, idx, &args).await
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
        // A script holds the gate for its whole run, so none runs while this does.
        ("kill", 2) => Reply::err("NOTBUSY No scripts in execution right now."),
        ("help", 2) => Reply::Array(
            [
                "SCRIPT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "EXISTS <sha1> [<sha1> ...]",
                "FLUSH [ASYNC|SYNC]",
                "KILL",
                "LOAD <script>",
            ]
            .iter()
            .map(|s| Reply::Simple((*s).into()))
            .collect(),
        ),
        _ => Reply::err(format!(
            "ERR unknown subcommand or wrong number of arguments for '{sub}'. Try SCRIPT HELP."
        )),
    }
}
