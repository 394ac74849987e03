"""The Catalog's calls, one module per group of callers, composed into :class:`Catalog
<state_runtime.catalog.Catalog>`: commits (the runtime), inventory, retention (cleanup), runs
and leases, health. The SQL each call runs lives beside them in ``state_runtime/catalog``."""
