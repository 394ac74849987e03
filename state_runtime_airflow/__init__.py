"""The Airflow provider of the state store's maintenance platform: a hook for the catalog and
the storage (Airflow connections), operators for each maintenance pass, a health check, assets,
and a ready DAG (``state_runtime_airflow/dags``). A thin layer over ``state_runtime.maintenance``,
like the Dagster code location; see docs/airflow.md.
"""
