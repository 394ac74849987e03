"""Airflow fixtures: a real Airflow home and metadata database (a SQLite file, migrated once per
session), the provider's DAG folder, and the catalog and storage connections of a test.

Airflow reads its configuration when first imported, so the environment is set here, before
anything imports it. These tests run in the Airflow environment (``make test-airflow``).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "state_runtime_airflow" / "dags"
HOME = Path(tempfile.mkdtemp(prefix="airflow-home-"))
# Registered before Airflow is imported, so it runs after Airflow's own exit handlers (which
# write its logs folder again).
atexit.register(shutil.rmtree, HOME, True)

os.environ.update(
    {
        "AIRFLOW_HOME": str(HOME),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{HOME / 'airflow.db'}",
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
    }
)

from state_runtime.catalog import Catalog  # noqa: E402
from tests.maintenance.conftest import (  # noqa: E402, F401  (fixtures)
    make_stream,
    pg_catalog,
    pg_database,
    sqlite_catalog,
)
from tests.orchestrator_catalog import BOTH_CATALOGS, catalog  # noqa: E402, F401  (fixture)
from tests.s3_fixtures import CREDENTIALS, REGION, MotoS3  # noqa: E402


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """Airflow's metadata database, migrated to Airflow's head: a SQLite file of its own."""
    from airflow.utils import db

    db.resetdb(skip_init=False)
    return HOME / "airflow.db"


def connection_env(catalog: Catalog, moto: MotoS3 | None = None) -> dict[str, str]:  # noqa: F811
    """``AIRFLOW_CONN_*`` variables: the catalog's URL split into a connection's fields, and
    the S3 endpoint and credentials as an ``aws`` connection (how a deployment defines them)."""
    url = catalog.engine.url
    if url.get_backend_name() == "sqlite":
        conn = {"conn_type": "sqlite", "schema": url.database}
    else:
        conn = {
            "conn_type": "postgres",
            "host": url.host,
            "port": url.port,
            "login": url.username,
            "password": url.password,
            "schema": url.database,
        }
    found = {"AIRFLOW_CONN_STATE_CATALOG_DEFAULT": json.dumps(conn)}
    if moto is not None:
        storage = {
            "conn_type": "aws",
            "login": CREDENTIALS["aws_access_key_id"],
            "password": CREDENTIALS["aws_secret_access_key"],
            "extra": {"endpoint_url": moto.endpoint_url, "region_name": REGION},
        }
        found["AIRFLOW_CONN_STATE_STORAGE_DEFAULT"] = json.dumps(storage)
    return found


@pytest.fixture
def connections(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A test's connections and maintenance policy come from the environment only."""
    for name in list(os.environ):
        if name.startswith(("AIRFLOW_CONN_", "STATE_MAINTENANCE_", "STATE_S3_", "AWS_")):
            monkeypatch.delenv(name)
    yield
