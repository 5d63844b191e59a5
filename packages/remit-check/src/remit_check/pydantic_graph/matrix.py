"""``remit check`` for pydantic-graph: the fault matrix on FileStatePersistence and on remit.

Every cell is measured by real runs of small graphs with no LLM
(:mod:`remit_check.pydantic_graph.graphs`), in child processes forked from a server
that imported only this module. Kill points are reported by the child over a pipe
(the parent then SIGKILLs it); racers are released by a barrier; a ledger file (one
fsynced line per real effect call and per node entry) is the oracle. The layers and
their factory contract are declared in :mod:`remit_check.pydantic_graph`.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from pydantic_graph import BaseNode, End

from remit_check import CellResult, Matrix, Scenario, harness
from remit_check.harness import (
    Children,
    Layer,
    count,
    hold,
    lines,
    pid_of,
    quiet_children,
    use_layer,
)
from remit_check.pydantic_graph import FRAMEWORK, LEASE
from remit_check.pydantic_graph.graphs import (
    CLEAN,
    GRAPHS,
    A,
    Answer,
    Ask,
    Bulk,
    C,
    Deps,
    Evaluate,
    Order,
    Step,
    bulk_graph,
    order_graph,
    question_graph,
)
from remit_check.tally import Tally, scenario
from remit_core import ConsumeConflict, StateValidationError

WAIT = 30.0  # a child that does not report within this many seconds counts as stuck


def _hang(deps: Deps, point: str) -> None:
    if deps.hang == point:
        hold(deps.conn, point)


# ========================================================================= child bodies


def _open(layer: Layer, d: str, run_id: str) -> Any:
    """Open a layer in a child. The store URL travels as an argument: a forkserver's
    children inherit the environment of its start, not the parent's current one."""
    return use_layer(layer)(d, run_id)


def _hang_around_snapshot(p: Any, deps: Deps) -> None:
    """Kill points around the successor's snapshot (an instance patch, on either layer)."""
    original = p.snapshot_node

    async def snapshot_node(state: Any, next_node: Any) -> None:
        if isinstance(next_node, C):
            _hang(deps, "gap")  # B returned; C's snapshot not written
        await original(state, next_node)
        if isinstance(next_node, C):
            _hang(deps, "c-created")  # C's snapshot written, C not started

    p.snapshot_node = snapshot_node


def run_order(factory: Layer, d: str, run_id: str, ledger: str, hang: str,
              conn: Connection | None = None) -> str:
    deps = Deps(ledger, hang, conn)
    p = _open(factory, d, run_id)
    _hang_around_snapshot(p, deps)
    try:
        asyncio.run(order_graph.run(A(), state=Order(), deps=deps, persistence=p))
    except StateValidationError:
        return "refused"
    return "finished"


def recover(factory: Layer, d: str, run_id: str, ledger: str, graph: str = "order") -> tuple[Any, ...]:
    """Resume a run in a fresh process (waiting out a dead owner's lease)."""
    g = GRAPHS[graph]

    async def go() -> tuple[Any, ...]:
        p = _open(factory, d, run_id)
        end = time.monotonic() + 4 * LEASE + 5
        while True:
            try:
                deps = None if graph == "bulk" else Deps(ledger)
                async with g.iter_from_persistence(p, deps=deps) as run:
                    async for _ in run:
                        pass
                assert run.result is not None
                ids = [s.id for s in await p.load_all()]
                return ("ok", run.result.output, repr(run.result.state)[:200], ids)
            except ConsumeConflict as exc:
                if exc.status != "claimed" or time.monotonic() > end:
                    return ("conflict", str(exc)[:120])
                await asyncio.sleep(0.05)  # the dead owner's lease has not run out yet
            except Exception as exc:
                return ("failed", f"{type(exc).__name__}: {str(exc)[:120]}")

    return asyncio.run(go())


def load_history(factory: Layer, d: str, run_id: str, graph: str = "order") -> tuple[Any, ...]:
    g = GRAPHS[graph]

    async def go() -> tuple[Any, ...]:
        p = _open(factory, d, run_id)
        p.set_graph_types(g)
        try:
            history = await asyncio.wait_for(p.load_all(), timeout=10)
        except Exception as exc:
            return ("failed", f"{type(exc).__name__}: {str(exc)[:120]}")
        return ("ok", len(history), [repr(getattr(s, "state", None))[:60] for s in history])

    return asyncio.run(go())


def answer_racer(factory: Layer, d: str, run_id: str, ledger: str, answer: str,
                 barrier: Any, results: Any) -> None:
    barrier.wait()
    try:
        out = deliver_answer(factory, d, run_id, ledger, answer)
    except Exception as exc:
        out = f"error {type(exc).__name__}"
    results.put(out)


def deliver_answer(factory: Layer, d: str, run_id: str, ledger: str, answer: str) -> str:
    """The documented human-in-the-loop pattern: load_next(); if a snapshot is there,
    continue with Evaluate(answer), else start a new run."""

    async def go() -> str:
        p = _open(factory, d, run_id)
        p.set_graph_types(question_graph)
        try:
            node: BaseNode[Order, Deps, str]
            if snapshot := await p.load_next():
                state, node = snapshot.state, Evaluate(answer)
            else:
                state, node = Order(), Ask()
            async with question_graph.iter(node, state=state, deps=Deps(ledger),
                                           persistence=p) as run:
                while True:
                    nxt = await run.next()
                    if isinstance(nxt, End):
                        return "evaluated"
                    if isinstance(nxt, Answer):
                        return "asked"
        except ConsumeConflict:
            return "conflict"

    return asyncio.run(go())


def bulk_writer(factory: Layer, d: str, run_id: str, conn: Connection) -> None:
    """The bulk graph (1 MB of state per step), announcing each snapshot write."""
    p = _open(factory, d, run_id)
    for name in ("snapshot_node", "snapshot_end"):
        original = getattr(p, name)

        def announced(*args: Any, __original: Any = original) -> Any:
            conn.send("write")
            return __original(*args)

        setattr(p, name, announced)
    asyncio.run(bulk_graph.run(Step(0), state=Bulk(), persistence=p))


def fork_and_finish(factory: Layer, d: str, source: str, ledger: str,
                    target: str) -> tuple[Any, ...]:
    """Fork the parked source run at its head snapshot into ``target`` and run it to the end:
    with the persistence's own ``fork`` where it has one (remit's explicit fork), else by
    starting a new history from the snapshot's state."""

    async def go() -> tuple[Any, ...]:
        p = _open(factory, d, source)
        p.set_graph_types(order_graph)
        head = (await p.load_all())[-1]
        if callable(getattr(p, "fork", None)):
            forked = await p.fork(head.id, run_id=target)
            async with order_graph.iter_from_persistence(forked, deps=Deps(ledger)) as run:
                async for _ in run:
                    pass
            q = forked
        else:  # the stock layer has no fork: start a new history from the snapshot's state
            q = _open(factory, d, target)
            async with order_graph.iter(head.node, state=head.state, deps=Deps(ledger),
                                        persistence=q) as run:
                async for _ in run:
                    pass
        assert run.result is not None
        return (repr(run.result.state), [s.id for s in await q.load_all()])

    return asyncio.run(go())


# ============================================================================ the parent

CHILDREN = Children(__name__, WAIT)
quiet_children()
MATRIX = Matrix(FRAMEWORK)

Run = tuple[Layer, str, str, str]
"""A run as the child bodies take it: (layer, directory, run id, ledger)."""


def _runs(t: Tally, lay: Layer, prefix: str) -> Iterator[tuple[Path, Run]]:
    """Per rep: its ledger and a fresh run (id ``prefix-...``) in its fresh directory."""
    for d in t.dirs():
        ledger = d / "ledger"
        yield ledger, (lay, str(d), t.env.new_id(prefix), str(ledger))


@scenario(MATRIX, "kill-after-effect", "EO", "PC")
def kill_after_effect(t: Tally, lay: Layer) -> list[CellResult]:
    for ledger, run in _runs(t, lay, "order"):
        CHILDREN.crash(run_order, (*run, "B"), "charged")  # inside B
        got = CHILDREN.call(recover, run)
        entries = lines(ledger)
        t.add(effect_calls=count(entries, "effect charge"),
              completed_node_reruns=count(entries, "enter A") - 1,
              finished=got[0] == "ok" and got[1] == CLEAN[0])
    all_finished = t["finished"] == t.n
    return [
        t.cell("EO", t["effect_calls"] == t.n and all_finished, ["effect_calls", "finished"],
               "charge fired {effect_calls} times in {reps} reps; {finished} of {reps} runs "
               "finished"),
        t.cell("PC", all_finished and t["completed_node_reruns"] == 0,
               ["finished", "completed_node_reruns"],
               "run resumed in {finished} of {reps} reps; completed nodes re-ran "
               "{completed_node_reruns} times"),
    ]


@scenario(MATRIX, "kill-between-steps", "PC")
def kill_between_steps(t: Tally, lay: Layer) -> list[CellResult]:
    for ledger, run in _runs(t, lay, "gap"):
        CHILDREN.crash(run_order, (*run, "gap"), "gap")
        got = CHILDREN.call(recover, run)
        entries = lines(ledger)
        t.add(recovered_intact=got[0] == "ok" and got[1] == CLEAN[0]
              and count(entries, "effect charge") == 1 and count(entries, "enter A") == 1)
    return [t.cell("PC", t["recovered_intact"] == t.n, ["recovered_intact"],
                   "recovered with no state lost in {recovered_intact} of {reps} reps")]


@scenario(MATRIX, "kill-during-write", "PC", "LV")
def kill_during_write(t: Tally, lay: Layer) -> list[CellResult]:
    for rep, d in enumerate(t.dirs()):
        run_id = t.env.new_id("bulk")
        parent, child = CHILDREN.ctx.Pipe()
        proc = CHILDREN.ctx.Process(target=bulk_writer, args=(lay, str(d), run_id),
                           kwargs={"conn": child})
        proc.start()
        child.close()
        target = 3 + rep  # kill as the (3+rep)-th snapshot write starts
        seen = 0
        try:
            while seen < target and parent.poll(WAIT):
                with contextlib.suppress(EOFError):
                    parent.recv()
                seen += 1
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid_of(proc), signal.SIGKILL)
            proc.join(timeout=WAIT)
        with CHILDREN.one() as pool:
            history = pool.apply(load_history, (lay, str(d), run_id, "bulk"))
            t.add(history_lost=history[0] != "ok" or history[1] == 0)
            resumed = pool.apply_async(recover, (lay, str(d), run_id, "", "bulk"))
            try:
                t.add(not_resumable=resumed.get(timeout=WAIT)[0] != "ok")
            except mp.TimeoutError:
                t.add(not_resumable=1)
    return [
        t.cell("PC", t["history_lost"] == 0, ["history_lost"],
               "history unloadable or empty after the kill in {history_lost} of {reps} reps"),
        t.cell("LV", t["not_resumable"] == 0, ["not_resumable"],
               "the run could not be resumed afterwards in {not_resumable} of {reps} reps"),
    ]


@scenario(MATRIX, "k-resumes", "CO-k")
def k_resumes(t: Tally, lay: Layer) -> list[CellResult]:
    """k processes deliver an answer to one parked run at once, with the documented
    human-in-the-loop pattern (load_next, else start a new run)."""
    for ledger, run in _runs(t, lay, "question"):
        CHILDREN.call(deliver_answer, (*run, ""))
        outcomes = CHILDREN.race(answer_racer, [(*run, f"v{i}") for i in range(t.env.k)])
        t.add(evaluations=count(lines(ledger), "enter Evaluate"),
              deliveries_accepted=sum(o != "conflict" for o in outcomes))
    return [t.cell("CO-k", t["evaluations"] == t.n and t["deliveries_accepted"] == t.n,
                   ["evaluations", "deliveries_accepted", "k"],
                   "{k} racing deliveries: evaluated {evaluations} times in {reps} reps, "
                   "{deliveries_accepted} accepted without an error")]


@scenario(MATRIX, "second-resume", "CO")
def second_resume(t: Tally, lay: Layer) -> list[CellResult]:
    """A late second delivery, after the first finished: refused, or silently taken?"""
    for _, run in _runs(t, lay, "question"):
        outcomes = [CHILDREN.call(deliver_answer, (*run, answer))
                    for answer in ("", "first", "second")]
        t.add(late_deliveries_accepted=outcomes[2] != "conflict")
    return [t.cell("CO", t["late_deliveries_accepted"] == 0, ["late_deliveries_accepted"],
                   "a late second delivery was accepted without an error in "
                   "{late_deliveries_accepted} of {reps} reps")]


@scenario(MATRIX, "invalid-state", "CV")
def invalid_state(t: Tally, lay: Layer) -> list[CellResult]:
    for _, run in _runs(t, lay, "cv"):
        with CHILDREN.one() as pool:
            with contextlib.suppress(Exception):
                pool.apply(run_order, (*run, "invalid"))
            history = pool.apply(load_history, run[:3])  # (layer, directory, run id)
        unloadable = history[0] != "ok"
        t.add(invalid_persisted=unloadable or any("eleven" in s for s in history[2]),
              history_unloadable=unloadable)
    return [t.cell("CV", t["invalid_persisted"] == 0, ["invalid_persisted", "history_unloadable"],
                   "invalid state stored in {invalid_persisted} of {reps} reps; history "
                   "unloadable in {history_unloadable}")]


@scenario(MATRIX, "fork-twice", "FI/FD")
def fork_twice(t: Tally, lay: Layer) -> list[CellResult]:
    for _, source in _runs(t, lay, "source"):
        CHILDREN.crash(run_order, (*source, "c-created"), "c-created")
        with CHILDREN.one() as pool:
            a = pool.apply(fork_and_finish, (*source, t.env.new_id("fork-a")))
            b = pool.apply(fork_and_finish, (*source, t.env.new_id("fork-b")))
        t.add(forks_equal=a == b)
    return [t.cell("FI/FD", t["forks_equal"] == t.n, ["forks_equal"],
                   "two forks of one snapshot had the same ids and state in {forks_equal} of "
                   "{reps} reps")]


@scenario(MATRIX, "recover-twice", "RD")
def recover_twice(t: Tally, lay: Layer) -> list[CellResult]:
    def crash(files: Layer, d: Path) -> tuple[str, str]:
        run_id, ledger = t.env.new_id("rd"), str(d / "ledger")
        CHILDREN.crash(run_order, (files, str(d), run_id, ledger, "c-created"), "c-created")
        return run_id, ledger

    def recover_copy(files: Layer, copy: Path, run: tuple[str, str]) -> Any:
        return CHILDREN.call(recover, (files, str(copy), *run))

    return harness.recover_twice(t, lay, crash=crash, recover=recover_copy,
                                 finished=lambda got: bool(got[0] == "ok"),
                                 agreed="agreed on state and ids")


def scenarios() -> list[Scenario]:
    return list(MATRIX.scenarios)
