"""Child-process bodies for the recovery tests: threads killed mid-step, and recoverers.

The graph is ``a -> b (effect "charge") -> c``. A child runs threads until each is in
``c`` (a kill point: the child reports and blocks there until the parent SIGKILLs it).
The oracle is a ledger file (O_APPEND + fsync): every node entry and every real effect
call appends one line, so counts survive SIGKILL.
"""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from remit_langgraph import RemitSaver, arecover, effect, recover
from tests.workers import break_recovery, note, recover_until_done

NAME = "recovery-graph"
#: the lease of the executors that die: their threads read as abandoned a second later
LEASE = 1.0
#: the lease of the chaos test's recoverers: a killed one's threads are taken over once it
#: runs out; long enough that a live one, slowed on a loaded machine, renews in time
RECOVERER_LEASE = 3.0
#: the passes a chaos recoverer makes at most: a handful find work when each thread is
#: taken once (its own, then the killed recoverers'); without the atomic take its
#: threads read as abandoned after every pass
PASSES = 10

#: set in a child that must stop in node c: called with the thread id
_stop_in_c: Any = None


def _merge(a: list[str], b: list[str]) -> list[str]:
    return a + b


class State(TypedDict, total=False):
    thread: str
    log: Annotated[list[str], _merge]
    answer: Any


def build(ledger: str, *, park_in_b: bool = False) -> StateGraph:
    @effect(name="ship")
    def ship(thread: str) -> dict[str, Any]:
        # no idempotency key: a call cut short by a crash is in doubt, not re-run
        note(ledger, f"effect ship {thread} {os.getpid()}")
        if _stop_in_c is not None:
            _stop_in_c(thread)
        return {"shipped": thread}

    @effect(name="charge")
    def charge(thread: str, *, idempotency_key: str) -> dict[str, Any]:
        note(ledger, f"effect charge {thread} {os.getpid()}")
        return {"txn": f"txn-{thread}", "key": idempotency_key}

    def a(s: State) -> dict[str, Any]:
        note(ledger, f"enter a {s['thread']}")
        return {"log": ["a"]}

    def b(s: State) -> dict[str, Any]:
        note(ledger, f"enter b {s['thread']}")
        receipt = charge(s["thread"])
        answer = interrupt({"approve": s["thread"]}) if park_in_b else None
        return {"log": [f"b:{receipt['txn']}"], "answer": answer}

    def c(s: State) -> dict[str, Any]:
        note(ledger, f"enter c {s['thread']} {os.getpid()}")
        if s["thread"].startswith("ship"):
            return {"log": [f"c:{ship(s['thread'])['shipped']}"]}
        if _stop_in_c is not None:
            _stop_in_c(s["thread"])
        return {"log": ["c"]}

    g = StateGraph(State)
    g.add_node("a", a)
    g.add_node("b", b)
    g.add_node("c", c)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", "c")
    g.add_edge("c", END)
    return g


def app(saver: RemitSaver, ledger: str, **kwargs: Any) -> Any:
    return build(ledger, **kwargs).compile(checkpointer=saver, name=NAME)


def worker_app() -> Any:
    """``remit worker --app``'s target: the graph, compiled without a checkpointer (the
    worker gives it the store of its ``--store``); the ledger is $REMIT_TEST_LEDGER."""
    return build(os.environ["REMIT_TEST_LEDGER"]).compile(name=NAME)


def cfg(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def die_in_c(url: str, ledger: str, threads: list[str], conn: Connection,
             api: str = "invoke") -> None:
    """Run every thread (each on its own Python thread, at once) to node c; report once
    all are there, then block until SIGKILLed. (``durability="sync"``: a step's checkpoint
    is durable before the next step starts, so a and b are behind every thread in c; under
    LangGraph's default, "async", a recovery may run b again, its effect still once.) ``done:<id>`` threads run to the end
    first, ``park:<id>`` ones park on an interrupt in b, before the others start."""
    global _stop_in_c
    arrived: list[str] = []
    lock = threading.Lock()
    all_there = threading.Event()
    killable = [t for t in threads if not t.startswith(("done:", "park:"))]

    def stop(thread: str) -> None:
        with lock:
            arrived.append(thread)
            if len(arrived) == len(killable):
                all_there.set()
        threading.Event().wait()  # until the process is killed

    with RemitSaver.from_conn_string(url, lease=LEASE) as saver:
        for t in threads:
            if t.startswith("done:"):
                app(saver, ledger).invoke({"thread": t}, cfg(t))
            elif t.startswith("park:"):
                app(saver, ledger, park_in_b=True).invoke({"thread": t}, cfg(t))
        _stop_in_c = stop
        graph = app(saver, ledger)
        if api == "ainvoke":
            loop = asyncio.new_event_loop()
            # (sync nodes run on the loop's default executor: one thread per blocked c)
            loop.set_default_executor(ThreadPoolExecutor(len(killable) + 4))
            threading.Thread(target=loop.run_forever, daemon=True).start()
            for t in killable:
                asyncio.run_coroutine_threadsafe(
                    graph.ainvoke({"thread": t}, cfg(t), durability="sync"), loop)
        else:
            for t in killable:
                threading.Thread(target=graph.invoke, args=({"thread": t}, cfg(t)),
                                 kwargs={"durability": "sync"}, daemon=True).start()
        all_there.wait()
        conn.send(("in c", sorted(arrived)))
        conn.recv()  # blocks until the parent kills this process


def recoverer(url: str, ledger: str, barrier: Any, results: Any, api: str,
              broken: bool) -> None:
    """Call recover (or arecover) at the same moment as the other recoverers and report
    what it recovered. ``broken``: the protection off -- each recoverer decides by a read
    whether a run is abandoned and takes it without the atomic recovery."""
    with RemitSaver.from_conn_string(url) as saver:
        if broken:
            break_recovery(saver.store)
        graph = app(saver, ledger)
        barrier.wait()
        report = asyncio.run(arecover(graph)) if api == "ainvoke" else recover(graph)
        results.put((os.getpid(), sorted(report.recovered), sorted(report.failed),
                     sorted(report.skipped)))


def chaos_recoverer(url: str, ledger: str, threads: list[str], barrier: Any, results: Any,
                    kills: Any, killed: Any, die: bool, broken: bool) -> None:
    """A recoverer in the chaos test. ``die``: it stops inside node c of the first thread
    it continues, reports that, and blocks until the parent SIGKILLs it. Otherwise its
    node c waits until the parent has killed the dying ones (so that they take threads),
    and it recovers pass after pass until every thread is done (the killed recoverers'
    threads read as abandoned once their lease, :data:`RECOVERER_LEASE`, runs out), at
    most :data:`PASSES` passes; it reports what it recovered and failed, and why it
    stopped."""
    global _stop_in_c

    def stop_dying(thread: str) -> None:
        kills.put((os.getpid(), thread))
        threading.Event().wait()

    _stop_in_c = stop_dying if die else (lambda thread: killed.wait(120))
    with RemitSaver.from_conn_string(url, lease=RECOVERER_LEASE) as saver:
        if broken:
            break_recovery(saver.store)
        graph = app(saver, ledger)
        barrier.wait()
        results.put((os.getpid(), *recover_until_done(saver.store, threads,
                                                      lambda: recover(graph), PASSES)))
