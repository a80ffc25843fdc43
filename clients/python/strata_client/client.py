"""Clients over redis-py, with a connection pool."""

import mmap
import os
import struct
import threading
import time
from collections import OrderedDict
from typing import List, Optional, Sequence, Tuple, Union

import redis

from .kvcache import GROUP_CHUNKS_DEFAULT, Namespace, groups, key_for, tokens_le
from .wire import Wire

Buffer = Union[bytes, bytearray, memoryview]

#: Most chunks sent in one command; longer prompts are split and pipelined.
CHUNKS_PER_COMMAND = 256
#: Value-log files ``retrieve_local`` keeps mapped (each up to the server's vlog_file_bytes).
MAPS_MAX = 64
#: Direct-read connections a ``KVCacheClient`` keeps for reuse.
WIRES_MAX = 8
#: Times a cluster request is sent again after a redirection (``MOVED``, ``TRYAGAIN``...).
REDIRECTS_MAX = 16
#: Failures that mean: the slot map moved, learn it again and send again (redis-py turns
#: the replies ``MOVED``, ``ASK``, ``TRYAGAIN`` and ``CLUSTERDOWN`` into these).
REDIRECTED = (
    redis.exceptions.AskError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.ConnectionError,
)


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


def kvc_get(get, hashes: Sequence, values: Optional[list] = None) -> list:
    """The leading present chunks of ``hashes`` (``KVC.GET``, again for what a reply left
    out); ``get(hashes)`` sends one ``KVC.GET``; ``values``: a first reply already in hand."""
    values = list(get(hashes)) if values is None else list(values)
    rest = unread(hashes, values)
    while rest:
        more = get(rest)
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

    With ``cluster=True`` the URL names any node of a Strata cluster: chunks go in groups of
    ``group_chunks`` (the cluster's ``kvc_group_chunks``), each group under its tag (the hash
    of its first chunk) in one slot; a request is split per group and sent to each group's
    node, one pipeline per node, and sent again after a redirection. ``where`` asks any node
    which nodes hold a prefix (``KVC.WHERE``).
    """

    def __init__(self, url: str, namespace: Namespace, cluster: bool = False, group_chunks: int = GROUP_CHUNKS_DEFAULT, **kw):
        self.ns = namespace
        self.maps = FileMaps()
        if cluster:
            from redis.cluster import RedisCluster

            self.rc = RedisCluster.from_url(url, **kw)
            self.group_chunks = max(1, int(group_chunks))
            self.pool = None
            self.r = self.rc
        else:
            self.rc = None
            self.group_chunks = 0
            self.pool = redis.ConnectionPool.from_url(url, **kw)
            self.r = redis.Redis(connection_pool=self.pool)
        # Connections that read chunks straight into buffers (``wire.Wire``), kept for reuse;
        # not over TLS (``rediss://``), where reads go through redis-py.
        self.url = url
        self.direct = self.rc is None and not url.startswith("rediss://")
        self._wires: List[Wire] = []
        self._wires_lock = threading.Lock()

    def _batches(self, items: list) -> List[list]:
        return [items[i : i + CHUNKS_PER_COMMAND] for i in range(0, len(items), CHUNKS_PER_COMMAND)] or [[]]

    def _parts(self, items: list) -> List[Tuple[Optional[str], list]]:
        """``items`` (chunk hashes, or ``(hash, value)`` pairs) cut into the requests that
        carry them, in order: per group in a cluster (with the group's tag), and at most
        ``CHUNKS_PER_COMMAND`` per request."""
        if not items:
            return []
        if not self.group_chunks:
            return [(None, b) for b in self._batches(items)]
        first = lambda it: it[0] if isinstance(it, tuple) else it  # noqa: E731
        out = []
        for start, end in groups(len(items), self.group_chunks):
            tag = first(items[start])
            out += [(tag, b) for b in self._batches(items[start:end])]
        return out

    def _args(self, command: str, tag: Optional[str], args: list) -> list:
        head = [command, self.ns.id] if tag is None else [command, self.ns.id, "TAG", tag]
        return head + list(args)

    def _run(self, command: str, parts: List[Tuple[Optional[str], list]], extra: Sequence = ()) -> list:
        """One reply per part (``command ns [TAG t] *args *extra``): one pipeline, or in a
        cluster one pipeline per node, sent again while the slot map moves."""
        if not parts:
            return []
        if self.rc is None:
            pipe = self.r.pipeline(transaction=False)
            for tag, args in parts:
                pipe.execute_command(*self._args(command, tag, args), *extra)
            return pipe.execute()
        from redis.crc import key_slot

        for attempt in range(REDIRECTS_MAX):
            by_node = {}
            for i, (tag, _) in enumerate(parts):
                node = self.rc.nodes_manager.get_node_from_slot(key_slot(tag.encode()))
                by_node.setdefault(node.name, (node, []))[1].append(i)
            replies: list = [None] * len(parts)
            for node, idxs in by_node.values():
                pipe = self.rc.get_redis_connection(node).pipeline(transaction=False)
                for i in idxs:
                    tag, args = parts[i]
                    pipe.execute_command(*self._args(command, tag, args), *extra)
                try:
                    got = pipe.execute(raise_on_error=False)
                except redis.exceptions.ConnectionError as e:  # the node left
                    got = [e] * len(idxs)
                for i, rep in zip(idxs, got):
                    replies[i] = rep
            errors = [r for r in replies if isinstance(r, Exception)]
            if not errors:
                return replies
            if not all(isinstance(e, REDIRECTED) for e in errors):
                raise errors[0]
            # The map moved: learn it again and send everything again (every KVC command
            # is idempotent).
            self.rc.nodes_manager.initialize()
            time.sleep(min(0.5, 0.01 * (attempt + 1)))
        raise errors[0]

    def lookup(self, tokens: Sequence[int], lease_ms: Optional[int] = None) -> int:
        """The number of leading tokens whose KV chunks are cached."""
        extra = ["LEASE", int(lease_ms)] if lease_ms else []
        return len(self._match(self.ns.chunk_hashes(tokens), extra)) * self.ns.chunk_tokens

    def _match(self, hashes: list, extra: Sequence = ()) -> List[str]:
        """The tiers of the leading cached chunks of ``hashes`` (one ``KVC.MATCH`` per
        request part, all sent at once)."""
        parts = self._parts(hashes)
        tiers: List[str] = []
        for (_, part), (count, part_tiers) in zip(parts, self._run("KVC.MATCH", parts, extra)):
            tiers += [t.decode() if isinstance(t, bytes) else t for t in part_tiers]
            if int(count) < len(part):
                break
        return tiers

    def tiers(self, tokens: Sequence[int]) -> List[str]:
        """Where each leading cached chunk lives (hot, warm, cold)."""
        return self._match(self.ns.chunk_hashes(tokens))

    def where(self, tokens: Sequence[int]) -> dict:
        """``KVC.WHERE`` of ``tokens`` asked of one node: how many leading tokens are
        cached across the cluster, the expected microseconds to load them, the nodes that
        hold them (``[(node, chunks), ...]`` in chunk order) and each chunk's tier."""
        hashes = self.ns.chunk_hashes(tokens)
        if not hashes:
            return {"tokens": 0, "load_us": 0, "nodes": [], "tiers": []}
        args = ["KVC.WHERE", self.ns.id, "GROUP", self.group_chunks, *hashes]
        if self.rc is not None:
            count, load_us, nodes, tiers = self.rc.execute_command(*args, target_nodes=self.rc.get_random_node())
        else:
            count, load_us, nodes, tiers = self.r.execute_command(*args)
        text = lambda b: b.decode() if isinstance(b, bytes) else b  # noqa: E731
        return {
            "tokens": int(count) * self.ns.chunk_tokens,
            "load_us": int(load_us),
            "nodes": [(text(n), int(c)) for n, c in nodes],
            "tiers": [text(t) for t in tiers],
        }

    def store(self, tokens: Sequence[int], chunks: Sequence[Buffer], ttl_s: Optional[int] = None) -> int:
        """Stores one buffer per whole chunk of ``tokens``; returns the number stored. Each
        chunk carries its tokens and its parent's hash (``KVC.PUT ... TOKENS``), so the
        server can announce it on its KV event feed."""
        hashes = self.ns.chunk_hashes(tokens)
        if len(chunks) != len(hashes):
            raise ValueError(f"{len(hashes)} whole chunks in the tokens but {len(chunks)} buffers given")
        n = self.ns.chunk_tokens
        items = [(h, c, tokens_le(tokens[i * n : (i + 1) * n])) for i, (h, c) in enumerate(zip(hashes, chunks))]
        before = dict(zip(hashes, [""] + hashes[:-1]))
        parts = [
            (tag, ["TOKENS", before[b[0][0]]] + [x for h, c, t in b for x in (h, byte_view(c), t)])
            for tag, b in self._parts(items)
        ]
        extra = ["TTL", int(ttl_s)] if ttl_s else []
        return sum(int(n) for n in self._run("KVC.PUT", parts, extra))

    def retrieve(self, tokens: Sequence[int]) -> List[bytes]:
        """The buffers of the leading cached chunks, in order (stops at the first miss):
        ``bytearray`` objects each filled straight from the socket (``bytes`` in a cluster)."""
        return self.retrieve_chunks(self.ns.chunk_hashes(tokens))

    def retrieve_into(self, tokens: Sequence[int], buffers: Sequence) -> List[int]:
        """Reads the leading cached chunks of ``tokens`` into ``buffers`` (one writable,
        contiguous buffer per chunk, from the first: ``bytearray``, a numpy array, a tensor's
        memory...; each at least as large as its chunk) and returns the chunks' lengths (as
        many as were cached). On a single node the bytes go from the socket into the buffers
        with no copy in between. A chunk larger than its buffer raises ``ValueError``."""
        hashes = self.ns.chunk_hashes(tokens)[: len(buffers)]
        views = [memoryview(b).cast("B") for b in buffers[: len(hashes)]]

        def into(i: int, n: int) -> memoryview:
            if n > len(views[i]):
                raise ValueError(f"chunk {i} holds {n} bytes, its buffer {len(views[i])}")
            return views[i][:n]

        if self.direct:
            return self._read_chunks(hashes, into)
        lengths = []
        for i, v in enumerate(self.retrieve_chunks(hashes)):
            into(i, len(v))[:] = v
            lengths.append(len(v))
        return lengths

    def _wire(self) -> Wire:
        with self._wires_lock:
            if self._wires:
                return self._wires.pop()
        return Wire(self.url)

    def _give_back(self, w: Wire) -> None:
        with self._wires_lock:
            if not w.broken and len(self._wires) < WIRES_MAX:
                self._wires.append(w)
                return
        w.close()

    def _read_chunks(self, hashes: Sequence[str], buffer_for) -> List[int]:
        """The lengths of the leading cached chunks of ``hashes``, chunk ``i`` read into
        ``buffer_for(i, n)``: a ``KVC.GET`` per ``CHUNKS_PER_COMMAND`` chunks, and again for
        the rest of a reply the server cut at its size limit; an empty reply means the next
        chunk is missing."""
        lengths: List[int] = []
        w = self._wire()
        try:
            rest = list(hashes)
            while rest:
                batch, base = rest[:CHUNKS_PER_COMMAND], len(lengths)
                w.send([self._args("KVC.GET", None, batch)])
                got = w.read_bulks(lambda i, n: buffer_for(base + i, n))
                lengths += got
                if not got:
                    break
                rest = rest[len(got) :]
        finally:
            self._give_back(w)
        return lengths

    def retrieve_local(self, tokens: Sequence[int], verify: bool = False) -> List[Buffer]:
        """As ``retrieve``, for a client on the server's machine that may read the server's
        files: chunks in the server's value log come back as read-only views of those files,
        mapped here (``KVC.LOCATE``), so their bytes never cross the socket and are not
        copied (the views point into the page cache, and stay valid after the server
        deletes or rewrites a file); the rest of the prefix (chunks in the object store, or
        too small for the value log) is read with ``KVC.GET``. With ``verify``, each mapped
        chunk is checked against the CRC-32C the server gives (needs ``google-crc32c``:
        ``pip install strata-client[verify]``); a mismatch raises ``ValueError``."""
        out: List[Buffer] = []
        for tag, batch in self._parts(self.ns.chunk_hashes(tokens)):
            (located,) = self._run("KVC.LOCATE", [(tag, batch)])
            key_of = (lambda h, t=tag: key_for(self.ns.id, h, t)) if verify else None
            elsewhere = map_located(self.maps, batch, located, out, key_of)
            if elsewhere:
                values = kvc_get(self._getter(tag), [h for _, h in elsewhere])
                if not fill_elsewhere(out, elsewhere, values):
                    break
            if len(located) < len(batch):
                break
        return out

    def _getter(self, tag: Optional[str]):
        """Sends one ``KVC.GET`` of some chunks of the group tagged ``tag``."""
        return lambda hashes: self._run("KVC.GET", [(tag, list(hashes))])[0]

    def retrieve_chunks(self, hashes: Sequence[str]) -> List[bytes]:
        """The leading cached chunks of ``hashes`` (chunk ids), read with ``KVC.GET``."""
        if self.direct:
            chunks: List[bytearray] = []

            def fresh(i: int, n: int) -> memoryview:
                chunks.append(bytearray(n))
                return memoryview(chunks[-1])

            self._read_chunks(hashes, fresh)
            return chunks
        out: List[bytes] = []
        parts = self._parts(list(hashes))
        for (tag, batch), values in zip(parts, self._run("KVC.GET", parts)):
            values = kvc_get(self._getter(tag), batch, values)
            out.extend(values)
            if len(values) < len(batch):
                break
        return out

    def close(self):
        with self._wires_lock:
            wires, self._wires = self._wires, []
        for w in wires:
            w.close()
        if self.rc is not None:
            self.rc.close()
        else:
            self.pool.disconnect()
