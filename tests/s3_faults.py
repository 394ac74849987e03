"""A fault-injecting HTTP proxy on loopback, between boto3 and the moto S3 server.

Faults are real HTTP behaviour, not mocks: error answers with S3's XML body, answers lost
after the request reached S3 (the bytes were stored, the client never hears so), stalls past
the client's read timeout (held until the proxy is reset: no sleep races that timeout), and
DeleteObjects answers where S3 refused some keys. Each rule applies to the next ``times``
requests of one S3 operation; everything else is forwarded.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import socket
import threading
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

_NS = "http://s3.amazonaws.com/doc/2006-03-01/"
ET.register_namespace("", _NS)  # keep S3 documents unprefixed when rewritten
_HOP_BY_HOP = {"connection", "keep-alive", "expect", "transfer-encoding", "proxy-connection"}


@dataclass
class Rule:
    """What to do to the next ``times`` requests of ``operation``.

    ``action``: ``error`` (answer ``status``/``code``), ``drop`` (close without answering) or
    ``stall`` (hold the connection until the proxy is reset or closed, then close it).
    ``forward``: whether the request reaches S3 first, so that its effect happens although
    the client sees a failure. ``skip``: let that many requests of ``operation`` through
    untouched first. ``times`` -1: every request.
    """

    operation: str
    action: str
    times: int
    forward: bool = False
    status: int = 500
    code: str = "InternalError"
    skip: int = 0


@dataclass
class _Request:
    method: str
    target: str  # the path with its query, as sent
    headers: dict[str, str]
    body: bytes

    @property
    def operation(self) -> str:
        parsed = urlparse(self.target)
        return operation_of(self.method, parsed.path, parse_qs(parsed.query, True))


def operation_of(method: str, path: str, query: dict[str, list[str]]) -> str:
    """The S3 operation of a path-style request, as boto3 names it."""
    on_key = path.strip("/").count("/") >= 1
    if method == "PUT":
        if "partNumber" in query:
            return "UploadPart"
        return "PutObject" if on_key else "CreateBucket"
    if method == "POST":
        if "uploads" in query:
            return "CreateMultipartUpload"
        if "uploadId" in query:
            return "CompleteMultipartUpload"
        if "delete" in query:
            return "DeleteObjects"
    if method == "DELETE":
        return "AbortMultipartUpload" if "uploadId" in query else "DeleteObject"
    if method == "HEAD":
        return "HeadObject" if on_key else "HeadBucket"
    if method == "GET":
        if not on_key:
            return "ListObjectsV2" if "list-type" in query else "ListObjects"
        return "GetObject"
    return f"{method} {path}"


class FaultProxy:
    """Forwards to ``upstream`` (moto) and applies the injected faults."""

    def __init__(self, upstream: str) -> None:
        parsed = urlparse(upstream)
        self._upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self._lock = threading.Lock()
        self._rules: list[Rule] = []
        self._refused_keys: dict[str, str] = {}
        self._released = threading.Event()  # set to end the current stalls
        self.seen: Counter[str] = Counter()
        self.faulted: Counter[str] = Counter()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()
        host, port = self._server.server_address[:2]
        self.url = f"http://{host!s}:{port}"

    def reset(self) -> None:
        """Forget every rule and count; end every stall."""
        with self._lock:
            self._released.set()
            self._released = threading.Event()
            self._rules.clear()
            self._refused_keys.clear()
            self.seen.clear()
            self.faulted.clear()

    def close(self) -> None:
        self._released.set()
        self._server.shutdown()
        self._server.server_close()

    # --- injecting ----------------------------------------------------------------------

    def error(
        self,
        operation: str,
        *,
        status: int = 500,
        code: str = "InternalError",
        times: int = 1,
        forward: bool = False,
        skip: int = 0,
    ) -> None:
        """Answer ``status``/``code`` (after forwarding the request if ``forward``)."""
        self._add(Rule(operation, "error", times, forward, status, code, skip=skip))

    def drop(self, operation: str, *, times: int = 1, forward: bool = True) -> None:
        """Close the connection without an answer (after forwarding if ``forward``)."""
        self._add(Rule(operation, "drop", times, forward))

    def stall(self, operation: str, *, times: int = 1, forward: bool = False) -> None:
        """Hold the connection without answering until :meth:`reset`, then close it.

        The client's read timeout ends its wait however loaded the machine is; a stall that
        ended on its own after some seconds would race that timeout.
        """
        self._add(Rule(operation, "stall", times, forward))

    def refuse_deletes(self, keys: set[str], code: str = "AccessDenied") -> None:
        """DeleteObjects: S3 keeps these keys and reports a per-key error for each."""
        with self._lock:
            self._refused_keys.update(dict.fromkeys(keys, code))

    def _add(self, rule: Rule) -> None:
        with self._lock:
            self._rules.append(rule)

    def _take_rule(self, operation: str) -> tuple[Rule | None, threading.Event]:
        """The rule for this request (if any) and the event that ends a stall under it."""
        with self._lock:
            self.seen[operation] += 1
            for rule in self._rules:
                if rule.operation == operation and rule.times != 0:
                    if rule.skip > 0:
                        rule.skip -= 1
                        return None, self._released
                    rule.times -= 1
                    self.faulted[operation] += 1
                    return rule, self._released
            return None, self._released

    # --- serving ------------------------------------------------------------------------

    def serve(self, handler: BaseHTTPRequestHandler, request: _Request) -> None:
        rule, released = self._take_rule(request.operation)
        if rule is None:
            if request.operation == "DeleteObjects" and self._refused_keys:
                self._delete_with_refusals(handler, request)
            else:
                _answer(handler, *self._forward(request), head=request.method == "HEAD")
            return
        if rule.forward:
            self._forward(request)
        if rule.action == "error":
            _answer(handler, rule.status, {}, _error_xml(rule.code), head=request.method == "HEAD")
            return
        if rule.action == "stall":
            released.wait()
        handler.close_connection = True
        handler.connection.shutdown(socket.SHUT_RDWR)

    def _forward(self, request: _Request) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(*self._upstream, timeout=30)
        try:
            headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
            conn.request(request.method, request.target, request.body, headers)
            answer = conn.getresponse()
            body = answer.read()
            kept = {k: v for k, v in answer.getheaders() if k.lower() not in _HOP_BY_HOP}
            return answer.status, kept, body
        finally:
            conn.close()

    def _delete_with_refusals(self, handler: BaseHTTPRequestHandler, request: _Request) -> None:
        doc = ET.fromstring(request.body)
        refused: dict[str, str] = {}
        for obj in list(doc.findall(f"{{{_NS}}}Object")):
            key = obj.findtext(f"{{{_NS}}}Key", "")
            if key in self._refused_keys:
                refused[key] = self._refused_keys[key]
                doc.remove(obj)
        body = ET.tostring(doc)
        headers = {
            k: v
            for k, v in request.headers.items()
            if not k.lower().startswith(("x-amz-checksum", "x-amz-sdk-checksum", "content-md5"))
        }
        headers["Content-Length"] = str(len(body))
        headers["Content-MD5"] = base64.b64encode(hashlib.md5(body).digest()).decode()
        status, answer_headers, answer = self._forward(
            _Request(request.method, request.target, headers, body)
        )
        result = ET.fromstring(answer) if answer.strip() else ET.Element(f"{{{_NS}}}DeleteResult")
        for key, code in refused.items():
            error = ET.SubElement(result, f"{{{_NS}}}Error")
            ET.SubElement(error, f"{{{_NS}}}Key").text = key
            ET.SubElement(error, f"{{{_NS}}}Code").text = code
            ET.SubElement(error, f"{{{_NS}}}Message").text = "injected refusal"
        _answer(handler, status, answer_headers, ET.tostring(result), head=False)


def _handler_for(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            body = self.rfile.read(length) if length else b""
            request = _Request(self.command, self.path, dict(self.headers.items()), body)
            try:
                proxy.serve(self, request)
            except (BrokenPipeError, ConnectionResetError, OSError):
                self.close_connection = True

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


def _answer(
    handler: BaseHTTPRequestHandler,
    status: int,
    headers: dict[str, str],
    body: bytes,
    *,
    head: bool,
) -> None:
    handler.send_response(status)
    for name, value in headers.items():
        if name.lower() not in {"content-length", "date", "server"}:
            handler.send_header(name, value)
    length = headers.get("Content-Length", headers.get("content-length")) if head else None
    handler.send_header("Content-Length", length or str(len(body)))
    handler.end_headers()
    if not head:
        handler.wfile.write(body)


def _error_xml(code: str) -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
        f"<Message>injected fault</Message><RequestId>fault-proxy</RequestId></Error>"
    ).encode()
