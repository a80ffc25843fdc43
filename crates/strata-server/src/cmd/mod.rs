//! The command table, and what happens once for every command: lookup, arity,
//! authentication and roles, `MULTI` queueing, `WATCH` versions, metrics. Each entry holds
//! its command's handler; there is no second dispatch by name.

mod bits;
mod blocks;
mod cluster;
mod connection;
pub(crate) mod ctx;
mod docs;
mod hashes;
mod info;
mod items;
mod keys;
mod kvc;
mod kvcns;
mod lcs;
mod lists;
mod packed;
pub(crate) mod scripting;
mod server;
mod sets;
mod sort;
mod spec;
mod strata;
mod strings;
mod syntax;
#[cfg(test)]
mod tests;
pub(crate) mod txn;
mod typed;
mod vlive;
mod vsets;
mod zsets;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use futures::future::BoxFuture;
use strata_engine::Key;
use strata_resp::Reply;

pub(crate) use ctx::Ctx;
use ctx::{
    arity_fits, no_permission, wrong_args, Commands, Spec, ADMIN, BLOCKING, CONN, CONTAINER,
    EXCLUSIVE, FAST, NOAUTH, NOMULTI, NOQUEUE, NOSCRIPT, READ, TOUCHES_WHAT_CHANGES, WRITE,
};
use spec::{group_of, key_positions, module_flags};

pub(crate) use cluster::clear_slot;
pub(crate) use server::ENCODING_PARAMS;

use crate::auth::Role;
use crate::session::Conn;
use crate::shared::Shared;
use crate::stopwatch;

/// The stored keys a request names (for `EXEC`, those of the commands it queued): what it
/// waits on when a change woke clients blocked on them ([`crate::blocked::Blocked::served`]).
pub(crate) fn stored_keys(
    shared: &Shared,
    conn: &Conn,
    idx: Option<usize>,
    a: &[Bytes],
) -> Vec<Key> {
    let Some(spec) = idx.map(|i| &COMMANDS[i]) else {
        return Vec::new();
    };
    if spec.name == "exec" {
        let queued = conn.multi.iter().flatten();
        return queued
            .flat_map(|q| stored_keys(shared, conn, q.first().and_then(|n| lookup(n)), q))
            .collect();
    }
    let positions = key_positions(spec, a).unwrap_or_default();
    positions
        .into_iter()
        .filter_map(|i| a.get(i))
        .map(|k| shared.engine.key(conn.db, k))
        .collect()
}

/// A table entry: name, arity, flags, first key, last key, step, handler (`module::fn`, an
/// async fn of `(&mut Ctx, &[Bytes]) -> Reply`; the module adds [`module_flags`]).
macro_rules! c {
    ($name:literal, $arity:expr, $flags:expr, $first:expr, $last:expr, $step:expr, $m:ident :: $f:ident) => {
        Spec {
            name: $name,
            group: group_of(stringify!($m), $name),
            arity: $arity,
            flags: $flags | module_flags(stringify!($m)),
            first_key: $first,
            last_key: $last,
            step: $step,
            run: |ctx, a| Box::pin($m::$f(ctx, a)),
        }
    };
}

use connection as cn;
use hashes as h;
use lists as l;
use server as sv;
use sets as se;
use strata as st;
use strings as s;
use zsets as z;

pub(crate) static COMMANDS: &[Spec] = &[
    // Connection.
    c!("ping", -1, CONN | FAST, 0, 0, 0, cn::ping),
    c!("echo", 2, CONN | FAST, 0, 0, 0, cn::echo),
    c!(
        "hello",
        -1,
        CONN | NOAUTH | FAST | NOSCRIPT,
        0,
        0,
        0,
        cn::hello
    ),
    c!(
        "auth",
        -2,
        CONN | NOAUTH | FAST | NOSCRIPT,
        0,
        0,
        0,
        cn::auth
    ),
    c!("select", 2, CONN | FAST, 0, 0, 0, cn::select),
    c!(
        "quit",
        -1,
        CONN | NOAUTH | FAST | NOQUEUE | NOSCRIPT,
        0,
        0,
        0,
        cn::quit
    ),
    c!(
        "reset",
        1,
        CONN | NOAUTH | FAST | NOQUEUE | NOSCRIPT,
        0,
        0,
        0,
        cn::reset
    ),
    c!(
        "client",
        -2,
        CONN | NOSCRIPT | CONTAINER,
        0,
        0,
        0,
        cn::client
    ),
    c!("command", -1, CONN | CONTAINER, 0, 0, 0, sv::command),
    // Strings.
    c!("get", 2, READ | FAST, 1, 1, 1, s::get),
    c!("set", -3, WRITE, 1, 1, 1, s::set),
    c!("setnx", 3, WRITE | FAST, 1, 1, 1, s::setnx),
    c!("setex", 4, WRITE, 1, 1, 1, s::setex),
    c!("psetex", 4, WRITE, 1, 1, 1, s::psetex),
    c!("getex", -2, WRITE | FAST, 1, 1, 1, s::getex),
    c!("getdel", 2, WRITE | FAST, 1, 1, 1, s::getdel),
    c!("getset", 3, WRITE | FAST, 1, 1, 1, s::getset),
    c!("mget", -2, READ | FAST, 1, -1, 1, s::mget),
    c!("mset", -3, WRITE | EXCLUSIVE, 1, -1, 2, s::mset),
    c!("msetnx", -3, WRITE | EXCLUSIVE, 1, -1, 2, s::msetnx),
    c!("strlen", 2, READ | FAST, 1, 1, 1, s::strlen),
    c!("append", 3, WRITE | FAST, 1, 1, 1, s::append),
    c!("getrange", 4, READ, 1, 1, 1, s::getrange),
    c!("lcs", -3, READ, 1, 2, 1, lcs::lcs_cmd),
    c!("substr", 4, READ, 1, 1, 1, s::getrange),
    c!("setrange", 4, WRITE, 1, 1, 1, s::setrange),
    c!("incr", 2, WRITE | FAST, 1, 1, 1, s::incr),
    c!("decr", 2, WRITE | FAST, 1, 1, 1, s::decr),
    c!("incrby", 3, WRITE | FAST, 1, 1, 1, s::incrby),
    c!("decrby", 3, WRITE | FAST, 1, 1, 1, s::decrby),
    c!("incrbyfloat", 3, WRITE | FAST, 1, 1, 1, s::incrbyfloat),
    c!("setbit", 4, WRITE, 1, 1, 1, bits::setbit),
    c!("getbit", 3, READ | FAST, 1, 1, 1, bits::getbit),
    c!("bitcount", -2, READ, 1, 1, 1, bits::bitcount),
    // Hashes.
    c!("hset", -4, WRITE | FAST, 1, 1, 1, h::hset),
    c!("hmset", -4, WRITE | FAST, 1, 1, 1, h::hmset),
    c!("hsetnx", 4, WRITE | FAST, 1, 1, 1, h::hsetnx),
    c!("hget", 3, READ | FAST, 1, 1, 1, h::hget),
    c!("hmget", -3, READ | FAST, 1, 1, 1, h::hmget),
    c!("hgetall", 2, READ, 1, 1, 1, h::hgetall),
    c!("hkeys", 2, READ, 1, 1, 1, h::hkeys),
    c!("hvals", 2, READ, 1, 1, 1, h::hvals),
    c!("hlen", 2, READ | FAST, 1, 1, 1, h::hlen),
    c!("hexists", 3, READ | FAST, 1, 1, 1, h::hexists),
    c!("hstrlen", 3, READ | FAST, 1, 1, 1, h::hstrlen),
    c!("hdel", -3, WRITE | FAST, 1, 1, 1, h::hdel),
    c!("hincrby", 4, WRITE | FAST, 1, 1, 1, h::hincrby),
    c!("hincrbyfloat", 4, WRITE | FAST, 1, 1, 1, h::hincrbyfloat),
    c!("hrandfield", -2, READ, 1, 1, 1, h::hrandfield),
    c!("hscan", -3, READ, 1, 1, 1, h::hscan),
    c!("hexpire", -6, WRITE | FAST, 1, 1, 1, h::hexpire),
    c!("hpexpire", -6, WRITE | FAST, 1, 1, 1, h::hpexpire),
    c!("hexpireat", -6, WRITE | FAST, 1, 1, 1, h::hexpireat),
    c!("hpexpireat", -6, WRITE | FAST, 1, 1, 1, h::hpexpireat),
    c!("httl", -5, READ | FAST, 1, 1, 1, h::httl),
    c!("hpttl", -5, READ | FAST, 1, 1, 1, h::hpttl),
    c!("hexpiretime", -5, READ | FAST, 1, 1, 1, h::hexpiretime),
    c!("hpexpiretime", -5, READ | FAST, 1, 1, 1, h::hpexpiretime),
    c!("hpersist", -5, WRITE | FAST, 1, 1, 1, h::hpersist),
    // Sets.
    c!("sadd", -3, WRITE | FAST, 1, 1, 1, se::sadd),
    c!("srem", -3, WRITE | FAST, 1, 1, 1, se::srem),
    c!("smembers", 2, READ, 1, 1, 1, se::smembers),
    c!("scard", 2, READ | FAST, 1, 1, 1, se::scard),
    c!("sismember", 3, READ | FAST, 1, 1, 1, se::sismember),
    c!("smismember", -3, READ | FAST, 1, 1, 1, se::smismember),
    c!("spop", -2, WRITE | FAST, 1, 1, 1, se::spop),
    c!("srandmember", -2, READ, 1, 1, 1, se::srandmember),
    c!("sscan", -3, READ, 1, 1, 1, se::sscan),
    c!("sinter", -2, READ, 1, -1, 1, se::sinter),
    c!("sunion", -2, READ, 1, -1, 1, se::sunion),
    c!("sdiff", -2, READ, 1, -1, 1, se::sdiff),
    c!(
        "sinterstore",
        -3,
        WRITE | EXCLUSIVE,
        1,
        -1,
        1,
        se::sinterstore
    ),
    c!(
        "sunionstore",
        -3,
        WRITE | EXCLUSIVE,
        1,
        -1,
        1,
        se::sunionstore
    ),
    c!(
        "sdiffstore",
        -3,
        WRITE | EXCLUSIVE,
        1,
        -1,
        1,
        se::sdiffstore
    ),
    c!("sintercard", -3, READ, 0, 0, 0, se::sintercard),
    c!("smove", 4, WRITE | EXCLUSIVE | FAST, 1, 2, 1, se::smove),
    // Lists.
    c!("lpush", -3, WRITE | FAST, 1, 1, 1, l::lpush),
    c!("rpush", -3, WRITE | FAST, 1, 1, 1, l::rpush),
    c!("lpushx", -3, WRITE | FAST, 1, 1, 1, l::lpushx),
    c!("rpushx", -3, WRITE | FAST, 1, 1, 1, l::rpushx),
    c!("lpop", -2, WRITE | FAST, 1, 1, 1, l::lpop),
    c!("rpop", -2, WRITE | FAST, 1, 1, 1, l::rpop),
    c!("llen", 2, READ | FAST, 1, 1, 1, l::llen),
    c!("lrange", 4, READ, 1, 1, 1, l::lrange),
    c!("ltrim", 4, WRITE, 1, 1, 1, l::ltrim),
    c!("lindex", 3, READ, 1, 1, 1, l::lindex),
    c!("lset", 4, WRITE, 1, 1, 1, l::lset),
    c!("linsert", 5, WRITE, 1, 1, 1, l::linsert),
    c!("lrem", 4, WRITE, 1, 1, 1, l::lrem),
    c!("lpos", -3, READ, 1, 1, 1, l::lpos),
    c!("lmove", 5, WRITE | EXCLUSIVE, 1, 2, 1, l::lmove),
    c!("rpoplpush", 3, WRITE | EXCLUSIVE, 1, 2, 1, l::rpoplpush),
    c!("blpop", -3, WRITE | BLOCKING | NOSCRIPT, 1, -2, 1, l::blpop),
    c!("brpop", -3, WRITE | BLOCKING | NOSCRIPT, 1, -2, 1, l::brpop),
    c!("blmove", 6, WRITE | BLOCKING | NOSCRIPT, 1, 2, 1, l::blmove),
    c!(
        "brpoplpush",
        4,
        WRITE | BLOCKING | NOSCRIPT,
        1,
        2,
        1,
        l::brpoplpush
    ),
    c!("lmpop", -4, WRITE, 0, 0, 0, l::lmpop),
    c!("sort", -2, WRITE | EXCLUSIVE, 1, 1, 1, sort::sort),
    c!("sort_ro", -2, READ, 1, 1, 1, sort::sort_ro),
    c!("blmpop", -5, WRITE | BLOCKING, 0, 0, 0, l::blmpop),
    // Sorted sets.
    c!("zadd", -4, WRITE | FAST, 1, 1, 1, z::zadd),
    c!("zincrby", 4, WRITE | FAST, 1, 1, 1, z::zincrby),
    c!("zrem", -3, WRITE | FAST, 1, 1, 1, z::zrem),
    c!("zcard", 2, READ | FAST, 1, 1, 1, z::zcard),
    c!("zscore", 3, READ | FAST, 1, 1, 1, z::zscore),
    c!("zmscore", -3, READ | FAST, 1, 1, 1, z::zmscore),
    c!("zrank", -3, READ | FAST, 1, 1, 1, z::zrank),
    c!("zrevrank", -3, READ | FAST, 1, 1, 1, z::zrevrank),
    c!("zrange", -4, READ, 1, 1, 1, z::zrange),
    c!("zrevrange", -4, READ, 1, 1, 1, z::zrevrange),
    c!("zrangebyscore", -4, READ, 1, 1, 1, z::zrangebyscore),
    c!("zrevrangebyscore", -4, READ, 1, 1, 1, z::zrevrangebyscore),
    c!("zrangebylex", -4, READ, 1, 1, 1, z::zrangebylex),
    c!("zrevrangebylex", -4, READ, 1, 1, 1, z::zrevrangebylex),
    c!("zcount", 4, READ | FAST, 1, 1, 1, z::zcount),
    c!("zlexcount", 4, READ | FAST, 1, 1, 1, z::zlexcount),
    c!("zremrangebyscore", 4, WRITE, 1, 1, 1, z::zremrangebyscore),
    c!("zremrangebyrank", 4, WRITE, 1, 1, 1, z::zremrangebyrank),
    c!("zremrangebylex", 4, WRITE, 1, 1, 1, z::zremrangebylex),
    c!("zpopmin", -2, WRITE | FAST, 1, 1, 1, z::zpopmin),
    c!("zpopmax", -2, WRITE | FAST, 1, 1, 1, z::zpopmax),
    c!("zscan", -3, READ, 1, 1, 1, z::zscan),
    c!("zrandmember", -2, READ, 1, 1, 1, z::zrandmember),
    c!(
        "zunionstore",
        -4,
        WRITE | EXCLUSIVE,
        1,
        1,
        1,
        z::zunionstore
    ),
    c!(
        "zinterstore",
        -4,
        WRITE | EXCLUSIVE,
        1,
        1,
        1,
        z::zinterstore
    ),
    c!("zdiffstore", -4, WRITE | EXCLUSIVE, 1, 1, 1, z::zdiffstore),
    c!("zmpop", -4, WRITE, 0, 0, 0, z::zmpop),
    c!("bzmpop", -5, WRITE | BLOCKING, 0, 0, 0, z::bzmpop),
    c!(
        "bzpopmin",
        -3,
        WRITE | FAST | BLOCKING | NOSCRIPT,
        1,
        -2,
        1,
        z::bzpopmin
    ),
    c!(
        "bzpopmax",
        -3,
        WRITE | FAST | BLOCKING | NOSCRIPT,
        1,
        -2,
        1,
        z::bzpopmax
    ),
    c!("zunion", -3, READ, 0, 0, 0, z::zunion),
    c!("zinter", -3, READ, 0, 0, 0, z::zinter),
    c!("zdiff", -3, READ, 0, 0, 0, z::zdiff),
    c!("zintercard", -3, READ, 0, 0, 0, z::zintercard),
    c!(
        "zrangestore",
        -5,
        WRITE | EXCLUSIVE,
        1,
        2,
        1,
        z::zrangestore
    ),
    // Keys.
    c!("del", -2, WRITE, 1, -1, 1, keys::del),
    c!("unlink", -2, WRITE | FAST, 1, -1, 1, keys::del),
    c!("exists", -2, READ | FAST, 1, -1, 1, keys::exists),
    c!("expire", -3, WRITE | FAST, 1, 1, 1, keys::expire),
    c!("pexpire", -3, WRITE | FAST, 1, 1, 1, keys::pexpire),
    c!("expireat", -3, WRITE | FAST, 1, 1, 1, keys::expireat),
    c!("pexpireat", -3, WRITE | FAST, 1, 1, 1, keys::pexpireat),
    c!("expiretime", 2, READ | FAST, 1, 1, 1, keys::expiretime),
    c!("pexpiretime", 2, READ | FAST, 1, 1, 1, keys::pexpiretime),
    c!("ttl", 2, READ | FAST, 1, 1, 1, keys::ttl),
    c!("pttl", 2, READ | FAST, 1, 1, 1, keys::pttl),
    c!("persist", 2, WRITE | FAST, 1, 1, 1, keys::persist),
    c!("type", 2, READ | FAST, 1, 1, 1, keys::type_of),
    c!("object", -2, READ | CONTAINER, 2, 2, 1, keys::object),
    c!("memory", -2, READ | CONTAINER, 2, 2, 1, keys::memory),
    c!("rename", 3, WRITE | EXCLUSIVE, 1, 2, 1, keys::rename),
    c!(
        "renamenx",
        3,
        WRITE | FAST | EXCLUSIVE,
        1,
        2,
        1,
        keys::renamenx
    ),
    c!("scan", -2, READ, 0, 0, 0, keys::scan),
    c!("keys", 2, READ, 0, 0, 0, keys::keys),
    c!("dbsize", 1, READ | FAST, 0, 0, 0, keys::dbsize),
    c!(
        "move",
        3,
        WRITE | FAST | EXCLUSIVE,
        1,
        1,
        1,
        keys::move_to_db
    ),
    c!("swapdb", 3, WRITE | FAST | EXCLUSIVE, 0, 0, 0, keys::swapdb),
    c!("dump", 2, READ, 1, 1, 1, keys::dump),
    c!("restore", -4, WRITE, 1, 1, 1, keys::restore),
    c!("copy", -3, WRITE | EXCLUSIVE, 1, 2, 1, keys::copy),
    c!("randomkey", 1, READ, 0, 0, 0, keys::randomkey),
    c!(
        "flushdb",
        -1,
        WRITE | ADMIN | EXCLUSIVE,
        0,
        0,
        0,
        keys::flushdb
    ),
    c!(
        "flushall",
        -1,
        WRITE | ADMIN | EXCLUSIVE,
        0,
        0,
        0,
        keys::flush
    ),
    // Transactions.
    c!(
        "multi",
        1,
        CONN | FAST | NOQUEUE | NOSCRIPT,
        0,
        0,
        0,
        txn::multi
    ),
    c!(
        "exec",
        1,
        CONN | NOQUEUE | EXCLUSIVE | NOSCRIPT,
        0,
        0,
        0,
        txn::exec
    ),
    c!(
        "discard",
        1,
        CONN | FAST | NOQUEUE | NOSCRIPT,
        0,
        0,
        0,
        txn::discard
    ),
    c!(
        "watch",
        -2,
        CONN | FAST | NOQUEUE | NOSCRIPT,
        1,
        -1,
        1,
        txn::watch
    ),
    c!(
        "unwatch",
        1,
        CONN | FAST | NOQUEUE | NOSCRIPT,
        0,
        0,
        0,
        txn::unwatch
    ),
    // Scripts: each holds the gate for its whole run (its calls run as the client's).
    c!(
        "eval",
        -3,
        WRITE | EXCLUSIVE | NOSCRIPT,
        0,
        0,
        0,
        scripting::eval
    ),
    c!(
        "evalsha",
        -3,
        WRITE | EXCLUSIVE | NOSCRIPT,
        0,
        0,
        0,
        scripting::evalsha
    ),
    c!(
        "eval_ro",
        -3,
        READ | EXCLUSIVE | NOSCRIPT,
        0,
        0,
        0,
        scripting::eval_ro
    ),
    c!(
        "evalsha_ro",
        -3,
        READ | EXCLUSIVE | NOSCRIPT,
        0,
        0,
        0,
        scripting::evalsha_ro
    ),
    c!(
        "fcall",
        -3,
        WRITE | EXCLUSIVE | NOSCRIPT,
        0,
        0,
        0,
        scripting::fcall
    ),
    c!(
        "fcall_ro",
        -3,
        READ | EXCLUSIVE | NOSCRIPT,
        0,
        0,
        0,
        scripting::fcall_ro
    ),
    c!(
        "script",
        -2,
        WRITE | NOSCRIPT | CONTAINER,
        0,
        0,
        0,
        scripting::script
    ),
    c!(
        "function",
        -2,
        WRITE | NOSCRIPT | CONTAINER,
        0,
        0,
        0,
        scripting::function
    ),
    // Server.
    c!("info", -1, READ, 0, 0, 0, info::info),
    c!(
        "config",
        -2,
        ADMIN | NOSCRIPT | CONTAINER,
        0,
        0,
        0,
        sv::config
    ),
    c!("debug", -2, ADMIN | NOSCRIPT, 0, 0, 0, sv::debug),
    c!(
        "shutdown",
        -1,
        ADMIN | NOQUEUE | NOMULTI | NOSCRIPT,
        0,
        0,
        0,
        sv::shutdown
    ),
    c!("time", 1, CONN | FAST, 0, 0, 0, sv::time),
    c!("wait", 3, CONN | NOSCRIPT, 0, 0, 0, sv::wait),
    c!("lastsave", 1, CONN | FAST, 0, 0, 0, sv::lastsave),
    c!("save", 1, ADMIN | NOSCRIPT | NOMULTI, 0, 0, 0, sv::save),
    c!("bgsave", -1, ADMIN | NOSCRIPT, 0, 0, 0, sv::bgsave),
    // Cluster.
    c!("cluster", -2, CONN | CONTAINER, 0, 0, 0, cluster::cluster),
    c!("readonly", 1, CONN | FAST, 0, 0, 0, cluster::accept),
    c!("readwrite", 1, CONN | FAST, 0, 0, 0, cluster::accept),
    c!("asking", 1, CONN | FAST, 0, 0, 0, cluster::asking),
    c!(
        "strata.slotclear",
        2,
        WRITE | ADMIN,
        0,
        0,
        0,
        cluster::slotclear
    ),
    c!(
        "strata.slottake",
        2,
        WRITE | ADMIN,
        0,
        0,
        0,
        cluster::slottake
    ),
    // Vector sets.
    c!("vadd", -5, WRITE, 1, 1, 1, vsets::vadd),
    c!("vrem", 3, WRITE | FAST, 1, 1, 1, vsets::vrem),
    c!("vsetattr", 4, WRITE | FAST, 1, 1, 1, vsets::vsetattr),
    c!("vsim", -4, READ, 1, 1, 1, vsets::vsim),
    c!("vcard", 2, READ | FAST, 1, 1, 1, vsets::vcard),
    c!("vdim", 2, READ | FAST, 1, 1, 1, vsets::vdim),
    c!("vemb", -3, READ | FAST, 1, 1, 1, vsets::vemb),
    c!("vismember", 3, READ | FAST, 1, 1, 1, vsets::vismember),
    c!("vgetattr", 3, READ | FAST, 1, 1, 1, vsets::vgetattr),
    c!("vinfo", 2, READ | FAST, 1, 1, 1, vsets::vinfo),
    c!("vrandmember", -2, READ, 1, 1, 1, vsets::vrandmember),
    c!("vlinks", -3, READ, 1, 1, 1, vsets::vlinks),
    // Strata's own.
    c!("tier", 2, READ | FAST, 1, 1, 1, st::tier),
    c!("strata.stats", 1, READ, 0, 0, 0, st::stats),
    c!("pin", 2, WRITE | ADMIN, 0, 0, 0, st::pin),
    c!("unpin", 2, WRITE | ADMIN, 0, 0, 0, st::unpin),
    c!("pins", 1, READ, 0, 0, 0, st::pins),
    c!("strata.backup", 2, ADMIN, 0, 0, 0, st::backup),
    c!("strata.range", -3, READ, 0, 0, 0, st::range),
    // The KV-cache pool (one round trip each).
    c!("kvc.put", -4, WRITE, 0, 0, 0, kvc::put),
    c!("kvc.drop", 2, WRITE, 0, 0, 0, kvcns::drop_namespace),
    c!("kvc.quota", -2, WRITE, 0, 0, 0, kvcns::quota),
    c!("kvc.get", -3, READ, 0, 0, 0, kvc::get),
    c!("kvc.match", -3, READ, 0, 0, 0, kvc::match_prefix),
    c!("kvc.locate", -3, READ, 0, 0, 0, kvc::locate),
    c!("kvc.where", -3, READ, 0, 0, 0, kvc::where_cached),
];

/// The table as [`Ctx::commands`] hands it to the commands that call it back.
pub(crate) struct Table;

pub(crate) static TABLE: Table = Table;

impl Commands for Table {
    fn specs(&self) -> &'static [Spec] {
        COMMANDS
    }

    fn lookup(&self, name: &[u8]) -> Option<usize> {
        lookup(name)
    }

    fn refusal(&self, conn: &mut Conn, spec: &Spec, args: &[Bytes]) -> Option<Reply> {
        refusal(conn, spec, args)
    }

    fn subcommand_misfit(&self, spec: &Spec, args: &[Bytes]) -> Option<&'static str> {
        subcommand_misfit(spec, args)
    }

    fn dispatch<'a, 'b>(
        &self,
        ctx: &'a mut Ctx<'b>,
        idx: usize,
        a: &'a [Bytes],
    ) -> BoxFuture<'a, Reply> {
        Box::pin(dispatch(ctx, idx, a))
    }

    fn dispatch_counted<'a, 'b>(
        &self,
        ctx: &'a mut Ctx<'b>,
        idx: usize,
        a: &'a [Bytes],
    ) -> BoxFuture<'a, Reply> {
        Box::pin(dispatch_counted(ctx, idx, a))
    }
}

/// The context a command of this connection runs in.
pub(crate) fn ctx<'a>(shared: &'a Arc<Shared>, conn: &'a mut Conn) -> Ctx<'a> {
    Ctx {
        shared,
        conn,
        commands: &TABLE,
    }
}

/// Every command's name, in table order.
pub(crate) fn names() -> Vec<&'static str> {
    COMMANDS.iter().map(|s| s.name).collect()
}

fn table() -> &'static HashMap<&'static [u8], usize, ahash::RandomState> {
    static T: OnceLock<HashMap<&'static [u8], usize, ahash::RandomState>> = OnceLock::new();
    T.get_or_init(|| {
        COMMANDS
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.as_bytes(), i))
            .collect()
    })
}

/// Longest command name looked up.
const NAME_BYTES_MAX: usize = 32;

/// The index in [`COMMANDS`] of the command `name` names (in any case).
pub(crate) fn lookup(name: &[u8]) -> Option<usize> {
    if name.len() > NAME_BYTES_MAX {
        return None;
    }
    let mut lower = [0u8; NAME_BYTES_MAX];
    for (d, s) in lower.iter_mut().zip(name) {
        *d = s.to_ascii_lowercase();
    }
    table().get(&lower[..name.len()]).copied()
}

/// The index in [`COMMANDS`] of the command a request names, if any.
pub(crate) fn lookup_request(args: &[Bytes]) -> Option<usize> {
    args.first().and_then(|n| lookup(n))
}

/// Whether a request of command `idx` may block (see [`BLOCKING`]); inside `MULTI` it is
/// only queued.
pub(crate) fn is_blocking(idx: Option<usize>, conn: &Conn) -> bool {
    conn.multi.is_none() && idx.is_some_and(|i| COMMANDS[i].flags & BLOCKING != 0)
}

/// Whether a request of command `idx` must run alone (it holds the gate for writing).
pub(crate) fn is_exclusive(idx: Option<usize>, conn: &Conn) -> bool {
    let Some(i) = idx else {
        return false;
    };
    let spec = &COMMANDS[i];
    // Inside MULTI most commands are only queued; EXEC itself is exclusive.
    if conn.multi.is_some() && spec.flags & NOQUEUE == 0 {
        return false;
    }
    spec.flags & EXCLUSIVE != 0
}

/// Most commands one `MULTI` may queue.
const MULTI_QUEUED_MAX: usize = 100_000;

fn unknown_command(args: &[Bytes]) -> Reply {
    let name = String::from_utf8_lossy(&args[0]);
    let rest: String = args[1..]
        .iter()
        .take(8)
        .map(|a| format!("'{}' ", String::from_utf8_lossy(a)))
        .collect();
    Reply::err(format!(
        "ERR unknown command '{name}', with args beginning with: {rest}"
    ))
}

fn role_allows(role: Role, flags: u32) -> bool {
    if flags & CONN != 0 {
        return true;
    }
    match role {
        Role::Admin => true,
        Role::ReadWrite => flags & ADMIN == 0,
        Role::ReadOnly => flags & (WRITE | ADMIN) == 0,
    }
}

/// The subcommand a request of container `spec` names, held to its own arity: the name to
/// refuse it by, if the request does not fit.
fn subcommand_misfit(spec: &Spec, args: &[Bytes]) -> Option<&'static str> {
    if spec.flags & CONTAINER == 0 {
        return None;
    }
    let named = [spec.name.as_bytes(), b"|", args.get(1)?].concat();
    let sub = docs::subcommand(&named)?;
    (!arity_fits(sub.arity(), args.len())).then_some(sub.name)
}

/// Checks arity (a subcommand's too) and permissions; the refusal, if any.
fn refusal(conn: &mut Conn, spec: &Spec, args: &[Bytes]) -> Option<Reply> {
    let misfit = if spec.accepts(args.len()) {
        subcommand_misfit(spec, args)
    } else {
        Some(spec.name)
    };
    if let Some(name) = misfit {
        if conn.multi.is_some() {
            conn.multi_failed = true;
        }
        return Some(wrong_args(name));
    }
    if conn.multi.is_some() && spec.flags & NOMULTI != 0 {
        conn.multi_failed = true;
        return Some(Reply::err("ERR Command not allowed inside a transaction"));
    }
    match &conn.user {
        None if spec.flags & NOAUTH == 0 => Some(Reply::err("NOAUTH Authentication required.")),
        Some((user, role)) if !role_allows(*role, spec.flags) => {
            if conn.multi.is_some() {
                conn.multi_failed = true;
            }
            Some(no_permission(user, spec.name))
        }
        _ => None,
    }
}

/// Runs one request, of command `idx` ([`lookup_request`]), and returns its reply; the
/// tickets of its writes join `conn.pending`. An error reply is counted by its code.
pub(crate) async fn execute(
    shared: &Arc<Shared>,
    conn: &mut Conn,
    args: &[Bytes],
    idx: Option<usize>,
) -> Reply {
    let asks = idx.is_some_and(|i| COMMANDS[i].name == "asking");
    let reply = execute_request(shared, conn, args, idx).await;
    // ASKING lasts for the one command after it.
    if !asks {
        conn.asking = false;
    }
    if let Reply::Error(e) = &reply {
        shared.metrics.record_error_reply(e);
    }
    reply
}

async fn execute_request(
    shared: &Arc<Shared>,
    conn: &mut Conn,
    args: &[Bytes],
    idx: Option<usize>,
) -> Reply {
    if args.is_empty() {
        return Reply::Array(vec![]);
    }
    let Some(idx) = idx else {
        if conn.multi.is_some() {
            conn.multi_failed = true;
        }
        return unknown_command(args);
    };
    let spec = &COMMANDS[idx];
    if let Some(r) = refusal(conn, spec, args) {
        return r;
    }
    if let Some(r) = cluster::redirect(shared.cluster.as_ref(), conn, spec, args) {
        return r;
    }
    if let Some(queue) = conn.multi.as_mut().filter(|_| spec.flags & NOQUEUE == 0) {
        // The queue lives until EXEC: it gets the query buffer's limit.
        let bytes: usize = args.iter().map(|a| a.len()).sum();
        let bytes_max = shared.cfg.read().client_query_buffer_limit as usize;
        if queue.len() >= MULTI_QUEUED_MAX || conn.multi_bytes + bytes > bytes_max {
            conn.multi_failed = true;
            return Reply::err(format!(
                "ERR MULTI queue full ({MULTI_QUEUED_MAX} commands or client-query-buffer-limit \
                 bytes); the transaction will be discarded"
            ));
        }
        conn.multi_bytes += bytes;
        queue.push(args.to_vec());
        return Reply::Simple("QUEUED".into());
    }
    // Writes slow down while the `none` log hand-off is late; the wait is not the
    // command's time. Not one that holds the server's gate alone: every client would wait.
    if spec.flags & (WRITE | EXCLUSIVE) == WRITE && shared.engine.pace_writes().await {
        conn.lap = None;
    }
    dispatch_counted(&mut ctx(shared, conn), idx, args).await
}

/// [`dispatch`], timed and counted in the server's figures (a client's command, or one a
/// script calls).
pub(crate) async fn dispatch_counted(ctx: &mut Ctx<'_>, idx: usize, a: &[Bytes]) -> Reply {
    if ctx.conn.tally.command() != Some(idx) {
        flush_tally(ctx.shared, ctx.conn);
    }
    let start = ctx.conn.lap.take().unwrap_or_else(stopwatch::now);
    let reply = dispatch(ctx, idx, a).await;
    let end = stopwatch::now();
    ctx.conn.lap = Some(end);
    // A script's calls were counted meanwhile.
    if ctx.conn.tally.command().is_some_and(|c| c != idx) {
        flush_tally(ctx.shared, ctx.conn);
    }
    ctx.conn.tally.add(idx, start.until(end), reply.is_error());
    reply
}

/// Moves the connection's counts of its calls to the server's counters
/// ([`crate::metrics::Tally`]).
pub(crate) fn flush_tally(shared: &Shared, conn: &mut Conn) {
    let calls = shared.metrics.flush(&mut conn.tally);
    if calls > 0 {
        shared
            .counters
            .total_commands_processed
            .fetch_add(calls, Ordering::Relaxed);
    }
}

/// Most commands of one pipeline written as one batch, and most value bytes (past which the
/// run ends: the batch copies its values once more).
pub(crate) const RUN_MAX: usize = 256;
pub(crate) const RUN_BYTES_MAX: usize = 1 << 20;

/// Pipelined commands that run with their neighbours of the same kind as one engine call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunKind {
    /// `SET key value`, no options.
    Set,
    /// `INCR`, `DECR`, `INCRBY`, `DECRBY`.
    Incr,
    /// `GET key`.
    Get,
}

impl RunKind {
    fn writes(self) -> bool {
        !matches!(self, RunKind::Get)
    }
}

/// The run `args` may join, outside `MULTI` (see [`execute_run`]).
pub(crate) fn run_kind(args: &[Bytes], conn: &Conn) -> Option<RunKind> {
    if conn.multi.is_some() || args.is_empty() {
        return None;
    }
    let is = |name: &[u8]| args[0].eq_ignore_ascii_case(name);
    match args.len() {
        2 if is(b"get") => Some(RunKind::Get),
        3 if is(b"set") => Some(RunKind::Set),
        2 if is(b"incr") || is(b"decr") => Some(RunKind::Incr),
        3 if is(b"incrby") || is(b"decrby") => Some(RunKind::Incr),
        _ => None,
    }
}

/// Runs consecutive pipelined commands of one kind (see [`run_kind`]) as one call of the
/// engine: writes as one batch, one log record, one ticket, instead of one each; `GET`s as
/// one read. Each still gets the checks, `WATCH` touch (writes), metrics and reply of a
/// command of its own, in order.
pub(crate) async fn execute_run(
    shared: &Arc<Shared>,
    conn: &mut Conn,
    kind: RunKind,
    cmds: &[&[Bytes]],
    out: &mut Vec<Reply>,
) {
    let idxs: Vec<usize> = cmds
        .iter()
        .map(|a| lookup(&a[0]).expect("a run's commands are in the table"))
        .collect();
    // Every command of a run has the same flags and a fixed arity: one check covers all.
    if let Some(r) = refusal(conn, &COMMANDS[idxs[0]], cmds[0]) {
        out.extend(cmds.iter().map(|_| r.clone()));
        return;
    }
    if kind.writes() && shared.engine.pace_writes().await {
        conn.lap = None;
    }
    // In cluster mode, a run with a key this node does not serve runs command by command,
    // each redirected or run on its own.
    if let Some(c) = shared.cluster.as_ref() {
        let asking = conn.asking;
        let elsewhere = |a: &&[Bytes]| {
            let slot = strata_format::keys::slot_of(&a[1]);
            cluster::route_reply(c, slot, kind.writes(), asking).is_some()
        };
        if cmds.iter().any(elsewhere) {
            for (a, &i) in cmds.iter().zip(&idxs) {
                out.push(execute(shared, conn, a, Some(i)).await);
            }
            return;
        }
        conn.asking = false;
    }
    let start = stopwatch::now();
    let mut ctx = ctx(shared, conn);
    let replies = match kind {
        RunKind::Set => strings::set_run(&mut ctx, cmds).await,
        RunKind::Incr => strings::incr_run(&mut ctx, cmds).await,
        RunKind::Get => strings::get_run(&mut ctx, cmds).await,
    };
    // After the writes, as in `dispatch`.
    if kind.writes() {
        for (a, &i) in cmds.iter().zip(&idxs) {
            touch_keys(&ctx, &COMMANDS[i], a);
        }
    }
    let each = start.elapsed() / cmds.len().max(1) as u32;
    // Commands of one name in a row are counted together.
    let mut at = 0;
    while at < replies.len() {
        let i = idxs[at];
        let n = idxs[at..].iter().take_while(|&&j| j == i).count();
        let mut errors = 0;
        for r in &replies[at..at + n] {
            if let Reply::Error(e) = r {
                errors += 1;
                shared.metrics.record_error_reply(e);
            }
        }
        shared.metrics.record_calls(i, n as u64, each, errors);
        at += n;
    }
    shared
        .counters
        .total_commands_processed
        .fetch_add(cmds.len() as u64, Ordering::Relaxed);
    out.extend(replies);
}

/// Runs a command already checked for arity, auth and queueing. A write touches its keys
/// for `WATCH` once it has run: a write may wait (for the object store, for room) holding
/// the gate for reading, and a `WATCH` taken meanwhile must see it. (`EXEC` holds the gate
/// for writing, so it never runs between a write and its touch.)
pub(crate) async fn dispatch(ctx: &mut Ctx<'_>, idx: usize, a: &[Bytes]) -> Reply {
    let spec = &COMMANDS[idx];
    let reply = (spec.run)(ctx, a).await;
    if spec.flags & WRITE != 0 && spec.flags & TOUCHES_WHAT_CHANGES == 0 {
        touch_keys(ctx, spec, a);
    }
    reply
}

/// Bumps the `WATCH` version of every key a write command names.
fn touch_keys(ctx: &Ctx<'_>, s: &Spec, a: &[Bytes]) {
    if s.first_key <= 0 || ctx.shared.watches.idle() {
        return;
    }
    let last = if s.last_key < 0 {
        a.len() as i32 + s.last_key
    } else {
        s.last_key
    };
    let mut i = s.first_key;
    while i <= last && (i as usize) < a.len() {
        ctx.shared.watches.touch(&ctx.key(&a[i as usize]));
        i += s.step.max(1);
    }
}
