"""Shared fixtures. Service fixtures fail under CI when the service is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from state_runtime.storage import LocalStorage, Storage

BACKENDS = ["local"]


@pytest.fixture(params=BACKENDS)
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    """A fresh, empty checkpoint root on each storage backend."""
    if request.param == "local":
        return LocalStorage(tmp_path / "checkpoint")
    raise AssertionError(request.param)
