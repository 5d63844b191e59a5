"""The resume contract on CrewAI Flows, with real processes, a barrier and SIGKILL.

Each test runs on SQLite, PostgreSQL and Redis. REMIT_TEST_BREAK (see
cw_flows) switches one protection off in the worker processes, and the
``stock`` tests run the same flows on CrewAI's own SQLiteFlowPersistence, to
show that each test fails without remit.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from remit_crewai import RemitFlowPersistence
from tests.crewai import cw_flows as w
from tests.pydantic_graph.clone import clone_store

# Fresh processes forked from a server that imported CrewAI (and started no thread):
# spawn's isolation without ~10 s of imports per child.
CTX = mp.get_context("forkserver")
CTX.set_forkserver_preload(["tests.crewai.cw_flows"])


def crash(target: Any, args: tuple[Any, ...], point: str) -> None:
    """Run ``target(*args, conn=...)`` in a child and SIGKILL it when it reports ``point``."""
    parent, child = CTX.Pipe()
    proc = CTX.Process(target=target, args=args, kwargs={"conn": child})
    proc.start()
    child.close()  # a child that dies early reads as EOF, not as a hang
    try:
        assert parent.poll(120), "the child never reached the kill point"
        assert parent.recv() == point
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(timeout=30)
    assert proc.exitcode == -signal.SIGKILL


def in_child(fn: Any, *args: Any) -> Any:
    with CTX.Pool(1) as pool:
        return pool.apply(fn, args)


# ============================================================================ PC and EO


@pytest.mark.slow
@pytest.mark.parametrize("name", ["OrderFlow", "AsyncOrderFlow"])
def test_sigkill_in_a_later_method_does_not_rerun_completed_ones(
        name: str, backend: str, store_url: str, tmp_path: Path) -> None:
    """PC, EO, RD: SIGKILL inside ``slow``; ``kickoff(inputs={"id"})`` in a fresh process runs
    neither ``begin`` nor ``pay`` again, ``slow`` gets the recorded transaction id, the effect
    fired once; a copy of the crashed store recovers to the same state and transaction."""
    ledger = str(tmp_path / "ledger.txt")
    crash(w.run_and_hang, (store_url, name, "order-1", ledger, "slow"), "slow")
    copy_url, drop = clone_store(backend, store_url)
    try:
        result, state = in_child(w.resume, store_url, name, "order-1")
        entries = w.lines(ledger)
        assert w.count(entries, "enter begin") == 1, entries
        assert w.count(entries, "enter pay") == 1, entries
        assert w.count(entries, "effect charge") == 1, entries
        txn = entries[[e.startswith("effect charge") for e in entries].index(True)].split()[3]
        assert w.count(entries, f"enter slow {txn}") == 2, entries  # the recorded txn, twice
        assert result == f"done {txn}"
        assert state["txn"] == txn and state["count"] == 1
        assert state["log"] == ["begin", "pay", f"slow {txn}"]
        # RD: the copy recovers to the same result and state, with no new effect
        again = in_child(w.resume, copy_url, name, "order-1")
        assert again == (result, state)
        assert w.count(w.lines(ledger), "effect charge") == 1
    finally:
        drop()
    # the same result and state as a run that never crashed (but for the fresh txn)
    clean = in_child(w.run_clean, store_url, name, "clean", str(tmp_path / "clean.txt"))
    assert w.comparable(*clean) == w.comparable(result, state)


@pytest.mark.slow
def test_stock_layer_reruns_completed_methods(tmp_path: Path) -> None:
    """The baseline: on CrewAI's own SQLiteFlowPersistence the same crash re-runs ``begin``
    and ``pay``, and the effect fires twice."""
    ledger = str(tmp_path / "ledger.txt")
    db = str(tmp_path / "stock.db")
    crash(w.run_and_hang, (db, "OrderFlow", "order-1", ledger, "slow", True), "slow")
    in_child(w.resume, db, "OrderFlow", "order-1", True)
    entries = w.lines(ledger)
    assert w.count(entries, "enter begin") == 2, entries
    assert w.count(entries, "effect charge") == 2, entries


# ================================================================================== CO


def race(k: int, url: str, flow_id: str, stock: bool = False) -> dict[str, str]:
    """k processes load the parked flow, meet at a barrier, and resume with v0..v{k-1}."""
    barrier = CTX.Barrier(k)
    results = CTX.Queue()
    procs = [CTX.Process(target=w.racer, args=(url, flow_id, f"v{i}", barrier, results, stock))
             for i in range(k)]
    for p in procs:
        p.start()
    try:
        return dict(results.get(timeout=240) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=60)


@pytest.mark.slow
def test_k8_resumes_of_parked_feedback(store_url: str, tmp_path: Path) -> None:
    """CO: a flow parks on @human_feedback; k=8 processes call from_pending(id).resume(v_i)
    at once. ``deliver`` runs once, the 7 others raise ConsumeConflict, and the consumed
    value is recorded."""
    k = 8
    ledger = str(tmp_path / "ledger.txt")
    fid = in_child(w.park, store_url, "approval-1", ledger)
    outcome = race(k, store_url, fid)
    assert Counter(outcome.values()) == {"won": 1, "conflict": k - 1}, outcome
    entries = w.lines(ledger)
    assert w.count(entries, "enter deliver") == 1, entries
    assert w.count(entries, "effect ship") == 1, entries
    [winner] = [v for v, o in outcome.items() if o == "won"]
    assert f"effect ship {winner}" in entries
    backend = RemitFlowPersistence.from_url(store_url)
    claims = backend.store.list_claims(fid)
    assert [c.status for c in claims] == ["consumed"]
    assert claims[0].value == winner


@pytest.mark.slow
def test_stock_layer_lets_every_racer_resume(tmp_path: Path) -> None:
    """The baseline: on CrewAI's own SQLiteFlowPersistence several of the k=8 racers resume
    the same parked feedback, and the gated effect fires more than once."""
    ledger = str(tmp_path / "ledger.txt")
    db = str(tmp_path / "stock.db")
    fid = in_child(w.park, db, "approval-1", ledger, True)
    outcome = race(8, db, fid, stock=True)
    assert list(outcome.values()).count("won") > 1, outcome
    assert w.count(w.lines(ledger), "effect ship") > 1


@pytest.mark.slow
def test_resume_owner_dies_after_claiming(store_url: str, tmp_path: Path) -> None:
    """LV: the winning resume is SIGKILLed inside ``deliver``, after its effect. After the
    lease, ``kickoff(inputs={"id"})`` in another process finishes the flow with the value the
    dead resume claimed; the effect is replayed, not fired again."""
    ledger = str(tmp_path / "ledger.txt")
    fid = in_child(w.park, store_url, "approval-lv", ledger)
    crash(w.resume_and_hang, (store_url, fid, "ship it"), "deliver")
    result, state = in_child(w.resume, store_url, "ApprovalFlow", fid)
    assert result == "shipped ship it" and state["shipped"] == "shipped ship it"
    entries = w.lines(ledger)
    assert w.count(entries, "enter deliver ship it") == 2, entries
    assert w.count(entries, "effect ship") == 1, entries
    backend = RemitFlowPersistence.from_url(store_url)
    [claim] = backend.store.list_claims(fid)
    assert claim.status == "consumed" and claim.value == "ship it"


# ===================================================================== routers, cycles


@pytest.mark.slow
@pytest.mark.parametrize(("name", "point"), [("RouterFlow", "loop"), ("ParallelFlow", "join")])
def test_routers_cycles_and_parallel_listeners_replay(
        name: str, point: str, store_url: str, tmp_path: Path) -> None:
    """A crash in the third pass of a router cycle, or in the join of two parallel listeners:
    the recorded branches and passes replay (one receipt per method and ordinal), the effects
    do not fire again, and the run ends as an uncrashed one."""
    ledger = str(tmp_path / "ledger.txt")
    crash(w.run_and_hang, (store_url, name, "cyc", ledger, point), point)
    result, state = in_child(w.resume, store_url, name, "cyc")
    entries = w.lines(ledger)
    clean = in_child(w.run_clean, store_url, name, "clean", str(tmp_path / "clean.txt"))
    if name == "RouterFlow":
        assert [w.count(entries, f"effect tick {n}") for n in range(4)] == [1, 1, 1, 0], entries
        assert w.count(entries, "enter init") == 1
        assert [w.count(entries, f"enter decide {n}") for n in range(4)] == [1, 1, 1, 1]
        assert w.count(entries, "enter loop 2") == 2 and w.count(entries, "enter finish") == 1
        assert state["n"] == 3 and result == f"finished 3 {state['seen']}"
    else:
        assert w.count(entries, "effect tick 100") == 1, entries
        assert w.count(entries, "enter left") == 1 and w.count(entries, "enter right") == 1
        assert w.count(entries, "enter join") == 2
        assert state["n"] == 7 and len(state["seen"]) == 1  # both branches' writes kept
    assert len(clean[1]["seen"]) == len(state["seen"])
    assert clean[1]["n"] == state["n"]


# ============================================================================ kill sweep


@pytest.mark.slow
def test_kill_after_every_store_write(store_url: str, tmp_path: Path) -> None:
    """EO and PC at every kill point: SIGKILL the run right after each of its store writes,
    resume in a fresh process; the charge is made once, each method body before the kill
    point ran once, and the final state is the uncrashed one."""
    clean_ledger = str(tmp_path / "clean.txt")
    writes = in_child(w.kill_after, store_url, "OrderFlow", "sweep-clean", clean_ledger, 0)
    clean = in_child(w.resume, store_url, "OrderFlow", "sweep-clean")
    assert writes >= 10, writes
    for n in range(1, writes + 1):
        ledger = str(tmp_path / f"ledger-{n}.txt")
        fid = f"sweep-{n}"
        proc = CTX.Process(target=w.kill_after, args=(store_url, "OrderFlow", fid, ledger, n))
        proc.start()
        proc.join(timeout=120)
        assert proc.exitcode == -signal.SIGKILL, (n, proc.exitcode)
        result, state = in_child(w.resume, store_url, "OrderFlow", fid, False, ledger)
        entries = w.lines(ledger)
        assert w.count(entries, "effect charge") == 1, (n, entries)
        assert all(w.count(entries, f"enter {m}") in (1, 2) for m in ("begin", "pay")), entries
        assert w.count(entries, "enter begin") + w.count(entries, "enter pay") <= 3, (n, entries)
        assert w.comparable(result, state) == w.comparable(*clean), n
