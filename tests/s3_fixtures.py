"""pytest plugin: a real S3 HTTP endpoint on loopback (moto's server) and fresh S3 storages.

Registered from tests/conftest.py through ``pytest_plugins``. The server runs in this process
(``ThreadedMotoServer``) on 127.0.0.1 and a free port, once per session; every storage gets
its own bucket, so tests never see each other's files.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import boto3
import pytest

from state_runtime.storage.s3 import S3Storage
from tests.s3_faults import FaultProxy
from tests.services import service_missing

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

REGION = "us-east-1"
CREDENTIALS = {"aws_access_key_id": "testing-key-id", "aws_secret_access_key": "testing-secret"}


@dataclass(frozen=True)
class MotoS3:
    """The running moto server: its endpoint and an uninstrumented admin client."""

    endpoint_url: str
    admin: S3Client

    def new_bucket(self) -> str:
        name = f"t-{uuid.uuid4().hex[:20]}"
        self.admin.create_bucket(Bucket=name)
        return name

    def storage(
        self,
        bucket: str | None = None,
        prefix: str = "checkpoint",
        *,
        endpoint_url: str | None = None,
        **options: Any,
    ) -> S3Storage:
        """A storage on a fresh bucket (or ``bucket``), optionally through another endpoint."""
        settings: dict[str, Any] = {"region_name": REGION, **CREDENTIALS, **options}
        return S3Storage(
            bucket or self.new_bucket(),
            prefix,
            endpoint_url=endpoint_url or self.endpoint_url,
            **settings,
        )

    def keys(self, bucket: str) -> set[str]:
        pages = self.admin.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        return {obj["Key"] for page in pages for obj in page.get("Contents", [])}

    def pending_uploads(self, bucket: str) -> list[str]:
        answer = self.admin.list_multipart_uploads(Bucket=bucket)
        return [u["Key"] for u in answer.get("Uploads", [])]

    def seed(self, bucket: str, keys: Iterable[str], body: bytes = b"x") -> None:
        """Create many objects fast, straight in moto's in-process backend.

        Only for bulk set-up (1,000+ objects at ~5 ms per HTTP PUT would take seconds); the
        behaviour under test still goes through HTTP. Tests check the result by listing.
        """
        from moto.core.models import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
        for key in keys:
            backend.put_object(bucket, key, body)


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    """moto's S3 server on 127.0.0.1 and a free port, for the whole session."""
    try:
        import moto.backends
        from moto.server import ThreadedMotoServer
    except ImportError as e:
        service_missing("S3 endpoint (moto server)", f"moto[server] is not installed: {e}")
        raise
    # moto lists its package folder on every request to route it (~4 ms); list it once.
    modules = tuple(moto.backends.list_of_moto_modules())
    moto.backends.list_of_moto_modules = lambda: modules
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    admin = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=CREDENTIALS["aws_access_key_id"],
        aws_secret_access_key=CREDENTIALS["aws_secret_access_key"],
    )
    try:
        admin.list_buckets()
    except Exception as e:
        server.stop()
        service_missing("S3 endpoint (moto server)", f"no answer at {endpoint}: {e}")
    yield MotoS3(endpoint, admin)
    server.stop()


@pytest.fixture
def s3_storage(moto_s3: MotoS3) -> S3Storage:
    """A fresh S3 storage: its own bucket on the moto server."""
    return moto_s3.storage()


@pytest.fixture(scope="session")
def _session_fault_proxy(moto_s3: MotoS3) -> Iterator[FaultProxy]:
    proxy = FaultProxy(moto_s3.endpoint_url)
    yield proxy
    proxy.close()


@pytest.fixture
def fault_proxy(_session_fault_proxy: FaultProxy) -> Iterator[FaultProxy]:
    """An HTTP proxy on loopback in front of moto that injects the faults a test asks for.

    One per session (one endpoint, so storages share a client), reset before every test and
    after it (which ends the test's stalls).
    """
    _session_fault_proxy.reset()
    yield _session_fault_proxy
    _session_fault_proxy.reset()
