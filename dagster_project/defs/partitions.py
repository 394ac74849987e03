"""One dynamic partition per state store, named ``<query>/<operator>/<partition>/<store>``.

The names come from :class:`state_runtime.maintenance.StoreNames` (the root shown once, not
in every key); the discovery sensor keeps the partitions in step with the catalog.
"""

from __future__ import annotations

from dagster import DynamicPartitionsDefinition

state_stores = DynamicPartitionsDefinition(name="state_stores")
