"""A damaged file, end to end as the on-call operator lives it, without Spark: real files
damaged on disk (a delta deleted, a delta with a byte flipped, the only snapshot truncated
after cleanup removed the deltas below it, a snapshot bit-flipped above intact deltas). The
runtime's next batch (``StatefulQuery``'s batch minus Spark: the real task body and loss
check) fails with :class:`StateLost`, whose one paragraph names the store, the file, the
cause and the next command with the Spark checkpoint the driver was given; ``repair`` (dry
run and executed), ``explain``, ``validate`` and ``health`` name the same command in at most 8
lines; that command, run exactly as printed, succeeds, and the state it leaves is exactly the
model's (each store loaded from its files and counted)."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from state_runtime.catalog import FileRecord
from state_runtime.cli import main
from state_runtime.errors import StateLost
from state_runtime.identity import FileKind, StoreId
from tests.simulation.model import Batch, Model
from tests.simulation.platform import Platform

DAMAGED = StoreId(0, 1)
COMMAND = re.compile(r"run `(statestore [^`]+)`")


class Night:
    """A query of two state partitions on local files, its Spark checkpoint's logs written
    as Spark writes them (``offsets/N``, ``commits/N``), and the operator's CLI."""

    def __init__(self, folder: Path) -> None:
        self.spark = folder / "spark-checkpoint"
        self.platform = Platform(folder, partitions=2, spark_checkpoint=str(self.spark))
        self.model = Model(partitions=2)
        self.batch = 0

    @staticmethod
    def changes(batch: int) -> Batch:
        """Every partition's keys change each batch; one key goes now and then."""
        return {
            p: {f"u{p}-{k}": batch + k for k in range(4 + batch % 3)}
            | ({f"u{p}-0": None} if batch % 4 == 3 else {})
            for p in range(2)
        }

    def run(self, batches: int) -> None:
        for _ in range(batches):
            changes = self.changes(self.batch)
            self.platform.run_batch(self.batch, changes)
            self.model.commit(self.batch, changes)
            for log in ("offsets", "commits"):
                (self.spark / log).mkdir(parents=True, exist_ok=True)
                (self.spark / log / str(self.batch)).write_text("v1\n")
            self.batch += 1

    def next_batch_fails(self) -> str:
        """The paragraph a restarted driver's next batch fails with."""
        self.platform.restart_driver()
        with pytest.raises(StateLost) as lost:
            self.platform.run_batch(self.batch, self.changes(self.batch))
        return str(lost.value)

    def statestore(self, *args: str) -> Result:
        env = {"COLUMNS": "120", "STATE_CATALOG_URL": self.platform.catalog_url}
        return CliRunner(env=env).invoke(main, list(args), catch_exceptions=False)

    def files(self, kind: FileKind) -> list[FileRecord]:
        found = self.platform.catalog.store_files(self.platform.root, DAMAGED)
        return sorted(
            (f for f in found if f.kind is kind and f.state == "committed"),
            key=lambda f: f.version,
        )

    def path(self, record: FileRecord) -> Path:
        return self.platform.folder / self.platform.root_name / record.path

    def assert_exact(self) -> None:
        """Every store's latest committed version, loaded from its files, holds exactly the
        model's rows at the query's last batch."""
        last = self.model.last
        committed = self.platform.catalog.latest_committed(self.platform.root)
        for p in range(2):
            expected = self.model.expected(last, p)
            ref = committed.get(StoreId(0, p))
            loaded = {} if ref is None else self.platform.load(StoreId(0, p), ref)
            assert loaded == expected, p
            records = self.platform.catalog.store_files(self.platform.root, StoreId(0, p))
            if ref is not None and ref.version > 0:  # the commit's row count agrees
                newest = max((f for f in records if f.version == ref.version), key=lambda f: f.rows)
                assert newest.rows == len(expected)


@pytest.fixture
def night(tmp_path: Path) -> Night:
    here = os.getcwd()
    os.chdir(tmp_path)  # paths are typed relative to here, as the shell completes them
    try:
        yield Night(tmp_path)  # type: ignore[misc]
    finally:
        os.chdir(here)


def one_paragraph(said: str, record: FileRecord, cause: str) -> str:
    """``said`` is at most 8 lines, one paragraph naming the store, the file and the cause
    and one next command, which it returns."""
    lines = said.strip().splitlines()
    assert 1 <= len(lines) <= 8 and "" not in lines, said
    assert f"#{DAMAGED}:" in said and record.path in said and cause in said, said
    commands = set(COMMAND.findall(said))
    assert len(commands) == 1, said
    return commands.pop()


def every_tool_agrees(night: Night, record: FileRecord, cause: str, command: str) -> None:
    """``repair`` (dry run and executed: one paragraph, at most 8 lines), ``explain`` (the
    path as the shell completes it), ``validate`` and ``health --brief`` name ``command``;
    validate never calls the broken store's chain long."""
    repairs = command.split()[1:4] == ["--root", night.platform.root, "repair"]
    planned = night.statestore("repair")
    assert planned.exit_code == (0 if repairs else 1), planned.output
    assert ("1 damaged snapshot(s) to rebuild" in planned.output) is repairs
    assert one_paragraph(planned.output, record, cause) == command
    if not repairs:  # run by the operator otherwise: it is the command
        done = night.statestore("repair", "--execute")
        assert done.exit_code == 1 and ", 0 unrepairable" in done.output, done.output
        assert one_paragraph(done.output, record, cause) == command
    explained = night.statestore("explain", os.path.relpath(night.path(record)))
    assert explained.exit_code == 0, explained.output
    unwrapped = explained.output.replace("\n", "")
    assert record.path in unwrapped and cause.split()[-1] in unwrapped
    assert COMMAND.findall(explained.output) == [command]  # its report on the file, then this
    assert "backup" not in explained.output and "untracked" not in explained.output
    validated = night.statestore("validate")
    assert validated.exit_code == 1, validated.output
    errors = [line for line in validated.output.splitlines() if line.startswith("  error: ")]
    assert errors and {c for e in errors for c in COMMAND.findall(e)} == {command}
    assert "a cold load reads" not in validated.output
    assert validated.output.count(record.path) == 1  # the table counts, the error line tells
    health = night.statestore("health", "--brief")
    assert health.exit_code == 2, health.output
    assert " ".join(health.output.split()).count(" ".join(command.split())) == 1


def run_as_printed(night: Night, command: str) -> Result:
    args = shlex.split(command)
    assert args[0] == "statestore"
    done = night.statestore(*args[1:])
    assert done.exit_code == 0, done.output
    return done


def test_a_missing_delta_restores_the_newest_intact_batch_exactly(night: Night) -> None:
    """Version 4's delta of one store is deleted: versions 4 and 5 are lost; batch 2 is the
    newest intact batch (not 4, which restore refuses), named with the Spark checkpoint the
    driver was given."""
    night.run(5)
    gone = night.files(FileKind.DELTA)[3]
    assert gone.version == 4
    night.path(gone).unlink()

    said = night.next_batch_fails()
    assert "\n" not in said and said.startswith("[STATE_LOST] batch 5 of query simulated ")
    command = one_paragraph(said, gone, "is missing from storage")
    assert command == (
        f"statestore restore {night.platform.root} --query simulated --to-batch 2 "
        f"--spark-checkpoint {night.spark} --execute"
    )
    every_tool_agrees(night, gone, "is missing from storage", command)

    refused = night.statestore(*shlex.split(command.replace("--to-batch 2", "--to-batch 4"))[1:])
    assert refused.exit_code == 3
    refusal = " ".join(refused.output.split())
    assert "batch 2 is the newest batch whose stores all load: restore it (--to-batch 2)" in (
        refusal
    )
    assert ". " not in refusal.split("cannot restore")[1]  # one sentence

    run_as_printed(night, command)
    assert sorted(p.name for p in (night.spark / "commits").iterdir()) == ["0", "1", "2"]
    night.model.rewind(2)
    night.assert_exact()
    night.batch = 3
    night.platform.restart_driver()
    night.run(3)  # the query goes on from batch 3
    night.assert_exact()


def test_a_flipped_byte_in_a_delta_gets_the_same_help(night: Night) -> None:
    night.run(4)
    newest = night.files(FileKind.DELTA)[-1]
    path = night.path(newest)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))

    said = night.next_batch_fails()
    command = one_paragraph(said, newest, "is damaged")
    assert command.endswith(f"--to-batch 2 --spark-checkpoint {night.spark} --execute")
    every_tool_agrees(night, newest, "is damaged", command)

    run_as_printed(night, command)
    night.model.rewind(2)
    night.assert_exact()


def test_a_truncated_snapshot_after_cleanup_is_lost_and_every_tool_says_so(
    night: Night,
) -> None:
    """Maintenance snapshots every store and cleanup removes the deltas below it; the
    snapshot of one store is then truncated: no batch loads that store, so every tool says
    lost unless --allow-lost-state (the dry run promises no rebuild that --execute refuses);
    run as printed, that store starts again from empty and the other keeps every row."""
    for batches in (4, 1):  # the second pass supersedes the first's files
        night.run(batches)
        maintained = night.statestore("--policy", "demo", "-q", "maintain", "--execute")
        assert maintained.exit_code == 0, maintained.output
    [snapshot] = night.files(FileKind.SNAPSHOT)
    assert all(f.version > snapshot.version for f in night.files(FileKind.DELTA))
    path = night.path(snapshot)
    path.write_bytes(path.read_bytes()[:60])

    said = night.next_batch_fails()
    command = one_paragraph(said, snapshot, "is damaged")
    assert command == (
        f"statestore restore {night.platform.root} --query simulated --to-batch 4 "
        f"--spark-checkpoint {night.spark} --allow-lost-state --execute"
    )
    every_tool_agrees(night, snapshot, "is damaged", command)

    run_as_printed(night, command)
    night.model.rewind(4, restarted=frozenset({DAMAGED.partition_id}))
    night.assert_exact()
    night.platform.restart_driver()
    night.run(2)
    night.assert_exact()


def test_a_bit_flipped_snapshot_above_intact_deltas_is_repaired(night: Night) -> None:
    """A snapshot whose deltas are kept (the default window): no batch fails (the loader
    walks the deltas); validate, health and explain name the repair, its dry run promises
    the rebuild and --execute does it, and the state is exact."""
    night.run(5)
    assert night.statestore("-q", "maintain", "--min-deltas", "4", "--execute").exit_code == 0
    night.run(1)
    [snapshot] = night.files(FileKind.SNAPSHOT)
    path = night.path(snapshot)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))

    night.platform.restart_driver()
    night.run(1)  # the batch loads through the deltas
    validated = night.statestore("validate", "--full")  # in place, size kept: full (or sample)
    assert validated.exit_code == 1, validated.output
    command = one_paragraph(
        "\n".join(e for e in validated.output.splitlines() if e.startswith("  error: ")),
        snapshot,
        "is damaged",
    )
    assert command == (
        f"statestore --root {night.platform.root} repair --store {DAMAGED} --execute"
    )
    every_tool_agrees(night, snapshot, "is damaged", command)

    done = run_as_printed(night, command)
    assert "1 repaired" in done.output
    assert night.statestore("validate").exit_code == 0
    health = night.statestore("health", "--brief")
    assert health.exit_code == 0 and "healthy" in health.output, health.output
    night.assert_exact()
    night.run(1)
    night.assert_exact()


def test_a_restore_below_retention_names_a_batch_that_restores(night: Night) -> None:
    """Cleanup removed the deltas below the snapshot: batch 1 no longer loads; the refusal is
    one sentence naming the newest batch whose stores all load (a later one), and that batch,
    run as named, restores exactly."""
    for batches in (4, 1):
        night.run(batches)
        maintained = night.statestore("--policy", "demo", "-q", "maintain", "--execute")
        assert maintained.exit_code == 0, maintained.output
    night.run(2)
    spark = f"--spark-checkpoint {night.spark}"
    root = night.platform.root
    refused = night.statestore(
        *shlex.split(f"restore {root} --query simulated --to-batch 1 {spark}")
    )
    assert refused.exit_code == 3, refused.output
    said = " ".join(refused.output.split())
    assert "cannot restore query simulated to batch 1: " in said
    assert "; batch 6 is the newest batch whose stores all load: restore it (--to-batch 6)" in said
    assert ". " not in said.split("cannot restore")[1]  # one sentence

    run_as_printed(
        night, f"statestore restore {root} --query simulated --to-batch 6 {spark} --execute"
    )
    night.assert_exact()


def test_a_damaged_snapshot_only_older_versions_need_is_accepted(night: Night) -> None:
    """The older of two snapshots is truncated: the latest version loads without it, so no
    batch fails; every tool names the same `resolve`, which run as printed closes the problem;
    once the query commits past the versions that needed it, cleanup deletes the file and
    validation passes."""
    night.run(4)
    demo = ("--policy", "demo", "-q", "maintain", "--execute")
    assert night.statestore(*demo).exit_code == 0
    night.run(3)
    assert night.statestore(*demo[:-1], "--min-deltas", "3", "--execute").exit_code == 0
    older, _ = night.files(FileKind.SNAPSHOT)
    path = night.path(older)
    path.write_bytes(path.read_bytes()[:60])

    validated = night.statestore("validate")
    assert validated.exit_code == 1, validated.output
    errors = [e for e in validated.output.splitlines() if e.startswith("  error: ")]
    command = one_paragraph(next(e for e in errors if older.path in e), older, "is damaged")
    assert command.startswith(f"statestore --root {night.platform.root} resolve --store {DAMAGED}")
    assert "only older retained versions needed it" in validated.output
    planned = night.statestore("repair")
    assert planned.exit_code == 1 and COMMAND.findall(planned.output)[0] == command

    run_as_printed(night, command)
    health = night.statestore("health", "--brief")
    assert health.exit_code == 0, health.output
    night.platform.restart_driver()
    night.run(2)  # the latest version loads from the newer snapshot
    assert night.statestore(*demo).exit_code == 0
    assert not path.exists()  # no retained version needs it any more: cleanup deleted it
    assert night.statestore("validate").exit_code == 0
    night.assert_exact()


@pytest.mark.parametrize(
    "command",
    [
        "restore {root} --query simulated --to-batch 1",
        "repartition {root} --query simulated --partitions 3 --idle 0s",
    ],
)
def test_a_command_without_the_spark_checkpoint_is_told_the_recorded_one(
    night: Night, command: str
) -> None:
    """restore and repartition, refused for want of --spark-checkpoint (before any Spark
    starts), name the folder the runtime recorded with the last batch, ready to paste."""
    night.run(3)
    refused = night.statestore(*shlex.split(command.format(root=night.platform.root)))
    assert refused.exit_code == 3, refused.output
    said = " ".join(refused.output.split())
    assert (
        f"keeps its Spark checkpoint: --spark-checkpoint {night.spark}, as the runtime "
        "recorded with its last batch" in said
    ), said


@pytest.mark.parametrize("columns", ["120", "80"])
def test_explain_on_a_long_path_stays_within_8_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, columns: str
) -> None:
    """A store below a deep folder (its root, the file's path and the command's Spark
    checkpoint each longer than a line): explain's report on a missing file prints at most 8
    lines at 120 or 80 columns, none wrapped into several, and its command runs as printed."""
    deep = tmp_path.joinpath(*[f"on-call-night-folder-{n}" for n in range(6)])
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    night = Night(deep)
    night.run(4)
    newest = night.files(FileKind.DELTA)[-1]
    night.path(newest).unlink()
    env = {"COLUMNS": columns, "STATE_CATALOG_URL": night.platform.catalog_url}
    explained = CliRunner(env=env).invoke(main, ["explain", str(night.path(newest))])
    assert explained.exit_code == 0, explained.output
    lines = explained.output.strip().splitlines()
    assert 1 <= len(lines) <= 8 and "" not in lines, explained.output
    # no line broken in two: the file's path and the command stay whole, to copy
    assert f"{night.platform.root}/{newest.path}" in lines[0]
    assert "verdict: missing" in lines and "store status: broken since " in explained.output
    (command,) = COMMAND.findall(explained.output)
    assert command.endswith(f"--to-batch 2 --spark-checkpoint {night.spark} --execute")
    run_as_printed(night, command)
