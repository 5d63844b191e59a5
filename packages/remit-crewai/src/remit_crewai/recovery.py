"""Recover CrewAI flows whose process died, without knowing their ids.

Every kickoff and resume of a ``@durable`` flow keeps its flow id's lifecycle in the
store (running, parked, done, failed; see :mod:`remit_core.recovery` and
:mod:`remit_crewai._durable`) under the flow's name: its ``name`` (CrewAI's field) if the
class gives one, else the class's name. A flow whose process was killed mid-method reads
as *abandoned* once its lease runs out. :func:`recover` finds the abandoned flows of one
class, takes each (of k recoverers racing, across processes and hosts, exactly one takes
a flow) and continues it the way ``@durable`` resumes a flow:
``FlowClass().kickoff(inputs={"id": flow_id})`` under its own id. Completed methods are
not run again (their receipts give their outputs and state), effects with receipts
return them, and a resume of parked feedback that died is finished with the value it
claimed.

    from remit_crewai import recover

    report = recover(OrderFlow)      # or: await arecover(OrderFlow)
    print(report)                    # 3 recovered, 0 failed, ...

``remit worker --app myapp.flows:OrderFlow --store URL`` recovers them continuously
(:func:`recoverable` is its entry point ``crewai.recover``).

A resume that claimed parked feedback and died before its execution was recorded
leaves the run ``parked`` (the claim comes first, so that of k racing deliveries one
wins; the lifecycle is taken once it has). So a pass also looks for the feedback claims
of the class's parked flows that are held under a lease that ran out
(:meth:`remit_core.Store.list_lapsed_claims`, an indexed read of the lapsed claims, not
of every parked flow): each such flow is abandoned too, and is finished with the claimed
value (:func:`remit_crewai._durable.afinish_claimed`: the take-over of the claim is
atomic, so of k recoverers one finishes it; a claim a live resume renews is never
taken). The claim's fence counts the resumes that held it; once ``max_attempts`` of
them died before recording an execution, the flow is reported exhausted and left parked
with its claim, for a person (``remit inspect``).

Plain flows (``@persist(RemitFlowPersistence...)`` without ``@durable``) keep no
lifecycle: continuing one would run its completed methods again, so there is nothing a
recovery could safely do with it.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from crewai.flow.flow import Flow

from remit_core import ConsumeConflict, RemitError, Store
from remit_core.adapter import (
    DEFAULT_MAX_ATTEMPTS,
    RecoveryReport,
    RunState,
    aio,
    apoll,
    arecover_runs,
    ending,
    poll,
    recover_runs,
)
from remit_crewai._durable import afinish_claimed, finish_claimed, persistence_of
from remit_crewai._seam import class_name
from remit_crewai.persistence import FRAMEWORK, RemitFlowPersistence


def _flows(flow_class: Any, persistence: RemitFlowPersistence | None
           ) -> tuple[RemitFlowPersistence, Callable[[], Any]]:
    """The backend the class's flows use, and how to make one of them."""
    if not isinstance(flow_class, type) or not flow_class.__dict__.get("__remit_durable__"):
        raise TypeError(
            f"recover() needs a @durable flow class, not {flow_class!r}: only @durable "
            "flows keep the run lifecycle (a plain flow's completed methods would run "
            "again), so decorate the class with @durable above @persist(...)")

    def make() -> Any:
        return flow_class() if persistence is None else flow_class(persistence=persistence)

    return persistence_of(make()), make


def _held(exc: ConsumeConflict) -> bool:
    """The flow's parked feedback is still claimed by its dead resumer, whose claim lease
    is about to run out (it is renewed with the run's, a moment apart): wait for it."""
    return exc.status == "claimed"


def _within(store: Store) -> float:
    return 2 * store.lease


log = logging.getLogger("remit.recovery")

#: parked runs listed at a time when looking for dead resumes
PAGE = 100


def _dead_resumes(store: Store, name: str) -> dict[str, int]:
    """The parked flows named ``name`` that hold a feedback claim whose lease ran out (a
    resume claimed it and died before its execution was recorded), each with the most
    resumes that held one of its claims (the claim's fence). A hint: the take-over
    itself is decided by the store (:func:`afinish_claimed`). In a random order, so that
    recoverers listing the same flows do not all race for the first one."""
    found: dict[str, int] = {}
    after = None
    while True:
        page = store.list_lapsed_claims(framework=FRAMEWORK, name=name, limit=PAGE,
                                        after=after)
        for claim in page:
            found[claim.run_id] = max(found.get(claim.run_id, 0), claim.fence)
        if len(page) < PAGE:
            return dict(random.sample(list(found.items()), len(found)))
        after = page[-1]


#: the exhausted dead resumes this process has warned about, as (store URL, run, fence):
#: a worker passing over them every few seconds warns once per flow (each report still
#: lists it)
_warned: set[tuple[str, str, int]] = set()
_warned_lock = threading.Lock()
WARNED_MAX = 10_000


def _spent(store: Store, run_id: str, fence: int, max_attempts: int,
           report: RecoveryReport) -> bool:
    """``max_attempts`` resumes of the flow's feedback held its claim and recorded no
    execution (they died first): report the flow exhausted and leave it parked with the
    claim (the claim's fence records them), rather than take it over again. The warning
    is logged once per process for a flow and fence (later passes log it at debug)."""
    if not max_attempts or fence < max_attempts:
        return False
    report.exhausted.append(run_id)
    with _warned_lock:
        key = (store.url, run_id, fence)
        first = key not in _warned
        if first:
            if len(_warned) >= WARNED_MAX:
                _warned.clear()
            _warned.add(key)
    log.log(logging.WARNING if first else logging.DEBUG,
            "remit: run %s (crewai) not recovered: %d resumes of its parked feedback "
            "claimed it and died before recording an execution (max_attempts=%d); it "
            "is left parked with its claim: see why those processes died, then resume "
            "it by hand or recover it with a larger max_attempts", run_id, fence,
            max_attempts)
    return True


def _left(limit: int | None, report: RecoveryReport) -> int | None:
    return None if limit is None else limit - report.total


def _settled(run_id: str, taken: bool, exc: Exception | None, report: RecoveryReport) -> None:
    """Report one dead resume: finished, taken by another recoverer (or no longer dead),
    or ended by an exception (its execution recorded it in the lifecycle)."""
    if exc is None:
        (report.recovered if taken else report.skipped).append(run_id)
        if taken:
            log.info("remit: recovered run %s (crewai): a resume that died after claiming "
                     "its feedback, finished with the claimed value", run_id)
        return
    status, detail = ending(exc)
    if status == "needs-attention":
        report.attention[run_id] = detail["receipt"]
    else:
        report.failed[run_id] = f"{detail['type']}: {detail['message']}"
    log.warning("remit: run %s (crewai) failed in recovery: %s", run_id, exc)


def _finish_dead_resumes(flow_class: Any, backend: RemitFlowPersistence, name: str,
                         limit: int | None, max_attempts: int, stop: threading.Event | None,
                         report: RecoveryReport) -> None:
    left = _left(limit, report)
    for run_id, fence in _dead_resumes(backend.store, name).items():
        if (stop is not None and stop.is_set()) or (left is not None and left < 1):
            return
        if _spent(backend.store, run_id, fence, max_attempts, report):
            continue
        taken, error = False, None
        try:
            taken = finish_claimed(flow_class, run_id, backend)
        except Exception as exc:  # the flow's failure is reported, not the pass's
            error = exc
        _settled(run_id, taken, error, report)
        left = None if left is None else left - 1


async def _afinish_dead_resumes(flow_class: Any, backend: RemitFlowPersistence, name: str,
                                limit: int | None, max_attempts: int,
                                stop: threading.Event | None, report: RecoveryReport) -> None:
    left = _left(limit, report)
    for run_id, fence in (await aio.run(_dead_resumes, backend.store, name)).items():
        if (stop is not None and stop.is_set()) or (left is not None and left < 1):
            return
        if _spent(backend.store, run_id, fence, max_attempts, report):
            continue
        taken, error = False, None
        try:
            taken = await afinish_claimed(flow_class, run_id, backend)
        except Exception as exc:
            error = exc
        _settled(run_id, taken, error, report)
        left = None if left is None else left - 1


def _kickoff(store: Store, make: Callable[[], Any]) -> Callable[[RunState], None]:
    """How one abandoned flow is continued: a new flow kicked off under its id."""
    def resume(run: RunState) -> None:
        refused: list[ConsumeConflict] = []

        def attempt() -> bool | None:
            try:
                make().kickoff(inputs={"id": run.run_id})
            except ConsumeConflict as exc:
                if not _held(exc):
                    raise
                refused.append(exc)
                return None
            return True

        if poll(attempt, within=_within(store), pause=0.01, most=0.25) is None:
            raise refused[-1]

    return resume


def recover(flow_class: Any, *, name: str | None = None,
            persistence: RemitFlowPersistence | None = None, limit: int | None = None,
            concurrency: int = 1, retry_failed: bool = False,
            max_attempts: int = DEFAULT_MAX_ATTEMPTS, owner: str | None = None,
            lease: float | None = None, stop: threading.Event | None = None
            ) -> RecoveryReport:
    """Continue the abandoned runs of the ``@durable`` flow class ``flow_class`` (its
    lifecycle name, or ``name``) to their next end: ``flow_class().kickoff(inputs={"id":
    flow_id})`` for each, ``concurrency`` at a time (threads), at most ``limit`` of them.

    The flows use the class's persistence (``@persist(...)`` or CrewAI's default
    factory), or ``persistence``, which each flow is then built with
    (``flow_class(persistence=persistence)``). ``retry_failed`` also retries flows whose
    last execution raised; flows stopped on an effect in doubt are continued once the
    receipt is settled. A flow gets at most ``max_attempts`` executions (0: no bound).
    ``owner`` names this recoverer in the store, ``lease`` its lease on each flow it
    takes (default: the store's). Once ``stop`` is set no further flow is taken (the
    one being continued finishes). Returns a :class:`~remit_core.adapter.RecoveryReport`.

    Then the parked flows whose resume died between claiming the feedback and recording
    its execution are finished with the claimed value, one at a time, after the
    abandoned ones (see the module; ``limit`` counts them too). Their resume is an
    ordinary one, not a recovery execution: it is recorded under a resume's own owner
    and the store's lease. ``max_attempts`` bounds the resumes that claimed the
    feedback and died before recording an execution (the claim's fence counts them):
    past it the flow is reported exhausted and left parked."""
    backend, make = _flows(flow_class, persistence)
    store = backend.store
    name = name or class_name(flow_class)
    report = recover_runs(store, _kickoff(store, make), framework=FRAMEWORK, name=name,
                          limit=limit, concurrency=concurrency, owner=owner, lease=lease,
                          retry_failed=retry_failed, max_attempts=max_attempts, stop=stop)
    _finish_dead_resumes(flow_class, backend, name, limit, max_attempts, stop, report)
    return report


async def arecover(flow_class: Any, *, name: str | None = None,
                   persistence: RemitFlowPersistence | None = None,
                   limit: int | None = None, concurrency: int = 1,
                   retry_failed: bool = False, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
                   owner: str | None = None, lease: float | None = None,
                   stop: threading.Event | None = None) -> RecoveryReport:
    """:func:`recover` with ``kickoff_async``, ``concurrency`` flows at a time as tasks of
    the running event loop."""
    backend, make = _flows(flow_class, persistence)
    store = backend.store

    async def resume(run: RunState) -> None:
        refused: list[ConsumeConflict] = []

        async def attempt() -> bool | None:
            try:
                await make().kickoff_async(inputs={"id": run.run_id})
            except ConsumeConflict as exc:
                if not _held(exc):
                    raise
                refused.append(exc)
                return None
            return True

        if await apoll(attempt, within=_within(store), pause=0.01, most=0.25) is None:
            raise refused[-1]

    name = name or class_name(flow_class)
    report = await arecover_runs(store, resume, framework=FRAMEWORK, name=name, limit=limit,
                                 concurrency=concurrency, owner=owner, lease=lease,
                                 retry_failed=retry_failed, max_attempts=max_attempts,
                                 stop=stop)
    await _afinish_dead_resumes(flow_class, backend, name, limit, max_attempts, stop,
                                report)
    return report


@dataclass
class FlowTarget:
    """A ``@durable`` flow class as ``remit worker`` recovers it (:func:`recoverable`).

    Its backend and flow factory are found once: a pass that finds nothing builds no
    flow (CrewAI makes a state class per flow instance)."""

    flow_class: Any
    name: str
    #: the backend the flows use: the one opened from the worker's --store URL (the
    #: flows are built with it, ``FlowClass(persistence=...)``), else the class's own
    backend: RemitFlowPersistence
    make: Callable[[], Any]
    framework: str = FRAMEWORK
    #: whether ``backend`` was opened for the worker (close() closes it then)
    opened: bool = False

    def recover(self, *, limit: int | None, concurrency: int, retry_failed: bool,
                max_attempts: int, owner: str, stop: threading.Event) -> RecoveryReport:
        store = self.backend.store
        report = recover_runs(store, _kickoff(store, self.make), framework=FRAMEWORK,
                              name=self.name, limit=limit, concurrency=concurrency,
                              owner=owner, retry_failed=retry_failed,
                              max_attempts=max_attempts, stop=stop)
        _finish_dead_resumes(self.flow_class, self.backend, self.name, limit, max_attempts,
                             stop, report)
        return report

    def close(self) -> None:
        if self.opened:
            self.opened = False
            self.backend.close()


def recoverable(obj: Any, store_url: str | None) -> FlowTarget | None:
    """``remit worker``'s entry point: a CrewAI ``Flow`` class becomes a target (it must
    be ``@durable``, as for :func:`recover`); anything else is not this adapter's. With
    ``store_url`` its flows are built with a :class:`RemitFlowPersistence` of that URL
    (``FlowClass(persistence=...)``, closed by :meth:`FlowTarget.close`), else they use
    the class's own persistence."""
    if not (isinstance(obj, type) and issubclass(obj, Flow)):
        return None
    opened = None if store_url is None else RemitFlowPersistence.from_url(store_url)
    try:
        backend, make = _flows(obj, opened)  # @durable, and its flows have a remit backend
    except (TypeError, RemitError) as exc:
        if opened is not None:
            opened.close()
        raise RemitError(f"remit worker cannot recover the flow class "
                         f"{obj.__module__}.{obj.__qualname__}: {exc}") from exc
    return FlowTarget(obj, class_name(obj), backend, make, opened=opened is not None)


__all__ = ["FlowTarget", "RecoveryReport", "arecover", "recover", "recoverable"]
