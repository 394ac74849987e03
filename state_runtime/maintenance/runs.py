"""Maintenance runs as the catalog records them: started, then succeeded or failed, with counts."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from state_runtime.catalog import Catalog, RunKind, RunOutcome


@dataclass
class RunRecord:
    """An open run: its id and the counts it will be closed with."""

    run_id: int
    counts: dict[str, Any] = field(default_factory=dict)


@contextmanager
def recorded_run(
    catalog: Catalog, kind: RunKind, owner: str, parameters: dict[str, Any]
) -> Iterator[RunRecord]:
    """Record a run around a block: 'succeeded' when it ends, 'failed' with the error if not."""
    run = RunRecord(catalog.start_run(kind.value, owner, parameters))
    try:
        yield run
    except BaseException as exc:
        catalog.finish_run(
            run.run_id, RunOutcome.FAILED.value, run.counts, f"{type(exc).__name__}: {exc}"
        )
        raise
    catalog.finish_run(run.run_id, RunOutcome.SUCCEEDED.value, run.counts)
