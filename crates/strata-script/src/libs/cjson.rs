//! `cjson`: JSON to and from Lua values, as Redis's bundled lua-cjson does it: numbers
//! written with 14 significant digits, `/` escaped, a table with only positive integer
//! keys written as an array (holes as `null`, refused when excessively sparse), an empty
//! table as `{}`, `cjson.null` for JSON's null, and limits on nesting both ways.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use super::lua_number;
use mlua::{Lua, Result, Table, Value};

fn err(m: impl Into<String>) -> mlua::Error {
    mlua::Error::RuntimeError(m.into())
}

/// The settings one VM's `cjson` keeps (the `encode_*`/`decode_*` setters change them).
struct Config {
    encode_depth_max: AtomicUsize,
    decode_depth_max: AtomicUsize,
    encode_invalid_numbers: AtomicBool,
    decode_invalid_numbers: AtomicBool,
    precision: AtomicUsize,
}

/// Arrays whose largest index is past this many times their items (and past
/// [`SPARSE_SAFE`]) are refused, as lua-cjson's default.
const SPARSE_RATIO: usize = 2;
const SPARSE_SAFE: usize = 10;
const DEPTH_DEFAULT: usize = 1000;

fn encode_number(out: &mut Vec<u8>, n: f64, cfg: &Config) -> Result<()> {
    if !n.is_finite() && !cfg.encode_invalid_numbers.load(Ordering::Relaxed) {
        return Err(err("Cannot serialise number: must not be NaN or Inf"));
    }
    out.extend_from_slice(
        strata_resp::format_g(n, cfg.precision.load(Ordering::Relaxed)).as_bytes(),
    );
    Ok(())
}

fn encode_string(out: &mut Vec<u8>, s: &[u8]) {
    out.push(b'"');
    for &b in s {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'/' => out.extend_from_slice(b"\\/"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            b if b < 0x20 || b == 0x7f => out.extend_from_slice(format!("\\u{b:04x}").as_bytes()),
            b => out.push(b),
        }
    }
    out.push(b'"');
}

/// The array length of `t` if every key is a positive integer (0 for an empty table,
/// which is written as an object); `None` if it is an object.
fn array_length(t: &Table) -> Result<Option<usize>> {
    let (mut max, mut items) = (0usize, 0usize);
    for pair in t.clone().pairs::<Value, Value>() {
        let (k, _) = pair?;
        match lua_number(&k) {
            Some(n) if n >= 1.0 && n.fract() == 0.0 => {
                max = max.max(n as usize);
                items += 1;
            }
            _ => return Ok(None),
        }
    }
    if items == 0 {
        return Ok(None);
    }
    if max > SPARSE_SAFE && max > items * SPARSE_RATIO {
        return Err(err("Cannot serialise table: excessively sparse array"));
    }
    Ok(Some(max))
}

fn encode_value(out: &mut Vec<u8>, v: &Value, depth: usize, cfg: &Config) -> Result<()> {
    match v {
        Value::Nil => out.extend_from_slice(b"null"),
        Value::LightUserData(u) if u.0.is_null() => out.extend_from_slice(b"null"),
        Value::Boolean(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Integer(_) | Value::Number(_) => {
            encode_number(out, lua_number(v).expect("a number"), cfg)?
        }
        Value::String(s) => encode_string(out, &s.as_bytes()),
        Value::Table(t) => {
            let depth = depth + 1;
            let max = cfg.encode_depth_max.load(Ordering::Relaxed);
            if depth > max {
                return Err(err(format!(
                    "Cannot serialise, excessive nesting ({depth})"
                )));
            }
            match array_length(t)? {
                Some(len) => {
                    out.push(b'[');
                    for i in 1..=len {
                        if i > 1 {
                            out.push(b',');
                        }
                        encode_value(out, &t.raw_get::<Value>(i)?, depth, cfg)?;
                    }
                    out.push(b']');
                }
                None => {
                    out.push(b'{');
                    let mut first = true;
                    for pair in t.clone().pairs::<Value, Value>() {
                        let (k, val) = pair?;
                        if !first {
                            out.push(b',');
                        }
                        first = false;
                        match &k {
                            Value::String(s) => encode_string(out, &s.as_bytes()),
                            Value::Integer(_) | Value::Number(_) => {
                                out.push(b'"');
                                encode_number(out, lua_number(&k).expect("a number"), cfg)?;
                                out.push(b'"');
                            }
                            _ => {
                                return Err(err(
                                    "Cannot serialise table: table key must be a number or string",
                                ))
                            }
                        }
                        out.push(b':');
                        encode_value(out, &val, depth, cfg)?;
                    }
                    out.push(b'}');
                }
            }
        }
        other => {
            return Err(err(format!(
                "Cannot serialise {}: type not supported",
                other.type_name()
            )))
        }
    }
    Ok(())
}

struct Decoder<'a> {
    s: &'a [u8],
    i: usize,
    depth: usize,
    cfg: &'a Config,
}

impl Decoder<'_> {
    fn fail<T>(&self, what: &str) -> Result<T> {
        Err(err(format!(
            "Expected {what} but found invalid token at character {}",
            self.i + 1
        )))
    }

    fn ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn literal(&mut self, word: &[u8]) -> bool {
        if self.s[self.i..].starts_with(word) {
            self.i += word.len();
            true
        } else {
            false
        }
    }

    fn nest(&mut self) -> Result<()> {
        self.depth += 1;
        if self.depth > self.cfg.decode_depth_max.load(Ordering::Relaxed) {
            return Err(err(format!(
                "Found too many nested data structures ({}) at character {}",
                self.depth,
                self.i + 1
            )));
        }
        Ok(())
    }

    fn value(&mut self, lua: &Lua) -> Result<Value> {
        self.ws();
        let Some(&c) = self.s.get(self.i) else {
            return self.fail("value");
        };
        match c {
            b'{' => {
                self.nest()?;
                self.i += 1;
                let t = lua.create_table()?;
                self.ws();
                if self.s.get(self.i) == Some(&b'}') {
                    self.i += 1;
                } else {
                    loop {
                        self.ws();
                        if self.s.get(self.i) != Some(&b'"') {
                            return self.fail("object key string");
                        }
                        let k = self.string(lua)?;
                        self.ws();
                        if self.s.get(self.i) != Some(&b':') {
                            return self.fail("colon");
                        }
                        self.i += 1;
                        let v = self.value(lua)?;
                        t.raw_set(k, v)?;
                        self.ws();
                        match self.s.get(self.i) {
                            Some(b',') => self.i += 1,
                            Some(b'}') => {
                                self.i += 1;
                                break;
                            }
                            _ => return self.fail("comma or object end"),
                        }
                    }
                }
                self.depth -= 1;
                Ok(Value::Table(t))
            }
            b'[' => {
                self.nest()?;
                self.i += 1;
                let t = lua.create_table()?;
                self.ws();
                if self.s.get(self.i) == Some(&b']') {
                    self.i += 1;
                } else {
                    let mut n = 1;
                    loop {
                        let v = self.value(lua)?;
                        t.raw_set(n, v)?;
                        n += 1;
                        self.ws();
                        match self.s.get(self.i) {
                            Some(b',') => self.i += 1,
                            Some(b']') => {
                                self.i += 1;
                                break;
                            }
                            _ => return self.fail("comma or array end"),
                        }
                    }
                }
                self.depth -= 1;
                Ok(Value::Table(t))
            }
            b'"' => Ok(Value::String(self.string(lua)?)),
            b't' if self.literal(b"true") => Ok(Value::Boolean(true)),
            b'f' if self.literal(b"false") => Ok(Value::Boolean(false)),
            b'n' if self.literal(b"null") => Ok(Value::NULL),
            _ => self.number(),
        }
    }

    fn number(&mut self) -> Result<Value> {
        let start = self.i;
        while self.i < self.s.len()
            && matches!(self.s[self.i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z')
        {
            self.i += 1;
        }
        let text = std::str::from_utf8(&self.s[start..self.i]).unwrap_or("");
        let lower = text.to_ascii_lowercase();
        let invalid_ok = self.cfg.decode_invalid_numbers.load(Ordering::Relaxed);
        let n = match lower.as_str() {
            "nan" | "-nan" if invalid_ok => f64::NAN,
            "inf" | "infinity" if invalid_ok => f64::INFINITY,
            "-inf" | "-infinity" if invalid_ok => f64::NEG_INFINITY,
            _ if lower.starts_with("0x") || lower.contains("inf") || lower.contains("nan") => {
                self.i = start;
                return self.fail("value");
            }
            _ => match text.parse::<f64>() {
                Ok(n) => n,
                Err(_) => {
                    self.i = start;
                    return self.fail("value");
                }
            },
        };
        Ok(Value::Number(n))
    }

    fn hex4(&mut self) -> Result<u32> {
        let h = self
            .s
            .get(self.i..self.i + 4)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u32::from_str_radix(h, 16).ok());
        match h {
            Some(v) => {
                self.i += 4;
                Ok(v)
            }
            None => self.fail("unicode escape"),
        }
    }

    fn string(&mut self, lua: &Lua) -> Result<mlua::LuaString> {
        self.i += 1;
        let mut out = Vec::new();
        loop {
            let Some(&c) = self.s.get(self.i) else {
                return self.fail("string end");
            };
            self.i += 1;
            match c {
                b'"' => break,
                b'\\' => {
                    let Some(&e) = self.s.get(self.i) else {
                        return self.fail("escape");
                    };
                    self.i += 1;
                    match e {
                        b'"' | b'\\' | b'/' => out.push(e),
                        b'b' => out.push(0x08),
                        b'f' => out.push(0x0c),
                        b'n' => out.push(b'\n'),
                        b'r' => out.push(b'\r'),
                        b't' => out.push(b'\t'),
                        b'u' => {
                            let mut cp = self.hex4()?;
                            if (0xd800..0xdc00).contains(&cp) && self.literal(b"\\u") {
                                let low = self.hex4()?;
                                cp = 0x10000
                                    + ((cp - 0xd800) << 10)
                                    + (low.wrapping_sub(0xdc00) & 0x3ff);
                            }
                            let ch = char::from_u32(cp).unwrap_or('\u{fffd}');
                            let mut buf = [0u8; 4];
                            out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                        }
                        _ => return self.fail("escape"),
                    }
                }
                c => out.push(c),
            }
        }
        lua.create_string(&out)
    }
}

/// Reads an optional setter argument: a number, or a boolean/"on"/"off".
fn setting_number(v: &Value) -> Option<usize> {
    lua_number(v).filter(|n| *n >= 1.0).map(|n| n as usize)
}

fn setting_bool(v: &Value) -> Option<bool> {
    match v {
        Value::Boolean(b) => Some(*b),
        Value::String(s) => match s.to_str().ok()?.as_ref() {
            "on" => Some(true),
            "off" => Some(false),
            _ => None,
        },
        _ => None,
    }
}

pub(crate) fn open(lua: &Lua) -> Result<Table> {
    let cfg = Arc::new(Config {
        encode_depth_max: AtomicUsize::new(DEPTH_DEFAULT),
        decode_depth_max: AtomicUsize::new(DEPTH_DEFAULT),
        encode_invalid_numbers: AtomicBool::new(false),
        decode_invalid_numbers: AtomicBool::new(true),
        precision: AtomicUsize::new(14),
    });
    let t = lua.create_table()?;
    let c = Arc::clone(&cfg);
    t.raw_set(
        "encode",
        lua.create_function(move |lua, v: Value| {
            let mut out = Vec::new();
            encode_value(&mut out, &v, 0, &c)?;
            lua.create_string(&out)
        })?,
    )?;
    let c = Arc::clone(&cfg);
    t.raw_set(
        "decode",
        lua.create_function(move |lua, s: mlua::LuaString| {
            let bytes = s.as_bytes();
            let mut d = Decoder {
                s: &bytes,
                i: 0,
                depth: 0,
                cfg: &c,
            };
            let v = d.value(lua)?;
            d.ws();
            if d.i != bytes.len() {
                return d.fail("the end");
            }
            Ok(v)
        })?,
    )?;
    for (name, which) in [
        ("encode_max_depth", 0),
        ("decode_max_depth", 1),
        ("encode_number_precision", 2),
    ] {
        let c = Arc::clone(&cfg);
        t.raw_set(
            name,
            lua.create_function(move |_, v: Value| {
                let slot = match which {
                    0 => &c.encode_depth_max,
                    1 => &c.decode_depth_max,
                    _ => &c.precision,
                };
                if !v.is_nil() {
                    let n = setting_number(&v)
                        .ok_or_else(|| err(format!("bad argument #1 to '{name}'")))?;
                    if which == 2 && n > 14 {
                        return Err(err(format!(
                            "bad argument #1 to '{name}' (expected integer between 1 and 14)"
                        )));
                    }
                    slot.store(n, Ordering::Relaxed);
                }
                Ok(slot.load(Ordering::Relaxed) as i64)
            })?,
        )?;
    }
    for (name, encode) in [
        ("encode_invalid_numbers", true),
        ("decode_invalid_numbers", false),
    ] {
        let c = Arc::clone(&cfg);
        t.raw_set(
            name,
            lua.create_function(move |_, v: Value| {
                let slot = if encode {
                    &c.encode_invalid_numbers
                } else {
                    &c.decode_invalid_numbers
                };
                if !v.is_nil() {
                    let b = setting_bool(&v)
                        .ok_or_else(|| err(format!("bad argument #1 to '{name}'")))?;
                    slot.store(b, Ordering::Relaxed);
                }
                Ok(slot.load(Ordering::Relaxed))
            })?,
        )?;
    }
    // Accepted for compatibility; they change nothing here.
    for name in ["encode_keep_buffer", "encode_sparse_array"] {
        t.raw_set(
            name,
            lua.create_function(|_, _: mlua::MultiValue| Ok(true))?,
        )?;
    }
    t.raw_set("null", Value::NULL)?;
    t.raw_set("_NAME", "cjson")?;
    t.raw_set("_VERSION", "2.1.0")?;
    Ok(t)
}
