"""A connection that reads bulk replies straight into the caller's buffers.

redis-py reads a large value in pieces and joins them (a copy of every byte, and a new
``bytes`` per value). For KV-cache chunks of megabytes that copy is most of the cost, so
``KVCacheClient`` reads ``KVC.GET`` replies with this instead: each chunk's bytes go from the
socket into its buffer with ``recv_into`` (a buffer the caller gives, such as a tensor's
memory, or a new ``bytearray``), and only the short header lines pass through a small
read-ahead buffer.
"""

import socket
from typing import Callable, List, Optional, Sequence

import redis
from redis.connection import parse_url

#: Longest header line (``*N``, ``$len``, or an error) accepted.
LINE_BYTES_MAX = 64 << 10
#: Bytes asked of the socket when reading header lines; what it brings beyond a line (the
#: start of a value) is copied once into the value's buffer.
READ_AHEAD_BYTES = 16 << 10
#: Most elements one array reply may have.
ARRAY_LEN_MAX = 1 << 20


def pack(args: Sequence) -> bytes:
    """A command in RESP: an array of bulk strings."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, str):
            a = a.encode()
        elif isinstance(a, int):
            a = b"%d" % a
        out += [b"$%d\r\n" % len(a), bytes(a), b"\r\n"]
    return b"".join(out)


class Wire:
    """One connection to a Strata server (``redis://``, ``rediss://`` is not supported,
    ``unix://``), with the URL's credentials and database. Not shared between threads."""

    def __init__(self, url: str, timeout: Optional[float] = None):
        opts = parse_url(url)
        if opts.get("connection_class") is redis.SSLConnection:
            raise ValueError("direct reads do not support TLS; use the redis-py path")
        if "path" in opts:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            self.sock.connect(opts["path"])
        else:
            self.sock = socket.create_connection((opts.get("host", "127.0.0.1"), int(opts.get("port", 6379))), timeout=timeout)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.ahead = bytearray()
        self.pos = 0
        self.broken = False
        if opts.get("password"):
            auth = ["AUTH", opts["username"], opts["password"]] if opts.get("username") else ["AUTH", opts["password"]]
            try:
                self.call(auth)
            except redis.exceptions.ResponseError as e:
                self.close()
                raise redis.exceptions.AuthenticationError(str(e)) from None
        if opts.get("db"):
            self.call(["SELECT", opts["db"]])

    def close(self) -> None:
        self.broken = True
        self.sock.close()

    def send(self, cmds: Sequence[Sequence]) -> None:
        """Sends commands at once (a pipeline); their replies are read in order after."""
        try:
            self.sock.sendall(b"".join(pack(c) for c in cmds))
        except OSError:
            self.close()
            raise

    def call(self, cmd: Sequence) -> bytes:
        """Sends one command whose reply is a status; returns it, or raises its error."""
        self.send([cmd])
        line = self._line()
        if line[:1] == b"-":
            raise redis.exceptions.ResponseError(line[1:].decode(errors="replace"))
        return line

    def _line(self) -> bytes:
        """The next header line, without its CRLF."""
        while True:
            end = self.ahead.find(b"\r\n", self.pos)
            if end >= 0:
                line = bytes(self.ahead[self.pos : end])
                self.pos = end + 2
                return line
            if len(self.ahead) - self.pos > LINE_BYTES_MAX:
                self.close()
                raise redis.exceptions.ConnectionError("reply header line too long")
            del self.ahead[: self.pos]
            self.pos = 0
            more = self.sock.recv(READ_AHEAD_BYTES)
            if not more:
                self.close()
                raise redis.exceptions.ConnectionError("the server closed the connection")
            self.ahead += more

    def _into(self, view: memoryview) -> None:
        """Fills ``view``: first from what was read ahead, then straight from the socket."""
        k = min(len(self.ahead) - self.pos, len(view))
        if k:
            view[:k] = self.ahead[self.pos : self.pos + k]
            self.pos += k
        while k < len(view):
            n = self.sock.recv_into(view[k:])
            if n == 0:
                self.close()
                raise redis.exceptions.ConnectionError("the server closed the connection")
            k += n

    def read_bulks(self, buffer_for: Callable[[int, int], memoryview]) -> List[int]:
        """Reads one array-of-bulk-strings reply: element ``i`` of ``n`` bytes goes into
        ``buffer_for(i, n)`` (a writable byte view of exactly ``n`` bytes). Returns the
        elements' lengths, -1 for a nil element (``MGET``'s missing keys: no buffer asked).
        An error reply raises ``ResponseError``; anything else that goes wrong (including
        ``buffer_for`` raising) closes the connection and raises."""
        try:
            line = self._line()
            if line[:1] == b"-":
                raise redis.exceptions.ResponseError(line[1:].decode(errors="replace"))
            if line[:1] != b"*" or not 0 <= int(line[1:]) <= ARRAY_LEN_MAX:
                raise redis.exceptions.InvalidResponse(f"expected an array reply, got {line[:40]!r}")
            lengths = []
            crlf = memoryview(bytearray(2))
            for i in range(int(line[1:])):
                head = self._line()
                if head[:1] != b"$":
                    raise redis.exceptions.InvalidResponse(f"expected a bulk string, got {head[:40]!r}")
                n = int(head[1:])
                if n < 0:
                    lengths.append(-1)
                    continue
                view = buffer_for(i, n)
                if len(view) != n:
                    raise ValueError(f"a buffer of {len(view)} bytes for a value of {n}")
                self._into(view)
                self._into(crlf)
                lengths.append(n)
            return lengths
        except redis.exceptions.ResponseError:
            raise
        except BaseException:
            self.close()
            raise
