"""LangGraph's own released test suite passes on RemitSaver (SQLite), in the default run.

The sdist of the installed langgraph is downloaded at run time (and cached); see
:mod:`tests.upstream.run`. Every test that passes on the stock SqliteSaver must pass on
RemitSaver, except the documented deliberate differences in
packages/remit-langgraph/README.md. The nox session ``langgraph_upstream`` runs the same
on PostgreSQL and Redis and on older langgraph releases.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(1800)
def test_langgraphs_own_suite_passes_on_remitsaver(tmp_path: Path) -> None:
    report = tmp_path / "upstream.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.upstream.run", "langgraph", "--store", "sqlite",
         "--json", str(report)],
        cwd=ROOT, capture_output=True, text=True, timeout=1700)
    summary = proc.stdout[proc.stdout.rfind("\nupstream: "):]
    print(summary)
    assert proc.returncode == 0, summary + proc.stderr[-3000:]
    result = json.loads(report.read_text())
    assert result["remit"]["passed"] >= 500, result["remit"]  # the suite really ran
    assert result["unlisted"] == {}
