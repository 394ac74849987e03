"""``statestore`` run by a process that hosted a local Spark Connect server.

Starting a local Connect server sets pyspark's process-wide switch
``SPARK_CONNECT_MODE_ENABLED=1`` in the process's environment (``spark_session(remote=
"local")``), and every child process inherits it: a ``statestore repartition`` launched from
such a process (a Dagster op's subprocess, a notebook's shell) once failed with exit 5 ("a
bug": pyspark's classic builder refused, CONNECT_URL_NOT_SET). A real subprocess with the
switch set now starts its own classic session for the job.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from state_runtime.catalog import Catalog
from state_runtime.identity import StoreId
from state_runtime.storage import LocalStorage
from tests.maintenance.streams import StoreStream

pytestmark = pytest.mark.spark


def test_statestore_ignores_an_inherited_connect_switch(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    catalog = Catalog.open(url, upgrade=True)
    stream = StoreStream(catalog, LocalStorage(tmp_path / "ckpt"), [StoreId(0, 0), StoreId(0, 1)])
    stream.run(3)
    catalog.close()
    env = os.environ | {"SPARK_CONNECT_MODE_ENABLED": "1", "STATE_CATALOG_URL": url}
    env.pop("SPARK_REMOTE", None)
    exe = Path(sys.executable).with_name("statestore")
    args = ["repartition", stream.root, "--query", stream.query, "--partitions", "3"]
    done = subprocess.run(
        [exe, "-q", *args, "--idle", "0s", "--no-spark-checkpoint", "--master", "local[1]"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    # the job's classic session started and the command reached its own rules: these
    # stores were committed without a layout (no query recorded one), a typed refusal
    assert done.returncode == 3, done.stderr
    assert "CONNECT_URL_NOT_SET" not in done.stderr
    assert "has no layout in the catalog" in done.stderr, done.stderr
