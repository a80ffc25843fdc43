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
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "clients" / "python"))
from ab import free_port, log  # noqa: E402  (this folder's A/B script: the same helpers)
from strata_client.kvcache import Namespace, tokens_le  # noqa: E402


def resp(*args) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += [b"$%d\r\n" % len(a), a, b"\r\n"]
    return b"".join(out)


def read_replies(sock, n, buf=b""):
    """Reads `n` whole replies (integers, errors, arrays of bulk strings) and returns the rest."""
    done = 0
    while done < n:
        while True:
            end = skip_reply(buf, 0)
            if end is None:
                break
            if buf[:1] == b"-":
                raise RuntimeError(buf[: buf.index(b"\r\n")].decode())
            buf, done = buf[end:], done + 1
            if done == n:
                return buf
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise RuntimeError("server closed the connection")
        buf += chunk
    return buf


def skip_reply(buf, at):
    """Where the reply at `at` ends, or None if it has not all arrived."""
    line = buf.find(b"\r\n", at)
    if line < 0:
        return None
    kind, head = buf[at : at + 1], buf[at + 1 : line]
    if kind in (b"+", b"-", b":"):
        return line + 2
    if kind == b"$":
        n = int(head)
        end = line + 2 + max(n, 0) + (2 if n >= 0 else 0)
        return end if n < 0 or len(buf) >= end else None
    if kind == b"*":
        at = line + 2
        for _ in range(max(int(head), 0)):
            at = skip_reply(buf, at)
            if at is None:
                return None
        return at
    raise RuntimeError(f"unexpected reply {buf[at:at + 40]!r}")


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


def run_pipelined(port, commands, depth=32):
    """Sends `commands` with `depth` in flight; returns the seconds taken."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    start = time.perf_counter()
    buf = b""
    for i in range(0, len(commands), depth):
        batch = commands[i : i + depth]
        sock.sendall(b"".join(batch))
        buf = read_replies(sock, len(batch), buf)
    took = time.perf_counter() - start
    sock.close()
    return took


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


def info_stats(port):
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(resp("INFO", "stats"))
    buf = b""
    while skip_reply(buf, 0) is None:
        buf += sock.recv(1 << 16)
    sock.close()
    text = buf[buf.index(b"\r\n") + 2 :].decode()
    return dict(line.split(":", 1) for line in text.split("\r\n") if ":" in line)


def one_round(args, feed, puts, gets, chunks, consumer_on=True):
    with tempfile.TemporaryDirectory() as data:
        port = free_port()
        settings = ["--set", "metrics_port=0", "--set", "durability=none"]
        endpoint = f"ipc://{data}/kv-events"
        if feed:
            settings += ["--set", f"kv_events_endpoint={endpoint}"]
        pin = (lambda c: ["taskset", "-c", str(c)]) if not args.unpinned else (lambda c: [])
        proc = subprocess.Popen(
            pin(0) + [args.bin, "serve", "--data-dir", data, "--port", str(port)] + settings,
            env=dict(os.environ, STRATA_LOG_LEVEL="warn"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            for _ in range(600):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    time.sleep(0.05)
            if not args.unpinned:
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
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "strata"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=2000)
    ap.add_argument("--chunks-per-prompt", type=int, default=8)
    ap.add_argument("--chunk-tokens", type=int, default=64)
    ap.add_argument("--value-bytes", type=int, default=4096)
    ap.add_argument("--unpinned", action="store_true")
    ap.add_argument("--name", default="kvevents")
    args = ap.parse_args()
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
