"""Maintenance runs as the catalog records them: started, then succeeded or failed, with counts.

Before a run starts, runs left ``running`` by a process that died are closed as ``abandoned``
(see ``state_runtime.catalog.sql.runs_and_leases``); while it runs, a heartbeat shows it alive.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from state_runtime.catalog import HEARTBEAT_INTERVAL, Catalog, RunKind, RunOutcome
from state_runtime.errors import StateStoreError
from state_runtime.redaction import get_logger, redact

log = get_logger(__name__)


@dataclass
class RunRecord:
    """An open run: its id and the counts it will be closed with."""

    run_id: int
    counts: dict[str, Any] = field(default_factory=dict)


@contextmanager
def recorded_run(
    catalog: Catalog,
    kind: RunKind,
    owner: str,
    parameters: dict[str, Any],
    status_limits: Mapping[str, int] | None,
) -> Iterator[RunRecord]:
    """Record a run around a block: 'succeeded' when it ends, 'failed' with the error if not;
    the transaction that closes it records the run's stores whose status (under
    ``status_limits``; None: a run that records them itself) changed.

    Abandoned runs are closed first; a heartbeat thread keeps this one visibly alive."""
    for gone in catalog.close_abandoned_runs():
        log.warning("closed run %d (%s by %s): %s", gone.run_id, gone.kind, gone.owner, gone.error)
    run = RunRecord(catalog.start_run(kind.value, owner, parameters))
    with _heartbeat(catalog, run.run_id):
        try:
            yield run
        except BaseException as exc:
            catalog.finish_run(
                run.run_id,
                RunOutcome.FAILED.value,
                run.counts,
                redact(f"{type(exc).__name__}: {exc}"),
                status_limits=status_limits,
            )
            raise
    catalog.finish_run(
        run.run_id, RunOutcome.SUCCEEDED.value, run.counts, status_limits=status_limits
    )


@contextmanager
def _heartbeat(catalog: Catalog, run_id: int) -> Iterator[None]:
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_INTERVAL.total_seconds()):
            try:
                catalog.heartbeat(run_id)
            except StateStoreError as exc:  # the next beat tries again; the run goes on
                log.warning("maintenance run %d: heartbeat failed: %s", run_id, exc)

    thread = threading.Thread(target=beat, name=f"run-{run_id}-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
