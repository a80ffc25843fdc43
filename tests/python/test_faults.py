"""Real faults under the real binary: the object store behind a fault-injecting proxy
(blackhole, reset, 503, delay), and a data directory on a tmpfs that fills up.

Every acknowledged write is checked, byte for byte, after the fault and after a restart."""

import contextlib
import os
import subprocess
import tempfile
import threading
import time

import pytest
import redis
import requests

from conftest import StrataProcess, free_port, set_when_writable
from faultproxy import FaultProxy

KIB = 1 << 10
MIB = 1 << 20


class Moto:
    """A moto S3 server on loopback with one bucket."""

    def __init__(self, bucket="strata-faults"):
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["moto_server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 60
        while True:
            try:
                requests.put(f"http://127.0.0.1:{self.port}/{bucket}", timeout=2).raise_for_status()
                break
            except requests.RequestException:
                if time.time() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("moto_server did not start (pip install 'moto[server]')")
                time.sleep(0.2)
        self.bucket = bucket

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def s3_settings(endpoint: str, cold_url: str) -> dict:
    """Strata settings for a cold tier at `cold_url` on the S3 server at `endpoint`."""
    return {
        "cold_url": cold_url,
        "s3_endpoint": endpoint,
        "s3_region": "us-east-1",
        "s3_access_key_id": "test",
        "s3_secret_access_key": "test",
        "s3_allow_http": "true",
    }


def value_for(key: str, n: int) -> bytes:
    """Incompressible, key-specific bytes, so a value read under the wrong key is caught."""
    seed = key.encode() + b"|"
    out = bytearray()
    i = 0
    import hashlib

    while len(out) < n:
        out += hashlib.sha256(seed + str(i).encode()).digest()
        i += 1
    return bytes(out[:n])


def check_all(client, acked):
    bad = [k for k, v in acked.items() if client.get(k) != v]
    assert not bad, f"{len(bad)} acknowledged keys wrong or missing, e.g. {bad[:5]}"


def stats(client):
    raw = client.execute_command("STRATA.STATS")
    if isinstance(raw, list):
        raw = dict(zip(raw[::2], raw[1::2]))
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in raw.items()}


@contextlib.contextmanager
def moto_behind_proxy(prefix: str, **settings):
    """A moto server behind a fault proxy, and the settings of a Strata whose cold tier is
    there under `prefix` with budgets small enough to reach it within a second, `settings`
    on top: yields (proxy, settings); stops both after."""
    moto = Moto()
    proxy = FaultProxy(("127.0.0.1", moto.port))
    try:
        yield proxy, {
            **s3_settings(proxy.endpoint, f"s3://{moto.bucket}/{prefix}"),
            "hot_bytes_max": "64KiB",
            "background_interval_ms": 50,
            "block_bytes": 4096,
            **settings,
        }
    finally:
        proxy.close()
        moto.stop()


def test_object_store_outage_through_a_fault_proxy():
    with moto_behind_proxy(
        "outage",
        warm_bytes_max="256KiB",
        warm_bytes_hard_max="512KiB",
        cold_request_timeout_ms=1500,
        write_stall_ms_max=1000,
        durability="sync",
    ) as (proxy, settings):
        p = StrataProcess(settings)
        try:
            c = p.client(socket_timeout=60)
            acked = {}
            for i in range(400):
                k = f"k{i:05}"
                v = value_for(k, 2 * KIB)
                # Filling past the hard limit needs demotion to keep up; wait it out if not.
                set_when_writable(c, k, v, time.time() + 60, redis.exceptions.OutOfMemoryError)
                acked[k] = v
            deadline = time.time() + 60
            while not (stats(c)["cold_entries"] > 100 and stats(c)["warm_bytes"] <= 256 * KIB):
                assert time.time() < deadline, f"demotion did not run: {stats(c)}"
                time.sleep(0.2)
            tiers = {k: (c.execute_command("TIER", k) or b"").decode() for k in acked}
            cold = [k for k, t in tiers.items() if t == "cold"]
            near = [k for k, t in tiers.items() if t in ("hot", "warm")]
            assert len(cold) > 40 and near, tiers

            # 1. Blackhole: near keys served, cold reads fail in time, writes run into the hard limit.
            figures = {}
            for mode in ("blackhole", "reset", "503", "delay"):
                proxy.mode = mode
                proxy.delay_s = 3.0
                k = near.pop()
                assert c.get(k) == acked[k]
                k = cold.pop()
                t0 = time.time()
                with pytest.raises(redis.ResponseError, match="cold tier unavailable"):
                    c.get(k)
                figures[mode] = time.time() - t0
                assert figures[mode] < 15, f"{mode}: a cold read hung for {figures[mode]:.1f} s"
                if mode == "blackhole":
                    refused = None
                    for i in range(400, 2000):
                        k = f"k{i:05}"
                        v = value_for(k, 2 * KIB)
                        t0 = time.time()
                        try:
                            c.set(k, v)
                        except redis.exceptions.OutOfMemoryError as e:  # the -OOM prefix
                            refused, waited = str(e), time.time() - t0
                            break
                        acked[k] = v
                    # The write waited write_stall_ms_max for room, then said why it got none.
                    assert refused and "hard limit" in refused, refused
                    assert waited >= 0.9, f"refused after {waited:.2f} s, before write_stall_ms_max"
                    assert "made no room in 1000 ms" in refused, refused
                    st = stats(c)
                    assert st["warm_bytes"] <= 512 * KIB, st
                    assert st["writes_refused_full"] >= 1, st
                    # Demotion fails (after its timeout) and backs off; it does not hang.
                    deadline = time.time() + 30
                    while stats(c)["demotion_errors"] == 0:
                        assert time.time() < deadline, f"demotion never reported a failure: {stats(c)}"
                        time.sleep(0.2)
                    # Deletes still work at the hard limit.
                    gone = near.pop()
                    assert c.delete(gone) == 1
                    del acked[gone]
            print("cold read failed after (s): " + ", ".join(f"{m} {t:.2f}" for m, t in figures.items()))

            # 2. The outage ends: writes resume, the backlog drains, everything is readable.
            proxy.mode = "pass"
            deadline = time.time() + 90
            set_when_writable(c, "after-outage", b"x", deadline)
            acked["after-outage"] = b"x"
            while stats(c)["warm_bytes"] > 256 * KIB:
                assert time.time() < deadline, f"backlog did not drain: {stats(c)}"
                time.sleep(0.5)
            check_all(c, acked)
            print(f"outage: {len(acked)} acknowledged keys intact, stats {stats(c)}")
        finally:
            p.stop()


def check_all_batched(client, acked, batch=500):
    keys = list(acked)
    for i in range(0, len(keys), batch):
        chunk = keys[i : i + batch]
        got = client.mget(chunk)
        bad = [k for k, v in zip(chunk, got) if v != acked[k]]
        assert not bad, f"{len(bad)} acknowledged keys wrong or missing, e.g. {bad[:5]}"


def test_a_pipelined_writer_at_ten_times_the_warm_budget_is_slowed_not_refused(tmp_path):
    """1 MiB of DRAM, 4 MiB of warm, the default one-second background tick and a local
    cold tier: 40 MiB written in pipelines of 100 go in without an error (demotion starts
    as warm passes its budget, and writers wait at the hard limit), and every key reads back
    exactly, also after a SIGKILL and restart."""
    settings = {"hot_bytes_max": "1MiB", "warm_bytes_max": "4MiB", "disk_free_min_bytes": 0}
    p = StrataProcess(settings, data_dir=str(tmp_path))
    try:
        c = p.client(socket_timeout=120)
        acked = {}
        for b in range(400):
            pipe = c.pipeline(transaction=False)
            for i in range(b * 100, b * 100 + 100):
                k = f"p{i:06}"
                acked[k] = value_for(k, KIB)
                pipe.set(k, acked[k])
            assert all(pipe.execute())  # an -OOM reply raises here
        st = stats(c)
        assert st["writes_refused_full"] == 0, st
        assert st["cold_entries"] > 30_000, st
        assert st["warm_bytes"] <= st["warm_bytes_hard_max"], st
        print(f"pipelined writer: {st['writes_stalled']} writes waited for room, none refused")
        check_all_batched(c, acked)
        p.stop()  # SIGKILL
        p = StrataProcess(settings, data_dir=str(tmp_path))
        check_all_batched(p.client(socket_timeout=120), acked)
    finally:
        p.stop()


def test_object_store_outage_state_survives_a_restart():
    """Keys acknowledged during an outage (stuck in warm) survive a kill and restart."""
    data = tempfile.TemporaryDirectory()
    with moto_behind_proxy(
        "restart",
        warm_bytes_max="128KiB",
        warm_bytes_hard_max="1MiB",
        cold_request_timeout_ms=1000,
        durability="sync",
    ) as (proxy, settings):
        p = StrataProcess(settings, data_dir=data.name)
        try:
            c = p.client(socket_timeout=60)
            acked = {}
            for i in range(150):
                k = f"r{i:05}"
                acked[k] = value_for(k, 2 * KIB)
                c.set(k, acked[k])
            deadline = time.time() + 60
            while stats(c)["cold_entries"] == 0:
                assert time.time() < deadline, "nothing was demoted"
                time.sleep(0.2)
            proxy.mode = "reset"
            for i in range(150, 200):
                k = f"r{i:05}"
                acked[k] = value_for(k, 2 * KIB)
                c.set(k, acked[k])
            p.stop()
            proxy.mode = "pass"
            p = StrataProcess(settings, data_dir=data.name)
            check_all(p.client(socket_timeout=60), acked)
        finally:
            p.stop()
            data.cleanup()


def test_disk_full_refuses_writes_keeps_reads_and_recovers():
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    mnt = tempfile.mkdtemp(prefix="strata-tmpfs-")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", mnt], check=True)
    data = os.path.join(mnt, "data")
    p = None
    try:
        p = StrataProcess({"durability": "sync", "disk_free_min_bytes": "8MiB"}, data_dir=data)
        c = p.client(socket_timeout=60)
        acked = {}
        error = None
        for i in range(1000):
            k = f"d{i:05}"
            v = value_for(k, 256 * KIB)
            try:
                c.set(k, v)
            except redis.ResponseError as e:
                error = str(e)
                break
            acked[k] = v
        assert error and "disk full" in error, error
        print(f"disk full after {len(acked)} writes of 256 KiB: {error[:80]}")
        # Reads keep working while the disk is full.
        check_all(c, acked)
        with pytest.raises(redis.ResponseError, match="disk full"):
            c.set("more", b"y" * MIB)
        # Space returns: RocksDB's error recovery resumes writes.
        subprocess.run(["mount", "-o", "remount,size=512m", mnt], check=True)
        set_when_writable(c, "after-full", b"z", time.time() + 90)
        acked["after-full"] = b"z"
        check_all(c, acked)
        p.stop()
        p = StrataProcess({"durability": "sync", "disk_free_min_bytes": "8MiB"}, data_dir=data)
        check_all(p.client(socket_timeout=60), acked)
        print(f"disk full: {len(acked)} acknowledged keys intact after recovery and restart")
    finally:
        if p:
            p.stop()
        subprocess.run(["umount", "-l", mnt], check=False)
        os.rmdir(mnt)


def test_truncated_wal_tail_is_detected_and_the_rest_recovered():
    """A crash that tears the WAL's last record: recovery keeps every whole record before it,
    reports the dropped bytes, and never returns a torn value."""
    import glob

    data = tempfile.TemporaryDirectory()
    p = StrataProcess({"durability": "sync"}, data_dir=data.name)
    try:
        c = p.client()
        acked = {}
        for i in range(200):
            k = f"w{i:04}"
            acked[k] = value_for(k, 500)
            c.set(k, acked[k])
        p.proc.kill()  # SIGKILL: the memtable is not flushed, the WAL holds everything
        p.proc.wait()
        wal = max(glob.glob(f"{data.name}/warm/*.log"), key=os.path.getsize)
        os.truncate(wal, os.path.getsize(wal) - 100)
        p = StrataProcess({"durability": "sync"}, data_dir=data.name)
        c = p.client()
        last = "w0199"
        assert c.get(last) in (None, acked[last]), "a torn record was returned"
        del acked[last]
        check_all(c, acked)
        dropped = stats(c)["wal_bytes_dropped"]
        assert dropped > 0, "the dropped WAL tail was not reported"
        assert c.info("strata")["wal_bytes_dropped"] == dropped
        print(f"truncated WAL: {len(acked)} earlier records intact, {dropped} bytes dropped and reported")
    finally:
        p.stop()
        data.cleanup()


def test_a_write_that_waits_for_the_object_store_fails_a_watch_taken_meanwhile():
    """An INCR of a cold key waits for the object store holding the gate for reading; a
    WATCH of the key taken meanwhile must see the INCR's change (its EXEC fails), as in
    Redis, where nothing runs between WATCH and the write."""
    with moto_behind_proxy(
        "watch",
        warm_bytes_max="128KiB",
        warm_bytes_hard_max="64MiB",
        prefetch="false",
    ) as (proxy, settings):
        p = StrataProcess(settings)
        try:
            c = p.client(socket_timeout=60)
            pipe = c.pipeline(transaction=False)
            for i in range(300):
                pipe.set(f"ctr:{i:03}", i)
                pipe.set(f"fill:{i:03}", value_for(f"fill:{i:03}", 2 * KIB))
            pipe.execute()
            deadline = time.time() + 60
            while True:
                cold = [k for k in (f"ctr:{i:03}" for i in range(0, 300, 7))
                        if c.execute_command("TIER", k) == b"cold"]
                if cold:
                    break
                assert time.time() < deadline, "no counter reached the cold tier"
                time.sleep(0.1)
            key = cold[0]
            start = int(key[4:])
            proxy.delay_s = 2.0
            proxy.mode = "delay"
            done = {}

            def incr():
                done["value"] = p.client(socket_timeout=60).incr(key)
                done["at"] = time.time()

            writer = threading.Thread(target=incr)
            writer.start()
            time.sleep(0.5)
            assert "value" not in done, "the INCR did not wait for the object store"
            w = p.client(socket_timeout=60)
            tx = w.pipeline(transaction=True)
            tx.watch(key)
            watched_at = time.time()
            tx.multi()
            tx.set(key, "mine")
            with pytest.raises(redis.exceptions.WatchError):
                tx.execute()
            writer.join(30)
            proxy.mode = "pass"
            assert done["value"] == start + 1 and done["at"] > watched_at, done
            assert c.get(key) == str(start + 1).encode()
        finally:
            p.stop()
