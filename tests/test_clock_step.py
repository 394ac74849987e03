"""A wall-clock step on a long-running maintenance process (an NTP step, a VM resume).

The catalog's clock is the database's. It was once this host's clock plus an offset measured
every 300 s, so for up to 300 s after a step the host's jump was the catalog's: two hours
forward, and cleanup took an in-flight batch's recorded attempt, a fresh temporary file and
an unrecorded new file as hours old, and deleted them as never committed. Now the catalog's
clock advances by ``time.monotonic`` between measurements (a step cannot move it) and a step
is noticed at the next reading, which measures the database again.

The process here is real and its clock is really stepped: ``tests/faults/clock_shim.c``
shifts its ``clock_gettime``, ``gettimeofday`` and ``time`` by ``STATE_CLOCK_SKEW_S``, which
the process changes mid-run, after the catalog measured its clock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Connection

from state_runtime.catalog import Catalog
from state_runtime.catalog.connection import clock as clock_module
from state_runtime.catalog.connection.clock import DatabaseClock
from state_runtime.catalog.connection.engine import RetryPolicy, run_transaction
from state_runtime.storage import LocalStorage
from tests.catalog.conftest import (  # noqa: F401  (fixtures)
    pg_catalog,
    pg_database,
)
from tests.maintenance.streams import StoreStream
from tests.test_clock_skew import (  # noqa: F401  (the clock_shim fixture)
    REPO,
    STORES,
    clock_shim,
    files,
    snapshotted,
)

pytestmark = pytest.mark.postgres

STEP_S = 7200

STEPPED_HOST = """
import json, os, sys
from datetime import UTC, datetime, timedelta
from state_runtime.catalog import Catalog
from state_runtime.maintenance import Fleet, MaintenancePolicy, cleanup_pass, reconcile
from state_runtime.retention import RetentionPolicy
from state_runtime.storage import LocalStorage

spec = json.loads(sys.argv[1])
policy = MaintenancePolicy(retention=RetentionPolicy(
    window=timedelta(hours=1), orphan_grace=timedelta(hours=1)))
with Catalog.open(spec["url"]) as catalog:
    storage = LocalStorage(spec["path"])
    fleet = Fleet(catalog, open_storage=lambda root: storage, owner="stepped-host")
    before, host_before = catalog.now(), datetime.now(UTC)  # measured: the clock is right
    os.environ["STATE_CLOCK_SKEW_S"] = str(spec["step_s"])  # the host's clock steps
    host_after, after = datetime.now(UTC), catalog.now()
    cleaned = cleanup_pass(fleet, policy, dry_run=False)
    reconciled = reconcile(fleet, policy, dry_run=False)
    print(json.dumps({
        "host_jump_s": (host_after - host_before).total_seconds(),
        "catalog_jump_s": (after - before).total_seconds(),
        "deleted": sorted(v.file.path for v in cleaned.deleted),
        "leftovers_removed": len(cleaned.leftovers.removed) + len(reconciled.leftovers.removed),
        "attempt_intents": cleaned.attempts.intents,
        "in_flight": reconciled.in_flight,
    }), flush=True)
"""


def test_a_clock_step_mid_run_deletes_nothing_in_flight(
    tmp_path: Path,
    pg_catalog: Catalog,  # noqa: F811
    clock_shim: Path,  # noqa: F811
) -> None:
    stream: StoreStream = snapshotted(pg_catalog, tmp_path / "checkpoint")
    assert isinstance(stream.storage, LocalStorage)
    stream.catalog.begin_batch(
        stream.root, stream.query, stream.batch, "inflight", [(0, "default", 2)]
    )
    attempt = stream.abandoned_attempt(STORES[1])  # recorded by the batch in flight
    temporary = stream.storage.root / STORES[0].directory / ".tmp-steptest.part"
    temporary.write_bytes(b"half a file")
    fresh = stream.write(STORES[0])[0].path  # written, not recorded yet
    before = files(stream)
    spec = {
        "url": stream.catalog.engine.url.render_as_string(hide_password=False),
        "path": str(stream.storage.root),
        "step_s": STEP_S,
    }
    done = subprocess.run(
        [sys.executable, "-c", STEPPED_HOST, json.dumps(spec)],
        cwd=REPO,
        env=os.environ | {"LD_PRELOAD": str(clock_shim), "STATE_CLOCK_SKEW_S": "0"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert abs(answer["host_jump_s"] - STEP_S) < 5, answer  # the step was real
    assert abs(answer["catalog_jump_s"]) < 5, answer  # and moved the catalog's clock not
    assert answer["deleted"] == [], answer
    assert answer["leftovers_removed"] == 0 and answer["attempt_intents"] == 0, answer
    assert answer["in_flight"] == [fresh], answer
    assert files(stream) == before and temporary.exists()
    assert attempt.path in before
    for store in STORES:
        assert stream.loaded(store, 14) == stream.expected(store, 14)


class _SteppedTime:
    """The ``time`` module as the clock sees it after a wall-clock step of ``step_s``."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s

    def time(self) -> float:
        return time.time() + self.step_s

    def monotonic(self) -> float:
        return time.monotonic()


def test_a_step_noticed_inside_a_transaction_takes_no_second_connection(
    pg_catalog: Catalog,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``now()`` runs inside the catalog's transactions. It once read the database again there
    when it noticed a step: a second pooled connection, taken while holding the clock's lock,
    which threads that each hold a connection and wait on that lock can starve. The step is
    noticed by the next transaction's ``sync`` instead, and the clock did not move meanwhile."""
    engine = pg_catalog.engine
    clock = DatabaseClock(engine, RetryPolicy())
    clock.sync()
    held, most, taken = 0, 0, 0

    def checkout(*_: object) -> None:
        nonlocal held, most, taken
        held, taken = held + 1, taken + 1
        most = max(most, held)

    def checkin(*_: object) -> None:
        nonlocal held
        held -= 1

    event.listen(engine.pool, "checkout", checkout)
    event.listen(engine.pool, "checkin", checkin)

    def work(_: Connection) -> tuple[datetime, datetime]:
        before = clock.now()
        monkeypatch.setattr(clock_module, "time", _SteppedTime(STEP_S))
        return before, clock.now()

    before, after = run_transaction(engine, work, retry=RetryPolicy(), what="a transaction")
    assert most == 1 and taken == 1
    assert abs((after - before).total_seconds()) < 5
    clock.sync()  # the next transaction's: the step is noticed, the database read again
    assert taken == 2
    assert abs((clock.now() - after).total_seconds()) < 5
