"""Quotas per KV-cache namespace (`KVC.QUOTA`): a namespace over its quota drops its own
least recently used chunks, never another namespace's; the count covers every tier and
every way a chunk goes; quotas survive SIGKILL and the count is rebuilt at start."""

import time
import urllib.request

import pytest
import redis

from conftest import StrataProcess, free_port

CHUNK = 1000


def put(r, ns, *hashes, ttl=None):
    args = ["KVC.PUT", ns]
    for h in hashes:
        args += [h, h.encode() * (CHUNK // len(h))]
    if ttl:
        args += ["TTL", ttl]
    return r.execute_command(*args)


def present(r, ns, h):
    """Whether chunk `h` is held (`KVC.MATCH`: a look that is not a use)."""
    return r.execute_command("KVC.MATCH", ns, h)[0] == 1


def quota(r, ns):
    reply = r.execute_command("KVC.QUOTA", ns)
    pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2])
    return {k.decode(): v for k, v in pairs}


def wait_for(what, timeout=10):
    deadline = time.time() + timeout
    while not what():
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)


def metrics(port):
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def test_a_namespace_over_its_quota_drops_its_own_least_recently_used_chunks(tmp_path):
    metrics_port = free_port()
    s = StrataProcess({"metrics_port": metrics_port}, data_dir=str(tmp_path))
    try:
        r = s.client()
        assert r.execute_command("KVC.QUOTA", "noisy", 4 * CHUNK) == b"OK"
        assert put(r, "noisy", "h1", "h2", "h3", "h4") == 4
        assert put(r, "quiet", *[f"q{i}" for i in range(10)]) == 10
        assert len(r.execute_command("KVC.GET", "noisy", "h1")) == 1  # no longer the least recently used
        assert put(r, "noisy", "h5") == 1  # 5,000 bytes > 4,000: h2 goes
        assert [h for h in ("h1", "h2", "h3", "h4", "h5") if present(r, "noisy", h)] == ["h1", "h3", "h4", "h5"]
        assert all(present(r, "quiet", f"q{i}") for i in range(10))
        assert quota(r, "noisy") == {"quota": 4000, "used_bytes": 4000, "chunks": 4, "dropped": 1}
        assert quota(r, "quiet") == {"quota": 0, "used_bytes": 10 * CHUNK, "chunks": 10, "dropped": 0}
        # A lower quota drops at once, least recently used first (h3, then h4).
        assert r.execute_command("KVC.QUOTA", "noisy", "2kb") == b"OK"
        assert quota(r, "noisy")["quota"] == 2048
        assert [h for h in ("h1", "h3", "h4", "h5") if present(r, "noisy", h)] == ["h1", "h5"]
        assert r.info("stats")["kvc_chunks_over_quota"] == 3
        info = r.info("kvcache")
        assert info["ns_noisy"] == {"quota": 2048, "used_bytes": 2000, "chunks": 2, "dropped": 3}
        assert info["ns_quiet"]["used_bytes"] == 10 * CHUNK
        m = metrics(metrics_port)
        assert 'strata_kvc_namespace_bytes{namespace="noisy"} 2000' in m
        assert 'strata_kvc_namespace_quota_bytes{namespace="noisy"} 2048' in m
        assert 'strata_kvc_namespace_dropped_total{namespace="noisy"} 3' in m
        assert 'strata_kvc_namespace_chunks{namespace="quiet"} 10' in m
    finally:
        s.kill()
    # SIGKILLed: the quota was saved, and the count is rebuilt from what is stored.
    s = StrataProcess(data_dir=str(tmp_path))
    try:
        r = s.client()
        wait_for(lambda: quota(r, "quiet")["chunks"] == 10)
        assert quota(r, "noisy") == {"quota": 2048, "used_bytes": 2000, "chunks": 2, "dropped": 0}
        assert put(r, "noisy", "h6") == 1
        assert quota(r, "noisy")["chunks"] == 2
        assert r.execute_command("KVC.QUOTA", "noisy", 0) == b"OK"
        assert put(r, "noisy", "h7") == 1
        assert quota(r, "noisy")["chunks"] == 3
    finally:
        s.stop()


def test_every_way_a_chunk_goes_leaves_the_count(strata):
    r = strata.client()
    put(r, "ns", "a", "b", "c", "d")
    # Large enough to be written through at once (a small value with a TTL waits in DRAM
    # and expires when read or settled).
    r.execute_command("KVC.PUT", "ns", "t", b"t" * 100_000, "TTL", 1)
    put(r, "ns", "a")  # a rewrite counts once
    assert quota(r, "ns")["used_bytes"] == 4 * CHUNK + 100_000
    wait_for(lambda: quota(r, "ns")["chunks"] == 4)  # t expired
    r.delete("kvc:ns:b")
    wait_for(lambda: quota(r, "ns")["chunks"] == 3)
    assert r.execute_command("KVC.DROP", "ns") == b"OK"
    wait_for(lambda: quota(r, "ns")["used_bytes"] == 0)
    put(r, "ns", "e")
    r.execute_command("KVC.QUOTA", "ns", 10 * CHUNK)
    r.flushall()
    assert quota(r, "ns") == {"quota": 10 * CHUNK, "used_bytes": 0, "chunks": 0, "dropped": 0}


def test_bad_quota_requests_get_redis_style_errors(strata):
    r = strata.client()
    with pytest.raises(redis.ResponseError, match="byte count"):
        r.execute_command("KVC.QUOTA", "ns", "lots")
    with pytest.raises(redis.ResponseError, match="byte count"):
        r.execute_command("KVC.QUOTA", "ns", "-1")
    with pytest.raises(redis.ResponseError, match="syntax error"):
        r.execute_command("KVC.QUOTA", "ns", "1", "2")
    with pytest.raises(redis.ResponseError, match="wrong number"):
        r.execute_command("KVC.QUOTA")
    with pytest.raises(redis.ResponseError, match="namespace of 1 to 1024 bytes"):
        r.execute_command("KVC.QUOTA", "x" * 1025, "1")
