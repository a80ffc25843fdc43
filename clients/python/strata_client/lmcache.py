"""A Strata remote connector for LMCache, beside the ``redis://`` one LMCache ships.

LMCache's own Redis connector keeps two keys per chunk (``<key>kv_bytes`` and
``<key>metadata``), probes one chunk at a time with ``EXISTS`` and reads each chunk with two
``GET``s. Against Strata that works unchanged. This connector uses what Strata adds:

- one key per chunk (metadata and bytes in one value, so they can never disagree);
- ``batched_contains``: how many leading chunks are cached, in one ``KVC.MATCH``
  (optionally leasing them so they are not evicted before they are read);
- ``batched_get`` / ``batched_put``: one ``KVC.GET`` / ``KVC.PUT`` per 64 chunks, pipelined.

LMCache keys (``model@world_size@worker_id@chunk_hash@dtype``, then optional ``@tag%value``
parts: ``CacheEngineKey.to_string()`` in LMCache 0.5) already carry a chained prefix hash;
the key without its hash becomes the Strata namespace, the hash the chunk id.
Values are ``(metadata: bytes, kv: bytes-like)`` pairs: LMCache's ``RemoteMetadata`` bytes
and the chunk's ``byte_array``. The methods mirror LMCache's ``RemoteConnector`` (async
``exists``/``get``/``put``/``list``/``close`` plus the batched calls);
``strata_client.lmcache_plugin`` wraps this class as a real LMCache ``RemoteConnector``
(converting ``MemoryObj`` to and from these pairs) that LMCache loads through its remote
storage plugin setting.
"""

import struct
from typing import List, Optional, Sequence, Tuple, Union

import redis.asyncio as aioredis

from .client import FileMaps, fill_elsewhere, map_located, unread
from .kvcache import key_for

Buffer = Union[bytes, bytearray, memoryview]
Chunk = Tuple[bytes, Buffer]

#: Chunks per KVC.GET / KVC.PUT; longer batches are split and pipelined.
CHUNKS_PER_COMMAND = 64


#: The field of an LMCache key string that holds the chunk hash.
HASH_FIELD = 3


def split_key(key) -> Tuple[str, str]:
    """``(namespace, chunk hash)`` of an LMCache key (a string or a ``CacheEngineKey``)."""
    s = key if isinstance(key, str) else key.to_string()
    parts = s.split("@")
    if len(parts) < 5 or not all(parts[:5]):
        raise ValueError(f"not an LMCache key (model@world_size@worker_id@chunk_hash@dtype): {s!r}")
    h = parts.pop(HASH_FIELD)
    return "@".join(parts), h


def join_key(namespace: str, chunk_hash: str) -> str:
    """The LMCache key string of a chunk: the inverse of ``split_key``."""
    parts = namespace.split("@")
    parts.insert(HASH_FIELD, chunk_hash)
    return "@".join(parts)


def encode(metadata: bytes, kv: Buffer) -> bytes:
    """One value: metadata length (u32 LE), metadata, chunk bytes; copies the chunk once."""
    return b"".join((struct.pack("<I", len(metadata)), metadata, kv))


def decode(value: bytes) -> Chunk:
    (n,) = struct.unpack_from("<I", value)
    view = memoryview(value)
    return bytes(view[4 : 4 + n]), view[4 + n :]


class StrataConnector:
    """LMCache remote connector over Strata's KV-cache commands."""

    def __init__(
        self, url: str = "redis://127.0.0.1:6380", lease_ms: int = 0, max_connections: int = 16, local: bool = False
    ):
        """With ``local`` (a client on the server's machine that may read its files), reads
        map the chunks from the server's value log (``KVC.LOCATE``) instead of receiving
        them through the socket; chunks not there are read with ``KVC.GET``."""
        self.pool = aioredis.ConnectionPool.from_url(url, max_connections=max_connections)
        self.r = aioredis.Redis(connection_pool=self.pool)
        self.lease_ms = lease_ms
        self.maps = FileMaps() if local else None

    @staticmethod
    def _group(keys: Sequence) -> Tuple[str, List[str]]:
        parts = [split_key(k) for k in keys]
        namespaces = {ns for ns, _ in parts}
        if len(namespaces) > 1:
            raise ValueError("keys of one batch must share a namespace (model, format, worker)")
        return (parts[0][0] if parts else ""), [h for _, h in parts]

    async def exists(self, key) -> bool:
        return await self.batched_contains([key]) == 1

    async def batched_contains(self, keys: Sequence, lease_ms: Optional[int] = None) -> int:
        """How many leading ``keys`` are cached: one round trip for the whole prefix. The
        matched chunks are leased for ``lease_ms`` (default: the connector's ``lease_ms``;
        0: no lease)."""
        if not keys:
            return 0
        ns, hashes = self._group(keys)
        args = ["KVC.MATCH", ns, *hashes]
        lease_ms = self.lease_ms if lease_ms is None else lease_ms
        if lease_ms:
            args += ["LEASE", lease_ms]
        count, _tiers = await self.r.execute_command(*args)
        return int(count)

    async def get(self, key) -> Optional[Chunk]:
        got = await self.batched_get([key])
        return got[0] if got else None

    async def batched_get(self, keys: Sequence) -> List[Chunk]:
        """The leading cached chunks of ``keys``, in order; stops at the first miss."""
        if not keys:
            return []
        ns, hashes = self._group(keys)
        if self.maps is not None:
            return await self._batched_get_local(ns, hashes)
        out: List[Chunk] = []
        pipe = self.r.pipeline(transaction=False)
        batches = [hashes[i : i + CHUNKS_PER_COMMAND] for i in range(0, len(hashes), CHUNKS_PER_COMMAND)]
        for b in batches:
            pipe.execute_command("KVC.GET", ns, *b)
        for b, values in zip(batches, await pipe.execute()):
            values = await self._kvc_get(ns, b, values)
            out.extend(decode(v) for v in values)
            if len(values) < len(b):
                break
        return out

    async def _kvc_get(self, ns: str, hashes: List[str], values: Optional[list] = None) -> list:
        """``strata_client.client.kvc_get`` over the asyncio client."""
        values = list(await self.r.execute_command("KVC.GET", ns, *hashes)) if values is None else list(values)
        rest = unread(hashes, values)
        while rest:
            more = await self.r.execute_command("KVC.GET", ns, *rest)
            values += more
            rest = unread(rest, more)
        return values

    async def _batched_get_local(self, ns: str, hashes: List[str]) -> List[Chunk]:
        """Chunks in the server's value log mapped from its files, the rest by KVC.GET."""
        out: list = []
        for i in range(0, len(hashes), CHUNKS_PER_COMMAND):
            batch = hashes[i : i + CHUNKS_PER_COMMAND]
            located = await self.r.execute_command("KVC.LOCATE", ns, *batch)
            elsewhere = map_located(self.maps, batch, located, out)
            if elsewhere:
                values = await self._kvc_get(ns, [h for _, h in elsewhere])
                if not fill_elsewhere(out, elsewhere, values):
                    break
            if len(located) < len(batch):
                break
        return [decode(v) for v in out]

    async def remove(self, key) -> bool:
        """Deletes one chunk; says whether it was there."""
        ns, (h,) = self._group([key])
        return bool(await self.r.delete(key_for(ns, h)))

    async def put(self, key, chunk: Chunk) -> None:
        await self.batched_put([key], [chunk])

    async def batched_put(self, keys: Sequence, chunks: Sequence[Chunk], ttl_s: int = 0) -> None:
        if len(keys) != len(chunks):
            raise ValueError(f"{len(keys)} keys but {len(chunks)} chunks")
        if not keys:
            return
        ns, hashes = self._group(keys)
        pipe = self.r.pipeline(transaction=False)
        for i in range(0, len(hashes), CHUNKS_PER_COMMAND):
            args: list = ["KVC.PUT", ns]
            for h, (meta, kv) in zip(hashes[i : i + CHUNKS_PER_COMMAND], chunks[i : i + CHUNKS_PER_COMMAND]):
                args += [h, encode(meta, kv)]
            if ttl_s:
                args += ["TTL", int(ttl_s)]
            pipe.execute_command(*args)
        await pipe.execute()

    async def list(self) -> List[str]:
        """Every chunk key, in LMCache's form (walks the keyspace with SCAN)."""
        out = []
        async for k in self.r.scan_iter(match="kvc:*", count=1000):
            ns, _, h = k.decode()[len("kvc:") :].rpartition(":")
            out.append(join_key(ns, h))
        return out

    async def close(self) -> None:
        await self.pool.disconnect()
