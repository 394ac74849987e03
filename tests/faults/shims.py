"""LD_PRELOAD shims that put a real fault into a process: failing C library calls
(``oserror_shim.c``) and a wall clock that is off (``clock_shim.c``)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def build_shim(name: str, into: Path) -> Path:
    """``<name>.c`` compiled to a shared library in ``into``."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.fail(f"a C compiler is needed to build tests/faults/{name}.c")
    built = into / f"{name}.so"
    command = [compiler, "-shared", "-fPIC", "-o", str(built), str(HERE / f"{name}.c"), "-ldl"]
    subprocess.run(command, check=True)
    return built
