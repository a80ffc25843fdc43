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
    let mut at = from;
    loop {
        at += buf.get(at..)?.iter().position(|&b| b == b'\r')?;
        if *buf.get(at + 1)? == b'\n' {
            return Some(at);
        }
        at += 1;
    }
}

fn parse_len(bytes: &[u8]) -> Option<i64> {
    // Most lengths: a few digits, read in one pass; anything else as `str::parse` reads it.
    if !bytes.is_empty() && bytes.len() <= 18 && bytes.iter().all(u8::is_ascii_digit) {
        return Some(
            bytes
                .iter()
                .fold(0i64, |n, &d| n * 10 + i64::from(d - b'0')),
        );
    }
    let s = std::str::from_utf8(bytes).ok()?;
    if s.is_empty() || s.starts_with('+') {
        return None;
    }
    s.parse().ok()
}

/// Parses one request from the front of `buf`. Returns `Ok(None)` when more bytes are
/// needed (nothing is consumed), or the request's arguments (consumed from `buf`).
/// Requests with no arguments (an empty inline line, `*0`, `*-1`) are skipped without a
/// reply, as Redis does.
pub fn parse_request(
    buf: &mut BytesMut,
    limits: &Limits,
) -> Result<Option<Vec<Bytes>>, ProtocolError> {
    loop {
        if buf.is_empty() {
            return Ok(None);
        }
        let got = if buf[0] == b'*' {
            parse_multibulk(buf, limits)?
        } else {
            parse_inline(buf, limits)?
        };
        match got {
            Some(args) if args.is_empty() => continue,
            other => return Ok(other),
        }
    }
}

fn parse_multibulk(
    buf: &mut BytesMut,
    limits: &Limits,
) -> Result<Option<Vec<Bytes>>, ProtocolError> {
    let Some((count, pos)) = multibulk_header(buf, limits)? else {
        return Ok(None);
    };
    let mut spans = Vec::with_capacity(count.min(1024));
    match scan_bulks(buf, pos, count, limits, &mut spans)? {
        Scan::Whole { end } => {
            let mut args = Vec::with_capacity(spans.len());
            cut(buf, end, &spans, &mut args);
            Ok(Some(args))
        }
        Scan::Short { .. } => Ok(None),
    }
}

/// The count of a multibulk request at the front of `buf` and where its first bulk starts;
/// `None` while the header line is incomplete.
fn multibulk_header(buf: &[u8], limits: &Limits) -> Result<Option<(usize, usize)>, ProtocolError> {
    let Some(end) = line_end(buf, 0) else {
        if buf.len() > limits.inline_bytes_max {
            return err("too big mbulk count string");
        }
        return Ok(None);
    };
    match parse_len(&buf[1..end]) {
        Some(n) if n <= limits.arg_count_max as i64 => Ok(Some((n.max(0) as usize, end + 2))),
        _ => err("invalid multibulk length"),
    }
}

/// What [`scan_bulks`] found (the bulks whole so far are in its `spans`).
enum Scan {
    /// All the bulks are there; the request ends at `end`.
    Whole { end: usize },
    /// The bulks added to `spans` are whole and end at `end`; the next one is not.
    /// `wanted`: the bytes still missing of that next bulk, when its header is there and it
    /// is large (0 otherwise).
    Short { end: usize, wanted: usize },
}

/// Reads up to `count` bulks (`$len\r\n` and the body) from `pos` on, adding where each
/// body lies to `spans`.
fn scan_bulks(
    buf: &[u8],
    mut pos: usize,
    count: usize,
    limits: &Limits,
    spans: &mut Vec<(usize, usize)>,
) -> Result<Scan, ProtocolError> {
    for _ in 0..count {
        let short = |wanted| Ok(Scan::Short { end: pos, wanted });
        if pos >= buf.len() {
            return short(0);
        }
        if buf[pos] != b'$' {
            return err(format!("expected '$', got '{}'", buf[pos] as char));
        }
        let Some(end) = line_end(buf, pos) else {
            if buf.len() - pos > limits.inline_bytes_max {
                return err("too big bulk count string");
            }
            return short(0);
        };
        let len = match parse_len(&buf[pos + 1..end]) {
            Some(n) if n >= 0 && n as usize <= limits.bulk_bytes_max => n as usize,
            _ => return err("invalid bulk length"),
        };
        let start = end + 2;
        if buf.len() < start + len + 2 {
            let wanted = if len >= LARGE_ARG_BYTES {
                start + len + 2 - buf.len()
            } else {
                0
            };
            return short(wanted);
        }
        if &buf[start + len..start + len + 2] != b"\r\n" {
            return err("bulk string not terminated by CRLF");
        }
        spans.push((start, len));
        pos = start + len + 2;
    }
    Ok(Scan::Whole { end: pos })
}

/// Takes `buf`'s first `end` bytes off and adds the `spans` of them to `args` (slices of
/// one frozen frame: no copies).
fn cut(buf: &mut BytesMut, end: usize, spans: &[(usize, usize)], args: &mut Vec<Bytes>) {
    let frame = buf.split_to(end).freeze();
    args.extend(spans.iter().map(|&(s, l)| frame.slice(s..s + l)));
}

/// The requests of one turn of a connection, parsed by [`RequestReader::read_turn`]: their
/// arguments one after another in one vector (kept from turn to turn), and where each
/// request's end.
#[derive(Debug, Default)]
pub struct Requests {
    args: Vec<Bytes>,
    ends: Vec<usize>,
    /// Bytes of arguments in them.
    bytes: usize,
}

impl Requests {
    /// How many requests.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The arguments of request `i`.
    pub fn get(&self, i: usize) -> &[Bytes] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.args[start..self.ends[i]]
    }

    /// Bytes of arguments in them all.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Forgets them (the vectors keep their room).
    pub fn clear(&mut self) {
        self.args.clear();
        self.ends.clear();
        self.bytes = 0;
    }

    fn push(&mut self, args: Vec<Bytes>) {
        self.bytes += args.iter().map(|a| a.len()).sum::<usize>();
        self.args.extend(args);
        self.ends.push(self.args.len());
    }
}

/// An argument at least this long is read into a buffer of its own size (Redis's
/// `PROTO_MBULK_BIG_ARG`): see [`RequestReader`].
pub const LARGE_ARG_BYTES: usize = 32 << 10;

/// Reads requests from a connection's buffer as [`parse_request`] does, and keeps a request
/// whose large argument is still arriving apart from the buffer: the arguments already
/// whole are taken out, so the buffer holds only the rest, and [`RequestReader::wanted`]
/// says how many bytes the large argument still needs. A caller that makes that much room
/// before reading has the argument read straight into a buffer of its size, as Redis does,
/// instead of into one that doubles (a copy and fresh pages each time) as it fills.
#[derive(Debug, Default)]
pub struct RequestReader {
    /// The whole arguments of the request being read.
    args: Vec<Bytes>,
    /// Its arguments still to come (0: no request is held).
    left: usize,
    /// What the large argument being read still needs.
    wanted: usize,
    /// Bytes in `args`.
    held: usize,
    /// Where the arguments scanned but not yet cut lie ([`RequestReader::read_turn`]).
    spans: Vec<(usize, usize)>,
}

impl RequestReader {
    /// The next whole request, or `None` when more bytes are needed.
    pub fn next(
        &mut self,
        buf: &mut BytesMut,
        limits: &Limits,
    ) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        self.wanted = 0;
        if self.left > 0 {
            return self.scan(buf, 0, self.left, limits);
        }
        loop {
            if buf.first() != Some(&b'*') {
                return parse_request(buf, limits);
            }
            let Some((count, pos)) = multibulk_header(buf, limits)? else {
                return Ok(None);
            };
            match self.scan(buf, pos, count, limits)? {
                // No arguments (`*0`, `*-1`): skipped, as `parse_request` skips it.
                Some(args) if args.is_empty() => continue,
                got => return Ok(got),
            }
        }
    }

    /// Adds to `out` the whole requests at the front of `buf`, as [`RequestReader::next`]
    /// would return them one by one, until `out` holds `count_max` requests or
    /// `bytes_max` bytes of arguments, or the buffer holds no whole request. Whole
    /// multibulk requests in a row are cut off the buffer at once, one frame for all (one
    /// reference count for the turn, not one per request). On a malformed request, the
    /// requests before it are in `out`.
    pub fn read_turn(
        &mut self,
        buf: &mut BytesMut,
        limits: &Limits,
        count_max: usize,
        bytes_max: usize,
        out: &mut Requests,
    ) -> Result<(), ProtocolError> {
        // Requests scanned, not cut yet, end at `pos`: their arguments' spans are
        // `self.spans`, and `out` already counts them (their ends are where they will be
        // once cut, after `out`'s arguments).
        let mut pos = 0;
        let got = loop {
            if out.len() >= count_max || out.bytes >= bytes_max {
                break Ok(());
            }
            if self.left == 0 && buf.get(pos) == Some(&b'*') {
                let header = match multibulk_header(&buf[pos..], limits) {
                    Ok(h) => h,
                    Err(e) => break Err(e),
                };
                let Some((count, at)) = header else {
                    break Ok(());
                };
                let first = self.spans.len();
                match scan_bulks(buf, pos + at, count, limits, &mut self.spans) {
                    Ok(Scan::Whole { end }) => {
                        pos = end;
                        // No arguments (`*0`, `*-1`): skipped.
                        if self.spans.len() > first {
                            out.bytes += self.spans[first..].iter().map(|s| s.1).sum::<usize>();
                            out.ends.push(out.args.len() + self.spans.len());
                        }
                        continue;
                    }
                    Ok(Scan::Short { .. }) => self.spans.truncate(first),
                    Err(e) => {
                        self.spans.truncate(first);
                        break Err(e);
                    }
                }
            }
            // Anything else (an inline request, a request not whole, a large argument
            // arriving) goes the one-by-one way, after the requests scanned so far.
            self.cut_scanned(buf, &mut pos, out);
            match self.next(buf, limits) {
                Ok(Some(args)) => out.push(args),
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        self.cut_scanned(buf, &mut pos, out);
        got
    }

    /// Cuts the requests [`RequestReader::read_turn`] scanned (up to `pos`) off `buf`,
    /// their arguments into `out`.
    fn cut_scanned(&mut self, buf: &mut BytesMut, pos: &mut usize, out: &mut Requests) {
        if *pos > 0 {
            cut(buf, *pos, &self.spans, &mut out.args);
            self.spans.clear();
            *pos = 0;
        }
    }

    fn scan(
        &mut self,
        buf: &mut BytesMut,
        pos: usize,
        count: usize,
        limits: &Limits,
    ) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        let mut spans = Vec::with_capacity(count.min(1024));
        match scan_bulks(buf, pos, count, limits, &mut spans)? {
            Scan::Whole { end } => {
                let mut args = std::mem::take(&mut self.args);
                cut(buf, end, &spans, &mut args);
                (self.left, self.held) = (0, 0);
                Ok(Some(args))
            }
            Scan::Short { end, wanted } => {
                if wanted > 0 || self.left > 0 {
                    // Hold what is whole (and the request's header) apart from the buffer.
                    self.left = count - spans.len();
                    self.held += spans.iter().map(|s| s.1).sum::<usize>();
                    cut(buf, end, &spans, &mut self.args);
                    self.wanted = wanted;
                }
                Ok(None)
            }
        }
    }

    /// Bytes the large argument being read still needs beyond what the buffer holds (0
    /// when none is being read).
    pub fn wanted(&self) -> usize {
        self.wanted
    }

    /// Whether part of a request is held here (the buffer may be empty meanwhile).
    pub fn is_pending(&self) -> bool {
        self.left > 0
    }

    /// Bytes of arguments held here, for the query buffer's limit.
    pub fn held_bytes(&self) -> usize {
        self.held
    }
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
        let got =
            parse_all(b"*1\r\n$4\r\nPING\r\nPING\r\n\r\n*0\r\n*-10\r\nSET k \"a b\"\r\n").unwrap();
        assert_eq!(
            got,
            vec![vec!["PING"], vec!["PING"], vec!["SET", "k", "a b"]]
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

    /// Feeds `input` to a reader `step` bytes at a time, making room as a connection does.
    fn read_in_steps(input: &[u8], step: usize) -> Vec<Vec<Bytes>> {
        let (mut reader, mut buf, mut out) = (RequestReader::default(), BytesMut::new(), vec![]);
        for piece in input.chunks(step) {
            if reader.wanted() > buf.capacity() - buf.len() {
                buf.reserve(reader.wanted());
            }
            buf.extend_from_slice(piece);
            while let Some(r) = reader.next(&mut buf, &Limits::default()).unwrap() {
                out.push(r);
            }
        }
        assert!(!reader.is_pending() && buf.is_empty());
        out
    }

    /// The requests `requests` in the multibulk form.
    fn multibulk(requests: &[Vec<&[u8]>]) -> Vec<u8> {
        let mut input = Vec::new();
        for args in requests {
            input.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
            for a in args {
                input.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
                input.extend_from_slice(a);
                input.extend_from_slice(b"\r\n");
            }
        }
        input
    }

    #[test]
    fn a_reader_gives_the_same_requests_at_every_split() {
        let big = vec![b'v'; LARGE_ARG_BYTES + 5];
        let mut input = multibulk(&[
            vec![&b"SET"[..], b"k", &big],
            vec![b"PING"],
            vec![b"MSET", b"a", &big, b"b", &big, b"c", b"1"],
            vec![],
        ]);
        input.extend_from_slice(b"*-3\r\nPING\r\n");
        let want = parse_all(&input).unwrap();
        // `*0` and `*-3` are skipped.
        assert_eq!(want.len(), 4);
        for step in [1, 2, 3, 7, 100, 4096, LARGE_ARG_BYTES - 1, input.len()] {
            assert_eq!(read_in_steps(&input, step), want, "step {step}");
        }
    }

    /// [`read_in_steps`] by turns of at most `count_max` requests and `bytes_max` bytes.
    fn read_turns_in_steps(
        input: &[u8],
        step: usize,
        count_max: usize,
        bytes_max: usize,
    ) -> Vec<Vec<Bytes>> {
        let (mut reader, mut buf, mut out) = (RequestReader::default(), BytesMut::new(), vec![]);
        let mut turn = Requests::default();
        for piece in input.chunks(step) {
            if reader.wanted() > buf.capacity() - buf.len() {
                buf.reserve(reader.wanted());
            }
            buf.extend_from_slice(piece);
            loop {
                turn.clear();
                reader
                    .read_turn(
                        &mut buf,
                        &Limits::default(),
                        count_max,
                        bytes_max,
                        &mut turn,
                    )
                    .unwrap();
                assert!(turn.len() <= count_max);
                let sum: usize = (0..turn.len())
                    .map(|i| turn.get(i).iter().map(|a| a.len()).sum::<usize>())
                    .sum();
                assert_eq!(turn.bytes(), sum);
                out.extend((0..turn.len()).map(|i| turn.get(i).to_vec()));
                if turn.is_empty() {
                    break;
                }
            }
        }
        assert!(!reader.is_pending() && buf.is_empty());
        out
    }

    /// Whole requests in a row are cut at once; inline ones, `*0`, and large arguments
    /// arriving go the one-by-one way among them: the same requests, in order, at every
    /// split and every turn size.
    #[test]
    fn turns_give_the_same_requests_as_one_by_one() {
        let big = vec![b'v'; LARGE_ARG_BYTES + 5];
        let mut input = multibulk(&[
            vec![&b"SET"[..], b"k", b"v"],
            vec![b"GET", b"k"],
            vec![b"SET", b"k", &big],
            vec![],
            vec![b"PING"],
            vec![b"MSET", b"a", &big, b"b", b"1"],
            vec![b"SADD", b"s", b"m1", b"m2"],
        ]);
        input.extend_from_slice(b"PING inline\r\n*2\r\n$4\r\nECHO\r\n$1\r\nx\r\n");
        let want = parse_all(&input).unwrap();
        assert_eq!(want.len(), 8);
        for step in [1, 3, 7, 100, 4096, input.len()] {
            for (count_max, bytes_max) in [
                (1, usize::MAX),
                (2, usize::MAX),
                (1024, 16),
                (1024, usize::MAX),
            ] {
                assert_eq!(
                    read_turns_in_steps(&input, step, count_max, bytes_max),
                    want,
                    "step {step}, turns of {count_max} requests, {bytes_max} bytes"
                );
            }
        }
    }

    /// A malformed request ends the turn with its error; the requests before it are there.
    #[test]
    fn a_turn_keeps_the_requests_before_a_protocol_error() {
        let mut buf = BytesMut::from(&b"*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nPING\r\n*1\r\n?4\r\n"[..]);
        let (mut reader, mut turn) = (RequestReader::default(), Requests::default());
        let e = reader
            .read_turn(&mut buf, &Limits::default(), 1024, usize::MAX, &mut turn)
            .unwrap_err();
        assert_eq!(e.0, "expected '$', got '?'");
        assert_eq!(turn.len(), 2);
        assert_eq!(turn.get(1), &[Bytes::from_static(b"PING")]);
    }

    #[test]
    fn a_large_argument_is_read_into_room_of_its_own_size() {
        let mut reader = RequestReader::default();
        let n = LARGE_ARG_BYTES * 4;
        let mut buf =
            BytesMut::from(format!("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n${n}\r\nab").as_bytes());
        assert_eq!(reader.next(&mut buf, &Limits::default()).unwrap(), None);
        assert!(reader.is_pending());
        assert_eq!(reader.held_bytes(), 4, "SET and k are held apart");
        assert_eq!(
            reader.wanted(),
            n - 2 + 2,
            "the value's missing bytes and its CRLF"
        );
        buf.reserve(reader.wanted());
        let at = buf.as_ptr() as usize;
        buf.extend_from_slice(&vec![b'x'; n - 2]);
        buf.extend_from_slice(b"\r\n");
        assert_eq!(buf.as_ptr() as usize, at, "no move while the value arrived");
        let r = reader.next(&mut buf, &Limits::default()).unwrap().unwrap();
        assert_eq!((r.len(), r[2].len()), (3, n));
        assert!(!reader.is_pending() && reader.wanted() == 0 && reader.held_bytes() == 0);
    }

    #[test]
    fn a_reader_keeps_the_protocol_errors() {
        let mut reader = RequestReader::default();
        let mut buf =
            BytesMut::from(format!("*2\r\n$3\r\nSET\r\n${}\r\n", LARGE_ARG_BYTES).as_bytes());
        assert_eq!(reader.next(&mut buf, &Limits::default()).unwrap(), None);
        buf.extend_from_slice(&vec![b'x'; LARGE_ARG_BYTES]);
        buf.extend_from_slice(b"XX");
        assert_eq!(
            reader.next(&mut buf, &Limits::default()).unwrap_err().0,
            "bulk string not terminated by CRLF"
        );
    }

    #[test]
    fn lengths_and_line_ends_read_as_before() {
        for (text, want) in [
            (&b"5"[..], Some(5)),
            (b"007", Some(7)),
            (b"-1", Some(-1)),
            (b"999999999999999999", Some(999_999_999_999_999_999)),
            (b"9223372036854775807", Some(i64::MAX)),
            (b"9223372036854775808", None),
            (b"", None),
            (b"+5", None),
            (b" 5", None),
            (b"5x", None),
        ] {
            assert_eq!(parse_len(text), want, "{text:?}");
        }
        assert_eq!(line_end(b"ab\rc\r\nd", 0), Some(4));
        assert_eq!(line_end(b"ab\r", 0), None);
        assert_eq!(line_end(b"\r\n\r\n", 1), Some(2));
        assert_eq!(line_end(b"x\r\n", 3), None);
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
