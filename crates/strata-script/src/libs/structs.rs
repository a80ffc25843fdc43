//! `struct`: `pack`, `unpack` and `size` of binary records described by a format string
//! (Roberto Ierusalimschy's struct library, as Redis ships it): `<` `>` `=` byte order,
//! `!n` alignment, `b B h H l L T i[n] I[n]` integers, `f d` floats, `c[n]` fixed strings,
//! `s` zero-terminated strings, `x` a pad byte, `X` align to the next option.

use mlua::{Lua, MultiValue, Result, Table, Value};

fn err(m: impl Into<String>) -> mlua::Error {
    mlua::Error::RuntimeError(m.into())
}

/// Largest integer field, and the native alignment `!` picks without a number.
const INT_BYTES_MAX: usize = 8;
const NATIVE_ALIGN: usize = 8;

struct Opts {
    little: bool,
    align: usize,
}

/// One option of a format: its letter and size (0 when not fixed).
struct Item {
    op: u8,
    size: usize,
}

/// Reads a decimal count after an option (`i4`, `c10`), if any.
fn number(fmt: &[u8], i: &mut usize) -> Option<usize> {
    let start = *i;
    while *i < fmt.len() && fmt[*i].is_ascii_digit() {
        *i += 1;
    }
    std::str::from_utf8(&fmt[start..*i]).ok()?.parse().ok()
}

/// The next option of `fmt` at `*i`, with the settings it changes applied to `o`.
fn next(fmt: &[u8], i: &mut usize, o: &mut Opts) -> Result<Option<Item>> {
    while *i < fmt.len() {
        let op = fmt[*i];
        *i += 1;
        let size = match op {
            b' ' => continue,
            b'<' => {
                o.little = true;
                continue;
            }
            b'>' => {
                o.little = false;
                continue;
            }
            b'=' => {
                o.little = cfg!(target_endian = "little");
                continue;
            }
            b'!' => {
                let a = number(fmt, i).unwrap_or(NATIVE_ALIGN);
                if !a.is_power_of_two() {
                    return Err(err(format!("alignment {a} is not a power of 2")));
                }
                o.align = a;
                continue;
            }
            b'b' | b'B' | b'x' => 1,
            b'h' | b'H' => 2,
            b'l' | b'L' | b'T' | b'd' => 8,
            b'f' => 4,
            b'i' | b'I' => {
                let n = number(fmt, i).unwrap_or(4);
                if n == 0 || n > INT_BYTES_MAX {
                    return Err(err(format!(
                        "integral size {n} is larger than limit of {INT_BYTES_MAX}"
                    )));
                }
                n
            }
            b'c' => number(fmt, i).unwrap_or(1),
            b's' | b'X' => 0,
            other => return Err(err(format!("invalid format option '{}'", other as char))),
        };
        return Ok(Some(Item { op, size }));
    }
    Ok(None)
}

/// Padding before a field of `size` bytes at `pos`, under the current alignment.
fn padding(pos: usize, item: &Item, o: &Opts, fmt: &[u8], i: usize) -> Result<usize> {
    let size = if item.op == b'X' {
        // Align to the size of the option that follows.
        let mut j = i;
        let mut probe = Opts {
            little: o.little,
            align: o.align,
        };
        match next(fmt, &mut j, &mut probe)? {
            Some(n) if n.size > 0 => n.size,
            _ => return Err(err("invalid next option for option 'X'")),
        }
    } else {
        item.size
    };
    if size <= 1 || item.op == b'c' {
        return Ok(0);
    }
    let a = size.min(o.align);
    if !a.is_power_of_two() {
        return Err(err("alignment is not a power of 2"));
    }
    Ok((a - (pos & (a - 1))) & (a - 1))
}

fn number_arg(v: Option<&Value>, n: usize) -> Result<f64> {
    match v {
        Some(Value::Integer(i)) => Ok(*i as f64),
        Some(Value::Number(x)) => Ok(*x),
        Some(Value::String(s)) => s
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| err(format!("bad argument #{n} to 'pack' (number expected)"))),
        _ => Err(err(format!(
            "bad argument #{n} to 'pack' (number expected)"
        ))),
    }
}

fn put_int(out: &mut Vec<u8>, v: u64, size: usize, little: bool) {
    let bytes = v.to_le_bytes();
    if little {
        out.extend_from_slice(&bytes[..size]);
    } else {
        out.extend(bytes[..size].iter().rev());
    }
}

fn pack(lua: &Lua, args: MultiValue) -> Result<mlua::LuaString> {
    let fmt = match args.front() {
        Some(Value::String(s)) => s.as_bytes().to_vec(),
        _ => return Err(err("bad argument #1 to 'pack' (string expected)")),
    };
    let mut o = Opts {
        little: cfg!(target_endian = "little"),
        align: 1,
    };
    let mut out = Vec::new();
    let mut arg = 1;
    let mut i = 0;
    while let Some(item) = next(&fmt, &mut i, &mut o)? {
        let pad = padding(out.len(), &item, &o, &fmt, i)?;
        out.resize(out.len() + pad, 0);
        match item.op {
            b'x' => out.push(0),
            b'X' => {}
            b'b' | b'B' | b'h' | b'H' | b'l' | b'L' | b'T' | b'i' | b'I' => {
                let n = number_arg(args.get(arg), arg + 1)?;
                arg += 1;
                let v = if item.op.is_ascii_lowercase() {
                    n as i64 as u64
                } else {
                    n as u64
                };
                put_int(&mut out, v, item.size, o.little);
            }
            b'f' => {
                let n = number_arg(args.get(arg), arg + 1)? as f32;
                arg += 1;
                put_int(&mut out, n.to_bits() as u64, 4, o.little);
            }
            b'd' => {
                let n = number_arg(args.get(arg), arg + 1)?;
                arg += 1;
                put_int(&mut out, n.to_bits(), 8, o.little);
            }
            b'c' | b's' => {
                let s = match args.get(arg) {
                    Some(Value::String(s)) => s.as_bytes().to_vec(),
                    Some(Value::Integer(n)) => n.to_string().into_bytes(),
                    _ => {
                        return Err(err(format!(
                            "bad argument #{} to 'pack' (string expected)",
                            arg + 1
                        )))
                    }
                };
                arg += 1;
                if item.op == b'c' {
                    let want = if item.size == 0 { s.len() } else { item.size };
                    if s.len() < want {
                        return Err(err(format!(
                            "bad argument #{arg} to 'pack' (string too short)"
                        )));
                    }
                    out.extend_from_slice(&s[..want]);
                } else {
                    out.extend_from_slice(&s);
                    out.push(0);
                }
            }
            _ => unreachable!("next() returns known options"),
        }
    }
    lua.create_string(&out)
}

fn get_int(data: &[u8], size: usize, little: bool, signed: bool) -> f64 {
    let mut v: u64 = 0;
    for k in 0..size {
        let b = if little { data[size - 1 - k] } else { data[k] };
        v = (v << 8) | b as u64;
    }
    if signed && size < 8 {
        let shift = 64 - 8 * size as u32;
        ((v << shift) as i64 >> shift) as f64
    } else if signed {
        v as i64 as f64
    } else {
        v as f64
    }
}

fn unpack(
    lua: &Lua,
    (fmt, data, init): (mlua::LuaString, mlua::LuaString, Option<i64>),
) -> Result<MultiValue> {
    let fmt = fmt.as_bytes().to_vec();
    let data = data.as_bytes().to_vec();
    let mut pos = match init {
        Some(n) if n >= 1 => (n - 1) as usize,
        Some(_) => return Err(err("offset must be 1 or greater")),
        None => 0,
    };
    let mut o = Opts {
        little: cfg!(target_endian = "little"),
        align: 1,
    };
    let mut out = MultiValue::new();
    let mut last_number: Option<f64> = None;
    let mut i = 0;
    let short = || err("bad argument #2 to 'unpack' (data string too short)");
    while let Some(item) = next(&fmt, &mut i, &mut o)? {
        pos += padding(pos, &item, &o, &fmt, i)?;
        match item.op {
            b'x' => pos += 1,
            b'X' => {}
            b'b' | b'B' | b'h' | b'H' | b'l' | b'L' | b'T' | b'i' | b'I' | b'f' | b'd' => {
                let field = data.get(pos..pos + item.size).ok_or_else(short)?;
                let n = match item.op {
                    b'f' => f32::from_bits(get_int(field, 4, o.little, false) as u32) as f64,
                    b'd' => {
                        let mut v: u64 = 0;
                        for k in 0..8 {
                            let b = if o.little { field[7 - k] } else { field[k] };
                            v = (v << 8) | b as u64;
                        }
                        f64::from_bits(v)
                    }
                    op => get_int(field, item.size, o.little, op.is_ascii_lowercase()),
                };
                pos += item.size;
                last_number = Some(n);
                out.push_back(Value::Number(n));
            }
            b'c' => {
                let size = if item.size == 0 {
                    match last_number.take() {
                        Some(n) if n >= 0.0 => {
                            out.pop_back();
                            n as usize
                        }
                        _ => return Err(err("format 'c0' needs a previous size")),
                    }
                } else {
                    item.size
                };
                let field = data.get(pos..pos + size).ok_or_else(short)?;
                out.push_back(Value::String(lua.create_string(field)?));
                pos += size;
            }
            b's' => {
                let rest = data.get(pos..).ok_or_else(short)?;
                let end = rest
                    .iter()
                    .position(|&b| b == 0)
                    .ok_or_else(|| err("unfinished string in data"))?;
                out.push_back(Value::String(lua.create_string(&rest[..end])?));
                pos += end + 1;
            }
            _ => unreachable!("next() returns known options"),
        }
    }
    out.push_back(Value::Integer(pos as i64 + 1));
    Ok(out)
}

fn size(_: &Lua, fmt: mlua::LuaString) -> Result<i64> {
    let fmt = fmt.as_bytes().to_vec();
    let mut o = Opts {
        little: true,
        align: 1,
    };
    let mut pos = 0;
    let mut i = 0;
    while let Some(item) = next(&fmt, &mut i, &mut o)? {
        if item.op == b's' || (item.op == b'c' && item.size == 0) {
            return Err(err("options 'c0' - 's' have undefined sizes"));
        }
        pos += padding(pos, &item, &o, &fmt, i)? + item.size;
    }
    Ok(pos as i64)
}

pub(crate) fn open(lua: &Lua) -> Result<Table> {
    let t = lua.create_table()?;
    t.raw_set("pack", lua.create_function(pack)?)?;
    t.raw_set("unpack", lua.create_function(unpack)?)?;
    t.raw_set("size", lua.create_function(size)?)?;
    Ok(t)
}
