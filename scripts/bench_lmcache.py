#!/usr/bin/env python3
"""LMCache's two paths to Strata, side by side with a real redis-server in the same run.

Each request looks up a prompt's cached prefix, then reads the cached chunks back:

- `lmcache-redis`: what LMCache's stock `redis://` connector does: `EXISTS <key>metadata`
  chunk by chunk until a miss, then `GET <key>metadata` and `GET <key>kv_bytes` per chunk
  (chunks fetched concurrently over a pool, which flatters it);
- `strata-connector`: `strata_client.lmcache.StrataConnector`: one `KVC.MATCH`, then
  pipelined `KVC.GET`;
- `strata-connector, local`: the same, but the chunks are mapped from Strata's value-log
  files (`KVC.LOCATE`) instead of crossing the socket, as a client on Strata's machine can.

Stock path against redis-server (the baseline) and against Strata; Strata's connector
against Strata. With `--lmcache` (run it with the Python of LMCache's virtual environment,
which `scripts/install-deps` makes) the paths are LMCache's own code instead: its stock
`RedisConnector`, and `StrataRemoteConnector` loaded through LMCache's plugin setting, each
reading into LMCache's CPU memory objects. Writes reports/<report>.{md,json,png}; prints
progress.

    scripts/bench_lmcache.py [--prompts 8] [--chunks 16] [--chunk-kib 1024] [--requests 40]
                             [--lmcache] [--report lmcache]
"""

import argparse
import asyncio
import json
import os
import pathlib
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import redis.asyncio as aioredis

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "clients" / "python"))
from strata_client.lmcache import StrataConnector  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen):
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"server on {port} exited")
            time.sleep(0.05)
    raise RuntimeError(f"server on {port} did not start")


class StockConnector:
    """LMCache's redis:// connector's command sequence (two keys per chunk)."""

    def __init__(self, url):
        self.pool = aioredis.ConnectionPool.from_url(url, max_connections=16)
        self.r = aioredis.Redis(connection_pool=self.pool)

    async def batched_contains(self, keys):
        n = 0
        for k in keys:
            if not await self.r.exists(k + "metadata"):
                break
            n += 1
        return n

    async def _get(self, k):
        meta = await self.r.get(k + "metadata")
        if meta is None:
            return None
        kv = await self.r.get(k + "kv_bytes")
        if kv is None:
            await self.r.delete(k + "metadata")
            return None
        return meta, kv

    async def batched_get(self, keys):
        got = await asyncio.gather(*(self._get(k) for k in keys))
        out = []
        for g in got:
            if g is None:
                break
            out.append(g)
        return out

    async def batched_put(self, keys, chunks):
        for k, (meta, kv) in zip(keys, chunks):
            await self.r.set(k + "kv_bytes", kv)
            await self.r.set(k + "metadata", meta)

    async def close(self):
        await self.pool.disconnect()


class LMCacheConnector:
    """One of LMCache's own connectors (`lmcache_harness.KINDS`) behind this benchmark's
    connector calls; chunks are read into and written from LMCache memory objects."""

    finished: list = []

    def __init__(self, kind: str, port: int, chunk_bytes: int):
        sys.path.insert(0, str(ROOT / "tests" / "python"))
        from lmcache_harness import TOKEN_BYTES, Harness

        if chunk_bytes % TOKEN_BYTES:
            sys.exit(f"--lmcache needs --chunk-kib in multiples of {TOKEN_BYTES >> 10} (whole tokens)")
        self.h = Harness(kind, f"127.0.0.1:{port}", chunk_bytes // TOKEN_BYTES, pool_bytes=512 << 20)

    @staticmethod
    def _keys(keys):
        from lmcache.utils import CacheEngineKey

        return [CacheEngineKey.from_string(k) for k in keys]

    async def batched_contains(self, keys):
        return await self.h.call(self.h.conn.batched_async_contains("bench", self._keys(keys)))

    async def batched_get(self, keys):
        objs = await self.h.call(self.h.conn.batched_get_non_blocking("bench", self._keys(keys)))
        out = [(b"", memoryview(m.byte_array).cast("B")) for m in objs]
        for m in objs:
            m.ref_count_down()
        return out

    async def batched_put(self, keys, chunks):
        objs = []
        for _, kv in chunks:
            m = self.h.chunk(0)
            memoryview(m.byte_array).cast("B")[:] = kv
            objs.append(m)
        await self.h.call(self.h.conn.batched_put(self._keys(keys), objs))
        for m in objs:
            m.ref_count_down()

    async def close(self):
        # LMCache's executor tasks never finish: keep their loop alive (a collected loop
        # with pending tasks complains) until the process exits.
        LMCacheConnector.finished.append(self)


def chunk_key(prompt: int, chunk: int) -> str:
    """An LMCache 0.5 key string (model@world_size@worker_id@chunk_hash@dtype)."""
    return f"llama-3.1-8b@1@0@{prompt:04x}{chunk:012x}@bfloat16"


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


async def run_path(name, conn, prompts, args, rng, one_round_trip):
    lookups, reads, bytes_read = [], [], 0
    # The consumer copies each chunk into its own staging memory (as an inference engine
    # moves it on to the GPU), so a path that hands out views still pays for touching them.
    staging = memoryview(bytearray(args.chunk_kib * 1024))
    for i in range(args.requests):
        keys = rng.choice(prompts)
        # Every request asks for its prompt plus a few chunks nobody has stored yet.
        asked = keys + [chunk_key(0xFFFF, i * 4 + j) for j in range(4)]
        t0 = time.perf_counter()
        n = await conn.batched_contains(asked)
        t1 = time.perf_counter()
        got = await conn.batched_get(asked[:n])
        for _, kv in got:
            staging[: len(kv)] = kv
        t2 = time.perf_counter()
        assert n == len(keys) and len(got) == n, (name, n, len(got))
        lookups.append((t1 - t0) * 1e3)
        reads.append((t2 - t1) * 1e3)
        bytes_read += sum(len(kv) for _, kv in got)
        if (i + 1) % 10 == 0 or i + 1 == args.requests:
            print(f"  {name}: {i + 1}/{args.requests} requests", file=sys.stderr, flush=True)
    total_read_s = sum(reads) / 1e3
    return {
        "path": name,
        "lookup_p50_ms": statistics.median(lookups),
        "lookup_p95_ms": pct(lookups, 95),
        "read_p50_ms": statistics.median(reads),
        "read_p95_ms": pct(reads, 95),
        "read_gib_per_sec": bytes_read / total_read_s / (1 << 30),
        "round_trips_lookup": "1" if one_round_trip else f"{args.chunks + 1}",
    }


async def main_async(args, strata_port, redis_port):
    rng = random.Random(7)
    kv_len = args.chunk_kib * 1024
    prompts = []
    for p in range(args.prompts):
        prompts.append([chunk_key(p, c) for c in range(args.chunks)])
    payload = os.urandom(kv_len)
    meta = b"M" * 28  # LMCache's RemoteMetadata is 28 bytes

    # Stock on Redis, stock on Strata, Strata's connector, and Strata's connector in local
    # mode (chunks mapped from Strata's files after KVC.LOCATE); from the third on, a path
    # finds the cached prefix in one round trip.
    strata_url = f"redis://127.0.0.1:{strata_port}"
    if args.lmcache:
        targets = [
            ("LMCache RedisConnector → redis-server", lambda: LMCacheConnector("redis", redis_port, kv_len)),
            ("LMCache RedisConnector → strata", lambda: LMCacheConnector("redis", strata_port, kv_len)),
            ("LMCache plugin://strata → strata", lambda: LMCacheConnector("strata", strata_port, kv_len)),
            ("LMCache plugin://strata, local → strata", lambda: LMCacheConnector("strata-local", strata_port, kv_len)),
        ]
    else:
        targets = [
            ("lmcache-redis → redis-server", lambda: StockConnector(f"redis://127.0.0.1:{redis_port}")),
            ("lmcache-redis → strata", lambda: StockConnector(strata_url)),
            ("strata-connector → strata", lambda: StrataConnector(strata_url)),
            ("strata-connector, local → strata", lambda: StrataConnector(strata_url, local=True)),
        ]
    runs = []  # runs[r][t]: one row per path per run; paths alternate within a run
    for r in range(args.repeat):
        runs.append([])
        for t, (name, make) in enumerate(targets):
            conn = make()
            print(f"run {r + 1}/{args.repeat}, {name}: storing {args.prompts} prompts × {args.chunks} chunks",
                  file=sys.stderr, flush=True)
            for keys in prompts:
                await conn.batched_put(keys, [(meta, payload)] * len(keys))
            runs[-1].append(await run_path(name, conn, prompts, args, random.Random(11 + r), one_round_trip=t >= 2))
            await conn.close()
    return runs


def median_rows(runs):
    """Per path, the median of each figure over the runs."""
    rows = []
    for t, first in enumerate(runs[0]):
        row = dict(first)
        for k, v in first.items():
            if isinstance(v, float):
                row[k] = statistics.median(run[t][k] for run in runs)
        rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--chunk-kib", type=int, default=1024)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=3, help="runs of every path, alternating; medians reported")
    ap.add_argument("--strata", default=str(ROOT / "target" / "release" / "strata"))
    ap.add_argument("--out", default=str(ROOT / "reports"))
    ap.add_argument("--lmcache", action="store_true", help="LMCache's own connectors (needs LMCache)")
    ap.add_argument("--report", default="lmcache", help="report file name (without extension)")
    args = ap.parse_args()
    if shutil.which("redis-server") is None:
        sys.exit("redis-server is missing: apt-get install redis-server")
    work = tempfile.TemporaryDirectory()
    sp, rp = free_port(), free_port()
    working_set = args.prompts * args.chunks * args.chunk_kib * 1024
    strata = subprocess.Popen(
        [args.strata, "serve", "--data-dir", work.name + "/strata", "--port", str(sp), "--set", "metrics_port=0",
         "--set", "durability=none", "--set", f"hot_bytes_max={2 * working_set + (64 << 20)}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    redis = subprocess.Popen(
        ["redis-server", "--port", str(rp), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", work.name, "--proto-max-bulk-len", "1gb"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(sp, strata)
        wait_port(rp, redis)
        started = time.time()
        runs = asyncio.run(main_async(args, sp, rp))
        took = time.time() - started
    finally:
        strata.kill()
        redis.kill()
        work.cleanup()
    def ratios_of(rows):
        base, stock_strata, conn, local = rows
        return {
            "local_connector_read_gib_vs_connector": local["read_gib_per_sec"] / conn["read_gib_per_sec"],
            "local_connector_read_gib_vs_stock_on_redis": local["read_gib_per_sec"] / base["read_gib_per_sec"],
            "connector_lookup_p50_vs_stock_on_strata": conn["lookup_p50_ms"] / stock_strata["lookup_p50_ms"],
            "connector_read_p95_vs_stock_on_redis": conn["read_p95_ms"] / base["read_p95_ms"],
            "connector_read_gib_vs_stock_on_redis": conn["read_gib_per_sec"] / base["read_gib_per_sec"],
            "stock_on_strata_read_gib_vs_stock_on_redis": stock_strata["read_gib_per_sec"] / base["read_gib_per_sec"],
        }

    rows = median_rows(runs)
    per_run = [ratios_of(run) for run in runs]
    ratios = {k: statistics.median(r[k] for r in per_run) for k in per_run[0]}
    cmd = "scripts/bench_lmcache.py " + " ".join(sys.argv[1:])
    report = {"args": vars(args), "rows": rows, "runs": runs, "ratios": ratios, "ratios_per_run": per_run,
              "seconds": took, "command": cmd}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.report}.json").write_text(json.dumps(report, indent=2) + "\n")
    md = [
        "# LMCache paths: stock redis:// connector vs Strata's connector, over the socket and local"
        + (" (LMCache's own code)" if args.lmcache else " (LMCache's command sequence, replayed)"),
        "",
        f"{args.prompts} prompts × {args.chunks} chunks of {args.chunk_kib} KiB, {args.requests} requests per path and run, "
        f"{args.repeat} runs with the paths alternating, medians; each "
        "request looks up its prompt plus 4 uncached chunks, then reads the cached prefix and copies every chunk "
        "into one staging buffer (so a path that hands out views of mapped files pays for touching the bytes). "
        "Strata with durability=none and DRAM larger than the working set; redis-server 7 without persistence. Same run.",
        "",
        "| path | lookup p50 ms | lookup p95 ms | read p50 ms | read p95 ms | read GiB/s | round trips per lookup |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        md.append(
            f"| {r['path']} | {r['lookup_p50_ms']:.2f} | {r['lookup_p95_ms']:.2f} | {r['read_p50_ms']:.1f} | "
            f"{r['read_p95_ms']:.1f} | {r['read_gib_per_sec']:.2f} | {r['round_trips_lookup']} |"
        )
    md += ["", "Ratios (medians of the per-run ratios; per run in brackets):", ""]
    md += [f"- {k}: {v:.2f} ({', '.join(f'{r[k]:.2f}' for r in per_run)})" for k, v in ratios.items()]
    md += ["", f"Command: `{cmd}` ({took:.0f} s). Chart: `{args.report}.png`.", ""]
    (out / f"{args.report}.md").write_text("\n".join(md))
    print("\n".join(md))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        names = [r["path"] for r in rows]
        axes[0].bar(names, [r["lookup_p50_ms"] for r in rows], color="tab:orange")
        axes[0].set_ylabel("prefix lookup p50 (ms)")
        axes[1].bar(names, [r["read_gib_per_sec"] for r in rows], color="tab:blue")
        axes[1].set_ylabel("prefix read GiB/s")
        for ax in axes:
            plt.setp(ax.get_xticklabels(), rotation=12, fontsize=7)
        fig.suptitle("LMCache paths (same run)")
        fig.tight_layout()
        fig.savefig(out / f"{args.report}.png", dpi=110)
    except ImportError:
        print("chart not drawn (needs matplotlib)", file=sys.stderr)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # LMCache's executor threads (with --lmcache) do not stop on their own
