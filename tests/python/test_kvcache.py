"""The KV-cache pool: shared key vectors, the Python client against the real server, and
LMCache's redis:// connector sequence replayed with redis-py."""

import json
import os
import time

import pytest
import redis

from conftest import ROOT
from strata_client import KVCacheClient, Namespace


def test_shared_vectors_match_the_python_implementation():
    vectors = json.loads((ROOT / "tests" / "vectors" / "kvcache.json").read_text())
    assert len(vectors["cases"]) >= 4
    for case in vectors["cases"]:
        n = case["namespace"]
        ns = Namespace(n["model"], n["revision"], n["dtype"], n["layout"], n["tp_world"], n["tp_rank"], n["chunk_tokens"])
        assert ns.canonical == case["canonical"], case["name"]
        assert ns.id == case["ns_id"], case["name"]
        assert ns.chunk_keys(case["tokens"]) == case["keys"], case["name"]
        assert ns.grouped_keys(case["tokens"], case["group_chunks"]) == case["grouped_keys"], case["name"]
    assert any(len(c["keys"]) > c["group_chunks"] for c in vectors["cases"]), "no case spans two groups"


def test_lookup_store_retrieve_round_trip(strata):
    ns = Namespace("meta-llama/Llama-3.1-8B-Instruct", "main", "bf16", "vllm-paged", 1, 0, chunk_tokens=16)
    c = KVCacheClient(f"redis://127.0.0.1:{strata.port}", ns)
    prompt = list(range(1000, 1000 + 16 * 5 + 3))  # five whole chunks and a partial one
    assert c.lookup(prompt) == 0
    chunks = [bytes([i]) * (256 * 1024) for i in range(5)]
    assert c.store(prompt, chunks) == 5
    assert c.lookup(prompt) == 80
    assert c.retrieve(prompt) == chunks
    # A prompt that shares the first three chunks then diverges reuses exactly those.
    other = prompt[:48] + [7] * 40
    assert c.lookup(other) == 48
    assert c.retrieve(other) == chunks[:3]
    assert c.tiers(prompt) == ["hot"] * 5
    # Another model never sees these chunks.
    other_ns = KVCacheClient(f"redis://127.0.0.1:{strata.port}", Namespace("other", "main", "bf16", "vllm-paged", 1, 0, 16))
    assert other_ns.lookup(prompt) == 0
    assert c.lookup(prompt, lease_ms=5000) == 80
    with pytest.raises(ValueError):
        c.store(prompt, chunks[:2])


def test_kvc_commands_stop_at_the_first_missing_chunk(strata):
    r = strata.client()
    assert r.execute_command("KVC.PUT", "ns", "a", "A", "b", "B", "d", "D", "TTL", "100") == 3
    assert r.execute_command("KVC.MATCH", "ns", "a", "b", "c", "d") == [2, [b"hot", b"hot"]]
    count, tiers, load_us = r.execute_command("KVC.MATCH", "ns", "a", "b", "LEASE", "100", "LOADTIME")
    assert (count, tiers) == (2, [b"hot", b"hot"])
    assert 0 < load_us < 1000, "two 1-byte chunks from DRAM load in microseconds"
    r.execute_command("KVC.PUT", "ns", "big", b"x" * (8 << 20))
    _, _, big_us = r.execute_command("KVC.MATCH", "ns", "big", "LOADTIME")
    assert big_us > load_us, "an 8 MiB chunk is expected to take longer than two tiny ones"
    assert r.execute_command("KVC.GET", "ns", "a", "b", "c", "d") == [b"A", b"B"]
    assert r.execute_command("KVC.GET", "ns", "x", "a") == []
    assert 0 < r.ttl("kvc:ns:a") <= 100
    with pytest.raises(redis.ResponseError, match="syntax error"):
        r.execute_command("KVC.PUT", "ns", "a", "A", "b")
    with pytest.raises(redis.ResponseError, match="LEASE"):
        r.execute_command("KVC.MATCH", "ns", "a", "LEASE", "-1")


def test_lmcache_redis_connector_sequence(strata):
    """LMCache's redis:// remote backend, replayed command for command with redis-py (the
    same sequence without LMCache; test_lmcache.py runs LMCache's own code): it probes
    with EXISTS on `<key>metadata`, stores `<key>kv_bytes` then `<key>metadata` with SET,
    reads metadata then bytes with GET, and deletes a metadata key whose bytes are gone."""
    r = strata.client()
    key = "vllm@meta-llama/Llama-3.1-8B@1@0@a1b2c3d4e5f6"
    kv = bytes(range(256)) * 4096  # 1 MiB
    meta = json.dumps({"shape": [32, 2, 256, 8, 128], "dtype": "bfloat16", "fmt": "vllm"}).encode()
    assert r.exists(key + "metadata") == 0
    assert r.set(key + "kv_bytes", kv)
    assert r.set(key + "metadata", meta)
    assert r.exists(key + "metadata") == 1
    assert r.get(key + "metadata") == meta
    assert r.get(key + "kv_bytes") == kv
    # Bytes evicted or lost: the connector finds metadata without bytes and deletes it.
    r.delete(key + "kv_bytes")
    assert r.get(key + "metadata") == meta
    assert r.get(key + "kv_bytes") is None
    assert r.delete(key + "metadata") == 1
    assert r.exists(key + "metadata") == 0


def test_strata_lmcache_connector_round_trip(strata):
    """The Strata connector for LMCache: one KVC.MATCH for the cached prefix, pipelined
    KVC.GET/PUT, metadata and bytes in one value."""
    import asyncio

    from strata_client.lmcache import StrataConnector, split_key

    keys = [f"meta-llama/Llama-3.1-8B@1@0@{i:x}@bfloat16" for i in range(100)]
    chunks = [(f"meta{i}".encode(), bytes([i]) * (4096 + i)) for i in range(100)]

    async def run():
        c = StrataConnector(f"redis://127.0.0.1:{strata.port}", lease_ms=5000)
        assert await c.batched_contains(keys) == 0
        await c.batched_put(keys[:70], chunks[:70])
        assert await c.batched_contains(keys) == 70
        assert await c.exists(keys[69]) and not await c.exists(keys[70])
        got = await c.batched_get(keys)
        assert len(got) == 70
        assert all(m == chunks[i][0] and bytes(kv) == chunks[i][1] for i, (m, kv) in enumerate(got))
        assert await c.get(keys[99]) is None
        listed = await c.list()
        assert sorted(listed) == sorted(keys[:70])
        assert split_key(keys[5]) == ("meta-llama/Llama-3.1-8B@1@0@bfloat16", "5")
        assert split_key(keys[5] + "@lora%a") == ("meta-llama/Llama-3.1-8B@1@0@bfloat16@lora%a", "5")
        with pytest.raises(ValueError):
            split_key("no-namespace@1@0@5")
        await c.close()

    asyncio.run(run())
    # Other models never see these chunks.
    assert strata.client().execute_command("KVC.MATCH", "other-model@1@0@bfloat16", "0")[0] == 0


def test_large_chunks_live_in_the_value_log_and_survive_a_kill():
    """Chunks of 1 MiB go to the value log; acknowledged ones read back byte for byte after
    SIGKILL and restart, from the warm tier (a process kill, not a power cut: the page cache
    survives it, so this checks recovery of the records and files, not the fsync order)."""
    import tempfile

    from conftest import StrataProcess

    root = tempfile.TemporaryDirectory()
    ns = Namespace("meta-llama/Llama-3.1-8B-Instruct", "main", "bf16", "vllm-paged", 1, 0, chunk_tokens=8)
    prompt = list(range(5000, 5000 + 8 * 12))
    chunks = [bytes([i]) * (1 << 20) + i.to_bytes(4, "little") for i in range(12)]
    p = StrataProcess({"durability": "group"}, data_dir=root.name)
    try:
        c = KVCacheClient(f"redis://127.0.0.1:{p.port}", ns)
        assert c.store(prompt, chunks) == 12
        info = p.client().info("strata")
        assert int(info["vlog_bytes"]) >= 12 << 20, info
    finally:
        p.stop()  # SIGKILL
    q = StrataProcess({"durability": "group", "hot_bytes_max": "1MiB"}, data_dir=root.name)
    try:
        c = KVCacheClient(f"redis://127.0.0.1:{q.port}", ns)
        assert c.lookup(prompt) == 96
        assert c.tiers(prompt) == ["warm"] * 12  # DRAM starts empty after a restart
        assert c.retrieve(prompt) == chunks
        assert int(q.client().info("strata")["checksum_errors"]) == 0
    finally:
        q.stop()
        root.cleanup()


def test_large_chunks_in_dram_are_the_value_logs_pages_not_a_second_copy(tmp_path):
    """DRAM holds a chunk written to the value log as a view of the log's pages, not as the
    request's buffer: 64 MiB of 2 MiB chunks stay 'hot' while the server's anonymous memory
    (RssAnon, what `maxmemory` bounds) grows by far less than they weigh, and they read back
    exactly. (When DRAM kept the request's buffers, RssAnon grew by the chunks' size.)"""
    from conftest import StrataProcess
    from test_memory import rss_anon

    mib = 1 << 20
    ns = Namespace("meta-llama/Llama-3.1-8B-Instruct", "main", "bf16", "vllm-paged", 1, 0, chunk_tokens=16)
    p = StrataProcess({"durability": "none", "hot_bytes_max": "1GiB"}, data_dir=str(tmp_path))
    try:
        c = KVCacheClient(f"redis://127.0.0.1:{p.port}", ns)
        warmup = list(range(900, 900 + 16))
        assert c.store(warmup, [b"w" * (2 * mib)]) == 1
        before = rss_anon(p.proc.pid)
        prompts = [list(range(10_000 * u, 10_000 * u + 16 * 8)) for u in range(4)]
        chunks = {u: [bytes([u * 8 + i]) * (2 * mib) for i in range(8)] for u in range(4)}
        for u, prompt in enumerate(prompts):
            assert c.store(prompt, chunks[u]) == 8
        # The requests' buffers go back to the system within jemalloc's decay (a second).
        time.sleep(2)
        grown = rss_anon(p.proc.pid) - before
        print(f"RssAnon grew {grown / mib:.1f} MiB for 64 MiB of chunks")
        for u, prompt in enumerate(prompts):
            assert c.tiers(prompt) == ["hot"] * 8
        assert grown < 24 * mib, f"RssAnon grew {grown / mib:.1f} MiB for 64 MiB of chunks"
        for u, prompt in enumerate(prompts):
            assert c.retrieve(prompt) == chunks[u]
        assert int(p.client().info("strata")["checksum_errors"]) == 0
    finally:
        p.stop()


def test_retrieve_local_maps_value_log_chunks_and_reads_the_rest(strata):
    """KVC.LOCATE names where value-log chunks lie (nil for a present chunk kept elsewhere);
    retrieve_local maps them (no bytes through the socket) and reads the others (here a
    chunk too small for the value log) with KVC.GET: the same bytes as retrieve, also after
    an overwrite; with verify, a flipped byte in the file is caught."""
    ns = Namespace("meta-llama/Llama-3.1-8B-Instruct", "main", "bf16", "vllm-paged", 1, 0, chunk_tokens=4)
    c = KVCacheClient(f"redis://127.0.0.1:{strata.port}", ns)
    tokens = list(range(28))
    chunks = [bytes([i]) * (100_000 + i) for i in range(4)] + [b"small", bytes([9]) * 100_000, b"x" * 70_000]
    assert c.store(tokens, chunks) == 7
    got = c.retrieve_local(tokens, verify=True)
    assert [bytes(g) for g in got] == chunks == c.retrieve(tokens)
    assert [type(g) for g in got] == [memoryview] * 4 + [bytes] + [memoryview] * 2
    r = strata.client()
    located = r.execute_command("KVC.LOCATE", ns.id, *ns.chunk_hashes(tokens))
    assert len(located) == 7 and located[4] is None, "the small chunk is present, but not in the value log"
    assert all(os.path.isabs(p.decode()) and n == 100_000 + i for i, (p, _, n, _, _) in enumerate(located[:4]))
    # Overwritten: the new value, at its new place; the old view still holds the old bytes.
    c.store(tokens[:4], [b"N" * 90_000])
    again = c.retrieve_local(tokens)
    assert bytes(again[0]) == b"N" * 90_000 and bytes(got[0]) == chunks[0]
    assert r.execute_command("KVC.LOCATE", ns.id, "no-such-chunk", ns.chunk_hashes(tokens)[0]) == []
    # A flipped byte in the file: the mapped chunk no longer matches its checksum.
    path, offset, *_ = r.execute_command("KVC.LOCATE", ns.id, ns.chunk_hashes(tokens)[1])[0]
    with open(path, "r+b") as f:
        f.seek(offset + 10)
        b = f.read(1)
        f.seek(offset + 10)
        f.write(bytes([b[0] ^ 0xFF]))
    assert len(c.retrieve_local(tokens)) == 7, "unchecked, the flipped chunk is handed out"
    with pytest.raises(ValueError, match="checksum mismatch"):
        c.retrieve_local(tokens, verify=True)
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        r.execute_command("KVC.LOCATE", ns.id)


def test_store_takes_any_buffer_without_copying_it_first(strata):
    """store() accepts bytes, memoryviews of other item sizes (as numpy arrays are) and
    non-contiguous views, and stores their bytes exactly."""
    import array

    ns = Namespace("m", "main", "bf16", "vllm-paged", 1, 0, chunk_tokens=2)
    c = KVCacheClient(f"redis://127.0.0.1:{strata.port}", ns)
    halves = array.array("H", range(5000))  # 2-byte items: 10,000 bytes, 5,000 items
    strided = memoryview(bytes(range(256)) * 8)[::2]  # not contiguous
    chunks = [b"plain", memoryview(halves), halves, strided]
    assert c.store(list(range(8)), chunks) == 4
    assert c.retrieve(list(range(8))) == [b"plain", halves.tobytes(), halves.tobytes(), strided.tobytes()]


def test_one_reply_carries_at_most_the_output_limit_and_the_clients_read_on(strata):
    """`client-output-buffer-limit` bounds the values one reply carries: MGET past it is
    refused, KVC.GET stops before the chunk that would pass it, and both Python clients ask
    again for the rest, so a retrieve still returns the whole cached prefix."""
    import asyncio

    from strata_client.lmcache import StrataConnector

    r = strata.client()
    mib = 1 << 20
    assert r.config_set("client-output-buffer-limit", "normal 3145728 0 0")
    assert r.config_get("client-output-buffer-limit")["client-output-buffer-limit"].startswith("normal 3145728 ")
    for bad in ("1000", "normal 0 0 0", "lots"):
        with pytest.raises(redis.ResponseError, match="client-output-buffer-limit"):
            r.config_set("client-output-buffer-limit", bad)

    ns = Namespace("limit-test", "main", "bf16", "vllm-paged", 1, 0, chunk_tokens=4)
    c = KVCacheClient(f"redis://127.0.0.1:{strata.port}", ns)
    prompt = list(range(4 * 8))
    chunks = [bytes([i]) * mib for i in range(8)]
    assert c.store(prompt, chunks) == 8
    hashes = ns.chunk_hashes(prompt)
    got = r.execute_command("KVC.GET", ns.id, *hashes)
    assert len(got) == 3 and got == chunks[:3], "stops before the chunk that passes 3 MiB"
    assert c.retrieve(prompt) == chunks
    assert [bytes(v) for v in c.retrieve_local(prompt)] == chunks
    # A reply over the limit that stopped at a real miss still ends there.
    assert c.retrieve(prompt[:20] + [9999] * 12) == chunks[:5]

    keys = [ns.key_of(h) for h in hashes]
    with pytest.raises(redis.ResponseError, match="more than 3145728 bytes"):
        r.mget(keys)
    assert r.mget(keys[:3]) == chunks[:3]
    assert r.mget(keys[:1]) == chunks[:1]

    async def via_connector():
        lm = [f"limit-model@1@0@{h}@bfloat16" for h in range(6)]
        conn = StrataConnector(f"redis://127.0.0.1:{strata.port}")
        await conn.batched_put(lm, [(b"m%d" % i, bytes([i]) * mib) for i in range(6)])
        got = await conn.batched_get(lm)
        await conn.close()
        return got

    got = asyncio.run(via_connector())
    assert [(m, bytes(kv)) for m, kv in got] == [(b"m%d" % i, bytes([i]) * mib) for i in range(6)]
    assert r.config_set("client-output-buffer-limit", str(1 << 30))
    assert len(r.execute_command("KVC.GET", ns.id, *hashes)) == 8


def test_clients_on_the_same_machine_can_use_the_unix_socket():
    """With `unixsocket` set, redis-py, KVCacheClient and the LMCache connector reach the
    same store through `unix://` URLs as through TCP."""
    import asyncio
    import tempfile
    import time

    from conftest import StrataProcess
    from strata_client.lmcache import StrataConnector

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "strata.sock")
        s = StrataProcess({"unixsocket": path})
        try:
            deadline = time.time() + 20
            while not os.path.exists(path):
                assert time.time() < deadline, "no Unix socket"
                time.sleep(0.05)
            r = redis.Redis(unix_socket_path=path)
            assert r.set("via", "unix") and s.client().get("via") == b"unix"
            ns = Namespace("meta-llama/Llama-3.1-8B-Instruct", "main", "bf16", "vllm-paged", 1, 0, chunk_tokens=8)
            c = KVCacheClient(f"unix://{path}", ns)
            tokens = list(range(32))
            chunks = [bytes([i]) * 200_000 for i in range(4)]
            assert c.store(tokens, chunks) == 4
            assert c.lookup(tokens) == 32 and c.retrieve(tokens) == chunks
            assert [bytes(v) for v in c.retrieve_local(tokens, verify=True)] == chunks

            async def lmcache():
                conn = StrataConnector(f"unix://{path}", lease_ms=1000)
                keys = [f"m@1@0@{i:x}@bfloat16" for i in range(3)]
                await conn.batched_put(keys, [(b"meta", b"kv" * 1000)] * 3)
                assert await conn.batched_contains(keys) == 3
                await conn.close()

            asyncio.run(lmcache())
            assert any(b"/strata.sock:0" in line for line in r.execute_command("CLIENT", "LIST").splitlines())
        finally:
            s.stop()


def test_retrieve_reads_chunks_straight_into_the_callers_buffers(strata):
    """`retrieve_into` fills buffers the caller owns (here bytearrays and an array of
    floats) from the socket; a buffer too small is refused and the client reads on; many
    small chunks that arrive in one read-ahead come back whole too."""
    import array

    ns = Namespace("into-test", "main", "bf16", "vllm-paged", 1, 0, chunk_tokens=16)
    c = KVCacheClient(f"redis://127.0.0.1:{strata.port}", ns)
    prompt = list(range(3000, 3000 + 16 * 6))
    chunks = [os.urandom(300 * 1024 + 7 * i) for i in range(6)]
    assert c.store(prompt, chunks) == 6
    bufs = [bytearray(len(ch) + 10) for ch in chunks]
    assert c.retrieve_into(prompt, bufs) == [len(ch) for ch in chunks]
    assert all(bytes(b[: len(ch)]) == ch for b, ch in zip(bufs, chunks))
    floats = array.array("f", bytes(len(chunks[0]) + 4))
    assert c.retrieve_into(prompt, [floats]) == [len(chunks[0])]
    assert floats.tobytes()[: len(chunks[0])] == chunks[0]
    # A prompt that diverges after three chunks fills three buffers.
    assert c.retrieve_into(prompt[:48] + [1] * 48, bufs) == [len(ch) for ch in chunks[:3]]
    with pytest.raises(ValueError, match="chunk 0 holds"):
        c.retrieve_into(prompt, [bytearray(10)])
    assert c.retrieve(prompt) == chunks
    small = [os.urandom(100) for _ in range(200)]
    tokens = list(range(16 * 200))
    assert c.store(tokens, small) == 200
    assert c.retrieve(tokens) == small
    # An error reply reaches the caller as an error, and the connection stays in step.
    from strata_client.wire import Wire

    w = Wire(f"redis://127.0.0.1:{strata.port}")
    w.send([["KVC.GET", ns.id]])
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        w.read_bulks(lambda i, n: memoryview(bytearray(n)))
    w.send([["KVC.GET", ns.id, ns.chunk_hashes(prompt)[0]]])
    assert w.read_bulks(lambda i, n: memoryview(bytearray(n))) == [len(chunks[0])]
    # MGET's missing keys read as -1, with no buffer asked for them (what
    # `strata-bench compare` reads Redis with).
    w.call(["SET", "present", b"abc"])
    asked = []
    w.send([["MGET", "absent", "present", "absent2"]])
    assert w.read_bulks(lambda i, n: asked.append(i) or memoryview(bytearray(n))) == [-1, 3, -1]
    assert asked == [1]
    w.close()
    assert c.retrieve(prompt) == chunks
    c.close()


def test_direct_reads_authenticate_with_the_urls_password(tmp_path):
    from conftest import StrataProcess

    s = StrataProcess({"requirepass": "sekret"})
    try:
        ns = Namespace("auth-test", "main", "bf16", "vllm-paged", 1, 0, chunk_tokens=4)
        c = KVCacheClient(f"redis://:sekret@127.0.0.1:{s.port}", ns)
        chunks = [b"a" * 70000, b"b" * 5]
        assert c.store(list(range(8)), chunks) == 2
        assert c.retrieve(list(range(8))) == chunks
        c.close()
        with pytest.raises(redis.AuthenticationError):
            KVCacheClient(f"redis://:wrong@127.0.0.1:{s.port}", ns).retrieve(list(range(8)))
    finally:
        s.stop()


def test_the_client_read_benchmark_runs_and_writes_its_report(tmp_path):
    import subprocess
    import sys

    from conftest import strata_bin

    out = tmp_path / "client"
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_kvcache_client.py"), "--quick", "--strata", strata_bin(), "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads((tmp_path / "client.json").read_text())
    assert set(report["results"]) == {"raw", "retrieve", "retrieve_into", "redis-py", "redis-py GET"}
    assert all(v["gib_per_s"] > 0 for v in report["results"].values())
    assert "| retrieve_into |" in (tmp_path / "client.md").read_text()
    assert "round 3/3" in run.stderr, "progress is shown"
