"""Every query in sql/ run by real psql against known data, rows checked; the PostgreSQL
views and functions agree with the Python rules."""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from state_runtime.catalog import BatchMetrics, Catalog, RetentionPolicy
from state_runtime.catalog.schema.tables import checkpoint_files
from state_runtime.identity import StoreId
from state_runtime.store.checkpoint_info import CheckpointInfo
from tests.catalog.factory import QUERY, ROOT, Stream, info
from tests.services import service_missing

pytestmark = pytest.mark.postgres

SQL = Path(__file__).resolve().parents[2] / "sql"
A, B, C = StoreId(0, 0), StoreId(0, 1), StoreId(1, 0, "dedup")
OTHER_ROOT = "s3://bucket/other-query"


@dataclass
class Known:
    """The data every test here queries."""

    catalog: Catalog
    files: dict[str, CheckpointInfo]
    stream: Stream
    cleanup_run: int
    deleted: list[str]
    in_flight: CheckpointInfo
    orphan: CheckpointInfo


@pytest.fixture
def known(pg_catalog: Catalog) -> Known:
    """Root ROOT: A, B, C commit 12 batches; A snapshots at 5 and 10. Batch 11 of B was
    replayed (one orphan); A has an uncommitted attempt at 13 written a minute ago; C lost
    its delta 7; a cleanup run deleted A's deltas 1 and 2. OTHER_ROOT holds one store with
    3 versions and a snapshot at 3."""
    catalog = pg_catalog
    stream = Stream(catalog, [A, B, C])
    files: dict[str, CheckpointInfo] = {}
    for version in range(1, 13):
        for i in stream.commit():
            files[f"{i.store.partition_id}{i.store.operator_id}:d{version}"] = i
        catalog.record_batch_metrics(
            ROOT, QUERY, version - 1, BatchMetrics(1000, 100 + version, 5000, 3000, 7.5, 2, 1)
        )
        if version in (5, 10):
            files[f"00:s{version}"] = stream.snapshot(A)
    orphan = stream.committed[B][11]
    replay = info(B, 12, stream.committed[B][10].checkpoint_id, created_at=stream.clock)
    catalog.commit_batch(
        ROOT, QUERY, 11, [stream.committed[A][11], replay, stream.committed[C][11]]
    )
    stream.committed[B][11] = replay
    in_flight = stream.delta(A, created_at=datetime.now(UTC) - timedelta(minutes=1))
    catalog.record_files(ROOT, [in_flight])
    with catalog.engine.begin() as connection:
        connection.execute(
            sa.update(checkpoint_files)
            .where(checkpoint_files.c.path == files["01:d7"].path)
            .values(state="deleted")
        )
    run = catalog.start_run("cleanup", "nightly-cron", {"retain_versions": 2})
    deleted = [files["00:d1"].path, files["00:d2"].path]
    assert len(catalog.claim_deletions(run, RetentionPolicy(), ROOT, [A], limit=2)) == 2
    catalog.record_deletions(run, ROOT, deleted)
    catalog.finish_run(run, "succeeded", {"deleted": 2})
    other = Stream(catalog, [A], root=OTHER_ROOT, query="other-query")
    other.run(3)
    other.snapshot(A)
    return Known(catalog, files, stream, run, deleted, in_flight, orphan)


def psql(known: Known, name: str, **variables: object) -> list[dict[str, str]]:
    """Run sql/<name> with psql as an operator would; the result rows as dicts."""
    return run_psql(known.catalog, name, **variables)


def run_psql(catalog: Catalog, name: str, **variables: object) -> list[dict[str, str]]:
    """Run sql/<name> with psql against ``catalog``; the result rows as dicts."""
    binary = shutil.which("psql")
    if binary is None:
        service_missing("psql", "the PostgreSQL client is not on PATH")
    url = catalog.engine.url
    command = [
        str(binary),
        "-X",
        "-q",
        "--csv",
        "-v",
        "ON_ERROR_STOP=1",
        "-d",
        f"host={url.host} port={url.port} user={url.username} dbname={url.database}",
        "-f",
        str(SQL / name),
    ]
    for key, value in variables.items():
        command[-2:-2] = ["-v", f"{key}={value}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return list(csv.DictReader(io.StringIO(done.stdout)))


def by_store(rows: list[dict[str, str]]) -> dict[tuple[int, str], dict[str, str]]:
    return {
        (int(r["partition_id"]) * 10 + int(r["operator_id"]), r["checkpoint_root"]): r for r in rows
    }


def test_every_sql_file_is_tested() -> None:
    tested = {
        "store_health.sql",
        "snapshot_candidates.sql",
        "lineage.sql",
        "commit_history.sql",
        "cleanup_preview.sql",
        "explain_file.sql",
        "deletion_history.sql",
        "maintenance_runs.sql",
    }
    assert {p.name for p in SQL.glob("*.sql")} == tested


def test_store_health(known: Known) -> None:
    # reclaimable: what cleanup may delete now under the policy; no window, the floor alone
    rows = psql(known, "store_health.sql", retention="0 seconds", grace="0 seconds")
    assert len(rows) == 4
    assert rows[0]["store_name"] == "default" and rows[0]["partition_id"] == "1"  # B: 12 deltas
    health = {(r["checkpoint_root"], r["operator_id"], r["partition_id"]): r for r in rows}
    a = health[(ROOT, "0", "0")]
    assert (a["latest_version"], a["last_snapshot_version"], a["deltas_since_snapshot"]) == (
        "12",
        "10",
        "2",
    )
    # A: d3..d12, s5, s10 and the in-flight attempt are live; d1, d2 deleted.
    assert (a["live_files"], a["live_bytes"], a["orphan_files"]) == ("13", "13000", "0")
    # Not needed by versions 11..12 (snapshot 10, d11, d12): d3..d10, s5, the attempt.
    assert (a["reclaimable_files"], a["reclaimable_bytes"]) == ("10", "10000")
    assert (a["last_run_id"], a["last_run_kind"], a["last_run_outcome"]) == (
        str(known.cleanup_run),
        "cleanup",
        "succeeded",
    )
    assert a["state_rows"] == "100" and a["versions_behind"] == "0"
    b = health[(ROOT, "0", "1")]
    assert (b["orphan_files"], b["orphan_bytes"], b["deltas_since_snapshot"]) == ("1", "1000", "12")
    assert b["reclaimable_files"] == "1"  # the orphan; versions 11 and 12 need d1..d12
    c = health[(ROOT, "1", "0")]
    assert c["live_files"] == "11"  # d7 is gone
    other = health[(OTHER_ROOT, "0", "0")]
    assert other["versions_behind"] == "0" and other["latest_version"] == "3"
    assert [r["checkpoint_root"] for r in psql(known, "store_health.sql", root=OTHER_ROOT)] == [
        OTHER_ROOT
    ]


def test_snapshot_candidates(known: Known) -> None:
    rows = psql(known, "snapshot_candidates.sql", min_deltas=5)
    found = [
        (r["checkpoint_root"], r["operator_id"], r["partition_id"], r["deltas_since_snapshot"])
        for r in rows
    ]
    assert found == [(ROOT, "0", "1", "12"), (ROOT, "1", "0", "12")]
    assert len(psql(known, "snapshot_candidates.sql")) == 2  # default threshold 10
    assert len(psql(known, "snapshot_candidates.sql", min_deltas=2)) == 3  # A, B, C


def test_lineage(known: Known) -> None:
    rows = psql(known, "lineage.sql", root=ROOT, operator=0, partition=0)
    assert [(r["version"], r["kind"]) for r in rows] == [
        ("12", "delta"),
        ("11", "delta"),
        ("10", "snapshot"),
    ]
    assert rows[2]["path"] == known.files["00:s10"].path and rows[2]["state"] == "committed"
    older = psql(known, "lineage.sql", root=ROOT, operator=0, partition=0, version=9)
    assert [(r["version"], r["kind"]) for r in older] == [
        ("9", "delta"),
        ("8", "delta"),
        ("7", "delta"),
        ("6", "delta"),
        ("5", "snapshot"),
    ]
    broken = psql(known, "lineage.sql", root=ROOT, operator=1, partition=0, store="dedup")
    assert [(r["version"], r["kind"]) for r in broken][-2:] == [("8", "delta"), ("7", "MISSING")]
    assert len(broken) == 6


def test_commit_history(known: Known) -> None:
    rows = psql(known, "commit_history.sql", query=QUERY)
    assert [r["batch_id"] for r in rows] == [str(b) for b in range(11, -1, -1)]
    newest = rows[0]
    assert (newest["stores"], newest["min_version"], newest["max_version"]) == ("3", "12", "12")
    assert newest["checkpoint_bytes"] == "3000" and newest["state_rows"] == "300"
    assert (newest["rows_in"], newest["keys_updated"], newest["commit_ms"]) == (
        "1000",
        "112",
        "7.5",
    )
    assert len(psql(known, "commit_history.sql", query=QUERY, limit=3)) == 3
    assert psql(known, "commit_history.sql", query="nobody") == []


def test_cleanup_preview_matches_the_python_cleanup(known: Known) -> None:
    rows = psql(known, "cleanup_preview.sql", root=ROOT)
    found = {r["path"]: r["verdict"] for r in rows}
    python = known.catalog.deletable_files(RetentionPolicy(), root=ROOT)
    assert found == {v.file.path: v.verdict.value for v in python}
    a = known.files
    assert found[a["00:d3"].path] == "deletable_superseded"
    assert found[known.orphan.path] == "deletable_orphan"
    assert known.in_flight.path not in found  # one minute old: may be in flight
    assert "replaced by a re-commit of batch 11" in next(
        r["reason"] for r in rows if r["path"] == known.orphan.path
    )
    keep_more = {r["path"] for r in psql(known, "cleanup_preview.sql", root=ROOT, retain=4)}
    assert a["00:d9"].path not in keep_more and a["00:d5"].path in keep_more
    every_root = psql(known, "cleanup_preview.sql", retention="0 seconds")
    assert {r["checkpoint_root"] for r in every_root} == {ROOT, OTHER_ROOT}


def test_explain_file(known: Known) -> None:
    (needed,) = psql(known, "explain_file.sql", root=ROOT, path=known.files["00:s10"].path)
    assert (needed["verdict"], needed["needed_from"], needed["needed_to"]) == ("needed", "11", "12")
    assert needed["reason"] == "needed to load retained versions 11..12 (the last 2 committed)"
    library = {v.file.path: v.reason for v in known.catalog.file_verdicts(RetentionPolicy())}
    assert needed["reason"] == library[known.files["00:s10"].path]  # the same rule, rendered
    (young,) = psql(known, "explain_file.sql", root=ROOT, path=known.in_flight.path)
    assert young["verdict"] == "in_flight"
    (gone,) = psql(known, "explain_file.sql", root=ROOT, path=known.deleted[0])
    assert (
        gone["verdict"] == "deleted"
        and f"cleanup run {known.cleanup_run}: superseded" in gone["reason"]
    )
    assert psql(known, "explain_file.sql", root=ROOT, path="state/9/9/default/x.delta") == []


def test_deletion_history(known: Known) -> None:
    rows = psql(known, "deletion_history.sql")
    assert sorted(r["path"] for r in rows) == sorted(known.deleted)
    assert {(r["run_id"], r["run_owner"]) for r in rows} == {
        (str(known.cleanup_run), "nightly-cron")
    }
    assert all(r["reason"].startswith("superseded") for r in rows)
    assert psql(known, "deletion_history.sql", root=OTHER_ROOT) == []


def test_maintenance_runs(known: Known) -> None:
    (run,) = psql(known, "maintenance_runs.sql")
    assert (run["run_id"], run["kind"], run["outcome"]) == (
        str(known.cleanup_run),
        "cleanup",
        "succeeded",
    )
    assert run["counts"] == '{"deleted": 2}'


def test_sql_verdicts_and_health_agree_with_python(known: Known) -> None:
    catalog = known.catalog
    for retain, window in ((2, "1 hour"), (3, "0 seconds")):
        policy = RetentionPolicy(
            retain_versions=retain,
            window=timedelta(hours=1 if window == "1 hour" else 0),
            orphan_grace=timedelta(0),
        )
        with catalog.engine.connect() as connection:
            sql = connection.execute(
                sa.text(
                    "SELECT path, verdict"
                    " FROM state_file_verdicts(:r, CAST(:w AS interval), interval '0')"
                ),
                {"r": retain, "w": window},
            ).all()
        python = catalog.file_verdicts(policy)
        assert dict(sql) == {v.file.path: v.verdict.value for v in python}
    floor = RetentionPolicy(window=timedelta(0), orphan_grace=timedelta(0))
    python_health = {(h.key.root, h.key.store): h for h in catalog.store_health(floor)}
    for row in psql(known, "store_health.sql", retention="0 seconds", grace="0 seconds"):
        store = StoreId(int(row["operator_id"]), int(row["partition_id"]), row["store_name"])
        h = python_health[(row["checkpoint_root"], store)]
        assert (int(row["reclaimable_files"]), int(row["reclaimable_bytes"])) == (
            h.reclaimable_files,
            h.reclaimable_bytes,
        )
        assert (
            int(row["live_files"]),
            int(row["orphan_files"]),
            int(row["deltas_since_snapshot"]),
        ) == (h.live_files, h.orphan_files, h.deltas_since_snapshot)


def test_a_plain_path_names_a_root_recorded_as_a_uri(pg_catalog: Catalog) -> None:
    """The runtime records local roots as file:// URIs; -v root= takes the path too."""
    uri = "file:///data/ckpt%20one"
    Stream(pg_catalog, [A], root=uri, query="uri-query").run(3)
    for given in (uri, "/data/ckpt one", "/data/ckpt one/"):
        rows = run_psql(pg_catalog, "store_health.sql", root=given)
        assert [r["checkpoint_root"] for r in rows] == [uri], given
        lineage = run_psql(pg_catalog, "lineage.sql", root=given, operator=0, partition=0)
        assert [r["version"] for r in lineage] == ["3", "2", "1"], given


@pytest.mark.parametrize(
    ("name", "variables", "missing"),
    [
        ("lineage.sql", {}, "root"),
        ("lineage.sql", {"root": "/x"}, "operator"),
        ("lineage.sql", {"root": "/x", "operator": 0}, "partition"),
        ("explain_file.sql", {"root": "/x"}, "path"),
        ("commit_history.sql", {}, "query"),
    ],
)
def test_a_missing_variable_is_one_clear_line(
    pg_catalog: Catalog, name: str, variables: dict[str, object], missing: str
) -> None:
    url = pg_catalog.engine.url
    command = ["psql", "-X", "-q", "-f", str(SQL / name)]  # the file stops on its own
    for key, value in variables.items():
        command += ["-v", f"{key}={value}"]
    command += ["-d", f"host={url.host} port={url.port} user={url.username} dbname={url.database}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.stdout == "" and done.returncode == 3, (done.returncode, done.stderr)
    assert f"ERROR:  sql/{name} needs -v {missing}=..." in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and "syntax error" not in done.stderr


def test_lineage_and_commit_history_pass_over_versions_that_changed_nothing(
    pg_catalog: Catalog,
) -> None:
    """Versions 2 and 3 changed nothing (commits of version 1's checkpoint, no file): the
    lineage of version 4 walks over them to version 1, and the commit history lists them."""
    store, root = StoreId(0, 0), "s3://bucket/idle"
    first = info(store, 1, None)
    chain = [first]
    for version in (2, 3):
        parent = chain[-1].checkpoint_id
        chain.append(info(store, version, parent, checkpoint_id=parent, size=0))
    chain.append(info(store, 4, first.checkpoint_id))
    for batch, checkpoint in enumerate(chain):
        pg_catalog.commit_batch(root, QUERY, batch, [checkpoint])
    rows = run_psql(pg_catalog, "lineage.sql", root=root, operator=0, partition=0)
    assert [(r["version"], r["kind"]) for r in rows] == [
        ("4", "delta"),
        ("3", "unchanged (no file)"),
        ("2", "unchanged (no file)"),
        ("1", "delta"),
    ]
    history = run_psql(pg_catalog, "commit_history.sql", query=QUERY)
    assert [(r["batch_id"], r["checkpoint_bytes"]) for r in history] == [
        ("3", "1000"),
        ("2", ""),
        ("1", ""),
        ("0", "1000"),
    ]
