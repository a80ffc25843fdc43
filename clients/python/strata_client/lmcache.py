"""A Strata remote connector for LMCache, beside the ``redis://`` one LMCache ships.

LMCache's own Redis connector keeps two keys per chunk (``<key>kv_bytes`` and
``<key>metadata``), probes one chunk at a time with ``EXISTS`` and reads each chunk with two
``GET``s. Against Strata that works unchanged. This connector uses what Strata adds:

- one key per chunk (metadata and bytes in one value, so they can never disagree);
- ``batched_contains``: how many leading chunks are cached, in one ``KVC.MATCH``
  (optionally leasing them so they are not evicted before they are read);
- ``batched_get`` / ``batched_put``: one ``KVC.GET`` / ``KVC.PUT`` per 64 chunks, pipelined.

Against a Strata cluster (``cluster=True``; the plugin's ``remote_storage_plugin.strata.cluster``)
each chunk is its own group: LMCache hands a connector chunk keys without their position in
the prompt, so the chunks cannot be grouped by it as ``KVCacheClient`` groups them. Each
chunk's tag is its own hash; the connector keeps the slot map (``CLUSTER SLOTS``), sends one
pipeline per node, and sends again after a redirection.

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

import asyncio
import struct
from typing import Dict, List, Optional, Sequence, Tuple, Union

import redis
import redis.asyncio as aioredis
from redis.asyncio.connection import parse_url
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from .client import REDIRECTED, REDIRECTS_MAX, FileMaps, fill_elsewhere, map_located, unread
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


class Routes:
    """Where a cluster's slots are, learned from ``CLUSTER SLOTS``, and a connection pool per
    node (at most ``max_connections`` each)."""

    def __init__(self, url: str, max_connections: int):
        self.url = url
        self.max_connections = max_connections
        self.nodes: Dict[str, aioredis.Redis] = {}
        self.owner: List[Optional[str]] = []

    def _client(self, endpoint: str) -> aioredis.Redis:
        if endpoint not in self.nodes:
            host, port = endpoint.rsplit(":", 1)
            # The URL's credentials and options, this node's address.
            options = {**parse_url(self.url), "host": host, "port": int(port)}
            pool = aioredis.ConnectionPool(max_connections=self.max_connections, **options)
            self.nodes[endpoint] = aioredis.Redis(connection_pool=pool)
        return self.nodes[endpoint]

    async def learn(self) -> None:
        """Reads the slot map from the first node that answers (the URL's first)."""
        first = aioredis.Redis(connection_pool=aioredis.ConnectionPool.from_url(self.url))
        askable = [first, *self.nodes.values()]
        error: Optional[Exception] = None
        try:
            for r in askable:
                try:
                    ranges = await r.execute_command("CLUSTER SLOTS")
                    break
                except (redis.exceptions.ConnectionError, redis.exceptions.ResponseError) as e:
                    error = e
            else:
                raise error  # type: ignore[misc]
        finally:
            await first.aclose()
        owner: List[Optional[str]] = [None] * REDIS_CLUSTER_HASH_SLOTS
        for lo, hi, primary, *_ in ranges:
            host = primary[0].decode() if isinstance(primary[0], bytes) else primary[0]
            endpoint = f"{host}:{int(primary[1])}"
            self._client(endpoint)
            for slot in range(int(lo), int(hi) + 1):
                owner[slot] = endpoint
        self.owner = owner

    async def run(self, cmds: List[Tuple[str, list]]) -> list:
        """One reply per ``(tag, command)``, each command sent to the node of its tag's slot:
        one pipeline per node, all nodes at once, everything sent again (after learning the
        map again) while a reply is a redirection."""
        if not cmds:
            return []
        for attempt in range(REDIRECTS_MAX):
            if not self.owner:
                await self.learn()
            by_node: Dict[str, List[int]] = {}
            for i, (tag, _) in enumerate(cmds):
                by_node.setdefault(self.owner[key_slot(tag.encode())] or "", []).append(i)
            replies: list = [None] * len(cmds)

            async def send(endpoint: str, idxs: List[int]) -> None:
                if not endpoint:
                    err = redis.exceptions.ClusterDownError("no node serves the slot")
                    for i in idxs:
                        replies[i] = err
                    return
                pipe = self._client(endpoint).pipeline(transaction=False)
                for i in idxs:
                    pipe.execute_command(*cmds[i][1])
                try:
                    got = await pipe.execute(raise_on_error=False)
                except redis.exceptions.ConnectionError as e:
                    got = [e] * len(idxs)
                for i, rep in zip(idxs, got):
                    replies[i] = rep

            await asyncio.gather(*(send(n, idxs) for n, idxs in by_node.items()))
            errors = [r for r in replies if isinstance(r, Exception)]
            if not errors:
                return replies
            if not all(isinstance(e, REDIRECTED) for e in errors):
                raise errors[0]
            self.owner = []
            await asyncio.sleep(min(0.5, 0.01 * (attempt + 1)))
        raise errors[0]

    async def close(self) -> None:
        for r in self.nodes.values():
            await r.connection_pool.disconnect()


class StrataConnector:
    """LMCache remote connector over Strata's KV-cache commands."""

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6380",
        lease_ms: int = 0,
        max_connections: int = 16,
        local: bool = False,
        cluster: bool = False,
        tokens_of=None,
    ):
        """With ``local`` (a client on the server's machine that may read its files), reads
        map the chunks from the server's value log (``KVC.LOCATE``) instead of receiving
        them through the socket; chunks not there are read with ``KVC.GET``. With
        ``cluster``, ``url`` names any node of a Strata cluster (``local`` is for a single
        node). ``tokens_of(chunk_hash)`` gives a chunk's parent hash and tokens if known
        (``strata_client.lmcache_tokens``): such chunks are stored with ``KVC.PUT ...
        TOKENS``, so the server announces them on its KV event feed."""
        if cluster and local:
            raise ValueError("local reads map one server's files: use them with a single node, not a cluster")
        self.routes = Routes(url, max_connections) if cluster else None
        self.pool = None if cluster else aioredis.ConnectionPool.from_url(url, max_connections=max_connections)
        self.r = None if cluster else aioredis.Redis(connection_pool=self.pool)
        self.lease_ms = lease_ms
        self.maps = FileMaps() if local else None
        self.tokens_of = tokens_of

    @staticmethod
    def _group(keys: Sequence) -> Tuple[str, List[str]]:
        parts = [split_key(k) for k in keys]
        namespaces = {ns for ns, _ in parts}
        if len(namespaces) > 1:
            raise ValueError("keys of one batch must share a namespace (model, format, worker)")
        return (parts[0][0] if parts else ""), [h for _, h in parts]

    def _parts(self, items: list) -> List[Tuple[Optional[str], list]]:
        """``items`` (hashes, or ``(hash, chunk)`` pairs) cut into requests: up to
        ``CHUNKS_PER_COMMAND`` each on a single node, one per chunk (its own group, tagged
        with its hash) in a cluster."""
        if self.routes is None:
            return [(None, items[i : i + CHUNKS_PER_COMMAND]) for i in range(0, len(items), CHUNKS_PER_COMMAND)]
        return [(it[0] if isinstance(it, tuple) else it, [it]) for it in items]

    async def _run(self, command: str, ns: str, parts: List[Tuple[Optional[str], list]], extra: Sequence = ()) -> list:
        """One reply per part: ``command ns [TAG t] *args *extra``."""
        cmds = [(tag, [command, ns, *(["TAG", tag] if tag else []), *args, *extra]) for tag, args in parts]
        if self.routes is not None:
            return await self.routes.run(cmds)
        pipe = self.r.pipeline(transaction=False)
        for _, c in cmds:
            pipe.execute_command(*c)
        return await pipe.execute()

    async def exists(self, key) -> bool:
        return await self.batched_contains([key]) == 1

    async def batched_contains(self, keys: Sequence, lease_ms: Optional[int] = None) -> int:
        """How many leading ``keys`` are cached: one round trip for the whole prefix (one
        per node in a cluster). The matched chunks are leased for ``lease_ms`` (default: the
        connector's ``lease_ms``; 0: no lease)."""
        if not keys:
            return 0
        ns, hashes = self._group(keys)
        lease_ms = self.lease_ms if lease_ms is None else lease_ms
        extra = ["LEASE", lease_ms] if lease_ms else []
        parts = self._parts(hashes)
        count = 0
        for (_, part), (n, _tiers) in zip(parts, await self._run("KVC.MATCH", ns, parts, extra)):
            count += int(n)
            if int(n) < len(part):
                break
        return count

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
        parts = self._parts(hashes)
        for (tag, b), values in zip(parts, await self._run("KVC.GET", ns, parts)):
            values = await self._kvc_get(ns, tag, b, values)
            out.extend(decode(v) for v in values)
            if len(values) < len(b):
                break
        return out

    async def _kvc_get(self, ns: str, tag: Optional[str], hashes: List[str], values: Optional[list] = None) -> list:
        """``strata_client.client.kvc_get`` over the asyncio client."""
        values = list((await self._run("KVC.GET", ns, [(tag, hashes)]))[0]) if values is None else list(values)
        rest = unread(hashes, values)
        while rest:
            more = (await self._run("KVC.GET", ns, [(tag, rest)]))[0]
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
                values = await self._kvc_get(ns, None, [h for _, h in elsewhere])
                if not fill_elsewhere(out, elsewhere, values):
                    break
            if len(located) < len(batch):
                break
        return [decode(v) for v in out]

    async def remove(self, key) -> bool:
        """Deletes one chunk; says whether it was there."""
        ns, (h,) = self._group([key])
        if self.routes is None:
            return bool(await self.r.delete(key_for(ns, h)))
        (n,) = await self.routes.run([(h, ["DEL", key_for(ns, h, h)])])
        return bool(n)

    async def put(self, key, chunk: Chunk) -> None:
        await self.batched_put([key], [chunk])

    async def batched_put(self, keys: Sequence, chunks: Sequence[Chunk], ttl_s: int = 0) -> None:
        if len(keys) != len(chunks):
            raise ValueError(f"{len(keys)} keys but {len(chunks)} chunks")
        if not keys:
            return
        ns, hashes = self._group(keys)
        known = [self.tokens_of(h) for h in hashes] if self.tokens_of else [None] * len(hashes)
        parts = []
        for run in self._chained_runs(hashes, known):
            pairs = [(hashes[i], chunks[i]) for i in run]
            if known[run[0]] is None:
                parts += [(tag, [x for h, (meta, kv) in ps for x in (h, encode(meta, kv))]) for tag, ps in self._parts(pairs)]
                continue
            at = dict(zip(hashes, range(len(hashes))))
            for tag, ps in self._parts(pairs):
                first = at[ps[0][0]]
                args = ["TOKENS", known[first][0]]
                for h, (meta, kv) in ps:
                    args += [h, encode(meta, kv), known[at[h]][1]]
                parts.append((tag, args))
        await self._run("KVC.PUT", ns, parts, ["TTL", int(ttl_s)] if ttl_s else [])

    @staticmethod
    def _chained_runs(hashes: Sequence[str], known: Sequence) -> List[List[int]]:
        """Indexes of ``hashes`` in runs one request can carry: chunks with tokens whose
        parents are the chunks before them (``KVC.PUT ... TOKENS`` chains them so), or
        chunks without tokens."""
        runs: List[List[int]] = []
        for i, k in enumerate(known):
            prev = runs[-1][-1] if runs else None
            same = prev is not None and (known[prev] is None) == (k is None)
            if same and (k is None or k[0] == hashes[prev]):
                runs[-1].append(i)
            else:
                runs.append([i])
        return runs

    async def list(self) -> List[str]:
        """Every chunk key, in LMCache's form (walks the keyspace of every node with SCAN)."""
        if self.routes is not None and not self.routes.owner:
            await self.routes.learn()
        clients = [self.r] if self.routes is None else list(self.routes.nodes.values())
        out = []
        for r in clients:
            async for k in r.scan_iter(match="kvc:*", count=1000):
                ns, _, h = k.decode()[len("kvc:") :].rpartition(":")
                if h.startswith("{"):  # a cluster's key: {tag}hash
                    h = h[h.index("}") + 1 :]
                out.append(join_key(ns, h))
        return out

    async def close(self) -> None:
        if self.routes is not None:
            await self.routes.close()
        else:
            await self.pool.disconnect()
