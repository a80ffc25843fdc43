//! Malformed requests, after Redis's tests/unit/protocol.tcl: each gets `-ERR Protocol
//! error: ...`, the connection closes, and the server keeps serving everyone else.

use crate::support::{Conn, Strata};

fn expect_protocol_error(s: &Strata, input: &[u8], want: &str) {
    let mut c = s.conn();
    c.send_raw(input);
    let got = String::from_utf8_lossy(&c.read_to_close()).into_owned();
    assert!(
        got.starts_with(&format!("-ERR Protocol error: {want}")),
        "input {:?}: got {got:?}",
        String::from_utf8_lossy(&input[..input.len().min(40)])
    );
}

#[test]
fn malformed_requests_are_refused_and_the_server_keeps_serving() {
    let s = Strata::start(&[]);
    let mut bystander = s.conn();
    assert_eq!(bystander.cmd(&["SET", "k", "v"]), "+OK\r\n");
    expect_protocol_error(&s, b"*20000000\r\n", "invalid multibulk length");
    expect_protocol_error(&s, b"*3000000000\r\n", "invalid multibulk length");
    expect_protocol_error(&s, b"*1\r\n$1000000000000\r\n", "invalid bulk length");
    expect_protocol_error(&s, b"*1\r\n$-10\r\n", "invalid bulk length");
    expect_protocol_error(&s, b"*1\r\nfoo\r\n", "expected '$', got 'f'");
    expect_protocol_error(
        &s,
        b"*1\r\n$3\r\nabcdef\r\n",
        "bulk string not terminated by CRLF",
    );
    expect_protocol_error(&s, b"SET k \"unbalanced\r\n", "unbalanced quotes");
    expect_protocol_error(&s, &vec![b'x'; 100 * 1024], "too big inline request");
    let mut garbage = vec![b'*'];
    garbage.extend(std::iter::repeat_n(b'9', 70 * 1024));
    expect_protocol_error(&s, &garbage, "too big mbulk count string");
    assert_eq!(bystander.cmd(&["GET", "k"]), "$1\r\nv\r\n");
}

#[test]
fn bulk_over_proto_max_bulk_len_is_refused_before_the_body_is_buffered() {
    let s = Strata::start(&[("proto_max_bulk_len", "1048576")]);
    let mut c = s.conn();
    c.send_raw(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2000000\r\n");
    let got = String::from_utf8_lossy(&c.read_to_close()).into_owned();
    assert_eq!(got, "-ERR Protocol error: invalid bulk length\r\n");
    let mut c = s.conn();
    assert_eq!(
        c.cmd(&["CONFIG", "GET", "proto-max-bulk-len"]),
        "*2\r\n$18\r\nproto-max-bulk-len\r\n$7\r\n1048576\r\n"
    );
}

#[test]
fn inline_commands_and_deep_pipelines_keep_order() {
    let s = Strata::start(&[]);
    let mut c = s.conn();
    c.send_raw(b"PING\r\nSET a \"x y\"\r\nGET a\r\n");
    assert_eq!(c.read_reply(), b"+PONG\r\n");
    assert_eq!(c.read_reply(), b"+OK\r\n");
    assert_eq!(c.read_reply(), b"$3\r\nx y\r\n");
    let mut batch = Vec::new();
    for i in 0..5000 {
        batch.extend(Conn::encode(&[b"INCR", b"counter"]));
        if i % 1000 == 0 {
            batch.extend(Conn::encode(&[b"GET", b"a"]));
        }
    }
    c.send_raw(&batch);
    let mut n = 0;
    for i in 0..5000 {
        let r = String::from_utf8(c.read_reply()).unwrap();
        n += 1;
        assert_eq!(r, format!(":{}\r\n", i + 1));
        if i % 1000 == 0 {
            assert_eq!(c.read_reply(), b"$3\r\nx y\r\n");
        }
    }
    assert_eq!(n, 5000);
}
