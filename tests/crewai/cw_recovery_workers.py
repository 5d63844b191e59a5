"""Child-process bodies for the CrewAI recovery tests: flows killed mid-method, and
recoverers.

``RecoveryFlow`` starts with ``a``; the router ``route`` sends it on by its ``mode``:

* ``pay``: ``b`` (the effect ``charge``) -> ``c`` (a kill point);
* ``ship`` (flow ids ``ship...``): ``send`` calls the effect ``ship``, which takes no
  idempotency key (a kill point inside the call: the effect is left in doubt);
* ``asking``: ``ask`` parks on human feedback with ``emit`` options (left parked);
* ``reviewing``: ``review`` parks on human feedback -> ``after`` (a kill point on resume).

``InputsFlow`` (:func:`inputs_flow`) reads its kickoff's inputs in its first method,
``first`` (a kill point), and writes to a ledger fixed with the class (not a state
field: what a recovery restores is what is checked).

A child that must die runs its flows until each killable one is at its kill point,
reports that through a pipe, and blocks until the parent SIGKILLs it. The oracle is a
ledger file (O_APPEND + fsync): every method entry and every real effect call appends
one line, so the counts survive SIGKILL.

Recoverers (:func:`recoverer`, :func:`chaos_recoverer`) run in processes of their own;
``broken`` (REMIT_TEST_BREAK=recovery) switches the atomic take off in them.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

from crewai.flow.async_feedback.types import HumanFeedbackPending
from crewai.flow.flow import Flow, listen, router, start
from crewai.flow.human_feedback import human_feedback
from crewai.flow.persistence import persist
from pydantic import BaseModel

from remit_check.crewai.flows import Park
from remit_crewai import RemitFlowPersistence, arecover, durable, effect, fork, recover
from tests.crewai import _env  # noqa: F401  (before crewai)
from tests.workers import break_recovery, note, recover_until_done

NAME = "RecoveryFlow"
#: the lease of the executors that die: their flows read as abandoned a second later
LEASE = 1.0
#: the lease of the chaos test's recoverers: a killed one's flows are taken over once it
#: runs out; long enough that a live one, slowed on a loaded machine, renews in time
RECOVERER_LEASE = 3.0
#: the passes a chaos recoverer makes at most: a handful find work when each flow is
#: taken once (its own, then the killed recoverers'); without the atomic take its
#: flows read as abandoned after every pass
PASSES = 10

#: set in a child that must stop at a kill point: called with (method, flow id)
_stop: Any = None


class RState(BaseModel):
    ledger: str = ""
    mode: str = "pay"
    txn: str = ""
    shipment: dict[str, str] = {}
    log: list[str] = []


@effect(name="charge")
def charge(ledger: str, flow_id: str, *, idempotency_key: str) -> str:
    note(ledger, f"effect charge {flow_id} {os.getpid()}")
    return f"txn-{flow_id}"


@effect(name="ship")
def ship(ledger: str, flow_id: str) -> dict[str, str]:
    # no idempotency key: a call cut short by a crash is in doubt, not run again
    note(ledger, f"effect ship {flow_id} {os.getpid()}")
    _halt("ship", flow_id)
    return {"shipped": flow_id, "carrier": "parcel-co"}


def _halt(method: str, flow_id: str) -> None:
    if _stop is not None:
        _stop(method, flow_id)


@functools.cache
def flows(url: str, lease: float | None = None) -> dict[str, type[Flow[Any]]]:
    """The test flows on one store (``lease``: the store's lease in this process)."""
    backend = RemitFlowPersistence.from_url(url, lease=lease)

    @durable
    @persist(backend)
    class RecoveryFlow(Flow[RState]):
        _skip_auto_memory = True  # CrewAI's agent memory: unused here, and slow to build

        @start()
        def a(self) -> str:
            note(self.state.ledger, f"enter a {self.state.id}")
            self.state.log.append("a")
            return "a"

        @router(a)
        def route(self) -> str:
            return self.state.mode

        @listen("pay")
        def b(self) -> str:
            note(self.state.ledger, f"enter b {self.state.id}")
            self.state.txn = charge(self.state.ledger, self.state.id)
            self.state.log.append("b")
            return self.state.txn

        @listen(b)
        def c(self, txn: str) -> str:
            note(self.state.ledger, f"enter c {self.state.id} {os.getpid()}")
            _halt("c", self.state.id)
            self.state.log.append("c")
            return f"done {txn}"

        @listen("ship")
        def send(self) -> str:
            note(self.state.ledger, f"enter send {self.state.id} {os.getpid()}")
            self.state.shipment = ship(self.state.ledger, self.state.id)
            self.state.log.append(f"sent {self.state.shipment['shipped']}")
            return f"shipped {self.state.shipment['shipped']}"

        @listen("asking")
        @human_feedback(message="ship it?", emit=["approved", "rejected"],
                        default_outcome="approved", provider=Park())
        def ask(self) -> str:
            note(self.state.ledger, f"enter ask {self.state.id}")
            return "the order"

        @listen("reviewing")
        @human_feedback(message="review?", provider=Park())
        def review(self) -> str:
            note(self.state.ledger, f"enter review {self.state.id}")
            return "the draft"

        @listen(review)
        def after(self, result: Any) -> str:
            feedback = getattr(result, "feedback", str(result))
            note(self.state.ledger, f"enter after {self.state.id} {feedback} {os.getpid()}")
            _halt("after", self.state.id)
            self.state.log.append(f"after {feedback}")
            return f"reviewed {feedback}"

    @durable
    @persist(backend)
    class OtherFlow(Flow[RState]):
        _skip_auto_memory = True

        @start()
        def a(self) -> str:
            return "other"

    return {"RecoveryFlow": RecoveryFlow, "OtherFlow": OtherFlow}


class IState(BaseModel):
    amount: int = 0
    note: str = ""
    log: list[str] = []


@functools.cache
def inputs_flow(url: str, ledger: str, lease: float | None = None) -> type[Flow[Any]]:
    """A flow whose first method reads the kickoff's inputs (``amount``, ``note``)."""
    backend = RemitFlowPersistence.from_url(url, lease=lease)

    @durable
    @persist(backend)
    class InputsFlow(Flow[IState]):
        _skip_auto_memory = True

        @start()
        def first(self) -> str:
            seen = f"{self.state.amount} {self.state.note or '-'}"
            note(ledger, f"enter first {self.state.id} {seen} {os.getpid()}")
            _halt("first", self.state.id)
            self.state.log.append(f"first {seen}")
            return seen

        @listen(first)
        def second(self, seen: str) -> str:
            note(ledger, f"enter second {self.state.id} {seen}")
            self.state.log.append("second")
            return f"second after {seen}"

    return InputsFlow


def recovery_flow(url: str, lease: float | None = None) -> type[Flow[Any]]:
    return flows(url, lease)["RecoveryFlow"]


def worker_app() -> type[Flow[Any]]:
    """``remit worker --app``'s target: the flow class, whose own ``@persist`` backend is
    on $REMIT_TEST_CLASS_STORE, a store that holds no flow: only a worker that builds
    the flows with its ``--store`` finds the killed ones."""
    return recovery_flow(os.environ["REMIT_TEST_CLASS_STORE"])


def killable(specs: list[str]) -> list[str]:
    return sorted(s for s in specs if not s.startswith(("done:", "park:")))


def inputs(flow_id: str, ledger: str) -> dict[str, str]:
    """A killable flow's kickoff inputs: ``ship...`` flows go to ``send``, others pay."""
    return {"id": flow_id, "ledger": ledger,
            "mode": "ship" if flow_id.startswith("ship") else "pay"}


# ======================================================================= child bodies


def die_in_c(url: str, ledger: str, specs: list[str], conn: Connection,
             api: str = "kickoff") -> None:
    """Run every killable flow (all at once, each on its own thread or task) to method c;
    report once all are there, then block until SIGKILLed. ``done:<id>`` flows run to
    the end first, ``park:<id>`` ones park on human feedback (with ``emit`` options)."""
    global _stop
    arrived: list[str] = []
    lock = threading.Lock()
    all_there = threading.Event()
    kill = killable(specs)

    def stop(method: str, flow_id: str) -> None:
        with lock:
            arrived.append(flow_id)
            if len(arrived) == len(kill):
                all_there.set()
        threading.Event().wait()  # until the process is killed

    flow = recovery_flow(url, LEASE)
    for s in specs:
        if s.startswith("done:"):
            flow().kickoff(inputs={"id": s, "ledger": ledger})
        elif s.startswith("park:"):
            parked = flow().kickoff(inputs={"id": s, "ledger": ledger, "mode": "asking"})
            assert isinstance(parked, HumanFeedbackPending), parked
    _stop = stop
    if api == "kickoff_async":
        loop = asyncio.new_event_loop()
        # sync methods run on the loop's default executor: one thread per blocked c
        loop.set_default_executor(ThreadPoolExecutor(2 * len(kill) + 4))
        threading.Thread(target=loop.run_forever, daemon=True).start()
        for t in kill:
            asyncio.run_coroutine_threadsafe(
                flow().kickoff_async(inputs=inputs(t, ledger)), loop)
    else:
        for t in kill:
            threading.Thread(target=flow().kickoff, kwargs={"inputs": inputs(t, ledger)},
                             daemon=True).start()
    all_there.wait()
    conn.send(("in c", sorted(arrived)))
    conn.recv()  # blocks until the parent kills this process


def resume_and_die(url: str, flow_id: str, value: str, conn: Connection) -> None:
    """Resume the parked review of ``flow_id`` with ``value``; report from inside
    ``after`` and block there until SIGKILLed."""
    global _stop

    def stop(method: str, fid: str) -> None:
        conn.send(("in after", fid))
        threading.Event().wait()

    _stop = stop
    flow = recovery_flow(url, LEASE)
    flow.from_pending(flow_id, RemitFlowPersistence.from_url(url, lease=LEASE)).resume(value)
    conn.send(("finished", flow_id))


def die_in_first(url: str, ledger: str, how: str, flow_id: str, inputs: dict[str, Any],
                 conn: Connection) -> None:
    """Start ``flow_id`` of :func:`inputs_flow` with ``inputs`` and report from inside its
    first method (``("in first", flow id)``), then block until SIGKILLed. ``how``:
    ``kickoff``, or ``fork`` (``flow_id`` is the source: the fork of it with ``inputs``)."""
    global _stop

    def stop(method: str, fid: str) -> None:
        conn.send(("in first", fid))
        threading.Event().wait()

    _stop = stop
    flow = inputs_flow(url, ledger, LEASE)
    if how == "fork":
        fork(flow(), flow_id, inputs)
    else:
        flow().kickoff(inputs={"id": flow_id, **inputs})
    conn.send(("finished", flow_id))


def resume_until_lifecycle(url: str, flow_ids: list[str], value: str, lease: float,
                           conn: Connection) -> None:
    """Resume the parked reviews of ``flow_ids`` with ``value`` (one thread each) on a store
    of lease ``lease``, and stop each between its claim on the feedback and the record of
    its execution (its ``start_run``): report ``("claimed", flow_ids)`` once all are there
    and block. An answer on ``conn`` lets them go on; then report ``("finished", {flow id:
    result})``."""
    backend = RemitFlowPersistence.from_url(url, lease=lease)
    store = backend.store  # the store the flows use (one per URL and lease)
    real = store.start_run
    arrived: list[str] = []
    lock = threading.Lock()
    all_there, go = threading.Event(), threading.Event()

    def gate(run_id: str, **kwargs: Any) -> Any:
        if run_id in flow_ids:
            # the resume claimed the feedback already (the claim comes first)
            with lock:
                arrived.append(run_id)
                if len(arrived) == len(flow_ids):
                    all_there.set()
            go.wait()
        return real(run_id, **kwargs)

    store.start_run = gate  # type: ignore[method-assign]
    flow = recovery_flow(url, lease)
    results: dict[str, Any] = {}

    def resume(fid: str) -> None:
        results[fid] = flow.from_pending(fid, backend).resume(value)

    threads = [threading.Thread(target=resume, args=(f,), daemon=True) for f in flow_ids]
    for t in threads:
        t.start()
    all_there.wait()
    conn.send(("claimed", sorted(arrived)))
    conn.recv()  # a dying one blocks here until the parent kills it
    go.set()
    for t in threads:
        t.join()
    conn.send(("finished", results))


def recoverer(url: str, barrier: Any, results: Any, api: str, broken: bool) -> None:
    """Call recover (or arecover) at the same moment as the other recoverers and report
    what it recovered. ``broken``: the protection off -- each recoverer decides by a read
    whether a run is abandoned and takes it without the atomic recovery."""
    flow = recovery_flow(url)
    if broken:
        # the store the flows use
        break_recovery(RemitFlowPersistence.from_url(url).store)
    barrier.wait()
    report = asyncio.run(arecover(flow)) if api == "kickoff_async" else recover(flow)
    results.put((os.getpid(), sorted(report.recovered), sorted(report.failed),
                 sorted(report.skipped)))


def chaos_recoverer(url: str, flow_ids: list[str], barrier: Any, results: Any, kills: Any,
                    killed: Any, die: bool, broken: bool) -> None:
    """A recoverer in the chaos test. ``die``: it stops inside method c of the first flow
    it continues, reports that (its pid and the flow id) on ``kills``, and blocks until
    the parent SIGKILLs it. Otherwise its method c waits until the parent has killed the
    dying ones (so that they do take flows), and it recovers pass after pass until every
    flow is done (the killed recoverers' flows read as abandoned once their lease,
    :data:`RECOVERER_LEASE`, runs out), at most :data:`PASSES` passes; it reports what
    it recovered and failed, and why it stopped."""
    global _stop

    def stop_dying(method: str, flow_id: str) -> None:
        kills.put((os.getpid(), flow_id))
        threading.Event().wait()

    _stop = stop_dying if die else (lambda method, flow_id: killed.wait(120))
    flow = recovery_flow(url, RECOVERER_LEASE)
    # the store the flows use (the backends of one URL and lease share one)
    backend = RemitFlowPersistence.from_url(url, lease=RECOVERER_LEASE)
    store = backend.store
    if broken:
        break_recovery(store)
    barrier.wait()
    results.put((os.getpid(), *recover_until_done(store, flow_ids, lambda: recover(flow),
                                                  PASSES)))
