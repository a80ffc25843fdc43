//! A command's arguments written in one line, close to the usage lines of Redis's command
//! reference, and read into the argument trees `COMMAND DOCS` answers with (`redis-cli`
//! builds its hints and `HELP` from them).
//!
//! The notation:
//! - `name` is an argument, a string unless it says its type: `count:integer`; the types
//!   are Redis's (`key string integer double pattern unix-time`), and `key`, `newkey`,
//!   `source` and `destination` are keys without saying so; the type is what follows the
//!   last colon, so a name with one in it says its type (`ip:port:string`);
//! - an upper-case word is a literal token (`WITHSCORES`); at the head of a group with more
//!   after it, it introduces the rest (`[EX seconds:integer]`, `[LIMIT offset count]`);
//! - `[ ... ]` is optional, `< ... >` required; `|` separates alternatives inside either;
//!   a group of several arguments without alternatives is a block (`<field value>`);
//! - `...` after an argument or a group repeats it (`key...`, `<field value>...`,
//!   `[GET pattern]...`, where the token repeats too).

use strata_resp::Reply;

/// One argument of a command, as `COMMAND DOCS` describes it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Arg {
    name: String,
    kind: &'static str,
    token: Option<String>,
    optional: bool,
    multiple: bool,
    multiple_token: bool,
    args: Vec<Arg>,
}

const TYPES: [&str; 6] = ["key", "string", "integer", "double", "pattern", "unix-time"];
const KEY_NAMES: [&str; 4] = ["key", "newkey", "source", "destination"];

#[derive(Debug, PartialEq)]
enum Tok<'a> {
    Word(&'a str),
    Open(char),
    Close(char),
    Or,
    Repeat,
}

fn tokens(s: &str) -> Vec<Tok<'_>> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(c) = rest.chars().next() {
        if c.is_whitespace() {
            rest = &rest[1..];
        } else if let Some(r) = rest.strip_prefix("...") {
            out.push(Tok::Repeat);
            rest = r;
        } else if c == '[' || c == '<' {
            out.push(Tok::Open(c));
            rest = &rest[1..];
        } else if c == ']' || c == '>' {
            out.push(Tok::Close(c));
            rest = &rest[1..];
        } else if c == '|' {
            out.push(Tok::Or);
            rest = &rest[1..];
        } else {
            let end = rest
                .find(|c: char| c.is_whitespace() || "[]<>|".contains(c))
                .unwrap_or(rest.len());
            let end = rest[..end].find("...").unwrap_or(end);
            out.push(Tok::Word(&rest[..end]));
            rest = &rest[end..];
        }
    }
    out
}

fn is_token(word: &str) -> bool {
    word.chars().any(|c| c.is_ascii_uppercase()) && !word.chars().any(|c| c.is_ascii_lowercase())
}

fn word(w: &str) -> Result<Arg, String> {
    if is_token(w) {
        return Ok(Arg {
            name: w.to_ascii_lowercase(),
            kind: "pure-token",
            token: Some(w.to_string()),
            ..plain()
        });
    }
    let (name, kind) = match w.rsplit_once(':') {
        Some((n, t)) => (
            n,
            *TYPES
                .iter()
                .find(|k| **k == t)
                .ok_or_else(|| format!("unknown argument type '{t}' in '{w}'"))?,
        ),
        None if KEY_NAMES.contains(&w) => (w, "key"),
        None => (w, "string"),
    };
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-:/".contains(c))
    {
        return Err(format!("not an argument name: '{w}'"));
    }
    Ok(Arg {
        name: name.to_string(),
        kind,
        ..plain()
    })
}

fn plain() -> Arg {
    Arg {
        name: String::new(),
        kind: "string",
        token: None,
        optional: false,
        multiple: false,
        multiple_token: false,
        args: Vec::new(),
    }
}

/// The alternatives of a sequence up to `close` (or the end of the line).
fn alternatives(
    toks: &[Tok<'_>],
    at: &mut usize,
    close: Option<char>,
) -> Result<Vec<Vec<Arg>>, String> {
    let mut alts = vec![Vec::new()];
    loop {
        let Some(t) = toks.get(*at) else {
            return match close {
                None => Ok(alts),
                Some(c) => Err(format!("'{c}' missing")),
            };
        };
        *at += 1;
        let mut arg = match t {
            Tok::Word(w) => word(w)?,
            Tok::Open(o) => {
                let close = if *o == '[' { ']' } else { '>' };
                let mut g = group(alternatives(toks, at, Some(close))?)?;
                g.optional = *o == '[';
                g
            }
            Tok::Close(c) if Some(*c) == close => return Ok(alts),
            Tok::Close(c) => return Err(format!("unexpected '{c}'")),
            Tok::Or => {
                alts.push(Vec::new());
                continue;
            }
            Tok::Repeat => return Err("'...' after nothing".into()),
        };
        if toks.get(*at) == Some(&Tok::Repeat) {
            *at += 1;
            arg.multiple = true;
            // A repeated group that starts with its token repeats the token too.
            arg.multiple_token = arg.token.is_some() && !matches!(t, Tok::Word(_));
        }
        alts.last_mut().expect("one alternative at least").push(arg);
    }
}

/// One argument from a group's alternatives.
fn group(alts: Vec<Vec<Arg>>) -> Result<Arg, String> {
    if alts.iter().any(|a| a.is_empty()) {
        return Err("an empty group or alternative".into());
    }
    if alts.len() == 1 {
        return Ok(sequence(alts.into_iter().next().expect("one")));
    }
    let args: Vec<Arg> = alts.into_iter().map(sequence).collect();
    Ok(Arg {
        name: joined_names(&args),
        kind: "oneof",
        args,
        ..plain()
    })
}

/// The name of a group of `args`: theirs joined, each by its token where it has one
/// (`nx-xx`, `ex-px-exat-pxat-keepttl`, `field-value`).
fn joined_names(args: &[Arg]) -> String {
    let names: Vec<String> = args
        .iter()
        .map(|a| {
            a.token
                .as_deref()
                .map_or(a.name.clone(), str::to_ascii_lowercase)
        })
        .collect();
    names.join("-")
}

/// One argument from a sequence: itself if alone; led by a token, the rest introduced by
/// it; otherwise a block.
fn sequence(mut seq: Vec<Arg>) -> Arg {
    if seq.len() == 1 {
        return seq.pop().expect("one");
    }
    let head = &seq[0];
    if head.kind == "pure-token" && !head.multiple && !head.optional {
        let token = head.token.clone();
        let mut rest: Vec<Arg> = seq.drain(1..).collect();
        if rest.len() == 1 && rest[0].token.is_none() {
            let mut a = rest.pop().expect("one");
            a.token = token;
            return a;
        }
        return Arg {
            name: seq[0].name.clone(),
            kind: "block",
            token,
            args: rest,
            ..plain()
        };
    }
    Arg {
        name: joined_names(&seq),
        kind: "block",
        args: seq,
        ..plain()
    }
}

/// The arguments a syntax line describes.
pub(crate) fn parse(line: &str) -> Result<Vec<Arg>, String> {
    let toks = tokens(line);
    let mut at = 0;
    let mut alts = alternatives(&toks, &mut at, None)?;
    if alts.len() != 1 {
        return Err("alternatives outside a group".into());
    }
    Ok(alts.pop().expect("one"))
}

impl Arg {
    /// The argument as `COMMAND DOCS` gives it.
    pub(crate) fn reply(&self) -> Reply {
        let mut fields = vec![
            (Reply::bulk("name"), Reply::bulk(self.name.clone())),
            (Reply::bulk("type"), Reply::bulk(self.kind)),
        ];
        if let Some(t) = &self.token {
            fields.push((Reply::bulk("token"), Reply::bulk(t.clone())));
        }
        let flags: Vec<Reply> = [
            (self.optional, "optional"),
            (self.multiple, "multiple"),
            (self.multiple_token, "multiple_token"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, f)| Reply::Simple((*f).into()))
        .collect();
        if !flags.is_empty() {
            fields.push((Reply::bulk("flags"), Reply::Set(flags)));
        }
        if !self.args.is_empty() {
            fields.push((
                Reply::bulk("arguments"),
                Reply::Array(self.args.iter().map(Arg::reply).collect()),
            ));
        }
        Reply::Map(fields)
    }

    /// The fewest and the most words the argument takes (`None`: no bound).
    pub(crate) fn words(&self) -> (usize, Option<usize>) {
        let token = usize::from(self.token.is_some() && self.kind != "pure-token");
        let (lo, hi) = match self.kind {
            "oneof" => {
                let w: Vec<_> = self.args.iter().map(Arg::words).collect();
                let lo = w.iter().map(|w| w.0).min().unwrap_or(0);
                let hi = w.iter().try_fold(0, |m, w| w.1.map(|h| h.max(m)));
                (lo, hi)
            }
            "block" => self
                .args
                .iter()
                .map(Arg::words)
                .fold((0, Some(0)), |(lo, hi), w| {
                    (lo + w.0, hi.zip(w.1).map(|(a, b)| a + b))
                }),
            _ => (1, Some(1)),
        };
        let (lo, hi) = (lo + token, hi.map(|h| h + token));
        let hi = if self.multiple { None } else { hi };
        if self.optional {
            (0, hi)
        } else {
            (lo, hi)
        }
    }

    /// The argument as `redis-cli` prints it in `HELP` and its hints.
    #[cfg(test)]
    pub(crate) fn usage(&self) -> String {
        let inner: Vec<String> = self.args.iter().map(Arg::usage).collect();
        let repeat = match self.kind {
            "oneof" => inner.join("|"),
            "block" => inner.join(" "),
            "pure-token" => String::new(),
            _ => self.name.clone(),
        };
        let mut token = self.token.clone().unwrap_or_default();
        if !token.is_empty() && self.kind != "pure-token" {
            token.push(' ');
        }
        let mut s = String::new();
        if self.optional {
            s.push('[');
        }
        s += &token;
        s += &repeat;
        if self.multiple {
            s += " [";
            if self.multiple_token {
                s += &token;
            }
            s += &repeat;
            s += " ...]";
        }
        if self.optional {
            s.push(']');
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(line: &str) -> String {
        parse(line)
            .unwrap()
            .iter()
            .map(Arg::usage)
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn lines_read_as_redis_documents_its_commands() {
        assert_eq!(
            usage("key value [NX | XX] [GET] [EX seconds:integer | PX milliseconds:integer | KEEPTTL]"),
            "key value [NX|XX] [GET] [EX seconds|PX milliseconds|KEEPTTL]"
        );
        assert_eq!(
            usage("key <field value>..."),
            "key field value [field value ...]"
        );
        assert_eq!(
            usage("key [BY pattern:pattern] [LIMIT offset:integer count:integer] [GET pattern:pattern]..."),
            "key [BY pattern] [LIMIT offset count] [GET pattern [GET pattern ...]]"
        );
        assert_eq!(
            usage("destination numkeys:integer key... [WEIGHTS weight:integer...] [AGGREGATE <SUM | MIN | MAX>]"),
            "destination numkeys key [key ...] [WEIGHTS weight [weight ...]] [AGGREGATE SUM|MIN|MAX]"
        );
        assert_eq!(
            usage("key [start:integer end:integer [BYTE | BIT]]"),
            "key [start end [BYTE|BIT]]"
        );
        assert_eq!(usage(""), "");
    }

    #[test]
    fn types_tokens_and_flags_are_kept() {
        let a = parse(
            "key [EX seconds:integer] [GET pattern:pattern]... <FIELDS numfields:integer field...>",
        )
        .unwrap();
        assert_eq!((a[0].name.as_str(), a[0].kind), ("key", "key"));
        assert_eq!(
            (a[1].name.as_str(), a[1].kind, a[1].token.as_deref()),
            ("seconds", "integer", Some("EX"))
        );
        assert!(a[1].optional && !a[1].multiple);
        assert!(a[2].multiple && a[2].multiple_token && a[2].optional);
        assert_eq!(
            (a[3].kind, a[3].token.as_deref(), a[3].args.len()),
            ("block", Some("FIELDS"), 2)
        );
        assert!(a[3].args[1].multiple && !a[3].args[1].multiple_token);
        assert_eq!(a[3].words(), (3, None));
    }

    #[test]
    fn bad_lines_are_refused() {
        for bad in [
            "key [NX",
            "key NX]",
            "count:number",
            "key | value",
            "[]",
            "... key",
            "Key",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
