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

Plain flows (``@persist(RemitFlowPersistence...)`` without ``@durable``) keep no
lifecycle: continuing one would run its completed methods again, so there is nothing a
recovery could safely do with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from remit_core import ConsumeConflict, Store
from remit_core.adapter import (
    DEFAULT_MAX_ATTEMPTS,
    RecoveryReport,
    RunState,
    apoll,
    arecover_runs,
    poll,
    recover_runs,
)
from remit_crewai._durable import persistence_of
from remit_crewai._seam import class_name
from remit_crewai.persistence import FRAMEWORK, RemitFlowPersistence


def _flows(flow_class: Any, persistence: RemitFlowPersistence | None
           ) -> tuple[Store, Callable[[], Any]]:
    """The store the class's flows use, and how to make one of them."""
    if not isinstance(flow_class, type) or not flow_class.__dict__.get("__remit_durable__"):
        raise TypeError(
            f"recover() needs a @durable flow class, not {flow_class!r}: only @durable "
            "flows keep the run lifecycle (a plain flow's completed methods would run "
            "again), so decorate the class with @durable above @persist(...)")

    def make() -> Any:
        return flow_class() if persistence is None else flow_class(persistence=persistence)

    return persistence_of(make()).store, make


def _held(exc: ConsumeConflict) -> bool:
    """The flow's parked feedback is still claimed by its dead resumer, whose claim lease
    is about to run out (it is renewed with the run's, a moment apart): wait for it."""
    return exc.status == "claimed"


def _within(store: Store) -> float:
    return 2 * store.lease


def recover(flow_class: Any, *, name: str | None = None,
            persistence: RemitFlowPersistence | None = None, limit: int | None = None,
            concurrency: int = 1, retry_failed: bool = False,
            max_attempts: int = DEFAULT_MAX_ATTEMPTS, owner: str | None = None,
            lease: float | None = None) -> RecoveryReport:
    """Continue the abandoned runs of the ``@durable`` flow class ``flow_class`` (its
    lifecycle name, or ``name``) to their next end: ``flow_class().kickoff(inputs={"id":
    flow_id})`` for each, ``concurrency`` at a time (threads), at most ``limit`` of them.

    The flows use the class's persistence (``@persist(...)`` or CrewAI's default
    factory), or ``persistence``, which each flow is then built with
    (``flow_class(persistence=persistence)``). ``retry_failed`` also retries flows whose
    last execution raised; flows stopped on an effect in doubt are continued once the
    receipt is settled. A flow gets at most ``max_attempts`` executions (0: no bound).
    ``owner`` names this recoverer in the store, ``lease`` its lease on each flow it
    takes (default: the store's). Returns a :class:`~remit_core.adapter.RecoveryReport`."""
    store, make = _flows(flow_class, persistence)

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

    return recover_runs(store, resume, framework=FRAMEWORK,
                        name=name or class_name(flow_class), limit=limit,
                        concurrency=concurrency, owner=owner, lease=lease,
                        retry_failed=retry_failed, max_attempts=max_attempts)


async def arecover(flow_class: Any, *, name: str | None = None,
                   persistence: RemitFlowPersistence | None = None,
                   limit: int | None = None, concurrency: int = 1,
                   retry_failed: bool = False, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
                   owner: str | None = None, lease: float | None = None) -> RecoveryReport:
    """:func:`recover` with ``kickoff_async``, ``concurrency`` flows at a time as tasks of
    the running event loop."""
    store, make = _flows(flow_class, persistence)

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

    return await arecover_runs(store, resume, framework=FRAMEWORK,
                               name=name or class_name(flow_class), limit=limit,
                               concurrency=concurrency, owner=owner, lease=lease,
                               retry_failed=retry_failed, max_attempts=max_attempts)


__all__ = ["RecoveryReport", "arecover", "recover"]
