"""The coordinator of seed 000: which Python worker holds the current copy of each store.

Each task report names the worker that wrote the store's new checkpoint, and so holds its
warm copy; the driver records those holders in the batch's commit transaction (the
catalog's ``store_holders`` table), so operators see where each store's copy lives without
a task ever writing to the catalog. Copies are unloaded by the process's memory budget
(:mod:`state_runtime.store.cache`, least recently used first), never by how far behind they
are: a copy many versions behind still rolls forward in O(changes), far cheaper than a
reload. No load or commit depends on the coordinator.
"""

from __future__ import annotations

from collections.abc import Sequence

from state_runtime.identity import StoreId
from state_runtime.runtime.tasks import TaskReport


def holders(reports: Sequence[TaskReport]) -> dict[StoreId, str]:
    """The worker holding each store's copy after the batch: the writer of its chosen report."""
    return {report.info.store: report.worker for report in reports}
