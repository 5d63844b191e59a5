"""SQLite backend: the embedded default.

A file store uses WAL and ``synchronous=FULL``, one connection per thread and
process, and ``BEGIN IMMEDIATE`` for every write, so that each contract
primitive is one serialised transaction across all processes on the host.
``sqlite://`` (no path) is an in-memory store for one process.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from remit_core.errors import (
    StoreConfigError,
    StoreNotFound,
    StoreUnavailable,
)
from remit_core.records import (
    BlobRow,
    CheckpointRow,
    RunInfo,
    WriteRow,
)
from remit_core.serde import Serde
from remit_core.store import chunks as _chunks
from remit_core.store.base import Layout
from remit_core.store.decisions import Verdict
from remit_core.store.options import parse_options
from remit_core.store.sql import TABLES, Decide, Dialect, R, Records, SqlStore
from remit_core.urls import mask_url

# Append-only: never edit an entry, add a new one. The store's version is len(MIGRATIONS).
MIGRATIONS: list[str] = [
    """
    CREATE TABLE remit_runs (
        run_id TEXT PRIMARY KEY,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE remit_checkpoints (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id TEXT NOT NULL,
        ns TEXT NOT NULL,
        checkpoint_id TEXT NOT NULL,
        parent_id TEXT,
        kind TEXT NOT NULL,
        execution_id TEXT,
        data BLOB NOT NULL,
        metadata BLOB NOT NULL,
        versions TEXT NOT NULL,
        created_at REAL NOT NULL,
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
        value BLOB NOT NULL,
        PRIMARY KEY (run_id, ns, channel, version)
    ) WITHOUT ROWID;
    CREATE TABLE remit_writes (
        run_id TEXT NOT NULL,
        ns TEXT NOT NULL,
        checkpoint_id TEXT NOT NULL,
        task_id TEXT NOT NULL,
        idx INTEGER NOT NULL,
        channel TEXT NOT NULL,
        value BLOB NOT NULL,
        task_path TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (run_id, ns, checkpoint_id, task_id, idx)
    ) WITHOUT ROWID;
    CREATE TABLE remit_receipts (
        key TEXT PRIMARY KEY,
        run_id TEXT NOT NULL,
        step TEXT NOT NULL,
        name TEXT NOT NULL,
        ordinal INTEGER NOT NULL,
        status TEXT NOT NULL,
        owner TEXT,
        fence INTEGER NOT NULL,
        lease_until REAL NOT NULL,
        started_at REAL NOT NULL,
        completed_at REAL,
        result BLOB,
        attempt INTEGER NOT NULL
    );
    CREATE INDEX remit_receipts_run ON remit_receipts (run_id);
    CREATE TABLE remit_claims (
        key TEXT PRIMARY KEY,
        run_id TEXT NOT NULL,
        status TEXT NOT NULL,
        owner TEXT,
        fence INTEGER NOT NULL,
        lease_until REAL NOT NULL,
        digest TEXT,
        value BLOB,
        claimed_at REAL NOT NULL,
        consumed_at REAL
    );
    CREATE INDEX remit_claims_run ON remit_claims (run_id);
    """,
    # 2: large values in content-defined chunks, once per run (remit_core.store.chunks).
    # A rowid table: its rows are 4-64 kB, too large to sit well in a WITHOUT ROWID b-tree.
    """
    CREATE TABLE remit_chunks (
        run_id TEXT NOT NULL,
        digest BLOB NOT NULL,
        value BLOB NOT NULL,
        UNIQUE (run_id, digest)
    );
    """,
]

_MANIFEST_ROWS = (
    "SELECT value FROM remit_blobs WHERE run_id = ?1 AND substr(value, 1, 2) = ?2 "
    "UNION ALL SELECT value FROM remit_writes WHERE run_id = ?1 AND substr(value, 1, 2) = ?2"
)
_BATCH = 500  # digests per IN (...) list

_CK_COLS = ("run_id, ns, checkpoint_id, parent_id, kind, execution_id, data, metadata, versions, "
            "created_at, seq")
# CROSS JOIN makes SQLite's planner keep json_each as the outer loop, so each blob is one
# primary-key lookup. With a plain JOIN it may scan the run's blobs instead (the whole
# history) and read the latest checkpoint in time linear in the history's length.
_BLOBS_OF = """
    SELECT j.key, b.value FROM json_each(?) AS j CROSS JOIN remit_blobs AS b
    ON b.run_id = ? AND b.ns = ? AND b.channel = j.key AND b.version = j.value
"""


def _ck(r: Sequence[Any]) -> CheckpointRow:
    return CheckpointRow(r[0], r[1], r[2], r[3], r[4], r[5], bytes(r[6]), bytes(r[7]),
                         json.loads(r[8]), r[9], r[10])


class SqliteStore(SqlStore):
    """A store in one SQLite file (or in memory)."""

    migrations = MIGRATIONS
    layout_advice = "Use another database file"

    def __init__(self, url: str, path: str | None, *, serde: Serde | None, lease: float,
                 synchronous: str = "FULL", timeout: float = 30.0, mode: int = 0o600,
                 read_only: bool = False) -> None:
        super().__init__(mask_url(url), serde=serde, lease=lease, read_only=read_only)
        self.path = path
        self._synchronous = synchronous
        self._timeout = timeout
        self._mode = mode
        self._local = threading.local()
        self._memory_lock = threading.RLock() if path is None else None
        self._memory_conn: sqlite3.Connection | None = None
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        # the writer lock and connection of this process (remade in a forked child)
        self._wlock = threading.Lock()
        self._wconn: sqlite3.Connection | None = None
        self._wpid = os.getpid()
        self._records(Dialect(style=":{}", now=":now"), "remit_receipts", "remit_claims")
        if not read_only:
            self._create_file()
        self._open_file()

    @classmethod
    def open(cls, url: str, *, serde: Serde | None = None, lease: float | None = None,
             read_only: bool = False, **options: Any) -> SqliteStore:
        masked = mask_url(url)
        parts = urlsplit(url)
        opts = parse_options("sqlite", parts.query, {"lease": lease, **options},
                             scheme="sqlite", where=repr(masked), url=masked,
                             keyword_passthrough=False).values
        if parts.netloc not in ("", "localhost"):
            raise StoreConfigError(
                f"{masked!r} names host {parts.netloc!r}; a SQLite URL has three slashes "
                "before a relative path (sqlite:///app.db) and four before an absolute one "
                "(sqlite:////var/lib/app.db)",
                url=masked,
            )
        raw = unquote(parts.path)
        path = raw[1:] if raw.startswith("/") else raw
        if path in ("", ":memory:"):
            path_or_none = None
        else:
            p = Path(path)
            if not p.parent.exists():
                if read_only:
                    raise StoreNotFound(
                        f"no remit store at {masked!r}: its directory {str(p.parent)!r} does "
                        "not exist. Check the path.", url=masked)
                raise StoreConfigError(
                    f"the directory of {masked!r} ({p.parent}) does not exist; "
                    "create it first",
                    url=masked,
                )
            path_or_none = str(p)
        store = cls(url, path_or_none, serde=serde, lease=opts["lease"],
                    synchronous=opts["synchronous"], timeout=opts["timeout"], mode=opts["mode"],
                    read_only=read_only)
        store.wait = opts["wait"]
        return store

    # ----------------------------------------------------------------------------- connections

    def _permissions(self) -> str:
        """Why this process may not use the file, in a sentence, or "" when it may."""
        if self.path is None:
            return ""
        path = Path(self.path)
        parent = path.parent
        who = f"user {os.geteuid()}" if hasattr(os, "geteuid") else "this user"
        if path.exists() and not os.access(path, os.R_OK):
            return (f"Permission denied: {who} may not read {str(path)!r}; fix the file's "
                    "permissions or run as its owner.")
        if self.read_only:
            return ""
        if path.exists() and not os.access(path, os.W_OK):
            return (f"Permission denied: {str(path)!r} is read-only for {who}; remit writes "
                    "to its store (use `remit inspect` to only read it), so make the file "
                    "writable or run as its owner.")
        if not os.access(parent, os.W_OK | os.X_OK):
            return (f"Permission denied: {who} may not write directory {str(parent)!r}; "
                    "SQLite keeps the -wal and -shm files next to the database, so remit needs "
                    "write access to the directory. Fix its permissions or choose another "
                    "path.")
        return ""

    def _unusable(self, exc: BaseException, doing: str) -> StoreUnavailable:
        """The error for a file SQLite cannot open or write: a permission problem says
        so; only a file that is not a database is asked whether it is one."""
        why = self._permissions()
        msg = str(exc).lower()
        if not why and (isinstance(exc, PermissionError) or (
                isinstance(exc, sqlite3.OperationalError)
                and any(w in msg for w in ("readonly", "unable to open", "permission")))):
            why = ("Check the permissions of the file and of its directory (remit writes "
                   "both: SQLite keeps the -wal and -shm files next to the database) and that "
                   "the file system is not mounted read-only.")
        if why:
            return StoreUnavailable(f"cannot {doing} {self.url!r}: {exc}. {why}", url=self.url)
        hint = (" Is it a SQLite database file?"
                if isinstance(exc, sqlite3.DatabaseError)
                and not isinstance(exc, sqlite3.OperationalError) else "")
        return StoreUnavailable(f"cannot {doing} {self.url!r}: {exc}.{hint}", url=self.url)

    def _create_file(self) -> None:
        """Create the database file, owner-only unless the URL says otherwise (``mode``);
        SQLite gives its -wal and -shm files the database's permissions. An existing file
        keeps its own."""
        if self.path is None:
            return
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                         self._mode)
        except FileExistsError:
            return
        except OSError as exc:
            raise self._unusable(exc, "create") from exc
        try:
            os.fchmod(fd, self._mode)  # exactly the mode asked for, whatever the umask
        finally:
            os.close(fd)

    def _connect(self, *, shared: bool = False) -> sqlite3.Connection:
        try:
            if self.path is not None and self.read_only:
                # mode=rw: never create the file; query_only: never write. Not mode=ro:
                # a read-only connection leaves -wal and -shm files behind.
                uri = f"{Path(self.path).absolute().as_uri()}?mode=rw"
                conn = sqlite3.connect(uri, uri=True, timeout=self._timeout,
                                       isolation_level=None, check_same_thread=not shared)
                try:
                    conn.execute("PRAGMA schema_version")
                except sqlite3.OperationalError:  # e.g. no write access to the directory
                    conn.close()
                    conn = sqlite3.connect(uri.replace("mode=rw", "mode=ro"), uri=True,
                                           timeout=self._timeout, isolation_level=None,
                                           check_same_thread=not shared)
                conn.execute("PRAGMA query_only=ON")
            else:
                conn = sqlite3.connect(self.path or ":memory:", timeout=self._timeout,
                                       isolation_level=None,
                                       check_same_thread=self.path is not None and not shared)
                if self.path is not None:
                    conn.execute("PRAGMA journal_mode=WAL")
                conn.execute(f"PRAGMA synchronous={self._synchronous}")
            conn.execute(f"PRAGMA busy_timeout={int(self._timeout * 1000)}")
        except sqlite3.Error as exc:
            raise self._unusable(exc, "open") from exc
        with self._all_lock:
            self._all.append(conn)
        return conn

    def _conn(self) -> sqlite3.Connection:
        if self.path is None:
            if self._memory_conn is None:
                self._memory_conn = sqlite3.connect(":memory:", isolation_level=None,
                                                    check_same_thread=False)
            return self._memory_conn
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None or getattr(self._local, "pid", None) != os.getpid():
            conn = self._connect()
            self._local.conn = conn
            self._local.pid = os.getpid()
        return conn

    def _writer(self) -> sqlite3.Connection:
        """The process's one connection for write transactions (under the writer lock).

        One connection, not one per thread: a connection's page cache is dropped whenever
        another connection has written since its last transaction, so a step whose
        checkpoint and task writes LangGraph stores from two threads would re-read the
        b-tree pages it just wrote on every transaction. A forked child opens its own
        (_writer_lock, taken first, forgets the parent's)."""
        if self._wconn is None:
            self._wconn = self._connect(shared=True)
        return self._wconn

    def _writer_lock(self) -> threading.Lock:
        """Serialises this process's write transactions on a file store.

        SQLite lets one writer in at a time anyway; without this lock, a second thread
        of this process (LangGraph writes a step's checkpoint and its tasks' writes from
        two threads) would wait for the first in SQLite's busy handler, which sleeps
        in steps of milliseconds, while a lock hands over at once. Other processes
        still wait in the busy handler. A forked child gets a fresh lock (another thread
        may have held the parent's at the fork) and no write connection (SQLite's may not
        cross a fork)."""
        if self._wpid != os.getpid():
            self._wlock = threading.Lock()
            self._wconn = None
            self._wpid = os.getpid()
        return self._wlock

    @contextlib.contextmanager
    def _tx(self, write: bool = True) -> Iterator[sqlite3.Connection]:
        lock: contextlib.AbstractContextManager[Any] = (
            self._memory_lock or (self._writer_lock() if write else contextlib.nullcontext()))
        with lock:
            conn = self._writer() if write and self.path is not None else self._conn()
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def _close(self) -> None:
        with self._all_lock:
            conns, self._all = self._all, []
        for c in conns:
            with contextlib.suppress(Exception):
                c.close()
        if self._memory_conn is not None:
            self._memory_conn.close()
            self._memory_conn = None

    def _is_transient(self, exc: BaseException) -> bool:
        if isinstance(exc, sqlite3.OperationalError):
            msg = str(exc).lower()
            return "locked" in msg or "busy" in msg
        return False

    def _now(self) -> float:
        return time.time()

    # ------------------------------------------------------------------------------- migrations

    def _open_file(self) -> None:
        """Open the store's layout (:meth:`Store._open_layout`), creating a database only
        when opened for writing."""
        if self.read_only and self.path is None:
            raise StoreNotFound(f"no remit store at {self.url!r}: an in-memory database "
                                "starts empty.", url=self.url)
        if self.read_only and not os.path.exists(str(self.path)):
            raise StoreNotFound(
                f"no remit store at {self.url!r}: the file does not exist. Check the path; "
                "remit creates a store only when an application opens it for writing.",
                url=self.url)
        try:
            self._call(self._open_layout)
        except (StoreUnavailable, sqlite3.DatabaseError) as exc:
            if self.read_only and "not a database" in str(exc):
                raise StoreNotFound(f"no remit store at {self.url!r}: the file is not a SQLite "
                                    "database.", url=self.url) from None
            if isinstance(exc, StoreUnavailable):
                raise
            raise self._unusable(exc, "read" if self.read_only else "use") from exc

    def _layout_session(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return self._tx(write=not self.read_only)

    def _read_layout(self, conn: sqlite3.Connection) -> Layout:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "remit_meta" in names:
            return Layout(self._read_meta(conn))
        held = ", ".join(sorted(names)[:5]) + (" ..." if len(names) > 5 else "")
        return Layout(None, strays=sorted(n for n in TABLES if n in names),
                      absent="the database has no remit tables "
                      f"({'its tables: ' + held if names else 'it has no tables'}). Check the "
                      "path.")

    def _create_layout(self, conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE remit_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute("INSERT INTO remit_meta VALUES ('schema', 'remit'), ('version', '0')")

    def _apply_step(self, conn: sqlite3.Connection, step: str) -> None:
        for statement in step.split(";"):
            if statement.strip():
                conn.execute(statement)

    def _set_version(self, conn: sqlite3.Connection, version: int) -> None:
        conn.execute("UPDATE remit_meta SET value = ? WHERE key = 'version'", (str(version),))

    @staticmethod
    def _read_meta(conn: sqlite3.Connection) -> dict[str, str]:
        try:
            return {k: v for k, v in conn.execute("SELECT key, value FROM remit_meta")}
        except sqlite3.OperationalError:
            return {}

    # ------------------------------------------------------------------------------ checkpoints

    @staticmethod
    def _insert_chunks(conn: sqlite3.Connection, run_id: str,
                       chunks: Mapping[bytes, bytes]) -> None:
        if chunks:
            conn.executemany("INSERT OR IGNORE INTO remit_chunks VALUES (?, ?, ?)",
                             [(run_id, d, v) for d, v in chunks.items()])

    def _read_chunks(self, run_id: str, digests: list[bytes]) -> dict[bytes, bytes]:
        found: dict[bytes, bytes] = {}
        with self._tx(write=False) as conn:
            for i in range(0, len(digests), _BATCH):
                batch = digests[i:i + _BATCH]
                found.update((bytes(d), bytes(v)) for d, v in conn.execute(
                    "SELECT digest, value FROM remit_chunks WHERE run_id = ? AND digest IN "
                    f"({', '.join('?' * len(batch))})", (run_id, *batch)))
        return found

    def _write_checkpoint(self, row: CheckpointRow, blobs: list[BlobRow],
                          exclusive_child: bool, chunks: Mapping[bytes, bytes]
                          ) -> tuple[int, str | None]:
        now = self._now()
        with self._tx() as conn:
            if exclusive_child and row.parent_id is not None:
                other = conn.execute(
                    "SELECT checkpoint_id FROM remit_checkpoints WHERE run_id = ? AND ns = ? "
                    "AND parent_id = ? AND kind = ? AND checkpoint_id != ? LIMIT 1",
                    (row.run_id, row.ns, row.parent_id, row.kind, row.checkpoint_id),
                ).fetchone()
                if other is not None:
                    return 0, str(other[0])
            self._insert_chunks(conn, row.run_id, chunks)
            conn.executemany(
                "INSERT OR IGNORE INTO remit_blobs VALUES (?, ?, ?, ?, ?)",
                [(b.run_id, b.ns, b.channel, b.version, b.value) for b in blobs],
            )
            conn.execute(
                "INSERT INTO remit_runs VALUES (?, ?, ?) "
                "ON CONFLICT (run_id) DO UPDATE SET updated_at = excluded.updated_at",
                (row.run_id, now, now),
            )
            seq = conn.execute(
                "INSERT INTO remit_checkpoints (run_id, ns, checkpoint_id, parent_id, kind, "
                "execution_id, data, metadata, versions, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (run_id, ns, checkpoint_id) DO UPDATE SET "
                "parent_id = excluded.parent_id, kind = excluded.kind, "
                "execution_id = excluded.execution_id, data = excluded.data, "
                "metadata = excluded.metadata, versions = excluded.versions "
                "RETURNING seq",
                (row.run_id, row.ns, row.checkpoint_id, row.parent_id, row.kind,
                 row.execution_id, row.data, row.metadata, json.dumps(row.versions), now),
            ).fetchone()[0]
            return int(seq), None

    def _blobs(self, conn: sqlite3.Connection, row: CheckpointRow) -> dict[str, bytes]:
        return {ch: bytes(v) for ch, v in conn.execute(
            _BLOBS_OF, (json.dumps(row.versions), row.run_id, row.ns))}

    def _read_checkpoint(self, run_id: str, ns: str, checkpoint_id: str | None
                         ) -> tuple[CheckpointRow, dict[str, bytes]] | None:
        with self._tx(write=False) as conn:
            if checkpoint_id is None:
                r = conn.execute(
                    f"SELECT {_CK_COLS} FROM remit_checkpoints WHERE run_id = ? AND ns = ? "
                    "ORDER BY seq DESC LIMIT 1", (run_id, ns)).fetchone()
            else:
                r = conn.execute(
                    f"SELECT {_CK_COLS} FROM remit_checkpoints WHERE run_id = ? AND ns = ? "
                    "AND checkpoint_id = ?", (run_id, ns, checkpoint_id)).fetchone()
            if r is None:
                return None
            row = _ck(r)
            return row, self._blobs(conn, row)

    def _read_writes(self, run_id: str, ns: str, checkpoint_id: str) -> list[WriteRow]:
        with self._tx(write=False) as conn:
            return [
                WriteRow(run_id, ns, checkpoint_id, t, i, ch, bytes(v), p)
                for t, i, ch, v, p in conn.execute(
                    "SELECT task_id, idx, channel, value, task_path FROM remit_writes "
                    "WHERE run_id = ? AND ns = ? AND checkpoint_id = ? ORDER BY task_id, idx",
                    (run_id, ns, checkpoint_id))
            ]

    def _list_checkpoints(self, run_id: str | None, ns: str | None, before: str | None,
                          limit: int | None, execution_ids: Sequence[str] | None
                          ) -> list[tuple[CheckpointRow, dict[str, bytes]]]:
        where: list[str] = []
        args: list[Any] = []
        if run_id is not None:
            where.append("run_id = ?")
            args.append(run_id)
        if ns is not None:
            where.append("ns = ?")
            args.append(ns)
        if execution_ids is not None:
            where.append(f"execution_id IN ({', '.join('?' * len(execution_ids))})")
            args.extend(execution_ids)
        with self._tx(write=False) as conn:
            if before is not None:
                q = "SELECT MIN(seq) FROM remit_checkpoints WHERE checkpoint_id = ?"
                qa: list[Any] = [before]
                if run_id is not None:
                    q += " AND run_id = ?"
                    qa.append(run_id)
                b = conn.execute(q, qa).fetchone()[0]
                if b is None:
                    return []
                where.append("seq < ?")
                args.append(b)
            sql = f"SELECT {_CK_COLS} FROM remit_checkpoints"
            if where:
                sql += " WHERE " + " AND ".join(where)
            sql += " ORDER BY seq DESC"
            if limit is not None:
                sql += " LIMIT ?"
                args.append(int(limit))
            rows = [_ck(r) for r in conn.execute(sql, args)]
            return [(row, self._blobs(conn, row)) for row in rows]

    def _write_writes(self, rows: list[WriteRow], overwrite: bool,
                      chunks: Mapping[bytes, bytes]) -> None:
        verb = "INSERT OR REPLACE" if overwrite else "INSERT OR IGNORE"
        with self._tx() as conn:
            self._insert_chunks(conn, rows[0].run_id, chunks)
            conn.executemany(
                f"{verb} INTO remit_writes VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(w.run_id, w.ns, w.checkpoint_id, w.task_id, w.idx, w.channel, w.value,
                  w.task_path) for w in rows],
            )

    def _list_runs(self, limit: int | None) -> list[RunInfo]:
        sql = (
            "SELECT r.run_id, r.created_at, r.updated_at, "
            "(SELECT COUNT(*) FROM remit_checkpoints c WHERE c.run_id = r.run_id), "
            "l.checkpoint_id, l.kind FROM remit_runs r LEFT JOIN remit_checkpoints l ON l.seq = "
            "(SELECT MAX(seq) FROM remit_checkpoints c2 WHERE c2.run_id = r.run_id) "
            "ORDER BY r.updated_at DESC, r.run_id"
        )
        args: list[Any] = []
        if limit is not None:
            sql += " LIMIT ?"
            args.append(int(limit))
        with self._tx(write=False) as conn:
            return [RunInfo(*r) for r in conn.execute(sql, args)]

    def _delete_run(self, run_id: str) -> None:
        with self._tx() as conn:
            for table in ("remit_checkpoints", "remit_blobs", "remit_writes", "remit_chunks",
                          "remit_receipts", "remit_claims", "remit_runs"):
                conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))

    def _copy_run(self, source: str, target: str) -> None:
        now = self._now()
        with self._tx() as conn:
            if conn.execute("SELECT 1 FROM remit_runs WHERE run_id = ?", (source,)).fetchone() is None:
                return
            conn.execute("INSERT INTO remit_runs VALUES (?, ?, ?) ON CONFLICT (run_id) DO UPDATE "
                         "SET updated_at = excluded.updated_at", (target, now, now))
            conn.execute(
                "INSERT OR IGNORE INTO remit_checkpoints (run_id, ns, checkpoint_id, parent_id, "
                "kind, execution_id, data, metadata, versions, created_at) "
                "SELECT ?, ns, checkpoint_id, parent_id, kind, execution_id, data, metadata, "
                "versions, created_at FROM remit_checkpoints WHERE run_id = ? ORDER BY seq",
                (target, source))
            conn.execute("INSERT OR IGNORE INTO remit_blobs SELECT ?, ns, channel, version, value "
                         "FROM remit_blobs WHERE run_id = ?", (target, source))
            conn.execute("INSERT OR IGNORE INTO remit_writes SELECT ?, ns, checkpoint_id, task_id, "
                         "idx, channel, value, task_path FROM remit_writes WHERE run_id = ?",
                         (target, source))
            conn.execute("INSERT OR IGNORE INTO remit_chunks SELECT ?, digest, value "
                         "FROM remit_chunks WHERE run_id = ?", (target, source))

    def _drop_orphans(self, conn: sqlite3.Connection, run_id: str) -> None:
        conn.execute(
            "DELETE FROM remit_writes AS w WHERE w.run_id = ? AND NOT EXISTS (SELECT 1 FROM "
            "remit_checkpoints c WHERE c.run_id = w.run_id AND c.ns = w.ns "
            "AND c.checkpoint_id = w.checkpoint_id)", (run_id,))
        conn.execute(
            "DELETE FROM remit_blobs AS b WHERE b.run_id = ? AND NOT EXISTS (SELECT 1 FROM "
            "remit_checkpoints c, json_each(c.versions) j WHERE c.run_id = b.run_id "
            "AND c.ns = b.ns AND j.key = b.channel AND j.value = b.version)", (run_id,))
        stored = [bytes(d) for (d,) in conn.execute(
            "SELECT digest FROM remit_chunks WHERE run_id = ?", (run_id,))]
        if stored:
            keep = _chunks.referenced(bytes(v) for (v,) in conn.execute(
                _MANIFEST_ROWS, (run_id, _chunks.MAGIC)))
            conn.executemany("DELETE FROM remit_chunks WHERE run_id = ? AND digest = ?",
                             [(run_id, d) for d in stored if d not in keep])

    def _prune_run(self, run_id: str, keep_latest: int) -> None:
        with self._tx() as conn:
            conn.execute(
                "DELETE FROM remit_checkpoints WHERE run_id = ? AND seq NOT IN (SELECT seq FROM "
                "(SELECT seq, ROW_NUMBER() OVER (PARTITION BY ns ORDER BY seq DESC) AS rn "
                "FROM remit_checkpoints WHERE run_id = ?) WHERE rn <= ?)",
                (run_id, run_id, keep_latest))
            self._drop_orphans(conn, run_id)

    def _delete_executions(self, execution_ids: list[str]) -> None:
        marks = ", ".join("?" * len(execution_ids))
        with self._tx() as conn:
            runs = [r[0] for r in conn.execute(
                f"SELECT DISTINCT run_id FROM remit_checkpoints WHERE execution_id IN ({marks})",
                execution_ids)]
            conn.execute(f"DELETE FROM remit_checkpoints WHERE execution_id IN ({marks})",
                         execution_ids)
            for run_id in runs:
                self._drop_orphans(conn, run_id)

    def _usage(self, run_id: str | None) -> dict[str, int]:
        where, args = ("WHERE run_id = ?", (run_id,)) if run_id is not None else ("", ())
        with self._tx(write=False) as conn:
            def one(sql: str) -> int:
                return int(conn.execute(sql, args).fetchone()[0] or 0)
            return {
                "checkpoints": one(f"SELECT COUNT(*) FROM remit_checkpoints {where}"),
                "blobs": one(f"SELECT COUNT(*) FROM remit_blobs {where}"),
                "blob_bytes": one(f"SELECT SUM(LENGTH(value)) FROM remit_blobs {where}"),
                "writes": one(f"SELECT COUNT(*) FROM remit_writes {where}"),
                "receipts": one(f"SELECT COUNT(*) FROM remit_receipts {where}"),
                "claims": one(f"SELECT COUNT(*) FROM remit_claims {where}"),
                "chunks": one(f"SELECT COUNT(*) FROM remit_chunks {where}"),
                "chunk_bytes": one(f"SELECT SUM(LENGTH(value)) FROM remit_chunks {where}"),
            }

    # ------------------------------------------------------------------------ receipts, claims

    def _writing(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return self._tx()

    def _reading(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return self._tx(write=False)

    def _clock(self) -> dict[str, Any]:
        return {"now": self._now()}

    def _decide(self, records: Records[R], key: str, decide: Decide[R]) -> Verdict[Any, Any]:
        # BEGIN IMMEDIATE holds the database's write lock from the read to the commit
        with self._tx() as conn:
            r = conn.execute(records.select, {"key": key}).fetchone()
            verdict = decide(None if r is None else records.row(r), self._now())
            self._apply(conn, records, verdict)
            return verdict
