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

import multiprocessing as mp
from multiprocessing import forkserver

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
