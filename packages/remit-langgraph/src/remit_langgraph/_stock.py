"""Reading LangGraph's stock savers, and importing one thread into remit.

The machinery under ``remit migrate langgraph`` (:mod:`remit_langgraph.migrate`) and
``RemitSaver(legacy=...)``; see :mod:`remit_langgraph.migrate` for what is read, what is
written, and how an import is idempotent and safe from many processes. It writes through
any saver with a remit ``store`` and LangGraph's ``put`` (:class:`ImportTarget`, a
``RemitSaver`` without ``legacy=``), so it does not import the saver module: the saver
imports this one.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import ormsgpack
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)

from remit_core import Store, effect
from remit_core.adapter import MigrationError, RecordsRefused, effect_scope, mask_url
from remit_langgraph import _seam
from remit_langgraph._serde import storable

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


Allowed = frozenset[tuple[str, ...]]
"""Exact ``(module, name)`` pairs (and, for method records, ``(module, name, method)``)."""

# The classes LangGraph's serializer writes as constructor records for standard values
# (its encoder's own list, for langgraph-checkpoint releases without SAFE_MSGPACK_TYPES).
_STANDARD: Allowed = frozenset({
    ("datetime", "datetime"), ("datetime", "date"), ("datetime", "time"),
    ("datetime", "timedelta"), ("datetime", "timezone"), ("uuid", "UUID"),
    ("decimal", "Decimal"), ("builtins", "set"), ("builtins", "frozenset"),
    ("collections", "deque"), ("zoneinfo", "ZoneInfo"), ("re", "compile"),
    *(("ipaddress", f"IPv{v}{kind}") for v in (4, 6) for kind in ("Address", "Interface",
                                                                  "Network")),
    *((module, name) for module in ("pathlib", "pathlib._local")
      for name in ("Path", "PosixPath", "WindowsPath")),
    *(("langgraph.types", name) for name in ("Send", "Interrupt", "Command")),
    *((f"langchain_core.messages.{module}", f"{name}{chunk}")
      for module, name in (("base", "BaseMessage"), ("human", "HumanMessage"),
                           ("ai", "AIMessage"), ("system", "SystemMessage"),
                           ("chat", "ChatMessage"), ("tool", "ToolMessage"),
                           ("function", "FunctionMessage"))
      for chunk in ("", "Chunk")),
    ("langchain_core.messages.modifier", "RemoveMessage"),
})
_STANDARD_METHODS: Allowed = frozenset({("datetime", "datetime", "fromisoformat")})

# LangGraph's msgpack ext codes (langgraph.checkpoint.serde.jsonplus): a constructor
# call with one argument, positional or keyword arguments; a class method call; pydantic
# v1 and v2 models; a numpy array; a DeltaChannel snapshot (langgraph-checkpoint 4).
_EXT_CONSTRUCTORS = frozenset({0, 1, 2, 4, 5})
_EXT_METHOD, _EXT_NUMPY, _EXT_DELTA = 3, 6, 7


def default_allowed() -> tuple[Allowed, Allowed]:
    """The allow-list used when nothing is added: (types, methods)."""
    types: set[tuple[str, ...]] = set(_STANDARD)
    methods: set[tuple[str, ...]] = set(_STANDARD_METHODS)
    types |= _seam.SAFE_MSGPACK_TYPES | _seam.curated_message_types()
    methods |= _seam.SAFE_MSGPACK_METHODS
    return frozenset(types), frozenset(methods)


def _normalise(allow: Iterable[tuple[str, str] | type]) -> set[tuple[str, ...]]:
    out: set[tuple[str, ...]] = set()
    for item in allow:
        if isinstance(item, type):
            out.add((item.__module__, item.__name__))
        elif (isinstance(item, tuple) and len(item) == 2
              and all(isinstance(part, str) for part in item)):
            out.add(item)
        else:
            raise TypeError(f"allow= takes classes or (module, name) pairs, not {item!r}")
    return out


@dataclass(frozen=True, slots=True)
class _Ext:
    """An ext record as parsed, not resolved."""

    code: int
    data: bytes


def _parse(data: bytes) -> Any:
    # ext records become _Ext values: nothing inside one is parsed, named or resolved here
    return ormsgpack.unpackb(data, ext_hook=_Ext, option=ormsgpack.OPT_NON_STR_KEYS)


def _lc_key(value: dict[Any, Any]) -> tuple[str, ...] | None:
    """The (module, name) a LangChain/LangGraph JSON constructor record names."""
    ids = value.get("id")
    if not (isinstance(ids, list) and len(ids) >= 2 and all(isinstance(p, str) for p in ids)):
        return None
    if value.get("lc") == 1:  # LangChain's legacy ids map to their import paths
        with contextlib.suppress(ImportError):
            from langchain_core.load import mapping

            for table in ("SERIALIZABLE_MAPPING", "_OG_SERIALIZABLE_MAPPING",
                          "OLD_CORE_NAMESPACES_MAPPING"):
                target = getattr(mapping, table, {}).get(tuple(ids))
                if target:
                    ids = list(target)
                    break
    return (".".join(ids[:-1]), ids[-1])


def scan_record(type_: str, data: bytes | None, allowed: Allowed,
                methods: Allowed = _STANDARD_METHODS) -> list[str]:
    """What a stock record names that is not allowed (empty: it may be decoded).

    Parses the bytes without resolving anything: no import, no attribute lookup, no
    call; nesting is walked with a list, not by recursion per ext."""
    if type_ in ("null", "empty", "bytes", "bytearray"):
        return []
    if type_ == "pickle":
        return ["a value stored with pickle (remit never unpickles stored bytes)"]
    if data is None:
        return []
    refused: list[str] = []
    try:
        if type_ == "json":
            return _scan_json(json.loads(data), allowed)
        if type_ != "msgpack":
            return []  # only the stock serializer reads it (e.g. encrypted): checked there
        todo: list[Any] = [_parse(data)]
        while todo:
            value = todo.pop()
            if isinstance(value, dict):
                todo.extend(value.keys())
                todo.extend(value.values())
            elif isinstance(value, list | tuple):
                todo.extend(value)
            elif isinstance(value, _Ext):
                if value.code == _EXT_DELTA:
                    todo.append(_parse(value.data))
                    continue
                if value.code == _EXT_NUMPY:
                    if ("numpy", "ndarray") not in allowed:
                        refused.append("names numpy.ndarray")
                    continue
                inner = _parse(value.data)
                if not (isinstance(inner, list) and len(inner) >= 3
                        and isinstance(inner[0], str) and isinstance(inner[1], str)):
                    refused.append(f"holds a malformed ext record (code {value.code})")
                elif value.code in _EXT_CONSTRUCTORS:
                    if (inner[0], inner[1]) in allowed:
                        todo.append(inner[2])
                    else:
                        refused.append(f"names {inner[0]}.{inner[1]}")
                elif value.code == _EXT_METHOD and len(inner) >= 4 and isinstance(inner[3], str):
                    if (inner[0], inner[1], inner[3]) in methods:
                        todo.append(inner[2])
                    else:
                        refused.append(f"names {inner[0]}.{inner[1]}.{inner[3]}")
                else:
                    refused.append(f"holds an ext record of unknown code {value.code}")
    except (ValueError, TypeError, RecursionError) as exc:  # msgpack / JSON parse errors
        refused.append(f"does not parse as {type_}: {type(exc).__name__}")
    return refused


def _scan_json(root: Any, allowed: Allowed) -> list[str]:
    refused: list[str] = []
    todo: list[Any] = [root]
    while todo:
        value = todo.pop()
        if isinstance(value, list):
            todo.extend(value)
        elif isinstance(value, dict):
            if value.get("lc") in (1, 2) and "type" in value:
                kind = value.get("type")
                key = _lc_key(value)
                name = ".".join(key) if key else repr(value.get("id"))
                if kind != "constructor":
                    refused.append(f"holds a LangChain {kind!r} record ({name})")
                    continue
                if key is None or key not in allowed:
                    refused.append(f"names {name}")
                    continue
                if value.get("lc") == 2 and value.get("method") not in (None, [None]):
                    refused.append(f"names {name}.{value.get('method')}")
                    continue
            todo.extend(value.values())
    return refused


class _Refused(Exception):
    def __init__(self, what: list[str]) -> None:
        self.what = what
        super().__init__("; ".join(what))


class _GuardedSerde:
    """The stock serializer's decoding, behind :func:`scan_record`: a record that names
    anything not allowed is refused before any decoder sees it."""

    def __init__(self, inner: Any, allowed: Allowed, methods: Allowed) -> None:
        self.inner = inner
        self.allowed = allowed
        self.methods = methods

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        return self.inner.dumps_typed(obj)  # type: ignore[no-any-return]

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        type_, raw = data
        refused = scan_record(type_, raw, self.allowed, self.methods)
        if refused:
            raise _Refused(refused)
        return self.inner.loads_typed(data)


def _strict_jsonplus(allowed: Allowed) -> Any:
    """LangGraph's serializer in its strict mode: pickle off, only ``allowed`` revived."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    params = inspect.signature(JsonPlusSerializer.__init__).parameters
    if "allowed_msgpack_modules" not in params:  # langgraph-checkpoint 2.1.x: no allow-list;
        return JsonPlusSerializer(pickle_fallback=False)  # scan_record checked every name
    pairs = sorted(k for k in allowed if len(k) == 2)
    json_ids = sorted((*k[0].split("."), k[1]) for k in pairs)
    options: dict[str, Any] = {"allowed_msgpack_modules": pairs}
    if "allowed_json_modules" in params:
        options["allowed_json_modules"] = json_ids
    return JsonPlusSerializer(pickle_fallback=False, **options)


def _guarded(serde: Any, allowed: Allowed, methods: Allowed) -> Any:
    """``serde`` with its innermost LangGraph serializer replaced by a guarded strict one;
    wrappers (EncryptedSerializer, SerializerCompat) are copied, never changed."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    if isinstance(serde, JsonPlusSerializer):
        return _GuardedSerde(_strict_jsonplus(allowed), allowed, methods)
    inner = getattr(serde, "serde", None)
    if inner is not None:
        clone = copy.copy(serde)
        clone.serde = _guarded(inner, allowed, methods)
        return clone
    return _GuardedSerde(serde, allowed, methods)  # a serializer of the app's own


class StockSource:
    """A stock ``SqliteSaver`` or ``PostgresSaver`` to read threads from (never written).

    ``allow``: classes or exact ``(module, name)`` pairs that stock records may name, in
    addition to the default allow-list and the stock serializer's own
    ``allowed_msgpack_modules`` (see the module docstring)."""

    def __init__(self, saver: BaseCheckpointSaver[Any], *, label: str | None = None,
                 allow: Iterable[tuple[str, str] | type] = ()) -> None:
        self.kind = _kind(saver)
        types, methods = default_allowed()
        self.allowed: Allowed = frozenset(types | _seam.serializer_allowlist(saver.serde)
                                          | _normalise(allow))
        self.methods = methods
        self.saver: Any = copy.copy(saver)  # shares the connection and the lock
        self.saver.serde = _guarded(saver.serde, self.allowed, methods)
        self.label = label or type(saver).__name__
        self._task_path: bool | None = None

    def _query(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        if self.kind == "sqlite":
            with self.saver.cursor(transaction=False) as cur:
                cur.execute(sql, params)
                return [tuple(r) for r in cur.fetchall()]
        with _seam.stock_cursor(self.saver) as cur:  # the saver's lock, connection or pool
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

    def _scan_checkpoints(self, thread_id: str) -> list[str]:
        """What the thread's stored checkpoints (SQLite) or channel blobs (PostgreSQL)
        name that is not allowed, one line per record."""
        refused: list[str] = []
        if self.kind == "sqlite":
            rows = self._query("SELECT checkpoint_ns, checkpoint_id, type, checkpoint FROM "
                               "checkpoints WHERE thread_id = ?", (thread_id,))
            for ns, cid, type_, data in rows:
                for what in scan_record(str(type_), _bytes(data), self.allowed, self.methods):
                    refused.append(f"checkpoint {cid!s}{_in_ns(ns)}: {what}")
        else:
            rows = self._query("SELECT checkpoint_ns, channel, version, type, blob FROM "
                               "checkpoint_blobs WHERE thread_id = ?", (thread_id,))
            for ns, channel, version, type_, data in rows:
                for what in scan_record(str(type_), _bytes(data), self.allowed, self.methods):
                    refused.append(f"channel {channel!r} version {version!s}{_in_ns(ns)}: "
                                   f"{what}")
        return refused

    def read_thread(self, thread_id: str) -> StockThread:
        """The thread's checkpoints (stock ``list``) and pending writes (stock table).

        Raises :class:`~remit_core.migrate.RecordsRefused` (nothing decoded) when a
        record of the thread names what is not allowed."""
        table, value = ("writes", "value") if self.kind == "sqlite" else ("checkpoint_writes", "blob")
        try:
            path = "task_path" if self._has_task_path() else "''"
            rows = self._query(
                f"SELECT checkpoint_ns, checkpoint_id, task_id, {path}, idx, channel, type, "
                f"{value} FROM {table} WHERE thread_id = ?", (thread_id,))
            refused = self._scan_checkpoints(thread_id)
            for ns, cid, task_id, _path, idx, channel, type_, data in rows:
                for what in scan_record(str(type_), _bytes(data), self.allowed, self.methods):
                    refused.append(f"pending write of task {task_id!r} (channel {channel!r}, "
                                   f"idx {idx}) on checkpoint {cid!s}{_in_ns(ns)}: {what}")
        except Exception as exc:
            raise _read_error(self.label, thread_id, exc) from exc
        if refused:
            raise RecordsRefused(self.label, {thread_id: refused}, hint=REFUSED_HINT)
        try:
            found = list(self.saver.list({"configurable": {"thread_id": thread_id}}))
            loads = self.saver.serde.loads_typed
            writes: dict[tuple[str, str], list[StockWrite]] = {}
            for ns, cid, task_id, task_path, idx, channel, type_, data in rows:
                writes.setdefault((str(ns), str(cid)), []).append(StockWrite(
                    str(task_id), str(task_path), int(idx), str(channel),
                    loads((type_, _bytes(data)))))
        except _Refused as exc:  # a record only the stock serializer could parse
            raise RecordsRefused(self.label, {thread_id: [f"a stored record: {w}"
                                                          for w in exc.what]},
                                 hint=REFUSED_HINT) from None
        except Exception as exc:
            raise _read_error(self.label, thread_id, exc) from exc
        for rows_of_one in writes.values():
            rows_of_one.sort(key=lambda w: (w.task_path, w.task_id, w.idx))
        found.reverse()  # stock lists newest first (checkpoint id descending)
        return StockThread(thread_id, found, writes)


REFUSED_HINT = (
    "A name outside the allow-list is never imported or called. If a type named is your "
    "own and you trust the file, allow it by exact name: remit_langgraph.migrate.migrate("
    "source, target, allow=[YourClass or ('module', 'Name')]), or for legacy= give the "
    "stock saver JsonPlusSerializer(allowed_msgpack_modules=[...]). Otherwise remove the "
    "record with the stock saver, then import again.")


def _bytes(data: Any) -> bytes | None:
    return bytes(data) if data is not None else None


def _in_ns(ns: Any) -> str:
    return f" (namespace {ns!s})" if ns else ""


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


def _read_error(label: str, thread_id: str, exc: Exception) -> MigrationError:
    return MigrationError(f"could not read thread {thread_id!r} from {label}: "
                          f"{type(exc).__name__}: {exc}")


@contextlib.contextmanager
def open_source(source: str | os.PathLike[str] | BaseCheckpointSaver[Any], *,
                allow: Iterable[tuple[str, str] | type] = ()) -> Iterator[StockSource]:
    """A stock saver to read from: an instance (left open), a SQLite file path
    (``sqlite:///`` prefix optional) or a ``postgresql://`` URL (closed on exit).

    A missing file, a file or database without LangGraph's tables, an unreachable
    server or a missing stock package raise :class:`MigrationError`; nothing is
    created in the source.
    """
    if isinstance(source, BaseCheckpointSaver):
        yield StockSource(source, allow=allow)
        return
    text = os.fspath(source)
    if text.startswith(("postgresql://", "postgres://")):
        with _open_postgres(text, allow) as found:
            yield found
    else:
        with _open_sqlite(text, allow) as found:
            yield found


@contextlib.contextmanager
def _open_sqlite(text: str, allow: Iterable[tuple[str, str] | type]
                 ) -> Iterator[StockSource]:
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
        yield StockSource(saver, label=path, allow=allow)


@contextlib.contextmanager
def _open_postgres(url: str, allow: Iterable[tuple[str, str] | type]
                   ) -> Iterator[StockSource]:
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
            with _seam.stock_cursor(saver) as cur:
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
        yield StockSource(saver, label=label, allow=allow)


# ===================================================================================== writing


@dataclass
class ImportCounts:
    """What importing one thread stored, and how many stock records were there already."""

    checkpoints: int = 0
    writes: int = 0
    skipped: int = 0
    notes: list[str] = field(default_factory=list)


class ImportTarget(Protocol):
    """What an import writes through: a remit store, and LangGraph's ``put`` (a
    ``RemitSaver`` without ``legacy=``: one atomic store write per checkpoint, validated
    with its ``schema=``)."""

    @property
    def store(self) -> Store: ...

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig: ...


def import_thread(source: StockSource, saver: ImportTarget, thread_id: str) -> ImportCounts:
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


def _import_newer(saver: ImportTarget, stock: StockThread, before: Frontier,
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
            saver.put(config, checkpoint, t.metadata, dict(checkpoint["channel_versions"]))
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


__all__ = ["IMPORT_WAIT", "MARKER_RUN", "REFUSED_HINT", "ImportCounts", "ImportTarget",
           "StockSource", "StockThread", "StockWrite", "default_allowed", "import_thread",
           "open_source", "scan_record"]
