"""The hook: the state catalog and the checkpoint storage, from Airflow connections.

``state_catalog_default`` (type ``state_catalog``, ``postgres`` or ``sqlite``) names the
catalog: host, port, login, password and schema (the database; for SQLite, the file), with an
optional ``drivername`` extra (default ``postgresql+psycopg2``). ``state_storage_default``
(type ``aws``) holds the S3 credentials for the checkpoint roots: login (access key id),
password (secret key) and the extras ``endpoint_url``, ``region_name`` and
``aws_session_token``. Without that connection, S3 roots use boto3's own chain (the worker's
environment, profile or role); local roots need none. No credential lives in DAG code.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from state_runtime.catalog import Catalog, catalog_url_of
from state_runtime.errors import InvalidArgument
from state_runtime.maintenance import Fleet, canonical_root
from state_runtime.storage import Storage, open_storage

DEFAULT_CATALOG_CONN = "state_catalog_default"
DEFAULT_STORAGE_CONN = "state_storage_default"
DRIVERS = {
    "state_catalog": "postgresql+psycopg2",
    "postgres": "postgresql+psycopg2",
    "postgresql": "postgresql+psycopg2",
    "sqlite": "sqlite",
}
STORAGE_EXTRAS = ("endpoint_url", "region_name", "aws_session_token")


class StateCatalogHook(BaseHook):
    """Opens the state catalog and the storage of its checkpoint roots for maintenance."""

    conn_name_attr = "state_catalog_conn_id"
    default_conn_name = DEFAULT_CATALOG_CONN
    conn_type = "state_catalog"
    hook_name = "State store catalog"

    def __init__(
        self,
        state_catalog_conn_id: str = DEFAULT_CATALOG_CONN,
        storage_conn_id: str | None = DEFAULT_STORAGE_CONN,
    ) -> None:
        super().__init__()
        self.state_catalog_conn_id = state_catalog_conn_id
        self.storage_conn_id = storage_conn_id
        self._storage_options: dict[str, object] | None = None

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """How the connection form names its fields."""
        return {
            "hidden_fields": [],
            "relabeling": {"schema": "Database (SQLite: the file)"},
            "placeholders": {"extra": '{"drivername": "postgresql+psycopg2"}'},
        }

    def catalog_url(self) -> str:
        """The catalog's SQLAlchemy URL, built from the connection's fields."""
        conn = self.get_connection(self.state_catalog_conn_id)
        extra = conn.extra_dejson
        driver = str(extra.get("drivername") or DRIVERS.get(conn.conn_type or "", ""))
        if not driver:
            raise InvalidArgument(
                f"connection {conn.conn_id!r} is of type {conn.conn_type!r}: expected one of "
                f"{', '.join(DRIVERS)} or a 'drivername' extra"
            )
        if driver.startswith("sqlite"):
            return catalog_url_of(driver, database=conn.schema or conn.host)
        return catalog_url_of(
            driver,
            database=conn.schema,
            host=conn.host,
            port=conn.port,
            username=conn.login,
            password=conn.password,
            query=extra.get("query"),
        )

    def storage_options(self) -> dict[str, object]:
        """Options for S3 roots from the storage connection; none when it is not defined."""
        if self._storage_options is None:
            self._storage_options = self._read_storage_options()
        return self._storage_options

    def _read_storage_options(self) -> dict[str, object]:
        if self.storage_conn_id is None:
            return {}
        try:
            conn = self.get_connection(self.storage_conn_id)
        except AirflowNotFoundException:
            if self.storage_conn_id != DEFAULT_STORAGE_CONN:
                raise
            self.log.info(
                "no %s connection: S3 roots use boto3's own credentials", DEFAULT_STORAGE_CONN
            )
            return {}
        extra = conn.extra_dejson
        options: dict[str, object] = {k: extra[k] for k in STORAGE_EXTRAS if extra.get(k)}
        if conn.login:
            options["aws_access_key_id"] = conn.login
        if conn.password:
            options["aws_secret_access_key"] = conn.password
        return options

    def __getstate__(self) -> dict[str, Any]:
        """The hook as a pass's worker processes receive it (its ``open_storage`` opens their
        roots), the storage options read first: a process of the task's own reads no Airflow
        connection."""
        self.storage_options()
        return dict(self.__dict__)

    def open_storage(self, root: str) -> Storage:
        """The storage of a checkpoint root (S3 roots with the storage connection's options)."""
        if root.startswith(("s3://", "s3a://")):
            return open_storage(root, **self.storage_options())
        return open_storage(root)

    @contextmanager
    def catalog(self) -> Iterator[Catalog]:
        catalog = Catalog.open(self.catalog_url())
        try:
            yield catalog
        finally:
            catalog.close()

    @contextmanager
    def fleet(self, owner: str, roots: Sequence[str] | None = None) -> Iterator[Fleet]:
        """The stores to maintain, below ``roots`` (all the catalog's when None); ``owner``
        names the work in the catalog's run records and leases."""
        scope = [canonical_root(r) for r in roots] if roots else None
        with self.catalog() as catalog:
            yield Fleet(catalog, roots=scope, open_storage=self.open_storage, owner=owner)

    def test_connection(self) -> tuple[bool, str]:
        """The connection form's Test button: open the catalog and count its stores."""
        try:
            with self.catalog() as catalog:
                stores = len(catalog.stores())
        except Exception as exc:  # the form shows any failure as text
            return False, str(exc)
        return True, f"catalog reached: {stores} store(s)"
