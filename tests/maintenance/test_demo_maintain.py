"""``make demo-maintain`` on a finished demo-like stream: snapshots written, files deleted,
stores validated, with real effect (real make, real CLI process, SQLite catalog)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from state_runtime.catalog import Catalog, RetentionPolicy
from state_runtime.identity import StoreId
from state_runtime.storage import LocalStorage
from tests.maintenance.streams import StoreStream

REPO = Path(__file__).resolve().parents[2]


def test_demo_maintain_snapshots_cleans_and_validates(tmp_path: Path) -> None:
    database = tmp_path / "demo-output" / "catalog.db"
    stores = [StoreId(0, p) for p in range(4)]
    with Catalog.open(f"sqlite:///{database}", upgrade=True) as catalog:
        stream = StoreStream(catalog, LocalStorage(database.parent / "checkpoint"), stores)
        stream.run(10)
        stream.abandoned_attempt(stores[0])  # a lost task attempt: an orphan
    done = subprocess.run(
        ["make", "-s", "-C", str(REPO), "demo-maintain", f"DEMO_CATALOG=sqlite:///{database}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "snapshots (run" in done.stdout and "4 written" in done.stdout
    assert "History (10 micro-batches, newest first)" in done.stdout
    with Catalog.open(f"sqlite:///{database}") as catalog:
        deleted = catalog.deletion_history()
        # delta 10 of each store (snapshot 10 replaces it) and the orphan
        assert len(deleted) == 5
        health = catalog.store_health(RetentionPolicy())
        assert {h.last_snapshot_version for h in health} == {10}
        assert all(h.last_validated_at is not None and not h.open_problems for h in health)
    for store in stores:
        for version in (9, 10):
            assert stream.loaded(store, version) == stream.expected(store, version)
