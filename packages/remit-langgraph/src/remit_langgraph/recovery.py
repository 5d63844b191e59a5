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

import threading
from collections.abc import Mapping
from dataclasses import dataclass
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
from remit_langgraph._seam import Pregel


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
            lease: float | None = None, stop: threading.Event | None = None
            ) -> RecoveryReport:
    """Continue the abandoned threads of ``graph`` (its ``name``, or ``name``) to their
    next end: ``graph.invoke(None, config)`` for each, ``concurrency`` at a time, at most
    ``limit`` of them. ``config`` is merged into each invocation's config (its
    ``thread_id`` is the thread's).

    ``retry_failed`` also retries threads whose last execution raised; threads that
    stopped on an effect in doubt are continued once the receipt is settled (``remit
    effects resolve``). A thread gets at most ``max_attempts`` executions (0: no bound).
    Once ``stop`` is set no further thread is taken. Returns a
    :class:`~remit_core.adapter.RecoveryReport`."""
    store = _store_of(graph)

    def resume(run: RunState) -> None:
        Retrying(**_policy(store))(graph.invoke, None, _config(config, run.run_id))

    return recover_runs(store, resume, framework=FRAMEWORK,
                        name=name or getattr(graph, "name", None) or DEFAULT_NAME,
                        limit=limit, concurrency=concurrency, owner=owner, lease=lease,
                        retry_failed=retry_failed, max_attempts=max_attempts, stop=stop)


async def arecover(graph: Any, *, name: str | None = None,
                   config: Mapping[str, Any] | None = None, limit: int | None = None,
                   concurrency: int = 1, retry_failed: bool = False,
                   max_attempts: int = DEFAULT_MAX_ATTEMPTS, owner: str | None = None,
                   lease: float | None = None, stop: threading.Event | None = None
                   ) -> RecoveryReport:
    """:func:`recover` with ``graph.ainvoke``, ``concurrency`` threads at a time as tasks."""
    store = _store_of(graph)

    async def resume(run: RunState) -> None:
        await AsyncRetrying(**_policy(store))(graph.ainvoke, None,
                                              _config(config, run.run_id))

    return await arecover_runs(store, resume, framework=FRAMEWORK,
                               name=name or getattr(graph, "name", None) or DEFAULT_NAME,
                               limit=limit, concurrency=concurrency, owner=owner,
                               lease=lease, retry_failed=retry_failed,
                               max_attempts=max_attempts, stop=stop)


@dataclass
class GraphTarget:
    """A compiled graph as ``remit worker`` recovers it (:func:`recoverable`)."""

    graph: Any
    name: str
    framework: str = FRAMEWORK
    opened: Any = None  # the saver context the worker opened from its --store URL

    def recover(self, *, limit: int | None, concurrency: int, retry_failed: bool,
                max_attempts: int, owner: str, stop: threading.Event) -> RecoveryReport:
        return recover(self.graph, name=self.name, limit=limit, concurrency=concurrency,
                       retry_failed=retry_failed, max_attempts=max_attempts, owner=owner,
                       stop=stop)

    def close(self) -> None:
        if self.opened is not None:
            opened, self.opened = self.opened, None
            opened.__exit__(None, None, None)


def recoverable(obj: Any, store_url: str | None) -> GraphTarget | None:
    """``remit worker``'s entry point: a compiled graph (a ``Pregel``) becomes a target;
    with ``store_url`` its threads are recovered from that store (a RemitSaver opened
    for the worker), else through the graph's own RemitSaver."""
    if not isinstance(obj, Pregel):
        return None
    name = getattr(obj, "name", None) or DEFAULT_NAME
    if store_url is None:
        _store_of(obj)  # the graph's own checkpointer must be a RemitSaver
        return GraphTarget(obj, name)
    from remit_langgraph.saver import RemitSaver

    opened = RemitSaver.from_conn_string(store_url)
    saver = opened.__enter__()
    return GraphTarget(obj.copy(update={"checkpointer": saver}), name, opened=opened)


__all__ = ["GraphTarget", "RecoveryReport", "arecover", "recover", "recoverable"]
