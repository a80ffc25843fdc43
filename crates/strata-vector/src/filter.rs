//! `VSIM ... FILTER` expressions over an element's JSON attributes, as Redis documents
//! them: `.field` selects a top-level attribute; numbers, strings (`"..."` or `'...'`),
//! `true`/`false` (1 and 0), arrays `[...]` (for `in`); `+ - * / % **`, `== != > >= < <=`,
//! `and or not` (or `&& || !`), `in` (an array's member, or a string's substring), and
//! parentheses. An element whose attributes are missing or not JSON, or that lacks a field
//! the expression reads, does not match: evaluation never fails, only parsing does.
//!
//! Precedence, loosest first: `or`, `and`, `in`, `== !=`, `> >= < <=`, `+ -`, `* / %`,
//! `**` (right to left), then `not` and unary minus.

use serde_json::Value as Json;

/// A value during evaluation.
#[derive(Debug, Clone, PartialEq)]
enum Val {
    Num(f64),
    Str(String),
    Arr(Vec<Val>),
}

impl Val {
    fn from_json(j: &Json) -> Option<Val> {
        Some(match j {
            Json::Number(n) => Val::Num(n.as_f64()?),
            Json::String(s) => Val::Str(s.clone()),
            Json::Bool(b) => Val::Num(*b as u8 as f64),
            Json::Array(a) => Val::Arr(a.iter().map(Val::from_json).collect::<Option<_>>()?),
            _ => return None,
        })
    }

    fn truthy(&self) -> bool {
        match self {
            Val::Num(n) => *n != 0.0,
            Val::Str(s) => !s.is_empty(),
            Val::Arr(a) => !a.is_empty(),
        }
    }

    fn num(&self) -> Option<f64> {
        match self {
            Val::Num(n) => Some(*n),
            _ => None,
        }
    }
}

/// A parsed expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Lit(LitVal),
    Field(String),
    Array(Vec<Expr>),
    Not(Box<Expr>),
    Neg(Box<Expr>),
    Bin(Op, Box<Expr>, Box<Expr>),
}

/// A literal.
#[derive(Debug, Clone, PartialEq)]
pub enum LitVal {
    Num(f64),
    Str(String),
}

/// A binary operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Or,
    And,
    In,
    Eq,
    Ne,
    Gt,
    Ge,
    Lt,
    Le,
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    Pow,
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(f64),
    Str(String),
    Field(String),
    Op(Op),
    Not,
    Minus,
    Open,
    Close,
    LBracket,
    RBracket,
    Comma,
}

/// Why an expression does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(pub String);

fn err<T>(what: impl Into<String>) -> Result<T, ParseError> {
    Err(ParseError(what.into()))
}

/// The operator spelled at the start of `s`, and its length.
fn operator(s: &str) -> Option<(Tok, usize)> {
    const OPS: [(&str, Op); 15] = [
        ("**", Op::Pow),
        ("==", Op::Eq),
        ("!=", Op::Ne),
        (">=", Op::Ge),
        ("<=", Op::Le),
        ("&&", Op::And),
        ("||", Op::Or),
        (">", Op::Gt),
        ("<", Op::Lt),
        ("+", Op::Add),
        ("*", Op::Mul),
        ("/", Op::Div),
        ("%", Op::Mod),
        ("and", Op::And),
        ("or", Op::Or),
    ];
    OPS.iter()
        .find(|(text, _)| s.starts_with(text))
        .map(|(text, op)| (Tok::Op(*op), text.len()))
}

fn lex(src: &str) -> Result<Vec<Tok>, ParseError> {
    let mut out = Vec::new();
    let mut rest = src;
    while let Some(c) = rest.chars().next() {
        let word_len = rest
            .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
            .unwrap_or(rest.len());
        let (tok, len) = match c {
            ' ' | '\t' | '\n' | '\r' => (None, 1),
            '(' => (Some(Tok::Open), 1),
            ')' => (Some(Tok::Close), 1),
            '[' => (Some(Tok::LBracket), 1),
            ']' => (Some(Tok::RBracket), 1),
            ',' => (Some(Tok::Comma), 1),
            '-' => (Some(Tok::Minus), 1),
            '.' if rest[1..].starts_with(|ch: char| ch.is_ascii_alphabetic() || ch == '_') => {
                let n = 1 + rest[1..]
                    .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
                    .unwrap_or(rest.len() - 1);
                (Some(Tok::Field(rest[1..n].to_string())), n)
            }
            '"' | '\'' => match rest[1..].find(c) {
                Some(end) => (Some(Tok::Str(rest[1..1 + end].to_string())), end + 2),
                None => return err("an unterminated string"),
            },
            '0'..='9' | '.' => {
                let n = rest
                    .find(|ch: char| !(ch.is_ascii_digit() || ".eE".contains(ch)))
                    .unwrap_or(rest.len());
                match rest[..n].parse() {
                    Ok(v) => (Some(Tok::Num(v)), n),
                    Err(_) => return err(format!("a bad number '{}'", &rest[..n])),
                }
            }
            '!' if !rest.starts_with("!=") => (Some(Tok::Not), 1),
            _ if &rest[..word_len] == "not" => (Some(Tok::Not), 3),
            _ if &rest[..word_len] == "in" => (Some(Tok::Op(Op::In)), 2),
            _ if &rest[..word_len] == "true" => (Some(Tok::Num(1.0)), 4),
            _ if &rest[..word_len] == "false" => (Some(Tok::Num(0.0)), 5),
            _ => match operator(rest) {
                Some((t, n)) if word_len == 0 || word_len == n => (Some(t), n),
                _ => return err(format!("an unknown token at '{rest}'")),
            },
        };
        out.extend(tok);
        rest = &rest[len..];
    }
    Ok(out)
}

/// How tightly `op` binds (higher binds tighter).
fn binding(op: Op) -> u8 {
    match op {
        Op::Or => 1,
        Op::And => 2,
        Op::In => 3,
        Op::Eq | Op::Ne => 4,
        Op::Gt | Op::Ge | Op::Lt | Op::Le => 5,
        Op::Add | Op::Sub => 6,
        Op::Mul | Op::Div | Op::Mod => 7,
        Op::Pow => 8,
    }
}

struct Parser {
    toks: Vec<Tok>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.at)
    }

    fn next(&mut self) -> Option<Tok> {
        let t = self.toks.get(self.at).cloned();
        self.at += 1;
        t
    }

    /// An expression whose operators bind at least `min` tightly.
    fn expr(&mut self, min: u8) -> Result<Expr, ParseError> {
        let mut left = self.unary()?;
        loop {
            let op = match self.peek() {
                Some(Tok::Op(op)) => *op,
                Some(Tok::Minus) => Op::Sub,
                _ => return Ok(left),
            };
            let b = binding(op);
            if b < min {
                return Ok(left);
            }
            self.next();
            // `**` groups to the right, the rest to the left.
            let right = self.expr(if op == Op::Pow { b } else { b + 1 })?;
            left = Expr::Bin(op, Box::new(left), Box::new(right));
        }
    }

    fn unary(&mut self) -> Result<Expr, ParseError> {
        match self.next() {
            Some(Tok::Not) => Ok(Expr::Not(Box::new(self.unary()?))),
            Some(Tok::Minus) => Ok(Expr::Neg(Box::new(self.unary()?))),
            Some(Tok::Num(n)) => Ok(Expr::Lit(LitVal::Num(n))),
            Some(Tok::Str(s)) => Ok(Expr::Lit(LitVal::Str(s))),
            Some(Tok::Field(f)) => Ok(Expr::Field(f)),
            Some(Tok::Open) => {
                let e = self.expr(0)?;
                match self.next() {
                    Some(Tok::Close) => Ok(e),
                    _ => err("a missing ')'"),
                }
            }
            Some(Tok::LBracket) => self.array(),
            Some(t) => err(format!("an unexpected {t:?}")),
            None => err("an unexpected end"),
        }
    }

    fn array(&mut self) -> Result<Expr, ParseError> {
        let mut items = Vec::new();
        if self.peek() == Some(&Tok::RBracket) {
            self.next();
            return Ok(Expr::Array(items));
        }
        loop {
            items.push(self.expr(0)?);
            match self.next() {
                Some(Tok::Comma) => continue,
                Some(Tok::RBracket) => return Ok(Expr::Array(items)),
                _ => return err("a missing ']'"),
            }
        }
    }
}

/// Parses a `FILTER` expression.
pub fn parse(src: &str) -> Result<Expr, ParseError> {
    let mut p = Parser {
        toks: lex(src)?,
        at: 0,
    };
    let e = p.expr(0)?;
    match p.peek() {
        None => Ok(e),
        Some(t) => err(format!("an unexpected {t:?} after the expression")),
    }
}

impl Expr {
    /// Whether an element with JSON attributes `attrs` (`None`: it has none) matches.
    pub fn matches(&self, attrs: Option<&[u8]>) -> bool {
        let uses_fields = self.reads_fields();
        let json = match attrs.map(serde_json::from_slice::<Json>) {
            Some(Ok(Json::Object(m))) => Some(m),
            _ if uses_fields => return false,
            _ => None,
        };
        self.eval(json.as_ref()).is_some_and(|v| v.truthy())
    }

    fn reads_fields(&self) -> bool {
        match self {
            Expr::Field(_) => true,
            Expr::Lit(_) => false,
            Expr::Array(a) => a.iter().any(Expr::reads_fields),
            Expr::Not(e) | Expr::Neg(e) => e.reads_fields(),
            Expr::Bin(_, a, b) => a.reads_fields() || b.reads_fields(),
        }
    }

    fn eval(&self, attrs: Option<&serde_json::Map<String, Json>>) -> Option<Val> {
        Some(match self {
            Expr::Lit(LitVal::Num(n)) => Val::Num(*n),
            Expr::Lit(LitVal::Str(s)) => Val::Str(s.clone()),
            Expr::Field(f) => Val::from_json(attrs?.get(f)?)?,
            Expr::Array(a) => Val::Arr(a.iter().map(|e| e.eval(attrs)).collect::<Option<_>>()?),
            Expr::Not(e) => Val::Num(!e.eval(attrs)?.truthy() as u8 as f64),
            Expr::Neg(e) => Val::Num(-e.eval(attrs)?.num()?),
            Expr::Bin(Op::And, a, b) => {
                Val::Num((a.eval(attrs)?.truthy() && b.eval(attrs)?.truthy()) as u8 as f64)
            }
            Expr::Bin(Op::Or, a, b) => {
                let l = a.eval(attrs).is_some_and(|v| v.truthy());
                Val::Num((l || b.eval(attrs)?.truthy()) as u8 as f64)
            }
            Expr::Bin(op, a, b) => binary(*op, a.eval(attrs)?, b.eval(attrs)?)?,
        })
    }
}

fn binary(op: Op, l: Val, r: Val) -> Option<Val> {
    let flag = |b: bool| Some(Val::Num(b as u8 as f64));
    match op {
        Op::Eq => flag(l == r),
        Op::Ne => flag(l != r),
        Op::In => match (&l, &r) {
            (_, Val::Arr(items)) => flag(items.contains(&l)),
            (Val::Str(needle), Val::Str(hay)) => flag(hay.contains(needle.as_str())),
            _ => None,
        },
        Op::Gt | Op::Ge | Op::Lt | Op::Le => {
            let ord = match (&l, &r) {
                (Val::Num(a), Val::Num(b)) => a.partial_cmp(b)?,
                (Val::Str(a), Val::Str(b)) => a.cmp(b),
                _ => return None,
            };
            flag(match op {
                Op::Gt => ord.is_gt(),
                Op::Ge => ord.is_ge(),
                Op::Lt => ord.is_lt(),
                _ => ord.is_le(),
            })
        }
        _ => {
            let (a, b) = (l.num()?, r.num()?);
            Some(Val::Num(match op {
                Op::Add => a + b,
                Op::Sub => a - b,
                Op::Mul => a * b,
                Op::Div => a / b,
                Op::Mod => a % b,
                _ => a.powf(b),
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(expr: &str, attrs: &str) -> bool {
        parse(expr).unwrap().matches(Some(attrs.as_bytes()))
    }

    #[test]
    fn the_documented_forms_match_as_redis_says() {
        let movie =
            r#"{"year": 1984, "rating": 8.1, "genre": "action", "tags": ["a", "b"], "old": true}"#;
        assert!(run(".year >= 1980 and .rating > 7", movie));
        assert!(!run(".year > 1990 && .rating > 7", movie));
        assert!(run(".genre == 'action' or .year < 0", movie));
        assert!(run(".genre in [\"drama\", \"action\"]", movie));
        assert!(run("'ct' in .genre", movie));
        assert!(run("\"a\" in .tags and not (.year == 2000)", movie));
        assert!(run("!(.rating < 5) && .old", movie));
        assert!(run("(.year - 1900) * 2 == 168", movie));
        assert!(run("2 ** 3 ** 2 == 512", movie), "** groups to the right");
        assert!(run(".year % 100 == 84 and -.rating < 0", movie));
        assert!(run("1 + 2 * 3 == 7", "{}"));
    }

    #[test]
    fn missing_fields_and_bad_json_never_match_and_never_fail() {
        assert!(!run(".missing > 1", r#"{"year": 1}"#));
        assert!(!run(".year > 1", "not json"));
        assert!(!run(".year > 1", "[1, 2]"));
        assert!(!parse(".year > 1").unwrap().matches(None));
        assert!(
            !run(".genre > 1", r#"{"genre": "x"}"#),
            "a string against a number"
        );
        // An `or` whose left side cannot be read still looks at its right side.
        assert!(run(".missing == 1 or .year == 1", r#"{"year": 1}"#));
    }

    #[test]
    fn bad_expressions_are_parse_errors() {
        for bad in [
            ".year >",
            "(.year > 1",
            ".year >> 1",
            "'open",
            ".a in [1, 2",
            "1 2",
            "@",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
