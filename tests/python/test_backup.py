"""Backup and restore with the real binary: a live backup through `STRATA.BACKUP`, an
offline one with `strata backup`, each restored with `strata restore` into a fresh data
directory (and so a fresh cold tier) and compared key by key."""

import hashlib
import os
import subprocess
import tempfile
import time

import redis

from conftest import StrataProcess, set_when_writable, strata_bin

#: What a tiny store answers while demotion catches up with its writes; the fills below
#: wait that out, as a client should (nothing acknowledged is lost).
OOM = redis.exceptions.OutOfMemoryError

TINY = {
    "hot_bytes_max": "64KiB",
    "warm_bytes_max": "128KiB",
    "background_interval_ms": 50,
    "block_bytes": 4096,
    "durability": "sync",
    # Values of 512 bytes and more (about 60% of them) go to the value log, so a backup
    # must carry its files too.
    "vlog_value_bytes_min": "512",
    "vlog_file_bytes": "1MiB",
}


def value(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest() * (1 + i % 40)


def cli(*args, data_dir):
    out = subprocess.run(
        [strata_bin(), *args, "--data-dir", data_dir],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return out


def compare(p, expected):
    c = p.client()
    wrong = [k for k, v in expected.items() if c.get(k) != v]
    assert not wrong, f"{len(wrong)} keys differ after restore, e.g. {wrong[:5]}"
    assert c.dbsize() == len(expected)


def test_backup_and_restore_compare_every_key():
    root = tempfile.TemporaryDirectory()
    src = os.path.join(root.name, "src")
    live_url = f"file://{root.name}/backup-live"
    offline_url = f"file://{root.name}/backup-offline"
    p = StrataProcess(TINY, data_dir=src)
    try:
        c = p.client()
        expected = {}
        for i in range(600):
            set_when_writable(c, f"key:{i:04}", value(i), time.time() + 60, OOM)
            expected[f"key:{i:04}"] = value(i)
        for i in range(0, 600, 10):
            c.delete(f"key:{i:04}")
            del expected[f"key:{i:04}"]
        deadline = time.time() + 60
        while int(c.info("strata")["cold_entries"]) < 200:
            assert time.time() < deadline, "nothing reached the cold tier"
            time.sleep(0.1)
        assert int(c.info("strata")["vlog_bytes"]) > 0, "no value reached the value log"
        assert c.execute_command("STRATA.BACKUP", live_url) == b"Background backup started"
        deadline = time.time() + 120
        while c.info("persistence")["backup_in_progress"]:
            assert time.time() < deadline, "backup did not finish"
            time.sleep(0.1)
        assert c.info("persistence")["last_backup_status"] == "ok"
        at_backup = dict(expected)
        for i in range(600, 650):  # written after the snapshot
            set_when_writable(c, f"key:{i:04}", value(i), time.time() + 60, OOM)
            expected[f"key:{i:04}"] = value(i)
    finally:
        p.stop()

    # Offline backup of the stopped store, with progress on stderr.
    out = cli("backup", "--to", offline_url, data_dir=src)
    assert out.returncode == 0, out.stderr
    assert "backup: " in out.stderr and "100%" in out.stderr, out.stderr
    print(out.stdout.strip())

    for url, want in ((live_url, at_backup), (offline_url, expected)):
        dest = tempfile.mkdtemp(dir=root.name)
        out = cli("restore", "--from", url, data_dir=dest)
        assert out.returncode == 0, out.stderr
        print(out.stdout.strip())
        q = StrataProcess(TINY, data_dir=dest)
        try:
            compare(q, want)
            tiers = {q.client().execute_command("TIER", k) for k in list(want)[:300]}
            assert b"cold" in tiers, "the restored store has no cold keys: segments not restored?"
        finally:
            q.stop()
        # Restoring over a store is refused.
        out = cli("restore", "--from", url, data_dir=dest)
        assert out.returncode != 0 and "empty data directory" in out.stderr, out.stderr

    # A running server's store cannot be backed up offline; the error says what to do.
    p = StrataProcess(TINY, data_dir=src)
    try:
        out = cli("backup", "--to", f"file://{root.name}/x", data_dir=src)
        assert out.returncode != 0 and "STRATA.BACKUP" in out.stderr, out.stderr
    finally:
        p.stop()
    root.cleanup()


def test_backup_to_an_s3_prefix_and_restore_from_it():
    from test_faults import Moto

    moto = Moto(bucket="strata-backups")
    root = tempfile.TemporaryDirectory()
    s3 = [
        "--set", f"s3_endpoint=http://127.0.0.1:{moto.port}",
        "--set", "s3_region=us-east-1",
        "--set", "s3_access_key_id=test",
        "--set", "s3_secret_access_key=test",
        "--set", "s3_allow_http=true",
    ]
    src = os.path.join(root.name, "src")
    p = StrataProcess(TINY, data_dir=src)
    try:
        c = p.client()
        expected = {f"s3key:{i:04}": value(i) for i in range(300)}
        for k, v in expected.items():
            set_when_writable(c, k, v, time.time() + 60, OOM)
    finally:
        p.stop()
    try:
        out = cli("backup", "--to", "s3://strata-backups/nightly", *s3, data_dir=src)
        assert out.returncode == 0, out.stderr
        dest = os.path.join(root.name, "dest")
        out = cli("restore", "--from", "s3://strata-backups/nightly", *s3, data_dir=dest)
        assert out.returncode == 0, out.stderr
        print(out.stdout.strip())
        q = StrataProcess(TINY, data_dir=dest)
        try:
            compare(q, expected)
        finally:
            q.stop()
    finally:
        moto.stop()
        root.cleanup()
