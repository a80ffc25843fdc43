"""Strata as an LMCache remote backend, through LMCache's remote storage plugin setting.

Importing this module needs LMCache (``pip install lmcache``; it brings torch). LMCache
loads the connector from its configuration, for example::

    remote_url: "plugin://strata"
    remote_storage_plugins: ["strata"]
    extra_config:
      save_chunk_meta: false
      remote_storage_plugin.strata.module_path: strata_client.lmcache_plugin
      remote_storage_plugin.strata.class_name: StrataRemoteConnector
      remote_storage_plugin.strata.url: "redis://127.0.0.1:6380"
      remote_storage_plugin.strata.lease_ms: 30000   # optional
      remote_storage_plugin.strata.local: true       # optional: on Strata's machine, map
                                                     # chunks from its files (KVC.LOCATE)
      remote_storage_plugin.strata.cluster: true     # optional: url names any node of a
                                                     # Strata cluster

Each chunk is one Strata value (LMCache's ``RemoteMetadata`` and the chunk's bytes), so
metadata and bytes cannot disagree; a lookup of N chunks is one ``KVC.MATCH`` (leasing the
matched chunks when LMCache asks to pin them), and reads and writes are pipelined
``KVC.GET`` / ``KVC.PUT`` of up to 64 chunks each (see ``strata_client.lmcache``). Chunks
hashed by ``LMCacheEngine.store`` carry their tokens (``strata_client.lmcache_tokens``), so a
Strata server with a KV event feed announces them to KV-aware routers.
"""

import asyncio
from typing import List, Optional

from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.protocol import RemoteMetadata
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from . import lmcache_tokens
from .lmcache import Chunk, StrataConnector

PREFIX = "remote_storage_plugin.strata."
DEFAULT_URL = "redis://127.0.0.1:6380"
#: How long chunks matched by a pinning lookup stay leased, unless configured.
DEFAULT_LEASE_MS = 30_000


def _byte_view(memory_obj: MemoryObj) -> memoryview:
    view = memory_obj.byte_array
    if not isinstance(view, memoryview):
        view = memoryview(view)
    return view.cast("B") if view.format != "B" else view


class StrataRemoteConnector(RemoteConnector):
    """LMCache ``RemoteConnector`` over Strata's KV-cache commands."""

    def __init__(self, loop: asyncio.AbstractEventLoop, local_cpu_backend, config):
        super().__init__(config, local_cpu_backend.metadata)
        extra = config.extra_config or {}
        url = extra.get(PREFIX + "url")
        if not url:
            remote = config.remote_url or ""
            url = remote if remote.startswith(("redis://", "rediss://", "unix://")) else DEFAULT_URL
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.lease_ms = int(extra.get(PREFIX + "lease_ms", DEFAULT_LEASE_MS))
        flag = lambda name: str(extra.get(PREFIX + name, "false")).lower() in ("1", "true", "yes")  # noqa: E731
        lmcache_tokens.install()
        self.strata = StrataConnector(
            url, local=flag("local"), cluster=flag("cluster"), tokens_of=lmcache_tokens.tokens_of
        )

    def _to_chunk(self, memory_obj: MemoryObj) -> Chunk:
        kv = _byte_view(memory_obj)
        meta = RemoteMetadata(
            len(kv), memory_obj.get_shapes(), memory_obj.get_dtypes(), memory_obj.get_memory_format()
        )
        return meta.serialize(), kv

    def _to_memory_obj(self, chunk: Chunk) -> Optional[MemoryObj]:
        meta_bytes, kv = chunk
        meta = RemoteMetadata.deserialize(memoryview(meta_bytes))
        if len(kv) != meta.length:
            raise ValueError(f"chunk holds {len(kv)} bytes, its metadata says {meta.length}")
        memory_obj = self.local_cpu_backend.allocate(meta.shapes, meta.dtypes, meta.fmt)
        if memory_obj is None:
            return None
        _byte_view(memory_obj)[: meta.length] = kv
        return memory_obj

    async def exists(self, key: CacheEngineKey) -> bool:
        return await self.strata.exists(key)

    def exists_sync(self, key: CacheEngineKey) -> bool:
        return self._sync(self.exists(key))

    async def get(self, key: CacheEngineKey) -> Optional[MemoryObj]:
        chunk = await self.strata.get(key)
        return None if chunk is None else self._to_memory_obj(chunk)

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj):
        await self.strata.put(key, self._to_chunk(memory_obj))

    async def list(self) -> List[str]:
        return await self.strata.list()

    async def close(self):
        await self.strata.close()

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys: List[CacheEngineKey], memory_objs: List[MemoryObj]):
        await self.strata.batched_put(keys, [self._to_chunk(m) for m in memory_objs])

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys: List[CacheEngineKey]) -> List[Optional[MemoryObj]]:
        found = await self.batched_get_non_blocking("", keys)
        return found + [None] * (len(keys) - len(found))

    def support_batched_get_non_blocking(self) -> bool:
        return True

    async def batched_get_non_blocking(self, lookup_id: str, keys: List[CacheEngineKey]) -> List[MemoryObj]:
        """The leading cached chunks (what LMCache can use: a prefix)."""
        out: List[MemoryObj] = []
        for chunk in await self.strata.batched_get(keys):
            memory_obj = self._to_memory_obj(chunk)
            if memory_obj is None:  # out of local memory: the prefix ends here
                break
            out.append(memory_obj)
        return out

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: List[CacheEngineKey]) -> int:
        """The synchronous lookup LMCache's storage manager uses: one ``KVC.MATCH`` (without
        this, LMCache falls back to one ``exists_sync`` round trip per chunk)."""
        return self._sync(self.strata.batched_contains(keys, lease_ms=0))

    def remove_sync(self, key: CacheEngineKey) -> bool:
        """Deletes one chunk; says whether it was there."""
        return self._sync(self.strata.remove(key))

    def _sync(self, coro):
        """Runs a call on the connector's event loop from another thread and waits for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys: List[CacheEngineKey], pin: bool = False) -> int:
        """How many leading chunks are cached, in one round trip; ``pin`` leases them."""
        return await self.strata.batched_contains(keys, lease_ms=self.lease_ms if pin else 0)
