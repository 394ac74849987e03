"""The house's guards: no module over 600 lines, and the layer diagram of docs/architecture.md
drawn as the imports are (every import goes down or stays in its layer)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_import_graph import PACKAGE, REPO, import_graph

MAX_LINES = 600
SIZED = [PACKAGE, REPO / "dagster_project", REPO / "state_runtime_airflow", REPO / "benchmarks"]
PENDING_CUTS: dict[str, str] = {}
"""Modules over the limit whose cut is another branch's; remove the entry when it lands."""
DIAGRAM = REPO / "docs" / "architecture.md"
PATH = r"(?<![\w/])((?:state_runtime_airflow|state_runtime|dagster_project|sql)(?:/\w+)*(?:/|\.py))"
"""A package (``state_runtime/store/``) or a module (``state_runtime/status.py``) in the diagram."""


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_module_is_over_600_lines() -> None:
    """Small modules named for what they do: the package, the front ends and the benchmarks
    (migrations aside: one revision per file, never edited)."""
    over = {
        str(path.relative_to(REPO)): _lines(path)
        for root in SIZED
        for path in root.rglob("*.py")
        if "migrations" not in path.parts and _lines(path) > MAX_LINES
    }
    assert {p: n for p, n in over.items() if p not in PENDING_CUTS} == {}


def layers(text: str) -> list[list[str]]:
    """The diagram's layers, top first: each the paths (``state_runtime/x/``, ``.../y.py``)
    listed on its lines (a line starting in the first column opens a layer)."""
    block = text.split("## Layers", 1)[1].split("```", 2)[1]
    found: list[list[str]] = []
    for line in block.splitlines():
        if not line.strip():
            continue
        if not line.startswith("  "):  # a label in the first columns opens a layer
            found.append([])
        found[-1] += re.findall(PATH, line)
    return [paths for paths in found if paths]


def layer_of(module: str, drawn: list[list[str]]) -> int | None:
    """The index of the layer whose path holds ``module`` (the longest match), or None."""
    path = module.replace(".", "/")
    best: tuple[int, int] | None = None
    for index, paths in enumerate(drawn):
        for drawn_path in paths:
            hit = path + ".py" == drawn_path or (path + "/").startswith(drawn_path)
            if hit and (best is None or len(drawn_path) > best[1]):
                best = (index, len(drawn_path))
    return None if best is None else best[0]


def test_the_diagram_reader_finds_the_layers() -> None:
    drawn = layers(
        "## Layers\n```\n top   state_runtime/a/  x\n       state_runtime/b.py\n"
        " low   state_runtime/c/\n```\n"
    )
    assert drawn == [["state_runtime/a/", "state_runtime/b.py"], ["state_runtime/c/"]]
    assert layer_of("state_runtime.a.deep", drawn) == 0 and layer_of("state_runtime.c", drawn) == 1
    assert layer_of("state_runtime.b", drawn) == 0 and layer_of("state_runtime.d", drawn) is None


def test_the_layer_diagram_is_drawn_as_the_imports_are() -> None:
    """Every module of the package sits in a layer of the diagram, and imports only modules
    of its own layer or below (the package's ``__init__``, the public API, is left out)."""
    drawn = layers(DIAGRAM.read_text())
    graph = {m: deps for m, deps in import_graph().items() if m != "state_runtime"}
    unplaced = sorted(m for m in graph if layer_of(m, drawn) is None)
    assert unplaced == [], f"not in the diagram of {DIAGRAM.name}: {unplaced}"
    up = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets - {"state_runtime"}
        if (layer_of(target, drawn) or 0) < (layer_of(module, drawn) or 0)
    )
    assert up == [], f"imports going up the diagram of {DIAGRAM.name}: {up}"
