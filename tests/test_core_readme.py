"""Every python example in shared/README.md (remit-core) runs, in order."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.readme import run_blocks

README = Path(__file__).resolve().parents[1] / "shared" / "README.md"


def test_core_readme_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert run_blocks(README, {"__name__": "readme"}) >= 4
    assert (tmp_path / "remit.db").exists()
