"""A repartition's layout switch (``Catalog.switch_layout``) is set-based: the batch's entries
replaced or removed, their files orphaned, the new snapshots committed and verified and the
stores' latest versions set take the same number of statements whatever the number of
stores, and the catalog ends as the new layout says (a store's expiry brought below the
switch)."""

from __future__ import annotations

import sqlalchemy as sa

from state_runtime.catalog import Catalog
from state_runtime.catalog.records import NewLayout
from state_runtime.catalog.schema.tables import checkpoint_files, stores
from state_runtime.catalog.sql.layouts import Switch
from state_runtime.identity import FileKind, StoreId
from tests.catalog.factory import Stream, info
from tests.statements import statements


def _switch(catalog: Catalog, root: str, partitions: int) -> tuple[Stream, Switch, list[str]]:
    """Two stores commit batches 0 and 1 (versions 1 and 2); batch 1 is switched to
    ``partitions`` stores, each a snapshot at version 3. The statements it sent, BEGINs
    left out."""
    stream = Stream(catalog, [StoreId(0, 0), StoreId(0, 1)], root=root)
    stream.run(2)
    with catalog.engine.begin() as connection:  # as if cleanup had expired past the switch
        connection.execute(
            stores.update().where(stores.c.checkpoint_root == root).values(expired_through=10)
        )
    snapshots = [info(StoreId(0, p), 3, None, kind=FileKind.SNAPSHOT) for p in range(partitions)]
    expected = {s: stream.committed[s][-1].ref for s in stream.stores}
    layout = NewLayout(0, "default", partitions, [{"by": "hash"}])
    with statements(catalog.engine) as sent:
        switch = catalog.switch_layout(
            root, stream.query, 1, expected, snapshots, [layout], reason="test", run_id=None
        )
    committed = catalog.committed_ids(root, stream.query, 1)
    assert committed == {s.store: s.ref for s in snapshots}
    assert catalog.latest_committed(root) == {s.store: s.ref for s in snapshots}
    with catalog.engine.connect() as connection:
        f = checkpoint_files.c
        states = dict(
            connection.execute(
                sa.select(f.path, f.state + ":" + sa.func.coalesce(f.verification, "-"))
            ).all()
        )
        expiry = dict(
            connection.execute(
                sa.select(stores.c.partition_id, stores.c.expired_through).where(
                    stores.c.checkpoint_root == root
                )
            ).all()
        )
    assert {states[s.path] for s in snapshots} == {"committed:verified"}
    replaced = [stream.committed[s][-1].path for s in stream.stores]
    assert {states[path].split(":")[0] for path in replaced} == {"orphan"}
    assert {states[stream.committed[s][0].path].split(":")[0] for s in stream.stores} == {
        "committed"
    }
    assert all(expiry[p] <= 2 for p in range(partitions)), expiry  # below version 3
    assert expiry[0] == 2, expiry  # brought down from 10 to below the switch, not left there
    return stream, switch, [text for text in sent if not text.lstrip().upper().startswith("BEGIN")]


def test_a_switch_takes_the_same_statements_for_four_stores_as_for_eight(
    catalog: Catalog,
) -> None:
    """Two stores to four and two to eight: the same statements (none a store or an entry),
    two entries replaced, the others added, the replaced entries' files orphaned; the earlier
    versions stay committed."""
    _, four, few = _switch(catalog, "/data/checkpoints/query-a", 4)
    _, eight, many = _switch(catalog, "/data/checkpoints/query-b", 8)
    assert (four.replaced, four.removed, four.added, four.orphaned_files) == (2, 0, 2, 2)
    assert (eight.replaced, eight.removed, eight.added, eight.orphaned_files) == (2, 0, 6, 2)
    assert len(few) == len(many), (few, many)


def test_a_switch_to_fewer_stores_removes_the_others_entries(catalog: Catalog) -> None:
    """Two stores to one: one entry replaced, one removed, both old files orphaned; the
    removed store's latest version returns to 0."""
    _, switch, _ = _switch(catalog, "/data/checkpoints/query-a", 1)
    assert (switch.replaced, switch.removed, switch.added, switch.orphaned_files) == (1, 1, 0, 2)
    with catalog.engine.connect() as connection:
        s = stores.c
        latest = dict(
            connection.execute(
                sa.select(s.partition_id, s.latest_version).where(
                    s.checkpoint_root == "/data/checkpoints/query-a"
                )
            ).all()
        )
    assert latest == {0: 3, 1: 0}
