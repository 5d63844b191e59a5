"""Every python example in packages/remit-langgraph/README.md runs, in order."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "packages" / "remit-langgraph" / "README.md"


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = blocks()
    assert len(code) >= 5
    monkeypatch.chdir(tmp_path)  # the examples use sqlite:///app.db, a relative path
    namespace: dict[str, object] = {"__name__": "readme"}
    for i, block in enumerate(code):
        try:
            exec(compile(block, f"README.md block {i + 1}", "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"README block {i + 1} failed: {exc!r}\n{block}") from exc
    assert (tmp_path / "app.db").exists()
