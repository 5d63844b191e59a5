"""Run the python examples of a README in order, as a test does."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any


def python_blocks(readme: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", readme.read_text(), flags=re.S)


def run_blocks(readme: Path, namespace: dict[str, Any]) -> int:
    """Execute every block in one namespace; a failure names the block. Returns the count."""
    code = python_blocks(readme)
    for i, block in enumerate(code):
        try:
            exec(compile(block, f"{readme.name} block {i + 1}", "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"{readme} block {i + 1} failed: {exc!r}\n{block}") from exc
    return len(code)
