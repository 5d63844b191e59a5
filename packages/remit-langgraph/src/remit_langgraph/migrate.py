"""Import threads from LangGraph's stock savers: ``remit migrate langgraph`` and ``legacy=``.

    remit migrate langgraph --from checkpoints.sqlite --to sqlite:///app.db
    remit migrate langgraph --from postgresql://user@host/db --to postgresql://...

:func:`migrate` imports every thread of a stock ``SqliteSaver`` file or
``PostgresSaver`` database: every checkpoint with its id, parent, metadata,
channel values and versions, and every pending write with its task id,
``task_path``, ``idx`` and channel. ``RemitSaver(store, legacy=stock_saver)``
does the same for one thread at a time, on the thread's first use.

What is read, and how:

* Checkpoints come from the stock saver's own ``list()``, so its own decoding
  (and its migration of old ``pending_sends``) applies.
* Pending writes come from the stock ``writes`` / ``checkpoint_writes`` table,
  read through the saver's connection and decoded with the saver's serializer:
  the ``pending_writes`` of a ``CheckpointTuple`` carry (task_id, channel,
  value) only, and the ``task_path`` they drop decides the order LangGraph
  applies parallel tasks' writes in.
* The stock serializer runs with pickle fallback off: a record stored with
  pickle raises :class:`~remit_core.migrate.MigrationError`, it is never unpickled.

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
import copy
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple

from remit_core import Store, effect, open_store
from remit_core.effects import effect_scope
from remit_core.migrate import MigrationError, MigrationReport
from remit_core.urls import mask_url
from remit_langgraph._serde import storable

if TYPE_CHECKING:
    from remit_langgraph.saver import RemitSaver

MARKER_RUN = "remit-migrate:langgraph"
"""The run id of the import receipts (one per thread: step = thread id). Deliberately
not the thread's own run id, so that deleting a thread does not let it be imported again."""

IMPORT_WAIT = 600.0
"""Seconds a process waits for another live process importing the same thread."""

INSTALL = "pip install 'remit-langgraph[migrate]'"

Frontier = dict[str, tuple[str, int]]
"""Per namespace: the stock latest checkpoint id imported, and how many writes it had."""


# ===================================================================================== reading


@dataclass(frozen=True, slots=True)
class StockWrite:
    """One row of the stock writes table, value decoded."""

    task_id: str
    task_path: str
    idx: int
    channel: str
    value: Any


@dataclass
class StockThread:
    """Everything the stock saver holds for one thread, oldest checkpoint first."""

    thread_id: str
    checkpoints: list[CheckpointTuple]
    writes: dict[tuple[str, str], list[StockWrite]]

    def records(self) -> int:
        return len(self.checkpoints) + sum(len(w) for w in self.writes.values())


class StockSource:
    """A stock ``SqliteSaver`` or ``PostgresSaver`` to read threads from (never written)."""

    def __init__(self, saver: BaseCheckpointSaver[Any], *, label: str | None = None) -> None:
        self.kind = _kind(saver)
        self.saver: Any = _without_pickle(saver)
        self.label = label or type(saver).__name__
        self._task_path: bool | None = None

    def _query(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        if self.kind == "sqlite":
            with self.saver.cursor(transaction=False) as cur:
                cur.execute(sql, params)
                return [tuple(r) for r in cur.fetchall()]
        with self.saver._cursor() as cur:  # the saver's lock, connection or pool
            cur.execute(sql.replace("?", "%s"), params)
            return [tuple(r.values()) for r in cur.fetchall()]

    def _has_task_path(self) -> bool:
        if self._task_path is None:
            if self.kind == "sqlite":
                cols = self._query("SELECT name FROM pragma_table_info('writes')", ())
            else:
                cols = self._query(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = "
                    "'checkpoint_writes' AND table_schema = ANY(current_schemas(false))", ())
            self._task_path = ("task_path",) in cols
        return self._task_path

    def thread_ids(self) -> list[str]:
        try:
            return [str(r[0]) for r in self._query(
                "SELECT DISTINCT thread_id FROM checkpoints ORDER BY thread_id", ())]
        except Exception as exc:
            raise MigrationError(f"could not list the threads of {self.label}: {exc}") from exc

    def read_thread(self, thread_id: str) -> StockThread:
        """The thread's checkpoints (stock ``list``) and pending writes (stock table)."""
        table, value = ("writes", "value") if self.kind == "sqlite" else ("checkpoint_writes", "blob")
        try:
            found = list(self.saver.list({"configurable": {"thread_id": thread_id}}))
            path = "task_path" if self._has_task_path() else "''"
            rows = self._query(
                f"SELECT checkpoint_ns, checkpoint_id, task_id, {path}, idx, channel, type, "
                f"{value} FROM {table} WHERE thread_id = ?", (thread_id,))
            loads = self.saver.serde.loads_typed
            writes: dict[tuple[str, str], list[StockWrite]] = {}
            for ns, cid, task_id, task_path, idx, channel, type_, data in rows:
                writes.setdefault((str(ns), str(cid)), []).append(StockWrite(
                    str(task_id), str(task_path), int(idx), str(channel),
                    loads((type_, bytes(data) if data is not None else data))))
        except Exception as exc:
            raise _read_error(self.label, thread_id, exc) from exc
        for rows_of_one in writes.values():
            rows_of_one.sort(key=lambda w: (w.task_path, w.task_id, w.idx))
        found.reverse()  # stock lists newest first (checkpoint id descending)
        return StockThread(thread_id, found, writes)


def _kind(saver: Any) -> str:
    for kind, module, name in (("sqlite", "langgraph.checkpoint.sqlite", "SqliteSaver"),
                               ("postgres", "langgraph.checkpoint.postgres", "PostgresSaver")):
        with contextlib.suppress(ImportError):
            cls = getattr(__import__(module, fromlist=[name]), name)
            if isinstance(saver, cls):
                return kind
    raise TypeError(
        f"cannot import from a {type(saver).__name__}: remit reads the stock SqliteSaver and "
        "PostgresSaver (the sync classes), or a SQLite file path or postgresql:// URL"
    )


def _without_pickle(saver: BaseCheckpointSaver[Any]) -> BaseCheckpointSaver[Any]:
    """The saver, or a shallow copy of it whose serializer never unpickles."""
    safe = _serde_without_pickle(saver.serde)
    if safe is saver.serde:
        return saver
    clone = copy.copy(saver)  # shares the connection and the lock
    clone.serde = safe
    return clone


def _serde_without_pickle(serde: Any) -> Any:
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    if isinstance(serde, JsonPlusSerializer):
        if not serde.pickle_fallback:
            return serde
        serde = copy.copy(serde)
        serde.pickle_fallback = False
        return serde
    inner = getattr(serde, "serde", None)  # EncryptedSerializer, SerializerCompat
    if inner is not None and (safe := _serde_without_pickle(inner)) is not inner:
        serde = copy.copy(serde)
        serde.serde = safe
    return serde


def _read_error(label: str, thread_id: str, exc: Exception) -> MigrationError:
    if "pickle" in str(exc):
        return MigrationError(
            f"thread {thread_id!r} of {label} holds a value stored with pickle; remit never "
            "unpickles stored bytes. Load the thread with the stock saver and store the value "
            "as a type its msgpack serializer handles (or drop it), then import again."
        )
    return MigrationError(f"could not read thread {thread_id!r} from {label}: "
                          f"{type(exc).__name__}: {exc}")


@contextlib.contextmanager
def open_source(source: str | os.PathLike[str] | BaseCheckpointSaver[Any]
                ) -> Iterator[StockSource]:
    """A stock saver to read from: an instance (left open), a SQLite file path
    (``sqlite:///`` prefix optional) or a ``postgresql://`` URL (closed on exit).

    A missing file, a file or database without LangGraph's tables, an unreachable
    server or a missing stock package raise :class:`MigrationError`; nothing is
    created in the source.
    """
    if isinstance(source, BaseCheckpointSaver):
        yield StockSource(source)
        return
    text = os.fspath(source)
    if text.startswith(("postgresql://", "postgres://")):
        with _open_postgres(text) as found:
            yield found
    else:
        with _open_sqlite(text) as found:
            yield found


@contextlib.contextmanager
def _open_sqlite(text: str) -> Iterator[StockSource]:
    import sqlite3

    path = text.removeprefix("sqlite:///") if text.startswith("sqlite:///") else text
    if not os.path.isfile(path):
        raise MigrationError(f"no stock SqliteSaver file at {path!r}: the file does not exist")
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
    except ImportError:
        raise MigrationError(f"reading a stock SqliteSaver file needs langgraph-checkpoint-"
                             f"sqlite: {INSTALL}") from None
    try:  # look before SqliteSaver.setup() would create its tables in a foreign file
        uri = f"{Path(path).resolve().as_uri()}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as probe:
            tables = {r[0] for r in probe.execute("SELECT name FROM sqlite_master")}
    except sqlite3.DatabaseError as exc:
        raise MigrationError(f"{path!r} is not a SQLite database: {exc}") from exc
    if not {"checkpoints", "writes"} <= tables:
        raise MigrationError(f"{path!r} holds no LangGraph checkpoints (no 'checkpoints' and "
                             "'writes' tables of a stock SqliteSaver)")
    with SqliteSaver.from_conn_string(path) as saver:
        yield StockSource(saver, label=path)


@contextlib.contextmanager
def _open_postgres(url: str) -> Iterator[StockSource]:
    label = mask_url(url)
    try:
        from langgraph.checkpoint.postgres import PostgresSaver
    except ImportError:
        raise MigrationError(f"reading a stock PostgresSaver database needs langgraph-"
                             f"checkpoint-postgres: {INSTALL}") from None
    import psycopg

    stack = contextlib.ExitStack()
    with stack:
        try:
            saver = stack.enter_context(PostgresSaver.from_conn_string(url))
            with saver._cursor() as cur:
                cur.execute("SELECT to_regclass('checkpoints') IS NOT NULL AND "
                            "to_regclass('checkpoint_writes') IS NOT NULL AS ok")
                row = cur.fetchone()
        except psycopg.Error as exc:
            raise MigrationError(f"cannot read the stock PostgresSaver database at {label}: "
                                 f"{exc}".strip()) from exc
        if not (row and row["ok"]):
            raise MigrationError(
                f"{label} holds no LangGraph checkpoints (no 'checkpoints' and "
                "'checkpoint_writes' tables on the search path; for another schema add "
                "?options=-csearch_path%3D<schema> to the URL)")
        yield StockSource(saver, label=label)


# ===================================================================================== writing


@dataclass
class ImportCounts:
    """What importing one thread stored, and how many stock records were there already."""

    checkpoints: int = 0
    writes: int = 0
    skipped: int = 0
    notes: list[str] = field(default_factory=list)


def import_thread(source: StockSource, saver: RemitSaver, thread_id: str) -> ImportCounts:
    """Import one thread from ``source`` through ``saver`` (a RemitSaver without
    ``legacy=``): what remit already holds, or held and pruned since, is skipped.

    Safe to call from many processes at once (see the module docstring)."""
    stock = source.read_thread(thread_id)
    counts = ImportCounts()

    @effect(name="import", on_in_doubt="retry", wait=IMPORT_WAIT)
    def generation(before: dict[str, list[Any]]) -> dict[str, list[Any]]:
        after = _import_newer(saver, stock, _frontier(before), counts)
        return {ns: [cid, n] for ns, (cid, n) in after.items()}

    with effect_scope(saver.store, MARKER_RUN, thread_id):
        frontier = _frontier(generation({}))
        while _newer(stock, frontier):  # the stock saver wrote more since the last import
            frontier = _frontier(generation({ns: [c, n] for ns, (c, n) in frontier.items()}))
    counts.skipped = max(0, stock.records() - counts.checkpoints - counts.writes)
    return counts


def _frontier(raw: Any) -> Frontier:
    return {str(ns): (str(v[0]), int(v[1])) for ns, v in (raw or {}).items()}


def _where(t: CheckpointTuple) -> tuple[str, str]:
    conf = t.config["configurable"]
    return str(conf.get("checkpoint_ns") or ""), str(conf["checkpoint_id"])


def _newer(stock: StockThread, frontier: Frontier) -> bool:
    for t in stock.checkpoints:
        ns, cid = _where(t)
        mark = frontier.get(ns)
        if mark is None or cid > mark[0]:
            return True
        if cid == mark[0] and len(stock.writes.get((ns, cid), ())) > mark[1]:
            return True
    return False


def _import_newer(saver: RemitSaver, stock: StockThread, before: Frontier,
                  counts: ImportCounts) -> Frontier:
    """Store the stock checkpoints newer than ``before`` (and writes added to the one at
    ``before``, if remit still has it); return the new frontier."""
    store = saver.store
    thread_id = stock.thread_id
    after = dict(before)
    for t in stock.checkpoints:  # oldest first: remit's seq order follows
        ns, cid = _where(t)
        writes = stock.writes.get((ns, cid), [])
        mark = before.get(ns)
        if mark is not None and cid < mark[0]:
            continue
        have = store.get_checkpoint(thread_id, cid, ns=ns)
        if mark is not None and cid == mark[0]:
            if have is None:  # imported before, pruned or deleted in remit since: stays gone
                continue
        elif have is None:
            parent = (t.parent_config or {}).get("configurable", {}).get("checkpoint_id")
            config: RunnableConfig = {"configurable": {
                "thread_id": thread_id, "checkpoint_ns": ns,
                **({"checkpoint_id": parent} if parent else {})}}
            checkpoint = t.checkpoint
            saver._put(config, checkpoint, t.metadata, dict(checkpoint["channel_versions"]),
                       from_update=False)
            counts.checkpoints += 1
        present = {(w.task_id, w.idx) for w in have.writes} if have is not None else set()
        tasks: dict[str, list[StockWrite]] = {}
        for w in writes:
            if (w.task_id, w.idx) not in present:
                tasks.setdefault(w.task_id, []).append(w)
        for task_id, rows in tasks.items():
            store.put_writes(
                thread_id, cid, task_id,
                [(w.idx, w.channel, storable(w.value, store.serde)) for w in rows],
                ns=ns, task_path=rows[0].task_path, overwrite=False,
            )
            counts.writes += len(rows)
        if ns not in after or cid >= after[ns][0]:
            after[ns] = (cid, len(writes))
    return after


# =================================================================================== migrate


def migrate(source: str | os.PathLike[str] | BaseCheckpointSaver[Any], target: str | Store,
            *, run_id: str | None = None) -> MigrationReport:
    """Import every thread (or only ``run_id``) of a stock LangGraph saver into remit.

    ``source``: a stock ``SqliteSaver`` file path, a ``postgresql://`` URL of a stock
    ``PostgresSaver`` database, or an open ``SqliteSaver``/``PostgresSaver``.
    ``target``: a remit store URL or an open :class:`~remit_core.Store`.

    Running it again stores nothing twice: what is already imported is counted in
    ``skipped``, and only what the stock saver wrote since is added.
    """
    from remit_langgraph.saver import RemitSaver

    with contextlib.ExitStack() as stack:
        src = stack.enter_context(open_source(source))
        store = target if isinstance(target, Store) else stack.enter_context(open_store(target))
        report = MigrationReport(source=src.label, target=store.url)
        threads = src.thread_ids()
        if run_id is not None:
            if run_id not in threads:
                raise MigrationError(f"no thread {run_id!r} in {src.label}")
            threads = [run_id]
        saver = RemitSaver(store)
        for thread_id in threads:
            counts = import_thread(src, saver, thread_id)
            report.checkpoints += counts.checkpoints
            report.writes += counts.writes
            report.skipped += counts.skipped
            report.runs += 1 if counts.checkpoints or counts.writes else 0
        if threads and not src._has_task_path():
            report.notes.append("the source's writes table has no task_path column (it "
                                "predates LangGraph recording it): writes were imported with ''")
        return report


__all__ = ["MARKER_RUN", "ImportCounts", "StockSource", "import_thread", "migrate",
           "open_source"]
