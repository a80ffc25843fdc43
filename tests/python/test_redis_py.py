"""redis-py, unchanged, against the real Strata server."""

import re
import subprocess
import time

import pytest
import redis
from conftest import StrataProcess, refusal


def test_strings_expiry_and_errors(strata):
    r = strata.client(decode_responses=True)
    assert r.ping()
    assert r.set("a", "1")
    assert r.get("a") == "1"
    assert r.set("a", "2", nx=True) is None
    assert r.set("a", "3", xx=True, get=True) == "1"
    assert r.incr("n", 5) == 5
    assert r.decr("n") == 4
    assert r.incrbyfloat("f", 1.5) == 1.5
    assert r.append("s", "ab") == 2 and r.append("s", "cd") == 4
    assert r.getrange("s", 1, -1) == "bcd"
    assert r.mset({"x": "1", "y": "2"}) is True
    assert r.mget("x", "y", "nope") == ["1", "2", None]
    assert r.expire("x", 100) is True
    assert 99 <= r.ttl("x") <= 100
    assert r.persist("x") is True and r.ttl("x") == -1
    assert r.ttl("nope") == -2
    assert r.exists("x", "y", "nope") == 2
    assert r.delete("x", "nope") == 1
    assert r.type("y") == "string"
    with pytest.raises(redis.ResponseError, match="not an integer"):
        r.incr("s")
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        r.execute_command("GET")
    with pytest.raises(redis.ResponseError, match="unknown command"):
        r.execute_command("XADD", "stream", "*", "f", "v")


def test_pipelines_keep_order(strata):
    r = strata.client()
    p = r.pipeline(transaction=False)
    for i in range(2000):
        p.set(f"k{i}", i)
        p.incr("counter")
    out = p.execute()
    assert out[1::2] == list(range(1, 2001))
    assert r.get("k1999") == b"1999"


def test_pipelined_sets_are_written_together_and_behave_one_by_one(strata):
    """Consecutive plain SETs of a pipeline go to the engine as one batch: replies stay in
    order, a later SET of the same key wins, reads between them see the earlier ones, a SET
    with options ends the run, TTLs are cleared as SET clears them, and a WATCHed key set
    in another client's pipeline aborts the transaction."""
    r = strata.client()
    r.set("ttl-key", "old", ex=100)
    p = r.pipeline(transaction=False)
    for i in range(300):  # longer than one run (256)
        p.set(f"run:{i % 120}", f"v{i}")
    p.set("ttl-key", "new")
    p.get("run:5")
    p.set("run:5", "after-get")
    p.set("nx-key", "first", nx=True)
    p.set("nx-key", "second", nx=True)
    p.set("run:6", "last")
    out = p.execute()
    assert out[:301] == [True] * 301
    assert out[301] == b"v245"
    assert out[302:] == [True, True, None, True]
    assert r.get("run:0") == b"v240" and r.get("run:119") == b"v239"
    assert r.get("run:5") == b"after-get" and r.get("run:6") == b"last"
    assert r.get("nx-key") == b"first"
    assert r.get("ttl-key") == b"new" and r.ttl("ttl-key") == -1

    other = strata.client()
    with r.pipeline() as pipe:
        pipe.watch("w1")
        q = other.pipeline(transaction=False)
        q.set("w0", "a").set("w1", "b").set("w2", "c")
        assert q.execute() == [True, True, True]
        pipe.multi()
        pipe.set("w1", "mine")
        with pytest.raises(redis.WatchError):
            pipe.execute()
    assert r.get("w1") == b"b"
    stats = r.info("commandstats")
    assert stats["cmdstat_set"]["calls"] == 309, stats["cmdstat_set"]  # each counted once


def test_info_counts_every_command_before_it_in_a_pipeline(strata):
    """A connection counts its calls of one command in a row itself and moves them to the
    server's counters before a call of another command and before its replies go: an INFO
    in the same pipeline sees every call before it, another client every call answered."""
    r, other = strata.client(), strata.client()
    before = other.info("stats")["total_commands_processed"]
    p = r.pipeline(transaction=False)
    for i in range(50):
        p.sadd("tally:s", f"m{i}")
    p.hincrby("tally:s", "f", 1)  # WRONGTYPE: a failed call
    p.hincrby("tally:s", "f", 1)
    p.info("commandstats")
    out = p.execute(raise_on_error=False)
    stats = out[-1]
    assert stats["cmdstat_sadd"]["calls"] == 50, stats["cmdstat_sadd"]
    assert stats["cmdstat_hincrby"]["calls"] == 2
    assert stats["cmdstat_hincrby"]["failed_calls"] == 2
    p = r.pipeline(transaction=False)
    for i in range(30):
        p.sismember("tally:s", f"m{i}")
    assert p.execute() == [True] * 30
    seen = other.info("commandstats")
    assert seen["cmdstat_sismember"]["calls"] == 30
    assert seen["cmdstat_info"]["calls"] >= 1
    # 50 + 2 + INFO + 30, and the other client's first INFO.
    after = other.info("stats")["total_commands_processed"]
    assert after - before >= 84, (before, after)


def test_pipelined_counters_run_together_and_answer_one_by_one(strata):
    """Consecutive INCR/DECR/INCRBY/DECRBY of a pipeline are one engine batch; each gets
    the reply it would get alone (a key named twice sees its first result, a value that is
    not an integer or an overflow fails that command only), TTLs are kept."""
    r = strata.client()
    r.set("word", "abc")
    r.set("big", 2**63 - 2)
    r.set("ttl", 10, ex=100)
    p = r.pipeline(transaction=False)
    p.incr("a").incr("a").decr("b").incrby("a", 10).decrby("b", 5)
    p.incr("word").incrby("big", 1).incrby("big", 1).incr("ttl")
    p.execute_command("INCRBY", "a", "x")
    p.incr("a")
    out = p.execute(raise_on_error=False)
    assert out[:5] == [1, 2, -1, 12, -6]
    assert isinstance(out[5], redis.ResponseError) and "not an integer" in str(out[5])
    assert out[6] == 2**63 - 1
    assert isinstance(out[7], redis.ResponseError) and "overflow" in str(out[7])
    assert out[8] == 11
    assert isinstance(out[9], redis.ResponseError) and "not an integer" in str(out[9])
    assert out[10] == 13
    assert r.get("a") == b"13" and r.get("b") == b"-6" and r.get("word") == b"abc"
    assert r.get("big") == str(2**63 - 1).encode()
    assert 0 < r.ttl("ttl") <= 100
    p = r.pipeline(transaction=False)
    for _ in range(1000):
        p.incr("many")
    assert p.execute() == list(range(1, 1001))


def test_pipelined_gets_read_together_and_answer_as_redis_server_does(strata, redis_server):
    """Consecutive GETs of a pipeline are one engine read (DRAM's shards in one pass): each
    still answers what redis-server answers to the same pipeline (values, nil, WRONGTYPE,
    an expired key, a key of another database), and a GET run touches no WATCHed key."""
    got = {}
    for name, port in (("strata", strata.port), ("redis", redis_server)):
        r, other_db = redis.Redis(port=port), redis.Redis(port=port, db=1)
        r.flushall()
        r.set("a", "1")
        r.set("big", b"x" * 5000)
        r.hset("h", "f", "v")
        r.set("gone", "v", px=1)
        other_db.set("only-in-1", "one")
        time.sleep(0.05)
        pipe = r.pipeline(transaction=False)
        for k in ["a", "missing", "h", "big", "gone", "only-in-1", "a"] * 20:
            pipe.get(k)
        replies = pipe.execute(raise_on_error=False)
        got[name] = [str(x) if isinstance(x, Exception) else x for x in replies]
        # A watcher of "a" sees no change from a run of GETs of it.
        w = redis.Redis(port=port)
        tx = w.pipeline(transaction=True)
        tx.watch("a")
        reads = r.pipeline(transaction=False)
        for _ in range(10):
            reads.get("a")
        assert reads.execute() == [b"1"] * 10
        tx.multi()
        tx.set("a", "2")
        assert tx.execute() == [True], name
    assert got["strata"] == got["redis"]
    assert got["strata"][2].startswith("WRONGTYPE")


def test_transactions_and_watch(strata):
    r = strata.client()
    other = strata.client()
    r.set("balance", 100)

    def debit(pipe):
        cur = int(pipe.get("balance"))
        pipe.multi()
        pipe.set("balance", cur - 30)

    r.transaction(debit, "balance")
    assert r.get("balance") == b"70"

    with r.pipeline() as pipe:
        pipe.watch("balance")
        other.set("balance", 0)
        pipe.multi()
        pipe.set("balance", 999)
        with pytest.raises(redis.WatchError):
            pipe.execute()
    assert r.get("balance") == b"0"

    with r.pipeline() as pipe:
        pipe.set("t1", "a").incr("t2").get("t1")
        assert pipe.execute() == [True, 1, b"a"]


def test_watch_fails_on_what_changed_a_watched_key_and_only_that(strata):
    """As Redis 7.0 has it: a flush fails the watches of keys it deleted, not of keys
    that did not exist or live in another database; a watched key that expires counts as
    changed; SWAPDB fails the watches of either database."""
    r = strata.client(decode_responses=True)
    other = strata.client(decode_responses=True, db=1)

    def runs(watched, between, db_client=r):
        p = db_client.pipeline()
        p.watch(*watched)
        between()
        p.multi()
        p.ping()
        try:
            return p.execute() == [True]
        except redis.WatchError:
            return False

    assert runs(["absent"], r.flushall), "a flush leaves an absent key's watch alone"
    r.set("x", 1)
    assert not runs(["x"], r.flushall)
    r.set("x", 1)
    assert not runs(["x"], r.flushdb)
    r.set("x", 1)
    assert runs(["x"], other.flushdb), "a flush of another database"
    assert r.get("x") == "1"
    assert not runs(["y"], lambda: other.set("y", 1), other)
    assert not runs(["x"], lambda: r.swapdb(0, 1))
    assert runs(["x"], lambda: r.swapdb(2, 3)), "a swap of other databases"
    r.set("ttl", 1, px=300)
    assert not runs(["ttl"], lambda: time.sleep(0.5)), "a watched key that expired"
    assert runs(["ttl"], lambda: time.sleep(0.1)), "absent when watched, absent still"
    # A collection write that changes nothing touches nothing (Redis's signalModifiedKey).
    r.sadd("dst", "a")
    r.sadd("src", "a", "b")
    assert runs(["dst"], lambda: r.smove("src", "dst", "a")), "SMOVE of a member dst holds"
    assert runs(["dst"], lambda: r.srem("dst", "zz")), "SREM of no member"
    assert runs(["none"], lambda: r.sinterstore("none", "no1", "no2")), "empty STORE, no key"
    assert not runs(["dst"], lambda: r.smove("src", "dst", "b"))
    r.sadd("src", "a")
    assert not runs(["src"], lambda: r.smove("src", "dst", "a")), "the source lost it"


def test_shutdown_inside_multi_is_refused_and_fails_the_transaction(strata):
    """Redis's no_multi: SHUTDOWN inside MULTI is refused (the server stays up) and the
    transaction is discarded; a CONFIG SET that cannot apply fails inside EXEC's reply."""
    c = strata.client(decode_responses=True)
    assert c.execute_command("MULTI") == "OK"
    assert c.execute_command("APPEND", "foo", "bar") == "QUEUED"
    with pytest.raises(redis.ResponseError, match="not allowed inside a transaction"):
        c.execute_command("SHUTDOWN")
    with pytest.raises(redis.exceptions.ExecAbortError):
        c.execute_command("EXEC")
    assert c.get("foo") is None and c.ping()
    p = c.pipeline()
    p.set("foo", "bar").config_set("maxmemory", "1mb")
    with pytest.raises(redis.ResponseError, match="CONFIG SET failed.*at least 64 MiB"):
        p.execute()
    assert c.get("foo") == "bar"


def test_randomkey_draws_every_key(strata):
    """RANDOMKEY draws from every key of a small database (it drew almost only the first
    key after a random byte, so of 'bar' and 'foo' mostly 'bar'), and from all over a large
    one: from a window after a point drawn between its first and last keys (a point drawn
    from all byte strings fell before or after keys sharing a prefix, so it drew the first
    64 keys over and over); nil when the database is empty."""
    r = strata.client(decode_responses=True)
    assert r.randomkey() is None
    r.mset({"foo": "x", "bar": "y", "baz": "z"})
    seen = {r.randomkey() for _ in range(200)}
    assert seen == {"foo", "bar", "baz"}
    r.delete("foo", "bar", "baz")
    r.mset({f"key:{i:05d}": "v" for i in range(1000)})
    drawn = [r.randomkey() for _ in range(300)]
    assert all(r.exists(k) for k in set(drawn))
    assert len(set(drawn)) > 150, len(set(drawn))
    upper = sum(k >= "key:00500" for k in drawn)
    assert 60 < upper < 240, f"{upper} of 300 from the upper half of the keys"


def test_command_docs_describe_every_command(strata):
    """COMMAND DOCS answers every command with a summary and its group (it answered an
    empty map), and only the commands named when some are."""
    r = strata.client(decode_responses=True)

    def docs(*names):
        # (As one word, "COMMAND DOCS" gets redis-py's parser of that subcommand: a dict.)
        return r.execute_command("COMMAND DOCS", *names)

    every = docs()
    assert len(every) == r.execute_command("COMMAND COUNT")
    assert all(d["summary"] and d["group"] for d in every.values())
    assert every["hmget"]["group"] == "hash" and every["zadd"]["group"] == "sorted-set"
    assert every["kvc.match"]["group"] == "strata"
    assert every["flushdb"]["group"] == "server" and every["wait"]["group"] == "generic"
    assert list(docs("get", "nosuch", "SET")) == ["get", "set"]
    assert "string value" in docs("get")["get"]["summary"]
    # Arguments, in Redis's shape: names, types, tokens and flags.
    zadd = {a["name"]: a for a in docs("zadd")["zadd"]["arguments"]}
    assert zadd["nx-xx"]["type"] == "oneof" and zadd["nx-xx"]["flags"] == ["optional"]
    assert [a["token"] for a in zadd["nx-xx"]["arguments"]] == ["NX", "XX"]
    assert zadd["score-member"]["type"] == "block" and zadd["score-member"]["flags"] == ["multiple"]
    assert zadd["score-member"]["arguments"][0] == {"name": "score", "type": "double"}
    assert "arguments" not in docs("dbsize")["dbsize"]


# Commands whose `redis-cli` help line differs from Redis 7.0.15's on purpose: DEBUG, of
# which Strata has only SLEEP; options Strata takes from later Redis versions (NOVALUES 7.4,
# WITHSCORE 7.2, IFEQ 8.0); ABORT, which Strata's SHUTDOWN has no use for.
HELP_DIFFERS = {"debug", "hscan", "zrank", "zrevrank", "set", "shutdown"}

# Subcommands whose line differs on purpose: Redis 7.0.15 documents no arguments for
# COMMAND GETKEYS.
SUB_HELP_DIFFERS = {"command|getkeys"}

def cli_help(port, command):
    out = subprocess.run(["redis-cli", "-p", str(port), "help", *command.split()], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    return re.sub(r"\x1b\[[0-9;]*m", "", out).strip().split("\n")[0].strip()


def assert_same_help(port, redis_port, commands):
    """`redis-cli help` prints the same line for each of `commands` from both servers."""
    differ = []
    for c in commands:
        a, b = cli_help(port, c), cli_help(redis_port, c)
        if a != b:
            differ.append(f"strata: {a}\nredis:  {b}")
    assert not differ, "\n".join(differ)


def test_redis_cli_help_reads_each_commands_arguments_as_redis_server_gives_them(strata,
                                                                                 redis_server):
    """`redis-cli` builds `HELP` and its typing hints from COMMAND DOCS's argument lists:
    for every command both servers have, the line it prints is Redis 7.0.15's."""
    ours = strata.client(decode_responses=True).execute_command("COMMAND DOCS")
    theirs = redis.Redis(port=redis_server, decode_responses=True).execute_command("COMMAND DOCS")
    both = sorted(set(ours) & set(theirs) - HELP_DIFFERS)
    assert len(both) > 150
    assert_same_help(strata.port, redis_server, both)
    assert cli_help(strata.port, "kvc.put") == \
        "KVC.PUT namespace [TAG tag] [TOKENS parent] hash value [tokens] [hash value [tokens] ...] [TTL seconds]"
    assert cli_help(strata.port, "hexpire") == \
        "HEXPIRE key seconds [NX|XX|GT|LT] FIELDS numfields field [field ...]"


def test_redis_cli_help_reads_each_subcommand_as_redis_server_gives_it(strata, redis_server):
    """Commands with subcommands (CLIENT, CONFIG, OBJECT, SCRIPT...) list them in COMMAND
    DOCS, as Redis 7 does, and `redis-cli` prints Redis's line for each one both have."""
    ours = strata.client(decode_responses=True).execute_command("COMMAND DOCS")
    theirs = redis.Redis(port=redis_server, decode_responses=True).execute_command("COMMAND DOCS")
    subs = lambda docs, c: set((docs.get(c) or {}).get("subcommands") or {})
    both = sorted(s for c in ours for s in subs(ours, c) & subs(theirs, c))
    assert len(both) > 35, both
    assert {"client|setname", "config|get", "object|encoding", "script|load"} <= set(both)
    # A container takes no arguments of its own; its subcommands have theirs.
    assert "arguments" not in ours["config"]
    assert ours["config"]["subcommands"]["config|get"]["arguments"][0]["name"] == "parameter"
    assert_same_help(strata.port, redis_server,
                     [s.replace("|", " ") for s in both if s not in SUB_HELP_DIFFERS])
    assert "client|kill" in both and "command|list" in both


def test_client_list_filters_by_type_and_by_id(strata):
    """`CLIENT LIST TYPE t` and `CLIENT LIST ID id...`, with Redis 7.0's errors."""
    r, other = strata.client(decode_responses=True), strata.client(decode_responses=True)
    me, them = r.client_id(), other.client_id()
    assert {c["id"] for c in r.client_list()} >= {str(me), str(them)}
    assert {c["id"] for c in r.client_list(_type="normal")} >= {str(me), str(them)}
    assert r.client_list(_type="pubsub") == [] and r.client_list(_type="replica") == []
    assert [c["id"] for c in r.client_list(client_id=[them])] == [str(them)]
    # In the order given, an id named twice listed twice (redis-server 7.0.15 does so).
    assert [c["id"] for c in r.client_list(client_id=[them, me])] == [str(them), str(me)]
    assert [c["id"] for c in r.client_list(client_id=[me, me])] == [str(me), str(me)]
    assert r.client_list(client_id=[999_999]) == []
    for args, error in [(("TYPE", "nosuch"), "Unknown client type 'nosuch'"),
                        (("ID", "x"), "Invalid client ID"), (("ID",), "syntax error"),
                        (("TYPE", "normal", "ID", str(me)), "syntax error")]:
        with pytest.raises(redis.ResponseError, match=error):
            r.execute_command("CLIENT", "LIST", *args)


def client_kill_steps(port):
    """The same CLIENT KILL steps against the server at `port`: what each answered, which
    connections it closed, and what CLIENT LIST showed of a connection before."""
    def connect(**kw):
        return redis.Redis(port=port, decode_responses=True, single_connection_client=True, **kw)

    admin, a, b, c = connect(), connect(), connect(db=3), connect(client_name="c")
    ids = {n: r.client_id() for n, r in [("admin", admin), ("a", a), ("b", b), ("c", c)]}
    line = next(x for x in admin.client_list() if x["id"] == str(ids["b"]))
    seen = {k: line[k] for k in ("db", "user", "laddr")}
    seen["c's name"] = next(x for x in admin.client_list() if x["id"] == str(ids["c"]))["name"]
    # The caller's own line shows the command that asks.
    seen["own cmd"] = next(x for x in admin.client_list() if x["id"] == str(ids["admin"]))["cmd"]
    seen["info cmd"] = admin.client_info()["cmd"]
    # A script's SELECT lasts for the script; a name HELLO set before a bad option stays.
    admin.eval("redis.call('select', '5') return 1", 0)
    seen["db after a script"] = str(admin.client_info()["db"])
    for hello in [("SETNAME", "h", "NOSUCH"), ("SETNAME", "a b")]:
        try:
            c.execute_command("HELLO", "2", *hello)
        except redis.ResponseError as e:
            seen[f"HELLO {' '.join(hello)}"] = str(e)
    seen["c's name after HELLO"] = next(
        x for x in admin.client_list() if x["id"] == str(ids["c"]))["name"]
    addr = {n: x["addr"] for x in admin.client_list() for n, i in ids.items() if x["id"] == str(i)}

    def open_ids():
        # A closed connection leaves the list once its server notices.
        deadline = time.time() + 5
        while True:
            now = {int(x["id"]) for x in connect().client_list()} & set(ids.values())
            if time.time() > deadline or now == set(ids.values()) - closed:
                return sorted(n for n, i in ids.items() if i in now)
            time.sleep(0.05)

    closed = set()
    steps = []

    def kill(*args, victims=()):
        try:
            got = admin.execute_command("CLIENT", "KILL", *args)
        except redis.ResponseError as e:
            got = f"error: {e}"
        closed.update(ids[v] for v in victims)
        # The step's arguments differ between servers (ids, ports): its place names it.
        steps.append((len(steps), got, open_ids() if victims else None))

    for bad in [("ID", "0"), ("ID", "x"), ("TYPE", "nosuch"), ("USER", "nosuch"),
                ("SKIPME", "maybe"), ("ID",), ("MAXAGE", "1"), ("NOSUCH", "1"), (),
                ("1.2.3.4:5",), ("TYPE", "pubsub"), ("TYPE", "master", "ID", str(ids["a"])),
                # Every filter must hold.
                ("ADDR", addr["b"], "ID", str(ids["a"])),
                ("LADDR", "127.0.0.1:1", "ID", str(ids["a"])),
                # Not the caller unless SKIPME no.
                ("ID", str(ids["admin"])), ("ADDR", addr["admin"], "SKIPME", "yes")]:
        kill(*bad)
    kill("ID", str(ids["a"]), "TYPE", "normal", "USER", "default", victims=["a"])
    kill("LADDR", seen["laddr"], "ADDR", addr["b"], victims=["b"])
    kill(addr["c"], victims=["c"])
    kill("ID", str(ids["admin"]), "SKIPME", "no", victims=["admin"])
    return seen, steps


def test_client_kill_applies_every_filter_as_redis_server_does(strata, redis_server):
    """CLIENT KILL with ID, TYPE, USER, ADDR, LADDR and SKIPME (it ignored all but ID and
    ADDR, and closed a connection that matched either), its errors and both reply forms,
    step by step as redis-server 7.0.15 answers; CLIENT LIST shows another connection's
    database, user and local address (it showed 0, default and port 0), and the caller's
    line its running command (it showed the one before)."""
    ours, theirs = client_kill_steps(strata.port), client_kill_steps(redis_server)
    assert ours[0] == {"db": "3", "user": "default", "laddr": f"127.0.0.1:{strata.port}",
                       "c's name": "c", "own cmd": "client|list", "info cmd": "client|info",
                       "db after a script": "0",
                       "HELLO SETNAME h NOSUCH": "Syntax error in HELLO option 'NOSUCH'",
                       "HELLO SETNAME a b":
                           "Client names cannot contain spaces, newlines or special characters.",
                       "c's name after HELLO": "h"}
    assert theirs[0] == {**ours[0], "laddr": f"127.0.0.1:{redis_server}"}
    assert ours[1] == theirs[1]
    assert ours[1][-4:] == [(16, 1, ["admin", "b", "c"]), (17, 1, ["admin", "c"]),
                            (18, "OK", ["admin"]), (19, 1, [])]


def test_command_list_filters_as_redis_server_does(strata, redis_server):
    """COMMAND LIST names subcommands too, and FILTERBY PATTERN, ACLCAT and MODULE keep
    what redis-server 7.0.15 keeps of the commands both servers have."""
    ours, theirs = strata.client(decode_responses=True), redis.Redis(port=redis_server,
                                                                      decode_responses=True)
    # (As one word, "COMMAND LIST" is not read by redis-py's parser of COMMAND's reply.)
    common = set(ours.execute_command("COMMAND LIST")) & set(
        theirs.execute_command("COMMAND LIST"))
    assert {"get", "client|kill", "config|get"} <= common

    def kept(r, *f):
        return set(r.execute_command("COMMAND LIST", "FILTERBY", *f)) & common

    for f in [("PATTERN", "client|*"), ("PATTERN", "H*"), ("ACLCAT", "hash"), ("ACLCAT", "list"),
              ("ACLCAT", "sortedset"), ("ACLCAT", "SET"), ("ACLCAT", "blocking"),
              ("ACLCAT", "transaction"), ("ACLCAT", "nosuch"), ("MODULE", "search")]:
        assert kept(ours, *f) == kept(theirs, *f), f
    for bad in [("FILTERBY", "nosuch", "x"), ("FILTERBY", "PATTERN"), ("x",)]:
        for r in (ours, theirs):
            with pytest.raises(redis.ResponseError, match="syntax error"):
                r.execute_command("COMMAND LIST", *bad)


def test_command_info_gives_redis_server_s_arity_and_acl_categories(strata, redis_server):
    """Every command and subcommand both servers have (`get`, `client|kill`, `config|get`,
    `function|load`...) answers COMMAND INFO with redis-server 7.0.15's ACL categories and
    arity, and a subcommand with its flags as far as Strata tells them; a container lists
    its subcommands' entries, COMMAND LIST FILTERBY ACLCAT keeps the same names, and a
    subcommand given the wrong number of arguments is refused in Redis's words."""
    ours, theirs = strata.client(decode_responses=True), redis.Redis(port=redis_server,
                                                                      decode_responses=True)
    common = set(ours.execute_command("COMMAND LIST")) & set(
        theirs.execute_command("COMMAND LIST"))
    subs = {n for n in common if "|" in n}
    assert {"client|kill", "config|get", "function|load", "object|encoding"} <= subs
    # ZRANK and ZREVRANK take Redis 7.2's WITHSCORE, which 7.0.15 does not know.
    newer = {"zrank", "zrevrank"}
    told = {"write", "readonly", "admin", "fast", "noscript", "no_multi", "movablekeys",
            "blocking"}
    for name in sorted(common):
        [mine], [real] = (r.execute_command("COMMAND INFO", name) for r in (ours, theirs))
        assert mine[6] == real[6], (name, "categories", mine[6], real[6])
        assert mine[1] == real[1] or name in newer, (name, "arity", mine[1], real[1])
        if name in subs:
            assert set(mine[2]) == set(real[2]) & told, (name, "flags", mine[2], real[2])
    [client] = ours.execute_command("COMMAND INFO", "client")
    assert "client|kill" in [entry[0] for entry in client[9]]
    for cat in ["admin", "dangerous", "connection", "scripting", "write", "read", "keyspace",
                "fast", "slow"]:
        kept = [set(r.execute_command("COMMAND LIST", "FILTERBY", "ACLCAT", cat)) & common
                for r in (ours, theirs)]
        assert kept[0] == kept[1], cat
    for args in [("CLIENT", "SETNAME"), ("CONFIG", "SET", "maxclients"), ("COMMAND", "GETKEYS", "GET"),
                 ("OBJECT", "ENCODING"), ("CLIENT", "KILL")]:
        errors = [refusal(r, *args) for r in (ours, theirs)]
        assert errors[0] == errors[1], args
        assert errors[0].startswith("wrong number of arguments for '"), errors


def test_client_list_inside_exec_shows_the_transaction_as_redis_server_does(strata, redis_server):
    """CLIENT INFO and CLIENT LIST run by EXEC show the caller in its transaction:
    `cmd=exec`, `multi=` the number of commands it runs and the flag `x`; outside, the
    command itself."""
    seen = []
    for r in (strata.client(decode_responses=True),
              redis.Redis(port=redis_server, decode_responses=True)):
        pick = lambda d: (d["cmd"], str(d["multi"]), d["flags"])
        p = r.pipeline(transaction=True)
        p.client_info()
        p.client_list(client_id=[r.client_id()])
        p.ping()
        info, [listed], _ = p.execute()
        seen.append((pick(info), pick(listed), pick(r.client_info())))
    assert seen[0] == seen[1]
    assert seen[0] == (("exec", "3", "x"), ("exec", "3", "x"), ("client|info", "-1", "N"))


def test_large_values(strata):
    r = strata.client()
    big = bytes(range(256)) * (32 * 1024)  # 8 MiB
    assert r.set("chunk", big)
    assert r.get("chunk") == big
    assert r.strlen("chunk") == len(big)


def test_resp3(strata):
    r = strata.client(protocol=3, decode_responses=True)
    assert r.set("k", "v")
    assert r.get("k") == "v"
    assert r.get("missing") is None
    assert r.execute_command("TIER", "k") == "hot"


def test_scan_iter_spans_three_tiers(tiny_strata):
    r = tiny_strata.client(decode_responses=True)
    p = r.pipeline(transaction=False)
    for i in range(600):
        p.set(f"item:{i:04d}", "x" * 1000)
    p.execute()
    deadline = time.time() + 30
    while int(r.info("strata")["cold_entries"]) == 0:
        assert time.time() < deadline, "nothing reached the cold tier"
        time.sleep(0.1)
    # Which keys went cold depends on which stayed in DRAM as write-back's dirty values
    # while the pipeline ran: ask for every one (a sample of them missed now and then).
    p = r.pipeline(transaction=False)
    for i in range(600):
        p.execute_command("TIER", f"item:{i:04d}")
    assert "cold" in set(p.execute())
    assert sorted(set(r.scan_iter("item:*", count=50))) == [f"item:{i:04d}" for i in range(600)]
    assert r.get("item:0000") == "x" * 1000


def test_a_value_read_from_the_cold_tier_goes_back_to_the_warm_tier():
    # tiny_strata's budgets, without prefetch: it learns this stride and would serve the
    # later reads from DRAM (those values go back to warm too, but later, in its own task).
    strata = StrataProcess(
        {
            "hot_bytes_max": 65536,
            "warm_bytes_max": 131072,
            "warm_bytes_hard_max": "64MiB",
            "background_interval_ms": 50,
            "block_bytes": 4096,
            "prefetch": "false",
        }
    )
    try:
        r = strata.client(decode_responses=True)
        p = r.pipeline(transaction=False)
        for i in range(600):
            p.set(f"item:{i:04d}", f"{i:04d}" * 250)
        p.execute()
        # Keys far apart, each in an object-store block of its own; demotion moves a
        # segment at a time, so wait until two of them are cold.
        deadline = time.time() + 30
        while True:
            keys = (f"item:{i:04d}" for i in range(0, 600, 60))
            cold = [k for k in keys if r.execute_command("TIER", k) == "cold"]
            if len(cold) >= 2:
                break
            assert time.time() < deadline, f"only {cold} of the spread reached the cold tier"
            time.sleep(0.1)
        before = int(r.info("strata")["returns_to_warm"])
        for k in cold:
            assert r.get(k) == k[5:] * 250
        # Returns happen after the replies, off the reads' path.
        deadline = time.time() + 10
        while int(r.info("strata")["returns_to_warm"]) - before < len(cold):
            assert time.time() < deadline, "the values did not go back to the warm tier"
            time.sleep(0.05)
        assert int(r.info("strata")["returns_to_warm"]) - before == len(cold)
        assert int(r.execute_command("STRATA.STATS")["returns_to_warm"]) >= len(cold)
    finally:
        strata.stop()


def test_strata_commands(strata):
    r = strata.client(decode_responses=True)
    r.set("model:llama:layer0", "w")
    assert r.execute_command("PIN", "model:llama:") >= 1
    assert r.execute_command("PINS") == ["model:llama:"]
    assert r.execute_command("UNPIN", "model:llama:") == 1
    stats = r.execute_command("STRATA.STATS")
    assert int(stats["warm_entries"]) == 1
    assert r.info("strata")["warm_entries"] == 1


def test_shutdown_from_redis_py(strata):
    r = strata.client()
    r.set("k", "v")
    r.shutdown(nosave=True)
    strata.proc.wait(timeout=30)
    assert strata.proc.returncode == 0


def test_cache_misses_are_answered_by_the_key_filter_and_no_stored_key_is_missed(tmp_path):
    settings = {
        "hot_bytes_max": 65536,
        "warm_bytes_max": 131072,
        "warm_bytes_hard_max": "64MiB",
        "background_interval_ms": 50,
        "block_bytes": 4096,
    }
    absent = [f"absent:{i}" for i in range(1000)]
    for life in ["first", "after a SIGKILL and restart"]:
        strata = StrataProcess(settings, data_dir=str(tmp_path))
        try:
            r = strata.client(decode_responses=True)
            if life == "first":
                p = r.pipeline(transaction=False)
                for i in range(600):
                    p.set(f"item:{i:04d}", f"{i:04d}" * 250)
                p.execute()
                deadline = time.time() + 30
                while int(r.info("strata")["cold_entries"]) == 0:
                    assert time.time() < deadline, "nothing reached the cold tier"
                    time.sleep(0.1)
            assert int(r.info("strata")["key_filter_builds"]) >= 1, life
            before = int(r.info("strata")["key_filter_answers"])
            p = r.pipeline(transaction=False)
            for k in absent:
                p.get(k)
            assert p.execute() == [None] * len(absent), life
            assert r.mget(absent[:100]) == [None] * 100, life
            assert r.exists(*absent[:50]) == 0, life
            answered = int(r.info("strata")["key_filter_answers"]) - before
            # A few absent keys may pass the filter as false "maybe"s (read from RocksDB).
            assert answered >= 0.95 * 1150, f"{life}: only {answered} answered by the filter"
            # Every stored key, in whichever tier it is, is found.
            keys = [f"item:{i:04d}" for i in range(600)]
            # Some are cold: after the restart, once demotion has again moved the values the
            # first life's reads brought back to the warm tier.
            deadline = time.time() + 30
            while "cold" not in {r.execute_command("TIER", k) for k in keys[::29]}:
                assert time.time() < deadline, f"{life}: no sampled key is cold"
                time.sleep(0.1)
            assert r.mget(keys) == [f"{i:04d}" * 250 for i in range(600)], life
        finally:
            strata.stop()
