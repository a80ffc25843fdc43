#!/usr/bin/env python3
"""One contender's multi-turn KV-cache workload, run by `strata-bench compare` inside a memory
cgroup (with the contender's server, when it has one), so the memory the contender may use is
bounded as it would be on a shared inference node.

`--users` conversations of `--turns` turns; each turn adds `--chunks-per-turn` chunks of 256
tokens. From the second turn on, a turn first reads its whole earlier prefix back (timed: the
cached tokens found, leading chunks only) and then writes its new chunks. Backends:

- `strata`: `KVCacheClient.retrieve_into` (the client LMCache's plugin uses), `KVC.PUT`;
- `redis`: `MGET` read with the same `recv_into` reader into the same buffers, `MSET`;
- `files`: one file per chunk, `readinto` the same buffers, written with `write`.

Prints one JSON object: cached tokens per second, read p50/p95 in ms, hit rate.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path.cwd() / "clients" / "python"))

from strata_client import KVCacheClient, Namespace  # noqa: E402
from strata_client.wire import Wire  # noqa: E402

CHUNK_TOKENS = 256


def user_tokens(u: int, n: int):
    return [(u * 1_000_003 + i * 7919) % 128_000 for i in range(n)]


def chunk_bytes(u: int, i: int, n: int) -> bytes:
    return bytes([(u * 31 + i) % 251]) * n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=["strata", "redis", "files"], required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--dir", default="")
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--chunks-per-turn", type=int, default=8)
    ap.add_argument("--chunk-bytes", type=int, default=2 << 20)
    a = ap.parse_args()
    ns = Namespace("bench", "main", "bf16", "compare", 1, 0, chunk_tokens=CHUNK_TOKENS)
    url = f"redis://127.0.0.1:{a.port}"
    kv = KVCacheClient(url, ns) if a.backend == "strata" else None
    wire = Wire(url) if a.backend != "files" else None
    most = (a.turns - 1) * a.chunks_per_turn
    buffers = [bytearray(a.chunk_bytes) for _ in range(most)]
    views = [memoryview(b) for b in buffers]
    lat, cached, wanted, read_s = [], 0, 0, 0.0
    for turn in range(a.turns):
        for u in range(a.users):
            tokens = user_tokens(u, (turn + 1) * a.chunks_per_turn * CHUNK_TOKENS)
            hashes = ns.chunk_hashes(tokens)
            keys = [ns.key_of(h) for h in hashes]
            prefix = turn * a.chunks_per_turn
            if prefix:
                t = time.perf_counter()
                if a.backend == "strata":
                    found = len(kv.retrieve_into(tokens[: prefix * CHUNK_TOKENS], buffers[:prefix]))
                elif a.backend == "redis":
                    wire.send([["MGET", *keys[:prefix]]])
                    lens = wire.read_bulks(lambda i, n: views[i][:n])
                    found = next((i for i, n in enumerate(lens) if n < 0), len(lens))
                else:
                    found = 0
                    for i in range(prefix):
                        try:
                            with open(os.path.join(a.dir, keys[i].replace(":", "_")), "rb", buffering=0) as f:
                                f.readinto(views[i])
                        except FileNotFoundError:
                            break
                        found += 1
                dt = time.perf_counter() - t
                read_s += dt
                lat.append(dt * 1e3)
                cached += found * CHUNK_TOKENS
                wanted += prefix * CHUNK_TOKENS
            # One chunk per command: the client holds one chunk beside its read buffers.
            for i in range(prefix, len(hashes)):
                c = chunk_bytes(u, i, a.chunk_bytes)
                if a.backend == "strata":
                    wire.call(["KVC.PUT", ns.id, hashes[i], c])
                elif a.backend == "redis":
                    wire.call(["SET", keys[i], c])
                else:
                    with open(os.path.join(a.dir, keys[i].replace(":", "_")), "wb") as f:
                        f.write(c)
    lat.sort()
    pct = lambda q: lat[min(int(len(lat) * q), len(lat) - 1)] if lat else 0.0  # noqa: E731
    print(json.dumps({
        "cached_tokens_per_sec": cached / max(read_s, 1e-9),
        "read_p50_ms": pct(0.50),
        "read_p95_ms": pct(0.95),
        "hit_rate": cached / max(wanted, 1),
        "working_set_bytes": a.users * a.turns * a.chunks_per_turn * a.chunk_bytes,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
