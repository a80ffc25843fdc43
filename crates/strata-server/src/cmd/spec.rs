//! What the table says of a command beyond its handler: its `COMMAND DOCS` group and the
//! flags its handler's module gives it (read by the table's `c!` rows), and where its keys
//! are (for `WATCH`, cluster routing, `COMMAND GETKEYS`).

use bytes::Bytes;

use super::ctx::{parse_int, Spec, TOUCHES_WHAT_CHANGES};

/// Whether two strings are equal, in a `const fn`.
const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The flags the module of a command's handler gives it: the collections' modules
/// (hashes, sets, sorted sets, lists) [`TOUCHES_WHAT_CHANGES`].
pub(super) const fn module_flags(module: &str) -> u32 {
    if same(module, "h")
        || same(module, "se")
        || same(module, "z")
        || same(module, "l")
        || same(module, "vsets")
    {
        TOUCHES_WHAT_CHANGES
    } else {
        0
    }
}

/// The `COMMAND DOCS` group of command `name`, whose handler is in `module`: Redis's group
/// names (Strata's own commands are `strata`), by module but for the few commands whose
/// handlers sit with others of another group.
pub(super) const fn group_of(module: &str, name: &str) -> &'static str {
    const SERVER: [&str; 5] = ["flushdb", "flushall", "dbsize", "swapdb", "memory"];
    let mut k = 0;
    while k < SERVER.len() {
        if same(name, SERVER[k]) {
            return "server";
        }
        k += 1;
    }
    if same(name, "wait") {
        return "generic";
    }
    const GROUPS: [(&str, &str); 19] = [
        ("cn", "connection"),
        ("s", "string"),
        ("lcs", "string"),
        ("bits", "bitmap"),
        ("h", "hash"),
        ("se", "set"),
        ("l", "list"),
        ("z", "sorted-set"),
        ("sort", "generic"),
        ("keys", "generic"),
        ("txn", "transactions"),
        ("scripting", "scripting"),
        ("info", "server"),
        ("sv", "server"),
        ("cluster", "cluster"),
        ("st", "strata"),
        ("kvc", "strata"),
        ("kvcns", "strata"),
        ("vsets", "vector_set"),
    ];
    let mut i = 0;
    while i < GROUPS.len() {
        if same(module, GROUPS[i].0) {
            return GROUPS[i].1;
        }
        i += 1;
    }
    panic!("a module of command handlers without a COMMAND DOCS group")
}

/// For commands that count their keys: the position of that count, and how many keys come
/// before it from position 1.
fn counted_keys(spec: &Spec) -> Option<(usize, usize)> {
    match spec.name {
        "eval" | "evalsha" | "eval_ro" | "evalsha_ro" | "fcall" | "fcall_ro" => Some((2, 0)),
        "sintercard" | "zintercard" | "zunion" | "zinter" | "zdiff" | "lmpop" | "zmpop" => {
            Some((1, 0))
        }
        "blmpop" | "bzmpop" => Some((2, 0)),
        "zunionstore" | "zinterstore" | "zdiffstore" => Some((2, 1)),
        _ => None,
    }
}

/// The `KVC.*` commands that name chunks of one group: their group tag is their key.
/// (`KVC.WHERE` answers on any node.)
fn routed_by_tag(spec: &Spec) -> bool {
    spec.name.starts_with("kvc.") && spec.name != "kvc.where"
}

/// Whether a command's keys are found from its arguments rather than fixed positions
/// (`movablekeys` in `COMMAND`: cluster clients then ask `COMMAND GETKEYS`).
pub(crate) fn movable_keys(spec: &Spec) -> bool {
    counted_keys(spec).is_some() || routed_by_tag(spec)
}

/// The argument positions of the keys a request of `spec` names: the table's first, last
/// and step, or, for commands that count their keys (`EVAL`, `ZUNION`, `LMPOP`...), the
/// `numkeys` argument. `Err` if that count is not a number that fits the arguments.
pub(crate) fn key_positions(spec: &Spec, a: &[Bytes]) -> Result<Vec<usize>, ()> {
    if routed_by_tag(spec) {
        return Ok(tag_position(a).into_iter().collect());
    }
    if let Some((at, before)) = counted_keys(spec) {
        let n = a.get(at).and_then(|b| parse_int(b)).ok_or(())?;
        if n < 0 || n as usize > a.len().saturating_sub(at + 1) {
            return Err(());
        }
        let mut out: Vec<usize> = (1..=before).collect();
        out.extend(at + 1..at + 1 + n as usize);
        return Ok(out);
    }
    if spec.first_key <= 0 {
        return Ok(Vec::new());
    }
    let n = a.len() as i32;
    let last = if spec.last_key < 0 {
        n + spec.last_key
    } else {
        spec.last_key
    };
    Ok((spec.first_key..=last.min(n - 1))
        .step_by(spec.step.max(1) as usize)
        .map(|k| k as usize)
        .collect())
}

/// The position of a request's group tag (`KVC.* ns TAG t ...`): its key for routing. A tag
/// has no braces, so its slot is that of `{t}`, which every chunk key with it shares.
pub(crate) fn tag_position(a: &[Bytes]) -> Option<usize> {
    (a.len() >= 4 && a[2].eq_ignore_ascii_case(b"tag")).then_some(3)
}
