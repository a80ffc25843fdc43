#!/usr/bin/env python3
"""The bucket log's costs, beside their baselines in one run (issue 67):

1. Writes: `SET` of 100 bytes through `redis-benchmark` (50 clients at -P 1 and -P 16, and
   one client) against Strata with `durability=bucket` (its bucket a local directory),
   Strata with `durability=group`, and redis-server with `appendfsync always`: every one
   acknowledges a write once it is durable. Servers on core 0, the client on core 1,
   rounds alternating the servers; medians. With them: the bucket log's object PUTs per
   second and the bytes it wrote per acknowledged write.
2. Failover: three nodes on etcd sharing a bucket (`durability=bucket`), N keys written
   through `redis-benchmark --cluster`, one node killed; the time until every key of its
   slots reads back from the survivors, at N = 10,000 and 100,000.

Writes reports/bucket.md and .json. Progress goes to stderr.

    python3 scripts/bench-bucket.py --strata target/release/strata [--rounds 3] [--quick]
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ab import free_port, log  # this folder's A/B script: the same helpers

ROOT = Path(__file__).resolve().parent.parent


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


def start(kind, strata, data_dir, settings=(), pin=True):
    port = free_port()
    taskset = ["taskset", "-c", "0"] if pin else []
    if kind == "redis":
        args = taskset + ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                          "--dir", str(data_dir), "--appendonly", "yes", "--appendfsync", "always"]
    else:
        args = taskset + [str(strata), "serve", "--data-dir", str(data_dir), "--port", str(port),
                          "--set", "metrics_port=0", "--set", f"durability={kind}"]
        for kv in settings:
            args += ["--set", kv]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, STRATA_LOG_LEVEL="warn"))
    wait_port(port, proc)
    return proc, port


def info_field(port, field):
    out = subprocess.run(["redis-cli", "-p", str(port), "INFO", "strata"], capture_output=True,
                         text=True).stdout
    for line in out.splitlines():
        if line.startswith(field + ":"):
            return float(line.split(":", 1)[1])
    return 0.0


def dir_bytes(path):
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def benchmark(port, clients, pipeline, requests):
    args = ["taskset", "-c", "1", "redis-benchmark", "-p", str(port), "--csv", "-t", "set",
            "-r", "100000", "-d", "100", "-n", str(requests), "-c", str(clients), "-P", str(pipeline)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=600).stdout
    for line in out.splitlines()[1:]:
        cols = [c.strip('"') for c in line.split('","')]
        if len(cols) >= 8:
            return {"rps": float(cols[1]), "p50_ms": float(cols[4]), "p99_ms": float(cols[6])}
    raise RuntimeError(f"redis-benchmark printed nothing: {out}")


def writes(strata, rounds, requests):
    rows = [(50, 1), (50, 16), (1, 1)]
    kinds = ["bucket", "group", "redis"]
    got = {}
    for r in range(rounds):
        for kind in kinds[r % 3:] + kinds[:r % 3]:
            d = tempfile.mkdtemp(prefix=f"bb-{kind}-")
            proc, port = start(kind, strata, d)
            try:
                for clients, pipeline in rows:
                    n = requests if clients > 1 else requests // 10
                    objects0 = info_field(port, "bucket_log_objects")
                    bytes0 = dir_bytes(Path(d) / "cold")
                    t0 = time.time()
                    f = benchmark(port, clients, pipeline, n)
                    secs = time.time() - t0
                    if kind == "bucket":
                        f["puts_per_s"] = (info_field(port, "bucket_log_objects") - objects0) / secs
                        f["bucket_bytes_per_write"] = (dir_bytes(Path(d) / "cold") - bytes0) / n
                    got.setdefault((kind, clients, pipeline), []).append(f)
                    log(f"[writes round {r + 1}/{rounds}] {kind} c{clients} P{pipeline}: {f['rps']:.0f}/s")
            finally:
                proc.terminate()
                proc.wait(30)
                shutil.rmtree(d, ignore_errors=True)
    med = {}
    for key, runs in got.items():
        med[key] = {k: statistics.median(x[k] for x in runs) for k in runs[0]}
    return rows, med


def failover(strata, keys, ttl_s, history=1, extra=()):
    """Seconds from killing one of three nodes until every key of its slots reads back, and
    the bytes of the lost node's epoch in the bucket at the kill. Each key is written
    `history` times (the last value is the one read back); `extra`: more settings."""
    import redis
    from redis.cluster import ClusterNode, RedisCluster
    work = Path(tempfile.mkdtemp(prefix="bb-failover-"))
    etcd_port, peer = free_port(), free_port()
    etcd = subprocess.Popen(
        ["etcd", "--data-dir", str(work / "etcd"), "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
         "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"default=http://127.0.0.1:{peer}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    nodes = []
    try:
        time.sleep(2)
        settings = [f'cluster_etcd="http://127.0.0.1:{etcd_port}"', 'cluster_name="bench"',
                    f"cluster_lease_ttl_s={ttl_s}", f'cold_url="file://{work / "bucket"}"', *extra]
        (work / "bucket").mkdir()
        for i in range(3):
            nodes.append(start("bucket", strata, work / f"n{i}", settings, pin=False))
        subprocess.run([str(strata), "cluster", "rebalance", "--etcd", f"http://127.0.0.1:{etcd_port}",
                        "--name", "bench"], check=True, capture_output=True, timeout=120)
        time.sleep(1)
        rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", nodes[0][1])])
        pipe = rc.pipeline()
        pad = "x" * 200
        for round_ in range(history):
            last = round_ == history - 1
            for i in range(keys):
                pipe.set(f"k:{i}", f"v{i}" if last else f"v{i}{pad}{round_}")
                if i % 1000 == 999:
                    pipe.execute()
            pipe.execute()
            log(f"[failover] {keys} keys: write {round_ + 1} of {history} done")
        victim = nodes[2]
        lost_keys = [f"k:{i}" for i in range(keys)
                     if rc.keyslot(f"k:{i}") in owned_slots(nodes[0][1], victim[1])]
        before = {e: sum(f.stat().st_size for f in e.rglob("*") if f.is_file())
                  for e in (work / "bucket" / "epochs").iterdir()}
        victim[0].kill()
        t0 = time.time()
        rc2 = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", nodes[0][1])])
        pending = list(lost_keys)
        while pending:
            assert time.time() - t0 < 300, "failover took over 5 minutes"
            still = []
            for k in pending:
                try:
                    if rc2.get(k) != f"v{k[2:]}".encode():
                        still.append(k)
                except (redis.exceptions.RedisError, OSError):
                    still.append(k)
            pending = still
            if pending:
                time.sleep(0.1)
        secs = time.time() - t0
        after = {e: sum(f.stat().st_size for f in e.rglob("*") if f.is_file())
                 for e in (work / "bucket" / "epochs").iterdir()}
        # The lost node's epoch: the one its retirement emptied (or, before that, any).
        gone = [e for e in before if after.get(e, 0) < before[e] / 10] or list(before)
        return secs, len(lost_keys), before[gone[0]]
    finally:
        for p, _ in nodes:
            p.kill()
        etcd.kill()
        shutil.rmtree(work, ignore_errors=True)


def history(a):
    """Failover after a long history: 100,000 keys each written five times (four values of
    about 210 bytes, then the short one read back), with snapshots and without."""
    cmd = "python3 scripts/bench-bucket.py " + " ".join(sys.argv[1:])
    keys = 10_000 if a.quick else 100_000
    rows = []
    for label, extra in [("snapshots from 8 MiB", ("bucket_snapshot_bytes_min=8MiB",)),
                         ("no snapshots", ("bucket_snapshot_bytes_min=1TiB",))]:
        log(f"[history] {label}")
        secs, lost, held = failover(a.strata, keys, 3, history=5, extra=extra)
        rows.append((label, lost, held, secs))
        log(f"[history] {label}: {secs:.1f} s, the lost node's epoch held {held / 1e6:.1f} MB")
    md = ["# Failover after a long history", "",
          f"Command: `{cmd}`. Three nodes, `durability=bucket`, lease 3 s; {keys} keys each "
          "written five times through a RedisCluster pipeline; one node SIGKILLed; seconds "
          "until every key of its slots reads back its last value from the survivors.", "",
          "| bucket log | keys on the lost node | lost node's bytes in the bucket | seconds |",
          "|---|---:|---:|---:|"]
    md += [f"| {l} | {n} | {h / 1e6:.1f} MB | {s:.1f} |" for l, n, h, s in rows]
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "bucket-history.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


def owned_slots(any_port, port):
    import redis
    out = set()
    for first, last, owner, *_ in redis.Redis(port=any_port).execute_command("CLUSTER", "SLOTS"):
        if owner[1] == port:
            out.update(range(first, last + 1))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--strata", type=Path, default=ROOT / "target" / "release" / "strata")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path, default=ROOT / "reports")
    p.add_argument("--failover-only", action="store_true",
                   help="only the failover rows (the report keeps the writes table of an earlier run)")
    p.add_argument("--history", action="store_true",
                   help="only failover after each key was written five times, with snapshots "
                        "(bucket_snapshot_bytes_min = 8 MiB) and without")
    a = p.parse_args()
    if a.history:
        return history(a)
    started = time.time()
    rounds, requests = (1, 10_000) if a.quick else (a.rounds, a.requests)
    rows, med = ([], {}) if a.failover_only else writes(a.strata, rounds, requests)
    ttl = 3
    fails = []
    for n in ([2_000] if a.quick else [10_000, 100_000]):
        log(f"[failover] {n} keys")
        secs, lost, _ = failover(a.strata, n, ttl)
        fails.append({"keys": n, "keys_on_lost_node": lost, "seconds": secs})
        log(f"[failover] {n} keys: every key of the lost node back after {secs:.1f} s")
    cmd = "python3 scripts/bench-bucket.py " + " ".join(sys.argv[1:])
    md = ["# The bucket log beside group commit and Redis's appendfsync always", "",
          f"Command: `{cmd}` ({(time.time() - started) / 60:.0f} min), on this project's machine "
          "(2 cores, shared VM). `SET` of 100 bytes; servers on core 0, `redis-benchmark` on core 1; "
          f"medians of {rounds} rounds that alternate the servers. Strata's bucket is a local "
          "directory (fsynced objects). All three acknowledge a write once it is durable.", "",
          "| clients, pipeline | bucket req/s | group req/s | Redis always req/s | bucket/group | bucket/Redis | bucket p50 / p99 ms | group p50 / p99 ms | Redis p50 / p99 ms | bucket PUTs/s | bucket bytes per write |",
          "|---|---:|---:|---:|---:|---:|---|---|---|---:|---:|"]
    for c, pl in rows:
        b, g, r = med[("bucket", c, pl)], med[("group", c, pl)], med[("redis", c, pl)]
        md.append(f"| {c}, -P {pl} | {b['rps']:.0f} | {g['rps']:.0f} | {r['rps']:.0f} | "
                  f"{b['rps'] / g['rps']:.2f} | {b['rps'] / r['rps']:.2f} | {b['p50_ms']:.3f} / {b['p99_ms']:.3f} | "
                  f"{g['p50_ms']:.3f} / {g['p99_ms']:.3f} | {r['p50_ms']:.3f} / {r['p99_ms']:.3f} | "
                  f"{b['puts_per_s']:.0f} | {b['bucket_bytes_per_write']:.0f} |")
    md += ["", f"Failover: three nodes, `durability=bucket`, lease {ttl} s, nothing pinned; "
           "seconds from a SIGKILL of one node until every key of its slots read back from the survivors:", "",
           "| keys | keys on the lost node | seconds |", "|---:|---:|---:|"]
    md += [f"| {f['keys']} | {f['keys_on_lost_node']} | {f['seconds']:.1f} |" for f in fails]
    a.out.mkdir(parents=True, exist_ok=True)
    name = "bucket-failover" if a.failover_only else "bucket"
    (a.out / f"{name}.md").write_text("\n".join(md) + "\n")
    (a.out / f"{name}.json").write_text(json.dumps({
        "command": cmd,
        "writes": [{"server": k[0], "clients": k[1], "pipeline": k[2], **v} for k, v in med.items()],
        "failover": fails}, indent=1))
    print("\n".join(md))


if __name__ == "__main__":
    main()
