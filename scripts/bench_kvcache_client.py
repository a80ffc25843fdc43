#!/usr/bin/env python3
"""How fast the Python client reads a cached KV prefix, beside a raw socket reading the same
reply in the same run.

A `strata` server (pinned to core 0 when `taskset` exists) holds a prefix of `--chunks`
chunks of `--chunk-mib` MiB in DRAM; the client (pinned to core 1) reads it back with:

- `raw`: one `KVC.GET` of every chunk, the whole reply read with `recv_into` into one
  buffer, nothing parsed: the ceiling for any Python reader;
- `retrieve`: `KVCacheClient.retrieve` (each chunk straight into a new `bytearray`);
- `retrieve_into`: `KVCacheClient.retrieve_into` into buffers allocated once;
- `redis-py`: the same `KVC.GET` through redis-py (what `retrieve` did before);
- `redis-py GET`: one `GET` of a value as large as the whole prefix.

Prints GiB/s per method (median of `--rounds`) and the ratio to `raw`, and writes
`<out>.md` and `<out>.json`. `--quick` is a small run for the tests (it asserts no timings).
"""

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "clients" / "python"))

import redis  # noqa: E402

from strata_client import KVCacheClient, Namespace  # noqa: E402
from strata_client.wire import pack  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(binary: str, data_dir: str, port: int, hot_bytes: int) -> subprocess.Popen:
    args = [binary, "serve", "--data-dir", data_dir, "--port", str(port), "--set", "metrics_port=0",
            "--set", "durability=none", "--set", f"hot_bytes_max={hot_bytes}"]
    if shutil.which("taskset"):
        args = ["taskset", "-c", "0", *args]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("strata did not start")
            time.sleep(0.05)


def raw_reader(port: int, request: bytes, reply_bytes: int):
    """Reads the reply to ``request`` (``reply_bytes`` long) with recv_into, unparsed."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = memoryview(bytearray(reply_bytes))

    def read():
        sock.sendall(request)
        got = 0
        while got < reply_bytes:
            n = sock.recv_into(buf[got:])
            if n == 0:
                raise ConnectionError("closed")
            got += n

    return read, sock


def measure(methods: dict, nbytes: int, rounds: int) -> dict:
    """GiB/s of each method per round, the methods taking turns within each round (so the
    machine's noise falls on all of them alike); median, min and max."""
    for fn in methods.values():
        fn()  # warm up (connections, first allocations)
    rates = {name: [] for name in methods}
    for i in range(rounds):
        for name, fn in methods.items():
            t = time.perf_counter()
            fn()
            rates[name].append(nbytes / (time.perf_counter() - t) / (1 << 30))
        now = ", ".join(f"{n} {r[-1]:.2f}" for n, r in rates.items())
        print(f"  round {i + 1}/{rounds}: {now} GiB/s", file=sys.stderr, flush=True)
    return {
        name: {"gib_per_s": statistics.median(r), "rounds": rounds, "min": min(r), "max": max(r)}
        for name, r in rates.items()
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--strata", default=os.environ.get("STRATA_BIN", str(ROOT / "target" / "release" / "strata")))
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--chunk-mib", type=float, default=4)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="2 chunks of 1 MiB, 3 rounds")
    ap.add_argument("--out", default=str(ROOT / "reports" / "kvcache-client"))
    a = ap.parse_args()
    if a.quick:
        a.chunks, a.chunk_mib, a.rounds = 2, 1, 3
    chunk_bytes = int(a.chunk_mib * (1 << 20))
    total = chunk_bytes * a.chunks
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) > 1:
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    with tempfile.TemporaryDirectory() as d:
        port = free_port()
        server = start_server(a.strata, d, port, hot_bytes=4 * total + (64 << 20))
        try:
            url = f"redis://127.0.0.1:{port}"
            ns = Namespace("bench", "main", "bf16", "vllm-paged", 1, 0, chunk_tokens=256)
            tokens = list(range(256 * a.chunks))
            chunks = [os.urandom(chunk_bytes) for _ in range(a.chunks)]
            c = KVCacheClient(url, ns)
            print(f"storing {a.chunks} chunks of {chunk_bytes} bytes", file=sys.stderr)
            assert c.store(tokens, chunks) == a.chunks
            assert c.tiers(tokens) == ["hot"] * a.chunks, "the prefix must be in DRAM"
            r = redis.Redis(host="127.0.0.1", port=port)
            r.set("whole", b"".join(chunks))
            hashes = ns.chunk_hashes(tokens)
            request = pack(["KVC.GET", ns.id, *hashes])
            reply_bytes = len(b"*%d\r\n" % a.chunks) + sum(len(b"$%d\r\n\r\n" % chunk_bytes) + chunk_bytes for _ in chunks)
            raw, raw_sock = raw_reader(port, request, reply_bytes)
            bufs = [bytearray(chunk_bytes) for _ in chunks]
            via_redis_py = KVCacheClient(url, ns)
            via_redis_py.direct = False
            assert c.retrieve(tokens) == chunks and via_redis_py.retrieve(tokens) == chunks
            methods = {
                "raw": raw,
                "retrieve": lambda: c.retrieve(tokens),
                "retrieve_into": lambda: c.retrieve_into(tokens, bufs),
                "redis-py": lambda: via_redis_py.retrieve(tokens),
                "redis-py GET": lambda: r.get("whole"),
            }
            print(f"reading {total / (1 << 20):.0f} MiB per round, {a.rounds} rounds each", file=sys.stderr)
            results = measure(methods, total, a.rounds)
            raw_sock.close()
        finally:
            server.kill()
            server.wait()
    base = results["raw"]["gib_per_s"]
    for v in results.values():
        v["ratio_to_raw"] = v["gib_per_s"] / base
    report = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}, Python {platform.python_version()}, redis-py {redis.__version__}",
        "chunks": a.chunks,
        "chunk_bytes": chunk_bytes,
        "results": results,
    }
    lines = [
        f"# Python client reads of a cached KV prefix ({time.strftime('%Y-%m-%d')})",
        "",
        f"`{report['command']}` on {report['machine']}.",
        f"A prefix of {a.chunks} chunks of {chunk_bytes} bytes in DRAM; server on core 0, client on core 1;",
        f"median of {a.rounds} rounds, the methods taking turns in each. `raw` reads the same `KVC.GET` reply",
        "with `recv_into` into one buffer it reuses, and parses nothing; `retrieve` allocates a new buffer per",
        "chunk each time (the page faults of fresh memory are part of its cost), `retrieve_into` reuses its own.",
        "",
        "| method | GiB/s | × raw |",
        "|---|---:|---:|",
    ]
    for name, v in results.items():
        lines.append(f"| {name} | {v['gib_per_s']:.2f} | {v['ratio_to_raw']:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out + ".md").write_text(text)
    Path(a.out + ".json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
