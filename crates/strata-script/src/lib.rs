//! Lua scripts and functions as Redis runs them (`EVAL`, `EVALSHA`, `SCRIPT`, `FUNCTION`,
//! `FCALL`): Lua 5.1 in a sealed VM (`env.rs`: the base, table, string and math libraries,
//! `cjson`, `cmsgpack`, `bit`, `struct`; no io, os, debug, no loading of files; read-only
//! globals), a cache of scripts by SHA1 ([`Vm`]), function libraries ([`Functions`]),
//! `redis.call`/`redis.pcall`, and Redis's conversions between Lua values and replies.
//!
//! The caller runs the commands: a run takes a function that executes one command and
//! answers its reply, so a script reaches exactly what a client reaches. A [`Control`]
//! shared with the caller says when a script has run past the busy threshold and lets
//! another client kill it.

mod control;
mod convert;
mod env;
mod functions;
mod libs;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use mlua::{Function, IntoLuaMulti, Lua, Value};
use strata_resp::Reply;

pub use control::Control;
use convert::lua_err;
pub use convert::sha1_hex;
pub use env::VM_BYTES_MAX;
pub use functions::{FunctionInfo, Functions, Library, RestorePolicy};

/// How a command reached from a script is run: its arguments in, its reply out.
pub type Call<'a> = &'a mut dyn FnMut(&[Bytes]) -> Reply;

/// The flags a script declares (`#!lua flags=...`) or a function registers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flags(u32);

impl Flags {
    pub const NO_WRITES: Flags = Flags(1);
    pub const ALLOW_OOM: Flags = Flags(2);
    pub const ALLOW_STALE: Flags = Flags(4);
    pub const NO_CLUSTER: Flags = Flags(8);
    pub const ALLOW_CROSS_SLOT_KEYS: Flags = Flags(16);
    const NAMES: [(&'static str, Flags); 5] = [
        ("no-writes", Flags::NO_WRITES),
        ("allow-oom", Flags::ALLOW_OOM),
        ("allow-stale", Flags::ALLOW_STALE),
        ("no-cluster", Flags::NO_CLUSTER),
        ("allow-cross-slot-keys", Flags::ALLOW_CROSS_SLOT_KEYS),
    ];

    pub fn contains(self, f: Flags) -> bool {
        self.0 & f.0 == f.0
    }

    fn parse(name: &str) -> Option<Flags> {
        Flags::NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, f)| *f)
    }

    /// The flags' names, as `FUNCTION LIST` shows them.
    pub fn names(self) -> Vec<&'static str> {
        Flags::NAMES
            .iter()
            .filter(|(_, f)| self.contains(*f))
            .map(|(n, _)| *n)
            .collect()
    }
}

impl std::ops::BitOr for Flags {
    type Output = Flags;
    fn bitor(self, o: Flags) -> Flags {
        Flags(self.0 | o.0)
    }
}

/// A cached script: its compiled body and the flags its shebang declares.
struct Script {
    body: Function,
    flags: Flags,
}

/// The Lua VM of `EVAL` and its script cache.
pub struct Vm {
    env: env::Env,
    control: Arc<Control>,
    scripts: HashMap<String, Script>,
}

/// Splits a script's `#!lua flags=...` first line off; the body keeps the line's newline
/// so line numbers stay the same.
fn shebang(body: &[u8]) -> Result<(Flags, Vec<u8>), Reply> {
    if !body.starts_with(b"#!") {
        return Ok((Flags::default(), body.to_vec()));
    }
    let end = body.iter().position(|&b| b == b'\n').unwrap_or(body.len());
    let line = String::from_utf8_lossy(&body[2..end]).to_string();
    let mut words = line.split_ascii_whitespace();
    let engine = words.next().unwrap_or("");
    if !engine.eq_ignore_ascii_case("lua") {
        return Err(Reply::err(format!(
            "ERR Unexpected engine in script shebang: {engine}"
        )));
    }
    let mut flags = Flags::default();
    for w in words {
        let Some(list) = w.strip_prefix("flags=") else {
            return Err(Reply::err(format!("ERR Unknown lua shebang option: {w}")));
        };
        for f in list.split(',').filter(|f| !f.is_empty()) {
            flags = flags
                | Flags::parse(f).ok_or_else(|| {
                    Reply::err(format!("ERR Unexpected flag in script shebang: {f}"))
                })?;
        }
    }
    Ok((flags, body[end..].to_vec()))
}

impl Vm {
    pub fn new(control: Arc<Control>) -> Result<Vm, String> {
        Ok(Vm {
            env: env::Env::new(&control)?,
            control,
            scripts: HashMap::new(),
        })
    }

    /// Compiles `body` into the cache (`SCRIPT LOAD`, and `EVAL` before it runs); answers
    /// its SHA1, or Redis's compile error.
    pub fn load(&mut self, body: &[u8]) -> Result<String, Reply> {
        let sha = sha1_hex(body);
        if !self.scripts.contains_key(&sha) {
            let (flags, source) = shebang(body)?;
            let f = self
                .env
                .lua
                .load(&source)
                .set_name("@user_script")
                .into_function()
                .map_err(|e| {
                    Reply::err(format!(
                        "ERR Error compiling script (new function): {}",
                        lua_err(e)
                    ))
                })?;
            self.scripts.insert(sha.clone(), Script { body: f, flags });
        }
        Ok(sha)
    }

    pub fn exists(&self, sha: &[u8]) -> bool {
        std::str::from_utf8(sha).is_ok_and(|s| self.script(s).is_some())
    }

    /// The flags script `sha` declares, if it is cached.
    pub fn flags(&self, sha: &str) -> Option<Flags> {
        self.script(sha).map(|s| s.flags)
    }

    /// The cached script `sha` (any case; clients send it as `SCRIPT LOAD` answered it,
    /// lower case, so that look-up allocates nothing).
    fn script(&self, sha: &str) -> Option<&Script> {
        if sha.bytes().any(|b| b.is_ascii_uppercase()) {
            self.scripts.get(&sha.to_ascii_lowercase())
        } else {
            self.scripts.get(sha)
        }
    }

    /// Scripts in the cache.
    pub fn len(&self) -> usize {
        self.scripts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.scripts.is_empty()
    }

    /// Forgets every script (`SCRIPT FLUSH`).
    pub fn flush(&mut self) {
        self.scripts.clear();
        let _ = self.env.lua.gc_collect();
    }

    /// Runs the cached script `sha` with `KEYS` and `ARGV`, reaching commands through
    /// `call` (on the caller's thread: `redis.call` is bound to it for this run only);
    /// past `busy_after` it is busy (see [`Control`]).
    pub fn run(
        &mut self,
        sha: &str,
        keys: &[Bytes],
        argv: &[Bytes],
        call: Call<'_>,
        busy_after: Option<Duration>,
    ) -> Reply {
        let Some(f) = self.script(sha).map(|s| s.body.clone()) else {
            return Reply::err("NOSCRIPT No matching script. Please use EVAL.");
        };
        if let Err(e) = set_keys_argv(&self.env, keys, argv) {
            return Reply::err(format!("ERR {}", lua_err(e)));
        }
        let run = Run {
            env: &self.env,
            control: &self.control,
            function: false,
            name: sha,
            chunk: "user_script",
        };
        run.call(&f, (), call, busy_after)
    }
}

/// One run of a script or function: binds `redis.call`, runs, converts the result or the
/// error as Redis words it.
pub(crate) struct Run<'a> {
    pub(crate) env: &'a env::Env,
    pub(crate) control: &'a Control,
    pub(crate) function: bool,
    /// What errors name: the script's SHA1 or the function's name.
    pub(crate) name: &'a str,
    /// The chunk name errors carry (`user_script`, `user_function`).
    pub(crate) chunk: &'a str,
}

impl Run<'_> {
    pub(crate) fn call(
        &self,
        f: &Function,
        args: impl IntoLuaMulti,
        call: Call<'_>,
        busy_after: Option<Duration>,
    ) -> Reply {
        let lua = &self.env.lua;
        let call: *mut (dyn FnMut(&[Bytes]) -> Reply + '_) = call;
        // SAFETY: only the lifetime is erased. The pointer lives in the VM's call slot, which
        // is emptied below before this function returns (and `call` outlives this frame);
        // `redis.call` takes it out while it calls, so it is never used twice at once.
        let call = unsafe {
            std::mem::transmute::<
                *mut (dyn FnMut(&[Bytes]) -> Reply + '_),
                *mut (dyn FnMut(&[Bytes]) -> Reply + 'static),
            >(call)
        };
        lua.set_app_data(env::Running {
            raised: None,
            busy_at: busy_after.map(|l| Instant::now() + l),
            deadline: None,
        });
        let mut raw = env::RawCall(call);
        let slot = &self.env.slot;
        slot.resp.store(2, Ordering::Relaxed);
        slot.call.store(&mut raw, Ordering::Release);
        self.control.begin(self.function);
        let result = f.call::<Value>(args);
        self.control.end();
        slot.call.store(std::ptr::null_mut(), Ordering::Release);
        let running = lua.remove_app_data::<env::Running>();
        let resp = slot.resp.load(Ordering::Relaxed);
        match result {
            Ok(v) => convert::to_reply(&v, 0, resp),
            Err(e) => self.error(e, running.and_then(|r| r.raised)),
        }
    }

    fn error(&self, e: mlua::Error, raised: Option<(String, usize)>) -> Reply {
        let (name, chunk) = (self.name, self.chunk);
        if let Some((raised, line)) = raised {
            return Reply::Error(format!("{raised} script: {name}, on @{chunk}:{line}."));
        }
        let m = lua_err(e);
        if m == env::KILLED {
            return Reply::Error(m);
        }
        // Lua's message starts with where: "<chunk>:<line>: ...".
        let line = m
            .strip_prefix(chunk)
            .and_then(|r| r.strip_prefix(':'))
            .and_then(|r| r.split(':').next())
            .and_then(|n| n.parse::<usize>().ok());
        let body = if m.starts_with("ERR ") {
            m.clone()
        } else {
            format!("ERR {m}")
        };
        Reply::Error(format!(
            "{body} script: {name}, on @{chunk}:{}.",
            line.unwrap_or(0)
        ))
    }
}

/// `KEYS` and `ARGV` of a run: Lua tables of the byte strings, numbered from 1 (the
/// arguments of a function).
pub(crate) fn bytes_tables(
    lua: &Lua,
    keys: &[Bytes],
    argv: &[Bytes],
) -> mlua::Result<(mlua::Table, mlua::Table)> {
    // One protected call for both tables: through mlua's API each string and each table
    // is a protected call of its own (a tenth of a one-call script's time).
    // SAFETY: the closure pushes two tables (and one string at a time, set at once), in
    // the three stack slots `exec_raw` checked; any Lua error is caught by `exec_raw`.
    unsafe {
        lua.exec_raw((), |state| {
            push_bytes_table(state, keys);
            push_bytes_table(state, argv);
        })
    }
}

/// Sets a script's globals `KEYS` and `ARGV` (in the table its globals resolve to), in
/// one protected call: table, name and strings set one at a time.
fn set_keys_argv(env: &env::Env, keys: &[Bytes], argv: &[Bytes]) -> mlua::Result<()> {
    // SAFETY: the runtime table is the closure's first stack slot (popped at the end); it pushes at most a
    // name, a table and a string above it (a C function has 20 slots); `lua_rawset` pops
    // the name and the table. Lua errors (memory) are caught by `exec_raw`.
    unsafe {
        env.lua.exec_raw(&env.runtime, |state| {
            for (name, items) in [(c"KEYS", keys), (c"ARGV", argv)] {
                mlua::ffi::lua_pushstring(state, name.as_ptr());
                push_bytes_table(state, items);
                mlua::ffi::lua_rawset(state, 1);
            }
            mlua::ffi::lua_settop(state, 0);
        })
    }
}

/// Pushes a table of `items` as Lua strings, numbered from 1.
///
/// # Safety
/// `state` has two free stack slots, inside a protected call.
unsafe fn push_bytes_table(state: *mut mlua::ffi::lua_State, items: &[Bytes]) {
    let n = items.len().min(i32::MAX as usize) as i32;
    mlua::ffi::lua_createtable(state, n, 0);
    for (i, b) in items.iter().enumerate() {
        mlua::ffi::lua_pushlstring(state, b.as_ptr().cast(), b.len());
        mlua::ffi::lua_rawseti(state, -2, i as i64 + 1);
    }
}

#[cfg(test)]
mod tests;
