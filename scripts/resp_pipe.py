"""A RESP client just fast enough to load a server from Python without measuring itself:
commands encoded once, sent pipelined, replies skipped over without decoding; and the
arguments every KV-cache pool benchmark takes. Shared by those benchmarks."""

import socket
import time
from pathlib import Path


def bench_args(ap, rounds=5):
    """The binary, rounds and workload shape every pool benchmark takes, on `ap`."""
    root = Path(__file__).resolve().parents[1]
    ap.add_argument("--bin", default=str(root / "target" / "release" / "strata"))
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--prompts", type=int, default=2000)
    ap.add_argument("--chunks-per-prompt", type=int, default=8)
    ap.add_argument("--value-bytes", type=int, default=4096)
    ap.add_argument("--unpinned", action="store_true")


def resp(*args) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += [b"$%d\r\n" % len(a), a, b"\r\n"]
    return b"".join(out)


def read_replies(sock, n, buf=b""):
    """Reads `n` whole replies (integers, errors, arrays of bulk strings) and returns the rest."""
    done = 0
    while done < n:
        while True:
            end = skip_reply(buf, 0)
            if end is None:
                break
            if buf[:1] == b"-":
                raise RuntimeError(buf[: buf.index(b"\r\n")].decode())
            buf, done = buf[end:], done + 1
            if done == n:
                return buf
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise RuntimeError("server closed the connection")
        buf += chunk
    return buf


def skip_reply(buf, at):
    """Where the reply at `at` ends, or None if it has not all arrived."""
    line = buf.find(b"\r\n", at)
    if line < 0:
        return None
    kind, head = buf[at : at + 1], buf[at + 1 : line]
    if kind in (b"+", b"-", b":"):
        return line + 2
    if kind == b"$":
        n = int(head)
        end = line + 2 + max(n, 0) + (2 if n >= 0 else 0)
        return end if n < 0 or len(buf) >= end else None
    if kind == b"*":
        at = line + 2
        for _ in range(max(int(head), 0)):
            at = skip_reply(buf, at)
            if at is None:
                return None
        return at
    raise RuntimeError(f"unexpected reply {buf[at:at + 40]!r}")


def run_pipelined(port, commands, depth=32):
    """Sends `commands` with `depth` in flight; returns the seconds taken."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    start = time.perf_counter()
    buf = b""
    for i in range(0, len(commands), depth):
        batch = commands[i : i + depth]
        sock.sendall(b"".join(batch))
        buf = read_replies(sock, len(batch), buf)
    took = time.perf_counter() - start
    sock.close()
    return took


def info_stats(port):
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(resp("INFO", "stats"))
    buf = b""
    while skip_reply(buf, 0) is None:
        buf += sock.recv(1 << 16)
    sock.close()
    text = buf[buf.index(b"\r\n") + 2 :].decode()
    return dict(line.split(":", 1) for line in text.split("\r\n") if ":" in line)
