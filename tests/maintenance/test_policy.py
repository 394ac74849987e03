"""Policy settings, durations and progress reporting."""

from __future__ import annotations

from datetime import timedelta

import pytest

from state_runtime.catalog import StoreKey
from state_runtime.errors import InvalidArgument, MaintenanceRefused
from state_runtime.identity import StoreId
from state_runtime.maintenance import (
    CallbackProgress,
    MaintenancePolicy,
    format_duration,
    parse_duration,
    parse_store_key,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("90", timedelta(seconds=90)),
        ("15m", timedelta(minutes=15)),
        ("1.5h", timedelta(minutes=90)),
        ("2d", timedelta(days=2)),
        ("1w", timedelta(weeks=1)),
    ],
)
def test_durations_round_trip(text: str, value: timedelta) -> None:
    assert parse_duration(text) == value
    assert parse_duration(format_duration(value)) == value


@pytest.mark.parametrize("text", ["", "1y", "-5m", "m", "1 h 2"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(InvalidArgument, match="invalid duration"):
        parse_duration(text)


def test_policy_from_the_environment() -> None:
    policy = MaintenancePolicy.from_env(
        {
            "STATE_MAINTENANCE_SNAPSHOT_MIN_DELTAS": "25",
            "STATE_MAINTENANCE_WINDOW": "2h",
            "STATE_MAINTENANCE_RETAIN_VERSIONS": "3",
            "STATE_MAINTENANCE_SNAPSHOT_MAX_RECOVERY_BYTES": "1000000",
        }
    )
    assert policy.snapshot_min_deltas == 25
    assert policy.retention.window == timedelta(hours=2)
    assert policy.retention.retain_versions == 3
    assert policy.snapshot_max_recovery_bytes == 1_000_000
    assert MaintenancePolicy.from_env({}) == MaintenancePolicy()
    with pytest.raises(InvalidArgument, match="STATE_MAINTENANCE_LAG_WARN_DELTAS='x'"):
        MaintenancePolicy.from_env({"STATE_MAINTENANCE_LAG_WARN_DELTAS": "x"})
    with pytest.raises(MaintenanceRefused, match="safety floor"):
        MaintenancePolicy.from_env({"STATE_MAINTENANCE_RETAIN_VERSIONS": "1"})


def test_store_keys_round_trip_even_with_a_hash_in_the_root() -> None:
    key = StoreKey("s3://bucket/a#b", StoreId(3, 14, "sessions"))
    assert parse_store_key(str(key)) == key
    with pytest.raises(InvalidArgument, match="invalid store"):
        parse_store_key("file:///x#0/zero/default")


def test_callback_progress_reports_start_and_end() -> None:
    seen: list[tuple[str, int, int]] = []
    progress = CallbackProgress(lambda *a: seen.append(a), interval_s=3600)
    with progress.stage("work", 3) as advance:
        for _ in range(3):
            advance(1)
    assert seen == [("work", 0, 3), ("work", 3, 3)]


def test_settings_from_an_orchestrator_are_parsed_and_named_in_errors() -> None:
    """What Dagster's resource fields and Airflow's task ``policy`` give: text or numbers."""
    policy = MaintenancePolicy().with_settings(
        {"window": "2d", "retain_versions": 3, "snapshot_min_deltas": None}, "task t policy"
    )
    assert policy.retention.window == timedelta(days=2)
    assert policy.retention.retain_versions == 3
    assert policy.snapshot_min_deltas == MaintenancePolicy().snapshot_min_deltas
    with pytest.raises(MaintenanceRefused, match=r"task t policy retain_versions=1"):
        MaintenancePolicy().with_settings({"retain_versions": 1}, "task t policy")
    with pytest.raises(InvalidArgument, match=r"task t policy window='soon'"):
        MaintenancePolicy().with_settings({"window": "soon"}, "task t policy")
    with pytest.raises(InvalidArgument, match="unknown maintenance setting"):
        MaintenancePolicy().with_settings({"windw": "1h"}, "task t policy")
