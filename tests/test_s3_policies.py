"""The documented S3 policies (``infra/s3/*-policy.json``) against an endpoint that enforces
them: moto's server with IAM authorization on (``INITIAL_NO_AUTH_ACTION_COUNT``), one IAM user
per role. The runtime writes (conditional and multipart puts), reads and lists under its
prefix and cannot delete; maintenance deletes too; neither reaches outside the prefix.

Where moto's authorization differs from S3's, the test says so rather than pretend: it
does not check policy conditions (the ``s3:prefix`` of ``ListBucket``), and it authorizes a
DeleteObjects request as ``s3:DeleteObject`` on the bucket's ARN (S3 checks each key's ARN),
so maintenance gets that one moto-only statement here, and its deletes outside the prefix are
left to real S3.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError

from state_runtime.catalog import Catalog
from state_runtime.errors import StorageError
from state_runtime.identity import StoreId
from state_runtime.maintenance import Fleet, MaintenancePolicy, cleanup_pass, snapshot_pass
from state_runtime.retention import RetentionPolicy
from state_runtime.storage.s3 import S3Storage
from tests.catalog.conftest import sqlite_catalog  # noqa: F401  (fixture)
from tests.maintenance.streams import StoreStream

pytestmark = pytest.mark.s3
REPO = Path(__file__).resolve().parents[1]
REGION = "us-east-1"
BUCKET, PREFIX = "state-checkpoints", "checkpoints"
SETUP_ACTIONS = 10  # create_bucket, then create_user, put_user_policy, create_access_key x 3
FAST = MaintenancePolicy(
    snapshot_min_deltas=3, retention=RetentionPolicy(window=timedelta(0)), min_window=timedelta(0)
)


def policy(name: str) -> str:
    text = (REPO / "infra" / "s3" / f"{name}-policy.json").read_text()
    return text.replace("BUCKET", BUCKET).replace("PREFIX", PREFIX)


def moto_delete(document: str) -> str:
    """``document`` plus DeleteObject on the bucket's ARN: how moto authorizes DeleteObjects."""
    parsed = json.loads(document)
    parsed["Statement"].append(
        {"Effect": "Allow", "Action": "s3:DeleteObject", "Resource": f"arn:aws:s3:::{BUCKET}"}
    )
    return json.dumps(parsed)


@dataclass(frozen=True)
class Enforcing:
    endpoint: str
    keys: dict[str, dict[str, str]]

    def storage(self, role: str, prefix: str = PREFIX, **options: object) -> S3Storage:
        key = self.keys[role]
        return S3Storage(
            BUCKET,
            prefix,
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=key["AccessKeyId"],
            aws_secret_access_key=key["SecretAccessKey"],
            max_attempts=1,
            **options,
        )


STARTUP = 120.0  # seconds for moto's server to answer: importing moto is slow under load
PORT_TRIES = 3


def start_moto(log: Path) -> tuple[subprocess.Popen[bytes], int]:
    """moto's server with IAM authorization on, answering on a free loopback port.

    The port is found free, then bound by the server a moment later: if another process took
    it meanwhile, the server exits and another port is tried. A server that neither answers
    nor exits within :data:`STARTUP` fails the test with its log."""
    for _ in range(PORT_TRIES):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        with log.open("ab") as out:
            server = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                env=os.environ | {"INITIAL_NO_AUTH_ACTION_COUNT": str(SETUP_ACTIONS)},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + STARTUP
        while server.poll() is None and time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return server, port
            except OSError:
                time.sleep(0.1)
        if server.poll() is None:  # neither answered nor exited
            server.kill()
            server.wait()
            break
    pytest.fail(f"moto's server did not answer within {STARTUP:.0f} s; its log:\n{log.read_text()}")


@pytest.fixture(scope="module")
def enforcing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Enforcing]:
    server, port = start_moto(tmp_path_factory.mktemp("moto") / "server.log")
    endpoint = f"http://127.0.0.1:{port}"
    try:
        anyone = {"aws_access_key_id": "setup", "aws_secret_access_key": "setup"}
        boto3.client("s3", endpoint_url=endpoint, region_name=REGION, **anyone).create_bucket(
            Bucket=BUCKET
        )
        iam = boto3.client("iam", endpoint_url=endpoint, region_name=REGION, **anyone)
        documents = {
            "admin": json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
                }
            ),
            "runtime": policy("runtime"),
            "maintenance": moto_delete(policy("maintenance")),
        }
        keys = {}
        for role, document in documents.items():
            iam.create_user(UserName=role)
            iam.put_user_policy(UserName=role, PolicyName=role, PolicyDocument=document)
            keys[role] = iam.create_access_key(UserName=role)["AccessKey"]
        yield Enforcing(endpoint, keys)
    finally:
        server.kill()
        server.wait()


def test_the_runtime_writes_reads_and_lists_under_its_prefix_and_cannot_delete(
    enforcing: Enforcing,
) -> None:
    runtime = enforcing.storage("runtime")
    runtime.write_if_absent("state/0/0/default/1_a.delta", b"small")  # a conditional put
    big = enforcing.storage("runtime", multipart_threshold=5 * 1024 * 1024)
    big.write_if_absent("state/0/0/default/2_b.delta", os.urandom(6 * 1024 * 1024))  # multipart
    assert runtime.read("state/0/0/default/1_a.delta") == b"small"
    assert runtime.exists("state/0/0/default/2_b.delta")
    assert {f.path for f in runtime.list("state")} >= {"state/0/0/default/1_a.delta"}
    refused = runtime.delete(["state/0/0/default/1_a.delta"])
    assert not refused.deleted and "Access Denied" in refused.failed["state/0/0/default/1_a.delta"]
    assert runtime.read("state/0/0/default/1_a.delta") == b"small"
    outside = enforcing.storage("runtime", prefix="elsewhere")
    with pytest.raises(StorageError, match=r"(?i)access ?denied"):
        outside.write_if_absent("state/x.delta", b"x")
    with pytest.raises(StorageError, match=r"(?i)access ?denied"):
        outside.read("state/x.delta")


def test_maintenance_deletes_and_writes_under_its_prefix_only(enforcing: Enforcing) -> None:
    writer, maintenance = enforcing.storage("runtime"), enforcing.storage("maintenance")
    writer.write_if_absent("state/9/0/default/1_c.delta", b"c")
    assert list(maintenance.partial_writes(["state"])) is not None  # ListBucketMultipartUploads
    done = maintenance.delete(["state/9/0/default/1_c.delta"])
    assert done.deleted == ["state/9/0/default/1_c.delta"] and not done.failed, done.failed
    assert not maintenance.exists("state/9/0/default/1_c.delta")
    with pytest.raises(StorageError, match=r"(?i)access ?denied"):
        enforcing.storage("maintenance", prefix="elsewhere").write_if_absent("x", b"x")
    with pytest.raises(ClientError):
        boto3.client(
            "s3",
            endpoint_url=enforcing.endpoint,
            region_name=REGION,
            aws_access_key_id=enforcing.keys["maintenance"]["AccessKeyId"],
            aws_secret_access_key=enforcing.keys["maintenance"]["SecretAccessKey"],
        ).delete_bucket(Bucket=BUCKET)


def test_a_stream_as_runtime_maintained_as_maintenance(
    enforcing: Enforcing,
    sqlite_catalog: Catalog,  # noqa: F811
) -> None:
    stores = [StoreId(5, 0), StoreId(5, 1)]
    stream = StoreStream(sqlite_catalog, enforcing.storage("runtime", prefix=f"{PREFIX}/s"), stores)
    stream.run(6)
    as_runtime = Fleet(sqlite_catalog, open_storage=lambda root: stream.storage, owner="rt")
    maintenance = enforcing.storage("maintenance", prefix=f"{PREFIX}/s")
    as_maintenance = Fleet(sqlite_catalog, open_storage=lambda root: maintenance, owner="mt")
    assert not snapshot_pass(as_maintenance, FAST).failed
    stream.run(2)
    refused = cleanup_pass(as_runtime, FAST, dry_run=False)  # the runtime's keys cannot delete
    assert refused.failed and not refused.deleted
    done = cleanup_pass(as_maintenance, FAST, dry_run=False)  # the claims resume, and delete
    assert done.deleted and not done.failed
    for store in stores:
        for version in (7, 8):
            assert stream.loaded(store, version) == stream.expected(store, version)
