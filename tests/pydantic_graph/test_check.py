"""``remit check`` for pydantic-graph: every remit cell holds; the stock layer shows the
violations measured in DESIGN.md (so each scenario can fail)."""

from __future__ import annotations

import pytest

from remit_check import run_check


def cells(report: object) -> dict[tuple[str, str, str], str]:
    return {(c.layer, c.fault, c.property): c.verdict for c in report.cells}  # type: ignore[attr-defined]


@pytest.mark.slow
def test_matrix_on_sqlite() -> None:
    report = run_check(["pydantic-graph"], k=4, reps=1, progress=False)
    got = cells(report)
    assert len(got) == 20, got
    assert report.ok, [c for c in report.cells if c.layer == "remit" and not c.holds]
    for key in [("stock", "kill-after-effect", "PC"), ("stock", "kill-between-steps", "PC"),
                ("stock", "kill-during-write", "LV"), ("stock", "second-resume", "CO"),
                ("stock", "invalid-state", "CV"), ("stock", "fork-twice", "FI/FD"),
                ("stock", "recover-twice", "RD")]:
        assert got[key] == "violated", (key, got)
    for c in report.cells:
        assert c.counts and c.summary, c


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["postgres", "redis"], indirect=True)
def test_remit_cells_on_a_server(store_url: str) -> None:
    """--store: the remit layer across processes on a real PostgreSQL or Redis server."""
    report = run_check(["pydantic-graph"], store_url=store_url, k=4, reps=1, progress=False,
                       layers=("remit",))
    assert report.ok, [c for c in report.cells if not c.holds]
    assert len(report.cells) == 10
