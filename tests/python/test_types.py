"""Databases and hashes through redis-py against the real binary: a feature store's layout
(one hash per entity, HSET and EXPIRE on write, HMGET in a pipeline on read), SELECT,
MOVE and FLUSHDB, WRONGTYPE, and hashes larger than DRAM demoted and read back."""

import time

import struct

import pytest
import redis

from conftest import StrataProcess


def test_a_feature_store_writes_hashes_with_a_ttl_and_reads_them_in_a_pipeline(strata):
    r = strata.client(decode_responses=True)
    users = [f"user:{i}" for i in range(200)]
    p = r.pipeline(transaction=False)
    for u in users:
        p.hset(u, mapping={f"f{j}": f"{u}:{j}" for j in range(100)})
        p.expire(u, 3600)
    assert all(p.execute())
    p = r.pipeline(transaction=False)
    for u in users:
        p.hmget(u, ["f0", "f50", "f99", "missing"])
    got = p.execute()
    assert got == [[f"{u}:0", f"{u}:50", f"{u}:99", None] for u in users]
    assert 3500 < r.ttl("user:7") <= 3600, "HSET keeps the key's TTL"
    r.hset("user:7", "f0", "new")
    assert 3500 < r.ttl("user:7") <= 3600
    assert r.hget("user:7", "f0") == "new"
    assert r.hlen("user:7") == 100
    assert r.hgetall("user:1") == {f"f{j}": f"user:1:{j}" for j in range(100)}
    assert r.type("user:1") == "hash"
    assert r.hincrby("counters", "views", 5) == 5
    assert r.hincrbyfloat("counters", "score", 1.5) == 1.5
    assert r.hdel("counters", "views", "score", "nope") == 2
    assert r.exists("counters") == 0, "a hash with no fields is deleted"


def test_reads_answer_with_slices_of_the_stored_value_byte_for_byte(strata):
    # HGET/HMGET/HGETALL/HKEYS/HVALS and LRANGE/LINDEX answer with parts of the stored
    # value itself (no copies): empty names, members and values, and binary bytes, come
    # back exactly; SISMEMBER/SMISMEMBER/SCARD/LLEN read the members without copying them.
    r = strata.client()
    blob = bytes(range(256))
    r.hset("h", mapping={"": "", "bin": blob, "x": "1"})
    assert r.hget("h", "") == b"" and r.hget("h", "bin") == blob
    assert r.hmget("h", ["", "bin", "missing"]) == [b"", blob, None]
    assert r.hgetall("h") == {b"": b"", b"bin": blob, b"x": b"1"}
    assert sorted(r.hkeys("h")) == [b"", b"bin", b"x"] and sorted(r.hvals("h")) == sorted([b"", blob, b"1"])
    r.rpush("l", "", blob, "tail")
    assert r.lrange("l", 0, -1) == [b"", blob, b"tail"] and r.lrange("l", -2, 5) == [blob, b"tail"]
    assert r.lindex("l", 1) == blob and r.lindex("l", 0) == b"" and r.lindex("l", 3) is None
    assert r.llen("l") == 3 and r.llen("nolist") == 0 and r.lrange("nolist", 0, -1) == []
    r.sadd("s", "", blob)
    assert r.sismember("s", "") and r.sismember("s", blob) and not r.sismember("s", "zz")
    assert r.smismember("s", ["", "zz", blob]) == [1, 0, 1]
    assert r.scard("s") == 2 and r.scard("noset") == 0 and not r.sismember("noset", "")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        r.lrange("h", 0, -1)
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        r.sismember("l", "")


def test_the_wrong_type_is_refused_both_ways(strata):
    r = strata.client()
    r.set("s", "1")
    r.hset("h", "f", "v")
    for call in (lambda: r.hget("s", "f"), lambda: r.hset("s", "f", "v"), lambda: r.get("h"),
                 lambda: r.incr("h"), lambda: r.append("h", "x")):
        with pytest.raises(redis.ResponseError, match="^WRONGTYPE"):
            call()
    assert r.mget("s", "h") == [b"1", None]
    r.set("h", "now a string")
    assert r.type("h") == b"string"
    r.hset("h2", "a", "1")
    r.rename("h2", "h3")
    assert r.type("h3") == b"hash" and r.hgetall("h3") == {b"a": b"1"}
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        r.execute_command("HSET", "h3", "a")
    assert sorted(r.scan_iter(_type="hash")) == [b"h3"]
    assert sorted(r.scan_iter(_type="string")) == [b"h", b"s"]


def test_info_counts_keys_without_writing_out_what_write_back_holds(strata):
    """`INFO` (its keyspace section) counts keys as they stand: what write-back holds stays
    in DRAM, since a monitor polls `INFO` (it wrote out every dirty value, seconds for a few
    hundred megabytes). `DBSIZE`, exact as in Redis, writes them out and counts."""
    r = strata.client(decode_responses=True)
    r9 = strata.client(decode_responses=True, db=9)

    def write(names):
        pipe = r.pipeline(transaction=False)
        for n in names:
            pipe.set(n, "v" * 100)
        pipe.execute()

    write(f"k{i}" for i in range(500))
    r9.set("x", "y")
    before = r.info("strata")["hot_dirty_bytes"]
    assert before > 0
    keyspace = r.info("keyspace")
    assert keyspace["db0"]["keys"] == 500 and keyspace["db9"]["keys"] == 1
    assert r.info()["db0"]["keys"] == 500
    assert r.info("strata")["hot_dirty_bytes"] == before, "INFO wrote write-back out"
    assert r.dbsize() == 500
    assert r.info("strata")["hot_dirty_bytes"] == 0
    # Stored keys written again are counted once; new ones beside them too (a few of the
    # new may pass the key filter as "maybe" and wait for the next settle to count).
    write([f"k{i}" for i in range(500)] + [f"n{i}" for i in range(100)])
    assert r.info("strata")["hot_dirty_bytes"] > 0
    assert 590 <= r.info("keyspace")["db0"]["keys"] <= 600
    assert r.dbsize() == 600


def test_dbsize_writes_out_what_write_back_holds_while_other_clients_are_served():
    """On one core (one runtime thread), `DBSIZE` after many writes settles write-back on
    the blocking pool: another client's commands are answered meanwhile (they waited for
    the whole settle, a third of a second for these 60 MB and seconds for more), and the
    count is exact."""
    import threading

    p = StrataProcess({"durability": "none", "hot_bytes_max": "1GiB"}, cores={0})
    try:
        r = p.client()
        for start in range(0, 60_000, 1000):
            pipe = r.pipeline(transaction=False)
            for i in range(start, start + 1000):
                pipe.set(f"key:{i}", b"v" * 1024)
            pipe.execute()
        held = r.info("strata")["hot_dirty_bytes"]
        assert held > 50_000_000
        counted = {}
        sizing = threading.Thread(target=lambda: counted.update(n=r.dbsize()))
        other = p.client()
        sizing.start()
        # Another client asks how much write-back holds, over and over: answered only
        # between commands, it could never see the settle part-way.
        seen = []
        while sizing.is_alive():
            seen.append(other.info("strata")["hot_dirty_bytes"])
        sizing.join()
        assert counted["n"] == 60_000
        assert any(0 < d < held for d in seen), f"served only before or after: {seen}"
        assert other.info("strata")["hot_dirty_bytes"] == 0
    finally:
        p.stop()


def test_databases_are_separate_keyspaces(strata):
    r0 = strata.client(decode_responses=True)
    r9 = strata.client(decode_responses=True, db=9)
    r0.set("k", "zero")
    r9.set("k", "nine")
    r9.hset("h", "f", "v")
    assert (r0.get("k"), r9.get("k")) == ("zero", "nine")
    assert (r0.dbsize(), r9.dbsize()) == (1, 2)
    assert r9.move("h", 0) is True
    assert r0.hget("h", "f") == "v" and r9.exists("h") == 0
    assert r9.move("k", 0) is False, "MOVE refuses a name the target holds"
    keyspace = r0.info("keyspace")
    assert keyspace["db0"]["keys"] == 2 and keyspace["db9"]["keys"] == 1
    r9.flushdb()
    assert (r0.dbsize(), r9.dbsize()) == (2, 0)
    with pytest.raises(redis.ResponseError, match="DB index is out of range"):
        strata.client(db=16).ping()
    p = r0.pipeline(transaction=False)
    p.execute_command("SELECT", 3)
    p.set("k", "three")
    p.execute_command("SELECT", 0)
    p.get("k")
    assert p.execute()[-1] == "zero"


def test_hashes_larger_than_dram_are_demoted_and_read_back_in_order(tiny_strata):
    r = tiny_strata.client(decode_responses=True)
    p = r.pipeline(transaction=False)
    for i in range(300):
        p.hset(f"entity:{i:03d}", mapping={f"feature{j}": f"{i}-{j}-" + "x" * 20 for j in range(20)})
    p.execute()
    deadline = time.time() + 30
    while int(r.info("strata")["cold_entries"]) < 100:
        assert time.time() < deadline, "no hash reached the cold tier"
        time.sleep(0.1)
    assert "cold" in {r.execute_command("TIER", f"entity:{i:03d}") for i in range(0, 300, 10)}
    for i in range(300):
        want = {f"feature{j}": f"{i}-{j}-" + "x" * 20 for j in range(20)}
        assert r.hgetall(f"entity:{i:03d}") == want
        assert list(r.hkeys(f"entity:{i:03d}")) == list(want), "insertion order survives tiering"
    assert r.hset("entity:000", "feature0", "changed") == 0
    assert r.hget("entity:000", "feature0") == "changed"


def test_hash_fields_expire_on_their_own_in_every_tier(tiny_strata):
    """Redis 7.4's field expiry: HEXPIRE and friends answer per field; a field past its
    time is gone from every read, also when its hash sits in the cold tier."""
    r = tiny_strata.client(decode_responses=True)
    r.hset("session", mapping={"token": "t", "user": "u", "csrf": "c"})
    assert r.execute_command("HPEXPIRE", "session", 400, "FIELDS", 2, "token", "nope") == [1, -2]
    assert r.execute_command("HEXPIRE", "session", 100, "NX", "FIELDS", 2, "token", "csrf") == [0, 1]
    assert r.execute_command("HEXPIRE", "session", 50, "GT", "FIELDS", 1, "csrf") == [0]
    assert r.execute_command("HEXPIRE", "session", 50, "LT", "FIELDS", 1, "user") == [1]
    assert r.execute_command("HPERSIST", "session", "FIELDS", 2, "user", "nope") == [1, -2]
    assert r.execute_command("HPERSIST", "session", "FIELDS", 1, "user") == [-1]
    ttl = r.execute_command("HPTTL", "session", "FIELDS", 3, "token", "user", "nope")
    assert 0 < ttl[0] <= 400 and ttl[1:] == [-1, -2]
    assert r.execute_command("HTTL", "session", "FIELDS", 1, "csrf") == [100]
    at = r.execute_command("HPEXPIRETIME", "session", "FIELDS", 1, "token")[0]
    assert abs(at - time.time() * 1000) < 5000
    assert r.execute_command("HEXPIRETIME", "session", "FIELDS", 1, "token") == [at // 1000]
    # A time already past deletes the field at once.
    r.hset("session", "old", "o")
    assert r.execute_command("HEXPIREAT", "session", 1, "FIELDS", 1, "old") == [2]
    assert r.hexists("session", "old") == 0
    # Many hashes with a short-lived field, pushed to the cold tier by the tiny budget; the
    # first hundred have no other field, so they go with it.
    p = r.pipeline(transaction=False)
    for i in range(100):
        p.hset(f"gone:{i:03d}", "drop", "d" * 400)
        p.execute_command("HPEXPIRE", f"gone:{i:03d}", 4000, "FIELDS", 1, "drop")
    for i in range(300):
        p.hset(f"h:{i:03d}", mapping={"keep": "k" * 400, "drop": "d" * 400})
        p.execute_command("HPEXPIRE", f"h:{i:03d}", 1500, "FIELDS", 1, "drop")
    p.execute()
    assert r.hgetall("h:000") == {"keep": "k" * 400, "drop": "d" * 400}
    deadline = time.time() + 30
    while int(r.info("strata")["cold_entries"]) < 100:
        assert time.time() < deadline, "no hash reached the cold tier"
        time.sleep(0.1)
    # The "gone:" hashes live 4 s, time for some to reach the cold tier (demotion skips
    # expired keys) before their fields expire there.
    while "cold" not in {r.execute_command("TIER", f"gone:{i:03d}") for i in range(100)}:
        assert time.time() < deadline, "no short-lived hash reached the cold tier"
        time.sleep(0.05)
    time.sleep(1.6)
    tiers = {r.execute_command("TIER", f"h:{i:03d}") for i in range(0, 300, 10)}
    assert "cold" in tiers
    # Without a read of them, the sweep deletes the hashes whose last field expired.
    deadline = time.time() + 15
    while r.keys("gone:*"):
        assert time.time() < deadline, f"{len(r.keys('gone:*'))} hashes outlived their fields"
        time.sleep(0.1)
    assert r.exists(*[f"gone:{i:03d}" for i in range(100)]) == 0
    for i in range(300):
        assert r.hgetall(f"h:{i:03d}") == {"keep": "k" * 400}
    assert r.hgetall("session") == {"user": "u", "csrf": "c"}, "token's 400 ms are over"
    assert r.hlen("session") == 2 and r.hget("session", "token") is None
    with pytest.raises(redis.ResponseError, match="numfields"):
        r.execute_command("HEXPIRE", "session", 10, "FIELDS", 2, "user")
    with pytest.raises(redis.ResponseError, match="FIELDS is missing"):
        r.execute_command("HTTL", "session", "FIELD", 1, "user")
    with pytest.raises(redis.ResponseError, match="must be >= 0"):
        r.execute_command("HEXPIRE", "session", -1, "FIELDS", 1, "user")


def test_a_hash_goes_when_its_last_field_expires(strata):
    """As in Redis 7.4, a hash whose fields have all expired is deleted: EXISTS, TYPE,
    DBSIZE and KEYS stop seeing it soon after, without a read or write of it."""
    r = strata.client(decode_responses=True)
    r.hset("h", mapping={"f": "1", "g": "2"})
    r.hset("kept", mapping={"f": "1", "g": "2"})
    r.set("other", "x")
    assert r.execute_command("HPEXPIRE", "h", 100, "FIELDS", 2, "f", "g") == [1, 1]
    assert r.execute_command("HPEXPIRE", "kept", 100, "FIELDS", 1, "f") == [1]
    assert r.dbsize() == 3
    deadline = time.time() + 10
    while r.exists("h"):
        assert time.time() < deadline, "the hash outlived its fields"
        time.sleep(0.05)
    assert r.type("h") == "none" and r.dbsize() == 2
    assert sorted(r.keys("*")) == ["kept", "other"]
    assert r.hgetall("kept") == {"g": "2"} and r.type("kept") == "hash"


def test_hashes_and_databases_survive_a_kill_and_restart(tmp_path):
    p = StrataProcess(data_dir=str(tmp_path))
    r = p.client(decode_responses=True, db=2)
    r.hset("h", mapping={"a": "1", "b": "2"})
    r.hdel("h", "a")
    p.client(decode_responses=True).set("h", "db0")
    assert r.execute_command("HEXPIRE", "h", 3600, "FIELDS", 1, "b") == [1]
    p.client(db=5).set("in5", "x")
    assert r.swapdb(5, 6)
    p.stop()
    p = StrataProcess(data_dir=str(tmp_path))
    try:
        r = p.client(decode_responses=True, db=2)
        assert r.hgetall("h") == {"b": "2"} and r.type("h") == "hash"
        assert 3500 < r.execute_command("HTTL", "h", "FIELDS", 1, "b")[0] <= 3600
        assert p.client(decode_responses=True).get("h") == "db0"
        assert r.dbsize() == 1
        # SWAPDB holds across the restart.
        assert p.client(db=6).get("in5") == b"x" and p.client(db=5).dbsize() == 0
    finally:
        p.stop()


def test_sets_pop_and_sample_at_random_and_combine(strata):
    r = strata.client(decode_responses=True)
    assert r.sadd("s", *[f"m{i}" for i in range(50)]) == 50
    assert r.sadd("s", "m0", "new") == 1
    assert r.scard("s") == 51 and r.sismember("s", "new") and not r.sismember("s", "nope")
    sample = r.srandmember("s", 10)
    assert len(set(sample)) == 10 and set(sample) <= r.smembers("s")
    assert len(r.srandmember("s", -100)) == 100, "a negative count repeats"
    popped = r.spop("s", 5)
    assert len(popped) == 5 and not (set(popped) & r.smembers("s"))
    assert r.scard("s") == 46
    r.sadd("t", "m10", "m11", "x")
    assert r.sinter("s", "t") == {"m10", "m11"} - set(popped)
    assert r.sunionstore("u", "s", "t") == len(r.smembers("s") | {"x", "m10", "m11"})
    assert r.smove("t", "s", "x") and r.sismember("s", "x") and not r.sismember("t", "x")
    assert r.sintercard(2, ["s", "t"], limit=1) <= 1
    while r.spop("t"):
        pass
    assert r.exists("t") == 0, "an emptied set is deleted"


def test_sorted_sets_rank_range_and_combine_like_a_leaderboard(strata):
    r = strata.client(decode_responses=True)
    assert r.zadd("board", {f"player{i}": i * 10 for i in range(100)}) == 100
    assert r.zadd("board", {"player5": 1000}, gt=True, ch=True) == 1
    assert r.zadd("board", {"player5": 1}, gt=True, ch=True) == 0, "GT keeps the higher score"
    assert r.zrevrange("board", 0, 2, withscores=True) == [
        ("player5", 1000.0), ("player99", 990.0), ("player98", 980.0)]
    assert r.zrank("board", "player0") == 0 and r.zrevrank("board", "player5") == 0
    assert r.zrangebyscore("board", "(10", 30) == ["player2", "player3"]
    # player5 left for 1000: the scores from 50 are player6 (60), player7, ...
    assert r.zrange("board", 50, "(100", byscore=True, offset=1, num=2) == ["player7", "player8"]
    assert r.zincrby("board", 0.1, "player0") == 0.1
    assert r.zscore("board", "player0") == 0.1
    assert r.zcount("board", "-inf", "+inf") == 100
    assert r.zpopmin("board", 2) == [("player0", 0.1), ("player1", 10.0)]
    assert r.zremrangebyrank("board", 0, 9) == 10
    assert r.zcard("board") == 88
    r.zadd("bonus", {"player50": 5, "ghost": 1})
    assert r.zunionstore("total", ["board", "bonus"], aggregate="SUM") == 89
    assert r.zscore("total", "player50") == 505.0
    assert r.zinterstore("both", {"board": 1, "bonus": 2}) == 1
    assert r.zrange("both", 0, -1, withscores=True) == [("player50", 510.0)]
    r.zadd("lex", {m: 0 for m in "abcdef"})
    assert r.zrangebylex("lex", "[b", "(e") == ["b", "c", "d"]
    assert r.zlexcount("lex", "-", "+") == 6
    with pytest.raises(redis.ResponseError, match="not a valid float"):
        r.zadd("board", {"x": "abc"})


def test_lists_as_queues_with_blocking_pops_and_timeouts(strata):
    import threading
    r = strata.client(decode_responses=True)
    assert r.rpush("q", "a", "b", "c") == 3 and r.lpush("q", "z") == 4
    assert r.lrange("q", 0, -1) == ["z", "a", "b", "c"]
    assert r.lpop("q") == "z" and r.rpop("q", 2) == ["c", "b"]
    assert r.linsert("q", "BEFORE", "a", "x") == 2 and r.lpos("q", "a") == 1
    assert r.lmove("q", "done", "LEFT", "RIGHT") == "x"
    # A blocked pop waits its timeout, then answers nil.
    t0 = time.time()
    assert r.blpop(["empty"], timeout=0.3) is None
    assert 0.25 < time.time() - t0 < 5
    # A pop blocked on two keys is woken by another client's push, which it takes.
    got = {}
    def waiter():
        got["v"] = strata.client(decode_responses=True).brpop(["never", "jobs"], timeout=10)
    w = threading.Thread(target=waiter)
    w.start()
    time.sleep(0.3)
    # While it waits, commands that run alone still run (the wait holds no gate).
    assert r.mset({"k1": "1", "k2": "2"})
    assert r.lpush("jobs", "job1") == 1
    w.join(10)
    assert got["v"] == ("jobs", "job1") and r.llen("jobs") == 0
    assert r.blmove("done", "q", 1, "RIGHT", "LEFT") == "x"
    # Inside MULTI a blocking pop does not block.
    p = r.pipeline(transaction=True)
    p.blpop(["empty"], timeout=0)
    assert p.execute() == [None]
    with pytest.raises(redis.ResponseError, match="timeout is negative"):
        r.blpop(["q"], timeout=-1)


def wait_for_blocked(r, n):
    """Waits until `n` clients of the server `r` talks to are blocked."""
    deadline = time.time() + 10
    while (now := r.info("clients")["blocked_clients"]) != n:
        assert time.time() < deadline, f"blocked_clients stayed {now}, not {n}"
        time.sleep(0.02)


def test_blocked_pops_are_served_in_the_order_they_blocked(strata):
    """As Redis: clients blocked on one key are served first come, first served, each
    push to the longest waiter; a client that hangs up while blocked leaves the line and
    takes nothing."""
    import socket
    import threading
    r = strata.client(decode_responses=True)

    def blocked_count():
        return r.info("clients")["blocked_clients"]

    def wait_blocked(n):
        wait_for_blocked(r, n)

    # A raw client blocks, then hangs up: it must not take the next element.
    gone = socket.create_connection(("127.0.0.1", strata.port))
    gone.sendall(b"*3\r\n$5\r\nBLPOP\r\n$4\r\nline\r\n$1\r\n0\r\n")
    wait_blocked(1)
    gone.close()
    wait_blocked(0)
    got = [None] * 4
    threads = []
    for i in range(4):
        def waiter(i=i):
            got[i] = strata.client(decode_responses=True).blpop(["other", "line"], timeout=10)
        t = threading.Thread(target=waiter)
        t.start()
        threads.append(t)
        wait_blocked(i + 1)
    # One push of three: the three longest waiters get one each, in order.
    assert r.rpush("line", "a", "b", "c") == 3
    for t in threads[:3]:
        t.join(10)
    assert got[:3] == [("line", "a"), ("line", "b"), ("line", "c")]
    assert got[3] is None and blocked_count() == 1
    assert r.lpush("other", "d") == 1
    threads[3].join(10)
    assert got[3] == ("other", "d") and r.exists("line", "other") == 0


def blocked_clients_served_before_the_next_command(port):
    """What clients see when commands on a key follow a push that feeds clients blocked on
    it (the same steps against Strata and redis-server)."""
    import threading
    r = redis.Redis(port=port, decode_responses=True)
    seen = []

    def block(keys, into, name="waiter", to=None):
        def waiter():
            # A client not served times out (nil), so the steps after it still run.
            c = redis.Redis(port=port, decode_responses=True)
            into[name] = c.blpop(keys, timeout=5) if to is None else \
                c.blmove(keys[0], to, 5, "LEFT", "RIGHT")
        t = threading.Thread(target=waiter)
        t.start()
        return t

    # A pop pipelined right after the push finds nothing: the blocked client was served
    # first. Ten rounds: before, the pop won most of them.
    for i in range(10):
        got = {}
        t = block(["feed"], got)
        wait_for_blocked(r, 1)
        p = r.pipeline(transaction=False)
        p.rpush("feed", f"e{i}").lpop("feed").llen("feed")
        seen.append(p.execute())
        t.join(10)
        seen.append(got)
    # One push of two feeds two blocked clients, in the order they blocked, before a pop.
    got = {}
    first = block(["feed"], got, "first")
    wait_for_blocked(r, 1)
    second = block(["other", "feed"], got, "second")
    wait_for_blocked(r, 2)
    p = r.pipeline(transaction=False)
    p.rpush("feed", "a", "b").lpop("feed").exists("feed")
    seen.append(p.execute())
    first.join(10)
    second.join(10)
    seen.append(got)
    # A client blocked in BLMOVE is served before a command on the list it moves to.
    for i in range(3):
        got = {}
        t = block(["feed"], got, to="moved")
        wait_for_blocked(r, 1)
        p = r.pipeline(transaction=False)
        p.rpush("feed", f"m{i}").lrange("moved", 0, -1).rpop("moved")
        seen.append(p.execute())
        t.join(10)
        seen.append(got)
    # Inside a transaction the pop comes first: clients are served after EXEC.
    got = {}
    t = block(["feed"], got)
    wait_for_blocked(r, 1)
    p = r.pipeline(transaction=True)
    p.rpush("feed", "x").lpop("feed")
    seen.append(p.execute())
    seen.append(r.info("clients")["blocked_clients"])
    seen.append(r.rpush("feed", "y"))
    t.join(10)
    seen.append(got)
    return seen


def test_a_push_serves_blocked_clients_before_the_next_command_as_redis_server_does(
    strata, redis_server
):
    """Redis serves the clients a push unblocks before it runs another command, so a pop
    (from the pusher or anyone) cannot take what a blocked client was given."""
    ours = blocked_clients_served_before_the_next_command(strata.port)
    theirs = blocked_clients_served_before_the_next_command(redis_server)
    assert ours[:2] == [[1, None, 0], {"waiter": ("feed", "e0")}]
    assert ours == theirs


def test_swapdb_trades_databases_and_wakes_a_client_blocked_in_one(strata):
    import threading
    r = strata.client(db=1, decode_responses=True)
    r.rpush("k", "hello")
    r.hset("h", "f", "v")
    got = {}

    def waiter():
        got["v"] = strata.client(db=9, decode_responses=True).brpop(["k"], timeout=10)
    w = threading.Thread(target=waiter)
    w.start()
    deadline = time.time() + 10
    while r.info("clients")["blocked_clients"] != 1:
        assert time.time() < deadline
        time.sleep(0.02)
    assert r.swapdb(1, 9)
    w.join(10)
    assert got["v"] == ("k", "hello")
    assert r.hgetall("h") == {} and r.dbsize() == 0
    r9 = strata.client(db=9, decode_responses=True)
    assert r9.hgetall("h") == {"f": "v"} and r9.dbsize() == 1
    with pytest.raises(redis.ResponseError, match="DB index is out of range"):
        r.swapdb(0, 16)
    with pytest.raises(redis.ResponseError, match="invalid first DB index"):
        r.execute_command("SWAPDB", "x", 1)


def test_dump_and_restore_carry_every_type_and_refuse_damaged_payloads(strata):
    r = strata.client()
    r.set("s", "text")
    r.hset("h", mapping={"f1": "1", "f2": "2"})
    r.sadd("st", "a", "b")
    r.zadd("z", {"m1": 1.5, "m2": -2})
    r.rpush("l", "x", "y", "x")
    read = {
        "s": lambda k: r.get(k),
        "h": lambda k: r.hgetall(k),
        "st": lambda k: r.smembers(k),
        "z": lambda k: r.zrange(k, 0, -1, withscores=True),
        "l": lambda k: r.lrange(k, 0, -1),
    }
    for k, get in read.items():
        payload = r.dump(k)
        assert r.restore(k + ":copy", 0, payload)
        assert get(k + ":copy") == get(k) and r.type(k + ":copy") == r.type(k)
        with pytest.raises(redis.ResponseError, match="BUSYKEY"):
            r.restore(k + ":copy", 0, payload)
        damaged = bytearray(payload)
        damaged[len(damaged) // 2] ^= 1
        with pytest.raises(redis.ResponseError, match="payload version or checksum"):
            r.restore(k + ":bad", 0, bytes(damaged))
    # REPLACE over another kind, with a TTL; ABSTTL in the past creates nothing.
    assert r.restore("s", 60000, r.dump("l"), replace=True)
    assert r.type("s") == b"list" and 0 < r.pttl("s") <= 60000
    assert r.restore("gone", 1000, r.dump("h"), absttl=True)
    assert r.exists("gone") == 0
    assert r.dump("nothing") is None
    with pytest.raises(redis.ResponseError, match="Invalid TTL"):
        r.restore("x", -1, r.dump("h"))


def _payload(kind, value):
    """A `DUMP` payload of Strata's (`docs/formats.md`): kind, value, version 1, CRC-32C."""
    import google_crc32c

    body = bytes([kind]) + value + struct.pack("<H", 1)
    return body + struct.pack("<I", google_crc32c.value(body))


def test_collections_are_stored_compactly_and_the_first_encoding_is_still_read(strata):
    """The feature store's hash of short fields: each field costs its name and value and 2
    bytes (the collection values' version 2: varint lengths, an expiry only where a field
    has one), where version 1 took 16; a sorted set's whole scores and a list's elements
    are as short. Values in version 1, as a store written before holds them, are read, and
    a write stores them in version 2."""
    r = strata.client()
    fields = {f"f{j}": f"{j:08d}" for j in range(20)}
    r.hset("h", mapping=fields)
    # A payload is kind u8 | the stored value | version u16 | CRC-32C u32.
    stored = lambda key: r.dump(key)[1:-6]
    assert len(stored("h")) == 2 + sum(2 + len(n) + len(v) for n, v in fields.items())
    r.hpexpire("h", 60_000, "f3")
    assert len(stored("h")) == 2 + sum(2 + len(n) + len(v) for n, v in fields.items()) + 8
    r.zadd("z", {f"m{j}": j * 10 for j in range(6)})
    r.zadd("z", {"half": 0.5, "neg": -0.0})
    assert len(stored("z")) == 2 + 6 * (2 + 2) + (9 + 4) + (9 + 3)
    assert r.zrange("z", 0, -1, withscores=True)[:3] == [(b"m0", 0.0), (b"neg", -0.0), (b"half", 0.5)]
    r.rpush("l", *[f"e{j}" for j in range(20)])
    r.sadd("s", *[f"e{j}" for j in range(20)])
    for key in ("l", "s"):
        assert len(stored(key)) == 2 + sum(1 + len(f"e{j}") for j in range(20))

    # Version 1: count u32, a u32 for every length, a hash field's expiry u64 always.
    v1_hash = bytes([1]) + struct.pack("<I", 2)
    for name, value, expire_ms in [(b"a", b"1", 0), (b"b", b"22", 4102444800000)]:
        v1_hash += struct.pack("<IIQ", len(name), len(value), expire_ms) + name + value
    v1_members = bytes([1]) + struct.pack("<I", 2) + b"".join(
        struct.pack("<I", len(m)) + m for m in (b"x", b"yy")
    )
    v1_zset = bytes([1]) + struct.pack("<I", 2) + b"".join(
        struct.pack("<dI", score, len(m)) + m for score, m in ((-1.5, b"lo"), (7.0, b"hi"))
    )
    assert r.restore("h1", 0, _payload(1, v1_hash))
    assert r.restore("s1", 0, _payload(2, v1_members))
    assert r.restore("z1", 0, _payload(3, v1_zset))
    assert r.restore("l1", 0, _payload(4, v1_members))
    assert r.hgetall("h1") == {b"a": b"1", b"b": b"22"}
    assert r.hexpiretime("h1", "a", "b") == [-1, 4102444800]
    assert r.smembers("s1") == {b"x", b"yy"}
    assert r.zrange("z1", 0, -1, withscores=True) == [(b"lo", -1.5), (b"hi", 7.0)]
    assert r.lrange("l1", 0, -1) == [b"x", b"yy"]
    assert stored("h1") == v1_hash, "kept as it was until written"
    r.hset("h1", "c", "3")
    r.sadd("s1", "z")
    r.zadd("z1", {"mid": 2})
    r.rpush("l1", "z")
    assert stored("h1") == bytes([2, 3]) + b"\x02\x01a1" + b"\x03\x02" + struct.pack(
        "<Q", 4102444800000
    ) + b"b22" + b"\x02\x01c3"
    assert stored("s1") == bytes([2, 3, 1]) + b"x" + bytes([2]) + b"yy" + bytes([1]) + b"z"
    assert stored("l1") == stored("s1")
    assert r.zrange("z1", 0, -1, withscores=True) == [(b"lo", -1.5), (b"mid", 2.0), (b"hi", 7.0)]
    assert stored("z1")[:2] == bytes([2, 3]) and len(stored("z1")) == 2 + 11 + 5 + 4


def test_a_list_larger_than_dram_is_demoted_and_read_back(tiny_strata):
    r = tiny_strata.client(decode_responses=True)
    p = r.pipeline(transaction=False)
    for i in range(300):
        p.rpush(f"list:{i:03d}", *[f"{i}-{j}-" + "y" * 30 for j in range(40)])
    p.execute()
    deadline = time.time() + 30
    while int(r.info("strata")["cold_entries"]) < 50:
        assert time.time() < deadline, "no list reached the cold tier"
        time.sleep(0.1)
    for i in range(300):
        assert r.lrange(f"list:{i:03d}", 0, -1) == [f"{i}-{j}-" + "y" * 30 for j in range(40)]
    assert r.type("list:000") == "list"


def test_sort_by_and_get_patterns_read_other_keys(strata):
    r = strata.client(decode_responses=True)
    r.rpush("ids", 3, 1, 2)
    r.mset({"w_1": 30, "w_2": 10, "w_3": 20, "name_1": "one", "name_2": "two"})
    r.hset("h_3", "n", "three")
    assert r.sort("ids", by="w_*") == ["2", "3", "1"]
    assert r.sort("ids", by="w_*", desc=True, start=0, num=2) == ["1", "3"]
    assert r.sort("ids", by="w_*", get=["#", "name_*", "h_*->n"]) == [
        "2", "two", None, "3", None, "three", "1", "one", None]
    # A constant BY reads no key: a list keeps its order, a set is ordered by bytes.
    assert r.sort("ids", by="nosort") == ["3", "1", "2"]
    r.sadd("s", "b", "c", "a")
    assert r.sort("s", by="nosort") == ["a", "b", "c"]
    assert r.sort("ids", by="w_*", get="name_*", store="out") == 3
    assert r.lrange("out", 0, -1) == ["two", "", "one"]
    r.set("w_2", "x")
    with pytest.raises(redis.ResponseError, match="can't be converted"):
        r.sort("ids", by="w_*")


def test_collections_changed_in_place_are_seen_by_every_other_command(strata):
    """A collection's writes change it in place in memory (a live value, stored when the
    logs are written out): every other command sees the newest state at once, and a write
    of another kind replaces it."""
    r = strata.client(decode_responses=True)
    before = int(r.info("strata")["live_writes"])
    r.hset("h", mapping={"a": "1", "b": "2"})
    r.sadd("s", "x", "y")
    r.rpush("l", "1", "2", "3")
    r.zadd("z", {"m": 1.5})
    assert int(r.info("strata")["live_writes"]) >= before + 4
    assert [r.type(k) for k in ("h", "s", "l", "z")] == ["hash", "set", "list", "zset"]
    assert r.exists("h", "s", "l", "z") == 4 and r.dbsize() == 4
    assert sorted(r.scan_iter(_type="hash")) == ["h"]
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        r.get("h")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        r.incr("l")
    # Copies, renames and dumps carry the newest state.
    r.hset("h", "c", "3")
    assert r.copy("h", "h2") and r.hgetall("h2") == {"a": "1", "b": "2", "c": "3"}
    r.rpush("l", "4")
    r.rename("l", "l2")
    assert r.lrange("l2", 0, -1) == ["1", "2", "3", "4"] and not r.exists("l")
    r.sadd("s", "z")
    dumped = r.dump("s")
    r.restore("s2", 0, dumped)
    assert r.smembers("s2") == {"x", "y", "z"}
    # Expiry and deletion of a live key.
    r.zadd("z", {"n": 2})
    assert r.expire("z", 100) and 0 < r.ttl("z") <= 100
    r.zadd("z", {"o": 3})
    assert 0 < r.ttl("z") <= 100 and r.zcard("z") == 3
    r.sadd("s", "w")
    assert r.delete("s") == 1 and r.smembers("s") == set() and not r.exists("s")
    # A write of another kind replaces the live value; writes after it see the string.
    r.hset("h", "d", "4")
    r.set("h", "now a string")
    assert r.get("h") == "now a string"
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        r.hset("h", "e", "5")
    # Popping the last element deletes the key.
    r.rpush("q", "only")
    assert r.lpop("q") == "only" and not r.exists("q")
    r.sadd("t", "a")
    r.flushdb()
    assert r.dbsize() == 0 and r.smembers("t") == set()
    r.sadd("t", "b")
    assert r.smembers("t") == {"b"}


def test_reads_of_a_collection_read_again_answer_from_its_live_value(tmp_path):
    """A collection read a second time running is decoded once and kept in memory (a live
    value): later reads answer from it (the `live_reads` figure counts them) exactly as from
    the stored value, and see every write, an expiry and another kind at once."""
    p = StrataProcess(data_dir=str(tmp_path))
    try:
        r = p.client(decode_responses=True)
        members = [f"m{i:03d}" for i in range(100)]
        r.sadd("s", *members)
        r.hset("h", mapping={f"f{i}": f"v{i}" for i in range(50)})
        r.rpush("l", *members)
        r.zadd("z", {m: i for i, m in enumerate(members)})
        r.shutdown(nosave=True)
    except redis.ConnectionError:
        pass
    p.proc.wait()
    p = StrataProcess(data_dir=str(tmp_path))
    try:
        r = p.client(decode_responses=True)

        def live_reads():
            return int(r.info("strata")["live_reads"])

        def answers():
            return [
                bool(r.sismember("s", "m042")), bool(r.sismember("s", "nope")),
                [bool(x) for x in r.smismember("s", ["m000", "x", "m099"])], r.scard("s"),
                r.hget("h", "f7"), r.hget("h", "nope"), r.hmget("h", ["f1", "x", "f49"]),
                r.hgetall("h"), r.hlen("h"), bool(r.hexists("h", "f3")),
                r.lrange("l", 0, 4), r.lrange("l", -3, -1), r.lindex("l", -1), r.llen("l"),
                r.zrange("z", 0, 2, withscores=True), r.zrevrange("z", 0, 1),
                r.zrangebyscore("z", 10, 12), r.zrange("z", "[m010", "(m013", bylex=True),
                r.zscore("z", "m005"), r.zmscore("z", ["m001", "x"]), r.zcard("z"),
            ]

        expected = [
            True, False, [True, False, True], 100,
            "v7", None, ["v1", None, "v49"], {f"f{i}": f"v{i}" for i in range(50)}, 50, True,
            members[:5], members[-3:], "m099", 100,
            [("m000", 0.0), ("m001", 1.0), ("m002", 2.0)], ["m099", "m098"],
            ["m010", "m011", "m012"], ["m010", "m011", "m012"], 5.0, [1.0, None], 100,
        ]
        # Nothing is live after the restart: a first read decodes the stored value.
        before = live_reads()
        assert [r.scard("s"), r.hlen("h"), r.llen("l"), r.zcard("z")] == [100, 50, 100, 100]
        assert live_reads() == before
        # Read again: from the live value, alike.
        assert answers() == expected
        assert live_reads() >= before + len(expected) - 4
        # Writes change the live value; reads see them at once.
        r.srem("s", "m042")
        r.hset("h", "f7", "changed")
        r.lpush("l", "head")
        r.zadd("z", {"m000": 1000})
        now = answers()
        assert not now[0] and now[3] == 99 and now[4] == "changed"
        assert now[10][0] == "head" and now[13] == 101 and now[14][0] == ("m001", 1.0)
        # Another kind, read through a live value's key, and an expiry.
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            r.hget("s", "x")
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            r.lrange("z", 0, 1)
        r.pexpire("s", 50)
        time.sleep(0.2)
        assert not r.sismember("s", "m001") and r.scard("s") == 0 and not r.exists("s")
        r.set("h", "a string")
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            r.hget("h", "f1")
    finally:
        p.stop()


def test_parts_read_alike_lent_from_dram_or_shared_from_the_tiers(tiny_strata):
    """A read that answers with parts of a collection borrows the value where DRAM holds
    it (copying out only the parts) and shares it where a tier hands it over: both answer
    the same bytes, for every kind, before and after the value leaves DRAM."""
    r = tiny_strata.client()
    blob = bytes(range(256))
    r.hset("h", mapping={"": "", "bin": blob, "x": "1"})
    r.rpush("l", "", blob, "tail")
    r.sadd("s", "", blob)
    r.zadd("z", {blob: 1.5, "": 2, "m": 3})

    def check():
        assert r.hmget("h", ["", "bin", "missing"]) == [b"", blob, None]
        assert r.hgetall("h") == {b"": b"", b"bin": blob, b"x": b"1"}
        assert r.lrange("l", 0, -1) == [b"", blob, b"tail"] and r.lindex("l", 1) == blob
        assert r.smismember("s", ["", "zz", blob]) == [1, 0, 1] and r.scard("s") == 2
        assert r.zrange("z", 0, -1, withscores=True) == [(blob, 1.5), (b"", 2.0), (b"m", 3.0)]
        assert r.zscore("z", blob) == 1.5 and r.zrank("z", "m") == 2 and r.zcard("z") == 3

    check()
    hits = int(r.info("strata")["hot_hits"])
    check()
    assert int(r.info("strata")["hot_hits"]) > hits, "the second reads were not DRAM hits"
    # Push them out of DRAM (64 KiB) and down the tiers, then read them from there.
    for i in range(2000):
        r.set(f"filler:{i}", b"f" * 1000)
        r.get(f"filler:{i}")
        r.get(f"filler:{i}")
    misses_before = int(r.info("strata")["warm_hits"]) + int(r.info("strata")["cold_hits"])
    check()
    assert int(r.info("strata")["warm_hits"]) + int(r.info("strata")["cold_hits"]) > misses_before


def test_strata_range_reads_versioned_features_newest_first_from_every_tier(tiny_strata):
    """STRATA.RANGE over `feature:entity:version` string keys: bounds as in ZRANGEBYLEX,
    LIMIT and REV, values from DRAM, the warm and the cold tier, other kinds and other
    databases passed over, bad arguments refused."""
    r = tiny_strata.client()
    p = r.pipeline(transaction=False)
    for e in range(40):
        for v in range(10):
            p.set(f"feature:e{e:02d}:v{v:02d}", f"{e}-{v}-".encode() + b"x" * 1000)
    p.execute()
    deadline = time.time() + 30
    while int(r.info("strata")["cold_entries"]) < 100:
        assert time.time() < deadline, "no key reached the cold tier"
        time.sleep(0.1)
    # The newest versions of one entity written last are in DRAM.
    r.set("feature:e39:v10", b"39-10-" + b"x" * 1000)
    r.hset("feature:e05:v99", "not", "a string")
    r.select(1)
    r.set("feature:e05:v50", "another database")
    r.select(0)

    # Where the keys are before the reads below (a read may move a key up).
    names = [f"feature:e{e:02d}:v{v:02d}" for e in range(40) for v in range(10)] + ["feature:e39:v10"]
    tiers = {r.execute_command("TIER", k) for k in names}
    assert {b"hot", b"warm", b"cold"} <= tiers, tiers

    def pairs(reply):
        return [(reply[i].decode(), reply[i + 1][:6].decode()) for i in range(0, len(reply), 2)]

    newest = r.execute_command("STRATA.RANGE", "[feature:e05:\xff", "[feature:e05:", "REV", "LIMIT", 2)
    assert pairs(newest) == [("feature:e05:v09", "5-9-xx"), ("feature:e05:v08", "5-8-xx")]
    whole = r.execute_command("STRATA.RANGE", "(feature:e05:v02", "[feature:e05:v05")
    assert pairs(whole) == [(f"feature:e05:v{v:02d}", f"5-{v}-xx") for v in (3, 4, 5)]
    everything = r.execute_command("STRATA.RANGE", "-", "+")
    assert [everything[i].decode() for i in range(0, len(everything), 2)] == names
    assert pairs(r.execute_command("STRATA.RANGE", "+", "-", "REV", "LIMIT", 1)) == [("feature:e39:v10", "39-10-")]
    assert r.execute_command("STRATA.RANGE", "+", "-") == []
    assert r.execute_command("STRATA.RANGE", "-", "+", "LIMIT", 0) == []
    for bad, why in [
        (["a", "+"], "not valid string range item"),
        (["-", "+", "LIMIT", "-1"], "LIMIT must be"),
        (["-", "+", "LIMIT", "x"], "not an integer"),
        (["-", "+", "SIDEWAYS"], "syntax error"),
    ]:
        with pytest.raises(redis.ResponseError, match=why):
            r.execute_command("STRATA.RANGE", *bad)


@pytest.mark.parametrize("durability", ["group", "none"])
def test_large_collections_log_their_changes_as_deltas_and_survive_a_kill(tmp_path, durability):
    """A large hash, set, sorted set or list changed a few items at a time has each group commit
    (`group`) or flush tick (`none`) log only the items changed (a delta after the value
    logged whole once), not the whole value again; the hot log is compacted and settled in
    between, and after a SIGKILL every acknowledged change is there (with `none`, once its
    tick passed), list elements in their order (a large hash's fields in any: a removal
    moves its last field into the gap, as Redis's table keeps no order either)."""
    import random

    settings = {"hot_bytes_max": "4MiB", "background_interval_ms": 50, "durability": durability}
    if durability == "none":
        settings["none_flush_ms"] = 20  # a tick every few dozen commands
    p = StrataProcess(settings, data_dir=str(tmp_path))
    rng = random.Random(18)
    hash_model = {f"f{i}": f"v{i}" for i in range(3000)}
    set_model = {f"m{i}" for i in range(3000)}
    zset_model = {f"z{i}": float(i) for i in range(3000)}
    list_model = [f"e{i}" for i in range(3000)]
    try:
        r = p.client(decode_responses=True)
        pipe = r.pipeline(transaction=False)
        items = list(hash_model.items())
        for i in range(0, 3000, 500):
            pipe.hset("h", mapping=dict(items[i : i + 500]))
            pipe.sadd("s", *[f"m{j}" for j in range(i, i + 500)])
            pipe.zadd("z", {f"z{j}": float(j) for j in range(i, i + 500)})
            pipe.rpush("l", *list_model[i : i + 500])
        pipe.execute()
        before = r.info("strata")
        for step in range(2000):
            op = rng.randrange(13)
            n = rng.randrange(4000)
            if op == 0:
                r.hset("h", f"f{n}", f"w{step}")
                hash_model[f"f{n}"] = f"w{step}"
            elif op == 1:
                assert r.hdel("h", f"f{n}", f"f{n + 1}") == sum(
                    hash_model.pop(k, None) is not None for k in (f"f{n}", f"f{n + 1}")
                )
            elif op == 2:
                assert r.sadd("s", f"m{n}") == (f"m{n}" not in set_model)
                set_model.add(f"m{n}")
            elif op == 3:
                assert r.srem("s", f"m{n}") == (f"m{n}" in set_model)
                set_model.discard(f"m{n}")
            elif op == 4:
                for m in r.spop("s", 2):
                    set_model.remove(m)
            elif op == 5:
                r.zadd("z", {f"z{n}": float(n % 97)})
                zset_model[f"z{n}"] = float(n % 97)
            elif op == 6:
                assert r.zrem("z", f"z{n}") == (zset_model.pop(f"z{n}", None) is not None)
            elif op == 7:
                for m, _ in r.zpopmin("z", 1) + r.zpopmax("z", 1):
                    del zset_model[m]
            elif op == 9:
                r.lpush("l", f"h{step}", f"i{step}")
                list_model[:0] = [f"i{step}", f"h{step}"]
            elif op == 10:
                r.rpush("l", f"t{step}")
                list_model.append(f"t{step}")
            elif op == 11:
                assert r.lpop("l") == list_model.pop(0) and r.rpop("l") == list_model.pop()
            elif op == 12:
                i = n % len(list_model)
                r.lset("l", i, f"s{step}")
                list_model[i] = f"s{step}"
                if step % 100 == 0:
                    # A trim of both ends, and now and then a change deltas do not say.
                    r.ltrim("l", 1, -2)
                    list_model = list_model[1:-1]
                    r.linsert("l", "BEFORE", list_model[5], f"x{step}")
                    list_model.insert(5, f"x{step}")
                if step % 5 == 0:
                    # An insert and a removal inside the list (deltas say them too).
                    pivot = list_model[n % len(list_model)]
                    assert r.linsert("l", "AFTER", pivot, f"y{step}") == len(list_model) + 1
                    list_model.insert(list_model.index(pivot) + 1, f"y{step}")
                    gone = list_model[(n * 7) % len(list_model)]
                    assert r.lrem("l", 1, gone) == 1
                    list_model.remove(gone)
            else:
                # Plain writes that fill the hot log: first a few keys over and over (its
                # file grows, a compaction), then many (dirty values pass their budget,
                # the colder half settles into the warm store).
                keys = 10 if step < 750 else 200
                r.set(f"pad{n % keys}", "x" * 40_000)
                if durability == "none" and step < 750:
                    # A tick logs a key once however often it was written: two more keys
                    # and a tick's wait, so the file passes its size however fast the
                    # server runs.
                    r.mset({f"pad{(n + i) % keys}": "y" * 40_000 for i in (1, 2)})
                    time.sleep(0.03)
        # A set emptied after its deltas were logged goes, and stays gone.
        r.sadd("gone", *[f"g{i}" for i in range(200)])
        for i in range(5):
            r.srem("gone", f"g{i}")
        assert len(r.spop("gone", 195)) == 195 and not r.exists("gone")
        after = r.info("strata")
        assert r.hgetall("h") == hash_model
        assert r.lrange("l", 0, -1) == list_model
        deltas = after["live_deltas"] - before.get("live_deltas", 0)
        assert deltas > (500 if durability == "group" else 20), after
        background = {k: after[k] for k in ("hot_log_compactions", "write_back_settles")}
        assert all(n > 0 for n in background.values()), background
        if durability == "none":
            time.sleep(0.5)  # past `none_flush_ms`: what a kill may lose
    finally:
        p.stop()
    p = StrataProcess(settings, data_dir=str(tmp_path))
    try:
        r = p.client(decode_responses=True)
        assert r.hgetall("h") == hash_model
        assert r.smembers("s") == set_model and not r.exists("gone")
        assert r.lrange("l", 0, -1) == list_model
        assert r.zrange("z", 0, -1, withscores=True) == sorted(
            zset_model.items(), key=lambda e: (e[1], e[0])
        )
    finally:
        p.stop()


def test_linsert_and_lrem_in_a_large_list_log_deltas_not_the_whole_list(tmp_path):
    """`LINSERT` and `LREM` inside a large list change it in place and each commit logs what
    they did (an insert, removals by index), not the list again; the list reads back in
    order after them, also after a SIGKILL."""
    p = StrataProcess({"durability": "group"}, data_dir=str(tmp_path))
    try:
        r = p.client(decode_responses=True)
        model = [f"e{i % 50}" for i in range(5000)]
        r.rpush("l", *model)
        r.lset("l", 0, "e0")  # a first delta after the list's first whole record
        before = r.info("strata")
        assert r.linsert("l", "AFTER", "e7", "new") == 5001
        model.insert(model.index("e7") + 1, "new")
        assert r.lrem("l", -3, "e9") == 3
        for _ in range(3):
            i = len(model) - 1 - model[::-1].index("e9")
            del model[i]
        assert r.lrem("l", 0, "e11") == 100
        model = [e for e in model if e != "e11"]
        after = r.info("strata")
        assert after["live_deltas"] - before["live_deltas"] == 3, (before, after)
        assert after["live_folds"] == before["live_folds"], "the list was logged whole"
        assert r.lrange("l", 0, -1) == model
    finally:
        p.stop()  # SIGKILL
    p = StrataProcess({"durability": "group"}, data_dir=str(tmp_path))
    try:
        assert p.client(decode_responses=True).lrange("l", 0, -1) == model
    finally:
        p.stop()


@pytest.mark.parametrize("durability", ["group", "none"])
def test_expiry_changes_stay_in_dram_and_survive_a_kill(tmp_path, durability):
    """The feature-store write (`HSET` then `EXPIRE` of the same hash, in a pipeline) and the
    rate limiter's (`INCR` then `EXPIRE`): the expiry changes the live value or the value
    write-back holds, with no fold of the hash or write of the warm store per command; `TTL`,
    `TYPE` and `EXISTS` read the live value as it is. Expiries still expire, `PERSIST`
    holds, and after a SIGKILL every acknowledged expiry is there (with `none`, once its
    tick passed)."""
    settings = {"durability": durability}
    p = StrataProcess(settings, data_dir=str(tmp_path))
    try:
        r = p.client(decode_responses=True)
        r.hset("feat", mapping={f"f{i}": f"v{i}" for i in range(200)})
        r.hset("feat", "f0", "w")  # live from here
        before = r.info("strata")
        pipe = r.pipeline(transaction=False)
        for i in range(300):
            pipe.hset("feat", f"f{i % 50}", f"x{i}")
            pipe.expire("feat", 1000 + i)
            pipe.set(f"s{i % 20}", "v")
            pipe.expire(f"s{i % 20}", 2000 + i)
            pipe.incr("rate")
            pipe.expire("rate", 3000 + i)
        replies = pipe.execute()
        assert all(x in (0, 1, True, "OK") or isinstance(x, int) for x in replies)
        assert replies[1::2] == [True] * 900
        assert 1299 - 10 <= r.ttl("feat") <= 1299 and r.type("feat") == "hash" and r.exists("feat")
        assert 2299 - 10 <= r.ttl("s19") <= 2299 and r.get("rate") == "300"
        assert 3299 - 10 <= r.ttl("rate") <= 3299
        after = r.info("strata")
        # Before, each EXPIRE of the live hash folded it whole and let it go (the next HSET
        # decoded it again), and each EXPIRE of a string wrote the warm store.
        assert after["live_folds"] - before["live_folds"] < 30, (before, after)
        assert after["writes_back"] - before["writes_back"] >= 600 + 300, (before, after)

        # Expiry options and PERSIST on the live value; an expiry that passes.
        r.hset("brief", mapping={f"f{i}": "v" for i in range(50)})
        r.hset("brief", "f0", "w")
        assert r.expire("brief", 100, nx=True) and not r.expire("brief", 200, nx=True)
        assert not r.expire("brief", 50, gt=True) and r.expire("brief", 500, gt=True)
        assert r.persist("brief") and r.ttl("brief") == -1 and not r.persist("brief")
        assert r.expire("feat", 100, xx=True) and r.persist("feat") and r.ttl("feat") == -1
        r.expire("feat", 5000)
        r.hset("short", mapping={"a": "1", "b": "2"})
        r.hset("short", "a", "3")
        assert r.pexpire("short", 300)
        assert r.hget("short", "a") == "3" and 0 < r.pttl("short") <= 300
        time.sleep(0.5)
        assert r.hget("short", "a") is None and not r.exists("short") and r.ttl("short") == -2
        assert r.type("short") == "none"
        r.hset("short", "c", "4")  # a new hash, no expiry, nothing of the old one
        assert r.hgetall("short") == {"c": "4"} and r.ttl("short") == -1
        # A past expiry deletes the key, live or not.
        r.hset("gone", "a", "1")
        r.hset("gone", "a", "2")
        assert r.expire("gone", -1) and not r.exists("gone")
        if durability == "none":
            time.sleep(1.5)  # past `none_flush_ms`: what a kill may lose
    finally:
        p.stop()
    p = StrataProcess(settings, data_dir=str(tmp_path))
    try:
        r = p.client(decode_responses=True)
        assert 5000 - 60 <= r.ttl("feat") <= 5000
        assert r.hget("feat", "f49") == "x299" and r.hlen("feat") == 200
        assert 2299 - 60 <= r.ttl("s19") <= 2299
        assert r.get("rate") == "300" and 3299 - 60 <= r.ttl("rate") <= 3299
        assert r.ttl("brief") == -1 and r.hlen("brief") == 50
        assert r.hgetall("short") == {"c": "4"} and r.ttl("short") == -1
        assert not r.exists("gone")
    finally:
        p.stop()


def test_leaderboard_reads_use_the_live_sorted_set_without_folding_it(strata):
    """A leaderboard: a large sorted set written one member at a time, read between the
    writes for a member's rank, the top ten, a score window with LIMIT and a count, and
    popped and trimmed now and then. The reads go through the live set as it is (its runs),
    not a fold of the whole set each, and answer as a model does; so do `SMEMBERS`, `HKEYS`
    and `HVALS` of a live set and hash."""
    import random

    r = strata.client(decode_responses=True)
    rng = random.Random(24)
    model = {f"p{i}": float(i % 1000) for i in range(20_000)}
    pipe = r.pipeline(transaction=False)
    items = list(model.items())
    for i in range(0, len(items), 2000):
        pipe.zadd("board", dict(items[i : i + 2000]))
    pipe.execute()
    r.sadd("tags", *[f"t{i}" for i in range(500)])
    r.hset("feat", mapping={f"f{i}": f"v{i}" for i in range(300)})

    def ordered():
        return sorted(model.items(), key=lambda e: (e[1], e[0]))

    before = r.info("strata")
    for step in range(300):
        m = f"p{rng.randrange(25_000)}"
        score = float(rng.randrange(1000))
        r.zadd("board", {m: score})
        model[m] = score
        asc = ordered()
        rank = next(i for i, (name, _) in enumerate(asc) if name == m)
        assert r.zrank("board", m) == rank
        assert r.zrevrank("board", m) == len(asc) - 1 - rank
        assert r.zrevrange("board", 0, 9, withscores=True) == asc[::-1][:10]
        lo, hi = sorted((rng.randrange(1000), rng.randrange(1000)))
        window = [e for e in asc if lo <= e[1] <= hi]
        assert r.zcount("board", lo, hi) == len(window)
        assert r.zrangebyscore("board", lo, f"({hi + 1}", start=5, num=7) == [
            name for name, _ in window[5:12]
        ]
        assert r.zrevrangebyscore("board", hi, lo, start=3, num=4) == [
            name for name, _ in window[::-1][3:7]
        ]
        if step % 25 == 0:
            for name, _ in r.zpopmin("board", 2) + r.zpopmax("board", 1):
                del model[name]
            gone = [asc[len(asc) // 2][0], asc[7][0], "absent"]
            assert r.zrem("board", *gone) == 2
            for name in gone[:2]:
                model.pop(name, None)
            assert r.zremrangebyrank("board", 100, 102) == 3
            for name, _ in ordered()[100:103]:
                del model[name]
        r.sadd("tags", f"t{step}", f"n{step}")
        r.hset("feat", f"f{step}", f"w{step}")
    assert r.zcard("board") == len(model)
    assert r.zrange("board", 0, -1, withscores=True) == ordered()
    assert r.smembers("tags") == {f"t{i}" for i in range(500)} | {f"n{i}" for i in range(300)}
    hash_model = {f"f{i}": f"w{i}" for i in range(300)}
    assert r.hkeys("feat") == list(hash_model) and r.hvals("feat") == list(hash_model.values())
    after = r.info("strata")
    # Before, each rank, count or score read folded the changed set whole (a million
    # members' worth at a large leaderboard); now a few folds at most (the flush ticks').
    assert after["live_folds"] - before["live_folds"] < 40, (before, after)
    assert after["live_reads"] - before["live_reads"] >= 300 * 6, (before, after)


def test_scans_of_large_hashes_and_sets_page_by_count_while_members_come_and_go(strata):
    """`HSCAN` and `SSCAN` of a large hash or set answer about `COUNT` items a page (not the
    whole value at once), from its live value; a walk meets every field and member held from
    its first page to its last while others are removed and added between pages (Redis's
    promise), with their values. A small value comes in one page, as Redis's compact
    encodings do. Removals (`HDEL`, `SREM`, `SPOP`, `SMOVE`) of a large live value keep
    every other member findable."""
    import random

    rng = random.Random(7)
    r = strata.client(decode_responses=True)
    r.hset("h", mapping={f"f{i}": f"v{i}" for i in range(5000)})
    r.sadd("s", *[f"m{i}" for i in range(5000)])
    hash_model = {f"f{i}": f"v{i}" for i in range(5000)}
    set_model = {f"m{i}" for i in range(5000)}
    held_fields = {f"f{i}" for i in range(5000) if i % 4}
    held_members = {f"m{i}" for i in range(5000) if i % 4}

    def walk(scan, count, churn):
        cursor, seen, pages = 0, {}, 0
        while True:
            cursor, items = scan(cursor, count)
            cursor = int(cursor)
            assert len(items) <= count, (len(items), count)
            seen.update(items if isinstance(items, dict) else dict.fromkeys(items))
            pages += 1
            churn()
            if cursor == 0:
                return seen, pages

    def churn_hash():
        for _ in range(10):
            n = rng.randrange(7000)
            name = f"f{n}"
            if name in held_fields:
                continue
            if rng.random() < 0.5:
                assert r.hdel("h", name) == (hash_model.pop(name, None) is not None)
            else:
                r.hset("h", name, f"w{n}")
                hash_model[name] = f"w{n}"

    live_reads = int(r.info("strata")["live_reads"])
    seen, pages = walk(lambda c, n: r.hscan("h", c, count=n), 50, churn_hash)
    assert pages >= 5000 // 50, pages
    assert int(r.info("strata")["live_reads"]) >= live_reads + pages - 2, "pages read live"
    assert held_fields <= seen.keys()
    assert all(seen[f] == hash_model[f] for f in held_fields)
    assert r.hgetall("h") == hash_model

    def churn_set():
        for _ in range(10):
            m = f"m{rng.randrange(7000)}"
            if m in held_members:
                continue
            op = rng.randrange(4)
            if op == 0:
                assert r.srem("s", m) == (m in set_model)
                set_model.discard(m)
            elif op == 1:
                assert r.smove("s", "elsewhere", m) == (m in set_model)
                set_model.discard(m)
            else:
                assert r.sadd("s", m) == (m not in set_model)
                set_model.add(m)

    seen, pages = walk(lambda c, n: r.sscan("s", c, count=n), 80, churn_set)
    assert pages >= 5000 // 80, pages
    assert held_members <= seen.keys()
    assert r.smembers("s") == set_model
    # A pattern filters a page; NOVALUES leaves the values out.
    cursor, fields = r.hscan("h", 0, match="f4*", count=2000, no_values=True)
    assert fields and all(f.startswith("f4") for f in fields) and int(cursor) != 0
    # Pops and removals of many keep the rest findable.
    popped = r.spop("s", 300)
    set_model -= set(popped)
    assert len(popped) == 300 and r.scard("s") == len(set_model)
    gone = rng.sample(sorted(set_model), 500)
    assert r.srem("s", *gone) == 500
    set_model -= set(gone)
    assert all(r.smismember("s", sorted(set_model)[:2000]))
    assert r.smembers("s") == set_model
    # A small value: one page whatever the count.
    r.hset("small", mapping={f"x{i}": i for i in range(20)})
    cursor, fields = r.hscan("small", 0, count=1)
    assert int(cursor) == 0 and len(fields) == 20
    # Bad options, as Redis words them.
    with pytest.raises(redis.ResponseError, match="invalid cursor"):
        r.execute_command("HSCAN", "h", "x")
    with pytest.raises(redis.ResponseError, match="syntax error"):
        r.execute_command("SSCAN", "s", "0", "COUNT", "0")


def test_hscan_and_sscan_walks_meet_every_member_when_their_key_is_rewritten_whole(strata):
    """A walk of a large hash or set whose key is replaced whole between pages (`RENAME` of
    a copy holding the same members in another order, `SUNIONSTORE` onto it) still meets
    every member: the cursor notices the value changed under it and the walk starts over
    (members may come twice, as Redis allows)."""
    import random

    rng = random.Random(11)
    r = strata.client(decode_responses=True)
    fields = [f"f{i}" for i in range(3000)]
    r.hset("h", mapping={f: f"v-{f}" for f in fields})
    members = [f"m{i}" for i in range(3000)]
    r.sadd("s", *members)

    def walk(scan, rewrite):
        cursor, seen, pages = 0, {}, 0
        while True:
            cursor, items = scan(cursor)
            cursor = int(cursor)
            seen.update(items if isinstance(items, dict) else dict.fromkeys(items))
            pages += 1
            if pages == 10:
                rewrite()
            if cursor == 0:
                return seen, pages

    def rewrite_hash():
        shuffled = fields[:]
        rng.shuffle(shuffled)
        r.hset("h2", mapping={f: f"v-{f}" for f in shuffled})
        assert r.rename("h2", "h")

    seen, pages = walk(lambda c: r.hscan("h", c, count=100), rewrite_hash)
    assert not set(fields) - seen.keys(), f"missed {len(set(fields) - seen.keys())}"
    assert all(seen[f] == f"v-{f}" for f in fields)
    assert pages > 30, pages

    def rewrite_set():
        shuffled = members[:]
        rng.shuffle(shuffled)
        r.sadd("s2", *shuffled)
        assert r.sunionstore("s", "s2") == len(members)

    seen, pages = walk(lambda c: r.sscan("s", c, count=100), rewrite_set)
    assert not set(members) - seen.keys(), f"missed {len(set(members) - seen.keys())}"
    assert pages > 30, pages


def test_zscan_of_a_large_sorted_set_pages_and_meets_every_member_while_scores_move(strata):
    """`ZSCAN` of a large sorted set answers it in pages (about `COUNT` members each, at most
    64 pages a walk), each page in score order, and a walk meets every member held from its
    first page to its last exactly once while scores change, others come and go, and the key
    is rewritten whole (`ZUNIONSTORE` onto it) between pages; with each member's score as it
    stands."""
    import random

    rng = random.Random(11)
    r = strata.client(decode_responses=True)
    model = {f"m{i}": float(i) for i in range(10_000)}
    r.zadd("z", model)
    held = {f"m{i}" for i in range(10_000) if i % 5}
    cursor, seen, pages = 0, [], 0
    while True:
        cursor, items = r.zscan("z", cursor, count=300)
        assert 0 < len(items) <= 2 * 300, len(items)
        scores = [s for _, s in items]
        assert scores == sorted(scores), "a page is in score order"
        for m, s in items:
            assert s == model[m], (m, s, model[m])
        seen += [m for m, _ in items]
        pages += 1
        for _ in range(40):
            m = f"m{rng.randrange(12_000)}"
            if m in held or rng.random() < 0.5:
                # A new score anywhere moves the member anywhere in score order.
                model[m] = float(rng.randrange(-1_000_000, 1_000_000))
                r.zadd("z", {m: model[m]})
            else:
                r.zrem("z", m)
                model.pop(m, None)
        if pages == 10:
            r.zunionstore("z", ["z"])
        if cursor == 0:
            break
    assert 10 <= pages <= 64, pages
    counts = {}
    for m in seen:
        counts[m] = counts.get(m, 0) + 1
    assert all(counts.get(m) == 1 for m in held), [(m, counts.get(m)) for m in held if counts.get(m) != 1][:5]
    assert r.zcard("z") == len(model)
    # A pattern filters a page; a small set comes whole.
    cursor, items = r.zscan("z", 0, match="m1*", count=10_000)
    assert items and all(m.startswith("m1") for m, _ in items)
    r.zadd("small", {f"x{i}": i for i in range(20)})
    assert r.zscan("small", 0, count=1) == (0, [(f"x{i}", float(i)) for i in range(20)])
    with pytest.raises(redis.ResponseError, match="invalid cursor"):
        r.execute_command("ZSCAN", "z", "x")


def member(i):
    """The `i`th member of the large sets."""
    return f"member:{i:012d}"


# 2.4 to 3.1 MB counted when live (20 bytes a member packed as stored, 4 for its place, and
# 0.7 MB of table once it has one): more than half of a 4 MiB live budget, less than all of
# it, and past the 1 MiB of a large value.
LARGE_SET_COUNT = 100_000
LARGE_SET_MEMBERS = [member(i) for i in range(LARGE_SET_COUNT)]


def fill_large_set(r, key):
    """Adds `LARGE_SET_MEMBERS` to the set `key`, 5,000 a command."""
    for i in range(0, len(LARGE_SET_MEMBERS), 5000):
        r.sadd(key, *LARGE_SET_MEMBERS[i:i + 5000])


def test_a_large_collection_stays_decoded_between_uses_seconds_apart(tmp_path):
    """A collection of tens of thousands of members, used every few seconds, stays live (its
    decode costs milliseconds, a million members tens of them) where a small one is let go
    after a second unused; past the live values' budget the least recently used goes
    first, and the other stays; one newly in use takes an idle one's place."""

    def held():
        return int(r.info("strata")["live_values"])

    def live_reads():
        return int(r.info("strata")["live_reads"])

    def tick():
        # A write, so that a commit folds and lets go what is due.
        r.set("tick", "x")
        time.sleep(0.3)

    # hot_bytes_max 16 MiB: write-back holds half, live values half of that (4 MiB).
    p = StrataProcess({"hot_bytes_max": "16MiB"}, data_dir=str(tmp_path))
    try:
        r = p.client(decode_responses=True)
        def fill(key):
            fill_large_set(r, key)

        fill("c")  # let go when "a" is written: over the budget, the older goes
        # Written, both are live.
        fill("a")
        r.sadd("small", *LARGE_SET_MEMBERS[:50])
        assert held() == 2
        time.sleep(1.3)
        tick()
        assert held() == 1, "the small set went, the large one stayed"
        before = live_reads()
        assert r.sismember("a", member(LARGE_SET_COUNT - 1)) and r.scard("a") == LARGE_SET_COUNT
        assert live_reads() == before + 2, "read from the live set, not decoded again"
        # A second large set: over the budget, the one used longest ago goes.
        time.sleep(0.1)
        fill("b")
        tick()
        assert held() == 1
        before = live_reads()
        assert r.sismember("b", member(7))
        assert live_reads() == before + 1, "b is the one live, a was let go"
        # Read twice running, a is made live again though both do not fit: b, idle
        # longer, goes at the next fold.
        time.sleep(0.1)
        r.sismember("a", member(1))
        r.sismember("a", member(2))
        tick()
        assert held() == 1
        before = live_reads()
        assert r.sismember("a", member(3))
        assert live_reads() == before + 1, "a is live again"
        # Reads alone (no write, so no commit and no fold): b read twice running is made
        # live beside a, past the budget; c read twice running then takes a's place.
        for key in ("b", "b", "c", "c"):
            r.sismember(key, member(1))
        assert held() == 2
        before = live_reads()
        assert r.sismember("c", member(5)) and r.sismember("b", member(5))
        assert live_reads() == before + 2, "b and c are live, a was let go for c"
    finally:
        p.stop()


def test_a_large_collection_written_past_the_live_budget_goes_in_place_at_once(tmp_path):
    """Live values full (two large sets changed since their last fold), a write to a third
    large set lets the least recently used go at once, stored whole first, so the third is
    changed in place from its first write, not rewritten whole per command until the next
    fold (a million members: hundreds of milliseconds each). Nothing is lost on the way."""
    # hot_bytes_max 16 MiB: live values get 4 MiB; no `none` tick during the test.
    p = StrataProcess({"hot_bytes_max": "16MiB", "durability": "none",
                       "none_flush_ms": "60000"}, data_dir=str(tmp_path))
    try:
        r = p.client(decode_responses=True)
        def fill(key):
            fill_large_set(r, key)

        def info(field):
            return int(r.info("strata")[field])

        fill("c")
        fill("a")
        assert r.dbsize() == 2  # stores both whole; the older, c, is let go
        assert info("live_values") == 1
        fill("b")  # a and b live and changed: past the budget
        assert info("live_values") == 2
        before = info("live_writes")
        for i in range(3):
            assert r.sadd("c", f"new{i}") == 1
        assert info("live_writes") == before + 3, "c's writes went the whole-value way"
        assert info("live_values") == 2, "a, used longest ago, made room for c"
        assert [r.scard(k) for k in ("a", "b", "c")] == [LARGE_SET_COUNT] * 2 + [LARGE_SET_COUNT + 3]
        assert r.sismember("a", member(LARGE_SET_COUNT - 1)) and r.sismember("c", "new2")
    finally:
        p.stop()


def test_a_collection_larger_than_the_live_budget_is_changed_in_place_alone(tmp_path):
    """A hash whose decoded form passes the live values' budget (here 2 MiB: half of
    write-back's half of DRAM's 8 MiB) is still changed in place, alone, rather than
    decoded and stored whole by every command (a 2.5-million-field hash: 1.5 s a
    command); the collection live before it is let go. A kill loses nothing acknowledged."""
    settings = {"hot_bytes_max": "8MiB", "durability": "group"}
    p = StrataProcess(settings, data_dir=str(tmp_path))
    try:
        r = p.client(decode_responses=True)

        def info(field):
            return int(r.info("strata")[field])

        r.sadd("small", "a", "b")
        assert info("live_values") == 1
        model = {}
        for start in range(0, 120_000, 5000):
            fields = {f"f{i:06d}": f"v{i}" for i in range(start, start + 5000)}
            r.hset("big", mapping=fields)
            model.update(fields)
        assert info("live_values") == 1, "the big hash alone is live"
        assert info("live_bytes") > 2 << 20, "past the live values' shared budget"
        before = info("live_writes")
        assert r.hset("big", "f000007", "changed") == 0
        assert r.hdel("big", "f000008") == 1
        assert r.hincrby("big", "counter", 5) == 5
        model.update({"f000007": "changed", "counter": "5"})
        del model["f000008"]
        assert info("live_writes") == before + 3, "changed in place"
        # The small set goes the whole-value way meanwhile; both answer right.
        assert r.sadd("small", "c") == 1 and r.smembers("small") == {"a", "b", "c"}
        assert info("live_values") == 1
        assert r.hlen("big") == len(model) and r.hget("big", "f000007") == "changed"
    finally:
        p.stop()
    p = StrataProcess(settings, data_dir=str(tmp_path))
    try:
        r = p.client(decode_responses=True)
        assert r.hgetall("big") == model
        assert r.smembers("small") == {"a", "b", "c"}
    finally:
        p.stop()


def test_a_collection_grown_in_place_counts_its_items_bytes(strata):
    """A hash, set and list made live empty and grown by their writes count what their
    items hold once stored (the live values' budget is in bytes): 1 KiB values, not the
    few dozen bytes a live item of an empty value was first reckoned at."""
    r = strata.client()
    value = b"v" * 1024
    for start in range(0, 8000, 1000):
        p = r.pipeline(transaction=False)
        p.hset("h", mapping={f"f{i}": value for i in range(start, start + 1000)})
        p.sadd("s", *[value[:-8] + b"%08d" % i for i in range(start, start + 1000)])
        p.rpush("l", *[value] * 1000)
        p.execute()
    time.sleep(1.5)  # a group commit folds them; their next writes count them anew
    p = r.pipeline(transaction=False)
    p.hset("h", "x", "y").sadd("s", "x").rpush("l", "x")
    p.execute()
    info = r.info("strata")
    assert int(info["live_values"]) == 3
    assert int(info["live_bytes"]) > 3 * 8000 * 1024, info["live_bytes"]


def test_a_large_live_hash_and_set_cost_about_their_stored_size(strata):
    """A live hash or set keeps its items packed as its stored value holds them (a place
    and a table slot each beside): 100,000 fields of 13-byte names and 7-byte values count
    under twice their stored bytes (22 a field, 14 a member), where two `Bytes` and an
    expiry per field counted seven times. Read in place, changed, every answer as written."""
    r = strata.client(decode_responses=True)
    model = {}
    for start in range(0, 100_000, 5000):
        fields = {f"f{i:012d}": f"v{i:06d}" for i in range(start, start + 5000)}
        r.hset("h", mapping=fields)
        model.update(fields)
    r.sadd("s", *[f"m{i:012d}" for i in range(100_000)])
    time.sleep(1.5)  # a group commit folds both: they read in place from what it stored
    stored = 100_000 * (2 + 13 + 7) + 100_000 * (1 + 13)
    reads = int(r.info("strata")["live_reads"])
    assert r.hget("h", "f000000000007") == "v000007"
    assert r.hmget("h", "f000000099999", "nope") == ["v099999", None]
    assert r.sismember("s", "m000000054321")
    info = r.info("strata")
    assert int(info["live_values"]) == 2
    assert int(info["live_reads"]) == reads + 3, "read from the live values"
    assert int(info["live_bytes"]) < 2 * stored, (info["live_bytes"], stored)
    # Changes copy the items out of the stored value first; nothing read before moves.
    assert r.hset("h", "f000000000007", "longer value") == 0
    assert r.hdel("h", "f000000000008") == 1
    model["f000000000007"] = "longer value"
    del model["f000000000008"]
    assert r.srem("s", "m000000000001") == 1
    assert r.hgetall("h") == model
    assert r.scard("s") == 99_999 and not r.sismember("s", "m000000000001")


def test_smove_and_lpos_use_a_large_collections_live_value(strata):
    """`SMOVE` checks both kinds without reading either set, and `LPOS` searches the live
    list: neither folds a large live value whole (stores it) nor decodes it per command;
    replies and errors as Redis gives them."""
    r = strata.client(decode_responses=True)
    r.sadd("src", *[f"m{i}" for i in range(5000)])
    r.rpush("l", *[f"e{i % 2500}" for i in range(5000)])
    r.set("str", "x")
    folds = int(r.info("strata")["live_folds"])
    for i in range(100):
        assert r.smove("src", "dst", f"m{i}") == 1
    assert r.smove("src", "dst", "m0") == 0, "moved already"
    assert r.smove("nope", "dst", "m1") == 0
    assert r.smove("src", "src", "m300") == 1 and r.smove("src", "src", "m1") == 0
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        r.smove("src", "str", "m200")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        r.smove("str", "dst", "m200")
    assert r.scard("src") == 4900 and r.scard("dst") == 100 and r.sismember("dst", "m99")
    reads = int(r.info("strata")["live_reads"])
    assert r.lpos("l", "e2499") == 2499
    assert r.lpos("l", "e7", rank=-1) == 2507
    assert r.lpos("l", "e7", count=0) == [7, 2507]
    assert r.lpos("l", "e7", maxlen=5) is None and r.lpos("l", "absent") is None
    after = r.info("strata")
    assert int(after["live_reads"]) >= reads + 4, "LPOS read the live list"
    # The commits fold each value whole once or so; a fold per SMOVE would be 100.
    assert int(after["live_folds"]) <= folds + 6, after["live_folds"]


def test_a_large_sorted_set_read_often_from_its_parts_is_put_together_and_read_from_memory(
    tmp_path,
):
    """A sorted set stored as parts and not in memory is read from its score index at
    first: the top ten costs ten entries, not the set. Once its parts have answered 32
    reads it is put together into DRAM in the background, and later reads read no part."""
    settings = {"parts_bytes_min": "64KiB"}
    p = StrataProcess(settings, data_dir=str(tmp_path))
    try:
        r = p.client(decode_responses=True)
        pipe = r.pipeline(transaction=False)
        for at in range(0, 20000, 1000):
            pipe.zadd("z", {f"m{i:05d}": i for i in range(at, at + 1000)})
        pipe.execute()
        r.save()
    finally:
        p.stop()

    top = [(f"m{i:05d}", float(i)) for i in range(19999, 19989, -1)]
    p = StrataProcess(settings, data_dir=str(tmp_path))
    try:
        r = p.client(decode_responses=True)

        def parts_read():
            return r.info("strata")["parts_read"]

        assert r.zrevrange("z", 0, 9, withscores=True) == top
        assert parts_read() == 10
        for _ in range(40):
            assert r.zrevrange("z", 0, 9, withscores=True) == top
        deadline = time.time() + 30
        while True:
            before = parts_read()
            assert r.zrevrange("z", 0, 9, withscores=True) == top
            if parts_read() == before:
                break
            assert time.time() < deadline, f"still read from its parts: {before}"
            time.sleep(0.1)
        assert r.zscore("z", "m00005") == 5.0 and r.zcard("z") == 20000
        assert r.zrange("z", 0, 1) == ["m00000", "m00001"]
    finally:
        p.stop()


@pytest.mark.parametrize("durability", ["group", "none"])
def test_large_hashes_sets_and_sorted_sets_are_stored_as_parts_a_change_writing_what_changed(
    tmp_path, durability
):
    """A hash, set or sorted set stored past `parts_bytes_min` is kept as parts in RocksDB,
    one record per field or member: after it is filled, a change of five items writes five
    parts, not the values again. Everything reads back after a SIGKILL (with `none`, once a
    flush tick passed), in score order for the sorted set, whose range reads walk its score
    index; a field's own expiry holds, and a delete leaves nothing to read."""
    settings = {"durability": durability, "parts_bytes_min": "64KiB", "none_flush_ms": 100}
    p = StrataProcess(settings, data_dir=str(tmp_path))
    try:
        r = p.client(decode_responses=True)
        fields = {f"f{i:05d}": f"value-{i}" for i in range(20000)}
        members = {f"m{i:05d}" for i in range(20000)}
        # Scores against the members' order (parts are kept by member), some equal.
        scores = {f"m{i:05d}": float((20000 - i) // 2) for i in range(20000)}
        pipe = r.pipeline(transaction=False)
        items = list(fields.items())
        ranked = list(scores.items())
        for i in range(0, len(items), 500):
            pipe.hset("h", mapping=dict(items[i:i + 500]))
            pipe.sadd("s", *sorted(members)[i:i + 500])
            pipe.zadd("z", dict(ranked[i:i + 500]))
        pipe.execute()
        r.hset("h", "f00000", "first change")
        fields["f00000"] = "first change"
        r.save()  # every change folded (with `none`, the tick's work)
        before = r.info("strata")["parts_written"]
        assert before >= 60000, "filled past parts_bytes_min, each item was written as a part"
        assert r.hset("h", "f00001", "changed") == 0
        assert r.hdel("h", "f00002") == 1
        assert r.srem("s", "m00003") == 1
        assert r.zadd("z", {"m00004": -1.5}) == 0
        assert r.zrem("z", "m00005") == 1
        if durability == "none":
            r.save()
        fields["f00001"] = "changed"
        del fields["f00002"]
        members.discard("m00003")
        scores["m00004"] = -1.5
        del scores["m00005"]
        written = r.info("strata")["parts_written"] - before
        assert written == 5, f"five items changed, {written} parts written"
        assert r.hget("h", "f00001") == "changed" and r.hget("h", "f00002") is None
        if durability == "none":
            time.sleep(0.3)
    finally:
        p.stop()  # SIGKILL

    in_order = sorted(scores.items(), key=lambda e: (e[1], e[0]))
    p = StrataProcess(settings, data_dir=str(tmp_path))
    try:
        r = p.client(decode_responses=True)
        # Reads of a few fields or members read those parts alone.
        assert r.hmget("h", "f00001", "f00002", "f19999") == ["changed", None, "value-19999"]
        assert r.sismember("s", "m00003") == 0
        assert r.zscore("z", "m00004") == -1.5
        assert r.zmscore("z", ["m00005", "m00006"]) == [None, scores["m00006"]]
        assert r.info("strata")["parts_read"] == 7
        # Ranges walk the score index: the entries they answer with (and the changed
        # entries are where their changes put them).
        assert r.zrange("z", 0, 3, withscores=True) == in_order[:4]
        assert r.zrevrange("z", 0, 4, withscores=True) == in_order[::-1][:5]
        by_score = [m for m, s in in_order if 100 <= s <= 101]
        assert len(by_score) == 4 and r.zrangebyscore("z", 100, 101) == by_score
        assert r.zcount("z", 100, "(101") == 2
        assert r.info("strata")["parts_read"] == 7 + 4 + 5 + 4 + 2
        assert r.hlen("h") == len(fields) and r.scard("s") == len(members)
        assert r.zcard("z") == len(scores)
        assert r.hgetall("h") == fields
        assert r.smembers("s") == members
        assert r.sismember("s", "m00004") == 1
        assert r.zrank("z", "m00004") == 0
        # A field of the parted hash expires on its own.
        assert r.execute_command("HPEXPIRE", "h", 200, "FIELDS", 1, "f00005") == [1]
        time.sleep(0.4)
        assert r.hget("h", "f00005") is None and r.hexists("h", "f00005") == 0
        assert r.hget("h", "f00006") == "value-6"
        assert r.delete("h", "s", "z") == 3
        assert r.hgetall("h") == {} and r.smembers("s") == set()
        assert r.zrange("z", 0, -1) == []
        r.sadd("s", "again")
        assert r.smembers("s") == {"again"}
    finally:
        p.stop()


@pytest.mark.parametrize("durability", ["group", "none"])
def test_a_large_list_is_stored_as_parts_by_position_a_change_writing_what_moved(
    tmp_path, durability
):
    """A list stored past `parts_bytes_min` is kept as parts in RocksDB, one record per
    position: a push writes one part, a pop deletes one, an insert or a removal in the
    middle moves the elements on its shorter side. After a SIGKILL, `LRANGE` and `LINDEX`
    read the span they answer with, `LLEN` the record's count, and the whole list reads
    back as a model holds it."""
    settings = {"durability": durability, "parts_bytes_min": "64KiB", "none_flush_ms": 100}
    model = [f"e{i:05d}" for i in range(20000)]
    p = StrataProcess(settings, data_dir=str(tmp_path))
    try:
        r = p.client(decode_responses=True)
        pipe = r.pipeline(transaction=False)
        for i in range(0, len(model), 500):
            pipe.rpush("l", *model[i:i + 500])
        pipe.execute()
        r.save()
        assert r.info("strata")["parts_written"] >= 20000

        def writes(command, *args):
            before = r.info("strata")["parts_written"]
            got = r.execute_command(command, *args)
            r.save()  # folded (with `none`, the tick's work)
            return got, r.info("strata")["parts_written"] - before

        assert writes("LPUSH", "l", "h1", "h2") == (20002, 2)
        model[:0] = ["h2", "h1"]
        assert writes("RPOP", "l") == ("e19999", 1)
        model.pop()
        assert writes("LSET", "l", 100, "set") == (True, 1)
        model[100] = "set"
        # Three elements stand before it: they move one towards the head.
        assert writes("LINSERT", "l", "BEFORE", "e00001", "ins") == (20002, 4)
        model.insert(3, "ins")
        # Five stand before this one.
        assert writes("LREM", "l", 1, "e00002") == (1, 6)
        model.remove("e00002")
        # Near the tail: the two after it move.
        assert writes("LREM", "l", 1, "e19996") == (1, 3)
        model.remove("e19996")
        # Inserts in the middle that would move more elements than the list holds: the
        # list is written whole instead, once.
        before = r.info("strata")["parts_written"]
        tx = r.pipeline(transaction=True)
        for at in ("e08000", "e09000", "e10000", "e11000", "e12000"):
            tx.linsert("l", "AFTER", at, f"mid-{at}")
            model.insert(model.index(at) + 1, f"mid-{at}")
        tx.execute()
        r.save()
        assert r.info("strata")["parts_written"] - before == len(model)
        if durability == "none":
            time.sleep(0.3)
    finally:
        p.stop()  # SIGKILL

    p = StrataProcess(settings, data_dir=str(tmp_path))
    try:
        r = p.client(decode_responses=True)

        def parts_read():
            return r.info("strata")["parts_read"]

        assert r.lrange("l", 0, 9) == model[:10]
        assert r.lindex("l", -1) == model[-1] and r.lindex("l", 100) == "set"
        assert r.lrange("l", -3, -1) == model[-3:]
        assert r.lindex("l", 99999) is None and r.lrange("l", 5, 2) == []
        assert parts_read() == 10 + 1 + 1 + 3
        assert r.llen("l") == len(model)
        assert parts_read() == 15, "LLEN reads the record's count"
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            r.zrange("l", 0, 1)
        assert r.lrange("l", 0, -1) == model
        # Made live from its parts by a write, then read from it.
        assert r.rpush("l", "last") == len(model) + 1
        model.append("last")
        assert r.lrange("l", -2, -1) == model[-2:]
        assert r.lpos("l", "ins") == 3
        assert r.delete("l") == 1
        assert r.lrange("l", 0, -1) == [] and r.llen("l") == 0
    finally:
        p.stop()


def test_lex_ranges_of_a_large_sorted_set_of_one_score_read_their_result(tmp_path):
    """An autocomplete index: a sorted set stored as parts whose members all have score 0.
    After a restart, `ZRANGEBYLEX`, `ZREVRANGEBYLEX` (with `LIMIT`), `ZRANGE ... BYLEX` and
    `ZLEXCOUNT` walk its score index from their first member: they read the members they
    answer with, not the set."""
    settings = {"parts_bytes_min": "64KiB"}
    words = sorted(f"w{i:05d}" for i in range(20000))
    p = StrataProcess(settings, data_dir=str(tmp_path))
    try:
        r = p.client(decode_responses=True)
        pipe = r.pipeline(transaction=False)
        for at in range(0, len(words), 1000):
            pipe.zadd("words", {w: 0 for w in words[at:at + 1000]})
        pipe.execute()
        r.save()
    finally:
        p.stop()

    p = StrataProcess(settings, data_dir=str(tmp_path))
    try:
        r = p.client(decode_responses=True)

        def parts_read():
            return r.info("strata")["parts_read"]

        assert r.zrangebylex("words", "[w01000", "(w01005") == words[1000:1005]
        assert parts_read() == 5
        assert r.zrevrangebylex("words", "+", "-", start=2, num=3) == words[::-1][2:5]
        assert parts_read() == 5 + 3
        assert r.zrange("words", "(w19990", "+", bylex=True) == words[19991:]
        assert r.zlexcount("words", "[w00010", "[w00019") == 10
        assert parts_read() == 8 + 9 + 10
        assert r.zrangebylex("words", "[x", "+") == [] and r.zrangebylex("words", "+", "-") == []
    finally:
        p.stop()
