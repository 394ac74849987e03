"""Airflow assets for the state stores: one per checkpoint root (a query's stores), updated by
the health task when every store below the root is validated, cleaned and not broken.

The maintenance DAG does not know the roots when it is parsed, so its health task emits
through the alias :data:`MAINTAINED`; a downstream DAG waits with ``schedule=[root_asset(root)]``
(or on the alias, for every root).
"""

from __future__ import annotations

from urllib.parse import quote

from airflow.sdk import Asset, AssetAlias

from state_runtime.maintenance import canonical_root

GROUP = "state_runtime"
MAINTAINED = AssetAlias("state_runtime_maintained", group=GROUP)


def root_asset(root: str) -> Asset:
    """The asset of a checkpoint root (a path or URI, as the runtime or the catalog names it)."""
    uri = canonical_root(root)
    return Asset(
        name=f"state_runtime_maintained:{uri}",
        uri=f"x-state-runtime://maintained/{quote(uri, safe='')}",
        group=GROUP,
    )
