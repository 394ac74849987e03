"""The one place secrets are masked: patterns, registered values, errors and log records."""

from __future__ import annotations

import logging

import pytest

from state_runtime.errors import CatalogUnavailable, StorageError
from state_runtime.redaction import MASK, get_logger, redact, register_secret
from state_runtime.storage.s3_settings import S3Settings


@pytest.mark.parametrize(
    ("text", "secret", "kept"),
    [
        ("postgresql+psycopg2://app:s3cr3t-pw@db:5432/state", "s3cr3t-pw", "app:***@db"),
        ("postgresql://app:p@ss-w0rd@db/state", "ss-w0rd", "app:***@db/state"),
        (
            "at postgresql+psycopg2://u@h/db?password=qs-secret&sslmode=require",
            "qs-secret",
            "sslmode=require",
        ),
        ("host=db user=app password=dsn-secret dbname=x", "dsn-secret", "dbname=x"),
        ("options sslpassword='quoted secret' port=5", "quoted secret", "port=5"),
        ("s3://AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI@bucket/p", "wJalrXUtnFEMI", "bucket/p"),
        ("key AKIAIOSFODNN7EXAMPLE was refused", "AKIAIOSFODNN7EXAMPLE", "was refused"),
        (
            "https://b.s3.amazonaws.com/k?X-Amz-Signature=abc123&X-Amz-Security-Token=tok-9",
            "tok-9",
            "b.s3.amazonaws.com/k",
        ),
    ],
)
def test_patterns_mask_secrets_and_keep_the_rest(text: str, secret: str, kept: str) -> None:
    masked = redact(text)
    assert secret not in masked and MASK in masked and kept in masked


def test_text_without_secrets_is_unchanged() -> None:
    for text in (
        "cannot connect to postgresql+psycopg2://postgres@127.0.0.1:5432/db",
        "file=state/0/0/default/1_ab.delta (store=0/0/default, version=3, checkpoint_id=ab)",
        "http://minio:9000 refused",
    ):
        assert redact(text) == text


def test_registered_and_environment_secrets_are_masked_anywhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    register_secret("registered/secret@x")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "session-token-value")
    text = "a registered/secret@x, registered%2Fsecret%40x and session-token-value appear"
    assert redact(text) == f"a {MASK}, {MASK} and {MASK} appear"
    register_secret("ab")  # too short to mask by value: it would garble every message
    assert redact("about") == "about"


def test_explicit_s3_credentials_never_appear_in_errors() -> None:
    settings = S3Settings(
        aws_access_key_id="AKIA0000EXAMPLE00000", aws_secret_access_key="x-secret-key-1"
    )
    assert "x-secret-key-1" not in repr(settings)
    error = StorageError("S3 said: bad signature for x-secret-key-1", path="state/x")
    assert "x-secret-key-1" not in str(error) and "x-secret-key-1" not in error.reason


def test_errors_mask_their_message_and_path() -> None:
    error = CatalogUnavailable(
        "cannot reach postgresql+psycopg2://u:err-secret@db/x", path="s3://k:path-secret@b/p"
    )
    assert "err-secret" not in str(error) and "path-secret" not in str(error)
    assert error.retryable


def test_library_log_records_are_masked(caplog: pytest.LogCaptureFixture) -> None:
    log = get_logger("state_runtime.test_redaction")
    with caplog.at_level(logging.WARNING):
        log.warning("retrying %s", "postgresql+psycopg2://u:log-secret@db/x")
    assert "log-secret" not in caplog.text and "u:***@db" in caplog.text
