"""The ready DAGs of the provider (Airflow's dags folder, or a copy of it, points here)."""
