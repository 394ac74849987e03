"""Every typed error has its own stable code (like Spark's error classes): unique, pinned here
so that a change is deliberate, shown at the start of every message and in ``--json``; and a
refusal names the value it was given and the limit it broke."""

from __future__ import annotations

import inspect
import json
import pickle
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from state_runtime import errors
from state_runtime.cli import main
from state_runtime.errors import (
    CheckpointFileCorrupt,
    InvalidArgument,
    MaintenanceRefused,
    StateStoreError,
)
from state_runtime.maintenance import MaintenancePolicy
from state_runtime.retention import RetentionPolicy
from state_runtime.storage import LocalStorage

from .store_helpers import commit_rows, provider_for

# Released codes never change: scripts and alerts match on them. Add a line for a new error.
CODES = {
    "StateStoreError": "STATE_ERROR",
    "InvalidArgument": "STATE_INVALID_ARGUMENT",
    "MissingExtra": "STATE_MISSING_EXTRA",
    "SchemaMismatch": "STATE_SCHEMA_MISMATCH",
    "QueryRefused": "STATE_QUERY_REFUSED",
    "StoreClosed": "STATE_STORE_CLOSED",
    "CannotLoadState": "STATE_CANNOT_LOAD",
    "CheckpointFileMissing": "STATE_CHECKPOINT_FILE_MISSING",
    "CheckpointFileCorrupt": "STATE_CHECKPOINT_FILE_CORRUPT",
    "UnexpectedVersion": "STATE_CHECKPOINT_FILE_MISLABELLED",
    "LineageBroken": "STATE_LINEAGE_BROKEN",
    "UnknownCheckpointId": "STATE_UNKNOWN_CHECKPOINT_ID",
    "StateLost": "STATE_LOST",
    "ChangesCleanedUp": "STATE_CHANGES_CLEANED_UP",
    "CannotCommit": "STATE_CANNOT_COMMIT",
    "StorageError": "STATE_STORAGE_FAILED",
    "FileAlreadyExists": "STATE_STORAGE_FILE_EXISTS",
    "StorageFileNotFound": "STATE_STORAGE_FILE_NOT_FOUND",
    "StorageUnavailable": "STATE_STORAGE_UNAVAILABLE",
    "WorkerProcessLost": "STATE_WORKER_PROCESS_LOST",
    "RootMissing": "STATE_ROOT_MISSING",
    "CatalogError": "STATE_CATALOG_FAILED",
    "CatalogUnavailable": "STATE_CATALOG_UNAVAILABLE",
    "CatalogTimeout": "STATE_CATALOG_TIMEOUT",
    "CatalogMisconfigured": "STATE_CATALOG_MISCONFIGURED",
    "CatalogPermissionDenied": "STATE_CATALOG_PERMISSION_DENIED",
    "CatalogReadOnly": "STATE_CATALOG_READ_ONLY",
    "InvalidCatalogUrl": "STATE_CATALOG_URL_INVALID",
    "CatalogSchemaOutdated": "STATE_CATALOG_SCHEMA_OUTDATED",
    "CatalogSchemaTooNew": "STATE_CATALOG_SCHEMA_TOO_NEW",
    "CommitConflict": "STATE_COMMIT_CONFLICT",
    "BatchOutOfOrder": "STATE_BATCH_OUT_OF_ORDER",
    "AttemptSuperseded": "STATE_ATTEMPT_SUPERSEDED",
    "MaintenanceRefused": "STATE_MAINTENANCE_REFUSED",
    "LocalDiskFull": "STATE_LOCAL_DISK_FULL",
    "LocalRunDamaged": "STATE_LOCAL_RUN_DAMAGED",
}


def error_classes() -> dict[str, type[StateStoreError]]:
    return {
        name: cls
        for name, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, StateStoreError)
    }


def test_every_error_has_its_own_pinned_code() -> None:
    classes = error_classes()
    assert {name: cls.code for name, cls in classes.items()} == CODES
    for name, cls in classes.items():
        assert "code" in vars(cls), f"{name} inherits its parent's code"
    assert len(set(CODES.values())) == len(CODES)


def test_a_real_corrupt_file_names_its_code(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    info = commit_rows(provider_for(storage), None, {"a": 1})
    data = bytearray(storage.read(info.path))
    data[len(data) // 2] ^= 0xFF
    storage.delete([info.path])
    storage.write_if_absent(info.path, bytes(data))
    with pytest.raises(CheckpointFileCorrupt) as err:
        provider_for(storage).get_read_store(1, info.checkpoint_id)
    assert str(err.value).startswith("[STATE_CHECKPOINT_FILE_CORRUPT] ")
    details = err.value.details()
    assert details["code"] == "STATE_CHECKPOINT_FILE_CORRUPT" and details["file"] == info.path
    assert details["version"] == 1 and not details["retryable"]


def test_json_output_carries_the_code(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'absent.db'}"
    runner = CliRunner(env={"STATE_CATALOG_URL": None})
    result = runner.invoke(main, ["--catalog-url", url, "history", "--json"])
    assert result.exit_code == 4
    shown = json.loads(result.stdout)["error"]
    assert shown["code"] == "STATE_CATALOG_SCHEMA_OUTDATED" and "no schema yet" in shown["message"]
    assert "error: [STATE_CATALOG_SCHEMA_OUTDATED] " in result.stderr
    plain = runner.invoke(main, ["--catalog-url", url, "history"])
    assert plain.exit_code == 4 and plain.stdout == ""
    monitor = runner.invoke(main, ["--catalog-url", url, "health"])
    assert monitor.exit_code == 3 and "STATE_CATALOG_SCHEMA_OUTDATED" in monitor.stderr


def test_a_refusal_names_the_value_and_the_limit() -> None:
    with pytest.raises(InvalidArgument) as err:
        MaintenancePolicy(lag_warn_deltas=0)
    assert str(err.value) == ("[STATE_INVALID_ARGUMENT] lag_warn_deltas must be at least 1, got 0")


def test_a_refusal_carries_the_value_and_the_limit_as_fields() -> None:
    """A program reads what was refused without parsing words: the setting, the value and the
    limit are fields, in ``details()`` (``--json``), kept when the error is relabelled with
    the variable that set the value, and through pickling (an executor's error reaches the
    driver whole)."""
    with pytest.raises(MaintenanceRefused) as floor:
        MaintenancePolicy.from_env({"STATE_MAINTENANCE_RETAIN_VERSIONS": "1"})
    assert "STATE_MAINTENANCE_RETAIN_VERSIONS='1'" in str(floor.value)
    assert (floor.value.setting, floor.value.value, floor.value.limit) == ("retain_versions", 1, 2)
    policy = MaintenancePolicy(retention=RetentionPolicy(window=timedelta(minutes=5)))
    with pytest.raises(MaintenanceRefused) as short:
        policy.check_retention()
    details = short.value.details()
    assert (details["setting"], details["value"], details["limit"]) == ("window", 300.0, 600.0)
    again = pickle.loads(pickle.dumps(short.value))
    assert isinstance(again, MaintenanceRefused) and again.details() == details
