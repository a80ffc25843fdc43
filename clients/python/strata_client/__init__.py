"""Python client for Strata.

- ``StrataClient``: a plain key-value client (redis-py underneath, with a connection pool).
- ``KVCacheClient``: the LLM KV-cache pool: ``lookup``, ``store`` and ``retrieve`` by token
  prefix, each one round trip.
- ``Namespace``: chunk keys from tokens, identical to the Rust implementation
  (``crates/strata-kvcache``) and checked against ``tests/vectors/kvcache.json``.
"""

from .client import KVCacheClient, StrataClient
from .kvcache import Namespace

__all__ = ["KVCacheClient", "Namespace", "StrataClient"]
