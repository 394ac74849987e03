"""How a version of a store loads from the files kept, judged as the loader walks them.

``restore`` (its plan), the failed batch's loss check (``runtime/loss.py``) and the damage
classification (``maintenance/damage.py``) ask the same question of the same files: does this
version load, and if not, which file breaks it. They all walk the catalog's chain with each
file checked now (:func:`walk_chain`): a base snapshot gone or damaged is passed over for the
chain below it, where a snapshot that failed an earlier verification and reads intact now (put
back from a backup) is a base again (:func:`judged_now`); and a snapshot storage cannot read
now (a failed read, not a verdict) is named, so that no one calls a version lost because of
an outage on one object.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace

from state_runtime.catalog import FileRecord, FileState, StoreKey
from state_runtime.identity import FileKind
from state_runtime.maintenance.fleet import Fleet
from state_runtime.retention import StoreFile, Verification, base_version, intact, loading_files
from state_runtime.store.file_verification import UNREADABLE, verify_file


@dataclass
class Verified:
    """What one plan has read: each store's file records and idle versions and each file's
    verification (path -> problem or None), so that a file shared by many batches' chains is
    read once, and a store's records once however many batches the plan weighs."""

    files: dict[StoreKey, list[FileRecord]] = field(default_factory=dict)
    idle: dict[StoreKey, frozenset[int]] = field(default_factory=dict)
    problems: dict[str, str | None] = field(default_factory=dict)

    def store_files(self, fleet: Fleet, key: StoreKey) -> list[FileRecord]:
        if key not in self.files:
            self.files[key] = fleet.catalog.store_files(key.root, key.store)
        return self.files[key]

    def idle_versions(self, fleet: Fleet, key: StoreKey) -> frozenset[int]:
        if key not in self.idle:
            self.idle[key] = fleet.catalog.idle_versions(key.root, key.store)
        return self.idle[key]

    def problem(self, fleet: Fleet, root: str, record: FileRecord) -> str | None:
        if record.path not in self.problems:
            self.problems[record.path], _ = verify_file(fleet.storage(root), record.expected())
        return self.problems[record.path]


@dataclass(frozen=True)
class Walk:
    """How a version of a store loads from the files kept (:func:`walk_chain`)."""

    loads: bool
    passed_over: list[tuple[FileRecord, str]]  # base snapshots found gone or damaged, in order
    broken: tuple[FileRecord, str] | None  # the delta that breaks the last chain tried
    unreadable: FileRecord | None  # not loading: an unreadable snapshot it would load from

    @property
    def damaged(self) -> list[tuple[FileRecord, str]]:
        """Each file found gone or damaged, with its problem, in the order found."""
        return self.passed_over + ([self.broken] if self.broken else [])


def walk_chain(
    fleet: Fleet,
    key: StoreKey,
    version: int,
    checked: Verified,
    problem: Callable[[FileRecord], str | None] | None = None,
) -> Walk:
    """Walk the chains that load ``version`` as the loader does: the catalog's chain judged
    now (:func:`judged_now`), each file checked by ``problem`` (default: read and verified);
    a base snapshot gone or damaged is passed over for the chain judged again without it
    (a failed snapshot below it that reads intact now is the base), until a chain loads, a
    delta breaks it, or no complete chain is left. When it does not load, ``unreadable`` names
    a snapshot storage could not read (a failed read, no verdict) with which it loads when
    taken as intact (walked again so): only then may the read decide; otherwise the loss
    stands."""
    walk = _walk(fleet, key, version, checked, problem)
    if walk.loads:
        return walk
    unreadable = next(
        (
            f
            for f in checked.store_files(fleet, key)
            if f.kind is FileKind.SNAPSHOT
            and f.version <= version
            and (checked.problems.get(f.path) or "").startswith(UNREADABLE)
            and _loads_if_intact(fleet, key, version, checked, problem, f)
        ),
        None,
    )
    return replace(walk, unreadable=unreadable)


def _loads_if_intact(
    fleet: Fleet,
    key: StoreKey,
    version: int,
    checked: Verified,
    problem: Callable[[FileRecord], str | None] | None,
    snapshot: FileRecord,
) -> bool:
    """Whether ``version`` loads when ``snapshot`` (one storage could not read) is taken as
    intact: only then is the failed read no verdict; otherwise the loss stands whatever the
    snapshot holds. What else this walk reads is kept in ``checked``."""
    assumed = Verified(checked.files, checked.idle, {**checked.problems, snapshot.path: None})

    def check(record: FileRecord) -> str | None:
        if record.path == snapshot.path:
            return None
        return problem(record) if problem else assumed.problem(fleet, key.root, record)

    loads = _walk(fleet, key, version, assumed, check).loads
    checked.problems.update(
        (path, found) for path, found in assumed.problems.items() if path != snapshot.path
    )
    return loads


def _walk(
    fleet: Fleet,
    key: StoreKey,
    version: int,
    checked: Verified,
    problem: Callable[[FileRecord], str | None] | None,
) -> Walk:
    """:func:`walk_chain` without the search for a snapshot storage cannot read."""
    files = checked.store_files(fleet, key)
    by_path = {f.path: f for f in files}
    check = problem or (lambda record: checked.problem(fleet, key.root, record))
    idle = checked.idle_versions(fleet, key)
    passed: list[tuple[FileRecord, str]] = []
    broken: tuple[FileRecord, str] | None = None
    while broken is None:
        facts = judged_now(fleet, key.root, files, version, checked, {r.path for r, _ in passed})
        if not intact(facts, version, idle):
            break
        for fact in loading_files(facts, version):
            record = by_path[fact.path]
            cause = check(record)
            if cause is None:
                continue
            if fact.kind is not FileKind.SNAPSHOT:
                broken = (record, cause)
            else:
                passed.append((record, cause))
            break
        else:
            return Walk(True, passed, None, None)
    return Walk(False, passed, broken, None)


def judged_now(
    fleet: Fleet,
    root: str,
    files: Sequence[FileRecord],
    version: int,
    checked: Verified,
    passed: Collection[str] = (),
) -> list[StoreFile]:
    """The files' facts with the verifications that matter for loading ``version`` judged
    again, so that a failed snapshot that is intact now (put back from a backup, or read
    wrong once) does not refuse the restore until the next validation (nor makes a failed
    batch's loss check, :func:`state_runtime.runtime.loss.lost_state`, call a store that loads
    lost). The snapshots at the paths ``passed`` (found gone or damaged) are failed; a failed
    snapshot above the newest verified one left (committed, at or below ``version``) is read,
    newest first, and the first that reads intact is a base again (one storage cannot read
    now stays failed: no base), also when a newer verified one was passed over. A failed delta
    is marked unverified, for the caller to read with the rest of the chain."""
    facts = [
        replace(f, verification=Verification.FAILED) if f.path in passed else f
        for f in (record.facts() for record in files)
    ]
    floor = base_version(facts, version)
    candidates = sorted(
        (
            i
            for i, f in enumerate(facts)
            if f.kind is FileKind.SNAPSHOT
            and f.state is FileState.COMMITTED
            and f.verification is Verification.FAILED
            and floor < f.version <= version
            and f.path not in passed
        ),
        key=lambda i: facts[i].version,
        reverse=True,
    )
    for i in candidates:
        if checked.problem(fleet, root, files[i]) is None:
            facts[i] = replace(facts[i], verification=Verification.VERIFIED)
            break
    return [
        replace(f, verification=Verification.UNVERIFIED)
        if f.kind is FileKind.DELTA and f.verification is Verification.FAILED
        else f
        for f in facts
    ]
