"""Chunk keys of LLM KV caches: a namespace and a chained SHA-256 of the token prefix.

The scheme (shared with ``crates/strata-kvcache``)::

    canonical = "strata-kvc-v1|model=<m>|revision=<r>|dtype=<d>|layout=<l>|tp=<world>/<rank>|chunk=<n>"
    ns_id     = sha256(canonical).hexdigest()[:32]
    h_0       = sha256(canonical)
    h_i       = sha256(h_{i-1} || tokens of chunk i as u32 little-endian)
    key_i     = "kvc:" + ns_id + ":" + hex(h_i)

In a cluster, chunks go in groups of ``G`` (``kvc_group_chunks``, ``GROUP_CHUNKS_DEFAULT``):
chunk ``i`` carries the tag ``hex(h_j)``, ``j = (i // G) * G``, and its key is
``"kvc:" + ns_id + ":{" + hex(h_j) + "}" + hex(h_i)``, so a group's chunks share one slot.

Never Python's ``hash()``: it changes between processes.
"""

import hashlib
import struct
from typing import List, Optional, Sequence, Tuple


#: Chunks per group in a cluster (``strata_kvcache::GROUP_CHUNKS_DEFAULT``).
GROUP_CHUNKS_DEFAULT = 16


def key_for(ns_id: str, chunk_hash: str, tag: Optional[str] = None) -> str:
    """The Strata key of a chunk in namespace ``ns_id``, with its group ``tag`` if any
    (``strata_kvcache::key_for``)."""
    return f"kvc:{ns_id}:{chunk_hash}" if tag is None else f"kvc:{ns_id}:{{{tag}}}{chunk_hash}"


def tokens_le(tokens: Sequence[int]) -> bytes:
    """Tokens as 32-bit little-endian integers: how chunk hashes take them, and how
    ``KVC.PUT ... TOKENS`` carries them."""
    return struct.pack(f"<{len(tokens)}I", *tokens)


def group_start(i: int, group_chunks: int) -> int:
    """The index of the first chunk of chunk ``i``'s group: its hash is chunk ``i``'s tag."""
    g = max(1, int(group_chunks))
    return i // g * g


def groups(n: int, group_chunks: int) -> List[Tuple[int, int]]:
    """The ``(first, end)`` runs of ``n`` chunks that share a group, in order."""
    g = max(1, int(group_chunks))
    return [(s, min(s + g, n)) for s in range(0, n, g)]


class Namespace:
    """Everything that makes two KV caches incompatible."""

    def __init__(self, model: str, revision: str, dtype: str, layout: str, tp_world: int = 1, tp_rank: int = 0, chunk_tokens: int = 256):
        def clean(s: str) -> str:
            return s.replace("|", "%7C")

        self.chunk_tokens = max(1, int(chunk_tokens))
        self.canonical = (
            f"strata-kvc-v1|model={clean(model)}|revision={clean(revision)}|dtype={clean(dtype)}"
            f"|layout={clean(layout)}|tp={int(tp_world)}/{int(tp_rank)}|chunk={int(chunk_tokens)}"
        )
        self.id = hashlib.sha256(self.canonical.encode()).hexdigest()[:32]

    def chunk_hashes(self, tokens: Sequence[int]) -> List[str]:
        """The chained hash of every whole chunk of ``tokens``, as hex."""
        h = hashlib.sha256(self.canonical.encode()).digest()
        out = []
        whole = len(tokens) - len(tokens) % self.chunk_tokens
        for i in range(0, whole, self.chunk_tokens):
            chunk = tokens[i : i + self.chunk_tokens]
            h = hashlib.sha256(h + tokens_le(chunk)).digest()
            out.append(h.hex())
        return out

    def key_of(self, chunk_hash: str) -> str:
        return key_for(self.id, chunk_hash)

    def chunk_keys(self, tokens: Sequence[int]) -> List[str]:
        return [self.key_of(h) for h in self.chunk_hashes(tokens)]

    def grouped_keys(self, tokens: Sequence[int], group_chunks: int = GROUP_CHUNKS_DEFAULT) -> List[str]:
        """The keys of every whole chunk of ``tokens`` as a cluster stores them."""
        hashes = self.chunk_hashes(tokens)
        return [key_for(self.id, h, hashes[group_start(i, group_chunks)]) for i, h in enumerate(hashes)]
