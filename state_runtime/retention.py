"""The retention rule: which checkpoint files cleanup keeps, which it may delete, and why.

This module is the one home of the rule; it holds no SQL. Change retention here.

- A store retains its last ``retain_versions`` committed versions (never fewer than
  :data:`MIN_RETAINED_VERSIONS`) that have not **expired**. Once cleanup deleted a committed
  file no retained version needed, the versions that loaded through it cannot load any more:
  they, and every older version, have expired (the store's ``expired_through``). None counts
  as retained again, not even after a restore moves the latest version back next to them, so
  nothing calls them lost. A restore un-expires only what it checked loads: its target, and
  the version below it with its id (the base of its replay) once it wrote that one its own
  snapshot (``maintenance/replay_bases.py``).
- A retained version ``r`` loads from the newest *verified* committed snapshot at or below
  ``r`` (version ``s``; 0 when there is none) plus the committed deltas ``s+1..r``. Those files
  are **needed**. A snapshot counts only once its bytes were verified after it was written
  (checksum, size, header naming the right store, version and id): an unverified or damaged
  snapshot supersedes nothing, so the deltas it would replace stay needed. *Committed* is the
  commit log's word, not a file row's state: the catalog takes the needed files from the
  commit-log entries (a delta an entry names, a snapshot of a committed (version, id)), so a
  file a retained commit needs is never deletable whatever its state says. A version that
  changed nothing is a commit without a file (its parent's checkpoint): it adds no file.
- The store's **floor** is the lowest base any retained version loads from. A damaged or
  unverified snapshot at or above the floor is kept (to be repaired, or verified).
- A store with an open validation failure is **held**: none of its committed files is deleted
  until a validation passes or an operator resolves the failure. Orphans, which no committed
  version references, may still go.
- Otherwise a committed file goes once it is older than the retention window, and a file that
  was never committed once it is older than the orphan grace period as well.
- A file's age is measured by the database's clock: from the later of the time its writer
  stamped (``created_at``, the writer host's clock) and the time the catalog recorded it
  (``recorded_at``, the database's clock), to the database's ``now``. A writer whose clock
  runs slow stamps its files older than they are; the catalog's time keeps them young until
  they really are old. One running fast only makes its files stay longer, which is safe.

Who applies it: the catalog translates the facts and :data:`RULES` into SQL
(``state_runtime/catalog/sql/retention.py``); store-level cleanup
(``state_runtime/store/file_cleanup.py``) evaluates it on the files it listed; the PL/pgSQL
functions of the catalog migrations mirror it for ``psql`` users.
``tests/catalog/test_rule_translation.py`` checks the catalog's SQL against :func:`judge_store`
on random histories, ``tests/catalog/test_sql_queries.py`` and
``test_status_sql.py`` the PL/pgSQL against the catalog.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from state_runtime.errors import InvalidArgument, MaintenanceRefused, StateStoreError
from state_runtime.identity import FileKind
from state_runtime.settings import MAINTENANCE, MIN_RETAINED_VERSIONS, default_of


def check_retained_versions(
    value: int,
    what: str = "retain_versions",
    refusal: type[StateStoreError] = MaintenanceRefused,
    *,
    named: bool = False,
) -> int:
    """``value`` if it is an int at or above the safety floor (declared with the setting,
    :data:`state_runtime.settings.MAINTENANCE`); else ``refusal`` (a maintenance request is
    refused; a store configuration is an invalid argument), the message starting with
    ``what=value`` when ``named`` (callers that label settings themselves leave it off)."""
    setting = MAINTENANCE["retain_versions"]
    try:
        setting.check(value)
    except MaintenanceRefused as exc:
        message = (f"{what}={value}: " if named else "") + exc.reason
        if issubclass(refusal, MaintenanceRefused):
            raise refusal(message, setting=what, value=exc.value, limit=exc.limit) from None
        raise refusal(message) from None
    except InvalidArgument:
        raise InvalidArgument(f"{what} must be an int, got {value!r}") from None
    return value


class FileState(StrEnum):
    """Life cycle of a checkpoint file in the inventory."""

    WRITTEN = "written"  # recorded, not (yet) named by the commit log
    COMMITTED = "committed"  # its (version, checkpoint id) is in the commit log
    ORPHAN = "orphan"  # known never to be committed: replaced by a replay, or another attempt won
    DELETING = "deleting"  # claimed by a cleanup run; never needed again
    DELETED = "deleted"  # removed from storage; the deletion ledger says when and why


LIVE_STATES = (FileState.WRITTEN, FileState.COMMITTED, FileState.ORPHAN)


class Verification(StrEnum):
    """Whether a file's bytes were checked against its record since it was written."""

    UNVERIFIED = "unverified"
    VERIFIED = "verified"
    FAILED = "failed"  # missing, truncated, corrupt or mislabelled when last checked


@dataclass(frozen=True)
class RetentionPolicy:
    """What cleanup keeps: the last ``retain_versions`` committed versions of every store (never
    fewer than 2), every committed file younger than ``window``, and every never-committed file
    younger than both ``window`` and ``orphan_grace`` (in-flight batches, attempts worth a
    look)."""

    retain_versions: int = MIN_RETAINED_VERSIONS
    window: timedelta = default_of(MAINTENANCE, "window", timedelta)
    orphan_grace: timedelta = default_of(MAINTENANCE, "orphan_grace", timedelta)

    def __post_init__(self) -> None:
        check_retained_versions(self.retain_versions)
        MAINTENANCE["window"].check(self.window)
        MAINTENANCE["orphan_grace"].check(self.orphan_grace)

    @property
    def grace(self) -> timedelta:
        """How old a never-committed file must be before it may go."""
        return max(self.window, self.orphan_grace)

    def committed_cutoff(self, now: datetime) -> datetime:
        return now - self.window

    def uncommitted_cutoff(self, now: datetime) -> datetime:
        return now - self.grace


class Fact(StrEnum):
    """What the rule knows about one file; the catalog translates each fact to SQL."""

    NEEDED = "needed"  # a retained version loads through it
    CLAIMED = "claimed"  # a cleanup run claimed it (state 'deleting')
    COMMITTED = "committed"  # state 'committed'
    ORPHAN = "orphan"  # state 'orphan'
    DAMAGED = "damaged"  # a snapshot whose verification failed
    UNVERIFIED = "unverified"  # a snapshot not yet verified
    ABOVE_FLOOR = "above_floor"  # version at or above the store's floor
    STORE_HELD = "store_held"  # the store has an open validation failure
    PAST_WINDOW = "past_window"  # aged from at or before now - window (StoreFile.aged_from)
    PAST_GRACE = "past_grace"  # aged from at or before now - max(window, orphan grace)


class Verdict(StrEnum):
    """Why a file is kept or may be deleted (``explain`` and the cleanup plan)."""

    NEEDED = "needed"  # a retained committed version loads through it
    DELETING = "deleting"  # claimed by a cleanup run
    DAMAGED = "damaged"  # a damaged snapshot at or above the floor: kept for repair
    UNVERIFIED = "unverified"  # an unverified snapshot at or above the floor: kept until checked
    HELD = "held"  # committed, in a store with an open validation failure
    WITHIN_WINDOW = "within_window"  # committed, not needed, younger than the retention window
    IN_FLIGHT = "in_flight"  # written, not committed, younger than the grace period
    ORPHAN_IN_GRACE = "orphan_in_grace"  # orphan younger than the grace period
    DELETABLE_SUPERSEDED = "deletable_superseded"
    DELETABLE_ORPHAN = "deletable_orphan"
    DELETABLE_UNCOMMITTED = "deletable_uncommitted"
    DELETED = "deleted"  # explain only: the ledger says when and why
    MISSING = "missing"  # explain only: the catalog counts on it, storage lacks it
    UNTRACKED = "untracked"  # explain only: the catalog has no record of this path

    @property
    def deletable(self) -> bool:
        return self in DELETABLE


DELETABLE = frozenset(
    {Verdict.DELETABLE_SUPERSEDED, Verdict.DELETABLE_ORPHAN, Verdict.DELETABLE_UNCOMMITTED}
)

RULES: tuple[tuple[Verdict, frozenset[Fact]], ...] = (
    (Verdict.NEEDED, frozenset({Fact.NEEDED})),
    (Verdict.DELETING, frozenset({Fact.CLAIMED})),
    (Verdict.DAMAGED, frozenset({Fact.COMMITTED, Fact.DAMAGED, Fact.ABOVE_FLOOR})),
    (Verdict.UNVERIFIED, frozenset({Fact.COMMITTED, Fact.UNVERIFIED, Fact.ABOVE_FLOOR})),
    (Verdict.HELD, frozenset({Fact.COMMITTED, Fact.STORE_HELD})),
    (Verdict.DELETABLE_SUPERSEDED, frozenset({Fact.COMMITTED, Fact.PAST_WINDOW})),
    (Verdict.WITHIN_WINDOW, frozenset({Fact.COMMITTED})),
    (Verdict.DELETABLE_ORPHAN, frozenset({Fact.ORPHAN, Fact.PAST_GRACE})),
    (Verdict.ORPHAN_IN_GRACE, frozenset({Fact.ORPHAN})),
    (Verdict.DELETABLE_UNCOMMITTED, frozenset({Fact.PAST_GRACE})),
    (Verdict.IN_FLIGHT, frozenset()),
)
"""The verdict on a live or claimed file: the first rule whose facts all hold."""


def judge(facts: Collection[Fact]) -> Verdict:
    """The verdict of :data:`RULES` on a file with ``facts``."""
    return next(verdict for verdict, needs in RULES if needs <= set(facts))


REASONS: Mapping[Verdict, str] = {
    Verdict.NEEDED: "needed to load retained {needed_by} (the last {keep} committed)",
    Verdict.DELETING: "claimed for deletion by cleanup run {run}",
    Verdict.DAMAGED: (
        "damaged snapshot ({note}): it supersedes nothing, its deltas stay; kept until a repair "
        "replaces it"
    ),
    Verdict.UNVERIFIED: (
        "snapshot not verified since it was written: it supersedes nothing, its deltas stay; "
        "kept until validation or the snapshot pass verifies it"
    ),
    Verdict.HELD: (
        "held: the store has an open validation failure; nothing it committed is deleted until "
        "a validation passes or an operator resolves the failure"
    ),
    Verdict.WITHIN_WINDOW: (
        "committed and no longer needed by the last {keep} committed versions, but younger than "
        "the retention window ({window})"
    ),
    Verdict.DELETABLE_SUPERSEDED: (
        "superseded: not needed by the last {keep} committed versions and older than the "
        "retention window ({window}); {replaced}"
    ),
    Verdict.ORPHAN_IN_GRACE: "orphan ({state_reason}), younger than the grace period ({grace})",
    Verdict.DELETABLE_ORPHAN: "orphan ({state_reason}), older than the grace period ({grace})",
    Verdict.DELETABLE_UNCOMMITTED: (
        "never committed: no commit names it and it is older than the grace period ({grace})"
    ),
    Verdict.IN_FLIGHT: (
        "written but not committed, younger than the grace period ({grace}): it may belong to a "
        "batch in flight"
    ),
}
"""Each verdict of :data:`RULES` in words: a template over the fields of :class:`ReasonField`
(Python fills it in :func:`reason`; the catalog's views render it as SQL)."""


class ReasonField(StrEnum):
    """The fields of the reason templates, and what fills each."""

    KEEP = "keep"  # the policy's retain_versions
    WINDOW = "window"  # the policy's retention window, as str(timedelta) writes it
    GRACE = "grace"  # the policy's grace for never-committed files (at least the window)
    NEEDED_BY = "needed_by"  # "version v", or "versions lo..hi": the retained ones needing it
    RUN = "run"  # the cleanup run that claimed the file
    STATE_REASON = "state_reason"  # why the file is an orphan
    NOTE = "note"  # what verification found wrong, or NOTE_UNKNOWN
    REPLACED = "replaced"  # SUPERSEDED_BECAUSE[whether the file lies at or above the floor]


NOTE_UNKNOWN = "verification failed"
SUPERSEDED_BECAUSE = {
    True: "a newer snapshot, verified, replaces it",
    False: "older than the retained versions and the snapshot they load from",
}


NEEDED_ONE = "version {low}"
NEEDED_RANGE = "versions {low}..{high}"


def needed_by_text(low: int, high: int) -> str:
    """The retained versions that need a file, in words (the ``needed_by`` field)."""
    return (NEEDED_ONE if low == high else NEEDED_RANGE).format(low=low, high=high)


@functools.lru_cache(maxsize=4096)
def reason(
    verdict: Verdict,
    policy: RetentionPolicy,
    *,
    needed_by: tuple[int, int] | None = None,
    claimed_by_run: int | None = None,
    state_reason: str | None = None,
    note: str | None = None,
    above_floor: bool = False,
) -> str:
    """A verdict in words: its :data:`REASONS` template filled in (memoised: most files of an
    answer share a handful of reasons).

    ``state_reason`` is why a file is an orphan; ``note`` what verification found wrong;
    ``above_floor`` tells a superseded file replaced by a newer snapshot from one older than
    anything the retained versions load.
    """
    template = REASONS.get(verdict)
    if template is None:
        raise InvalidArgument(f"verdict {verdict.value} is not decided by the retention rule")
    fields = {
        ReasonField.KEEP: policy.retain_versions,
        ReasonField.WINDOW: policy.window,
        ReasonField.GRACE: policy.grace,
        ReasonField.NEEDED_BY: needed_by_text(*(needed_by or (0, 0))),
        ReasonField.RUN: claimed_by_run,
        ReasonField.STATE_REASON: state_reason,
        ReasonField.NOTE: note or NOTE_UNKNOWN,
        ReasonField.REPLACED: SUPERSEDED_BECAUSE[above_floor],
    }
    return template.format_map({field.value: value for field, value in fields.items()})


# --- the rule on one store's files, in Python ------------------------------------------------


@dataclass(frozen=True)
class StoreFile:
    """The facts the rule needs about one file of a store."""

    path: str
    kind: FileKind
    version: int
    state: FileState
    created_at: datetime  # stamped by the writer, by its host's clock
    verification: Verification = Verification.UNVERIFIED
    size: int = 0
    state_reason: str | None = None
    note: str | None = None  # what verification found wrong
    # When the catalog recorded the file, by the database's clock. None only where no catalog
    # is asked (store-level cleanup judges the files it listed): there ``created_at`` is the
    # storage's modification time, and the clocks are that storage's and this host's.
    recorded_at: datetime | None = None

    @property
    def aged_from(self) -> datetime:
        """When the file's age starts: the later of ``created_at`` and ``recorded_at``, so a
        writer's slow clock cannot make a file old before the database's clock says so."""
        if self.recorded_at is None:
            return self.created_at
        return max(self.created_at, self.recorded_at)


@dataclass(frozen=True)
class Judged:
    """A file, the verdict on it, the reason and the retained versions that need it."""

    file: StoreFile
    verdict: Verdict
    reason: str
    needed_by: tuple[int, int] | None


def retained_versions(latest: int, retain_versions: int, expired_through: int = 0) -> list[int]:
    """The retained committed versions of a store whose latest is ``latest`` and whose
    versions up to ``expired_through`` expired, newest first."""
    return [v for v in range(latest, latest - retain_versions, -1) if v > expired_through]


def _usable(f: StoreFile) -> bool:
    return f.state is FileState.COMMITTED and f.verification is not Verification.FAILED


def base_version(files: Iterable[StoreFile], version: int) -> int:
    """The newest verified committed snapshot at or below ``version`` (0: none)."""
    return max(
        (
            f.version
            for f in files
            if f.kind is FileKind.SNAPSHOT
            and f.state is FileState.COMMITTED
            and f.verification is Verification.VERIFIED
            and f.version <= version
        ),
        default=0,
    )


def loading_files(files: Sequence[StoreFile], version: int) -> list[StoreFile]:
    """The files that load committed ``version``: its base snapshot, then the committed deltas
    above it, oldest first (a delta may be absent: the chain is then incomplete)."""
    base = base_version(files, version)
    chosen = [
        f
        for f in files
        if f.state is FileState.COMMITTED
        and (
            (f.kind is FileKind.SNAPSHOT and f.version == base)
            or (f.kind is FileKind.DELTA and base < f.version <= version)
        )
    ]
    return sorted(chosen, key=lambda f: (f.version, f.kind is FileKind.DELTA))


def intact(files: Sequence[StoreFile], version: int, idle: Collection[int] = ()) -> bool:
    """Whether ``version`` has a complete path of committed files none of which failed
    verification: a verified base snapshot (or version 0) and a delta at every version above
    it, except the versions in ``idle`` (committed without a file: they changed nothing)."""
    usable = [f for f in files if _usable(f)]
    base = base_version(usable, version)
    present = {f.version for f in usable if f.kind is FileKind.DELTA} | set(idle)
    return all(v in present for v in range(base + 1, version + 1))


def needed(
    files: Sequence[StoreFile], latest: int, policy: RetentionPolicy, expired_through: int = 0
) -> tuple[dict[str, tuple[int, int]], int | None]:
    """Each needed file's (oldest, newest) retained version that needs it, and the store's
    floor (the lowest base a retained version loads from; None without retained versions)."""
    by_path: dict[str, tuple[int, int]] = {}
    bases = []
    for version in retained_versions(latest, policy.retain_versions, expired_through):
        bases.append(base_version(files, version))
        for f in loading_files(files, version):
            lo, hi = by_path.get(f.path, (version, version))
            by_path[f.path] = (min(lo, version), max(hi, version))
    return by_path, min(bases, default=None)


def facts_of(
    f: StoreFile,
    *,
    needed_by: tuple[int, int] | None,
    floor: int | None,
    held: bool,
    policy: RetentionPolicy,
    now: datetime,
) -> set[Fact]:
    """The facts that hold for ``f`` (the catalog computes the same ones in SQL)."""
    snapshot = f.kind is FileKind.SNAPSHOT
    facts = {
        Fact.NEEDED: needed_by is not None,
        Fact.CLAIMED: f.state is FileState.DELETING,
        Fact.COMMITTED: f.state is FileState.COMMITTED,
        Fact.ORPHAN: f.state is FileState.ORPHAN,
        Fact.DAMAGED: snapshot and f.verification is Verification.FAILED,
        Fact.UNVERIFIED: snapshot and f.verification is Verification.UNVERIFIED,
        Fact.ABOVE_FLOOR: floor is not None and f.version >= floor,
        Fact.STORE_HELD: held,
        Fact.PAST_WINDOW: f.aged_from <= policy.committed_cutoff(now),
        Fact.PAST_GRACE: f.aged_from <= policy.uncommitted_cutoff(now),
    }
    return {fact for fact, holds in facts.items() if holds}


def judge_store(
    files: Sequence[StoreFile],
    latest: int,
    policy: RetentionPolicy,
    now: datetime,
    *,
    held: bool = False,
    expired_through: int = 0,
) -> list[Judged]:
    """The verdict on every live or claimed file of one store whose latest committed version
    is ``latest``; ``held``: the store has an open validation failure; ``expired_through``:
    its newest expired version."""
    by_path, floor = needed(files, latest, policy, expired_through)
    judged = []
    for f in files:
        if f.state is FileState.DELETED:
            continue
        needed_by = by_path.get(f.path)
        facts = facts_of(f, needed_by=needed_by, floor=floor, held=held, policy=policy, now=now)
        verdict = judge(facts)
        text = reason(
            verdict,
            policy,
            needed_by=needed_by,
            state_reason=f.state_reason,
            note=f.note,
            above_floor=Fact.ABOVE_FLOOR in facts,
        )
        judged.append(Judged(f, verdict, text, needed_by))
    return judged


def still_intact(
    files: Sequence[StoreFile],
    latest: int,
    policy: RetentionPolicy,
    without: str,
    idle: Collection[int] = (),
) -> Mapping[int, bool]:
    """For each retained version, whether it still loads from intact files when the file at
    ``without`` is gone (what ``explain`` reports for a missing or damaged file; ``idle``: the
    versions committed without a file)."""
    rest = [f for f in files if f.path != without]
    return {v: intact(rest, v, idle) for v in retained_versions(latest, policy.retain_versions)}


def _versions(versions: Sequence[int]) -> str:
    if len(versions) == 1:
        return f"version {versions[0]}"
    contiguous = list(versions) == list(range(versions[0], versions[-1] + 1))
    joined = f"{versions[0]}..{versions[-1]}" if contiguous else ", ".join(map(str, versions))
    return f"versions {joined}"


def damage_reason(kind: FileKind, note: str, holds: Mapping[int, bool]) -> str:
    """What a missing or damaged file means for the retained versions (``holds``: whether each
    still loads from intact files without it): never "needed", but what is lost and what
    still holds. The next step is the file's classification's (maintenance/damage.py)."""
    lost = sorted(v for v, ok in holds.items() if not ok)
    kept = sorted(v for v, ok in holds.items() if ok)
    parts = [f"{kind.value} {note}"]
    if lost:
        parts.append(
            f"lost: retained {_versions(lost)} cannot be loaded from intact files without it"
        )
    else:
        parts.append("no retained version is lost")
    if kept:
        parts.append(f"still loadable from intact files: retained {_versions(kept)}")
    return "; ".join(parts)
