"""Catalog administration: ``python -m state_runtime.catalog upgrade|current|grants [--url URL]``.

``grants`` prints the SQL that creates the runtime, maintenance and reader roles and grants
their rights (:mod:`state_runtime.catalog.schema.grants`); with ``--apply`` it runs it, as the
owner. Exit codes: 0 done; 1 any error, printed as one line (``current`` never creates a catalog).
"""

from __future__ import annotations

import argparse
import sys

from state_runtime.catalog.connection.settings import URL_ENV, catalog_url
from state_runtime.catalog.schema.administration import (
    grant_statements,
    revision_line,
    upgrade_catalog,
)
from state_runtime.errors import StateStoreError


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
        url = args.url or catalog_url()
        if args.command == "grants":
            statements = grant_statements(
                url,
                owner=args.owner_role,
                runtime=args.runtime_role,
                maintenance=args.maintenance_role,
                reader=args.reader_role,
                apply=args.apply,
            )
            print("\n".join(f"{statement};" for statement in statements))
        elif args.command == "upgrade":
            print(upgrade_catalog(url, args.revision))
        else:
            print(revision_line(url))
    except StateStoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
