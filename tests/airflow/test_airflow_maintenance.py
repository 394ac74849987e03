"""The ready DAG end to end with ``dag.test()``: a real Airflow metadata database, real stores
written by the runtime (local files and S3 on moto's server), SQLite and PostgreSQL catalogs,
the catalog and storage reached through Airflow connections only."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from state_runtime.identity import FileKind
from tests.airflow.conftest import BOTH_CATALOGS, DAGS, connection_env
from tests.maintenance.conftest import STORES
from tests.maintenance.streams import StoreStream
from tests.s3_fixtures import MotoS3

POLICY = {
    "STATE_MAINTENANCE_SNAPSHOT_MIN_DELTAS": "5",
    "STATE_MAINTENANCE_WINDOW": "0s",
    "STATE_MAINTENANCE_MIN_WINDOW": "0s",
    # full validations: corrupt_snapshot damages a verified snapshot keeping its size, which
    # only reading finds (at the default 5% sample, within about 20 runs)
    "STATE_MAINTENANCE_VERIFY_SAMPLE_PERCENT": "100",
}
STORAGES = ["local", pytest.param("s3", marks=pytest.mark.s3)]


@pytest.fixture(params=STORAGES)
def stream(
    request: pytest.FixtureRequest,
    make_stream: Callable[..., StoreStream],
    monkeypatch: pytest.MonkeyPatch,
    connections: None,
    airflow_db: object,
) -> StoreStream:
    """Stores written by the runtime on local files or S3, the connections and policy set."""
    moto: MotoS3 | None = None
    if request.param == "s3":
        moto = request.getfixturevalue("moto_s3")
        made = StoreStream(request.getfixturevalue("catalog"), moto.storage(), list(STORES))
    else:
        made = make_stream()
    for name, value in {**connection_env(made.catalog, moto), **POLICY}.items():
        monkeypatch.setenv(name, value)
    return made


def run_dag(
    cleanup_dry_run: bool = True, *, dag_id: str = "state_store_maintenance", **conf: Any
) -> tuple[dict[str, str], dict[str, Any]]:
    """One ``dag.test()`` run of a provider DAG: each task's state and XCom value
    (``task[map index]``). The maintenance DAG's conf is always given whole: ``dag.test()``
    keeps one run's conf in the DAG object's params for the next run in the same process."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    dag = DagBag(dag_folder=str(DAGS)).dags[dag_id]
    if dag_id == "state_store_maintenance":
        conf["cleanup_dry_run"] = cleanup_dry_run
    run = dag.test(run_conf=conf)
    states: dict[str, str] = {}
    values: dict[str, Any] = {}
    with create_session() as session:
        for ti in run.get_task_instances(session=session):
            name = ti.task_id + ("" if ti.map_index < 0 else f"[{ti.map_index}]")
            states[name] = str(ti.state)
        for row in session.query(XComModel).filter(
            XComModel.dag_id == dag.dag_id, XComModel.run_id == run.run_id
        ):
            name = row.task_id + ("" if row.map_index < 0 else f"[{row.map_index}]")
            values[name] = XComModel.deserialize_value(row)
    return states, values


def snapshots(stream: StoreStream) -> dict[str, list[int]]:
    """Each store's snapshot versions as the catalog records them."""
    found: dict[str, list[int]] = {}
    for store in stream.stores:
        files = stream.catalog.store_files(stream.root, store)
        found[str(stream.key(store))] = sorted(
            f.version for f in files if f.kind is FileKind.SNAPSHOT
        )
    return found


def corrupt_snapshot(stream: StoreStream, version: int) -> str:
    """Damage the first store's snapshot file in its storage; its path."""
    store = stream.stores[0]
    [path] = [
        f.path
        for f in stream.catalog.store_files(stream.root, store)
        if f.kind is FileKind.SNAPSHOT and f.version == version
    ]
    data = stream.storage.read(path)
    stream.storage.delete([path])
    stream.storage.write_if_absent(path, data[:-7] + b"corrupt")
    return path


@BOTH_CATALOGS
def test_the_dag_snapshots_validates_cleans_within_retention_and_reports(
    stream: StoreStream,
) -> None:
    stream.run(6)
    states, values = run_dag()
    assert set(states.values()) == {"success"}, states
    names = {str(stream.key(s)) for s in stream.stores}
    assert snapshots(stream) == {name: [6] for name in names}
    [due] = [v for k, v in values.items() if k == "due_stores"]
    assert due == [sorted(names)]
    written = values["snapshots[0]"]
    assert {row["store"]: row["status"] for row in written["stores"]} == dict.fromkeys(
        names, "written"
    )
    dry = values["root.cleanup[0]"]
    assert dry["counts"]["dry_run"] is True
    assert stream.catalog.deletion_history(root=stream.root) == []

    stream.run(2)
    states, values = run_dag(cleanup_dry_run=False)
    assert states["snapshots"] == "skipped", states  # nothing due: chains of 2 deltas
    assert {k: v for k, v in states.items() if k != "snapshots"} == dict.fromkeys(
        ["due_stores", "roots", "root.validate[0]", "root.cleanup[0]", "root.health[0]"],
        "success",
    )
    # Retention keeps versions 7 and 8: they load from the snapshot at 6 and deltas 7 and 8,
    # so exactly the deltas of versions 1 to 6 go, and nothing else.
    deleted = {d.path for d in stream.catalog.deletion_history(root=stream.root)}
    allowed = {i.path for s in stream.stores for i in stream.committed[s][:6]}
    assert deleted == allowed
    for store in stream.stores:
        for version in (7, 8):
            assert stream.loaded(store, version) == stream.expected(store, version)
    cleaned = values["root.cleanup[0]"]
    assert cleaned["counts"]["deleted_files"] == len(allowed)
    assert {row["store"]: row["deleted_files"] for row in cleaned["stores"]} == dict.fromkeys(
        names, 6
    )
    health = values["root.health[0]"]
    assert {row["store"]: row["status"] for row in health["stores"]} == dict.fromkeys(
        names, "healthy"
    )

    # Every pass is a maintenance run in the catalog, owned by its Airflow task.
    runs = stream.catalog.recent_runs()
    by_kind = {(r.kind, r.owner.split("/")[0]) for r in runs}
    assert {
        ("snapshot", "airflow:state_store_maintenance.snapshots[0]"),
        ("validate", "airflow:state_store_maintenance.root.validate[0]"),
        ("cleanup", "airflow:state_store_maintenance.root.cleanup[0]"),
    } <= by_kind
    assert all(r.outcome == "succeeded" for r in runs)
    assert cleaned["run_id"] in {r.run_id for r in runs if r.kind == "cleanup"}


@BOTH_CATALOGS
def test_a_corrupt_snapshot_blocks_cleanup_and_fails_health_naming_the_store(
    stream: StoreStream,
) -> None:
    stream.run(6)
    states, _ = run_dag()
    assert set(states.values()) == {"success"}, states
    stream.run(2)
    path = corrupt_snapshot(stream, 6)
    name = str(stream.key(stream.stores[0]))

    states, values = run_dag(cleanup_dry_run=False)
    assert states["root.validate[0]"] == "failed"
    assert states["root.cleanup[0]"] == "upstream_failed"
    assert states["root.health[0]"] == "failed"
    assert stream.catalog.deletion_history(root=stream.root) == []

    validation = values["root.validate[0]"]
    lineage = next(c for c in validation["checks"] if c["check"] == "lineage_valid")
    assert not lineage["passed"] and lineage["failing_stores"] == [name]
    health = values["root.health[0]"]
    statuses = {row["store"]: row for row in health["stores"]}
    assert statuses[name]["status"] == "broken" and path in statuses[name]["status_reason"]
    assert all(row["status"] == "healthy" for store, row in statuses.items() if store != name)

    # The repair DAG: a dry run lists the damaged snapshot; applied, it rebuilds it, and the
    # next maintenance run validates, cleans within retention and finds every store healthy.
    states, values = run_dag(dag_id="state_store_repair", roots=[], dry_run=True)
    assert values["repair"]["stores"] == [
        {"store": name, "path": path, "detail": values["repair"]["stores"][0]["detail"]}
    ]
    assert states["health"] == "failed"
    states, values = run_dag(dag_id="state_store_repair", roots=[], dry_run=False)
    assert set(states.values()) == {"success"}, states
    assert values["repair"]["counts"]["repaired"] == 1
    states, _ = run_dag(cleanup_dry_run=False)
    assert set(states.values()) == {"success", "skipped"}, states
    deleted = {d.path for d in stream.catalog.deletion_history(root=stream.root)}
    assert deleted == {i.path for s in stream.stores for i in stream.committed[s][:6]}
    for store in stream.stores:
        assert stream.loaded(store, 8) == stream.expected(store, 8)


def test_the_restore_dag_plans_then_returns_the_query_to_a_batch(stream: StoreStream) -> None:
    stream.run(5)
    conf = {"root": stream.root, "query_id": stream.query, "batch_id": 2, "spark_checkpoint": ""}
    states, values = run_dag(dag_id="state_store_restore", **conf, dry_run=True)
    assert set(states.values()) == {"success"}, states
    plan = values["restore"]
    assert plan["counts"]["dry_run"] is True and plan["run_id"] is None
    assert {row["version"] for row in plan["stores"]} == {3}
    assert (
        max(e.batch_id for e in stream.catalog.commit_history(stream.root, query_id="query-1")) == 4
    )

    states, values = run_dag(dag_id="state_store_restore", **conf, dry_run=False)
    assert set(states.values()) == {"success"}, states
    done = values["restore"]
    assert done["counts"]["superseded_versions"] == 2 * len(stream.stores)
    [run] = [r for r in stream.catalog.recent_runs() if r.kind == "restore"]
    assert run.run_id == done["run_id"] and run.owner.startswith(
        "airflow:state_store_restore.restore/"
    )
    newest = max(e.batch_id for e in stream.catalog.commit_history(stream.root, query_id="query-1"))
    assert newest == 2


@pytest.mark.spark
def test_the_repartition_dag_plans_then_changes_the_partitions(
    spark: Any,
    catalog: Any,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
    connections: None,
    airflow_db: object,
) -> None:
    """A running count on 4 partitions is planned onto 3 (nothing written), then moved: the
    run is recorded as the task's, and the query resumes on 3 partitions with every count
    it had (the counts equal a query that never changed)."""
    from state_runtime.maintenance import canonical_root
    from state_runtime.runtime import Agg, StatefulQuery, running_aggregation

    for name, value in connection_env(catalog).items():
        monkeypatch.setenv(name, value)
    url = catalog.engine.url.render_as_string(hide_password=False)
    aggs = [Agg("n", "count")]

    def run(root: str, partitions: int, batches: range) -> list[tuple[str, int]]:
        op = running_aggregation(0, ["user"], "user string", aggs, partitions)
        query = StatefulQuery("counts", root, [op], catalog_url=url)
        rows: list[tuple[str, int]] = []
        for b in batches:
            events = spark.range(b * 30, b * 30 + 30).selectExpr(
                "concat('u', cast((id * 7) % 13 as string)) AS user"
            )
            result = query.run_batch(events, b)
            rows = sorted((r["user"], r["n"]) for r in result.output.collect())
            result.release()
        return rows

    root = str(tmp_path / "moved")
    run(root, 4, range(0, 3))
    conf = {
        "root": root,
        "query_id": "counts",
        "num_partitions": 3,
        "spark_checkpoint": "",
        "idle_seconds": 0,
    }
    states, values = run_dag(dag_id="state_store_repartition", **conf, dry_run=True)
    assert set(states.values()) == {"success"}, states
    plan = values["repartition"]
    assert plan["counts"]["dry_run"] is True and plan["run_id"] is None
    assert len(plan["stores"]) == 3 and sum(row["rows"] for row in plan["stores"]) == 13
    change = f"query counts below {canonical_root(root)} at batch 2: operator 0 (default) 4 -> 3"
    assert plan["summary"].startswith(f"repartition (dry run): {change}; new snapshots")
    layouts = catalog.layout_history(canonical_root(root))
    assert [layout.num_partitions for layout in layouts] == [4]

    states, values = run_dag(dag_id="state_store_repartition", **conf, dry_run=False)
    assert set(states.values()) == {"success"}, states
    done = values["repartition"]
    [record] = [r for r in catalog.recent_runs() if r.kind == "repartition"]
    assert record.run_id == done["run_id"] and record.owner.startswith(
        "airflow:state_store_repartition.repartition/"
    )
    assert done["summary"].startswith(f"repartition (run {record.run_id}): {change}; new")
    assert catalog.layout_history(canonical_root(root))[-1].num_partitions == 3

    moved = run(root, 3, range(3, 5))
    assert moved == run(str(tmp_path / "unchanged"), 4, range(0, 5))


def test_a_task_fails_with_the_paragraph_the_cli_prints(
    connections: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The catalog's PostgreSQL down (nothing listens on its port) and a bad policy: the
    task fails with the one paragraph ``statestore`` prints, no chained trace."""
    from types import SimpleNamespace

    from airflow.sdk.exceptions import AirflowException

    from state_runtime_airflow.operators import StateCleanupOperator, StateHealthCheckOperator

    down = {"conn_type": "postgres", "host": "127.0.0.1", "port": 9, "login": "postgres"}
    monkeypatch.setenv("AIRFLOW_CONN_STATE_CATALOG_DEFAULT", json.dumps({**down, "schema": "x"}))
    ti = SimpleNamespace(dag_id="d", task_id="t", run_id="r", map_index=-1)
    with pytest.raises(AirflowException) as failed:
        StateHealthCheckOperator(task_id="health").execute({"ti": ti})  # type: ignore[arg-type]
    message = str(failed.value)
    assert message.startswith("error: [STATE_CATALOG_UNAVAILABLE] cannot connect to the catalog")
    assert "`pg_isready -h 127.0.0.1 -p 9`" in message and "Traceback" not in message
    assert message.splitlines()[-1].startswith("full trace: ") and len(message.splitlines()) == 2
    assert failed.value.__cause__ is None and failed.value.__suppress_context__
    bad = StateCleanupOperator(task_id="cleanup", policy={"window": "soon"})
    with pytest.raises(AirflowException, match=r"^error: \[STATE_INVALID_ARGUMENT\] .*soon"):
        bad.execute({"ti": ti})  # type: ignore[arg-type]
    # ``workers`` and ``processes`` are the policy's settings: checked (and named) as every
    # setting is
    for name in ("workers", "processes"):
        zero = StateCleanupOperator(task_id="cleanup", **{name: 0})
        with pytest.raises(AirflowException, match=rf"^error: .*{name}=0.*at least 1"):
            zero.execute({"ti": ti})  # type: ignore[arg-type]
