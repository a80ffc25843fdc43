//! Bit commands on strings: `SETBIT`, `GETBIT`, `BITCOUNT`. A string's bit `n` is bit
//! `7 - n % 8` of byte `n / 8` (the most significant bit first), as in Redis.

use bytes::{Bytes, BytesMut};
use strata_engine::{Change, Kind};
use strata_resp::Reply;

use super::ctx::{engine_error, lower, not_integer, parse_int, string_only, syntax_error, Ctx};

/// The highest bit offset (Redis's 512 MiB string limit).
const BIT_OFFSET_MAX: i64 = (1 << 32) - 1;

fn bit_offset(b: &[u8]) -> Result<usize, Reply> {
    match parse_int(b) {
        Some(n) if (0..=BIT_OFFSET_MAX).contains(&n) => Ok(n as usize),
        _ => Err(Reply::err(
            "ERR bit offset is not an integer or out of range",
        )),
    }
}

fn bit_at(v: &[u8], offset: usize) -> u8 {
    v.get(offset / 8).map_or(0, |b| (b >> (7 - offset % 8)) & 1)
}

pub(crate) async fn setbit(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let offset = match bit_offset(&a[2]) {
        Ok(o) => o,
        Err(r) => return r,
    };
    let on = match a[3].as_ref() {
        b"1" => true,
        b"0" => false,
        _ => return Reply::err("ERR bit is not an integer or out of range"),
    };
    if offset / 8 + 1 > ctx.shared.cfg.read().proto_max_bulk_len as usize {
        return Reply::err("ERR string exceeds maximum allowed size (proto-max-bulk-len)");
    }
    let key = ctx.key(&a[1]);
    let r = ctx
        .shared
        .engine
        .update(&key, true, move |cur| {
            string_only(&cur)?;
            let old = cur.as_ref().and_then(|c| c.value);
            let expire_ms = cur.as_ref().map_or(0, |c| c.expire_ms);
            let was = old.map_or(0, |v| bit_at(v, offset));
            let mut v = BytesMut::from(old.map_or(&b""[..], |o| o.as_ref()));
            if v.len() <= offset / 8 {
                v.resize(offset / 8 + 1, 0);
            }
            let mask = 1u8 << (7 - offset % 8);
            if on {
                v[offset / 8] |= mask;
            } else {
                v[offset / 8] &= !mask;
            }
            let change = Change::Put {
                kind: Kind::String,
                value: v.freeze(),
                expire_ms,
            };
            Ok((Some(change), was as i64))
        })
        .await;
    match r {
        Ok(w) => Reply::Integer(ctx.defer(w)),
        Err(e) => engine_error(&e),
    }
}

pub(crate) async fn getbit(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let offset = match bit_offset(&a[2]) {
        Ok(o) => o,
        Err(r) => return r,
    };
    match ctx.shared.engine.get(&ctx.key(&a[1])).await {
        Ok(v) => Reply::Integer(v.map_or(0, |v| bit_at(&v, offset)) as i64),
        Err(e) => engine_error(&e),
    }
}

/// `BITCOUNT key [start end [BYTE|BIT]]`: set bits in the range (negative indexes count
/// from the end), checked in Redis's order: the key (a missing one counts 0 whatever the
/// arguments), the indexes, then the unit.
pub(crate) async fn bitcount(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let v = match ctx.shared.engine.get(&ctx.key(&a[1])).await {
        Ok(Some(v)) => v,
        Ok(None) => return Reply::Integer(0),
        Err(e) => return engine_error(&e),
    };
    let popcount = |b: &[u8]| b.iter().map(|x| x.count_ones() as i64).sum::<i64>();
    if a.len() == 2 {
        return Reply::Integer(popcount(&v));
    }
    if a.len() != 4 && a.len() != 5 {
        return syntax_error();
    }
    let (Some(mut start), Some(mut end)) = (parse_int(&a[2]), parse_int(&a[3])) else {
        return not_integer();
    };
    if start < 0 && end < 0 && start > end {
        return Reply::Integer(0);
    }
    let bits = match a.get(4).map(|u| lower(u)) {
        None => false,
        Some(u) if u == "byte" => false,
        Some(u) if u == "bit" => true,
        Some(_) => return syntax_error(),
    };
    let len = if bits {
        v.len() as i64 * 8
    } else {
        v.len() as i64
    };
    if start < 0 {
        start += len;
    }
    if end < 0 {
        end += len;
    }
    let (start, end) = (start.max(0), end.max(0).min(len - 1));
    if start > end {
        return Reply::Integer(0);
    }
    let count = if bits {
        (start as usize..=end as usize)
            .filter(|&i| bit_at(&v, i) == 1)
            .count() as i64
    } else {
        popcount(&v[start as usize..=end as usize])
    };
    Reply::Integer(count)
}
