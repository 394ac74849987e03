"""The files of a chain a load walks, and what their headers say about the lineage.

Split from :mod:`state_runtime.store.loader`: a decoded file (:class:`CheckpointFile`), a
file of a chain (decoded, or a tiny delta decoded with its chain's), the lineage they give.
"""

from __future__ import annotations

from dataclasses import dataclass

from state_runtime.identity import EMPTY, CheckpointRef, FileKind, parse_file_name
from state_runtime.store.checkpoint_format import FileHeader
from state_runtime.store.run_levels import AnyRun
from state_runtime.store.tiny_deltas import TinyDelta
from state_runtime.store.versions import Version


@dataclass(frozen=True)
class CheckpointFile:
    """A decoded, verified checkpoint file; ``run`` holds its rows."""

    ref: CheckpointRef
    kind: FileKind
    path: str
    header: FileHeader
    run: AnyRun
    """In memory, except a large file's rows (:mod:`state_runtime.store.snapshot_stream`)."""


ChainFile = CheckpointFile | TinyDelta
"""A file of a chain walked from files: decoded, or a tiny delta decoded with the chain's
(:meth:`~state_runtime.store.loader.VersionLoader._decoded`)."""


def parent_of(delta: ChainFile) -> CheckpointRef:
    return delta.header.lineage[0] if delta.header.lineage else EMPTY


def unchanged(ref: CheckpointRef, names: set[str]) -> bool:
    """Whether ``ref`` is a version without a file, going by the store's file ``names``: its
    id is that of a file at a lower version (a commit that changed nothing keeps its parent's
    id; one that writes a file takes a fresh one, so this cannot mistake a lost file)."""
    if ref.version < 2:
        return False
    for name in names:
        parsed = parse_file_name(name)
        if (
            parsed is not None
            and parsed.checkpoint_id == ref.checkpoint_id
            and parsed.version < ref.version
        ):
            return True
    return False


def lineage_of(chain: list[CheckpointFile], base: Version) -> tuple[CheckpointRef, ...]:
    """The full lineage of ``chain[0]`` (applied on ``base``): as its file records it, or, for
    a format 3 delta (which records its parent and depth), each chain file's parent down to
    the next file (the versions between changed nothing and share its id) and the base's own
    lineage, as deep as the writer's was."""
    header = chain[0].header
    if header.lineage_depth is None:
        return header.lineage
    refs: list[CheckpointRef] = []
    for i, delta in enumerate(chain):
        parent = parent_of(delta)
        stop = chain[i + 1].ref.version if i + 1 < len(chain) else base.ref.version
        refs += [
            CheckpointRef(v, parent.checkpoint_id)
            for v in range(parent.version, stop - 1, -1)
            if v >= 1
        ]
    return tuple([*refs, *base.lineage][: header.depth])
