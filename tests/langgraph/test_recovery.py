"""Recovery without a person: threads SIGKILLed mid-step are found and finished.

A child runs threads of ``a -> b (effect) -> c`` and is SIGKILLed while every one of them
is inside ``c`` (the child reports when they all are; no sleeps). Once the dead
executor's lease runs out the threads read as abandoned, and :func:`remit_langgraph.recover`
(or ``arecover``) finds them by the graph's name, with no thread id given, and continues
each from its last checkpoint: ``a`` and ``b`` do not run again, the effect fired once,
``c`` runs once more. Threads that finished or parked are left alone. A second recovery
finds nothing. Eight recoverer processes racing over the same abandoned threads finish
each exactly once.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from remit_core.adapter import poll
from remit_langgraph import RemitSaver, arecover, recover
from tests.langgraph import lg_recovery_workers as w
from tests.test_races import drain, join_all

CTX = mp.get_context("spawn")
BREAK = os.environ.get("REMIT_TEST_BREAK", "")


def ledger_lines(ledger: Path) -> list[str]:
    return ledger.read_text().splitlines() if ledger.exists() else []


def kill_in_c(url: str, ledger: Path, threads: list[str], api: str = "invoke") -> None:
    """Run ``threads`` in a child until each killable one is in node c, then SIGKILL it,
    and wait (polling the store) until its threads read as abandoned."""
    parent, child = CTX.Pipe()
    proc = CTX.Process(target=w.die_in_c, args=(url, str(ledger), threads, child, api))
    proc.start()
    try:
        assert parent.poll(120), "the child never reached node c"
        tag, arrived = parent.recv()
        killable = sorted(t for t in threads if not t.startswith(("done:", "park:")))
        assert (tag, arrived) == ("in c", killable)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
    assert proc.exitcode == -signal.SIGKILL
    with RemitSaver.from_conn_string(url) as saver:
        def all_abandoned() -> bool | None:
            states = [saver.store.get_run(t) for t in killable]
            return True if all(s is not None and s.status == "abandoned"
                               for s in states) else None

        assert poll(all_abandoned, within=w.LEASE + 30, pause=0.05, most=0.25), \
            "the killed threads never read as abandoned"


def check_once(ledger: Path, threads: list[str], recoveries: int = 1) -> None:
    lines = ledger_lines(ledger)
    counts = Counter(" ".join(line.split()[:3]) for line in lines)
    for t in threads:
        assert counts[f"enter a {t}"] == 1, lines
        assert counts[f"enter b {t}"] == 1, lines
        assert counts[f"effect charge {t}"] == 1, lines
        assert counts[f"enter c {t}"] == 1 + recoveries, lines


@pytest.mark.parametrize("api", ["invoke", "ainvoke"])
def test_threads_killed_mid_step_are_found_and_finished(store_url: str, tmp_path: Path,
                                                        api: str) -> None:
    ledger = tmp_path / "ledger"
    killed = [f"k{i}" for i in range(3)]
    kill_in_c(store_url, ledger, ["done:1", "park:1", *killed], api)
    with RemitSaver.from_conn_string(store_url) as saver:
        graph = w.app(saver, str(ledger))
        report = recover(graph) if api == "invoke" else asyncio.run(arecover(graph))
        assert sorted(report.recovered) == killed, report
        assert (report.failed, report.skipped, report.attention) == ({}, [], {})
        check_once(ledger, killed)
        for t in killed:
            state = graph.get_state(w.cfg(t))
            assert state.values["log"] == ["a", f"b:txn-{t}", "c"] and not state.next
            run = saver.store.get_run(t)
            assert run is not None and (run.status, run.attempts, run.name) == \
                ("done", 2, w.NAME)
        # finished and parked threads were left alone
        assert saver.store.get_run("done:1").status == "done"  # type: ignore[union-attr]
        assert saver.store.get_run("park:1").status == "parked"  # type: ignore[union-attr]
        # a second recovery finds nothing
        again = recover(graph)
        assert again.total == 0, again


def test_a_recovery_finds_only_its_graphs_threads(store_url: str, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    kill_in_c(store_url, ledger, ["mine"])
    with RemitSaver.from_conn_string(store_url) as saver:
        other = w.build(str(ledger)).compile(checkpointer=saver, name="another-graph")
        assert recover(other).total == 0
        assert recover(w.app(saver, str(ledger))).recovered == ["mine"]


@pytest.mark.slow
@pytest.mark.parametrize("api", ["invoke", "ainvoke"])
def test_eight_recoverers_race_and_each_thread_finishes_once(store_url: str, tmp_path: Path,
                                                             api: str) -> None:
    ledger = tmp_path / "ledger"
    threads = [f"r{i:02d}" for i in range(24)]
    kill_in_c(store_url, ledger, threads, api)
    k = 8
    barrier, results = CTX.Barrier(k), CTX.Queue()
    procs = [CTX.Process(target=w.recoverer, args=(store_url, str(ledger), barrier, results,
                                                   api, BREAK == "recovery"))
             for _ in range(k)]
    for p in procs:
        p.start()
    reports = drain(results, k)
    join_all(procs)
    recovered = Counter(t for _, done, _, _ in reports for t in done)
    assert all(not failed for _, _, failed, _ in reports), reports
    assert recovered == Counter({t: 1 for t in threads}), recovered
    check_once(ledger, threads)
