"""A fault-injecting TCP proxy on loopback, between psycopg2 and a real PostgreSQL server.

The faults are real network behaviour, not mocks. A *dead* connection stays open on both
sides but passes nothing any more, in either direction: no reset, no FIN, exactly what a
network partition or a dropping firewall does. The kernel still accepts connections and
acknowledges bytes, so only a client-side deadline can notice, and the server keeps the
session (and its locks) until its own timeouts end it.

- ``blackhole()``: every open connection dies, and so does every new one until ``heal()``;
  after ``heal()`` new connections work again (the dead ones never come back, as after a
  partition the client has given up on).
- ``blackhole_at(n)``: the connection that sends the ``n``-th statement from now dies before
  delivering it.
- ``reset_at(n)``: the ``n``-th statement from now is not delivered; both sides of its
  connection are reset (TCP RST).
- ``swallow_commit_answers(n)``: the next ``n`` COMMITs reach the server (which commits), then
  their connection dies: the answer never comes back.
- ``delay_answer_to(text, seconds)``: the answer to the next statement containing ``text``
  reaches the client that much later (a slow return path, one way only).

The proxy reads the client's side of the PostgreSQL protocol (v3; connect with
``sslmode=disable`` so that it is readable) just enough to count statements: every
simple-query (``Q``) and parse (``P``) message is one, and ``statements`` lists their text.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

_PRE_STARTUP = {80877103, 80877104, 80877102}  # SSLRequest, GSSENCRequest, CancelRequest


@dataclass(eq=False)
class _Link:
    """One proxied connection: the client's socket and the server's."""

    client: socket.socket
    server: socket.socket
    dead: bool = False  # passes nothing any more; both sockets stay open
    closed: bool = False
    answer_delay: float = 0.0  # before the next answer reaches the client


class PgFaultProxy:
    """Listens on 127.0.0.1 (a free port) and forwards to ``host:port``."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._links: list[_Link] = []
        self._blackholed = False
        self._dead_at: int | None = None
        self._reset_at: int | None = None
        self._swallow_commits = 0
        self._delayed: tuple[str, float] | None = None
        self.statements: list[str] = []
        self.connections = 0
        self._threads: list[threading.Thread] = []
        self._spawn(self._accept_loop)

    def url(self, database: str, user: str = "postgres") -> str:
        return f"postgresql+psycopg2://{user}@127.0.0.1:{self.port}/{database}?sslmode=disable"

    # --- faults -------------------------------------------------------------------------

    def blackhole(self) -> None:
        with self._lock:
            self._blackholed = True
            for link in self._links:
                link.dead = True

    def heal(self) -> None:
        with self._lock:
            self._blackholed = False

    @contextmanager
    def blackholed(self) -> Iterator[None]:
        self.blackhole()
        try:
            yield
        finally:
            self.heal()

    def blackhole_at(self, n: int) -> None:
        with self._lock:
            self._dead_at = len(self.statements) + n

    def reset_at(self, n: int) -> None:
        with self._lock:
            self._reset_at = len(self.statements) + n

    def swallow_commit_answers(self, n: int = 1) -> None:
        with self._lock:
            self._swallow_commits = n

    def delay_answer_to(self, text: str, seconds: float) -> None:
        with self._lock:
            self._delayed = (text, seconds)

    def clear(self) -> None:
        """Forget faults that have not struck yet."""
        with self._lock:
            self._dead_at = self._reset_at = None
            self._swallow_commits = 0

    def close(self) -> None:
        with suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self._listener.close()
        with self._lock:
            links = list(self._links)
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
                return  # closed
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            link = _Link(client, server)
            with self._lock:
                link.dead = self._blackholed
                self._links.append(link)
                self.connections += 1
            self._spawn(self._client_to_server, link)
            self._spawn(self._server_to_client, link)

    def _client_to_server(self, link: _Link) -> None:
        buffer, started = b"", False
        while True:
            data = _recv(link.client)
            if not data:
                with self._lock:
                    dead = link.dead
                if not dead:  # a dead link's FIN is lost too: the server's side stays open
                    self._close(link, reset=False)
                return
            buffer += data
            while (size := _message_size(buffer, started)) is not None and len(buffer) >= size:
                message, buffer = buffer[:size], buffer[size:]
                if not started:
                    started = struct.unpack("!I", message[4:8])[0] not in _PRE_STARTUP
                if not self._deliver(link, message):
                    return

    def _deliver(self, link: _Link, message: bytes) -> bool:
        """Forward one client message unless a fault says otherwise; False once reset."""
        reset, text = False, ""
        with self._lock:
            if message[:1] in (b"Q", b"P") and not link.dead:
                text = _statement_text(message)
                self.statements.append(text)
                count = len(self.statements)
                if self._delayed is not None and self._delayed[0] in text:
                    link.answer_delay, self._delayed = self._delayed[1], None
                if self._reset_at is not None and count >= self._reset_at:
                    self._reset_at, reset = None, True
                elif self._dead_at is not None and count >= self._dead_at:
                    self._dead_at, link.dead = None, True
            if not reset and not link.dead:
                _send(link.server, message)
                if message[:1] == b"Q" and text.upper() == "COMMIT" and self._swallow_commits:
                    self._swallow_commits -= 1
                    link.dead = True  # the server commits; its answer is lost
        if reset:
            self._close(link, reset=True)
        return not reset

    def _server_to_client(self, link: _Link) -> None:
        while True:
            data = _recv(link.server)
            if not data:
                self._close(link, reset=False)
                return
            with self._lock:
                delay, link.answer_delay = link.answer_delay, 0.0
            time.sleep(delay)
            with self._lock:
                if not link.dead:
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
    """The size of the first message in ``buffer``, or None if its header is incomplete.

    Before startup a message is ``int32 length`` (including itself), then its body; after
    it, ``type byte + int32 length``."""
    if not started:
        return None if len(buffer) < 8 else int(struct.unpack("!I", buffer[:4])[0])
    if len(buffer) < 5:
        return None
    return 1 + int(struct.unpack("!I", buffer[1:5])[0])


def _statement_text(message: bytes) -> str:
    body = message[5:]
    if message[:1] == b"P":  # Parse: statement name, then the query text
        body = body.split(b"\0", 1)[1] if b"\0" in body else body
    return body.split(b"\0", 1)[0].decode("utf-8", "replace").strip()
