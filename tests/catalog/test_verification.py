"""The catalog's record of checks: verifications, store problems, validations and repairs,
on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest

from state_runtime.catalog import (
    Catalog,
    FoundProblem,
    RetentionPolicy,
    StoreKey,
    Verdict,
    Verification,
)
from state_runtime.errors import CatalogError, InvalidArgument
from state_runtime.identity import StoreId
from tests.catalog.factory import ROOT, Stream

A = StoreId(0, 0)
KEY = StoreKey(ROOT, A)
POLICY = RetentionPolicy(window=timedelta(0))


def built(catalog: Catalog) -> Stream:
    stream = Stream(catalog, [A])
    stream.run(6)
    stream.snapshot(A, verified=False)
    stream.run(2)
    return stream


def test_verifications_decide_what_a_snapshot_supersedes(catalog: Catalog) -> None:
    stream = built(catalog)
    snap = next(f for f in catalog.store_files(ROOT, A) if f.kind.value == "snapshot")
    assert snap.verification is Verification.UNVERIFIED and snap.verified_at is None
    deltas = {i.path for i in stream.committed[A]}
    assert not deltas & {v.file.path for v in catalog.deletable_files(POLICY, root=ROOT)}

    catalog.record_verifications(ROOT, {snap.path: None})
    [again] = [f for f in catalog.store_files(ROOT, A) if f.path == snap.path]
    assert again.verification is Verification.VERIFIED and again.verified_at is not None
    assert {i.path for i in stream.committed[A][:6]} <= {
        v.file.path for v in catalog.deletable_files(POLICY, root=ROOT)
    }

    catalog.record_verifications(ROOT, {snap.path: "checksum differs"})
    verdicts = {v.file.path: v for v in catalog.file_verdicts(POLICY, root=ROOT)}
    assert verdicts[snap.path].verdict is Verdict.DAMAGED
    assert "(checksum differs)" in verdicts[snap.path].reason
    with pytest.raises(CatalogError, match="untracked"):
        catalog.record_verifications(ROOT, {"state/0/0/default/nothing.delta": None})


def test_validation_sets_the_open_problems(catalog: Catalog) -> None:
    stream = built(catalog)
    first = stream.committed[A][0].path
    run = catalog.start_run("validate", "tests")
    catalog.record_validation(run, KEY, {first: "file is missing from storage"}, [
        FoundProblem("file is missing from storage", first, 1),
        FoundProblem("commit log is not linear"),
    ])  # fmt: skip
    assert [(p.path, p.problem) for p in catalog.problems(root=ROOT)] == [
        (first, "file is missing from storage"),
        (None, "commit log is not linear"),
    ]
    assert {v.verdict for v in catalog.file_verdicts(POLICY, root=ROOT)} >= {Verdict.NEEDED}
    assert catalog.add_problems(KEY, [FoundProblem("commit log is not linear")]) == 0

    # A validation that started before a problem was recorded leaves it open.
    later = catalog.start_run("validate", "tests")
    started = frozenset(p.problem_id for p in catalog.problems(root=ROOT))
    catalog.add_problems(KEY, [FoundProblem("snapshot failed verification", "s", 8)])
    catalog.record_validation(later, KEY, {first: None}, [], open_before=started)
    [left] = catalog.problems(store=KEY)
    assert left.problem == "snapshot failed verification"
    resolved = [p for p in catalog.problems(root=ROOT, only_open=False) if p.resolved_at]
    assert {p.resolution for p in resolved} == {f"no longer found by validation run {later}"}

    assert catalog.resolve_problems(KEY, "resolved by hand: known") == 1
    assert catalog.problems(root=ROOT) == []
    with pytest.raises(InvalidArgument):
        catalog.resolve_problems(KEY, "")  # a resolution always says why
    with pytest.raises(CatalogError, match="no store"):
        catalog.record_validation(later, StoreKey(ROOT, StoreId(9, 9)), {}, [])


def test_an_unfinished_repair_is_resumed(catalog: Catalog) -> None:
    built(catalog)
    snap = next(f for f in catalog.store_files(ROOT, A) if f.kind.value == "snapshot")
    run = catalog.start_run("snapshot", "tests", {"repair": True})
    first = catalog.begin_repair(run, ROOT, snap.path, "checksum differs", b"damaged bytes")
    assert catalog.begin_repair(run, ROOT, snap.path, "again", None) == first
    catalog.repair_removed(first)
    [repair] = catalog.repairs(ROOT)
    assert repair.problem == "checksum differs" and repair.damaged_size == len(b"damaged bytes")
    assert repair.removed_at is not None and repair.finished_at is None
    assert repair.old_checksum == snap.checksum and repair.old_size == snap.size_bytes
