"""pydantic-graph's async persistence is native: concurrent runs with no worker thread.

RemitStatePersistence's every store operation (snapshots, the node claims, the run
lifecycle, the receipts of an async ``@effect``) awaits the backend's async driver on
the loop on PostgreSQL and Redis; on SQLite it goes to the store's own threads. The
instrumentation is that of the LangGraph twin (``tests/aio_probe.py``).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from dataclasses import dataclass, field

import pytest
from pydantic_graph import BaseNode, End, GraphRunContext
from pydantic_graph.graph import Graph

from remit_core import Store, effect
from remit_pydantic_graph import RemitStatePersistence
from tests.aio_probe import Threads, count_sync_uses

CONCURRENT = 32
charged: list[str] = []
lock = threading.Lock()


@effect(name="native-charge")
async def charge(order: str) -> str:
    await asyncio.sleep(0)
    with lock:
        charged.append(order)
    return f"txn-{order}"


@dataclass
class Order:
    order: str = ""
    log: list[str] = field(default_factory=list)


@dataclass
class Price(BaseNode[Order]):
    async def run(self, ctx: GraphRunContext[Order]) -> Pay:
        ctx.state.log.append("price")
        return Pay()


@dataclass
class Pay(BaseNode[Order]):
    async def run(self, ctx: GraphRunContext[Order]) -> Ship:
        ctx.state.log.append(await charge(ctx.state.order))
        return Ship()


@dataclass
class Ship(BaseNode[Order, None, str]):
    async def run(self, ctx: GraphRunContext[Order]) -> End[str]:
        ctx.state.log.append("ship")
        return End(ctx.state.order)


graph = Graph(nodes=[Price, Pay, Ship], name="native-async-orders")


def test_concurrent_runs_never_leave_the_loop(store: Store, threads: Threads,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    orders = [f"o{i}-{uuid.uuid4().hex[:8]}" for i in range(CONCURRENT)]
    charged.clear()
    sync_uses = count_sync_uses(store, monkeypatch)

    async def one(order: str) -> tuple[str, list[str]]:
        state = Order(order)
        result = await graph.run(Price(), state=state,
                                 persistence=RemitStatePersistence(store, run_id=order))
        return result.output, state.log

    async def main() -> list[tuple[str, list[str]]]:
        return await asyncio.gather(*(one(o) for o in orders))

    results = asyncio.run(main())
    on_the_loop = [t for t in sync_uses if t == threading.main_thread().name]

    for order, (output, log) in zip(orders, results, strict=True):
        assert (output, log) == (order, ["price", f"txn-{order}", "ship"])
        run = store.get_run(order)
        assert run is not None and run.status == "done", run
        assert [r.status for r in store.list_receipts(order)] == ["completed"]
    assert sorted(charged) == sorted(orders)
    assert threads.to_thread == 0
    if store.backend in ("postgres", "redis"):
        assert threads.executor == 0
        assert on_the_loop == [], f"{len(on_the_loop)} sync store operations on the loop"
    else:
        assert threads.executor > 0
