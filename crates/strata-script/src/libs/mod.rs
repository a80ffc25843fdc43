//! The libraries Redis gives scripts besides Lua's own: `cjson`, `cmsgpack`, `bit` and
//! `struct`, written here in Rust against Redis's documented behaviour.

pub(crate) mod bit;
pub(crate) mod cjson;
pub(crate) mod cmsgpack;
pub(crate) mod structs;

/// A Lua number as `f64` (mlua hands integral ones over as integers), or `None`.
pub(crate) fn lua_number(v: &mlua::Value) -> Option<f64> {
    match v {
        mlua::Value::Integer(i) => Some(*i as f64),
        mlua::Value::Number(n) => Some(*n),
        _ => None,
    }
}
