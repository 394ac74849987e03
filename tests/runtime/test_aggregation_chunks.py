"""A running aggregation taken in chunks of whole keys (``aggregation.CHUNK_ROWS``) gives the
output and the state of the whole batch at once: keys of two columns with nulls and NaN, a
key of many rows straddling chunk ends, and a second batch over the first's state; the task
hands each chunk's output to Spark as it goes."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from benchmarks.task_spec import first_batch_spec, first_batch_store, operator_provider
from state_runtime.runtime import Agg, aggregation, partition_input, running_aggregation
from state_runtime.runtime.batch_reports import batch_metrics
from state_runtime.runtime.context import BatchContext, batch_scope
from state_runtime.runtime.tasks import (
    HEARTBEAT_COLUMN,
    PARTITION_COLUMN,
    REPORT_COLUMN,
    TaskReport,
    run_partitions,
)
from state_runtime.settings import WorkerSettings
from state_runtime.storage import LocalStorage
from state_runtime.store.disk_runs import LOCAL_DISK
from state_runtime.store.provider import StateStoreProvider
from state_runtime.store.state_schema import StateSchema

OP = running_aggregation(
    0,
    ["a", "b"],
    "a double, b string",
    [Agg("n", "count"), Agg("total", "sum", "v"), Agg("low", "min", "v")],
    1,
)


def _batch(seed: int) -> pa.Table:
    rng = random.Random(seed)
    a = [None, float("nan"), -0.5, 0.0, 1.0, 2.5]
    b = [None, "", "x", "y"]
    rows = [(rng.choice(a), rng.choice(b), rng.randrange(-50, 50)) for _ in range(3000)]
    rows += [(1.0, "x", 1)] * 500  # one key of many rows
    rng.shuffle(rows)
    a_col, b_col, v_col = zip(*rows, strict=True)
    return pa.table(
        {"a": pa.array(a_col, pa.float64()), "b": pa.array(b_col), "v": pa.array(v_col)}
    )


def _provider(root: Path) -> StateStoreProvider:
    return operator_provider(OP, LocalStorage(root))


def _canonical(rows: list[dict[str, Any]]) -> list[str]:
    return sorted(repr(sorted(r.items())) for r in rows)


def _run(root: Path, chunk_rows: int, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    monkeypatch.setattr(aggregation, "CHUNK_ROWS", chunk_rows)
    provider = _provider(root)
    seen, checkpoint = [], None
    for version, seed in enumerate((1, 2)):
        store = provider.get_store(version, checkpoint)
        with batch_scope(BatchContext("q", version, 0, 0, stores={OP.store_name: store})):
            output = aggregation.whole_output(OP.update(store, _batch(seed)))
            checkpoint = store.commit().checkpoint_id
        assert output is not None
        seen.append(_canonical(output.to_pylist()))
    state = provider.get_store(2, checkpoint)
    seen.append(_canonical(state.to_arrow().to_pylist()))
    return seen


@pytest.mark.parametrize("chunk_rows", [1, 7, 1000])
def test_chunks_give_the_whole_batch_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk_rows: int
) -> None:
    whole = _run(tmp_path / "whole", 1 << 40, monkeypatch)
    assert _run(tmp_path / "chunks", chunk_rows, monkeypatch) == whole


@pytest.mark.parametrize("spilled", [False, True], ids=["held", "spilled"])
def test_a_task_hands_each_chunks_output_to_spark_before_the_next_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, spilled: bool
) -> None:
    """The task body yields a chunk's output as soon as the chunk is applied, and commits
    after the last: the output is held a chunk at a time, not whole. Spilled, the input goes
    to sorted files on local disk past a few hundred rows and comes back in pieces of whole
    keys (past ``FAN_IN`` files, groups of files are merged into one first): the same rows
    and state, and no file left."""
    monkeypatch.setattr(aggregation, "CHUNK_ROWS", 1000)
    if spilled:
        monkeypatch.setattr(partition_input, "SPILL_ROWS", 500)
        monkeypatch.setattr(partition_input, "PIECE_ROWS", 300)
        monkeypatch.setattr(partition_input, "BLOCK_ROWS", 64)
        monkeypatch.setattr(partition_input, "FAN_IN", 3)  # 8 files: merged 3 at a time first
        LOCAL_DISK.set_directory(str(tmp_path / "local"))
        request.addfinalizer(lambda: LOCAL_DISK.set_directory(None))
    written = LOCAL_DISK.stats.bytes_written
    events: list[str] = []
    apply = aggregation._RunningAggregate._apply

    def recorded(self: Any, store: Any, rows: pa.Table) -> pa.Table:
        events.append("apply")
        return apply(self, store, rows)

    monkeypatch.setattr(aggregation._RunningAggregate, "_apply", recorded)
    spec = first_batch_spec(OP, LocalStorage(tmp_path), WorkerSettings())
    rows = _batch(1)
    sent = rows.append_column(PARTITION_COLUMN, pa.array([0] * rows.num_rows, pa.int32()))
    sent = sent.append_column(HEARTBEAT_COLUMN, pa.array([False] * rows.num_rows))
    output, reports = [], []
    for batch in run_partitions(spec, iter(sent.to_batches(max_chunksize=700))):
        events.append("output" if batch.column(REPORT_COLUMN).null_count else "report")
        output += [r for r in batch.to_pylist() if r[REPORT_COLUMN] is None]
        reports += [
            TaskReport.from_json(r) for r in batch.column(REPORT_COLUMN).drop_null().to_pylist()
        ]
    last_apply = len(events) - 1 - events[::-1].index("apply")
    assert events.count("apply") >= 3 and events.index("output") < last_apply, events
    assert events[-1] == "report"
    assert (LOCAL_DISK.stats.bytes_written > written) == spilled
    # the batch's figures count the spilled input, written before the partition ran
    local = batch_metrics(reports, 0, 0.0, 0.0).extra["local_bytes_written"]
    assert local == LOCAL_DISK.stats.bytes_written - written and (local > 0) == spilled
    if spilled:
        assert not list((tmp_path / "local").glob("*/input-*")), "input files left"
    store = _provider(tmp_path / "whole").get_store(0, None)
    expected = aggregation.whole_output(OP.update(store, rows))
    assert expected is not None
    assert _canonical([{k: v for k, v in r.items() if k != REPORT_COLUMN} for r in output]) == (
        _canonical(expected.to_pylist())
    )
    committed = _provider(tmp_path).get_store(1, None).to_arrow().to_pylist()
    assert _canonical(committed) == _canonical(store.to_arrow().to_pylist())


def test_a_chunk_takes_at_most_a_share_of_the_spill_threshold_of_input(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """16-byte rows (a count by one integer key): bench_e2e's 3.8 MiB budget (a 1 MB
    threshold) takes 31,250 rows a step, half the threshold at the store's row width;
    memory mode the most, a forced-disk budget the least."""
    schema = StateSchema.of("k bigint", "n bigint")
    assert schema.row_bytes == 16
    rows = pa.table({"k": pa.array(range(100), pa.int64())})
    for threshold, expected in [
        (1_000_000, 31_250),
        (1 << 40, aggregation.CHUNK_ROWS),
        (0, aggregation.MIN_CHUNK_ROWS),
    ]:
        monkeypatch.setattr(LOCAL_DISK, "spill_bytes", threshold)
        assert aggregation.chunk_rows(schema, rows) == expected


def test_long_string_keys_keep_each_chunk_within_the_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``row_bytes`` counts a string as 8 bytes: 100-character keys weighed so were taken in
    chunks of up to 125,000 rows (13 MB), here the whole 4.2 MB batch at once. Weighed by the
    batch's real bytes a row, every chunk's input stays within 1/CHUNK_SHARE of the threshold,
    and the state is the whole batch's."""
    threshold = 4_000_000
    monkeypatch.setattr(LOCAL_DISK, "spill_bytes", threshold)
    op = running_aggregation(0, ["k"], "k string", [Agg("n", "count")], 1)
    keys = [f"{i:0100d}" for i in range(40_000)]
    rows = pa.table({"k": pa.array(keys + keys[:500])})
    sizes: list[int] = []
    apply = aggregation._RunningAggregate._apply

    def recorded(self: Any, store: Any, chunk: pa.Table) -> pa.Table:
        sizes.append(chunk.nbytes)
        return apply(self, store, chunk)

    monkeypatch.setattr(aggregation._RunningAggregate, "_apply", recorded)
    with first_batch_store(op, LocalStorage(tmp_path)) as (_, store):
        output = aggregation.whole_output(op.update(store, rows))
    assert output is not None and output.num_rows == len(keys)
    share = threshold // aggregation.CHUNK_SHARE  # a chunk ends past a key: a row or so over
    assert len(sizes) > 1 and max(sizes) <= share * 1.01, sizes
    state = store.to_arrow().flatten()
    assert state.num_rows == len(keys)
    assert sum(state.column("value.n").to_pylist()) == rows.num_rows
