//! `cmsgpack`: MessagePack to and from Lua values, as Redis's bundled lua-cmsgpack does it:
//! integral numbers as the smallest integer format, others as float 32 when exact, else
//! float 64; a table whose keys are exactly 1..n as an array, other tables as maps in Lua's
//! own iteration order; tables nested past [`NESTING_MAX`] as nil.

use super::lua_number;
use mlua::{Lua, MultiValue, Result, Table, Value};

fn err(m: impl Into<String>) -> mlua::Error {
    mlua::Error::RuntimeError(m.into())
}

/// Deepest nesting packed; deeper tables are written as nil (so cycles end).
const NESTING_MAX: usize = 16;

fn pack_int(out: &mut Vec<u8>, n: i64) {
    if n >= 0 {
        let u = n as u64;
        if u <= 127 {
            out.push(u as u8);
        } else if u <= 0xff {
            out.extend_from_slice(&[0xcc, u as u8]);
        } else if u <= 0xffff {
            out.push(0xcd);
            out.extend_from_slice(&(u as u16).to_be_bytes());
        } else if u <= 0xffff_ffff {
            out.push(0xce);
            out.extend_from_slice(&(u as u32).to_be_bytes());
        } else {
            out.push(0xcf);
            out.extend_from_slice(&u.to_be_bytes());
        }
    } else if n >= -32 {
        out.push(n as i8 as u8);
    } else if n >= -128 {
        out.extend_from_slice(&[0xd0, n as i8 as u8]);
    } else if n >= -32768 {
        out.push(0xd1);
        out.extend_from_slice(&(n as i16).to_be_bytes());
    } else if n >= -2_147_483_648 {
        out.push(0xd2);
        out.extend_from_slice(&(n as i32).to_be_bytes());
    } else {
        out.push(0xd3);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

fn pack_number(out: &mut Vec<u8>, n: f64) {
    if n.is_finite() && n.fract() == 0.0 && n >= i64::MIN as f64 && n < i64::MAX as f64 {
        pack_int(out, n as i64);
    } else if (n as f32) as f64 == n || n.is_nan() {
        out.push(0xca);
        out.extend_from_slice(&(n as f32).to_be_bytes());
    } else {
        out.push(0xcb);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

fn pack_len(out: &mut Vec<u8>, len: usize, fix: (u8, usize), wide: [u8; 2]) {
    if len < fix.1 {
        out.push(fix.0 | len as u8);
    } else if len <= 0xffff {
        out.push(wide[0]);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(wide[1]);
        out.extend_from_slice(&(len as u32).to_be_bytes());
    }
}

/// The array length of `t` if its keys are exactly 1..n (an empty table is an array).
fn array_length(t: &Table) -> Result<Option<usize>> {
    let (mut max, mut count) = (0usize, 0usize);
    for pair in t.clone().pairs::<Value, Value>() {
        let (k, _) = pair?;
        match lua_number(&k) {
            Some(n) if n > 0.0 && n.fract() == 0.0 => {
                max = max.max(n as usize);
                count += 1;
            }
            _ => return Ok(None),
        }
    }
    Ok((max == count).then_some(max))
}

fn pack_value(out: &mut Vec<u8>, v: &Value, level: usize) -> Result<()> {
    match v {
        Value::Nil => out.push(0xc0),
        Value::Boolean(b) => out.push(if *b { 0xc3 } else { 0xc2 }),
        Value::Integer(_) | Value::Number(_) => pack_number(out, lua_number(v).expect("a number")),
        Value::String(s) => {
            let s = s.as_bytes();
            let len = s.len();
            if len < 32 {
                out.push(0xa0 | len as u8);
            } else if len <= 0xff {
                out.extend_from_slice(&[0xd9, len as u8]);
            } else if len <= 0xffff {
                out.push(0xda);
                out.extend_from_slice(&(len as u16).to_be_bytes());
            } else {
                out.push(0xdb);
                out.extend_from_slice(&(len as u32).to_be_bytes());
            }
            out.extend_from_slice(&s);
        }
        Value::Table(t) if level < NESTING_MAX => match array_length(t)? {
            Some(len) => {
                pack_len(out, len, (0x90, 16), [0xdc, 0xdd]);
                for i in 1..=len {
                    pack_value(out, &t.raw_get::<Value>(i)?, level + 1)?;
                }
            }
            None => {
                // Counted first, then written pair by pair: holding every pair at once
                // would take a slot of Lua's stack each.
                let len = t.clone().pairs::<Value, Value>().count();
                pack_len(out, len, (0x80, 16), [0xde, 0xdf]);
                for pair in t.clone().pairs::<Value, Value>() {
                    let (k, val) = pair?;
                    pack_value(out, &k, level + 1)?;
                    pack_value(out, &val, level + 1)?;
                }
            }
        },
        // Too deep, functions, userdata: nil, as lua-cmsgpack writes them.
        _ => out.push(0xc0),
    }
    Ok(())
}

struct Reader<'a> {
    s: &'a [u8],
    i: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        let b = self
            .s
            .get(self.i..self.i + n)
            .ok_or_else(|| err("Missing bytes in input."))?;
        self.i += n;
        Ok(b)
    }

    fn uint(&mut self, n: usize) -> Result<u64> {
        Ok(self.take(n)?.iter().fold(0u64, |a, &b| (a << 8) | b as u64))
    }

    fn value(&mut self, lua: &Lua) -> Result<Value> {
        let c = self.uint(1)? as u8;
        let int = |n: i64| Value::Number(n as f64);
        Ok(match c {
            0x00..=0x7f => int(c as i64),
            0x80..=0x8f => self.map(lua, (c & 0x0f) as usize)?,
            0x90..=0x9f => self.array(lua, (c & 0x0f) as usize)?,
            0xa0..=0xbf => self.string(lua, (c & 0x1f) as usize)?,
            0xc0 => Value::Nil,
            0xc2 => Value::Boolean(false),
            0xc3 => Value::Boolean(true),
            0xc4 | 0xd9 => {
                let n = self.uint(1)? as usize;
                self.string(lua, n)?
            }
            0xc5 | 0xda => {
                let n = self.uint(2)? as usize;
                self.string(lua, n)?
            }
            0xc6 | 0xdb => {
                let n = self.uint(4)? as usize;
                self.string(lua, n)?
            }
            0xca => Value::Number(f32::from_bits(self.uint(4)? as u32) as f64),
            0xcb => Value::Number(f64::from_bits(self.uint(8)?)),
            0xcc => int(self.uint(1)? as i64),
            0xcd => int(self.uint(2)? as i64),
            0xce => int(self.uint(4)? as i64),
            0xcf => Value::Number(self.uint(8)? as f64),
            0xd0 => int(self.uint(1)? as u8 as i8 as i64),
            0xd1 => int(self.uint(2)? as u16 as i16 as i64),
            0xd2 => int(self.uint(4)? as u32 as i32 as i64),
            0xd3 => int(self.uint(8)? as i64),
            0xdc => {
                let n = self.uint(2)? as usize;
                self.array(lua, n)?
            }
            0xdd => {
                let n = self.uint(4)? as usize;
                self.array(lua, n)?
            }
            0xde => {
                let n = self.uint(2)? as usize;
                self.map(lua, n)?
            }
            0xdf => {
                let n = self.uint(4)? as usize;
                self.map(lua, n)?
            }
            0xe0..=0xff => int(c as i8 as i64),
            _ => return Err(err("Bad data format in input.")),
        })
    }

    fn string(&mut self, lua: &Lua, n: usize) -> Result<Value> {
        Ok(Value::String(lua.create_string(self.take(n)?)?))
    }

    fn array(&mut self, lua: &Lua, n: usize) -> Result<Value> {
        let t = lua.create_table_with_capacity(n.min(1 << 16), 0)?;
        for i in 1..=n {
            t.raw_set(i, self.value(lua)?)?;
        }
        Ok(Value::Table(t))
    }

    fn map(&mut self, lua: &Lua, n: usize) -> Result<Value> {
        let t = lua.create_table_with_capacity(0, n.min(1 << 16))?;
        for _ in 0..n {
            let k = self.value(lua)?;
            let v = self.value(lua)?;
            if !k.is_nil() {
                t.raw_set(k, v)?;
            }
        }
        Ok(Value::Table(t))
    }
}

/// Unpacks up to `limit` objects (0: all) from `s` at `offset`; answers the next offset
/// (-1 at the end) and the objects.
fn unpack_from(lua: &Lua, s: &[u8], limit: usize, offset: usize) -> Result<(i64, Vec<Value>)> {
    let mut r = Reader { s, i: offset };
    let mut out = Vec::new();
    while r.i < s.len() && (limit == 0 || out.len() < limit) {
        out.push(r.value(lua)?);
    }
    let next = if r.i >= s.len() { -1 } else { r.i as i64 };
    Ok((next, out))
}

fn offset_arg(v: Option<i64>, len: usize) -> Result<usize> {
    match v {
        None => Ok(0),
        Some(n) if n >= 0 && (n as usize) <= len => Ok(n as usize),
        Some(_) => Err(err("Start offset greater than input length")),
    }
}

pub(crate) fn open(lua: &Lua) -> Result<Table> {
    let t = lua.create_table()?;
    t.raw_set(
        "pack",
        lua.create_function(|lua, args: MultiValue| {
            if args.is_empty() {
                return Err(err("MessagePack pack needs input."));
            }
            let mut out = Vec::new();
            for v in args.iter() {
                pack_value(&mut out, v, 0)?;
            }
            lua.create_string(&out)
        })?,
    )?;
    t.raw_set(
        "unpack",
        lua.create_function(|lua, s: mlua::LuaString| {
            let (_, values) = unpack_from(lua, &s.as_bytes(), 0, 0)?;
            Ok(MultiValue::from_iter(values))
        })?,
    )?;
    t.raw_set(
        "unpack_one",
        lua.create_function(|lua, (s, offset): (mlua::LuaString, Option<i64>)| {
            let bytes = s.as_bytes();
            let (next, values) = unpack_from(lua, &bytes, 1, offset_arg(offset, bytes.len())?)?;
            Ok(MultiValue::from_iter(
                std::iter::once(Value::Integer(next)).chain(values),
            ))
        })?,
    )?;
    t.raw_set(
        "unpack_limit",
        lua.create_function(
            |lua, (s, limit, offset): (mlua::LuaString, i64, Option<i64>)| {
                let bytes = s.as_bytes();
                let (next, values) = unpack_from(
                    lua,
                    &bytes,
                    limit.max(0) as usize,
                    offset_arg(offset, bytes.len())?,
                )?;
                Ok(MultiValue::from_iter(
                    std::iter::once(Value::Integer(next)).chain(values),
                ))
            },
        )?,
    )?;
    t.raw_set("_NAME", "cmsgpack")?;
    t.raw_set("_VERSION", "lua-cmsgpack 0.4.0")?;
    Ok(t)
}
