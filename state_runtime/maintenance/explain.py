"""``explain``: why a file is kept or may go, checked against storage, with its store's status.

The catalog answers from its inventory; a file it counts on is also looked up in storage (one
request), so that a file that is gone is never called "needed": the answer says what is lost
and what still loads without it. A missing or damaged committed file is classified as every
tool does (:func:`state_runtime.maintenance.damage.classify`): its fate and the next command;
a missing one is recorded as a problem on its store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import posixpath
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import unquote, urlparse

from state_runtime.catalog import Explanation, FileRecord, FileState, FoundProblem, Verdict
from state_runtime.errors import CatalogPermissionDenied, InvalidArgument
from state_runtime.maintenance.damage import Damage, classify
from state_runtime.maintenance.fleet import Fleet
from state_runtime.maintenance.health import store_reports
from state_runtime.maintenance.policy import MaintenancePolicy
from state_runtime.status import Status
from state_runtime.storage import check_relative_path
from state_runtime.storage.root_rule import RootLocation, parse_root
from state_runtime.store.file_verification import MISSING, verify_file


@dataclass(frozen=True)
class FileExplanation:
    """The catalog's explanation of a file, and the status of the store it belongs to."""

    explanation: Explanation
    status: Status | None
    damage: Damage | None = None


def explain_file(
    fleet: Fleet, root: str, path: str, policy: MaintenancePolicy, *, now: datetime | None = None
) -> FileExplanation:
    """Why the file at ``path`` (relative to ``root``) is kept, or why it may be deleted."""
    catalog = fleet.catalog
    found = catalog.explain(root, path, policy.retention, now=now)
    record = found.file
    if record is None:
        return FileExplanation(found, None)
    live = record.state in {s.value for s in (FileState.WRITTEN, FileState.COMMITTED)}
    committed = record.state == FileState.COMMITTED
    if live and not fleet.storage(root).exists(path):
        found = catalog.explain(root, path, policy.retention, now=now, absent=True)
    cause = _damage_found(fleet, record, found) if committed else None
    damage = None if cause is None else classify(fleet, record, cause)
    if damage is not None and found.verdict is not Verdict.DAMAGED:
        if found.verdict is Verdict.MISSING:  # a fact, for health and repair
            lost = FoundProblem(damage.paragraph(store=False), path, record.version)
            with contextlib.suppress(CatalogPermissionDenied):  # a reader: validate records it
                catalog.add_problems(record.key, [lost])
        else:  # an open problem named the file, and reading it shows the damage
            found = dataclasses.replace(
                found, verdict=Verdict.DAMAGED, reason=f"{record.kind.value} {cause}"
            )
    reports = store_reports(fleet, policy, only=[record.key], now=now)
    return FileExplanation(found, reports[0].status if reports else None, damage)


def locate_file(
    fleet: Fleet, typed: str, policy: MaintenancePolicy, *, cwd: str | None = None
) -> tuple[str, str]:
    """The (root, path below it) that ``typed`` names: a URI (``s3://``, ``s3a://``,
    ``file://``), an absolute path, or a path relative to ``cwd`` (default: the current
    folder, as the shell completes it) or to a root in the fleet's scope. ``..`` is resolved
    before the roots are compared, never after: a path that climbs out of every root is below
    none. Raises InvalidArgument, naming the roots, when no reading is below a root, when no
    reading names a file the catalog records or storage holds, or when several do."""
    roots = fleet.root_names()
    places = _places(typed, os.getcwd() if cwd is None else cwd)
    relative = "://" not in typed and not os.path.isabs(os.path.expanduser(typed))
    readings: set[tuple[str, str]] = set()
    for root in roots:
        where = parse_root(root)
        readings.update((root, rest) for place in places if (rest := _below(where, place)))
        if relative:
            rest = posixpath.normpath(typed)  # relative to the root
            if rest not in {".", ".."} and not rest.startswith("../"):
                readings.add((root, rest))
    named = ", ".join(roots) or "none"
    valid = sorted((root, rest) for root, rest in readings if _valid(rest))
    if not valid:
        if readings:  # below a root, but no file could have that name
            check_relative_path(min(readings)[1])
        raise InvalidArgument(f"{typed!r} is below none of the catalog's roots: {named}")
    known = [(root, rest) for root, rest in valid if _names_a_file(fleet, policy, root, rest)]
    if not known:
        where_ = "; ".join(f"{rest} below {root}" for root, rest in valid)
        raise InvalidArgument(
            f"{typed!r} names no file the catalog records or storage holds ({where_})"
        )
    if len(known) > 1:
        both = "; ".join(f"{rest} below {root}" for root, rest in known)
        raise InvalidArgument(
            f"{typed!r} is ambiguous: it names {both}; give its URI or absolute path, or "
            "name its root with --root"
        )
    return known[0]


_Place = tuple[str, str]
"""Where a typed path points once resolved: (S3 bucket, key) or ("", absolute local path)."""


def _places(typed: str, cwd: str) -> list[_Place]:
    """The places ``typed`` names apart from a root: an S3 key, or a local path both as
    written and with its symlinks resolved (a root may have been recorded either way)."""
    if "://" in typed:
        parsed = urlparse(typed)
        if parsed.scheme in {"s3", "s3a"}:
            return [(parsed.netloc, posixpath.normpath(parsed.path or "/").lstrip("/"))]
        if parsed.scheme != "file" or parsed.netloc not in {"", "localhost"}:
            raise InvalidArgument(
                f"{typed!r}: expected a path, a file:///path or s3://bucket/key URI"
            )
        typed = unquote(parsed.path)
    local = os.path.join(cwd, os.path.expanduser(typed))
    return [("", p) for p in dict.fromkeys((os.path.abspath(local), os.path.realpath(local)))]


def _below(root: RootLocation, place: _Place) -> str:
    """The path of ``place`` below ``root`` ('' if it is not below it)."""
    bucket, path = place
    if root.scheme == "s3":
        prefix = f"{root.path}/" if root.path else ""
        return (
            path.removeprefix(prefix) if bucket == root.bucket and path.startswith(prefix) else ""
        )
    if bucket:
        return ""
    folder = os.path.abspath(os.path.expanduser(root.path))
    for top in dict.fromkeys((folder, os.path.realpath(folder))):
        if path.startswith(top.rstrip("/") + "/"):
            return path[len(top.rstrip("/")) + 1 :]
    return ""


def _valid(path: str) -> bool:
    try:
        check_relative_path(path)
    except InvalidArgument:
        return False
    return True


def _names_a_file(fleet: Fleet, policy: MaintenancePolicy, root: str, path: str) -> bool:
    """Whether the catalog records ``path`` below ``root`` or storage has it there."""
    explained = fleet.catalog.explain(root, path, policy.retention)
    return explained.file is not None or fleet.storage(root).exists(path)


def _damage_found(fleet: Fleet, record: FileRecord, found: Explanation) -> str | None:
    """What is wrong with the committed file ``record``: missing, its failed verification,
    or, when an open problem of its store names it (the runtime found it damaged), what
    reading it shows now; None if nothing is known to be wrong."""
    if found.verdict is Verdict.MISSING:
        return MISSING
    if found.verdict is Verdict.DAMAGED:
        return record.verification_note or "its last verification failed"
    if not any(p.path == record.path for p in fleet.catalog.problems(store=record.key)):
        return None
    problem, _ = verify_file(fleet.storage(record.key.root), record.expected())
    return problem
