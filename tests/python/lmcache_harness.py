"""One of LMCache's own remote connectors, created the way LMCache creates it, outside vLLM.

Needs LMCache (the virtual environment `scripts/install-deps` makes). Shared by
`lmcache_driver.py` (tests) and `scripts/bench_lmcache.py --lmcache` (benchmark).
"""

import asyncio
import threading

import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory_allocators.tensor_memory_allocator import TensorMemoryAllocator
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend import LocalCPUBackend
from lmcache.v1.storage_backend.connector import CreateConnector

MODEL = "meta-llama/Llama-3.1-8B"
LAYERS, HEADS, HEAD_SIZE = 32, 8, 128
#: Bytes of K and V for one token of Llama-3.1-8B in bf16 (128 KiB).
TOKEN_BYTES = LAYERS * 2 * HEADS * HEAD_SIZE * 2
#: The connectors: LMCache's stock redis:// one, its native resp:// client, and ours (also
#: in its local mode, mapping chunks from the server's files).
KINDS = ("redis", "resp", "strata", "strata-local")


class Harness:
    """A connector of `kind` to the server at `host_port`, with its own event loop thread
    and a CPU memory pool of `pool_bytes`; chunks of `chunk_tokens` tokens."""

    def __init__(self, kind: str, host_port: str, chunk_tokens: int, pool_bytes: int = 256 << 20):
        if kind not in KINDS:
            raise ValueError(f"connector {kind!r}: choose one of {KINDS}")
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        extra = {"save_chunk_meta": False, "resp_num_threads": 2}
        remote_url, plugins = f"{kind}://{host_port}", None
        if kind.startswith("strata"):
            remote_url, plugins = "plugin://strata", ["strata"]
            extra.update(
                {
                    "remote_storage_plugin.strata.module_path": "strata_client.lmcache_plugin",
                    "remote_storage_plugin.strata.class_name": "StrataRemoteConnector",
                    "remote_storage_plugin.strata.url": f"redis://{host_port}",
                    "remote_storage_plugin.strata.local": kind == "strata-local",
                }
            )
        config = LMCacheEngineConfig.from_defaults(
            chunk_size=chunk_tokens, remote_url=remote_url, remote_storage_plugins=plugins, extra_config=extra
        )
        metadata = LMCacheMetadata(
            model_name=MODEL, world_size=1, local_world_size=1, worker_id=0, local_worker_id=0,
            kv_dtype=torch.bfloat16, kv_shape=(LAYERS, 2, chunk_tokens, HEADS, HEAD_SIZE),
            chunk_size=chunk_tokens,
        )
        allocator = TensorMemoryAllocator(torch.empty(pool_bytes, dtype=torch.uint8))
        self.backend = LocalCPUBackend(config=config, metadata=metadata, memory_allocator=allocator)
        self.conn = CreateConnector(remote_url, self.loop, self.backend, config, metadata)
        self.config, self.metadata = config, metadata
        self.shape = torch.Size([2, LAYERS, chunk_tokens, HEADS * HEAD_SIZE])

    def run(self, coro, timeout: float = 120):
        """Runs a connector coroutine on the connector's loop and waits for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=timeout)

    async def call(self, coro):
        """Awaits a connector coroutine (run on the connector's loop) from another loop."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def chunk(self, seed: int):
        """A new chunk (memory object) of deterministic bf16 values."""
        m = self.backend.allocate(self.shape, torch.bfloat16)
        m.ref_count_up()
        g = torch.Generator().manual_seed(seed)
        m.raw_data.copy_(torch.randint(-1000, 1000, m.raw_data.shape, generator=g).to(torch.bfloat16))
        return m


def key(chunk_hash: int, model: str = MODEL) -> CacheEngineKey:
    return CacheEngineKey(model, 1, 0, chunk_hash, torch.bfloat16)
