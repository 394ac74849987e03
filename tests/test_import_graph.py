"""The package's modules import each other without cycles (type-checking imports included), and
only the catalog package touches SQL: no module outside ``state_runtime.catalog`` imports
SQLAlchemy, Alembic or a module of the catalog package (its tables, engine, SQL helpers); they
call :class:`state_runtime.catalog.Catalog` through the package."""

from __future__ import annotations

import ast
from pathlib import Path

import state_runtime

PACKAGE = Path(state_runtime.__file__).parent
DAGSTER = PACKAGE.parent / "dagster_project"
CATALOG = PACKAGE / "catalog"
SQL_LIBRARIES = ("sqlalchemy", "alembic", "psycopg2")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The package modules ``path`` imports in any import statement (the implicit import of
    a parent package is not counted: Python initialises packages before their modules)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                package = _module_name(path).split(".")
                if path.name != "__init__.py":
                    package = package[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            for alias in node.names:  # a submodule, or a name defined in ``base``
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    return {name for name in found if name in modules}


def external_imports(path: Path) -> set[str]:
    """Every absolute module name ``path`` imports (first dotted level kept whole)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts}
    modules = set(files)
    return {name: _imports(path, modules) - {name} for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules, or None."""
    done: set[str] = set()
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(node: str) -> list[str] | None:
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt in on_stack:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in done:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        on_stack.discard(node)
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def test_the_checker_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_state_runtime_has_no_import_cycle() -> None:
    graph = import_graph()
    assert "state_runtime.store.state_store" in graph and "state_runtime.store.provider" in graph
    assert "state_runtime.store.state_store" in graph["state_runtime.store.provider"]
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def _outside_catalog() -> list[Path]:
    return [p for p in [*PACKAGE.rglob("*.py"), *DAGSTER.rglob("*.py")] if CATALOG not in p.parents]


def _catalog_module(name: str) -> bool:
    """``state_runtime.catalog.<x>...`` where ``x`` is a module or package of the catalog (a
    name the package exports, such as ``Catalog``, is not)."""
    head, _, rest = name.partition("state_runtime.catalog.")
    first = rest.split(".")[0]
    return (
        not head
        and bool(first)
        and ((CATALOG / f"{first}.py").exists() or (CATALOG / first).is_dir())
    )


def test_only_the_catalog_touches_sql() -> None:
    """SQL (the tables, the engine, transactions) stays behind the Catalog's methods."""
    assert _catalog_module("state_runtime.catalog.tables") and _catalog_module(
        "state_runtime.catalog.api.run_calls"
    )
    assert not _catalog_module("state_runtime.catalog.Catalog")
    assert "sqlalchemy" in external_imports(CATALOG / "inventory.py")
    offenders = {}
    for path in _outside_catalog():
        bad = {
            name
            for name in external_imports(path)
            if name.split(".")[0] in SQL_LIBRARIES or _catalog_module(name)
        }
        if bad:
            offenders[str(path.relative_to(PACKAGE.parent))] = sorted(bad)
    assert not offenders, offenders
