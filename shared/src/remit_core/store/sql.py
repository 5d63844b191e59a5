"""What the two SQL backends share: table and column lists, row builders, and the receipt
and claim operations, over a few hooks.

:class:`SqlStore` implements every receipt and claim operation of the
:class:`~remit_core.store.base.Store` once, for SQLite and PostgreSQL alike, with the
decisions of :mod:`remit_core.store.decisions`:

* a decision (start a receipt, claim, consume) reads the record, calls the pure
  function and writes its verdict, all in the backend's :meth:`SqlStore._decide` --
  one ``BEGIN IMMEDIATE`` transaction on SQLite, the row lock (after an optimistic
  ``INSERT ... ON CONFLICT DO NOTHING`` and an unlocked read) on PostgreSQL;
* a fenced change (complete, renew, release) is one conditional statement rendered
  from its :class:`~remit_core.store.decisions.Change` by :meth:`Records.change`.

It also implements, once, the checkpoint operations whose SQL both databases speak:
the reads of checkpoints (filters, then the backend's :meth:`SqlStore._checkpoints`,
one consistent read with the blobs and writes), and copy, prune, delete, usage and the
run listing. Each backend keeps what only it can do well: writing checkpoints and
writes (PostgreSQL in one round trip), and reading rows with their blobs.

The backends differ in a :class:`Dialect` (a subclass in each backend file): how a
parameter is written, what ``now`` is (SQLite: this host's clock, bound as a
parameter; PostgreSQL: the server's clock, so that hosts with skewed clocks agree on
leases), how keys sort, how a JSON object's entries and a list parameter are read.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from functools import cache
from typing import Any, Generic, Literal, Protocol, TypeVar

from remit_core import records
from remit_core.records import (
    CheckpointRow,
    ClaimRow,
    ReceiptRow,
    RunInfo,
    RunQuery,
    RunRow,
    WriteRow,
)
from remit_core.store import chunks as _chunks
from remit_core.store import decisions
from remit_core.store.base import USAGE_KEYS, Found, Store
from remit_core.store.decisions import Change, From, Verdict

#: every table of a store; their names are remit's, in whatever database or schema
TABLES = ("remit_meta", "remit_runs", "remit_checkpoints", "remit_blobs", "remit_writes",
          "remit_receipts", "remit_claims", "remit_chunks", "remit_lifecycle")

#: The first migration of both SQL backends: every table but the chunks (migration 2).
#: Append-only like the migration lists that use it: never edit it, add a migration. Its
#: placeholders are the column types that differ, given by each backend's ``SCHEMA_TYPES``:
#: ``seq`` (an increasing integer key), ``time`` (epoch seconds as a float), ``bytes``,
#: ``json`` (the versions object), ``int64``, and ``keyed`` (after a table that has a
#: primary key: SQLite's `` WITHOUT ROWID``).
SCHEMA = """
    CREATE TABLE remit_runs (
        run_id TEXT PRIMARY KEY,
        created_at {time} NOT NULL,
        updated_at {time} NOT NULL
    );
    CREATE TABLE remit_checkpoints (
        seq {seq},
        run_id TEXT NOT NULL,
        ns TEXT NOT NULL,
        checkpoint_id TEXT NOT NULL,
        parent_id TEXT,
        kind TEXT NOT NULL,
        execution_id TEXT,
        data {bytes} NOT NULL,
        metadata {bytes} NOT NULL,
        versions {json} NOT NULL,
        created_at {time} NOT NULL,
        UNIQUE (run_id, ns, checkpoint_id)
    );
    CREATE INDEX remit_checkpoints_latest ON remit_checkpoints (run_id, ns, seq DESC);
    CREATE INDEX remit_checkpoints_parent ON remit_checkpoints (run_id, ns, parent_id, kind);
    CREATE INDEX remit_checkpoints_execution ON remit_checkpoints (execution_id)
        WHERE execution_id IS NOT NULL;
    CREATE TABLE remit_blobs (
        run_id TEXT NOT NULL,
        ns TEXT NOT NULL,
        channel TEXT NOT NULL,
        version TEXT NOT NULL,
        value {bytes} NOT NULL,
        PRIMARY KEY (run_id, ns, channel, version)
    ){keyed};
    CREATE TABLE remit_writes (
        run_id TEXT NOT NULL,
        ns TEXT NOT NULL,
        checkpoint_id TEXT NOT NULL,
        task_id TEXT NOT NULL,
        idx INTEGER NOT NULL,
        channel TEXT NOT NULL,
        value {bytes} NOT NULL,
        task_path TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (run_id, ns, checkpoint_id, task_id, idx)
    ){keyed};
    CREATE TABLE remit_receipts (
        key TEXT PRIMARY KEY,
        run_id TEXT NOT NULL,
        step TEXT NOT NULL,
        name TEXT NOT NULL,
        ordinal INTEGER NOT NULL,
        status TEXT NOT NULL,
        owner TEXT,
        fence {int64} NOT NULL,
        lease_until {time} NOT NULL,
        started_at {time} NOT NULL,
        completed_at {time},
        result {bytes},
        attempt INTEGER NOT NULL
    );
    CREATE INDEX remit_receipts_run ON remit_receipts (run_id);
    CREATE TABLE remit_claims (
        key TEXT PRIMARY KEY,
        run_id TEXT NOT NULL,
        status TEXT NOT NULL,
        owner TEXT,
        fence {int64} NOT NULL,
        lease_until {time} NOT NULL,
        digest TEXT,
        value {bytes},
        claimed_at {time} NOT NULL,
        consumed_at {time}
    );
    CREATE INDEX remit_claims_run ON remit_claims (run_id);
    """

#: The second migration: large values in content-defined chunks, once per run
#: (remit_core.store.chunks). Append-only too; ``chunk_key`` is how the table is keyed.
CHUNKS = """
    CREATE TABLE remit_chunks (
        run_id TEXT NOT NULL,
        digest {bytes} NOT NULL,
        value {bytes} NOT NULL,
        {chunk_key} (run_id, digest)
    );
    """

#: A later migration (SQLite's third, PostgreSQL's fourth): each run's lifecycle (who
#: executes it, parked, done, failed), one record per run keyed by its id (``key``, as the
#: other record tables). Append-only too.
#: ``abandoned`` is not stored: a running record whose lease has expired.
LIFECYCLE = """
    CREATE TABLE remit_lifecycle (
        key TEXT PRIMARY KEY,
        run_id TEXT NOT NULL,
        framework TEXT NOT NULL,
        name TEXT NOT NULL,
        status TEXT NOT NULL,
        owner TEXT,
        fence {int64} NOT NULL,
        lease_until {time} NOT NULL,
        waiting {bytes},
        error {bytes},
        attempts INTEGER NOT NULL,
        started_at {time} NOT NULL,
        updated_at {time} NOT NULL
    );
    CREATE INDEX remit_lifecycle_status ON remit_lifecycle (status, updated_at);
    CREATE INDEX remit_lifecycle_name ON remit_lifecycle (name, status, updated_at);
    """

#: The fourth migration: the claims still held, by lease expiry, so that a recovery finds
#: the deliveries that died holding one (list_lapsed_claims) without reading every claim.
#: Append-only too.
LAPSING = """
    CREATE INDEX remit_claims_lapsing ON remit_claims (lease_until, key)
        WHERE status = 'claimed';
    """

#: The fifth migration: the running runs of each framework and name by lease expiry, in
#: the order take_runs takes them (``ORDER BY lease_until, key``; ``{ordered_key}`` is the
#: key in that order's collation), so that a take reads the expired head of that order and
#: stops at its limit. Without it, every take read and sorted every running run of the
#: table (PostgreSQL: a sequential scan of 10 000 runs and a sort, 13.8 ms, for each run a
#: recoverer took). Append-only too.
LIFECYCLE_LAPSING = """
    CREATE INDEX remit_lifecycle_lapsing
        ON remit_lifecycle (framework, name, lease_until, {ordered_key})
        WHERE status = 'running';
    """

#: the columns of a checkpoint row as CheckpointRow takes them
CHECKPOINT_COLUMNS = ("run_id", "ns", "checkpoint_id", "parent_id", "kind", "execution_id",
                      "data", "metadata", "versions", "created_at", "seq")
#: those columns of the checkpoints table read as ``c``
CK_COLS = ", ".join(f"c.{c}" for c in CHECKPOINT_COLUMNS)
#: the columns a checkpoint write gives (seq is the store's)
CK_WRITTEN = ", ".join(CHECKPOINT_COLUMNS[:-1])
#: after the values of a checkpoint insert: a rewrite keeps the row's seq and created_at
CK_UPSERT = ("ON CONFLICT (run_id, ns, checkpoint_id) DO UPDATE SET "
             "parent_id = excluded.parent_id, kind = excluded.kind, "
             "execution_id = excluded.execution_id, data = excluded.data, "
             "metadata = excluded.metadata, versions = excluded.versions RETURNING seq")
#: the columns of a pending write after its checkpoint's key, as WriteRow takes them
WRITE_COLUMNS = ("task_id", "idx", "channel", "value", "task_path")
WRITE_COLS = ", ".join(WRITE_COLUMNS)

#: the record tables: (column, PostgreSQL type); a float8 column is a time
RECEIPT_COLUMNS = (("key", "text"), ("run_id", "text"), ("step", "text"), ("name", "text"),
                   ("ordinal", "int4"), ("status", "text"), ("owner", "text"),
                   ("fence", "int8"), ("lease_until", "float8"), ("started_at", "float8"),
                   ("completed_at", "float8"), ("result", "bytea"), ("attempt", "int4"))
CLAIM_COLUMNS = (("key", "text"), ("run_id", "text"), ("status", "text"), ("owner", "text"),
                 ("fence", "int8"), ("lease_until", "float8"), ("digest", "text"),
                 ("value", "bytea"), ("claimed_at", "float8"), ("consumed_at", "float8"))
RUN_COLUMNS = (("key", "text"), ("run_id", "text"), ("framework", "text"), ("name", "text"),
               ("status", "text"), ("owner", "text"), ("fence", "int8"),
               ("lease_until", "float8"), ("waiting", "bytea"), ("error", "bytea"),
               ("attempts", "int4"), ("started_at", "float8"), ("updated_at", "float8"))


def _bytes(v: Any) -> bytes | None:
    return None if v is None else bytes(v)


def checkpoint_row(r: Sequence[Any], versions: Callable[[Any], dict[str, str]]
                   ) -> CheckpointRow:
    """A checkpoint from the columns of :data:`CHECKPOINT_COLUMNS` (``versions`` decodes
    the backend's form of the version map)."""
    return CheckpointRow(r[0], r[1], r[2], r[3], r[4], r[5], bytes(r[6]), bytes(r[7]),
                         versions(r[8]), float(r[9]), int(r[10]))


def write_row(ck: CheckpointRow, r: Sequence[Any]) -> WriteRow:
    """A pending write of ``ck`` from the columns of :data:`WRITE_COLUMNS`."""
    return WriteRow(ck.run_id, ck.ns, ck.checkpoint_id, r[0], int(r[1]), r[2], bytes(r[3]),
                    r[4])


def receipt_row(r: Sequence[Any]) -> ReceiptRow:
    return ReceiptRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10],
                      _bytes(r[11]), r[12])


def claim_row(r: Sequence[Any]) -> ClaimRow:
    return ClaimRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], _bytes(r[7]), r[8], r[9])


def run_row(r: Sequence[Any]) -> RunRow:
    return RunRow(r[0], r[1], r[2], r[3], r[4], r[5], int(r[6]), float(r[7]), _bytes(r[8]),
                  _bytes(r[9]), int(r[10]), float(r[11]), float(r[12]))


class Dialect:
    """How the shared statements are written for one backend (a subclass in each backend
    file sets these)."""

    #: a named parameter: ``style.format(name)``
    style: str
    #: the SQL of the backend clock (epoch seconds)
    now: str
    #: the same clock, read once per statement (PostgreSQL: an index can range over it,
    #: which it cannot over a volatile one); a read that lists by expiry uses it
    statement_now: str = ""
    #: after a key in ORDER BY: byte order whatever the database's collation
    collate: str = ""
    #: parameters carry their type (``%(name)s::text``)
    casts: bool = False
    #: the table function of a JSON object's (key, value) text pairs
    json_each: str = "json_each"
    #: after a SELECT in a write transaction: lock the rows read, passing over the rows
    #: another transaction holds (a backend whose write transactions are serial: nothing)
    skip_locked: str = ""

    def p(self, name: str, type_: str | None = None) -> str:
        mark = self.style.format(name)
        return f"{mark}::{type_}" if self.casts and type_ else mark

    def any_of(self, column: str, name: str) -> str:
        """``column`` is one of the texts of list parameter ``name`` (:meth:`texts`)."""
        raise NotImplementedError

    def texts(self, values: Sequence[str]) -> Any:
        """A list of texts as the parameter of :meth:`any_of`."""
        raise NotImplementedError

    def limit(self, n: int | None) -> Any:
        """``LIMIT``'s parameter, None for no limit."""
        return n


class Tables:
    """The names of a store's tables, qualified by its schema (PostgreSQL)."""

    def __init__(self, qualifier: str = "") -> None:
        q = qualifier
        self.meta, self.runs, self.ck = f"{q}remit_meta", f"{q}remit_runs", f"{q}remit_checkpoints"
        self.bl, self.wr, self.ch = f"{q}remit_blobs", f"{q}remit_writes", f"{q}remit_chunks"
        self.rc, self.cl = f"{q}remit_receipts", f"{q}remit_claims"
        self.lc = f"{q}remit_lifecycle"
        #: everything of a run, in the order delete_run deletes it (the run last)
        self.of_run = (self.ck, self.bl, self.wr, self.ch, self.rc, self.cl, self.lc,
                       self.runs)


R = TypeVar("R", ReceiptRow, ClaimRow, RunRow)


class Records(Generic[R]):
    """The statements on one record table (receipts or claims) in one dialect."""

    def __init__(self, table: str, columns: Sequence[tuple[str, str]],
                 row: Callable[[Sequence[Any]], R], order: str, d: Dialect, *,
                 kept: bool = False) -> None:
        self.table = table
        #: a record most decisions find already stored (a run's lifecycle: every start
        #: but the first), where a receipt's or claim's decision mostly makes it: a
        #: backend may read it before trying to insert it
        self.kept = kept
        self.row: Callable[[Sequence[Any]], R] = row
        self._d = d
        self.names = tuple(c for c, _ in columns)
        cols = ", ".join(self.names)
        key = f"key = {d.p('key')}"
        self.select = f"SELECT {cols} FROM {table} WHERE {key}"
        #: the record with the clock: its last column is now
        self.select_now = f"SELECT {cols}, {d.now} FROM {table} WHERE {key}"
        self.insert = (f"INSERT INTO {table} ({cols}) VALUES "
                       f"({', '.join(d.p(c, t) for c, t in columns)})")
        #: insert-if-absent (the rows affected tell whether it inserted)
        self.insert_new = f"{self.insert} ON CONFLICT (key) DO NOTHING"
        # the insert-if-absent of a row whose every time is an offset from the clock n.t
        stamped = (f"INSERT INTO {table} ({cols}) SELECT "
                   + ", ".join(f"n.t + {d.p(c, t)}" if t == "float8" else d.p(c, t)
                               for c, t in columns))
        returning = f"ON CONFLICT (key) DO NOTHING RETURNING {cols}"
        #: insert-if-absent with every time an offset from the clock (``n.t``), returning
        #: the row written, or nothing when the key exists
        self.insert_stamped = f"{stamped} FROM (SELECT {d.now} AS t) AS n {returning}"
        #: :attr:`insert_stamped` and, when the key exists, :attr:`select_now`, in one
        #: statement (PostgreSQL): (true, the row written, now) or (false, the stored row,
        #: now); no row when the key was committed after the statement's snapshot (a
        #: concurrent inserter: the insert waited for it, the read cannot see it)
        self.insert_or_select = (
            f"WITH n AS (SELECT {d.now} AS t), ins AS ({stamped} FROM n {returning}) "
            f"SELECT true, {cols}, (SELECT t FROM n) FROM ins UNION ALL "
            f"SELECT false, {cols}, n.t FROM {table}, n WHERE {key} "
            "AND NOT EXISTS (SELECT FROM ins)")
        self.update = (f"UPDATE {table} SET "
                       f"{', '.join(f'{c} = {d.p(c, t)}' for c, t in columns[1:])} WHERE {key}")
        #: compare-and-set: the update, only while the row is as it was read (every column
        #: as the ``was_`` parameters give it; PostgreSQL)
        self.swap = (self.update + "".join(
            f" AND {c} IS NOT DISTINCT FROM {d.p('was_' + c, t)}" for c, t in columns[1:]))
        self.delete = f"DELETE FROM {table} WHERE {key}"
        order_by = f"ORDER BY {order}, key{d.collate}"
        self.list_all = f"SELECT {cols} FROM {table} {order_by}"
        self.list_run = f"SELECT {cols} FROM {table} WHERE run_id = {d.p('run')} {order_by}"
        self._changes: dict[int, str] = {}  # by id(): the changes are module constants
        self._changed: dict[int, str] = {}  # the same, returning the changed record

    def params(self, row: R) -> dict[str, Any]:
        return {n: getattr(row, n) for n in self.names}

    def swap_params(self, was: R, row: R) -> dict[str, Any]:
        """The parameters of :attr:`swap`: ``row`` written where ``was`` is stored."""
        return {**self.params(row), **{f"was_{n}": getattr(was, n) for n in self.names[1:]}}

    def change(self, change: Change) -> str:
        """``change`` as one conditional statement: its guard is the WHERE clause."""
        found = self._changes.get(id(change))
        if found is None:
            found = self._changes[id(change)] = self._render(change)
        return found

    def changed(self, change: Change) -> str:
        """``change`` as one conditional statement that returns the changed record (no
        row: the guard did not hold)."""
        found = self._changed.get(id(change))
        if found is None:
            found = self._changed[id(change)] = (
                f"{self._render(change)} RETURNING {', '.join(self.names)}")
        return found

    def _render(self, change: Change) -> str:
        d = self._d
        where = f"key = {d.p('key')}"
        if change.fenced:
            where += f" AND owner = {d.p('owner')} AND fence = {d.p('fence', 'int8')}"
        statuses = change.statuses
        if statuses is not None:
            where += (f" AND status = {_literal(statuses[0])}" if len(statuses) == 1 else
                      f" AND status IN ({', '.join(map(_literal, statuses))})")
        if change.sets is None:
            return f"DELETE FROM {self.table} WHERE {where}"
        terms = {From.NOW: d.now, From.LEASE_END: f"{d.now} + {d.p('lease', 'float8')}",
                 From.RESULT: d.p("result", "bytea"), From.OWNER: d.p("owner", "text"),
                 From.FRAMEWORK: d.p("framework", "text"), From.NAME: d.p("name", "text")}

        def term(column: str, value: str | float | From | None) -> str:
            if value is From.NEXT:  # the column's own value, plus one
                return f"{column} + 1"
            return terms[value] if isinstance(value, From) else _literal(value)

        sets = ", ".join(f"{c} = {term(c, v)}" for c, v in change.sets.items())
        return f"UPDATE {self.table} SET {sets} WHERE {where}"


@cache
def _literal(value: str | float | None) -> str:
    """A constant of :mod:`~remit_core.store.decisions` (a status, a number or None) as
    an SQL literal."""
    if value is None:
        return "NULL"
    if isinstance(value, int | float):
        return repr(float(value))
    assert value.replace("-", "_").isidentifier(), value
    return f"'{value}'"


class Conn(Protocol):
    """What the shared code uses of a sqlite3 or psycopg connection."""

    def execute(self, sql: str, params: Any, /) -> Any: ...

    def cursor(self) -> Any: ...


Decide = Callable[[R | None, float], Verdict[Any, Any]]


class SqlStore(Store):
    """The receipt and claim operations of the SQL backends (see the module docstring)."""

    _d: Dialect
    _t: Tables
    _receipts: Records[ReceiptRow]
    _claims: Records[ClaimRow]

    def _sql(self, d: Dialect, tables: Tables) -> None:
        """Set the dialect and tables (in the backend's __init__, before any operation)."""
        self._d, self._t = d, tables
        self._receipts = Records(tables.rc, RECEIPT_COLUMNS, receipt_row, "started_at", d)
        self._claims = Records(tables.cl, CLAIM_COLUMNS, claim_row, "claimed_at", d)
        self._lifecycle = Records(tables.lc, RUN_COLUMNS, run_row, "updated_at", d, kept=True)
        p, ck = d.p, tables.ck
        #: CO (exclusive_child): another checkpoint of the same kind with this parent
        self._sibling_sql = (
            f"SELECT checkpoint_id FROM {ck} WHERE run_id = {p('run')} AND ns = {p('ns')} "
            f"AND parent_id = {p('parent')} AND kind = {p('kind')} "
            f"AND checkpoint_id <> {p('cid')} LIMIT 1")
        #: the conditions of _read_checkpoint: by run and namespace, and (True) by id too
        latest = (f"c.run_id = {p('run')}", f"c.ns = {p('ns')}")
        self._one_where = {False: latest, True: (*latest, f"c.checkpoint_id = {p('cid')}")}

    # ------------------------------------------------------------------------------- hooks

    @abstractmethod
    def _transaction(self) -> AbstractContextManager[Conn]:
        """One write transaction."""

    def _lock_runs(self, conn: Conn, *run_ids: str) -> None:
        """In a transaction: serialise it with the checkpoint writes of these runs (a
        backend whose write transactions are serial anyway does nothing)."""

    @abstractmethod
    def _checkpoints(self, where: Sequence[str], args: Mapping[str, Any], limit: int | None,
                     with_writes: bool) -> list[Found]:
        """In one consistent read: the checkpoints (alias ``c``) matching every condition
        of ``where``, newest first (seq descending), at most ``limit``, each with its blobs
        and (``with_writes``) its pending writes."""

    @abstractmethod
    def _writing(self) -> AbstractContextManager[Conn]:
        """A connection for one write statement that is its own atomic operation."""

    @abstractmethod
    def _reading(self) -> AbstractContextManager[Conn]:
        """A connection for reading."""

    @abstractmethod
    def _decide(self, records: Records[R], key: str, decide: Decide[R], *,
                insert_first: bool = False) -> Verdict[Any, Any]:
        """In one atomic operation: read the record ``key`` (or None), take
        ``decide(record, now)`` and write its verdict (:meth:`_apply`). Returns the verdict.
        ``insert_first``: try a verdict on a new key before reading, as for records that
        are not ``kept``."""

    def _clock(self) -> dict[str, Any]:
        """The parameters the dialect's ``now`` needs (none for a server clock)."""
        return {}

    @staticmethod
    def _apply(conn: Conn, records: Records[R], verdict: Verdict[Any, Any]) -> None:
        """Write what ``verdict`` says (in the transaction that read the record)."""
        if verdict.write == "insert":
            conn.execute(records.insert, records.params(verdict.row))
        elif verdict.write == "update":
            conn.execute(records.update, records.params(verdict.row))
        elif verdict.write == "delete":
            conn.execute(records.delete, {"key": verdict.row.key})

    def _change(self, records: Records[R], change: Change, key: str, *, owner: str | None = None,
                fence: int | None = None, lease: float = 0.0,
                result: bytes | None = None) -> bool:
        with self._writing() as conn:
            cur = conn.execute(records.change(change), {
                "key": key, "owner": owner, "fence": fence, "lease": lease, "result": result,
                **self._clock()})
            return bool(cur.rowcount == 1)

    def _get(self, records: Records[R], key: str) -> R | None:
        with self._reading() as conn:
            r = conn.execute(records.select, {"key": key}).fetchone()
        return None if r is None else records.row(r)

    def _list(self, records: Records[R], run_id: str | None) -> list[R]:
        with self._reading() as conn:
            rows = (conn.execute(records.list_all, {}) if run_id is None
                    else conn.execute(records.list_run, {"run": run_id})).fetchall()
        return [records.row(r) for r in rows]

    # ------------------------------------------------------------------------- checkpoints

    def _read_checkpoint(self, run_id: str, ns: str, checkpoint_id: str | None,
                         with_writes: bool) -> Found | None:
        where = self._one_where[checkpoint_id is not None]
        found = self._checkpoints(where, {"run": run_id, "ns": ns, "cid": checkpoint_id}, 1,
                                  with_writes)
        return found[0] if found else None

    def _list_checkpoints(self, run_id: str | None, ns: str | None, before: str | None,
                          limit: int | None, execution_ids: Sequence[str] | None,
                          with_writes: bool) -> list[Found]:
        d, p = self._d, self._d.p
        where: list[str] = []
        args: dict[str, Any] = {"run": run_id, "ns": ns, "before": before}
        if run_id is not None:
            where.append(f"c.run_id = {p('run')}")
        if ns is not None:
            where.append(f"c.ns = {p('ns')}")
        if execution_ids is not None:
            where.append(d.any_of("c.execution_id", "executions"))
            args["executions"] = d.texts(execution_ids)
        if before is not None:
            # the lowest seq of a checkpoint with that id (of the run); none: nothing listed
            ck = self._t.ck
            if run_id is None:
                sub = f"SELECT min(seq) FROM {ck} WHERE checkpoint_id = {p('before')}"
            else:  # each namespace of the run by the unique key, not a scan of the run
                run, cid = p("run"), p("before")
                sub = (f"WITH RECURSIVE spaces (ns) AS ("
                       f"SELECT min(ns) FROM {ck} WHERE run_id = {run} UNION ALL "
                       f"SELECT (SELECT min(n.ns) FROM {ck} n WHERE n.run_id = {run} "
                       f"AND n.ns > spaces.ns) FROM spaces WHERE spaces.ns IS NOT NULL) "
                       f"SELECT min((SELECT b.seq FROM {ck} b WHERE b.run_id = {run} "
                       f"AND b.ns = spaces.ns AND b.checkpoint_id = {cid})) FROM spaces")
            where.append(f"c.seq < ({sub})")
        return self._checkpoints(where, args, limit, with_writes)

    def _list_runs(self, limit: int | None) -> list[tuple[RunInfo, RunRow | None, float]]:
        t, d = self._t, self._d
        if self._keeps_lifecycles:
            cols = ", ".join(f"l.{c}" for c, _ in RUN_COLUMNS)
            joined = f"LEFT JOIN {t.lc} l ON l.key = r.run_id "
        else:  # (NULL as a column of every lifecycle: none kept)
            cols, joined = ", ".join("NULL" for _ in RUN_COLUMNS), ""
        with self._reading() as conn:
            rows = conn.execute(
                f"SELECT r.run_id, r.created_at, r.updated_at, {self._run_counts('r.run_id')}, "
                f"{cols}, {d.now} FROM {t.runs} r {joined}"
                f"ORDER BY r.updated_at DESC, r.run_id{d.collate} LIMIT {d.p('limit')}",
                {"limit": d.limit(None if limit is None else int(limit)),
                 **self._clock()}).fetchall()
        return [(RunInfo(r[0], r[1], r[2], int(r[3]), r[4], r[5]),
                 None if r[6] is None else run_row(r[6:-1]), float(r[-1])) for r in rows]

    def _run_counts(self, run: str) -> str:
        """The listing's columns of the run named by the SQL expression ``run``: its
        checkpoint count, the latest checkpoint's id and kind."""
        ck = self._t.ck
        latest = f"FROM {ck} c WHERE c.run_id = {run} ORDER BY c.seq DESC LIMIT 1"
        return (f"(SELECT count(*) FROM {ck} c WHERE c.run_id = {run}), "
                f"(SELECT c.checkpoint_id {latest}), (SELECT c.kind {latest})")

    def _usage(self, run_id: str | None) -> dict[str, int]:
        t = self._t
        where = "" if run_id is None else f" WHERE run_id = {self._d.p('run')}"
        counted = (f"count(*) FROM {t.ck}", f"count(*) FROM {t.bl}",
                   f"coalesce(sum(length(value)), 0) FROM {t.bl}", f"count(*) FROM {t.wr}",
                   f"count(*) FROM {t.rc}", f"count(*) FROM {t.cl}", f"count(*) FROM {t.ch}",
                   f"coalesce(sum(length(value)), 0) FROM {t.ch}")
        # one statement, so that the counts come from one snapshot
        with self._reading() as conn:
            r = conn.execute("SELECT " + ", ".join(f"(SELECT {c}{where})" for c in counted),
                             {"run": run_id}).fetchone()
        return {k: int(v or 0) for k, v in zip(USAGE_KEYS, r, strict=True)}

    def _delete_run(self, run_id: str) -> None:
        with self._transaction() as conn:
            self._lock_runs(conn, run_id)
            for table in self._t.of_run:
                conn.execute(f"DELETE FROM {table} WHERE run_id = {self._d.p('run')}",
                             {"run": run_id})

    def _copy_run(self, source: str, target: str) -> None:
        t, p = self._t, self._d.p
        src, tgt = p("source"), p("target", "text")
        args = {"source": source, "target": target, **self._clock()}
        with self._transaction() as conn:
            self._lock_runs(conn, source, target)
            if conn.execute(f"SELECT 1 FROM {t.runs} WHERE run_id = {src}", args
                            ).fetchone() is None:
                return
            # (WHERE true: SQLite reads the ON CONFLICT of an INSERT ... SELECT only after one)
            conn.execute(
                f"INSERT INTO {t.runs} (run_id, created_at, updated_at) SELECT {tgt}, n.t, n.t "
                f"FROM (SELECT {self._d.now} AS t) AS n WHERE true "
                "ON CONFLICT (run_id) DO UPDATE SET updated_at = excluded.updated_at", args)
            conn.execute(  # in seq order, each with a new seq; an existing one is kept
                f"INSERT INTO {t.ck} ({CK_WRITTEN}) SELECT {tgt}, "
                f"{CK_WRITTEN.removeprefix('run_id, ')} FROM {t.ck} WHERE run_id = {src} "
                "ORDER BY seq ON CONFLICT (run_id, ns, checkpoint_id) DO NOTHING", args)
            for table, cols in ((t.bl, "ns, channel, version, value"),
                                (t.wr, f"ns, checkpoint_id, {WRITE_COLS}"),
                                (t.ch, "digest, value")):
                conn.execute(f"INSERT INTO {table} (run_id, {cols}) SELECT {tgt}, {cols} "
                             f"FROM {table} WHERE run_id = {src} ON CONFLICT DO NOTHING", args)

    def _prune_run(self, run_id: str, keep_latest: int) -> None:
        p, ck = self._d.p, self._t.ck
        with self._transaction() as conn:
            self._lock_runs(conn, run_id)
            conn.execute(
                f"DELETE FROM {ck} WHERE run_id = {p('run')} AND seq NOT IN (SELECT seq FROM "
                "(SELECT seq, row_number() OVER (PARTITION BY ns ORDER BY seq DESC) AS rn "
                f"FROM {ck} WHERE run_id = {p('run')}) AS ranked WHERE rn <= {p('keep')})",
                {"run": run_id, "keep": keep_latest})
            self._drop_orphans(conn, run_id)

    def _delete_executions(self, execution_ids: list[str]) -> None:
        d, ck = self._d, self._t.ck
        args = {"executions": d.texts(execution_ids)}
        match = d.any_of("execution_id", "executions")
        with self._transaction() as conn:
            self._lock_runs(conn, *(r[0] for r in conn.execute(
                f"SELECT DISTINCT run_id FROM {ck} WHERE {match}", args).fetchall()))
            gone = {r[0] for r in conn.execute(
                f"DELETE FROM {ck} WHERE {match} RETURNING run_id", args).fetchall()}
            for run_id in sorted(gone):
                self._drop_orphans(conn, run_id)

    def _drop_orphans(self, conn: Conn, run_id: str) -> None:
        """Delete the run's writes whose checkpoint is gone, its blobs that no checkpoint
        names, and its chunks that no remaining blob or write names."""
        t, p = self._t, self._d.p
        run = {"run": run_id}
        conn.execute(
            f"DELETE FROM {t.wr} AS w WHERE w.run_id = {p('run')} AND NOT EXISTS (SELECT 1 "
            f"FROM {t.ck} c WHERE c.run_id = w.run_id AND c.ns = w.ns "
            "AND c.checkpoint_id = w.checkpoint_id)", run)
        conn.execute(
            f"DELETE FROM {t.bl} AS b WHERE b.run_id = {p('run')} AND NOT EXISTS (SELECT 1 "
            f"FROM {t.ck} c CROSS JOIN {self._d.json_each}(c.versions) AS j "
            "WHERE c.run_id = b.run_id AND c.ns = b.ns AND j.key = b.channel "
            "AND j.value = b.version)", run)
        stored = [bytes(d) for (d,) in conn.execute(
            f"SELECT digest FROM {t.ch} WHERE run_id = {p('run')}", run).fetchall()]
        if not stored:
            return
        manifests = {"run": run_id, "magic": _chunks.MAGIC}
        keep = _chunks.referenced(bytes(v) for (v,) in conn.execute(
            f"SELECT value FROM {t.bl} WHERE run_id = {p('run')} "
            f"AND substr(value, 1, 2) = {p('magic')} UNION ALL SELECT value FROM {t.wr} "
            f"WHERE run_id = {p('run')} AND substr(value, 1, 2) = {p('magic')}",
            manifests).fetchall())
        gone = [{"run": run_id, "digest": d} for d in stored if d not in keep]
        if gone:
            conn.cursor().executemany(
                f"DELETE FROM {t.ch} WHERE run_id = {p('run')} AND digest = {p('digest')}",
                gone)

    # ---------------------------------------------------------------------------- receipts

    def _start_receipt(self, key: str, run_id: str, step: str, name: str, ordinal: int,
                       owner: str, lease: float, may_take_over: bool
                       ) -> tuple[records.ReceiptOutcome, ReceiptRow]:
        def decide(cur: ReceiptRow | None, now: float
                   ) -> Verdict[records.ReceiptOutcome, ReceiptRow]:
            return decisions.start_receipt(
                cur, key=key, run_id=run_id, step=step, name=name, ordinal=ordinal,
                owner=owner, lease=lease, may_take_over=may_take_over, now=now)

        v = self._decide(self._receipts, key, decide)
        return v.outcome, v.row

    def _complete_receipt(self, key: str, owner: str, fence: int, result: bytes) -> bool:
        return self._change(self._receipts, decisions.COMPLETE_RECEIPT, key, owner=owner,
                            fence=fence, result=result)

    def _release_receipt(self, key: str, owner: str, fence: int) -> bool:
        return self._change(self._receipts, decisions.RELEASE_RECEIPT, key, owner=owner,
                            fence=fence)

    def _renew_receipt(self, key: str, owner: str, fence: int, lease: float) -> bool:
        return self._change(self._receipts, decisions.RENEW_RECEIPT, key, owner=owner,
                            fence=fence, lease=lease)

    def _resolve_receipt(self, key: str, result: bytes) -> bool:
        return self._change(self._receipts, decisions.RESOLVE_RECEIPT, key, result=result)

    def _reset_receipt(self, key: str) -> None:
        with self._writing() as conn:
            conn.execute(self._receipts.delete, {"key": key})

    def _get_receipt(self, key: str) -> ReceiptRow | None:
        return self._get(self._receipts, key)

    def _list_receipts(self, run_id: str | None) -> list[ReceiptRow]:
        return self._list(self._receipts, run_id)

    # ------------------------------------------------------------------------------ claims

    def _claim(self, key: str, run_id: str, owner: str, lease: float, digest: str | None,
               value: bytes | None) -> tuple[records.ClaimOutcome, ClaimRow]:
        def decide(cur: ClaimRow | None, now: float) -> Verdict[records.ClaimOutcome, ClaimRow]:
            return decisions.claim(cur, key=key, run_id=run_id, owner=owner, lease=lease,
                                   digest=digest, value=value, now=now)

        v = self._decide(self._claims, key, decide)
        return v.outcome, v.row

    def _consume_claim(self, key: str, owner: str, fence: int, digest: str | None
                       ) -> tuple[bool, ClaimRow | None]:
        def decide(cur: ClaimRow | None, now: float) -> Verdict[bool, ClaimRow | None]:
            return decisions.consume_claim(cur, owner=owner, fence=fence, digest=digest,
                                           now=now)

        v = self._decide(self._claims, key, decide)
        return v.outcome, v.row

    def _release_claim(self, key: str, owner: str, fence: int) -> bool:
        return self._change(self._claims, decisions.RELEASE_CLAIM, key, owner=owner,
                            fence=fence)

    def _renew_claim(self, key: str, owner: str, fence: int, lease: float) -> bool:
        return self._change(self._claims, decisions.RENEW_CLAIM, key, owner=owner,
                            fence=fence, lease=lease)

    def _get_claim(self, key: str) -> ClaimRow | None:
        return self._get(self._claims, key)

    def _list_claims(self, run_id: str | None) -> list[ClaimRow]:
        return self._list(self._claims, run_id)

    def _list_lapsed_claims(self, framework: str, name: str | None, limit: int,
                            after: tuple[float, str] | None) -> list[ClaimRow]:
        if not self._keeps_lifecycles:
            return []
        d = self._d
        p = d.p
        cols = ", ".join(f"c.{c}" for c, _ in CLAIM_COLUMNS)
        args: dict[str, Any] = {**self._clock(), "framework": framework, "limit": limit}
        where = ["c.status = 'claimed'", f"c.lease_until <= {d.statement_now or d.now}",
                 "l.key = c.run_id",
                 "l.status = 'parked'", f"l.framework = {p('framework', 'text')}"]
        if name is not None:
            where.append(f"l.name = {p('name', 'text')}")
            args["name"] = name
        if after is not None:
            where.append(f"(c.lease_until > {p('after_lease', 'float8')} OR "
                         f"(c.lease_until = {p('after_lease', 'float8')} AND "
                         f"c.key{d.collate} > {p('after_key', 'text')}))")
            args["after_lease"], args["after_key"] = after
        # CROSS JOIN: SQLite reads the lapsed claims first (by their index), then each
        # one's lifecycle by key, never the parked runs first (PostgreSQL plans freely)
        sql = (f"SELECT {cols} FROM {self._t.cl} AS c CROSS JOIN {self._t.lc} AS l "
               f"WHERE {' AND '.join(where)} "
               f"ORDER BY c.lease_until, c.key{d.collate} LIMIT {p('limit')}")
        with self._reading() as conn:
            return [claim_row(r) for r in conn.execute(sql, args).fetchall()]

    # ---------------------------------------------------------------------------- lifecycle

    def _start_run(self, run_id: str, framework: str, name: str, owner: str, lease: float,
                   recovery: records.Recovery | None, likely_new: bool = False
                   ) -> tuple[records.RunStartOutcome, RunRow | None, float]:
        if recovery is None and not likely_new:
            # most starts continue a run that is not running: one conditional statement
            # (decisions.CONTINUE_RUN, what start_run decides for it); any other record,
            # or none, is read and decided below
            with self._writing() as conn:
                r = conn.execute(self._lifecycle.changed(decisions.CONTINUE_RUN), {
                    "key": run_id, "owner": owner, "framework": framework, "name": name,
                    "lease": lease, **self._clock()}).fetchall()
            if r:
                row = run_row(r[0])
                return "started", row, row.started_at
        seen: list[float] = []

        def decide(cur: RunRow | None, now: float
                   ) -> Verdict[records.RunStartOutcome, RunRow | None]:
            seen.append(now)
            return decisions.start_run(cur, run_id=run_id, framework=framework, name=name,
                                       owner=owner, lease=lease, recovery=recovery,
                                       now=now)

        v = self._decide(self._lifecycle, run_id, decide, insert_first=likely_new)
        # (an insert stamped by the server clock was decided at now 0: its started_at is now)
        now = v.row.started_at if v.write == "insert" and v.row is not None else seen[-1]
        return v.outcome, v.row, now

    def _end_run(self, run_id: str, owner: str, fence: int, status: records.RunEnd,
                 detail: bytes | None) -> bool:
        # decisions.end_run as one fenced statement (decisions.END_RUN)
        return self._change(self._lifecycle, decisions.END_RUN[status], run_id, owner=owner,
                            fence=fence, result=detail)

    def _import_run(self, run_id: str, framework: str, name: str,
                    status: records.RunEnd | Literal["abandoned"], owner: str,
                    detail: bytes | None, replaces: tuple[int, float] | None = None) -> bool:
        def decide(cur: RunRow | None, now: float) -> Verdict[bool, RunRow | None]:
            return decisions.import_run(cur, run_id=run_id, framework=framework, name=name,
                                        status=status, owner=owner, detail=detail, now=now,
                                        replaces=replaces)

        return bool(self._decide(self._lifecycle, run_id, decide).outcome)

    def _take_runs(self, framework: str, name: str | None, owner: str, lease: float,
                   recovery: records.Recovery, limit: int
                   ) -> list[tuple[records.RunStartOutcome, RunRow, float]]:
        if not self._keeps_lifecycles:
            return []
        lc = self._lifecycle
        sql, args = self._take_runs_query(framework, name, limit)
        taken: list[tuple[records.RunStartOutcome, RunRow, float]] = []
        with self._transaction() as conn:
            for r in conn.execute(sql, args).fetchall():
                now, row = float(r[-1]), run_row(r[:-1])
                v = decisions.start_run(row, run_id=row.run_id, framework="", name="",
                                        owner=owner, lease=lease, recovery=recovery, now=now)
                if v.write == "update" and v.row is not None:
                    taken.append((v.outcome, v.row, now))
            if taken:
                conn.cursor().executemany(lc.update, [lc.params(row) for _, row, _ in taken])
        return taken

    def _take_runs_query(self, framework: str, name: str | None, limit: int
                         ) -> tuple[str, dict[str, Any]]:
        """take_runs' statement and its parameters: the expired head of the running runs
        of ``framework`` (and ``name``) in lease order, read through
        remit_lifecycle_lapsing (:data:`LIFECYCLE_LAPSING`), at most ``limit``, locked
        where the backend locks rows (those another take holds are skipped)."""
        d = self._d
        p = d.p
        args: dict[str, Any] = {**self._clock(), "framework": framework, "limit": limit}
        if name is not None:
            args["name"] = name
        sql = (f"SELECT {', '.join(self._lifecycle.names)}, {d.now} FROM {self._t.lc} "
               f"WHERE status = 'running' AND lease_until <= {d.now} "
               f"AND framework = {p('framework', 'text')}"
               + ("" if name is None else f" AND name = {p('name', 'text')}")
               + f" ORDER BY lease_until, key{d.collate} LIMIT {p('limit')}{d.skip_locked}")
        return sql, args

    def _renew_run(self, run_id: str, owner: str, fence: int, lease: float) -> bool:
        return self._change(self._lifecycle, decisions.RENEW_RUN, run_id, owner=owner,
                            fence=fence, lease=lease)

    @property
    def _keeps_lifecycles(self) -> bool:
        """The store has the lifecycle table (a store of an older layout, opened
        read-only, does not: it has no lifecycles to read)."""
        return any("remit_lifecycle" in step
                   for step in self.migrations[:self.layout_version])

    def _get_run(self, run_id: str) -> tuple[RunRow, float] | None:
        if not self._keeps_lifecycles:
            return None
        with self._reading() as conn:
            r = conn.execute(self._lifecycle.select_now,
                             {"key": run_id, **self._clock()}).fetchone()
        return None if r is None else (run_row(r), float(r[-1]))

    def _list_lifecycles(self, query: RunQuery) -> list[tuple[RunInfo, RunRow, float]]:
        if not self._keeps_lifecycles:
            return []
        t, d = self._t, self._d
        p = d.p
        cols = ", ".join(f"l.{c}" for c, _ in RUN_COLUMNS)
        where: list[str] = []
        args: dict[str, Any] = {**self._clock(), "limit": d.limit(query.limit)}
        if query.status == "abandoned":
            where.append(f"l.status = 'running' AND l.lease_until <= {d.now}")
        elif query.status == "running":
            where.append(f"l.status = 'running' AND l.lease_until > {d.now}")
        elif query.status is not None:
            where.append(f"l.status = {p('status')}")
            args["status"] = query.status
        if query.framework is not None:
            where.append(f"l.framework = {p('framework')}")
            args["framework"] = query.framework
        if query.name is not None:
            where.append(f"l.name = {p('name')}")
            args["name"] = query.name
        if query.updated_before is not None:
            where.append(f"l.updated_at < {p('before', 'float8')}")
            args["before"] = float(query.updated_before)
        if query.cursor is not None:
            where.append(f"(l.updated_at < {p('cu', 'float8')} OR (l.updated_at = "
                         f"{p('cu', 'float8')} AND l.key{d.collate} > {p('ck', 'text')}))")
            args["cu"], args["ck"] = query.cursor
        sql = (f"SELECT {cols}, {d.now}, r.created_at, r.updated_at, "
               f"{self._run_counts('l.run_id')} FROM {t.lc} l LEFT JOIN {t.runs} r ON r.run_id = l.run_id"
               + (f" WHERE {' AND '.join(where)}" if where else "")
               + f" ORDER BY l.updated_at DESC, l.key{d.collate} LIMIT {p('limit')}")
        with self._reading() as conn:
            rows = conn.execute(sql, args).fetchall()
        n = len(RUN_COLUMNS)
        found = []
        for r in rows:
            row = run_row(r[:n])
            now, created, updated, count, latest_id, latest_kind = r[n:n + 6]
            info = RunInfo(row.run_id, row.started_at if created is None else float(created),
                           row.updated_at if updated is None else float(updated), int(count),
                           latest_id, latest_kind)
            found.append((info, row, float(now)))
        return found


__all__ = ["CHECKPOINT_COLUMNS", "CLAIM_COLUMNS", "RECEIPT_COLUMNS", "RUN_COLUMNS", "TABLES",
           "Dialect", "Found", "Records", "SqlStore", "Tables", "checkpoint_row", "claim_row",
           "receipt_row", "run_row", "write_row"]
