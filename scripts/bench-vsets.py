#!/usr/bin/env python3
"""Vector sets beside hnswlib: recall@10 against an exact float32 cosine search, queries per
second on one thread as ef is swept (Strata's time per `VSIM ... NOTHREAD` minus a `PING`
round trip on the same client), insert rate beside hnswlib's build rate, memory per vector,
and how long a restarted server takes to build the graph again (its first `VCARD`).

Data: `--n` vectors of `--dim` dimensions around 100 random centres (each component
uniform in [-1, 1], a vector its centre plus uniform noise of ±`--spread`); queries drawn
the same way, not in the set. Same M (16) and build ef (200) on both sides.

The server is pinned to core 0 and the client (and hnswlib) to core 1; `--unpinned` leaves
them where the OS puts them. Needs numpy and hnswlib (`pip install hnswlib`). Writes
reports/<name>.md and .json; progress goes to stderr.

    python3 scripts/bench-vsets.py --bin target/release/strata --n 100000 --dim 96
"""

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
import ab  # noqa: E402  (this folder's A/B script: the same helpers)
from ab import log  # noqa: E402
from resp_pipe import read_replies, resp, skip_reply  # noqa: E402


def clustered(n, dim, spread, rng, centres):
    return (centres[rng.integers(0, len(centres), n)] + rng.uniform(-spread, spread, (n, dim))).astype(np.float32)


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


class Conn:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def call_all(self, cmds):
        self.sock.sendall(b"".join(cmds))
        self.buf = read_replies(self.sock, len(cmds), self.buf)

    def call(self, *args):
        """One command; its raw reply."""
        self.sock.sendall(resp(*args))
        while True:
            end = skip_reply(self.buf, 0)
            if end is not None:
                reply, self.buf = self.buf[:end], self.buf[end:]
                return reply
            self.buf += self.sock.recv(1 << 20)


def names_of(reply):
    """The bulk strings of a flat array reply."""
    out, at = [], reply.index(b"\r\n") + 2
    while at < len(reply):
        end = reply.index(b"\r\n", at)
        n = int(reply[at + 1:end])
        out.append(reply[end + 2:end + 2 + n])
        at = end + 4 + n
    return out


def strata_side(args, quant, data, queries, truth):
    with tempfile.TemporaryDirectory() as d:
        proc, port = ab.start_strata(args.bin, d, "none")
        try:
            if ab.PINNED:
                os.sched_setaffinity(0, {1})
            c = Conn(port)
            before = rss(proc.pid)
            t = time.perf_counter()
            for i in range(0, len(data), 500):
                c.call_all([resp("VADD", "v", "FP32", data[j].tobytes(), f"e{j}", quant, "M", 16)
                            for j in range(i, min(i + 500, len(data)))])
                if i % 20000 == 0:
                    log(f"strata {quant}: {i:,} of {len(data):,} added")
            insert = len(data) / (time.perf_counter() - t)
            mem = (rss(proc.pid) - before) / len(data)
            t = time.perf_counter()
            for _ in range(2000):
                c.call("PING")
            ping = (time.perf_counter() - t) / 2000
            rows = []
            for ef in args.efs:
                hits, t = 0, time.perf_counter()
                for qi, q in enumerate(queries):
                    got = names_of(c.call("VSIM", "v", "FP32", q.tobytes(), "COUNT", 10, "EF", ef, "NOTHREAD"))
                    hits += len(truth[qi] & {int(g[1:]) for g in got})
                per = (time.perf_counter() - t) / len(queries) - ping
                rows.append({"ef": ef, "recall": hits / (10 * len(queries)), "qps": 1 / max(per, 1e-9)})
                log(f"strata {quant} ef {ef}: recall {rows[-1]['recall']:.3f}, {rows[-1]['qps']:,.0f} q/s")
            proc.terminate()
            proc.wait(120)
            proc, port = ab.start_strata(args.bin, d, "none")
            t = time.perf_counter()
            Conn(port).call("VCARD", "v")
            rebuild = time.perf_counter() - t
            log(f"strata {quant}: graph built again in {rebuild:.1f} s after a restart")
            return {"insert_per_s": insert, "bytes_per_vector": mem, "ping_s": ping, "rows": rows, "rebuild_s": rebuild}
        finally:
            proc.terminate()
            proc.wait(120)


def hnswlib_side(args, data, queries, truth):
    import hnswlib

    if ab.PINNED:
        os.sched_setaffinity(0, {1})
    index = hnswlib.Index(space="cosine", dim=data.shape[1])
    index.init_index(max_elements=len(data), M=16, ef_construction=200)
    index.set_num_threads(1)
    t = time.perf_counter()
    index.add_items(data, np.arange(len(data)), num_threads=1)
    build = len(data) / (time.perf_counter() - t)
    with tempfile.NamedTemporaryFile() as f:
        index.save_index(f.name)
        mem = os.path.getsize(f.name) / len(data)
    rows = []
    for ef in args.efs:
        index.set_ef(max(ef, 10))
        hits, t = 0, time.perf_counter()
        for qi, q in enumerate(queries):
            labels, _ = index.knn_query(q, k=10, num_threads=1)
            hits += len(truth[qi] & set(labels[0].tolist()))
        per = (time.perf_counter() - t) / len(queries)
        rows.append({"ef": ef, "recall": hits / (10 * len(queries)), "qps": 1 / per})
        log(f"hnswlib ef {ef}: recall {rows[-1]['recall']:.3f}, {rows[-1]['qps']:,.0f} q/s")
    return {"insert_per_s": build, "bytes_per_vector": mem, "rows": rows}


def at_recall(rows, goal):
    """Queries per second at the first ef whose recall reaches `goal` (None if none does)."""
    return next(((r["ef"], r["qps"]) for r in rows if r["recall"] >= goal), None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "strata"))
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=96)
    ap.add_argument("--spread", type=float, default=0.3)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--efs", default="10,20,40,80,160,320")
    ap.add_argument("--quants", default="Q8,NOQUANT")
    ap.add_argument("--unpinned", action="store_true")
    ap.add_argument("--name", default="vsets")
    args = ap.parse_args()
    args.efs = [int(x) for x in args.efs.split(",")]
    ab.PINNED = not args.unpinned
    rng = np.random.default_rng(7)
    centres = rng.uniform(-1, 1, (100, args.dim))
    data = clustered(args.n, args.dim, args.spread, rng, centres)
    queries = clustered(args.queries, args.dim, args.spread, rng, centres)
    unit = data / np.linalg.norm(data, axis=1, keepdims=True)
    qunit = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    truth = [set(np.argsort(-(unit @ q))[:10].tolist()) for q in qunit]
    log(f"{args.n:,} vectors of {args.dim} dimensions, exact answers computed")
    result = {"args": vars(args), "hnswlib": hnswlib_side(args, data, queries, truth)}
    for quant in args.quants.split(","):
        result[quant] = strata_side(args, quant, data, queries, truth)
    out = ROOT / "reports" / args.name
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    write_report(out.with_suffix(".md"), args, result)
    log(f"wrote {out}.md")


def write_report(path, args, r):
    pinned = "server on core 0, client and hnswlib on core 1" if ab.PINNED else "unpinned"
    h = r["hnswlib"]
    lines = [
        f"# Vector sets beside hnswlib ({pinned})", "",
        f"`python3 scripts/bench-vsets.py {' '.join(sys.argv[1:])}`: {args.n:,} vectors of {args.dim} "
        f"dimensions around 100 centres (spread ±{args.spread}), {args.queries} queries not in the set, "
        "recall@10 against exact float32 cosine, one thread each side, M 16, build ef 200.", "",
        "| | ef | recall@10 | queries/s |", "|---|---:|---:|---:|",
    ]
    for name in ["hnswlib"] + args.quants.split(","):
        lines += [f"| {name} | {row['ef']} | {row['recall']:.3f} | {row['qps']:,.0f} |" for row in r[name]["rows"]]
    lines += ["", "| | inserts/s | bytes per vector | at recall 0.95: ef, queries/s | graph rebuilt after restart |",
              "|---|---:|---:|---|---:|"]
    for name in ["hnswlib"] + args.quants.split(","):
        s = r[name]
        hit = at_recall(s["rows"], 0.95)
        rebuild = f"{s['rebuild_s']:.1f} s" if "rebuild_s" in s else "–"
        lines.append(f"| {name} | {s['insert_per_s']:,.0f} | {s['bytes_per_vector']:,.0f} | "
                     f"{'not reached' if hit is None else f'{hit[0]}, {hit[1]:,.0f}'} | {rebuild} |")
    lines += ["", "Strata's queries/s is one over (time per `VSIM` minus a `PING` round trip on the same "
              "client); its bytes per vector are the server's resident memory growth over the load; "
              "hnswlib's are its saved index's size."]
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
