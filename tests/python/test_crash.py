"""SIGKILL the real server during concurrent writes and deletes in `sync` mode, 20 times:
after every restart each acknowledged operation is there with exact bytes, including keys
that had been demoted to the object store. In-flight operations are absent or whole."""

import os
import random
import signal
import threading
import time

import pytest
import redis

from conftest import StrataProcess

WRITERS = 3
KEYS_PER_WRITER = 120
CYCLES = 20


def writer(port, wid, seed, acked, inflight, lock, stop):
    rng = random.Random(seed)
    r = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
    seq = 0
    while not stop.is_set():
        key = f"w{wid}:{rng.randrange(KEYS_PER_WRITER):04d}"
        seq += 1
        value = None if rng.random() < 0.1 else f"{seed}:{seq}:".encode() + os.urandom(rng.randrange(200, 3000))
        with lock:
            inflight[wid] = (key, value)
        try:
            if value is None:
                r.delete(key)
            else:
                r.set(key, value)
        except (redis.ConnectionError, redis.TimeoutError):
            return
        with lock:
            acked[key] = value
            inflight[wid] = None


@pytest.mark.parametrize("durability", ["sync", "group"])
def test_sigkill_cycles_lose_no_acknowledged_write(tmp_path, durability):
    """`sync` writes every value through the warm store; `group` takes plain SETs through
    write-back (DRAM and the hot log, the warm store filled at checkpoints), so its cycles
    also kill the server between a write and its checkpoint, and during replays."""
    settings = {
        "durability": durability,
        "warm_bytes_max": 262144,
        # Three writers outrun demotion at this budget; refusals are test_faults.py's subject.
        "warm_bytes_hard_max": "64MiB",
        "hot_bytes_max": 65536,
        "background_interval_ms": 50,
        "block_bytes": 8192,
    }
    acked = {}
    checked = 0
    saw_cold = False
    rng = random.Random(int(os.environ.get("STRATA_SEED", time.time_ns())))
    data_dir = str(tmp_path / "data")
    for cycle in range(CYCLES + 1):
        proc = StrataProcess(settings, data_dir=data_dir)
        r = redis.Redis(host="127.0.0.1", port=proc.port)
        inflight = [None] * WRITERS
        # Check everything acknowledged so far (the previous cycle's in-flight writes may
        # have landed or not, but never torn).
        for key, want in acked.items():
            got = r.get(key)
            pending = [op for op in last_inflight if op and op[0] == key] if cycle else []
            if pending and got == pending[0][1]:
                acked[key] = got
                continue
            assert got == want, f"cycle {cycle}: {key} lost or torn"
            checked += 1
        saw_cold |= int(r.info("strata")["cold_entries"]) > 0
        if cycle == CYCLES:
            proc.stop()
            break
        lock = threading.Lock()
        stop = threading.Event()
        threads = [
            threading.Thread(target=writer, args=(proc.port, w, rng.randrange(1 << 30), acked, inflight, lock, stop))
            for w in range(WRITERS)
        ]
        for t in threads:
            t.start()
        time.sleep(rng.uniform(0.3, 0.9))
        proc.proc.send_signal(signal.SIGKILL)
        proc.proc.wait()
        stop.set()
        for t in threads:
            t.join(timeout=30)
        last_inflight = list(inflight)
    print(f"{durability}: checked {checked} acknowledged keys over {CYCLES} SIGKILL cycles")
    assert checked > 1000
    assert saw_cold, "no key reached the cold tier during the crash cycles"


def killed_and_restarted(p, settings, data_dir):
    """SIGKILLs the server `p` and starts a new one on the same data."""
    p.proc.send_signal(signal.SIGKILL)
    p.proc.wait()
    p.stop()
    return StrataProcess(settings, data_dir=str(data_dir))


def lost_ms_after_restart(settings, data_dir, acked, killed_at, flush_ms, slack_ms):
    """Restarts a SIGKILLed server on `data_dir` and reads back `acked` (key, value, time
    acknowledged): no value may be wrong and none lost that was acknowledged more than
    `flush_ms` + `slack_ms` before `killed_at`. Returns how far back the losses reach, ms."""
    p = StrataProcess(settings, data_dir=str(data_dir))
    try:
        c = p.client(socket_timeout=30)
        got = []
        for j in range(0, len(acked), 500):
            got += c.mget([k for k, _, _ in acked[j : j + 500]])
    finally:
        p.stop()
    wrong = [k for (k, v, _), g in zip(acked, got) if g is not None and g != v]
    assert not wrong, f"values corrupted after SIGKILL: {wrong[:5]}"
    lost = [(k, t) for (k, _, t), g in zip(acked, got) if g is None]
    too_old = [k for k, t in lost if (killed_at - t) * 1000 > flush_ms + slack_ms]
    assert not too_old, (
        f"lost {len(too_old)} of {len(acked)} writes acknowledged more than {flush_ms} + "
        f"{slack_ms} ms before the kill, e.g. {too_old[:3]}"
    )
    return max(((killed_at - t) * 1000 for _, t in lost), default=0.0)


def test_durability_none_loses_at_most_none_flush_ms_of_writes_on_sigkill(tmp_path):
    """`durability=none` keeps the write-ahead log in the process and hands it to the OS
    every `none_flush_ms`: a SIGKILL loses at most the writes acknowledged in that last
    stretch (plus scheduling slack), never an older one, and never leaves a wrong value.
    (Within that stretch what survives need not be a prefix: a tick logs each key's value
    as DRAM holds it then, key by key.)"""
    flush_ms, slack_ms = 200, 500
    settings = {"durability": "none", "none_flush_ms": flush_ms}
    lost_ms = []
    for cycle in range(3):
        d = tmp_path / f"c{cycle}"
        p = StrataProcess(settings, data_dir=str(d))
        c = p.client(socket_timeout=10)
        acked = []
        stop_at = time.monotonic() + 2.0
        i = 0
        while time.monotonic() < stop_at:
            k, v = f"n{i:07}", f"{cycle}:{i}:".encode() * 8
            c.set(k, v)
            acked.append((k, v, time.monotonic()))
            i += 1
        killed_at = time.monotonic()
        p.proc.send_signal(signal.SIGKILL)
        p.proc.wait()
        p.stop()
        lost_ms.append(lost_ms_after_restart(settings, d, acked, killed_at, flush_ms, slack_ms))
    print(f"durability=none, none_flush_ms={flush_ms}: lost the last {', '.join(f'{x:.0f}' for x in lost_ms)} ms of acknowledged writes")


def test_durability_none_bound_holds_beside_a_pipelined_writer_and_busy_readers(tmp_path):
    """The `none` hand-off runs at the background work's priority so that a busy core
    serves requests first; the bound must hold anyway: with a pipelined writer and readers
    keeping the server busy, past half a period writes wait for a late hand-off, and past a
    whole period it goes on at a client's priority. A SIGKILL then loses only writes
    acknowledged in the last period (plus slack), and no value is wrong."""
    flush_ms, slack_ms, batch = 200, 500, 200
    settings = {"durability": "none", "none_flush_ms": flush_ms}
    p = StrataProcess(settings, data_dir=str(tmp_path / "data"))
    stop = threading.Event()

    def reader():
        r = p.client(socket_timeout=30)
        try:
            while not stop.is_set():
                r.mget([f"p{i:07}" for i in range(0, 2000, 20)])
        except redis.ConnectionError:
            assert stop.is_set(), "a reader lost the server before the kill"

    readers = [threading.Thread(target=reader, daemon=True) for _ in range(2)]
    for t in readers:
        t.start()
    c = p.client(socket_timeout=30)
    acked, i = [], 0
    stop_at = time.monotonic() + 3.0
    while time.monotonic() < stop_at:
        pipe = c.pipeline(transaction=False)
        keys = []
        for _ in range(batch):
            k, v = f"p{i:07}", f"{i}:".encode() * 100
            pipe.set(k, v)
            keys.append((k, v))
            i += 1
        pipe.execute()
        now = time.monotonic()
        acked += [(k, v, now) for k, v in keys]
    killed_at = time.monotonic()
    stop.set()
    p.proc.send_signal(signal.SIGKILL)
    p.proc.wait()
    for t in readers:
        t.join(timeout=30)
    p.stop()
    lost_ms = lost_ms_after_restart(
        settings, tmp_path / "data", acked, killed_at, flush_ms, slack_ms
    )
    print(f"{len(acked)} pipelined writes beside two readers: lost the last {lost_ms:.0f} ms")


def test_durability_none_logs_a_key_once_per_tick_and_never_replays_an_older_value(tmp_path):
    """With `durability=none` a write logs nothing itself: each flush tick logs every
    written key's value as DRAM holds it then, so a key overwritten many times within a
    tick costs one record (the hot log stays far smaller than the writes). A value written
    to RocksDB before its tick (DBSIZE settles write-back) must not lose, after a SIGKILL, to
    the older record of the key the hot log still holds."""
    settings = {"durability": "none", "none_flush_ms": 2000}
    d = tmp_path / "data"
    p = StrataProcess(settings, data_dir=str(d))
    try:
        c = p.client(socket_timeout=10)
        keys = [f"co:{i:03}" for i in range(200)]
        pipe = c.pipeline(transaction=False)
        for k in keys:
            pipe.set(k, b"first:" + k.encode())
        pipe.execute()
        time.sleep(2.5)  # a tick logs the first values
        written = 0
        for round in range(50):
            pipe = c.pipeline(transaction=False)
            for k in keys:
                pipe.set(k, f"r{round}:{k}".encode() * 4)
                pipe.incr("co:counter")
                written += len(k) * 4 + 16
            pipe.execute()
        assert c.dbsize() == len(keys) + 1  # settles every dirty value before its tick
        time.sleep(2.5)  # a tick hands RocksDB's log and then the hot log to the OS
        # Each record at least as large as the write it logs: without coalescing, more
        # than `written`; the writes span a tick or two.
        logged = sum(f.stat().st_size for f in (d / "hotlog").iterdir())
        assert logged * 3 < written, f"hot log {logged} bytes for {written} bytes of writes"
        p.proc.send_signal(signal.SIGKILL)
        p.proc.wait()
    finally:
        p.stop()
    p = StrataProcess(settings, data_dir=str(d))
    try:
        c = p.client(socket_timeout=10)
        assert c.mget(keys) == [f"r49:{k}".encode() * 4 for k in keys]
        assert c.get("co:counter") == str(50 * len(keys)).encode()
    finally:
        p.stop()


def check_small_writes(c):
    """What the first phase of the write-back test left, as Redis would have it."""
    assert c.get("kept") == b"v1"
    assert c.get("deleted") is None
    assert c.get("counter") == b"6"
    assert c.get("appended") == b"abcd"
    assert c.get("expiring") is None
    assert c.get("rewritten") == b"new"
    c.select(1)
    assert c.get("flushed") is None
    c.select(0)


def test_write_back_replays_after_sigkill_without_resurrecting_older_values(tmp_path):
    """Plain SETs go to DRAM and the hot log (write-back), RocksDB filled behind them. A
    SIGKILL before any checkpoint: the restart replays the hot log, and a key that another
    write changed afterwards through RocksDB (DEL, INCR, APPEND, EXPIRE, FLUSHALL) keeps
    that write, never the older SET the log still holds. With a small DRAM budget the
    write-back budget fills, checkpoints run and later SETs fall through to RocksDB; every
    acknowledged value reads back after the kill either way."""
    data_dir = str(tmp_path / "data")
    settings = {"durability": "group", "hot_bytes_max": "1MiB"}
    p = StrataProcess(settings, data_dir=data_dir)
    try:
        c = p.client(socket_timeout=10)
        opened = int(c.info("strata")["checkpoints"])  # the one after replay at open
        c.set("kept", "v1")
        c.set("deleted", "v1")
        c.delete("deleted")
        c.set("counter", "5")
        assert c.incr("counter") == 6
        c.set("appended", "ab")
        c.append("appended", "cd")
        c.set("expiring", "x")
        c.pexpire("expiring", 1)
        c.set("rewritten", "old")
        c.delete("rewritten")
        c.set("rewritten", "new")
        c.select(1)
        c.set("flushed", "v")
        c.flushdb()
        c.select(0)
        assert int(c.info("strata")["checkpoints"]) == opened, "a checkpoint ran: nothing to replay"
        p.proc.send_signal(signal.SIGKILL)
        p.proc.wait()
    finally:
        p.stop()
    p = StrataProcess(settings, data_dir=data_dir)
    try:
        c = p.client(socket_timeout=10)
        check_small_writes(c)
        # Past the write-back budget (a quarter of 1 MiB): checkpoints, then fall-through.
        values = {f"bulk:{i:05}": os.urandom(300) for i in range(6000)}
        pipe = c.pipeline(transaction=False)
        for k, v in values.items():
            pipe.set(k, v)
        pipe.execute()
        info = c.info("strata")
        assert int(info["writes_back"]) > 0
        assert int(info["checkpoints"]) > 0, info
        p.proc.send_signal(signal.SIGKILL)
        p.proc.wait()
    finally:
        p.stop()
    p = StrataProcess(settings, data_dir=data_dir)
    try:
        c = p.client(socket_timeout=10)
        check_small_writes(c)
        keys = list(values)
        for j in range(0, len(keys), 500):
            got = c.mget(keys[j : j + 500])
            assert got == [values[k] for k in keys[j : j + 500]]
        assert c.dbsize() == len(values) + 4
    finally:
        p.stop()


def collection_writer(port, wid, acked, stop):
    """Adds members nobody else adds, pipelined, to one hash, set, sorted set and list
    shared by every writer (changed in place as live values); `acked` gets each batch once
    its replies are in."""
    r = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
    i = 0
    while not stop.is_set():
        p = r.pipeline(transaction=False)
        batch = [f"w{wid}:{i + j}" for j in range(8)]
        for m in batch:
            p.hset("live:h", m, m * 3)
            p.sadd("live:s", m)
            p.zadd("live:z", {m: i})
            p.rpush("live:l", m)
        try:
            p.execute()
        except (redis.ConnectionError, redis.TimeoutError):
            return
        acked.extend(batch)
        i += 8


def test_collections_changed_in_place_lose_no_acknowledged_write_on_sigkill(tmp_path):
    """With `durability=group` a collection write is acknowledged after the group commit
    that covers it, and a group commit stores the live values' changes before it syncs:
    SIGKILL during pipelined writes to one hash, set, sorted set and list loses no
    acknowledged member, in any of them, and each writer's list elements keep their order."""
    data_dir = str(tmp_path / "data")
    for cycle in range(3):
        proc = StrataProcess({"durability": "group"}, data_dir=data_dir)
        acked, stop = [], threading.Event()
        threads = [threading.Thread(target=collection_writer, args=(proc.port, f"{cycle}.{w}", acked, stop)) for w in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        # (INFO stores every live value; the kill comes well after it.)
        assert int(proc.info("strata")["live_writes"]) > 0, "collection writes did not go in place"
        time.sleep(0.5)
        proc.proc.send_signal(signal.SIGKILL)
        proc.proc.wait()
        stop.set()
        for t in threads:
            t.join(timeout=30)
        proc.stop()
        proc = StrataProcess({"durability": "group"}, data_dir=data_dir)
        try:
            r = proc.client(decode_responses=True)
            h, s = r.hgetall("live:h"), r.smembers("live:s")
            z, l = dict(r.zrange("live:z", 0, -1, withscores=True)), r.lrange("live:l", 0, -1)
        finally:
            proc.stop()
        assert acked, "no write was acknowledged"
        missing = [m for m in acked if h.get(m) != m * 3 or m not in s or m not in z or m not in l]
        assert not missing, f"cycle {cycle}: {len(missing)} acknowledged members lost, e.g. {missing[:3]}"
        for w in range(3):
            mine = [e for e in l if e.startswith(f"w{cycle}.{w}:")]
            assert mine == sorted(mine, key=lambda e: int(e.split(":")[1])), "list order broken"
        print(f"cycle {cycle}: {len(acked)} acknowledged members of each collection survived SIGKILL")


def test_durability_none_loses_at_most_none_flush_ms_of_collection_writes(tmp_path):
    """With `durability=none` live values are stored when the log is handed to the OS,
    every `none_flush_ms`: a SIGKILL loses at most that stretch of acknowledged `HSET`s and
    `RPUSH`es, and what survives is a prefix of them."""
    flush_ms, slack_ms = 200, 500
    settings = {"durability": "none", "none_flush_ms": flush_ms}
    p = StrataProcess(settings, data_dir=str(tmp_path))
    c = p.client(socket_timeout=10, decode_responses=True)
    acked = []
    stop_at = time.monotonic() + 2.0
    i = 0
    while time.monotonic() < stop_at:
        c.hset("h", f"f{i}", i)
        c.rpush("l", i)
        acked.append(time.monotonic())
        i += 1
    killed_at = time.monotonic()
    p = killed_and_restarted(p, settings, tmp_path)
    try:
        c = p.client(decode_responses=True)
        h, l = c.hgetall("h"), c.lrange("l", 0, -1)
    finally:
        p.stop()
    kept = len(l)
    assert l == [str(j) for j in range(kept)], "the list is not a prefix of what was pushed"
    assert h == {f"f{j}": str(j) for j in range(len(h))}, "the hash is not a prefix of what was set"
    too_old = [t for t in acked[min(kept, len(h)):] if (killed_at - t) * 1000 > flush_ms + slack_ms]
    assert not too_old, f"lost {len(too_old)} writes acknowledged more than {flush_ms} + {slack_ms} ms before the kill"
    print(f"durability=none: {len(acked)} acknowledged, {kept} survived; lost the last {(killed_at - acked[kept]) * 1000 if kept < len(acked) else 0:.0f} ms")


def test_save_makes_acknowledged_writes_durable_whatever_the_durability(tmp_path):
    """`SAVE` returns once every write acknowledged before it is durable: with
    `durability=none` and a flush tick of a minute, what was written before a `SAVE` (string
    keys, a hash, a large value in the value log) survives a SIGKILL right after it;
    `LASTSAVE` moves to the save; `BGSAVE` answers at once and saves too."""
    settings = {"durability": "none", "none_flush_ms": 60_000}
    p = StrataProcess(settings, data_dir=str(tmp_path))
    c = p.client(decode_responses=True)
    before = c.lastsave()
    c.mset({f"k{i}": f"v{i}" for i in range(1000)})
    c.hset("h", mapping={"a": "1", "b": "2"})
    c.set("big", "x" * (2 << 20))
    time.sleep(1.1)
    assert c.save() is True
    assert c.lastsave() > before
    with pytest.raises(redis.ResponseError, match="not allowed inside a transaction"):
        pipe = c.pipeline()
        pipe.save()
        pipe.execute()
    c.set("after-bgsave", "1")
    saved = c.lastsave()
    time.sleep(1.1)  # LASTSAVE counts seconds
    assert c.bgsave() is True
    deadline = time.time() + 20
    while c.lastsave() == saved:
        assert time.time() < deadline, "BGSAVE did not finish"
        time.sleep(0.05)
    p = killed_and_restarted(p, settings, tmp_path)
    try:
        c = p.client(decode_responses=True)
        assert c.mget([f"k{i}" for i in range(1000)]) == [f"v{i}" for i in range(1000)]
        assert c.hgetall("h") == {"a": "1", "b": "2"}
        assert c.strlen("big") == 2 << 20
        assert c.get("after-bgsave") == "1"
    finally:
        p.stop()


def test_one_save_runs_at_a_time(tmp_path):
    """As in Redis: while a BGSAVE runs, another BGSAVE or a SAVE is refused with
    'Background save already in progress'; once it is done, a SAVE runs."""
    p = StrataProcess({"durability": "none", "none_flush_ms": 60_000}, data_dir=str(tmp_path))
    try:
        c = p.client()
        value = b"x" * 4096
        for b in range(0, 20_000, 1000):
            pipe = c.pipeline(transaction=False)
            for i in range(b, b + 1000):
                pipe.set(f"k{i}", value)
            pipe.execute()
        # 80 MB to log and sync: the first BGSAVE still runs when the next two arrive.
        pipe = c.pipeline(transaction=False)
        pipe.bgsave().bgsave().save()
        got = pipe.execute(raise_on_error=False)
        assert got[0] is True, got
        for refused in got[1:]:
            assert isinstance(refused, redis.ResponseError), got
            assert "already in progress" in str(refused)
        deadline = time.time() + 60
        while True:
            try:
                assert c.save() is True
                break
            except redis.ResponseError as e:
                assert "already in progress" in str(e) and time.time() < deadline
                time.sleep(0.05)
    finally:
        p.stop()
