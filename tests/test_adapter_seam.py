"""remit_core.adapter, the adapters' seam: claim keys, the poll helper and the shared
store cache, on real stores (SQLite files; the cache's PostgreSQL pool counts are in
tests/crewai/test_store_pools.py)."""

from __future__ import annotations

import asyncio
import gc
import itertools
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from remit_core import ConsumeConflict, open_store
from remit_core.adapter import (
    apoll,
    borrow_store,
    claim_key,
    hold_store,
    known_url,
    new_owner,
    poll,
    split_claim_key,
)
from remit_core.effects import receipt_key
from remit_core.errors import StoreClosed

# ===================================================================================== keys

parts = st.lists(st.text(alphabet="ab|\\:%", max_size=4), max_size=4)


@given(parts, parts)
def test_claim_keys_of_different_parts_never_collide(a: list[str], b: list[str]) -> None:
    """CO: one key per slot, whatever its parts hold (``|`` and ``\\`` included)."""
    if a != b:
        assert claim_key("fw", *a) != claim_key("fw", *b)
    assert split_claim_key(claim_key("fw", *a)) == ("fw", *a)


def test_claim_keys_read_as_their_parts() -> None:
    assert claim_key("crewai", "flow-1", "0190-pending") == "crewai|flow-1|0190-pending"
    assert claim_key("langgraph", "a|b", "", "cp") == "langgraph|a\\|b||cp"
    assert claim_key("x", "a\\", "b") != claim_key("x", "a", "\\b")
    assert claim_key("langgraph", "t") != claim_key("pydantic-graph", "t")
    with pytest.raises(ValueError):
        claim_key("", "t")


def test_receipt_keys_escape_as_claim_keys_do() -> None:
    assert receipt_key("run|1", "step", "pay", 0) == "run\\|1|step|pay|0"
    assert split_claim_key(receipt_key("r", "s\\", "n", 3)) == ("r", "s\\", "n", "3")


# ================================================================================== polling


def test_poll_returns_at_once_when_the_fact_is_there() -> None:
    calls: list[int] = []
    assert poll(lambda: calls.append(1) or "x", within=5.0) == "x"
    assert calls == [1]


def test_poll_waits_for_another_thread_then_gives_up() -> None:
    box: list[str] = []
    timer = threading.Timer(0.05, box.append, ("done",))
    timer.start()
    assert poll(lambda: box[0] if box else None, within=5.0) == "done"
    calls: list[float] = []
    started = time.monotonic()
    assert poll(lambda: calls.append(time.monotonic()), within=0.2, pause=0.01,
                most=0.04) is None
    elapsed = time.monotonic() - started
    assert 0.2 <= elapsed < 1.0 and 4 <= len(calls) < 40  # back-off, bounded
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert gaps[0] < gaps[-1] + 0.02  # pauses grow (to ``most``)


def test_poll_of_zero_is_one_call_and_errors_propagate() -> None:
    calls: list[int] = []
    assert poll(lambda: calls.append(1), within=0) is None and calls == [1]

    def boom() -> None:
        raise ConsumeConflict("held", key="k")

    with pytest.raises(ConsumeConflict):
        poll(boom, within=5.0)


def test_apoll() -> None:
    async def main() -> tuple[str | None, str | None]:
        box: list[str] = []
        asyncio.get_running_loop().call_later(0.05, box.append, "done")

        async def check() -> str | None:
            return box[0] if box else None

        async def never() -> str | None:
            return None

        return (await apoll(check, within=5.0), await apoll(never, within=0.1))

    assert asyncio.run(main()) == ("done", None)


# ============================================================================ store cache


def url_of(tmp_path: Path, name: str) -> str:
    return f"sqlite:///{tmp_path / name}"


def test_holds_share_one_store_until_the_last_is_released(tmp_path: Path) -> None:
    url = url_of(tmp_path, "a.db")
    first, second = hold_store(url), hold_store(url)
    assert first.store is second.store
    other = hold_store(url, lease=5.0)
    assert other.store is not first.store  # other options, another store
    other.release()
    first.release()
    first.release()  # idempotent
    assert first.released and not second.released
    second.store.list_runs()  # still open: second holds it
    store = second.store
    second.release()
    with pytest.raises(StoreClosed):
        store.list_runs()
    assert hold_store(url).store is not store  # opened again on the next use


def test_a_collected_hold_is_released_by_the_next_acquisition(tmp_path: Path) -> None:
    hold = hold_store(url_of(tmp_path, "b.db"))
    store = hold.store
    del hold
    gc.collect()
    store.list_runs()  # never closed inside the collector
    other = hold_store(url_of(tmp_path, "c.db"))  # the next acquisition carries it out
    with pytest.raises(StoreClosed):
        store.list_runs()
    other.release()


def test_a_borrowed_store_is_found_by_its_url_and_never_closed(tmp_path: Path) -> None:
    with open_store(url_of(tmp_path, "d.db")) as store:
        borrowed = borrow_store(store)
        again = hold_store(store.url)
        assert again.store is store and known_url(store.url) == store.url
        borrowed.release()
        again.release()
        store.claim_once("k", run_id="r", owner=new_owner())  # still the caller's, open


def test_known_url_maps_a_masked_url_back(tmp_path: Path) -> None:
    path = tmp_path / "e.db"
    hold = hold_store(f"sqlite:///{path}")
    assert known_url(f"sqlite:///{path}") == f"sqlite:///{path}"
    assert known_url("sqlite:///nowhere-opened.db") is None
    hold.release()
