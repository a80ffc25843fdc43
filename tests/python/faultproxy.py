"""A fault-injecting TCP proxy for tests: sits between Strata and the S3-compatible server
and, on command, passes traffic, blackholes it, resets connections, delays it, or answers
every request with HTTP 503.

    proxy = FaultProxy(("127.0.0.1", moto_port))
    proxy.mode = "blackhole"        # "pass", "blackhole", "reset", "delay", "503"
    proxy.delay_s = 5.0             # used by "delay"
    proxy.close()

A mode applies to connections as they carry data: switching it affects open connections
too (Strata's HTTP client keeps its connections alive)."""

import select
import socket
import struct
import threading
import time

MODES = ("pass", "blackhole", "reset", "delay", "503")
RESPONSE_503 = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\n"
    b"Content-Length: 97\r\nConnection: close\r\n\r\n"
    b"<Error><Code>ServiceUnavailable</Code><Message>injected by faultproxy</Message></Error>\n\n"
)


class FaultProxy:
    def __init__(self, upstream):
        self.upstream = upstream
        self.mode = "pass"
        self.delay_s = 5.0
        self.connections = 0
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(256)
        self.port = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept_loop, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self):
        self._closed = True
        self._listener.close()

    def _accept_loop(self):
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    @staticmethod
    def _reset(sock):
        # SO_LINGER with a zero timeout makes close() send RST.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()

    def _serve(self, client):
        upstream = None
        try:
            while not self._closed:
                readable, _, _ = select.select([client] + ([upstream] if upstream else []), [], [], 0.2)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    mode = self.mode
                    if mode == "blackhole":
                        continue  # swallowed: nothing is forwarded, nothing answered
                    if mode == "reset":
                        self._reset(client)
                        return
                    if mode == "503":
                        if sock is client:
                            client.sendall(RESPONSE_503)
                            return
                        continue
                    if mode == "delay":
                        time.sleep(self.delay_s)
                    if sock is client:
                        if upstream is None:
                            upstream = socket.create_connection(self.upstream)
                        upstream.sendall(data)
                    else:
                        client.sendall(data)
        except OSError:
            return
        finally:
            for s in (client, upstream):
                if s is not None:
                    try:
                        s.close()
                    except OSError:
                        pass
