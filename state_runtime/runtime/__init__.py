"""The streaming runtime: stateful micro-batches on PySpark with ``state_runtime`` stores.

The public names are imported when first used (PEP 562): a Python worker that unpickles a
task function (``state_runtime.runtime.tasks``) initialises this package first, and should
import the stores and the operators only, never the driver's catalog (SQLAlchemy, Alembic),
query or readers: a new worker's imports are part of the first batch it serves."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from state_runtime.runtime.aggregation import Agg, running_aggregation
    from state_runtime.runtime.changes import read_state_changes
    from state_runtime.runtime.context import BatchContext, current_batch
    from state_runtime.runtime.dedup import drop_duplicates
    from state_runtime.runtime.groups import GroupState, map_groups_with_state
    from state_runtime.runtime.operator import StatefulOperator, UpdateFunction
    from state_runtime.runtime.query import BatchResult, StatefulQuery
    from state_runtime.runtime.reader import read_state, read_state_metadata
    from state_runtime.runtime.session_windows import SessionWindow, session_window_aggregation
    from state_runtime.runtime.spark_progress import state_figures, with_state_progress
    from state_runtime.runtime.stream_writer import write_stream
    from state_runtime.runtime.tws import transform_with_state
    from state_runtime.runtime.watermark import Watermark
    from state_runtime.runtime.windows import Window, windowed_aggregation
    from state_runtime.store.schema_evolution import SchemaChange

_HOMES = {
    "Agg": "state_runtime.runtime.aggregation",
    "running_aggregation": "state_runtime.runtime.aggregation",
    "read_state_changes": "state_runtime.runtime.changes",
    "BatchContext": "state_runtime.runtime.context",
    "current_batch": "state_runtime.runtime.context",
    "drop_duplicates": "state_runtime.runtime.dedup",
    "GroupState": "state_runtime.runtime.groups",
    "map_groups_with_state": "state_runtime.runtime.groups",
    "StatefulOperator": "state_runtime.runtime.operator",
    "UpdateFunction": "state_runtime.runtime.operator",
    "BatchResult": "state_runtime.runtime.query",
    "StatefulQuery": "state_runtime.runtime.query",
    "read_state": "state_runtime.runtime.reader",
    "read_state_metadata": "state_runtime.runtime.reader",
    "SessionWindow": "state_runtime.runtime.session_windows",
    "session_window_aggregation": "state_runtime.runtime.session_windows",
    "state_figures": "state_runtime.runtime.spark_progress",
    "with_state_progress": "state_runtime.runtime.spark_progress",
    "write_stream": "state_runtime.runtime.stream_writer",
    "transform_with_state": "state_runtime.runtime.tws",
    "Watermark": "state_runtime.runtime.watermark",
    "Window": "state_runtime.runtime.windows",
    "windowed_aggregation": "state_runtime.runtime.windows",
    "SchemaChange": "state_runtime.store.schema_evolution",
}
"""Each public name's module."""

__all__ = [
    "Agg",
    "BatchContext",
    "BatchResult",
    "GroupState",
    "SchemaChange",
    "SessionWindow",
    "StatefulOperator",
    "StatefulQuery",
    "Watermark",
    "Window",
    "UpdateFunction",
    "current_batch",
    "drop_duplicates",
    "map_groups_with_state",
    "read_state",
    "read_state_changes",
    "read_state_metadata",
    "running_aggregation",
    "session_window_aggregation",
    "state_figures",
    "transform_with_state",
    "windowed_aggregation",
    "with_state_progress",
    "write_stream",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
