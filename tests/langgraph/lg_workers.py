"""LangGraph graphs and child-process bodies for the contract tests (no LLM).

The oracle is a ledger file: every node entry and every real effect call
appends one line (O_APPEND + fsync), so counts survive SIGKILL.
"""

from __future__ import annotations

import os
from multiprocessing.connection import Connection
from typing import Any

from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from remit_check.langgraph.graphs import State  # remit check's state: {x: int, log: str}
from remit_langgraph import ConsumeConflict, RemitSaver, _contract, effect
from tests.workers import note

if os.environ.get("REMIT_TEST_BREAK") == "langgraph-gate":  # protection off, in every process
    _contract.ConsumeGate.on_load = lambda self, config, found, loop: found  # type: ignore[method-assign]
if os.environ.get("REMIT_TEST_BREAK") == "langgraph-ids":  # RD off: LangGraph's uuid6 ids
    _contract.derived_checkpoint_id = lambda loop, parent, channels, step, new: None


def build(ledger: str, *, hang: Connection | None = None) -> StateGraph:
    """A -> B (effect, interrupt, gated effect) -> C. ``hang``: B blocks after its gated
    effect until the parent kills the process."""

    @effect(name="prepare")
    def prepare(x: int, *, idempotency_key: str) -> str:
        note(ledger, f"effect prepare {x}")
        return f"prep-{x}"

    @effect(name="charge")
    def charge(x: int, *, idempotency_key: str) -> str:
        note(ledger, f"effect charge {x} {os.getpid()}")
        return f"txn-{x}"

    def a(s: State) -> dict[str, Any]:
        note(ledger, "enter A")
        return {"x": s["x"] + 1}

    def b(s: State) -> dict[str, Any]:
        prep = prepare(s["x"])
        answer = interrupt({"question": "approve?", "prep": prep})
        note(ledger, f"after-interrupt B {answer} {os.getpid()}")
        txn = charge(answer)
        if hang is not None:
            hang.send("charged")
            hang.recv()
        return {"x": s["x"] + int(answer), "log": txn}

    def c(s: State) -> dict[str, Any]:
        note(ledger, f"enter C {os.getpid()}")
        return {"log": s["log"] + "!"}

    g = StateGraph(State)
    g.add_node("a", a)
    g.add_node("b", b)
    g.add_node("c", c)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", "c")
    g.add_edge("c", END)
    return g


def park(url: str, thread: str, ledger: str) -> Any:
    with RemitSaver.from_conn_string(url, lease=2.0) as saver:
        app = build(ledger).compile(checkpointer=saver)
        return app.invoke({"x": 1, "log": ""}, {"configurable": {"thread_id": thread}})


def resume_racer(url: str, thread: str, value: Any, ledger: str, barrier: Any, results: Any,
                 use_map: bool) -> None:
    with RemitSaver.from_conn_string(url, lease=5.0) as saver:
        app = build(ledger).compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": thread}}
        resume: Any = value
        if use_map:
            (pending,) = app.get_state(cfg).interrupts
            resume = {pending.id: value}
        barrier.wait()
        try:
            out = app.invoke(Command(resume=resume), cfg)
            results.put(("ok", value, out))
        except ConsumeConflict as exc:
            results.put(("conflict", value, {"owner": exc.owner, "status": exc.status}))


def reader(url: str, thread: str, barrier: Any, results: Any, rounds: int) -> None:
    with RemitSaver.from_conn_string(url) as saver:
        app = build(os.devnull).compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": thread}}
        barrier.wait()
        seen = 0
        for _ in range(rounds):
            app.get_state(cfg)
            seen += len(list(app.get_state_history(cfg)))
        results.put(("reader", rounds, seen))


def resume_and_hang(url: str, thread: str, value: Any, ledger: str, conn: Connection) -> None:
    with RemitSaver.from_conn_string(url, lease=1.0) as saver:
        app = build(ledger, hang=conn).compile(checkpointer=saver)
        app.invoke(Command(resume=value), {"configurable": {"thread_id": thread}})


def recover(url: str, thread: str, ledger: str) -> Any:
    with RemitSaver.from_conn_string(url, lease=1.0) as saver:
        app = build(ledger).compile(checkpointer=saver)
        return app.invoke(None, {"configurable": {"thread_id": thread}})
