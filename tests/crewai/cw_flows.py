"""CrewAI flows and child-process bodies for the contract tests (no LLM).

The oracle is a ledger file: every method entry and every real effect call
appends one line (O_APPEND + fsync), so the counts survive SIGKILL.

The flows take their store from :func:`flows` (one set of classes per store
URL, since ``@persist(backend)`` binds the backend when the class is made).

``stock=True`` builds the same flows on CrewAI's own SQLiteFlowPersistence
with no ``@durable``: the baseline each contract test is seen failing on.

The parking feedback provider (``Park``) and the approval flow's state are
``remit check``'s own (:mod:`remit_check.crewai.flows`); the flows are these tests'.

REMIT_TEST_BREAK switches one protection off in every process that imports
this module:

* ``crewai-receipts``: method bodies get no receipts (PC/EO off).
* ``crewai-claim``: a resume does not claim the parked feedback (CO off).
* ``crewai-cv``: states are stored without validation (CV off).
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import uuid
from multiprocessing.connection import Connection
from typing import Any

from crewai.flow.async_feedback.types import HumanFeedbackPending
from crewai.flow.flow import Flow, and_, listen, or_, router, start
from crewai.flow.human_feedback import human_feedback
from crewai.flow.persistence import persist
from crewai.flow.persistence.sqlite import SQLiteFlowPersistence
from pydantic import BaseModel

from remit_check.crewai.flows import ApprovalState, Park
from remit_check.harness import count, lines  # noqa: F401  (w.count, w.lines, for the tests)
from remit_core.urls import with_options
from remit_crewai import ConsumeConflict, RemitFlowPersistence, durable, effect
from remit_crewai import _durable as _d
from remit_crewai import persistence as _p
from tests.crewai import _env  # noqa: F401  (before crewai)
from tests.workers import note

BREAK = os.environ.get("REMIT_TEST_BREAK", "")
LEASE = 1.0
WAIT = 20 * LEASE

if BREAK == "crewai-receipts":
    _d._wrap_method = lambda name, meth: meth  # type: ignore[assignment]

if BREAK == "crewai-claim":
    async def _no_claim(flow: Any, feedback: str | None, original: Any) -> Any:
        return await original(flow, feedback or "")

    _d._resume = _no_claim  # type: ignore[assignment]
    _p.RemitFlowPersistence.clear_pending_feedback = (  # type: ignore[method-assign]
        lambda self, flow_uuid: None)

if BREAK == "crewai-cv":
    def _unchecked(state: Any, **_: Any) -> dict[str, Any]:
        if isinstance(state, BaseModel):
            return state.model_dump(mode="json", warnings=False)
        return dict(state)

    _p.dump_state = _unchecked  # type: ignore[assignment]
    _d.dump_state = _unchecked  # type: ignore[assignment]

_conn: Connection | None = None


def comparable(result: Any, state: dict[str, Any]) -> str:
    """A run's result and state with what differs between runs (ids, paths, the txn
    a real call mints) masked."""
    txn = state.get("txn") or "<no txn>"
    masked = {k: v for k, v in state.items() if k not in ("id", "ledger", "hang")}
    return repr((result, masked)).replace(txn, "<txn>")


def hang_here(point: str) -> None:
    """Tell the parent the kill point is reached, then wait to be killed."""
    assert _conn is not None
    _conn.send(point)
    _conn.recv()  # never answered: the parent SIGKILLs this process


@effect(name="charge")
def charge(ledger: str, amount: int, *, idempotency_key: str = "") -> str:
    txn = f"txn-{uuid.uuid4().hex[:12]}"  # like a payment API: a new id per real call
    note(ledger, f"effect charge {amount} {txn} {idempotency_key}")
    return txn


@effect(name="ship")
def ship(ledger: str, what: str) -> str:
    note(ledger, f"effect ship {what}")
    return f"shipped {what}"


@effect(name="tick")
def tick(ledger: str, n: int) -> str:
    note(ledger, f"effect tick {n}")
    return f"tick-{n}-{uuid.uuid4().hex[:6]}"


class OrderState(BaseModel):
    ledger: str = ""
    hang: str = ""
    amount: int = 10
    count: int = 0
    txn: str = ""
    log: list[str] = []


class LoopState(BaseModel):
    ledger: str = ""
    hang: str = ""
    n: int = 0
    seen: list[str] = []


def _backend(url: str, stock: bool) -> Any:
    if stock:
        return SQLiteFlowPersistence(db_path=url)
    # a recovery waits for a dead resumer's lease (1 s) instead of raising at once
    return RemitFlowPersistence.from_url(with_options(url, wait=WAIT), lease=LEASE)


@functools.cache
def flows(url: str, stock: bool = False) -> dict[str, type[Flow[Any]]]:
    """The test flows on one store. ``stock``: ``url`` is a SQLite file path for CrewAI's own
    SQLiteFlowPersistence, and the flows are not ``@durable``."""
    backend = _backend(url, stock)
    wrap = (lambda cls: cls) if stock else durable

    @wrap
    @persist(backend)
    class OrderFlow(Flow[OrderState]):
        """begin -> pay (an @effect) -> slow."""

        _skip_auto_memory = True  # CrewAI's agent memory: unused here, and slow to build

        @start()
        def begin(self) -> str:
            note(self.state.ledger, "enter begin")
            self.state.count += 1
            self.state.log.append("begin")
            return "begun"

        @listen(begin)
        def pay(self, _: str) -> str:
            note(self.state.ledger, "enter pay")
            self.state.txn = charge(self.state.ledger, self.state.amount)
            if self.state.hang == "pay":
                hang_here("pay")
            self.state.log.append("pay")
            return self.state.txn

        @listen(pay)
        def slow(self, txn: str) -> str:
            note(self.state.ledger, f"enter slow {txn}")
            if self.state.hang == "slow":
                hang_here("slow")
            self.state.log.append(f"slow {txn}")
            return f"done {txn}"

    @wrap
    @persist(backend)
    class AsyncOrderFlow(Flow[OrderState]):
        """OrderFlow with async method bodies."""

        _skip_auto_memory = True

        @start()
        async def begin(self) -> str:
            note(self.state.ledger, "enter begin")
            self.state.count += 1
            self.state.log.append("begin")
            return "begun"

        @listen(begin)
        async def pay(self, _: str) -> str:
            note(self.state.ledger, "enter pay")
            self.state.txn = await asyncio.to_thread(charge, self.state.ledger,
                                                     self.state.amount)
            self.state.log.append("pay")
            return self.state.txn

        @listen(pay)
        async def slow(self, txn: str) -> str:
            note(self.state.ledger, f"enter slow {txn}")
            if self.state.hang == "slow":
                hang_here("slow")
            self.state.log.append(f"slow {txn}")
            return f"done {txn}"

    @wrap
    @persist(backend)
    class ApprovalFlow(Flow[ApprovalState]):
        """draft parks on human feedback; ship runs after the feedback."""

        _skip_auto_memory = True

        @start()
        @human_feedback(message="approve?", provider=Park())
        def draft(self) -> str:
            note(self.state.ledger, "enter draft")
            return "draft v1"

        @listen(draft)
        def deliver(self, result: Any) -> str:
            feedback = getattr(result, "feedback", str(result))
            note(self.state.ledger, f"enter deliver {feedback}")
            self.state.shipped = ship(self.state.ledger, feedback)
            if self.state.hang == "deliver":
                hang_here("deliver")
            return self.state.shipped

    @wrap
    @persist(backend)
    class RouterFlow(Flow[LoopState]):
        """A cycle through a router: decide -> loop -> decide ... -> finish."""

        _skip_auto_memory = True

        @start()
        def init(self) -> str:
            note(self.state.ledger, "enter init")
            return "init"

        @router(or_(init, "loop"))
        def decide(self) -> str:
            note(self.state.ledger, f"enter decide {self.state.n}")
            return "again" if self.state.n < 3 else "done"

        @listen("again")
        def loop(self) -> int:
            n = self.state.n
            note(self.state.ledger, f"enter loop {n}")
            self.state.seen.append(tick(self.state.ledger, n))
            if self.state.hang == "loop" and n == 2:
                hang_here("loop")
            self.state.n = n + 1
            return n

        @listen("done")
        def finish(self) -> str:
            note(self.state.ledger, "enter finish")
            return f"finished {self.state.n} {self.state.seen}"

    @wrap
    @persist(backend)
    class ParallelFlow(Flow[LoopState]):
        """Two listeners of one start run in parallel; a third joins them."""

        _skip_auto_memory = True

        @start()
        def fan(self) -> str:
            note(self.state.ledger, "enter fan")
            return "fan"

        @listen(fan)
        def left(self, _: str) -> str:
            note(self.state.ledger, "enter left")
            self.state.seen.append(tick(self.state.ledger, 100))
            return "L"

        @listen(fan)
        def right(self, _: str) -> str:
            note(self.state.ledger, "enter right")
            self.state.n += 7
            return "R"

        @listen(and_(left, right))
        def join(self) -> str:
            note(self.state.ledger, "enter join")
            if self.state.hang == "join":
                hang_here("join")
            return f"joined {self.state.n} {self.state.seen}"

    return {c.__name__: c for c in (OrderFlow, AsyncOrderFlow, ApprovalFlow, RouterFlow,
                                    ParallelFlow)}


# ======================================================================= child bodies


def _flow(url: str, name: str, stock: bool) -> Flow[Any]:
    return flows(url, stock)[name]()


def run_and_hang(url: str, name: str, flow_id: str, ledger: str, hang: str,
                 stock: bool = False, *, conn: Connection) -> None:
    """Kick a flow off and stop at ``hang`` (the parent SIGKILLs this process there)."""
    global _conn
    _conn = conn
    _flow(url, name, stock).kickoff(inputs={"id": flow_id, "ledger": ledger, "hang": hang})
    conn.send("finished")


def resume(url: str, name: str, flow_id: str, stock: bool = False,
           ledger: str | None = None) -> tuple[Any, dict[str, Any]]:
    """``kickoff(inputs={"id": ...})`` in a fresh process: the documented resume (with the
    original ``ledger`` input when the run may have died before storing anything)."""
    flow = _flow(url, name, stock)
    extra = {} if ledger is None else {"ledger": ledger}
    result = flow.kickoff(inputs={"id": flow_id, "hang": "", **extra})
    return result, flow.state.model_dump()


def run_clean(url: str, name: str, flow_id: str, ledger: str) -> tuple[Any, dict[str, Any]]:
    flow = _flow(url, name, False)
    result = flow.kickoff(inputs={"id": flow_id, "ledger": ledger})
    return result, flow.state.model_dump()


def park(url: str, flow_id: str, ledger: str, stock: bool = False) -> str:
    result = _flow(url, "ApprovalFlow", stock).kickoff(inputs={"id": flow_id, "ledger": ledger})
    assert isinstance(result, HumanFeedbackPending), result
    return str(result.context.flow_id)


def racer(url: str, flow_id: str, value: str, barrier: Any, results: Any,
          stock: bool = False) -> None:
    """Load the parked flow, wait for the others, resume with ``value``; report the outcome."""
    results.put((value, _race(url, flow_id, value, barrier, stock)))


def _race(url: str, flow_id: str, value: str, barrier: Any, stock: bool) -> str:
    cls = flows(url, stock)["ApprovalFlow"]
    backend = _backend(url, stock)
    try:
        flow = cls.from_pending(flow_id, backend)
    except Exception as exc:
        barrier.wait()
        return f"load {type(exc).__name__}"
    barrier.wait()
    try:
        flow.resume(value)
    except ConsumeConflict:
        return "conflict"
    except Exception as exc:
        return f"error {type(exc).__name__}: {exc}"
    return "won"


def resume_and_hang(url: str, flow_id: str, value: str, *, conn: Connection) -> None:
    """Resume parked feedback, then stop inside ``deliver`` (the parent SIGKILLs)."""
    global _conn
    _conn = conn
    cls = flows(url)["ApprovalFlow"]
    flow = cls.from_pending(flow_id, _backend(url, False))
    flow.state.hang = "deliver"
    flow.resume(value)
    conn.send("finished")


def kill_after(url: str, name: str, flow_id: str, ledger: str, n: int) -> int:
    """Run a flow and SIGKILL this process right after its n-th store write returns
    (n = 0: count the writes of an uncrashed run and return the count)."""
    backend = _backend(url, False)  # the store the flows use
    store = backend.store
    calls = 0
    for op in ("put_checkpoint", "put_writes", "start_receipt", "complete_receipt",
               "release_receipt", "claim_once", "consume_claim", "release_claim"):
        real = getattr(store, op)

        def counted(*args: Any, __real: Any = real, **kwargs: Any) -> Any:
            nonlocal calls
            out = __real(*args, **kwargs)
            calls += 1
            if calls == n:
                os.kill(os.getpid(), signal.SIGKILL)
            return out

        setattr(store, op, counted)
    _flow(url, name, False).kickoff(inputs={"id": flow_id, "ledger": ledger})
    return calls
