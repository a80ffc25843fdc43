"""Bad and hostile clients against the real binary: huge lengths, slowloris, clients that
never read, 10,000 idle connections under load, protected mode and AUTH rate limiting.

Each test prints the figures RELIABILITY.md quotes (peak memory, connections served)."""

import resource
import shutil
import socket
import subprocess
import time

import pytest
import redis

from conftest import StrataProcess

MIB = 1 << 20


def recv_until_closed(sock, timeout=10.0) -> bytes:
    """Reads until the server closes the connection (or `timeout` passes)."""
    sock.settimeout(timeout)
    data = b""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, socket.timeout):
            break
        if not chunk:
            break
        data += chunk
    return data


def connect_from(port, source_ip) -> socket.socket:
    s = socket.socket()
    s.bind((source_ip, 0))
    s.connect(("127.0.0.1", port))
    return s


def test_huge_declared_lengths_are_refused_before_buffering():
    p = StrataProcess({"proto_max_bulk_len": "1MiB"})
    try:
        rss0 = p.rss_bytes()
        # A bulk length over the limit: refused at the header, before any body arrives.
        s = socket.create_connection(("127.0.0.1", p.port))
        s.sendall(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2097152\r\n")
        reply = recv_until_closed(s)
        assert reply.startswith(b"-ERR Protocol error: invalid bulk length"), reply
        # An absurd one, and an absurd argument count.
        for header in (b"*1\r\n$99999999999999\r\n", b"*99999999999\r\n"):
            s = socket.create_connection(("127.0.0.1", p.port))
            s.sendall(header)
            reply = recv_until_closed(s)
            assert reply.startswith(b"-ERR Protocol error"), (header, reply)
        assert p.client().ping()
        grown = p.rss_bytes() - rss0
        print(f"huge lengths: RSS grew {grown / MIB:.1f} MiB")
        assert grown < 64 * MIB
        assert p.info()["clients_cut_off_protocol_error"] == 3
    finally:
        p.stop()



def test_requests_without_arguments_get_no_reply(strata):
    """As Redis: `*0`, a negative count and an empty line are skipped, unanswered; the
    next request's reply is the next one the client reads."""
    s = socket.create_connection(("127.0.0.1", strata.port))
    s.settimeout(5)
    s.sendall(b"*-10\r\n*0\r\n\r\n*1\r\n$4\r\nPING\r\n")
    got = b""
    while not got.endswith(b"\r\n"):
        got += s.recv(64)
    assert got == b"+PONG\r\n"
    s.close()


def test_a_transaction_queue_a_watch_set_and_a_keys_reply_have_limits(strata):
    """A MULTI queue may hold at most client-query-buffer-limit bytes: past it the command
    is refused and EXEC discards the transaction (nothing of it is applied); EXEC's reply
    carries at most client-output-buffer-limit bytes (the commands all run). One client
    watches at most 100,000 keys. KEYS refuses to build a reply of more than
    client-output-buffer-limit bytes of names, and points at SCAN."""
    r = strata.client()
    watcher = strata.client(single_connection_client=True)
    watcher.execute_command("WATCH", *[f"w:{i}" for i in range(60_000)])
    watcher.execute_command("WATCH", *[f"w:{i}" for i in range(50_000, 100_000)])  # 10,000 already watched
    with pytest.raises(redis.ResponseError, match="at most 100000 keys"):
        watcher.execute_command("WATCH", "w:one-more")
    r.set("w:99999", "changed")
    assert watcher.execute_command("MULTI")
    watcher.execute_command("SET", "w:0", "x")
    assert watcher.execute_command("EXEC") is None, "the watches taken before the refusal hold"
    assert watcher.execute_command("WATCH", "w:one-more"), "EXEC released them"
    r.config_set("client-query-buffer-limit", str(MIB))
    r.config_set("client-output-buffer-limit", str(MIB))
    one = strata.client(single_connection_client=True)
    assert one.execute_command("MULTI")
    for i in range(3):
        one.execute_command("SET", f"queued:{i}", b"v" * (300 << 10))  # QUEUED
    with pytest.raises(redis.ResponseError, match="MULTI queue full"):
        one.execute_command("SET", "queued:3", b"v" * (300 << 10))
    with pytest.raises(redis.ResponseError, match="Transaction discarded"):  # EXECABORT
        one.execute_command("EXEC")
    assert r.exists(*[f"queued:{i}" for i in range(5)]) == 0
    pipe = r.pipeline(transaction=True)
    for i in range(3):
        pipe.set(f"queued:{i}", b"v" * (300 << 10))
    assert pipe.execute() == [True] * 3, "a queue under the limit runs"
    # EXEC runs every command, but replies past the output limit become errors.
    pipe = r.pipeline(transaction=True)
    for i in (0, 1, 2, 0):
        pipe.get(f"queued:{i}")
    pipe.incr("after-the-limit")
    got = pipe.execute(raise_on_error=False)
    assert got[:3] == [b"v" * (300 << 10)] * 3
    assert isinstance(got[3], redis.ResponseError) and "client-output-buffer-limit" in str(got[3])
    assert got[4] == 1 and r.get("after-the-limit") == b"1"

    long_names = [b"n%02d:" % i + b"x" * (60 << 10) for i in range(20)]
    for part in (long_names[:10], long_names[10:]):  # each under the query limit
        r.mset({k: b"1" for k in part})
    with pytest.raises(redis.ResponseError, match="use SCAN"):
        r.keys("n*")
    assert r.keys("n05:*") == [long_names[5]]
    assert sorted(k for k in r.scan_iter("n*", count=5)) == sorted(long_names)

def test_slowloris_client_is_cut_off():
    p = StrataProcess({"client_request_timeout": 2})
    try:
        s = socket.create_connection(("127.0.0.1", p.port))
        request = b"*3\r\n$3\r\nSET\r\n$4\r\nslow\r\n$40\r\n" + b"x" * 40 + b"\r\n"
        start = time.time()
        closed_after = None
        for byte in request:
            try:
                s.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed_after = time.time() - start
                break
            time.sleep(0.25)
        if closed_after is None:
            reply = recv_until_closed(s, timeout=5)
        else:
            reply = b""
        took = time.time() - start
        print(f"slowloris: cut off after {took:.1f} s")
        assert took < 10, "the trickling client was not cut off"
        assert reply == b"" or b"request not completed within 2 seconds" in reply, reply
        assert p.client().get("slow") is None, "a request that never arrived ran"
        assert p.info()["clients_cut_off_slow_request"] == 1
        # A client that is slow between requests (not within one) keeps its connection.
        c = p.client()
        for _ in range(3):
            assert c.ping()
            time.sleep(1.0)
        assert p.info()["clients_cut_off_slow_request"] == 1
    finally:
        p.stop()


def test_a_large_value_arriving_in_pieces_is_read_whole_or_cut_off_when_it_stalls():
    """A value past 32 KiB is read into room of its own size once its header is in, with the
    request's earlier arguments held apart from the input buffer: it must come out whole,
    and a request stalled inside it still counts as a partial request."""
    p = StrataProcess({"client_request_timeout": 2})
    try:
        value = bytes(range(256)) * 400  # 100 KiB
        request = (b"*5\r\n$4\r\nMSET\r\n$1\r\na\r\n$%d\r\n" % len(value) + value
                   + b"\r\n$1\r\nb\r\n$%d\r\n" % len(value) + value[::-1] + b"\r\n")
        s = socket.create_connection(("127.0.0.1", p.port))
        for i in range(0, len(request), 7001):
            s.sendall(request[i:i + 7001])
            time.sleep(0.01)
        s.settimeout(5)
        assert s.recv(64) == b"+OK\r\n"
        c = p.client()
        assert c.get("a") == value and c.get("b") == value[::-1]
        # Stalled inside a large value, and stalled after one (all the server has read is
        # then held apart, its buffer empty): cut off either way, nothing written.
        stalls = [
            [b"*3\r\n$3\r\nSET\r\n$5\r\nstall\r\n$%d\r\n" % len(value) + value[:1000]],
            [b"*5\r\n$4\r\nMSET\r\n$5\r\nstall\r\n$%d\r\n" % len(value) + value[:1000],
             value[1000:] + b"\r\n"],
        ]
        for n, pieces in enumerate(stalls, 1):
            s = socket.create_connection(("127.0.0.1", p.port))
            start = time.time()
            for piece in pieces:
                s.sendall(piece)
                time.sleep(0.2)
            reply = recv_until_closed(s, timeout=8)
            assert b"request not completed within 2 seconds" in reply, (n, reply)
            assert time.time() - start < 6
            assert c.get("stall") is None
            assert p.info()["clients_cut_off_slow_request"] == n
    finally:
        p.stop()


def test_client_that_never_reads_is_cut_off_with_memory_bounded():
    p = StrataProcess({"client_write_timeout": 2})
    try:
        p.client().set("big", b"v" * MIB)
        rss0 = p.rss_bytes()
        s = socket.create_connection(("127.0.0.1", p.port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        # 2 GiB of replies asked for, none read.
        pipeline = b"*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n" * 2048
        s.settimeout(5)
        try:
            s.sendall(pipeline)
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            pass
        peak = rss0
        deadline = time.time() + 20
        while time.time() < deadline and p.info()["clients_cut_off_not_reading"] == 0:
            peak = max(peak, p.rss_bytes())
            time.sleep(0.2)
        print(f"never-reading client: RSS {rss0 / MIB:.0f} -> peak {peak / MIB:.0f} MiB")
        assert p.info()["clients_cut_off_not_reading"] == 1
        assert peak - rss0 < 128 * MIB, "replies to an unread pipeline were buffered"
        assert p.client().get("big") == b"v" * MIB
    finally:
        p.stop()


def test_ten_thousand_idle_connections_while_redis_benchmark_runs():
    if shutil.which("redis-benchmark") is None:
        pytest.fail("redis-benchmark is missing: apt-get install redis-tools")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 10_500
    if hard < need:
        pytest.fail(f"the open-file hard limit is {hard}; this test needs {need}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))
    p = StrataProcess({"maxclients": 11_000})
    idle = []
    try:
        for i in range(10_000):
            idle.append(socket.create_connection(("127.0.0.1", p.port)))
        # Every one of them is admitted: a PING on a sample is answered.
        for s in idle[::500]:
            s.sendall(b"PING\r\n")
            assert s.recv(64) == b"+PONG\r\n"
        assert p.client().info("clients")["connected_clients"] >= 10_000
        rss_idle = p.rss_bytes()
        out = subprocess.run(
            ["redis-benchmark", "-p", str(p.port), "-n", "20000", "-c", "50", "-t", "set,get", "-q"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr
        lines = [l for l in out.stdout.replace("\r", "\n").splitlines() if "requests per second" in l]
        assert any(l.startswith("SET") for l in lines) and any(l.startswith("GET") for l in lines), out.stdout
        rss_after = p.rss_bytes()
        print(
            f"10k idle + redis-benchmark: RSS {rss_idle / MIB:.0f} MiB idle, {rss_after / MIB:.0f} MiB after; "
            + "; ".join(l.strip() for l in lines)
        )
        for s in idle[::500]:
            s.sendall(b"PING\r\n")
            assert s.recv(64) == b"+PONG\r\n"
    finally:
        for s in idle:
            s.close()
        p.stop()


def test_protected_mode_refuses_non_loopback_clients_without_a_password():
    p = StrataProcess()
    try:
        s = connect_from(p.port, "127.0.0.2")
        reply = recv_until_closed(s)
        assert reply.startswith(b"-DENIED"), reply
        assert p.client().ping(), "127.0.0.1 is the loopback interface"
        assert p.info()["protected_mode_denied"] == 1
        # Turning it off (only possible from loopback) lets the client in.
        p.client().config_set("protected-mode", "no")
        s = connect_from(p.port, "127.0.0.2")
        s.sendall(b"PING\r\n")
        assert s.recv(64) == b"+PONG\r\n"
    finally:
        p.stop()
    # With a password, remote clients may connect and must authenticate.
    p = StrataProcess({"requirepass": "s3cret"})
    try:
        s = connect_from(p.port, "127.0.0.2")
        s.sendall(b"PING\r\n")
        assert s.recv(256).startswith(b"-NOAUTH")
        s.sendall(b"AUTH s3cret\r\nPING\r\n")
        time.sleep(0.2)
        assert s.recv(256) == b"+OK\r\n+PONG\r\n"
    finally:
        p.stop()


def test_wrong_passwords_are_rate_limited_and_logged():
    p = StrataProcess({"requirepass": "s3cret", "auth_failures_per_minute_max": 5})
    try:
        c = socket.create_connection(("127.0.0.1", p.port))
        for _ in range(5):
            c.sendall(b"AUTH guess\r\n")
            assert c.recv(256).startswith(b"-WRONGPASS")
        # The right password is not even checked now, from this address.
        c.sendall(b"AUTH s3cret\r\n")
        assert c.recv(256).startswith(b"-ERR too many failed AUTH attempts"), "not limited"
        with pytest.raises(redis.ResponseError, match="too many failed AUTH attempts"):
            p.client(password="s3cret", protocol=2).ping()
        # Another address is not affected.
        s = connect_from(p.port, "127.0.0.2")
        s.sendall(b"AUTH s3cret\r\n")
        assert s.recv(64) == b"+OK\r\n"
        s.sendall(b"INFO stats\r\n")
        time.sleep(0.3)
        text = s.recv(65536).decode()
        stats = dict(l.split(":", 1) for l in text.split("\r\n") if ":" in l)
        assert (stats["auth_failures"], stats["auth_refused"]) == ("5", "2"), text
        log = p.log_text()
        assert log.count("authentication failed") == 5, log
        assert "too many failed attempts" in log
    finally:
        p.stop()
