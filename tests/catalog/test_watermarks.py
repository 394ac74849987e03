"""Each batch's watermark in the catalog: fixed once, reused by replays (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest

from state_runtime.catalog import Catalog
from state_runtime.errors import InvalidArgument


def test_catalog_keeps_the_first_watermark_of_a_batch(catalog: Catalog) -> None:
    root = "file:///tmp/wm"
    assert catalog.batch_watermark(root, "q", 0) is None
    assert catalog.fix_watermark(root, "q", 0, 100).watermark_ms == 100
    assert catalog.fix_watermark(root, "q", 0, 999).watermark_ms == 100  # a replay reuses it
    catalog.record_max_event_time(root, "q", 0, 7000)
    found = catalog.batch_watermark(root, "q", 0)
    assert found is not None and (found.watermark_ms, found.max_event_ms) == (100, 7000)
    assert catalog.batch_watermark(root, "other", 0) is None
    with pytest.raises(InvalidArgument):
        catalog.fix_watermark(root, "q", -1, 0)
