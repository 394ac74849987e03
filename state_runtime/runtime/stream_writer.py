"""A stream that runs a :class:`StatefulQuery` in ``foreachBatch``, its Spark checkpoint set in
the one place the runtime learns it.

Spark tells a running query's ``checkpointLocation`` to no Connect-safe reader (not its
progress, its status or a listener's events), and the command a loss advises (``statestore
restore ... --spark-checkpoint DIR``) needs it: so the folder is given once, here, to Spark
and to the runtime alike.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql.streaming.readwriter import DataStreamWriter

from state_runtime.runtime.query import Sink, StatefulQuery


def write_stream(
    query: StatefulQuery,
    stream: DataFrame,
    checkpoint_location: str,
    sink: Sink | None = None,
    *,
    cache_output: bool = False,
) -> DataStreamWriter:
    """``stream.writeStream`` running ``query`` in ``foreachBatch`` (``query.foreach_batch``)
    with Spark's checkpoint at ``checkpoint_location``, which ``query`` records with each batch
    and names in the command a loss or a partition mismatch advises. Add a trigger or a name,
    then ``start()``."""
    query.spark_checkpoint = checkpoint_location  # before foreachBatch pickles the query
    process = query.foreach_batch(sink, cache_output=cache_output)
    return stream.writeStream.foreachBatch(process).option(
        "checkpointLocation", checkpoint_location
    )
