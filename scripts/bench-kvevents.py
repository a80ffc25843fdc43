#!/usr/bin/env python3
"""What the KV event feed costs: `KVC.PUT ... TOKENS` and `KVC.GET` rates with the feed on
and off, and `KVC.PUT` without tokens (nothing kept beside the chunks), in alternating rounds
of the same binary (the machine is shared and noisy: only
what both see in the same run compares), and whether a native consumer (a pyzmq SUB socket
in its own process) saw every batch at full rate: sequence gaps, events received against
events the server sent.

The server is pinned to core 0 and the client and the consumer to core 1 (`taskset`);
`--unpinned` runs them where the OS puts them, as a newcomer would. Writes
reports/<name>.md and .json; progress goes to stderr.

    python3 scripts/bench-kvevents.py --bin target/release/strata --rounds 5 --name kvevents
"""

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "clients" / "python"))
import ab  # noqa: E402  (this folder's A/B script: the same helpers)
from ab import log  # noqa: E402
from resp_pipe import bench_args, info_stats, resp, run_pipelined  # noqa: E402
from strata_client.kvcache import Namespace, tokens_le  # noqa: E402


def workload(ns, prompts, chunks_per_prompt, chunk_tokens, value):
    """One pipelined `KVC.PUT ... TOKENS` per prompt (and the same without tokens), and one
    `KVC.GET` per prompt."""
    puts, plain, gets = [], [], []
    for p in range(prompts):
        tokens = [p * 1_000_000 + i for i in range(chunks_per_prompt * chunk_tokens)]
        hashes = ns.chunk_hashes(tokens)
        args = ["KVC.PUT", ns.id, "TOKENS", ""]
        for i, h in enumerate(hashes):
            args += [h, value, tokens_le(tokens[i * chunk_tokens : (i + 1) * chunk_tokens])]
        puts.append(resp(*args))
        plain.append(resp("KVC.PUT", ns.id, *[x for h in hashes for x in (h, value)]))
        gets.append(resp("KVC.GET", ns.id, *hashes))
    return puts, plain, gets


def consume(endpoint, ready, stop, out):
    """A native consumer: counts events and sequence gaps until `stop` is set."""
    import msgpack
    import zmq

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.RCVTIMEO, 200)
    sub.connect(endpoint)
    time.sleep(0.3)
    ready.set()
    events = gaps = batches = 0
    last = None
    while True:
        try:
            _, seq8, payload = sub.recv_multipart()
        except zmq.Again:
            if stop.is_set():
                break
            continue
        seq = int.from_bytes(seq8, "big")
        if last is not None and seq != last + 1:
            gaps += 1
        last = seq
        batches += 1
        events += len(msgpack.unpackb(payload)[1])
    out.put({"events": events, "gaps": gaps, "batches": batches})
    ctx.destroy(linger=0)


def one_round(args, feed, puts, gets, chunks, consumer_on=True):
    with tempfile.TemporaryDirectory() as data:
        endpoint = f"ipc://{data}/kv-events"
        binary = f"{args.bin}@kv_events_endpoint={endpoint}" if feed else args.bin
        proc, port = ab.start_strata(binary, data, "none")
        try:
            if ab.PINNED:
                os.sched_setaffinity(0, {1})
            seen = None
            if feed and consumer_on:
                ready, stop, out = multiprocessing.Event(), multiprocessing.Event(), multiprocessing.Queue()
                consumer = multiprocessing.Process(target=consume, args=(endpoint, ready, stop, out))
                consumer.start()
                ready.wait(10)
            put_s = run_pipelined(port, puts)
            get_s = run_pipelined(port, gets)
            stats = info_stats(port)
            if feed and consumer_on:
                time.sleep(0.5)
                stop.set()
                seen = out.get(timeout=30)
                consumer.join(10)
                seen["sent"] = int(stats.get("kv_events_sent", 0))
                seen["dropped"] = int(stats.get("kv_events_dropped", 0))
            return {"put": chunks / put_s, "get": chunks / get_s, "seen": seen}
        finally:
            proc.terminate()
            proc.wait(30)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bench_args(ap)
    ap.add_argument("--chunk-tokens", type=int, default=64)
    ap.add_argument("--name", default="kvevents")
    args = ap.parse_args()
    ab.PINNED = not args.unpinned
    ns = Namespace("bench-model", "main", "bf16", "vllm", 1, 0, args.chunk_tokens)
    value = b"v" * args.value_bytes
    puts, plain, gets = workload(ns, args.prompts, args.chunks_per_prompt, args.chunk_tokens, value)
    chunks = args.prompts * args.chunks_per_prompt
    rows = {"plain": [], "off": [], "on": [], "unread": []}
    for r in range(args.rounds):
        order = ("plain", "off", "unread", "on") if r % 2 == 0 else ("on", "unread", "off", "plain")
        for mode in order:
            feed = mode in ("on", "unread")
            got = one_round(args, feed, plain if mode == "plain" else puts, gets, chunks, mode == "on")
            rows[mode].append(got)
            seen = got["seen"]
            log(f"round {r + 1}/{args.rounds} feed {mode}: put {got['put']:,.0f} chunks/s, get {got['get']:,.0f} chunks/s"
                + (f", consumer {seen['events']:,} of {seen['sent']:,} events, {seen['gaps']} gaps" if seen else ""))
    med = {m: {k: statistics.median(x[k] for x in rows[m]) for k in ("put", "get")} for m in rows}
    ratios = [{k: on[k] / off[k] for k in ("put", "get")} for on, off in zip(rows["on"], rows["off"])]
    unread = [{k: u[k] / off[k] for k in ("put", "get")} for u, off in zip(rows["unread"], rows["off"])]
    kept = [off["put"] / p["put"] for off, p in zip(rows["off"], rows["plain"])]
    seen = [x["seen"] for x in rows["on"]]
    report = {
        "args": vars(args), "median": med,
        "ratio_on_off": {k: med["on"][k] / med["off"][k] for k in ("put", "get")},
        "ratio_unread_off": {k: med["unread"][k] / med["off"][k] for k in ("put", "get")},
        "round_ratios": ratios, "consumer": seen,
        "tokens_kept_over_plain_put": statistics.median(kept), "tokens_kept_round_ratios": kept,
    }
    out = ROOT / "reports" / args.name
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    pinned = "server on core 0, client and consumer on core 1" if not args.unpinned else "unpinned"
    lines = [
        f"# The KV event feed's cost ({pinned})",
        "",
        f"`python3 scripts/bench-kvevents.py {' '.join(sys.argv[1:])}`: {args.prompts} prompts of "
        f"{args.chunks_per_prompt} chunks ({args.chunk_tokens} tokens, {args.value_bytes} B each), one pipelined "
        f"`KVC.PUT ... TOKENS` and one `KVC.GET` per prompt, 32 in flight, `durability=none`; the feed on "
        f"(a pyzmq SUB consumer in its own process) and off in alternating rounds of the same binary.",
        "",
        "The consumer decodes every batch in Python on the client's core, so the rows with it also "
        "measure what it takes from the client; the rows with no subscriber measure the server alone.",
        "",
        "| | feed off (median) | feed on (median) | on / off | per round |",
        "|---|---:|---:|---:|---|",
    ]
    for k, name in (("put", "KVC.PUT chunks/s"), ("get", "KVC.GET chunks/s")):
        per = ", ".join(f"{x[k]:.3f}" for x in ratios)
        lines.append(f"| {name} | {med['off'][k]:,.0f} | {med['on'][k]:,.0f} | {report['ratio_on_off'][k]:.3f} | {per} |")
    for k, name in (("put", "KVC.PUT chunks/s"), ("get", "KVC.GET chunks/s")):
        per = ", ".join(f"{x[k]:.3f}" for x in unread)
        lines.append(f"| {name}, feed on with no subscriber | {med['off'][k]:,.0f} | {med['unread'][k]:,.0f} | "
                     f"{report['ratio_unread_off'][k]:.3f} | {per} |")
    lines += [
        "",
        f"`KVC.PUT ... TOKENS` with the feed off beside `KVC.PUT` without tokens (a record of the tokens "
        f"beside each chunk): {med['off']['put']:,.0f} against {med['plain']['put']:,.0f} chunks/s, "
        f"{report['tokens_kept_over_plain_put']:.3f} (per round {', '.join(f'{x:.3f}' for x in kept)}).",
        "",
        "Consumer, per round with the feed on: events received / sent by the server, sequence gaps, drops:",
        "",
    ]
    lines += [f"- {s['events']:,} / {s['sent']:,} events, {s['batches']:,} batches, {s['gaps']} gaps, "
              f"{s['dropped']} dropped" for s in seen]
    (out.with_suffix(".md")).write_text("\n".join(lines) + "\n")
    log(f"wrote {out}.md")


if __name__ == "__main__":
    main()
