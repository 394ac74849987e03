"""A new driver process that resumes our side of differential streams after a stop:
``python -m tests.runtime.resume JOBS OUT`` reads pickled :class:`Resume` jobs, runs each
stream's remaining batches in a Spark session of its own (new query objects on the streams'
checkpoint roots and catalog), and pickles each job's output rows per batch to ``OUT``."""

from __future__ import annotations

import pickle
import sys
from dataclasses import dataclass
from pathlib import Path

from .differential import OPERATORS, Rows, Stream, run_ours, session_for


@dataclass(frozen=True)
class Resume:
    operator: str
    stream: Stream
    folder: Path
    catalog_url: str
    first: int
    """The first batch this process runs (the earlier ones ran in another process)."""


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
            operator = OPERATORS[job.operator]
            out.append(
                run_ours(session, operator, job.stream, job.folder, job.catalog_url, batches)
            )
        Path(out_path).write_bytes(pickle.dumps(out))
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
