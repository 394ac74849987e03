"""No secret in anything Dagster stores: events, errors, metadata, run config and run tags.

The catalog URL carries a password, as in production, through ``STATE_CATALOG_URL`` (the
code location's own resources read it at run time, never as resource config). Every record
of the runs, failed and successful, is serialized and searched for the password.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest
from dagster import DagsterInstance, Definitions, materialize, serialize_value

from dagster_project.definitions import resources
from dagster_project.defs.assets import state_retention_cleanup, state_store_health
from state_runtime.catalog import Catalog
from tests.catalog.conftest import PG_HOST, PG_PORT, PG_USER
from tests.maintenance.streams import StoreStream

SECRET = "sekret-d4gster-pw"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def everything_recorded(instance: DagsterInstance, run_id: str) -> str:
    """Every event (messages, errors with their causes, metadata), the run's config and tags."""
    run = instance.get_run_by_id(run_id)
    assert run is not None
    events = [serialize_value(entry) for entry in instance.all_logs(run_id)]
    return "\n".join([*events, serialize_value(run.run_config), repr(run.tags)])


def test_the_code_location_shows_no_password(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the Dagster UI shows of the code location: its repository snapshot, resources'
    configured values included."""
    monkeypatch.setenv("STATE_CATALOG_URL", f"postgresql+psycopg2://app:{SECRET}@db/state")
    from dagster._core.remote_representation.external_data import RepositorySnap

    defs = Definitions(assets=[state_store_health], resources=resources())
    snapshot = serialize_value(RepositorySnap.from_def(defs.get_repository_def()))
    assert "maintenance" in snapshot and SECRET not in snapshot


def test_a_failing_catalog_leaves_no_password_in_dagster(
    instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"postgresql+psycopg2://{PG_USER}:{SECRET}@127.0.0.1:{free_port()}/x?password={SECRET}"
    monkeypatch.setenv("STATE_CATALOG_URL", url)
    monkeypatch.setenv("STATE_CATALOG_CONNECT_TIMEOUT", "2s")
    result = materialize(
        [state_store_health], resources=resources(), instance=instance, raise_on_error=False
    )
    assert not result.success
    recorded = everything_recorded(instance, result.run_id)
    assert "STATE_CATALOG_UNAVAILABLE" in recorded and "cannot connect to the catalog" in recorded
    assert SECRET not in recorded


@pytest.mark.postgres
@pytest.mark.parametrize("catalog", ["postgresql"], indirect=True)
def test_a_working_catalog_leaves_no_password_in_dagster(
    make_stream: Callable[..., StoreStream],
    catalog: Catalog,
    instance: DagsterInstance,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stream = make_stream()
    stream.run(3)
    database = catalog.engine.url.database
    # trust authentication ignores the password, which the URL still carries everywhere
    monkeypatch.setenv(
        "STATE_CATALOG_URL",
        f"postgresql+psycopg2://{PG_USER}:{SECRET}@{PG_HOST}:{PG_PORT}/{database}",
    )
    for asset in (state_store_health, state_retention_cleanup):
        result = materialize([asset], resources=resources(), instance=instance)
        assert result.success
        recorded = everything_recorded(instance, result.run_id)
        assert "catalog_run_id" in recorded or "stores_table" in recorded
        assert SECRET not in recorded
