"""RemitSaver's async path is native: many concurrent ``ainvoke`` with no worker thread.

On PostgreSQL and Redis every store operation of an ``ainvoke`` -- the gate's claim on
resume, the run lifecycle, checkpoints and writes, the effect receipts -- awaits the
backend's async driver on the event loop (:mod:`remit_core.aio`). The tests count, by
instrumentation, every ``asyncio.to_thread`` and ``run_in_executor`` call and every use
of the store's sync connections while the invocations run, and check what they stored.
On SQLite the operations go to the store's own threads, never the default executor.
"""

from __future__ import annotations

import asyncio
import operator
import threading
import uuid
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.graph import START, StateGraph
from langgraph.types import Command, interrupt

from remit_core import ConsumeConflict, RemitError, Store, effect
from remit_langgraph import RemitSaver
from tests.aio_probe import Threads, count_sync_uses

CONCURRENT = 64


class State(TypedDict):
    log: Annotated[list[str], operator.add]
    total: int


charged: list[str] = []
charged_lock = threading.Lock()


@effect
async def charge(order: str, amount: int) -> dict[str, Any]:
    await asyncio.sleep(0)
    with charged_lock:
        charged.append(order)
    return {"order": order, "amount": amount}


def build(saver: RemitSaver) -> Any:
    async def prepare(state: State) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"log": ["prepare"], "total": 3}

    async def approve(state: State) -> dict[str, Any]:
        answer = interrupt({"question": "charge?", "total": state["total"]})
        return {"log": [f"approved:{answer['approved']}:{answer['by']}"]}

    async def pay(state: State, config: RunnableConfig) -> dict[str, Any]:
        receipt = await charge(config["configurable"]["thread_id"], state["total"])
        return {"log": [f"paid:{receipt['amount']}"]}

    return (StateGraph(State).add_node("prepare", prepare).add_node("approve", approve)
            .add_node("pay", pay).add_edge(START, "prepare").add_edge("prepare", "approve")
            .add_edge("approve", "pay").compile(checkpointer=saver))


async def _one(graph: Any, thread_id: str) -> dict[str, Any]:
    config = {"configurable": {"thread_id": thread_id}}
    first = await graph.ainvoke({"log": [], "total": 0}, config)
    assert [i.value for i in first["__interrupt__"]] == [{"question": "charge?", "total": 3}]
    return await graph.ainvoke(Command(resume={"approved": True, "by": thread_id[:6]}), config)


def test_concurrent_ainvoke_never_leaves_the_loop(store: Store, threads: Threads,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    saver = RemitSaver(store)
    graph = build(saver)
    ids = [f"native-{i}-{uuid.uuid4().hex[:8]}" for i in range(CONCURRENT)]
    charged.clear()
    sync_uses = count_sync_uses(store, monkeypatch)

    async def main() -> list[dict[str, Any]]:
        results = await asyncio.gather(*(_one(graph, t) for t in ids))
        # a second delivery of an answered interrupt is refused, on the async path too
        with pytest.raises(ConsumeConflict):
            await graph.ainvoke(Command(resume={"approved": True, "by": "late"}),
                                {"configurable": {"thread_id": ids[0]}})
        return results

    results = asyncio.run(main())
    on_the_loop = [t for t in sync_uses if t == threading.main_thread().name]

    for thread_id, result in zip(ids, results, strict=True):
        assert result["log"] == ["prepare", f"approved:True:{thread_id[:6]}", "paid:3"]
        run = store.get_run(thread_id)
        assert run is not None and run.status == "done", run
        claims = store.list_claims(thread_id)
        assert [c.status for c in claims] == ["consumed"], claims
        receipts = store.list_receipts(thread_id)
        assert [r.status for r in receipts] == ["completed"], receipts
    assert sorted(charged) == sorted(ids)  # each effect fired once
    if store.backend in ("postgres", "redis"):
        assert threads.to_thread == 0
        assert threads.executor == 0
        assert on_the_loop == [], f"{len(on_the_loop)} sync store operations on the loop"
    else:  # SQLite: the store's own threads, through run_in_executor, never to_thread
        assert threads.to_thread == 0
        assert threads.executor > 0


def test_a_cancelled_ainvoke_releases_its_claim_on_the_loop(store: Store,
                                                            threads: Threads) -> None:
    """Cancel an ``ainvoke`` that holds the resume's claim: the claim is released (not
    left to its lease), and the answer can be delivered again at once."""
    saver = RemitSaver(store)
    started = asyncio.Event

    def graph_with_a_slow_node() -> tuple[Any, dict[str, Any]]:
        gate: dict[str, Any] = {}

        async def approve(state: State) -> dict[str, Any]:
            answer = interrupt("ok?")
            if answer == "hang":
                gate["entered"].set()
                await asyncio.Event().wait()  # until cancelled
            return {"log": [f"answer:{answer}"]}

        graph = (StateGraph(State).add_node("approve", approve).add_edge(START, "approve")
                 .compile(checkpointer=saver))
        return graph, gate

    graph, gate = graph_with_a_slow_node()
    config = {"configurable": {"thread_id": f"cancel-{uuid.uuid4().hex[:8]}"}}

    async def main() -> dict[str, Any]:
        gate["entered"] = started()
        await graph.ainvoke({"log": [], "total": 0}, config)
        task = asyncio.ensure_future(graph.ainvoke(Command(resume="hang"), config))
        await gate["entered"].wait()
        held = store.get_claim(store.list_claims(config["configurable"]["thread_id"])[0].key)
        assert held is not None and held.status == "claimed"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        claims = store.list_claims(config["configurable"]["thread_id"])
        assert [c.status for c in claims] == ["released"] or claims == [], claims
        return await graph.ainvoke(Command(resume="again"), config)

    assert asyncio.run(main())["log"] == ["answer:again"]
    if store.backend in ("postgres", "redis"):
        assert threads.to_thread == 0


def test_a_sync_effect_that_would_block_the_loop_is_a_clear_error(store: Store) -> None:
    """A sync ``@effect`` called by an ``async def`` node under durability='async' would
    wait, blocking the loop, for the checkpoint that loop stores in the background (it
    hung until the wait ran out): it is refused at once, saying what to do."""

    @effect
    def notify(who: str) -> str:
        return f"notified {who}"

    async def first(state: State) -> dict[str, Any]:
        return {"log": ["first"]}

    async def second(state: State) -> dict[str, Any]:
        return {"log": [notify("ops")]}

    graph = (StateGraph(State).add_node("first", first).add_node("second", second)
             .add_edge(START, "first").add_edge("first", "second")
             .compile(checkpointer=RemitSaver(store)))
    config = {"configurable": {"thread_id": f"blocking-{uuid.uuid4().hex[:8]}"}}

    with pytest.raises(RemitError, match="Declare the effect 'async def'"):
        asyncio.run(graph.ainvoke({"log": [], "total": 0}, config, durability="async"))
    # under durability='sync' the checkpoint is stored before the node runs: it works
    config = {"configurable": {"thread_id": f"blocking-{uuid.uuid4().hex[:8]}"}}
    done = asyncio.run(graph.ainvoke({"log": [], "total": 0}, config, durability="sync"))
    assert done["log"] == ["first", "notified ops"]
