"""S3 storage against moto's real HTTP endpoint: settings, URIs, accounting, paging, batching,
multipart uploads."""

from __future__ import annotations

import pickle
from collections.abc import Callable

import pytest

from state_runtime.errors import FileAlreadyExists, InvalidArgument
from state_runtime.storage import open_storage
from state_runtime.storage.s3 import S3Storage
from state_runtime.storage.s3_settings import MIB, S3Settings
from tests.s3_fixtures import CREDENTIALS, REGION, MotoS3

pytestmark = pytest.mark.s3


# --- URIs and settings (no server needed) --------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "bucket", "prefix"),
    [
        ("s3://my-bucket", "my-bucket", ""),
        ("s3://my-bucket/", "my-bucket", ""),
        ("s3://my-bucket/ckpt/job-1/", "my-bucket", "ckpt/job-1"),
        ("s3a://my.bucket/ckpt", "my.bucket", "ckpt"),
    ],
)
def test_from_uri(uri: str, bucket: str, prefix: str) -> None:
    storage = S3Storage.from_uri(uri, region_name=REGION)
    assert (storage.bucket, storage.prefix) == (bucket, prefix)
    assert storage.uri == (f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}")


@pytest.mark.parametrize(
    "uri",
    [
        "s3://Bad_Bucket/x",
        "s3://ab/x",
        "s3://bucket/../x",
        "s3://bucket/a//b",
        "s3://bucket:9000/x",
        "s3://bucket/x?versionId=1",
        "gs://bucket/x",
        "s3:///x",
    ],
)
def test_bad_uris_are_rejected(uri: str) -> None:
    with pytest.raises(InvalidArgument):
        S3Storage.from_uri(uri)


def test_credentials_in_uris_are_rejected_without_echo() -> None:
    with pytest.raises(InvalidArgument) as caught:
        S3Storage.from_uri("s3://AKIDLEAK:SECRETLEAK@bucket/x")
    assert "SECRETLEAK" not in str(caught.value) and "AKIDLEAK" not in str(caught.value)
    with pytest.raises(InvalidArgument) as caught:
        S3Storage("bucket", endpoint_url="http://AKIDLEAK:SECRETLEAK@127.0.0.1:9000")
    assert "SECRETLEAK" not in str(caught.value) and "AKIDLEAK" not in str(caught.value)


def test_settings_from_string_options_and_environment() -> None:
    env = {"STATE_S3_ENDPOINT_URL": "http://minio:9000", "AWS_ENDPOINT_URL": "http://other:1"}
    settings = S3Settings.resolve({"max_attempts": "7", "read_timeout": "2.5"}, env)
    assert settings.max_attempts == 7 and settings.read_timeout == 2.5
    assert settings.endpoint_url == "http://minio:9000"
    assert settings.effective_addressing_style == "path"
    assert S3Settings.resolve({}, {"AWS_ENDPOINT_URL": "http://aws-env:1"}).endpoint_url == (
        "http://aws-env:1"
    )
    explicit = S3Settings.resolve({"endpoint_url": "https://s3.example"}, env)
    assert explicit.endpoint_url == "https://s3.example"
    assert S3Settings.resolve({}, {"AWS_REGION": "eu-west-1"}).region_name == "eu-west-1"
    assert S3Settings.resolve({}, {}).effective_addressing_style == "auto"


@pytest.mark.parametrize(
    "options",
    [
        {"max_attemps": 3},
        {"max_attempts": 0},
        {"max_attempts": "many"},
        {"retry_mode": "legacy"},
        {"multipart_part_size": MIB},
        {"read_timeout": 0},
        {"endpoint_url": "ftp://host"},
        {"endpoint_url": "http://host/path"},
        {"aws_secret_access_key": 12345},
    ],
)
def test_bad_settings_are_rejected(options: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument) as caught:
        S3Settings.resolve(options, {})
    assert "12345" not in str(caught.value)


def test_settings_repr_hides_credentials() -> None:
    settings = S3Settings.resolve(
        {
            "aws_access_key_id": "AKIDSHOWN",
            "aws_secret_access_key": "S3CR3T",
            "aws_session_token": "T0K",
        },
        {},
    )
    for text in (repr(settings), str(settings), repr(S3Storage("bucket", settings=settings))):
        assert "AKIDSHOWN" not in text and "S3CR3T" not in text and "T0K" not in text


# --- behaviour on the moto server ------------------------------------------------------------


def test_pickled_storage_rebuilds_its_client(moto_s3: MotoS3) -> None:
    storage = moto_s3.storage()
    storage.write_if_absent("f", b"data")
    blob = pickle.dumps(storage)
    assert b"botocore" not in blob and b"boto3" not in blob
    copy = pickle.loads(blob)
    assert copy.settings == storage.settings
    assert copy.read("f") == b"data"
    assert copy.requests.counts == {"get": 1}  # a copy counts its own requests


def test_open_storage_takes_the_endpoint_from_the_environment(
    moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = moto_s3.new_bucket()
    monkeypatch.setenv("STATE_S3_ENDPOINT_URL", moto_s3.endpoint_url)
    storage = open_storage(f"s3://{bucket}/root", region_name=REGION, **CREDENTIALS)
    storage.write_if_absent("x/y", b"via env")
    assert moto_s3.keys(bucket) == {"root/x/y"}


def test_each_operation_costs_one_request(moto_s3: MotoS3) -> None:
    storage = moto_s3.storage()
    expected: list[tuple[Callable[[], object], dict[str, int]]] = [
        (lambda: storage.write_if_absent("a/1", b"12345"), {"put": 1}),
        (lambda: storage.read("a/1"), {"get": 1}),
        (lambda: storage.exists("a/1"), {"head": 1}),
        (lambda: storage.exists("a/none"), {"head": 1}),
        (lambda: storage.size("a/1"), {"head": 1}),
        (lambda: list(storage.list("a")), {"list": 1}),
        (lambda: storage.delete(["a/1", "a/none"]), {"delete": 1}),
    ]
    for operation, counts in expected:
        storage.requests.reset()
        operation()
        assert storage.requests.counts == counts
    storage.requests.reset()
    storage.write_if_absent("a/2", b"x")
    with pytest.raises(FileAlreadyExists):
        storage.write_if_absent("a/2", b"y")
    assert storage.requests.counts == {"put": 2}  # a refused put costs no extra HEAD
    storage.read("a/2")
    assert (storage.requests.bytes_written, storage.requests.bytes_read) == (1, 1)


def test_storages_share_a_client_but_count_apart(moto_s3: MotoS3) -> None:
    one = moto_s3.storage()
    two = moto_s3.storage(bucket=one.bucket, prefix="other")
    assert one._client is two._client
    one.write_if_absent("f", b"1")
    two.write_if_absent("f", b"2")
    two.read("f")
    assert one.requests.counts == {"put": 1}
    assert two.requests.counts == {"put": 1, "get": 1}
    assert moto_s3.keys(one.bucket) == {"checkpoint/f", "other/f"}


def test_list_pages_through_more_than_1000_keys(moto_s3: MotoS3) -> None:
    storage = moto_s3.storage()
    keys = [f"checkpoint/many/{i:05d}.delta" for i in range(1234)]
    moto_s3.seed(storage.bucket, [*keys, "checkpoint/many-not/x", "checkpoint/other/y"])
    found = list(storage.list("many"))
    assert sorted(f.path for f in found) == [k.removeprefix("checkpoint/") for k in keys]
    assert all(f.size == 1 for f in found)
    assert storage.requests.counts == {"list": 2}


def test_delete_batches_1000_keys_per_request(moto_s3: MotoS3) -> None:
    storage = moto_s3.storage()
    paths = [f"old/{i:05d}" for i in range(2500)]
    present = paths[::50]  # spread over every batch; absent keys count as deleted
    moto_s3.seed(storage.bucket, [f"checkpoint/{p}" for p in [*present, "keep/me"]])
    result = storage.delete([*paths, *present])  # duplicates are sent once
    assert result.failed == {}
    assert sorted(result.deleted) == paths
    assert storage.requests.counts == {"delete": 3}
    assert moto_s3.keys(storage.bucket) == {"checkpoint/keep/me"}


def test_invalid_path_in_a_delete_deletes_nothing(moto_s3: MotoS3) -> None:
    storage = moto_s3.storage()
    storage.write_if_absent("a", b"x")
    with pytest.raises(InvalidArgument):
        storage.delete(["a", "../escape"])
    assert storage.exists("a")


def test_multipart_upload_of_a_large_payload(moto_s3: MotoS3) -> None:
    storage = moto_s3.storage(multipart_threshold=MIB, multipart_part_size=5 * MIB)
    data = bytes(range(256)) * (12 * MIB // 256) + b"tail"
    storage.write_if_absent("big/1_x.snapshot", data)
    assert storage.requests.counts == {"multipart": 5}  # create, 3 parts, complete
    assert storage.read("big/1_x.snapshot") == data
    assert moto_s3.pending_uploads(storage.bucket) == []

    storage.requests.reset()
    with pytest.raises(FileAlreadyExists):
        storage.write_if_absent("big/1_x.snapshot", b"other" * MIB)
    assert storage.requests.counts == {"multipart": 4}  # create, 1 part, complete, abort
    assert moto_s3.pending_uploads(storage.bucket) == []
    assert storage.read("big/1_x.snapshot") == data


def test_small_payloads_below_the_threshold_use_one_put(moto_s3: MotoS3) -> None:
    storage = moto_s3.storage(multipart_threshold=MIB)
    storage.write_if_absent("small", b"x" * (MIB - 1))
    assert storage.requests.counts == {"put": 1}
