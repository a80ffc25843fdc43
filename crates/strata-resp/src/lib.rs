//! The Redis serialization protocol: requests in, replies out. No I/O, no commands.
//!
//! [`parse_request`] takes bytes as they arrive and returns whole requests (multibulk or
//! inline), with every argument a zero-copy slice of the received buffer. [`Reply`] is a
//! reply in RESP3 terms; [`ReplyBuf`] encodes it for a RESP2 or RESP3 client and keeps
//! large bulk values as separate chunks so they are written without a copy.
//!
//! ```
//! use bytes::BytesMut;
//! use strata_resp::{parse_request, Limits, Reply, ReplyBuf};
//! let mut buf = BytesMut::from(&b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"[..]);
//! let req = parse_request(&mut buf, &Limits::default()).unwrap().unwrap();
//! assert_eq!(req, vec!["GET", "k"]);
//! let mut out = ReplyBuf::new(2);
//! out.push(&Reply::Bulk("v".into()));
//! assert_eq!(out.to_vec(), b"$1\r\nv\r\n");
//! ```

mod parse;
mod reply;

pub use parse::{parse_request, Limits, ProtocolError, RequestReader, Requests, LARGE_ARG_BYTES};

/// The Redis version Strata answers to (`HELLO`, `INFO`, `redis.REDIS_VERSION`), for
/// clients that check it.
pub const REDIS_VERSION: &str = "7.0.0";
pub use reply::{format_double, format_g, Reply, ReplyBuf};
