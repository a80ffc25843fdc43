//! The libraries Redis gives scripts besides Lua's own: `cjson`, `cmsgpack`, `bit` and
//! `struct`, written here in Rust against Redis's documented behaviour.

pub(crate) mod bit;
pub(crate) mod cjson;
pub(crate) mod cmsgpack;
pub(crate) mod structs;

/// `n` as C's `printf("%.<precision>g")` writes it (Lua's `tostring` uses 14).
pub(crate) fn format_g(n: f64, precision: usize) -> String {
    if n.is_nan() {
        return if n.is_sign_negative() { "-nan" } else { "nan" }.into();
    }
    if n.is_infinite() {
        return if n < 0.0 { "-inf" } else { "inf" }.into();
    }
    if n == 0.0 {
        return if n.is_sign_negative() { "-0" } else { "0" }.into();
    }
    let p = precision.max(1);
    let sci = format!("{:.*e}", p - 1, n);
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("{:e} exponent is a number");
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
        let decimals = (p as i32 - 1 - exp).max(0) as usize;
        trim(&format!("{n:.decimals$}"))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn format_g_writes_what_printf_writes() {
        for (n, want) in [
            (0.1, "0.1"),
            (100.0, "100"),
            (1023.2, "1023.2"),
            (-5000.0, "-5000"),
            (0.0003, "0.0003"),
            (1e15, "1e+15"),
            (123456789012346.0, "1.2345678901235e+14"),
            (1e-5, "1e-05"),
            (2f64.powi(40), "1099511627776"),
        ] {
            assert_eq!(super::format_g(n, 14), want, "{n}");
        }
    }
}
