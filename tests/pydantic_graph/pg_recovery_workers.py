"""Graphs and child-process bodies for the pydantic-graph recovery tests.

The graph is ``A -> B (effect "charge") -> C -> End``. A child runs runs until each is in
``C`` (a kill point: the child reports through a pipe and blocks there until the parent
SIGKILLs it). Each run executes on its own thread, with its own event loop, so that one
blocked run holds up no other. The oracle is a ledger file (O_APPEND + fsync): every
node entry and every real effect call appends one line, so counts survive SIGKILL.

REMIT_TEST_BREAK=recovery switches the recovery's protection off in a recoverer
(:func:`recoverer`): it decides by a read that a run is abandoned and goes on with it,
instead of taking it with the store's atomic ``recover_run``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from pydantic_graph import BaseNode, End, GraphRunContext
from pydantic_graph.graph import Graph

from remit_core import open_store
from remit_pydantic_graph import GraphTarget, RemitStatePersistence, arecover, effect, recover
from tests.workers import break_recovery, note, recover_until_done

NAME = "pg-recovery"
#: the lease of the executors that die: their runs read as abandoned a second later
LEASE = 1.0
#: the lease of the chaos test's recoverers: a killed one's runs are taken over once it
#: runs out; long enough that a live one, slowed on a loaded machine, renews in time
RECOVERER_LEASE = 3.0
#: the passes a chaos recoverer makes at most: a handful find work when each run is
#: taken once (its own, then the killed recoverers'); without the atomic take its
#: runs read as abandoned after every pass
PASSES = 10
BROKEN = os.environ.get("REMIT_TEST_BREAK", "") == "recovery"
#: runs with these prefixes end (done, parked before C, failed in C) before the others start
ENDED = ("done:", "park:", "fail:")

#: set in a child that must stop in node C (or in the effect "ship"): called with the run
_stop: Any = None


@dataclass
class Job:
    run: str = ""
    ledger: str = ""
    log: list[str] = field(default_factory=list)


@effect(name="charge")
def charge(run: str, ledger: str, *, idempotency_key: str) -> str:
    note(ledger, f"effect charge {run} {os.getpid()}")
    return f"txn-{run}"


@effect(name="ship")
def ship(run: str, ledger: str) -> str:
    # no idempotency key: a call cut short by a crash is in doubt, not run again
    note(ledger, f"effect ship {run} {os.getpid()}")
    if _stop is not None:
        _stop(run)
    return f"shipped-{run}"


@dataclass
class A(BaseNode[Job]):
    async def run(self, ctx: GraphRunContext[Job]) -> B:
        note(ctx.state.ledger, f"enter A {ctx.state.run} {os.getpid()}")
        ctx.state.log.append("A")
        return B()


@dataclass
class B(BaseNode[Job]):
    async def run(self, ctx: GraphRunContext[Job]) -> C:
        note(ctx.state.ledger, f"enter B {ctx.state.run} {os.getpid()}")
        ctx.state.log.append(f"B:{charge(ctx.state.run, ctx.state.ledger)}")
        return C()


@dataclass
class C(BaseNode[Job, None, str]):
    async def run(self, ctx: GraphRunContext[Job]) -> End[str]:
        s = ctx.state
        note(s.ledger, f"enter C {s.run} {os.getpid()}")
        if s.run.startswith("fail:"):
            raise RuntimeError(f"C refused {s.run}")
        if s.run.startswith("ship"):
            s.log.append(f"C:{ship(s.run, s.ledger)}")
            return End(s.log[-1])
        if _stop is not None:
            _stop(s.run)
        s.log.append("C")
        return End(s.run)


graph = Graph(nodes=[A, B, C], name=NAME)
other_graph = Graph(nodes=[A, B, C], name="another-graph")


def worker_target() -> GraphTarget:
    """``remit worker --app``'s target without ``--store``: the graph with the store its
    runs are on ($REMIT_TEST_STORE)."""
    return GraphTarget(graph, os.environ["REMIT_TEST_STORE"])


async def execute(url: str, ledger: str, run: str, lease: float = LEASE) -> None:
    """One run of ``graph``: ``park:`` runs stop before C (parked), ``fail:`` runs raise in
    C (failed), the others run to the end (unless stopped in C)."""
    persistence = RemitStatePersistence.from_url(url, run_id=run, lease=lease)
    state = Job(run=run, ledger=ledger)
    if run.startswith("park:"):
        async with graph.iter(A(), state=state, persistence=persistence) as graph_run:
            async for node in graph_run:
                if isinstance(node, C):
                    break
    elif run.startswith("fail:"):
        with contextlib.suppress(RuntimeError):
            await graph.run(A(), state=state, persistence=persistence)
    else:
        await graph.run(A(), state=state, persistence=persistence)


def die_in_c(url: str, ledger: str, runs: list[str], conn: Connection,
             lease: float = LEASE) -> None:
    """Run ``runs``: the ended ones (:data:`ENDED`) first, one after the other; then the
    others at once, each on its own thread, until every one is in C (or in ``ship``);
    report them, then block until SIGKILLed."""
    global _stop
    killable = [r for r in runs if not r.startswith(ENDED)]
    arrived: list[str] = []
    lock = threading.Lock()
    all_there = threading.Event()

    def stop(run: str) -> None:
        with lock:
            arrived.append(run)
            if len(arrived) == len(killable):
                all_there.set()
        threading.Event().wait()  # until the process is killed

    def on_its_thread(run: str) -> None:
        try:
            asyncio.run(execute(url, ledger, run, lease))
        except BaseException as exc:  # reported: the parent fails at once, not on a timeout
            with lock:
                conn.send(("error", f"{run}: {exc!r}"))
            raise
        with lock:
            conn.send(("error", f"{run}: ended instead of stopping in C"))

    for run in runs:
        if run.startswith(ENDED):
            asyncio.run(execute(url, ledger, run, lease))
    _stop = stop
    for run in killable:
        threading.Thread(target=on_its_thread, args=(run,), daemon=True).start()
    all_there.wait()
    with lock:
        conn.send(("in C", sorted(arrived)))
    conn.recv()  # blocks until the parent kills this process


def stock_die_in_c(path: str, ledger: str, run: str, conn: Connection) -> None:
    """Run ``run`` of ``graph`` on pydantic-graph's own ``FileStatePersistence`` (the stock
    layer, not remit: ``charge`` runs as a plain call) until it is in node C; report that,
    then block until the parent SIGKILLs this process (C's snapshot stays ``running``)."""
    global _stop
    from pathlib import Path

    from pydantic_graph.persistence.file import FileStatePersistence

    def stop(arrived: str) -> None:
        conn.send(("in C", arrived))
        conn.recv()  # never answered: the parent SIGKILLs this process here

    _stop = stop
    stock: FileStatePersistence[Job, str] = FileStatePersistence(Path(path))
    asyncio.run(graph.run(A(), state=Job(run=run, ledger=ledger), persistence=stock))
    conn.send(("error", f"{run}: ended instead of stopping in C"))


def recoverer(url: str, barrier: Any, results: Any, api: str) -> None:
    """Call recover (or arecover) at the same moment as the other recoverers and report
    what it recovered. With REMIT_TEST_BREAK=recovery the protection is off: each
    recoverer decides by a read whether a run is abandoned and goes on with it, without
    the atomic take (check-then-act)."""
    store = open_store(url)
    try:
        if BROKEN:
            break_recovery(store)
        barrier.wait()
        report = recover(graph, store) if api == "recover" else \
            asyncio.run(arecover(graph, store))
        results.put((os.getpid(), sorted(report.recovered), sorted(report.failed),
                     sorted(report.skipped)))
    finally:
        store.close()


def chaos_recoverer(url: str, runs: list[str], barrier: Any, results: Any, kills: Any,
                    killed: Any, die: bool) -> None:
    """A recoverer in the chaos test. ``die``: it stops inside node C of the first run it
    continues, reports that (its pid and the run) on ``kills``, and blocks until the
    parent SIGKILLs it. Otherwise its node C waits until the parent has killed the dying
    ones (so that they do take runs), and it recovers pass after pass until every run is
    done (the killed recoverers' runs read as abandoned once their lease,
    :data:`RECOVERER_LEASE`, runs out), at most :data:`PASSES` passes; it reports what
    it recovered and failed, and why it stopped."""
    global _stop

    def stop_dying(run: str) -> None:
        kills.put((os.getpid(), run))
        threading.Event().wait()

    _stop = stop_dying if die else (lambda run: killed.wait(120))
    store = open_store(url, lease=RECOVERER_LEASE)
    try:
        if BROKEN:
            break_recovery(store)
        barrier.wait()
        results.put((os.getpid(), *recover_until_done(store, runs,
                                                      lambda: recover(graph, store), PASSES)))
    finally:
        store.close()


# ------------------------------------------------------- in-process lifecycle test graphs

#: set by a test: the node Hang sets it when it runs, then waits until cancelled
entered: asyncio.Event | None = None


@dataclass
class Hang(BaseNode[Job, None, str]):
    async def run(self, ctx: GraphRunContext[Job]) -> End[str]:
        assert entered is not None
        entered.set()
        await asyncio.Event().wait()  # until the task is cancelled
        return End("never")


hang_graph = Graph(nodes=[Hang], name="pg-hang")


@dataclass
class Ask(BaseNode[Job, None, str]):
    async def run(self, ctx: GraphRunContext[Job]) -> Answer:
        return Answer(question="ship it?")


@dataclass
class Answer(BaseNode[Job, None, str]):
    question: str

    async def run(self, ctx: GraphRunContext[Job]) -> Evaluate:
        raise AssertionError("the answer comes from outside the graph")


@dataclass
class Evaluate(BaseNode[Job, None, str]):
    answer: str

    async def run(self, ctx: GraphRunContext[Job]) -> End[str]:
        return End(self.answer)


question_graph = Graph(nodes=[Ask, Answer, Evaluate], name="pg-question")
