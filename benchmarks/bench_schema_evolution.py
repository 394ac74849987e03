"""Schema evolution benchmark: loading a store written under an older schema, through the
planned projection, against loading it with no evolution.

Run with ``make bench-schema``. One store of ``--keys`` keys (``k bigint``) is written as a
snapshot under ``amount int, n int``. Each figure is a cold load of that version by a fresh
provider (no cache), median of ``--repeat`` rounds that interleave the cases:

- ``no evolution``: the provider's schema is the files' schema (the baseline);
- ``through the projection``: the newest schema renames ``amount`` to ``total``, widens ``n``
  to bigint and adds ``extra bigint``; every file is read through the projection (rename,
  cast, a null column) in Arrow;
- ``written under the newest``: the same rows written under the newest schema and loaded
  with it (what a store converges to once a snapshot has been written under the newest).

Each case prints its median and its fastest run with their ratios to the baseline's (the
fastest is the steadier figure on a busy machine), and the projection's own cost (applied to
``--keys`` decoded rows). Target: the projection costs at most 1.2x the baseline.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile

import numpy as np
import pyarrow as pa
from bench_store import timed  # this folder is on sys.path when run as a script

from state_runtime import SchemaChange, SchemaHistory, StateStoreProvider
from state_runtime.storage import LocalStorage
from state_runtime.store.state_schema import StateSchema

KEY = "k bigint"
OLD = StateSchema.of(KEY, "amount int, n int")
NEW = StateSchema.of(KEY, "total int, n bigint, extra bigint")


def write(root: str, history: SchemaHistory, keys: int) -> tuple[int, str | None]:
    """Version 1 of a store holding ``keys`` rows, as a snapshot under ``history``'s newest."""
    provider = StateStoreProvider(LocalStorage(root), 0, 0, history=history)
    store = provider.get_store(0)
    rng = np.random.default_rng(7)
    value_type = history.newest.schema.value_arrow
    columns = [
        pa.array(rng.integers(0, 1_000_000, keys), type=value_type.field(i).type)
        for i in range(value_type.num_fields)
    ]
    store.apply_arrow(
        pa.table(
            {
                "key": pa.StructArray.from_arrays(
                    [pa.array(np.arange(keys, dtype=np.int64))], fields=list(OLD.key_arrow)
                ),
                "value": pa.StructArray.from_arrays(columns, fields=list(value_type)),
            }
        )
    )
    info = store.commit()
    provider.snapshot(info.version, info.checkpoint_id)
    return info.version, info.checkpoint_id


def cold_load(root: str, history: SchemaHistory, ref: tuple[int, str | None]) -> None:
    provider = StateStoreProvider(LocalStorage(root), 0, 0, history=history)
    store = provider.get_read_store(*ref)
    assert store.metrics.rows > 0
    provider.drop_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    old = SchemaHistory.of(OLD)
    new, projection = old.evolve(NEW, SchemaChange(renamed={"amount": "total"}), 1)
    assert projection is not None
    converged = SchemaHistory.of(NEW)
    with tempfile.TemporaryDirectory() as tmp:
        old_root, new_root = os.path.join(tmp, "old"), os.path.join(tmp, "new")
        ref_old = write(old_root, old, args.keys)
        ref_new = write(new_root, converged, args.keys)
        cases = [
            ("no evolution", lambda: cold_load(old_root, old, ref_old)),
            ("through the projection", lambda: cold_load(old_root, new, ref_old)),
            ("written under the newest", lambda: cold_load(new_root, converged, ref_new)),
        ]
        times: dict[str, list[float]] = {name: [] for name, _ in cases}
        for _ in range(args.repeat):  # rounds interleave the cases: load drifts alike
            for name, load in cases:
                times[name].append(timed(load, 1))
        figures = [(name, statistics.median(t), min(t)) for name, t in times.items()]
    keys = pa.StructArray.from_arrays(
        [pa.array(np.arange(args.keys, dtype=np.int64))], fields=list(OLD.key_arrow)
    )
    values = pa.StructArray.from_arrays(
        [pa.array(np.arange(args.keys, dtype=np.int32))] * 2, fields=list(OLD.value_arrow)
    )
    alone = [timed(lambda: projection.apply(keys, values), 1) for _ in range(args.repeat)]
    base, fastest = figures[0][1], figures[0][2]
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}, "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(f"cold load of {args.keys:,} keys, median of {args.repeat}; projection: ", end="")
    print("; ".join(projection.actions))
    print(f"{'case':<28}{'median s':>10}{'ratio':>8}{'fastest s':>11}{'ratio':>8}")
    for name, median, least in figures:
        print(
            f"{name:<28}{median:>10.4f}{median / base:>7.2f}x{least:>11.4f}{least / fastest:>7.2f}x"
        )
    print(
        f"{'the projection alone':<28}{statistics.median(alone):>10.4f}"
        f"{statistics.median(alone) / base:>7.2f}x{min(alone):>11.4f}{min(alone) / fastest:>7.2f}x"
        "  (of the no-evolution load)"
    )


if __name__ == "__main__":
    main()
