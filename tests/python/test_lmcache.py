"""LMCache's own connector code against Strata, and against a real redis-server for parity.

LMCache (with torch) lives in its own virtual environment, which `scripts/install-deps`
creates (`STRATA_LMCACHE_VENV`, by default ~/.cache/strata/lmcache-venv); each case runs
`lmcache_driver.py` there, against a server started here, and compares what it saw.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from conftest import StrataProcess

HERE = Path(__file__).resolve().parent
CLIENT = HERE.parents[1] / "clients" / "python"
VENV = Path(os.environ.get("STRATA_LMCACHE_VENV", Path.home() / ".cache" / "strata" / "lmcache-venv"))

# `STRATA_SKIP_LMCACHE=1 scripts/test` runs everything else without the 6 GB install; CI
# never sets it, so there these tests always run.
pytestmark = pytest.mark.skipif(
    os.environ.get("STRATA_SKIP_LMCACHE") == "1",
    reason="STRATA_SKIP_LMCACHE=1: LMCache and torch were not installed",
)


def drive(port: int, connector: str) -> dict:
    python = VENV / "bin" / "python"
    if not python.exists():
        pytest.fail(f"LMCache is not installed in {VENV}: run scripts/install-deps")
    env = dict(os.environ, PYTHONPATH=str(CLIENT), LMCACHE_LOG_LEVEL="ERROR")
    out = subprocess.run(
        [str(python), str(HERE / "lmcache_driver.py"), f"127.0.0.1:{port}", connector],
        capture_output=True, text=True, timeout=300, env=env,
    )
    if out.returncode != 0:
        sys.stderr.write(out.stderr[-4000:])
    assert out.returncode == 0, f"driver failed ({connector} on port {port}): {out.stderr[-800:]}"
    return json.loads(out.stdout.strip().splitlines()[-1])


#: What every connector must see (keys 0-3 stored, 4-5 never; chunk 1 then deleted).
EXPECTED = {
    "exists_before": False,
    "contains_before": 0,
    "exists_after": [True, True, True, True, False, False],
    "contains_after": 4,
    "get_matches": [True] * 4,
    "other_model_sees_it": False,
}
#: Also checked where the connector survives them: LMCache 0.5.6's resp:// client hangs on a
#: missing key (against Redis too) and can lose the reply of a synchronous call (a race in
#: its Python wrapper), so it is not asked these.
AFTER_A_MISS = {
    "exists_sync": True,
    "get_missing": True,
    "prefix_matches": [True] * 4,
    "get_after_loss": True,
    "contains_after_loss": 1,
}


@pytest.mark.parametrize("connector", ["redis", "resp"])
def test_lmcache_stock_connectors_see_strata_as_they_see_redis(strata, redis_server, connector):
    """LMCache's stock `redis://` connector (redis-py: `<key>kv_bytes` and `<key>metadata`,
    EXISTS per chunk, metadata deleted when its bytes are gone) and its native `resp://`
    client, unchanged, store and read back 2 MiB chunks byte for byte on Strata exactly as
    on redis-server."""
    on_strata = drive(strata.port, connector)
    on_redis = drive(redis_server, connector)
    expected = dict(EXPECTED, **(AFTER_A_MISS if connector == "redis" else {}))
    for k, v in expected.items():
        assert on_strata[k] == v, f"{k}: {on_strata[k]!r} on Strata"
    assert on_strata == on_redis
    if connector == "redis":
        assert on_strata["metadata_left"] == 0, "metadata of lost bytes is deleted"
        assert all(k.endswith(("kv_bytes", "metadata")) for k in on_strata["server_keys"])


@pytest.mark.parametrize("kind", ["strata", "strata-local"])
def test_lmcache_loads_the_strata_plugin(strata, kind):
    """LMCache loads `strata_client.lmcache_plugin.StrataRemoteConnector` through its remote
    storage plugin setting (`plugin://strata`): one value per chunk under `kvc:`, lookups
    by KVC.MATCH, reads by KVC.GET (or, in local mode, by mapping the chunks from the
    server's files after KVC.LOCATE), and a lost chunk ends the prefix."""
    seen = drive(strata.port, kind)
    assert seen["connector"] == "StrataRemoteConnector"
    for k, v in dict(EXPECTED, **AFTER_A_MISS).items():
        assert seen[k] == v, f"{k}: {seen[k]!r}"
    assert len(seen["server_keys"]) == 3 and all(
        k.startswith("kvc:meta-llama/Llama-3.1-8B@1@0@bfloat16:") for k in seen["server_keys"]
    ), seen["server_keys"]
    assert seen["sync_contains"] == 4, "LMCache's synchronous lookup: one KVC.MATCH"
    assert seen["removed"] == [True, False] and seen["contains_after_remove"] == 3
    if kind == "strata-local":
        assert seen["kvc_locate_calls"] > 0 and seen["kvc_get_calls"] == 0, seen
    else:
        assert seen["kvc_get_calls"] > 0 and seen["kvc_locate_calls"] == 0, seen


def test_the_strata_plugin_sends_the_tokens_lmcache_hashed(tmp_path):
    """Chunks hashed by LMCache's token database while it stores go out with their tokens,
    and Strata announces them on its KV event feed (test_kvevents.py has the feed itself)."""
    import msgpack
    import zmq

    s = StrataProcess({"kv_events_endpoint": f"ipc://{tmp_path}/kv-events"})
    ctx = zmq.Context()
    try:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.RCVTIMEO, 10000)
        sub.connect(f"ipc://{tmp_path}/kv-events")
        time.sleep(0.3)
        seen = drive(s.port, "strata-tokens")
        assert seen["store_wrapped"]
        events = []
        while len(events) < 3:
            events += msgpack.unpackb(sub.recv_multipart()[2])[1]
    finally:
        ctx.destroy(linger=0)
        s.stop()
    assert [e[0] for e in events] == ["BlockStored"] * 3
    assert [t for e in events for t in e[3]] == seen["tokens"]
    assert events[0][2] is None
    assert [e[2] for e in events[1:]] == [events[0][1][-1], events[1][1][-1]]
