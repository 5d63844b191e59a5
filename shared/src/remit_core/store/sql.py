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

The backends differ in a :class:`Dialect`: how a parameter is written, what ``now``
is (SQLite: this host's clock, bound as a parameter; PostgreSQL: the server's clock, so
that hosts with skewed clocks agree on leases) and how keys sort.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from functools import cache
from typing import Any, Generic, Protocol, TypeVar

from remit_core.records import (
    CheckpointRow,
    ClaimOutcome,
    ClaimRow,
    ReceiptOutcome,
    ReceiptRow,
    WriteRow,
)
from remit_core.store import decisions
from remit_core.store.base import Store
from remit_core.store.decisions import Change, From, Verdict

#: every table of a store; their names are remit's, in whatever database or schema
TABLES = ("remit_meta", "remit_runs", "remit_checkpoints", "remit_blobs", "remit_writes",
          "remit_receipts", "remit_claims", "remit_chunks")

#: the data tables of a run (what delete_run deletes; remit_runs last)
RUN_TABLES = ("remit_checkpoints", "remit_blobs", "remit_writes", "remit_chunks",
              "remit_receipts", "remit_claims", "remit_runs")

#: the columns of a checkpoint row as CheckpointRow takes them
CHECKPOINT_COLUMNS = ("run_id", "ns", "checkpoint_id", "parent_id", "kind", "execution_id",
                      "data", "metadata", "versions", "created_at", "seq")
#: the columns of a pending write after its checkpoint's key, as WriteRow takes them
WRITE_COLUMNS = ("task_id", "idx", "channel", "value", "task_path")

#: the record tables: (column, PostgreSQL type); a float8 column is a time
RECEIPT_COLUMNS = (("key", "text"), ("run_id", "text"), ("step", "text"), ("name", "text"),
                   ("ordinal", "int4"), ("status", "text"), ("owner", "text"),
                   ("fence", "int8"), ("lease_until", "float8"), ("started_at", "float8"),
                   ("completed_at", "float8"), ("result", "bytea"), ("attempt", "int4"))
CLAIM_COLUMNS = (("key", "text"), ("run_id", "text"), ("status", "text"), ("owner", "text"),
                 ("fence", "int8"), ("lease_until", "float8"), ("digest", "text"),
                 ("value", "bytea"), ("claimed_at", "float8"), ("consumed_at", "float8"))

USAGE_KEYS = ("checkpoints", "blobs", "blob_bytes", "writes", "receipts", "claims", "chunks",
              "chunk_bytes")


def _bytes(v: Any) -> bytes | None:
    return None if v is None else bytes(v)


def checkpoint_row(r: Sequence[Any], versions: Callable[[Any], dict[str, str]]
                   ) -> CheckpointRow:
    """A checkpoint from the columns of :data:`CHECKPOINT_COLUMNS` (``versions`` decodes
    the backend's form of the version map)."""
    return CheckpointRow(r[0], r[1], r[2], r[3], r[4], r[5], bytes(r[6]), bytes(r[7]),
                         versions(r[8]), float(r[9]), int(r[10]))


def write_rows(run_id: str, ns: str, checkpoint_id: str, rows: Iterator[Sequence[Any]]
               ) -> list[WriteRow]:
    """Pending writes from the columns of :data:`WRITE_COLUMNS`."""
    return [WriteRow(run_id, ns, checkpoint_id, t, int(i), ch, bytes(v), p)
            for t, i, ch, v, p in rows]


def receipt_row(r: Sequence[Any]) -> ReceiptRow:
    return ReceiptRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10],
                      _bytes(r[11]), r[12])


def claim_row(r: Sequence[Any]) -> ClaimRow:
    return ClaimRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], _bytes(r[7]), r[8], r[9])


def versions_json(versions: Mapping[str, str]) -> str:
    return json.dumps(versions)


class Dialect:
    """How the shared statements are written for one backend."""

    def __init__(self, *, style: str, now: str, collate: str = "", casts: bool = False):
        #: a named parameter: ``style.format(name)``
        self.style = style
        #: the SQL of the backend clock (epoch seconds)
        self.now = now
        #: after ``key`` in ORDER BY: byte order whatever the database's collation
        self.collate = collate
        self.casts = casts

    def p(self, name: str, type_: str | None = None) -> str:
        mark = self.style.format(name)
        return f"{mark}::{type_}" if self.casts and type_ else mark


R = TypeVar("R", ReceiptRow, ClaimRow)


class Records(Generic[R]):
    """The statements on one record table (receipts or claims) in one dialect."""

    def __init__(self, table: str, columns: Sequence[tuple[str, str]],
                 row: Callable[[Sequence[Any]], R], order: str, d: Dialect) -> None:
        self.table = table
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
        #: insert-if-absent with every time an offset from the clock (``n.t``), returning
        #: the row written, or nothing when the key exists
        self.insert_stamped = (
            f"INSERT INTO {table} ({cols}) SELECT "
            + ", ".join(f"n.t + {d.p(c, t)}" if t == "float8" else d.p(c, t)
                        for c, t in columns)
            + f" FROM (SELECT {d.now} AS t) AS n ON CONFLICT (key) DO NOTHING "
            f"RETURNING {cols}")
        self.update = (f"UPDATE {table} SET "
                       f"{', '.join(f'{c} = {d.p(c, t)}' for c, t in columns[1:])} WHERE {key}")
        self.delete = f"DELETE FROM {table} WHERE {key}"
        order_by = f"ORDER BY {order}, key{d.collate}"
        self.list_all = f"SELECT {cols} FROM {table} {order_by}"
        self.list_run = f"SELECT {cols} FROM {table} WHERE run_id = {d.p('run')} {order_by}"
        self._changes: dict[int, str] = {}  # by id(): the changes are module constants

    def params(self, row: R) -> dict[str, Any]:
        return {n: getattr(row, n) for n in self.names}

    def change(self, change: Change) -> str:
        """``change`` as one conditional statement: its guard is the WHERE clause."""
        found = self._changes.get(id(change))
        if found is None:
            found = self._changes[id(change)] = self._render(change)
        return found

    def _render(self, change: Change) -> str:
        d = self._d
        where = f"key = {d.p('key')}"
        if change.fenced:
            where += f" AND owner = {d.p('owner')} AND fence = {d.p('fence', 'int8')}"
        if change.status is not None:
            where += f" AND status = {_literal(change.status)}"
        if change.sets is None:
            return f"DELETE FROM {self.table} WHERE {where}"
        terms = {From.NOW: d.now, From.LEASE_END: f"{d.now} + {d.p('lease', 'float8')}",
                 From.RESULT: d.p("result", "bytea")}
        sets = ", ".join(f"{c} = {terms[v] if isinstance(v, From) else _literal(v)}"
                         for c, v in change.sets.items())
        return f"UPDATE {self.table} SET {sets} WHERE {where}"


@cache
def _literal(text: str) -> str:
    """A constant of :mod:`~remit_core.store.decisions` (a status) as an SQL literal."""
    assert text.isidentifier(), text
    return f"'{text}'"


class Conn(Protocol):
    """What the shared code uses of a sqlite3 or psycopg connection."""

    def execute(self, sql: str, params: Any, /) -> Any: ...


Decide = Callable[[R | None, float], Verdict[Any, Any]]


class SqlStore(Store):
    """The receipt and claim operations of the SQL backends (see the module docstring)."""

    _receipts: Records[ReceiptRow]
    _claims: Records[ClaimRow]

    def _records(self, d: Dialect, receipts: str, claims: str) -> None:
        self._receipts = Records(receipts, RECEIPT_COLUMNS, receipt_row, "started_at", d)
        self._claims = Records(claims, CLAIM_COLUMNS, claim_row, "claimed_at", d)

    # ------------------------------------------------------------------------------- hooks

    @abstractmethod
    def _writing(self) -> AbstractContextManager[Conn]:
        """A connection for one write statement that is its own atomic operation."""

    @abstractmethod
    def _reading(self) -> AbstractContextManager[Conn]:
        """A connection for reading."""

    @abstractmethod
    def _decide(self, records: Records[R], key: str, decide: Decide[R]) -> Verdict[Any, Any]:
        """In one atomic operation: read the record ``key`` (or None), take
        ``decide(record, now)`` and write its verdict (:meth:`_apply`). Returns the verdict."""

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

    # ---------------------------------------------------------------------------- receipts

    def _start_receipt(self, key: str, run_id: str, step: str, name: str, ordinal: int,
                       owner: str, lease: float, may_take_over: bool
                       ) -> tuple[ReceiptOutcome, ReceiptRow]:
        def decide(cur: ReceiptRow | None, now: float) -> Verdict[ReceiptOutcome, ReceiptRow]:
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
               value: bytes | None) -> tuple[ClaimOutcome, ClaimRow]:
        def decide(cur: ClaimRow | None, now: float) -> Verdict[ClaimOutcome, ClaimRow]:
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


__all__ = ["CHECKPOINT_COLUMNS", "CLAIM_COLUMNS", "RECEIPT_COLUMNS", "TABLES", "Dialect",
           "Records", "SqlStore", "checkpoint_row", "claim_row", "receipt_row", "write_rows"]
