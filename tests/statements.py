"""What a block of code sends a catalog: an SQLAlchemy listener on ``after_cursor_execute``
that keeps what each test asks of every statement run while the block runs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, ExecutionContext

T = TypeVar("T")

Keep = Callable[[Connection, str, ExecutionContext], "T | None"]


def _text(_conn: Connection, statement: str, _context: ExecutionContext) -> str:
    return statement


@contextmanager
def executed(
    target: sa.Engine | type[sa.Engine],
    keep: Keep[T] = _text,  # type: ignore[assignment]
) -> Iterator[list[T]]:
    """What ``keep`` makes of each statement ``target`` (an engine, or every engine) runs
    while the block runs, in order; a statement it returns ``None`` for is left out. By
    default, each statement's text."""
    seen: list[T] = []

    def note(
        conn: Connection, _cursor: Any, statement: str, _parameters: Any, context: Any, _many: bool
    ) -> None:
        found = keep(conn, statement, context)
        if found is not None:
            seen.append(found)

    sa.event.listen(target, "after_cursor_execute", note)
    try:
        yield seen
    finally:
        sa.event.remove(target, "after_cursor_execute", note)


def statements(target: sa.Engine | type[sa.Engine]) -> AbstractContextManager[list[str]]:
    """The text of each statement ``target`` runs while the block runs."""
    return executed(target, lambda _conn, statement, _context: statement)
