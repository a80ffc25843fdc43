//! Redis's conversions between replies and Lua values, both ways, in RESP2 and in RESP3
//! (`redis.setresp(3)`). The caller's own protocol is applied later, when the reply is
//! written: a RESP3 map reaches a RESP2 client as a flat array.

use std::cell::RefCell;

use bytes::Bytes;
use mlua::{ffi, FromLuaMulti, Lua, MultiValue, Table, Value};
use strata_resp::Reply;

/// Deepest table a script's reply may nest.
const REPLY_DEPTH_MAX: usize = 64;

/// What Redis answers a `redis.call` argument that is neither a string nor a number.
const ARG_NOT_STRING: &str = "ERR Lua redis lib command arguments must be strings or integers";

/// The arguments of a `redis.call`, converted as Redis converts them: a string as it is, a
/// number as C's `%.17g` writes it; anything else refuses the call. They are read straight
/// off Lua's stack, not through mlua's values.
pub(crate) struct CommandArgs(pub(crate) Result<Vec<Bytes>, &'static str>);

thread_local! {
    /// The command name the last `redis.call` on this thread named, and an emptied
    /// argument list: a script calls a command or two over and over, and then neither
    /// costs an allocation per call.
    static REUSED: RefCell<(Bytes, Vec<Bytes>)> = const { RefCell::new((Bytes::new(), Vec::new())) };
}

/// Most arguments a list kept for reuse may have room for.
const REUSED_ARGS_MAX: usize = 64;

impl CommandArgs {
    /// Gives back a call's argument list once the call is over (see `REUSED`).
    pub(crate) fn reuse(mut args: Vec<Bytes>) {
        REUSED.with_borrow_mut(|(name, list)| {
            if let Some(first) = args.first() {
                if first != name {
                    *name = first.clone();
                }
            }
            if args.capacity() <= REUSED_ARGS_MAX {
                args.clear();
                *list = args;
            }
        });
    }
}

/// A numeric argument as C's `%.17g` writes it: an integral number below 1e17 as its
/// digits, the rest through [`strata_resp::format_g`].
fn number_arg(n: f64) -> Bytes {
    let negative_zero = n == 0.0 && n.is_sign_negative();
    if n.fract() == 0.0 && n.abs() < 1e17 && !negative_zero {
        Bytes::copy_from_slice(itoa::Buffer::new().format(n as i64).as_bytes())
    } else {
        Bytes::from(strata_resp::format_g(n, 17))
    }
}

impl FromLuaMulti for CommandArgs {
    fn from_lua_multi(values: MultiValue, _: &Lua) -> mlua::Result<Self> {
        let mut args = Vec::with_capacity(values.len());
        for v in values.iter() {
            args.push(match v {
                Value::String(s) => Bytes::copy_from_slice(&s.as_bytes()),
                Value::Integer(n) => number_arg(*n as f64),
                Value::Number(n) => number_arg(*n),
                _ => return Ok(CommandArgs(Err(ARG_NOT_STRING))),
            });
        }
        Ok(CommandArgs(Ok(args)))
    }

    unsafe fn from_stack_args(
        nargs: std::ffi::c_int,
        _: usize,
        _: Option<&str>,
        lua: &mlua::state::RawLua,
    ) -> mlua::Result<Self> {
        let state = lua.state();
        let (name, mut args) = REUSED.with_borrow_mut(|(n, l)| (n.clone(), std::mem::take(l)));
        args.reserve(nargs.max(0) as usize);
        for idx in -nargs..0 {
            // SAFETY: `idx` is one of the callback's `nargs` arguments on `state`'s stack;
            // `lua_tolstring` is called on strings only (it would convert a number in
            // place), and the bytes it points to live while the argument is on the stack.
            args.push(match unsafe { ffi::lua_type(state, idx) } {
                ffi::LUA_TSTRING => unsafe {
                    let mut len = 0;
                    let at = ffi::lua_tolstring(state, idx, &mut len);
                    let arg = std::slice::from_raw_parts(at.cast::<u8>(), len);
                    if idx == -nargs && arg == &name[..] {
                        name.clone()
                    } else {
                        Bytes::copy_from_slice(arg)
                    }
                },
                ffi::LUA_TNUMBER => number_arg(unsafe { ffi::lua_tonumber(state, idx) }),
                _ => return Ok(CommandArgs(Err(ARG_NOT_STRING))),
            });
        }
        Ok(CommandArgs(Ok(args)))
    }
}

fn single(lua: &Lua, field: &str, v: impl mlua::IntoLua) -> mlua::Result<Value> {
    let t = lua.create_table()?;
    t.raw_set(field, v)?;
    Ok(Value::Table(t))
}

/// A command's reply as a script sees it: integers as numbers, bulks as strings, status
/// and error as `{ok=...}` and `{err=...}`, arrays as tables; in RESP2 nil as false, maps
/// and sets flattened, doubles as strings; in RESP3 nil as nil, `{map=...}`, `{set=...}`,
/// `{double=...}`, booleans as booleans.
pub(crate) fn to_lua(lua: &Lua, r: Reply, resp: u8) -> mlua::Result<Value> {
    let resp3 = resp == 3;
    Ok(match r {
        Reply::Simple(s) => single(lua, "ok", s)?,
        Reply::Error(e) => single(lua, "err", e)?,
        Reply::Integer(n) => Value::Integer(n),
        Reply::Bulk(b) => Value::String(lua.create_string(&b)?),
        Reply::Null | Reply::NullArray | Reply::NoReply if resp3 => Value::Nil,
        Reply::Null | Reply::NullArray | Reply::NoReply => Value::Boolean(false),
        Reply::Bool(b) if resp3 => Value::Boolean(b),
        Reply::Bool(b) => Value::Integer(b as i64),
        Reply::Double(d) if resp3 => single(lua, "double", d)?,
        Reply::Double(d) => Value::String(lua.create_string(strata_resp::format_double(d))?),
        Reply::Verbatim(s) if resp3 => {
            let t = lua.create_table()?;
            t.raw_set("format", "txt")?;
            t.raw_set("string", lua.create_string(s)?)?;
            single(lua, "verbatim_string", t)?
        }
        Reply::Verbatim(s) => Value::String(lua.create_string(s)?),
        Reply::Array(items) => array(lua, items, resp)?,
        Reply::Set(items) if resp3 => {
            let t = lua.create_table_with_capacity(0, items.len())?;
            for item in items {
                t.raw_set(to_lua(lua, item, resp)?, true)?;
            }
            single(lua, "set", t)?
        }
        Reply::Set(items) => array(lua, items, resp)?,
        Reply::Map(pairs) if resp3 => {
            let t = lua.create_table_with_capacity(0, pairs.len())?;
            for (k, v) in pairs {
                t.raw_set(to_lua(lua, k, resp)?, to_lua(lua, v, resp)?)?;
            }
            single(lua, "map", t)?
        }
        Reply::Map(pairs) => {
            let t = lua.create_table_with_capacity(pairs.len() * 2, 0)?;
            for (i, (k, v)) in pairs.into_iter().enumerate() {
                t.raw_seti(2 * i + 1, to_lua(lua, k, resp)?)?;
                t.raw_seti(2 * i + 2, to_lua(lua, v, resp)?)?;
            }
            Value::Table(t)
        }
    })
}

fn array(lua: &Lua, items: Vec<Reply>, resp: u8) -> mlua::Result<Value> {
    let t = lua.create_table_with_capacity(items.len(), 0)?;
    for (i, item) in items.into_iter().enumerate() {
        t.raw_seti(i + 1, to_lua(lua, item, resp)?)?;
    }
    Ok(Value::Table(t))
}

/// An error table's message as Redis replies with it (an empty one is `ERR`).
fn error_line(e: &mlua::LuaString) -> String {
    let s = e.to_string_lossy();
    let s = s.trim_start_matches('-');
    if s.is_empty() {
        "ERR".into()
    } else {
        s.to_string()
    }
}

/// `n` cast to an integer as Redis's C cast `(long long)` does on x86-64: truncated toward
/// zero, and a number out of range (or NaN) becomes `i64::MIN` (the processor's "integer
/// indefinite"), where Rust's cast would saturate. An `INCR` to `i64::MAX` returned
/// through Lua is a double of 2^63: Redis answers `i64::MIN`.
fn c_long_long(n: f64) -> i64 {
    const TWO_TO_63: f64 = 9_223_372_036_854_775_808.0;
    if (-TWO_TO_63..TWO_TO_63).contains(&n) {
        n as i64
    } else {
        i64::MIN
    }
}

/// A Lua value as Redis replies with it: numbers truncated to integers, strings as bulks,
/// `{err=...}` and `{ok=...}` as error and status, other tables as arrays up to their
/// first nil; in RESP2 true as 1 and false as nil, in RESP3 booleans, `{map=...}`,
/// `{set=...}`, `{double=...}`, `{big_number=...}` and `{verbatim_string=...}`.
pub(crate) fn to_reply(v: &Value, depth: usize, resp: u8) -> Reply {
    match v {
        Value::Integer(n) => Reply::Integer(*n),
        Value::Number(n) => Reply::Integer(c_long_long(*n)),
        Value::String(s) => Reply::Bulk(Bytes::copy_from_slice(&s.as_bytes())),
        Value::Boolean(b) if resp == 3 => Reply::Bool(*b),
        Value::Boolean(true) => Reply::Integer(1),
        Value::Table(t) => table_reply(t, depth, resp),
        _ => Reply::Null,
    }
}

fn table_reply(t: &Table, depth: usize, resp: u8) -> Reply {
    let field = |name: &str| t.raw_get::<Value>(name).unwrap_or(Value::Nil);
    if let Value::String(e) = field("err") {
        return Reply::Error(error_line(&e));
    }
    if let Value::String(s) = field("ok") {
        return Reply::Simple(s.to_string_lossy());
    }
    if depth >= REPLY_DEPTH_MAX {
        return Reply::err("ERR reached lua stack limit");
    }
    if resp == 3 {
        if let Value::Table(m) = field("map") {
            let pairs = m
                .pairs::<Value, Value>()
                .filter_map(|p| p.ok())
                .map(|(k, v)| (to_reply(&k, depth + 1, resp), to_reply(&v, depth + 1, resp)))
                .collect();
            return Reply::Map(pairs);
        }
        if let Value::Table(s) = field("set") {
            let items = s
                .pairs::<Value, Value>()
                .filter_map(|p| p.ok())
                .map(|(k, _)| to_reply(&k, depth + 1, resp))
                .collect();
            return Reply::Set(items);
        }
        match field("double") {
            Value::Number(d) => return Reply::Double(d),
            Value::Integer(d) => return Reply::Double(d as f64),
            _ => {}
        }
        if let Value::String(b) = field("big_number") {
            return Reply::Bulk(Bytes::copy_from_slice(&b.as_bytes()));
        }
        if let Value::Table(v) = field("verbatim_string") {
            if let Ok(Value::String(s)) = v.raw_get::<Value>("string") {
                return Reply::Verbatim(s.to_string_lossy());
            }
        }
    }
    let mut items = Vec::new();
    for i in 1.. {
        match t.raw_get::<Value>(i) {
            Ok(Value::Nil) | Err(_) => break,
            Ok(item) => items.push(to_reply(&item, depth + 1, resp)),
        }
    }
    Reply::Array(items)
}

/// The SHA1 of `body` in lowercase hex, as `SCRIPT LOAD` answers it.
pub fn sha1_hex(body: &[u8]) -> String {
    sha1_smol::Sha1::from(body).digest().to_string()
}

pub(crate) fn lua_err(e: mlua::Error) -> String {
    // mlua wraps errors raised in callbacks; the innermost message is the one to show.
    match e {
        mlua::Error::CallbackError { cause, .. } => lua_err((*cause).clone()),
        // A Lua error raised in Lua carries mlua's traceback after the message.
        mlua::Error::RuntimeError(m) | mlua::Error::SyntaxError { message: m, .. } => m
            .split_once("\nstack traceback:")
            .map_or(m.clone(), |(msg, _)| msg.to_string()),
        mlua::Error::MemoryError(m) => format!("not enough memory ({m})"),
        other => other.to_string(),
    }
}
