"""Exit codes for roots that are malformed or whose folder is gone.

``health`` (a monitor command: 3 means "cannot tell") once exited 2, "broken", for a
malformed ``--root``: the group resolved the root before the command's own error handling.
``maintain`` and ``reconcile`` once exited 0 for a root whose folder was moved away: they
maintained an empty folder and reported success. Now such a root is set aside with a typed
error naming the folder (exit 1), and its catalog rows are left alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta

import pytest

from state_runtime.errors import RootMissing
from state_runtime.maintenance import (
    Fleet,
    MaintenancePolicy,
    SnapshotStatus,
    cleanup_pass,
    reconcile,
    snapshot_pass,
)
from state_runtime.retention import RetentionPolicy
from tests.maintenance.streams import StoreStream
from tests.maintenance.test_cli import statestore


@pytest.mark.parametrize("command", ["health", "status"])
@pytest.mark.parametrize("root", ["s3://b/x", "hdfs://n/x", "file://host/x", "file:///a/%FF"])
def test_a_malformed_root_is_unknown_to_a_monitor(
    make_stream: Callable[..., StoreStream], command: str, root: str
) -> None:
    stream = make_stream()
    stream.run(1)
    result = statestore(stream, "--root", root, command)
    assert result.exit_code == 3, result.output
    assert "error: [STATE_INVALID_ARGUMENT] " in result.stderr, result.stderr
    # every other command still calls it bad input
    assert statestore(stream, "--root", root, "validate").exit_code == 2


@pytest.mark.parametrize("command", [("maintain", "--execute"), ("reconcile",), ("validate",)])
def test_a_root_whose_folder_is_gone_fails_naming_the_folder(
    make_stream: Callable[..., StoreStream], command: tuple[str, ...]
) -> None:
    stream = make_stream()
    stream.run(3)
    folder = stream.storage.root
    folder.rename(folder.with_name("moved"))
    stores = stream.catalog.stores()
    for args in (command, ("--root", stream.root, *command)):
        result = statestore(stream, *args)
        assert result.exit_code == 1, result.output
        assert (
            f"error: root {stream.root} was not maintained (some work failed): "
            f"[STATE_ROOT_MISSING] checkpoint root {stream.root}: folder {folder} does not exist"
        ) in " ".join(result.stderr.split()), result.stderr
    assert stream.catalog.stores() == stores
    assert not folder.exists()  # nothing was written at the old place


def test_a_root_registered_before_its_first_file_is_not_missing(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = make_stream()  # stores registered, nothing committed: no folder yet
    assert not stream.storage.root.exists()
    for command in (("maintain", "--execute"), ("reconcile",), ("validate",)):
        result = statestore(stream, *command)
        assert result.exit_code == 0, result.output


def test_the_passes_themselves_refuse_a_root_whose_folder_is_gone(
    make_stream: Callable[..., StoreStream],
) -> None:
    """As Dagster and Airflow call them, with no command to set the root aside: cleanup
    refuses the root rather than record the absent folder's files as deleted, and
    reconciliation sets it aside by name."""
    stream = make_stream()
    stream.run(12)
    fleet = Fleet(stream.catalog, owner="tests")
    snapshots = snapshot_pass(fleet, MaintenancePolicy(snapshot_min_deltas=5))
    assert snapshots.count(SnapshotStatus.WRITTEN) == len(stream.stores)  # deltas superseded
    folder = stream.storage.root
    folder.rename(folder.with_name("moved"))
    fleet = Fleet(stream.catalog, owner="tests")
    zero = RetentionPolicy(window=timedelta(0), orphan_grace=timedelta(0))
    policy = MaintenancePolicy(retention=zero, min_window=timedelta(0))
    with pytest.raises(RootMissing, match=rf"folder {re.escape(str(folder))} does not exist"):
        cleanup_pass(fleet, policy, dry_run=False)
    reconciled = reconcile(fleet, policy, dry_run=False)  # it sweeps root by root
    assert "[STATE_ROOT_MISSING]" in fleet.failed_roots[stream.root]
    assert reconciled.recorded == {} and stream.catalog.deletion_history() == []
