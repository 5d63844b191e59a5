"""The resume contract on pydantic-graph, with real processes, a barrier and SIGKILL.

Each test runs on SQLite, PostgreSQL and Redis. REMIT_TEST_BREAK (see
pg_workers) switches one protection off in the worker processes, to show that
the test fails without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from remit_pydantic_graph import ConsumeConflict, RemitStatePersistence
from tests.pydantic_graph import pg_workers as w
from tests.pydantic_graph.clone import clone_store

# Fresh processes, forked from a clean server that has imported only the worker module
# (never from the test process): spawn's isolation without paying ~2 s of imports per child,
# which would dominate the k=16 test. REMIT_TEST_BREAK reaches the server's import too.
CTX = mp.get_context("forkserver")
CTX.set_forkserver_preload(["tests.pydantic_graph.pg_workers"])


def count(entries: list[str], prefix: str) -> int:
    return sum(e.startswith(prefix) for e in entries)


def crash(url: str, run_id: str, ledger: Path, hang: str) -> None:
    """Run the order graph in a child and SIGKILL it at ``hang``."""
    parent, child = CTX.Pipe()
    proc = CTX.Process(target=w.run_and_hang, args=(url, run_id, str(ledger), hang, child))
    proc.start()
    child.close()  # so that a child that dies early reads as EOF, not as a hang
    try:
        assert parent.poll(120), "the child never reached the kill point"
        assert parent.recv() == ("charged" if hang == "B" else "gap")
    finally:
        with contextlib.suppress(ProcessLookupError):  # it may have died on its own
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(timeout=30)
    assert proc.exitcode == -signal.SIGKILL


def history(url: str, run_id: str) -> list[tuple[str, str]]:
    p = RemitStatePersistence.from_url(url, run_id=run_id)
    p.set_graph_types(w.order_graph)
    return w.describe(asyncio.run(p.load_all()))


@pytest.mark.slow
def test_sigkill_inside_a_node_after_its_effect(backend: str, store_url: str,
                                                tmp_path: Path) -> None:
    """LV, PC, EO, RD: the node re-runs with its effect replayed; earlier nodes do not; the
    result equals an uncrashed run's; two copies of the crashed store recover alike."""
    ledger = tmp_path / "ledger.txt"
    crash(store_url, "crash", ledger, "B")
    # a dead process never wedges later calls: reads answer at once
    stranded = history(store_url, "crash")
    assert [s for _, s in stranded] == ["success", "running"], stranded
    copy_url, drop = clone_store(backend, store_url)
    try:
        with CTX.Pool(1) as pool:
            got = pool.apply(w.recover, (store_url, "crash", str(ledger)))
            assert got[0] == "ok", got
            entries = w.lines(str(ledger))
            assert count(entries, "enter A") == 1, entries  # PC: a completed node never re-runs
            assert count(entries, "enter B") == 2, entries  # the unfinished node runs again
            assert count(entries, "effect charge") == 1, entries  # EO: replayed from its receipt
            assert count(entries, "enter C") == 1, entries
            # RD: a copy of the same crashed store recovers to the same ids, state and effects
            again = pool.apply(w.recover, (copy_url, "crash", str(ledger)))
        assert again[0] == "ok", again
        assert again[1:4] == got[1:4]
        assert count(w.lines(str(ledger)), "effect charge") == 1
    finally:
        drop()
    # the same result, state and snapshot ids as a run that never crashed
    clean = asyncio.run(w.run_clean(store_url, "clean", str(tmp_path / "clean.txt")))
    assert (got[1], got[2], got[3]) == clean
    assert got[2].log == ["txn-10", "C"]


@pytest.mark.slow
def test_sigkill_between_a_node_and_its_successor(backend: str, store_url: str,
                                                  tmp_path: Path) -> None:
    """The gap: B returned, C's snapshot not yet written. B's success and C's snapshot are one
    write, so the crash looks like one inside B: B re-runs (effect replayed), no state is lost."""
    ledger = tmp_path / "ledger.txt"
    crash(store_url, "gap", ledger, "gap")
    stranded = history(store_url, "gap")
    with CTX.Pool(1) as pool:
        got = pool.apply(w.recover, (store_url, "gap", str(ledger)))
    assert got[0] == "ok", (got, stranded)
    # B's success was not durable without C's snapshot: it showed as a crash inside B
    assert [s for _, s in stranded] == ["success", "running"], stranded
    entries = w.lines(str(ledger))
    assert count(entries, "enter B") == 2 and count(entries, "effect charge") == 1, entries
    assert count(entries, "enter A") == 1 and count(entries, "enter C") == 1, entries
    clean = asyncio.run(w.run_clean(store_url, "clean", str(tmp_path / "clean.txt")))
    assert (got[1], got[2], got[3]) == clean


@pytest.mark.slow
def test_k16_resumers_of_one_parked_run(store_url: str, tmp_path: Path) -> None:
    """CO: k=16 processes resume one parked run at once, with iter_from_persistence and with
    the documented human-in-the-loop pattern: the next node's body runs once, the others raise
    ConsumeConflict. The 16 processes start once and serve every round."""
    k, rounds = 16, 2
    ledger = tmp_path / "ledger.txt"
    barrier = CTX.Barrier(k)
    results = CTX.Queue()
    pipes = [CTX.Pipe() for _ in range(k)]
    procs = [CTX.Process(target=w.racer, args=(store_url, str(ledger), barrier, child, results))
             for _, child in pipes]
    for p in procs:
        p.start()
    try:
        for r in range(rounds):
            for kind in ("iter", "hitl"):
                run_id = f"{kind}-{r}"
                if kind == "iter":
                    asyncio.run(w.park_gate(store_url, run_id, str(ledger)))
                else:
                    asyncio.run(w.park_question(store_url, run_id, str(ledger)))
                before = w.lines(str(ledger))
                for i, (parent, _) in enumerate(pipes):
                    parent.send((kind, run_id, f"a{i}"))
                got = [results.get(timeout=180) for _ in range(k)]
                verdicts = Counter(g[0] for g in got)
                assert verdicts == Counter(ok=1, conflict=k - 1), (kind, r, got)
                assert all(g[2] in ("claimed", "consumed", "ended") for g in got if g[0] == "conflict"), got
                new = w.lines(str(ledger))[len(before):]
                if kind == "iter":
                    assert count(new, "enter Gate") == 1, new
                    assert count(new, "effect grant") == 1, new
                else:
                    (winner,) = [g for g in got if g[0] == "ok"]
                    assert winner[2] == f"done-{winner[1]}"
                    assert [e.split()[:3] for e in new if e.startswith("enter Evaluate")] == [
                        ["enter", "Evaluate", winner[1]]], new
                    assert count(new, "effect grade") == 1, new
                    assert count(new, "enter Ask") == 0, new  # no loser started a new run
    finally:
        for parent, _ in pipes:
            parent.send(None)
        for p in procs:
            p.join(timeout=60)
    assert all(p.exitcode == 0 for p in procs)
    # a late second delivery is rejected, with either resume style, and changes nothing
    late = (w.resume_gate(w.resumer(store_url, "iter-0", "iter"), str(ledger)),
            w.deliver_answer(w.resumer(store_url, "hitl-0", "hitl"), str(ledger), "late"))
    before = w.lines(str(ledger))
    for attempt in late:
        with pytest.raises(ConsumeConflict) as info:
            asyncio.run(attempt)
        assert info.value.status == "ended" and info.value.owner
    assert w.lines(str(ledger)) == before


def kill_during_write(url: str, run_id: str, resume: bool, at: int, delay: float) -> None:
    """SIGKILL the writer ``delay`` seconds after it announces its ``at``-th snapshot write."""
    parent, child = CTX.Pipe()
    proc = CTX.Process(target=w.bulk_writer, args=(url, run_id, resume, child))
    proc.start()
    child.close()  # so that a child that dies early reads as EOF, not as a hang
    try:
        while True:
            assert parent.poll(120), "the writer stopped announcing"
            if parent.recv() >= at:
                break
        # the fault schedule, not synchronisation: a write takes 15-45 ms here, so the
        # delays (0, 4, 12 ms) put the kill at different points inside it
        time.sleep(delay)
    finally:
        with contextlib.suppress(ProcessLookupError):  # it may have died on its own
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(timeout=30)


@pytest.mark.slow
def test_sigkill_during_writes_never_loses_the_history(store_url: str) -> None:
    """A write is one transaction: killed anywhere in it, the history before it stays whole
    and loadable, and the run still finishes (killed three times, then recovered)."""
    p = RemitStatePersistence.from_url(store_url, run_id="bulk")
    p.set_graph_types(w.bulk_graph)
    seen: list[str] = []
    for n, delay in enumerate((0.0, 0.004, 0.012)):
        kill_during_write(store_url, "bulk", n > 0, at=3, delay=delay)
        history = asyncio.run(p.load_all())  # loads: nothing torn
        assert [s.id for s in history[:len(seen)]] == seen  # nothing lost
        assert len(history) >= len(seen) + 2  # every write before the announced one returned
        for i, snap in enumerate(history):
            assert snap.state.n == i
            assert snap.state.blob == (f"{i - 1:08d}" * (w.BLOB // 8) if i else "")
        seen = [s.id for s in history]
    with CTX.Pool(1) as pool:
        assert pool.apply(w.bulk_writer, (store_url, "bulk", True, None)) == w.STEPS
    final = asyncio.run(p.load_all())
    assert len(final) == w.STEPS + 1 and final[-1].state.n == w.STEPS
    assert [s.id for s in final[:len(seen)]] == seen


def _stock_history(path: str) -> Any:
    from pydantic_graph.persistence.file import FileStatePersistence

    p: FileStatePersistence[Any, Any] = FileStatePersistence(Path(path))
    p.set_graph_types(w.order_graph)
    return [(s.id.split(":")[0], getattr(s, "status", "end")) for s in asyncio.run(p.load_all())]


@pytest.mark.slow
def test_baseline_stock_file_persistence_loses_the_run(tmp_path: Path) -> None:
    """BASELINE (stock pydantic-graph, not remit): after SIGKILL inside B the stock
    FileStatePersistence leaves B 'running' forever and iter_from_persistence cannot resume."""
    ledger, path = tmp_path / "ledger.txt", tmp_path / "run.json"
    parent, child = CTX.Pipe()
    proc = CTX.Process(target=w.stock_run_and_hang, args=(str(path), str(ledger), child))
    proc.start()
    child.close()  # so that a child that dies early reads as EOF, not as a hang
    try:
        assert parent.poll(120) and parent.recv() == "charged"
    finally:
        with contextlib.suppress(ProcessLookupError):  # it may have died on its own
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(timeout=30)
    assert _stock_history(str(path)) == [("A", "success"), ("B", "running")]
    with CTX.Pool(1) as pool:
        got = pool.apply(w.stock_recover, (str(path), str(ledger)))
    assert got == ("unrecoverable", "GraphRuntimeError",
                   "Unable to restore snapshot from state persistence."), got
    assert _stock_history(str(path)) == [("A", "success"), ("B", "running")]  # stranded
