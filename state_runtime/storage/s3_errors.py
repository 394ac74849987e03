"""Turning botocore exceptions into the library's typed storage errors.

Messages say what failed, on which file, how many attempts were made and what S3 answered,
and never carry credentials: only the error code, HTTP status and S3's own message are used,
and the errors mask every known credential out of them all the same
(:mod:`state_runtime.redaction`).
"""

from __future__ import annotations

from typing import Final

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
    ReadTimeoutError,
    ResponseStreamingError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from state_runtime.errors import StorageError, StorageFileNotFound, StorageUnavailable

NOT_FOUND_CODES: Final = frozenset({"NoSuchKey", "NotFound", "404"})
PRECONDITION_CODES: Final = frozenset({"PreconditionFailed", "412"})
CREDENTIAL_CODES: Final = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "AuthorizationHeaderMalformed",
    }
)
TRANSIENT_CODES: Final = frozenset(
    {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "ServiceUnavailable"}
)


def error_code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def http_status(error: ClientError) -> int:
    return int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def is_precondition_failed(error: BaseException) -> bool:
    return isinstance(error, ClientError) and (
        error_code(error) in PRECONDITION_CODES or http_status(error) == 412
    )


def is_not_found(error: ClientError) -> bool:
    return error_code(error) in NOT_FOUND_CODES


def storage_error(
    error: ClientError | BotoCoreError,
    *,
    action: str,
    path: str | None,
    bucket: str,
    endpoint: str,
    attempts: int,
) -> StorageError:
    """The typed error for a failed S3 ``action`` on ``path`` after ``attempts`` requests."""
    tries = f"after {attempts} attempt{'s' if attempts != 1 else ''}"
    if isinstance(error, ClientError):
        code, status = error_code(error), http_status(error)
        said = error.response.get("Error", {}).get("Message", "")
        answer = f"{code or 'error'} (HTTP {status})"
        if code in NOT_FOUND_CODES and path is not None:
            return StorageFileNotFound("file not found", path=path)
        if code == "NoSuchBucket":
            return StorageError(f"S3 bucket {bucket!r} does not exist ({action})", path=path)
        if code in CREDENTIAL_CODES:
            return StorageError(
                f"S3 rejected the credentials: {answer} ({action}); check the access key, "
                "secret and session token, or the AWS profile",
                path=path,
            )
        if code == "AccessDenied" or status == 403:
            return StorageError(
                f"S3 denied access: {answer} ({action}; a missing file also answers 403 "
                "without s3:ListBucket permission)",
                path=path,
            )
        if status >= 500 or code in TRANSIENT_CODES:
            return StorageUnavailable(f"S3 {action} failed {tries}: {answer}", path=path)
        text = f"S3 {action} failed: {answer}: {said}" if said else f"S3 {action} failed: {answer}"
        return StorageError(text, path=path)
    if isinstance(error, NoCredentialsError | PartialCredentialsError):
        return StorageError(
            f"no usable AWS credentials for {action}: set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, a profile, or an instance role",
            path=path,
        )
    reason = _connection_reason(error)
    if reason is not None:
        return StorageUnavailable(
            f"cannot complete S3 {action} at {endpoint} {tries}: {reason}", path=path
        )
    return StorageError(f"S3 {action} failed: {type(error).__name__}: {error}", path=path)


def _connection_reason(error: BotoCoreError) -> str | None:
    if isinstance(error, ConnectTimeoutError):
        return "connect timeout"
    if isinstance(error, ReadTimeoutError):
        return "read timeout (no answer in time)"
    if isinstance(error, ConnectionClosedError):
        return "connection closed before the answer"
    if isinstance(error, EndpointConnectionError):
        return "cannot connect to the endpoint"
    if isinstance(error, ResponseStreamingError | IncompleteReadError):
        return "connection lost while reading the answer"
    if isinstance(error, BotoConnectionError | HTTPClientError):
        return "connection failed"
    return None
