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
from urllib.parse import SplitResult, unquote

from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_random_exponential

from remit_core.errors import StoreConfigError, StoreNotFound, StoreUnavailable
from remit_core.records import BlobRow, CheckpointRow, WriteRow, versions_from_json, versions_json
from remit_core.serde import Serde
from remit_core.store import sql
from remit_core.store.base import Layout
from remit_core.store.decisions import Verdict
from remit_core.store.options import Parsed
from remit_core.store.sql import TABLES
from remit_core.urls import mask_url

#: the column types of sql.SCHEMA, sql.CHUNKS and sql.LIFECYCLE in this database (and the
#: collation of the key that sql.LIFECYCLE_LAPSING orders by)
# (the chunks are a rowid table: their rows are 0.5-8 kB, too large to sit well in a
# WITHOUT ROWID b-tree)
SCHEMA_TYPES = dict(seq="INTEGER PRIMARY KEY AUTOINCREMENT", time="REAL", bytes="BLOB",
                    json="TEXT", int64="INTEGER", keyed=" WITHOUT ROWID", chunk_key="UNIQUE",
                    ordered_key="key")

# Append-only: never edit an entry, add a new one. The store's version is len(MIGRATIONS).
MIGRATIONS: list[str] = [
    sql.SCHEMA.format(**SCHEMA_TYPES),
    sql.CHUNKS.format(**SCHEMA_TYPES),
    sql.LIFECYCLE.format(**SCHEMA_TYPES),
    sql.LAPSING,
    sql.LIFECYCLE_LAPSING.format(**SCHEMA_TYPES),
]

_BATCH = 500  # digests per IN (...) list

_PUT_RUN = ("INSERT INTO remit_runs VALUES (?, ?, ?) "
            "ON CONFLICT (run_id) DO UPDATE SET updated_at = excluded.updated_at")
_PUT_CHECKPOINT = (f"INSERT INTO remit_checkpoints ({sql.CK_WRITTEN}) "
                   f"VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) {sql.CK_UPSERT}")

# The blobs and the writes of one checkpoint (its versions as JSON, its key), and of the
# checkpoints listed in :seqs (a JSON array). CROSS JOIN makes SQLite's planner keep this
# order: each listed seq, its checkpoint by rowid, its versions, then each blob or write by
# primary key. With plain JOINs it may scan the run's blobs instead (the whole history)
# and read a checkpoint in time linear in its length.
_BLOBS_OF_ONE = (
    "SELECT j.key, b.value FROM json_each(?) AS j CROSS JOIN remit_blobs AS b "
    "ON b.run_id = ? AND b.ns = ? AND b.channel = j.key AND b.version = j.value")
_WRITES_OF_ONE = (
    f"SELECT {sql.WRITE_COLS} FROM remit_writes WHERE run_id = ? AND ns = ? "
    "AND checkpoint_id = ? ORDER BY task_id, idx")
#: the latest checkpoint of a run in a namespace, and one by its id (_read_checkpoint)
_LATEST = (f"SELECT {sql.CK_COLS} FROM remit_checkpoints AS c WHERE c.run_id = ? "
           "AND c.ns = ? ORDER BY c.seq DESC LIMIT 1")
_BY_ID = (f"SELECT {sql.CK_COLS} FROM remit_checkpoints AS c WHERE c.run_id = ? "
          "AND c.ns = ? AND c.checkpoint_id = ?")
_OF_SEQS = "FROM json_each(:seqs) AS s CROSS JOIN remit_checkpoints AS c ON c.seq = s.value"
_BLOBS_OF = (
    f"SELECT c.seq, j.key, b.value {_OF_SEQS} CROSS JOIN json_each(c.versions) AS j "
    "CROSS JOIN remit_blobs AS b ON b.run_id = c.run_id AND b.ns = c.ns "
    "AND b.channel = j.key AND b.version = j.value")
_WRITES_OF = (  # in no order: each checkpoint's are sorted after the read
    f"SELECT c.seq, {', '.join(f'w.{c}' for c in sql.WRITE_COLUMNS)} {_OF_SEQS} "
    "CROSS JOIN remit_writes AS w ON w.run_id = c.run_id AND w.ns = c.ns "
    "AND w.checkpoint_id = c.checkpoint_id")


class SqliteDialect(sql.Dialect):
    style = ":{}"
    now = ":now"  # this host's clock, bound by the caller (SqliteStore._clock)

    def any_of(self, column: str, name: str) -> str:
        return f"{column} IN (SELECT value FROM json_each({self.p(name)}))"

    def texts(self, values: Sequence[str]) -> str:
        return json.dumps(list(values))

    def limit(self, n: int | None) -> int:
        return -1 if n is None else n


class SqliteStore(sql.SqlStore):
    """A store in one SQLite file (or in memory)."""

    groups_writes = True
    groups_background_writes = True
    backend = "sqlite"
    keyword_passthrough = False
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
        self._sql(SqliteDialect(), sql.Tables())
        self._ck_queries: dict[tuple[str, ...], str] = {}
        if not read_only:
            self._create_file()
        self._open_file()

    @classmethod
    def _from_url(cls, url: str, parts: SplitResult, parsed: Parsed, *, serde: Serde | None,
                  read_only: bool) -> SqliteStore:
        masked, opts = mask_url(url), parsed.values
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
        return cls(url, path_or_none, serde=serde, lease=opts["lease"],
                   synchronous=opts["synchronous"], timeout=opts["timeout"], mode=opts["mode"],
                   read_only=read_only)

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

    def _enter_wal(self, conn: sqlite3.Connection) -> None:
        """``PRAGMA journal_mode=WAL``. Switching a new file to WAL needs it to itself, and
        SQLite answers "database is locked" at once, without its busy timeout, while
        another process opening the same new file holds it: tried again (tenacity) for up
        to the store's timeout."""
        Retrying(retry=retry_if_exception(lambda e: isinstance(e, sqlite3.OperationalError)
                                          and "locked" in str(e)),
                 stop=stop_after_delay(self._timeout),
                 wait=wait_random_exponential(multiplier=0.005, max=0.1),
                 reraise=True)(conn.execute, "PRAGMA journal_mode=WAL")

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
                    self._enter_wal(conn)
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
        with (self._one_statement() if write else self._read_conn()) as conn:
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

    def _transaction(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return self._tx()

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
                          exclusive_child: bool, chunks: Mapping[bytes, bytes],
                          writes: Sequence[tuple[list[WriteRow], bool]] = ()
                          ) -> tuple[int, str | None]:
        now = self._now()
        with self._tx() as conn:
            if exclusive_child and row.parent_id is not None:
                other = conn.execute(self._sibling_sql, {
                    "run": row.run_id, "ns": row.ns, "parent": row.parent_id,
                    "kind": row.kind, "cid": row.checkpoint_id}).fetchone()
                if other is not None:
                    return 0, str(other[0])
            self._insert_chunks(conn, row.run_id, chunks)
            for rows, overwrite in writes:
                self._insert_writes(conn, rows, overwrite)
            conn.executemany(
                "INSERT OR IGNORE INTO remit_blobs VALUES (?, ?, ?, ?, ?)",
                [(b.run_id, b.ns, b.channel, b.version, b.value) for b in blobs],
            )
            conn.execute(_PUT_RUN, (row.run_id, now, now))
            seq = conn.execute(_PUT_CHECKPOINT, (
                row.run_id, row.ns, row.checkpoint_id, row.parent_id, row.kind,
                row.execution_id, row.data, row.metadata, versions_json(row.versions), now,
            )).fetchone()[0]
            return int(seq), None

    def _checkpoints(self, where: Sequence[str], args: Mapping[str, Any], limit: int | None,
                     with_writes: bool) -> list[sql.Found]:
        query = self._ck_queries.get(tuple(where))
        if query is None:
            query = self._ck_queries[tuple(where)] = (
                f"SELECT {sql.CK_COLS} FROM remit_checkpoints AS c"
                + (" WHERE " + " AND ".join(where) if where else "")
                + " ORDER BY c.seq DESC LIMIT :limit")
        with self._tx(write=False) as conn:  # one transaction: one snapshot
            raw = conn.execute(query, {**args, "limit": -1 if limit is None else limit}
                               ).fetchall()
            if len(raw) == 1:  # one checkpoint: its blobs and writes by key
                return [self._with_blobs(conn, raw[0], with_writes)]
            rows = [sql.checkpoint_row(r, versions_from_json) for r in raw]
            if not rows:
                return []
            seqs = {"seqs": json.dumps([r.seq for r in rows])}
            by_seq: dict[int, sql.Found] = {r.seq: (r, {}, []) for r in rows}
            for seq, channel, value in conn.execute(_BLOBS_OF, seqs):
                by_seq[seq][1][channel] = bytes(value)
            if with_writes:
                for w in conn.execute(_WRITES_OF, seqs):
                    ck, _, writes = by_seq[w[0]]
                    writes.append(sql.write_row(ck, w[1:]))
        for _, _, writes in by_seq.values():  # (task_id, idx): SQLite's byte order, as str's
            writes.sort(key=lambda w: (w.task_id, w.idx))
        return list(by_seq.values())

    def _read_checkpoint(self, run_id: str, ns: str, checkpoint_id: str | None,
                         with_writes: bool) -> sql.Found | None:
        """The run's latest checkpoint in ``ns``, or the one ``checkpoint_id`` names, with
        its blobs and writes, in one read transaction on this thread's connection: the
        read path of every load, so written out (positional statements, no context
        managers around them). The memory store reads under its lock, as any read."""
        if self._memory_lock is not None:
            return super()._read_checkpoint(run_id, ns, checkpoint_id, with_writes)
        conn = self._conn()
        conn.execute("BEGIN")
        try:
            raw = (conn.execute(_LATEST, (run_id, ns)) if checkpoint_id is None else
                   conn.execute(_BY_ID, (run_id, ns, checkpoint_id))).fetchone()
            found = None if raw is None else self._with_blobs(conn, raw, with_writes)
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return found

    @staticmethod
    def _with_blobs(conn: sqlite3.Connection, raw: Sequence[Any], with_writes: bool
                    ) -> sql.Found:
        """The checkpoint of ``raw`` (its columns) with its blobs and writes, read by key."""
        row = sql.checkpoint_row(raw, versions_from_json)
        blobs = {ch: bytes(v) for ch, v in conn.execute(
            _BLOBS_OF_ONE, (raw[8], row.run_id, row.ns))}
        writes = [sql.write_row(row, w) for w in conn.execute(
            _WRITES_OF_ONE, (row.run_id, row.ns, row.checkpoint_id))] if with_writes else []
        return row, blobs, writes

    def _write_writes(self, rows: list[WriteRow], overwrite: bool,
                      chunks: Mapping[bytes, bytes]) -> None:
        with self._tx() as conn:
            self._insert_chunks(conn, rows[0].run_id, chunks)
            self._insert_writes(conn, rows, overwrite)

    @staticmethod
    def _insert_writes(conn: sqlite3.Connection, rows: list[WriteRow], overwrite: bool) -> None:
        verb = "INSERT OR REPLACE" if overwrite else "INSERT OR IGNORE"
        conn.executemany(
            f"{verb} INTO remit_writes VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [(w.run_id, w.ns, w.checkpoint_id, w.task_id, w.idx, w.channel, w.value,
              w.task_path) for w in rows],
        )

    # ------------------------------------------------------------------------ receipts, claims

    @contextlib.contextmanager
    def _read_conn(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection for reading (the memory store's one, under its lock)."""
        with self._memory_lock or contextlib.nullcontext():
            yield self._conn()

    @contextlib.contextmanager
    def _one_statement(self) -> Iterator[sqlite3.Connection]:
        """The write connection, under the writer lock: for a write transaction
        (:meth:`_tx`), or for one write statement in autocommit, which SQLite makes its own
        transaction, taking the write lock at its start (waiting in the busy handler as
        ``BEGIN IMMEDIATE`` does) and committing it at its end, durably -- one statement
        where a transaction takes three."""
        lock: contextlib.AbstractContextManager[Any] = self._memory_lock or self._writer_lock()
        with lock:
            yield self._writer() if self.path is not None else self._conn()

    def _writing(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return self._one_statement()  # a fenced change or a delete: one statement

    def _reading(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return self._tx(write=False)

    def _clock(self) -> dict[str, Any]:
        return {"now": self._now()}

    def _decide(self, records: sql.Records[sql.R], key: str, decide: sql.Decide[sql.R], *,
                insert_first: bool = False) -> Verdict[Any, Any]:
        # A verdict on a new key that inserts (``run``, ``won``) is one insert-if-absent
        # statement; if the key exists (a replay, a take-over ...), or is mostly there
        # already (a run's lifecycle, unless the caller expects it new: insert_first),
        # BEGIN IMMEDIATE holds the database's write lock from the read to the commit
        if insert_first or not records.kept:
            with self._one_statement() as conn:
                fresh = decide(None, self._now())  # now read once this process may write
                if (fresh.write == "insert" and conn.execute(
                        records.insert_new, records.params(fresh.row)).rowcount == 1):
                    return fresh
        with self._tx() as conn:
            r = conn.execute(records.select, {"key": key}).fetchone()
            verdict = decide(None if r is None else records.row(r), self._now())
            self._apply(conn, records, verdict)
            return verdict
