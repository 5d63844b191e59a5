"""The LangGraph graphs of ``remit check`` (no LLM); the contract tests use them too.

Every node entry and every real call of an ``@effect`` body appends one line to a
ledger file (:func:`remit_check.harness.note`), so counts survive SIGKILL.
``hold(point)`` marks the kill points: a child that must die there reports the
point to the parent and blocks.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from itertools import pairwise
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt
from pydantic import BaseModel

from remit_check.harness import note
from remit_core import effect


class State(TypedDict):
    x: int
    log: str


class Account(BaseModel):
    """The invalid-state scenario's schema."""

    x: int
    log: str = ""


BAD = "not a number"
"""What the invalid-state scenario's node writes into ``Account.x``."""

Hold = Callable[[str], None]


def _no_hold(point: str) -> None:
    return None


def _line(schema: Any, *nodes: Callable[..., Any]) -> Any:
    """START -> ``nodes`` in their order -> END, on ``schema``; a node is named after its
    function."""
    g: Any = StateGraph(schema)
    for node in nodes:
        g.add_node(node.__name__, node)
    for a, b in pairwise([START, *(node.__name__ for node in nodes), END]):
        g.add_edge(a, b)
    return g


def flow_graph(ledger: str, *, ask: bool = True, hold: Hold = _no_hold) -> Any:
    """a -> b -> c. ``b`` calls ``pay``; with ``ask`` it then parks on ``interrupt()`` and
    calls ``charge`` with the answer. Effects return a fresh transaction id, as a real
    payment provider would. ``hold(point)`` marks the kill points."""

    @effect(name="remit-check-pay")
    def pay(x: int) -> str:
        note(ledger, f"effect pay {x}")
        return f"pay-{x}-{uuid.uuid4().hex[:8]}"

    @effect(name="remit-check-charge")
    def charge(answer: int) -> str:
        note(ledger, f"effect charge {answer}")
        return f"charge-{answer}-{uuid.uuid4().hex[:8]}"

    def a(s: State) -> dict[str, Any]:
        note(ledger, "enter a")
        return {"x": s["x"] + 1}

    def b(s: State) -> dict[str, Any]:
        note(ledger, "enter b")
        paid = pay(s["x"])
        hold("after-pay")
        if not ask:
            return {"log": paid}
        answer = interrupt("approve?")
        note(ledger, f"after-interrupt b {answer}")
        txn = charge(int(answer))
        hold("after-charge")
        return {"x": s["x"] + int(answer), "log": f"{paid},{txn}"}

    def c(s: State) -> dict[str, Any]:
        note(ledger, "enter c")
        hold("start-c")
        return {"log": s["log"] + "!"}

    return _line(State, a, b, c)


def cv_graph(ledger: str, *, hold: Hold = _no_hold) -> Any:
    """ok -> bad (writes a string into the int field) -> c, on a pydantic state."""

    def ok(s: Account) -> dict[str, Any]:
        note(ledger, "enter ok")
        return {"x": s.x + 1}

    def bad(s: Account) -> dict[str, Any]:
        note(ledger, "enter bad")
        return {"x": BAD}

    def c(s: Account) -> dict[str, Any]:
        note(ledger, "enter c")
        return {"log": "done"}

    return _line(Account, ok, bad, c)


def fork_graph(ledger: str, *, hold: Hold = _no_hold) -> Any:
    """a (x+1) -> b (x*2)."""

    def a(s: State) -> dict[str, Any]:
        note(ledger, "enter a")
        return {"x": s["x"] + 1}

    def b(s: State) -> dict[str, Any]:
        note(ledger, "enter b")
        return {"x": s["x"] * 2}

    return _line(State, a, b)


GRAPHS: dict[str, Callable[..., Any]] = {
    "flow": flow_graph,
    "straight": lambda ledger, hold=_no_hold: flow_graph(ledger, ask=False, hold=hold),
    "cv": cv_graph,
    "fork": fork_graph,
}
INPUTS: dict[str, dict[str, Any]] = {
    "flow": {"x": 1, "log": ""}, "straight": {"x": 1, "log": ""},
    "cv": {"x": 1, "log": ""}, "fork": {"x": 1, "log": ""},
}
SCHEMAS: dict[str, Any] = {"cv": Account}

__all__ = ["BAD", "GRAPHS", "INPUTS", "SCHEMAS", "Account", "Hold", "State", "cv_graph",
           "flow_graph", "fork_graph"]
