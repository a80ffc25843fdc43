//! `COMMAND DOCS`: what each command of the table does, in one line of our own, with its
//! group (`Spec::group`, mostly given by the module of its handler). A test holds this list
//! to the command table: every command has a summary, and no summary names a missing one.

use bytes::Bytes;
use strata_resp::Reply;

use super::{lookup, COMMANDS};

/// Each command's summary, by name.
const SUMMARIES: &[(&str, &str)] = &[
    // Connection.
    ("ping", "Answers PONG, or echoes its argument."),
    ("echo", "Answers with its argument."),
    (
        "hello",
        "Chooses the protocol version (2 or 3), authenticates and names the connection.",
    ),
    ("auth", "Authenticates the connection as a user."),
    ("select", "Switches the connection to another database."),
    ("quit", "Closes the connection after its reply."),
    (
        "reset",
        "Returns the connection to its state when it opened.",
    ),
    (
        "client",
        "Lists, names, kills, pauses and inspects client connections.",
    ),
    (
        "command",
        "Describes the commands: arity, flags, key positions, summaries.",
    ),
    // Strings.
    ("get", "The string value of a key."),
    (
        "set",
        "Sets a string value, with an expiry and conditions if asked.",
    ),
    (
        "setnx",
        "Sets a string value only if the key does not exist.",
    ),
    ("setex", "Sets a string value with an expiry in seconds."),
    (
        "psetex",
        "Sets a string value with an expiry in milliseconds.",
    ),
    (
        "getex",
        "The string value of a key, setting or removing its expiry.",
    ),
    ("getdel", "The string value of a key, deleting the key."),
    ("getset", "Sets a string value and answers the old one."),
    ("mget", "The string values of many keys."),
    ("mset", "Sets many string values at once."),
    (
        "msetnx",
        "Sets many string values only if none of the keys exists.",
    ),
    ("strlen", "The length of a string value."),
    ("append", "Appends to a string value."),
    ("getrange", "A range of bytes of a string value."),
    (
        "lcs",
        "The longest common subsequence of two string values.",
    ),
    (
        "substr",
        "A range of bytes of a string value (the old name of GETRANGE).",
    ),
    (
        "setrange",
        "Overwrites part of a string value from an offset.",
    ),
    ("incr", "Adds one to the integer in a key."),
    ("decr", "Subtracts one from the integer in a key."),
    ("incrby", "Adds an integer to the integer in a key."),
    ("decrby", "Subtracts an integer from the integer in a key."),
    (
        "incrbyfloat",
        "Adds a decimal number to the number in a key, in extended precision.",
    ),
    // Bitmaps.
    ("setbit", "Sets or clears one bit of a string value."),
    ("getbit", "One bit of a string value."),
    (
        "bitcount",
        "How many bits a string value has set, in a range if asked.",
    ),
    // Hashes.
    ("hset", "Sets fields of a hash."),
    ("hmset", "Sets fields of a hash (the old form of HSET)."),
    (
        "hsetnx",
        "Sets a field of a hash only if it does not exist.",
    ),
    ("hget", "The value of a field of a hash."),
    ("hmget", "The values of many fields of a hash."),
    ("hgetall", "Every field of a hash with its value."),
    ("hkeys", "Every field name of a hash."),
    ("hvals", "Every field value of a hash."),
    ("hlen", "How many fields a hash has."),
    ("hexists", "Whether a hash has a field."),
    ("hstrlen", "The length of a field's value."),
    ("hdel", "Deletes fields of a hash."),
    ("hincrby", "Adds an integer to the integer in a field."),
    (
        "hincrbyfloat",
        "Adds a decimal number to the number in a field, in extended precision.",
    ),
    (
        "hrandfield",
        "Random fields of a hash, with their values if asked.",
    ),
    ("hscan", "Walks the fields of a hash with a cursor."),
    ("hexpire", "Sets an expiry in seconds on fields of a hash."),
    (
        "hpexpire",
        "Sets an expiry in milliseconds on fields of a hash.",
    ),
    (
        "hexpireat",
        "Sets an expiry time (Unix seconds) on fields of a hash.",
    ),
    (
        "hpexpireat",
        "Sets an expiry time (Unix milliseconds) on fields of a hash.",
    ),
    ("httl", "The seconds left before fields of a hash expire."),
    (
        "hpttl",
        "The milliseconds left before fields of a hash expire.",
    ),
    (
        "hexpiretime",
        "When fields of a hash expire, in Unix seconds.",
    ),
    (
        "hpexpiretime",
        "When fields of a hash expire, in Unix milliseconds.",
    ),
    ("hpersist", "Removes the expiry of fields of a hash."),
    // Sets.
    ("sadd", "Adds members to a set."),
    ("srem", "Removes members from a set."),
    ("smembers", "Every member of a set."),
    ("scard", "How many members a set has."),
    ("sismember", "Whether a set has a member."),
    ("smismember", "Whether a set has each of many members."),
    ("spop", "Removes and answers random members of a set."),
    ("srandmember", "Random members of a set, left in place."),
    ("sscan", "Walks the members of a set with a cursor."),
    ("sinter", "The members every given set has."),
    ("sunion", "The members any given set has."),
    (
        "sdiff",
        "The members of the first set that no other given set has.",
    ),
    ("sinterstore", "Stores the intersection of sets in a key."),
    ("sunionstore", "Stores the union of sets in a key."),
    ("sdiffstore", "Stores the difference of sets in a key."),
    (
        "sintercard",
        "How many members every given set has, up to a limit.",
    ),
    ("smove", "Moves a member from one set to another."),
    // Lists.
    ("lpush", "Adds elements at the head of a list."),
    ("rpush", "Adds elements at the tail of a list."),
    ("lpushx", "Adds elements at the head of a list that exists."),
    ("rpushx", "Adds elements at the tail of a list that exists."),
    (
        "lpop",
        "Removes and answers elements from the head of a list.",
    ),
    (
        "rpop",
        "Removes and answers elements from the tail of a list.",
    ),
    ("llen", "How many elements a list has."),
    ("lrange", "The elements of a list between two positions."),
    (
        "ltrim",
        "Keeps only the elements of a list between two positions.",
    ),
    ("lindex", "The element of a list at a position."),
    ("lset", "Replaces the element of a list at a position."),
    (
        "linsert",
        "Inserts an element before or after another in a list.",
    ),
    ("lrem", "Removes elements equal to a value from a list."),
    (
        "lpos",
        "The positions of elements equal to a value in a list.",
    ),
    (
        "lmove",
        "Moves an element from one end of a list to an end of another.",
    ),
    (
        "rpoplpush",
        "Moves the tail element of a list to the head of another.",
    ),
    (
        "blpop",
        "Removes the head element of the first non-empty list, waiting for one.",
    ),
    (
        "brpop",
        "Removes the tail element of the first non-empty list, waiting for one.",
    ),
    (
        "blmove",
        "LMOVE, waiting for an element if the source is empty.",
    ),
    (
        "brpoplpush",
        "RPOPLPUSH, waiting for an element if the source is empty.",
    ),
    (
        "lmpop",
        "Removes elements from an end of the first non-empty list.",
    ),
    (
        "blmpop",
        "LMPOP, waiting for an element if every list is empty.",
    ),
    (
        "sort",
        "Sorts the elements of a list, set or sorted set, storing them if asked.",
    ),
    (
        "sort_ro",
        "Sorts the elements of a list, set or sorted set; reads only.",
    ),
    // Sorted sets.
    (
        "zadd",
        "Adds members with scores to a sorted set, or updates their scores.",
    ),
    ("zincrby", "Adds to the score of a member of a sorted set."),
    ("zrem", "Removes members from a sorted set."),
    ("zcard", "How many members a sorted set has."),
    ("zscore", "The score of a member of a sorted set."),
    ("zmscore", "The scores of many members of a sorted set."),
    (
        "zrank",
        "The position of a member in a sorted set, lowest score first.",
    ),
    (
        "zrevrank",
        "The position of a member in a sorted set, highest score first.",
    ),
    (
        "zrange",
        "Members of a sorted set by position, score or name, in either order.",
    ),
    (
        "zrevrange",
        "Members of a sorted set by position, highest score first.",
    ),
    (
        "zrangebyscore",
        "Members of a sorted set with scores in a range.",
    ),
    (
        "zrevrangebyscore",
        "Members of a sorted set with scores in a range, highest first.",
    ),
    (
        "zrangebylex",
        "Members of a sorted set with names in a range.",
    ),
    (
        "zrevrangebylex",
        "Members of a sorted set with names in a range, in reverse.",
    ),
    (
        "zcount",
        "How many members of a sorted set have scores in a range.",
    ),
    (
        "zlexcount",
        "How many members of a sorted set have names in a range.",
    ),
    (
        "zremrangebyscore",
        "Removes the members of a sorted set with scores in a range.",
    ),
    (
        "zremrangebyrank",
        "Removes the members of a sorted set between two positions.",
    ),
    (
        "zremrangebylex",
        "Removes the members of a sorted set with names in a range.",
    ),
    (
        "zpopmin",
        "Removes and answers the members with the lowest scores.",
    ),
    (
        "zpopmax",
        "Removes and answers the members with the highest scores.",
    ),
    ("zscan", "Walks the members of a sorted set with a cursor."),
    (
        "zrandmember",
        "Random members of a sorted set, with scores if asked.",
    ),
    (
        "zunionstore",
        "Stores the union of sorted sets, scores combined, in a key.",
    ),
    (
        "zinterstore",
        "Stores the intersection of sorted sets, scores combined, in a key.",
    ),
    (
        "zdiffstore",
        "Stores the difference of sorted sets in a key.",
    ),
    (
        "zmpop",
        "Removes members from the first non-empty sorted set.",
    ),
    (
        "bzmpop",
        "ZMPOP, waiting for a member if every sorted set is empty.",
    ),
    (
        "bzpopmin",
        "ZPOPMIN of the first non-empty sorted set, waiting for one.",
    ),
    (
        "bzpopmax",
        "ZPOPMAX of the first non-empty sorted set, waiting for one.",
    ),
    ("zunion", "The union of sorted sets, scores combined."),
    (
        "zinter",
        "The intersection of sorted sets, scores combined.",
    ),
    (
        "zdiff",
        "The members of the first sorted set that no other has.",
    ),
    (
        "zintercard",
        "How many members every given sorted set has, up to a limit.",
    ),
    ("zrangestore", "Stores a range of a sorted set in a key."),
    // Keys.
    ("del", "Deletes keys."),
    ("unlink", "Deletes keys (the same as DEL here)."),
    ("exists", "How many of the given keys exist."),
    ("expire", "Sets a key's expiry in seconds."),
    ("pexpire", "Sets a key's expiry in milliseconds."),
    ("expireat", "Sets a key's expiry time in Unix seconds."),
    (
        "pexpireat",
        "Sets a key's expiry time in Unix milliseconds.",
    ),
    ("expiretime", "When a key expires, in Unix seconds."),
    ("pexpiretime", "When a key expires, in Unix milliseconds."),
    ("ttl", "The seconds left before a key expires."),
    ("pttl", "The milliseconds left before a key expires."),
    ("persist", "Removes a key's expiry."),
    ("type", "The type of a key's value."),
    (
        "object",
        "How a key's value is kept (Strata's encoding names) and its reference count.",
    ),
    ("memory", "The bytes a key and its value take."),
    (
        "rename",
        "Renames a key, replacing any key of the new name.",
    ),
    ("renamenx", "Renames a key only if the new name is free."),
    (
        "scan",
        "Walks the keys of the database with a cursor, in every tier.",
    ),
    ("keys", "The keys of the database that match a pattern."),
    ("dbsize", "How many keys the database holds."),
    ("move", "Moves a key to another database."),
    ("swapdb", "Swaps the contents of two databases."),
    ("dump", "A key's value in a checksummed form RESTORE reads."),
    ("restore", "Creates a key from what DUMP gave."),
    ("copy", "Copies a key's value to another key."),
    ("randomkey", "A key of the database, drawn at random."),
    (
        "flushdb",
        "Deletes every key of the database, in every tier.",
    ),
    (
        "flushall",
        "Deletes every key of every database, in every tier.",
    ),
    // Transactions.
    (
        "multi",
        "Starts a transaction: the commands that follow are queued.",
    ),
    ("exec", "Runs the queued commands of a transaction as one."),
    ("discard", "Drops the queued commands of a transaction."),
    (
        "watch",
        "Makes the next transaction fail if these keys change first.",
    ),
    ("unwatch", "Forgets the keys the connection watches."),
    // Scripting.
    ("eval", "Runs a Lua script."),
    ("evalsha", "Runs a cached Lua script by its SHA1."),
    ("eval_ro", "Runs a Lua script that only reads."),
    (
        "evalsha_ro",
        "Runs a cached Lua script that only reads, by its SHA1.",
    ),
    ("fcall", "Calls a function of a loaded library."),
    (
        "fcall_ro",
        "Calls a function of a loaded library that only reads.",
    ),
    ("script", "Loads, checks, flushes and kills scripts."),
    (
        "function",
        "Loads, lists, dumps, restores, deletes and kills function libraries.",
    ),
    // Server.
    ("info", "Figures about the server, by section."),
    ("config", "Reads and changes the server's settings."),
    ("debug", "Commands for testing (DEBUG SLEEP)."),
    ("shutdown", "Stops the server."),
    ("time", "The server's clock."),
    (
        "wait",
        "How many replicas have the connection's writes: 0, there are none.",
    ),
    ("lastsave", "When the last SAVE finished, in Unix seconds."),
    ("save", "Returns once every acknowledged write is durable."),
    (
        "bgsave",
        "Makes every acknowledged write durable, without waiting.",
    ),
    // Cluster.
    ("cluster", "The cluster's slots, nodes and state."),
    (
        "readonly",
        "Accepted in a cluster, where there are no replicas to read from.",
    ),
    ("readwrite", "Accepted in a cluster, as READONLY is."),
    (
        "asking",
        "Lets the next command reach a slot that is being moved here.",
    ),
    (
        "strata.slotclear",
        "Drops what this node holds of a slot about to move here.",
    ),
    (
        "strata.slottake",
        "Takes over a slot whose keys another node has sent here.",
    ),
    // Strata's own.
    (
        "tier",
        "Which tier holds a key: hot (DRAM), warm (disk) or cold (object store).",
    ),
    (
        "strata.stats",
        "The engine's figures: tiers, hits, demotions, prefetches.",
    ),
    (
        "pin",
        "Keeps the keys that match a pattern out of the cold tier.",
    ),
    ("unpin", "Lets the keys of a pattern go cold again."),
    ("pins", "The patterns pinned to the warm tier."),
    (
        "strata.backup",
        "Writes a consistent copy of the store to a directory or object store.",
    ),
    (
        "strata.range",
        "String keys between two bounds with their values, in key order.",
    ),
    (
        "kvc.put",
        "Stores chunks of LLM attention KV state under their prefix hash chain.",
    ),
    (
        "kvc.get",
        "Reads chunks of KV state by their prefix hash chain.",
    ),
    (
        "kvc.match",
        "How many leading chunks of a prefix hash chain are stored, and in which tiers.",
    ),
    (
        "kvc.locate",
        "Where leading chunks lie in the value log, for a local client to map.",
    ),
    (
        "kvc.where",
        "Which nodes of the cluster hold the leading chunks, and the load cost.",
    ),
];

/// The summary of command `name`.
fn summary(name: &str) -> Option<&'static str> {
    SUMMARIES.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

/// `COMMAND DOCS [name ...]`: each named command (every command if none is named) with
/// its summary, group and the Strata version it is documented for; names that are not
/// commands are left out, as Redis leaves them out.
pub(crate) fn docs(names: &[Bytes]) -> Reply {
    let doc = |i: usize| {
        let s = &COMMANDS[i];
        let fields = vec![
            (
                Reply::bulk("summary"),
                Reply::bulk(summary(s.name).unwrap_or("")),
            ),
            (Reply::bulk("since"), Reply::bulk(env!("CARGO_PKG_VERSION"))),
            (Reply::bulk("group"), Reply::bulk(s.group)),
        ];
        (Reply::bulk(s.name), Reply::Map(fields))
    };
    let entries = if names.is_empty() {
        (0..COMMANDS.len()).map(doc).collect()
    } else {
        names.iter().filter_map(|n| lookup(n)).map(doc).collect()
    };
    Reply::Map(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_has_a_summary_and_every_summary_a_command() {
        for s in COMMANDS {
            assert!(
                summary(s.name).is_some_and(|t| !t.is_empty()),
                "{} has no summary",
                s.name
            );
        }
        for (name, _) in SUMMARIES {
            assert!(
                COMMANDS.iter().any(|s| s.name == *name),
                "{name} is not a command"
            );
        }
        assert_eq!(
            SUMMARIES.len(),
            COMMANDS.len(),
            "a command summarised twice"
        );
    }
}
