"""What every family's printers share: tables that never cut a value, roots printed once
above their rows, and the unfinished writes a cleanup or a reconcile found."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from state_runtime.maintenance import (
    LeftoverReport,
)

SHOWN = 20  # rows of detail before "... and N more"


def show(console: Console, table: Table) -> None:
    """Print a table, never cutting a value, at any width (``COLUMNS``, a terminal): when
    every figure fits whole and every word of text fits its column, as a table (a path too
    long for its column folds onto the next line); when the width cannot hold that (80
    columns, a dozen columns), one block per row, a ``column: value`` line each, like psql's
    expanded display."""
    for column in table.columns:
        column.overflow = "fold"
        column.no_wrap = False
    if _narrowest(table) <= console.width:
        console.print(table)
        return
    headers = [str(column.header) for column in table.columns]
    width = max(len(h) for h in headers)
    if table.title:
        console.print(str(table.title))
    for row in range(table.row_count):
        console.print()
        for header, column in zip(headers, table.columns, strict=True):
            console.print(f"{header:>{width}}: {list(column.cells)[row]}")
    if table.caption:
        console.print(f"\n{table.caption}")


def _narrowest(table: Table) -> int:
    """The width a table needs with whole figures and whole words of text."""
    needed = 1
    for column in table.columns:
        cells = [Text.from_markup(str(c)).plain for c in (column.header, *column.cells)]
        if column.justify == "right":
            needed += max(len(c) for c in cells) + 3
        else:
            needed += min(max(len(w) for c in cells for w in c.split() or [""]), 24) + 3
    return needed


def root_prefix(roots: Collection[str]) -> str:
    """What to print once above rows of stores: the root when there is one, else the folder
    the roots share (empty if none); each row then shows only the rest (:func:`below`)."""
    unique = sorted(set(roots))
    if len(unique) == 1:
        return unique[0]
    first, last = (unique[0], unique[-1]) if unique else ("", "")
    shared = 0
    while shared < min(len(first), len(last)) and first[shared] == last[shared]:
        shared += 1
    return first[: first.rfind("/", 0, shared) + 1] if shared else ""


def below(prefix: str, root: str, rest: str = "") -> str:
    """A root (and what follows it, ``#store``) as a row shows it below ``prefix``."""
    if root == prefix:
        return rest.removeprefix("#") or "."
    return root.removeprefix(prefix) + rest


def print_prefix(console: Console, prefix: str, roots: Collection[str]) -> None:
    """``root: <root>`` on one line when it fits the width; else the label, then the root on
    lines of its own, folded at the width (``COLUMNS``, a terminal; never on a pipe without
    ``COLUMNS``)."""
    if prefix:
        label = "root" if len(set(roots)) == 1 else "roots below"
        line = f"{label}: {prefix}"
        if len(line) <= console.width:
            console.print(line, markup=False)
        else:
            console.print(f"{label}:")
            console.print(prefix, markup=False, overflow="fold")


def print_leftovers(console: Console, report: LeftoverReport) -> None:
    """Unfinished writes of killed writers, if any were found: the report's summary and rows."""
    if not report.found:
        return
    console.print(report.summary(), markup=False, soft_wrap=True)
    print_lines(console, report.rows())


def print_lines(console: Console, rows: Sequence[dict[str, Any]]) -> None:
    """Rows that name no store (one per file): each row's ``detail``, the first
    :data:`SHOWN`, then how many more."""
    for row in rows[:SHOWN]:
        console.print(f"  {row['detail']}", markup=False, soft_wrap=True)
    if len(rows) > SHOWN:
        console.print(f"  ... and {len(rows) - SHOWN} more")


def print_rows(console: Console, rows: Sequence[dict[str, Any]], listed: str = "") -> None:
    """A report's rows as lines, ``store: detail`` (and, indented below, the row's ``listed``
    list when named), the first :data:`SHOWN`, then how many more."""
    for row in rows[:SHOWN]:
        console.print(f"  {row['store']}: {row['detail']}", markup=False, soft_wrap=True)
        for line in row[listed] if listed else ():
            console.print(f"    {line}", markup=False, soft_wrap=True)
    if len(rows) > SHOWN:
        console.print(f"  ... and {len(rows) - SHOWN} more")
