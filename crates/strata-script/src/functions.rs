//! Redis 7 functions: libraries of Lua functions loaded with `FUNCTION LOAD` (a
//! `#!lua name=<library>` first line, then code that calls `redis.register_function`),
//! called with `FCALL`, listed, deleted, dumped and restored. Library code runs once, at
//! load, in a small environment (only `redis.register_function` and `redis.log`); the
//! functions it registers run with the full one.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mlua::{Function, Table, Value};
use strata_resp::Reply;

use crate::env::Env;
use crate::{bytes_tables, lua_err, Call, Control, Flags, Run};

/// A function as `FUNCTION LIST` shows it.
#[derive(Debug, Clone)]
pub struct FunctionInfo {
    pub name: String,
    pub description: Option<String>,
    pub flags: Flags,
}

/// A loaded library: its name, its code (as loaded) and its functions.
#[derive(Clone)]
pub struct Library {
    pub name: String,
    pub code: Bytes,
    pub functions: Vec<FunctionInfo>,
    callbacks: Vec<Function>,
}

/// How `FUNCTION RESTORE` treats the libraries already loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestorePolicy {
    /// Refuse if any restored library exists.
    Append,
    /// Restored libraries replace those of the same name.
    Replace,
    /// Drop every library first.
    Flush,
}

/// What `redis.register_function` collects during a load.
#[derive(Default)]
struct Loading {
    registered: Vec<(FunctionInfo, Function)>,
}

/// Longest time library code may run at load.
const LOAD_TIME_MAX: Duration = Duration::from_millis(500);
/// A dump's first bytes and version; a dump ends with the first 8 bytes of the SHA1 of
/// what precedes them.
const DUMP_MAGIC: &[u8] = b"STRATA-FUNCTIONS";
const DUMP_VERSION: u8 = 1;

fn err(m: impl Into<String>) -> Reply {
    Reply::err(m.into())
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

const NAME_RULE: &str = "Library names can only contain letters, numbers, or underscores(_) and must be at least one character long";

/// The function libraries of a server, in their own VM.
pub struct Functions {
    env: Env,
    control: Arc<Control>,
    /// The environment library code loads in.
    load_env: Table,
    /// By lowercase name.
    libraries: BTreeMap<String, Library>,
    /// Lowercase function name → lowercase library name, index of the function.
    by_name: HashMap<String, (String, usize)>,
}

/// The library name a `#!lua name=...` first line gives, and the code with that line
/// blanked (line numbers stay the same).
fn header(code: &[u8]) -> Result<(String, Vec<u8>), Reply> {
    if !code.starts_with(b"#!") {
        return Err(err("ERR Missing library metadata"));
    }
    let end = code.iter().position(|&b| b == b'\n').unwrap_or(code.len());
    let line = String::from_utf8_lossy(&code[2..end]).to_string();
    let (engine, rest) = match line.split_once(' ') {
        Some((e, r)) => (e, r),
        None => (line.as_str(), ""),
    };
    if !engine.eq_ignore_ascii_case("lua") {
        return Err(err(format!("ERR Engine '{engine}' not found")));
    }
    let mut name = None;
    for w in rest.split_ascii_whitespace() {
        match w.split_once('=') {
            Some(("name", v)) => {
                if name.is_some() {
                    return Err(err(
                        "ERR Invalid metadata value, name argument was given multiple times",
                    ));
                }
                name = Some(v.trim_matches('"').to_string());
            }
            _ => return Err(err(format!("ERR Invalid metadata value given: {w}"))),
        }
    }
    let name = name.ok_or_else(|| err("ERR Library name was not given"))?;
    if !valid_name(&name) {
        return Err(err(format!("ERR {NAME_RULE}")));
    }
    Ok((name, code[end..].to_vec()))
}

impl Functions {
    pub fn new(control: Arc<Control>) -> Result<Functions, String> {
        let env = Env::new(&control)?;
        let load_env = load_env(&env).map_err(lua_err)?;
        Ok(Functions {
            env,
            control,
            load_env,
            libraries: BTreeMap::new(),
            by_name: HashMap::new(),
        })
    }

    /// `FUNCTION LOAD [REPLACE] code`: answers the library's name.
    pub fn load(&mut self, code: &[u8], replace: bool) -> Result<String, Reply> {
        let (name, source) = header(code)?;
        let key = name.to_ascii_lowercase();
        if !replace && self.libraries.contains_key(&key) {
            return Err(err(format!("ERR Library '{name}' already exists")));
        }
        let registered = self.run_library(&source)?;
        for (info, _) in &registered {
            if let Some((lib, _)) = self.by_name.get(&info.name.to_ascii_lowercase()) {
                if *lib != key {
                    return Err(err(format!("ERR Function {} already exists", info.name)));
                }
            }
        }
        self.remove(&key);
        let (functions, callbacks) = registered.into_iter().unzip();
        self.insert(Library {
            name,
            code: Bytes::copy_from_slice(code),
            functions,
            callbacks,
        });
        Ok(self.libraries[&key].name.clone())
    }

    /// Runs library code in the load environment; what it registered.
    fn run_library(&self, source: &[u8]) -> Result<Vec<(FunctionInfo, Function)>, Reply> {
        let lua = &self.env.lua;
        let chunk = lua
            .load(source)
            .set_name("@user_function")
            .into_function()
            .map_err(|e| err(format!("ERR Error compiling function: {}", lua_err(e))))?;
        let meta = &self.env.globals_meta;
        let setup = || -> mlua::Result<()> { meta.raw_set("__index", self.load_env.clone()) };
        setup().map_err(|e| err(format!("ERR {}", lua_err(e))))?;
        lua.set_app_data(Loading::default());
        lua.set_app_data(crate::env::Running {
            raised: None,
            busy_at: None,
            deadline: Some(std::time::Instant::now() + LOAD_TIME_MAX),
        });
        let result = chunk.call::<()>(());
        lua.remove_app_data::<crate::env::Running>();
        let _ = meta.raw_set("__index", self.env.runtime.clone());
        let loading = lua.remove_app_data::<Loading>().unwrap_or_default();
        if let Err(e) = result {
            return Err(err(format!(
                "ERR Error registering functions: {}",
                lua_err(e)
            )));
        }
        if loading.registered.is_empty() {
            return Err(err("ERR No functions registered"));
        }
        Ok(loading.registered)
    }

    fn insert(&mut self, lib: Library) {
        let key = lib.name.to_ascii_lowercase();
        for (i, f) in lib.functions.iter().enumerate() {
            self.by_name
                .insert(f.name.to_ascii_lowercase(), (key.clone(), i));
        }
        self.libraries.insert(key, lib);
    }

    fn remove(&mut self, key: &str) -> Option<Library> {
        let lib = self.libraries.remove(key)?;
        for f in &lib.functions {
            self.by_name.remove(&f.name.to_ascii_lowercase());
        }
        Some(lib)
    }

    /// `FUNCTION DELETE name`.
    pub fn delete(&mut self, name: &[u8]) -> Result<(), Reply> {
        let key = String::from_utf8_lossy(name).to_ascii_lowercase();
        self.remove(&key)
            .map(|_| ())
            .ok_or_else(|| err("ERR Library not found"))
    }

    /// `FUNCTION FLUSH`.
    pub fn flush(&mut self) {
        self.libraries.clear();
        self.by_name.clear();
        let _ = self.env.lua.gc_collect();
    }

    /// The libraries, by name.
    pub fn libraries(&self) -> impl Iterator<Item = &Library> {
        self.libraries.values()
    }

    /// Libraries and functions loaded (`FUNCTION STATS`).
    pub fn counts(&self) -> (usize, usize) {
        (self.libraries.len(), self.by_name.len())
    }

    /// The function `name` (any case), if loaded.
    pub fn function(&self, name: &[u8]) -> Option<&FunctionInfo> {
        let (lib, i) = self
            .by_name
            .get(&String::from_utf8_lossy(name).to_ascii_lowercase())?;
        self.libraries.get(lib).map(|l| &l.functions[*i])
    }

    /// `FCALL`: runs function `name` with `KEYS` and `ARGV` as its two arguments.
    pub fn call(
        &mut self,
        name: &[u8],
        keys: &[Bytes],
        argv: &[Bytes],
        call: Call<'_>,
        busy_after: Option<Duration>,
    ) -> Reply {
        let key = String::from_utf8_lossy(name).to_ascii_lowercase();
        let Some((lib, i)) = self.by_name.get(&key) else {
            return err("ERR Function not found");
        };
        let library = &self.libraries[lib];
        let f = library.callbacks[*i].clone();
        let fname = library.functions[*i].name.clone();
        let lua = &self.env.lua;
        let args = match bytes_tables(lua, keys, argv) {
            Ok(ka) => ka,
            Err(e) => return err(format!("ERR {}", lua_err(e))),
        };
        let run = Run {
            env: &self.env,
            control: &self.control,
            function: true,
            name: &fname,
            chunk: "user_function",
        };
        run.call(&f, args, call, busy_after)
    }

    /// `FUNCTION DUMP`: every library's code, in a payload only `restore` reads.
    pub fn dump(&self) -> Vec<u8> {
        let mut out = DUMP_MAGIC.to_vec();
        out.push(DUMP_VERSION);
        for lib in self.libraries.values() {
            out.extend_from_slice(&(lib.code.len() as u32).to_le_bytes());
            out.extend_from_slice(&lib.code);
        }
        let sum = sha1_smol::Sha1::from(&out).digest().bytes();
        out.extend_from_slice(&sum[..8]);
        out
    }

    /// `FUNCTION RESTORE payload [APPEND|REPLACE|FLUSH]`: all the payload's libraries or,
    /// on any error, none.
    pub fn restore(&mut self, payload: &[u8], policy: RestorePolicy) -> Result<(), Reply> {
        let codes =
            parse_dump(payload).ok_or_else(|| err("ERR payload version or checksum are wrong"))?;
        let saved = (self.libraries.clone(), self.by_name.clone());
        if policy == RestorePolicy::Flush {
            self.libraries.clear();
            self.by_name.clear();
        }
        for code in codes {
            let appended = match header(code) {
                Ok((name, _))
                    if policy == RestorePolicy::Append
                        && self.libraries.contains_key(&name.to_ascii_lowercase()) =>
                {
                    Err(err(format!("ERR Library {name} already exists")))
                }
                _ => self.load(code, true).map(|_| ()),
            };
            if let Err(e) = appended {
                (self.libraries, self.by_name) = saved;
                return Err(e);
            }
        }
        Ok(())
    }
}

/// The library codes of a dump, if its version and checksum hold.
fn parse_dump(p: &[u8]) -> Option<Vec<&[u8]>> {
    let body_len = p.len().checked_sub(8)?;
    let (body, sum) = p.split_at(body_len);
    if !body.starts_with(DUMP_MAGIC)
        || body.get(DUMP_MAGIC.len()) != Some(&DUMP_VERSION)
        || sha1_smol::Sha1::from(body).digest().bytes()[..8] != *sum
    {
        return None;
    }
    let mut rest = &body[DUMP_MAGIC.len() + 1..];
    let mut out = Vec::new();
    while !rest.is_empty() {
        let len = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        out.push(rest.get(4..4 + len)?);
        rest = &rest[4 + len..];
    }
    Some(out)
}

/// The environment library code runs in: `redis.register_function`, `redis.log` and the
/// log levels, nothing else (reading anything else raises, as for an undefined global).
fn load_env(env: &Env) -> mlua::Result<Table> {
    let lua = &env.lua;
    let guard = lua.create_table()?;
    guard.raw_set("__index", env.nonexistent.clone())?;
    let api = lua.create_table()?;
    api.raw_set("register_function", lua.create_function(register)?)?;
    api.raw_set("log", crate::env::log_function(lua)?)?;
    crate::env::redis_constants(&api)?;
    api.set_metatable(Some(guard.clone()))?;
    let sealed: Table = env.seal.call(api)?;
    let top = lua.create_table()?;
    top.raw_set("redis", sealed)?;
    top.set_metatable(Some(guard))?;
    Ok(top)
}

/// A wrong argument to `redis.register_function`: missing or of the wrong type when given
/// by name, or wrong when given by position.
fn argument_error(
    named: bool,
    given: &Value,
    missing: &str,
    wrong_named: &str,
    wrong_positional: &str,
) -> mlua::Error {
    runtime_error(match (named, given) {
        (true, Value::Nil) => missing,
        (true, _) => wrong_named,
        (false, _) => wrong_positional,
    })
}

fn runtime_error(m: impl Into<String>) -> mlua::Error {
    mlua::Error::RuntimeError(m.into())
}

/// `redis.register_function(name, callback)` or `redis.register_function{function_name=,
/// callback=, flags=, description=}`.
fn register(lua: &mlua::Lua, args: mlua::MultiValue) -> mlua::Result<()> {
    if lua.app_data_ref::<Loading>().is_none() {
        return Err(runtime_error(
            "redis.register_function can only be called on FUNCTION LOAD command",
        ));
    }
    let args_were_named = args.len() == 1;
    let (name, callback, flags, description) = match args.len() {
        1 => {
            let Some(Value::Table(t)) = args.front() else {
                return Err(runtime_error("calling redis.register_function with a single argument is only applicable to Lua table (representing named arguments)."));
            };
            let (mut name, mut callback, mut flags, mut description) =
                (Value::Nil, Value::Nil, Flags::default(), None);
            for pair in t.pairs::<Value, Value>() {
                let (k, v) = pair?;
                let k =
                    match &k {
                        Value::String(s) => s.to_string_lossy(),
                        _ => return Err(runtime_error(
                            "named argument key given to redis.register_function is not a string",
                        )),
                    };
                match k.as_str() {
                    "function_name" => name = v,
                    "callback" => callback = v,
                    "description" => match v {
                        Value::String(s) => description = Some(s.to_string_lossy()),
                        _ => return Err(runtime_error("description argument given to redis.register_function must be a string")),
                    },
                    "flags" => {
                        let Value::Table(list) = v else {
                            return Err(runtime_error("flags argument to redis.register_function must be a table representing function flags"));
                        };
                        for f in list.sequence_values::<Value>() {
                            let f = match f? {
                                Value::String(s) => s.to_string_lossy(),
                                _ => return Err(runtime_error("unknown flag given")),
                            };
                            flags = flags
                                | Flags::parse(&f).ok_or_else(|| runtime_error("unknown flag given"))?;
                        }
                    }
                    _ => return Err(runtime_error("unknown argument given to redis.register_function")),
                }
            }
            (name, callback, flags, description)
        }
        2 => {
            let mut it = args.into_iter();
            let name = it.next().unwrap_or(Value::Nil);
            let callback = it.next().unwrap_or(Value::Nil);
            (name, callback, Flags::default(), None)
        }
        _ => {
            return Err(runtime_error(
                "wrong number of arguments to redis.register_function",
            ))
        }
    };
    // Redis words the two forms' errors differently.
    let name = match name {
        Value::String(n) => n,
        other => {
            return Err(argument_error(
                args_were_named,
                &other,
                "redis.register_function must get a function name argument",
                "function_name argument given to redis.register_function must be a string",
                "first argument to redis.register_function must be a string",
            ))
        }
    };
    let callback = match callback {
        Value::Function(f) => f,
        other => {
            return Err(argument_error(
                args_were_named,
                &other,
                "redis.register_function must get a callback argument",
                "callback argument given to redis.register_function must be a function",
                "second argument to redis.register_function must be a function",
            ))
        }
    };
    let name = name.to_string_lossy();
    if !valid_name(&name) {
        return Err(runtime_error(NAME_RULE));
    }
    let mut loading = lua.app_data_mut::<Loading>().expect("checked at the start");
    if loading
        .registered
        .iter()
        .any(|(f, _)| f.name.eq_ignore_ascii_case(&name))
    {
        return Err(runtime_error("Function already exists in the library"));
    }
    loading.registered.push((
        FunctionInfo {
            name,
            description,
            flags,
        },
        callback,
    ));
    Ok(())
}
