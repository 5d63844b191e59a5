"""The pydantic-graph graphs of ``remit check`` (no LLM); the contract tests use the
order and bulk graphs too.

Every node entry and every real call of an ``@effect`` body appends one line to a
ledger file (:func:`remit_check.harness.note`), so counts survive SIGKILL. The
order graph is ``A -> B -> C``: ``B`` calls the effect ``charge``; with
``Deps.hang == "B"`` it then reports ``"charged"`` over ``Deps.conn`` and blocks
there until the parent kills the process; with ``"invalid"`` it writes a string
into the ``int`` field (the CV fault).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from pydantic_graph import BaseNode, End, GraphRunContext
from pydantic_graph.graph import Graph

from remit_check.harness import hold, note
from remit_core import effect


@dataclass
class Deps:
    ledger: str
    hang: str | None = None  # "B": block inside B after its effect; other kill points: the caller's
    conn: Connection | None = None


@dataclass
class Order:
    x: int = 0
    log: list[str] = field(default_factory=list)


@effect(name="charge")
def charge(ledger: str, amount: int, *, idempotency_key: str = "") -> str:
    note(ledger, f"effect charge {amount} {os.getpid()}")  # the pid: which process called
    return f"txn-{amount}"


@dataclass
class A(BaseNode[Order, Deps, int]):
    async def run(self, ctx: GraphRunContext[Order, Deps]) -> B:
        note(ctx.deps.ledger, "enter A")
        ctx.state.x += 1
        return B(amount=ctx.state.x * 10)


@dataclass
class B(BaseNode[Order, Deps, int]):
    amount: int

    async def run(self, ctx: GraphRunContext[Order, Deps]) -> C:
        note(ctx.deps.ledger, "enter B")
        ctx.state.log.append(charge(ctx.deps.ledger, self.amount))
        if ctx.deps.hang == "B":
            hold(ctx.deps.conn, "charged")  # the parent SIGKILLs this process here
        ctx.state.x += self.amount
        if ctx.deps.hang == "invalid":
            ctx.state.x = "eleven"  # type: ignore[assignment]  # the CV fault
        return C()


@dataclass
class C(BaseNode[Order, Deps, int]):
    async def run(self, ctx: GraphRunContext[Order, Deps]) -> End[int]:
        note(ctx.deps.ledger, "enter C")
        ctx.state.log.append("C")
        return End(ctx.state.x)


order_graph = Graph[Order, Deps, int](nodes=[A, B, C])
CLEAN = (11, Order(x=11, log=["txn-10", "C"]))  # the output and state of an uncrashed run


@effect(name="check-grant")
def grant(ledger: str, *, idempotency_key: str = "") -> str:
    note(ledger, "effect grant")
    return "granted"


@dataclass
class Ask(BaseNode[Order, Deps, str]):
    async def run(self, ctx: GraphRunContext[Order, Deps]) -> Answer:
        return Answer()


@dataclass
class Answer(BaseNode[Order, Deps, str]):
    async def run(self, ctx: GraphRunContext[Order, Deps]) -> Evaluate:
        raise RuntimeError("the answer comes from outside: Answer never runs")


@dataclass
class Evaluate(BaseNode[Order, Deps, str]):
    answer: str

    async def run(self, ctx: GraphRunContext[Order, Deps]) -> End[str]:
        note(ctx.deps.ledger, f"enter Evaluate {self.answer}")
        ctx.state.log.append(grant(ctx.deps.ledger))
        return End(self.answer)


question_graph = Graph[Order, Deps, str](nodes=[Ask, Answer, Evaluate])

STEPS = 10
BLOB = 1 << 20


@dataclass
class Bulk:
    n: int = 0
    blob: str = ""


@dataclass
class Step(BaseNode[Bulk, None, int]):
    i: int

    async def run(self, ctx: GraphRunContext[Bulk]) -> Step | End[int]:
        ctx.state.n += 1
        ctx.state.blob = f"{self.i:08d}" * (BLOB // 8)
        return Step(self.i + 1) if self.i + 1 < STEPS else End(ctx.state.n)


bulk_graph = Graph[Bulk, None, int](nodes=[Step])


GRAPHS: dict[str, Graph[Any, Any, Any]] = {"order": order_graph, "bulk": bulk_graph}


__all__ = ["BLOB", "CLEAN", "GRAPHS", "STEPS", "A", "Answer", "Ask", "B", "Bulk", "C", "Deps",
           "Evaluate", "Order", "Step", "bulk_graph", "charge", "grant", "order_graph",
           "question_graph"]
