"""A large delta is written through a file on local disk, never encoded whole in memory
(issue 37, docs/state-on-disk.md "Large deltas"): in a fresh process, a commit of 1M changed
rows under a 4 MiB budget grows the peak resident memory by at most 3x the budget over what
the process held just before the commit (before this, about 4 copies of the changes), and
the version reads back equal, streamed and whole. In process, on local files and on S3
(moto, a multipart upload): the file is format 2 in record batches, decodes to exactly the
changes (removals too), a fresh provider reads the version back equal, no local file is
left, and a small delta is still written in one buffer as format 3. A batch of many large
``apply_arrow`` calls peaks within 3x the budget too (its change runs spill as they come)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from state_runtime import StateStoreProvider
from state_runtime.identity import FileKind
from state_runtime.storage import LocalStorage, Storage
from state_runtime.store import checkpoint_format
from state_runtime.store.disk_runs import LOCAL_DISK

from .bench_runs import run_benchmark
from .s3_fixtures import MotoS3
from .store_helpers import int_table

BUDGET_MIB = 4
MIB = 1 << 20


def test_a_large_commit_peaks_within_the_budget_and_reads_back_equal(tmp_path: Path) -> None:
    keys = 1_000_000
    root = str(tmp_path / "root")
    run_benchmark("bench_cold_start.py", "--prepare", root, "--keys", str(keys))
    budget = ("--budget-mib", str(BUDGET_MIB))
    commit = run_benchmark("bench_cold_start.py", "--commit", root, *budget, "--updates", str(keys))
    assert commit["delta_bytes"] > 2 * MIB  # a format 2 delta of many record batches
    assert commit["commit_peak_rss_growth_bytes"] <= 3 * (BUDGET_MIB << 20), commit
    expected = keys * (keys - 1) // 2 + 2 * keys  # every value is its key + 2
    for mode in ((), ("--memory",)):  # streamed under the budget, then whole
        read = run_benchmark("bench_cold_start.py", "--load", root, *budget, *mode)
        assert (read["rows"], read["checksum"]) == (keys, expected), read


def test_a_batch_of_many_large_calls_peaks_within_the_budget(tmp_path: Path) -> None:
    """500k changed rows in 10 ``apply_arrow`` calls under 4 MiB: the calls' change runs
    go to local disk as they pass the threshold, so the batch (calls and commit) grows the
    peak by at most 3x the budget (before: 37.8 MB, the runs held and squashed in memory)."""
    root = str(tmp_path / "root")
    run_benchmark("bench_cold_start.py", "--prepare", root, "--keys", "200000")
    budget = ("--budget-mib", str(BUDGET_MIB))
    batch = run_benchmark(
        "bench_cold_start.py", "--commit", root, *budget, "--updates", "500000", "--calls", "10"
    )
    assert batch["batch_peak_rss_growth_bytes"] <= 3 * (BUDGET_MIB << 20), batch
    read = run_benchmark("bench_cold_start.py", "--load", root, *budget)
    expected = 500_000 * 499_999 // 2 + 2 * 500_000  # keys 0 to 499,999, value = key + 2
    assert (read["rows"], read["checksum"]) == (500_000, expected), read


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    """A fresh checkpoint root; on S3 one whose files above 1 MiB are multipart uploads."""
    if request.param == "local":
        return LocalStorage(tmp_path / "checkpoint")
    moto: MotoS3 = request.getfixturevalue("moto_s3")
    return moto.storage(multipart_threshold=MIB, multipart_part_size=5 * MIB)


def test_a_large_delta_goes_through_a_local_file_and_reads_back_equal(root: Storage) -> None:
    def provider() -> StateStoreProvider:
        return StateStoreProvider(root, 0, 0, key_schema="k bigint", value_schema="v bigint")

    rows = 300_000
    keys = np.arange(rows, dtype=np.int64)
    values = np.random.default_rng(7).integers(0, 1 << 62, rows)  # 2.4 MB: barely compresses
    store = provider().get_store(0)
    store.apply_arrow(int_table(keys, values))
    root.requests.reset()
    first = store.commit()
    if isinstance(root, LocalStorage):
        assert root.requests.counts["write"] == 2  # the schema's file, then the delta
    else:  # above 1 MiB: create, one part, complete
        assert root.requests.counts["multipart"] == 3
    store = provider().get_store(first.version, first.checkpoint_id)
    changed = keys[::2]
    store.apply_arrow(int_table(changed, changed))
    store.apply_arrow(int_table(keys[1::6], None))  # removals
    second = store.commit()
    assert not list(Path(LOCAL_DISK.directory).glob("*.delta"))  # the local file is gone
    expected = dict(zip(keys.tolist(), values.tolist(), strict=True))
    expected.update(zip(changed.tolist(), changed.tolist(), strict=True))
    for k in keys[1::6].tolist():
        del expected[k]
    for info, file_rows in ((first, rows), (second, len(changed) + len(keys[1::6]))):
        data = root.read(info.path)
        assert int.from_bytes(data[8:10], "little") == checkpoint_format.FORMAT_VERSION
        assert info.checksum == checkpoint_format.checksum(data)
        assert info.bytes_written == len(data)
        header, table = checkpoint_format.decode(data, info.path)
        assert (header.kind, header.file_rows, header.state_rows) == (
            FileKind.DELTA,
            file_rows,
            info.rows,
        )
        assert (info.file_rows, header.lineage) == (file_rows, info.lineage)
        batches = pa.ipc.open_stream(data[checkpoint_format.ENVELOPE_SIZE :]).read_all()
        assert len(batches.to_batches()) > 1
    _, table = checkpoint_format.decode(root.read(second.path), second.path)
    written = dict(
        zip(
            table.column("key").combine_chunks().field("k").to_pylist(),
            table.column("value").combine_chunks().to_pylist(),
            strict=True,
        )
    )
    assert written == {
        **{k: {"v": k} for k in changed.tolist()},
        **{k: None for k in keys[1::6].tolist()},
    }
    assert second.rows == len(expected)
    state = provider().get_read_store(second.version, second.checkpoint_id).to_arrow()
    assert (
        dict(
            zip(
                state.column("key").combine_chunks().field("k").to_pylist(),
                state.column("value").combine_chunks().field("v").to_pylist(),
                strict=True,
            )
        )
        == expected
    )
    store = provider().get_store(second.version, second.checkpoint_id)
    store.apply_arrow(int_table(keys[:10], keys[:10]))
    small = store.commit()
    data = root.read(small.path)
    assert int.from_bytes(data[8:10], "little") == checkpoint_format.DELTA_FORMAT_VERSION
