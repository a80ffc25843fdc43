#!/usr/bin/env python3
"""What quotas per namespace cost: `KVC.PUT` and `KVC.GET` rates of one namespace with no
quota, with a quota it stays under (the ledger's cost alone), and with a quota of half what
it writes (each write past it drops the namespace's least recently used chunks), beside the
binary from before quotas (`--old-bin`), in alternating rounds (the machine is shared and
noisy: only what the same run sees compares).

The server is pinned to core 0 and the client to core 1 (`taskset`); `--unpinned` runs them
where the OS puts them. Writes reports/<name>.md and .json; progress goes to stderr.

    python3 scripts/bench-kvquota.py --bin target/release/strata --old-bin /tmp/strata-old --rounds 5
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
import ab  # noqa: E402  (this folder's A/B script: the same helpers)
from ab import log  # noqa: E402
from resp_pipe import bench_args, info_stats, resp, run_pipelined  # noqa: E402

NS = "bench-ns"
MODES = ("old", "none", "under", "over")


def workload(prompts, chunks_per_prompt, value):
    """One pipelined `KVC.PUT` of a prompt's chunks and one `KVC.GET` of them, per prompt."""
    puts, gets = [], []
    for p in range(prompts):
        hashes = [f"{p:08x}{i:04x}" for i in range(chunks_per_prompt)]
        puts.append(resp("KVC.PUT", NS, *[x for h in hashes for x in (h, value)]))
        gets.append(resp("KVC.GET", NS, *hashes))
    return puts, gets


def one_round(args, mode, puts, gets, total_bytes):
    binary = args.old_bin if mode == "old" else args.bin
    with tempfile.TemporaryDirectory() as data:
        proc, port = ab.start_strata(binary, data, "none")
        try:
            if ab.PINNED:
                os.sched_setaffinity(0, {1})
            quota = {"under": total_bytes * 2, "over": total_bytes // 2}.get(mode)
            if quota:
                run_pipelined(port, [resp("KVC.QUOTA", NS, quota)])
            chunks = len(puts) * args.chunks_per_prompt
            got = {"put": chunks / run_pipelined(port, puts)}
            if mode != "over":  # past a quota most prompts' first chunks are gone
                got["get"] = chunks / run_pipelined(port, gets)
            got["over_quota"] = int(info_stats(port).get("kvc_chunks_over_quota", 0))
            return got
        finally:
            proc.terminate()
            proc.wait(30)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bench_args(ap)
    ap.add_argument("--old-bin", required=True, help="a build from before quotas")
    ap.add_argument("--name", default="kvc-quota-cost")
    args = ap.parse_args()
    ab.PINNED = not args.unpinned
    puts, gets = workload(args.prompts, args.chunks_per_prompt, b"v" * args.value_bytes)
    total = args.prompts * args.chunks_per_prompt * args.value_bytes
    rows = {m: [] for m in MODES}
    for r in range(args.rounds):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            got = one_round(args, mode, puts, gets, total)
            rows[mode].append(got)
            log(f"round {r + 1}/{args.rounds} {mode}: put {got['put']:,.0f} chunks/s"
                + (f", get {got['get']:,.0f} chunks/s" if "get" in got else "")
                + f", {got['over_quota']:,} dropped for the quota")
    med = {m: {k: statistics.median(x[k] for x in rows[m]) for k in rows[m][0] if k != "over_quota"} for m in MODES}
    ratio = {m: {k: med[m][k] / med["none"][k] for k in med[m]} for m in MODES}
    per_round = {m: [x["put"] / n["put"] for x, n in zip(rows[m], rows["none"])] for m in MODES}
    report = {"args": vars(args), "median": med, "ratio_to_no_quota": ratio, "put_round_ratios": per_round,
              "rounds": rows}
    out = ROOT / "reports" / args.name
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    pinned = "server on core 0, client on core 1" if not args.unpinned else "unpinned"
    names = {"old": "before quotas (old binary)", "none": "no quota", "under": "quota 2x what is written",
             "over": "quota 1/2 of what is written"}
    lines = [
        f"# What quotas per namespace cost ({pinned})",
        "",
        f"`python3 scripts/bench-kvquota.py {' '.join(sys.argv[1:])}`: {args.prompts} prompts of "
        f"{args.chunks_per_prompt} chunks of {args.value_bytes} B in one namespace, one pipelined `KVC.PUT` "
        f"and one `KVC.GET` per prompt, 32 in flight, `durability=none`, in alternating rounds.",
        "",
        "| | KVC.PUT chunks/s | / no quota | per round | KVC.GET chunks/s | / no quota |",
        "|---|---:|---:|---|---:|---:|",
    ]
    for m in MODES:
        per = ", ".join(f"{x:.3f}" for x in per_round[m])
        get = f"{med[m]['get']:,.0f} | {ratio[m]['get']:.3f}" if "get" in med[m] else "– | –"
        lines.append(f"| {names[m]} | {med[m]['put']:,.0f} | {ratio[m]['put']:.3f} | {per} | {get} |")
    dropped = [x["over_quota"] for x in rows["over"]]
    lines += ["", f"Chunks dropped for the quota per round of the last row: {', '.join(f'{d:,}' for d in dropped)}."]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    log(f"wrote {out}.md")


if __name__ == "__main__":
    main()
