"""The CrewAI flows of ``remit check`` (no LLM); the contract tests use parts of them too.

Every method entry and every real call of an ``@effect`` body appends one line to a
ledger file (:func:`remit_check.harness.note`), so counts survive SIGKILL. A state's
``hang`` names the kill point at which a child reports to the parent (over the pipe
given to :func:`kill_pipe`) and blocks.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from remit_check.crewai import LAYERS, quiet_crewai

quiet_crewai()

from crewai.flow.async_feedback.types import HumanFeedbackPending, PendingFeedbackContext  # noqa: E402
from crewai.flow.flow import Flow, listen, start  # noqa: E402
from crewai.flow.human_feedback import human_feedback  # noqa: E402
from crewai.flow.persistence import persist  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from remit_check.harness import Layer, hold, note, use_layer  # noqa: E402
from remit_core import effect  # noqa: E402

_conn: Connection | None = None


def kill_pipe(conn: Connection | None) -> None:
    """In a child: the pipe on which a kill point is reported (None: no kill point)."""
    global _conn
    _conn = conn


def _hang(state: Any, point: str) -> None:
    if state.hang == point:
        hold(_conn, point)


@effect(name="check-charge")
def charge(ledger: str, amount: int, *, idempotency_key: str = "") -> str:
    txn = f"txn-{uuid.uuid4().hex[:10]}"  # like a payment API: a new id per real call
    note(ledger, f"effect charge {txn}")
    return txn


@effect(name="check-ship")
def ship(ledger: str, what: str, *, idempotency_key: str = "") -> str:
    note(ledger, f"effect ship {what}")
    return f"shipped {what}"


class OrderState(BaseModel):
    ledger: str = ""
    hang: str = ""
    count: int = 0
    value: Any = 1
    txn: str = ""


class ApprovalState(BaseModel):
    ledger: str = ""
    hang: str = ""
    shipped: str = ""


class Park:
    """A feedback provider that parks the flow (an asynchronous human in the loop)."""

    def request_feedback(self, context: PendingFeedbackContext, flow: Any) -> str:
        raise HumanFeedbackPending(context=context)




@functools.cache
def flows(layer: Layer, directory: str) -> dict[str, Any]:
    """The flows on one layer's store. The store URL travels as an argument: a fork
    server's children inherit the environment of its start, not the parent's."""
    from remit_crewai import durable

    factory = layer[0]
    backend = use_layer(layer)(directory)
    remit = factory == LAYERS["remit"] or "RemitFlowPersistence" in type(backend).__name__
    wrap: Callable[[Any], Any] = durable if remit else (lambda cls: cls)

    @wrap
    @persist(backend)
    class OrderFlow(Flow[OrderState]):
        _skip_auto_memory = True  # CrewAI's agent memory: unused, and slow to build

        @start()
        def begin(self) -> str:
            note(self.state.ledger, "enter begin")
            self.state.count += 1
            return "begun"

        @listen(begin)
        def pay(self, _: str) -> str:
            note(self.state.ledger, "enter pay")
            self.state.txn = charge(self.state.ledger, 10)
            _hang(self.state, "after-effect")
            self.state.count = self.state.value  # the CV fault when value is not an int
            return str(self.state.txn)

        @listen(pay)
        def slow(self, txn: str) -> str:
            note(self.state.ledger, "enter slow")
            _hang(self.state, "between")
            return f"done {txn}"

    @wrap
    @persist(backend)
    class ReviewFlow(Flow[ApprovalState]):
        _skip_auto_memory = True

        @start()
        @human_feedback(message="ship?", provider=Park())
        def draft(self) -> str:
            return "draft"

        @listen(draft)
        def deliver(self, result: Any) -> str:
            note(self.state.ledger, f"enter deliver {result.feedback}")
            self.state.shipped = ship(self.state.ledger, result.feedback)
            _hang(self.state, "deliver")
            return str(self.state.shipped)

    # "durable": the flows are remit's (a fork is remit's explicit fork, not CrewAI's)
    return {"order": OrderFlow, "review": ReviewFlow, "backend": backend, "durable": remit}

__all__ = ["ApprovalState", "OrderState", "Park", "charge", "flows", "kill_pipe", "ship"]
