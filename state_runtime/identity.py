"""Store identity, validated names and the checkpoint file naming scheme.

A store is (checkpoint root, operator id, partition id, store name). Its files live under
``state/<operator>/<partition>/<store name>/`` relative to the root and are named
``<version>_<checkpoint id>.delta`` or ``<version>_<checkpoint id>.snapshot``.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from enum import StrEnum

from state_runtime.errors import InvalidArgument

DEFAULT_STORE_NAME = "default"
MAX_INT = 2**31 - 1
"""The largest operator or partition id: the catalog stores them as SQL INTEGER."""
MAX_BIGINT = 2**63 - 1
"""The largest version, batch or run id: the catalog stores them as SQL BIGINT."""
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
_ID_RE = re.compile(r"^[0-9a-f]{32}$")
_FILE_RE = re.compile(
    r"^(?P<version>0|[1-9][0-9]*)_(?P<id>[0-9a-f]{32})\.(?P<kind>delta|snapshot)$"
)


class FileKind(StrEnum):
    DELTA = "delta"
    SNAPSHOT = "snapshot"


def validate_name(value: str, what: str) -> str:
    """Return ``value`` if it is a safe single path segment, else raise InvalidArgument."""
    if not isinstance(value, str) or not _NAME_RE.match(value) or value in {".", ".."}:
        raise InvalidArgument(
            f"invalid {what} {value!r}: use 1-128 characters from [A-Za-z0-9_.-], "
            "starting with a letter or digit"
        )
    if ".." in value:
        raise InvalidArgument(f"invalid {what} {value!r}: '..' is not allowed")
    return value


def validate_non_negative(value: int, what: str, maximum: int = MAX_BIGINT) -> int:
    """Return ``value`` if it is an integer from 0 to ``maximum`` (the catalog's column
    range), else raise InvalidArgument naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(f"invalid {what} {value!r}: expected an integer >= 0")
    if value > maximum:
        raise InvalidArgument(
            f"invalid {what} {value}: larger than {maximum}, the catalog's integer range"
        )
    return value


def validate_checkpoint_id(value: str) -> str:
    if not isinstance(value, str) or not _ID_RE.match(value):
        raise InvalidArgument(f"invalid checkpoint id {value!r}: expected 32 lowercase hex digits")
    return value


def new_checkpoint_id() -> str:
    """A fresh, globally unique checkpoint id (a UUID4 as 32 hex digits)."""
    return uuid.uuid4().hex


@dataclass(frozen=True, order=True)
class StoreId:
    """The identity of one state store below a checkpoint root."""

    operator_id: int
    partition_id: int
    store_name: str = DEFAULT_STORE_NAME

    def __post_init__(self) -> None:
        validate_non_negative(self.operator_id, "operator id", MAX_INT)
        validate_non_negative(self.partition_id, "partition id", MAX_INT)
        validate_name(self.store_name, "store name")

    @property
    def directory(self) -> str:
        """The store's folder, relative to the checkpoint root."""
        return f"state/{self.operator_id}/{self.partition_id}/{self.store_name}"

    def file_path(self, version: int, checkpoint_id: str, kind: FileKind) -> str:
        return f"{self.directory}/{file_name(version, checkpoint_id, kind)}"

    def __str__(self) -> str:
        return f"{self.operator_id}/{self.partition_id}/{self.store_name}"


@dataclass(frozen=True, order=True)
class CheckpointRef:
    """A committed or candidate state: (version, checkpoint id). Version 0 has no id."""

    version: int
    checkpoint_id: str | None

    def __post_init__(self) -> None:
        validate_non_negative(self.version, "version")
        if self.version == 0:
            if self.checkpoint_id is not None:
                raise InvalidArgument("version 0 is the empty store and has no checkpoint id")
        elif self.checkpoint_id is None:
            raise InvalidArgument(f"version {self.version} needs a checkpoint id")
        else:
            validate_checkpoint_id(self.checkpoint_id)

    def __str__(self) -> str:
        return f"{self.version}_{self.checkpoint_id}" if self.checkpoint_id else "0"


EMPTY = CheckpointRef(0, None)


def file_name(version: int, checkpoint_id: str, kind: FileKind) -> str:
    return f"{version}_{checkpoint_id}.{kind.value}"


@dataclass(frozen=True)
class ParsedName:
    version: int
    checkpoint_id: str
    kind: FileKind

    @property
    def ref(self) -> CheckpointRef:
        return CheckpointRef(self.version, self.checkpoint_id)


def parse_file_name(name: str) -> ParsedName | None:
    """Parse ``<version>_<id>.<kind>``; None for any other name (temporary files, strays,
    versions beyond the catalog's range)."""
    match = _FILE_RE.match(name)
    if match is None or int(match["version"]) > MAX_BIGINT:
        return None
    return ParsedName(int(match["version"]), match["id"], FileKind(match["kind"]))
