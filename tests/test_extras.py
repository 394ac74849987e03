"""The base install (store, runtime, SQLite catalog, maintenance library) works without the
optional packages; each optional part names the extra it needs when that extra is missing.

A fresh interpreter is started with the optional packages made unimportable (as in an
environment where only the base dependencies are installed) and uses the store, the catalog and
the runtime's modules for real.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPTIONAL = (
    "boto3",
    "botocore",
    "psycopg2",
    "dagster",
    "click",
    "rich",
    "matplotlib",
    "moto",
    "grpc",
    "grpc_status",
    "zstandard",
    "opentelemetry",
    "airflow",
)

BLOCK_OPTIONAL = f"""
import importlib.abc, sys

class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {OPTIONAL!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
"""


def run_without_extras(code: str, tmp_path: Path) -> str:
    script = BLOCK_OPTIONAL + textwrap.dedent(code)
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def test_the_base_dependencies_leave_the_optional_parts_to_extras() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = " ".join(project["dependencies"])
    assert not [name for name in OPTIONAL if name in base]
    extras = project["optional-dependencies"]
    assert {"postgres", "s3", "cli", "connect", "dagster", "dev"} <= set(extras)
    assert any(r.startswith("grpcio-status") for r in extras["connect"])
    assert any("psycopg2" in r for r in extras["postgres"])
    assert any("boto3" in r for r in extras["s3"])
    assert any("click" in r for r in extras["cli"]) and any("rich" in r for r in extras["cli"])
    assert any(r.startswith("dagster>") for r in extras["dagster"])
    assert any(r.startswith("opentelemetry-exporter-otlp-proto-http") for r in extras["otel"])
    # make install: everything but Airflow, which has its own environment (make install-airflow)
    assert "state-runtime[postgres,s3,cli,connect,dagster,otel,test,typing]" in extras["dev"]
    assert any(r.startswith("apache-airflow>=3") for r in extras["airflow"])
    assert "state-runtime[airflow,test,typing]" in extras["airflow-dev"]
    assert not [r for r in extras["airflow"] + extras["airflow-dev"] if "dagster" in r]


def test_store_catalog_and_runtime_work_without_the_extras(tmp_path: Path) -> None:
    out = run_without_extras(
        """
        import state_runtime.runtime, state_runtime.maintenance  # the modules executors load
        import state_runtime.runtime.datasource, state_runtime.maintenance.spark
        from state_runtime import StateStoreProvider, StoreConfig
        from state_runtime.catalog import Catalog
        from state_runtime.maintenance import MaintenancePolicy
        from state_runtime.storage import open_storage

        storage = open_storage("checkpoints")
        provider = StateStoreProvider(
            storage, 0, 0, "default", key_schema="k string", value_schema="n bigint",
            config=StoreConfig(),
        )
        store = provider.get_store(0)
        store.put(("a",), (1,))
        info = store.commit()
        fresh = StateStoreProvider(
            open_storage("checkpoints"), 0, 0, "default", key_schema="k string",
            value_schema="n bigint", config=StoreConfig(),
        )
        print(dict(fresh.get_read_store(info.version, info.checkpoint_id).items()))
        catalog = Catalog.open("sqlite:///catalog.db", upgrade=True)
        catalog.record_files(storage.uri, [info])
        print(len(catalog.stores()), MaintenancePolicy.from_env().snapshot_min_deltas)
        """,
        tmp_path,
    )
    assert out.splitlines() == ["{('a',): (1,)}", "1 10"]


def test_optional_parts_name_their_extra(tmp_path: Path) -> None:
    out = run_without_extras(
        """
        from state_runtime.catalog import Catalog
        from state_runtime.errors import StateStoreError
        from state_runtime.storage import open_storage

        for attempt in (
            lambda: open_storage("s3://bucket/prefix"),
            lambda: Catalog.open("postgresql+psycopg2://app@127.0.0.1:1/state"),
        ):
            try:
                attempt()
            except StateStoreError as exc:
                print(type(exc).__name__, exc)
        from state_runtime.runtime.spark_session import spark_session
        try:
            spark_session(remote="sc://localhost:1")
        except StateStoreError as exc:
            print(type(exc).__name__, exc)
        from state_runtime.cli import entry
        try:
            entry()
        except SystemExit as exc:
            print("exit", exc.code)
        """,
        tmp_path,
    )
    lines = out.splitlines()
    assert lines[0].startswith(
        "MissingExtra [STATE_MISSING_EXTRA] checkpoint root 's3://bucket/prefix' needs the s3"
    )
    assert "pip install 'state-runtime[s3]'" in lines[0]
    assert lines[1].startswith("InvalidCatalogUrl ")
    assert "pip install 'state-runtime[postgres]'" in lines[1]
    assert "Spark Connect (remote='sc://localhost:1') needs the connect extra" in lines[2]
    assert "pip install 'state-runtime[connect]'" in lines[2]
    assert lines[3] == "exit 2"
    assert "error: statestore needs the cli extra" in out
    assert "pip install 'state-runtime[cli]'" in out


def test_the_otel_export_names_its_extra(tmp_path: Path) -> None:
    out = run_without_extras(
        """
        from state_runtime.catalog import BatchMetrics
        from state_runtime.errors import MissingExtra
        from state_runtime.runtime.telemetry import OtelExport

        try:
            figures = BatchMetrics(1, 1, 1, 1, 1.0, 0, 1)
            OtelExport("http://127.0.0.1:1").batch("file:///r", "q", figures, [])
        except MissingExtra as exc:
            print(exc)
        """,
        tmp_path,
    )
    assert "exporting figures over OpenTelemetry needs the otel extra" in out
    assert "pip install 'state-runtime[otel]'" in out
