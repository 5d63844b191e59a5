"""Closing a store while other threads are still using it (issue 13: nothing remit does
may crash the process).

An asyncio app that shuts its event loop down while LangGraph's background writes still
run in executor threads closed the store under them; on SQLite that segfaulted the
process (the connection was closed while a statement ran on it). Now close() waits for
the operations in flight, and any started afterwards raise StoreClosed. Each run is a
child process, so a crash is seen as a signal, not as a dead test run.
"""

from __future__ import annotations

import threading
from multiprocessing.connection import Connection

import pytest

from remit_core import open_store
from remit_core.errors import StoreClosed
from tests import procs

CTX = procs.CTX


def _writers_then_close(url: str, rounds: int) -> dict[str, int]:
    outcome = {"written": 0, "closed": 0, "other": 0}
    lock = threading.Lock()
    for r in range(rounds):
        store = open_store(url)
        start = threading.Barrier(5)

        def write(n: int, store: object = store, r: int = r, start: threading.Barrier = start) -> None:
            for i in range(2000):
                if i == 1:
                    start.wait()  # every writer has written once: close under them now
                try:
                    store.put_writes(f"run-{r}", "c1", f"task-{n}",  # type: ignore[attr-defined]
                                     [(i, "ch", {"v": i})], ns="")
                    kind = "written"
                except StoreClosed:
                    kind = "closed"
                except Exception:
                    kind = "other"
                with lock:
                    outcome[kind] += 1
                if kind == "closed":
                    return

        threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        start.wait()
        store.close()  # while the writers run
        for t in threads:
            t.join()
    return outcome


def _child(url: str, conn: Connection) -> None:
    conn.send(_writers_then_close(url, 10))


def test_closing_a_store_under_running_writes_does_not_crash(store_url: str) -> None:
    parent, child = CTX.Pipe()
    proc = CTX.Process(target=_child, args=(store_url, child))
    proc.start()
    child.close()
    proc.join(timeout=300)
    assert proc.exitcode == 0, f"the child died: exit code {proc.exitcode} (-11 is SIGSEGV)"
    outcome = parent.recv()
    assert outcome["other"] == 0, outcome
    assert outcome["closed"] > 0 and outcome["written"] > 0, outcome


def test_an_operation_after_close_says_so(store_url: str) -> None:
    store = open_store(store_url)
    store.close()
    with pytest.raises(StoreClosed, match="was closed"):
        store.get_checkpoint("r", None)
    store.close()  # closing twice is harmless
