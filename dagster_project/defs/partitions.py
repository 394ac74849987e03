"""One dynamic partition per state store, named ``<root>#<operator>/<partition>/<store>``."""

from __future__ import annotations

from dagster import DynamicPartitionsDefinition

state_stores = DynamicPartitionsDefinition(name="state_stores")
