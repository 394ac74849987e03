"""The catalog's schema: its tables, the reading views every read selects from, the operators'
views, the PostgreSQL grants, the Alembic migrations that build them and the revision check."""
