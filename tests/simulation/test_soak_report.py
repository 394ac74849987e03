"""The soak's saved failures keep what failed, even when hypothesis could not replay it; a
soak on several processes runs in each."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.simulation.soak import kind_of, main, report_of


def _failed_check() -> AssertionError:
    try:
        raise AssertionError("store 0/1 version 7 does not load")
    except AssertionError as caught:  # kept with its traceback, as a run's failure is
        return caught


def test_a_group_s_report_names_each_sub_exception_and_where_it_was_raised() -> None:
    group = ExceptionGroup("Inconsistent results", [_failed_check()])
    group.add_note("state.run(changes={}, fail='sink')")
    report = report_of(kind_of(group), group)
    assert report.startswith("ExceptionGroup: Inconsistent results")
    assert "state.run(changes={}, fail='sink')" in report
    assert "AssertionError: store 0/1 version 7 does not load" in report
    assert "in _failed_check" in report


def test_a_soak_on_two_processes_runs_in_each_and_adds_them_up(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """``--processes 2``: two soaks in fresh interpreters, each reporting its own runs and
    keeping its failures in a folder of its own; the total is theirs added up."""
    argv = ["--minutes", "0.05", "--examples", "1", "--steps", "3", "--report-every", "600"]
    assert main([*argv, "--processes", "2", "--out", str(tmp_path)]) == 0
    printed = capfd.readouterr().out
    steps = {
        k: int(re.findall(rf"^process {k}: [\d.]+ min: \d+ runs, (\d+) steps", printed, re.M)[-1])
        for k in (0, 1)
    }
    assert all(steps.values()), printed
    assert f"runs, {sum(steps.values())} steps, 0 failed runs" in printed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["process-0", "process-1"]
