"""A chain's tiny format 3 deltas decoded together (issue 35).

A store of 200 partitions commits deltas of a few rows; loading its latest version for a
snapshot reads ten or so of them, and each cost about 0.6 ms of CPU, nearly all of it fixed
per file: each file's narrow fields decoded, its struct columns rebuilt, its columns checked
and its run built, a few dozen Arrow calls for a few rows. Here every file is still verified
alone, in the loader's walk and before any of it is used (envelope and CRC-32, header,
schema id, every row buffer validated, identity, lineage: :func:`parse_compact_rows`); what
is done once for the chain's files of one stored layout is decoding their narrow fields
(:func:`~state_runtime.store.column_encoding.decode_small_tables`, each file's values through
the same checks), the layout check, the projection to the store's schema and the index of
their keys. Each file's run is then its slice of those rows, as :meth:`Run.build` of the file
alone gives it.

Only deltas of at most :data:`~state_runtime.store.column_encoding.SMALL` rows take this
path, and only while every file decodes cleanly: on any fault, or duplicate keys in a file,
:func:`runs_together` answers None and the loader decodes
each file alone, in its walk's order, which raises the same error, naming the same file, as
a load that never took this path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from state_runtime.identity import CheckpointRef, FileKind
from state_runtime.store.checkpoint_format import PARSE_ERRORS, FileHeader, layout_problem
from state_runtime.store.column_encoding import SMALL, decode_small_tables
from state_runtime.store.keys import KeyIndexer
from state_runtime.store.schema_evolution import Projection
from state_runtime.store.sorted_runs import Run, run_of


@dataclass(frozen=True)
class TinyDelta:
    """A verified format 3 delta whose rows are parsed, as stored, and not yet decoded."""

    ref: CheckpointRef
    kind: FileKind
    path: str
    header: FileHeader
    """With the schema its id names."""
    stored: pa.Table
    encodings: dict[str, Any]
    projection: Projection | None
    """How its rows read under the store's schema (None: the file is read alone)."""


def is_tiny(header: FileHeader) -> bool:
    """Whether a format 3 delta of this header is decoded with its chain's."""
    return header.kind is FileKind.DELTA and header.file_rows <= SMALL


def runs_together(indexer: KeyIndexer, deltas: Sequence[TinyDelta]) -> list[Run] | None:
    """Each delta's run (its rows under the store's schema, in index order), those of one
    stored layout decoded together; None when any delta does not decode cleanly or holds a
    key twice (decode each alone: that names the fault)."""
    groups: list[tuple[TinyDelta, list[int]]] = []  # few: compared, not hashed
    for i, delta in enumerate(deltas):
        for first, members in groups:
            if _alike(first, delta):
                members.append(i)
                break
        else:
            groups.append((delta, [i]))
    runs: list[Run | None] = [None] * len(deltas)
    for _, members in groups:
        group = [deltas[i] for i in members]
        made = _group_runs(indexer, group)
        if made is None:
            return None
        for i, run in zip(members, made, strict=True):
            runs[i] = run
    return [run for run in runs if run is not None]


def _alike(a: TinyDelta, b: TinyDelta) -> bool:
    """Whether two deltas' rows decode together: one projection, one stored layout, the same
    fields stored narrow."""
    return (
        a.projection is b.projection
        and a.encodings.keys() == b.encodings.keys()
        and a.stored.schema.equals(b.stored.schema)
    )


def _group_runs(indexer: KeyIndexer, group: list[TinyDelta]) -> list[Run] | None:
    """The runs of deltas of one projection and stored layout (see :func:`runs_together`)."""
    schema = group[0].header.schema
    assert schema is not None
    try:
        table = decode_small_tables(
            [d.stored for d in group],
            [d.encodings for d in group],
            schema.key_arrow,
            schema.value_arrow,
        )
    except PARSE_ERRORS:
        return None
    if layout_problem(table, schema.key_arrow, schema.value_arrow):
        return None
    if any(d.stored.num_rows != d.header.file_rows for d in group):
        return None
    projection = group[0].projection
    assert projection is not None
    keys, values = projection.apply(
        table.column("key").combine_chunks(), table.column("value").combine_chunks()
    )
    index = indexer.index(keys)
    runs = []
    start = 0
    for delta in group:
        rows = delta.header.file_rows
        part = index[start : start + rows]
        file_keys, file_values = keys.slice(start, rows), values.slice(start, rows)
        start += rows
        if len(part) < 2 or bool(np.all(part[1:] > part[:-1])):
            runs.append(run_of(part, file_keys, file_values))
            continue
        run, duplicates = Run.build(indexer, file_keys, file_values)  # another order
        if duplicates:
            return None
        runs.append(run)
    return runs
