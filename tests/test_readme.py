"""The README's store example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def test_store_example_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = README.read_text()
    match = re.search(r"<!-- test: store-example -->\n```python\n(.*?)```", text, re.S)
    assert match, "the README lost its store example"
    monkeypatch.chdir(tmp_path)
    exec(compile(match.group(1), "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "{('alice',): (2, '/pay'), ('bob',): None}" in out
    assert "[(('alice',), (2, '/pay'))] cache" in out
    assert (
        len(list((tmp_path / "demo-output/readme-example/state/0/0/default").glob("2_*.snapshot")))
        == 1
    )
