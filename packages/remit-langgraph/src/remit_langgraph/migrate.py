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
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver

from remit_core import Store, open_store
from remit_core.adapter import MigrationError, MigrationReport, RecordsRefused
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
            allow: Iterable[tuple[str, str] | type] = ()) -> MigrationReport:
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
    """
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
        if threads and not src._has_task_path():
            report.notes.append("the source's writes table has no task_path column (it "
                                "predates LangGraph recording it): writes were imported with ''")
        if report.refused:
            raise RecordsRefused(src.label, report.refused, hint=REFUSED_HINT, report=report)
        return report


__all__ = ["MARKER_RUN", "ImportCounts", "RecordsRefused", "StockSource", "default_allowed",
           "import_thread", "migrate", "open_source", "scan_record"]
