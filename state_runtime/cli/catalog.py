"""The catalog's own commands, ``statestore catalog upgrade|current|grants``: the same as
``python -m state_runtime.catalog upgrade|current|grants``, on the group's ``--catalog-url``."""

from __future__ import annotations

import click

from state_runtime.catalog import grant_statements, revision_line, upgrade_catalog
from state_runtime.cli.group import Settings


@click.group()
def catalog() -> None:
    """The catalog's schema and roles: upgrade it, show its revision, grant the roles' rights."""


@catalog.command()
@click.option("--revision", default="head", help="The revision to migrate to.")
@click.pass_obj
def upgrade(settings: Settings, /, revision: str) -> None:
    """Create or upgrade the catalog's schema (as its owner), then show its revision."""
    click.echo(upgrade_catalog(settings.url, revision))


@catalog.command()
@click.pass_obj
def current(settings: Settings, /) -> None:
    """The catalog's revision and the newest one this code knows (never creates a catalog)."""
    click.echo(revision_line(settings.url))


@catalog.command()
@click.option("--apply", is_flag=True, help="Run the SQL (as the owner) instead of printing it.")
@click.option("--owner-role", help="The owner role's name.", show_default="the URL's role")
@click.option("--runtime-role", help="The runtime role's name.", show_default="state_runtime")
@click.option(
    "--maintenance-role", help="The maintenance role's name.", show_default="state_maintenance"
)
@click.option("--reader-role", help="The reader role's name.", show_default="state_reader")
@click.pass_obj
def grants(
    settings: Settings,
    /,
    apply: bool,
    owner_role: str | None,
    runtime_role: str | None,
    maintenance_role: str | None,
    reader_role: str | None,
) -> None:
    """The SQL that creates the runtime, maintenance and reader roles (PostgreSQL) and grants
    their rights; with --apply it runs it."""
    statements = grant_statements(
        settings.url,
        owner=owner_role,
        runtime=runtime_role,
        maintenance=maintenance_role,
        reader=reader_role,
        apply=apply,
    )
    click.echo("\n".join(f"{statement};" for statement in statements))
