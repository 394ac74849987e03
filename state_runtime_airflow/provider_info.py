"""What Airflow's providers manager reads about this provider (the ``apache_airflow_provider``
entry point): its connection type and the modules of its hook and operators."""

from __future__ import annotations

from typing import Any

PACKAGE = "state-runtime"


def get_provider_info() -> dict[str, Any]:
    """The provider's description in the runtime schema of ``airflow/provider_info.schema.json``."""
    return {
        "package-name": PACKAGE,
        "name": "State Runtime",
        "description": "Maintenance of state_runtime's state stores: snapshots, validation, "
        "cleanup, repair, restore, repartitioning and health.",
        "integrations": [
            {"integration-name": "State Runtime", "tags": ["software"]},
        ],
        "hooks": [
            {
                "integration-name": "State Runtime",
                "python-modules": ["state_runtime_airflow.hooks"],
            }
        ],
        "operators": [
            {
                "integration-name": "State Runtime",
                "python-modules": ["state_runtime_airflow.operators"],
            }
        ],
        "connection-types": [
            {
                "connection-type": "state_catalog",
                "hook-class-name": "state_runtime_airflow.hooks.StateCatalogHook",
                "hook-name": "State store catalog",
            },
        ],
    }
