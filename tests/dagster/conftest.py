"""Dagster fixtures: the maintenance fixtures, resources pointing at them, an ephemeral instance."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from dagster import AssetMaterialization, AssetObservation, DagsterInstance, instance_for_test

from dagster_project.defs.checkpoints import state_checkpoints
from dagster_project.defs.resources import MaintenanceResource
from state_runtime.catalog import Catalog
from state_runtime.identity import StoreId
from state_runtime.maintenance import MaintenancePolicy, StoreNames
from tests.maintenance.conftest import (  # noqa: F401  (fixtures)
    make_stream,
    pg_catalog,
    pg_database,
    sqlite_catalog,
)
from tests.maintenance.streams import StoreStream
from tests.orchestrator_catalog import BOTH_CATALOGS, catalog  # noqa: F401  (fixture)


def store_name(stream: StoreStream, store: StoreId) -> str:
    """A store's partition key, as the discovery sensor names it (over every root)."""
    return StoreNames.of(stream.catalog).name(stream.key(store))


def resources_for(catalog: Catalog, policy: MaintenancePolicy | None = None) -> dict[str, Any]:  # noqa: F811
    url = catalog.engine.url.render_as_string(hide_password=False)
    return {"maintenance": MaintenanceResource.of(policy or MaintenancePolicy(), catalog_url=url)}


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with instance_for_test() as instance:
        yield instance


def latest_events(
    instance: DagsterInstance,
) -> dict[str, AssetMaterialization | AssetObservation]:
    """Each store's latest recorded state event: its partition's latest materialization or
    observation (a broken store's)."""
    key = state_checkpoints.key
    records = [
        *instance.fetch_materializations(key, limit=500).records,
        *instance.fetch_observations(key, limit=500).records,
    ]
    latest: dict[str, AssetMaterialization | AssetObservation] = {}
    for record in sorted(records, key=lambda r: r.storage_id):
        event = record.asset_event
        assert event is not None and record.partition_key is not None
        latest[record.partition_key] = event
    return latest


def latest_states(instance: DagsterInstance) -> dict[str, dict[str, Any]]:
    """Each store's latest recorded state, as metadata values."""
    return {
        partition: {k: v.value for k, v in event.metadata.items()}
        for partition, event in latest_events(instance).items()
    }
