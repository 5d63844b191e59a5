"""``remit check`` for LangGraph: every remit cell holds; the stock SqliteSaver shows the
violations measured in DESIGN.md section 1, so each of those cells can fail. The cells
where the stock saver holds (PC, LV) are shown to fail on savers that lose state."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.sqlite import SqliteSaver

from remit_check import CellResult, CheckEnv, Report, run_check
from remit_check.langgraph import matrix as check


def cells(report: Report) -> dict[tuple[str, str, str], CellResult]:
    return {(c.layer, c.fault, c.property): c for c in report.cells}


STOCK_VIOLATES = [("kill-after-effect", "EO"), ("k-resumes", "CO-k"), ("second-resume", "CO"),
                  ("invalid-state", "CV"), ("fork-twice", "FI/FD"), ("recover-twice", "RD")]
# LangGraph keeps node-level PC. (LV usually holds on the stock saver, which has no claim
# to wait out, but not always: the resume value is written by a background thread, and a
# SIGKILL under load can land before it is stored; the cell then says so.)
STOCK_HOLDS = [("kill-after-effect", "PC"), ("kill-between-steps", "PC")]


@pytest.mark.slow
def test_matrix_on_sqlite() -> None:
    report = run_check(["langgraph"], k=4, reps=1, progress=False)
    got = cells(report)
    assert len(got) == 18, sorted(got)
    assert report.ok, [c for c in report.cells if c.layer == "remit" and not c.holds]
    for fault, prop in STOCK_VIOLATES:
        assert got["stock", fault, prop].verdict == "violated", got["stock", fault, prop]
    for fault, prop in STOCK_HOLDS:
        assert got["stock", fault, prop].verdict == "holds", got["stock", fault, prop]
    for c in report.cells:
        assert c.counts and c.summary, c
    # the raw counts behind the verdicts
    eo = got["stock", "kill-after-effect", "EO"].counts
    assert eo["effect_calls"] > eo["effect_calls_declared"] == 2
    assert got["remit", "kill-after-effect", "EO"].counts["effect_calls"] == 2
    assert got["remit", "k-resumes", "CO-k"].counts["gated_effect_calls"] == 1
    assert got["remit", "k-resumes", "CO-k"].counts["resumes_accepted"] == 1
    assert got["stock", "k-resumes", "CO-k"].counts["resumes_accepted"] == 4
    assert got["stock", "second-resume", "CO"].counts["second_values_stored"] == 1
    assert got["stock", "invalid-state", "CV"].counts["invalid_stored"] == 1
    assert got["stock", "fork-twice", "FI/FD"].counts["forks_same_id"] == 0
    assert got["stock", "recover-twice", "RD"].counts["same_ids"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["postgres", "redis"], indirect=True)
def test_remit_cells_on_a_server(store_url: str) -> None:
    """--store: the remit layer across processes on a real PostgreSQL or Redis server."""
    report = run_check(["langgraph"], store_url=store_url, k=4, reps=1, progress=False,
                       layers=("remit",))
    assert report.ok, [c for c in report.cells if not c.holds]
    assert len(report.cells) == 9
    (rd,) = [c for c in report.cells if c.property == "RD"]
    assert "SQLite copies" in rd.summary


# ============================================== savers that lose state: PC and LV can fail


class LossySaver(SqliteSaver):
    """Stores only input checkpoints: every loop checkpoint is dropped, so a recovery
    starts over from the input."""

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        if metadata.get("source") == "input":
            return super().put(config, checkpoint, metadata, new_versions)
        return {"configurable": {**config["configurable"], "checkpoint_id": checkpoint["id"]}}


@contextmanager
def lossy_saver(directory: str) -> Iterator[LossySaver]:
    with LossySaver.from_conn_string(str(Path(directory) / "lossy.db")) as saver:
        yield saver


def memory_saver(directory: str) -> Any:
    """Keeps nothing across processes."""
    from langgraph.checkpoint.memory import InMemorySaver

    return InMemorySaver()


def scenario_cells(tmp_path: Path, factory: str, *faults: str) -> dict[tuple[str, str], str]:
    env = CheckEnv(workdir=tmp_path, k=2, reps=1)
    got = {}
    for s in check.scenarios():
        if s.fault in faults:
            for c in s.run(env, "custom", factory):
                got[c.fault, c.property] = c.verdict
    return got


@pytest.mark.slow
def test_pc_cells_fail_when_completed_steps_rerun(tmp_path: Path) -> None:
    got = scenario_cells(tmp_path, f"{__name__}:lossy_saver",
                         "kill-after-effect", "kill-between-steps")
    assert got["kill-after-effect", "PC"] == "violated"
    assert got["kill-between-steps", "PC"] == "violated"


@pytest.mark.slow
def test_lv_cell_fails_when_nothing_survives_the_owner(tmp_path: Path) -> None:
    got = scenario_cells(tmp_path, f"{__name__}:memory_saver", "kill-after-effect")
    assert got["kill-after-effect", "LV"] == "violated"
    assert got["kill-after-effect", "PC"] == "violated"


# ===================================================================== the plumbing


def test_the_fork_server_preload_starts_no_thread() -> None:
    """Workers are forked from a server that imported this module: it must be
    single-threaded after the import."""
    code = ("import threading, remit_check.langgraph.matrix; "
            "print(threading.active_count())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "1"


def test_a_missing_stock_saver_is_a_one_line_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner skips a layer its check module names, with this reason (the runner's
    own process imports the module afresh, so only the module's answer is tested here)."""
    import importlib.util

    real = importlib.util.find_spec
    assert check.layer_unavailable("stock") is None  # installed in the dev environment
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "langgraph.checkpoint.sqlite"
                        else real(name, *a))
    assert check.layer_unavailable("stock") == check.STOCK_MISSING
    assert check.layer_unavailable("remit") is None
    assert "\n" not in check.STOCK_MISSING
    assert "pip install 'remit-langgraph[check]'" in check.STOCK_MISSING


def test_a_factory_that_returns_no_saver_is_an_error_cell(tmp_path: Path) -> None:
    from remit_check import CheckEnv as Env

    env = Env(workdir=tmp_path, k=2, reps=1)
    (scenario,) = [s for s in check.scenarios() if s.fault == "second-resume"]
    with pytest.raises(check.ChildError, match="not a BaseCheckpointSaver"):
        scenario.run(env, "custom", f"{__name__}:not_a_saver")


def not_a_saver(directory: str) -> object:
    return object()
