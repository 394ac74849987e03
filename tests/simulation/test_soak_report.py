"""The soak's saved failures keep what failed, even when hypothesis could not replay it."""

from __future__ import annotations

from tests.simulation.soak import kind_of, report_of


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
