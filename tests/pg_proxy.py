"""A fault-injecting TCP proxy on loopback, between psycopg2 and a real PostgreSQL server.

The faults are real network behaviour, not mocks:

- ``blackhole()``: stop forwarding in both directions without closing anything (a cable
  pulled, a firewall dropping packets). The kernel still accepts connections and acknowledges
  bytes, so only a client-side deadline can notice. ``heal()`` delivers what was held back,
  as TCP would once the network is back.
- ``reset_at(n)``: the n-th statement a client sends (counted over all connections) is not
  delivered; both sides are reset instead.
- ``swallow_commit_answers(n)``: the next ``n`` COMMITs reach the server (which commits), but
  their answers never come back and the connection goes silent.

The proxy parses the client's side of the PostgreSQL protocol (v3; connect with
``sslmode=disable`` so that it is readable) just enough to count statements: every
simple-query (``Q``) and parse (``P``) message is a statement.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

_STARTUP_CODES = {80877103, 80877104, 80877102}  # SSLRequest, GSSENCRequest, CancelRequest


@dataclass
class _Link:
    """One proxied connection: the client's socket and the server's."""

    client: socket.socket
    server: socket.socket
    held: list[tuple[socket.socket, bytes]] = field(default_factory=list)
    silent: bool = False  # answers from the server are dropped
    closed: bool = False


class PgFaultProxy:
    """Listens on 127.0.0.1 (a free port) and forwards to ``host:port``."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Condition()
        self._links: list[_Link] = []
        self._blackholed = False
        self._reset_at: int | None = None
        self._swallow_commits = 0
        self.statements: list[str] = []
        self.connections = 0
        self._stopped = False
        self._threads: list[threading.Thread] = []
        self._spawn(self._accept_loop)

    # --- faults -------------------------------------------------------------------------

    def blackhole(self) -> None:
        with self._lock:
            self._blackholed = True

    def heal(self) -> None:
        with self._lock:
            self._blackholed = False
            for link in self._links:
                for target, data in link.held:
                    _send(target, data)
                link.held.clear()
            self._lock.notify_all()

    def reset_at(self, n: int) -> None:
        """Reset the connection that sends the ``n``-th statement from now (1 = the next)."""
        with self._lock:
            self._reset_at = len(self.statements) + n

    def swallow_commit_answers(self, n: int = 1) -> None:
        with self._lock:
            self._swallow_commits = n

    @contextmanager
    def blackholed(self) -> Iterator[None]:
        self.blackhole()
        try:
            yield
        finally:
            self.heal()

    def close(self) -> None:
        with self._lock:
            self._stopped = True
            links = list(self._links)
            self._lock.notify_all()
        self._listener.close()
        for link in links:
            self._close(link, reset=False)
        for thread in self._threads:
            thread.join(timeout=5)

    def __enter__(self) -> PgFaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- forwarding ---------------------------------------------------------------------

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        thread.start()
        self._threads.append(thread)

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            link = _Link(client, server)
            with self._lock:
                if self._stopped:
                    client.close()
                    server.close()
                    return
                self._links.append(link)
                self.connections += 1
            self._spawn(self._client_to_server, link)
            self._spawn(self._server_to_client, link)

    def _client_to_server(self, link: _Link) -> None:
        buffer = b""
        started = False
        while True:
            data = _recv(link.client)
            if not data:
                self._close(link, reset=False)
                return
            buffer += data
            while True:
                size = _message_size(buffer, started)
                if size is None or len(buffer) < size:
                    break
                message, buffer = buffer[:size], buffer[size:]
                if not started:
                    code = struct.unpack("!I", message[4:8])[0]
                    started = code not in _STARTUP_CODES
                if not self._forward_client_message(link, message):
                    return

    def _forward_client_message(self, link: _Link, message: bytes) -> bool:
        """Deliver (or hold, or refuse) one client message; False once the link is closed."""
        kind = message[:1]
        with self._lock:
            if kind in (b"Q", b"P"):
                self.statements.append(_statement_text(message))
                if self._reset_at is not None and len(self.statements) >= self._reset_at:
                    self._reset_at = None
                    reset = True
                else:
                    reset = False
                    commit = kind == b"Q" and _statement_text(message).upper() == "COMMIT"
                    if commit and self._swallow_commits > 0:
                        self._swallow_commits -= 1
                        link.silent = True
            else:
                reset = False
            if not reset:
                if self._blackholed:
                    link.held.append((link.server, message))
                else:
                    _send(link.server, message)
        if reset:
            self._close(link, reset=True)
            return False
        return not link.closed

    def _server_to_client(self, link: _Link) -> None:
        while True:
            data = _recv(link.server)
            if not data:
                self._close(link, reset=False)
                return
            with self._lock:
                if link.silent:
                    continue
                if self._blackholed:
                    link.held.append((link.client, data))
                else:
                    _send(link.client, data)

    def _close(self, link: _Link, *, reset: bool) -> None:
        with self._lock:
            if link.closed:
                return
            link.closed = True
        for sock in (link.client, link.server):
            if reset:
                # SO_LINGER 0: close with a TCP RST, as a crashed middlebox would.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _send(sock: socket.socket, data: bytes) -> None:
    with suppress(OSError):
        sock.sendall(data)


def _message_size(buffer: bytes, started: bool) -> int | None:
    """The size of the first complete message header in ``buffer``, or None if too short.

    Before startup a message is ``int32 length`` (length includes itself); after it,
    ``type byte + int32 length``."""
    if not started:
        return None if len(buffer) < 8 else struct.unpack("!I", buffer[:4])[0]
    if len(buffer) < 5:
        return None
    return 1 + struct.unpack("!I", buffer[1:5])[0]


def _statement_text(message: bytes) -> str:
    body = message[5:]
    if message[:1] == b"P":  # Parse: statement name, then the query text
        body = body.split(b"\0", 1)[1] if b"\0" in body else body
    return body.split(b"\0", 1)[0].decode("utf-8", "replace").strip()
