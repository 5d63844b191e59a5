"""The multiprocessing context of the suite's child processes (race, crash and recovery
tests).

Children are forked from a fork server (``forkserver``): a clean process, started once
per test session, that has imported the worker modules below and the frameworks they
import, and runs no test code itself. A child is then a fresh process of its own (no
store, connection, thread or test state of the parent), ready in milliseconds instead
of the seconds a ``spawn`` interpreter takes to import LangGraph. Tests about what a
*fresh interpreter* sees (a reader that never imported the app's types) use ``spawn``
on purpose and say so.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
from collections import Counter
from collections.abc import Callable
from multiprocessing import forkserver
from typing import Any

CTX = mp.get_context("forkserver")

#: the modules the fork server imports before it forks children
PRELOAD = [
    "tests.workers",
    "tests.langgraph.lg_workers",
    "tests.langgraph.lg_more_workers",
    "tests.langgraph.lg_recovery_workers",
    "tests.crewai.cw_flows",
    "tests.crewai.cw_recovery_workers",
    "tests.pydantic_graph.pg_workers",
    "tests.pydantic_graph.pg_recovery_workers",
]


def preload() -> None:
    """Set the fork server's modules: PRELOAD and what test modules or the check harness
    asked for (called once collection is over, before the server starts)."""
    server = getattr(forkserver, "_forkserver", None)
    asked = [m for m in getattr(server, "_preload_modules", None) or [] if m != "__main__"]
    CTX.set_forkserver_preload([*PRELOAD, *(m for m in asked if m not in PRELOAD)])


def chaos(target: Callable[..., None], args: Callable[..., tuple[Any, ...]], k: int = 8,
          dying: int = 2) -> tuple[list[tuple[int, str]], list[Any]]:
    """The chaos test's processes: ``k`` recoverers ``target(*args(barrier, results, kills,
    killed, die))``; the first ``dying`` report ``(pid, run id)`` on ``kills`` from inside
    the run they continue and are SIGKILLed there (wherever they are, if they never
    report), then ``killed`` is set for the others. Returns the victims' reports and the
    survivors' results, once every process ended, the dying ones by SIGKILL, the others
    with 0."""
    from tests.test_races import drain

    barrier, results, kills, killed = CTX.Barrier(k), CTX.Queue(), CTX.Queue(), CTX.Event()
    procs = [CTX.Process(target=target, args=args(barrier, results, kills, killed, i < dying))
             for i in range(k)]
    for p in procs:
        p.start()
    try:
        victims = drain(kills, dying, timeout=180)
    finally:
        for p in procs[:dying]:
            assert p.pid is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
        killed.set()
    assert {pid for pid, _ in victims} == {p.pid for p in procs[:dying]}, victims
    reports = drain(results, k - dying, timeout=240)
    for p in procs:
        p.join(60)
    assert Counter(p.exitcode for p in procs) == \
        Counter({-signal.SIGKILL: dying, 0: k - dying})
    assert len({run for _, run in victims}) == dying, victims  # one run each
    return victims, reports
