"""Every read method of ``Catalog`` answers as the PostgreSQL reader role, which holds SELECT on
the views alone: each read goes through the reading views (docs/catalog.md), none through a
table. A new public method must be listed here as a read or as something else."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from state_runtime.catalog import Catalog, Position, RetentionPolicy, RunKind
from tests.catalog.test_roles import STORES, Roles, roles, runtime_stream  # noqa: F401
from tests.maintenance.streams import StoreStream

Read = Callable[[Catalog, StoreStream], object]
STORE = STORES[0]
POLICY = RetentionPolicy(window=timedelta(0), orphan_grace=timedelta(0))
LATER = datetime.now(UTC) + timedelta(days=1)  # "as of" one time: owner and reader agree

READS: dict[str, Read] = {
    "now": lambda c, s: c.now(),
    "roots": lambda c, s: c.roots(),
    "stores": lambda c, s: c.stores(s.root),
    "store_pages": lambda c, s: list(c.store_pages(s.root)),
    "store_files": lambda c, s: c.store_files(s.root, STORE),
    "idle_versions": lambda c, s: c.idle_versions(s.root, STORE),
    "latest_committed": lambda c, s: c.latest_committed(s.root),
    "committed_ids": lambda c, s: c.committed_ids(s.root, s.query, 3),
    "committed_before": lambda c, s: c.committed_before(s.root, s.query, 3),
    "commit_history": lambda c, s: c.commit_history(s.root, store=STORE),
    "committed_deltas": lambda c, s: c.committed_deltas(s.root, 0, STORE.store_name, 0, 9),
    "version_history": lambda c, s: c.version_history(s.root, stores=[STORE]),
    "query_ids": lambda c, s: c.query_ids(s.root),
    "root_queries": lambda c, s: c.root_queries(),
    "names_mark": lambda c, s: c.names_mark(),
    "batch_metrics": lambda c, s: c.batch_metrics(s.root, s.query),
    "batch_metrics_after": lambda c, s: c.batch_metrics_after(Position()),
    "batch_watermark": lambda c, s: c.batch_watermark(s.root, s.query, 9),
    "layouts": lambda c, s: c.layouts(s.root),
    "layout_history": lambda c, s: c.layout_history(s.root),
    "schema_histories": lambda c, s: c.schema_histories(s.root),
    "registered": lambda c, s: c.registered(s.root),
    "schema_history": lambda c, s: c.schema_history(s.root, 0, STORE.store_name),
    "store_health": lambda c, s: c.store_health(POLICY, root=s.root, now=LATER),
    "snapshot_candidates": lambda c, s: c.snapshot_candidates(1, s.root),
    "snapshot_candidate_pages": lambda c, s: list(c.snapshot_candidate_pages(1, root=s.root)),
    "recovery_costs": lambda c, s: c.recovery_costs(s.root),
    "health_pages": lambda c, s: list(c.health_pages(POLICY, root=s.root, now=LATER)),
    "store_census": lambda c, s: c.store_census(),
    "problem_census": lambda c, s: c.problem_census(),
    "file_verdicts": lambda c, s: c.file_verdicts(POLICY, root=s.root, now=LATER),
    "unconfirmed_snapshots": lambda c, s: c.unconfirmed_snapshots(POLICY, root=s.root, now=LATER),
    "deletable_files": lambda c, s: c.deletable_files(POLICY, root=s.root, store=STORE, now=LATER),
    "deletable_pages": lambda c, s: list(c.deletable_pages(POLICY, root=s.root, now=LATER)),
    "deletable_counts": lambda c, s: list(c.deletable_counts(POLICY, root=s.root, now=LATER)),
    "retained_versions": lambda c, s: c.retained_versions(s.root, STORE),
    "retained_versions_of": lambda c, s: c.retained_versions_of(s.root, STORES),
    "explain": lambda c, s: c.explain(s.root, s.committed[STORE][-1].path, POLICY, now=LATER),
    "deletion_history": lambda c, s: c.deletion_history(root=s.root),
    "problems": lambda c, s: c.problems(root=s.root, only_open=False),
    "repairs": lambda c, s: c.repairs(s.root),
    "claimed_stores": lambda c, s: c.claimed_stores(s.root),
    "recorded_paths": lambda c, s: c.recorded_paths(s.root, [s.committed[STORE][-1].path]),
    "known_paths": lambda c, s: c.known_paths(s.root),
    "run": lambda c, s: c.run(1),
    "recent_runs": lambda c, s: c.recent_runs(),
    "runs_after": lambda c, s: c.runs_after(Position()),
    "unsettled": lambda c, s: c.unsettled(Position(), Position()),
    "previous_run_counts": lambda c, s: c.previous_run_counts(RunKind.VALIDATE, s.root, 10**6),
    "attempt_sweeps": lambda c, s: c.attempt_sweeps(c.now()),
}
"""Each read method, called on the stream ``runtime_stream`` records."""

NOT_READS = frozenset(
    {
        # writes: the reader is refused them (test_roles)
        "register_store",
        "register_stores",
        "register_query",
        "begin_run",
        "begin_batch",
        "record_files",
        "commit_batch",
        "rewind_query",
        "switch_layout",
        "record_batch_metrics",
        "record_layout",
        "record_schema_history",
        "fix_watermark",
        "record_max_event_time",
        "record_snapshot",
        "record_verified_snapshots",
        "record_verifications",
        "record_validation",
        "record_validations",
        "add_problems",
        "resolve_problems",
        "begin_repair",
        "repair_removed",
        "finish_repair",
        "finish_attempt_sweeps",
        "relocate_root",
        "start_run",
        "finish_run",
        "heartbeat",
        "close_abandoned_runs",
        "record_statuses",
        "claim_deletions",
        "record_deletions",
        "record_deletions_by_id",
        "record_lost",
        "acquire_leases",
        "try_acquire_lease",
        "store_lease",
        "renew_lease",
        "renew_leases",
        "release_lease",
        "release_leases",
        # the workers' holders: the runtime's own, no reading view (schema/reading_views.py)
        "store_holders",
        # not a catalog call
        "open",
        "close",
    }
)


def public_methods() -> set[str]:
    return {
        name
        for name, member in inspect.getmembers(Catalog)
        if not name.startswith("_") and callable(member)
    }


def test_every_public_method_is_a_read_or_not() -> None:
    assert not set(READS) & NOT_READS
    assert public_methods() == set(READS) | NOT_READS


@pytest.mark.postgres
def test_every_read_method_answers_as_the_reader_role(roles: Roles, tmp_path: Path) -> None:  # noqa: F811
    stream = runtime_stream(roles, tmp_path)
    stream.catalog.close()
    with Catalog.open(roles.owner) as owner:
        run = owner.start_run("validate", "tests")
        owner.record_validation(run, stream.key(STORE), {}, [])
        owner.finish_run(run, "succeeded", {"checked": 1})
        cleanup = owner.start_run("cleanup", "tests")
        claimed = owner.claim_deletions(cleanup, POLICY, stream.root, [STORE], limit=2)
        owner.record_deletions(cleanup, stream.root, [v.file.path for v in claimed])
        owner.finish_run(cleanup, "succeeded")
        expected = {name: read(owner, stream) for name, read in READS.items() if name != "now"}
    with Catalog.open(roles.reader) as reader:
        for name, read in READS.items():
            answer = read(reader, stream)
            if name != "now":
                assert answer == expected[name], name
    assert STORE in expected["latest_committed"]  # type: ignore[operator]
    assert len(expected["deletion_history"]) == 2  # type: ignore[arg-type]
