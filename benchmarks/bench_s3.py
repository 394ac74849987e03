"""S3 benchmark: requests and bytes per commit, per snapshot and per load, beside local files.

Run with ``make bench-s3``. Without ``--endpoint-url`` (or ``STATE_S3_ENDPOINT_URL``) it
starts moto's S3 server on loopback; with one (MinIO, AWS) it uses ``--bucket``, which must
exist, and credentials from the usual AWS settings. The same workload runs on a local
directory in the same run as the baseline. Request counts are exact (every HTTP request,
retries included); times are medians on this machine and, against moto, mostly moto's own.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from state_runtime import CheckpointInfo, StateStoreProvider, StoreConfig
from state_runtime.storage import LocalStorage, Storage
from state_runtime.storage.s3 import S3Storage

KEY, VALUE = "k bigint", "count bigint"
BEHIND = 3
"""Versions a warm worker's cache is behind, as when Spark moves a partition between workers."""


@dataclass
class Cost:
    """Requests, bytes and median time of one kind of operation."""

    requests: dict[str, int]
    bytes: int
    ms: float

    @property
    def shown_requests(self) -> str:
        kinds = {k: v for k, v in sorted(self.requests.items()) if k != "retries"}
        return ", ".join(f"{k} {v}" for k, v in kinds.items()) or "none"


def measure(storage: Storage, op: Callable[[], object], *, written: bool, repeat: int) -> Cost:
    """Run ``op`` ``repeat`` times; requests and bytes of the last run, median time of all."""
    times = []
    for _ in range(repeat):
        storage.requests.reset()
        started = time.perf_counter()
        op()
        times.append((time.perf_counter() - started) * 1000)
    io = storage.requests.bytes_written if written else storage.requests.bytes_read
    return Cost(dict(storage.requests.counts), io, statistics.median(times))


def provider(storage: Storage) -> StateStoreProvider:
    return StateStoreProvider(
        storage,
        0,
        0,
        key_schema=KEY,
        value_schema=VALUE,
        config=StoreConfig(min_deltas_for_snapshot=100),
    )


def commit_batch(p: StateStoreProvider, base: CheckpointInfo, keys: list[int]) -> CheckpointInfo:
    store = p.get_store(base.version, base.checkpoint_id)
    store.apply(((k,), (k + base.version,)) for k in keys)
    return store.commit()


def workload(storage: Storage, size: int, updates: int, batches: int) -> dict[str, Cost]:
    """Populate, commit batches of updates, snapshot, then load cold and warm."""
    rng = random.Random(11)
    writer = provider(storage)
    store = writer.get_store(0)
    store.apply(((i,), (i,)) for i in range(size))
    costs = {"initial commit (all keys)": measure(storage, store.commit, written=True, repeat=1)}
    info = store.checkpoint_info
    assert info is not None

    state = {"info": info}

    def one_batch() -> None:
        state["info"] = commit_batch(writer, state["info"], rng.sample(range(size), updates))

    costs[f"commit ({updates:,} updates)"] = measure(
        storage, one_batch, written=True, repeat=batches
    )
    snap_info = state["info"]
    costs["snapshot (full state)"] = measure(
        storage,
        lambda: writer.snapshot(snap_info.version, snap_info.checkpoint_id),
        written=True,
        repeat=1,
    )
    behind = provider(storage)
    behind.get_read_store(snap_info.version, snap_info.checkpoint_id)
    for _ in range(BEHIND):
        one_batch()
    head = state["info"]

    def cold() -> None:
        provider(storage).get_read_store(head.version, head.checkpoint_id)

    costs[f"cold load (snapshot + {BEHIND} deltas)"] = measure(
        storage, cold, written=False, repeat=3
    )
    costs[f"warm load ({BEHIND} versions behind)"] = measure(
        storage,
        lambda: behind.get_read_store(head.version, head.checkpoint_id),
        written=False,
        repeat=1,
    )
    return costs


@contextmanager
def s3_root(endpoint: str | None, bucket: str | None) -> Iterator[tuple[S3Storage, str]]:
    """An S3 storage under a fresh prefix: on the given endpoint, or on moto on loopback."""
    prefix = f"bench-s3/{uuid.uuid4().hex[:12]}"
    if endpoint:
        if not bucket:
            raise SystemExit("--bucket is required with --endpoint-url")
        yield S3Storage(bucket, prefix, endpoint_url=endpoint), endpoint
        return
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    admin = boto3.client(
        "s3",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
    )
    admin.create_bucket(Bucket="bench")
    storage = S3Storage(
        "bench",
        prefix,
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
    )
    try:
        yield storage, f"moto on {url}"
    finally:
        server.stop()


def kb(n: int) -> str:
    return f"{n / 1024:,.1f} KB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000, help="state size in keys")
    parser.add_argument("--updates", type=int, default=2_000, help="updated keys per batch")
    parser.add_argument("--batches", type=int, default=10, help="batches to time commits over")
    parser.add_argument("--endpoint-url", default=os.environ.get("STATE_S3_ENDPOINT_URL"))
    parser.add_argument("--bucket", help="existing bucket (with --endpoint-url)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        local = workload(LocalStorage(tmp), args.keys, args.updates, args.batches)
    with s3_root(args.endpoint_url, args.bucket) as (storage, where):
        remote = workload(storage, args.keys, args.updates, args.batches)
        retries = storage.requests.counts.get("retries", 0)

    print(
        f"S3 request accounting: {args.keys:,} keys, {args.updates:,} updates per batch "
        f"({args.updates / args.keys:.1%}), {args.batches} batches; S3: {where}; "
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    header = f"{'operation':<34}{'S3 requests':<18}{'bytes':>12}{'S3 ms':>9}"
    print(f"{header}  | {'local requests':<18}{'bytes':>12}{'local ms':>10}")
    for name, cost in remote.items():
        base = local[name]
        print(
            f"{name:<34}{cost.shown_requests:<18}{kb(cost.bytes):>12}{cost.ms:>9.1f}  | "
            f"{base.shown_requests:<18}{kb(base.bytes):>12}{base.ms:>10.1f}"
        )
    delta = remote[f"commit ({args.updates:,} updates)"].bytes
    full = remote["snapshot (full state)"].bytes
    print(
        f"a commit writes {delta / full:.1%} of a full rewrite's bytes "
        f"({kb(delta)} vs {kb(full)}); retries during the S3 run: {retries}"
    )


if __name__ == "__main__":
    main()
