"""The outcome of every test of an upstream run, for :mod:`tests.upstream.run` to pair.

Both plugins take :func:`pytest_runtest_logreport` from here (pytest finds a hook in a
plugin's namespace) and call :func:`write` when the session finishes.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

_outcomes: dict[str, dict[str, Any]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = _outcomes.setdefault(report.nodeid, {"nodeid": report.nodeid,
                                                  "outcome": "passed", "message": ""})
    if report.failed:
        if entry["outcome"] != "failed":
            crash = getattr(report.longrepr, "reprcrash", None)
            message = getattr(crash, "message", None) or str(report.longrepr)[-2000:]
            entry["message"] = f"{report.when}: {message}"
        entry["outcome"] = "failed"
    elif report.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"


def write() -> None:
    """Write the outcomes, as JSON lines, to ``REMIT_UPSTREAM_REPORT`` (if set)."""
    path = os.environ.get("REMIT_UPSTREAM_REPORT")
    # (under pytest-xdist the controller gets every worker's reports and writes them all;
    # a worker has only its own share)
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    with open(path, "w", encoding="utf-8") as out:
        for entry in _outcomes.values():
            out.write(json.dumps(entry) + "\n")


def outcomes() -> list[dict[str, Any]]:
    return list(_outcomes.values())
