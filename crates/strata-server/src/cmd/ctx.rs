//! The shared command context: what every handler is handed ([`Ctx`]: the server, the
//! connection, and the command table as [`Commands`]), a table entry ([`Spec`]) with its
//! flags, and the replies and parsers handlers share. The table itself (`cmd/mod.rs`)
//! names every handler; this file names none, so every command file may import it and
//! the commands that call the table back (`EXEC`, scripts, `COMMAND`) reach it through
//! [`Ctx::commands`].

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use strata_engine::{Error, Key, Written};
use strata_resp::Reply;

use crate::session::Conn;
use crate::shared::Shared;

pub(crate) const WRITE: u32 = 1;
pub(crate) const READ: u32 = 2;
pub(crate) const ADMIN: u32 = 4;
/// Allowed before authentication.
pub(crate) const NOAUTH: u32 = 8;
/// Runs immediately even inside `MULTI`.
pub(crate) const NOQUEUE: u32 = 16;
/// Runs while no other command runs (holds the server's gate for writing).
pub(crate) const EXCLUSIVE: u32 = 32;
pub(crate) const FAST: u32 = 64;
/// Connection commands: allowed to every role.
pub(crate) const CONN: u32 = 128;
/// May wait for another client's write (`BLPOP`): runs outside the gate, taking it for
/// each attempt.
pub(crate) const BLOCKING: u32 = 256;
/// Refused from a script (`redis.call`): transactions, scripts, the blocking pops but
/// `BLMPOP` and `BZMPOP`, and the commands of the connection and the server Redis refuses
/// there (`CONFIG`, `CLIENT`, `AUTH`, `WAIT`...).
pub(crate) const NOSCRIPT: u32 = 512;
/// Refused inside `MULTI`, failing the transaction (Redis's `no_multi`: `SHUTDOWN`).
pub(crate) const NOMULTI: u32 = 1024;
/// The handler writes only through `typed.rs`, which touches for `WATCH` exactly the keys
/// a write changes (`typed::changed`), so [`dispatch`] does not touch every key the
/// command names: an `SMOVE` of a member the destination holds leaves its watchers alone,
/// as in Redis. Given by the handler's module ([`module_flags`]).
pub(crate) const TOUCHES_WHAT_CHANGES: u32 = 2048;
/// Has subcommands (`docs::SUBCOMMANDS`): a request naming one is held to its arity.
pub(crate) const CONTAINER: u32 = 4096;

/// A command's handler: the checked arguments in, the reply out.
pub(crate) type Run = for<'a, 'b> fn(&'a mut Ctx<'b>, &'a [Bytes]) -> BoxFuture<'a, Reply>;

/// One command: Redis's arity convention (negative = at least), flags, key positions and
/// the handler.
#[derive(Clone, Copy)]
pub(crate) struct Spec {
    pub(crate) name: &'static str,
    /// Its group in `COMMAND DOCS` ([`group_of`]).
    pub(crate) group: &'static str,
    pub(crate) arity: i32,
    pub(crate) flags: u32,
    pub(crate) first_key: i32,
    pub(crate) last_key: i32,
    pub(crate) step: i32,
    pub(crate) run: Run,
}

impl Spec {
    /// Whether `n` arguments (the name included) fit the command's arity.
    pub(crate) fn accepts(&self, n: usize) -> bool {
        arity_fits(self.arity, n)
    }
}

/// Whether `n` arguments (the names included) fit Redis's `arity`.
pub(crate) fn arity_fits(arity: i32, n: usize) -> bool {
    let n = n as i32;
    match arity.cmp(&0) {
        std::cmp::Ordering::Greater => n == arity,
        std::cmp::Ordering::Less => n >= -arity,
        std::cmp::Ordering::Equal => true,
    }
}

/// `ERR wrong number of arguments for 'x' command`.
pub(crate) fn wrong_args(name: &str) -> Reply {
    Reply::err(format!(
        "ERR wrong number of arguments for '{name}' command"
    ))
}

/// The refusal of `command` (`client|kill` for a subcommand) to `user`, whose role does
/// not allow it.
pub(crate) fn no_permission(user: &str, command: &str) -> Reply {
    Reply::err(format!(
        "NOPERM User {user} has no permissions to run the '{command}' command"
    ))
}

pub(crate) fn syntax_error() -> Reply {
    Reply::err("ERR syntax error")
}

pub(crate) fn wrong_type() -> Reply {
    Reply::err("WRONGTYPE Operation against a key holding the wrong kind of value")
}

/// Refuses an entry that is not a string (`WRONGTYPE`), for the string commands'
/// read-modify-writes.
pub(crate) fn string_only(cur: &Option<strata_engine::Existing<'_>>) -> strata_engine::Result<()> {
    match cur {
        Some(c) if c.kind != strata_engine::Kind::String => Err(Error::WrongType),
        _ => Ok(()),
    }
}

pub(crate) fn not_integer() -> Reply {
    Reply::err("ERR value is not an integer or out of range")
}

/// Maps an engine error to a Redis error reply.
pub(crate) fn engine_error(e: &Error) -> Reply {
    match e {
        Error::NotInteger => not_integer(),
        Error::Overflow => Reply::err("ERR increment or decrement would overflow"),
        Error::WrongType => wrong_type(),
        Error::Invalid(m) => Reply::err(format!("ERR {m}")),
        Error::ColdUnavailable(m) => Reply::err(format!("TRYAGAIN cold tier unavailable: {m}")),
        Error::Storage(m) => Reply::err(format!("ERR storage unavailable: {m}")),
        Error::Data(m) => Reply::err(format!("ERR data error: {m}")),
        Error::WarmFull(m) => Reply::err(format!("OOM {m}")),
        Error::DiskFull(m) => Reply::err(format!("ERR {m}")),
        Error::Closed => Reply::err("ERR server is shutting down"),
        Error::Poisoned(m) => Reply::err(format!(
            "MISCONF writes are refused because a WAL sync failed: {m}"
        )),
        Error::Internal(m) => Reply::err(format!("ERR internal error: {m}")),
    }
}

pub(crate) fn parse_int(b: &[u8]) -> Option<i64> {
    strata_engine::parse_i64(b)
}

/// A database index as `SELECT` and `MOVE` take it: an integer below `databases`.
pub(crate) fn parse_db(ctx: &Ctx<'_>, b: &[u8]) -> Result<u8, Reply> {
    let n = parse_int(b).ok_or_else(not_integer)?;
    db_index(ctx, n)
}

/// Database `n`, if the `databases` setting has it.
pub(crate) fn db_index(ctx: &Ctx<'_>, n: i64) -> Result<u8, Reply> {
    let count = ctx.shared.cfg.read().databases as i64;
    if (0..count).contains(&n) {
        Ok(n as u8)
    } else {
        Err(Reply::err("ERR DB index is out of range"))
    }
}

pub(crate) fn lower(a: &[u8]) -> String {
    String::from_utf8_lossy(a).to_ascii_lowercase()
}

/// Context handed to command implementations.
pub(crate) struct Ctx<'a> {
    pub(crate) shared: &'a Arc<Shared>,
    pub(crate) conn: &'a mut Conn,
    /// The command table, for the commands that run or describe others.
    pub(crate) commands: &'static dyn Commands,
}

/// The command table as the commands that call it back see it: `EXEC` runs what `MULTI`
/// queued, a script's `redis.call` runs a command as a client's, `COMMAND` and `CLIENT`
/// describe them. Implemented by the table's module, which every handler is below.
pub(crate) trait Commands: Sync {
    /// Every entry, in table order (an index into it names a command).
    fn specs(&self) -> &'static [Spec];
    /// The index of the command `name` names (in any case).
    fn lookup(&self, name: &[u8]) -> Option<usize>;
    /// Why a request of `spec` may not run now (arity, a subcommand's arity, `MULTI`,
    /// permissions), if it may not.
    fn refusal(&self, conn: &mut Conn, spec: &Spec, args: &[Bytes]) -> Option<Reply>;
    /// The subcommand of a container `spec` whose arity `args` does not fit.
    fn subcommand_misfit(&self, spec: &Spec, args: &[Bytes]) -> Option<&'static str>;
    /// Runs command `idx`, already checked, and touches its keys for `WATCH`.
    fn dispatch<'a, 'b>(
        &self,
        ctx: &'a mut Ctx<'b>,
        idx: usize,
        a: &'a [Bytes],
    ) -> BoxFuture<'a, Reply>;
    /// [`Commands::dispatch`], timed and counted in the server's figures.
    fn dispatch_counted<'a, 'b>(
        &self,
        ctx: &'a mut Ctx<'b>,
        idx: usize,
        a: &'a [Bytes],
    ) -> BoxFuture<'a, Reply>;
}

impl Ctx<'_> {
    /// The most bytes of values one reply may carry (`client-output-buffer-limit`).
    pub(crate) fn reply_bytes_max(&self) -> u64 {
        self.shared.cfg.read().client_output_buffer_limit
    }

    /// The same client key in database `db` (`MOVE`).
    pub(crate) fn key_in(&self, db: u8, client: &[u8]) -> Key {
        self.shared.engine.key(db, client)
    }

    /// The stored key of `client` in the selected database.
    pub(crate) fn key(&self, client: &[u8]) -> Key {
        self.shared.engine.key(self.conn.db, client)
    }

    /// A write's result; its ticket joins those the replies wait for.
    pub(crate) fn defer<T>(&mut self, w: Written<T>) -> T {
        w.defer(&mut self.conn.pending)
    }
}
