"""The driver's check of a whole query against its input schema, before any Spark job.

Every column the watermark, an operator's keys, its windows or its aggregates name must exist
in that operator's input (the query's input for the first operator, the previous operator's
output for the others) with a usable type, and the output mode must be one Spark accepts for
the shape: an append-mode windowed aggregation needs the watermark on the window's time
column, since nothing else can finalize a window (Spark's
``STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION`` "... streaming aggregations without
watermark"). As in Spark, the watermark marks the column of the query's input it is defined
on and, for a later operator, only that column as an earlier operator passes it on
(:attr:`StatefulOperator.passes_on`): a column of the same name that a
``map_groups_with_state`` function outputs carries no watermark. A failure is a
:class:`QueryRefused` naming the column, the operator and the rule; without this check the
same mistakes surface inside the tasks as pyspark's untyped ``PythonException``.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql.types import (
    ArrayType,
    DataType,
    MapType,
    NumericType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from state_runtime.errors import QueryRefused
from state_runtime.runtime.operator import ColumnKind, StatefulOperator
from state_runtime.runtime.watermark import Watermark


def _usable(kind: ColumnKind, data_type: DataType) -> bool:
    if kind == "timestamp":
        return isinstance(data_type, TimestampType | TimestampNTZType)
    if kind == "string":
        return isinstance(data_type, StringType)
    if kind == "numeric":
        return isinstance(data_type, NumericType)
    return not _has_map(data_type)  # orderable: Spark orders anything without a map


def _has_map(data_type: DataType) -> bool:
    if isinstance(data_type, MapType):
        return True
    if isinstance(data_type, ArrayType):
        return _has_map(data_type.elementType)
    if isinstance(data_type, StructType):
        return any(_has_map(f.dataType) for f in data_type.fields)
    return False


def _column(schema: StructType, column: str, who: str, role: str, kind: ColumnKind | None) -> None:
    """Refuse ``column`` if ``schema`` lacks it or (``kind`` given) its type is unusable."""
    if column not in schema.names:
        raise QueryRefused(
            f"{who}: {role} {column!r} is not in its input "
            f"<{schema.simpleString()}> (rule: every column a query names must exist)"
        )
    data_type = schema[column].dataType
    if kind is not None and not _usable(kind, data_type):
        raise QueryRefused(
            f"{who}: {role} {column!r} is {data_type.simpleString()}, not a {kind} "
            f"(rule: a {role} must be a {kind})"
        )


def check_query(
    operators: Sequence[StatefulOperator], watermark: Watermark | None, schema: StructType
) -> None:
    """Refuse the query if it cannot run on input of ``schema``; see the module's rules."""
    if watermark is not None:
        _column(schema, watermark.column, "the query's watermark", "event-time column", "timestamp")
    for op, marked in zip(operators, marked_columns(operators, watermark), strict=True):
        for key in op.key_columns:
            _column(schema, key, op.name, "key column", None)
            if _has_map(schema[key].dataType):
                raise QueryRefused(
                    f"{op.name}: key column {key!r} is {schema[key].dataType.simpleString()} "
                    "(rule: Spark cannot group by a map)"
                )
        for use in op.reads:
            _column(schema, use.column, op.name, use.role, use.kind)
        if op.window_column is not None and watermark is not None:
            _watermarked(op, op.window_column, watermark, marked)
        schema = op.output_nullable()


def marked_columns(
    operators: Sequence[StatefulOperator], watermark: Watermark | None
) -> list[set[str]]:
    """The columns of each operator's input the query's watermark marks."""
    marked = set() if watermark is None else {watermark.column}
    out = []
    for op in operators:
        out.append(marked)
        marked = _passed_on(op, marked)
    return out


def _watermarked(op: StatefulOperator, column: str, watermark: Watermark, marked: set[str]) -> None:
    """Refuse windows over ``column`` unless the query's watermark marks it at ``op``."""
    if column in marked:
        return
    rule = (
        "Spark refuses an append-mode aggregation that no watermark can finalize"
        if op.output_mode == "append"
        else "this runtime closes windows by the query's watermark, so the windows must be "
        "over the watermark's column"
    )
    where = (
        f"but the watermark is on {watermark.column!r}"
        if column != watermark.column
        else "which carries no watermark here: an earlier operator's output, and only a "
        "deduplication's rows and an aggregation's keys carry the query's watermark on"
    )
    raise QueryRefused(
        f"{op.name}: windows over column {column!r}, {where} in {op.output_mode} mode "
        f"(rule: {rule})"
    )


def _passed_on(op: StatefulOperator, marked: set[str]) -> set[str]:
    """The columns of ``op``'s output the watermark still marks."""
    if op.passes_on == "rows":
        return marked
    if op.passes_on == "keys":
        return marked & set(op.key_columns)
    return set()
