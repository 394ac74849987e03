"""The Catalog's calls, one module per group of callers, composed into :class:`Catalog
<state_runtime.catalog.Catalog>`: commits (the runtime), inventory, retention (cleanup), runs
and leases, health, history, event time, schema histories, layouts. The SQL each call runs
lives in the module of the same name in :mod:`state_runtime.catalog.sql`."""
