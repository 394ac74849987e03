"""boto3 S3 clients: built from :class:`S3Settings`, shared per process, instrumented.

Building a boto3 session and client costs about 150 ms, too much for a Spark task that opens
a store each micro-batch, so clients are cached per settings (and per process: a forked
worker builds its own). Two botocore event hooks are installed on every client:

- ``request-created``: counts each HTTP request, retries included, into the counter of the
  storage call running on this thread (see :func:`recording`), so one shared client still
  gives exact per-storage accounting;
- ``needs-retry`` for conditional writes: S3 answers ``409 ConditionalRequestConflict`` when
  another conditional write to the same key is in flight and asks the client to retry, which
  botocore's standard and adaptive modes do not do; this hook lets botocore's own retry loop
  retry it within the configured attempts.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import boto3
from botocore.config import Config

from state_runtime.storage.base import RequestCounter
from state_runtime.storage.s3_settings import S3Settings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

REQUEST_KINDS: Final = {
    "GetObject": "get",
    "PutObject": "put",
    "HeadObject": "head",
    "ListObjectsV2": "list",
    "DeleteObjects": "delete",
    "CreateMultipartUpload": "multipart",
    "UploadPart": "multipart",
    "CompleteMultipartUpload": "multipart",
    "AbortMultipartUpload": "multipart",
}
"""Request kinds in :attr:`Storage.requests`; other operations count under their own name."""

RETRY_KIND: Final = "retries"
"""Counted once per re-sent request, in addition to the request's own kind."""

CONDITIONAL_WRITES: Final = ("PutObject", "CompleteMultipartUpload")
_USER_AGENT: Final = "state-runtime"

_current = threading.local()
_cache_lock = threading.Lock()
_clients: dict[S3Settings, S3Client] = {}
_cache_pid = os.getpid()


@dataclass
class CallRecord:
    """The HTTP requests one storage call sent (one botocore API call, retries included)."""

    counter: RequestCounter
    lock: threading.Lock = field(repr=False)
    attempts: int = 0

    def sent(self, operation: str) -> None:
        self.attempts += 1
        with self.lock:
            self.counter.add(REQUEST_KINDS.get(operation, operation))
            if self.attempts > 1:
                self.counter.add(RETRY_KIND)


@contextmanager
def recording(counter: RequestCounter, lock: threading.Lock) -> Iterator[CallRecord]:
    """Count the requests sent on this thread, inside the block, into ``counter``."""
    record = CallRecord(counter, lock)
    previous = getattr(_current, "record", None)
    _current.record = record
    try:
        yield record
    finally:
        _current.record = previous


def shared_client(settings: S3Settings) -> S3Client:
    """The process's client for these settings, built on first use."""
    global _cache_pid
    key = settings.client_settings()
    with _cache_lock:
        if _cache_pid != os.getpid():
            _clients.clear()
            _cache_pid = os.getpid()
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = build_client(key)
        return client


def build_client(settings: S3Settings) -> S3Client:
    """A new instrumented client with boto3's retry mode, timeouts and addressing style."""
    session = boto3.session.Session(
        aws_access_key_id=settings.aws_access_key_id,
        aws_secret_access_key=settings.aws_secret_access_key,
        aws_session_token=settings.aws_session_token,
        region_name=settings.region_name,
        profile_name=settings.profile_name,
    )
    config = Config(
        retries={"mode": settings.retry_mode, "total_max_attempts": settings.max_attempts},
        connect_timeout=settings.connect_timeout,
        read_timeout=settings.read_timeout,
        max_pool_connections=settings.max_pool_connections,
        s3={"addressing_style": settings.effective_addressing_style},
        user_agent_extra=_USER_AGENT,
    )
    client = session.client("s3", endpoint_url=settings.endpoint_url, config=config)
    instrument(client, settings.max_attempts)
    return client


def instrument(client: S3Client, max_attempts: int) -> None:
    """Install the counting and conflict-retry hooks (idempotent: unique ids)."""
    events = client.meta.events
    events.register("request-created.s3", _count_request, unique_id="state-runtime-count")
    retry_conflict = _ConflictRetry(max_attempts)
    for operation in CONDITIONAL_WRITES:
        events.register(
            f"needs-retry.s3.{operation}",
            retry_conflict,  # type: ignore[arg-type]  # needs-retry handlers return a delay
            unique_id=f"state-runtime-conflict-{operation}",
        )


def _count_request(operation_name: str, **_: Any) -> None:
    record: CallRecord | None = getattr(_current, "record", None)
    if record is not None:
        record.sent(operation_name)


class _ConflictRetry:
    """Retry ``409 ConditionalRequestConflict`` with jittered exponential backoff."""

    def __init__(self, max_attempts: int) -> None:
        self.max_attempts = max_attempts

    def __call__(self, response: Any, attempts: int, **_: Any) -> float | None:
        if response is None or attempts >= self.max_attempts:
            return None
        if response[1].get("Error", {}).get("Code") != "ConditionalRequestConflict":
            return None
        return random.uniform(0, min(1.0, 0.05 * 2**attempts))
