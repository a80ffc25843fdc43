#!/usr/bin/env python3
"""What Strata's DRAM policy costs in GET throughput, against LRU, in the same run.

Two Strata servers, one with `hot_policy=lru` and one with `hot_policy=strata` (the
default), each filled with the same keys by `redis-benchmark`, then `redis-benchmark -t get`
against each in rounds whose order alternates (the machine is shared and noisy; the figure
is the median of the per-round ratios). Three cases: every key in DRAM; a 4 MiB DRAM budget,
so most GETs promote from RocksDB and evict; and pipelined GETs of 1 KiB values. Hit rates
are not the point here (random keys favour no policy); `strata trace replay --engine`
measures those. Writes reports/<report>.{md,json}; prints progress.

    scripts/bench_hot_policy.py [--strata target/release/strata] [--rounds 6]
                                [--requests 150000] [--report hot-policy]
"""

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from bench_lmcache import free_port, wait_port  # noqa: E402

KEYS = 100_000
CASES = [
    ("every key in DRAM", [], ["-d", "100"]),
    ("4 MiB DRAM budget", ["--set", "hot_bytes_max=4MiB"], ["-d", "100"]),
    ("pipelined (-P 16), 1 KiB values", [], ["-d", "1024", "-P", "16"]),
]


def bench(port: int, test: str, requests: int, extra: list) -> float:
    """Requests per second that `redis-benchmark` reports for one test."""
    out = subprocess.run(
        ["redis-benchmark", "-p", str(port), "-t", test, "-n", str(requests), "-c", "50",
         "-r", str(KEYS), "-q", *extra],
        check=True, capture_output=True, text=True,
    ).stdout
    line = [l for l in out.replace("\r", "\n").splitlines() if l.upper().startswith(test.upper() + ":")][-1]
    return float(line.split()[1])


def run_case(args, name: str, settings: list, extra: list, tmp: pathlib.Path) -> dict:
    servers = {}
    try:
        for policy in ("lru", "strata"):
            port = free_port()
            proc = subprocess.Popen(
                [args.strata, "serve", "--port", str(port), "--data-dir", str(tmp / f"{name[:5]}-{policy}"),
                 "--set", f"hot_policy={policy}", "--set", "metrics_port=0", "--set", "durability=none",
                 *settings],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            servers[policy] = (port, proc)
            wait_port(port, proc)
        for policy, (port, _) in servers.items():
            bench(port, "set", KEYS, extra)
        rounds = []
        for r in range(args.rounds):
            order = ["lru", "strata"] if r % 2 == 0 else ["strata", "lru"]
            got = {p: bench(servers[p][0], "get", args.requests, extra) for p in order}
            rounds.append(got)
            print(f"  {name}: round {r + 1}/{args.rounds}: lru {got['lru']:.0f}, strata {got['strata']:.0f} GET/s"
                  f" (ratio {got['strata'] / got['lru']:.3f})", flush=True)
    finally:
        for _, proc in servers.values():
            proc.terminate()
            proc.wait(timeout=30)
    ratios = [g["strata"] / g["lru"] for g in rounds]
    return {
        "case": name,
        "lru_gets_per_sec_median": statistics.median(g["lru"] for g in rounds),
        "strata_gets_per_sec_median": statistics.median(g["strata"] for g in rounds),
        "ratio_median": statistics.median(ratios),
        "ratios": ratios,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strata", default=str(ROOT / "target" / "release" / "strata"))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--requests", type=int, default=150_000)
    ap.add_argument("--out", default=str(ROOT / "reports"))
    ap.add_argument("--report", default="hot-policy")
    args = ap.parse_args()
    started = time.time()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, settings, extra) in enumerate(CASES):
            print(f"[{i + 1}/{len(CASES)}] {name}", flush=True)
            rows.append(run_case(args, name, settings, extra, pathlib.Path(tmp)))
    command = (f"scripts/bench_hot_policy.py --rounds {args.rounds} --requests {args.requests}"
               f" --report {args.report}")
    md = [
        "# DRAM policy: GET throughput of `hot_policy=strata` against `lru`",
        "",
        f"Two Strata servers in one run, {KEYS:,} random keys (`-r {KEYS}`), 50 clients, "
        f"`durability=none`; {args.rounds} rounds of {args.requests:,} GETs, the order of the two "
        "servers alternating; ratio = strata / lru GETs per second, median of the rounds "
        "(above 1: Strata's policy is faster).",
        "",
        "| case | lru GET/s | strata GET/s | ratio | per round |",
        "|---|---:|---:|---:|---|",
    ]
    for r in rows:
        md.append(f"| {r['case']} | {r['lru_gets_per_sec_median']:.0f} | {r['strata_gets_per_sec_median']:.0f} | "
                  f"{r['ratio_median']:.3f} | {', '.join(f'{x:.3f}' for x in r['ratios'])} |")
    md += ["", f"Command: `{command}` ({time.time() - started:.0f} s)."]
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.report}.md").write_text("\n".join(md) + "\n")
    (out / f"{args.report}.json").write_text(json.dumps({"command": command, "cases": rows}, indent=2) + "\n")
    print("\n".join(md))
    print(f"wrote {out / args.report}.md and .json")


if __name__ == "__main__":
    main()
