"""The storage contract, run on every backend (local files and S3 on moto) via ``storage``."""

from __future__ import annotations

import pickle
import threading
from datetime import UTC, datetime, timedelta

import pytest

from state_runtime.errors import FileAlreadyExists, InvalidArgument, StorageFileNotFound
from state_runtime.storage import Storage

BAD_PATHS = ["../x", "a/../../x", "/abs", "a//b", "a\\b", "a/./b", "", "a/", "a b"]


def test_round_trip(storage: Storage) -> None:
    payloads = {"empty": b"", "binary": bytes(range(256)) * 4, "big": b"\x00\xff" * 600_000}
    for name, data in payloads.items():
        storage.write_if_absent(f"dir/{name}.bin", data)
    for name, data in payloads.items():
        assert storage.read(f"dir/{name}.bin") == data
        assert storage.size(f"dir/{name}.bin") == len(data)
        assert storage.exists(f"dir/{name}.bin")


def test_write_if_absent_never_replaces(storage: Storage) -> None:
    storage.write_if_absent("state/1_a.delta", b"first")
    with pytest.raises(FileAlreadyExists) as caught:
        storage.write_if_absent("state/1_a.delta", b"second")
    assert caught.value.path == "state/1_a.delta"
    assert "state/1_a.delta" in str(caught.value)
    assert storage.read("state/1_a.delta") == b"first"


def test_concurrent_writers_exactly_one_wins(storage: Storage) -> None:
    writers = 6
    for r in range(5):
        path = f"race/{r}.delta"
        outcomes = _race(storage, path, writers)
        won = [i for i, outcome in outcomes.items() if outcome is None]
        assert len(won) == 1, outcomes
        assert all(isinstance(o, FileAlreadyExists) for i, o in outcomes.items() if i != won[0])
        assert storage.read(path) == f"writer {won[0]} ".encode() * 1000


def _race(storage: Storage, path: str, writers: int) -> dict[int, BaseException | None]:
    """Writers in threads, released together, all writing ``path``: what each got."""
    barrier = threading.Barrier(writers)
    outcomes: dict[int, BaseException | None] = {}

    def write(i: int) -> None:
        barrier.wait()
        try:
            storage.write_if_absent(path, f"writer {i} ".encode() * 1000)
            outcomes[i] = None
        except BaseException as e:
            outcomes[i] = e

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def test_missing_file(storage: Storage) -> None:
    assert not storage.exists("nothing/here")
    for call in (storage.read, storage.size):
        with pytest.raises(StorageFileNotFound) as caught:
            call("nothing/here")
        assert caught.value.path == "nothing/here"
        assert "nothing/here" in str(caught.value)


def test_list_is_recursive_and_bounded_by_the_folder(storage: Storage) -> None:
    files = {"a/b/1": b"1", "a/b/c/2": b"22", "a/x": b"333", "ab/3": b"4444", "top": b"5"}
    for path, data in files.items():
        storage.write_if_absent(path, data)
    before = datetime.now(UTC) - timedelta(minutes=5)

    found = {f.path: f for f in storage.list("a")}
    assert set(found) == {"a/b/1", "a/b/c/2", "a/x"}  # not "ab/3": a folder, not a prefix
    for path, info in found.items():
        assert info.size == len(files[path])
        assert info.modified.tzinfo is not None and info.modified > before
    assert {f.path for f in storage.list("a/b")} == {"a/b/1", "a/b/c/2"}
    assert list(storage.list("missing")) == []


def test_delete_batch_including_absent_paths(storage: Storage) -> None:
    for i in range(5):
        storage.write_if_absent(f"d/{i}", b"x")
    result = storage.delete(["d/0", "d/2", "d/absent", "d/4", "never/was"])
    assert result.failed == {}
    assert sorted(result.deleted) == ["d/0", "d/2", "d/4", "d/absent", "never/was"]
    assert sorted(f.path for f in storage.list("d")) == ["d/1", "d/3"]
    assert storage.delete([]).deleted == []


@pytest.mark.parametrize("bad", BAD_PATHS)
def test_unsafe_paths_are_rejected(storage: Storage, bad: str) -> None:
    with pytest.raises(InvalidArgument):
        storage.write_if_absent(bad, b"x")
    for call in (storage.read, storage.exists, storage.size):
        with pytest.raises(InvalidArgument):
            call(bad)
    with pytest.raises(InvalidArgument):
        list(storage.list(bad))
    with pytest.raises(InvalidArgument):
        storage.delete([bad])


def test_storage_pickles_to_a_working_copy(storage: Storage) -> None:
    """Spark ships storages to executors by pickling them."""
    storage.write_if_absent("p/1", b"shipped")
    copy = pickle.loads(pickle.dumps(storage))
    assert copy.uri == storage.uri
    assert copy.read("p/1") == b"shipped"
    copy.write_if_absent("p/2", b"back")
    assert storage.read("p/2") == b"back"
