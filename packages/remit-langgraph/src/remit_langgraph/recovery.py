"""Recover LangGraph threads whose executor died, without knowing their ids.

Every invocation of a graph compiled with a :class:`~remit_langgraph.RemitSaver` keeps
its thread's lifecycle in the store (running, parked, done, failed; see
:mod:`remit_core.recovery`), under the graph's ``name`` (``compile(name=...)``;
LangGraph's default is ``"LangGraph"``, so give each graph of an app its own). A thread
whose executor was killed mid-run reads as *abandoned* once its lease runs out.
:func:`recover` finds the abandoned threads of one graph, takes each (of k recoverers
racing, across processes and hosts, exactly one takes a thread) and continues it the way
LangGraph continues a thread: ``graph.invoke(None, config)``, from its last durable
checkpoint, subgraphs included. Completed steps are not run again; effects whose
receipts are recorded return them.

    from remit_langgraph import recover

    report = recover(graph)          # or: await arecover(graph)
    print(report)                    # 3 recovered, 0 failed, ...
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_core.runnables import RunnableConfig
from tenacity import (
    AsyncRetrying,
    Retrying,
    retry_if_exception,
    stop_after_delay,
    wait_exponential,
)

from remit_core import ConsumeConflict, Store
from remit_core.adapter import (
    DEFAULT_MAX_ATTEMPTS,
    RecoveryReport,
    RunState,
    arecover_runs,
    recover_runs,
)
from remit_langgraph._contract import DEFAULT_NAME, FRAMEWORK, GatedSaver


def _store_of(graph: Any) -> Store:
    saver = getattr(graph, "checkpointer", None)
    if not isinstance(saver, GatedSaver):
        raise TypeError(
            f"recover() needs a graph compiled with a RemitSaver "
            f"(builder.compile(checkpointer=RemitSaver...)); this one's checkpointer is "
            f"{type(saver).__name__ if saver is not None else 'None'}")
    return saver.store


def _config(base: Mapping[str, Any] | None, thread_id: str) -> RunnableConfig:
    config: dict[str, Any] = dict(base or {})
    config["configurable"] = {**dict(config.get("configurable") or {}),
                              "thread_id": thread_id}
    return config  # type: ignore[return-value]


def _held(exc: BaseException) -> bool:
    """The thread's resume is still claimed by its dead executor, whose claim lease is
    about to run out (it is renewed with the run's, a moment apart): wait for it."""
    return isinstance(exc, ConsumeConflict) and exc.status == "claimed"


def _policy(store: Store) -> dict[str, Any]:
    return dict(retry=retry_if_exception(_held), stop=stop_after_delay(store.lease),
                wait=wait_exponential(multiplier=0.01, min=0.01, max=0.5), reraise=True)


def recover(graph: Any, *, name: str | None = None, config: Mapping[str, Any] | None = None,
            limit: int | None = None, concurrency: int = 1, retry_failed: bool = False,
            max_attempts: int = DEFAULT_MAX_ATTEMPTS, owner: str | None = None,
            lease: float | None = None) -> RecoveryReport:
    """Continue the abandoned threads of ``graph`` (its ``name``, or ``name``) to their
    next end: ``graph.invoke(None, config)`` for each, ``concurrency`` at a time, at most
    ``limit`` of them. ``config`` is merged into each invocation's config (its
    ``thread_id`` is the thread's).

    ``retry_failed`` also retries threads whose last execution raised; threads that
    stopped on an effect in doubt are continued once the receipt is settled (``remit
    effects resolve``). A thread gets at most ``max_attempts`` executions (0: no bound).
    Returns a :class:`~remit_core.adapter.RecoveryReport`."""
    store = _store_of(graph)

    def resume(run: RunState) -> None:
        Retrying(**_policy(store))(graph.invoke, None, _config(config, run.run_id))

    return recover_runs(store, resume, framework=FRAMEWORK,
                        name=name or getattr(graph, "name", None) or DEFAULT_NAME,
                        limit=limit, concurrency=concurrency, owner=owner, lease=lease,
                        retry_failed=retry_failed, max_attempts=max_attempts)


async def arecover(graph: Any, *, name: str | None = None,
                   config: Mapping[str, Any] | None = None, limit: int | None = None,
                   concurrency: int = 1, retry_failed: bool = False,
                   max_attempts: int = DEFAULT_MAX_ATTEMPTS, owner: str | None = None,
                   lease: float | None = None) -> RecoveryReport:
    """:func:`recover` with ``graph.ainvoke``, ``concurrency`` threads at a time as tasks."""
    store = _store_of(graph)

    async def resume(run: RunState) -> None:
        await AsyncRetrying(**_policy(store))(graph.ainvoke, None,
                                              _config(config, run.run_id))

    return await arecover_runs(store, resume, framework=FRAMEWORK,
                               name=name or getattr(graph, "name", None) or DEFAULT_NAME,
                               limit=limit, concurrency=concurrency, owner=owner,
                               lease=lease, retry_failed=retry_failed,
                               max_attempts=max_attempts)


__all__ = ["RecoveryReport", "arecover", "recover"]
