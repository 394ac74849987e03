"""Hostile input to ``statestore``: every row gets its documented exit code and one clear
line, no traceback, no file written outside the places it may touch, no secret in any output.

Rows run through click's runner in a scratch working directory; a few run the installed
``statestore`` script in a real process, to show the entry point itself prints no traceback.
"""

from __future__ import annotations

import shlex
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from state_runtime.catalog import Catalog
from state_runtime.catalog.connection.engine import create_catalog_engine
from state_runtime.catalog.schema.revision import upgrade
from state_runtime.cli import main
from state_runtime.cli.exits import EXIT_FAILED, EXIT_REFUSED, EXIT_USAGE, MONITOR_UNKNOWN
from state_runtime.identity import StoreId
from tests.catalog.conftest import PG_HOST, PG_PORT, PG_USER, pg_database  # noqa: F401
from tests.catalog.factory import Stream, info

AWS_KEY_ID = "AKIAIOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Place:
    """A scratch area: a working directory, a checkpoint root and a catalog with stores."""

    base: Path

    @property
    def work(self) -> Path:
        return self.base / "work"

    @property
    def root(self) -> Path:
        return self.base / "root"

    @property
    def catalog(self) -> Path:
        return self.base / "catalog"

    @property
    def url(self) -> str:
        return f"sqlite:///{self.catalog / 'catalog.db'}"

    def files(self) -> set[str]:
        return {p.relative_to(self.base).as_posix() for p in self.base.rglob("*")}


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Place:
    """Two stores recorded below ``root`` in a SQLite catalog; a newer-schema catalog too."""
    here = Place(tmp_path_factory.mktemp("hostile"))
    for folder in (here.work, here.root, here.catalog):
        folder.mkdir()
    with Catalog.open(here.url, upgrade=True) as catalog:
        Stream(catalog, [StoreId(0, 0), StoreId(0, 1)], root=here.root.as_uri()).run(3)
    newer = create_catalog_engine(f"sqlite:///{here.catalog / 'newer.db'}")
    upgrade(newer)
    with newer.begin() as connection:
        connection.execute(sa.text("UPDATE alembic_version SET version_num = '9999_future'"))
    newer.dispose()
    return here


@dataclass(frozen=True)
class Row:
    """One hostile input: ``{root}``, ``{url}``, ``{base}``, ``{port}`` are filled in."""

    name: str
    args: tuple[str, ...]
    code: int
    says: str
    env: dict[str, str] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()


def row(
    name: str,
    args: str,
    code: int,
    says: str,
    env: dict[str, str] | None = None,
    secrets: tuple[str, ...] = (),
) -> Row:
    """A row whose command line is written as a shell would split it."""
    return Row(name, tuple(shlex.split(args)), code, says, env or {}, secrets)


ROWS = [
    # --- roots ------------------------------------------------------------------------------
    row("ftp root", "--root ftp://host/x validate", EXIT_USAGE, "unsupported checkpoint root"),
    row(
        "s3 root with keys",
        f"--root s3://{AWS_KEY_ID}:{AWS_SECRET}@bucket/p validate",
        EXIT_USAGE,
        "must not contain credentials",
        secrets=(AWS_SECRET, AWS_KEY_ID),
    ),
    row(
        "file root with password",
        "--root file://admin:hunter2-pass@host/x validate",
        EXIT_USAGE,
        "holds no credentials",
        secrets=("hunter2-pass",),
    ),
    row("file root of another host", "--root file://host/x validate", EXIT_USAGE, "no host"),
    row("dot-dot root", "--root ../escape validate", EXIT_USAGE, "'..' is not allowed"),
    row("root with a query", "--root s3://bucket/p?x=1 validate", EXIT_USAGE, "no port, query"),
    row("control characters", "--root '/tmp/a\nb' validate", EXIT_USAGE, "control characters"),
    row(
        "root with nothing recorded",
        "--root {base}/does-not-exist validate",
        EXIT_USAGE,
        "nothing is recorded below file://",
    ),
    # --- names and ids ----------------------------------------------------------------------
    row("store traversal", "validate --store {root}#0/0/../../etc", EXIT_USAGE, "invalid store"),
    row(
        "operator id past INTEGER",
        "validate --store {root}#2147483648/0/default",
        EXIT_USAGE,
        "catalog's integer range",
    ),
    row(
        "partition id past BIGINT",
        "validate --store {root}#0/99999999999999999999999/default",
        EXIT_USAGE,
        "catalog's integer range",
    ),
    row("store name with a slash", "validate --store {root}#0/0/a/b", EXIT_USAGE, "invalid store"),
    row(
        "explain traversal",
        "--root {root} explain ../../etc/passwd",
        EXIT_USAGE,
        "below none of the catalog's roots",
    ),
    # --- catalog URLs -----------------------------------------------------------------------
    row(
        "plain postgresql URL",
        "--catalog-url postgresql://postgres:sekret-plain@127.0.0.1/x validate",
        EXIT_USAGE,
        "use postgresql+psycopg2://",
        secrets=("sekret-plain",),
    ),
    row(
        "postgres scheme",
        "--catalog-url postgres://postgres@127.0.0.1/x validate",
        EXIT_USAGE,
        "postgresql+psycopg2://",
    ),
    row(
        "unescaped @ in the password",
        "--catalog-url postgresql+psycopg2://u:p@ss-w0rd@127.0.0.1/x validate",
        EXIT_USAGE,
        "percent-encode it as %40",
        secrets=("ss-w0rd",),
    ),
    row(
        "non-numeric port",
        "--catalog-url postgresql+psycopg2://u:sekret-port@127.0.0.1:abc/x validate",
        EXIT_USAGE,
        "the port must be a number",
        secrets=("sekret-port",),
    ),
    row(
        "unsupported database",
        "--catalog-url mysql://u:sekret-my@h/db validate",
        EXIT_USAGE,
        "unsupported database 'mysql'",
        secrets=("sekret-my",),
    ),
    row("not a URL", "--catalog-url not-a-url validate", EXIT_USAGE, "not a valid SQLAlchemy URL"),
    row(
        "password in the query, server down",
        "--catalog-url postgresql+psycopg2://postgres@127.0.0.1:{port}/x?password=sekret-q history",
        EXIT_FAILED,
        "cannot connect to the catalog",
        secrets=("sekret-q",),
    ),
    row(
        "missing SQLite folder",
        "--catalog-url sqlite:///{base}/nowhere/catalog.db validate",
        EXIT_FAILED,
        "has no schema yet",
    ),
    row(
        "newer schema",
        "--catalog-url sqlite:///{base}/catalog/newer.db validate",
        EXIT_FAILED,
        "9999_future, which this version of state_runtime does not know",
    ),
    # --- settings from the environment ------------------------------------------------------
    row(
        "garbage duration variable",
        "validate",
        EXIT_USAGE,
        "STATE_MAINTENANCE_WINDOW='soon'",
        env={"STATE_MAINTENANCE_WINDOW": "soon"},
    ),
    row(
        "variable below the floor",
        "validate",
        EXIT_REFUSED,
        "STATE_MAINTENANCE_RETAIN_VERSIONS='1': retaining 1 version(s) is below the safety floor",
        env={"STATE_MAINTENANCE_RETAIN_VERSIONS": "1"},
    ),
    row(
        "misspelt variable",
        "validate",
        EXIT_USAGE,
        "unknown setting(s) STATE_MAINTENANCE_RETAIN",
        env={"STATE_MAINTENANCE_RETAIN": "5"},
    ),
    row(
        "huge number variable",
        "validate",
        EXIT_USAGE,
        "is out of range",
        env={"STATE_MAINTENANCE_LAG_WARN_DELTAS": "99999999999999999999"},
    ),
    row(
        "garbage catalog timeout",
        "validate",
        EXIT_USAGE,
        "STATE_CATALOG_STATEMENT_TIMEOUT='forever'",
        env={"STATE_CATALOG_STATEMENT_TIMEOUT": "forever"},
    ),
    row(
        "plain URL in the environment",
        "validate",
        EXIT_USAGE,
        "names no driver",
        env={"STATE_CATALOG_URL": "postgresql://app:sekret-env@db/state"},
        secrets=("sekret-env",),
    ),
    row(
        "S3 endpoint with credentials",
        "--root s3://bucket/p validate",
        EXIT_USAGE,
        "must not contain credentials",
        env={"STATE_S3_ENDPOINT_URL": f"http://{AWS_KEY_ID}:{AWS_SECRET}@minio:9000"},
        secrets=(AWS_SECRET, AWS_KEY_ID),
    ),
    # --- command-line options ---------------------------------------------------------------
    row("retain 0", "maintain --retain-versions 0", EXIT_REFUSED, "--retain-versions 0: "),
    row("retain 1", "maintain --retain-versions 1", EXIT_REFUSED, "below the safety floor of 2"),
    row("retain negative", "maintain --retain-versions -3", EXIT_REFUSED, "--retain-versions -3"),
    row("retain huge", "maintain --retain-versions 99999999999", EXIT_USAGE, "--retain-versions"),
    row(
        "zero window, default minimum",
        "maintain --execute --window 0s",
        EXIT_REFUSED,
        "retention window 0s is shorter than the configured minimum of 10m",
    ),
    row("century window", "maintain --window 9999999w", EXIT_USAGE, "longer than 100 years"),
    row("negative window", "maintain --window -5m", EXIT_USAGE, "invalid duration '-5m'"),
    row("zero deltas", "maintain --min-deltas 0", EXIT_USAGE, "--min-deltas"),
    row("zero limit", "history --limit 0", EXIT_USAGE, "--limit"),
    row("unknown sort", "health --sort rows", MONITOR_UNKNOWN, "--sort"),  # monitors: 3
    row("unknown command", "vacuum", EXIT_USAGE, "No such command 'vacuum'"),
]
POSTGRES_ROWS = [
    row(
        "database does not exist",
        f"--catalog-url postgresql+psycopg2://{PG_USER}:sekret-db@{PG_HOST}:{PG_PORT}/"
        f"no_such_db_{uuid.uuid4().hex[:8]} validate",
        EXIT_FAILED,
        "does not exist",
        secrets=("sekret-db",),
    ),
]


def command_line(case: Row, place: Place) -> list[str]:
    """The row's arguments filled in, with the scratch catalog unless the row names one."""
    args = [
        a.format(root=place.root.as_uri(), base=place.base, url=place.url, port=free_port())
        for a in case.args
    ]
    if "--catalog-url" not in args and "STATE_CATALOG_URL" not in case.env:
        args = ["--catalog-url", place.url, *args]
    return ["-q", *args]


@pytest.fixture
def cli(place: Place, monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRunner]:
    monkeypatch.chdir(place.work)
    for name in ("STATE_CATALOG_URL", "STATE_S3_ENDPOINT_URL", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    yield CliRunner(env={"COLUMNS": "200"})


def check(place: Place, case: Row, code: int, stdout: str, stderr: str, before: set[str]) -> None:
    everything = stdout + stderr
    assert code == case.code, everything
    assert case.says in stderr, everything
    assert "Traceback" not in everything
    errors = [line for line in stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: "), errors
    for secret in case.secrets:
        assert secret not in everything
    # Nothing new anywhere but the catalog's own SQLite side files (-wal, -shm).
    new = place.files() - before
    assert all(path.startswith("catalog/catalog.db") for path in new), new


@pytest.mark.parametrize(
    "case",
    [*ROWS, *(pytest.param(r, marks=pytest.mark.postgres) for r in POSTGRES_ROWS)],
    ids=lambda r: r.name,
)
def test_hostile_input(
    case: Row, place: Place, cli: CliRunner, request: pytest.FixtureRequest
) -> None:
    if case in POSTGRES_ROWS:
        request.getfixturevalue("pg_database")  # the server must be up (CI: or fail)
    before = place.files()
    result = cli.invoke(main, command_line(case, place), env=case.env)
    check(place, case, result.exit_code, result.stdout, result.stderr, before)


PROCESS_ROWS = [
    r
    for r in ROWS
    if r.name
    in {"s3 root with keys", "unescaped @ in the password", "password in the query, server down"}
]


@pytest.mark.parametrize("case", PROCESS_ROWS, ids=lambda r: r.name)
def test_hostile_input_to_the_installed_script(case: Row, place: Place) -> None:
    """The real entry point, in its own process: no traceback there either."""
    script = Path(sys.executable).with_name("statestore")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(place.work), **case.env}
    before = place.files()
    done = subprocess.run(
        [str(script), *command_line(case, place)],
        cwd=place.work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    check(place, case, done.returncode, done.stdout, done.stderr, before)


def test_zero_durations_mean_zero(tmp_path: Path) -> None:
    """``--window 0s --orphan-grace 0s --min-window 0s`` mean zero, not the defaults: a
    attempt written a moment ago is an orphan cleanup may take at once."""
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    (tmp_path / "root").mkdir()  # a root whose folder is gone is refused (RootMissing)
    root = (tmp_path / "root").as_uri()
    store = StoreId(0, 0)
    now = datetime.now(UTC)
    with Catalog.open(url, upgrade=True) as catalog:
        stream = Stream(catalog, [store], root=root)
        stream.run(2, created_at=now)
        loser = info(store, 2, stream.committed[store][0].checkpoint_id, created_at=now)
        catalog.record_files(root, [loser])
    runner = CliRunner(env={"COLUMNS": "200"})
    command = ["--catalog-url", url, "-q", "maintain", "--no-snapshots"]
    zero = ["--window", "0s", "--orphan-grace", "0s", "--min-window", "0s"]
    defaults = runner.invoke(main, command)
    assert defaults.exit_code == 0 and "would delete 0 files" in defaults.stdout
    zeros = runner.invoke(main, command + zero)
    assert zeros.exit_code == 0, zeros.output
    assert "would delete 1 files" in zeros.stdout and loser.path in zeros.stdout
    executed = runner.invoke(main, [*command, "--execute", *zero])
    assert executed.exit_code == 0, executed.output
    with Catalog.open(url) as catalog:
        (run,) = catalog.recent_runs()
        assert run.parameters["window"] == run.parameters["orphan_grace"] == "0s"
        assert run.parameters["min_window"] == "0s"
        assert [d.path for d in catalog.deletion_history()] == [loser.path]
