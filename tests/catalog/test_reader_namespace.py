"""Reading through the views is structural: a read function receives the reading views as a
``ReaderViews`` parameter (``CatalogBase._read`` passes it) and names no table.

The rules, each checked below:
- ``schema/reading_views.py`` holds its views in the one ``ReaderViews`` namespace, no view
  as a module-level name;
- a function of ``catalog/sql/`` with a ``ReaderViews`` parameter names no table, no view
  and not the shared namespace (only what it receives);
- every read method of ``Catalog`` (tests/catalog/test_reader_role.py's list) but the clock
  runs through ``self._read``, and the modules that import the shared ``READER_VIEWS`` are
  exactly the read path's entry (``CatalogBase._read``) and the operators' views, rendered
  from the read queries (a write hands the read functions it calls ``WRITE_LOOKUPS``, the
  same views, which no read function may name).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa

import state_runtime
from state_runtime.catalog import Catalog
from state_runtime.catalog.schema import reading_views
from tests.catalog.test_reader_role import READS

PACKAGE = Path(state_runtime.__file__).parent
SQL = PACKAGE / "catalog" / "sql"

NO_RELATION = frozenset({"now"})
"""Reads that select from no relation (the database's clock)."""

READ_PATH = {
    "state_runtime.catalog.api.transactions",  # CatalogBase._read hands the namespace out
    "state_runtime.catalog.schema.operator_views",  # renders the read queries as views
}


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)


def _sql_modules() -> list[ModuleType]:
    return [importlib.import_module(_module_name(p)) for p in sorted(SQL.glob("*.py"))]


def _takes_views(function: ast.FunctionDef) -> bool:
    params = [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs]
    return any(
        p.annotation is not None and ast.unparse(p.annotation) == "ReaderViews" for p in params
    )


def _forbidden(value: object) -> bool:
    """A table, a view, the shared namespace (under any name: ``WRITE_LOOKUPS`` too), or a
    module holding tables."""
    return (
        isinstance(value, sa.FromClause)
        or value is reading_views.READER_VIEWS
        or (
            isinstance(value, ModuleType)
            and value.__name__.startswith("state_runtime.catalog.schema")
        )
    )


def _violations(module: ModuleType, source: str) -> list[str]:
    """``function: name`` for each global that names a table in a function taking the views."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and _takes_views(node):
            for name in ast.walk(node):
                if isinstance(name, ast.Name) and _forbidden(getattr(module, name.id, None)):
                    found.append(f"{module.__name__}.{node.name}: {name.id}")
    return found


def test_the_views_live_only_in_the_namespace() -> None:
    loose = [
        name
        for name, value in vars(reading_views).items()
        if isinstance(value, sa.TableClause) and value.name.startswith(reading_views.PREFIX)
    ]
    assert loose == []
    assert {name: view.name for name, view in vars(reading_views.READER_VIEWS).items()} == {
        name: reading_views.PREFIX + table.name for name, table in reading_views.VIEWED.items()
    }


def test_read_functions_name_no_table() -> None:
    sources = {module: inspect.getsource(module) for module in _sql_modules()}
    readers = [
        n.name
        for source in sources.values()
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.FunctionDef) and _takes_views(n)
    ]
    assert len(readers) >= 20  # the rule checks the converted reads
    assert [v for module, source in sources.items() for v in _violations(module, source)] == []


_PROBE = """
def probe(connection, views: ReaderViews):
    return views, READER_VIEWS, stores
"""
"""A read function naming the shared namespace and a table (where its module imports them)."""


def test_a_read_function_naming_a_table_is_caught() -> None:
    module = ModuleType("state_runtime.catalog.sql.leak")
    exec(
        "from state_runtime.catalog.schema.reading_views import READER_VIEWS, ReaderViews\n"
        "from state_runtime.catalog.schema.tables import stores",
        vars(module),
    )
    assert _violations(module, _PROBE) == [
        "state_runtime.catalog.sql.leak.probe: READER_VIEWS",
        "state_runtime.catalog.sql.leak.probe: stores",
    ]


def _through_read(name: str) -> bool:
    """The method reads through ``_read`` (or ``_pages``, whose every page is one ``_read``)
    and writes nothing."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(Catalog, name))))
    calls = {
        n.func.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
    }
    return bool(calls & {"_read", "_pages"}) and "_run" not in calls


def test_read_methods_run_through_the_views() -> None:
    assert {name for name in READS if not _through_read(name)} == NO_RELATION


def test_only_the_read_path_imports_the_shared_namespace() -> None:
    importers = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module == reading_views.__name__
                and any(a.name == "READER_VIEWS" for a in node.names)
            ):
                importers.add(_module_name(path))
    assert importers == READ_PATH
