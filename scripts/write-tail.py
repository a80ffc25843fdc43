#!/usr/bin/env python3
"""The tail of unpipelined writes, and what a server's own file writes cost it on this
machine: `redis-benchmark` SETs of 1 KiB from 50 clients at `-P 1` (core 1) against four
servers on core 0, in alternating rounds:

- `redis`: Redis with persistence off (the issue's baseline);
- `redis+writer`: the same, beside a process on core 0 at nice 10 (the priority of
  Strata's log hand-off) that writes `--writer-mbps` MB/s into new files, 4 MiB at a time,
  deleting old ones, about what Strata's `none` log writes under this load;
- `redis-aof`: Redis with `appendonly yes, appendfsync everysec` (its nearest promise to
  Strata's `durability=none`, which may lose up to `none_flush_ms` of writes);
- `strata`: Strata with `durability=none`.

Reports latency percentiles from redis-benchmark's own table (medians over the rounds) and
their ratios to `redis`, in reports/<name>.md and .json. Progress goes to stderr.

    python3 scripts/write-tail.py --strata target/release/strata [--rounds 3]
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ab import ROOT, log, start_redis, start_strata

SERVERS = ["redis", "redis+writer", "redis-aof", "strata"]
# Percentiles read from redis-benchmark's table: the first row at or above each.
PERCENTILES = [50.0, 99.0, 99.5, 99.9]

# The writer beside `redis+writer`: `rate` bytes a second into new files under `dir`.
WRITER = """
import os, sys, time
d, rate = sys.argv[1], float(sys.argv[2])
chunk = b"\\0" * (4 << 20)
i = 0
while True:
    t = time.monotonic()
    with open(f"{d}/f{i}", "wb") as f:
        f.write(chunk)
    try:
        os.unlink(f"{d}/f{i - 8}")
    except FileNotFoundError:
        pass
    i += 1
    time.sleep(max(0.0, len(chunk) / rate - (time.monotonic() - t)))
"""


def bench(port, requests):
    return ["taskset", "-c", "1", "redis-benchmark", "-p", str(port), "-t", "set",
            "-n", str(requests), "-c", "50", "-P", "1", "-d", "1024", "-r", "100000"]


def percentiles(out):
    """{percentile: ms} from redis-benchmark's 'Latency by percentile distribution'."""
    rows = []
    for line in out.replace("\r", "\n").splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0].endswith("%") and parts[1] == "<=":
            rows.append((float(parts[0][:-1]), float(parts[2])))
    found = {}
    for p in PERCENTILES:
        at = [ms for q, ms in rows if q >= p]
        if at:
            found[p] = at[0]
    return found


def one(server, strata, requests, writer_rate):
    with tempfile.TemporaryDirectory() as data, tempfile.TemporaryDirectory() as spill:
        if server == "strata":
            proc, port = start_strata(strata, data, "none")
        elif server == "redis-aof":
            proc, port = start_redis(data, "everysec")
        else:
            proc, port = start_redis(data, "none")
        writer = None
        try:
            subprocess.run(bench(port, requests // 2), check=True, capture_output=True)
            if server == "redis+writer":
                writer = subprocess.Popen(
                    ["nice", "-n", "10", "taskset", "-c", "0", sys.executable, "-c", WRITER,
                     spill, str(writer_rate)])
                time.sleep(1)
            out = subprocess.run(bench(port, requests), check=True, capture_output=True,
                                 text=True).stdout
        finally:
            if writer:
                writer.kill()
                writer.wait()
            proc.terminate()
            proc.wait()
    return percentiles(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strata", required=True, type=Path)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=400_000)
    p.add_argument("--writer-mbps", type=float, default=85.0)
    p.add_argument("--name", default="write-tail")
    p.add_argument("--out", type=Path, default=ROOT / "reports")
    a = p.parse_args()
    started = time.time()
    runs = {s: [] for s in SERVERS}
    for r in range(a.rounds):
        order = SERVERS if r % 2 == 0 else SERVERS[::-1]
        for s in order:
            log(f"round {r + 1}/{a.rounds}: {s}")
            runs[s].append(one(s, a.strata, a.requests, a.writer_mbps * 1e6))
    medians = {s: {pc: statistics.median(run[pc] for run in runs[s] if pc in run)
                   for pc in PERCENTILES} for s in SERVERS}
    cmd = " ".join(["python3", "scripts/write-tail.py"] + sys.argv[1:])
    md = [f"# The tail of unpipelined writes, beside a writer of files\n",
          f"`redis-benchmark -t set -c 50 -P 1 -d 1024 -r 100000 -n {a.requests}` on core 1; "
          f"each server alone on core 0, fresh each round, its keys written once first; "
          f"{a.rounds} rounds, the order reversed every other round; medians. "
          f"`redis+writer`: Redis with persistence off beside a nice-10 process on core 0 "
          f"writing {a.writer_mbps:g} MB/s into new files (4 MiB at a time). `redis-aof`: "
          f"`appendonly yes, appendfsync everysec`. Strata: `durability=none`.\n",
          "| server | " + " | ".join(f"p{pc:g} ms" for pc in PERCENTILES) + " | "
          + " | ".join(f"p{pc:g} / redis" for pc in PERCENTILES[1:]) + " |",
          "|---|" + "---:|" * (2 * len(PERCENTILES) - 1)]
    for s in SERVERS:
        m = medians[s]
        md.append(f"| {s} | " + " | ".join(f"{m[pc]:.3f}" for pc in PERCENTILES) + " | "
                  + " | ".join(f"{m[pc] / medians['redis'][pc]:.2f}"
                               for pc in PERCENTILES[1:]) + " |")
    md.append(f"\nCommand: `{cmd}` ({time.time() - started:.0f} s).\n")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"{a.name}.md").write_text("\n".join(md))
    (a.out / f"{a.name}.json").write_text(json.dumps(
        {"command": cmd, "rounds": runs, "medians": medians}, indent=1))
    print("\n".join(md))


if __name__ == "__main__":
    main()
