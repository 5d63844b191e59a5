"""pydantic-graph graphs and child-process bodies for the contract tests (no LLM).

The oracle is a ledger file: every node entry and every real effect call
appends one line (O_APPEND + fsync), so the counts survive SIGKILL.

The order graph (A -> B -> C, ``Deps``, ``Order``, the effect ``charge``) and the bulk
graph are ``remit check``'s own (:mod:`remit_check.pydantic_graph.graphs`); the
graphs of parked runs below are these tests' alone.

REMIT_TEST_BREAK switches one protection off in every process that imports
this module (the worker processes too: they inherit the environment and import it):

* ``pg-takeover``: a claim whose owner died is never taken over (LV off).
* ``pg-gap``: a node's success is written when the node returns, before its
  successor's snapshot (the gap open again, as in the stock layer).
* ``pg-consume``: no atomic claim and no one-successor rule (CO off).
* ``pg-ids``: pydantic-graph's random snapshot ids (FD/RD off).
* ``pg-torn``: a snapshot written in two operations (a write is not atomic).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from pydantic_graph import BaseNode, End, GraphRunContext
from pydantic_graph.exceptions import GraphRuntimeError
from pydantic_graph.graph import Graph

from remit_check.harness import lines  # noqa: F401  (w.lines, for the tests)
from remit_check.pydantic_graph.graphs import (  # noqa: F401  (B, BLOB, STEPS, charge: w.*)
    BLOB,
    STEPS,
    A,
    B,
    Bulk,
    C,
    Deps,
    Order,
    Step,
    bulk_graph,
    charge,
    order_graph,
)
from remit_core.records import Claim
from remit_core.urls import with_options
from remit_pydantic_graph import ConsumeConflict, RemitStatePersistence, effect
from remit_pydantic_graph import persistence as _p
from tests.workers import note

BREAK = os.environ.get("REMIT_TEST_BREAK", "")

if BREAK == "pg-takeover":  # LV off: a held claim stays held, even when its owner is dead
    _claim_slot = RemitStatePersistence._claim_slot

    async def _no_takeover(self: RemitStatePersistence[Any, Any], sid: str, phase: str) -> Claim:
        held = await self._io(self.store.get_claim, self._key(sid))
        if held is not None and held.status == "claimed" and held.owner != self._owner:
            raise ConsumeConflict("held (takeover disabled)", key=held.key, owner=held.owner,
                                  status="claimed")
        return await _claim_slot(self, sid, phase)

    RemitStatePersistence._claim_slot = _no_takeover  # type: ignore[method-assign]

if BREAK == "pg-gap":  # the gap open: success durable before the successor is
    _defer = RemitStatePersistence._defer_success

    def _eager(self: RemitStatePersistence[Any, Any], attempt: _p._Attempt) -> None:
        _defer(self, attempt)
        self.store.consume_claim(self._key(attempt.snapshot_id), owner=self._owner,
                                 fence=attempt.claim.fence)

    RemitStatePersistence._defer_success = _eager  # type: ignore[method-assign]

if BREAK == "pg-consume":  # CO off: check-then-act instead of one atomic claim
    async def _racy(self: RemitStatePersistence[Any, Any], sid: str, phase: str) -> Claim:
        held = await self._io(self.store.get_claim, self._key(sid))
        if held is not None and held.status == "consumed":
            raise ConsumeConflict("consumed", key=held.key, owner=held.owner, status="consumed")
        now = time.time()
        return Claim(self._key(sid), self.run_id, "claimed", self._owner, 1, now + self.lease,
                     None, {"phase": phase}, now, None)

    async def _put_any(self: RemitStatePersistence[Any, Any], new_id: str, *, parent: str,
                       data: dict[str, Any], step: str | None, metadata: dict[str, Any]) -> None:
        await self._io(self.store.put_checkpoint, self.run_id, new_id, parent_id=parent,
                       kind=_p.KIND, data=data, metadata=metadata)

    RemitStatePersistence._claim_slot = _racy  # type: ignore[method-assign]
    RemitStatePersistence._put = _put_any  # type: ignore[method-assign]

if BREAK == "pg-torn":  # one write as two: an empty snapshot first, its data after
    _put_once = RemitStatePersistence._put

    async def _torn(self: RemitStatePersistence[Any, Any], new_id: str, *, parent: str,
                    data: dict[str, Any], step: str | None, metadata: dict[str, Any]) -> None:
        await self._io(self.store.put_checkpoint, self.run_id, new_id, parent_id=parent,
                       kind=_p.KIND, data={}, metadata=metadata)
        await _put_once(self, new_id, parent=parent, data=data, step=step, metadata=metadata)

    RemitStatePersistence._put = _torn  # type: ignore[method-assign]

if BREAK == "pg-ids":  # FD/RD off: pydantic-graph's own random ids
    from pydantic_graph.basenode import generate_snapshot_id

    RemitStatePersistence._derive = (  # type: ignore[method-assign]
        lambda self, parent, node_id, payload: generate_snapshot_id(node_id))


class GapPersistence(RemitStatePersistence[Order, int]):
    """Blocks in the gap: B has returned, C's snapshot is not written yet."""

    deps: Deps

    async def snapshot_node(self, state: Order, next_node: BaseNode[Order, Any, int]) -> None:
        if isinstance(next_node, C) and self.deps.conn is not None:
            self.deps.conn.send("gap")
            self.deps.conn.recv()  # the parent SIGKILLs this process here
        await super().snapshot_node(state, next_node)


def run_and_hang(url: str, run_id: str, ledger: str, hang: str, conn: Connection) -> None:
    """Run the order graph; block at ``hang`` until SIGKILLed."""
    deps = Deps(ledger, hang, conn)
    if hang == "gap":
        p = GapPersistence.from_url(url, run_id=run_id, lease=1.0)
        p.deps = deps  # type: ignore[attr-defined]
    else:
        p = RemitStatePersistence.from_url(url, run_id=run_id, lease=1.0)
    asyncio.run(order_graph.run(A(), state=Order(), deps=deps, persistence=p))


def describe(history: list[Any]) -> list[tuple[str, str]]:
    return [(s.id, getattr(s, "status", "end")) for s in history]


async def run_clean(url: str, run_id: str, ledger: str) -> tuple[Any, ...]:
    p = RemitStatePersistence.from_url(url, run_id=run_id)
    result = await order_graph.run(A(), state=Order(), deps=Deps(ledger), persistence=p)
    return result.output, result.state, describe(await p.load_all())


def recover(url: str, run_id: str, ledger: str, deadline: float = 20.0) -> tuple[Any, ...]:
    """In a fresh process: resume the run in one call; the store's wait= option makes it
    wait for the dead owner's lease to run out (no retry loop here)."""

    async def go() -> tuple[Any, ...]:
        p = RemitStatePersistence.from_url(with_options(url, wait=deadline), run_id=run_id,
                                           lease=1.0)
        try:
            async with order_graph.iter_from_persistence(p, deps=Deps(ledger)) as run:
                async for _ in run:
                    pass
        except ConsumeConflict as exc:
            return ("conflict", exc.status, str(exc))
        except GraphRuntimeError as exc:
            return ("unrecoverable", type(exc).__name__, str(exc))
        assert run.result is not None
        return ("ok", run.result.output, run.result.state, describe(await p.load_all()))

    return asyncio.run(go())


# ====================================================================== parked runs (CO)


@dataclass
class Prep(BaseNode[Order, Deps, int]):
    async def run(self, ctx: GraphRunContext[Order, Deps]) -> Gate:
        note(ctx.deps.ledger, "enter Prep")
        ctx.state.x = 7
        return Gate()


@effect(name="grant")
def grant(ledger: str, x: int, *, idempotency_key: str) -> str:
    note(ledger, f"effect grant {x} {os.getpid()}")
    return f"granted-{x}"


@dataclass
class Gate(BaseNode[Order, Deps, int]):
    async def run(self, ctx: GraphRunContext[Order, Deps]) -> End[int]:
        note(ctx.deps.ledger, f"enter Gate {os.getpid()}")
        ctx.state.log.append(grant(ctx.deps.ledger, ctx.state.x))
        return End(ctx.state.x)


gate_graph = Graph(nodes=[Prep, Gate])


@effect(name="ask")
def ask_question(ledger: str, *, idempotency_key: str) -> str:
    note(ledger, "effect ask")
    return "approve?"


@effect(name="grade")
def grade(ledger: str, answer: str, *, idempotency_key: str) -> str:
    note(ledger, f"effect grade {answer} {os.getpid()}")
    return f"graded-{answer}"


@dataclass
class Ask(BaseNode[Order, Deps, str]):
    async def run(self, ctx: GraphRunContext[Order, Deps]) -> Answer:
        note(ctx.deps.ledger, "enter Ask")
        return Answer(question=ask_question(ctx.deps.ledger))


@dataclass
class Answer(BaseNode[Order, Deps, str]):
    question: str

    async def run(self, ctx: GraphRunContext[Order, Deps]) -> Evaluate:
        raise RuntimeError("in the CLI pattern the answer comes from outside; Answer never runs")


@dataclass
class Evaluate(BaseNode[Order, Deps, str]):
    answer: str

    async def run(self, ctx: GraphRunContext[Order, Deps]) -> End[str]:
        note(ctx.deps.ledger, f"enter Evaluate {self.answer} {os.getpid()}")
        ctx.state.log.append(grade(ctx.deps.ledger, self.answer))
        return End(f"done-{self.answer}")


question_graph = Graph(nodes=[Ask, Answer, Evaluate])


async def park_gate(url: str, run_id: str, ledger: str) -> None:
    p = RemitStatePersistence.from_url(url, run_id=run_id)
    async with gate_graph.iter(Prep(), state=Order(), deps=Deps(ledger), persistence=p) as run:
        async for node in run:
            if isinstance(node, Gate):
                break


async def park_question(url: str, run_id: str, ledger: str) -> None:
    p = RemitStatePersistence.from_url(url, run_id=run_id)
    async with question_graph.iter(Ask(), state=Order(), deps=Deps(ledger), persistence=p) as run:
        while True:
            node = await run.next()
            if isinstance(node, Answer | End):
                break


async def resume_gate(p: RemitStatePersistence[Any, Any], ledger: str) -> Any:
    """The plain resume: iter_from_persistence."""
    async with gate_graph.iter_from_persistence(p, deps=Deps(ledger)) as run:
        async for _ in run:
            pass
    assert run.result is not None
    return run.result.output


async def deliver_answer(p: RemitStatePersistence[Any, Any], ledger: str, answer: str) -> Any:
    """The documented human-in-the-loop pattern (pydantic-ai's question_graph run_as_cli):
    load_next(); if it returns a snapshot, continue with Evaluate(answer), else start a new run."""
    p.set_graph_types(question_graph)
    if snapshot := await p.load_next():
        state = snapshot.state
        node: BaseNode[Order, Deps, str] = Evaluate(answer)
    else:
        state = Order()
        node = Ask()
    async with question_graph.iter(node, state=state, deps=Deps(ledger), persistence=p) as run:
        while True:
            nxt = await run.next()
            if isinstance(nxt, End):
                return nxt.data
            if isinstance(nxt, Answer):
                return "asked"


def resumer(url: str, run_id: str, kind: str) -> RemitStatePersistence[Any, Any]:
    """A persistence with its types set (the slow part), ready to race."""
    p = RemitStatePersistence.from_url(url, run_id=run_id, lease=10.0)
    p.set_graph_types(gate_graph if kind == "iter" else question_graph)
    return p


def racer(url: str, ledger: str, barrier: Any, conn: Connection, results: Any) -> None:
    """One of k processes, started once and reused: each command is released by the barrier,
    after everything that is not the resume itself is ready."""
    while True:
        cmd = conn.recv()
        if cmd is None:
            return
        kind, run_id, value = cmd
        p = resumer(url, run_id, kind)
        barrier.wait()
        try:
            if kind == "iter":
                out = asyncio.run(resume_gate(p, ledger))
            else:
                out = asyncio.run(deliver_answer(p, ledger, value))
            results.put(("ok", value, out))
        except ConsumeConflict as exc:
            results.put(("conflict", value, exc.status))
        except Exception as exc:
            results.put(("error", value, repr(exc)))


# ============================================================= killed in the middle of writes

class Announcing(RemitStatePersistence[Bulk, int]):
    """Tells the parent before each snapshot write starts (without waiting for it)."""

    conn: Connection | None = None
    writes = 0

    async def _put(self, new_id: str, **kwargs: Any) -> None:
        self.writes += 1
        if self.conn is not None:
            self.conn.send(self.writes)
        await super()._put(new_id, **kwargs)


def bulk_writer(url: str, run_id: str, resume: bool, conn: Connection | None) -> Any:
    """Run (or resume) the bulk graph, announcing each write; returns the output."""

    async def go() -> Any:
        p = Announcing.from_url(url, run_id=run_id, lease=0.5)
        p.conn = conn  # type: ignore[attr-defined]
        if not resume:
            return (await bulk_graph.run(Step(0), state=Bulk(), persistence=p)).output
        end = time.monotonic() + 20.0
        while True:
            try:
                async with bulk_graph.iter_from_persistence(p) as run:
                    async for _ in run:
                        pass
                assert run.result is not None
                return run.result.output
            except ConsumeConflict as exc:
                if exc.status != "claimed" or time.monotonic() > end:
                    raise
                await asyncio.sleep(0.05)  # the killed owner's lease has not run out yet

    return asyncio.run(go())


# =============================================================== stock baseline (not remit)


def stock_run_and_hang(path: str, ledger: str, conn: Connection) -> None:
    """The order graph on pydantic-graph's own FileStatePersistence; block inside B."""
    from pathlib import Path

    from pydantic_graph.persistence.file import FileStatePersistence

    p: FileStatePersistence[Order, int] = FileStatePersistence(Path(path))
    asyncio.run(order_graph.run(A(), state=Order(), deps=Deps(ledger, "B", conn), persistence=p))


def stock_recover(path: str, ledger: str) -> tuple[Any, ...]:
    from pathlib import Path

    from pydantic_graph.persistence.file import FileStatePersistence

    async def go() -> tuple[Any, ...]:
        p: FileStatePersistence[Order, int] = FileStatePersistence(Path(path))
        try:
            async with order_graph.iter_from_persistence(p, deps=Deps(ledger)) as run:
                async for _ in run:
                    pass
        except GraphRuntimeError as exc:
            return ("unrecoverable", type(exc).__name__, str(exc))
        return ("ok", run.result.output if run.result else None)

    return asyncio.run(go())
