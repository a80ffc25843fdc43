//! Replies, and their encoding for RESP2 and RESP3 clients.

use bytes::{BufMut, Bytes, BytesMut};

/// A reply, in RESP3 terms; [`ReplyBuf`] lowers it for RESP2 clients.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Simple(String),
    /// A full error line, prefix included (`ERR ...`, `WRONGTYPE ...`).
    Error(String),
    Integer(i64),
    Bulk(Bytes),
    /// A null bulk (RESP2 `$-1`, RESP3 `_`).
    Null,
    /// A null array (RESP2 `*-1`, RESP3 `_`), as `EXEC` returns on an aborted transaction.
    NullArray,
    Array(Vec<Reply>),
    Map(Vec<(Reply, Reply)>),
    Set(Vec<Reply>),
    Double(f64),
    Bool(bool),
    /// Verbatim text (`INFO`): RESP3 `=`, RESP2 bulk.
    Verbatim(String),
    /// Nothing is written (`SHUTDOWN` closes the connection without a reply).
    NoReply,
}

impl Reply {
    pub fn ok() -> Reply {
        Reply::Simple("OK".into())
    }
    pub fn err(msg: impl Into<String>) -> Reply {
        Reply::Error(msg.into())
    }
    pub fn bulk(b: impl Into<Bytes>) -> Reply {
        Reply::Bulk(b.into())
    }
    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }

    /// Bytes of bulk values and text the reply carries (framing left out).
    pub fn payload_bytes(&self) -> u64 {
        match self {
            Reply::Simple(s) | Reply::Error(s) | Reply::Verbatim(s) => s.len() as u64,
            Reply::Bulk(b) => b.len() as u64,
            Reply::Array(v) | Reply::Set(v) => v.iter().map(Reply::payload_bytes).sum(),
            Reply::Map(v) => v
                .iter()
                .map(|(k, v)| k.payload_bytes() + v.payload_bytes())
                .sum(),
            Reply::Integer(_)
            | Reply::Null
            | Reply::NullArray
            | Reply::Double(_)
            | Reply::Bool(_)
            | Reply::NoReply => 0,
        }
    }
}

/// Bulk values at least this large are kept as their own chunk instead of being copied.
const ZERO_COPY_BYTES_MIN: usize = 16 << 10;

/// Encoded replies waiting to be written: small items packed into one buffer, large bulk
/// values kept as separate chunks.
pub struct ReplyBuf {
    proto: u8,
    chunks: Vec<Bytes>,
    cur: BytesMut,
    len: usize,
}

impl ReplyBuf {
    pub fn new(proto: u8) -> ReplyBuf {
        ReplyBuf {
            proto,
            chunks: Vec::new(),
            cur: BytesMut::with_capacity(4096),
            len: 0,
        }
    }

    pub fn set_proto(&mut self, proto: u8) {
        self.proto = proto;
    }

    pub fn proto(&self) -> u8 {
        self.proto
    }

    /// Bytes waiting to be written.
    pub fn len(&self) -> usize {
        self.len + self.cur.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes the chunks to write, leaving the buffer empty.
    pub fn take_chunks(&mut self) -> Vec<Bytes> {
        if !self.cur.is_empty() {
            self.chunks.push(self.cur.split().freeze());
        }
        self.len = 0;
        std::mem::take(&mut self.chunks)
    }

    /// All pending bytes in one vector (tests and small replies).
    pub fn to_vec(&mut self) -> Vec<u8> {
        self.take_chunks().concat()
    }

    fn header(&mut self, tag: u8, n: i64) {
        if (0..10).contains(&n) {
            self.cur
                .extend_from_slice(&[tag, b'0' + n as u8, b'\r', b'\n']);
            return;
        }
        let mut b = itoa::Buffer::new();
        let digits = b.format(n).as_bytes();
        self.cur.reserve(digits.len() + 3);
        self.cur.put_u8(tag);
        self.cur.extend_from_slice(digits);
        self.cur.extend_from_slice(b"\r\n");
    }

    fn line(&mut self, tag: u8, s: &str) {
        self.cur.put_u8(tag);
        // A reply line may not contain CR or LF: they would end it early.
        for b in s.bytes() {
            self.cur
                .put_u8(if b == b'\r' || b == b'\n' { b' ' } else { b });
        }
        self.cur.extend_from_slice(b"\r\n");
    }

    fn bulk_bytes(&mut self, b: &Bytes) {
        self.header(b'$', b.len() as i64);
        if b.len() >= ZERO_COPY_BYTES_MIN {
            self.chunks.push(self.cur.split().freeze());
            self.len += self.chunks.last().map_or(0, |c| c.len()) + b.len();
            self.chunks.push(b.clone());
        } else {
            self.cur.extend_from_slice(b);
        }
        self.cur.extend_from_slice(b"\r\n");
    }

    pub fn push(&mut self, r: &Reply) {
        let v3 = self.proto >= 3;
        match r {
            Reply::Simple(s) => self.line(b'+', s),
            Reply::Error(s) => self.line(b'-', s),
            Reply::Integer(n) => self.header(b':', *n),
            Reply::Bulk(b) => self.bulk_bytes(b),
            Reply::Null if v3 => self.cur.extend_from_slice(b"_\r\n"),
            Reply::Null => self.cur.extend_from_slice(b"$-1\r\n"),
            Reply::NullArray if v3 => self.cur.extend_from_slice(b"_\r\n"),
            Reply::NullArray => self.cur.extend_from_slice(b"*-1\r\n"),
            Reply::Array(items) => {
                self.header(b'*', items.len() as i64);
                items.iter().for_each(|i| self.push(i));
            }
            Reply::Set(items) => {
                self.header(if v3 { b'~' } else { b'*' }, items.len() as i64);
                items.iter().for_each(|i| self.push(i));
            }
            Reply::Map(pairs) => {
                if v3 {
                    self.header(b'%', pairs.len() as i64);
                } else {
                    self.header(b'*', 2 * pairs.len() as i64);
                }
                for (k, v) in pairs {
                    self.push(k);
                    self.push(v);
                }
            }
            Reply::Double(d) => {
                let s = format_double(*d);
                if v3 {
                    self.line(b',', &s);
                } else {
                    self.bulk_bytes(&Bytes::from(s));
                }
            }
            Reply::Bool(b) if v3 => {
                self.cur
                    .extend_from_slice(if *b { b"#t\r\n" } else { b"#f\r\n" })
            }
            Reply::Bool(b) => self.header(b':', *b as i64),
            Reply::Verbatim(s) if v3 => {
                self.header(b'=', s.len() as i64 + 4);
                self.cur.extend_from_slice(b"txt:");
                self.cur.extend_from_slice(s.as_bytes());
                self.cur.extend_from_slice(b"\r\n");
            }
            Reply::Verbatim(s) => self.bulk_bytes(&Bytes::copy_from_slice(s.as_bytes())),
            Reply::NoReply => {}
        }
    }
}

/// Formats a double as Redis 7.0 replies with one (`addReplyDouble`: scores, `ZINCRBY`):
/// C's `%.17g` (17 significant digits, trailing zeros dropped, an exponent below 1e-4 or
/// from 1e17), with `inf`, `-inf` and `nan` spelled out.
pub fn format_double(d: f64) -> String {
    if d.is_nan() {
        return "nan".into();
    }
    format_g(d, 17)
}

/// `d` as C's `printf("%.<precision>g")` writes it (Lua's `tostring` and `cjson` use 14,
/// Redis's replies 17): `precision` significant digits, trailing zeros dropped, the
/// exponent form below 1e-4 or from 10^precision.
pub fn format_g(d: f64, precision: usize) -> String {
    if d.is_nan() {
        return if d.is_sign_negative() { "-nan" } else { "nan" }.into();
    }
    if d.is_infinite() {
        return if d > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if d == 0.0 {
        return if d.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    let p = precision.max(1);
    // An integer of at most `p` digits prints as itself (a sorted set's scores mostly are):
    // no exact decimal expansion needed.
    if d.fract() == 0.0 && d.abs() < 10f64.powi(p.min(18) as i32) {
        return (d as i64).to_string();
    }
    // The exponent %e would print with `p` significant digits decides the style.
    let e_form = format!("{:.*e}", p - 1, d);
    let (mantissa, exp) = e_form.split_once('e').expect("an exponent");
    let exp: i32 = exp.parse().expect("a decimal exponent");
    let trim = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if exp < -4 || exp >= p as i32 {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mantissa), exp.abs())
    } else {
        trim(&format!("{d:.*}", (p as i32 - 1 - exp) as usize))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn format_g_writes_what_printf_writes() {
        for (n, p, want) in [
            (0.1, 14, "0.1"),
            (100.0, 14, "100"),
            (1023.2, 14, "1023.2"),
            (-5000.0, 14, "-5000"),
            (0.0003, 14, "0.0003"),
            (1e15, 14, "1e+15"),
            (123456789012346.0, 14, "1.2345678901235e+14"),
            (1e-5, 14, "1e-05"),
            (2f64.powi(40), 14, "1099511627776"),
            (0.1, 17, "0.10000000000000001"),
            (1e17, 17, "1e+17"),
            (99999999999999999.0, 17, "1e+17"),
            (12345678901234567.0, 17, "12345678901234568"),
            (-42.0, 17, "-42"),
            (99999999999999.0, 14, "99999999999999"),
            (100000000000000.0, 14, "1e+14"),
        ] {
            assert_eq!(super::format_g(n, p), want, "{n} at {p}");
        }
        assert_eq!(super::format_g(-f64::NAN, 17), "-nan");
        assert_eq!(super::format_double(-f64::NAN), "nan");
    }

    use super::*;

    fn enc(proto: u8, r: Reply) -> String {
        let mut b = ReplyBuf::new(proto);
        b.push(&r);
        String::from_utf8(b.to_vec()).unwrap()
    }

    #[test]
    fn resp2_and_resp3_encodings() {
        assert_eq!(enc(2, Reply::Null), "$-1\r\n");
        assert_eq!(enc(3, Reply::Null), "_\r\n");
        assert_eq!(enc(2, Reply::NullArray), "*-1\r\n");
        assert_eq!(
            enc(2, Reply::Integer(i64::MIN)),
            ":-9223372036854775808\r\n"
        );
        let m = Reply::Map(vec![(Reply::bulk("a"), Reply::Integer(1))]);
        assert_eq!(enc(2, m.clone()), "*2\r\n$1\r\na\r\n:1\r\n");
        assert_eq!(enc(3, m), "%1\r\n$1\r\na\r\n:1\r\n");
        assert_eq!(enc(3, Reply::Double(1.5)), ",1.5\r\n");
        for (d, want) in [
            (0.1, "0.10000000000000001"),
            (1.0, "1"),
            (-2.5, "-2.5"),
            (1e17, "1e+17"),
            (12345678901234567.0, "12345678901234568"),
            (0.0001, "0.0001"),
            (0.00001, "1.0000000000000001e-05"),
            (-0.0, "-0"),
            (f64::INFINITY, "inf"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
        ] {
            assert_eq!(format_double(d), want, "{d}");
        }
        assert_eq!(enc(2, Reply::Double(1.5)), "$3\r\n1.5\r\n");
        assert_eq!(enc(3, Reply::Bool(true)), "#t\r\n");
        assert_eq!(enc(2, Reply::Error("ERR a\r\nb".into())), "-ERR a  b\r\n");
        assert_eq!(enc(3, Reply::Verbatim("x".into())), "=5\r\ntxt:x\r\n");
    }

    #[test]
    fn large_bulks_are_not_copied() {
        let big = Bytes::from(vec![7u8; 100 << 10]);
        let mut b = ReplyBuf::new(2);
        b.push(&Reply::Bulk(big.clone()));
        b.push(&Reply::Integer(1));
        assert_eq!(b.len(), big.len() + 9 + 2 + 4);
        let chunks = b.take_chunks();
        assert!(
            chunks.iter().any(|c| c.as_ptr() == big.as_ptr()),
            "the value was copied"
        );
        assert_eq!(chunks.concat().len(), big.len() + 9 + 2 + 4);
    }

    #[test]
    fn doubles_format_like_redis() {
        assert_eq!(format_double(10.5), "10.5");
        assert_eq!(format_double(3.0), "3");
        assert_eq!(format_double(5.0e3), "5000");
    }
}
