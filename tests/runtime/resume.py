"""A new driver process that resumes our side of differential streams after a stop:
``python -m tests.runtime.resume JOBS OUT`` reads pickled :class:`Resume` jobs, runs each
stream's remaining batches in a Spark session of its own (new query objects on the streams'
checkpoint roots and catalog), and pickles each job's output rows per batch to ``OUT``."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .differential import OPERATORS, Operator, Rows, Stream, run_ours, session_for


@dataclass(frozen=True)
class Resume:
    operator: str
    stream: Stream
    folder: Path
    catalog_url: str
    first: int
    """The first batch this process runs (the earlier ones ran in another process)."""


def operator_named(name: str) -> Operator:
    """An operator of the differential harness, or a ``transform_with_state`` processor of
    :mod:`.tws_processors` by its class name."""
    if name in OPERATORS:
        return OPERATORS[name]
    from .tws_processors import tws_operator_named

    return tws_operator_named(name)


def resume_elsewhere(jobs: list[Resume]) -> list[dict[int, Rows]]:
    """Run ``jobs`` in a new driver process (this module as a subprocess: its own Spark
    session, query objects, catalog connections and Python workers); each job's rows per
    batch."""
    work = Path(tempfile.mkdtemp(prefix="diff-resume-"))
    (work / "jobs.pkl").write_bytes(pickle.dumps(jobs))
    root = str(Path(__file__).resolve().parents[2])  # this checkout, for its Python workers too
    subprocess.run(
        [sys.executable, "-m", "tests.runtime.resume", str(work / "jobs.pkl"), str(work / "out")],
        cwd=root,
        env={**os.environ, "PYTHONPATH": root},
        check=True,
        timeout=900,
    )
    resumed: list[dict[int, Rows]] = pickle.loads((work / "out").read_bytes())
    shutil.rmtree(work, ignore_errors=True)
    return resumed


def main(jobs_path: str, out_path: str) -> None:
    from pyspark import cloudpickle

    import tests
    from state_runtime.runtime.spark_session import spark_session

    cloudpickle.register_pickle_by_value(tests)  # update functions travel by value
    jobs: list[Resume] = pickle.loads(Path(jobs_path).read_bytes())
    spark = spark_session("local[2]", app_name="differential-resume", shuffle_partitions=2)
    try:
        out: list[dict[int, Rows]] = []
        for job in jobs:
            batches = range(job.first, len(job.stream.batches))
            session = session_for(spark, job.stream)
            operator = operator_named(job.operator)
            out.append(
                run_ours(session, operator, job.stream, job.folder, job.catalog_url, batches)
            )
        Path(out_path).write_bytes(pickle.dumps(out))
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
