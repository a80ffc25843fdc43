"""The tokens of the chunks LMCache stores, for Strata's KV event feed.

LMCache hands a remote connector each chunk's key (its chained hash) and bytes, never its
tokens. This module learns them where LMCache computes the hash: it wraps LMCache's
``TokenDatabase._hash_tokens`` so that, while ``LMCacheEngine.store`` or ``store_layer``
runs on a thread, every hash computed there is remembered with its tokens and the hash
before it (its parent). The hashing happens on the storing thread before the chunks reach
the connector, so the connector finds them (``tokens_of``) when it sends ``KVC.PUT ...
TOKENS``. Relies on LMCache 0.5.6's private ``_hash_tokens(tokens, prefix_hash,
extra_keys)``; a chunk stored from hashes alone (``store(hashes=...)``) has no tokens and
is stored unannounced.
"""

import functools
import threading
from collections import OrderedDict
from typing import Optional, Tuple

from .kvcache import tokens_le

#: Chunks remembered at most (the oldest go first): one entry per chunk hashed by a store
#: and not yet put (a put LMCache skips leaves its entry behind).
REMEMBERED_MAX = 65_536

_remembered: "OrderedDict[str, Tuple[str, bytes]]" = OrderedDict()
_lock = threading.Lock()
_storing = threading.local()


def hash_hex(h) -> str:
    """A chunk hash as LMCache writes it in a key string (``CacheEngineKey.chunk_hash_hex``)."""
    return h.hex() if isinstance(h, bytes) else f"{h:x}"


def remember(chunk_hash, parent, tokens) -> None:
    """Keeps chunk ``chunk_hash``'s parent (``None``: a prompt's first chunk) and tokens."""
    entry = ("" if parent is None else hash_hex(parent), tokens_le(tokens))
    with _lock:
        _remembered[hash_hex(chunk_hash)] = entry
        _remembered.move_to_end(hash_hex(chunk_hash))
        while len(_remembered) > REMEMBERED_MAX:
            _remembered.popitem(last=False)


def tokens_of(chunk_hash_hex: str) -> Optional[Tuple[str, bytes]]:
    """The parent's hash ("" for none) and the tokens (32-bit little-endian) of a chunk a
    store hashed, taken out; ``None`` if not known."""
    with _lock:
        return _remembered.pop(chunk_hash_hex, None)


class storing:
    """While active on a thread, the hashes computed there are remembered with their tokens."""

    def __enter__(self):
        _storing.depth = getattr(_storing, "depth", 0) + 1

    def __exit__(self, *exc):
        _storing.depth -= 1


def _while_storing(method):
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        with storing():
            out = method(*args, **kwargs)
        if hasattr(out, "__next__"):  # store_layer is a generator: hash as it runs
            return _generator_storing(out)
        return out

    wrapper._strata = True
    return wrapper


def _generator_storing(gen):
    while True:
        with storing():
            try:
                item = next(gen)
            except StopIteration:
                return
        yield item


def install() -> None:
    """Wraps LMCache's hashing and stores (once per process)."""
    from lmcache.v1 import token_database as tdb
    from lmcache.v1.cache_engine import LMCacheEngine

    base = tdb.TokenDatabase
    if getattr(base._hash_tokens, "_strata", False):
        return
    hash_tokens = base._hash_tokens

    @functools.wraps(hash_tokens)
    def hashing(self, tokens, prefix_hash=None, extra_keys=None):
        h = hash_tokens(self, tokens, prefix_hash, extra_keys)
        if getattr(_storing, "depth", 0) > 0:
            ids = tokens.cpu().tolist() if hasattr(tokens, "cpu") else list(tokens)
            first = prefix_hash is None or prefix_hash == tdb.NONE_HASH
            remember(h, None if first else prefix_hash, ids)
        return h

    hashing._strata = True
    base._hash_tokens = hashing
    for name in ("store", "store_layer"):
        setattr(LMCacheEngine, name, _while_storing(getattr(LMCacheEngine, name)))
