"""``remit check`` for CrewAI: every remit cell holds; the stock layer shows the violations
measured in the research notes (so each scenario can fail)."""

from __future__ import annotations

import pytest

from remit_check import run_check
from tests.crewai import _env  # noqa: F401  (CrewAI's side files in a temporary directory)


@pytest.mark.slow
def test_matrix_on_sqlite() -> None:
    report = run_check(["crewai"], k=4, reps=1, progress=False)
    got = {(c.layer, c.fault, c.property): c.verdict for c in report.cells}
    assert len(got) == 18, got
    assert report.ok, [c for c in report.cells if c.layer == "remit" and not c.holds]
    stock = {k: v for k, v in got.items() if k[0] == "stock"}
    assert set(stock.values()) == {"violated"}, stock  # every fault point shows the stock failure
    assert all(c.counts and c.summary for c in report.cells)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["postgres", "redis"], indirect=True)
def test_remit_cells_on_a_server(store_url: str) -> None:
    report = run_check(["crewai"], store_url=store_url, k=4, reps=1, progress=False,
                       layers=("remit",))
    assert report.ok, [c for c in report.cells if not c.holds]
    assert len(report.cells) == 9
