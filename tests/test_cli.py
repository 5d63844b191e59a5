"""The remit command: inspect shows runs, checkpoints, receipts and claims."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from remit_core import effect, effect_scope, open_store
from remit_core.cli import main
from remit_core.store import new_owner


@pytest.fixture
def filled(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/s.db"
    with open_store(url) as s:
        s.put_checkpoint("run-1", "c1", new_values={"x": ("1", 1)})
        s.put_checkpoint("run-1", "c2", parent_id="c1", kind="end", versions={"x": "1"})
        s.put_writes("run-1", "c2", "t", [(0, "x", 2)])

        @effect(name="pay")
        def pay() -> str:
            return "ok"

        with effect_scope(s, "run-1", "s"):
            pay()
        owner = new_owner()
        c = s.claim_once("gate", run_id="run-1", owner=owner, digest="abc")
        s.consume_claim("gate", owner=owner, fence=c.fence)
    return url


def test_inspect_runs(filled: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", filled]) == 0
    out = capsys.readouterr().out
    assert "run-1" in out and "c2" in out and "end" in out
    assert "run-1|s|pay|0" in out and "completed" in out
    assert "gate" in out and "consumed" in out


def test_inspect_run_json(filled: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", filled, "run-1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [c["checkpoint_id"] for c in report["checkpoints"]] == ["c2", "c1"]
    assert report["checkpoints"][0]["pending_writes"] == 1
    assert report["receipts"][0]["status"] == "completed"
    assert report["claims"][0]["digest"] == "abc" and report["claims"][0]["status"] == "consumed"


def test_inspect_lists_runs_by_lifecycle_status(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/life.db"
    with open_store(url) as s:
        for run, lease in (("dead-1", 0.0), ("live-1", 60.0), ("asks-1", 60.0)):
            s.put_checkpoint(run, "c1", data={})
            s.start_run(run, framework="langgraph", name="approval", owner=f"w-{run}",
                        lease=lease)
        assert s.end_run("asks-1", owner="w-asks-1", fence=1, status="parked",
                         waiting={"question": "approve?"})
    assert main(["inspect", url, "--status", "abandoned"]) == 0
    out = capsys.readouterr().out
    assert "dead-1" in out and "abandoned" in out and "approval" in out
    assert "live-1" not in out and "asks-1" not in out
    assert main(["inspect", url, "--status", "parked", "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [(r["run_id"], r["status"], r["waiting"]) for r in runs] == \
        [("asks-1", "parked", {"question": "approve?"})]
    assert main(["inspect", url]) == 0  # every run, each with its status
    out = capsys.readouterr().out
    assert all(word in out for word in ("dead-1", "live-1", "asks-1", "running", "parked"))


def test_bad_url_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "mysql://u:pw@h/db"]) == 1
    err = capsys.readouterr().err
    assert "unknown store scheme" in err and "pw@" not in err


def test_check_rejects_an_unknown_framework(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["check", "--framework", "autogen"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_migrate_unknown_framework_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["migrate", "autogen", "--from", "a", "--to", "b"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_check_skips_a_missing_framework_with_a_note(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A framework that is not installed is skipped with one line; with nothing checked the
    exit status is 1 (nothing was shown to hold)."""
    import importlib.util

    import remit_check as check

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "pydantic_graph" else real(name, *a))
    assert check.available("pydantic-graph") == "pydantic-graph is not installed"
    assert main(["check", "--framework", "pydantic-graph", "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "pydantic-graph: skipped (pydantic-graph is not installed)" in out
    assert "nothing was checked" in out
