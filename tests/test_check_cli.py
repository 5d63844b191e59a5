"""``remit check`` as a user sees it (issue 13, item 12).

* Only the report goes to stdout and only the progress bar to stderr: the scenarios'
  child processes (effect-outside-scope warnings, pydantic serializer warnings, CrewAI
  listener tracebacks) print nothing between the rows.
* The progress total is known from the start: it never grows and the bar never goes back.
* An unusable ``--store`` is a configuration error: exit code 2 and one line.
* ``remit --version`` prints the installed versions.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from remit_core.cli import main

REMIT = str(Path(sys.executable).with_name("remit"))
BAR = re.compile(r"^\[[#.]{30}\] +(\d+)/(\d+) +\d+s  \S.*$")
REPORT_LINE = re.compile(
    r"^(remit check: .*|[a-z-]+|  \S.*|\s+(stock|remit)\s+(holds|VIOLATED|ERROR).*|"
    r"profile: .*|result: .*|)$")


@pytest.mark.slow
def test_check_prints_the_report_and_the_bar_only() -> None:
    # these two faults, on two frameworks, are the ones whose children were noisy: an
    # effect called outside a step, serializer warnings of invalid state, and CrewAI's
    # "Error executing listener" traceback of a refused write
    done = subprocess.run(
        [REMIT, "check", "--framework", "crewai", "--framework", "pydantic-graph",
         "--fault", "second-resume", "--fault", "invalid-state", "--reps", "1", "--k", "2"],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    out, err = done.stdout.splitlines(), done.stderr.splitlines()
    noise = [line for line in out if not REPORT_LINE.match(line)]
    assert noise == [], "\n".join(noise)
    stray = [line for line in err if not BAR.match(line)]
    assert stray == [], "\n".join(stray)
    steps = [tuple(map(int, BAR.match(line).groups())) for line in err]  # type: ignore[union-attr]
    totals = {t for _, t in steps}
    assert totals == {8}, steps
    assert [d for d, _ in steps] == list(range(1, 9)), steps


def test_unreachable_store_is_a_configuration_error() -> None:
    done = subprocess.run(
        [REMIT, "check", "--store", "redis://:hunter2x@127.0.0.1:1/0", "--framework",
         "crewai", "--fault", "second-resume", "--reps", "1", "--k", "2"],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "do NOT hold" not in done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("remit check: cannot use --store 'redis://:***@127.0.0.1:1/0'")
    assert "hunter2x" not in done.stdout + done.stderr


def test_bad_store_url_is_a_configuration_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--store", "sqlite:///x.db?lease=nan", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "option lease='nan'" in err[0], err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"remit {version('remit-core')}"), out
    for dist in ("remit-core", "remit-langgraph", "remit-crewai", "remit-pydantic-graph"):
        assert f"{dist} {version(dist)}" in out, out
