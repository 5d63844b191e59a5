"""PostgreSQL backend: psycopg 3 with a psycopg-pool connection pool.

Many processes on many hosts share one store. Every contract primitive is one
transaction (or one autocommit statement); the decisions of the receipt and
claim tables are taken under a row lock (``INSERT ... ON CONFLICT DO NOTHING``
then ``SELECT ... FOR UPDATE``), and every time -- timestamps and lease expiry
-- is the *server's* clock (``clock_timestamp()``), so hosts with skewed clocks
still agree on who holds a lease.

URL: ``postgresql://user:password@host:5432/db?schema=NAME&lease=30&pool_min=1&pool_max=10``.
remit's own options (``schema``, ``lease``, ``pool_min``, ``pool_max``, ``pool_timeout``)
are removed before the URL reaches libpq; every other query parameter (``sslmode``,
``connect_timeout``, ``application_name``, ...) is passed through, and libpq rejects
unknown ones. All of remit's tables live in ``schema`` (default ``public``), created when
missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, cast
from urllib.parse import SplitResult, urlencode, urlunsplit

import psycopg
import psycopg.errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from remit_core import aio
from remit_core.errors import StoreConfigError, StoreUnavailable
from remit_core.records import BlobRow, CheckpointRow, WriteRow, versions_json
from remit_core.serde import Serde
from remit_core.store import sql
from remit_core.store.base import Layout
from remit_core.store.decisions import Verdict
from remit_core.store.options import Parsed, known_options, option
from remit_core.store.sql import TABLES
from remit_core.urls import mask_url, password_hint, url_secrets
from remit_core.urls import scrub as _scrub

Conn = psycopg.Connection[tuple[Any, ...]]
AConn = psycopg.AsyncConnection[tuple[Any, ...]]

#: the column types of sql.SCHEMA, sql.CHUNKS and sql.LIFECYCLE in this database (and the
#: collation of the key that sql.LIFECYCLE_LAPSING orders by)
SCHEMA_TYPES = dict(seq="BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
                    time="DOUBLE PRECISION", bytes="BYTEA", json="JSONB", int64="BIGINT",
                    keyed="", chunk_key="PRIMARY KEY", ordered_key='(key COLLATE "C")')

# Append-only: never edit an entry, add a new one. The store's version is len(MIGRATIONS).
# Each script runs in the migration transaction with ``search_path`` set to the store's
# schema (SET LOCAL), so the scripts name tables unqualified.
MIGRATIONS: list[str] = [
    sql.SCHEMA.format(**SCHEMA_TYPES),
    sql.CHUNKS.format(**SCHEMA_TYPES),
    # 3: lz4 TOAST compression for the stored bytes, where the server has it (PostgreSQL
    # 14+ built with lz4): storing a checkpoint row costs far less server CPU than with
    # pglz. Elsewhere the columns keep the server's default. (EXECUTE: the syntax is 14+.)
    """
    DO $$
    BEGIN
      IF current_setting('server_version_num')::int >= 140000 AND EXISTS (
          SELECT 1 FROM pg_settings
          WHERE name = 'default_toast_compression' AND 'lz4' = ANY(enumvals)) THEN
        EXECUTE 'ALTER TABLE remit_checkpoints ALTER COLUMN data SET COMPRESSION lz4, '
                'ALTER COLUMN metadata SET COMPRESSION lz4, '
                'ALTER COLUMN versions SET COMPRESSION lz4';
        EXECUTE 'ALTER TABLE remit_blobs ALTER COLUMN value SET COMPRESSION lz4';
        EXECUTE 'ALTER TABLE remit_writes ALTER COLUMN value SET COMPRESSION lz4';
        EXECUTE 'ALTER TABLE remit_chunks ALTER COLUMN value SET COMPRESSION lz4';
      END IF;
    END $$;
    """,
    sql.LIFECYCLE.format(**SCHEMA_TYPES),
    sql.LAPSING,
    sql.LIFECYCLE_LAPSING.format(**SCHEMA_TYPES),
    # 7: a step's write as one call of a function (PostgresStore._write_checkpoint): the
    # run's lock, the pending writes grouped with the checkpoint (group by group, as
    # separate statements would), the values, the run's row and the checkpoint. Its
    # statements' plans are kept by the session; sent as one simple query, the same
    # statements were parsed and planned at every step (0.2-0.5 ms a step, measured).
    # search_path is the store's schema, captured when the function is created.
    """
    CREATE OR REPLACE FUNCTION remit_put_step(
        p_lock BIGINT, p_run TEXT, p_ns TEXT, p_cid TEXT, p_parent TEXT, p_kind TEXT,
        p_execution TEXT, p_data BYTEA, p_metadata BYTEA, p_versions JSONB,
        p_channels TEXT[], p_value_versions TEXT[], p_values BYTEA[],
        g_cids TEXT[], g_tasks TEXT[], g_paths TEXT[], g_overwrite BOOLEAN[], g_counts INT[],
        w_idxs INT[], w_channels TEXT[], w_values BYTEA[])
    RETURNS BIGINT LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $fn$
    DECLARE
        seq_ BIGINT;
        now_ DOUBLE PRECISION;
        lo INT := 1;
        hi INT;
    BEGIN
        PERFORM pg_advisory_xact_lock(p_lock);
        FOR i IN 1 .. coalesce(array_length(g_tasks, 1), 0) LOOP
            hi := lo + g_counts[i] - 1;
            -- a key the store has is replaced only by a call that overwrites
            INSERT INTO remit_writes (run_id, ns, checkpoint_id, task_id, idx, channel, value,
                                      task_path)
            SELECT p_run, p_ns, g_cids[i], g_tasks[i], u.idx, u.channel, u.value, g_paths[i]
            FROM unnest(w_idxs[lo:hi], w_channels[lo:hi], w_values[lo:hi])
                AS u(idx, channel, value)
            ON CONFLICT (run_id, ns, checkpoint_id, task_id, idx) DO UPDATE SET
                channel = excluded.channel, value = excluded.value, task_path = excluded.task_path
            WHERE g_overwrite[i];
            lo := hi + 1;
        END LOOP;
        INSERT INTO remit_blobs (run_id, ns, channel, version, value)
        SELECT p_run, p_ns, u.channel, u.version, u.value
        FROM unnest(p_channels, p_value_versions, p_values) AS u(channel, version, value)
        ON CONFLICT DO NOTHING;
        now_ := extract(epoch FROM clock_timestamp())::float8;
        INSERT INTO remit_runs (run_id, created_at, updated_at) VALUES (p_run, now_, now_)
        ON CONFLICT (run_id) DO UPDATE SET updated_at = excluded.updated_at;
        INSERT INTO remit_checkpoints (run_id, ns, checkpoint_id, parent_id, kind,
                                       execution_id, data, metadata, versions, created_at)
        VALUES (p_run, p_ns, p_cid, p_parent, p_kind, p_execution, p_data, p_metadata,
                p_versions, now_)
        ON CONFLICT (run_id, ns, checkpoint_id) DO UPDATE SET
            parent_id = excluded.parent_id, kind = excluded.kind,
            execution_id = excluded.execution_id, data = excluded.data,
            metadata = excluded.metadata, versions = excluded.versions
        RETURNING seq INTO seq_;
        RETURN seq_;
    END
    $fn$;
    """,
    # 8: a checkpoint's read as one call of a function (PostgresStore._read_checkpoint)
    # whose statements run their generic plans, kept by the session: no planning at each
    # read (as a statement, 0.1-0.2 ms of every get_checkpoint). The latest checkpoint of a
    # run's namespace is found through an index on (run_id, ns, -seq), the only one that
    # gives that order: given ORDER BY seq DESC, a plan may walk the primary key (seq)
    # backwards and filter by run, reading every checkpoint written since the run's latest,
    # other runs' included (measured: 2.5 ms behind 10 000 checkpoints of another run).
    # The chunks its values name come in the same call, read only when a value is a
    # manifest (no second read, and no second snapshot in which a prune could have removed
    # them). STABLE: its statements read one snapshot, the calling statement's.
    """
    CREATE INDEX remit_checkpoints_head ON remit_checkpoints (run_id, ns, (-seq));
    CREATE OR REPLACE FUNCTION remit_read_checkpoint(
        p_run TEXT, p_ns TEXT, p_cid TEXT, p_writes BOOLEAN)
    RETURNS TABLE (r_run_id TEXT, r_ns TEXT, r_checkpoint_id TEXT, r_parent_id TEXT,
                   r_kind TEXT, r_execution_id TEXT, r_data BYTEA, r_metadata BYTEA,
                   r_versions JSONB, r_created_at DOUBLE PRECISION, r_seq BIGINT,
                   r_channels TEXT[], r_values BYTEA[], r_task_ids TEXT[], r_idxs INT[],
                   r_write_channels TEXT[], r_write_values BYTEA[], r_task_paths TEXT[],
                   r_chunk_digests BYTEA[], r_chunks BYTEA[])
    LANGUAGE plpgsql STABLE
    SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan AS $fn$
    DECLARE
        seq_ BIGINT;
        chunked BOOLEAN;
    BEGIN
        IF p_cid IS NULL THEN
            SELECT c.seq INTO seq_ FROM remit_checkpoints AS c
            WHERE c.run_id = p_run AND c.ns = p_ns ORDER BY -c.seq LIMIT 1;
        ELSE
            SELECT c.seq INTO seq_ FROM remit_checkpoints AS c
            WHERE c.run_id = p_run AND c.ns = p_ns AND c.checkpoint_id = p_cid;
        END IF;
        IF seq_ IS NULL THEN
            RETURN;
        END IF;
        -- each value its own primary-key lookup; the writes in (task_id, idx) byte order
        SELECT c.run_id, c.ns, c.checkpoint_id, c.parent_id, c.kind, c.execution_id, c.data,
               c.metadata, c.versions, c.created_at, c.seq, b.channels, b.vals, ws.task_ids,
               ws.idxs, ws.channels, ws.vals, ws.task_paths, b.chunked OR ws.chunked
        INTO r_run_id, r_ns, r_checkpoint_id, r_parent_id, r_kind, r_execution_id, r_data,
             r_metadata, r_versions, r_created_at, r_seq, r_channels, r_values, r_task_ids,
             r_idxs, r_write_channels, r_write_values, r_task_paths, chunked
        FROM remit_checkpoints AS c
        CROSS JOIN LATERAL (
            SELECT array_agg(j.key) AS channels, array_agg(bl.value) AS vals,
                   bool_or(substring(bl.value FROM 1 FOR 2) = '\\x0001'::bytea) AS chunked
            FROM jsonb_each_text(c.versions) AS j
            CROSS JOIN LATERAL (
                SELECT x.value FROM remit_blobs AS x
                WHERE x.run_id = c.run_id AND x.ns = c.ns AND x.channel = j.key
                  AND x.version = j.value LIMIT 1) AS bl) AS b
        CROSS JOIN LATERAL (
            SELECT array_agg(w.task_id ORDER BY w.task_id COLLATE "C", w.idx) AS task_ids,
                   array_agg(w.idx ORDER BY w.task_id COLLATE "C", w.idx) AS idxs,
                   array_agg(w.channel ORDER BY w.task_id COLLATE "C", w.idx) AS channels,
                   array_agg(w.value ORDER BY w.task_id COLLATE "C", w.idx) AS vals,
                   array_agg(w.task_path ORDER BY w.task_id COLLATE "C", w.idx) AS task_paths,
                   bool_or(substring(w.value FROM 1 FOR 2) = '\\x0001'::bytea) AS chunked
            FROM remit_writes AS w
            WHERE p_writes AND w.run_id = c.run_id AND w.ns = c.ns
              AND w.checkpoint_id = c.checkpoint_id) AS ws
        WHERE c.seq = seq_;
        -- the chunks named by the manifests among them (remit_core.store.chunks: 0x00 0x01,
        -- then 32-byte digests), each its own primary-key lookup, in the same snapshot
        IF chunked THEN
            SELECT array_agg(d.digest), array_agg(k.value) INTO r_chunk_digests, r_chunks
            FROM (SELECT DISTINCT substring(m.v FROM 3 + 32 * g.i FOR 32) AS digest
                  FROM unnest(r_values || r_write_values) AS m(v)
                  CROSS JOIN LATERAL generate_series(0, (length(m.v) - 2) / 32 - 1) AS g(i)
                  WHERE substring(m.v FROM 1 FOR 2) = '\\x0001'::bytea) AS d
            CROSS JOIN LATERAL (
                SELECT y.value FROM remit_chunks AS y
                WHERE y.run_id = r_run_id AND y.digest = d.digest LIMIT 1) AS k;
        END IF;
        RETURN NEXT;
    END
    $fn$;
    """,
]

#: the first layout version with remit_read_checkpoint (a store of an older one, opened
#: read-only, is read with the statement)
_READ_FUNCTION = 8

#: take a run's advisory lock (see PostgresStore._lock_runs); parameter ``lock``
_LOCK_RUN = "SELECT pg_advisory_xact_lock(%(lock)s::bigint)"

#: the server clock as epoch seconds; one reading per evaluation
NOW = "extract(epoch from clock_timestamp())::float8"

# Key (first half) of the transaction-level advisory lock that serialises migrations of
# one schema; the second half is a hash of the schema name. The two-int4 key space of
# advisory locks does not overlap the bigint one used for the per-run locks below.
MIGRATION_LOCK = 0x52454D54  # "REMT"


# libpq's key='quoted value' form (in conninfo strings that a driver message may echo)
_KV_SECRET = re.compile(r"(\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*')", re.I)


def mask(url: str) -> str:
    """``mask_url``: every password in the URL (userinfo or ``password=``) masked."""
    return mask_url(url)


def scrub(text: str, secrets: Sequence[str | None] = ()) -> str:
    """A driver message with every password in it replaced by ``***``, on one line."""
    return _scrub(_KV_SECRET.sub(r"\1***", text), secrets)


def _read_only_session(conn: Conn) -> None:
    """A pooled connection of a store opened read-only: the server refuses any write."""
    conn.execute("SET default_transaction_read_only = on")


async def _aread_only_session(conn: AConn) -> None:
    await conn.execute("SET default_transaction_read_only = on")


class _Cursor:
    """An async cursor used as a sync one, inside :func:`remit_core.aio.run`."""

    def __init__(self, cursor: Any) -> None:
        self._c = cursor

    @property
    def rowcount(self) -> int:
        return int(self._c.rowcount)

    def execute(self, query: str, params: Any = None, **kwargs: Any) -> _Cursor:
        aio.wait(self._c.execute(query, params, **kwargs))
        return self

    def executemany(self, query: str, params: Any, **kwargs: Any) -> None:
        aio.wait(self._c.executemany(query, params, **kwargs))

    def fetchone(self) -> Any:
        return aio.wait(self._c.fetchone())

    def fetchall(self) -> list[Any]:
        return aio.wait(self._c.fetchall())

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())

    def __enter__(self) -> _Cursor:
        return self

    def __exit__(self, *exc: object) -> None:
        aio.wait(self._c.close())


class _Connection:
    """A pooled ``AsyncConnection`` used as the sync ``Connection`` the store's SQL is
    written for, inside :func:`remit_core.aio.run`: each call awaits the async one."""

    def __init__(self, conn: AConn) -> None:
        self._a = conn

    @property
    def closed(self) -> bool:
        return self._a.closed

    @property
    def info(self) -> Any:
        return self._a.info

    def execute(self, query: str, params: Any = None, **kwargs: Any) -> _Cursor:
        return _Cursor(aio.wait(self._a.execute(query, params, **kwargs)))

    def cursor(self) -> _Cursor:
        return _Cursor(self._a.cursor())

    def transaction(self) -> contextlib.AbstractContextManager[Any]:
        return aio.entered(self._a.transaction())


class _Borrowed:
    """A connection of the loop's pool (``PostgresStore._conn`` under :func:`aio.run`) as
    a sync context manager. A class, not generator-based managers: those would make
    several objects per operation, which live while it waits for the server and, with
    hundreds of runs on one loop, add to the garbage collector's full collections."""

    __slots__ = ("_conn", "_pool", "_store")

    def __init__(self, store: PostgresStore, pool: _LoopPool) -> None:
        self._store, self._pool = store, pool

    def __enter__(self) -> Conn:
        try:
            self._conn = aio.wait(self._pool.acquire())
        except psycopg.OperationalError as exc:
            self._sweep(exc)
            raise
        return cast(Conn, _Connection(self._conn))

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        self._pool.give_back(self._conn)
        if isinstance(exc, psycopg.OperationalError):
            self._sweep(exc)

    def _sweep(self, exc: psycopg.OperationalError) -> None:
        pool = self._pool
        self._store._sweep_after(exc, lambda: aio.wait(pool.check()))


class _LoopPool:
    """One event loop's async connections, for coroutines (see ``PostgresStore._conn``).

    Not psycopg_pool's ``AsyncConnectionPool``: its maintenance workers are tasks of the
    loop that survive a cancel while they connect, so a pool left open when
    ``asyncio.run`` ends makes the run hang in its cancellation of the remaining tasks
    -- and a store opened once serves every loop an application runs, none of which
    closes remit's pool. Here a connection is opened by the operation that needs it, in
    its own task, and kept for the next one: no task of remit's outlives an operation.
    At most ``max_size`` are open (an operation past that waits up to ``timeout``, then
    fails with ``PoolTimeout``, as the sync pool does); a connection that an operation
    left in a transaction, broken or cancelled mid-statement is closed, not reused."""

    def __init__(self, conninfo: str, *, max_size: int, timeout: float, read_only: bool,
                 name: str) -> None:
        self._conninfo, self._timeout, self._read_only = conninfo, timeout, read_only
        self._name = name
        self._idle: list[AConn] = []
        self._slots = asyncio.Semaphore(max_size)

    async def acquire(self) -> AConn:
        """A connection for one operation (a slot first, then an idle connection or a new
        one); :meth:`give_back` returns it."""
        try:
            if self._slots.locked():  # a timer only to wait (asyncio.timeout: no task)
                async with asyncio.timeout(self._timeout):
                    await self._slots.acquire()
            else:
                await self._slots.acquire()
        except TimeoutError:
            raise PoolTimeout(f"couldn't get a connection after {self._timeout:g} sec "
                              f"(pool {self._name!r})") from None
        try:
            return self._idle.pop() if self._idle else await self._connect()
        except BaseException:
            self._slots.release()
            raise

    def give_back(self, conn: AConn) -> None:
        """Keep ``conn`` for the next operation, or close it (under :func:`aio.run`) if it
        is closed, broken or still in a transaction; its slot is free again either way."""
        try:
            if conn.closed or conn.info.transaction_status != TransactionStatus.IDLE:
                with contextlib.suppress(Exception):
                    aio.wait(conn.close())
            else:
                self._idle.append(conn)
        finally:
            self._slots.release()

    async def _connect(self) -> AConn:
        conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
        if self._read_only:
            await _aread_only_session(conn)
        return conn

    async def check(self) -> None:
        """Close the idle connections (after one was lost: the others likely died too)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(Exception):
                await conn.close()

    close = check


def _text_array(items: Sequence[str]) -> str:
    """``items`` as a PostgreSQL array literal, for a ``text[]`` parameter bound as one
    text value: psycopg walks a list parameter element by element in Python to pick its
    dumper (most of a step's client-side cost); the server parses this in C."""
    return "{" + ",".join(['"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
                           for s in items]) + "}"


def _bytea_array(items: Sequence[bytes]) -> str:
    """``items`` as a PostgreSQL array literal of ``bytea`` values in hex (see
    :func:`_text_array`)."""
    return "{" + ",".join(['"\\\\x' + b.hex() + '"' for b in items]) + "}"


def _int_array(items: Sequence[int]) -> str:
    return "{" + ",".join(map(str, items)) + "}"


def _one_task(rows: Sequence[WriteRow]) -> tuple[str, str, str, str, str]:
    """The run, namespace, checkpoint, task and task path of one call's writes."""
    tasks = {(w.run_id, w.ns, w.checkpoint_id, w.task_id, w.task_path) for w in rows}
    if len(tasks) != 1:
        raise ValueError(f"one task's writes expected, got {len(tasks)} tasks")
    ((run, ns, cid, task, path),) = tasks
    return run, ns, cid, task, path


def _unique_writes(rows: Sequence[WriteRow], overwrite: bool) -> list[WriteRow]:
    """One row per key (an INSERT may not touch a row twice): the last one when
    overwriting, else the first, as row-by-row inserts would leave it."""
    unique: dict[int, WriteRow] = {}
    for w in rows:
        if overwrite or w.idx not in unique:
            unique[w.idx] = w
    return list(unique.values())


def _hash64(text: str) -> int:
    """A stable signed 64-bit hash (the same on every host, unlike ``hash()``)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big",
                          signed=True)


def _hash32(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "big",
                          signed=True)


def _connection_lost(exc: BaseException) -> bool:
    """The connection itself failed (not a statement): reset, server restart, refused."""
    if isinstance(exc, PoolTimeout):
        return True
    if not isinstance(exc, psycopg.OperationalError) or isinstance(exc, PoolClosed):
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03")


def _found(r: Sequence[Any]) -> sql.Found:
    """A row of ``_ck_select``: the checkpoint's columns, its blobs as two arrays and (with
    writes) its writes as one array per column of sql.WRITE_COLUMNS."""
    row = sql.checkpoint_row(r, dict)
    blobs = {ch: bytes(v) for ch, v in zip(r[11] or (), r[12] or (), strict=True)}
    if len(r) == 13 or r[13] is None:
        return row, blobs, []
    return row, blobs, [sql.write_row(row, w) for w in zip(*r[13:], strict=True)]


class PostgresDialect(sql.Dialect):
    style = "%({})s"
    now = NOW  # the server's clock: hosts with skewed clocks agree on leases
    statement_now = "extract(epoch from statement_timestamp())::float8"
    collate = ' COLLATE "C"'
    casts = True
    json_each = "jsonb_each_text"
    skip_locked = " FOR UPDATE SKIP LOCKED"

    def any_of(self, column: str, name: str) -> str:
        return f"{column} = ANY({self.p(name)}::text[])"

    def texts(self, values: Sequence[str]) -> list[str]:
        return list(values)


class PostgresStore(sql.SqlStore):
    """A store in one schema of a PostgreSQL database, shared by many hosts."""

    groups_writes = True
    backend = "postgres"
    migrations = MIGRATIONS
    native_async = True

    DEFAULT_CONNECT_TIMEOUT: ClassVar[int] = 5

    def __init__(self, url: str, conninfo: str, schema: str, *, serde: Serde | None,
                 lease: float, pool_min: int = 1, pool_max: int = 10,
                 pool_timeout: float = 10.0, read_only: bool = False,
                 secrets: Sequence[str | None] = ()) -> None:
        super().__init__(mask(url), serde=serde, lease=lease, read_only=read_only)
        self.schema = schema
        self.layout_place = f" (schema {schema!r})"
        self.layout_advice = "Use another schema (?schema=NAME)"
        self._conninfo = conninfo
        self._secrets = [s for s in secrets if s]
        self._pool_min = pool_min
        self._pool_max = pool_max
        self._pool_timeout = pool_timeout
        self._connect_timeout = float(str(
            conninfo_to_dict(conninfo).get("connect_timeout", self.DEFAULT_CONNECT_TIMEOUT)))
        # the option table allows letters, digits, _ in a schema name: no quote can occur
        t = sql.Tables(f'"{schema}".')
        self._sql(PostgresDialect(), t)
        self._meta = t.meta
        # Checkpoint rows joined with the blob of each channel at its version and (with
        # writes) the pending writes: one statement (jsonb_each_text over versions, as the
        # SQLite backend does with json_each). Each blob is its own primary-key lookup: the
        # LIMIT keeps the planner from flattening the lateral subquery into a hash join over
        # a sequential scan of remit_blobs, whose cost grows with every run's history.
        blobs = (
            f" FROM {t.ck} AS c CROSS JOIN LATERAL (SELECT array_agg(j.key) AS channels, "
            "array_agg(bl.value) AS vals FROM jsonb_each_text(c.versions) AS j "
            f"CROSS JOIN LATERAL (SELECT x.value FROM {t.bl} AS x WHERE x.run_id = c.run_id "
            "AND x.ns = c.ns AND x.channel = j.key AND x.version = j.value LIMIT 1) AS bl) AS b")
        writes = (  # one array per column, each in (task_id, idx) byte order
            " CROSS JOIN LATERAL (SELECT " + ", ".join(
                f'array_agg(w.{c} ORDER BY w.task_id COLLATE "C", w.idx) AS {c}s'
                for c in sql.WRITE_COLUMNS)
            + f" FROM {t.wr} AS w WHERE w.run_id = c.run_id AND w.ns = c.ns "
            "AND w.checkpoint_id = c.checkpoint_id) AS ws")
        head = f"SELECT {sql.CK_COLS}, b.channels, b.vals"
        self._ck_select = {
            False: head + blobs,
            True: head + "".join(f", ws.{c}s" for c in sql.WRITE_COLUMNS) + blobs + writes,
        }
        # one checkpoint (migration 8's function): the latest, or the one with that id
        self._read_sql = (f"SELECT * FROM \"{schema}\".remit_read_checkpoint(%(run)s::text, "
                          "%(ns)s::text, %(cid)s::text, %(writes)s::boolean)")
        self._chunks_sql = (
            f"INSERT INTO {t.ch} (run_id, digest, value) SELECT %(run)s::text, u.d, u.v "
            "FROM unnest(%(digests)s::bytea[], %(chunks)s::bytea[]) AS u(d, v) "
            "ON CONFLICT DO NOTHING")
        # a step's write, one statement (migration 7's function): the run's lock, the
        # grouped writes, the absent blobs, the run, the checkpoint (an upsert keeps its
        # seq); the arrays bound as literals
        self._put_step_sql = (
            f"SELECT \"{schema}\".remit_put_step(%(lock)s::bigint, %(run)s::text, %(ns)s::text, "
            "%(cid)s::text, %(parent)s::text, %(kind)s::text, %(execution)s::text, "
            "%(data)s::bytea, %(metadata)s::bytea, %(vmap)s::jsonb, %(channels)s::text[], "
            "%(versions)s::text[], %(values)s::bytea[], %(g_cids)s::text[], "
            "%(g_tasks)s::text[], %(g_paths)s::text[], %(g_overwrite)s::boolean[], "
            "%(g_counts)s::int[], %(w_idxs)s::int[], %(w_channels)s::text[], "
            "%(w_values)s::bytea[])")
        # one call's pending writes, as rows of parallel arrays; by overwrite: replace or
        # keep a key
        self._writes_sql: dict[bool, str] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()
        self._inherited: list[ConnectionPool[Conn]] = []
        #: coroutines' connections: a pool per event loop (a psycopg async connection
        #: belongs to the loop it was opened in), opened by its first operation
        self._apools: aio.PerLoop[_LoopPool] = aio.PerLoop(
            self._new_apool, lambda pool: pool.close())
        self._migrate()  # read-only: only finds the store
        self._pool = self._new_pool()
        try:
            self._pool.open(wait=True, timeout=self._connect_timeout + 5.0)
        except PoolTimeout as exc:
            self._pool.close()
            raise StoreUnavailable(
                f"cannot open a connection pool to PostgreSQL at {self.url!r} within "
                f"{self._connect_timeout + 5.0:.0f} s ({scrub(str(exc), self._secrets)}).",
                url=self.url,
            ) from exc

    # --------------------------------------------------------------------------------- opening

    @classmethod
    def _from_url(cls, url: str, parts: SplitResult, parsed: Parsed, *, serde: Serde | None,
                  read_only: bool) -> PostgresStore:
        masked, secrets, password = mask(url), url_secrets(url), parts.password

        def bad(msg: str) -> StoreConfigError:
            return StoreConfigError(f"{msg} (in {masked!r}){password_hint(url)}", url=masked)

        scheme = parts.scheme.lower().split("+", 1)[0]
        if scheme not in ("postgresql", "postgres"):
            raise bad(f"not a PostgreSQL URL (scheme {parts.scheme!r}); use postgresql://")
        opts = parsed.values
        if "pool_max" not in parsed.given:
            opts["pool_max"] = max(opts["pool_max"], opts["pool_min"])
        if opts["pool_min"] > opts["pool_max"]:
            raise bad(f"options pool_min={opts['pool_min']} and "
                      f"pool_max={opts['pool_max']}: pool_min must be at most pool_max")
        base = urlunsplit(("postgresql", parts.netloc, parts.path,
                           urlencode(parsed.driver_query), ""))
        params = {str(k): v for k, v in parsed.driver_kwargs.items() if v is not None}
        try:
            given = conninfo_to_dict(base, **params)
            if "connect_timeout" not in given:
                params["connect_timeout"] = cls.DEFAULT_CONNECT_TIMEOUT
            if "application_name" not in given and "PGAPPNAME" not in os.environ:
                params["application_name"] = "remit"
            conninfo = make_conninfo(base, **params)
        except psycopg.Error as exc:
            raise bad(f"invalid PostgreSQL URL: {scrub(str(exc), [password, *secrets])}; "
                      f"remit's own options are {', '.join(known_options('postgres'))}, every "
                      "other parameter goes to libpq") from None
        timeout = str(conninfo_to_dict(conninfo)["connect_timeout"])
        option("postgres", "connect_timeout").parse(  # type: ignore[union-attr]
            timeout, repr(masked), url=masked)
        return cls(url, conninfo, opts["schema"], serde=serde, lease=opts["lease"],
                   pool_min=opts["pool_min"], pool_max=opts["pool_max"],
                   pool_timeout=opts["pool_timeout"], read_only=read_only,
                   secrets=[password, str(given.get("password") or ""), *secrets])

    def _unavailable(self, exc: BaseException, doing: str, when: str = "") -> StoreUnavailable:
        return StoreUnavailable(
            f"{doing} PostgreSQL at {self.url!r} failed{when} "
            f"({scrub(str(exc), self._secrets)}). "
            "Check that the server is running and that the URL (host, port, database, user) "
            "is right.",
            url=self.url,
        )

    def _new_pool(self) -> ConnectionPool[Conn]:
        # No check-on-checkout (ConnectionPool.check_connection): it costs a round trip on
        # every operation and, after a server restart, sleeps >= 1 s per dead idle connection
        # it meets. Instead, a connection error is retried (every operation is safe to
        # repeat), the pool discards the broken connection when it comes back, and _conn()
        # sweeps the other idle connections (pool.check()), which died with it, so the retry
        # gets a fresh connection.
        return ConnectionPool(
            self._conninfo, connection_class=psycopg.Connection, kwargs={"autocommit": True},
            min_size=self._pool_min, max_size=self._pool_max, open=False,
            timeout=self._pool_timeout, name=f"remit-{self.schema}",
            configure=_read_only_session if self.read_only else None,
        )

    # ----------------------------------------------------------------------------- connections

    def _get_pool(self) -> ConnectionPool[Conn]:
        if self._pid != os.getpid() and not self._closed:
            # A forked child must not use its parent's sockets: give it its own pool. The
            # parent's pool is kept referenced (never closed or collected here).
            with self._lock:
                if self._pid != os.getpid():
                    self._inherited.append(self._pool)
                    self._pool = self._new_pool()
                    self._pool.open()
                    self._pid = os.getpid()
        return self._pool

    def _new_apool(self) -> _LoopPool:
        return _LoopPool(self._conninfo, max_size=self._pool_max, timeout=self._pool_timeout,
                         read_only=self.read_only, name=f"remit-{self.schema}-async")

    async def _aclose_loop(self) -> None:
        await self._apools.aclose_current()

    def _conn(self) -> contextlib.AbstractContextManager[Conn]:
        """A pooled autocommit connection: one statement is one transaction. Inside
        :func:`remit_core.aio.run`, an async connection of the loop's pool."""
        if aio.bridged():
            return _Borrowed(self, self._apools.get())
        return self._pooled()

    @contextlib.contextmanager
    def _pooled(self) -> Iterator[Conn]:
        pool = self._get_pool()
        try:
            with pool.connection() as conn:
                yield conn
        except psycopg.OperationalError as exc:
            self._sweep_after(exc, pool.check)
            raise

    def _sweep_after(self, exc: psycopg.OperationalError, check: Callable[[], Any]) -> None:
        """After ``exc``: if the connection itself was lost, drop the pool's idle
        connections (``check``), which died with it, so that the retry gets a fresh one."""
        if _connection_lost(exc) and not isinstance(exc, PoolTimeout) and not self._closed:
            with contextlib.suppress(Exception):
                check()

    def capacity_warnings(self, *, threads: int = 1) -> list[str]:
        """This pool against ``threads`` working threads (each holds a connection while it
        works, and the lease keeper one more) and against what the server has left:
        ``max_connections`` minus ``superuser_reserved_connections`` minus the connections
        open now (this pool's own not counted)."""
        found = []
        if self._pool_max < threads + 1:
            found.append(
                f"{self.url}: pool_max={self._pool_max} connections for {threads} threads "
                "and the lease keeper: threads will wait for a connection (up to "
                f"pool_timeout={self._pool_timeout:g} s, then fail); use "
                f"?pool_max={threads + 1} or more")
        with self._conn() as conn:
            row = conn.execute(
                "SELECT current_setting('max_connections')::int, "
                "current_setting('superuser_reserved_connections')::int, "
                "(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')"
            ).fetchone()
        assert row is not None
        most, reserved, in_use = (int(v) for v in row)
        own = self._get_pool().get_stats().get("pool_size", 0)
        left = most - reserved - (in_use - own)
        if self._pool_max > left:
            found.append(
                f"{self.url}: pool_max={self._pool_max}, but the server has {left} "
                f"connections left (max_connections {most}, {reserved} reserved for "
                f"superusers, {in_use - own} open by other clients): once they are used "
                "new connections are refused (too many clients). Lower pool_max per process "
                "(pool_max x processes must stay under max_connections) or raise "
                "max_connections; see docs/operating.md")
        return found

    @contextlib.contextmanager
    def _tx(self) -> Iterator[Conn]:
        """One transaction (BEGIN ... COMMIT, ROLLBACK on any error)."""
        with self._conn() as conn, conn.transaction():
            yield conn

    def _run_lock(self, run_id: str) -> int:
        """The key of a run's advisory lock (see _lock_runs)."""
        return _hash64(f"{self.schema}\x1f{run_id}")

    def _lock_runs(self, conn: sql.Conn, *run_ids: str) -> None:
        """Serialise the checkpoint writes and garbage collection of these runs.

        A transaction-level advisory lock on a hash of (schema, run_id), taken in sorted
        order so that two lockers of several runs cannot deadlock (a hash collision only
        makes two runs wait for each other). It must be its own statement, *before* any
        check: under READ COMMITTED each statement reads a fresh snapshot, so the check
        that follows sees every write committed by the previous holder.
        """
        for key in sorted({self._run_lock(r) for r in run_ids}):
            conn.execute(_LOCK_RUN, {"lock": key})

    def _close(self) -> None:
        self._closed = True
        if self._pid == os.getpid():
            self._pool.close()
        self._apools.close_all()

    def _is_transient(self, exc: BaseException) -> bool:
        # OperationalError covers a lost or refused connection (sqlstate None or 08xxx), the
        # server shutting down or starting (57P01-57P03, AdminShutdown, CannotConnectNow),
        # SerializationFailure and DeadlockDetected (40xxx), lock and statement timeouts,
        # too many connections, and the pool's PoolTimeout. IntegrityError, ProgrammingError,
        # DataError ... are not OperationalError and are never retried.
        if not isinstance(exc, psycopg.OperationalError) or isinstance(exc, PoolClosed):
            return False
        state = exc.sqlstate or ""
        return not state.startswith("54")  # program limit exceeded: repeating cannot help

    def _exhausted(self, exc: Exception) -> BaseException | None:
        if isinstance(exc, psycopg.OperationalError) and _connection_lost(exc):
            return self._unavailable(exc, "using", " after bounded retries")
        return None

    # ------------------------------------------------------------------------------ migrations

    def _migrate(self) -> None:
        """Open the store's layout (:meth:`Store._open_layout`) on a connection of its own
        (read-only: only find it)."""
        try:
            self._open_layout()
        except psycopg.errors.InsufficientPrivilege as exc:
            if self.read_only:
                raise StoreConfigError(
                    f"{self.url!r}: the user may not read remit's tables in schema "
                    f"{self.schema!r} ({scrub(str(exc), self._secrets)}). Grant it USAGE "
                    "on the schema and SELECT on its tables.", url=self.url) from exc
            raise StoreConfigError(
                f"{self.url!r}: the user may not create remit's tables in schema "
                f"{self.schema!r} ({scrub(str(exc), self._secrets)}). Grant it CREATE on "
                "the schema (or the database), or pick a schema it owns with ?schema=NAME.",
                url=self.url) from exc
        except psycopg.Error as exc:
            raise self._unavailable(exc, f"preparing schema {self.schema!r} of") from exc

    @contextlib.contextmanager
    def _layout_session(self) -> Iterator[Conn]:
        try:
            conn = psycopg.connect(self._conninfo, autocommit=True)
        except psycopg.Error as exc:
            msg = str(exc)
            if re.search(r"invalid \w+ value|invalid connection option|invalid integer value",
                         msg):
                raise StoreConfigError(
                    f"invalid connection option in {self.url!r}: {scrub(msg, self._secrets)}",
                    url=self.url) from None
            raise self._unavailable(exc, "connecting to") from None
        with conn, conn.transaction():
            if self.read_only:
                conn.execute("SET TRANSACTION READ ONLY")
            else:
                # Concurrent openers of one schema run this one at a time; the statements
                # after the lock see everything the previous holder committed (READ
                # COMMITTED). An opener stuck holding the lock makes the others fail after
                # lock_timeout, not hang.
                conn.execute("SET LOCAL lock_timeout = '60s'")
                conn.execute("SELECT pg_advisory_xact_lock(%s::int4, %s::int4)",
                             (MIGRATION_LOCK, _hash32(self.schema)))
            yield conn

    def _read_layout(self, conn: Conn) -> Layout:
        if conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s",
                        (self.schema,)).fetchone() is None:
            return Layout(None, absent=f"schema {self.schema!r} does not exist. Check "
                          "?schema=NAME; remit creates a store only when an application "
                          "opens it for writing.")
        names = {r[0] for r in conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = ANY(%s::text[])",
            (self.schema, list(TABLES)))}
        if "remit_meta" not in names:
            return Layout(None, strays=sorted(names), absent=f"schema {self.schema!r} has no "
                          "remit tables. Check ?schema=NAME.")
        try:
            return Layout({str(k): str(v) for k, v in conn.execute(
                f"SELECT key::text, value::text FROM {self._meta}")})
        except (psycopg.errors.UndefinedColumn, psycopg.errors.WrongObjectType):
            return Layout({})  # not remit's (the transaction is refused and rolled back)

    def _create_layout(self, conn: Conn) -> None:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
        conn.execute(f"CREATE TABLE {self._meta} (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute(f"INSERT INTO {self._meta} VALUES ('schema', 'remit'), ('version', '0')")

    def _apply_step(self, conn: Conn, step: str) -> None:
        # the scripts name tables unqualified
        conn.execute(f'SET LOCAL search_path TO "{self.schema}"')
        conn.execute(step)

    def _set_version(self, conn: Conn, version: int) -> None:
        conn.execute(f"UPDATE {self._meta} SET value = %s WHERE key = 'version'", (str(version),))

    # ----------------------------------------------------------------------------- checkpoints

    def _transaction(self) -> contextlib.AbstractContextManager[Conn]:
        return self._tx()

    def _read_chunks(self, run_id: str, digests: list[bytes]) -> dict[bytes, bytes]:
        with self._conn() as conn:
            return {bytes(d): bytes(v) for d, v in conn.execute(
                f"SELECT digest, value FROM {self._t.ch} WHERE run_id = %s "
                "AND digest = ANY(%s::bytea[])", (run_id, digests), binary=True).fetchall()}

    def _write_checkpoint(self, row: CheckpointRow, blobs: list[BlobRow],
                          exclusive_child: bool, chunks: Mapping[bytes, bytes],
                          writes: Sequence[tuple[list[WriteRow], bool]] = ()
                          ) -> tuple[int, str | None]:
        # Every checkpoint write of a run holds the run's advisory lock (see _lock_runs)
        # from before any check until commit. So exclusive_child (CO) is race-free: two
        # writers of children of one parent run the check-then-insert one after the other,
        # and the second one's check sees the first one's child. A lock per run (not per
        # parent) also makes seq order equal commit order within a run, so "latest" never
        # goes back, and keeps prune_run's collection from deleting a blob or chunk that a
        # concurrent writer just found present and skipped (chunks are inserted while the
        # lock is held, by writes too). Writers of one run already queue on its remit_runs
        # row, so this costs no concurrency.
        params = {
            "run": row.run_id, "ns": row.ns, "cid": row.checkpoint_id, "parent": row.parent_id,
            "kind": row.kind, "execution": row.execution_id, "data": row.data,
            "metadata": row.metadata, "vmap": versions_json(row.versions),
            "channels": _text_array([b.channel for b in blobs]),
            "versions": _text_array([b.version for b in blobs]),
            "values": _bytea_array([b.value for b in blobs]), "lock": self._run_lock(row.run_id),
            **self._grouped_writes(row, writes),
        }
        if not chunks and (not exclusive_child or row.parent_id is None):
            # one statement in its own transaction (autocommit): one round trip
            with self._conn() as conn:
                seq = conn.execute(self._put_step_sql, params).fetchone()
            assert seq is not None
            return int(seq[0]), None
        # the check's answer decides whether anything is written; chunks go as binary
        # parameters, only those the run does not have yet (a growing value shares most)
        with self._tx() as conn:
            self._lock_runs(conn, row.run_id)
            if exclusive_child and row.parent_id is not None:
                other = conn.execute(self._sibling_sql, params).fetchone()
                if other is not None:
                    return 0, str(other[0])
            self._insert_new_chunks(conn, row.run_id, chunks)
            seq = conn.execute(self._put_step_sql, params).fetchone()  # (the lock again: held)
            assert seq is not None
            return int(seq[0]), None

    @staticmethod
    def _grouped_writes(row: CheckpointRow, writes: Sequence[tuple[list[WriteRow], bool]]
                        ) -> dict[str, str]:
        """The pending writes grouped with a checkpoint, as remit_put_step takes them: per
        call of :meth:`Store.put_writes` (one task's) its checkpoint, task, path, overwrite
        flag and count, then every call's writes in order, as parallel arrays."""
        cids, tasks, paths, overwrites, counts = [], [], [], [], []
        kept: list[WriteRow] = []
        for rows, overwrite in writes:
            run, ns, cid, task, path = _one_task(rows)
            if (run, ns) != (row.run_id, row.ns):
                raise ValueError(f"writes of run {run!r} ns {ns!r} grouped with a checkpoint "
                                 f"of run {row.run_id!r} ns {row.ns!r}")
            unique = _unique_writes(rows, overwrite)
            cids.append(cid)
            tasks.append(task)
            paths.append(path)
            overwrites.append("t" if overwrite else "f")
            counts.append(len(unique))
            kept += unique
        return {
            "g_cids": _text_array(cids), "g_tasks": _text_array(tasks),
            "g_paths": _text_array(paths), "g_overwrite": "{" + ",".join(overwrites) + "}",
            "g_counts": _int_array(counts), "w_idxs": _int_array([w.idx for w in kept]),
            "w_channels": _text_array([w.channel for w in kept]),
            "w_values": _bytea_array([w.value for w in kept]),
        }

    def _read_checkpoint(self, run_id: str, ns: str, checkpoint_id: str | None,
                         with_writes: bool) -> sql.Found | None:
        if self.layout_version < _READ_FUNCTION:  # an older store, opened read-only
            return super()._read_checkpoint(run_id, ns, checkpoint_id, with_writes)
        with self._conn() as conn:  # one statement: one snapshot, the chunks included
            r = conn.execute(self._read_sql, {"run": run_id, "ns": ns, "cid": checkpoint_id,
                                              "writes": with_writes}, binary=True).fetchone()
        if r is None:
            return None
        found = _found(r[:18])
        if r[18] is None:  # no manifest among the values
            return found
        row, stored, written = found
        blobs, writes = self._unchunked(
            row, stored, written, {bytes(d): bytes(v) for d, v in zip(r[18], r[19], strict=True)})
        return row, dict(blobs), list(writes)

    def _checkpoints(self, where: Sequence[str], args: Mapping[str, Any], limit: int | None,
                     with_writes: bool) -> list[sql.Found]:
        query = (self._ck_select[with_writes]
                 + (" WHERE " + " AND ".join(where) if where else "")
                 + " ORDER BY c.seq DESC LIMIT %(limit)s")
        with self._conn() as conn:  # one statement: one snapshot
            rows = conn.execute(query, {**args, "limit": limit}, binary=True).fetchall()
        return [_found(r) for r in rows]

    def _writes_insert(self, rows: list[WriteRow], overwrite: bool) -> tuple[str, dict[str, Any]]:
        """The statement inserting one call's pending writes (one task's, as
        :meth:`Store.put_writes` takes them), and its parameters. The task's columns go as
        scalars, the writes' as arrays."""
        run, ns, cid, task, path = _one_task(rows)
        kept = _unique_writes(rows, overwrite)
        statement = self._writes_sql.get(overwrite)
        if statement is None:
            action = ("DO UPDATE SET channel = excluded.channel, value = excluded.value, "
                      "task_path = excluded.task_path") if overwrite else "DO NOTHING"
            statement = self._writes_sql[overwrite] = (
                f"INSERT INTO {self._t.wr} (run_id, ns, checkpoint_id, {sql.WRITE_COLS}) "
                "SELECT %(run)s::text, %(ns)s::text, %(cid)s::text, %(task)s::text, u.idx, "
                "u.channel, u.value, %(path)s::text FROM unnest(%(idxs)s::int[], "
                "%(channels)s::text[], %(values)s::bytea[]) AS u(idx, channel, value) "
                f"ON CONFLICT (run_id, ns, checkpoint_id, task_id, idx) {action}")
        return statement, {
            "run": run, "ns": ns, "cid": cid, "task": task, "path": path,
            "idxs": _int_array([w.idx for w in kept]),
            "channels": _text_array([w.channel for w in kept]),
            "values": _bytea_array([w.value for w in kept]),
        }

    def _write_writes(self, rows: list[WriteRow], overwrite: bool,
                      chunks: Mapping[bytes, bytes]) -> None:
        insert, params = self._writes_insert(rows, overwrite)
        if not chunks:  # one statement, its own transaction (autocommit): no lock
            # needed, as prune keeps a run's writes unless their checkpoint goes too
            with self._conn() as conn:
                conn.execute(insert, params)
            return
        with self._tx() as conn:
            self._lock_runs(conn, rows[0].run_id)
            self._insert_new_chunks(conn, rows[0].run_id, chunks)
            conn.execute(insert, params)

    def _insert_new_chunks(self, conn: Conn, run_id: str, chunks: Mapping[bytes, bytes]
                           ) -> None:
        """Insert the chunks the run does not have yet, under the run's lock (so that no
        prune deletes one found present before the value naming it commits)."""
        if not chunks:
            return
        present = {bytes(d) for (d,) in conn.execute(
            f"SELECT digest FROM {self._t.ch} WHERE run_id = %s AND digest = ANY(%s::bytea[])",
            (run_id, list(chunks)), binary=True).fetchall()}
        new = {d: v for d, v in chunks.items() if d not in present}
        if new:
            conn.execute(self._chunks_sql, {"run": run_id, "digests": list(new),
                                            "chunks": list(new.values())}, binary=True)

    # ------------------------------------------------------------------------ receipts, claims

    def _writing(self) -> contextlib.AbstractContextManager[Conn]:
        return self._conn()  # autocommit: one statement is one transaction

    def _reading(self) -> contextlib.AbstractContextManager[Conn]:
        return self._conn()

    def _decide(self, records: sql.Records[sql.R], key: str, decide: sql.Decide[sql.R], *,
                insert_first: bool = False) -> Verdict[Any, Any]:
        # In autocommit, without a row lock: a verdict on a new key that inserts (``run``,
        # ``won``) is one atomic INSERT, which reads the stored row with the server's
        # clock in the same statement when the key exists (``Records.insert_or_select``);
        # a verdict that writes nothing (a replay: done, busy, held, consumed, ...) is
        # taken on the committed row, and one that changes it (a consume, a take-over) is
        # one compare-and-set UPDATE that applies only while the row is still the one read
        # (every column). One round trip for a first call or a replay, two for a change.
        # A run's lifecycle is read first (``records.kept``: most starts continue a run),
        # then inserted or changed: two round trips, unless the caller expects it new
        # (``insert_first``). (Through insert_or_select, interleaved on one store, medians
        # of 6 x 200: a new run's start took 452 us against 620, but a parked run's, found
        # by the insert and then changed, 706 us against 604.) k racers for one key do not
        # queue on a lock. Deciding on the committed row orders this call
        # before any concurrent change of it, as a lock would order it after; a key
        # committed after the statement's snapshot (a concurrent first call), or a
        # compare-and-set that finds the row changed (a concurrent writer won), goes
        # through the locked transaction.
        fresh = decide(None, 0.0)  # with now 0: its times are offsets from the clock
        inserts = fresh.write == "insert"
        with self._conn() as conn:
            if inserts and (insert_first or not records.kept):
                r = conn.execute(records.insert_or_select, records.params(fresh.row)
                                 ).fetchone()
                if r is not None and r[0]:
                    return Verdict(fresh.outcome, records.row(r[1:]), "insert")
                r = None if r is None else r[1:]
            else:
                r = conn.execute(records.select_now, {"key": key}).fetchone()
                if r is None:
                    if not inserts:  # no record, nothing to write: the same at any time
                        return fresh
                    row = self._insert_stamped(conn, records, fresh)  # none yet: insert it
                    if row is not None:
                        return Verdict(fresh.outcome, row, "insert")
            if r is not None:
                # now is read with the row: applied a round trip later, it can only make
                # a lease look live longer (busy, never a wrong take-over) or a new lease
                # end a little early
                was = records.row(r)
                verdict = decide(was, float(r[-1]))
                if verdict.write == "none":
                    return verdict
                if verdict.write == "update" and conn.execute(
                        records.swap, records.swap_params(was, verdict.row)).rowcount == 1:
                    return verdict
        with self._tx() as conn:
            while True:
                if inserts:  # a concurrent inserter makes this wait for its commit
                    row = self._insert_stamped(conn, records, fresh)
                    if row is not None:
                        return Verdict(fresh.outcome, row, "insert")
                r = conn.execute(records.select_now + " FOR UPDATE", {"key": key}).fetchone()
                if r is not None:
                    break
                if not inserts:
                    return fresh
                # released or reset between the two statements: insert again
            verdict = decide(records.row(r), float(r[-1]))
            self._apply(conn, records, verdict)
            return verdict

    @staticmethod
    def _insert_stamped(conn: Conn, records: sql.Records[sql.R], fresh: Verdict[Any, Any]
                        ) -> sql.R | None:
        """Insert the row of ``fresh`` (decided at now 0) stamped with the server clock,
        unless the key exists: the row written, or None."""
        r = conn.execute(records.insert_stamped, records.params(fresh.row)).fetchone()
        return None if r is None else records.row(r)
