//! The payload of `DUMP` and `RESTORE`: one key's value, of any kind, with a version and a
//! checksum so `RESTORE` refuses bytes that `DUMP` did not write. It is Strata's own
//! payload, not Redis's RDB encoding (a Redis payload is refused, as a Strata one is by
//! Redis).
//!
//! ```text
//! payload = kind u8 | value | ver u16 LE (1) | crc32c u32 LE (over everything before it)
//! ```
//!
//! The value is the kind's stored encoding ([`crate::hash`], [`crate::members`],
//! [`crate::zset`]; a string's bytes as they are). Decoding checks that it decodes.

use crate::{FormatError, Kind, Result};

const DUMP_VERSION: u16 = 1;
/// Bytes a payload adds to its value.
pub const DUMP_OVERHEAD_BYTES: usize = 1 + 2 + 4;

/// The payload of a value of `kind`.
pub fn encode_dump(kind: Kind, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len() + DUMP_OVERHEAD_BYTES);
    out.push(kind as u8);
    out.extend_from_slice(value);
    out.extend_from_slice(&DUMP_VERSION.to_le_bytes());
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The kind and value of a payload, after its version, checksum and the value's own
/// encoding check out.
pub fn decode_dump(b: &[u8]) -> Result<(Kind, &[u8])> {
    if b.len() < DUMP_OVERHEAD_BYTES {
        return Err(FormatError::Truncated {
            what: "dump payload",
            need: DUMP_OVERHEAD_BYTES,
            have: b.len(),
        });
    }
    let (body, crc) = b.split_at(b.len() - 4);
    if crc32c::crc32c(body).to_le_bytes() != crc {
        return Err(FormatError::Checksum {
            what: "dump payload",
        });
    }
    let (body, ver) = body.split_at(body.len() - 2);
    let ver = u16::from_le_bytes([ver[0], ver[1]]);
    if ver != DUMP_VERSION {
        return Err(FormatError::Bad {
            what: "dump payload",
            detail: format!("version {ver}"),
        });
    }
    let kind = Kind::from_u8(body[0])?;
    let value = &body[1..];
    match kind {
        Kind::String => {}
        Kind::Hash | Kind::VectorSet => {
            crate::hash::decode_hash(value)?;
        }
        Kind::Set | Kind::List => {
            crate::members::decode_members(value)?;
        }
        Kind::ZSet => {
            crate::zset::decode_zset(value)?;
        }
    }
    Ok((kind, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip_and_any_damage_is_refused() {
        let list = crate::members::encode_members(&[b"a".as_slice(), b"bc"]);
        for (kind, value) in [(Kind::String, &b"hello"[..]), (Kind::List, &list[..])] {
            let p = encode_dump(kind, value);
            assert_eq!(decode_dump(&p).unwrap(), (kind, value));
            for i in 0..p.len() {
                let mut bad = p.clone();
                bad[i] ^= 0x40;
                assert!(decode_dump(&bad).is_err(), "flipped byte {i}");
            }
            assert!(decode_dump(&p[..p.len() - 1]).is_err());
        }
        // A well-sealed payload whose value does not decode as its kind.
        let p = encode_dump(Kind::Hash, b"not a hash");
        assert!(matches!(
            decode_dump(&p),
            Err(FormatError::Truncated { .. } | FormatError::Bad { .. })
        ));
    }
}
