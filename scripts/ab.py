#!/usr/bin/env python3
"""A/B of two Strata builds in one run: the same benchmarks on the old and the new binary,
in alternating rounds (the machine is shared and noisy: only what both see in the same run
compares), reported per row as new/old ratios of the medians.

- redis: redis-benchmark against two `strata serve` processes (old and new), both pinned to
  core 0 and the client to core 1 (`taskset`), the rows of `strata-bench redis` (SET, GET,
  INCR, MGET of 10 keys; 3 B and 1 KiB values; 50 clients -P 1 and -P 16, one client -P 1;
  `durability=none`) and of `strata-bench redis --durable` (SET, INCR with the default
  `durability=group`; 50 clients and one, -P 1 and -P 16); `getmiss` (GETs of keys no one
  wrote), `mget100`, `setwide` (SETs over 10,000,000 keys); rows of the data types, and
  `evalsha1`/`evalsha10`/`evalsha100` (EVALSHA of a script making 1, 10, 100 INCRs);
- kvcache: `strata-bench kvcache` (the new harness) with `--strata OLD` and `--strata NEW`:
  the Strata rows (write and read GiB/s, read p50/p99);
- prefetch: the old and the new `strata-bench prefetch` (the engine in-process): cold-read
  p50/p99 with prefetch off and on.

Writes reports/<name>.md and .json. Progress goes to stderr.

    python3 scripts/ab.py --old OLD/strata --new target/release/strata \\
        --old-bench OLD/strata-bench --new-bench target/release/strata-bench --name ab
"""

import argparse
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, seconds=60):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server on {port} exited: {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


# `taskset` arguments that pin a process to a core; empty with `--unpinned` (servers and
# clients share every core, as on a newcomer's machine).
PINNED = True


def pin(core):
    return ["taskset", "-c", str(core)] if PINNED else []


def start_strata(binary, data_dir, durability):
    """`binary` may carry settings after an `@`: `target/release/strata@worker_threads=1`."""
    path, _, extra = str(binary).partition("@")
    port = free_port()
    args = pin(0) + [path, "serve", "--data-dir", str(data_dir),
                     "--port", str(port), "--set", "metrics_port=0", "--set", f"durability={durability}"]
    for kv in filter(None, extra.split(",")):
        args += ["--set", kv]
    proc = subprocess.Popen(args, env=dict(os.environ, STRATA_LOG_LEVEL="warn"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, proc)
    return proc, port


def start_redis(data_dir, durability):
    """A real redis-server as the baseline: persistence off beside `durability=none`,
    `appendonly yes, appendfsync always` beside `group` (both reply after their fsync);
    `everysec` gives `appendfsync everysec`."""
    port = free_port()
    args = pin(0) + ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
            "--save", "", "--dir", str(data_dir), "--logfile", ""]
    args += ["--appendonly", "no"] if durability == "none" else \
        ["--appendonly", "yes", "--appendfsync",
         "everysec" if durability == "everysec" else "always"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, proc)
    return proc, port


def start_server(binary, data_dir, durability):
    if str(binary) == "redis":
        return start_redis(data_dir, durability)
    return start_strata(binary, data_dir, durability)


CLK_TCK = os.sysconf("SC_CLK_TCK")


def alternate(r, old, new):
    """The two sides of round `r`, in the order they run: old first in even rounds."""
    pair = [("old", old), ("new", new)]
    return pair if r % 2 == 0 else pair[::-1]


def cpu_seconds(pid):
    """User plus system CPU time of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


# The data-type rows: redis-benchmark's own tests for the writes, commands of our own over
# collections filled first (`fill_collections`) for the reads. Writes use a keyspace of
# TYPE_KEYSPACE members, so a collection grows to at most that many.
TYPE_KEYSPACE = 1000
TYPE_TESTS = {
    "hset": ["-t", "hset"],
    "hmget10": ["HMGET", "feat"] + [f"f{i}" for i in range(10)],
    "hmget100": ["HMGET", "feat"] + [f"f{i}" for i in range(100)],
    "hgetall": ["HGETALL", "feat"],
    "zadd": ["-t", "zadd"],
    "zrange10": ["ZRANGE", "board", "0", "9", "WITHSCORES"],
    "lpush": ["-t", "lpush"],
    "lrange10": ["LRANGE", "queue", "0", "9"],
    "sadd": ["-t", "sadd"],
    "sismember": ["SISMEMBER", "tags", "m__rand_int__"],
}


# The large-collection rows: writes of one member at a time into a hash, a set, a sorted
# set and a list of BIG_MEMBERS members each (`fill_big`), as a leaderboard, a large
# feature hash or a queue is written, and reads of a few members (samples, scan pages): with `durability=group` beside `appendfsync always` (each command's commit)
# and with `none` beside persistence off.
BIG_MEMBERS = 1_000_000
BIG_TESTS = {
    "hsetbig": ["HSET", "bigh", "f__rand_int__", "v__rand_int__"],
    "saddbig": ["SADD", "bigs", "m__rand_int__"],
    "zaddbig": ["ZADD", "bigz", "__rand_int__", "m__rand_int__"],
    "lpushbig": ["LPUSH", "bigl", "v__rand_int__"],
    # Reads of a few members of them, and pops.
    "spopbig": ["SPOP", "bigs"],
    "srandbig": ["SRANDMEMBER", "bigs", "5"],
    "hrandbig": ["HRANDFIELD", "bigh", "5", "WITHVALUES"],
    "zrandbig": ["ZRANDMEMBER", "bigz", "5"],
    "hscanbig": ["HSCAN", "bigh", "0"],
    "hgetbig": ["HGET", "bigh", "f__rand_int__"],
    "sscanbig": ["SSCAN", "bigs", "0", "COUNT", "20"],
}
BIG_READS = {"srandbig", "hrandbig", "zrandbig", "hscanbig", "sscanbig", "hgetbig"}


# The paired rows: two redis-benchmark processes at once, half the clients each, sending
# two commands of one pattern over the same keys (as a client's pipeline interleaves them):
# a feature store's `HSET` then `EXPIRE` of 1,000 hashes of 100 fields (`fill_entities`), a
# rate limiter's `INCR` then `EXPIRE`, a leaderboard's `ZADD` beside its reads (top ten,
# a member's rank) on the large sorted set of `fill_big`, and members and fields that come
# and go (`SADD` beside `SREM`, `HSET` beside `HDEL`) in its large set and hash.
PAIR_TESTS = {
    "hsetexpire": (["HSET", "ent:__rand_int__", "f5", "v"], ["EXPIRE", "ent:__rand_int__", "3600"]),
    "increxpire": (["INCR", "rl:__rand_int__"], ["EXPIRE", "rl:__rand_int__", "60"]),
    "zaddtop": (["ZADD", "bigz", "__rand_int__", "m__rand_int__"],
                ["ZREVRANGE", "bigz", "0", "9", "WITHSCORES"]),
    "zaddrank": (["ZADD", "bigz", "__rand_int__", "m__rand_int__"],
                 ["ZREVRANK", "bigz", "m__rand_int__"]),
    "saddsrem": (["SADD", "bigs", "m__rand_int__"], ["SREM", "bigs", "m__rand_int__"]),
    "hsethdel": (["HSET", "bigh", "f__rand_int__", "v"], ["HDEL", "bigh", "f__rand_int__"]),
}
# The pairs that write into `fill_big`'s collections.
PAIR_BIG = {"zaddtop", "zaddrank", "saddsrem", "hsethdel"}
PAIR_KEYSPACE = {"hsetexpire": TYPE_KEYSPACE, "increxpire": 100_000}


def big_keys(tests):
    """The large collections (`fill_big`'s keys) the commands of `tests` name."""
    commands = [BIG_TESTS[t] for t in tests if t in BIG_TESTS]
    commands += [c for t in tests if t in PAIR_BIG for c in PAIR_TESTS[t]]
    return {c[1] for c in commands}


def fill_entities(port):
    """The hashes `hsetexpire` writes: 1,000 entities of 100 fields, as redis-benchmark
    names its random keys."""
    import redis
    r = redis.Redis(port=port)
    for start in range(0, TYPE_KEYSPACE, 100):
        pipe = r.pipeline(transaction=False)
        for i in range(start, start + 100):
            pipe.hset(f"ent:{i:012d}", mapping={f"f{j}": "v" * 10 for j in range(100)})
        pipe.execute()


def fill_big(port, keys):
    """The large collections named `keys` (of `bigz bigh bigs bigl`), BIG_MEMBERS each."""
    import redis
    r = redis.Redis(port=port)
    step = 10_000
    for start in range(0, BIG_MEMBERS, step):
        pipe = r.pipeline(transaction=False)
        span = range(start, start + step)
        if "bigz" in keys:
            pipe.zadd("bigz", {f"m{i:012d}": i for i in span})
        if "bigh" in keys:
            pipe.hset("bigh", mapping={f"f{i:012d}": f"v{i}" for i in span})
        if "bigs" in keys:
            pipe.sadd("bigs", *[f"m{i:012d}" for i in span])
        if "bigl" in keys:
            pipe.rpush("bigl", *[f"v{i:012d}" for i in span])
        pipe.execute()


# The script rows: EVALSHA of a script making N `redis.call`s (INCR of one key, as a rate
# limiter does), loaded on each server first (`load_scripts`).
SCRIPT_CALLS = {"evalsha1": 1, "evalsha10": 10, "evalsha100": 100}


def script_body(calls):
    return f"for i = 1, {calls} do redis.call('INCR', KEYS[1]) end return {calls}"


for _name, _calls in SCRIPT_CALLS.items():
    import hashlib
    TYPE_TESTS[_name] = ["EVALSHA", hashlib.sha1(script_body(_calls).encode()).hexdigest(),
                         "1", "script:counter"]


def load_scripts(port):
    import redis
    r = redis.Redis(port=port)
    for calls in SCRIPT_CALLS.values():
        r.script_load(script_body(calls))


def fill_collections(port):
    """The collections the type read rows read: a 100-field hash of 100-byte values, a
    sorted set, a list and a set of 100 members each."""
    import redis
    r = redis.Redis(port=port)
    r.delete("feat", "board", "queue", "tags")
    r.hset("feat", mapping={f"f{i}": "v" * 100 for i in range(100)})
    r.zadd("board", {f"p{i}": i for i in range(100)})
    r.rpush("queue", *[f"job{i}" for i in range(100)])
    r.sadd("tags", *[f"m{i:012d}" for i in range(100)])


# The read rows read every key of redis-benchmark's keyspace (`key:` and 12 digits), written
# first with the row's value size, so that they measure hits ("all keys in DRAM"), not the
# share of the keyspace earlier write rows happened to cover. `getmiss` reads absent keys of
# that filled store: a cache's misses (an empty store would measure Redis's empty-table
# shortcut, not a look-up).
READ_TESTS = {"get", "mget", "mget100", "getmiss"}
# redis-benchmark's own default run: every request on its one key (no `-r`), as the first
# line a newcomer types (`redis-benchmark -t get,set -P 16 -q`).
ONE_KEY_TESTS = {"setone": "set", "getone": "get"}


def prefill(port, size):
    import redis
    r = redis.Redis(port=port)
    value = b"v" * size
    for start in range(0, 100_000, 1000):
        pipe = r.pipeline(transaction=False)
        for i in range(start, start + 1000):
            pipe.set(f"key:{i:012d}", value)
        pipe.execute()


def redis_benchmark(port, test, size, clients, pipeline, requests):
    if test in PAIR_TESTS:
        return paired_benchmark(port, test, size, clients, pipeline, requests)
    keyspace = 10_000_000 if test == "setwide" else 100_000
    if test in TYPE_TESTS:
        keyspace = TYPE_KEYSPACE
    if test in BIG_TESTS or test in PAIR_BIG:
        keyspace = BIG_MEMBERS
    args = pin(1) + ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "--csv",
                     "-n", str(requests), "-c", str(clients), "-P", str(pipeline), "-d", str(size)]
    if test not in ONE_KEY_TESTS:
        args += ["-r", str(keyspace)]
    if test in ONE_KEY_TESTS:
        args += ["-t", ONE_KEY_TESTS[test]]
    elif test in TYPE_TESTS:
        args += TYPE_TESTS[test]
    elif test in BIG_TESTS:
        args += BIG_TESTS[test]
    elif test == "mget":
        args += ["MGET"] + ["key:__rand_int__"] * 10
    elif test == "mget100":
        args += ["MGET"] + ["key:__rand_int__"] * 100
    elif test == "getmiss":
        args += ["GET", "absent:__rand_int__"]
    else:
        args += ["-t", "set" if test == "setwide" else test]
    out = subprocess.run(args, capture_output=True, text=True, timeout=600).stdout
    return benchmark_figures(test, out)


def benchmark_figures(test, out):
    for line in out.splitlines()[1:]:
        cols = [c.strip('"') for c in line.split('","')]
        if len(cols) >= 8:
            return {"rps": float(cols[1]), "p50_ms": float(cols[4]), "p99_ms": float(cols[6])}
    raise RuntimeError(f"redis-benchmark printed nothing for {test}: {out}")


def paired_benchmark(port, test, size, clients, pipeline, requests):
    """A `PAIR_TESTS` row: both commands' processes started together, half the clients and
    half the requests each; ops/s are all the requests over the time until both ended (a
    sum of the two rates would count the one that ended first as still running), p50 the
    mean of the two, p99 the larger."""
    procs = []
    started = time.monotonic()
    for command in PAIR_TESTS[test]:
        args = pin(1) + ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port),
                "--csv", "-r", str(PAIR_KEYSPACE.get(test, BIG_MEMBERS)), "-n", str(max(requests // 2, 1)),
                "-c", str(max(clients // 2, 1)), "-P", str(pipeline), "-d", str(size)] + command
        procs.append(subprocess.Popen(args, stdout=subprocess.PIPE, text=True))
    figures = [benchmark_figures(test, p.communicate(timeout=600)[0]) for p in procs]
    elapsed = time.monotonic() - started
    return {"rps": 2 * max(requests // 2, 1) / elapsed,
            "p50_ms": sum(f["p50_ms"] for f in figures) / len(figures),
            "p99_ms": max(f["p99_ms"] for f in figures)}


def redis_rows(quick):
    """(durability, test, value bytes, clients, pipeline). `mget100` reads 100 keys;
    `setwide` writes over 10,000,000 keys (beyond what coalescing absorbs); `getmiss` reads
    keys no one wrote (a cache's misses)."""
    rows = []
    for test in ["set", "get", "getmiss", "incr", "mget", "mget100", "setwide"]:
        for size in [3, 1024]:
            if test in ("incr", "setwide", "getmiss") and size != 3:
                continue
            for clients, pipeline in [(50, 1), (50, 16), (1, 1), (1, 16)]:
                if test == "setwide" and (clients, pipeline) != (50, 16):
                    continue
                rows.append(("none", test, size, clients, pipeline))
    for test in ["set", "incr"]:
        for clients, pipeline in [(50, 1), (50, 16), (1, 1), (1, 16)]:
            rows.append(("group", test, 3, clients, pipeline))
    for test in ONE_KEY_TESTS:
        for clients, pipeline in [(50, 1), (50, 16)]:
            rows.append(("none", test, 3, clients, pipeline))
    for test in TYPE_TESTS:
        if test in SCRIPT_CALLS:
            continue
        for clients, pipeline in [(50, 1), (50, 16)]:
            rows.append(("none", test, 100, clients, pipeline))
    for test in SCRIPT_CALLS:
        for clients, pipeline in [(50, 1), (1, 1)]:
            rows.append(("none", test, 3, clients, pipeline))
    for test in BIG_TESTS:
        # A read commits nothing: `durability` does not matter to it.
        for durability in ["group", "none"] if test not in BIG_READS else ["none"]:
            for clients, pipeline in [(50, 1), (50, 16)]:
                rows.append((durability, test, 3, clients, pipeline))
    for test in PAIR_TESTS:
        for durability in ["group", "none"]:
            for clients, pipeline in [(50, 1), (50, 16)]:
                rows.append((durability, test, 3, clients, pipeline))
    return rows


def run_redis(old, new, rounds, requests, results, tests):
    rows = [x for x in redis_rows(False) if x[1] in tests]
    for r in range(rounds):
        order = alternate(r, old, new)
        for durability in ["none", "group"]:
            servers = {}
            dirs = []
            try:
                for label, binary in order:
                    d = tempfile.mkdtemp(prefix=f"ab-{label}-")
                    dirs.append(d)
                    servers[label] = start_server(binary, d, durability)
                    if any(x[1] in TYPE_TESTS for x in rows):
                        fill_collections(servers[label][1])
                        load_scripts(servers[label][1])
                    if any(x[1] == "hsetexpire" for x in rows):
                        fill_entities(servers[label][1])
                    big = big_keys([x[1] for x in rows if x[0] == durability])
                    if big:
                        log(f"[redis round {r + 1}/{rounds}] {label}: filling the large collections")
                        fill_big(servers[label][1], big)
                filled = None
                for row in [x for x in rows if x[0] == durability]:
                    _, test, size, clients, pipeline = row
                    if test in READ_TESTS and filled != size:
                        for label, _ in order:
                            prefill(servers[label][1], size)
                        filled = size
                    elif test not in READ_TESTS:
                        filled = None
                    n = requests if clients > 1 else max(requests // 10, 1000)
                    for label, _ in order:
                        proc, port = servers[label]
                        cpu = cpu_seconds(proc.pid)
                        f = redis_benchmark(port, test, size, clients, pipeline, n)
                        f["cpu_us_per_op"] = (cpu_seconds(proc.pid) - cpu) * 1e6 / n
                        results.setdefault(("redis",) + row, {}).setdefault(label, []).append(f)
                    log(f"[redis round {r + 1}/{rounds}] {durability} {test} {size} B "
                        f"c{clients} P{pipeline}: " + ", ".join(
                            f"{label} {results[('redis',) + row][label][-1]['rps']:.0f}/s"
                            for label, _ in order))
            finally:
                for proc, _ in servers.values():
                    proc.terminate()
                    proc.wait(30)
                for d in dirs:
                    shutil.rmtree(d, ignore_errors=True)


def run_kvcache(new_bench, old, new, rounds, results, quick):
    extra = ["--model", "tiny", "--users", "4"] if quick else []
    for r in range(rounds):
        for label, binary in alternate(r, old, new):
            out = Path(tempfile.mkdtemp(prefix="ab-kv-"))
            subprocess.run([str(new_bench), "--out", str(out), "kvcache", "--strata", str(binary),
                            "--report", "kv"] + extra, check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=3600)
            data = json.loads((out / "kv.json").read_text())
            for row in data["rows"]:
                if not row["backend"].startswith("strata"):
                    continue
                key = ("kvcache", row["backend"])
                results.setdefault(key, {}).setdefault(label, []).append({
                    "write_gib_per_sec": row["write_gib_per_sec"],
                    "read_gib_per_sec": row["read_gib_per_sec"],
                    "read_p50_ms": row["read_p50_ms"],
                    "read_p99_ms": row["read_p99_ms"],
                })
            shutil.rmtree(out, ignore_errors=True)
            log(f"[kvcache round {r + 1}/{rounds}] {label} done")


def run_prefetch(old_bench, new_bench, rounds, results, quick):
    extra = ["--sessions", "16"] if quick else []
    for r in range(rounds):
        for label, bench in alternate(r, old_bench, new_bench):
            out = Path(tempfile.mkdtemp(prefix="ab-pf-"))
            subprocess.run([str(bench), "--out", str(out), "prefetch"] + extra, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=3600)
            data = json.loads((out / "prefetch.json").read_text())
            for row in data["rows"]:
                if not row["name"].startswith("strata"):
                    continue
                key = ("prefetch", row["name"])
                results.setdefault(key, {}).setdefault(label, []).append({
                    "p50_ms": row["reads"]["p50_us"] / 1000,
                    "p99_ms": row["reads"]["p99_us"] / 1000,
                    "precision": row["prefetch_precision"],
                })
            shutil.rmtree(out, ignore_errors=True)
            log(f"[prefetch round {r + 1}/{rounds}] {label} done")


# Which figure of each benchmark says "faster": higher is better for these, lower for the rest.
HIGHER_IS_BETTER = {"rps", "write_gib_per_sec", "read_gib_per_sec", "precision"}


def geomean(xs):
    xs = [x for x in xs if x > 0 and x == x and x != float("inf")]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def summarize(results, tolerance):
    table = []
    for key, by in results.items():
        if "old" not in by or "new" not in by:
            continue
        for fig in by["old"][0]:
            old = statistics.median(x[fig] for x in by["old"])
            new = statistics.median(x[fig] for x in by["new"])
            ratio = new / old if old else (1.0 if new == old else float("inf"))
            better = ratio if fig in HIGHER_IS_BETTER else (1 / ratio if ratio else float("nan"))
            table.append({
                "bench": key[0], "row": " ".join(str(k) for k in key[1:]), "figure": fig,
                "old": old, "new": new, "new_over_old": ratio,
                "within": abs(better - 1) <= tolerance or better > 1,
                "old_runs": [x[fig] for x in by["old"]], "new_runs": [x[fig] for x in by["new"]],
            })
    return table


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old", required=True, type=Path,
                   help="the old strata binary, or `redis` for a real redis-server (redis rows only)")
    p.add_argument("--new", required=True, type=Path)
    p.add_argument("--old-bench", required=True, type=Path)
    p.add_argument("--new-bench", required=True, type=Path)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--kv-rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--only", choices=["redis", "kvcache", "prefetch"], action="append")
    p.add_argument("--redis-tests", default="set,get,incr,mget",
                   help="which redis-benchmark tests to run (mget reads the keys set writes)")
    p.add_argument("--tolerance", type=float, default=0.05)
    p.add_argument("--quick", action="store_true", help="small sizes, to check the script")
    p.add_argument("--big-members", type=int, default=BIG_MEMBERS,
                   help="members of each large collection the `big` rows write and read")
    p.add_argument("--unpinned", action="store_true",
                   help="no taskset: servers and redis-benchmark share every core")
    p.add_argument("--name", default="ab")
    p.add_argument("--out", type=Path, default=ROOT / "reports")
    a = p.parse_args()
    global PINNED
    PINNED = not a.unpinned
    globals()["BIG_MEMBERS"] = a.big_members
    only = set(a.only or ["redis", "kvcache", "prefetch"])
    started = time.time()
    results = {}
    if "redis" in only:
        run_redis(a.old, a.new, a.rounds, a.requests if not a.quick else 5000, results,
                  a.redis_tests.split(","))
    if "kvcache" in only:
        run_kvcache(a.new_bench, a.old, a.new, a.kv_rounds, results, a.quick)
    if "prefetch" in only:
        run_prefetch(a.old_bench, a.new_bench, a.kv_rounds, results, a.quick)
    table = summarize(results, a.tolerance)
    a.out.mkdir(parents=True, exist_ok=True)
    cmd = "python3 scripts/ab.py " + " ".join(sys.argv[1:])
    (a.out / f"{a.name}.json").write_text(json.dumps({"command": cmd, "rows": table}, indent=1))
    md = [f"# A/B: {a.old} (old) against {a.new} (new)", "",
          f"Command: `{cmd}` ({(time.time() - started) / 60:.0f} min). Medians of the rounds; "
          "the two builds alternate, so both see the same machine. " + (
              "Servers on core 0, redis-benchmark on core 1. " if PINNED else
              "Nothing pinned: servers and redis-benchmark share every core. ") + "`ok`: new is within "
          f"{a.tolerance:.0%} of old, or better.", "",
          "`spread`: how far apart the old build's own rounds were (max − min over the median).", ""]
    if str(a.old) == "redis":
        md += ["`old` is a real `redis-server` (" + subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True).stdout.split(" sha")[0]
            + "): persistence off beside `durability=none`, `appendonly yes, appendfsync always` "
            "beside `group`. Ratios are Strata/Redis.", ""]
    md += ["| bench | row | figure | old | new | new/old | spread | |",
           "|---|---|---|---:|---:|---:|---:|---|"]
    for t in table:
        runs = t["old_runs"]
        spread = (max(runs) - min(runs)) / t["old"] if t["old"] else 0.0
        md.append(f"| {t['bench']} | {t['row']} | {t['figure']} | {t['old']:.4g} | {t['new']:.4g} "
                  f"| {t['new_over_old']:.3f} | {spread:.2f} | {'ok' if t['within'] else 'OUT'} |")
    out_rows = [t for t in table if not t["within"]]
    md += ["", f"{len(table) - len(out_rows)} of {len(table)} figures within {a.tolerance:.0%} or better."]
    for fig in sorted({t["figure"] for t in table}):
        g = geomean([t["new_over_old"] for t in table if t["figure"] == fig])
        md.append(f"- geometric mean of new/old, {fig}: {g:.3f}")
    (a.out / f"{a.name}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
