"""Fault injection on S3: a real HTTP proxy on loopback between boto3 and moto answers 5xx,
stalls past the read timeout, loses answers after S3 stored the bytes, and refuses deletes.
Each test checks the retries made (counted), that nothing committed is lost and that the
error, if any, is typed and says what happened to which file."""

from __future__ import annotations

import logging
import socket
import traceback
from typing import Any

import pytest

from state_runtime.errors import (
    FileAlreadyExists,
    StorageError,
    StorageFileNotFound,
    StorageUnavailable,
)
from state_runtime.storage.s3 import S3Storage
from state_runtime.storage.s3_settings import MIB
from tests.s3_faults import FaultProxy
from tests.s3_fixtures import MotoS3

pytestmark = pytest.mark.s3

ATTEMPTS = 3
# Read timeout of the tests where a stall must time out while the retry that follows, healthy,
# must not: far above a healthy request through proxy and moto on a loaded machine (<1 s).
STALL_TIMEOUT = 5.0


def faulty(moto_s3: MotoS3, proxy: FaultProxy, **options: Any) -> S3Storage:
    """A storage on a fresh bucket whose requests go through the fault proxy.

    The read timeout stays the default unless a test stalls requests: moto shares this
    process with the proxy and the client, so a short one would time out healthy requests
    under load and add retries the exact counts below do not expect.
    """
    return moto_s3.storage(endpoint_url=proxy.url, max_attempts=ATTEMPTS, **options)


# --- transient errors are retried by boto3 ---------------------------------------------------


def test_5xx_answers_are_retried(moto_s3: MotoS3, fault_proxy: FaultProxy) -> None:
    storage = faulty(moto_s3, fault_proxy)
    storage.write_if_absent("f", b"payload")
    fault_proxy.error("GetObject", status=500, code="InternalError", times=1)
    fault_proxy.error("GetObject", status=503, code="ServiceUnavailable", times=1)
    storage.requests.reset()
    assert storage.read("f") == b"payload"
    assert storage.requests.counts == {"get": 3, "retries": 2}
    assert fault_proxy.seen["GetObject"] == 3


def test_persistent_5xx_gives_storage_unavailable(moto_s3: MotoS3, fault_proxy: FaultProxy) -> None:
    storage = faulty(moto_s3, fault_proxy)
    fault_proxy.error("PutObject", status=503, code="ServiceUnavailable", times=-1)
    with pytest.raises(StorageUnavailable) as caught:
        storage.write_if_absent("state/1_a.delta", b"x")
    message = str(caught.value)
    assert "state/1_a.delta" in message
    assert f"after {ATTEMPTS} attempts" in message and "ServiceUnavailable (HTTP 503)" in message
    # Nothing reached S3, so the write settles with one HEAD: the file is absent.
    assert storage.requests.counts == {"put": ATTEMPTS, "retries": ATTEMPTS - 1, "head": 1}
    assert moto_s3.keys(storage.bucket) == set()


def test_read_timeouts_are_retried(moto_s3: MotoS3, fault_proxy: FaultProxy) -> None:
    storage = faulty(moto_s3, fault_proxy, read_timeout=STALL_TIMEOUT)
    storage.write_if_absent("f", b"payload")
    fault_proxy.stall("GetObject", times=1)
    storage.requests.reset()
    assert storage.read("f") == b"payload"
    assert storage.requests.counts == {"get": 2, "retries": 1}


def test_persistent_timeouts_give_storage_unavailable(
    moto_s3: MotoS3, fault_proxy: FaultProxy
) -> None:
    # Every attempt stalls and none is healthy, so a short timeout cannot add attempts.
    storage = faulty(moto_s3, fault_proxy, read_timeout=0.5)
    fault_proxy.stall("HeadObject", times=-1)
    with pytest.raises(StorageUnavailable) as caught:
        storage.exists("f")
    assert "read timeout" in str(caught.value) and "file=f" in str(caught.value)
    assert storage.requests.counts == {"head": ATTEMPTS, "retries": ATTEMPTS - 1}


def test_unreachable_endpoint(moto_s3: MotoS3) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    storage = moto_s3.storage(bucket="no-such-server", endpoint_url=closed, max_attempts=2)
    with pytest.raises(StorageUnavailable) as caught:
        storage.read("f")
    assert closed in str(caught.value) and "after 2 attempts" in str(caught.value)


# --- writes whose answer is lost after S3 stored the bytes -----------------------------------


@pytest.mark.parametrize("lose", ["error", "drop", "stall"])
def test_put_that_fails_after_the_bytes_were_sent(
    moto_s3: MotoS3, fault_proxy: FaultProxy, lose: str
) -> None:
    stalls = {"read_timeout": STALL_TIMEOUT} if lose == "stall" else {}
    storage = faulty(moto_s3, fault_proxy, **stalls)
    if lose == "error":
        fault_proxy.error("PutObject", status=500, forward=True)
    elif lose == "drop":
        fault_proxy.drop("PutObject", forward=True)
    else:
        fault_proxy.stall("PutObject", forward=True)
    storage.write_if_absent("state/2_b.delta", b"committed bytes")
    # The retry met our own file (412); its write token proved it ours: success.
    assert storage.requests.counts == {"put": 2, "retries": 1, "head": 1}
    assert storage.read("state/2_b.delta") == b"committed bytes"


def test_every_answer_lost_still_keeps_the_write(moto_s3: MotoS3, fault_proxy: FaultProxy) -> None:
    storage = faulty(moto_s3, fault_proxy)
    fault_proxy.drop("PutObject", forward=True, times=-1)
    storage.write_if_absent("f", b"kept")
    assert storage.requests.counts == {"put": ATTEMPTS, "retries": ATTEMPTS - 1, "head": 1}
    assert storage.read("f") == b"kept"


def test_retry_meeting_another_writers_file_is_file_already_exists(
    moto_s3: MotoS3, fault_proxy: FaultProxy
) -> None:
    storage = faulty(moto_s3, fault_proxy)
    other = moto_s3.storage(bucket=storage.bucket)
    other.write_if_absent("f", b"other writer")
    fault_proxy.error("PutObject", status=500)  # first attempt never reaches S3
    with pytest.raises(FileAlreadyExists):
        storage.write_if_absent("f", b"mine")
    assert storage.read("f") == b"other writer"


def test_conditional_conflict_409_is_retried(moto_s3: MotoS3, fault_proxy: FaultProxy) -> None:
    storage = faulty(moto_s3, fault_proxy)
    fault_proxy.error("PutObject", status=409, code="ConditionalRequestConflict")
    storage.write_if_absent("f", b"after conflict")
    assert storage.requests.counts == {"put": 2, "retries": 1}
    assert storage.read("f") == b"after conflict"


def test_conditional_conflict_409_that_persists(moto_s3: MotoS3, fault_proxy: FaultProxy) -> None:
    storage = faulty(moto_s3, fault_proxy)
    fault_proxy.error("PutObject", status=409, code="ConditionalRequestConflict", times=-1)
    with pytest.raises(StorageError) as caught:
        storage.write_if_absent("f", b"x")
    assert "ConditionalRequestConflict (HTTP 409)" in str(caught.value)
    assert storage.requests.counts == {"put": ATTEMPTS, "retries": ATTEMPTS - 1, "head": 1}

    other = moto_s3.storage(bucket=storage.bucket)
    other.write_if_absent("g", b"winner")
    with pytest.raises(FileAlreadyExists):  # the conflicting writer won
        storage.write_if_absent("g", b"x")
    assert storage.read("g") == b"winner"


# --- multipart uploads -----------------------------------------------------------------------


def test_failed_part_upload_aborts_the_upload(moto_s3: MotoS3, fault_proxy: FaultProxy) -> None:
    storage = faulty(moto_s3, fault_proxy, multipart_threshold=MIB, multipart_part_size=5 * MIB)
    fault_proxy.error("UploadPart", status=500, times=-1)
    with pytest.raises(StorageUnavailable) as caught:
        storage.write_if_absent("big", b"x" * 6 * MIB)
    assert "upload part" in str(caught.value) and "file=big" in str(caught.value)
    assert fault_proxy.seen["AbortMultipartUpload"] == 1
    assert moto_s3.pending_uploads(storage.bucket) == []
    assert moto_s3.keys(storage.bucket) == set()


def test_lost_completion_answer_keeps_the_upload(moto_s3: MotoS3, fault_proxy: FaultProxy) -> None:
    storage = faulty(moto_s3, fault_proxy, multipart_threshold=MIB, multipart_part_size=5 * MIB)
    fault_proxy.drop("CompleteMultipartUpload", forward=True)
    data = b"y" * 6 * MIB
    storage.write_if_absent("big", data)
    assert fault_proxy.seen["CompleteMultipartUpload"] == 2
    assert fault_proxy.seen["AbortMultipartUpload"] == 0
    assert storage.read("big") == data
    assert moto_s3.pending_uploads(storage.bucket) == []


# --- deletes ---------------------------------------------------------------------------------


def test_delete_failing_halfway_through_a_batch(moto_s3: MotoS3, fault_proxy: FaultProxy) -> None:
    storage = faulty(moto_s3, fault_proxy)
    paths = [f"old/{i:04d}" for i in range(2200)]
    moto_s3.seed(storage.bucket, [f"checkpoint/{p}" for p in paths])
    # The first DeleteObjects goes through; the second fails on every attempt.
    fault_proxy.error("DeleteObjects", status=500, times=ATTEMPTS, skip=1)
    result = storage.delete(paths)
    assert sorted(result.deleted) == paths[:1000]
    assert sorted(result.failed) == paths[1000:]
    assert "InternalError (HTTP 500)" in result.failed[paths[1000]]
    assert "not attempted" in result.failed[paths[2000]]
    assert storage.requests.counts == {"delete": 1 + ATTEMPTS, "retries": ATTEMPTS - 1}
    remaining = {k.removeprefix("checkpoint/") for k in moto_s3.keys(storage.bucket)}
    assert remaining == set(paths[1000:])
    # Deleting again once S3 is healthy finishes the job.
    assert storage.delete(sorted(result.failed)).failed == {}
    assert moto_s3.keys(storage.bucket) == set()


def test_keys_refused_inside_a_delete_batch(moto_s3: MotoS3, fault_proxy: FaultProxy) -> None:
    storage = faulty(moto_s3, fault_proxy)
    for name in ("a", "b", "c"):
        storage.write_if_absent(name, b"x")
    fault_proxy.refuse_deletes({"checkpoint/b"})
    result = storage.delete(["a", "b", "c"])
    assert sorted(result.deleted) == ["a", "c"]
    assert result.failed == {"b": "AccessDenied: injected refusal"}
    assert moto_s3.keys(storage.bucket) == {"checkpoint/b"}


# --- credentials never leak ------------------------------------------------------------------

SECRET = "wJalrFAKESECRETxxK7MDENGbPxRfiCYEXAMPLEKEY"
TOKEN = "FAKESESSIONTOKENzzzz9999"
KEY_ID = "AKIAFAKEKEYID0000000"


def test_credentials_never_appear_in_errors_or_logs(
    moto_s3: MotoS3, fault_proxy: FaultProxy, caplog: pytest.LogCaptureFixture
) -> None:
    storage = faulty(
        moto_s3,
        fault_proxy,
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET,
        aws_session_token=TOKEN,
        multipart_threshold=MIB,
        multipart_part_size=5 * MIB,
    )
    missing_bucket = S3Storage("no-such-bucket-here", settings=storage.settings)
    errors: list[BaseException] = []

    def expect(error: type[BaseException], call: object, *args: object) -> None:
        with pytest.raises(error) as caught:
            call(*args)  # type: ignore[operator]
        errors.append(caught.value)
        logging.getLogger("state_runtime.test").exception("storage failed: %s", caught.value)

    with caplog.at_level(logging.INFO):
        storage.write_if_absent("f", b"x")
        expect(FileAlreadyExists, storage.write_if_absent, "f", b"y")
        expect(StorageFileNotFound, storage.read, "absent")
        expect(StorageError, missing_bucket.read, "f")
        fault_proxy.error("GetObject", status=500, times=-1)
        expect(StorageUnavailable, storage.read, "f")
        fault_proxy.error("UploadPart", status=500, times=-1)
        fault_proxy.drop("AbortMultipartUpload", times=-1, forward=False)
        expect(StorageUnavailable, storage.write_if_absent, "big", b"z" * 2 * MIB)
    assert "could not abort multipart upload" in caplog.text  # the warning was logged

    shown = [caplog.text, repr(storage), repr(storage.settings)]
    shown += ["".join(traceback.format_exception(e)) for e in errors]
    for text in shown:
        for credential in (SECRET, TOKEN, KEY_ID):
            assert credential not in text

    # botocore's own DEBUG log prints request headers (access key id, session token) but
    # never the secret key; docs/s3.md says to keep botocore below DEBUG in production.
    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        expect(StorageUnavailable, storage.read, "f")
    assert caplog.text and SECRET not in caplog.text
