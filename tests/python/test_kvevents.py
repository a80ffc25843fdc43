"""The KV-cache pool's event feed: a subscriber we wrote from llm-d's positional field order
(array mode) and from vLLM's tagged maps (map mode) reads what `KVCacheClient.store`
announces; replay after a gap returns exactly the missed batches."""

import json
import os
import subprocess
import time
from pathlib import Path

import msgpack
import pytest
import zmq

from conftest import StrataProcess
from strata_client import KVCacheClient, Namespace

VENV = Path(os.environ.get("STRATA_LMCACHE_VENV", Path.home() / ".cache" / "strata" / "lmcache-venv"))
BLOCK = 16
NS = Namespace("meta-llama/Llama-3.1-8B-Instruct", "main", "bf16", "vllm-paged", 1, 0, chunk_tokens=32)


def feed_server(tmp_path, encoding="array", topics=("kv@pod-a@llama",)):
    topic_list = "[" + ",".join(f'"{t}"' for t in topics) + "]"
    settings = {
        "kv_events_endpoint": f"ipc://{tmp_path}/kv-events",
        "kv_events_replay_endpoint": f"ipc://{tmp_path}/kv-replay",
        "kv_events_encoding": encoding,
        "kv_events_topics": topic_list,
    }
    return StrataProcess(settings)


def subscriber(ctx, tmp_path, topic=b"kv@"):
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    sub.setsockopt(zmq.RCVTIMEO, 5000)
    sub.connect(f"ipc://{tmp_path}/kv-events")
    time.sleep(0.3)  # ZMQ's slow joiner: a subscription takes a moment to reach the publisher
    return sub


def llmd_event(raw):
    """An event decoded as llm-d's vLLM adapter does: by position, from a tagged array."""
    tag = raw[0]
    if tag == "BlockStored":
        return {"type": tag, "block_hashes": raw[1], "parent_block_hash": raw[2], "token_ids": raw[3],
                "block_size": raw[4], "lora_id": raw[5], "medium": raw[6]}
    if tag == "BlockRemoved":
        return {"type": tag, "block_hashes": raw[1], "medium": raw[2]}
    assert tag == "AllBlocksCleared" and len(raw) == 1
    return {"type": tag}


def receive(sub, want_events, decode):
    """Batches until `want_events` events have come: [(topic, seq, [event, ...])]."""
    got, n = [], 0
    while n < want_events:
        topic, seq, payload = sub.recv_multipart()
        ts, events, dp_rank = msgpack.unpackb(payload)
        assert ts > 1.6e9 and dp_rank == 0
        events = [decode(e) for e in events]
        got.append((topic, int.from_bytes(seq, "big"), events))
        n += len(events)
    return got


def ask_replay(ctx, tmp_path, request):
    """Sends `request` (a start sequence, or b"LIST") to the replay socket as a DEALER;
    returns the `(seq, payload)` pairs it answers with before the end marker."""
    replay = ctx.socket(zmq.DEALER)
    replay.setsockopt(zmq.RCVTIMEO, 5000)
    replay.connect(f"ipc://{tmp_path}/kv-replay")
    replay.send_multipart([b"", request])
    got = []
    while True:
        empty, seq8, payload = replay.recv_multipart()
        assert empty == b""
        if seq8 == (-1).to_bytes(8, "big", signed=True):
            assert payload == b""
            return got
        got.append((int.from_bytes(seq8, "big"), payload))


def check_prompt(events, prompt):
    """The stored events of one prompt carry its tokens in order, in blocks that chain."""
    stored = [e for e in events if e["type"] == "BlockStored"]
    tokens = [t for e in stored for t in e["token_ids"]]
    assert tokens == prompt
    assert all(e["block_size"] == BLOCK and e["medium"] == "DISK" for e in stored)
    assert stored[0]["parent_block_hash"] is None
    for before, e in zip(stored, stored[1:]):
        assert e["parent_block_hash"] == before["block_hashes"][-1]
        assert len(e["block_hashes"]) == len(e["token_ids"]) // BLOCK
    return stored


@pytest.mark.parametrize("encoding", ["array", "map"])
def test_a_stored_prompt_is_announced_with_its_tokens_in_blocks(tmp_path, encoding):
    s = feed_server(tmp_path, encoding, topics=("kv@pod-a@llama", "kv@pod-b@llama"))
    ctx = zmq.Context()
    try:
        sub = subscriber(ctx, tmp_path, b"kv@pod-b@")
        kv = KVCacheClient(f"redis://127.0.0.1:{s.port}", NS)
        prompt = list(range(500, 500 + 32 * 3))
        assert kv.store(prompt + [1, 2, 3], [b"x" * 1000] * 3) == 3
        decode = llmd_event if encoding == "array" else dict
        got = receive(sub, 3, decode)
        assert {t for t, _, _ in got} == {b"kv@pod-b@llama"}
        assert [seq for _, seq, _ in got] == list(range(len(got)))
        stored = check_prompt([e for _, _, evs in got for e in evs], prompt)
        if encoding == "map":
            assert set(stored[0]) >= {"type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "medium"}
        # A plain KVC.PUT without tokens announces nothing; FLUSHALL clears everything.
        kv.r.execute_command("KVC.PUT", NS.id, "h", "v")
        kv.r.flushall()
        (_, _, events), = receive(sub, 1, decode)
        assert events == [{"type": "AllBlocksCleared"}]
    finally:
        ctx.destroy(linger=0)
        s.stop()


def test_replay_after_a_gap_returns_exactly_the_missed_batches(tmp_path):
    s = feed_server(tmp_path)
    ctx = zmq.Context()
    try:
        sub = subscriber(ctx, tmp_path)
        kv = KVCacheClient(f"redis://127.0.0.1:{s.port}", NS)
        kv.store(list(range(32)), [b"a"])
        (_, first, _), = receive(sub, 1, llmd_event)
        sub.close()  # the router goes away while three more prompts are stored
        for p in range(1, 4):
            kv.store(list(range(p * 1000, p * 1000 + 32)), [b"b"])
            time.sleep(0.05)
        sub = subscriber(ctx, tmp_path)
        kv.store(list(range(9000, 9032)), [b"c"])
        (_, seq, _), = receive(sub, 1, llmd_event)
        assert seq > first + 1, "the subscriber sees a gap"
        replayed = ask_replay(ctx, tmp_path, (first + 1).to_bytes(8, "big"))
        tokens = [llmd_event(e)["token_ids"][0] for _, p in replayed for e in msgpack.unpackb(p)[1]]
        assert [s for s, _ in replayed] == list(range(first + 1, seq + 1))
        assert tokens == [1000, 2000, 3000, 9000]
        assert kv.r.info("stats")["kv_events_replays"] == 1
    finally:
        ctx.destroy(linger=0)
        s.stop()


def test_a_router_that_lost_too_much_asks_for_a_listing(tmp_path):
    s = feed_server(tmp_path)
    ctx = zmq.Context()
    try:
        kv = KVCacheClient(f"redis://127.0.0.1:{s.port}", NS)
        prompts = [list(range(p * 100, p * 100 + 64)) for p in range(3)]
        for p in prompts:
            kv.store(p, [b"x", b"y"])
        kv.r.execute_command("KVC.PUT", NS.id, "untokened", "v")  # not announced, not listed
        time.sleep(0.2)  # the prompts' batches go out (to no one)
        live = kv.r.info("stats")["kv_events_batches"]
        listed = ask_replay(ctx, tmp_path, b"LIST")
        events = [llmd_event(e) for _, p in listed for e in msgpack.unpackb(p)[1]]
        assert {s for s, _ in listed} == {live}, "a listing names the live sequence it stands at"
        assert sorted(t for e in events for t in e["token_ids"]) == sorted(t for p in prompts for t in p)
        assert {(e["type"], e["medium"], e["block_size"]) for e in events} == {("BlockStored", "DISK", BLOCK)}
        assert kv.r.info("stats")["kv_events_listings"] == 1
    finally:
        ctx.destroy(linger=0)
        s.stop()


def test_a_bad_feed_address_fails_the_start(tmp_path):
    with pytest.raises(RuntimeError, match="kv_events_replay_endpoint"):
        StrataProcess({"kv_events_endpoint": "tcp://127.0.0.1:1", "kv_events_replay_endpoint": "tcp://127.0.0.1:2"})


def test_kvc_drop_deletes_a_namespace_in_the_background_and_announces_it(tmp_path):
    s = feed_server(tmp_path)
    ctx = zmq.Context()
    try:
        sub = subscriber(ctx, tmp_path)
        url = f"redis://127.0.0.1:{s.port}"
        old = KVCacheClient(url, NS)
        kept_ns = Namespace("meta-llama/Llama-3.1-8B-Instruct", "v2", "bf16", "vllm-paged", 1, 0, chunk_tokens=32)
        kept = KVCacheClient(url, kept_ns)
        old.store(list(range(64)), [b"a", b"b"])
        old.store(list(range(100, 132)), [b"c"])
        kept.store(list(range(64)), [b"d", b"e"])
        stored = [e for _, _, evs in receive(sub, 5, llmd_event) for e in evs]
        old_blocks = {h for e in stored[:3] for h in e["block_hashes"]}
        r = s.client()
        assert r.execute_command("KVC.DROP", NS.id) == b"OK"
        removed = [e for _, _, evs in receive(sub, 6, llmd_event) for e in evs]
        assert {e["type"] for e in removed} == {"BlockRemoved"}
        for medium in ("DISK", "EXTERNAL"):
            assert {h for e in removed if e["medium"] == medium for h in e["block_hashes"]} == old_blocks
        deadline = time.time() + 10
        while (r.info("stats")["kvc_drops_running"] or r.dbsize() > 4) and time.time() < deadline:
            time.sleep(0.05)
        stats = r.info("stats")
        assert stats["kvc_chunks_dropped"] == 3 and stats["kv_events_sent"] == 11
        assert old.lookup(list(range(64))) == 0
        assert kept.lookup(list(range(64))) == 64
        assert sorted(r.keys("*")) == sorted(
            k.encode() for h in kept_ns.chunk_hashes(list(range(64))) for k in (kept_ns.key_of(h), "kvt" + kept_ns.key_of(h)[3:])
        )
        with pytest.raises(Exception, match="wrong number"):
            r.execute_command("KVC.DROP")
    finally:
        ctx.destroy(linger=0)
        s.stop()


def test_chunks_dropped_for_a_quota_are_announced_and_their_tokens_go(tmp_path):
    s = feed_server(tmp_path)
    ctx = zmq.Context()
    try:
        sub = subscriber(ctx, tmp_path)
        kv = KVCacheClient(f"redis://127.0.0.1:{s.port}", NS)
        assert kv.r.execute_command("KVC.QUOTA", NS.id, 2500) == b"OK"
        first, second = list(range(32)), list(range(1000, 1032))
        kv.store(first, [b"a" * 1000])
        stored = [e for _, _, evs in receive(sub, 1, llmd_event) for e in evs]
        kv.store(second, [b"c" * 1000])
        kv.store(list(range(2000, 2032)), [b"d" * 1000])  # 3,000 bytes > 2,500: the first goes
        events = [e for _, _, evs in receive(sub, 4, llmd_event) for e in evs]
        removed = [e for e in events if e["type"] == "BlockRemoved"]
        assert {e["medium"] for e in removed} == {"DISK", "EXTERNAL"}
        assert all(e["block_hashes"] == stored[0]["block_hashes"] for e in removed)
        assert kv.lookup(first) == 0 and kv.lookup(second) == 32
        deadline = time.time() + 10
        while kv.r.exists("kvt" + NS.chunk_keys(first)[0][3:]) and time.time() < deadline:
            time.sleep(0.05)
        assert not kv.r.exists("kvt" + NS.chunk_keys(first)[0][3:])
    finally:
        ctx.destroy(linger=0)
        s.stop()


def test_chunks_are_announced_as_they_move_between_tiers_and_expire(tmp_path):
    """Demoted to the object store: stored EXTERNAL, removed from DISK; read back: the
    reverse; expired or deleted: removed, and the tokens kept beside it go too."""
    s = StrataProcess({
        "kv_events_endpoint": f"ipc://{tmp_path}/kv-events",
        "hot_bytes_max": 65536, "warm_bytes_max": 131072, "warm_bytes_hard_max": "64MiB",
        "background_interval_ms": 50, "block_bytes": 4096,
    })
    ctx = zmq.Context()
    try:
        sub = subscriber(ctx, tmp_path, b"")  # the default topic: empty
        kv = KVCacheClient(f"redis://127.0.0.1:{s.port}", NS)
        prompt = list(range(1, 33))
        chunk = b"k" * 70000  # a chunk of the value log's size: write-back keeps smaller ones in DRAM
        kv.store(prompt, [chunk])
        (_, _, (stored,)), = receive(sub, 1, llmd_event)
        assert stored["medium"] == "DISK"
        r = s.client()
        for i in range(200):  # 4 MB of other values push the chunk down to the object store
            r.set(f"z:{i}", b"f" * 20000)
        demoted = [e for _, _, evs in receive(sub, 2, llmd_event) for e in evs]
        assert [(e["type"], e["medium"]) for e in demoted] == [("BlockStored", "EXTERNAL"), ("BlockRemoved", "DISK")]
        assert demoted[0]["token_ids"] == prompt and demoted[1]["block_hashes"] == stored["block_hashes"]
        assert kv.tiers(prompt) == ["cold"]
        assert kv.retrieve(prompt) == [chunk]  # read: it returns to the warm tier
        back = [e for _, _, evs in receive(sub, 2, llmd_event) for e in evs]
        assert [(e["type"], e["medium"]) for e in back] == [("BlockStored", "DISK"), ("BlockRemoved", "EXTERNAL")]
        ttl_tokens = list(range(100, 132))
        kv.store(ttl_tokens, [chunk], ttl_s=1)
        # Events until its removal from both tiers has come: it may be demoted before it
        # expires (the warm tier is tiny), and a batch may carry several events.
        ttl_blocks, removed = None, set()
        while ttl_blocks is None or removed != {"DISK", "EXTERNAL"}:
            (_, _, events), = receive(sub, 1, llmd_event)
            for e in events:
                if e["type"] == "BlockStored" and e["token_ids"] == ttl_tokens and e["medium"] == "DISK":
                    ttl_blocks = e["block_hashes"]
                elif e["type"] == "BlockRemoved" and e["block_hashes"] == ttl_blocks:
                    removed.add(e["medium"])
        r.delete(NS.key_of(NS.chunk_hashes(prompt)[0]))
        deadline = time.time() + 10
        while r.keys("kvt:*") and time.time() < deadline:
            time.sleep(0.05)
        assert r.keys("kvt:*") == [], "the tokens went with their chunks"
    finally:
        ctx.destroy(linger=0)
        s.stop()


# Decodes batches with vLLM's own classes (vLLM 0.34, from PyPI, in the LMCache environment):
# its decoder is what a vLLM-based router runs, and it sends events as tagged maps.
VLLM_DECODE = """
import json, sys
import msgspec
from vllm.distributed.kv_events import KVEventBatch
decode = msgspec.msgpack.Decoder(type=KVEventBatch).decode
out = []
for payload in json.load(sys.stdin):
    batch = decode(bytes.fromhex(payload))
    out += [dict(type=type(e).__name__, **{f: getattr(e, f) for f in e.__struct_fields__}) for e in batch.events]
print(json.dumps(out))
"""


@pytest.mark.skipif(os.environ.get("STRATA_SKIP_LMCACHE") == "1", reason="STRATA_SKIP_LMCACHE=1: no vLLM environment")
def test_vllms_own_decoder_reads_the_map_encoding(tmp_path):
    python = VENV / "bin" / "python"
    if not python.exists():
        pytest.fail(f"vLLM is not installed in {VENV}: run scripts/install-deps")
    s = feed_server(tmp_path, "map")
    ctx = zmq.Context()
    try:
        sub = subscriber(ctx, tmp_path)
        kv = KVCacheClient(f"redis://127.0.0.1:{s.port}", NS)
        prompt = list(range(7, 7 + 32 * 2))
        kv.store(prompt, [b"x", b"y"])
        kv.r.flushall()
        payloads, n = [], 0
        while n < 3:
            _, _, payload = sub.recv_multipart()
            payloads.append(payload.hex())
            n += len(msgpack.unpackb(payload)[1])
    finally:
        ctx.destroy(linger=0)
        s.stop()
    out = subprocess.run([str(python), "-c", VLLM_DECODE], input=json.dumps(payloads),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    events = json.loads(out.stdout)
    assert [e["type"] for e in events] == ["BlockStored", "BlockStored", "AllBlocksCleared"]
    check_prompt(events, prompt)
    assert all(e["lora_id"] is None and e["extra_keys"] is None for e in events[:2])
