"""Drives one of LMCache's own remote connectors against a server; runs in the LMCache venv.

    lmcache_driver.py HOST:PORT CONNECTOR     (CONNECTOR: redis, resp, strata, strata-local
                                               or strata-tokens)

`redis` is LMCache's stock `redis://` connector, `resp` its native `resp://` client, `strata`
our plugin (`strata_client.lmcache_plugin`, loaded through LMCache's remote storage plugin
setting; `strata-local` maps the chunks from the server's files). Each is created by LMCache's `CreateConnector` over a CPU `LocalCPUBackend`
(`lmcache_harness.py`), stores chunks of 2 MiB (Llama-3.1-8B, 16 tokens), looks them up,
reads them back and checks every byte. Prints one JSON object of what it saw;
test_lmcache.py compares it.
"""

import json
import os
import sys

import redis

from lmcache_harness import MODEL, Harness, key


def store_with_tokens(host_port):
    """Chunks hashed by LMCache's own token database inside a store, then put through our
    plugin: they carry their tokens (what `LMCacheEngine.store` does, without a GPU)."""
    import torch
    from lmcache.v1.cache_engine import LMCacheEngine
    from lmcache.v1.token_database import ChunkedTokenDatabase
    from strata_client import lmcache_tokens

    h = Harness("strata", host_port, chunk_tokens=16)
    db = ChunkedTokenDatabase(h.config, h.metadata)
    tokens = list(range(1000, 1000 + 16 * 3))
    with lmcache_tokens.storing():
        keys = [k for _, _, k in db.process_tokens(tokens=torch.tensor(tokens))]
    h.run(h.conn.batched_put(keys, [h.chunk(i) for i in range(3)]))
    seen = {"tokens": tokens, "hashes": [k.chunk_hash_hex for k in keys],
            "store_wrapped": getattr(LMCacheEngine.store, "_strata", False)}
    print(json.dumps(seen))
    sys.stdout.flush()
    os._exit(0)


def main():
    host_port, kind = sys.argv[1], sys.argv[2]
    if kind == "strata-tokens":
        store_with_tokens(host_port)
    h = Harness(kind, host_port, chunk_tokens=16)
    conn, run = h.conn, h.run
    seen = {"connector": type(conn.getWrappedConnector()).__name__}

    keys = [key(0xC0FFEE00 + i) for i in range(6)]
    objs = [h.chunk(i) for i in range(4)]
    stored = [bytes(m.byte_array) for m in objs]

    def same(memory_obj, i):
        return memory_obj is not None and bytes(memory_obj.byte_array) == stored[i]

    seen["exists_before"] = run(conn.exists(keys[0]))
    seen["contains_before"] = run(conn.batched_async_contains("lookup", keys))
    run(conn.batched_put(keys[:4], objs))
    seen["exists_after"] = [run(conn.exists(k)) for k in keys]
    if kind != "resp":
        # LMCache 0.5.6's resp:// client registers a synchronous call's future only after
        # submitting it, from another thread than the one that completes it: a fast reply
        # is dropped and the call hangs (a race in LMCache, seen against Strata in CI).
        seen["exists_sync"] = conn.exists_sync(keys[3])
    seen["contains_after"] = run(conn.batched_async_contains("lookup", keys))
    seen["get_matches"] = [same(run(conn.get(k)), i) for i, k in enumerate(keys[:4])]
    if kind != "resp":
        # LMCache 0.5.6's resp:// client hangs on a missing key (against Redis as well):
        # it is only asked about chunks it stored.
        seen["get_missing"] = run(conn.get(keys[4])) is None
        prefix = run(conn.batched_get_non_blocking("lookup", keys))
        seen["prefix_matches"] = [same(m, i) for i, m in enumerate(prefix)]
    seen["other_model_sees_it"] = run(conn.exists(key(keys[0].chunk_hash, model="other-model")))
    if kind.startswith("strata"):
        # The synchronous lookup LMCache's storage manager calls, in one round trip.
        seen["sync_contains"] = conn.support_batched_contains() and conn.batched_contains(keys)
        seen["removed"] = [conn.remove_sync(keys[3]), conn.remove_sync(keys[3])]
        seen["contains_after_remove"] = run(conn.batched_async_contains("lookup", keys))
        run(conn.batched_put(keys[3:4], objs[3:4]))

    r = redis.Redis.from_url(f"redis://{host_port}")
    if kind != "resp":
        # The chunk's bytes vanish (evicted, or lost): LMCache must see a miss, not garbage.
        if kind.startswith("strata"):
            r.delete(f"kvc:{MODEL}@1@0@bfloat16:{keys[1].chunk_hash_hex}")
        else:
            r.delete(keys[1].to_string() + "kv_bytes")
        seen["get_after_loss"] = run(conn.get(keys[1])) is None
        seen["contains_after_loss"] = run(conn.batched_async_contains("lookup", keys))
    if kind == "redis":
        seen["metadata_left"] = r.exists(keys[1].to_string() + "metadata")
    seen["server_keys"] = sorted(k.decode() for k in r.scan_iter(count=1000))
    calls = r.info("commandstats")
    seen["kvc_get_calls"] = calls.get("cmdstat_kvc.get", {}).get("calls", 0)
    seen["kvc_locate_calls"] = calls.get("cmdstat_kvc.locate", {}).get("calls", 0)
    print(json.dumps(seen))
    sys.stdout.flush()
    os._exit(0)  # LMCache's executor threads do not stop on their own


if __name__ == "__main__":
    main()
