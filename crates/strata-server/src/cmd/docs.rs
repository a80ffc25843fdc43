//! `COMMAND DOCS`: what each command of the table does, in one line of our own, with its
//! group (`Spec::group`, mostly given by the module of its handler) and its arguments
//! (written in the notation of [`super::syntax`]). Tests hold this list to the command
//! table: every command has an entry, no entry names a missing one, and each syntax takes
//! as many words as the command's arity says.

use std::collections::HashMap;

use bytes::Bytes;
use strata_resp::Reply;

use super::ctx::Commands;
use super::ctx::{ADMIN, NOSCRIPT, READ, WRITE};
use super::syntax;

/// Each command by name: its arguments' syntax and its summary.
pub(super) const DOCS: &[(&str, &str, &str)] = &[
    // Connection.
    ("ping", "[message]", "Answers PONG, or echoes its argument."),
    ("echo", "message", "Answers with its argument."),
    ("hello", "[protover:integer [AUTH username password] [SETNAME clientname]]", "Chooses the protocol version (2 or 3), authenticates and names the connection."),
    ("auth", "[username] password", "Authenticates the connection as a user."),
    ("select", "index:integer", "Switches the connection to another database."),
    ("quit", "", "Closes the connection after its reply."),
    ("reset", "", "Returns the connection to its state when it opened."),
    ("client", "", "Lists, names, kills, pauses and inspects client connections."),
    ("command", "", "Describes the commands: arity, flags, key positions, summaries."),
    // Strings.
    ("get", "key", "The string value of a key."),
    ("set", "key value [NX | XX | IFEQ comparison-value] [GET] [EX seconds:integer | PX milliseconds:integer | EXAT unix-time-seconds:unix-time | PXAT unix-time-milliseconds:unix-time | KEEPTTL]", "Sets a string value, with an expiry and conditions if asked."),
    ("setnx", "key value", "Sets a string value only if the key does not exist."),
    ("setex", "key seconds:integer value", "Sets a string value with an expiry in seconds."),
    ("psetex", "key milliseconds:integer value", "Sets a string value with an expiry in milliseconds."),
    ("getex", "key [EX seconds:integer | PX milliseconds:integer | EXAT unix-time-seconds:unix-time | PXAT unix-time-milliseconds:unix-time | PERSIST]", "The string value of a key, setting or removing its expiry."),
    ("getdel", "key", "The string value of a key, deleting the key."),
    ("getset", "key value", "Sets a string value and answers the old one."),
    ("mget", "key...", "The string values of many keys."),
    ("mset", "<key value>...", "Sets many string values at once."),
    ("msetnx", "<key value>...", "Sets many string values only if none of the keys exists."),
    ("strlen", "key", "The length of a string value."),
    ("append", "key value", "Appends to a string value."),
    ("getrange", "key start:integer end:integer", "A range of bytes of a string value."),
    ("lcs", "key1:key key2:key [LEN] [IDX] [MINMATCHLEN len:integer] [WITHMATCHLEN]", "The longest common subsequence of two string values."),
    ("substr", "key start:integer end:integer", "A range of bytes of a string value (the old name of GETRANGE)."),
    ("setrange", "key offset:integer value", "Overwrites part of a string value from an offset."),
    ("incr", "key", "Adds one to the integer in a key."),
    ("decr", "key", "Subtracts one from the integer in a key."),
    ("incrby", "key increment:integer", "Adds an integer to the integer in a key."),
    ("decrby", "key decrement:integer", "Subtracts an integer from the integer in a key."),
    ("incrbyfloat", "key increment:double", "Adds a decimal number to the number in a key, in extended precision."),
    // Bitmaps.
    ("setbit", "key offset:integer value:integer", "Sets or clears one bit of a string value."),
    ("getbit", "key offset:integer", "One bit of a string value."),
    ("bitcount", "key [start:integer end:integer [BYTE | BIT]]", "How many bits a string value has set, in a range if asked."),
    // Hashes.
    ("hset", "key <field value>...", "Sets fields of a hash."),
    ("hmset", "key <field value>...", "Sets fields of a hash (the old form of HSET)."),
    ("hsetnx", "key field value", "Sets a field of a hash only if it does not exist."),
    ("hget", "key field", "The value of a field of a hash."),
    ("hmget", "key field...", "The values of many fields of a hash."),
    ("hgetall", "key", "Every field of a hash with its value."),
    ("hkeys", "key", "Every field name of a hash."),
    ("hvals", "key", "Every field value of a hash."),
    ("hlen", "key", "How many fields a hash has."),
    ("hexists", "key field", "Whether a hash has a field."),
    ("hstrlen", "key field", "The length of a field's value."),
    ("hdel", "key field...", "Deletes fields of a hash."),
    ("hincrby", "key field increment:integer", "Adds an integer to the integer in a field."),
    ("hincrbyfloat", "key field increment:double", "Adds a decimal number to the number in a field, in extended precision."),
    ("hrandfield", "key [count:integer [WITHVALUES]]", "Random fields of a hash, with their values if asked."),
    ("hscan", "key cursor:integer [MATCH pattern:pattern] [COUNT count:integer] [NOVALUES]", "Walks the fields of a hash with a cursor."),
    ("hexpire", "key seconds:integer [NX | XX | GT | LT] <FIELDS numfields:integer field...>", "Sets an expiry in seconds on fields of a hash."),
    ("hpexpire", "key milliseconds:integer [NX | XX | GT | LT] <FIELDS numfields:integer field...>", "Sets an expiry in milliseconds on fields of a hash."),
    ("hexpireat", "key unix-time-seconds:unix-time [NX | XX | GT | LT] <FIELDS numfields:integer field...>", "Sets an expiry time (Unix seconds) on fields of a hash."),
    ("hpexpireat", "key unix-time-milliseconds:unix-time [NX | XX | GT | LT] <FIELDS numfields:integer field...>", "Sets an expiry time (Unix milliseconds) on fields of a hash."),
    ("httl", "key <FIELDS numfields:integer field...>", "The seconds left before fields of a hash expire."),
    ("hpttl", "key <FIELDS numfields:integer field...>", "The milliseconds left before fields of a hash expire."),
    ("hexpiretime", "key <FIELDS numfields:integer field...>", "When fields of a hash expire, in Unix seconds."),
    ("hpexpiretime", "key <FIELDS numfields:integer field...>", "When fields of a hash expire, in Unix milliseconds."),
    ("hpersist", "key <FIELDS numfields:integer field...>", "Removes the expiry of fields of a hash."),
    // Sets.
    ("sadd", "key member...", "Adds members to a set."),
    ("srem", "key member...", "Removes members from a set."),
    ("smembers", "key", "Every member of a set."),
    ("scard", "key", "How many members a set has."),
    ("sismember", "key member", "Whether a set has a member."),
    ("smismember", "key member...", "Whether a set has each of many members."),
    ("spop", "key [count:integer]", "Removes and answers random members of a set."),
    ("srandmember", "key [count:integer]", "Random members of a set, left in place."),
    ("sscan", "key cursor:integer [MATCH pattern:pattern] [COUNT count:integer]", "Walks the members of a set with a cursor."),
    ("sinter", "key...", "The members every given set has."),
    ("sunion", "key...", "The members any given set has."),
    ("sdiff", "key...", "The members of the first set that no other given set has."),
    ("sinterstore", "destination key...", "Stores the intersection of sets in a key."),
    ("sunionstore", "destination key...", "Stores the union of sets in a key."),
    ("sdiffstore", "destination key...", "Stores the difference of sets in a key."),
    ("sintercard", "numkeys:integer key... [LIMIT limit:integer]", "How many members every given set has, up to a limit."),
    ("smove", "source destination member", "Moves a member from one set to another."),
    // Lists.
    ("lpush", "key element...", "Adds elements at the head of a list."),
    ("rpush", "key element...", "Adds elements at the tail of a list."),
    ("lpushx", "key element...", "Adds elements at the head of a list that exists."),
    ("rpushx", "key element...", "Adds elements at the tail of a list that exists."),
    ("lpop", "key [count:integer]", "Removes and answers elements from the head of a list."),
    ("rpop", "key [count:integer]", "Removes and answers elements from the tail of a list."),
    ("llen", "key", "How many elements a list has."),
    ("lrange", "key start:integer stop:integer", "The elements of a list between two positions."),
    ("ltrim", "key start:integer stop:integer", "Keeps only the elements of a list between two positions."),
    ("lindex", "key index:integer", "The element of a list at a position."),
    ("lset", "key index:integer element", "Replaces the element of a list at a position."),
    ("linsert", "key <BEFORE | AFTER> pivot element", "Inserts an element before or after another in a list."),
    ("lrem", "key count:integer element", "Removes elements equal to a value from a list."),
    ("lpos", "key element [RANK rank:integer] [COUNT num-matches:integer] [MAXLEN len:integer]", "The positions of elements equal to a value in a list."),
    ("lmove", "source destination <LEFT | RIGHT> <LEFT | RIGHT>", "Moves an element from one end of a list to an end of another."),
    ("rpoplpush", "source destination", "Moves the tail element of a list to the head of another."),
    ("blpop", "key... timeout:double", "Removes the head element of the first non-empty list, waiting for one."),
    ("brpop", "key... timeout:double", "Removes the tail element of the first non-empty list, waiting for one."),
    ("blmove", "source destination <LEFT | RIGHT> <LEFT | RIGHT> timeout:double", "LMOVE, waiting for an element if the source is empty."),
    ("brpoplpush", "source destination timeout:double", "RPOPLPUSH, waiting for an element if the source is empty."),
    ("lmpop", "numkeys:integer key... <LEFT | RIGHT> [COUNT count:integer]", "Removes elements from an end of the first non-empty list."),
    ("blmpop", "timeout:double numkeys:integer key... <LEFT | RIGHT> [COUNT count:integer]", "LMPOP, waiting for an element if every list is empty."),
    ("sort", "key [BY pattern:pattern] [LIMIT offset:integer count:integer] [GET pattern:pattern]... [ASC | DESC] [ALPHA] [STORE destination]", "Sorts the elements of a list, set or sorted set, storing them if asked."),
    ("sort_ro", "key [BY pattern:pattern] [LIMIT offset:integer count:integer] [GET pattern:pattern]... [ASC | DESC] [ALPHA]", "Sorts the elements of a list, set or sorted set; reads only."),
    // Vector sets.
    ("vadd", "key [REDUCE dim:integer] <FP32 vector | VALUES num:integer vector...> element [CAS] [NOQUANT | Q8 | BIN] [EF build-exploration-factor:integer] [SETATTR attributes] [M numlinks:integer]", "Adds an element with its vector to a vector set, or replaces its vector."),
    ("vrem", "key element", "Removes an element from a vector set."),
    ("vsetattr", "key element attributes", "Sets or removes the JSON attributes of an element of a vector set."),
    ("vsim", "key <ELE element | FP32 vector | VALUES num:integer vector...> [WITHSCORES] [WITHATTRIBS] [COUNT num:integer] [EPSILON delta:double] [EF search-exploration-factor:integer] [FILTER expression] [FILTER-EF max-filtering-effort:integer] [TRUTH] [NOTHREAD]", "The elements of a vector set most similar to a vector or an element."),
    ("vcard", "key", "The number of elements of a vector set."),
    ("vdim", "key", "The dimension of the vectors of a vector set."),
    ("vemb", "key element [RAW]", "The vector of an element of a vector set."),
    ("vismember", "key element", "Whether an element is in a vector set."),
    ("vgetattr", "key element", "The JSON attributes of an element of a vector set."),
    ("vinfo", "key", "The settings and size of a vector set."),
    ("vrandmember", "key [count:integer]", "Random elements of a vector set."),
    ("vlinks", "key element [WITHSCORES]", "The neighbours of an element in a vector set's graph, layer by layer."),
    // Sorted sets.
    ("zadd", "key [NX | XX] [GT | LT] [CH] [INCR] <score:double member>...", "Adds members with scores to a sorted set, or updates their scores."),
    ("zincrby", "key increment:double member", "Adds to the score of a member of a sorted set."),
    ("zrem", "key member...", "Removes members from a sorted set."),
    ("zcard", "key", "How many members a sorted set has."),
    ("zscore", "key member", "The score of a member of a sorted set."),
    ("zmscore", "key member...", "The scores of many members of a sorted set."),
    ("zrank", "key member [WITHSCORE]", "The position of a member in a sorted set, lowest score first."),
    ("zrevrank", "key member [WITHSCORE]", "The position of a member in a sorted set, highest score first."),
    ("zrange", "key start stop [BYSCORE | BYLEX] [REV] [LIMIT offset:integer count:integer] [WITHSCORES]", "Members of a sorted set by position, score or name, in either order."),
    ("zrevrange", "key start:integer stop:integer [WITHSCORES]", "Members of a sorted set by position, highest score first."),
    ("zrangebyscore", "key min:double max:double [WITHSCORES] [LIMIT offset:integer count:integer]", "Members of a sorted set with scores in a range."),
    ("zrevrangebyscore", "key max:double min:double [WITHSCORES] [LIMIT offset:integer count:integer]", "Members of a sorted set with scores in a range, highest first."),
    ("zrangebylex", "key min max [LIMIT offset:integer count:integer]", "Members of a sorted set with names in a range."),
    ("zrevrangebylex", "key max min [LIMIT offset:integer count:integer]", "Members of a sorted set with names in a range, in reverse."),
    ("zcount", "key min:double max:double", "How many members of a sorted set have scores in a range."),
    ("zlexcount", "key min max", "How many members of a sorted set have names in a range."),
    ("zremrangebyscore", "key min:double max:double", "Removes the members of a sorted set with scores in a range."),
    ("zremrangebyrank", "key start:integer stop:integer", "Removes the members of a sorted set between two positions."),
    ("zremrangebylex", "key min max", "Removes the members of a sorted set with names in a range."),
    ("zpopmin", "key [count:integer]", "Removes and answers the members with the lowest scores."),
    ("zpopmax", "key [count:integer]", "Removes and answers the members with the highest scores."),
    ("zscan", "key cursor:integer [MATCH pattern:pattern] [COUNT count:integer]", "Walks the members of a sorted set with a cursor."),
    ("zrandmember", "key [count:integer [WITHSCORES]]", "Random members of a sorted set, with scores if asked."),
    ("zunionstore", "destination numkeys:integer key... [WEIGHTS weight:integer...] [AGGREGATE <SUM | MIN | MAX>]", "Stores the union of sorted sets, scores combined, in a key."),
    ("zinterstore", "destination numkeys:integer key... [WEIGHTS weight:integer...] [AGGREGATE <SUM | MIN | MAX>]", "Stores the intersection of sorted sets, scores combined, in a key."),
    ("zdiffstore", "destination numkeys:integer key...", "Stores the difference of sorted sets in a key."),
    ("zmpop", "numkeys:integer key... <MIN | MAX> [COUNT count:integer]", "Removes members from the first non-empty sorted set."),
    ("bzmpop", "timeout:double numkeys:integer key... <MIN | MAX> [COUNT count:integer]", "ZMPOP, waiting for a member if every sorted set is empty."),
    ("bzpopmin", "key... timeout:double", "ZPOPMIN of the first non-empty sorted set, waiting for one."),
    ("bzpopmax", "key... timeout:double", "ZPOPMAX of the first non-empty sorted set, waiting for one."),
    ("zunion", "numkeys:integer key... [WEIGHTS weight:integer...] [AGGREGATE <SUM | MIN | MAX>] [WITHSCORES]", "The union of sorted sets, scores combined."),
    ("zinter", "numkeys:integer key... [WEIGHTS weight:integer...] [AGGREGATE <SUM | MIN | MAX>] [WITHSCORES]", "The intersection of sorted sets, scores combined."),
    ("zdiff", "numkeys:integer key... [WITHSCORES]", "The members of the first sorted set that no other has."),
    ("zintercard", "numkeys:integer key... [LIMIT limit:integer]", "How many members every given sorted set has, up to a limit."),
    ("zrangestore", "dst:key src:key min max [BYSCORE | BYLEX] [REV] [LIMIT offset:integer count:integer]", "Stores a range of a sorted set in a key."),
    // Keys.
    ("del", "key...", "Deletes keys."),
    ("unlink", "key...", "Deletes keys (the same as DEL here)."),
    ("exists", "key...", "How many of the given keys exist."),
    ("expire", "key seconds:integer [NX | XX | GT | LT]", "Sets a key's expiry in seconds."),
    ("pexpire", "key milliseconds:integer [NX | XX | GT | LT]", "Sets a key's expiry in milliseconds."),
    ("expireat", "key unix-time-seconds:unix-time [NX | XX | GT | LT]", "Sets a key's expiry time in Unix seconds."),
    ("pexpireat", "key unix-time-milliseconds:unix-time [NX | XX | GT | LT]", "Sets a key's expiry time in Unix milliseconds."),
    ("expiretime", "key", "When a key expires, in Unix seconds."),
    ("pexpiretime", "key", "When a key expires, in Unix milliseconds."),
    ("ttl", "key", "The seconds left before a key expires."),
    ("pttl", "key", "The milliseconds left before a key expires."),
    ("persist", "key", "Removes a key's expiry."),
    ("type", "key", "The type of a key's value."),
    ("object", "", "How a key's value is kept (Strata's encoding names) and its reference count."),
    ("memory", "", "The bytes a key and its value take."),
    ("rename", "key newkey", "Renames a key, replacing any key of the new name."),
    ("renamenx", "key newkey", "Renames a key only if the new name is free."),
    ("scan", "cursor:integer [MATCH pattern:pattern] [COUNT count:integer] [TYPE type]", "Walks the keys of the database with a cursor, in every tier."),
    ("keys", "pattern:pattern", "The keys of the database that match a pattern."),
    ("dbsize", "", "How many keys the database holds."),
    ("move", "key db:integer", "Moves a key to another database."),
    ("swapdb", "index1:integer index2:integer", "Swaps the contents of two databases."),
    ("dump", "key", "A key's value in a checksummed form RESTORE reads."),
    ("restore", "key ttl:integer serialized-value [REPLACE] [ABSTTL] [IDLETIME seconds:integer] [FREQ frequency:integer]", "Creates a key from what DUMP gave."),
    ("copy", "source destination [DB destination-db:integer] [REPLACE]", "Copies a key's value to another key."),
    ("randomkey", "", "A key of the database, drawn at random."),
    ("flushdb", "[ASYNC | SYNC]", "Deletes every key of the database, in every tier."),
    ("flushall", "[ASYNC | SYNC]", "Deletes every key of every database, in every tier."),
    // Transactions.
    ("multi", "", "Starts a transaction: the commands that follow are queued."),
    ("exec", "", "Runs the queued commands of a transaction as one."),
    ("discard", "", "Drops the queued commands of a transaction."),
    ("watch", "key...", "Makes the next transaction fail if these keys change first."),
    ("unwatch", "", "Forgets the keys the connection watches."),
    // Scripting.
    ("eval", "script numkeys:integer [key...] [arg...]", "Runs a Lua script."),
    ("evalsha", "sha1 numkeys:integer [key...] [arg...]", "Runs a cached Lua script by its SHA1."),
    ("eval_ro", "script numkeys:integer [key...] [arg...]", "Runs a Lua script that only reads."),
    ("evalsha_ro", "sha1 numkeys:integer [key...] [arg...]", "Runs a cached Lua script that only reads, by its SHA1."),
    ("fcall", "function numkeys:integer [key...] [arg...]", "Calls a function of a loaded library."),
    ("fcall_ro", "function numkeys:integer [key...] [arg...]", "Calls a function of a loaded library that only reads."),
    ("script", "", "Loads, checks, flushes and kills scripts."),
    ("function", "", "Loads, lists, dumps, restores, deletes and kills function libraries."),
    // Server.
    ("info", "[section...]", "Figures about the server, by section."),
    ("config", "", "Reads and changes the server's settings."),
    ("debug", "subcommand [argument...]", "Commands for testing (DEBUG SLEEP)."),
    ("shutdown", "[NOSAVE | SAVE] [NOW] [FORCE]", "Stops the server."),
    ("time", "", "The server's clock."),
    ("wait", "numreplicas:integer timeout:integer", "How many replicas have the connection's writes: 0, there are none."),
    ("lastsave", "", "When the last SAVE finished, in Unix seconds."),
    ("save", "", "Returns once every acknowledged write is durable."),
    ("bgsave", "[SCHEDULE]", "Makes every acknowledged write durable, without waiting."),
    // Cluster.
    ("cluster", "", "The cluster's slots, nodes and state."),
    ("readonly", "", "Accepted in a cluster, where there are no replicas to read from."),
    ("readwrite", "", "Accepted in a cluster, as READONLY is."),
    ("asking", "", "Lets the next command reach a slot that is being moved here."),
    ("strata.slotclear", "slot:integer", "Drops what this node holds of a slot about to move here."),
    ("strata.slottake", "slot:integer", "Takes over a slot whose keys another node has sent here."),
    // Strata's own.
    ("tier", "key", "Which tier holds a key: hot (DRAM), warm (disk) or cold (object store)."),
    ("strata.stats", "", "The engine's figures: tiers, hits, demotions, prefetches."),
    ("pin", "pattern:pattern", "Keeps the keys that match a pattern out of the cold tier."),
    ("unpin", "pattern:pattern", "Lets the keys of a pattern go cold again."),
    ("pins", "", "The patterns pinned to the warm tier."),
    ("strata.backup", "url", "Writes a consistent copy of the store to a directory or object store."),
    ("strata.range", "start end [LIMIT count:integer] [REV]", "String keys between two bounds with their values, in key order."),
    ("kvc.drop", "namespace", "Deletes every chunk of a namespace in the background."),
    (
        "kvc.quota",
        "namespace [bytes]",
        "Sets or shows the bytes a namespace's chunks may take on this node.",
    ),
    ("kvc.put", "namespace [TAG tag] [TOKENS parent] <hash value [tokens]>... [TTL seconds:integer]", "Stores chunks of LLM attention KV state under their prefix hash chain."),
    ("kvc.get", "namespace [TAG tag] hash...", "Reads chunks of KV state by their prefix hash chain."),
    ("kvc.match", "namespace [TAG tag] hash... [LEASE milliseconds:integer] [LOADTIME]", "How many leading chunks of a prefix hash chain are stored, and in which tiers."),
    ("kvc.locate", "namespace [TAG tag] hash...", "Where leading chunks lie in the value log, for a local client to map."),
    ("kvc.where", "<namespace [GROUP group:integer] hash... | NAMESPACE canonical [GROUP group:integer] TOKENS token...>", "Which nodes of the cluster hold the leading chunks, and the load cost."),
];

/// The subcommands of the commands that have them (Redis's containers): the full name
/// (`command|subcommand`), its own flags (as Redis gives them: the group and key positions
/// are the command's; its arity follows from its syntax), its arguments' syntax (after the
/// two names) and its summary. A container's own entry in [`DOCS`] takes no arguments;
/// `COMMAND DOCS` and `COMMAND INFO` list these under it, and `redis-cli` shows them as
/// `CLIENT LIST` and so on.
#[rustfmt::skip]
pub(crate) const SUBCOMMANDS: &[(&str, u32, &str, &str)] = &[
    ("client|getname", NOSCRIPT, "", "The connection's name, or nil."),
    ("client|id", NOSCRIPT, "", "The connection's id."),
    ("client|info", NOSCRIPT, "", "This connection, as a line of CLIENT LIST."),
    ("client|kill", ADMIN | NOSCRIPT, "<ip:port:string | <[ID client-id:integer] | [TYPE <NORMAL | MASTER | SLAVE | REPLICA | PUBSUB>] | [USER username] | [ADDR ip:port:string] | [LADDR ip:port:string] | [SKIPME yes/no]>...>", "Closes the connections that match every filter given (not the caller, unless SKIPME no)."),
    ("client|list", ADMIN | NOSCRIPT, "[TYPE <NORMAL | MASTER | REPLICA | PUBSUB>] [ID client-id:integer...]", "Every connection, or those of one type or with the ids given, one line each."),
    ("client|no-evict", ADMIN | NOSCRIPT, "<ON | OFF>", "Accepted and ignored: Strata evicts no connection."),
    ("client|no-touch", NOSCRIPT, "<ON | OFF>", "Accepted and ignored: this connection's reads count as reads."),
    ("client|setinfo", NOSCRIPT, "<LIB-NAME libname | LIB-VER libver>", "Accepted and ignored: the client library's name and version."),
    ("client|setname", NOSCRIPT, "connection-name", "Names the connection."),
    ("client|unblock", ADMIN | NOSCRIPT, "client-id:integer [TIMEOUT | ERROR]", "Ends a blocking command of another connection, as if it timed out or with an error."),
    ("cluster|countkeysinslot", 0, "slot:integer", "How many keys one hash slot holds here."),
    ("cluster|getkeysinslot", 0, "slot:integer count:integer", "Up to count keys of one hash slot."),
    ("cluster|help", 0, "", "The subcommands of CLUSTER."),
    ("cluster|info", 0, "", "The cluster's state and sizes."),
    ("cluster|keyslot", 0, "key", "The hash slot of a key."),
    ("cluster|myid", 0, "", "This node's id."),
    ("cluster|nodes", 0, "", "The cluster's nodes and their slots, in Redis's text form."),
    ("cluster|shards", 0, "", "The cluster's shards: their slots and nodes."),
    ("cluster|slots", 0, "", "The slot ranges and the nodes serving them."),
    ("command|count", 0, "", "How many commands there are."),
    ("command|docs", 0, "[command-name...]", "What commands do, with their arguments."),
    ("command|getkeys", 0, "command arg...", "The keys of a full command."),
    ("command|info", 0, "[command-name...]", "Commands' arity, flags and key positions."),
    ("command|list", 0, "[FILTERBY <MODULE module-name | ACLCAT category | PATTERN pattern:pattern>]", "The names of the commands and their subcommands, or those in an ACL category or matching a pattern."),
    ("config|get", ADMIN | NOSCRIPT, "parameter...", "The settings matching the patterns given."),
    ("config|resetstat", ADMIN | NOSCRIPT, "", "Zeroes the statistics INFO reports."),
    ("config|rewrite", ADMIN | NOSCRIPT, "", "Answers OK: settings changed at run time are not written back to a file."),
    ("config|set", ADMIN | NOSCRIPT, "<parameter value>...", "Changes settings at run time."),
    ("function|delete", WRITE | NOSCRIPT, "library-name", "Deletes a library and its functions."),
    ("function|dump", NOSCRIPT, "", "Every library, serialized."),
    ("function|flush", WRITE | NOSCRIPT, "[ASYNC | SYNC]", "Deletes every library."),
    ("function|help", 0, "", "The subcommands of FUNCTION."),
    ("function|kill", NOSCRIPT, "", "Ends the running function, if it wrote nothing."),
    ("function|list", NOSCRIPT, "[LIBRARYNAME library-name-pattern] [WITHCODE]", "The libraries, their functions and, with WITHCODE, their code."),
    ("function|load", WRITE | NOSCRIPT, "[REPLACE] function-code", "Loads a library."),
    ("function|restore", WRITE | NOSCRIPT, "serialized-value [FLUSH | APPEND | REPLACE]", "Loads the libraries of a dump."),
    ("function|stats", NOSCRIPT, "", "The running function, and the engines."),
    ("memory|usage", READ, "key [SAMPLES count:integer]", "The bytes a key and its value take."),
    ("object|encoding", READ, "key", "How the value is kept, in Strata's own names (strata-string...)."),
    ("object|refcount", READ, "key", "1 for a key that exists: values are not shared."),
    ("script|exists", NOSCRIPT, "sha1...", "Whether each script is in the cache."),
    ("script|flush", NOSCRIPT, "[ASYNC | SYNC]", "Empties the script cache."),
    ("script|help", 0, "", "The subcommands of SCRIPT."),
    ("script|kill", NOSCRIPT, "", "Ends the running script, if it wrote nothing."),
    ("script|load", NOSCRIPT, "script", "Adds a script to the cache and answers its SHA1."),
];

/// The syntax and summary of command `name`.
pub(super) fn doc(name: &str) -> Option<(&'static str, &'static str)> {
    DOCS.iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, syntax, summary)| (*syntax, *summary))
}

/// One subcommand, a row of [`SUBCOMMANDS`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sub {
    /// `command|subcommand`.
    pub(crate) name: &'static str,
    pub(crate) flags: u32,
    pub(crate) syntax: &'static str,
    pub(crate) summary: &'static str,
}

impl Sub {
    /// Redis's arity of the subcommand (both names counted; negative: at least), from its
    /// syntax unless [`ARITY_BEYOND_SYNTAX`] gives it; each syntax is read once, the first
    /// time any arity is asked for.
    pub(crate) fn arity(&self) -> i32 {
        static ARITIES: std::sync::OnceLock<HashMap<&'static str, i32>> =
            std::sync::OnceLock::new();
        let arities = ARITIES.get_or_init(|| {
            let from_syntax = SUBCOMMANDS.iter().map(|&(name, _, syntax, _)| {
                let (lo, hi) = words(syntax);
                let n = 2 + lo as i32;
                (name, if hi == Some(lo) { n } else { -n })
            });
            from_syntax
                .chain(ARITY_BEYOND_SYNTAX.iter().copied())
                .collect()
        });
        arities[self.name]
    }
}

/// Subcommands whose arity in Redis asks for more words than their documented syntax (as
/// Redis documents it, so `redis-cli`'s hints match): `CLIENT KILL` needs a filter or an
/// address.
const ARITY_BEYOND_SYNTAX: &[(&str, i32)] = &[("client|kill", -3)];

/// The subcommands of command `name` (none for a command that is not a container).
pub(crate) fn subcommands(name: &str) -> impl Iterator<Item = Sub> + '_ {
    SUBCOMMANDS
        .iter()
        .filter(move |(full, ..)| full.split_once('|').is_some_and(|(c, _)| c == name))
        .map(|&(name, flags, syntax, summary)| Sub {
            name,
            flags,
            syntax,
            summary,
        })
}

/// The subcommand `full` names (`command|subcommand`, any case), if it is one.
pub(crate) fn subcommand(full: &[u8]) -> Option<Sub> {
    let full = std::str::from_utf8(full).ok()?.to_ascii_lowercase();
    let (command, _) = full.split_once('|')?;
    let found = subcommands(command).find(|s| s.name == full);
    found
}

/// The fewest and most words (`None`: no most) the arguments of syntax `line` take.
pub(super) fn words(line: &str) -> (usize, Option<usize>) {
    syntax::parse(line)
        .unwrap_or_default()
        .iter()
        .map(syntax::Arg::words)
        .fold((0, Some(0)), |(lo, hi), (l, h)| {
            (lo + l, hi.zip(h).map(|(a, b)| a + b))
        })
}

/// The fields of one `COMMAND DOCS` entry: summary, version, group and the arguments of
/// syntax `line`.
fn doc_fields(summary: &'static str, group: &'static str, line: &str) -> Vec<(Reply, Reply)> {
    let mut fields = vec![
        (Reply::bulk("summary"), Reply::bulk(summary)),
        (Reply::bulk("since"), Reply::bulk(env!("CARGO_PKG_VERSION"))),
        (Reply::bulk("group"), Reply::bulk(group)),
    ];
    // Every line parses (a test reads them all).
    let args = syntax::parse(line).unwrap_or_default();
    if !args.is_empty() {
        fields.push((
            Reply::bulk("arguments"),
            Reply::Array(args.iter().map(syntax::Arg::reply).collect()),
        ));
    }
    fields
}

/// `COMMAND DOCS [name ...]`: each named command (every command if none is named) with
/// its summary, group, the Strata version it is documented for and its arguments; names
/// that are not commands are left out, as Redis leaves them out.
pub(crate) fn docs(commands: &dyn Commands, names: &[Bytes]) -> Reply {
    let specs = commands.specs();
    let entry = |i: usize| {
        let s = &specs[i];
        let (line, summary) = doc(s.name).unwrap_or(("", ""));
        let mut fields = doc_fields(summary, s.group, line);
        let subs: Vec<(Reply, Reply)> = subcommands(s.name)
            .map(|sub| {
                (
                    Reply::bulk(sub.name),
                    Reply::Map(doc_fields(sub.summary, s.group, sub.syntax)),
                )
            })
            .collect();
        if !subs.is_empty() {
            fields.push((Reply::bulk("subcommands"), Reply::Map(subs)));
        }
        (Reply::bulk(s.name), Reply::Map(fields))
    };
    let entries = if names.is_empty() {
        (0..specs.len()).map(entry).collect()
    } else {
        names
            .iter()
            .filter_map(|n| commands.lookup(n))
            .map(entry)
            .collect()
    };
    Reply::Map(entries)
}
