"""The catalog's public face: one object per database, one retried transaction per call."""

from __future__ import annotations

from state_runtime.catalog.api.commits import CommitCalls
from state_runtime.catalog.api.event_time import EventTimeCalls
from state_runtime.catalog.api.health import HealthCalls
from state_runtime.catalog.api.history import HistoryCalls
from state_runtime.catalog.api.inventory import InventoryCalls
from state_runtime.catalog.api.layouts import LayoutCalls
from state_runtime.catalog.api.registration import RegistrationCalls
from state_runtime.catalog.api.retention import RetentionCalls
from state_runtime.catalog.api.runs_and_leases import RunCalls
from state_runtime.catalog.api.schema_history import SchemaHistoryCalls


class Catalog(
    CommitCalls,
    InventoryCalls,
    RetentionCalls,
    RunCalls,
    HealthCalls,
    HistoryCalls,
    EventTimeCalls,
    SchemaHistoryCalls,
    LayoutCalls,
    RegistrationCalls,
):
    """The SQL catalog of stores, checkpoint files, commits and maintenance.

    Open it with ``Catalog.open()`` (URL from ``STATE_CATALOG_URL``, else the embedded SQLite
    file). Every method is one transaction: it happens entirely or not at all, transient
    database errors are retried under ``retry``, and each attempt is bounded by the engine's
    CatalogTimeouts. Every method is safe to call again after CatalogUnavailable (its
    ``retryable`` is true): a retry finds what an attempt whose answer was lost did.
    Timestamps are aware UTC datetimes; ``now`` arguments exist so that tests and dry runs can
    ask "as of" a time.
    """
