"""Reaching the catalog database: where it lives and how long it may take (settings), engines
and retried transactions, the client-side watchdog that cuts a stuck attempt, and the
database's clock that leases, runs and retention go by."""
