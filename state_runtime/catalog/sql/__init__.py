"""The SQL of each concern, one module per concern (commits, inventory, retention, runs and
leases, health, history, ...), named like the calls in :mod:`state_runtime.catalog.api` that
run it, with the helpers they share (lookups, rows, statements, roots)."""
