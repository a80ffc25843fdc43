"""Clients over redis-py, with a connection pool."""

import mmap
import os
import struct
from collections import OrderedDict
from typing import List, Optional, Sequence, Union

import redis

from .kvcache import Namespace

Buffer = Union[bytes, bytearray, memoryview]

#: Most chunks sent in one command; longer prompts are split and pipelined.
CHUNKS_PER_COMMAND = 256
#: Value-log files ``retrieve_local`` keeps mapped (each up to the server's vlog_file_bytes).
MAPS_MAX = 64


class FileMaps:
    """Read-only maps of the server's value-log files, for clients on the server's machine
    (``KVC.LOCATE``): at most ``MAPS_MAX`` files stay mapped; a file dropped from the set is
    unmapped once no view of it is left."""

    def __init__(self):
        self._maps: "OrderedDict[bytes, memoryview]" = OrderedDict()

    def view(self, path: bytes, offset: int, length: int) -> memoryview:
        """``length`` bytes at ``offset`` of the file at ``path``, without a copy."""
        end = offset + length
        whole = self._maps.get(path)
        if whole is None or len(whole) < end:
            fd = os.open(path, os.O_RDONLY)
            try:
                whole = memoryview(mmap.mmap(fd, 0, access=mmap.ACCESS_READ))
            finally:
                os.close(fd)
            if len(whole) < end:
                raise ValueError(f"{path!r} holds {len(whole)} bytes, the server located a chunk up to {end}")
            self._maps[path] = whole
        self._maps.move_to_end(path)
        while len(self._maps) > MAPS_MAX:
            self._maps.popitem(last=False)
        return whole[offset:end]


def map_located(maps: FileMaps, hashes, located, out: list, key_of=None) -> list:
    """Appends to ``out`` a view of each chunk ``KVC.LOCATE`` located (checked against its
    CRC when ``key_of`` names the chunk keys), and a placeholder for each chunk it reports
    present elsewhere; returns those as ``(index in out, hash)`` to read with ``KVC.GET``."""
    elsewhere = []
    for h, loc in zip(hashes, located):
        if loc is None:
            elsewhere.append((len(out), h))
            out.append(None)
            continue
        path, offset, length, expire_ms, crc = loc
        view = maps.view(path, offset, length)
        if key_of is not None:
            check(key_of(h).encode(), expire_ms, view, crc)
        out.append(view)
    return elsewhere


def fill_elsewhere(out: list, elsewhere: list, values: list) -> bool:
    """Puts the ``KVC.GET`` ``values`` of the ``elsewhere`` chunks in their places; if one
    went missing meanwhile, cuts ``out`` there and returns False."""
    for (i, _), v in zip(elsewhere, values):
        out[i] = v
    if len(values) < len(elsewhere):
        del out[elsewhere[len(values)][0] :]
        return False
    return True


def unread(asked: Sequence, got: Sequence) -> list:
    """The chunk ids a ``KVC.GET`` reply left out. The server stops at its reply size limit
    (``client-output-buffer-limit``) as well as at a missing chunk; a reply that stopped
    early but carried something is followed by another for the rest, and an empty reply
    means the next chunk is missing."""
    return list(asked[len(got) :]) if 0 < len(got) < len(asked) else []


def kvc_get(r: "redis.Redis", ns: str, hashes: Sequence, values: Optional[list] = None) -> list:
    """The leading present chunks of ``hashes`` (``KVC.GET``, again for what a reply left
    out); ``values``: a first reply already in hand."""
    values = list(r.execute_command("KVC.GET", ns, *hashes)) if values is None else list(values)
    rest = unread(hashes, values)
    while rest:
        more = r.execute_command("KVC.GET", ns, *rest)
        values += more
        rest = unread(rest, more)
    return values


def byte_view(buf) -> Buffer:
    """Any buffer (bytes, a memoryview, a numpy array, ...) as bytes the wire can carry,
    without a copy when it is contiguous (redis-py writes a memoryview's length in items,
    so other formats are cast to bytes first)."""
    if isinstance(buf, (bytes, bytearray)):
        return buf
    view = memoryview(buf)
    return view.cast("B") if view.c_contiguous else view.tobytes()


def check(key: bytes, expire_ms: int, value: Buffer, crc: int) -> None:
    """Raises ``ValueError`` unless ``crc`` is the CRC-32C of key, expiry (8 bytes, little
    endian) and value: the checksum Strata keeps for every stored value."""
    import google_crc32c

    got = google_crc32c.extend(google_crc32c.value(key), struct.pack("<Q", expire_ms))
    view = memoryview(value)
    step = 1 << 20  # google_crc32c takes only bytes: check through one cache-sized copy at a time
    for at in range(0, len(view), step):
        got = google_crc32c.extend(got, bytes(view[at : at + step]))
    if got != crc:
        raise ValueError(f"checksum mismatch for {key!r}: the mapped bytes are not the value Strata stored")


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
    cached chunks back (``KVC.GET``); ``retrieve_local``, on the server's machine, maps them
    from the server's files instead (``KVC.LOCATE``).
    """

    def __init__(self, url: str, namespace: Namespace, **kw):
        self.ns = namespace
        self.pool = redis.ConnectionPool.from_url(url, **kw)
        self.r = redis.Redis(connection_pool=self.pool)
        self.maps = FileMaps()

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
                args += [h, byte_view(c)]
            if ttl_s:
                args += ["TTL", int(ttl_s)]
            pipe.execute_command(*args)
        return sum(int(n) for n in pipe.execute())

    def retrieve(self, tokens: Sequence[int]) -> List[bytes]:
        """The buffers of the leading cached chunks, in order (stops at the first miss)."""
        return self.retrieve_chunks(self.ns.chunk_hashes(tokens))

    def retrieve_local(self, tokens: Sequence[int], verify: bool = False) -> List[Buffer]:
        """As ``retrieve``, for a client on the server's machine that may read the server's
        files: chunks in the server's value log come back as read-only views of those files,
        mapped here (``KVC.LOCATE``), so their bytes never cross the socket and are not
        copied (the views point into the page cache, and stay valid after the server
        deletes or rewrites a file); the rest of the prefix (chunks in the object store, or
        too small for the value log) is read with ``KVC.GET``. With ``verify``, each mapped
        chunk is checked against the CRC-32C the server gives (needs ``google-crc32c``:
        ``pip install strata-client[verify]``); a mismatch raises ``ValueError``."""
        hashes = self.ns.chunk_hashes(tokens)
        out: List[Buffer] = []
        for batch in (b for b in self._batches(hashes) if b):
            located = self.r.execute_command("KVC.LOCATE", self.ns.id, *batch)
            elsewhere = map_located(self.maps, batch, located, out, self.ns.key_of if verify else None)
            if elsewhere:
                values = kvc_get(self.r, self.ns.id, [h for _, h in elsewhere])
                if not fill_elsewhere(out, elsewhere, values):
                    break
            if len(located) < len(batch):
                break
        return out

    def retrieve_chunks(self, hashes: Sequence[str]) -> List[bytes]:
        """The leading cached chunks of ``hashes`` (chunk ids), read with ``KVC.GET``."""
        out: List[bytes] = []
        pipe = self.r.pipeline(transaction=False)
        batches = [b for b in self._batches(list(hashes)) if b]
        for batch in batches:
            pipe.execute_command("KVC.GET", self.ns.id, *batch)
        for batch, values in zip(batches, pipe.execute()):
            values = kvc_get(self.r, self.ns.id, batch, values)
            out.extend(values)
            if len(values) < len(batch):
                break
        return out

    def close(self):
        self.pool.disconnect()
