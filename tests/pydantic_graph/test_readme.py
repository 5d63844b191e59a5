"""Every python example in packages/remit-pydantic-graph/README.md runs, in order."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from tests.readme import python_blocks, run_blocks

README = Path(__file__).resolve().parents[2] / "packages" / "remit-pydantic-graph" / "README.md"


def test_readme_states_the_supported_range_first() -> None:
    top = README.read_text().split("\n## ", 1)[0]
    assert "pydantic-graph>=1.0,<2" in top and "ImportError" in top


def test_readme_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert len(python_blocks(README)) >= 8
    monkeypatch.chdir(tmp_path)  # the examples use sqlite:///runs.db, a relative path
    # a real module, so that pydantic and pydantic-graph resolve the examples' annotations
    module = types.ModuleType("remit_pg_readme")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    run_blocks(README, module.__dict__)
    assert (tmp_path / "runs.db").exists()
