//! `bit`: LuaBitOp's operations on 32-bit integers, as Redis scripts use them. Numbers are
//! wrapped to signed 32 bits (rounded to the nearest integer first) and results are signed.

use mlua::{Lua, MultiValue, Result, Table, Value};

/// `x` wrapped to 32 bits the way LuaBitOp does it: round to nearest, keep the low bits.
fn to_bits(v: &Value) -> Result<u32> {
    let n = match v {
        Value::Integer(i) => *i as f64,
        Value::Number(n) => *n,
        Value::String(s) => s
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<f64>().ok())
            .ok_or_else(|| {
                mlua::Error::RuntimeError("bad argument to bit (number expected)".into())
            })?,
        _ => {
            return Err(mlua::Error::RuntimeError(
                "bad argument to bit (number expected)".into(),
            ))
        }
    };
    // Adding 2^52 + 2^51 moves the integer part into the mantissa's low bits.
    Ok((n + 6_755_399_441_055_744.0).to_bits() as u32)
}

fn arg(args: &MultiValue, i: usize) -> Result<u32> {
    to_bits(args.get(i).unwrap_or(&Value::Nil))
}

fn out(x: u32) -> Value {
    Value::Integer(x as i32 as i64)
}

pub(crate) fn open(lua: &Lua) -> Result<Table> {
    let t = lua.create_table()?;
    t.raw_set(
        "tobit",
        lua.create_function(|_, a: MultiValue| Ok(out(arg(&a, 0)?)))?,
    )?;
    t.raw_set(
        "bnot",
        lua.create_function(|_, a: MultiValue| Ok(out(!arg(&a, 0)?)))?,
    )?;
    t.raw_set(
        "bswap",
        lua.create_function(|_, a: MultiValue| Ok(out(arg(&a, 0)?.swap_bytes())))?,
    )?;
    type Fold = fn(u32, u32) -> u32;
    for (name, f) in [
        ("band", (|a, b| a & b) as Fold),
        ("bor", |a, b| a | b),
        ("bxor", |a, b| a ^ b),
    ] {
        t.raw_set(
            name,
            lua.create_function(move |_, a: MultiValue| {
                let mut acc = arg(&a, 0)?;
                for i in 1..a.len() {
                    acc = f(acc, arg(&a, i)?);
                }
                Ok(out(acc))
            })?,
        )?;
    }
    type Shift = fn(u32, u32) -> u32;
    for (name, f) in [
        ("lshift", (|x, n| x << (n & 31)) as Shift),
        ("rshift", |x, n| x >> (n & 31)),
        ("arshift", |x, n| ((x as i32) >> (n & 31)) as u32),
        ("rol", |x, n| x.rotate_left(n & 31)),
        ("ror", |x, n| x.rotate_right(n & 31)),
    ] {
        t.raw_set(
            name,
            lua.create_function(move |_, a: MultiValue| Ok(out(f(arg(&a, 0)?, arg(&a, 1)?))))?,
        )?;
    }
    t.raw_set(
        "tohex",
        lua.create_function(|_, a: MultiValue| {
            let x = arg(&a, 0)?;
            let n = if a.len() > 1 { arg(&a, 1)? as i32 } else { 8 };
            let (upper, digits) = if n < 0 {
                (true, (-n) as usize)
            } else {
                (false, n as usize)
            };
            let digits = digits.min(8);
            let s = format!("{x:08x}");
            let s = &s[8 - digits..];
            Ok(if upper {
                s.to_ascii_uppercase()
            } else {
                s.to_string()
            })
        })?,
    )?;
    Ok(t)
}
