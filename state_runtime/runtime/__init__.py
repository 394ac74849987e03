"""The streaming runtime: stateful micro-batches on PySpark with ``state_runtime`` stores."""

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
