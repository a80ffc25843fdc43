//! The arithmetic of Redis's `INCRBYFLOAT` and `HINCRBYFLOAT`: the x87 80-bit extended
//! format `long double` has on x86-64 (64-bit significand, exponents down to 2^-16445 with
//! subnormals), computed exactly and rounded to nearest-even as the hardware does, parsed as
//! glibc's `strtold` parses (Redis's `string2ld`) and printed as `%.17Lf` with trailing
//! zeros trimmed (Redis's `ld2string` in human mode). An `f64` cannot give the same text.

use num_bigint::{BigInt, BigUint, Sign};
use num_traits::{One, ToPrimitive, Zero};

/// Significand bits of the format.
const MANT_BITS: u64 = 64;
/// Weight of the last significand bit of the smallest numbers (subnormals).
const EXP_MIN: i64 = -16445;
/// Every finite value is below 2^EXP_LIMIT.
const EXP_LIMIT: i64 = 16384;
/// Longest text Redis parses or prints as a long double (`MAX_LONG_DOUBLE_CHARS`).
pub(crate) const TEXT_BYTES_MAX: usize = 5 * 1024;

/// A finite long double: `(-1)^neg × mant × 2^exp`, `mant` below 2^64.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LongDouble {
    neg: bool,
    mant: u64,
    exp: i64,
}

/// What adding two numbers gave: a number, or an infinity or NaN (which Redis refuses to
/// store).
pub(crate) enum Sum {
    Finite(LongDouble),
    NotFinite,
}

impl LongDouble {
    pub(crate) const ZERO: LongDouble = LongDouble {
        neg: false,
        mant: 0,
        exp: 0,
    };

    /// Parses `b` as Redis's `string2ld` does: all of it must be a number `strtold` reads
    /// (decimal or hexadecimal, with `inf`/`infinity`), no leading space, not NaN, and not
    /// out of range (a finite text whose value overflows, or rounds to zero). `None` when it
    /// is not a float. `Some(Err(()))` for an infinity, which parses but cannot be stored.
    pub(crate) fn parse(b: &[u8]) -> Option<Result<LongDouble, ()>> {
        if b.is_empty() || b.len() >= TEXT_BYTES_MAX {
            return None;
        }
        let (neg, body) = match b[0] {
            b'-' => (true, &b[1..]),
            b'+' => (false, &b[1..]),
            _ => (false, b),
        };
        let lower = body.to_ascii_lowercase();
        if lower == b"inf" || lower == b"infinity" {
            return Some(Err(()));
        }
        let exact = if lower.starts_with(b"0x") && lower.len() > 2 {
            parse_hex(&lower[2..])?
        } else {
            parse_decimal(&lower)?
        };
        match exact {
            Exact::Zero => Some(Ok(LongDouble {
                neg,
                ..LongDouble::ZERO
            })),
            Exact::Value(r) => match round(neg, r) {
                // Overflow (ERANGE, HUGE_VAL) and underflow to zero (ERANGE, 0) are refused.
                Rounded::Finite(v) if v.mant != 0 => Some(Ok(v)),
                _ => None,
            },
        }
    }

    /// One value, one form: the significand odd (or zero, with exponent 0).
    fn canonical(neg: bool, mant: u64, exp: i64) -> LongDouble {
        if mant == 0 {
            return LongDouble {
                neg,
                ..LongDouble::ZERO
            };
        }
        let z = mant.trailing_zeros();
        LongDouble {
            neg,
            mant: mant >> z,
            exp: exp + z as i64,
        }
    }

    /// `self + other`, rounded to nearest-even.
    pub(crate) fn add(self, other: LongDouble) -> Sum {
        if self.mant == 0 && other.mant == 0 {
            // -0 + -0 is -0; any other sum of zeros is +0.
            return Sum::Finite(LongDouble {
                neg: self.neg && other.neg,
                ..LongDouble::ZERO
            });
        }
        let e = self.exp.min(other.exp);
        let term = |v: LongDouble| {
            let m = BigInt::from(v.mant) << (v.exp - e) as usize;
            if v.neg {
                -m
            } else {
                m
            }
        };
        let sum = term(self) + term(other);
        let neg = sum.sign() == Sign::Minus;
        if sum.is_zero() {
            return Sum::Finite(LongDouble::ZERO);
        }
        let r = Ratio {
            num: sum.magnitude().clone(),
            exp: e,
            sticky: false,
        };
        match round(neg, r) {
            Rounded::Finite(v) => Sum::Finite(v),
            Rounded::Infinite => Sum::NotFinite,
        }
    }

    /// The text Redis stores: `%.17Lf` (rounded to nearest-even at the 17th decimal), with
    /// trailing zeros and a trailing point removed, and `-0` written `0`.
    pub(crate) fn to_text(self) -> String {
        let m = BigUint::from(self.mant);
        let fixed = if self.exp >= 0 {
            format!("{}.{:017}", m << self.exp as usize, 0)
        } else {
            let shift = (-self.exp) as usize;
            let scaled = m * BigUint::from(10u64).pow(17);
            let mut q = &scaled >> shift;
            let rem = &scaled - (&q << shift);
            let half = BigUint::one() << (shift - 1);
            if rem > half || rem == half && (&q % 2u32).is_one() {
                q += 1u32;
            }
            let unit = BigUint::from(10u64).pow(17);
            let frac = (&q % &unit).to_u64().expect("below 10^17");
            format!("{}.{frac:017}", q / unit)
        };
        let trimmed = fixed.trim_end_matches('0').trim_end_matches('.');
        match (self.neg, trimmed) {
            (_, "0") | (false, _) => trimmed.to_string(),
            (true, t) => format!("-{t}"),
        }
    }
}

/// An exact positive value `num × 2^exp`, and whether nonzero bits below it were dropped
/// (`sticky`: the value is a little more than that).
struct Ratio {
    num: BigUint,
    exp: i64,
    sticky: bool,
}

enum Exact {
    Zero,
    Value(Ratio),
}

enum Rounded {
    Finite(LongDouble),
    Infinite,
}

/// Rounds `r` to the nearest long double (ties to even), with subnormals.
fn round(neg: bool, r: Ratio) -> Rounded {
    let bits = r.num.bits() as i64;
    // Drop bits below the significand's last place, and below the format's last place.
    let shift = (bits - MANT_BITS as i64).max(EXP_MIN - r.exp);
    let (mut q, exp) = if shift <= 0 {
        (r.num, r.exp)
    } else {
        let s = shift as usize;
        let mut q = &r.num >> s;
        let rem = &r.num - (&q << s);
        let half = BigUint::one() << (s - 1);
        let up = match rem.cmp(&half) {
            std::cmp::Ordering::Greater => true,
            std::cmp::Ordering::Equal => r.sticky || (&q % 2u32).is_one(),
            std::cmp::Ordering::Less => false,
        };
        if up {
            q += 1u32;
        }
        (q, r.exp + shift)
    };
    let mut exp = exp;
    if q.bits() > MANT_BITS {
        q >>= 1;
        exp += 1;
    }
    if q.bits() as i64 + exp > EXP_LIMIT {
        return Rounded::Infinite;
    }
    let mant = q.to_u64().expect("64 bits");
    Rounded::Finite(LongDouble::canonical(neg, mant, exp))
}

/// A number's digits (in `radix`, at most one point) and its exponent (after `marker`:
/// sign, decimal digits): the digits as an integer, how many of them followed the point,
/// how many there were, and the exponent (0 if none).
fn parse_parts(s: &[u8], marker: u8, radix: u32) -> Option<(BigUint, i64, i64, i64)> {
    let (mantissa, exp) = match s.iter().position(|&c| c == marker) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let is_digit = if radix == 16 {
        u8::is_ascii_hexdigit
    } else {
        u8::is_ascii_digit
    };
    let (digits, frac_len) = split_point(mantissa, is_digit)?;
    let exp = match exp {
        None => 0,
        Some(e) => parse_exponent(e)?,
    };
    let n = BigUint::parse_bytes(&digits, radix).unwrap_or_default();
    Some((n, frac_len as i64, digits.len() as i64, exp))
}

fn value(num: BigUint, exp: i64, sticky: bool) -> Option<Exact> {
    Some(Exact::Value(Ratio { num, exp, sticky }))
}

/// Decimal: digits with at most one point, then an optional exponent (`e`, sign, digits).
fn parse_decimal(s: &[u8]) -> Option<Exact> {
    let (n, frac_len, len, exp10) = parse_parts(s, b'e', 10)?;
    if n.is_zero() {
        return Some(Exact::Zero);
    }
    let e10 = exp10.saturating_sub(frac_len);
    // Past these the value overflows or rounds to zero whatever the digits.
    if e10.saturating_add(len) > 4934 {
        return value(BigUint::one(), EXP_LIMIT, false);
    }
    if e10.saturating_add(len) < -4952 {
        return value(BigUint::one(), 2 * EXP_MIN, false);
    }
    if e10 >= 0 {
        return value(n * BigUint::from(10u32).pow(e10 as u32), 0, false);
    }
    // n / 10^-e10, with enough quotient bits to round correctly.
    let d = BigUint::from(10u32).pow((-e10) as u32);
    let k = (MANT_BITS as i64 + 2 + d.bits() as i64 - n.bits() as i64).max(0);
    let shifted = n << k as usize;
    let q = &shifted / &d;
    let sticky = !(&shifted % &d).is_zero();
    value(q, -k, sticky)
}

/// Hexadecimal (after `0x`): hex digits with at most one point, then an optional binary
/// exponent (`p`, sign, decimal digits).
fn parse_hex(s: &[u8]) -> Option<Exact> {
    let (n, frac_len, _, exp2) = parse_parts(s, b'p', 16)?;
    if n.is_zero() {
        return Some(Exact::Zero);
    }
    let exp = exp2
        .saturating_sub(4 * frac_len)
        .clamp(4 * EXP_MIN, 4 * EXP_LIMIT);
    value(n, exp, false)
}

/// The digits of a mantissa without its point, and how many followed the point; `None`
/// unless there is at least one digit and every other byte is a digit.
fn split_point(m: &[u8], is_digit: fn(&u8) -> bool) -> Option<(Vec<u8>, usize)> {
    let point = m.iter().position(|&c| c == b'.');
    let (int, frac) = match point {
        Some(p) => (&m[..p], &m[p + 1..]),
        None => (m, &m[..0]),
    };
    if int.len() + frac.len() == 0 || !int.iter().chain(frac).all(is_digit) {
        return None;
    }
    let mut digits = int.to_vec();
    digits.extend_from_slice(frac);
    Some((digits, frac.len()))
}

/// An exponent's text: optional sign, then at least one decimal digit (saturating).
fn parse_exponent(e: &[u8]) -> Option<i64> {
    let (neg, d) = match e.first() {
        Some(b'-') => (true, &e[1..]),
        Some(b'+') => (false, &e[1..]),
        _ => (false, e),
    };
    if d.is_empty() || !d.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let v = d.iter().fold(0i64, |acc, &c| {
        acc.saturating_mul(10).saturating_add((c - b'0') as i64)
    });
    Some(if neg { -v } else { v })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ld(s: &str) -> LongDouble {
        LongDouble::parse(s.as_bytes()).unwrap().unwrap()
    }

    fn plus(a: &str, b: &str) -> String {
        match ld(a).add(ld(b)) {
            Sum::Finite(v) => v.to_text(),
            Sum::NotFinite => "not finite".into(),
        }
    }

    #[test]
    fn sums_print_as_redis_prints_them() {
        // Each answer is what redis-server 7.0 on x86-64 replies to INCRBYFLOAT.
        assert_eq!(plus("9223372036854775807", "1.5"), "9223372036854775808");
        assert_eq!(plus("9223372036854775807", "-0.25"), "9223372036854775807");
        assert_eq!(plus("0.1", "0.2"), "0.3");
        assert_eq!(plus("10.5", "0.1"), "10.6");
        assert_eq!(plus("5.0e3", "2.0e2"), "5200");
        assert_eq!(plus("3", "-3"), "0");
        assert_eq!(plus("-0", "0"), "0");
        assert_eq!(plus("1", "1e-20"), "1");
        assert_eq!(plus("0", "1e-17"), "0.00000000000000001");
        assert_eq!(plus("0", "4e-18"), "0");
        assert_eq!(plus("0", "-1.5"), "-1.5");
        assert_eq!(plus("0x10", "0x1p-1"), "16.5");
    }

    #[test]
    fn parsing_refuses_what_string2ld_refuses() {
        for bad in [
            "", " 1", "1 ", "abc", "1e", "e5", ".", "nan", "-nan", "1e99999", "1e-99999", "0x",
            "1.2.3", "+-1",
        ] {
            assert!(LongDouble::parse(bad.as_bytes()).is_none(), "{bad:?}");
        }
        for ok in [
            "1", "-1.5", "+2", ".5", "5.", "1E3", "1e+3", "0x1P3", "0", "-0.0",
        ] {
            assert!(
                matches!(LongDouble::parse(ok.as_bytes()), Some(Ok(_))),
                "{ok:?}"
            );
        }
        assert!(matches!(LongDouble::parse(b"-inf"), Some(Err(()))));
        assert!(matches!(LongDouble::parse(b"Infinity"), Some(Err(()))));
        assert_eq!(ld("9223372036854775807"), ld("0x7fffffffffffffff"));
        assert_eq!(ld("1.5e0"), ld("0x3p-1"), "one value, one form");
        let max = ld("1.18973149535723176502e4932");
        assert!(matches!(max.add(max), Sum::NotFinite));
    }
}
