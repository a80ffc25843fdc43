//! One sealed Lua state (see `prelude.lua`): Lua's base, table, string and math libraries,
//! `cjson`, `cmsgpack`, `bit`, `struct` and the `redis` table; globals that cannot be read
//! when undefined or written at all; a hook that notices a script past the busy threshold
//! and stops a killed one.

use std::sync::atomic::{AtomicPtr, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Instant;

use mlua::{Function, HookTriggers, Lua, LuaOptions, StdLib, Table, Value, VmState};

use crate::control::Control;
use crate::convert::{self, lua_err, sha1_hex};
use strata_resp::Reply;

/// Memory one VM may hold (scripts, their tables and strings).
pub const VM_BYTES_MAX: usize = 256 << 20;
/// Lua instructions between two looks at the clock and the kill flag.
const HOOK_EVERY: u32 = 100_000;

/// What Redis answers a killed script with.
pub(crate) const KILLED: &str = "ERR Script killed by user with SCRIPT KILL...";

/// The state one run keeps in the VM while it runs.
pub(crate) struct Running {
    /// A `redis.call` that failed, and the script's line: the script's reply is that
    /// error, as in Redis.
    pub(crate) raised: Option<(String, usize)>,
    /// When the script becomes busy (other clients get `-BUSY`).
    pub(crate) busy_at: Option<Instant>,
    /// When the run is stopped outright (library code at load).
    pub(crate) deadline: Option<Instant>,
}

/// The command runner of the run in progress, its lifetime erased (see `Run::call`).
pub(crate) struct RawCall(
    pub(crate) *mut (dyn FnMut(&[bytes::Bytes]) -> strata_resp::Reply + 'static),
);

/// What `redis.call` reaches of the run in progress without a look-up in the VM: its
/// command runner and the protocol replies are converted with (`redis.setresp`).
#[derive(Default)]
pub(crate) struct CallSlot {
    /// The run's runner (on `Run::call`'s stack) while a run is in progress and none of
    /// its commands runs; null otherwise (outside a run, at load, during a call).
    pub(crate) call: AtomicPtr<RawCall>,
    pub(crate) resp: AtomicU8,
}

pub(crate) struct Env {
    pub(crate) lua: Lua,
    /// What a script's globals resolve to while it runs.
    pub(crate) runtime: Table,
    /// The metatable of the global table: its `__index` says what globals resolve to.
    pub(crate) globals_meta: Table,
    /// Seals a table (a read-only view of it), as the prelude seals the libraries.
    pub(crate) seal: Function,
    /// The `__index` that raises "Script attempted to access nonexistent global variable".
    pub(crate) nonexistent: Function,
    pub(crate) slot: Arc<CallSlot>,
}

impl Env {
    pub(crate) fn new(control: &Arc<Control>) -> Result<Env, String> {
        Env::build(control).map_err(lua_err)
    }

    fn build(control: &Arc<Control>) -> mlua::Result<Env> {
        let lua = Lua::new_with(
            StdLib::TABLE | StdLib::STRING | StdLib::MATH,
            LuaOptions::default(),
        )?;
        lua.set_memory_limit(VM_BYTES_MAX)?;
        let g = lua.globals();
        g.raw_set("cjson", crate::libs::cjson::open(&lua)?)?;
        g.raw_set("cmsgpack", crate::libs::cmsgpack::open(&lua)?)?;
        g.raw_set("bit", crate::libs::bit::open(&lua)?)?;
        g.raw_set("struct", crate::libs::structs::open(&lua)?)?;
        let slot = Arc::new(CallSlot::default());
        let redis = redis_table(&lua, &slot)?;
        // `redis.call` raises a command's error; `redis.pcall` returns it as a table.
        for (name, raise) in [("call", true), ("pcall", false)] {
            let c = Arc::clone(control);
            let slot = Arc::clone(&slot);
            redis.raw_set(
                name,
                lua.create_function(move |lua, args: convert::CommandArgs| {
                    command(lua, args, raise, &c, &slot)
                })?,
            )?;
        }
        g.raw_set("redis", redis.clone())?;
        let c = Arc::clone(control);
        let check_killed = lua.create_function(move |_, ()| {
            if c.killed() {
                return Err(mlua::Error::RuntimeError(KILLED.into()));
            }
            Ok(())
        })?;
        let (runtime, globals_meta, seal, nonexistent): (Table, Table, Function, Function) = lua
            .load(include_str!("prelude.lua"))
            .set_name("=prelude")
            .call(check_killed)?;
        let c = Arc::clone(control);
        lua.set_hook(
            HookTriggers::new().every_nth_instruction(HOOK_EVERY),
            move |lua, _| {
                if c.killed() {
                    return Err(mlua::Error::RuntimeError(KILLED.into()));
                }
                let (busy_at, deadline) = lua
                    .app_data_ref::<Running>()
                    .map_or((None, None), |r| (r.busy_at, r.deadline));
                let now = Instant::now();
                if deadline.is_some_and(|d| now >= d) {
                    return Err(mlua::Error::RuntimeError("FUNCTION LOAD timeout".into()));
                }
                if busy_at.is_some_and(|at| now >= at) {
                    c.set_busy();
                }
                Ok(VmState::Continue)
            },
        )?;
        Ok(Env {
            lua,
            runtime,
            globals_meta,
            seal,
            nonexistent,
            slot,
        })
    }
}

/// The `redis` table a script sees, but `call` and `pcall` (bound for each run).
fn redis_table(lua: &Lua, slot: &Arc<CallSlot>) -> mlua::Result<Table> {
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
        lua.create_function(|_, args: mlua::MultiValue| match args.front() {
            Some(Value::String(s)) if args.len() == 1 => Ok(sha1_hex(&s.as_bytes())),
            Some(Value::Integer(n)) if args.len() == 1 => Ok(sha1_hex(n.to_string().as_bytes())),
            _ => Err(mlua::Error::RuntimeError(
                "wrong number of arguments".into(),
            )),
        })?,
    )?;
    redis.raw_set("log", log_function(lua)?)?;
    let slot = Arc::clone(slot);
    redis.raw_set(
        "setresp",
        lua.create_function(move |_, v: i64| {
            if v != 2 && v != 3 {
                return Err(mlua::Error::RuntimeError(
                    "RESP version must be 2 or 3.".into(),
                ));
            }
            slot.resp.store(v as u8, Ordering::Relaxed);
            Ok(())
        })?,
    )?;
    redis.raw_set(
        "set_repl",
        lua.create_function(|_, v: i64| {
            if !(0..=3).contains(&v) {
                return Err(mlua::Error::RuntimeError(
                    "Invalid replication flags. Use REPL_AOF, REPL_REPLICA, REPL_ALL or REPL_NONE."
                        .into(),
                ));
            }
            Ok(())
        })?,
    )?;
    redis.raw_set("replicate_commands", lua.create_function(|_, ()| Ok(true))?)?;
    redis_constants(&redis)?;
    for (name, v) in [
        ("REPL_NONE", 0),
        ("REPL_AOF", 1),
        ("REPL_SLAVE", 2),
        ("REPL_REPLICA", 2),
        ("REPL_ALL", 3),
    ] {
        redis.raw_set(name, v)?;
    }
    Ok(redis)
}

/// The script's line that called the running Rust function (0 when unknown).
fn script_line(lua: &Lua) -> usize {
    lua.inspect_stack(1, |d| d.current_line())
        .flatten()
        .unwrap_or(0)
}

/// `redis.call` (`raise`: an error reply raises a Lua error) and `redis.pcall` (it comes
/// back as an error table), through the run's command runner.
pub(crate) fn command(
    lua: &Lua,
    args: convert::CommandArgs,
    raise: bool,
    control: &Control,
    slot: &CallSlot,
) -> mlua::Result<Value> {
    if control.killed() {
        return Err(mlua::Error::RuntimeError(KILLED.into()));
    }
    // Arguments Redis refuses are answered as a command's error is: raised by
    // `redis.call` (with the script's line), returned as a table by `redis.pcall`.
    let reply = match args.0 {
        Err(e) => Reply::err(e),
        Ok(argv) if argv.is_empty() => {
            Reply::err("ERR Please specify at least one argument for this redis lib call")
        }
        Ok(argv) => {
            // Taken out while it runs: a second `redis.call` meanwhile (there is none:
            // commands a script calls run no Lua) would find nothing rather than alias it.
            let taken = slot.call.swap(std::ptr::null_mut(), Ordering::Acquire);
            if taken.is_null() {
                return Err(mlua::Error::RuntimeError(
                    "ERR redis.call is only available while a script runs".into(),
                ));
            }
            // SAFETY: see `Run::call`: the runner is valid for the whole run, and taking
            // it out of the slot makes this its one user until it is put back.
            let reply = unsafe { (*(*taken).0)(&argv) };
            slot.call.store(taken, Ordering::Release);
            convert::CommandArgs::reuse(argv);
            reply
        }
    };
    if let (true, Reply::Error(e)) = (raise, &reply) {
        let line = script_line(lua);
        if let Some(mut r) = lua.app_data_mut::<Running>() {
            r.raised = Some((e.clone(), line));
        }
        return Err(mlua::Error::RuntimeError(e.clone()));
    }
    convert::to_lua(lua, reply, slot.resp.load(Ordering::Relaxed))
}

/// `redis.log(level, ...)`: accepted; Strata's log does not take script lines.
pub(crate) fn log_function(lua: &Lua) -> mlua::Result<Function> {
    lua.create_function(|_, args: mlua::MultiValue| {
        if args.len() < 2 {
            return Err(mlua::Error::RuntimeError(
                "redis.log() requires two arguments or more.".into(),
            ));
        }
        match args.front() {
            Some(Value::Integer(l)) if (0..=3).contains(l) => Ok(()),
            _ => Err(mlua::Error::RuntimeError("Invalid debug level.".into())),
        }
    })
}

/// `redis.REDIS_VERSION` and `redis.REDIS_VERSION_NUM` (`0x00MMmmpp`), and the log levels:
/// constants both the load-time and the run-time `redis` tables carry.
pub(crate) fn redis_constants(t: &Table) -> mlua::Result<()> {
    let version = strata_resp::REDIS_VERSION;
    t.raw_set("REDIS_VERSION", version)?;
    let num = version
        .split('.')
        .map(|p| p.parse::<i64>().unwrap_or(0))
        .fold(0, |acc, p| (acc << 8) | p);
    t.raw_set("REDIS_VERSION_NUM", num)?;
    for (i, name) in ["LOG_DEBUG", "LOG_VERBOSE", "LOG_NOTICE", "LOG_WARNING"]
        .iter()
        .enumerate()
    {
        t.raw_set(*name, i as i64)?;
    }
    Ok(())
}
