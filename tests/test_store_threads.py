"""Reads of a version see exactly that version whatever commits happen meanwhile, in any thread."""

from __future__ import annotations

import random
import threading
import time

import pytest

from state_runtime import StateStoreProvider, StoreConfig
from state_runtime.storage import Storage

from .store_helpers import commit_rows, provider_for

pytestmark = pytest.mark.usefixtures("state_mode")  # in memory, then on disk


def test_iterating_v1_while_the_same_provider_commits_v2_sees_v1(storage: Storage) -> None:
    p = provider_for(storage)
    v1 = commit_rows(p, None, {f"k{i}": i for i in range(10_000)})
    reader = p.get_read_store(1, v1.checkpoint_id)
    rows = reader.items()
    first = [next(rows) for _ in range(100)]  # iterate v1 partly
    # Commit v2 on the same provider: rewrite every key, remove some, add others.
    writer = p.get_store(1, v1.checkpoint_id)
    writer.apply(
        puts=[((f"k{i}",), (-i,)) for i in range(5_000, 10_000)]
        + [((f"new{i}",), (i,)) for i in range(3_000)],
        removes=[(f"k{i}",) for i in range(2_000)],
    )
    v2 = writer.commit()
    seen = dict(first + list(rows))  # finish iterating
    assert seen == {(f"k{i}",): (i,) for i in range(10_000)}
    assert reader.get("k9999") == (9999,) and reader.get("k1") == (1,)
    assert reader.get("new1") is None and len(reader) == 10_000
    after = p.get_read_store(2, v2.checkpoint_id)
    assert after.get("k9999") == (-9999,) and after.get("k1") is None
    assert len(after) == 10_000 - 2_000 + 3_000


def test_scans_and_bulk_reads_of_v1_are_unchanged_by_a_commit(storage: Storage) -> None:
    p = StateStoreProvider(storage, 0, 0, key_schema="u string, d int", value_schema="n bigint")
    store = p.get_store(0)
    store.apply(puts=[((f"u{i % 10}", i), (i,)) for i in range(1_000)])
    v1 = store.commit()
    reader = p.get_read_store(1, v1.checkpoint_id)
    scan = reader.prefix_scan("u3")
    first = next(scan)
    writer = p.get_store(1, v1.checkpoint_id)
    writer.apply(puts=[(("u3", i), (0,)) for i in range(2_000, 2_100)], removes=[("u3", 3)])
    writer.commit()
    assert [first, *scan] == [(("u3", i), (i,)) for i in range(3, 1_000, 10)]
    assert reader.get_many([("u3", 3), ("u3", 2_000)]) == [(3,), None]


def test_threaded_readers_see_their_version_while_a_writer_commits(
    storage: Storage, state_mode: str
) -> None:
    """A stress test: one writer commits 40 versions on a shared provider while four threads
    open random earlier versions of it and check each read against the model of that version
    (15 on S3, 8 on disk, whose blocks of a few rows make every read slow)."""
    versions = 8 if state_mode == "disk" else 15 if storage.uri.startswith("s3") else 40
    p = StateStoreProvider(
        storage,
        0,
        0,
        key_schema="user string",
        value_schema="count bigint",
        config=StoreConfig(cached_versions=versions + 1),
    )
    models: list[tuple[object, dict[str, int]]] = []
    state: dict[str, int] = {}
    info = None
    stop = threading.Event()
    failures: list[BaseException] = []
    lock = threading.Lock()

    def read_forever(seed: int) -> None:
        rng = random.Random(seed)
        try:
            while not stop.is_set():
                with lock:
                    if not models:
                        continue
                    committed, model = models[rng.randrange(len(models))]
                store = p.get_read_store(committed.version, committed.checkpoint_id)  # type: ignore[attr-defined]
                got = {}
                for i, (k, v) in enumerate(store.items()):
                    got[k[0]] = v[0]
                    if i % 200 == 0:
                        time.sleep(0)  # let the writer in mid-iteration
                assert got == model, committed
                probe = rng.sample(sorted(model) or ["none"], k=min(5, len(model) or 1))
                assert store.get_many(probe) == [(model[k],) if k in model else None for k in probe]
        except BaseException as e:  # reported by the main thread
            failures.append(e)

    readers = [threading.Thread(target=read_forever, args=(s,)) for s in range(4)]
    for t in readers:
        t.start()
    rng = random.Random(99)
    try:
        for v in range(versions):
            puts = {f"k{rng.randrange(3_000)}": rng.randrange(1_000) for _ in range(300)}
            removes = tuple(rng.sample(sorted(state), k=min(50, len(state))))
            removes = tuple(k for k in removes if k not in puts)
            info = commit_rows(p, info, puts, removes)
            for k in removes:
                state.pop(k, None)
            state.update(puts)
            with lock:
                models.append((info, dict(state)))
            assert info.version == v + 1
    finally:
        stop.set()
        for t in readers:
            t.join(timeout=60)
    assert not failures, failures[0]
