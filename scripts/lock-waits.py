#!/usr/bin/env python3
"""How long clients' writes wait for a DRAM shard's lock: starts `strata serve`
(`durability=none`) on core 0, drives `redis-benchmark` SETs of 1 KiB from 50 clients
(`-P 1`) on core 1, records the server's context switches with their call stacks
(`perf record -e sched:sched_switch --call-graph dwarf`) for a few seconds, and reports the
sleeps that began in `HotCache::insert_dirty` (a writer parked on the shard lock) until
the thread ran again. Progress goes to stderr.

    python3 scripts/lock-waits.py --strata target/release/strata [--strata OTHER ...]

Needs `perf` (Debian `linux-perf`) and root (or a low `perf_event_paranoid`).
"""

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time

from ab import log, start_strata

SWITCH = re.compile(
    r"^\s*\S+\s+\d+\s+(?:\[\d+\]\s+)?([\d.]+):\s+sched:sched_switch:.*prev_pid=(\d+) "
    r"prev_prio=\d+ prev_state=(\S+) ==> next_comm=\S+ next_pid=(\d+)"
)


def bench(port, requests):
    return [
        "taskset", "-c", "1", "redis-benchmark", "-p", str(port), "-t", "set",
        "-n", str(requests), "-c", "50", "-P", "1", "-d", "1024", "-r", "100000", "-q",
    ]


def waits(script):
    """Milliseconds each shard-lock sleep lasted, from `perf script` output."""
    asleep, out, current = {}, [], None
    for line in script.splitlines():
        m = SWITCH.match(line)
        if m:
            t, prev, state, nxt = float(m[1]), int(m[2]), m[3], int(m[4])
            if nxt in asleep:
                out.append((t - asleep.pop(nxt)) * 1000)
            current = (t, prev) if state.startswith("S") else None
        elif current and "HotCache::insert_dirty" in line:
            asleep[current[1]] = current[0]
            current = None
    return sorted(out)


def measure(strata, seconds):
    with tempfile.TemporaryDirectory() as data, tempfile.TemporaryDirectory() as tmp:
        server, port = start_strata(strata, data, "none")
        try:
            log(f"{strata}: writing the keys once")
            subprocess.run(bench(port, 200_000), check=True, capture_output=True)
            load = subprocess.Popen(bench(port, 2_000_000), stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            time.sleep(0.5)
            log(f"{strata}: recording {seconds} s of context switches")
            rec = f"{tmp}/perf.data"
            subprocess.run(["perf", "record", "-q", "-o", rec, "-e", "sched:sched_switch",
                            "--call-graph", "dwarf,16384", "-p", str(server.pid), "--",
                            "sleep", str(seconds)], check=True, capture_output=True)
            load.kill()
            load.wait()
            log(f"{strata}: reading the stacks")
            script = subprocess.run(["perf", "script", "-i", rec], capture_output=True,
                                    text=True).stdout
        finally:
            server.terminate()
            server.wait()
    return waits(script)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strata", action="append", required=True)
    p.add_argument("--seconds", type=float, default=2.0)
    a = p.parse_args()
    for tool in ("perf", "redis-benchmark", "taskset"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is needed")
    print("| build | waits | total ms | p50 ms | p99 ms | max ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for strata in a.strata:
        d = measure(strata, a.seconds)
        if not d:
            print(f"| {strata} | 0 | 0 | | | |")
            continue
        n = len(d)
        print(f"| {strata} | {n} | {sum(d):.1f} | {d[n // 2]:.3f} | "
              f"{d[min(n - 1, int(n * 0.99))]:.3f} | {d[-1]:.3f} |", flush=True)


if __name__ == "__main__":
    main()
