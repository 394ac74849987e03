"""The on-call journeys of a damaged checkpoint, end to end as an operator lives them: a real
query (the runtime, a real Spark session) loses or damages a file (a delta deleted, a delta
with one byte flipped, the only snapshot truncated after cleanup removed the deltas below it);
the next batch fails with one paragraph naming the store, the file and the cause, and the next
command; ``repair`` (dry run and executed) and ``explain`` say the same; that command, parsed
from the output and run as printed, succeeds, and the state it leaves is exactly the model's."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from pyspark.sql import SparkSession

from state_runtime.catalog import Catalog, FileRecord
from state_runtime.cli import main
from state_runtime.errors import StateLost
from state_runtime.identity import FileKind, StoreId
from state_runtime.runtime import Agg, StatefulQuery, running_aggregation
from state_runtime.store.config import StoreConfig

from .reference import running_totals
from .test_exactly_once import _df, _events, _state

pytestmark = pytest.mark.spark
PARTITIONS = 3
DAMAGED = StoreId(0, 1)
COMMAND = re.compile(r"run `(statestore [^`]+)`")


@dataclasses.dataclass
class Journey:
    spark: SparkSession
    folder: Path
    url: str

    @property
    def root(self) -> str:
        """The checkpoint root as the catalog records it."""
        return self.folder.as_uri()

    def query(self, *, restarted: bool = False) -> StatefulQuery:
        """The query; ``restarted``: a new application, whose workers hold no state in
        memory (a store config of its own gives it providers of its own)."""
        config = StoreConfig(min_deltas_for_snapshot=11 if restarted else 10)
        aggs = [Agg("n", "count"), Agg("total", "sum", "amount")]
        op = running_aggregation(0, ["user"], "user string", aggs, PARTITIONS)
        op = dataclasses.replace(op, config=config)
        return StatefulQuery("clicks", self.root, [op], catalog_url=self.url, spark_checkpoint="")

    def run(self, batches: range, query: StatefulQuery | None = None) -> None:
        query = query or self.query()
        for batch in batches:
            query.run_batch(_df(self.spark, _events(batch)), batch).release()

    def statestore(self, *args: str) -> Result:
        runner = CliRunner(env={"COLUMNS": "120", "STATE_CATALOG_URL": self.url})
        return runner.invoke(main, list(args), catch_exceptions=False)

    def files(self, kind: FileKind) -> list[FileRecord]:
        with Catalog.open(self.url) as catalog:
            found = catalog.store_files(self.root, DAMAGED)
        return sorted((f for f in found if f.kind is kind), key=lambda f: f.version)

    def state(self) -> dict[str, tuple[int, int]]:
        return _state(self.spark, self.root, self.url)


@pytest.fixture
def journey(spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str) -> Iterator[Journey]:
    here = os.getcwd()
    os.chdir(tmp_path)  # paths are typed relative to here, as the shell completes them
    try:
        yield Journey(spark, tmp_path / "ckpt", sqlite_catalog_url)
    finally:
        os.chdir(here)


def failed_batch(journey: Journey, batch: int) -> str:
    """The paragraph the next batch of a restarted application fails with."""
    with pytest.raises(StateLost) as lost:
        journey.run(range(batch, batch + 1), journey.query(restarted=True))
    return str(lost.value)


def assert_one_paragraph(said: str, *, store: StoreId, path: str, cause: str) -> str:
    """``said`` is at most 8 lines, one paragraph naming the store, the file and the cause
    and one next command, which it returns."""
    lines = said.strip().splitlines()
    assert 1 <= len(lines) <= 8 and "" not in lines, said
    assert f"#{store}:" in said and path in said and cause in said, said
    commands = set(COMMAND.findall(said))
    assert len(commands) == 1, said
    return commands.pop()


def assert_explained(journey: Journey, path: Path, command: str) -> None:
    """``explain``, given the path relative to the current folder as the shell completes
    it, finds the file and names the same command; no guess, no backup to restore."""
    explained = journey.statestore("explain", os.path.relpath(path))
    assert explained.exit_code == 0, explained.output
    assert "verdict: damaged" in explained.output, explained.output
    assert COMMAND.findall(explained.output) == [command], explained.output
    assert "untracked" not in explained.output and "backup" not in explained.output


def run_as_printed(journey: Journey, command: str) -> Result:
    done = journey.statestore(*shlex.split(command)[1:])
    assert done.exit_code == 0, done.output
    return done


def test_a_missing_delta_names_the_newest_intact_batch_and_its_restore_is_exact(
    journey: Journey,
) -> None:
    """Batches 0-4 commit versions 1-5; version 4's delta of one store is deleted: versions
    4 and 5 are lost, batch 2 (version 3) is the newest intact one, and the advice says so
    (not batch 4, which restore refuses)."""
    journey.run(range(5))
    gone = journey.files(FileKind.DELTA)[3]
    assert gone.version == 4
    Path(journey.folder, gone.path).unlink()

    said = failed_batch(journey, 5)
    assert "\n" not in said and said.startswith("[STATE_LOST] batch 5 of query clicks ")
    command = assert_one_paragraph(
        said, store=DAMAGED, path=gone.path, cause="is missing from storage"
    )
    assert command == (
        f"statestore restore {journey.root} --query clicks --to-batch 2 --no-spark-checkpoint "
        "--execute"
    )
    for mode in ("--dry-run", "--execute"):
        repair = journey.statestore("repair", mode)
        assert repair.exit_code == 1 and COMMAND.findall(repair.output) == [command], repair.output

    run_as_printed(journey, command)
    assert journey.state() == running_totals(_events(0) + _events(1) + _events(2))
    journey.run(range(3, 6), journey.query(restarted=True))  # the query goes on from batch 3
    assert journey.state() == running_totals(e for b in range(6) for e in _events(b))


def test_a_flipped_byte_gets_the_same_help_as_a_missing_file(journey: Journey) -> None:
    """One byte of the newest delta of a store is flipped: the batch that loads it fails
    with the same paragraph a missing file gets (before, the loss check saw the file
    present and Spark's task trace was all there was)."""
    journey.run(range(4))
    newest = journey.files(FileKind.DELTA)[-1]
    path = Path(journey.folder, newest.path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))

    said = failed_batch(journey, 4)
    command = assert_one_paragraph(said, store=DAMAGED, path=newest.path, cause="is damaged")
    assert "--to-batch 2 --no-spark-checkpoint --execute" in command
    assert_explained(journey, path, command)

    run_as_printed(journey, command)
    assert journey.state() == running_totals(e for b in range(3) for e in _events(b))


def test_a_truncated_snapshot_without_deltas_is_lost_and_every_tool_says_so(
    journey: Journey,
) -> None:
    """The issue's night: maintenance snapshots every store and cleanup removes the deltas
    below the snapshot; the snapshot of one store is then truncated. No batch loads that
    store: the runtime, repair's dry run and --execute, and explain all say it is lost unless
    --allow-lost-state, with one command (before, the dry run promised a rebuild that
    --execute refused); run as printed, that store starts again from empty and the others
    keep every row of the last batch."""
    for batches in (range(4), range(4, 5)):  # the second pass supersedes the first's files
        journey.run(batches)
        maintained = journey.statestore("--policy", "demo", "-q", "maintain", "--execute")
        assert maintained.exit_code == 0, maintained.output
    [snapshot] = [f for f in journey.files(FileKind.SNAPSHOT) if f.state == "committed"]
    live = [f for f in journey.files(FileKind.DELTA) if f.state == "committed"]
    assert all(f.version > snapshot.version for f in live)  # cleanup removed those below
    latest = max([snapshot, *live], key=lambda f: f.version)
    path = Path(journey.folder, snapshot.path)
    path.write_bytes(path.read_bytes()[:60])

    said = failed_batch(journey, 5)
    command = assert_one_paragraph(said, store=DAMAGED, path=snapshot.path, cause="is damaged")
    assert command == (
        f"statestore restore {journey.root} --query clicks --to-batch 4 --no-spark-checkpoint "
        "--allow-lost-state --execute"
    )
    for mode in ("--dry-run", "--execute"):
        repair = journey.statestore("repair", mode)
        assert repair.exit_code == 1, repair.output
        promised = repair.output.replace(", 0 unrepairable", "")  # the executed run's counts
        assert "to rebuild" not in promised and "unrepairable" not in promised
        assert COMMAND.findall(repair.output) == [command], repair.output
        assert len(repair.output.strip().splitlines()) <= 8
    assert_explained(journey, path, command)

    everything = running_totals(e for b in range(5) for e in _events(b))
    run_as_printed(journey, command)
    state = journey.state()
    assert all(state[u] == everything[u] for u in state)
    assert len(everything) - len(state) == latest.rows  # exactly the lost store's keys
