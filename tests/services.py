"""Tests and services: under CI a missing service fails, elsewhere it skips loudly."""

from __future__ import annotations

import os
import warnings

import pytest

IN_CI = bool(os.environ.get("CI"))


def service_missing(name: str, detail: str) -> None:
    """Fail (under CI) or skip loudly (on a laptop) a test whose service is not reachable."""
    message = f"{name} is not available: {detail}"
    if IN_CI:
        pytest.fail(f"{message} (CI requires it; a missing service is a failure, not a skip)")
    warnings.warn(f"SKIPPING: {message}", stacklevel=2)
    pytest.skip(message)
