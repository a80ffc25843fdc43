//! Request parsing, with Redis's limits and its exact protocol error messages.

use bytes::{Bytes, BytesMut};

/// Limits on what one request may hold.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest bulk string (`proto-max-bulk-len`).
    pub bulk_bytes_max: usize,
    /// Most arguments in one request.
    pub arg_count_max: usize,
    /// Longest inline request, or header line.
    pub inline_bytes_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            bulk_bytes_max: 512 << 20,
            arg_count_max: 1024 * 1024,
            inline_bytes_max: 64 << 10,
        }
    }
}

/// A malformed request. The connection cannot be resynchronised after one: reply with
/// `-ERR <message>` and close.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Protocol error: {}", self.0)
    }
}

impl std::error::Error for ProtocolError {}

fn err<T>(m: impl Into<String>) -> Result<T, ProtocolError> {
    Err(ProtocolError(m.into()))
}

/// Finds the end of the line starting at `from`: the index of its `\r`.
fn line_end(buf: &[u8], from: usize) -> Option<usize> {
    buf[from..]
        .windows(2)
        .position(|w| w == b"\r\n")
        .map(|p| from + p)
}

fn parse_len(bytes: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(bytes).ok()?;
    if s.is_empty() || s.starts_with('+') {
        return None;
    }
    s.parse().ok()
}

/// Parses one request from the front of `buf`. Returns `Ok(None)` when more bytes are
/// needed (nothing is consumed), or the request's arguments (consumed from `buf`).
/// Empty inline lines are skipped, as Redis does.
pub fn parse_request(
    buf: &mut BytesMut,
    limits: &Limits,
) -> Result<Option<Vec<Bytes>>, ProtocolError> {
    loop {
        if buf.is_empty() {
            return Ok(None);
        }
        if buf[0] == b'*' {
            return parse_multibulk(buf, limits);
        }
        match parse_inline(buf, limits)? {
            Some(args) if args.is_empty() => continue,
            other => return Ok(other),
        }
    }
}

fn parse_multibulk(
    buf: &mut BytesMut,
    limits: &Limits,
) -> Result<Option<Vec<Bytes>>, ProtocolError> {
    let Some(end) = line_end(buf, 0) else {
        if buf.len() > limits.inline_bytes_max {
            return err("too big mbulk count string");
        }
        return Ok(None);
    };
    let count = match parse_len(&buf[1..end]) {
        Some(n) if n <= limits.arg_count_max as i64 => n,
        _ => return err("invalid multibulk length"),
    };
    if count <= 0 {
        let _ = buf.split_to(end + 2);
        return Ok(Some(Vec::new()));
    }
    let mut pos = end + 2;
    let mut spans = Vec::with_capacity(count.min(1024) as usize);
    for _ in 0..count {
        if pos >= buf.len() {
            return Ok(None);
        }
        if buf[pos] != b'$' {
            return err(format!("expected '$', got '{}'", buf[pos] as char));
        }
        let Some(end) = line_end(buf, pos) else {
            if buf.len() - pos > limits.inline_bytes_max {
                return err("too big bulk count string");
            }
            return Ok(None);
        };
        let len = match parse_len(&buf[pos + 1..end]) {
            Some(n) if n >= 0 && n as usize <= limits.bulk_bytes_max => n as usize,
            _ => return err("invalid bulk length"),
        };
        let start = end + 2;
        if buf.len() < start + len + 2 {
            return Ok(None);
        }
        if &buf[start + len..start + len + 2] != b"\r\n" {
            return err("bulk string not terminated by CRLF");
        }
        spans.push((start, len));
        pos = start + len + 2;
    }
    let frame = buf.split_to(pos).freeze();
    Ok(Some(
        spans
            .into_iter()
            .map(|(s, l)| frame.slice(s..s + l))
            .collect(),
    ))
}

fn parse_inline(buf: &mut BytesMut, limits: &Limits) -> Result<Option<Vec<Bytes>>, ProtocolError> {
    let Some(nl) = buf.iter().position(|&b| b == b'\n') else {
        if buf.len() > limits.inline_bytes_max {
            return err("too big inline request");
        }
        return Ok(None);
    };
    if nl > limits.inline_bytes_max {
        return err("too big inline request");
    }
    let line = buf.split_to(nl + 1);
    let line = line.strip_suffix(b"\n").unwrap_or(&line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    split_inline(line).map(Some)
}

/// Splits an inline request into arguments, honouring quotes like `redis-cli` does.
fn split_inline(line: &[u8]) -> Result<Vec<Bytes>, ProtocolError> {
    let mut args = Vec::new();
    let mut i = 0;
    while i < line.len() {
        while i < line.len() && line[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= line.len() {
            break;
        }
        let mut cur = Vec::new();
        match line[i] {
            q @ (b'"' | b'\'') => {
                i += 1;
                loop {
                    if i >= line.len() {
                        return err("unbalanced quotes in request");
                    }
                    let c = line[i];
                    if c == q {
                        i += 1;
                        if i < line.len() && !line[i].is_ascii_whitespace() {
                            return err("unbalanced quotes in request");
                        }
                        break;
                    }
                    if c == b'\\' && i + 1 < line.len() {
                        let n = line[i + 1];
                        if q == b'"' && n == b'x' && i + 3 < line.len() {
                            let hex = std::str::from_utf8(&line[i + 2..i + 4])
                                .ok()
                                .and_then(|h| u8::from_str_radix(h, 16).ok());
                            if let Some(b) = hex {
                                cur.push(b);
                                i += 4;
                                continue;
                            }
                        }
                        let esc = match (q, n) {
                            (b'"', b'n') => b'\n',
                            (b'"', b'r') => b'\r',
                            (b'"', b't') => b'\t',
                            (b'"', b'a') => 7,
                            (b'"', b'b') => 8,
                            (_, o) => o,
                        };
                        cur.push(esc);
                        i += 2;
                        continue;
                    }
                    cur.push(c);
                    i += 1;
                }
            }
            _ => {
                while i < line.len() && !line[i].is_ascii_whitespace() {
                    cur.push(line[i]);
                    i += 1;
                }
            }
        }
        args.push(Bytes::from(cur));
    }
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(input: &[u8]) -> Result<Vec<Vec<Bytes>>, ProtocolError> {
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        while let Some(r) = parse_request(&mut buf, &Limits::default())? {
            out.push(r);
        }
        Ok(out)
    }

    #[test]
    fn multibulk_and_inline_and_pipelines() {
        let got = parse_all(b"*1\r\n$4\r\nPING\r\nPING\r\n\r\nSET k \"a b\"\r\n*0\r\n").unwrap();
        assert_eq!(
            got,
            vec![vec!["PING"], vec!["PING"], vec!["SET", "k", "a b"], vec![]]
        );
    }

    #[test]
    fn partial_input_consumes_nothing_at_every_split() {
        let full = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n";
        for cut in 0..full.len() {
            let mut buf = BytesMut::from(&full[..cut]);
            assert_eq!(
                parse_request(&mut buf, &Limits::default()).unwrap(),
                None,
                "cut {cut}"
            );
            assert_eq!(buf.len(), cut);
        }
    }

    #[test]
    fn redis_protocol_errors() {
        // Cases from Redis's tests/unit/protocol.tcl.
        let e = |b: &[u8]| parse_all(b).unwrap_err().0;
        assert_eq!(e(b"*20000000000\r\n"), "invalid multibulk length");
        assert_eq!(e(b"*-x\r\n"), "invalid multibulk length");
        assert_eq!(e(b"*1\r\nfoo\r\n"), "expected '$', got 'f'");
        assert_eq!(e(b"*1\r\n$1000000000000\r\n"), "invalid bulk length");
        assert_eq!(e(b"*1\r\n$-10\r\n"), "invalid bulk length");
        assert_eq!(
            e(b"*1\r\n$2\r\nabcd\r\n"),
            "bulk string not terminated by CRLF"
        );
        assert_eq!(
            e(b"SET k \"unterminated\r\n"),
            "unbalanced quotes in request"
        );
        let mut big = vec![b'a'; 70 << 10];
        assert_eq!(e(&big), "too big inline request");
        big.insert(0, b'*');
        assert_eq!(e(&big), "too big mbulk count string");
    }

    #[test]
    fn bulk_limit_is_enforced_before_the_body_arrives() {
        let limits = Limits {
            bulk_bytes_max: 10,
            ..Default::default()
        };
        let mut buf = BytesMut::from(&b"*2\r\n$3\r\nGET\r\n$11\r\n"[..]);
        assert_eq!(
            parse_request(&mut buf, &limits).unwrap_err().0,
            "invalid bulk length"
        );
    }

    #[test]
    fn arguments_are_slices_of_the_input() {
        let mut buf = BytesMut::from(&b"*2\r\n$3\r\nSET\r\n$3\r\nabc\r\n"[..]);
        let base = buf.as_ptr() as usize;
        let r = parse_request(&mut buf, &Limits::default())
            .unwrap()
            .unwrap();
        assert_eq!(r[1].as_ptr() as usize - base, 17);
    }
}
