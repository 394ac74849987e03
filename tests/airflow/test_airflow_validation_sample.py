"""The validation task reads what changed, by the task's ``policy`` (local files and S3)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.airflow.conftest import BOTH_CATALOGS
from tests.airflow.test_airflow_maintenance import stream  # noqa: F401  (fixture)
from tests.maintenance.streams import StoreStream


def validate(policy: dict[str, object]) -> dict[str, Any]:
    """One validation task run in process; its result's counts."""
    from state_runtime_airflow.operators import StateValidationOperator

    ti = SimpleNamespace(
        dag_id="d", task_id="validate", run_id="r", map_index=-1, xcom_push=lambda *_: None
    )
    task = StateValidationOperator(task_id="validate", policy=policy)
    counts: dict[str, Any] = task.execute({"ti": ti})["counts"]  # type: ignore[arg-type]
    return counts


@BOTH_CATALOGS
def test_a_second_validation_reads_nothing_and_a_deleted_file_fails_it(
    stream: StoreStream,  # noqa: F811
) -> None:
    stream.run(3)
    sample = {"verify_sample_percent": 0}
    assert validate(sample)["files"] == 9  # 3 stores, 3 deltas each, never verified
    again = validate(sample)
    assert (again["files"], again["files_present"]) == (0, 9)
    stream.run(1)
    assert validate(sample)["files"] == 3
    stream.storage.delete([stream.committed[stream.stores[0]][1].path])
    from airflow.sdk.exceptions import AirflowException

    for percent in (0, 0, 100):  # found by the listing, then read again, and in full
        with pytest.raises(AirflowException, match="lineage_valid failed"):
            validate({"verify_sample_percent": percent})
