"""The ``remit check`` report: JSON and text from a real run, and the HTML page as a real
headless Chromium renders it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from remit_check import run_check
from remit_check.report import text, write_html, write_json
from tests.conftest import unavailable

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def report() -> object:
    return run_check(["pydantic-graph"], k=2, reps=1, progress=False,
                     only=["invalid-state", "fork-twice"])


def test_text_and_json(report: object, tmp_path: Path) -> None:
    out = text(report)  # type: ignore[arg-type]
    assert "invalid-state" in out and "VIOLATED" in out and "every remit cell holds" in out
    write_json(report, tmp_path / "r.json")  # type: ignore[arg-type]
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["ok"] is True and len(data["cells"]) == 4
    assert all(c["counts"] for c in data["cells"])


def chromium(tmp_path: Path) -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        unavailable("chromium is not installed (apt-get install chromium)")
    assert exe is not None
    return exe


def test_html_report_renders_in_a_real_browser(report: object, tmp_path: Path) -> None:
    exe = chromium(tmp_path)
    page = tmp_path / "report.html"
    write_html(report, page)  # type: ignore[arg-type]
    profile = tmp_path / "profile"
    run = subprocess.run(
        [exe, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120, check=True)
    dom = run.stdout
    cells = re.findall(r'<td class="cell (holds|violated|error)"[^>]*data-framework="([^"]+)"'
                       r'[^>]*data-layer="([^"]+)"[^>]*data-fault="([^"]+)"', dom)
    assert sorted(cells) == sorted([
        ("holds", "pydantic-graph", "remit", "invalid-state"),
        ("holds", "pydantic-graph", "remit", "fork-twice"),
        ("violated", "pydantic-graph", "stock", "invalid-state"),
        ("violated", "pydantic-graph", "stock", "fork-twice"),
    ]), dom[:2000]
    assert "Every remit cell holds." in dom
    assert re.search(r'title="invalid_persisted=\d+', dom)  # the counts, on hover
    shot = tmp_path / "report.png"
    subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}", f"--screenshot={shot}",
                    "--window-size=1100,700", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    assert shot.stat().st_size > 10_000  # a rendered page, not a blank one
