"""Import threads from LangGraph's stock savers: ``remit migrate langgraph`` and ``legacy=``.

    remit migrate langgraph --from checkpoints.sqlite --to sqlite:///app.db
    remit migrate langgraph --from postgresql://user@host/db --to postgresql://...

:func:`migrate` imports every thread of a stock ``SqliteSaver`` file or
``PostgresSaver`` database: every checkpoint with its id, parent, metadata,
channel values and versions, and every pending write with its task id,
``task_path``, ``idx`` and channel. ``RemitSaver(store, legacy=stock_saver)``
does the same for one thread at a time, on the thread's first use. The reading and the
import of one thread are in :mod:`remit_langgraph._stock`, which both use.

What is read, and how:

* Checkpoints come from the stock saver's own ``list()``, so its own decoding
  (and its migration of old ``pending_sends``) applies.
* Pending writes come from the stock ``writes`` / ``checkpoint_writes`` table,
  read through the saver's connection and decoded with the saver's serializer:
  the ``pending_writes`` of a ``CheckpointTuple`` carry (task_id, channel,
  value) only, and the ``task_path`` they drop decides the order LangGraph
  applies parallel tasks' writes in.
* Nothing stored is decoded before it is checked. LangGraph's msgpack records
  name the classes they are rebuilt from (an ext holding ``(module, name, args)``),
  and its decoder, by default, imports any module and calls any name so found. So
  every stock record of a thread is first read by remit's own scan, which parses
  the bytes without resolving anything and collects each name a record holds: every
  one must be on the allow-list (exact ``(module, name)`` pairs, fixed before the
  read: the types LangGraph itself writes for standard values and messages,
  LangGraph's own ``SAFE_MSGPACK_TYPES`` where the installed langgraph-checkpoint
  has them, the stock serializer's own ``allowed_msgpack_modules`` if it was given
  one, and ``allow=``). A thread with a record that names anything else, was stored
  with pickle, or does not parse is refused whole: nothing of it is decoded or
  imported, no module it names is imported, and the refusal
  (:class:`~remit_core.migrate.RecordsRefused`) names the thread, each record and
  what it names. ``migrate`` imports the other threads, then raises it (so
  ``remit migrate`` exits 1); ``legacy=`` raises it on the thread's first use.
  The records that pass are decoded by LangGraph's serializer in its strict mode
  (``allowed_msgpack_modules`` set to the same allow-list, pickle off), behind the
  same check (which also covers records only the stock serializer can read, such as
  encrypted ones).

What is written, and how: each checkpoint through ``RemitSaver.put`` (one
atomic store write; with ``schema=`` it is validated), each task's writes
through ``Store.put_writes`` with their stored ``idx`` and ``task_path``,
oldest checkpoint first, so the stock latest is remit's latest.

Idempotence and concurrency. Store writes are idempotent (a checkpoint id is
stored once, a (task_id, idx) write is kept), and each thread's import is an
``@effect`` of remit itself, keyed by the thread: of two processes importing
one thread at once, one imports and the other waits for it to finish; an
importer that dies is taken over after its lease. The receipt records how far
the import went (the stock latest checkpoint per namespace), so a later import
adds only what the stock saver wrote after it and never brings back what remit
pruned or deleted since.

The run lifecycle (``graph=``). Without a graph the import keeps no run lifecycle: an
imported thread has checkpoints but no status, so ``Store.list_runs(status=...)``,
``remit inspect --status`` and :func:`remit_langgraph.recover` do not see it until it
is next invoked under remit. With ``migrate(..., graph=graph)`` (``remit migrate
langgraph ... --app package.module:graph`` on the command line) each imported thread
gets the lifecycle
remit would have recorded had it run under remit, framework ``"langgraph"``, name the
graph's ``name`` (LangGraph's default ``"LangGraph"`` when it has none), exactly what
:func:`~remit_langgraph.recover` looks for. It is decided from
``graph.get_state(config, subgraphs=True)``, read through a RemitSaver on the target
store (the root namespace, with each next task's subgraph), as the live path decides it
when a root loop exits
(``_seam.loop_end`` and remit-core's ``ending``):

* no next tasks: ``done``;
* next tasks with pending interrupts (``interrupt()``): ``parked``, waiting
  ``{"interrupts": [{"id": ..., "value": ...}, ...]}`` (the live record);
* a next task that failed (its error stored at the checkpoint): ``failed``, as a remit
  execution that raised records it; LangGraph stores only the error's repr, so the
  error is ``{"type": "SqliteSaver" (or "PostgresSaver"), "message": <that repr>}``;
  ``recover(graph, url, retry_failed=True)`` runs it again;
* next tasks at a static breakpoint: the graph pauses before one of the next nodes
  (``interrupt_before``), or after one of the nodes that produced the checkpoint
  (``interrupt_after``): ``parked``, waiting ``{"breakpoint": "interrupt_before" |
  "interrupt_after", "nodes": [the next nodes]}``: a person was meant to approve, so a recovery
  must not run it. (A stock process that was resumed past a breakpoint and died in the
  node before it wrote anything cannot be told from one that stopped there: it is
  parked too, the safe reading.)
* next tasks that run a subgraph stopped at a static breakpoint of its own (or of a
  subgraph of it; read with ``get_state(config, subgraphs=True)``): ``parked``, waiting
  ``{"interrupts": []}``, the record the live path makes when a root loop ends on its
  subgraph's pause;
* otherwise, next tasks pending: ``abandoned`` (the stock process died during the run):
  recorded running with a lease that has run out, so ``recover(graph, url)`` takes it at
  once and continues it from its last checkpoint.

The record is one atomic write, ``Store.import_run``, only where the thread has no
lifecycle: importing again, or after the thread ran under remit, leaves the recorded
one as it is (a report note says so).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.types import StateSnapshot

from remit_core import Store, open_store
from remit_core.adapter import (
    MigrationError,
    MigrationReport,
    RecordsRefused,
    ending,
    import_lifecycle,
    new_owner,
)
from remit_langgraph._contract import DEFAULT_NAME, FRAMEWORK
from remit_langgraph._seam import LangGraphSeamError, Pregel
from remit_langgraph._stock import (
    MARKER_RUN,
    REFUSED_HINT,
    ImportCounts,
    StockSource,
    default_allowed,
    import_thread,
    open_source,
    scan_record,
)
from remit_langgraph.saver import RemitSaver

# =================================================================================== migrate


def migrate(source: str | os.PathLike[str] | BaseCheckpointSaver[Any], target: str | Store,
            *, run_id: str | None = None,
            allow: Iterable[tuple[str, str] | type] = (),
            graph: Any = None) -> MigrationReport:
    """Import every thread (or only ``run_id``) of a stock LangGraph saver into remit.

    ``source``: a stock ``SqliteSaver`` file path, a ``postgresql://`` URL of a stock
    ``PostgresSaver`` database, or an open ``SqliteSaver``/``PostgresSaver``.
    ``target``: a remit store URL or an open :class:`~remit_core.Store`.
    ``allow``: classes of your own (or exact ``(module, name)`` pairs) that stored
    records may name, beyond the default allow-list (see the module docstring).

    Running it again stores nothing twice: what is already imported is counted in
    ``skipped``, and only what the stock saver wrote since is added.

    A thread holding a record that names anything not allowed is not imported; the
    others are, and then :class:`~remit_core.migrate.RecordsRefused` is raised, naming
    each refused thread and record (its ``report`` is what was imported).

    ``graph``: the app's compiled graph. With it, each imported thread is kept in the run
    lifecycle as remit would have kept it (``done``, ``parked``, ``failed`` or
    ``abandoned``; see the module docstring), so that ``recover(graph, url)`` finishes
    the threads the stock process left mid-run. Without it no lifecycle is kept.
    """
    if graph is not None and not isinstance(graph, Pregel):
        raise TypeError(f"graph= takes the app's compiled graph (builder.compile(...)), "
                        f"not {type(graph).__name__}")
    with contextlib.ExitStack() as stack:
        src = stack.enter_context(open_source(source, allow=allow))
        store = target if isinstance(target, Store) else stack.enter_context(open_store(target))
        report = MigrationReport(source=src.label, target=store.url)
        threads = src.thread_ids()
        if run_id is not None:
            if run_id not in threads:
                raise MigrationError(f"no thread {run_id!r} in {src.label}")
            threads = [run_id]
        saver = RemitSaver(store)
        reader = None if graph is None else graph.copy(update={"checkpointer": saver})
        for thread_id in threads:
            try:
                counts = import_thread(src, saver, thread_id)
            except RecordsRefused as exc:
                report.refused.update(exc.refused)
                continue
            report.checkpoints += counts.checkpoints
            report.writes += counts.writes
            report.skipped += counts.skipped
            report.runs += 1 if counts.checkpoints or counts.writes else 0
            if reader is not None:
                note = _settle_lifecycle(reader, store, thread_id, src)
                if note is not None:
                    report.notes.append(note)
        if threads and graph is None:
            report.notes.append(
                "no run lifecycle was kept (no graph given): the imported threads have no "
                "status, so list_runs(status=...), remit inspect --status and recover() do "
                "not see them until they next run under remit; to keep one, give the "
                "app's compiled graph: remit migrate langgraph ... --app "
                "package.module:graph, or migrate(source, target, graph=graph)")
        if threads and not src._has_task_path():
            report.notes.append("the source's writes table has no task_path column (it "
                                "predates LangGraph recording it): writes were imported with ''")
        if report.refused:
            raise RecordsRefused(src.label, report.refused, hint=REFUSED_HINT, report=report)
        return report


# =========================================================================== run lifecycle


def lifecycle_of(graph: Any, config: Any, *, stock: str = "stock saver"
                 ) -> tuple[str, Any] | None:
    """The lifecycle remit would have recorded for the thread of ``config`` had its last
    execution run under remit (status, with its waiting or error), read from
    ``graph.get_state(config, subgraphs=True)`` (the root namespace, with the state of
    each next task's subgraph); None when the thread has no root checkpoint. See the
    module docstring for the rules; ``stock`` names the stock saver in the error of a
    node that failed under it."""
    state = graph.get_state(config, subgraphs=True)
    if state.created_at is None and not state.next and not state.values:
        return None  # no checkpoint in the root namespace
    if not state.next:
        return ending(None)
    if state.interrupts:  # as _seam.loop_end records a root loop parked on interrupt()
        return ending(None, {"interrupts": [
            {"id": str(getattr(i, "id", "")), "value": getattr(i, "value", None)}
            for i in state.interrupts]}, parked=True)
    for task in state.tasks:
        if isinstance(task.error, BaseException):
            return ending(task.error)
        if task.error is not None:  # LangGraph stores a node's error as its repr only
            return "failed", {"type": stock, "message": str(task.error)}
    nodes = sorted(set(state.next))
    point = _breakpoint(graph, graph, state)
    if point is not None:
        return ending(None, {"breakpoint": point, "nodes": nodes}, parked=True)
    if _paused_inside(graph, graph, state):
        # a subgraph stopped at a static breakpoint of its own: the root loop ends on its
        # GraphInterrupt, and the live path records it parked so (_seam.loop_end)
        return ending(None, {"interrupts": []}, parked=True)
    return "abandoned", None


def _breakpoint(root: Any, graph: Any, state: StateSnapshot) -> str | None:
    """The static breakpoint of ``graph`` (the root or one of its subgraphs) that
    ``state``, one of its checkpoints with next tasks, stopped at: ``interrupt_before``
    one of the next nodes, or ``interrupt_after`` one of the nodes that produced it."""
    # (Pregel's own fields, set by its constructor: read directly, so that a release
    # without them fails loudly instead of reading every breakpoint as abandoned)
    before = graph.interrupt_before_nodes or ()
    if before == "*" or any(n in before for n in state.next):
        return "interrupt_before"
    after = graph.interrupt_after_nodes or ()
    if after and state.parent_config is not None:
        # (the root reads a subgraph's checkpoints too, by their namespace)
        ran = {t.name for t in root.get_state(state.parent_config).tasks}
        if after == "*" or any(n in after for n in ran):  # the loop then lists the next
            return "interrupt_after"
    return None


def _paused_inside(root: Any, graph: Any, state: StateSnapshot) -> bool:
    """A subgraph of ``graph`` that one of ``state``'s next tasks runs (read with
    ``subgraphs=True``), or a subgraph of it, stopped at its own static breakpoint."""
    subgraphs = dict(graph.get_subgraphs())
    for task in state.tasks:
        inner, sub = task.state, subgraphs.get(task.name)
        if sub is None:
            continue  # not a subgraph
        if not isinstance(inner, StateSnapshot):
            # (get_state(subgraphs=True) reads each subgraph task's state: a release that
            # no longer does would read every paused subgraph as abandoned)
            raise LangGraphSeamError(
                "Pregel.get_state(subgraphs=True)",
                f"gives the subgraph task {task.name!r} a {type(inner).__name__}, not a "
                "StateSnapshot")
        if not inner.next:
            continue  # a subgraph that has finished
        if _breakpoint(root, sub, inner) is not None or _paused_inside(root, sub, inner):
            return True
    return False


def _settle_lifecycle(graph: Any, store: Store, thread_id: str, src: StockSource
                      ) -> str | None:
    """Record the imported thread's first lifecycle (``Store.import_run``), or say why
    not; a note for the report, None when the thread has no root checkpoint."""
    stock = type(src.saver).__name__
    kept = lifecycle_of(graph, {"configurable": {"thread_id": thread_id}}, stock=stock)
    if kept is None:
        return None
    status, detail = kept
    name = getattr(graph, "name", None) or DEFAULT_NAME
    return import_lifecycle(store, "thread", thread_id, framework=FRAMEWORK, name=name,
                            status=status,  # type: ignore[arg-type]
                            owner=f"migrate:{stock}:{new_owner()}", detail=detail)


__all__ = ["MARKER_RUN", "ImportCounts", "RecordsRefused", "StockSource", "default_allowed",
           "import_thread", "lifecycle_of", "migrate", "open_source", "scan_record"]
