"""Recover pydantic-graph runs whose executor died, without knowing their run ids.

Every ``graph.run`` / ``graph.iter`` / ``graph.iter_from_persistence`` over a
:class:`~remit_pydantic_graph.RemitStatePersistence` keeps its run's lifecycle in the
store (running, parked, done, failed; see :mod:`remit_core.recovery`), under the graph's
name (:func:`~remit_pydantic_graph.persistence.graph_name`: give each graph of an app its
own, ``Graph(nodes=..., name="orders")``). A run whose executor was killed mid-run reads
as *abandoned* once its lease runs out. A run imported from a stock
``FileStatePersistence`` file (:mod:`remit_pydantic_graph.migrate`) is kept from its
import on: one whose stock process died inside a node reads as abandoned at once. :func:`recover` finds the abandoned runs of one
graph, takes each (of k recoverers racing, across processes and hosts, exactly one takes
a run) and continues it the way pydantic-graph continues a run:
``graph.iter_from_persistence(persistence)``, iterated to its End. Nodes that finished
do not run again; the node that was running runs again, and its ``@effect`` calls whose
receipts are recorded return them.

    from remit_pydantic_graph import recover

    report = recover(graph, "sqlite:///runs.db")   # or: await arecover(graph, ...)
    print(report)                                  # 3 recovered, 0 failed, ...

``remit worker --app myapp.graphs:graph --store URL`` recovers them continuously
(:func:`recoverable` is its entry point ``pydantic-graph.recover``). A pydantic-graph
graph carries no store (each run is given its persistence), so the worker needs
``--store``, or ``--app`` names a :class:`GraphTarget`, which carries the graph's store
source (and its ``deps``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic_graph.graph import Graph

from remit_core import ConsumeConflict, RemitError, Store
from remit_core.adapter import (
    DEFAULT_MAX_ATTEMPTS,
    RecoveryReport,
    RunState,
    StoreHold,
    apoll,
    arecover_runs,
    hold_store,
    recover_runs,
)
from remit_pydantic_graph.persistence import FRAMEWORK, RemitStatePersistence, graph_name

log = logging.getLogger("remit.recovery")

#: where recover() finds the runs' store and how it builds each run's persistence
PersistenceSource = str | Store | RemitStatePersistence[Any, Any]


@dataclass
class _Source:
    store: Store
    build: Callable[[str], RemitStatePersistence[Any, Any]]
    hold: StoreHold | None = None

    def close(self) -> None:
        if self.hold is not None:
            self.hold.release()


def _source(persistence_for: PersistenceSource, retry_failed: bool) -> _Source:
    """A store URL: each run's persistence is ``RemitStatePersistence.from_url(url,
    run_id=...)``; a :class:`~remit_core.Store`: ``RemitStatePersistence(store,
    run_id=...)``; a persistence: its :meth:`~RemitStatePersistence.for_run` (its store,
    lease and options, a subclass kept). ``retry_failed`` retries a failed node:
    the persistence is built with ``retry_errors=True``."""
    if isinstance(persistence_for, RemitStatePersistence):
        template = persistence_for

        def from_template(run_id: str) -> RemitStatePersistence[Any, Any]:
            p = template.for_run(run_id)
            p.retry_errors = p.retry_errors or retry_failed
            return p

        return _Source(template.store, from_template)
    if isinstance(persistence_for, Store):
        store = persistence_for
        return _Source(store, lambda run_id: RemitStatePersistence(
            store, run_id=run_id, retry_errors=retry_failed))
    if isinstance(persistence_for, str):
        url = persistence_for
        hold = hold_store(url)  # the same shared store as the persistences' from_url
        return _Source(hold.store, lambda run_id: RemitStatePersistence.from_url(
            url, run_id=run_id, retry_errors=retry_failed), hold)
    raise TypeError(
        "recover(graph, persistence_for): persistence_for is a store URL, a remit Store, or "
        "a RemitStatePersistence whose for_run(run_id) gives each run's persistence; got "
        f"{type(persistence_for).__name__}")


def _name(graph: Any, name: str | None) -> str:
    if not isinstance(graph, Graph):
        raise TypeError(f"recover() continues a pydantic_graph.Graph, not "
                        f"{type(graph).__name__}")
    if name:
        return name
    if graph.name is None:
        fallback = graph_name(graph)
        log.warning(
            "remit: recover(): this graph has no name, so its runs are looked for under "
            "%r (its first node). pydantic-graph names an unnamed graph after the variable "
            "that holds it where run()/iter() is called, and its runs are kept under that "
            "name: give the graph a name (Graph(nodes=..., name=...)) or pass recover(graph, "
            "..., name=...)", fallback)
        return fallback
    return str(graph.name)


async def _continue(graph: Graph[Any, Any, Any], persistence: RemitStatePersistence[Any, Any],
                    deps: Any) -> None:
    """Continue one run to its End with pydantic-graph's own resume. The dead executor's
    claim on the node it was running may outlive the run's lease by a moment (both were
    renewed, a moment apart): that refusal (``ConsumeConflict``, status ``claimed``) is
    waited through, for at most the persistence's lease. A run found ended already (its
    executor died after writing the End snapshot, before recording the end) is done."""
    refused: list[ConsumeConflict] = []

    async def attempt() -> bool | None:
        try:
            async with graph.iter_from_persistence(persistence, deps=deps,
                                                   infer_name=False) as run:
                async for _node in run:
                    pass
        except ConsumeConflict as exc:
            if exc.status == "claimed":
                refused[:] = [exc]
                return None
            if exc.status == "ended":
                return True
            raise
        return True

    if await apoll(attempt, within=persistence.lease, pause=0.01, most=0.5) is None:
        raise refused[-1]


def _no_loop_here() -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError("recover() runs each run on a new event loop in the calling thread, "
                       "and this thread runs an event loop already: use await arecover(...)")


def recover(graph: Graph[Any, Any, Any], persistence_for: PersistenceSource, *,
            name: str | None = None, deps: Any = None, limit: int | None = None,
            concurrency: int = 1, retry_failed: bool = False,
            max_attempts: int = DEFAULT_MAX_ATTEMPTS, owner: str | None = None,
            lease: float | None = None, stop: threading.Event | None = None
            ) -> RecoveryReport:
    """Continue the abandoned runs of ``graph`` (kept under its name, or ``name``) to their
    End: ``graph.iter_from_persistence(persistence, deps=deps)`` for each, iterated to
    the end, ``concurrency`` at a time (threads), at most ``limit`` of them.

    ``persistence_for`` says where the runs are and how each one's persistence is built:
    a store URL (``RemitStatePersistence.from_url(url, run_id=...)``), a
    :class:`~remit_core.Store` (``RemitStatePersistence(store, run_id=...)``), or a
    :class:`~remit_pydantic_graph.RemitStatePersistence` of any run, whose ``for_run``
    gives each run's (its lease and options; a subclass is kept).

    pydantic-graph is async-first: each run is continued by ``asyncio.run`` on a new
    event loop in the thread that continues it (the calling thread, or one of the
    ``concurrency`` pool threads); call it where no event loop runs (else it raises
    ``RuntimeError``: use :func:`arecover`).

    ``retry_failed`` also retries runs whose last execution raised (the failed node runs
    again: the persistences are built with ``retry_errors=True``); runs that stopped on
    an effect in doubt are continued once the receipt is settled. A run gets at most
    ``max_attempts`` executions (0: no bound). ``owner`` names this recoverer in the store
    and ``lease`` is its lease on the runs it takes (the store's by default). Once
    ``stop`` is set no further run is taken (the ones being continued finish). Returns a
    :class:`~remit_core.adapter.RecoveryReport`."""
    _no_loop_here()
    run_name = _name(graph, name)
    source = _source(persistence_for, retry_failed)

    def resume(run: RunState) -> None:
        asyncio.run(_continue(graph, source.build(run.run_id), deps))

    try:
        return recover_runs(source.store, resume, framework=FRAMEWORK, name=run_name,
                            limit=limit, concurrency=concurrency, owner=owner, lease=lease,
                            retry_failed=retry_failed, max_attempts=max_attempts, stop=stop)
    finally:
        source.close()


async def arecover(graph: Graph[Any, Any, Any], persistence_for: PersistenceSource, *,
                   name: str | None = None, deps: Any = None, limit: int | None = None,
                   concurrency: int = 1, retry_failed: bool = False,
                   max_attempts: int = DEFAULT_MAX_ATTEMPTS, owner: str | None = None,
                   lease: float | None = None, stop: threading.Event | None = None
                   ) -> RecoveryReport:
    """:func:`recover` on the running event loop: ``concurrency`` runs at a time as its
    tasks (the store's calls run in threads, as the persistence's do)."""
    run_name = _name(graph, name)
    source = await asyncio.to_thread(_source, persistence_for, retry_failed)  # may open it

    async def resume(run: RunState) -> None:
        await _continue(graph, source.build(run.run_id), deps)

    try:
        return await arecover_runs(source.store, resume, framework=FRAMEWORK, name=run_name,
                                   limit=limit, concurrency=concurrency, owner=owner,
                                   lease=lease, retry_failed=retry_failed,
                                   max_attempts=max_attempts, stop=stop)
    finally:
        source.close()


@dataclass
class GraphTarget:
    """A graph and where its runs are, as ``remit worker`` recovers them.

    ``persistence_for`` is what :func:`recover` takes (a store URL, a
    :class:`~remit_core.Store` or a :class:`RemitStatePersistence`); ``deps`` goes to
    ``iter_from_persistence``; ``name`` defaults to the graph's (as for :func:`recover`).
    Name one in ``--app`` when the graph needs ``deps``, or to run ``remit worker``
    without ``--store``; :func:`recoverable` makes one of a bare graph and the worker's
    ``--store``. A ``--store`` given to the worker replaces ``persistence_for``.

        target = GraphTarget(graph, "postgresql://app@db/app", deps=Deps(...))
    """

    graph: Graph[Any, Any, Any]
    persistence_for: PersistenceSource | None = None
    deps: Any = None
    name: str = ""
    framework: str = FRAMEWORK
    #: the store of a URL ``persistence_for``, held from the first pass to close(): one
    #: store (one connection pool) for every pass, not one opened per pass
    _hold: StoreHold | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.name = _name(self.graph, self.name or None)

    def recover(self, *, limit: int | None, concurrency: int, retry_failed: bool,
                max_attempts: int, owner: str, stop: threading.Event) -> RecoveryReport:
        source = self.persistence_for
        if source is None:
            raise RemitError(_needs_store(self.name))
        if isinstance(source, str) and self._hold is None:
            self._hold = hold_store(source)  # recover()'s own hold_store(url) shares it
        return recover(self.graph, source, name=self.name, deps=self.deps, limit=limit,
                       concurrency=concurrency, retry_failed=retry_failed,
                       max_attempts=max_attempts, owner=owner, stop=stop)

    def close(self) -> None:
        hold, self._hold = self._hold, None
        if hold is not None:
            hold.release()


def _needs_store(name: str) -> str:
    return (f"the pydantic-graph graph {name!r} carries no store (pydantic-graph gives "
            "each run its persistence), so remit worker cannot know where its runs are: "
            "run remit worker --store URL, or name a remit_pydantic_graph.GraphTarget"
            "(graph, persistence_for) in --app")


def recoverable(obj: Any, store_url: str | None) -> GraphTarget | None:
    """``remit worker``'s entry point: a ``pydantic_graph.Graph`` or a
    :class:`GraphTarget` becomes a target; anything else is not this adapter's.

    A bare graph needs ``store_url`` (its runs are recovered from that store; without it
    a :class:`~remit_core.RemitError` says to pass ``remit worker --store URL``). A
    :class:`GraphTarget` is recovered from its own ``persistence_for``, or from
    ``store_url`` when one is given."""
    if isinstance(obj, GraphTarget):
        if store_url is None:
            if obj.persistence_for is None:
                raise RemitError(_needs_store(obj.name))
            return obj
        target = dataclasses.replace(obj, persistence_for=store_url)
    elif isinstance(obj, Graph):
        if store_url is None:
            raise RemitError(_needs_store(_name(obj, None)))
        target = GraphTarget(obj, store_url)
    else:
        return None
    target._hold = hold_store(store_url)  # opened now: a bad URL stops the worker at start
    return target


__all__ = ["GraphTarget", "PersistenceSource", "RecoveryReport", "arecover", "recover",
           "recoverable"]
