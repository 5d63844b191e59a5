"""PostgreSQL-specific behaviour of the store: URLs and errors, schema versioning and
foreign tables, concurrent openers, the server clock, connection loss and races.

The backend-neutral contract is tested for every backend in test_store.py.
"""

from __future__ import annotations

import queue
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest
from psycopg_pool import PoolClosed, PoolTimeout
from tenacity import Retrying, retry_if_result, stop_after_delay, wait_fixed

from remit_core import ConsumeConflict, open_store
from remit_core.errors import (
    ForeignSchemaError,
    StoreClosed,
    StoreConfigError,
    StoreUnavailable,
    StoreVersionError,
)
from remit_core.store import new_owner
from remit_core.store.postgres import MIGRATIONS, TABLES, PostgresStore
from remit_core.store.sql import RECEIPT_COLUMNS
from tests import procs

pytestmark = pytest.mark.postgres

CTX = procs.CTX


@pytest.fixture
def pg_url(make_url: Callable[[str], str]) -> str:
    """The URL of a fresh schema (dropped after the test)."""
    return make_url("postgres")


def schema_of(url: str) -> str:
    return parse_qs(urlsplit(url).query)["schema"][0]


@pytest.fixture
def admin(pg_base_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_base_url, autocommit=True) as conn:
        yield conn


def tables_in(admin: psycopg.Connection[Any], schema: str) -> set[str]:
    return {r[0] for r in admin.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,))}


# ------------------------------------------------------------------------------- URLs, errors


def test_password_is_masked_when_the_server_is_unreachable() -> None:
    for url in ("postgresql://u:secret@127.0.0.1:1/test",
                "postgresql://u@127.0.0.1:1/test?password=secret&connect_timeout=2"):
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailable) as info:
            open_store(url)
        assert time.monotonic() - t0 < 15  # bounded: connect_timeout, no endless retries
        text = str(info.value)
        assert "secret" not in text and "***" in text, text
        assert "127.0.0.1:1" in text and "refused" in text.lower()
        assert info.value.url is not None and "secret" not in info.value.url
        assert "secret" not in repr(info.value)


def test_url_typos_give_clear_errors(pg_base_url: str) -> None:
    base = "postgresql://postgres@127.0.0.1:5432/test"
    with pytest.raises(StoreConfigError, match=r"Did you mean postgres(ql)?://"):
        open_store("postgresq://postgres@127.0.0.1:5432/test")
    for query, says in [
        ("schema=", "schema"),
        ("schema=bad-name", "schema"),
        ("schema=pg_mine", "pg_"),
        ("schema=a%22b", "schema"),
        ("pool_max=ten", "pool_max"),
        ("pool_min=5&pool_max=2", "pool_min"),
        ("lease=0", "lease"),
        ("shema=remit", "shema"),  # not remit's, so libpq's: an unknown parameter
        ("sslmode=sometimes", "sslmode"),
    ]:
        with pytest.raises(StoreConfigError, match=says) as info:
            open_store(f"{base}?{query}")
        assert "127.0.0.1:5432" in str(info.value)
    with pytest.raises(StoreConfigError) as bad_port:
        open_store("postgresql://u:secret@127.0.0.1:port/test")
    assert "secret" not in str(bad_port.value)


def test_options_reach_the_pool_and_libpq(pg_url: str, admin: psycopg.Connection[Any]) -> None:
    app = f"remit-opt-{uuid.uuid4().hex[:8]}"
    with open_store(f"{pg_url}&pool_min=2&pool_max=3&application_name={app}&lease=7") as s:
        assert isinstance(s, PostgresStore)
        assert s.lease == 7.0 and s.schema == schema_of(pg_url)
        assert s._pool.min_size == 2 and s._pool.max_size == 3
        n = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                          (app,)).fetchone()
        assert n is not None and n[0] >= 2
    assert tables_in(admin, schema_of(pg_url)) == set(TABLES)


def test_closed_store_fails_fast_without_retries(pg_url: str) -> None:
    s = open_store(pg_url)
    s.close()
    t0 = time.monotonic()
    with pytest.raises(StoreClosed, match="was closed"):
        s.get_checkpoint("r")
    assert time.monotonic() - t0 < 1.0


# ---------------------------------------------------------------------------------- schema


def test_schema_version_1_is_upgraded(pg_url: str, admin: psycopg.Connection[Any]) -> None:
    """A store written before chunked values (version 1) gains remit_chunks on open and
    keeps its data."""
    schema = schema_of(pg_url)
    with open_store(pg_url) as s:
        s.put_checkpoint("r", "c1", new_values={"x": ("1", 1)})
    admin.execute(f'DROP TABLE "{schema}".remit_chunks')  # the version-1 layout
    admin.execute(f'DROP TABLE "{schema}".remit_lifecycle')  # (version 4)
    admin.execute(f'DROP INDEX "{schema}".remit_claims_lapsing')  # (version 5)
    admin.execute(f'DROP FUNCTION "{schema}".remit_put_step')  # (version 7)
    admin.execute(f'DROP INDEX "{schema}".remit_checkpoints_head')  # (version 8)
    admin.execute(f'DROP FUNCTION "{schema}".remit_read_checkpoint')
    admin.execute(f"UPDATE \"{schema}\".remit_meta SET value = '1' WHERE key = 'version'")
    big = bytes(range(256)) * 1000
    with open_store(pg_url) as s:
        assert s.get_checkpoint("r").values == {"x": 1}  # type: ignore[union-attr]
        s.put_checkpoint("r", "c2", parent_id="c1", new_values={"x": ("2", big)})
        assert s.usage("r")["chunks"] > 0 and s.get_checkpoint("r").values == {"x": big}  # type: ignore[union-attr]
        s.put_checkpoint("r", "c3", parent_id="c2", new_values={"y": ("1", [1])})
        assert s.get_checkpoint("r").values == {"y": [1]}  # type: ignore[union-attr]
    # version 7: the step's write, a function resolving remit's tables in this schema
    config = admin.execute(
        "SELECT p.proconfig FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = %s AND p.proname = 'remit_put_step'", (schema,)).fetchall()
    quoted = admin.execute("SELECT quote_ident(%s)", (schema,)).fetchone()
    assert quoted is not None and config == [([f"search_path={quoted[0]}"],)]
    # version 8: the read, a function whose statements run their generic plans
    config = admin.execute(
        "SELECT p.proconfig FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = %s AND p.proname = 'remit_read_checkpoint'", (schema,)).fetchall()
    assert config == [([f"search_path={quoted[0]}", "plan_cache_mode=force_generic_plan"],)]
    assert tables_in(admin, schema) == set(TABLES)
    version = admin.execute(f"SELECT value FROM \"{schema}\".remit_meta WHERE key = 'version'"
                            ).fetchone()
    assert version == (str(len(MIGRATIONS)),)
    # version 3: lz4 TOAST compression where the server has it (this one does)
    compression = admin.execute(
        "SELECT attname, attcompression FROM pg_attribute WHERE attrelid = %s::regclass "
        "AND attname IN ('data', 'metadata', 'versions')",
        (f'"{schema}".remit_checkpoints',)).fetchall()
    assert sorted(compression) == [("data", "l"), ("metadata", "l"), ("versions", "l")]


def test_a_read_finds_a_runs_latest_checkpoint_through_the_head_index(pg_url: str) -> None:
    """get_checkpoint's read (remit_read_checkpoint, migration 8) finds a run's latest
    checkpoint through remit_checkpoints_head, with its generic plan, also for a run whose
    latest checkpoint lies behind a long history of another run: the plan neither walks the
    primary key (seq) backwards nor reads the other run's checkpoints. Its values and the
    chunks they name are each read by primary key, the chunks only when a value is in
    chunks. (Ordered by seq, a plan walked the primary key backwards from the newest
    checkpoint of the table, reading every checkpoint written since the run's latest: 2.5 ms
    behind 10 000.) The nested statements' plans are read from auto_explain on the store's
    one connection."""
    big = bytes(range(256)) * 40  # stored in chunks
    with open_store(pg_url + "&pool_max=1&pool_min=1") as s:
        parent = None
        for i in range(3):
            s.put_checkpoint("quiet", f"q{i}", parent_id=parent,
                             new_values={"x": (str(i), i), "big": (str(i), big + bytes([i]))})
            parent = f"q{i}"
        parent = None
        for i in range(300):
            s.put_checkpoint("busy", f"b{i}", parent_id=parent, new_values={"x": (str(i), i)})
            parent = f"b{i}"
        plans: list[str] = []
        with s._conn() as conn:  # type: ignore[attr-defined]
            conn.execute(f'ANALYZE "{schema_of(pg_url)}".remit_checkpoints')
            conn.execute("LOAD 'auto_explain'")
            for setting in ("log_min_duration = 0", "log_nested_statements = on",
                            "log_level = notice", "log_analyze = on"):
                conn.execute(f"SET auto_explain.{setting}")
            conn.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
        for _ in range(3):
            got = s.get_checkpoint("quiet")
            assert got is not None and got.checkpoint_id == "q2"
            assert got.values == {"x": 2, "big": big + b"\x02"}
            at = s.get_checkpoint("quiet", "q1")
            assert at is not None and at.checkpoint_id == "q1"
            assert at.values == {"x": 1, "big": big + b"\x01"}
        assert s.usage("quiet")["chunks"] > 0
        read = len(plans)
        plain = s.get_checkpoint("busy")  # no value in chunks: no read of the chunks
        assert plain is not None and plain.values == {"x": 299}
        with s._conn() as conn:  # type: ignore[attr-defined]
            conn.execute("SET auto_explain.log_min_duration = -1")
    assert any("Query Text: SELECT c.run_id" in p for p in plans[read:]), plans[read:]
    assert not any("remit_chunks" in p for p in plans[read:]), plans[read:]
    del plans[read:]
    lookups = [p for p in plans if "SELECT c.seq" in p]
    latest = [p for p in lookups if "ORDER BY" in p]
    assert len(latest) == 3 and len(lookups) == 6, plans
    for plan in latest:
        assert "remit_checkpoints_head" in plan and "Backward" not in plan, plan
        assert "Rows Removed" not in plan and "Sort" not in plan, plan
        assert "$1" in plan or "p_run" in plan  # a generic plan: the run is a parameter
    # the values, and the chunks they name: each one lookup by its primary key
    reads = [p for p in plans if "Query Text: SELECT c.run_id" in p]
    chunks = [p for p in plans if "FROM remit_chunks" in p]
    assert len(reads) == 6 and len(chunks) == 6, plans
    for plan, table in [*((p, "blobs") for p in reads), *((p, "chunks") for p in chunks)]:
        assert f"remit_{table}_pkey" in plan, plan
        assert f"Seq Scan on remit_{table}" not in plan and "Bitmap" not in plan, plan
        assert "Hash Join" not in plan and "Hash Semi Join" not in plan, plan


def test_a_listing_before_an_id_looks_it_up_by_the_unique_key(pg_url: str) -> None:
    """Where a listing with ``before`` stops is found by the checkpoints' unique key, one
    lookup per namespace of the run (their list walked through the same key), never by a
    scan of the run's checkpoints: a 1 000-checkpoint run's page before its middle reads
    no other checkpoint than those it lists. (The lookup by run and id alone read the whole
    run: a sequential scan of 3 003 rows for a 3 000-checkpoint run.) The plan is read from
    auto_explain on the store's one connection."""
    with open_store(pg_url + "&pool_max=1&pool_min=1") as s:
        parent = None
        for i in range(1_000):
            s.put_checkpoint("long", f"c{i:04d}", parent_id=parent)
            if i % 100 == 0:
                s.put_checkpoint("long", f"s{i:04d}", ns=f"sub:{i % 3}")
            parent = f"c{i:04d}"
        plans: list[str] = []
        with s._conn() as conn:  # type: ignore[attr-defined]
            conn.execute(f'ANALYZE "{schema_of(pg_url)}".remit_checkpoints')
            conn.execute("LOAD 'auto_explain'")
            for setting in ("log_min_duration = 0", "log_level = notice", "log_analyze = on"):
                conn.execute(f"SET auto_explain.{setting}")
            conn.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
        listed = list(s.list_checkpoints("long", ns="", before="c0500", limit=5))
        assert [c.checkpoint_id for c in listed] == ["c0499", "c0498", "c0497", "c0496", "c0495"]
        with s._conn() as conn:  # type: ignore[attr-defined]
            conn.execute("SET auto_explain.log_min_duration = -1")
    [plan] = [p for p in plans if "FROM spaces" in p]
    assert "Seq Scan on remit_checkpoints" not in plan and "Bitmap" not in plan, plan
    assert "Filter: (checkpoint_id" not in plan and "Join Filter" not in plan, plan
    assert "(ns = spaces" in plan and "(checkpoint_id = " in plan, plan
    assert all(int(n) <= 1 for n in re.findall(r"Rows Removed by Filter: (\d+)", plan)), plan


def test_a_first_call_or_a_replay_of_a_receipt_or_claim_is_one_statement(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A receipt's or claim's decision whose verdict on a new key inserts it is one
    statement whether the key is new or stored: the insert reads the stored row with the
    server's clock when the key exists, and a replay is decided on it. A verdict that
    changes the stored row adds its compare-and-set. (Before, a replay tried the insert
    and then read the row: two statements.) A run that is not running is continued by one
    conditional update (decisions.CONTINUE_RUN); any other lifecycle is read after it,
    then inserted or changed; a run started as ``likely_new`` is inserted first, as a
    receipt."""
    seen: list[str] = []
    execute = psycopg.Connection.execute

    def counting(self: psycopg.Connection[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        text = query if isinstance(query, str) else str(query)
        if "remit_" in text:
            seen.append(text.split()[0])
        return execute(self, query, *args, **kwargs)

    def receipt(owner: str) -> Any:
        return s.start_receipt("k", run_id="r", step="s", name="n", ordinal=0, owner=owner,
                               may_take_over=False)

    with open_store(pg_url) as s:
        monkeypatch.setattr(psycopg.Connection, "execute", counting)
        first = receipt("me")
        assert first.outcome == "run" and seen == ["WITH"], seen
        seen.clear()
        assert receipt("other").outcome == "busy" and seen == ["WITH"], seen
        s.complete_receipt("k", owner="me", fence=first.receipt.fence, result={"id": 7})
        seen.clear()
        replay = receipt("other")
        assert replay.outcome == "done" and replay.receipt.result == {"id": 7}
        assert seen == ["WITH"], seen
        seen.clear()
        claimed = s.claim_once("c", run_id="r", owner="me", digest="d", value={"ok": True})
        assert claimed.owner == "me" and seen == ["WITH"], seen
        seen.clear()
        with pytest.raises(ConsumeConflict):
            s.claim_once("c", run_id="r", owner="other", digest="d", value={"ok": True})
        assert seen == ["WITH"], seen
        seen.clear()
        run = s.start_run("r", framework="f", name="g", owner="me")  # new, without the hint
        assert run.outcome == "started" and seen == ["UPDATE", "SELECT", "INSERT"], seen
        assert s.end_run("r", owner="me", fence=run.run.fence, status="parked")
        seen.clear()
        again = s.start_run("r", framework="f", name="g", owner="me")
        assert again.outcome == "started" and seen == ["UPDATE"], seen
        assert (again.run.fence, again.run.attempts) == (run.run.fence + 1, 2)
        seen.clear()
        busy = s.start_run("r", framework="f", name="g", owner="other")  # running: read
        assert busy.outcome == "busy" and seen == ["UPDATE", "SELECT"], seen
        # likely_new (the adapter found nothing stored): the insert first, reading the
        # stored row in the same statement when the run exists after all
        seen.clear()
        new = s.start_run("n", framework="f", name="g", owner="me", likely_new=True)
        assert new.outcome == "started" and new.run.fence == 1 and seen == ["WITH"], seen
        assert s.end_run("r", owner="me", fence=again.run.fence, status="parked")
        seen.clear()
        wrong = s.start_run("r", framework="f", name="g", owner="me", likely_new=True)
        assert wrong.outcome == "started" and wrong.run.fence == again.run.fence + 1
        assert seen == ["WITH", "UPDATE"], seen


def test_a_first_call_racing_a_concurrent_first_call_is_decided_on_its_row(
        pg_url: str, admin: psycopg.Connection[Any]) -> None:
    """A receipt's first call whose key another transaction inserts and commits while the
    call's statement runs (its insert waits for that transaction and then finds the key;
    its read of the stored row, in the statement's snapshot, finds nothing) is decided on
    the row that transaction committed: busy, the other owner's lease being live, and that
    row is kept."""
    schema = schema_of(pg_url)
    rc = f'"{schema}".remit_receipts'
    cols = ", ".join(c for c, _ in RECEIPT_COLUMNS)

    def receipt(key: str, owner: str) -> Any:
        return s.start_receipt(key, run_id="r", step="s", name="n", ordinal=0, owner=owner,
                               may_take_over=False)

    with open_store(pg_url) as s:
        assert receipt("seed", "other").outcome == "run"
        with psycopg.connect(admin.info.dsn) as other:  # a transaction, left open
            other.execute(f"INSERT INTO {rc} ({cols}) SELECT 'k', "
                          + ", ".join(c for c, _ in RECEIPT_COLUMNS[1:])
                          + f" FROM {rc} WHERE key = 'seed'")
            got: queue.Queue[Any] = queue.Queue()
            caller = threading.Thread(target=lambda: got.put(receipt("k", "me")))
            caller.start()

            def waiting() -> bool:  # the call's insert waits for the open transaction
                return admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE %s", (f"%{rc}%",)).fetchone() == (1,)
            Retrying(retry=retry_if_result(lambda ok: not ok), stop=stop_after_delay(20),
                     wait=wait_fixed(0.005), reraise=True)(waiting)
            other.commit()
            caller.join(20)
        start = got.get_nowait()
        assert start.outcome == "busy" and start.receipt.owner == "other", start
        stored = s.get_receipt("k")
        assert stored is not None and stored.owner == "other" and stored.fence == 1


def test_a_store_of_the_layout_before_the_read_function_is_read_read_only(
        pg_url: str, admin: psycopg.Connection[Any]) -> None:
    """A store at layout 7 (before remit_read_checkpoint), opened read-only, is read with
    the statement, and the open changes nothing: no function, no index, the same version."""
    schema = schema_of(pg_url)
    with open_store(pg_url) as s:
        s.put_checkpoint("r", "c1", new_values={"x": ("1", 1)})
        s.put_checkpoint("r", "c2", parent_id="c1", new_values={"x": ("2", 2)})
        s.put_writes("r", "c2", "t", [(0, "x", 3)])
    admin.execute(f'DROP FUNCTION "{schema}".remit_read_checkpoint')
    admin.execute(f'DROP INDEX "{schema}".remit_checkpoints_head')
    admin.execute(f"UPDATE \"{schema}\".remit_meta SET value = '7' WHERE key = 'version'")
    with open_store(pg_url, read_only=True) as ro:
        latest = ro.get_checkpoint("r")
        assert latest is not None and latest.checkpoint_id == "c2" and latest.values == {"x": 2}
        assert [(w.task_id, w.idx, w.value) for w in latest.writes] == [("t", 0, 3)]
        first = ro.get_checkpoint("r", "c1")
        assert first is not None and first.values == {"x": 1}
        assert ro.get_checkpoint("r", "absent") is None
    functions = admin.execute(
        "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = %s AND p.proname = 'remit_read_checkpoint'", (schema,)).fetchone()
    version = admin.execute(f"SELECT value FROM \"{schema}\".remit_meta WHERE key = 'version'"
                            ).fetchone()
    assert functions == (0,) and version == ("7",)


def test_newer_schema_version_is_refused_and_data_kept(
        pg_url: str, admin: psycopg.Connection[Any]) -> None:
    schema = schema_of(pg_url)
    with open_store(pg_url) as s:
        s.put_checkpoint("r", "c1", new_values={"x": ("1", 1)})
    admin.execute(f'UPDATE "{schema}".remit_meta SET value = %s WHERE key = %s',
                  (str(len(MIGRATIONS) + 1), "version"))
    with pytest.raises(StoreVersionError) as info:
        open_store(pg_url)
    assert info.value.found == len(MIGRATIONS) + 1 and info.value.supported == len(MIGRATIONS)
    assert "newer remit" in str(info.value) and schema in str(info.value)
    version = admin.execute(f"SELECT value FROM \"{schema}\".remit_meta WHERE key = 'version'"
                            ).fetchone()
    assert version == (str(len(MIGRATIONS) + 1),)  # not touched
    assert tables_in(admin, schema) == set(TABLES)
    count = admin.execute(f'SELECT count(*) FROM "{schema}".remit_checkpoints').fetchone()
    assert count == (1,)
    admin.execute(f'UPDATE "{schema}".remit_meta SET value = %s WHERE key = %s',
                  (str(len(MIGRATIONS)), "version"))
    with open_store(pg_url) as s:
        got = s.get_checkpoint("r")
        assert got is not None and got.values == {"x": 1}


def test_foreign_table_is_refused_and_left_untouched(
        pg_url: str, admin: psycopg.Connection[Any]) -> None:
    schema = schema_of(pg_url)
    admin.execute(f'CREATE SCHEMA "{schema}"')
    admin.execute(f'CREATE TABLE "{schema}".remit_checkpoints (id INT PRIMARY KEY, note TEXT)')
    admin.execute(f"INSERT INTO \"{schema}\".remit_checkpoints VALUES (1, 'mine')")
    with pytest.raises(ForeignSchemaError) as info:
        open_store(pg_url)
    assert info.value.name == "remit_checkpoints"
    assert "remit_checkpoints" in str(info.value) and "untouched" in str(info.value)
    assert tables_in(admin, schema) == {"remit_checkpoints"}  # nothing created beside it
    rows = admin.execute(f'SELECT id, note FROM "{schema}".remit_checkpoints').fetchall()
    assert rows == [(1, "mine")]
    cols = admin.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
        "AND table_name = 'remit_checkpoints' ORDER BY ordinal_position", (schema,)).fetchall()
    assert cols == [("id",), ("note",)]


def test_foreign_meta_table_is_refused(pg_url: str, admin: psycopg.Connection[Any]) -> None:
    schema = schema_of(pg_url)
    admin.execute(f'CREATE SCHEMA "{schema}"')
    admin.execute(f'CREATE TABLE "{schema}".remit_meta (k TEXT, v TEXT)')
    with pytest.raises(ForeignSchemaError) as info:
        open_store(pg_url)
    assert info.value.name == "remit_meta"
    assert tables_in(admin, schema) == {"remit_meta"}


def test_reopen_does_not_migrate_again(pg_url: str, admin: psycopg.Connection[Any]) -> None:
    schema = schema_of(pg_url)

    def fingerprint() -> tuple[Any, ...]:
        row = admin.execute(
            f"SELECT xmin::text, (SELECT count(*) FROM \"{schema}\".remit_meta), "
            f"'\"{schema}\".remit_checkpoints'::regclass::oid "
            f"FROM \"{schema}\".remit_meta WHERE key = 'version'").fetchone()
        assert row is not None
        return tuple(row)

    with open_store(pg_url) as s:
        s.put_checkpoint("r", "c1", new_values={"x": ("1", 1)})
    before = fingerprint()
    for _ in range(2):
        with open_store(pg_url) as s:
            got = s.get_checkpoint("r")
            assert got is not None and got.values == {"x": 1}
    assert fingerprint() == before  # no write to remit_meta, no table re-created
    assert admin.execute(f"SELECT value FROM \"{schema}\".remit_meta WHERE key = 'version'"
                         ).fetchone() == (str(len(MIGRATIONS)),)


def open_and_write(url: str, barrier: Any, results: Any) -> None:
    """Child process: open a fresh schema at the same moment as the others, then write."""
    barrier.wait()
    try:
        with open_store(url) as s:
            s.put_checkpoint("r", f"c-{uuid.uuid4().hex[:8]}")
        results.put("ok")
    except Exception as exc:  # reported to the parent
        results.put(f"{type(exc).__name__}: {exc}")


def test_concurrent_openers_of_a_fresh_schema(
        pg_url: str, admin: psycopg.Connection[Any]) -> None:
    k = 2
    barrier = CTX.Barrier(k)
    results = CTX.Queue()
    procs = [CTX.Process(target=open_and_write, args=(pg_url, barrier, results))
             for _ in range(k)]
    for p in procs:
        p.start()
    got = []
    for _ in range(k):
        try:
            got.append(results.get(timeout=120))
        except queue.Empty:
            break
    for p in procs:
        p.join(timeout=60)
    assert got == ["ok"] * k
    schema = schema_of(pg_url)
    assert tables_in(admin, schema) == set(TABLES)
    meta = admin.execute(f'SELECT key, value FROM "{schema}".remit_meta ORDER BY key').fetchall()
    assert meta == [("schema", "remit"), ("version", str(len(MIGRATIONS)))]
    with open_store(pg_url) as s:
        assert len(list(s.list_checkpoints("r"))) == k


# ------------------------------------------------------------------------ clock, connections


def test_times_come_from_the_server_clock(pg_url: str, admin: psycopg.Connection[Any],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    with open_store(pg_url) as s:
        monkeypatch.setattr(time, "time", lambda: 0.0)  # a host whose clock is far off
        c = s.claim_once("gate", run_id="r", owner=new_owner(), lease=60.0)
        cp = s.put_checkpoint("r", "c1")
        monkeypatch.undo()
        row = admin.execute("SELECT extract(epoch from clock_timestamp())::float8").fetchone()
        assert row is not None
        server_now = row[0]
        assert abs(c.claimed_at - server_now) < 5 and abs(c.lease_until - c.claimed_at - 60) < 1
        got = s.get_checkpoint("r")
        assert got is not None and abs(got.created_at - server_now) < 5 and cp.seq == got.seq


def test_killed_connections_are_replaced_and_retried(
        pg_url: str, admin: psycopg.Connection[Any]) -> None:
    app = f"remit-kill-{uuid.uuid4().hex[:8]}"
    with open_store(f"{pg_url}&pool_min=4&application_name={app}") as s:
        assert isinstance(s, PostgresStore)
        s._pool.wait(timeout=10)
        s.put_checkpoint("r", "c1", new_values={"x": ("1", 1)})
        for round_no in range(3):
            # what a server restart does to every idle connection of the pool
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = %s", (app,)).fetchone()
            assert killed is not None and killed[0] >= 1
            t0 = time.monotonic()
            got = s.get_checkpoint("r", "c1")  # retried on a fresh connection
            assert got is not None and got.values == {"x": 1}
            s.put_checkpoint("r", f"c{round_no + 2}")
            assert time.monotonic() - t0 < 10


def test_transient_errors_are_classified(pg_url: str) -> None:
    with open_store(pg_url) as s:
        for exc in (psycopg.OperationalError("server closed the connection unexpectedly"),
                    psycopg.errors.AdminShutdown("terminating connection"),
                    psycopg.errors.SerializationFailure("could not serialize"),
                    psycopg.errors.DeadlockDetected("deadlock detected"),
                    psycopg.errors.CannotConnectNow("the database system is starting up"),
                    PoolTimeout("couldn't get a connection after 10.00 sec")):
            assert s._is_transient(exc), exc
        for other in (psycopg.IntegrityError("duplicate key"),
                    psycopg.errors.UniqueViolation("duplicate key"),
                    psycopg.ProgrammingError("syntax error"),
                    psycopg.errors.UndefinedTable("no such table"),
                    psycopg.DataError("invalid input"),
                    PoolClosed("the pool is closed"),
                    ValueError("not a database error")):
            assert not s._is_transient(other), other


def test_latest_checkpoint_is_one_statement(pg_url: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    with open_store(pg_url) as s:
        for i in range(20):
            s.put_checkpoint("r", f"c{i}", versions={"big": "1"},
                             new_values={"n": (str(i), i), **({"big": ("1", b"x" * 5000)}
                                                              if i == 0 else {})})
        s.put_writes("r", "c19", "t", [(0, "a", 1)])
        seen: list[str] = []
        real = psycopg.Connection.execute

        def counting(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            seen.append(str(query))
            return real(self, query, *args, **kwargs)

        monkeypatch.setattr(psycopg.Connection, "execute", counting)
        got = s.get_checkpoint("r")
        monkeypatch.undo()
        assert got is not None and got.values == {"n": 19, "big": b"x" * 5000}
        assert [w.value for w in got.writes] == [1]
        assert len(seen) == 1, seen  # the checkpoint with its values and its writes
        seen.clear()
        monkeypatch.setattr(psycopg.Connection, "execute", counting)
        listed = list(s.list_checkpoints("r"))  # every checkpoint: still one statement
        monkeypatch.undo()
        assert [c.checkpoint_id for c in listed] == [f"c{i}" for i in range(19, -1, -1)]
        assert listed[0].writes == got.writes and all(c.writes == [] for c in listed[1:])
        assert len(seen) == 1, seen


# ------------------------------------------------------------------------------------- races


def race(n: int, fn: Callable[[int], Any]) -> list[Any]:
    """Run fn(0..n-1) in n threads released together; results (or exceptions) in order."""
    barrier = threading.Barrier(n)
    out: list[Any] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            out[i] = fn(i)
        except Exception as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return out


def test_exclusive_child_race_has_one_winner(pg_url: str) -> None:
    n = 16
    with open_store(f"{pg_url}&pool_max={n}") as s:
        for round_no in range(5):
            parent = f"p{round_no}"
            s.put_checkpoint("r", parent)

            def child(i: int, p: str = parent) -> Any:
                return s.put_checkpoint("r", f"{p}-child-{i}", parent_id=p,
                                        exclusive_child=True)

            out = race(n, child)
            winners = [o for o in out if not isinstance(o, Exception)]
            losers = [o for o in out if isinstance(o, ConsumeConflict)]
            assert len(winners) == 1 and len(losers) == n - 1, out
            assert {e.owner for e in losers} == {winners[0].checkpoint_id}
            children = [c.checkpoint_id for c in s.list_checkpoints("r")
                        if c.parent_id == parent]
            assert children == [winners[0].checkpoint_id]


def test_claim_and_receipt_races_have_one_winner(pg_url: str) -> None:
    n = 16
    with open_store(f"{pg_url}&pool_max={n}") as s:
        for round_no in range(5):

            def claim(i: int, r: int = round_no) -> Any:
                return s.claim_once(f"gate-{r}", run_id="r", owner=new_owner(), digest="d",
                                    value=i)

            def start(i: int, r: int = round_no) -> Any:
                return s.start_receipt(f"effect-{r}", run_id="r", step="s", name="n",
                                       ordinal=0, owner=new_owner(), may_take_over=True)

            out = race(n, claim)
            winners = [o for o in out if not isinstance(o, Exception)]
            assert len(winners) == 1, out
            assert all(isinstance(o, ConsumeConflict) and o.owner == winners[0].owner
                       for o in out if isinstance(o, Exception))
            starts = race(n, start)
            assert sorted(st.outcome for st in starts) == ["busy"] * (n - 1) + ["run"]


def test_a_change_between_the_read_and_the_compare_and_set_is_not_overwritten(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A decision that changes a record reads it without a lock and writes it with a
    compare-and-set. Here two recoverers race for an abandoned run, the second taking it
    between the first one's read and its write: the first one's compare-and-set finds
    the row changed, the locked path decides again on the second one's take-over, and
    the first is told ``busy`` instead of taking the run over a second time."""
    from remit_core.store import sql

    with open_store(pg_url) as s, open_store(pg_url) as other:
        start = s.start_run("r", framework="f", name="n", owner="executor", lease=0.05)
        assert start.outcome == "started"
        deadline = time.monotonic() + 10
        while (run := s.get_run("r")) is None or run.status != "abandoned":
            assert time.monotonic() < deadline, run  # the server's clock passes the lease
            time.sleep(0.01)
        real = sql.Records.swap_params
        second: list[Any] = []

        def meanwhile(self: Any, was: Any, row: Any) -> dict[str, Any]:
            if not second and getattr(row, "owner", None) == "first":
                second.append(None)  # (the second recoverer's own compare-and-set runs this)
                second[0] = other.recover_run("r", owner="second", lease=30.0)
            return real(self, was, row)

        monkeypatch.setattr(sql.Records, "swap_params", meanwhile)
        first = s.recover_run("r", owner="first", lease=30.0)
        assert [t.outcome for t in second] == ["taken_over"], second
        assert first.outcome == "busy", first
        run = s.get_run("r")
        assert run is not None and (run.status, run.owner, run.fence) == (
            "running", "second", start.run.fence + 1), run


def test_a_pool_that_cannot_serve_its_threads_or_fit_the_server_is_warned_about(
        pg_url: str, admin: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture) -> None:
    """Issue 15, pool budget: a recovery's threads each hold a connection, and the lease
    keeper one more; every process's pool counts against max_connections. The store says
    where its pool cannot serve the threads, or cannot fit in what the server has left,
    with the numbers and what to change; the recovery driver logs it once per store."""
    most = int(admin.execute("SHOW max_connections").fetchone()[0])  # type: ignore[index]
    with open_store(pg_url + "&pool_max=2") as small:
        (warning,) = small.capacity_warnings(threads=4)
        assert "pool_max=2 connections for 4 threads" in warning
        assert "?pool_max=5 or more" in warning
        assert small.capacity_warnings(threads=1) == []
    with open_store(pg_url + f"&pool_max={most}") as big:
        (before,) = big.capacity_warnings(threads=1)
        assert f"max_connections {most}" in before and "too many clients" in before
        others = [psycopg.connect(admin.info.dsn) for _ in range(3)]
        try:
            (after,) = big.capacity_warnings(threads=1)
        finally:
            for conn in others:
                conn.close()

        def open_by_others(text: str) -> int:
            return int(text.split(" open by other clients")[0].rsplit(" ", 1)[1])

        assert open_by_others(after) >= open_by_others(before) + 3
    from remit_core.adapter import recover_runs

    with open_store(pg_url + "&pool_max=2") as small, caplog.at_level("WARNING", "remit"):
        for _ in range(2):
            recover_runs(small, lambda run: None, framework="nothing-here", concurrency=4)
    assert [r.getMessage() for r in caplog.records].count(
        f"remit: {warning}") == 1


def test_async_connection_left_in_a_transaction_is_closed_not_reused(pg_url: str) -> None:
    """Under remit_core.aio.run, a connection given back in a transaction (an operation
    cut short) is closed, and the next operation gets another one."""
    from remit_core import aio

    def leave_in_transaction(s: PostgresStore) -> tuple[Any, int]:
        with s._conn() as conn:
            conn.execute("BEGIN")
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            return conn._a, int(row[0])  # type: ignore[attr-defined]

    def backend_pid(s: PostgresStore) -> int:
        with s._conn() as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            return int(row[0])

    async def main() -> None:
        with open_store(pg_url) as s:
            assert isinstance(s, PostgresStore)
            kept = await aio.run(backend_pid, s)
            assert await aio.run(backend_pid, s) == kept  # an idle connection is reused
            left, pid = await aio.run(leave_in_transaction, s)
            assert pid == kept and left.closed
            assert await aio.run(backend_pid, s) != pid
            s.put_checkpoint("r", "c1", new_values={"x": ("1", 1)})
            got = await s.aget_checkpoint("r", "c1")
            assert got is not None and got.values == {"x": 1}
            await s.aclose()

    import asyncio

    asyncio.run(main())
