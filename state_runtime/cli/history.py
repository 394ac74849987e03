"""Inspection of the past: ``history`` (versions, micro-batches, schema changes,
repartitions) and ``metrics`` (each batch's figures), with their printers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from state_runtime.catalog import (
    DISK_FIGURES,
    Layout,
    RecordedBatchMetrics,
    VersionHistory,
)
from state_runtime.cli.exits import (
    EXIT_USAGE,
    fail,
)
from state_runtime.cli.group import (
    Settings,
    emit,
    emit_part,
    json_option,
    open_fleet,
    store_option,
    stores_of,
)
from state_runtime.cli.jsonable import jsonable
from state_runtime.cli.printing import below, print_prefix, root_prefix, show
from state_runtime.maintenance import (
    Fleet,
    SchemaChangeRow,
    canonical_root,
    schema_changes,
)
from state_runtime.units import millis, size


@click.command()
@click.option("--query", "query_id", help="Only the versions this query committed.")
@click.option("--by-batch", is_flag=True, help="One line per micro-batch (all its stores) instead.")
@click.option(
    "--schemas", is_flag=True, help="Each operator store's schema changes, with their batch."
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=50,
    help="Newest versions per root; with --by-batch, newest whole micro-batches per root.",
)
@json_option
@store_option
@click.pass_obj
def history(settings: Settings, /, **kw: Any) -> None:
    """Committed versions, newest first, like Delta's DESCRIBE HISTORY: the batch and query
    that committed each, its checkpoint id, when, state rows, the delta's bytes, and what
    became of its files (snapshots written, files deleted and why). With --schemas: each
    schema change instead, from which batch, and what it changed."""
    with open_fleet(settings) as fleet:
        only = stores_of(fleet, kw["stores"])
        roots = fleet.root_names(only)
        if kw["schemas"]:
            changes = schema_changes(fleet.catalog, roots)
            emit(changes, print_schema_changes)
            return
        query = kw["query_id"]
        known = sorted({q for root in roots for q in fleet.catalog.query_ids(root)})
        if query is not None and query not in known:
            fail(
                EXIT_USAGE,
                f"--query {query!r}: no such query committed below {', '.join(roots)} "
                f"(known: {', '.join(known[:10]) or 'none'})",
            )
        entries = []
        layouts = [x for root in roots for x in fleet.catalog.layout_history(root)]
        for root in roots:
            wanted = None if only is None else [k.store for k in only if k.root == root]
            # A batch commits at most one version per store: N batches fit in N x stores rows.
            per_batch = len(wanted) if wanted is not None else len(fleet.catalog.stores(root))
            rows = kw["limit"] * max(per_batch, 1) if kw["by_batch"] else kw["limit"]
            found = fleet.catalog.version_history(root, stores=wanted, query_id=query, limit=rows)
            entries += newest_batches(found, kw["limit"]) if kw["by_batch"] else found
    if kw["by_batch"]:
        emit(batch_history(entries), print_batch_history)
    else:
        emit(entries, print_history)
    emit_part(layouts, print_layout_changes)


@click.command()
@click.argument("root", required=False)
@click.option(
    "--query",
    "query_id",
    help="The query whose batches to show.",
    show_default="the one query in scope",
)
@click.option("--limit", type=click.IntRange(min=1), default=50, help="Newest batches.")
@json_option
@click.pass_obj
def metrics(settings: Settings, /, root: str | None, **kw: Any) -> None:
    """Each micro-batch's figures as the runtime recorded them, newest first: rows in, keys
    updated, state rows, bytes written, commit time, batch time, load time, cache hits (the
    view state_batch_metrics holds the same).

    Scoped like the other commands: the root is ROOT or --root, else the root that --query
    names; the query is --query, else the one query in scope. Several in scope are refused,
    each named with its root."""
    if root is not None:
        settings.roots = [canonical_root(root)]
    with open_fleet(settings) as fleet:
        scope, query_id = _one_query(fleet, kw["query_id"])
        batches = fleet.catalog.batch_metrics(scope, query_id, limit=kw["limit"])
    emit(
        batches,
        lambda console, shown: print_metrics(console, query_id, shown),
        as_json=lambda shown: [metrics_json(b) for b in shown],
    )


def _one_query(fleet: Fleet, wanted: str | None) -> tuple[str, str]:
    """The (root, query) in scope that ``wanted`` (or, if None, the scope alone) names; bad
    input, listing the queries in scope with their roots, when none or several do."""
    found = [(r, q) for r in fleet.root_names() for q in fleet.catalog.query_ids(r)]
    chosen = [(r, q) for r, q in found if wanted in (None, q)]
    if len(chosen) == 1:
        return chosen[0]
    listed = ", ".join(f"{q} below {r}" for r, q in (chosen or found)[:10]) or "none"
    if not chosen:
        given = "" if wanted is None else f"--query {wanted!r}: no such query; "
        fail(EXIT_USAGE, f"{given}the queries in scope: {listed}")
    more = "--query" if wanted is None else "--root"
    fail(EXIT_USAGE, f"{len(chosen)} queries in scope ({listed}): name one with {more}")


def print_history(console: Console, entries: Sequence[VersionHistory]) -> None:
    """One line per committed version, newest first, then each version's later events."""
    roots = {e.key.root for e in entries}
    prefix = root_prefix(roots)
    print_prefix(console, prefix, roots)
    table = Table(title=f"History ({len(entries)} committed versions, newest first)")
    for name in ("store", "version", "batch", "query", "checkpoint id", "committed"):
        table.add_column(name)
    for name in ("rows", "bytes", "files", "snapshots", "deleted"):
        table.add_column(name, justify="right")
    for e in entries:
        table.add_row(
            below(prefix, e.key.root, f"#{e.key.store}"),
            str(e.ref.version),
            str(e.batch_id),
            e.query_id,
            e.ref.checkpoint_id or "-",
            f"{e.committed_at:%Y-%m-%d %H:%M:%S}",
            f"{e.rows:,}",
            size(e.bytes_written),
            str(len(e.files)),
            ", ".join(f"{s.verification}" for s in e.snapshots) or "-",
            str(len(e.deleted)) or "-",
        )
    show(console, table)
    for e in entries:
        shown = below(prefix, e.key.root, f"#{e.key.store}")
        for f in e.files:
            if f.kind.value == "snapshot":
                console.print(
                    f"  {shown} v{e.ref.version}: snapshot {f.path} written "
                    f"{f.created_at:%Y-%m-%d %H:%M:%S}, {size(f.size_bytes)}, {f.verification}"
                )
            if f.deleted_at is not None:
                console.print(
                    f"  {shown} v{e.ref.version}: deleted {f.path} at "
                    f"{f.deleted_at:%Y-%m-%d %H:%M:%S} by run {f.deletion_run}: "
                    f"{f.deletion_reason}"
                )


def newest_batches(entries: Sequence[VersionHistory], limit: int) -> list[VersionHistory]:
    """The versions of the ``limit`` newest micro-batches among ``entries`` (newest first,
    as the catalog returns them: a batch's versions share its commit time), whole."""
    kept: set[tuple[str, int]] = set()
    chosen = []
    for e in entries:
        batch = (e.query_id, e.batch_id)
        if batch not in kept:
            if len(kept) == limit:
                continue
            kept.add(batch)
        chosen.append(e)
    return chosen


def batch_history(entries: Sequence[VersionHistory]) -> list[dict[str, Any]]:
    """The versions grouped by (root, query, batch), newest batch first: one micro-batch
    and all its stores per entry."""
    groups: dict[tuple[str, str, int], list[VersionHistory]] = {}
    for e in entries:
        groups.setdefault((e.key.root, e.query_id, e.batch_id), []).append(e)
    return [
        {
            "root": root,
            "query_id": query,
            "batch_id": batch,
            "committed_at": jsonable(max(e.committed_at for e in group)),
            "stores": len(group),
            "versions": sorted({e.ref.version for e in group}),
            "rows": sum(e.rows for e in group),
            "bytes_written": sum(e.bytes_written for e in group),
            "files": sum(len(e.files) for e in group),
            "snapshots": sum(len(e.snapshots) for e in group),
            "deleted_files": sum(len(e.deleted) for e in group),
        }
        for (root, query, batch), group in sorted(
            groups.items(), key=lambda item: (item[0][0], item[0][1], -item[0][2])
        )
    ]


def print_batch_history(console: Console, batches: Sequence[dict[str, Any]]) -> None:
    roots = {b["root"] for b in batches}
    prefix = root_prefix(roots)
    print_prefix(console, prefix, roots)
    table = Table(title=f"History ({len(batches)} micro-batches, newest first)")
    for name in ("root", "query", "batch", "committed", "stores", "versions"):
        table.add_column(name)
    for name in ("rows", "bytes", "files", "snapshots", "deleted"):
        table.add_column(name, justify="right")
    for b in batches:
        versions = b["versions"]
        table.add_row(
            below(prefix, b["root"]),
            b["query_id"],
            str(b["batch_id"]),
            b["committed_at"],
            str(b["stores"]),
            str(versions[0]) if len(versions) == 1 else f"{versions[0]}..{versions[-1]}",
            f"{b['rows']:,}",
            size(b["bytes_written"]),
            str(b["files"]),
            str(b["snapshots"]),
            str(b["deleted_files"]),
        )
    show(console, table)


def print_schema_changes(console: Console, rows: Sequence[SchemaChangeRow]) -> None:
    """One line per schema of each operator store, oldest first, with what changed."""
    table = Table(title=f"Schema history ({len(rows)} schemas)")
    for name in ("root", "operator", "store", "from batch", "schema id", "key", "value", "change"):
        table.add_column(name, no_wrap=name in ("schema id", "from batch"))
    for r in rows:
        table.add_row(
            r.root,
            str(r.operator_id),
            r.store_name,
            str(r.from_batch),
            r.schema_id[:12],
            r.key_schema,
            r.value_schema,
            "; ".join(r.actions),
        )
    show(console, table)


def print_layout_changes(console: Console, layouts: Sequence[Layout]) -> None:
    """The repartitions among ``layouts`` (oldest first per operator), one line each."""
    previous: dict[tuple[str, int, str], int] = {}
    for x in layouts:
        key = (x.root, x.operator_id, x.store_name)
        if x.run_id is not None:
            console.print(
                f"repartition: {x.root} operator {x.operator_id} ({x.store_name}) of query "
                f"{x.query_id}: {previous.get(key, '?')} -> {x.num_partitions} partitions from "
                f"batch {x.from_batch} (snapshots at version {x.from_version}), run {x.run_id} "
                f"at {x.recorded_at:%Y-%m-%d %H:%M:%S}",
                soft_wrap=True,
                highlight=False,
            )
        previous[key] = x.num_partitions


def metrics_json(recorded: RecordedBatchMetrics) -> dict[str, Any]:
    """One batch's figures, flat: the recorded columns, then the runtime's extra figures."""
    m = recorded.metrics
    return {
        "root": recorded.root,
        "query_id": recorded.query_id,
        "batch_id": recorded.batch_id,
        "recorded_at": jsonable(recorded.recorded_at),
        "rows_in": m.rows_in,
        "keys_updated": m.keys_updated,
        "state_rows": m.state_rows,
        "bytes_written": m.bytes_written,
        "commit_ms": m.commit_ms,
        "cache_hits": m.cache_hits,
        "cache_misses": m.cache_misses,
        **{name: getattr(m, name) for name in DISK_FIGURES},
    } | {key: jsonable(value) for key, value in m.extra.items()}


def print_metrics(console: Console, query_id: str, batches: Sequence[RecordedBatchMetrics]) -> None:
    """One row per batch, newest first."""
    table = Table(title=f"Batch metrics of query {query_id} ({len(batches)} batches, newest first)")
    for name in ("batch", "recorded", "rows in", "keys updated", "state rows", "written"):
        table.add_column(name, justify="left" if name == "recorded" else "right")
    for name in ("commit", "batch time", "max load", "cache hits", "resident", "local disk"):
        table.add_column(name, justify="right")
    for b in batches:
        m, extra = b.metrics, b.metrics.extra
        looked = m.cache_hits + m.cache_misses
        table.add_row(
            str(b.batch_id),
            b.recorded_at.strftime("%Y-%m-%d %H:%M:%S"),
            f"{m.rows_in:,}",
            f"{m.keys_updated:,}",
            f"{m.state_rows:,}",
            size(m.bytes_written),
            millis(m.commit_ms),
            millis(extra.get("batch_ms")),
            millis(extra.get("max_load_ms")),
            f"{m.cache_hits}/{looked}" if looked else "-",
            size(m.resident_bytes),
            size(m.local_disk_bytes),
        )
    show(console, table)
