"""The package's modules import each other without cycles (type-checking imports included), and
only the catalog package touches SQL: no module outside ``state_runtime.catalog`` (the
Dagster project, the demo and the scripts included) imports SQLAlchemy, Alembic or a module
of the catalog package (its tables, engine, SQL helpers); they call
:class:`state_runtime.catalog.Catalog` through the package. The benchmarks, the scripts and
the demo use only public names of the library. A Python worker running the runtime's tasks
imports neither the catalog nor an orchestrator."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import state_runtime

PACKAGE = Path(state_runtime.__file__).parent
REPO = PACKAGE.parent
DAGSTER = REPO / "dagster_project"
AIRFLOW = REPO / "state_runtime_airflow"
FRONTS = [REPO / "benchmarks", REPO / "scripts", REPO / "demo"]
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
    """Every module that must reach SQL through ``Catalog`` (the benchmarks measure the
    catalog's own queries, so they may import its modules: public names only, see below)."""
    roots = [PACKAGE, DAGSTER, AIRFLOW, REPO / "scripts", REPO / "demo"]
    return [p for root in roots for p in root.rglob("*.py") if CATALOG not in p.parents]


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
    assert _catalog_module("state_runtime.catalog.schema.tables") and _catalog_module(
        "state_runtime.catalog.api.runs_and_leases"
    )
    assert not _catalog_module("state_runtime.catalog.Catalog")
    assert "sqlalchemy" in external_imports(CATALOG / "sql" / "inventory.py")
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


def _private(name: str) -> bool:
    """A dotted name with a private part (``_x``; dunder names such as ``__main__`` are not)."""
    return any(
        part.startswith("_") and not (part.startswith("__") and part.endswith("__"))
        for part in name.split(".")
    )


def test_benchmarks_scripts_and_demo_use_only_public_names() -> None:
    assert _private("state_runtime.catalog.connection.engine._ATTEMPT_TIMEOUT")
    assert not _private("state_runtime.catalog.__main__") and not _private("state_runtime.Storage")
    files = [p for front in FRONTS for p in front.rglob("*.py")]
    assert {p.parent.name for p in files} == {"benchmarks", "scripts", "demo"}
    offenders = {}
    for path in files:
        bad = {
            name
            for name in external_imports(path)
            if name.split(".")[0] in ("state_runtime", "dagster_project") and _private(name)
        }
        if bad:
            offenders[str(path.relative_to(REPO))] = sorted(bad)
    assert not offenders, offenders


def test_the_catalog_calls_hold_no_sql() -> None:
    """``catalog/api`` composes the calls (one retried transaction each); the SQL of every
    call lives in the catalog module of its concern: no statement, no table here."""
    import sqlalchemy as sa

    from state_runtime.catalog.schema import tables

    for path in (CATALOG / "api").glob("*.py"):
        if path.name in ("__init__.py", "transactions.py"):  # the engine and the retry policy
            continue
        names = external_imports(path)
        assert {n for n in names if n.startswith("sqlalchemy")} <= {
            "sqlalchemy.engine",
            "sqlalchemy.engine.Connection",
        }, path.name
        for name in names:
            if name.startswith("state_runtime.catalog.schema.tables."):
                value = getattr(tables, name.rsplit(".", 1)[1])
                assert not isinstance(value, sa.Table), (path.name, name)
        assert ".execute(" not in path.read_text(), path.name


def test_every_module_says_why_at_the_top() -> None:
    """Each module opens with a docstring: what it is for, in a line or a paragraph."""
    roots = [PACKAGE, DAGSTER, AIRFLOW, *FRONTS]
    missing = [
        str(p.relative_to(REPO))
        for root in roots
        for p in root.rglob("*.py")
        if not ast.get_docstring(ast.parse(p.read_text()))
    ]
    assert not missing, missing


KIND_SUFFIXES = ("_sql", "_queries", "_calls", "_utils", "_helpers")


def _name_faults(paths: list[Path]) -> list[str]:
    """Modules whose name does not say what they hold: a kind suffix (the package says the
    kind: ``catalog/sql/retention.py``, not ``catalog/retention_sql.py``), or two names in one
    package that differ only by a plural ``s`` (``session.py`` beside ``sessions.py``)."""
    faults = [str(p) for p in paths if p.stem.endswith(KIND_SUFFIXES)]
    for p in paths:
        if p.stem.endswith("s") and p.with_name(p.stem[:-1] + ".py") in paths:
            faults.append(f"{p.with_name(p.stem[:-1] + '.py')} beside {p}")
    return faults


def test_module_names_say_what_they_hold() -> None:
    """A module is named for its concern; its package names the room (``catalog/api``: the
    calls, ``catalog/sql``: their SQL, ``catalog/schema``, ``catalog/connection``), so one
    concern may have a module of the same name in each room, but no name carries a kind
    suffix and no package holds two names a plural apart (migrations are named by revision).
    Test modules, named for what they test, stay unique across the test tree."""
    assert _name_faults([Path("a/b_sql.py"), Path("a/run.py"), Path("a/runs.py")]) == [
        "a/b_sql.py",
        "a/run.py beside a/runs.py",
    ]
    assert _name_faults([Path("a/run.py"), Path("b/runs.py")]) == []
    code = [
        p.relative_to(REPO)
        for root in [PACKAGE, DAGSTER, AIRFLOW, *FRONTS]
        for p in root.rglob("*.py")
        if "versions" not in p.parts
    ]
    assert _name_faults(code) == []
    seen: dict[str, list[str]] = {}
    for p in (REPO / "tests").rglob("*.py"):
        if p.name not in ("__init__.py", "conftest.py"):
            seen.setdefault(p.name, []).append(str(p.relative_to(REPO)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def test_each_orchestrator_is_a_layer_over_the_library_alone() -> None:
    """The library imports neither orchestrator; the Airflow provider never imports Dagster
    (nor the Dagster project), and the Dagster project never imports Airflow: each runs in an
    environment without the other."""
    forbidden = {
        PACKAGE: {"dagster", "dagster_project", "airflow", "state_runtime_airflow"},
        DAGSTER: {"airflow", "state_runtime_airflow"},
        AIRFLOW: {"dagster", "dagster_project"},
    }
    offenders = {
        str(path.relative_to(REPO)): sorted(bad)
        for root, names in forbidden.items()
        for path in root.rglob("*.py")
        if (bad := {n for n in external_imports(path) if n.split(".")[0] in names})
    }
    assert not offenders, offenders
    assert "airflow.sdk" in external_imports(AIRFLOW / "operators.py")


EXECUTOR_MODULES = (
    "state_runtime.runtime.tasks",  # the stateful stage's mapInArrow function
    "state_runtime.runtime.state_reads",  # read_state's and read_changes' functions
    "state_runtime.runtime.datasource",  # the state data source's reader
    "state_runtime.runtime.aggregation",  # the operators, pickled with each task
    "state_runtime.runtime.dedup",
    "state_runtime.runtime.windows",
    "state_runtime.runtime.session_windows",
    "state_runtime.runtime.tws",
)
"""The modules a Python worker imports to run the runtime's tasks (what it unpickles)."""

DRIVER_ONLY = ("sqlalchemy", "alembic", "psycopg2", "state_runtime.catalog", "dagster", "rich")
"""Never imported on that path: each is resident memory in every worker for nothing
(SQLAlchemy and Alembic alone about 32 MiB; docs/state-on-disk.md, "Issue 37, a worker's
fixed overhead"). pandas is not listed: pyarrow imports it at its first conversion of Python
values whatever the runtime imports."""


def _imported_by(modules: tuple[str, ...]) -> set[str]:
    """Every module a fresh interpreter holds after importing ``modules``."""
    code = f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
    code += "print('\\n'.join(sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    return set(out.stdout.split())


def _driver_only(loaded: set[str]) -> list[str]:
    return sorted(m for m in loaded if any(m == d or m.startswith(d + ".") for d in DRIVER_ONLY))


def test_a_worker_running_the_tasks_imports_no_driver_module() -> None:
    """A worker's fixed overhead stays lean: unpickling any task of the runtime imports
    neither the catalog (SQL) nor an orchestrator, only the stores and the operators."""
    assert _driver_only({"sqlalchemy.engine", "state_runtime.catalog", "pandas"}) == [
        "sqlalchemy.engine",
        "state_runtime.catalog",
    ]
    assert _driver_only(_imported_by(EXECUTOR_MODULES)) == []
    assert "sqlalchemy" in _imported_by(("state_runtime.runtime.reader",))  # the driver's side
