"""Chunk keys of LLM KV caches: a namespace and a chained SHA-256 of the token prefix.

The scheme (shared with ``crates/strata-kvcache``)::

    canonical = "strata-kvc-v1|model=<m>|revision=<r>|dtype=<d>|layout=<l>|tp=<world>/<rank>|chunk=<n>"
    ns_id     = sha256(canonical).hexdigest()[:32]
    h_0       = sha256(canonical)
    h_i       = sha256(h_{i-1} || tokens of chunk i as u32 little-endian)
    key_i     = "kvc:" + ns_id + ":" + hex(h_i)

Never Python's ``hash()``: it changes between processes.
"""

import hashlib
import struct
from typing import List, Sequence


def key_for(ns_id: str, chunk_hash: str) -> str:
    """The Strata key of a chunk in namespace ``ns_id`` (``strata_kvcache::key_for``)."""
    return f"kvc:{ns_id}:{chunk_hash}"


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
            h = hashlib.sha256(h + struct.pack(f"<{len(chunk)}I", *chunk)).digest()
            out.append(h.hex())
        return out

    def key_of(self, chunk_hash: str) -> str:
        return key_for(self.id, chunk_hash)

    def chunk_keys(self, tokens: Sequence[int]) -> List[str]:
        return [self.key_of(h) for h in self.chunk_hashes(tokens)]
