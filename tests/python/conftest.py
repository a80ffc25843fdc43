"""Fixtures that start the real `strata` binary on a free loopback port."""

import atexit
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

import pytest
import redis


def refusal(r, *args) -> str:
    """The error `r` answers the command `args` with (the command must fail)."""
    with pytest.raises(redis.ResponseError) as e:
        r.execute_command(*args)
    return str(e.value)


ROOT = pathlib.Path(__file__).resolve().parents[2]
# The client of this tree, whatever copy of it pip installed last.
sys.path.insert(0, str(ROOT / "clients" / "python"))


def built(package: str) -> str:
    """The debug binary of ``package`` (named after it), built first if it is missing."""
    target = os.environ.get("CARGO_TARGET_DIR", str(ROOT / "target"))
    path = pathlib.Path(target) / "debug" / package
    if not path.exists():
        subprocess.run(["cargo", "build", "-p", package], cwd=ROOT, check=True)
    return str(path)


def strata_bin() -> str:
    return os.environ.get("STRATA_BIN") or built("strata")


def strata_bench_bin() -> str:
    return os.environ.get("STRATA_BENCH_BIN") or built("strata-bench")


def set_when_writable(client, key, value, deadline, errors=redis.ResponseError):
    """Retries a SET refused with one of `errors` until the store accepts writes again (or
    `deadline` passes): a full disk, or the warm tier's hard limit (-OOM, "writes resume as
    it drains") while demotion catches up, as a client should."""
    while True:
        try:
            client.set(key, value)
            return
        except errors as e:
            assert time.time() < deadline, f"writes did not resume: {e}"
            time.sleep(0.5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Every server a test started: whatever a failing test left running is killed when the
# test run ends, so no server outlives it.
_started = []


@atexit.register
def _kill_leftovers():
    for proc in _started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class StrataProcess:
    def __init__(self, settings=None, data_dir=None, cores=None):
        self.dir = None if data_dir else tempfile.TemporaryDirectory()
        path = data_dir or self.dir.name
        self.port = free_port()
        args = [strata_bin(), "serve", "--data-dir", path, "--port", str(self.port), "--set", "metrics_port=0"]
        for k, v in (settings or {}).items():
            args += ["--set", f"{k}={v}"]
        env = dict(os.environ, STRATA_LOG_LEVEL="warn")
        # The server's log, for tests that check what it reports.
        self.log = tempfile.NamedTemporaryFile(prefix="strata-log-", suffix=".txt")
        # `cores`: the CPUs the server may run on, set before it starts (its runtime makes
        # a worker thread per CPU it may use).
        pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
        self.proc = subprocess.Popen(
            args, env=env, stdout=subprocess.DEVNULL, stderr=self.log, preexec_fn=pin
        )
        _started.append(self.proc)
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                if self.proc.poll() is not None:
                    said = open(self.log.name, errors="replace").read()[-2000:]
                    raise RuntimeError(f"strata exited with {self.proc.returncode}: {said}")
                if time.time() > deadline:
                    raise RuntimeError("strata did not start")
                time.sleep(0.05)

    def log_text(self) -> str:
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            return f.read()

    def rss_bytes(self) -> int:
        """Resident memory of the server process, from /proc."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def info(self, section="stats") -> dict:
        return self.client().info(section)

    def client(self, **kw) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, **kw)

    def kill(self):
        """SIGKILL, leaving the data directory for a restart on it."""
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.dir:
            self.dir.cleanup()
        self.log.close()


@pytest.fixture
def strata():
    p = StrataProcess()
    yield p
    p.stop()


@pytest.fixture
def tiny_strata():
    """Budgets so small that keys reach the cold tier within a second."""
    p = StrataProcess(
        {
            "hot_bytes_max": 65536,
            "warm_bytes_max": 131072,
            # Pipelined bursts outrun demotion; the hard limit is tested in test_faults.py.
            "warm_bytes_hard_max": "64MiB",
            "background_interval_ms": 50,
            "block_bytes": 4096,
        }
    )
    yield p
    p.stop()


@pytest.fixture
def redis_server(tmp_path):
    """A real redis-server on loopback, the baseline: its port."""
    port = free_port()
    p = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    r = redis.Redis(port=port)
    for _ in range(100):
        try:
            r.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    yield port
    p.terminate()
    p.wait(10)
