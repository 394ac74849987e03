"""Every catalog engine of a process compiles into one cache (statement_cache.py): a catalog
opened later runs the statements an earlier one compiled without compiling them again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import event

from state_runtime.catalog import Catalog
from state_runtime.catalog.connection.statement_cache import COMPILED


def test_a_catalog_opened_later_compiles_nothing_an_earlier_one_compiled(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    with Catalog.open(url, upgrade=True) as first:
        assert first.roots() == []
    assert len(COMPILED) > 0
    with Catalog.open(url) as second:
        hits: list[bool] = []

        @event.listens_for(second.engine, "after_cursor_execute")
        def seen(*args: Any) -> None:
            context = args[4]
            if context.compiled is not None:
                hits.append(context.cache_hit == context.dialect.CACHE_HIT)

        assert second.roots() == []
    assert hits and all(hits), hits
