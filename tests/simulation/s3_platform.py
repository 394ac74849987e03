"""The simulated platform on S3: the query's root is a bucket on moto's server (real HTTP,
tests/s3_fixtures.py), with the same catalog, rules and invariants as on local files.

What differs is S3's own: files are objects (a corrupt file is an object written anew), and an
unfinished write is an incomplete multipart upload, which S3 dates itself (a torn write is
always fresh), and the storage's clock never steps."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import ClassVar

from state_runtime.identity import StoreId
from state_runtime.maintenance import Fleet
from state_runtime.storage import Storage
from state_runtime.storage.s3 import S3Storage
from tests.s3_fixtures import MotoS3
from tests.simulation.machine import PlatformMachine
from tests.simulation.platform import Platform


class S3Platform(Platform):
    """:class:`Platform` on a fresh bucket of ``moto`` (set by the test)."""

    moto: ClassVar[MotoS3 | None] = None

    def open_root(self) -> Storage:
        assert self.moto is not None
        return self.moto.storage(prefix=self.root_name)

    def maintenance_fleet(self) -> Fleet:
        """The root's URI names the bucket, not moto's endpoint: maintenance is handed the
        storage the driver opened."""
        return Fleet(self.catalog, owner="simulation", open_storage=lambda _: self.storage)

    def step_storage_clock(self, step: timedelta) -> None:
        """S3 dates its objects by its own clock, which the simulation cannot step."""

    def torn_write(self, partition: int, age: timedelta) -> None:
        """A multipart upload a killed writer never completed (S3 dates it: ``age`` is not
        kept)."""
        assert self.moto is not None and isinstance(self.storage, S3Storage)
        folder = StoreId(0, partition).directory
        key = f"{self.root_name}/{folder}/{uuid.uuid4().hex[:8]}.delta"
        self.moto.admin.create_multipart_upload(Bucket=self.storage.bucket, Key=key)


class S3Machine(PlatformMachine):
    platform_type = S3Platform
    root_name = "checkpoint"
