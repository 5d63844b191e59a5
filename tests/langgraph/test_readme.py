"""Every python example in packages/remit-langgraph/README.md runs, in order."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.readme import run_blocks

README = Path(__file__).resolve().parents[2] / "packages" / "remit-langgraph" / "README.md"


def test_readme_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the examples use sqlite:///app.db, a relative path
    assert run_blocks(README, {"__name__": "readme"}) >= 5
    assert (tmp_path / "app.db").exists()
