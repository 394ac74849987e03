"""Checkpoint files on S3 or an S3-compatible store (MinIO), through boto3.

- Put-if-absent is ``If-None-Match: *`` on PutObject, and on CompleteMultipartUpload for
  payloads at or above ``multipart_threshold``; a failed multipart upload is aborted.
- Transient failures (5xx, throttling, timeouts, dropped connections) are retried by boto3's
  own ``standard`` or ``adaptive`` mode; ``409 ConditionalRequestConflict`` joins that loop.
- A retried conditional write can meet its own earlier, successful attempt (the answer was
  lost, the bytes were not). Every write therefore carries a unique token in its metadata;
  after an ambiguous failure one HEAD tells whether the file there is ours (success) or
  someone else's (FileAlreadyExists).
- Listing pages through ListObjectsV2; deletes go in DeleteObjects batches of 1,000 keys.
- A writer killed mid-upload leaves an incomplete multipart upload: ``partial_writes`` finds
  them (ListMultipartUploads) and ``abort_partial_writes`` aborts them.
- Every HTTP request is counted in :attr:`requests` by kind (see ``REQUEST_KINDS``), plus
  ``retries`` for each re-sent request.

The storage pickles as its bucket, prefix and :class:`S3Settings`; an unpickled copy (on a
Spark executor) uses the process's shared client for those settings.
"""

from __future__ import annotations

import posixpath
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC
from typing import TYPE_CHECKING, Any, Final

from botocore.exceptions import BotoCoreError, ClientError

from state_runtime.errors import (
    FileAlreadyExists,
    InvalidArgument,
    StorageError,
    StorageFileNotFound,
)
from state_runtime.redaction import get_logger
from state_runtime.storage.base import (
    ByteStream,
    DeleteResult,
    FileInfo,
    PartialWrite,
    Storage,
    check_relative_path,
)
from state_runtime.storage.root_rule import check_bucket, parse_root
from state_runtime.storage.s3_client import CallRecord, instrument, recording, shared_client
from state_runtime.storage.s3_errors import (
    error_code,
    http_status,
    is_not_found,
    is_precondition_failed,
    storage_error,
)
from state_runtime.storage.s3_settings import S3Settings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef

log = get_logger(__name__)

DELETE_BATCH: Final = 1000
"""DeleteObjects takes at most 1,000 keys per request."""
MAX_PARTS: Final = 10_000
WRITE_TOKEN: Final = "state-runtime-write"
"""User metadata key (``x-amz-meta-state-runtime-write``) holding each write's unique token."""

_S3Failure = ClientError | BotoCoreError


class S3Storage(Storage):
    """Files below ``s3://bucket/prefix``.

    Configure it with ``settings`` or with ``options``, the :class:`S3Settings` fields
    (``endpoint_url``, ``region_name``, ``max_attempts``, ``multipart_threshold``, ...) with
    the environment filled in. ``client`` replaces the shared client in this process only
    (tests, custom sessions); pickled copies build theirs from the settings.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        settings: S3Settings | None = None,
        client: S3Client | None = None,
        **options: object,
    ) -> None:
        super().__init__()
        if settings is not None and options:
            raise InvalidArgument("pass S3 settings or options, not both")
        prefix = check_bucket(bucket, prefix)
        self.bucket = bucket
        self.prefix = prefix
        self.settings = settings if settings is not None else S3Settings.resolve(options)
        self._client_override = client
        if client is not None:
            instrument(client, self.settings.max_attempts)
        self._count_lock = threading.Lock()

    @classmethod
    def from_uri(cls, uri: str, *, client: S3Client | None = None, **options: object) -> S3Storage:
        """Storage for ``s3://bucket/prefix`` (``s3a://`` accepted, as Hadoop writes it)."""
        location = parse_root(uri)
        if location.scheme != "s3":
            raise InvalidArgument(f"invalid S3 URI {uri!r}: expected s3://bucket/prefix")
        return cls(
            location.bucket, location.path, settings=S3Settings.resolve(options), client=client
        )

    def __reduce__(self) -> tuple[Callable[..., S3Storage], tuple[Any, ...]]:
        return _restore, (self.bucket, self.prefix, self.settings)

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    # --- the Storage interface ----------------------------------------------------------

    def read(self, path: str) -> bytes:
        key = self._key(path)
        with self._call() as call:
            try:
                data = self._client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
            except (ClientError, BotoCoreError) as e:
                raise self._error(e, "read", path, call) from e
        with self._count_lock:
            self.requests.bytes_read += len(data)
        return data

    @contextmanager
    def read_stream(self, path: str) -> Iterator[ByteStream]:
        key = self._key(path)
        with self._call() as call:
            try:
                body = self._client.get_object(Bucket=self.bucket, Key=key)["Body"]
            except (ClientError, BotoCoreError) as e:
                raise self._error(e, "read", path, call) from e
        try:
            yield _Body(self, body, path, call)
        finally:
            body.close()

    def write_if_absent(self, path: str, data: bytes) -> None:
        key = self._key(path)
        token = uuid.uuid4().hex
        if len(data) >= self.settings.multipart_threshold:
            part_size = self._part_size(len(data))
            parts = (data[start : start + part_size] for start in range(0, len(data), part_size))
            self._write_multipart(key, path, parts, token)
        else:
            self._put(key, path, data, token)
        with self._count_lock:
            self.requests.bytes_written += len(data)

    def write_stream_if_absent(self, path: str, source: ByteStream, size: int) -> None:
        if size < self.settings.multipart_threshold:
            self.write_if_absent(path, source.read(size))
            return
        part_size = self._part_size(size)
        parts = iter(lambda: source.read(part_size), b"")
        self._write_multipart(self._key(path), path, parts, uuid.uuid4().hex)
        with self._count_lock:
            self.requests.bytes_written += size

    def exists(self, path: str) -> bool:
        return self._head(path) is not None

    def size(self, path: str) -> int:
        head = self._head(path)
        if head is None:
            raise StorageFileNotFound("file not found", path=path)
        return int(head["ContentLength"])

    def list(self, prefix: str) -> Iterator[FileInfo]:
        for page in self._pages("list_objects_v2", self._key(prefix) + "/", "list", prefix):
            for obj in page.get("Contents", []):
                key = obj["Key"]
                if not key.endswith("/"):  # folder markers made by consoles
                    yield FileInfo(
                        path=self._relative(key),
                        size=obj["Size"],
                        modified=obj["LastModified"].astimezone(UTC),
                    )

    def delete(self, paths: Sequence[str]) -> DeleteResult:
        unique = list(dict.fromkeys(paths))
        keys = [self._key(p) for p in unique]  # validate every path before deleting any
        result = DeleteResult()
        for start in range(0, len(keys), DELETE_BATCH):
            end = start + DELETE_BATCH
            batch = dict(zip(keys[start:end], unique[start:end], strict=True))
            with self._call() as call:
                try:
                    answer = self._client.delete_objects(
                        Bucket=self.bucket,
                        Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
                    )
                except (ClientError, BotoCoreError) as e:
                    # Stop at the first failed batch: the store is failing; report the rest.
                    reason = str(self._error(e, "delete", None, call))
                    result.failed.update(dict.fromkeys(unique[start:end], reason))
                    later = f"not attempted after an earlier batch failed: {reason}"
                    result.failed.update(dict.fromkeys(unique[end:], later))
                    return result
            refused = {
                err.get("Key", ""): f"{err.get('Code', 'error')}: {err.get('Message', '')}"
                for err in answer.get("Errors", [])
            }
            for key, path in batch.items():
                if key in refused:
                    result.failed[path] = refused[key]
                else:
                    result.deleted.append(path)
        return result

    def partial_writes(self, folders: Sequence[str]) -> Iterator[PartialWrite]:
        """Incomplete multipart uploads below ``folders``, what a writer killed mid-upload
        left: ListMultipartUploads pages (1,000 uploads each) under the folders' common
        prefix, whatever their number; no object is listed."""
        wanted = tuple(self._key(folder) + "/" for folder in folders)
        if not wanted:
            return
        common = (posixpath.commonpath(wanted) + "/").lstrip("/")
        for page in self._pages("list_multipart_uploads", common, "list multipart uploads", None):
            for upload in page.get("Uploads", []):
                if not upload["Key"].startswith(wanted):
                    continue
                yield PartialWrite(
                    path=self._relative(upload["Key"]),
                    started=upload["Initiated"].astimezone(UTC),
                    size=0,
                    handle=upload["UploadId"],
                )

    def abort_partial_writes(self, writes: Sequence[PartialWrite]) -> DeleteResult:
        result = DeleteResult()
        for write in writes:
            key = self._key(write.path)
            with self._call() as call:
                try:
                    self._client.abort_multipart_upload(
                        Bucket=self.bucket, Key=key, UploadId=write.handle
                    )
                except ClientError as e:
                    if error_code(e) != "NoSuchUpload":  # already aborted or completed
                        result.failed[write.path] = str(self._error(e, "abort", write.path, call))
                        continue
                except BotoCoreError as e:
                    result.failed[write.path] = str(self._error(e, "abort", write.path, call))
                    continue
            result.deleted.append(write.path)
        return result

    # --- writes ---------------------------------------------------------------------------

    def _put(self, key: str, path: str, data: bytes, token: str) -> None:
        with self._call() as call:
            try:
                self._client.put_object(
                    Bucket=self.bucket,
                    Key=key,
                    Body=data,
                    IfNoneMatch="*",
                    Metadata={WRITE_TOKEN: token},
                )
                return
            except (ClientError, BotoCoreError) as e:
                failure: _S3Failure = e
        self._settle(failure, call, key, path, token, "write")

    def _part_size(self, size: int) -> int:
        return max(self.settings.multipart_part_size, -(-size // MAX_PARTS))

    def _write_multipart(self, key: str, path: str, parts: Iterator[bytes], token: str) -> None:
        with self._call() as call:
            try:
                upload_id = self._client.create_multipart_upload(
                    Bucket=self.bucket,
                    Key=key,
                    Metadata={WRITE_TOKEN: token},
                    ChecksumAlgorithm="CRC32",
                )["UploadId"]
            except (ClientError, BotoCoreError) as e:
                raise self._error(e, "start multipart upload", path, call) from e
        try:
            uploaded = self._upload_parts(key, path, upload_id, parts)
            with self._call() as call:
                try:
                    self._client.complete_multipart_upload(
                        Bucket=self.bucket,
                        Key=key,
                        UploadId=upload_id,
                        MultipartUpload={"Parts": uploaded},
                        IfNoneMatch="*",
                    )
                    return
                except (ClientError, BotoCoreError) as e:
                    failure: _S3Failure = e
            self._settle(failure, call, key, path, token, "complete multipart upload")
        except BaseException:
            self._abort(key, path, upload_id)
            raise

    def _upload_parts(
        self, key: str, path: str, upload_id: str, parts: Iterator[bytes]
    ) -> Sequence[CompletedPartTypeDef]:
        """Upload ``parts`` in order, ``multipart_concurrency`` at a time: a part is read from
        ``parts`` only when one of those is free, so at most that many parts are in memory."""

        def upload(number: int, body: bytes) -> CompletedPartTypeDef:
            with self._call() as call:
                try:
                    answer = self._client.upload_part(
                        Bucket=self.bucket,
                        Key=key,
                        UploadId=upload_id,
                        PartNumber=number,
                        Body=body,
                        ChecksumAlgorithm="CRC32",
                    )
                except (ClientError, BotoCoreError) as e:
                    raise self._error(e, f"upload part {number}", path, call) from e
            part: CompletedPartTypeDef = {"PartNumber": number, "ETag": answer["ETag"]}
            if "ChecksumCRC32" in answer:
                part["ChecksumCRC32"] = answer["ChecksumCRC32"]
            return part

        workers = self.settings.multipart_concurrency
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="s3-part")
        done: list[CompletedPartTypeDef] = []
        running: deque[Future[CompletedPartTypeDef]] = deque()
        try:
            for number, body in enumerate(parts, 1):
                if len(running) >= workers:
                    done.append(running.popleft().result())
                running.append(pool.submit(upload, number, body))
            done.extend(f.result() for f in running)
            return done
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _abort(self, key: str, path: str, upload_id: str) -> None:
        with self._call() as call:
            try:
                self._client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            except (ClientError, BotoCoreError) as e:
                # The parts stay billed until a lifecycle rule removes them (docs/s3.md).
                log.warning(
                    "could not abort multipart upload %s: %s",
                    upload_id,
                    self._error(e, "abort multipart upload", path, call),
                )

    def _settle(
        self, failure: _S3Failure, call: CallRecord, key: str, path: str, token: str, action: str
    ) -> None:
        """Decide a failed conditional write: return if the file is ours after all, else raise.

        A first-attempt 4xx answer is definitive. After a retry, a 5xx answer or a lost
        connection, an earlier attempt may have written the file: its token tells.
        """
        definitive = (
            isinstance(failure, ClientError) and call.attempts <= 1 and http_status(failure) < 500
        )
        if definitive and is_precondition_failed(failure):
            raise FileAlreadyExists("file already exists; not replaced", path=path) from failure
        if definitive:
            raise self._error(failure, action, path, call) from failure
        try:
            head = self._head(path)
        except StorageError:
            error = self._error(failure, action, path, call)
            raise type(error)(
                f"{error.reason}; outcome unknown, the file may exist", path=path
            ) from failure
        if head is not None and head.get("Metadata", {}).get(WRITE_TOKEN) == token:
            log.info("S3 %s succeeded on an earlier attempt whose answer was lost", action)
            return
        if head is not None:
            raise FileAlreadyExists("file already exists; not replaced", path=path) from failure
        raise self._error(failure, action, path, call) from failure

    # --- helpers --------------------------------------------------------------------------

    @property
    def _client(self) -> S3Client:
        return self._client_override or shared_client(self.settings)

    def _call(self) -> AbstractContextManager[CallRecord]:
        return recording(self.requests, self._count_lock)

    def _pages(
        self, operation: str, key_prefix: str, action: str, path: str | None
    ) -> Iterator[dict[str, Any]]:
        """The pages of a listing ``operation`` under ``key_prefix``, each request counted
        and its failure typed."""
        pages = iter(
            self._client.get_paginator(operation).paginate(  # type: ignore[call-overload]
                Bucket=self.bucket, Prefix=key_prefix
            )
        )
        while True:
            with self._call() as call:
                try:
                    page = next(pages, None)
                except (ClientError, BotoCoreError) as e:
                    raise self._error(e, action, path, call) from e
            if page is None:
                return
            yield dict(page)

    def _head(self, path: str) -> dict[str, Any] | None:
        key = self._key(path)
        with self._call() as call:
            try:
                return dict(self._client.head_object(Bucket=self.bucket, Key=key))
            except ClientError as e:
                if is_not_found(e):
                    return None
                raise self._error(e, "head", path, call) from e
            except BotoCoreError as e:
                raise self._error(e, "head", path, call) from e

    def _key(self, path: str) -> str:
        check_relative_path(path)
        return f"{self.prefix}/{path}" if self.prefix else path

    def _relative(self, key: str) -> str:
        return key[len(self.prefix) + 1 :] if self.prefix else key

    def _error(
        self, error: _S3Failure, action: str, path: str | None, call: CallRecord
    ) -> StorageError:
        return storage_error(
            error,
            action=action,
            path=path,
            bucket=self.bucket,
            endpoint=self.settings.endpoint_url or "AWS S3",
            attempts=max(call.attempts, 1),
        )


class _Body:
    """A GetObject body read in pieces, its bytes counted as read and its errors typed."""

    def __init__(self, storage: S3Storage, body: Any, path: str, call: CallRecord) -> None:
        self._storage, self._body, self._path, self._call = storage, body, path, call

    def read(self, size: int = -1, /) -> bytes:
        try:
            data: bytes = self._body.read(None if size < 0 else size)
        except BotoCoreError as e:  # the connection dropped mid-body
            raise self._storage._error(e, "read", self._path, self._call) from e
        with self._storage._count_lock:
            self._storage.requests.bytes_read += len(data)
        return data


def _restore(bucket: str, prefix: str, settings: S3Settings) -> S3Storage:
    return S3Storage(bucket, prefix, settings=settings)
