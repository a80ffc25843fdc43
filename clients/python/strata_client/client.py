"""Clients over redis-py, with a connection pool."""

from typing import List, Optional, Sequence, Union

import redis

from .kvcache import Namespace

Buffer = Union[bytes, bytearray, memoryview]

#: Most chunks sent in one command; longer prompts are split and pipelined.
CHUNKS_PER_COMMAND = 256


class StrataClient(redis.Redis):
    """A plain key-value client: every redis-py command, plus Strata's own."""

    @classmethod
    def connect(cls, url: str = "redis://127.0.0.1:6380", **kw) -> "StrataClient":
        return cls(connection_pool=redis.ConnectionPool.from_url(url, **kw))

    def tier(self, key) -> Optional[str]:
        t = self.execute_command("TIER", key)
        return t.decode() if isinstance(t, bytes) else t


class KVCacheClient:
    """The KV-cache pool: chunks of attention state keyed by token prefix.

    ``lookup`` answers how many leading tokens are cached (one ``KVC.MATCH``), ``store``
    writes the chunks of a prefix (``KVC.PUT``, pipelined), ``retrieve`` reads the leading
    cached chunks back (``KVC.GET``).
    """

    def __init__(self, url: str, namespace: Namespace, **kw):
        self.ns = namespace
        self.pool = redis.ConnectionPool.from_url(url, **kw)
        self.r = redis.Redis(connection_pool=self.pool)

    def _batches(self, items: list) -> List[list]:
        return [items[i : i + CHUNKS_PER_COMMAND] for i in range(0, len(items), CHUNKS_PER_COMMAND)] or [[]]

    def lookup(self, tokens: Sequence[int], lease_ms: Optional[int] = None) -> int:
        """The number of leading tokens whose KV chunks are cached."""
        hashes = self.ns.chunk_hashes(tokens)
        if not hashes:
            return 0
        args = ["KVC.MATCH", self.ns.id, *hashes]
        if lease_ms:
            args += ["LEASE", int(lease_ms)]
        count, _tiers = self.r.execute_command(*args)
        return int(count) * self.ns.chunk_tokens

    def tiers(self, tokens: Sequence[int]) -> List[str]:
        """Where each leading cached chunk lives (hot, warm, cold)."""
        hashes = self.ns.chunk_hashes(tokens)
        if not hashes:
            return []
        _count, tiers = self.r.execute_command("KVC.MATCH", self.ns.id, *hashes)
        return [t.decode() if isinstance(t, bytes) else t for t in tiers]

    def store(self, tokens: Sequence[int], chunks: Sequence[Buffer], ttl_s: Optional[int] = None) -> int:
        """Stores one buffer per whole chunk of ``tokens``; returns the number stored."""
        hashes = self.ns.chunk_hashes(tokens)
        if len(chunks) != len(hashes):
            raise ValueError(f"{len(hashes)} whole chunks in the tokens but {len(chunks)} buffers given")
        pipe = self.r.pipeline(transaction=False)
        pairs = list(zip(hashes, chunks))
        for batch in self._batches(pairs):
            if not batch:
                continue
            args = ["KVC.PUT", self.ns.id]
            for h, c in batch:
                args += [h, bytes(c) if isinstance(c, memoryview) else c]
            if ttl_s:
                args += ["TTL", int(ttl_s)]
            pipe.execute_command(*args)
        return sum(int(n) for n in pipe.execute())

    def retrieve(self, tokens: Sequence[int]) -> List[bytes]:
        """The buffers of the leading cached chunks, in order (stops at the first miss)."""
        hashes = self.ns.chunk_hashes(tokens)
        out: List[bytes] = []
        pipe = self.r.pipeline(transaction=False)
        batches = [b for b in self._batches(hashes) if b]
        for batch in batches:
            pipe.execute_command("KVC.GET", self.ns.id, *batch)
        for batch, values in zip(batches, pipe.execute()):
            out.extend(values)
            if len(values) < len(batch):
                break
        return out

    def close(self):
        self.pool.disconnect()
