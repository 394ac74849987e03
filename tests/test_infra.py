"""infra/ agrees with the code: services, ports, databases, bucket and environment.

Docker is not run here; these checks parse docker-compose.yml, dagster.yaml, the PostgreSQL
init script and infra/local/state.env, and hold them against the settings the code reads.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml
from sqlalchemy.engine import make_url

from state_runtime import errors
from state_runtime.storage.s3 import S3Storage
from state_runtime.storage.s3_settings import ENV_ENDPOINT_URL, S3Settings

ROOT = Path(__file__).resolve().parents[1]
INFRA = ROOT / "infra"
APP_SERVICES = ("catalog-migrate", "dagster-webserver", "dagster-daemon")
LOCAL_SCRIPTS = ("start-postgres.sh", "start-s3.sh", "start-dagster.sh", "stop.sh")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((INFRA / "docker-compose.yml").read_text())
    return loaded


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = compose["services"]
    return found


@pytest.fixture(scope="module")
def app_env(services: dict[str, Any]) -> dict[str, str]:
    env: dict[str, str] = services["dagster-webserver"]["environment"]
    return env


@pytest.fixture(scope="module")
def local_env() -> dict[str, str]:
    pairs = {}
    for line in (INFRA / "local" / "state.env").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            pairs[name.strip()] = value.strip()
    return pairs


def env_names_read_by_the_code() -> set[str]:
    """Every ``STATE_*`` setting named in full as a string constant in the library or Dagster
    code (prefixes of optional override families, like ``STATE_MAINTENANCE_``, and the error
    codes of ``state_runtime.errors``, excluded)."""
    codes = {
        cls.code
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.StateStoreError)
    }
    names = set()
    for path in [
        *(ROOT / "state_runtime").rglob("*.py"),
        *(ROOT / "dagster_project").rglob("*.py"),
    ]:
        for node in ast.walk(ast.parse(path.read_text())):
            value = node.value if isinstance(node, ast.Constant) else None
            if isinstance(value, str) and re.fullmatch(r"STATE_[A-Z0-9_]*[A-Z0-9]", value):
                names.add(value)
    return names - codes


def published(service: dict[str, Any]) -> dict[int, int]:
    """Container port -> host port."""
    ports = {}
    for mapping in service.get("ports", []):
        host, _, container = str(mapping).rpartition(":")
        ports[int(container)] = int(host)
    return ports


def test_every_piece_is_a_service(services: dict[str, Any]) -> None:
    assert {"postgres", "minio", "minio-init", *APP_SERVICES} <= set(services)


def test_app_services_share_one_environment(services: dict[str, Any]) -> None:
    envs = [services[name]["environment"] for name in APP_SERVICES]
    assert all(env == envs[0] for env in envs)
    for name in ("dagster-webserver", "dagster-daemon"):
        needs = services[name]["depends_on"]
        assert needs["postgres"]["condition"] == "service_healthy"
        assert needs["minio-init"]["condition"] == "service_completed_successfully"
        assert needs["catalog-migrate"]["condition"] == "service_completed_successfully"


def test_settings_agree_with_the_code(app_env: dict[str, str], local_env: dict[str, str]) -> None:
    read = env_names_read_by_the_code()
    assert {"STATE_CATALOG_URL", ENV_ENDPOINT_URL} <= read  # the scan finds real settings
    platform = {"STATE_CATALOG_URL", "STATE_CHECKPOINT_ROOT", ENV_ENDPOINT_URL}
    assert platform <= set(app_env)
    # No misspelt setting in compose: each STATE_* name is one the code reads (the checkpoint
    # root is read by the Dagster code location and the CLI as they land).
    unknown = {n for n in app_env if n.startswith("STATE_")} - read - {"STATE_CHECKPOINT_ROOT"}
    assert not unknown, unknown
    # The env file documents every setting: the code's and compose's.
    assert read | set(app_env) <= set(local_env), (read | set(app_env)) - set(local_env)


def test_catalog_database_matches_postgres_and_its_init_script(
    services: dict[str, Any], app_env: dict[str, str]
) -> None:
    url = make_url(app_env["STATE_CATALOG_URL"])
    owner = make_url(app_env["CATALOG_OWNER_URL"])
    assert url.drivername == owner.drivername == "postgresql+psycopg2"
    assert url.host == "postgres" and url.port in published(services["postgres"])
    assert (owner.host, owner.port, owner.database) == (url.host, url.port, url.database)
    init = (INFRA / "postgres" / "init.sql").read_text()
    mount = "./postgres/init.sql:/docker-entrypoint-initdb.d/"
    assert any(str(v).startswith(mount) for v in services["postgres"]["volumes"])
    assert f"CREATE DATABASE {url.database} OWNER {owner.username}" in init
    # Dagster maintains as the maintenance role, not the owner; the owner migrates and grants
    assert url.username == "state_maintenance" != owner.username
    for role in (owner, url):
        assert f"CREATE ROLE {role.username} LOGIN PASSWORD ''{role.password}''" in init
    migrate = " ".join(services["catalog-migrate"]["command"])
    assert 'upgrade --url "$$CATALOG_OWNER_URL"' in migrate
    assert 'grants --apply --url "$$CATALOG_OWNER_URL"' in migrate


def test_dagster_storage_is_postgres_in_its_own_database(
    services: dict[str, Any], app_env: dict[str, str]
) -> None:
    config = yaml.safe_load((INFRA / "dagster.yaml").read_text())
    postgres_db = config["storage"]["postgres"]["postgres_db"]
    for field in ("hostname", "port", "username", "password", "db_name"):
        assert postgres_db[field]["env"] in app_env, field
    assert app_env[postgres_db["hostname"]["env"]] == "postgres"
    assert int(app_env[postgres_db["port"]["env"]]) in published(services["postgres"])
    dagster_db = app_env[postgres_db["db_name"]["env"]]
    assert dagster_db != make_url(app_env["STATE_CATALOG_URL"]).database
    user, password = (app_env[postgres_db[f]["env"]] for f in ("username", "password"))
    init = (INFRA / "postgres" / "init.sql").read_text()
    assert f"CREATE DATABASE {dagster_db} OWNER {user}" in init
    assert f"CREATE ROLE {user} LOGIN PASSWORD ''{password}''" in init


def test_dagster_yaml_is_a_valid_instance_config(
    app_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dagster validates the file's schema (storage included) and each class's own config."""
    from dagster._core.instance.config import dagster_instance_config
    from dagster._serdes.config_class import ConfigurableClassData

    for name, value in app_env.items():
        monkeypatch.setenv(name, value)
    config, _ = dagster_instance_config(str(INFRA))
    assert "postgres" in config["storage"]
    for section, expected in (
        ("run_coordinator", "QueuedRunCoordinator"),
        ("run_launcher", "DefaultRunLauncher"),
    ):
        entry = config[section]
        data = ConfigurableClassData(
            entry["module"], entry["class"], yaml.safe_dump(entry.get("config") or {})
        )
        assert type(data.rehydrate(object)).__name__ == expected


def test_checkpoint_bucket_and_endpoint_match_minio(
    services: dict[str, Any], app_env: dict[str, str]
) -> None:
    storage = S3Storage.from_uri(app_env["STATE_CHECKPOINT_ROOT"])
    assert storage.bucket == services["minio-init"]["environment"]["STATE_BUCKET"]
    settings = S3Settings.resolve({}, app_env)
    endpoint = urlparse(settings.endpoint_url or "")
    assert endpoint.hostname == "minio"
    assert endpoint.port in published(services["minio"])
    assert settings.effective_addressing_style == "path"  # what MinIO needs
    minio = services["minio"]["environment"]
    assert app_env["AWS_ACCESS_KEY_ID"] == minio["MINIO_ROOT_USER"]
    assert app_env["AWS_SECRET_ACCESS_KEY"] == minio["MINIO_ROOT_PASSWORD"]
    assert services["minio-init"]["environment"]["MINIO_ROOT_USER"] == minio["MINIO_ROOT_USER"]


def test_dagster_commands_use_the_image_layout(
    services: dict[str, Any], app_env: dict[str, str]
) -> None:
    dockerfile = (INFRA / "Dockerfile").read_text()
    workdir = re.search(r"^WORKDIR (\S+)", dockerfile, re.M)
    assert workdir is not None
    assert f"DAGSTER_HOME={app_env['DAGSTER_HOME']}" in dockerfile
    assert 'cp infra/dagster.yaml "$DAGSTER_HOME/dagster.yaml"' in dockerfile
    assert "pip install --no-cache-dir '.[postgres,s3,cli,dagster]'" in dockerfile  # the extras
    workspace = f"{workdir.group(1)}/workspace.yaml"
    web = services["dagster-webserver"]["command"]
    assert web[web.index("-w") + 1] == workspace
    assert int(web[web.index("-p") + 1]) in published(services["dagster-webserver"])
    daemon = services["dagster-daemon"]["command"]
    assert daemon[:2] == ["dagster-daemon", "run"] and daemon[daemon.index("-w") + 1] == workspace
    migrate = services["catalog-migrate"]["command"]
    assert migrate[:2] == ["sh", "-c"] and "python -m state_runtime.catalog upgrade" in migrate[2]


def test_local_settings_mirror_compose_on_loopback(
    services: dict[str, Any], app_env: dict[str, str], local_env: dict[str, str]
) -> None:
    catalog = make_url(local_env["STATE_CATALOG_URL"])
    in_compose = make_url(app_env["STATE_CATALOG_URL"])
    assert catalog.host == "127.0.0.1"
    assert catalog.set(host="postgres") == in_compose
    assert catalog.port == published(services["postgres"])[5432]
    endpoint = urlparse(local_env[ENV_ENDPOINT_URL])
    assert endpoint.hostname == "127.0.0.1" and endpoint.port == published(services["minio"])[9000]
    for name in ("STATE_CHECKPOINT_ROOT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert local_env[name] == app_env[name]
    assert local_env["DAGSTER_PG_DB"] == app_env["DAGSTER_PG_DB"]


@pytest.mark.parametrize("script", LOCAL_SCRIPTS)
def test_local_scripts_are_executable_bash(script: str) -> None:
    path = INFRA / "local" / script
    assert os.access(path, os.X_OK)
    subprocess.run(["bash", "-n", str(path)], check=True)
