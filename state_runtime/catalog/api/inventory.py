"""Catalog calls about what exists: roots, stores, files, verifications, problems, repairs."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from datetime import datetime

from sqlalchemy.engine import Connection

from state_runtime.catalog.api.pages import PAGE_STORES, PagedCalls
from state_runtime.catalog.api.transactions import conflict
from state_runtime.catalog.records import (
    AttemptSweep,
    FileRecord,
    FoundProblem,
    Repair,
    StoreKey,
    StoreProblem,
    StoreRecord,
    Validated,
)
from state_runtime.catalog.schema.reading_views import ReaderViews
from state_runtime.catalog.sql import batch_intents, findings, inventory, lookups, store_files
from state_runtime.errors import InvalidArgument
from state_runtime.identity import FileKind, StoreId
from state_runtime.storage.root_rule import parse_root
from state_runtime.store.checkpoint_info import CheckpointInfo


class InventoryCalls(PagedCalls):
    """The inventory maintenance reads and validation and repair record."""

    def roots(self) -> list[str]:
        """Every checkpoint root below which the catalog knows a store."""
        return self._read("list roots", inventory.roots)

    def relocate_root(self, old: str, new: str) -> int:
        """Point every record below checkpoint root ``old`` at ``new`` (stores, batch metrics,
        recorded watermarks, operator schema histories) in one transaction, after the files
        were moved or copied there (file paths are stored relative to their root, so only the
        root changes). Returns the number of stores moved."""
        parse_root(new)  # storage's own rule, as for every root first recorded

        return self._run("relocate a root", lambda c: inventory.relocate_root(c, old, new))

    def stores(self, root: str | None = None) -> list[StoreRecord]:
        """Every store the catalog knows (below ``root``, if given)."""

        return self._read("list stores", lambda c, v: inventory.store_records(c, v, root))

    def store_pages(
        self, root: str | None = None, *, page_size: int = PAGE_STORES
    ) -> Iterator[list[StoreRecord]]:
        """:meth:`stores`, ``page_size`` stores a page (one transaction each, in store id
        order; by key within a page): what a fleet-wide pass walks, whatever the fleet's size."""
        return self._pages(
            "list stores",
            root,
            lambda c, v, scope: inventory.store_records_in(c, v, scope),
            page_size,
        )

    def store_census(self, roots: Collection[str] | None = None) -> tuple[int, int]:
        """How many stores the catalog knows and the newest store id (below ``roots``, if
        given): a reader's cheap test of whether the set of stores changed (Dagster's
        discovery sensor), and a narrowed pass's count of its stores, read without listing
        them."""
        return self._read("count stores", lambda c, v: inventory.store_census(c, v, roots))

    def store_files(self, root: str, store: StoreId) -> list[FileRecord]:
        """The live files of one store, oldest versions first (with their verification)."""

        def work(connection: Connection, views: ReaderViews) -> list[FileRecord]:
            found = lookups.store_ids(connection, views, root, [store])
            if store not in found:
                return []
            return store_files.live_files(connection, views, found[store])

        return self._read("read store files", work)

    def idle_versions(self, root: str, store: StoreId) -> frozenset[int]:
        """The store's committed versions that changed nothing: each is a commit of its
        parent's checkpoint and names no file (the loading chain passes over them)."""

        def work(connection: Connection, views: ReaderViews) -> frozenset[int]:
            found = lookups.store_ids(connection, views, root, [store])
            if store not in found:
                return frozenset()
            return store_files.idle_versions(connection, views, found[store])

        return self._read("read idle versions", work)

    def record_snapshot(
        self,
        root: str,
        info: CheckpointInfo,
        *,
        run_id: int | None = None,
        verified: bool = False,
        problem: str | None = None,
    ) -> str | None:
        """Record a snapshot written by maintenance, in one transaction with what verifying
        its bytes after the write found: ``verified`` (it may now supersede deltas), or the
        ``problem`` (it supersedes nothing and the store gets an open problem). Without
        either it is recorded unverified.

        A snapshot already recorded with another size or checksum (the file changed since)
        keeps its record and is recorded as damaged. Returns the problem recorded, if any.
        """
        checked = [(info, problem)]
        _only_snapshots(checked)
        return self._run(
            "record snapshot",
            lambda c: findings.record_snapshots(c, root, checked, run_id, verified, self.now()),
            conflict,
        )[0]

    def record_verified_snapshots(
        self, root: str, checked: Sequence[tuple[CheckpointInfo, str | None]], *, run_id: int
    ) -> list[str | None]:
        """:meth:`record_snapshot` of several snapshots below ``root``, each verified: its
        problem None (intact) or what verifying it found; in one transaction (the snapshot
        pass records a chunk of stores with one commit, not one per store). The problems
        recorded, in order."""
        _only_snapshots(checked)
        return self._run(
            "record snapshots",
            lambda c: findings.record_snapshots(c, root, checked, run_id, True, self.now()),
            conflict,
        )

    def record_verifications(self, root: str, results: Mapping[str, str | None]) -> None:
        """Record what verifying files found: None (intact) or the problem, per path."""
        self._run(
            "record verifications",
            lambda c: findings.record_verifications(c, root, results, self.now()),
        )

    def record_validation(
        self,
        run_id: int | None,
        key: StoreKey,
        checked: Mapping[str, str | None],
        found: Sequence[FoundProblem],
        *,
        open_before: frozenset[int] | None = None,
    ) -> None:
        """Record one store's validation by ``run_id``: each checked file's verification; the
        store's open problems become ``found`` (of those open when the validation started,
        ``open_before``, by id: problems recorded since are left for the next one)."""
        validated = [Validated(key, checked, found, open_before)]
        self._run(
            "record validation",
            lambda c: findings.record_validations(c, key.root, validated, run_id, self.now()),
        )

    def record_validations(self, run_id: int | None, validated: Sequence[Validated]) -> None:
        """Record the validations of several stores of one root by ``run_id``
        (:meth:`record_validation`) in one transaction: a few statements for all of them."""
        roots = {v.key.root for v in validated}
        if len(roots) > 1:
            raise InvalidArgument(f"validations of one root at a time, not of {sorted(roots)}")
        if not roots:
            return
        [root] = roots
        self._run(
            "record validations",
            lambda c: findings.record_validations(c, root, validated, run_id, self.now()),
        )

    def add_problems(
        self, key: StoreKey, found: Sequence[FoundProblem], *, run_id: int | None = None
    ) -> int:
        """Open problems on a store (those already open are kept as they are)."""
        return self._run(
            "record problems",
            lambda c: findings.add_problems(c, key.root, key.store, found, run_id, self.now()),
        )

    def problem_census(self) -> tuple[int, int]:
        """How many problems are open and how many were ever recorded: a reader's cheap test
        of whether any was found or resolved (Dagster's failures sensor)."""
        return self._read("count problems", lambda c, v: findings.problem_census(c, v))

    def problems(
        self,
        *,
        root: str | None = None,
        store: StoreKey | None = None,
        only_open: bool = True,
    ) -> list[StoreProblem]:
        """Store problems, oldest first: open ones (what holds stores back), or all."""
        if store is not None:
            root = store.root
        return self._read(
            "read problems",
            lambda c, v: findings.problems(
                c, v, root, None if store is None else store.store, only_open=only_open
            ),
        )

    def resolve_problems(
        self,
        key: StoreKey,
        resolution: str,
        *,
        run_id: int | None = None,
        path: str | None = None,
    ) -> int:
        """Resolve a store's open problems (an operator's decision, with why); the store is
        cleaned again. Returns how many were open."""
        return self._run(
            "resolve problems",
            lambda c: findings.resolve_problems(
                c, key.root, key.store, resolution, run_id, self.now(), path=path
            ),
        )

    def begin_repair(
        self, run_id: int, root: str, path: str, problem: str, damaged: bytes | None
    ) -> int:
        """Record a damaged snapshot (as found; None if gone) before it is replaced."""
        return self._run(
            "record repair",
            lambda c: findings.begin_repair(c, run_id, root, path, problem, damaged, self.now()),
        )

    def repair_removed(self, repair_id: int) -> None:
        self._run(
            "record repair step",
            lambda c: findings.repair_removed(c, repair_id, self.now()),
        )

    def finish_repair(self, repair_id: int, root: str, info: CheckpointInfo) -> None:
        """The rebuilt snapshot ``info`` is written and verified: it replaces the record."""
        self._run(
            "finish repair",
            lambda c: findings.finish_repair(c, repair_id, root, info, self.now()),
        )

    def repairs(self, root: str | None = None) -> list[Repair]:
        return self._read("read repairs", lambda c, v: findings.repairs(c, v, root))

    def claimed_stores(self, root: str | None = None) -> set[StoreKey]:
        """Stores with files claimed for deletion but not yet recorded deleted (a run stopped
        between claim and record); cleanup resumes them."""
        return self._read("find claimed stores", lambda c, v: inventory.claimed_stores(c, v, root))

    def recorded_paths(self, root: str, paths: Collection[str]) -> set[str]:
        """Those of ``paths`` (below ``root``) the catalog has a record of, by index probes."""
        return self._read(
            "find recorded paths", lambda c, v: lookups.recorded_paths(c, v, root, paths)
        )

    def known_paths(self, root: str) -> dict[str, str]:
        """Every path the catalog has a record of below ``root``, with its state."""
        return self._read("read known paths", lambda c, v: inventory.known_paths(c, v, root))

    def attempt_sweeps(self, started_before: datetime, limit: int = 100) -> list[AttemptSweep]:
        """Batch intents whose attempts may have left files the catalog lacks (settled with
        suspect stores, or never settled), started before ``started_before``, oldest first,
        each with the store folders and versions to look at."""
        return self._read(
            "read attempt sweeps",
            lambda c, v: batch_intents.open_sweeps(c, v, started_before, limit),
        )

    def finish_attempt_sweeps(self, runs: Collection[str], forget_before: datetime) -> int:
        """Mark the intents of ``runs`` swept, and forget intents swept before
        ``forget_before``; the number forgotten."""
        return self._run(
            "finish attempt sweeps",
            lambda c: batch_intents.finish_sweeps(c, runs, self.now(), forget_before),
        )


def _only_snapshots(checked: Sequence[tuple[CheckpointInfo, str | None]]) -> None:
    """Refuse a file that is not a snapshot before any transaction."""
    for info, _ in checked:
        if info.kind is not FileKind.SNAPSHOT:
            raise InvalidArgument(f"record_snapshot got a {info.kind.value} file", path=info.path)
