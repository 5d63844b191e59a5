"""Every python example in shared/README.md (remit-core) runs, in order."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "shared" / "README.md"


def test_core_readme_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(code) >= 4
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "readme"}
    for i, block in enumerate(code):
        try:
            exec(compile(block, f"shared/README.md block {i + 1}", "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"block {i + 1} failed: {exc!r}\n{block}") from exc
    assert (tmp_path / "remit.db").exists()
