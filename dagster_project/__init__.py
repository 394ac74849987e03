"""The Dagster code location of state maintenance: thin adapters over state_runtime.maintenance."""
