"""Delta bytes: format 3 (compact, schema by id) against format 2 (Arrow IPC with a JSON
header), for small deltas and for a batch at Spark's default 200 partitions.

Run with ``make bench-delta-bytes``. Everything is measured in this run: the same rows are
encoded in both formats by the library's own encoders. Prints:

- one delta of 10 changed (bigint key, bigint value) rows: bytes in each format, and format
  3's fixed overhead (the file minus the rows' Arrow buffer bytes as stored);
- a batch of ``--updates`` random updates over ``--keys`` keys spread over ``--partitions``
  stores: checkpoint bytes per batch in each format, and an idle batch (format 3 writes no
  file for a store that changed nothing; format 2 wrote one per store).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa

from state_runtime.identity import CheckpointRef, FileKind, StoreId, new_checkpoint_id
from state_runtime.store.checkpoint_format import encode, encode_json_format
from state_runtime.store.column_encoding import encode_table
from state_runtime.store.file_header import FileHeader
from state_runtime.store.schema_history import SchemaHistory
from state_runtime.store.state_schema import StateSchema

SCHEMA = StateSchema.of("k bigint", "count bigint")
SCHEMA_ID = SchemaHistory.of(SCHEMA).newest.schema_id


def _header(partition: int, rows: int, depth: int = 10) -> FileHeader:
    """A delta header as the writer makes one: version 25, a lineage ``depth`` deep."""
    lineage = tuple(CheckpointRef(24 - i, new_checkpoint_id()) for i in range(depth))
    return FileHeader(
        FileKind.DELTA,
        StoreId(0, partition),
        25,
        new_checkpoint_id(),
        lineage,
        SCHEMA,
        rows,
        500,
        datetime.now(UTC),
        SCHEMA_ID,
    )


def _rows(keys: np.ndarray, values: np.ndarray) -> tuple[pa.StructArray, pa.StructArray]:
    order = np.argsort(keys)
    k = pa.StructArray.from_arrays([pa.array(keys[order], pa.int64())], names=["k"])
    v = pa.StructArray.from_arrays([pa.array(values[order], pa.int64())], names=["count"])
    return k, v


def sizes(partition: int, keys: np.ndarray, values: np.ndarray) -> tuple[int, int, int]:
    """(format 2 bytes, format 3 bytes, the rows' stored Arrow buffer bytes) of one delta."""
    header = _header(partition, len(keys))
    k, v = _rows(keys, values)
    compact = encode(header, k, v, in_key_order=True)
    stored, encodings = encode_table(pa.table({"key": k, "value": v}), in_key_order=True)
    old = encode_json_format(header, stored, encodings)
    return len(old), len(compact), stored.nbytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--updates", type=int, default=2_000)
    parser.add_argument("--partitions", type=int, default=200)
    parser.add_argument("--samples", type=int, default=25)
    args = parser.parse_args()
    rng = np.random.default_rng(7)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"python {platform.python_version()}, pyarrow {pa.__version__}; "
        f"load {os.getloadavg()[0]:.2f}"
    )

    print(
        "\none delta of 10 changed (bigint key, bigint value) rows, keys out of "
        f"{args.keys:,}, values 1..4, lineage 10 deep (median of {args.samples})"
    )
    samples = [
        sizes(0, rng.choice(args.keys, 10, replace=False), rng.integers(1, 5, 10))
        for _ in range(args.samples)
    ]
    old = statistics.median(s[0] for s in samples)
    new = statistics.median(s[1] for s in samples)
    rows = statistics.median(s[2] for s in samples)
    fixed = statistics.median(s[1] - s[2] for s in samples)
    print(f"{'format':<10}{'bytes':>8}{'ratio':>8}")
    print(f"{'2 (old)':<10}{old:>8.0f}{1:>8.2f}")
    print(f"{'3 (new)':<10}{new:>8.0f}{new / old:>8.3f}")
    print(
        f"format 3 fixed overhead: {fixed:.0f} bytes (file minus {rows:.0f} bytes of stored rows)"
    )
    empty = sizes(0, np.array([], dtype=np.int64), np.array([], dtype=np.int64))
    print(
        f"an empty delta: format 2 {empty[0]} bytes, format 3 {empty[1]} bytes "
        "(and a batch that changes a store not at all writes no file in format 3)"
    )

    print(
        f"\none batch: {args.updates:,} random updates over {args.keys:,} keys, "
        f"{args.partitions} partitions (stores)"
    )
    keys = rng.choice(args.keys, args.updates, replace=False)
    parts = keys % args.partitions
    total_old = total_new = files_new = 0
    for p in range(args.partitions):
        mine = keys[parts == p]
        o, n, _ = sizes(p, mine, rng.integers(1, 5, len(mine)))
        total_old += o
        if len(mine):  # a store the batch does not touch writes nothing
            total_new, files_new = total_new + n, files_new + 1
    print(f"{'format':<10}{'files':>8}{'bytes':>10}{'ratio':>8}")
    print(f"{'2 (old)':<10}{args.partitions:>8}{total_old:>10,}{1:>8.2f}")
    print(f"{'3 (new)':<10}{files_new:>8}{total_new:>10,}{total_new / total_old:>8.3f}")
    idle_old = args.partitions * empty[0]
    print(
        f"an idle batch: format 2 {args.partitions} files, {idle_old:,} bytes; "
        "format 3 no file, 0 bytes"
    )


if __name__ == "__main__":
    main()
