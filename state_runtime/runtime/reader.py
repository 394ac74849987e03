"""Reading state back as Spark DataFrames, like Spark's ``statestore`` data source.

``read_state`` returns one row per key of an operator's store at a committed version: the
partition id, a ``key`` struct and a ``value`` struct. ``read_state_metadata`` lists every
store below a checkpoint root with its latest committed version and checkpoint id.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from state_runtime.catalog import Catalog
from state_runtime.catalog import catalog_url as default_catalog_url
from state_runtime.errors import InvalidArgument, UnknownCheckpointId
from state_runtime.identity import CheckpointRef, StoreId
from state_runtime.runtime.state_reads import load_partitions
from state_runtime.runtime.tws.variables import TIMERS_STORE
from state_runtime.storage import Storage, open_storage
from state_runtime.store.schema_history import SchemaHistory

_REFS = StructType(
    [
        StructField("partition_id", IntegerType(), False),
        StructField("version", LongType(), False),
        StructField("checkpoint_id", StringType(), True),
    ]
)


def store_history(catalog: Catalog, root: str, operator_id: int, store_name: str) -> SchemaHistory:
    """The schema history of an operator's store; InvalidArgument naming the store and
    listing the operator's stores (a ``transform_with_state`` operator's by variable name) if
    the catalog has none: read before any committed batch or version is looked up, so an
    unknown name is never reported as uncommitted batches."""
    history = catalog.schema_history(root, operator_id, store_name)
    if history is not None:
        return history
    names = sorted(n for op, n in catalog.schema_histories(root) if op == operator_id)
    where = f"operator {operator_id} below {root}"
    if not names:
        raise InvalidArgument(f"the catalog records no store of {where}")
    if TIMERS_STORE in names:
        variables = ", ".join(repr(n) for n in names if n != TIMERS_STORE) or "none"
        raise InvalidArgument(
            f"{where} has no state variable {store_name!r}: it is a transform_with_state "
            f"operator; read one of its state variables ({variables}) with state_variable=, "
            "or its timers with timers=True"
        )
    raise InvalidArgument(
        f"{where} has no store {store_name!r}; its stores: {', '.join(map(repr, names))}"
    )


def _refs(
    catalog: Catalog,
    root: str,
    operator_id: int,
    store_name: str,
    query_id: str | None,
    batch_id: int | None,
    version: int | None,
) -> dict[StoreId, CheckpointRef]:
    def ours(store: StoreId) -> bool:
        return store.operator_id == operator_id and store.store_name == store_name

    if batch_id is not None:
        if query_id is None:
            raise InvalidArgument("reading state as of a batch needs the query id")
        refs = catalog.committed_ids(root, query_id, batch_id)
    else:
        refs = catalog.latest_committed(root)
    refs = {s: r for s, r in refs.items() if ours(s)}
    if version is not None:
        refs = {}
        for record in catalog.stores(root):
            if not ours(record.key.store):
                continue
            entries = [
                e.ref
                for e in catalog.commit_history(root, store=record.key.store, limit=1_000_000)
                if e.ref.version == version
            ]
            if not entries:
                raise UnknownCheckpointId(
                    "no committed checkpoint at this version",
                    store=record.key.store,
                    version=version,
                )
            refs[record.key.store] = entries[0]
    if not refs:
        raise InvalidArgument(
            f"no committed state for operator {operator_id}, store {store_name} below {root}"
        )
    return refs


def state_plan(
    storage: Storage,
    operator_id: int,
    store_name: str,
    *,
    batch_id: int | None,
    query_id: str | None,
    version: int | None,
    catalog_url: str | None,
    as_written: bool = False,
) -> tuple[SchemaHistory, list[tuple[int, int, str | None]], StructType]:
    """What reading an operator's state needs (read on the driver): the schema history to
    read under, each partition's ``(partition, version, checkpoint id)``, the rows' schema.
    Rows read under the store's newest schema (older files through the planned projection),
    or with ``as_written`` under the schema the version was committed with."""
    root = storage.uri
    with Catalog.open(catalog_url or default_catalog_url()) as catalog:
        history = store_history(catalog, root, operator_id, store_name)
        refs = _refs(catalog, root, operator_id, store_name, query_id, batch_id, version)
    if as_written:
        written = max(refs.values(), key=lambda r: r.version).version
        history = history.up_to(history.at_batch(max(written - 1, 0)).schema_id)
    schema = history.newest.schema
    rows = [(s.partition_id, r.version, r.checkpoint_id) for s, r in sorted(refs.items())]
    out = StructType(
        [
            StructField("partition_id", IntegerType(), False),
            StructField("key", schema.key, True),
            StructField("value", schema.value, True),
        ]
    )
    return history, rows, out


def store_of(store_name: str, state_variable: str | None, timers: bool) -> str:
    """The store to read: a ``transform_with_state`` operator's ``state_variable`` (Spark's
    ``stateVarName``) or, with ``timers``, its timers (``readRegisteredTimers``), each a store
    of the operator; otherwise ``store_name``. InvalidArgument for an empty variable name, or
    a store name besides the variable or the timers (each names its store already)."""
    if state_variable is not None and timers:
        raise InvalidArgument("read a state variable or the timers, not both")
    if state_variable == "":
        raise InvalidArgument("state_variable must name a state variable, not ''")
    if (state_variable is not None or timers) and store_name != "default":
        chosen = "timers=True" if timers else f"state_variable={state_variable!r}"
        raise InvalidArgument(
            f"read store_name={store_name!r} or {chosen}, not both: "
            "a transform_with_state operator's variables and timers are its stores"
        )
    if state_variable is not None:
        return state_variable
    return TIMERS_STORE if timers else store_name


def read_state(
    spark: SparkSession,
    checkpoint_root: str | Storage,
    operator_id: int,
    store_name: str = "default",
    *,
    batch_id: int | None = None,
    query_id: str | None = None,
    version: int | None = None,
    catalog_url: str | None = None,
    as_written: bool = False,
    state_variable: str | None = None,
    timers: bool = False,
) -> DataFrame:
    """The state of an operator's store, as of the latest commit, a batch, or a version.

    Rows read under the store's newest schema (older files through the planned projection),
    or with ``as_written`` under the schema the version was committed with. For a
    ``transform_with_state`` operator, ``state_variable="name"`` reads one state variable
    (Spark's ``stateVarName``) and ``timers=True`` its pending timers (Spark's
    ``readRegisteredTimers``): each is a store of the operator."""
    store_name = store_of(store_name, state_variable, timers)
    storage = (
        checkpoint_root if isinstance(checkpoint_root, Storage) else open_storage(checkpoint_root)
    )
    history, rows, out = state_plan(
        storage,
        operator_id,
        store_name,
        batch_id=batch_id,
        query_id=query_id,
        version=version,
        catalog_url=catalog_url,
        as_written=as_written,
    )
    return (
        spark.createDataFrame(rows, _REFS)
        .repartition(len(rows))
        .mapInArrow(partial(load_partitions, storage, operator_id, store_name, history), out)
    )


def read_state_metadata(
    spark: SparkSession, checkpoint_root: str | Storage, *, catalog_url: str | None = None
) -> DataFrame:
    """Every store below ``checkpoint_root``: operator, partition, store name, latest committed
    version and checkpoint id, and when it was committed."""
    root = (
        checkpoint_root.uri
        if isinstance(checkpoint_root, Storage)
        else open_storage(checkpoint_root).uri
    )
    return spark.createDataFrame(metadata_rows(root, catalog_url), METADATA_SCHEMA)


METADATA_SCHEMA = (
    "operator_id int, partition_id int, store_name string, version bigint, "
    "checkpoint_id string, committed_at timestamp"
)


def metadata_rows(root: str, catalog_url: str | None) -> list[tuple[Any, ...]]:
    """One row per store below ``root`` (:data:`METADATA_SCHEMA`), read from the catalog."""
    with Catalog.open(catalog_url or default_catalog_url()) as catalog:
        records = catalog.stores(root)
    return [
        (
            r.key.store.operator_id,
            r.key.store.partition_id,
            r.key.store.store_name,
            r.latest.version,
            r.latest.checkpoint_id,
            r.last_committed_at,
        )
        for r in records
    ]
