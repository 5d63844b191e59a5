"""Every python example in packages/remit-crewai/README.md runs, in order."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from crewai.flow.persistence.factory import set_flow_persistence_factory

from tests.crewai import _env  # noqa: F401  (before the examples import crewai)
from tests.readme import python_blocks, run_blocks

README = Path(__file__).resolve().parents[2] / "packages" / "remit-crewai" / "README.md"


@pytest.fixture
def factory_reset() -> Iterator[None]:
    yield
    set_flow_persistence_factory(None)


def test_readme_states_the_supported_range_first() -> None:
    top = README.read_text().split("\n## ", 1)[0]
    assert "crewai>=1.15,<1.16" in top


def test_readme_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             factory_reset: None) -> None:
    assert len(python_blocks(README)) >= 8
    monkeypatch.chdir(tmp_path)  # the examples use sqlite:///flows.db, a relative path
    module = types.ModuleType("remit_crewai_readme")  # so that annotations resolve
    monkeypatch.setitem(sys.modules, module.__name__, module)
    run_blocks(README, module.__dict__)
    assert (tmp_path / "flows.db").exists()
