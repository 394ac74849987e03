"""``state_checkpoints``: the checkpoint files the streams write, one partition per store.

Its own module because the assets, the checks and the events that report each store's state
all name it. Declared here; made executable by ``record_store_state`` (``store_events.py``).
"""

from dagster import AssetSpec

from dagster_project.defs.partitions import state_stores

GROUP = "state_maintenance"
POOL = "state_maintenance"

state_checkpoints = AssetSpec(
    key="state_checkpoints",
    description=(
        "Checkpoint files of the state stores (deltas and snapshots), written by the streaming "
        "queries; Dagster never writes them. One partition per store "
        "(<query>/<operator>/<partition>/<store>); each validation or health run, in Dagster "
        "or outside it, records the store's status and figures on its partition: a "
        "materialization, or for a broken store an observation, and the partition shows Failed "
        "(a state_store_record_job run on it observes the store, then fails) until the store "
        "is sound again (a validation, and a state_store_record_job run that materializes it). "
        "Materializing a partition records the store's state from the catalog now."
    ),
    partitions_def=state_stores,
    group_name=GROUP,
    kinds={"arrow"},
)
