//! Lua scripts as Redis runs them (`EVAL`, `EVALSHA`, `SCRIPT`): Lua 5.1 in a sandbox (the
//! base, table, string and math libraries; no io, os, debug, no loading of files; no new
//! globals), a cache of scripts by SHA1, `redis.call`/`redis.pcall` and the rest of the
//! `redis` table, and Redis's conversions between Lua values and RESP2 replies.
//!
//! The caller runs the commands: [`Vm::run`] takes a function that executes one command
//! and answers its reply, so a script reaches exactly what a client reaches.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use mlua::{Function, HookTriggers, Lua, LuaOptions, StdLib, Table, Value, VmState};
use strata_resp::Reply;

/// Memory one VM may hold (scripts, their tables and strings).
pub const VM_BYTES_MAX: usize = 256 << 20;
/// Lua instructions between two looks at the script's deadline.
const HOOK_EVERY: u32 = 100_000;

/// How a command reached from a script is run: its arguments in, its reply out.
pub type Call<'a> = &'a mut dyn FnMut(Vec<Bytes>) -> Reply;

/// One run's state, kept in the VM while the script runs.
struct Running {
    /// A `redis.call` that failed, and the script's line: the script's reply is that
    /// error, as in Redis.
    raised: Option<(String, usize)>,
    deadline: Option<Instant>,
}

/// The Lua VM of a server and its script cache.
pub struct Vm {
    lua: Lua,
    scripts: HashMap<String, Function>,
}

/// The SHA1 of `body` in lowercase hex, as `SCRIPT LOAD` answers it.
pub fn sha1_hex(body: &[u8]) -> String {
    sha1_smol::Sha1::from(body).digest().to_string()
}

fn lua_err(e: mlua::Error) -> String {
    // mlua wraps errors raised in callbacks; the innermost message is the one to show.
    match e {
        mlua::Error::CallbackError { cause, .. } => lua_err((*cause).clone()),
        mlua::Error::RuntimeError(m) | mlua::Error::SyntaxError { message: m, .. } => m,
        other => other.to_string(),
    }
}

impl Vm {
    pub fn new() -> Result<Vm, String> {
        let lua = Lua::new_with(
            StdLib::TABLE | StdLib::STRING | StdLib::MATH,
            LuaOptions::default(),
        )
        .map_err(lua_err)?;
        lua.set_memory_limit(VM_BYTES_MAX).map_err(lua_err)?;
        sandbox(&lua).map_err(lua_err)?;
        lua.set_hook(
            HookTriggers::new().every_nth_instruction(HOOK_EVERY),
            |lua, _| {
                let late = lua
                    .app_data_ref::<Running>()
                    .and_then(|r| r.deadline)
                    .is_some_and(|d| Instant::now() >= d);
                if late {
                    return Err(mlua::Error::RuntimeError(
                        "ERR Script killed: it ran past the script time limit".into(),
                    ));
                }
                Ok(VmState::Continue)
            },
        )
        .map_err(lua_err)?;
        Ok(Vm {
            lua,
            scripts: HashMap::new(),
        })
    }

    /// Compiles `body` into the cache (`SCRIPT LOAD`, and `EVAL` before it runs); answers
    /// its SHA1, or Redis's compile error.
    pub fn load(&mut self, body: &[u8]) -> Result<String, Reply> {
        let sha = sha1_hex(body);
        if !self.scripts.contains_key(&sha) {
            let f = self
                .lua
                .load(body)
                .set_name("@user_script")
                .into_function()
                .map_err(|e| {
                    Reply::err(format!(
                        "ERR Error compiling script (new function): {}",
                        lua_err(e)
                    ))
                })?;
            self.scripts.insert(sha.clone(), f);
        }
        Ok(sha)
    }

    pub fn exists(&self, sha: &[u8]) -> bool {
        std::str::from_utf8(sha).is_ok_and(|s| self.scripts.contains_key(&s.to_ascii_lowercase()))
    }

    /// Forgets every script (`SCRIPT FLUSH`).
    pub fn flush(&mut self) {
        self.scripts.clear();
        let _ = self.lua.gc_collect();
    }

    /// Runs the cached script `sha` with `KEYS` and `ARGV`, reaching commands through
    /// `call` (on the caller's thread: `redis.call` is bound to it for this run only);
    /// past `limit` it is stopped with an error.
    pub fn run(
        &mut self,
        sha: &str,
        keys: &[Bytes],
        argv: &[Bytes],
        call: Call<'_>,
        limit: Option<Duration>,
    ) -> Reply {
        let Some(f) = self.scripts.get(&sha.to_ascii_lowercase()).cloned() else {
            return Reply::err("NOSCRIPT No matching script. Please use EVAL.");
        };
        let lua = &self.lua;
        let set = || -> mlua::Result<()> {
            let g = lua.globals();
            g.raw_set("KEYS", bytes_table(lua, keys)?)?;
            g.raw_set("ARGV", bytes_table(lua, argv)?)?;
            Ok(())
        };
        if let Err(e) = set() {
            return Reply::err(format!("ERR {}", lua_err(e)));
        }
        lua.set_app_data(Running {
            raised: None,
            deadline: limit.map(|l| Instant::now() + l),
        });
        let call = std::cell::RefCell::new(call);
        let result = lua.scope(|scope| {
            let redis: Table = lua.globals().raw_get("redis")?;
            // `redis.call` raises a command's error; `redis.pcall` returns it as a table.
            for (name, raise) in [("call", true), ("pcall", false)] {
                let call = &call;
                redis.raw_set(
                    name,
                    scope.create_function(move |lua, args: mlua::MultiValue| {
                        command(lua, args, raise, call)
                    })?,
                )?;
            }
            f.call::<Value>(())
        });
        let running = lua.remove_app_data::<Running>();
        let reply = match result {
            Ok(v) => to_reply(&v, 0),
            Err(e) => match running.and_then(|r| r.raised) {
                Some((raised, line)) => {
                    Reply::Error(format!("{raised} script: {sha}, on @user_script:{line}."))
                }
                None => {
                    let m = lua_err(e);
                    // Lua's message starts with where: "user_script:<line>: ...".
                    let line = m
                        .strip_prefix("user_script:")
                        .and_then(|r| r.split(':').next())
                        .and_then(|n| n.parse::<usize>().ok());
                    match line {
                        Some(line) => {
                            Reply::Error(format!("ERR {m} script: {sha}, on @user_script:{line}."))
                        }
                        // Strata's own stop (the time limit) is worded in full already.
                        None if m.starts_with("ERR ") => Reply::Error(m),
                        None => Reply::Error(format!("ERR {m} script: {sha}, on @user_script:0.")),
                    }
                }
            },
        };
        let _ = lua.gc_step();
        reply
    }
}

fn bytes_table(lua: &Lua, items: &[Bytes]) -> mlua::Result<Table> {
    let t = lua.create_table_with_capacity(items.len(), 0)?;
    for (i, b) in items.iter().enumerate() {
        t.raw_seti(i + 1, lua.create_string(b)?)?;
    }
    Ok(t)
}

/// The `redis` table and the sandbox: only what Redis scripts may use, and no new globals.
fn sandbox(lua: &Lua) -> mlua::Result<()> {
    let g = lua.globals();
    for name in [
        "dofile",
        "loadfile",
        "require",
        "module",
        "collectgarbage",
        "newproxy",
    ] {
        g.raw_set(name, Value::Nil)?;
    }
    // `redis.call` and `redis.pcall` are bound for each run (see [`Vm::run`]).
    let redis = lua.create_table()?;
    // `redis.error_reply(m)` is `{err = m}`, `redis.status_reply(m)` is `{ok = m}`.
    for (name, field) in [("error_reply", "err"), ("status_reply", "ok")] {
        redis.raw_set(
            name,
            lua.create_function(move |lua, m: mlua::LuaString| {
                let t = lua.create_table()?;
                t.raw_set(field, m)?;
                Ok(t)
            })?,
        )?;
    }
    redis.raw_set(
        "sha1hex",
        lua.create_function(|_, s: mlua::LuaString| Ok(sha1_hex(&s.as_bytes())))?,
    )?;
    // Accepted as in Redis; logs and replication settings have no effect here.
    redis.raw_set("log", lua.create_function(|_, _: mlua::MultiValue| Ok(()))?)?;
    redis.raw_set(
        "setresp",
        lua.create_function(|_, _: mlua::MultiValue| Ok(()))?,
    )?;
    redis.raw_set(
        "set_repl",
        lua.create_function(|_, _: mlua::MultiValue| Ok(()))?,
    )?;
    redis.raw_set("replicate_commands", lua.create_function(|_, ()| Ok(true))?)?;
    for (i, name) in ["LOG_DEBUG", "LOG_VERBOSE", "LOG_NOTICE", "LOG_WARNING"]
        .iter()
        .enumerate()
    {
        redis.raw_set(*name, i as i64)?;
    }
    for (i, name) in [
        "REPL_NONE",
        "REPL_AOF",
        "REPL_SLAVE",
        "REPL_REPLICA",
        "REPL_ALL",
    ]
    .iter()
    .enumerate()
    {
        redis.raw_set(*name, [0, 1, 2, 2, 3][i])?;
    }
    g.raw_set("redis", redis)?;
    // Globals are protected as in Redis: reading an undefined one or creating one fails.
    let meta = lua.create_table()?;
    meta.raw_set(
        "__newindex",
        lua.create_function(|lua, _: mlua::MultiValue| -> mlua::Result<()> {
            Err(script_error(
                lua,
                "Attempt to modify a readonly table".into(),
            ))
        })?,
    )?;
    meta.raw_set(
        "__index",
        lua.create_function(|lua, (_t, k): (Value, Value)| -> mlua::Result<()> {
            Err(script_error(
                lua,
                format!(
                    "Script attempted to access nonexistent global variable '{}'",
                    show(&k)
                ),
            ))
        })?,
    )?;
    g.set_metatable(Some(meta))?;
    Ok(())
}

/// The script's line that called the running Rust function (0 when unknown).
fn script_line(lua: &Lua) -> usize {
    lua.inspect_stack(1, |d| d.current_line())
        .flatten()
        .unwrap_or(0)
}

/// An error raised at the script's current line, worded as Lua words its own.
fn script_error(lua: &Lua, msg: String) -> mlua::Error {
    mlua::Error::RuntimeError(format!("user_script:{}: {msg}", script_line(lua)))
}

fn show(v: &Value) -> String {
    match v {
        Value::String(s) => s.to_string_lossy(),
        other => format!("{other:?}"),
    }
}

/// `redis.call` (`raise`: an error reply raises a Lua error) and `redis.pcall` (it comes
/// back as an error table).
fn command(
    lua: &Lua,
    args: mlua::MultiValue,
    raise: bool,
    call: &std::cell::RefCell<Call<'_>>,
) -> mlua::Result<Value> {
    let mut argv = Vec::with_capacity(args.len());
    for a in args.iter() {
        match a {
            Value::String(s) => argv.push(Bytes::copy_from_slice(&s.as_bytes())),
            Value::Integer(n) => argv.push(Bytes::from(n.to_string())),
            Value::Number(n) => argv.push(Bytes::from(strata_resp::format_double(*n))),
            _ => {
                return Err(mlua::Error::RuntimeError(
                    "ERR Lua redis lib command arguments must be strings or integers".into(),
                ))
            }
        }
    }
    if argv.is_empty() {
        return Err(mlua::Error::RuntimeError(
            "ERR Please specify at least one argument for this redis lib call".into(),
        ));
    }
    let reply = (call.borrow_mut())(argv);
    if let (true, Reply::Error(e)) = (raise, &reply) {
        let line = script_line(lua);
        if let Some(mut running) = lua.app_data_mut::<Running>() {
            running.raised = Some((e.clone(), line));
        }
        return Err(mlua::Error::RuntimeError(e.clone()));
    }
    to_lua(lua, reply)
}

/// A reply as Redis hands it to Lua (RESP2): integers as numbers, bulks as strings, nil
/// as false, arrays as tables, status and error as `{ok=...}` and `{err=...}`.
fn to_lua(lua: &Lua, r: Reply) -> mlua::Result<Value> {
    Ok(match r {
        Reply::Simple(s) => {
            let t = lua.create_table()?;
            t.raw_set("ok", s)?;
            Value::Table(t)
        }
        Reply::Error(e) => {
            let t = lua.create_table()?;
            t.raw_set("err", e)?;
            Value::Table(t)
        }
        Reply::Integer(n) => Value::Integer(n),
        Reply::Bulk(b) => Value::String(lua.create_string(&b)?),
        Reply::Verbatim(s) => Value::String(lua.create_string(s)?),
        Reply::Null | Reply::NullArray | Reply::NoReply => Value::Boolean(false),
        Reply::Bool(b) => Value::Integer(b as i64),
        Reply::Double(d) => Value::String(lua.create_string(strata_resp::format_double(d))?),
        Reply::Array(items) | Reply::Set(items) => {
            let t = lua.create_table_with_capacity(items.len(), 0)?;
            for (i, item) in items.into_iter().enumerate() {
                t.raw_seti(i + 1, to_lua(lua, item)?)?;
            }
            Value::Table(t)
        }
        Reply::Map(pairs) => {
            let t = lua.create_table_with_capacity(pairs.len() * 2, 0)?;
            for (i, (k, v)) in pairs.into_iter().enumerate() {
                t.raw_seti(2 * i + 1, to_lua(lua, k)?)?;
                t.raw_seti(2 * i + 2, to_lua(lua, v)?)?;
            }
            Value::Table(t)
        }
    })
}

/// Deepest table a script's reply may nest.
const REPLY_DEPTH_MAX: usize = 64;

/// A Lua value as Redis replies with it: numbers truncated to integers, strings as bulks,
/// true as 1, false and nil as nil, `{err=...}` and `{ok=...}` as error and status, other
/// tables as arrays up to their first nil.
fn to_reply(v: &Value, depth: usize) -> Reply {
    match v {
        Value::Integer(n) => Reply::Integer(*n),
        Value::Number(n) => Reply::Integer(*n as i64),
        Value::String(s) => Reply::Bulk(Bytes::copy_from_slice(&s.as_bytes())),
        Value::Boolean(true) => Reply::Integer(1),
        Value::Table(t) => {
            if let Ok(Value::String(e)) = t.raw_get::<Value>("err") {
                return Reply::Error(e.to_string_lossy());
            }
            if let Ok(Value::String(s)) = t.raw_get::<Value>("ok") {
                return Reply::Simple(s.to_string_lossy());
            }
            if depth >= REPLY_DEPTH_MAX {
                return Reply::err("ERR reached lua stack limit");
            }
            let mut items = Vec::new();
            for i in 1.. {
                match t.raw_get::<Value>(i) {
                    Ok(Value::Nil) | Err(_) => break,
                    Ok(item) => items.push(to_reply(&item, depth + 1)),
                }
            }
            Reply::Array(items)
        }
        _ => Reply::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(vm: &mut Vm, body: &str, keys: &[&str], argv: &[&str]) -> Reply {
        let sha = match vm.load(body.as_bytes()) {
            Ok(s) => s,
            Err(r) => return r,
        };
        let b =
            |v: &[&str]| -> Vec<Bytes> { v.iter().map(|s| Bytes::from(s.to_string())).collect() };
        // A stand-in for the server: echoes the command's arguments back as an array, or
        // fails on "FAIL".
        let mut call = |args: Vec<Bytes>| {
            if args[0].as_ref() == b"FAIL" {
                Reply::err("WRONGTYPE Operation against a key holding the wrong kind of value")
            } else {
                Reply::Array(args.into_iter().map(Reply::Bulk).collect())
            }
        };
        vm.run(
            &sha,
            &b(keys),
            &b(argv),
            &mut call,
            Some(Duration::from_secs(5)),
        )
    }

    #[test]
    fn values_convert_as_redis_converts_them() {
        let mut vm = Vm::new().unwrap();
        assert_eq!(run(&mut vm, "return 3.99", &[], &[]), Reply::Integer(3));
        assert_eq!(run(&mut vm, "return true", &[], &[]), Reply::Integer(1));
        assert_eq!(run(&mut vm, "return false", &[], &[]), Reply::Null);
        assert_eq!(
            run(&mut vm, "return {1, 'a', {2}, nil, 5}", &[], &[]),
            Reply::Array(vec![
                Reply::Integer(1),
                Reply::bulk("a"),
                Reply::Array(vec![Reply::Integer(2)])
            ])
        );
        assert_eq!(
            run(&mut vm, "return redis.status_reply('FINE')", &[], &[]),
            Reply::Simple("FINE".into())
        );
        assert_eq!(
            run(&mut vm, "return redis.error_reply('MYERR bad')", &[], &[]),
            Reply::err("MYERR bad")
        );
        assert_eq!(
            run(&mut vm, "return {KEYS[1], ARGV[2]}", &["k"], &["a", "b"]),
            Reply::Array(vec![Reply::bulk("k"), Reply::bulk("b")])
        );
        assert_eq!(
            run(&mut vm, "return redis.call('GET', KEYS[1], 7)", &["k"], &[]),
            Reply::Array(vec![Reply::bulk("GET"), Reply::bulk("k"), Reply::bulk("7")])
        );
        assert_eq!(
            run(&mut vm, "return redis.sha1hex('')", &[], &[]),
            Reply::bulk("da39a3ee5e6b4b0d3255bfef95601890afd80709")
        );
    }

    #[test]
    fn call_raises_pcall_returns_and_the_sandbox_holds() {
        let mut vm = Vm::new().unwrap();
        // As Redis 7.0: the command's error, then which script and line raised it.
        match run(&mut vm, "\nredis.call('FAIL') return 1", &[], &[]) {
            Reply::Error(e) => {
                assert!(e.starts_with("WRONGTYPE Operation against"), "{e}");
                assert!(e.ends_with(", on @user_script:2."), "{e}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            run(
                &mut vm,
                "local r = redis.pcall('FAIL') return r.err",
                &[],
                &[]
            ),
            Reply::bulk("WRONGTYPE Operation against a key holding the wrong kind of value")
        );
        for body in [
            "os.execute('true')",
            "io.open('/etc/passwd')",
            "dofile('/x')",
            "x = 1",
        ] {
            match run(&mut vm, body, &[], &[]) {
                Reply::Error(e) => assert!(e.starts_with("ERR "), "{body}: {e}"),
                other => panic!("{body} ran: {other:?}"),
            }
        }
        assert!(
            matches!(run(&mut vm, "return (", &[], &[]), Reply::Error(e) if e.contains("compiling"))
        );
        let sha = vm.load(b"return 1").unwrap();
        assert!(vm.exists(sha.as_bytes()));
        vm.flush();
        assert!(!vm.exists(sha.as_bytes()));
    }

    #[test]
    fn a_script_past_its_time_limit_is_stopped() {
        let mut vm = Vm::new().unwrap();
        let sha = vm.load(b"while true do end").unwrap();
        let r = vm.run(
            &sha,
            &[],
            &[],
            &mut |_| Reply::Null,
            Some(Duration::from_millis(50)),
        );
        assert!(matches!(r, Reply::Error(e) if e.contains("time limit")));
        // The VM is usable after.
        let sha = vm.load(b"return 2").unwrap();
        assert_eq!(
            vm.run(&sha, &[], &[], &mut |_| Reply::Null, None),
            Reply::Integer(2)
        );
    }
}
