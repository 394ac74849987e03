"""Catalog administration: ``python -m state_runtime.catalog upgrade|current|grants [--url URL]``.

``grants`` prints the SQL that creates the runtime, maintenance and reader roles and grants
their rights (:mod:`state_runtime.catalog.schema.grants`); with ``--apply`` it runs it, as the
owner. Exit codes: 0 done; 1 any error, printed as one line (``current`` never creates a catalog).
"""

from __future__ import annotations

import argparse
import sys

from state_runtime.catalog.connection.engine import (
    RetryPolicy,
    create_catalog_engine,
    display_url,
    run_transaction,
    sqlite_file,
)
from state_runtime.catalog.connection.settings import URL_ENV, catalog_url
from state_runtime.catalog.schema.grants import catalog_grants
from state_runtime.catalog.schema.revision import current_revision, head_revision, upgrade
from state_runtime.errors import CatalogSchemaOutdated, StateStoreError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m state_runtime.catalog",
        description="Create or upgrade the state catalog's schema.",
    )
    parser.add_argument("command", choices=["upgrade", "current", "grants"])
    parser.add_argument(
        "--url", help=f"catalog URL (default: ${URL_ENV}, else the embedded SQLite file)"
    )
    parser.add_argument("--revision", default="head", help="target revision for upgrade")
    parser.add_argument("--apply", action="store_true", help="grants: run the SQL (as owner)")
    for role in ("owner", "runtime", "maintenance", "reader"):
        parser.add_argument(
            f"--{role}-role",
            help=f"grants: the {role} role's name"
            + (" (default: the URL's role)" if role == "owner" else f" (default: state_{role})"),
        )
    args = parser.parse_args(argv)
    try:
        engine = create_catalog_engine(args.url or catalog_url())
        try:
            if args.command == "grants":
                statements = catalog_grants(
                    engine,
                    owner=args.owner_role,
                    runtime=args.runtime_role,
                    maintenance=args.maintenance_role,
                    reader=args.reader_role,
                    apply=args.apply,
                )
                print("\n".join(f"{statement};" for statement in statements))
                return 0
            if args.command == "upgrade":
                upgrade(engine, args.revision)
            missing = sqlite_file(engine.url)
            if missing is not None and not missing.is_file():  # reading must not create it
                raise CatalogSchemaOutdated(f"no catalog at {str(missing)!r}: no such file")
            found = run_transaction(
                engine, current_revision, retry=RetryPolicy(), what="read revision"
            )
            shown = display_url(engine.url)
            print(f"{shown}: revision {found or '(empty)'} (head: {head_revision()})")
        finally:
            engine.dispose()
    except StateStoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
