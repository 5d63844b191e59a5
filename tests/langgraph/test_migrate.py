"""Importing threads from LangGraph's stock savers: ``remit migrate langgraph`` and ``legacy=``.

The stock data is written by real graphs on the stock SqliteSaver (a file) and
PostgresSaver (a schema of its own per test), then imported into remit on every
backend. The oracle is the stock saver itself: every checkpoint read back through
RemitSaver equals the stock one (ids, parents, metadata, channel values and
versions, pending writes in order), the raw writes keep task_path and idx, and a
thread parked on interrupt() finishes under RemitSaver as it does under the stock
saver.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import operator
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import ormsgpack
import psycopg
import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Send, interrupt

from remit_core import Store, open_store
from remit_core.cli import main
from remit_core.effects import receipt_key
from remit_core.migrate import MigrationError, RecordsRefused
from remit_langgraph import ConsumeConflict, RemitSaver, recover
from remit_langgraph._seam import LangGraphSeamError
from remit_langgraph.migrate import MARKER_RUN, migrate
from tests import procs
from tests.langgraph import lg_recovery_workers as lrw

CTX = procs.CTX

# ==================================================================================== graph


class State(TypedDict):
    topics: list[str]
    items: Annotated[list[str], operator.add]
    answer: str


def _fan(s: State) -> list[Send]:
    return [Send("work", t) for t in s["topics"]]


def _work(topic: str) -> dict[str, Any]:
    return {"items": [topic.upper()]}


def _ask(s: State) -> dict[str, Any]:
    answer = interrupt({"question": "ok?", "seen": len(s["items"])})
    return {"answer": f"{answer} after {len(s['items'])}"}


def build(checkpointer: BaseCheckpointSaver[Any]) -> Any:
    """Parallel Send tasks (writes with task paths) feeding a subgraph that parks on
    interrupt() (checkpoints in a second namespace)."""
    sub = StateGraph(State)
    sub.add_node("ask", _ask)
    sub.add_edge(START, "ask")
    sub.add_edge("ask", END)
    b = StateGraph(State)
    b.add_node("work", _work)
    b.add_node("review", sub.compile())
    b.add_conditional_edges(START, _fan, ["work"])
    b.add_edge("work", "review")
    b.add_edge("review", END)
    return b.compile(checkpointer=checkpointer)


def cfg(thread: str) -> Any:
    return {"configurable": {"thread_id": thread}}


def fill(stock: BaseCheckpointSaver[Any]) -> None:
    """Thread "parked" waits on the subgraph's interrupt; "done" was resumed to the end."""
    g = build(stock)
    g.invoke({"topics": ["a", "b", "c"], "items": [], "answer": ""}, cfg("parked"))
    g.invoke({"topics": ["x", "y"], "items": [], "answer": ""}, cfg("done"))
    g.invoke(Command(resume="fine"), cfg("done"))


# ================================================================================= fixtures


@pytest.fixture
def stock_file(tmp_path: Path) -> str:
    path = str(tmp_path / "checkpoints.sqlite")
    with SqliteSaver.from_conn_string(path) as stock:
        fill(stock)
    return path


@pytest.fixture
def empty_pg_url(pg_base_url: str) -> Iterator[str]:
    """A URL whose search path is a fresh, empty schema."""
    schema = f"lg_stock_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_base_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in pg_base_url else "?"
    try:
        yield f"{pg_base_url}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(pg_base_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def stock_pg(empty_pg_url: str) -> str:
    """A stock PostgresSaver database (its own schema), set up and filled."""
    with PostgresSaver.from_conn_string(empty_pg_url) as stock:
        stock.setup()
        fill(stock)
    return empty_pg_url


@pytest.fixture(params=["sqlite-file", "postgres"])
def stock(request: pytest.FixtureRequest) -> str:
    """The source as a user names it: a SqliteSaver file path or a postgresql:// URL."""
    return str(request.getfixturevalue("stock_file" if request.param == "sqlite-file"
                                       else "stock_pg"))


# ================================================================================== helpers


@contextlib.contextmanager
def open_stock(source: str) -> Iterator[BaseCheckpointSaver[Any]]:
    if source.startswith("postgresql://"):
        with PostgresSaver.from_conn_string(source) as pg:
            yield pg
    else:
        with SqliteSaver.from_conn_string(source) as lite:
            yield lite


def stock_rows(source: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows straight from the stock tables (``?`` placeholders)."""
    if source.startswith("postgresql://"):
        sql = sql.replace("?", "%s").replace(" writes", " checkpoint_writes")
        with psycopg.connect(source) as conn:
            return [tuple(r) for r in conn.execute(sql, params).fetchall()]
    with contextlib.closing(sqlite3.connect(source)) as lite:
        return [tuple(r) for r in lite.execute(sql, params).fetchall()]


def stock_totals(source: str, thread: str | None = None) -> tuple[int, int]:
    """(checkpoints, writes) in the stock tables, of one thread or of all."""
    where, params = ("WHERE thread_id = ?", (thread,)) if thread else ("", ())
    (ck,), = stock_rows(source, f"SELECT COUNT(*) FROM checkpoints {where}", params)
    (wr,), = stock_rows(source, f"SELECT COUNT(*) FROM writes {where}", params)
    return int(ck), int(wr)


def stock_has_task_path(source: str) -> bool:
    """Whether the stock writes table has a task_path column (the PostgreSQL saver's has;
    langgraph-checkpoint-sqlite's has from 3.0, not in 2.0.x)."""
    if source.startswith("postgresql://"):
        return True
    return any(row[1] == "task_path" for row in stock_rows(source, "PRAGMA table_info(writes)"))


def raw_stock_writes(source: str, thread: str) -> list[tuple[Any, ...]]:
    path = "task_path" if stock_has_task_path(source) else "''"
    return sorted(stock_rows(
        source, f"SELECT checkpoint_ns, checkpoint_id, task_id, {path}, idx, channel "
        "FROM writes WHERE thread_id = ?", (thread,)))


def raw_remit_writes(store: Store, thread: str) -> list[tuple[Any, ...]]:
    return sorted((ck.ns, ck.checkpoint_id, w.task_id, w.task_path, w.idx, w.channel)
                  for ck in store.list_checkpoints(thread) for w in ck.writes)


def assert_same(source: str, store: Store, threads: list[str]) -> None:
    """Every stock checkpoint reads back through RemitSaver as the stock saver returns it,
    in the same order, and every stored write keeps its task_path and idx."""
    saver = RemitSaver(store)
    with open_stock(source) as stock:
        for thread in threads:
            theirs = list(stock.list(cfg(thread)))
            assert theirs, thread
            assert [t.config for t in saver.list(cfg(thread))] == [t.config for t in theirs]
            for t in theirs:
                assert saver.get_tuple(t.config) == t
            raw = raw_stock_writes(source, thread)
            assert raw_remit_writes(store, thread) == raw
    if stock_has_task_path(source):
        assert any(row[3] for row in raw), "the graph should produce writes with a task_path"


def assert_resumes_like_stock(store: Store, source: str) -> None:
    """The parked thread finishes under RemitSaver as it does under the stock saver."""
    ours = build(RemitSaver(store)).invoke(Command(resume="yes"), cfg("parked"))
    with open_stock(source) as stock:
        theirs = build(stock).invoke(Command(resume="yes"), cfg("parked"))
    assert ours == theirs
    assert ours["answer"] == "yes after 3"


# ================================================================================== migrate


def test_imports_every_thread_with_history_and_writes(stock: str, store_url: str) -> None:
    checkpoints, writes = stock_totals(stock)
    report = migrate(stock, store_url)
    assert (report.runs, report.checkpoints, report.writes, report.skipped) == (
        2, checkpoints, writes, 0)
    with open_store(store_url) as store:
        assert sorted(r.run_id for r in store.list_runs()) == ["done", "parked"]
        assert_same(stock, store, ["parked", "done"])
        assert_resumes_like_stock(store, stock)


def test_reimport_stores_nothing_twice(stock: str, store_url: str) -> None:
    first = migrate(stock, store_url)
    with open_store(store_url) as store:
        before = store.usage()
    again = migrate(stock, store_url)
    assert (again.runs, again.checkpoints, again.writes) == (0, 0, 0)
    assert again.skipped == first.checkpoints + first.writes
    assert again.summary().startswith("imported 0 run(s)")
    with open_store(store_url) as store:
        assert store.usage() == before
        assert_same(stock, store, ["parked", "done"])


def test_reimport_adds_what_the_stock_app_wrote_since(stock_file: str, store_url: str) -> None:
    migrate(stock_file, store_url)
    with SqliteSaver.from_conn_string(stock_file) as stock:  # the old app is still running
        build(stock).invoke(Command(resume="late"), cfg("parked"))
    report = migrate(stock_file, store_url)
    assert report.runs == 1 and report.checkpoints > 0 and report.writes > 0
    with open_store(store_url) as store:
        assert_same(stock_file, store, ["parked", "done"])
        assert RemitSaver(store).get_tuple(cfg("parked")).checkpoint["channel_values"][
            "answer"] == "late after 3"


def test_reimport_never_brings_back_what_remit_pruned(stock_file: str, store_url: str) -> None:
    migrate(stock_file, store_url)
    with open_store(store_url) as store:
        saver = RemitSaver(store)
        build(saver).invoke(Command(resume="yes"), cfg("parked"))  # the run moved on in remit
        latest = saver.get_tuple(cfg("parked"))
        saver.prune(["parked"])
        saver.delete_thread("done")
        before = store.usage()
    report = migrate(stock_file, store_url)
    assert (report.checkpoints, report.writes) == (0, 0)
    with open_store(store_url) as store:
        assert store.usage() == before
        saver = RemitSaver(store)
        assert saver.get_tuple(cfg("parked")) == latest
        assert saver.get_tuple(cfg("done")) is None


def test_the_cli_imports_one_thread_or_all(stock_file: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/cli.db"
    code = main(["migrate", "langgraph", "--from", stock_file, "--to", url,
                 "--run-id", "parked", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["runs"], out["checkpoints"], out["writes"]) == (1, *stock_totals(stock_file,
                                                                                 "parked"))
    assert out["source"] == stock_file and out["target"] == url
    with open_store(url) as store:
        assert [r.run_id for r in store.list_runs()] == ["parked"]
    assert main(["migrate", "langgraph", "--from", stock_file, "--to", url]) == 0
    text = capsys.readouterr().out
    assert "imported 1 run(s): " in text
    assert f"{sum(stock_totals(stock_file, 'parked'))} already present" in text
    with open_store(url) as store:
        assert_resumes_like_stock(store, stock_file)

    assert main(["migrate", "langgraph", "--from", str(tmp_path / "nope.db"), "--to", url]) == 1
    err = capsys.readouterr().err
    assert "MigrationError" in err and "does not exist" in err


# =================================================================================== errors


def test_a_missing_or_foreign_source_is_a_clear_error(tmp_path: Path, stock_file: str) -> None:
    target = f"sqlite:///{tmp_path}/remit.db"
    with pytest.raises(MigrationError, match="does not exist"):
        migrate(str(tmp_path / "nope.sqlite"), target)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database, " * 100)
    with pytest.raises(MigrationError, match="not a SQLite database"):
        migrate(str(junk), target)
    other = tmp_path / "other.sqlite"
    with contextlib.closing(sqlite3.connect(other)) as conn:
        conn.execute("CREATE TABLE t (x)")
        conn.commit()
    with pytest.raises(MigrationError, match="no LangGraph checkpoints"):
        migrate(str(other), target)
    with contextlib.closing(sqlite3.connect(other)) as conn:  # nothing was created in it
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master")] == ["t"]
    assert not (tmp_path / "remit.db").exists()  # the source is checked first
    with pytest.raises(MigrationError, match="no thread 'nope'"):
        migrate(stock_file, target, run_id="nope")
    with open_store(target) as store, pytest.raises(TypeError, match="SqliteSaver"):
        RemitSaver(store, legacy=InMemorySaver())


def test_a_postgres_source_without_tables_or_server_is_a_clear_error(
        empty_pg_url: str, tmp_path: Path) -> None:
    target = f"sqlite:///{tmp_path}/remit.db"
    with pytest.raises(MigrationError, match="no LangGraph checkpoints"):
        migrate(empty_pg_url, target)
    with pytest.raises(MigrationError, match="cannot read the stock PostgresSaver"):
        migrate("postgresql://postgres@127.0.0.1:1/test?connect_timeout=3", target)


class Tripwire:
    """Records every unpickling: remit must never cause one."""

    def __init__(self) -> None:
        self.x = 1

    def __setstate__(self, state: dict[str, Any]) -> None:
        UNPICKLED.append(state)
        self.__dict__.update(state)


UNPICKLED: list[Any] = []


class Loose(TypedDict):
    x: Any


def test_values_stored_with_pickle_are_refused_never_unpickled(tmp_path: Path,
                                                               store: Store) -> None:
    path = str(tmp_path / "pickled.sqlite")
    b = StateGraph(Loose)
    b.add_node("n", lambda s: {"x": Tripwire()})
    b.add_edge(START, "n")
    b.add_edge("n", END)
    conn = sqlite3.connect(path, check_same_thread=False)
    stock = SqliteSaver(conn, serde=JsonPlusSerializer(pickle_fallback=True))
    b.compile(checkpointer=stock).invoke({"x": 0}, cfg("p"))
    assert ("pickle",) in stock_rows(path, "SELECT DISTINCT type FROM checkpoints")
    UNPICKLED.clear()

    with pytest.raises(MigrationError, match="pickle"):
        migrate(path, store)
    saver = RemitSaver(store, legacy=stock)  # the app's own saver, pickle on
    with pytest.raises(MigrationError, match="pickle"):
        saver.get_tuple(cfg("p"))
    assert stock.serde.pickle_fallback is True  # left as the app configured it
    assert UNPICKLED == []
    assert store.list_runs() == []

    stock.get_tuple(cfg("p"))  # control: the stock saver itself does unpickle
    assert UNPICKLED
    conn.close()


# ====================================================================== crafted stock records

EXT_SINGLE_ARG, EXT_KW_ARGS = 0, 2  # LangGraph's msgpack ext codes for a constructor call


def constructor_ext(code: int, module: str, name: str, arg: Any) -> bytes:
    """A msgpack record as LangGraph's serializer writes a constructor call: an ext whose
    payload is (module, name, argument)."""
    return bytes(ormsgpack.packb(ormsgpack.Ext(code, ormsgpack.packb([module, name, arg]))))


def inject_write(source: str, thread: str, task_id: str, type_: str, value: bytes) -> None:
    """Add a row to the stock writes table at the thread's latest checkpoint, the way the
    stock saver stores one (the SQLite saver's ``value``, PostgreSQL's ``blob`` column)."""
    (ns, cid), = stock_rows(source, "SELECT checkpoint_ns, MAX(checkpoint_id) FROM checkpoints "
                                    "WHERE thread_id = ? AND checkpoint_ns = '' "
                                    "GROUP BY checkpoint_ns", (thread,))
    if source.startswith("postgresql://"):
        with psycopg.connect(source, autocommit=True) as conn:
            conn.execute("INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id,"
                         " task_id, task_path, idx, channel, type, blob) VALUES "
                         "(%s, %s, %s, %s, '', 0, 'items', %s, %s)",
                         (thread, ns, cid, task_id, type_, value))
        return
    path, empty = (", task_path", ", ''") if stock_has_task_path(source) else ("", "")
    with contextlib.closing(sqlite3.connect(source)) as lite:
        lite.execute(f"INSERT INTO writes (thread_id, checkpoint_ns, checkpoint_id, task_id"
                     f"{path}, idx, channel, type, value) VALUES (?, ?, ?, ?{empty}, 0, "
                     "'items', ?, ?)", (thread, ns, cid, task_id, type_, value))
        lite.commit()


@pytest.fixture
def canary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An importable module ``remit_canary_mod`` that touches a file when imported."""
    marker = tmp_path / "canary-imported"
    pkg = tmp_path / "canary_path"
    pkg.mkdir()
    (pkg / "remit_canary_mod.py").write_text(
        f"import dataclasses, pathlib\npathlib.Path({str(marker)!r}).touch()\n"
        "@dataclasses.dataclass\nclass Thing:\n    x: int = 0\n")
    monkeypatch.syspath_prepend(str(pkg))
    yield marker
    sys.modules.pop("remit_canary_mod", None)


def test_the_cli_runs_no_code_from_a_crafted_stock_file(stock_file: str, tmp_path: Path) -> None:
    """A write holding LangGraph's constructor ext ["os", "system", "touch …"]: remit
    migrate runs nothing, imports nothing of that thread, names the thread and the type it
    refused, and exits non-zero; the other thread is imported."""
    marker = tmp_path / "pwned"
    inject_write(stock_file, "parked", "evil", "msgpack",
                 constructor_ext(EXT_SINGLE_ARG, "os", "system", f"touch {marker}"))
    url = f"sqlite:///{tmp_path}/target.db"
    remit = Path(sys.executable).with_name("remit")
    done = subprocess.run([str(remit), "migrate", "langgraph", "--from", stock_file, "--to", url],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    output = done.stdout + done.stderr
    assert not marker.exists(), output
    assert done.returncode == 1, output
    assert "'parked'" in output and "os.system" in output, output
    assert "Deserializing unregistered type" not in output
    with open_store(url) as store:
        assert [r.run_id for r in store.list_runs()] == ["done"]
        assert list(store.list_checkpoints("parked")) == []
        assert_same(stock_file, store, ["done"])


def test_migrate_and_legacy_refuse_crafted_records_and_report_them(
        stock: str, store: Store, tmp_path: Path, canary: Path) -> None:
    marker = tmp_path / "pwned"
    inject_write(stock, "parked", "evil-1", "msgpack",
                 constructor_ext(EXT_SINGLE_ARG, "os", "system", f"touch {marker}"))
    nested = ormsgpack.packb(["fine", {"deep": [ormsgpack.Ext(EXT_KW_ARGS, ormsgpack.packb(
        ["remit_canary_mod", "Thing", {"x": 1}]))]}])
    inject_write(stock, "parked", "evil-2", "msgpack", bytes(nested))
    inject_write(stock, "parked", "evil-3", "json", json.dumps(
        {"lc": 2, "type": "constructor", "id": ["os", "system"], "args": [f"touch {marker}"]}
    ).encode())
    before = set(sys.modules)

    with pytest.raises(RecordsRefused) as caught:
        migrate(stock, store)
    text = str(caught.value)
    assert "'parked'" in text and "'done'" not in text
    for name in ("os.system", "remit_canary_mod.Thing"):
        assert name in text
    for task in ("evil-1", "evil-2", "evil-3"):
        assert task in text
    assert list(caught.value.refused) == ["parked"]
    assert len(caught.value.refused["parked"]) == 3  # one line per refused record
    assert caught.value.report is not None and caught.value.report.runs == 1
    assert [r.run_id for r in store.list_runs()] == ["done"]  # the clean thread is imported

    with open_stock(stock) as old:
        saver = RemitSaver(store, legacy=old)
        with pytest.raises(MigrationError, match=r"os\.system"):
            saver.get_tuple(cfg("parked"))
    assert list(store.list_checkpoints("parked")) == []
    assert not marker.exists() and not canary.exists()
    assert "remit_canary_mod" not in set(sys.modules) - before


def test_an_allow_listed_type_of_ones_own_is_imported(stock_file: str, store: Store,
                                                      canary: Path) -> None:
    """The allow-list is exact names given before the read: a type named there is decoded."""
    inject_write(stock_file, "parked", "mine", "msgpack",
                 constructor_ext(EXT_KW_ARGS, "remit_canary_mod", "Thing", {}))
    with pytest.raises(MigrationError, match=r"remit_canary_mod\.Thing"):
        migrate(stock_file, store, run_id="parked")
    assert not canary.exists()
    import remit_canary_mod  # the app's own module, imported by the app

    report = migrate(stock_file, store, run_id="parked", allow=[remit_canary_mod.Thing])
    assert report.runs == 1 and not report.refused


# ============================================================================ legacy= saver


def test_legacy_imports_a_thread_on_first_use(stock: str, store: Store) -> None:
    stock_before = stock_totals(stock)
    with open_stock(stock) as old:
        saver = RemitSaver(store, legacy=old)
        g = build(saver)
        assert store.list_runs() == []
        snap = g.get_state(cfg("parked"))  # first use: the thread is imported now
        assert snap.next == ("review",)
        assert snap.tasks[0].interrupts[0].value == {"question": "ok?", "seen": 3}
        assert [r.run_id for r in store.list_runs()] == ["parked"]
        result = g.invoke(Command(resume="yes"), cfg("parked"))
        assert result["answer"] == "yes after 3"
        assert result["items"] == build(old).get_state(cfg("parked")).values["items"] * 2
        # the stock versions go on in remit's shorter shape, above every stock one
        stock_versions = old.get_tuple(cfg("parked")).checkpoint["channel_versions"]
        ours = saver.get_tuple(cfg("parked")).checkpoint["channel_versions"]
        moved = {c: v for c, v in ours.items() if v != stock_versions.get(c)}
        assert moved and all(v[0].isalpha() and v > max(stock_versions.values())
                             for v in moved.values()), (stock_versions, ours)

        history = list(g.get_state_history(cfg("done")))  # list() imports too
        root = [t for t in old.list(cfg("done")) if not t.config["configurable"]["checkpoint_ns"]]
        assert [h.config for h in history] == [t.config for t in root]
        assert history[0].values["answer"] == "fine after 2"

        fresh = g.invoke({"topics": ["n"], "items": [], "answer": ""}, cfg("new"))
        assert fresh["items"] == ["N"]  # a thread the stock saver never had

        saver.delete_thread("gone-before-import")  # a no-op that must not fail
    assert stock_totals(stock) == stock_before  # the stock saver was only read


def test_legacy_deleted_threads_stay_deleted(stock_file: str, store: Store) -> None:
    with SqliteSaver.from_conn_string(stock_file) as old:
        RemitSaver(store, legacy=old).delete_thread("done")
        assert RemitSaver(store, legacy=old).get_tuple(cfg("done")) is None
        assert RemitSaver(store, legacy=old).get_tuple(cfg("parked")) is not None


def test_legacy_from_a_path_or_url_with_async(stock: str, store_url: str) -> None:
    async def run() -> Any:
        async with RemitSaver.from_conn_string(store_url, legacy=stock) as saver:
            g = build(saver)
            return await g.ainvoke(Command(resume="async"), cfg("parked"))

    assert asyncio.run(run())["answer"] == "async after 3"
    with RemitSaver.from_conn_string(store_url, legacy=stock) as saver:
        g = build(saver)
        assert g.get_state(cfg("done")).values["answer"] == "fine after 2"
        with pytest.raises(ConsumeConflict):  # CO holds for imported threads too
            g.invoke(Command(resume="again"), cfg("done"))


def first_use(url: str, stock_path: str, barrier: Any, results: Any) -> None:
    """Child process: open with legacy= and touch the parked thread at the barrier."""
    with RemitSaver.from_conn_string(url, legacy=stock_path) as saver:
        barrier.wait(timeout=60)
        found = saver.get_tuple(cfg("parked"))
        assert found is not None
        results.put((found.config["configurable"]["checkpoint_id"],
                     len(found.pending_writes or [])))


def test_two_processes_importing_one_thread_import_it_once(
        stock_file: str, store_url: str, tmp_path: Path) -> None:
    barrier = CTX.Barrier(2)
    results = CTX.Queue()
    procs = [CTX.Process(target=first_use, args=(store_url, stock_file, barrier, results))
             for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=180)
        assert p.exitcode == 0
    got = [results.get(timeout=10) for _ in procs]
    with SqliteSaver.from_conn_string(stock_file) as old:
        latest = old.get_tuple(cfg("parked"))
    assert latest is not None
    assert got == [(latest.config["configurable"]["checkpoint_id"],
                    len(latest.pending_writes or []))] * 2

    reference = f"sqlite:///{tmp_path}/reference.db"  # one import, by one process
    migrate(stock_file, reference, run_id="parked")
    keys = ("checkpoints", "blobs", "writes")
    with open_store(store_url) as store, open_store(reference) as ref:
        assert {k: store.usage("parked")[k] for k in keys} == {
            k: ref.usage("parked")[k] for k in keys}
        receipts = store.list_receipts(MARKER_RUN)
        assert [(r.step, r.status, r.attempt) for r in receipts] == [
            ("parked", "completed", 1)]
        assert_same(stock_file, store, ["parked"])


def test_a_reader_waits_for_an_import_in_flight_and_takes_a_dead_one_over(
        stock_file: str, store: Store) -> None:
    """Another process started importing "parked" (one checkpoint in) and died: a first use
    here neither reads the half-imported thread nor gives up; after the dead importer's
    lease it finishes the import, without duplicating what was already stored."""
    key = receipt_key(MARKER_RUN, "parked", "import", 0)
    started = store.start_receipt(key, run_id=MARKER_RUN, step="parked", name="import",
                                  ordinal=0, owner="dead-importer", may_take_over=True)
    assert started.outcome == "run"
    with SqliteSaver.from_conn_string(stock_file) as old:
        oldest = list(old.list(cfg("parked")))[-1]
        assert oldest.parent_config is None
        RemitSaver(store).put(cfg("parked"), oldest.checkpoint, oldest.metadata,
                              oldest.checkpoint["channel_versions"])
        t0 = time.monotonic()
        found = RemitSaver(store, legacy=old).get_tuple(cfg("parked"))
        waited = time.monotonic() - t0
        assert found == old.get_tuple(cfg("parked"))
    assert waited >= 1.0  # the store's lease is 2 s: it cannot have finished earlier
    (receipt,) = store.list_receipts(MARKER_RUN)
    assert (receipt.status, receipt.attempt) == ("completed", 2)
    assert store.usage("parked")["checkpoints"] == stock_totals(stock_file, "parked")[0]
    assert_same(stock_file, store, ["parked"])


# ============================================================== the run lifecycle (graph=)
#
# The graph is the recovery tests' ``a -> b (effect "charge") -> c``
# (tests/langgraph/lg_recovery_workers.py), run on a stock SqliteSaver; its ledger file
# (O_APPEND + fsync) counts every node entry and effect call, so counts survive SIGKILL.


def stock_dies_in_c(path: str, ledger: str, thread: str, conn: Any) -> None:
    """Child process: run ``thread`` on a stock SqliteSaver until it is inside node c
    (``durability="sync"``: a and b are durable then), report that, and block until the
    parent SIGKILLs this process."""
    def stop(t: str) -> None:
        conn.send(("in c", t))
        conn.recv()  # blocks until the process is killed

    lrw._stop_in_c = stop
    with SqliteSaver.from_conn_string(path) as stock:
        lrw.build(ledger).compile(checkpointer=stock, name=lrw.NAME).invoke(
            {"thread": thread}, lrw.cfg(thread), durability="sync")


def kill_stock_in_c(path: str, ledger: Path, thread: str) -> None:
    parent, child = CTX.Pipe()
    proc = CTX.Process(target=stock_dies_in_c, args=(path, str(ledger), thread, child))
    proc.start()
    try:
        assert parent.poll(120), "the stock child never reached node c"
        assert parent.recv() == ("in c", thread)
    finally:
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
    assert proc.exitcode == -signal.SIGKILL


@pytest.fixture
def stock_runs(tmp_path: Path) -> tuple[str, Path]:
    """A stock SqliteSaver file: "killed" was SIGKILLed inside node c, "finished" ran to
    the end, "asked" parks on interrupt({"approve": "asked"}) in b."""
    path, ledger = str(tmp_path / "stock-runs.sqlite"), tmp_path / "ledger"
    kill_stock_in_c(path, ledger, "killed")
    with SqliteSaver.from_conn_string(path) as stock:
        lrw.build(str(ledger)).compile(checkpointer=stock, name=lrw.NAME).invoke(
            {"thread": "finished"}, lrw.cfg("finished"))
        lrw.build(str(ledger), park_in_b=True).compile(checkpointer=stock, name=lrw.NAME
                                                       ).invoke({"thread": "asked"},
                                                                lrw.cfg("asked"))
    return path, ledger


def entries(ledger: Path, thread: str) -> Counter[str]:
    lines = ledger.read_text().splitlines() if ledger.exists() else []
    return Counter(" ".join(line.split()[:2]) for line in lines if line.split()[2] == thread)


def test_a_stock_thread_killed_mid_run_is_imported_abandoned_and_recovered(
        stock_runs: tuple[str, Path], store_url: str) -> None:
    path, ledger = stock_runs
    assert entries(ledger, "killed") == Counter({"enter a": 1, "enter b": 1,
                                                 "effect charge": 1, "enter c": 1})
    with RemitSaver.from_conn_string(store_url) as saver:
        graph = lrw.app(saver, str(ledger))
        report = migrate(path, saver.store, graph=graph)
        assert report.runs == 3 and not report.refused
        (run,) = saver.store.list_runs(status="abandoned")
        assert (run.run_id, run.lifecycle.framework, run.lifecycle.name) == (  # type: ignore[union-attr]
            "killed", "langgraph", lrw.NAME)
        assert any("'killed' is kept in the run lifecycle as abandoned" in n
                   for n in report.notes), report.notes

        rec = recover(graph)
        assert rec.recovered == ["killed"], rec
        assert (rec.failed, rec.skipped, rec.attention) == ({}, [], {})
        # a and b (and b's effect) ran once, under the stock saver; c once more
        assert entries(ledger, "killed") == Counter({"enter a": 1, "enter b": 1,
                                                     "effect charge": 1, "enter c": 2})
        state = graph.get_state(lrw.cfg("killed"))
        assert state.values["log"] == ["a", "b:txn-killed", "c"] and not state.next
        assert saver.store.get_run("killed").status == "done"  # type: ignore[union-attr]
        assert recover(graph).total == 0


def test_finished_and_interrupted_stock_threads_import_done_and_parked(
        stock_runs: tuple[str, Path], store_url: str) -> None:
    path, ledger = stock_runs
    with RemitSaver.from_conn_string(store_url) as saver:
        store = saver.store
        graph = lrw.app(saver, str(ledger))
        migrate(path, store, graph=graph)
        finished, asked = store.get_run("finished"), store.get_run("asked")
        assert finished is not None and (finished.status, finished.name) == ("done", lrw.NAME)
        assert asked is not None and (asked.status, asked.name) == ("parked", lrw.NAME)
        (pending,) = graph.get_state(lrw.cfg("asked")).interrupts
        assert asked.waiting == {"interrupts": [{"id": pending.id,
                                                 "value": {"approve": "asked"}}]}
        # the record the live path makes for the same graph parked the same way
        lrw.app(saver, str(ledger), park_in_b=True).invoke({"thread": "live"},
                                                          lrw.cfg("live"))
        live = store.get_run("live")
        assert live is not None and live.status == "parked"
        assert [i["value"] for i in live.waiting["interrupts"]] == [{"approve": "live"}]
        assert set(live.waiting) == set(asked.waiting)
        assert set(live.waiting["interrupts"][0]) == set(asked.waiting["interrupts"][0])

        before = entries(ledger, "asked")
        rec = recover(graph)
        assert "asked" not in rec.recovered and "finished" not in rec.recovered, rec
        assert store.get_run("asked").status == "parked"  # type: ignore[union-attr]
        assert entries(ledger, "asked") == before
        # the app's next resume continues it under remit
        done = lrw.app(saver, str(ledger), park_in_b=True).invoke(Command(resume="yes"),
                                                                 lrw.cfg("asked"))
        assert done["log"] == ["a", "b:txn-asked", "c"]
        assert store.get_run("asked").status == "done"  # type: ignore[union-attr]


def test_migrating_twice_changes_no_lifecycle(stock_runs: tuple[str, Path],
                                              store_url: str) -> None:
    path, ledger = stock_runs
    threads = ["asked", "finished", "killed"]
    with RemitSaver.from_conn_string(store_url) as saver:
        graph = lrw.app(saver, str(ledger))
        migrate(path, saver.store, graph=graph)
        first = {t: saver.store.get_run(t) for t in threads}
        assert {t: r.status for t, r in first.items() if r is not None} == {
            "asked": "parked", "finished": "done", "killed": "abandoned"}
        again = migrate(path, saver.store, graph=graph)
        assert (again.runs, again.checkpoints, again.writes) == (0, 0, 0)
        assert {t: saver.store.get_run(t) for t in threads} == first
        for t in threads:
            assert any(f"thread {t!r}: its run lifecycle was recorded before" in n
                       for n in again.notes), again.notes


def test_without_a_graph_no_lifecycle_is_kept_and_the_report_says_how(
        stock_runs: tuple[str, Path], store_url: str) -> None:
    path, _ = stock_runs
    report = migrate(path, store_url)
    assert any("no run lifecycle was kept" in n and "graph=graph" in n for n in report.notes)
    with open_store(store_url) as store:
        assert all(store.get_run(t) is None for t in ("asked", "finished", "killed"))
        assert store.list_runs(status="abandoned") == []


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_stock_thread_at_a_static_breakpoint_imports_parked(
        tmp_path: Path, store_url: str, where: str) -> None:
    """Stopped at ``interrupt_before=["c"]`` (or ``interrupt_after=["b"]``): parked, with
    what the live path records for the same graph stopped there; recover leaves it."""
    path, ledger = str(tmp_path / "held.sqlite"), str(tmp_path / "ledger")
    points = {"interrupt_before": ["c"]} if where == "before" else {"interrupt_after": ["b"]}
    with SqliteSaver.from_conn_string(path) as stock:
        lrw.build(ledger).compile(checkpointer=stock, name=lrw.NAME, **points).invoke(
            {"thread": "held"}, lrw.cfg("held"))
    with RemitSaver.from_conn_string(store_url) as saver:
        graph = lrw.build(ledger).compile(checkpointer=saver, name=lrw.NAME, **points)
        migrate(path, saver.store, graph=graph)
        graph.invoke({"thread": "live"}, lrw.cfg("live"))  # the live path, for the record
        held, live = saver.store.get_run("held"), saver.store.get_run("live")
        assert held is not None and live is not None
        assert (held.status, held.name) == (live.status, live.name) == ("parked", lrw.NAME)
        assert held.waiting == live.waiting == {"breakpoint": f"interrupt_{where}",
                                                "nodes": ["c"]}
        assert recover(graph).total == 0
        assert saver.store.get_run("held").status == "parked"  # type: ignore[union-attr]
        done = graph.invoke(None, lrw.cfg("held"))  # the person approves: it goes on
        assert done["log"] == ["a", "b:txn-held", "c"]


def approvals(checkpointer: BaseCheckpointSaver[Any] | None, where: str, depth: int) -> Any:
    """``pre``, then a subgraph (``depth`` levels deep) whose ``ask`` node has a static
    breakpoint of the innermost subgraph's own: ``interrupt_before=["ask"]``, or
    ``interrupt_after=["ask"]`` with ``z`` after it."""
    inner = StateGraph(Flaky)
    inner.add_node("ask", lambda s: {"log": ["ask"]})
    inner.add_node("z", lambda s: {"log": ["z"]})
    inner.add_edge(START, "ask")
    inner.add_edge("ask", "z")
    inner.add_edge("z", END)
    graph = inner.compile(**{f"interrupt_{where}": ["ask"]})  # type: ignore[arg-type]
    for level in range(depth - 1):
        wrap = StateGraph(Flaky)
        wrap.add_node(f"level{level}", graph)
        wrap.add_edge(START, f"level{level}")
        wrap.add_edge(f"level{level}", END)
        graph = wrap.compile()
    b = StateGraph(Flaky)
    b.add_node("pre", lambda s: {"log": ["pre"]})
    b.add_node("inner", graph)
    b.add_edge(START, "pre")
    b.add_edge("pre", "inner")
    b.add_edge("inner", END)
    return b.compile(checkpointer=checkpointer, name="approvals")


@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("where", ["before", "after"])
def test_a_stock_thread_stopped_at_a_subgraphs_breakpoint_imports_parked(
        tmp_path: Path, store_url: str, where: str, depth: int) -> None:
    """A subgraph (or a subgraph of it) stopped at a static breakpoint of its own: the root
    has next tasks and no interrupt, so only the subgraph's checkpoint tells a person's
    approval from a process that died; imported parked, as the live path records the
    same graph stopped there, and recover leaves it (it was imported abandoned, and
    recovered past the approval, before the import read the subgraphs)."""
    path = str(tmp_path / "sub.sqlite")
    with SqliteSaver.from_conn_string(path) as stock:
        stopped = approvals(stock, where, depth).invoke({"thread": "held"}, cfg("held"))
        assert stopped == {"thread": "held", "log": ["pre"]}  # the subgraph has not returned
    with RemitSaver.from_conn_string(store_url) as saver:
        graph = approvals(saver, where, depth)
        migrate(path, saver.store, graph=graph)
        graph.invoke({"thread": "live"}, cfg("live"))  # the live path, for the record
        held, live = saver.store.get_run("held"), saver.store.get_run("live")
        assert held is not None and live is not None
        assert (held.status, held.name) == (live.status, live.name) == ("parked", "approvals")
        assert held.waiting == live.waiting == {"interrupts": []}
        assert recover(graph).total == 0
        assert saver.store.get_run("held").status == "parked"  # type: ignore[union-attr]
        # the person approves: it goes on, as the thread that ran under remit does
        done, live_done = graph.invoke(None, cfg("held")), graph.invoke(None, cfg("live"))
        assert done["log"] == live_done["log"] and done["log"][-2:] == ["ask", "z"]
        assert saver.store.get_run("held").status == "done"  # type: ignore[union-attr]


def test_a_release_that_reads_no_subgraph_state_is_refused_by_the_import(
        tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The import tells a subgraph's pause by the subgraph states get_state(subgraphs=True)
    gives; a langgraph that gave a config there instead would read every paused
    subgraph as abandoned: LangGraphSeamError names the seam, nothing is guessed."""
    path = str(tmp_path / "sub.sqlite")
    with SqliteSaver.from_conn_string(path) as stock:
        approvals(stock, "before", 1).invoke({"thread": "held"}, cfg("held"))
    with RemitSaver.from_conn_string(store_url) as saver:
        graph = approvals(saver, "before", 1)
        real = type(graph).get_state

        def configs_only(self: Any, config: Any, *, subgraphs: bool = False) -> Any:
            state = real(self, config, subgraphs=subgraphs)
            return state._replace(tasks=tuple(
                t._replace(state={"configurable": {"checkpoint_ns": t.name}})
                for t in state.tasks))

        monkeypatch.setattr(type(graph), "get_state", configs_only)
        with pytest.raises(LangGraphSeamError, match=r"get_state\(subgraphs=True\)"):
            migrate(path, saver.store, graph=graph)


class Flaky(TypedDict, total=False):
    thread: str
    log: Annotated[list[str], operator.add]


def _boom(s: Flaky) -> dict[str, Any]:
    raise ValueError(f"card declined for {s['thread']}")


def flaky(checkpointer: BaseCheckpointSaver[Any]) -> Any:
    b = StateGraph(Flaky)
    b.add_node("a", lambda s: {"log": ["a"]})
    b.add_node("pay", _boom)
    b.add_edge(START, "a")
    b.add_edge("a", "pay")
    b.add_edge("pay", END)
    return b.compile(checkpointer=checkpointer, name="flaky")


def test_a_stock_thread_whose_node_raised_imports_failed(tmp_path: Path,
                                                         store_url: str) -> None:
    """The node raised under the stock saver (its error is stored at the checkpoint): failed,
    with the error the live path records for the same failure; recover leaves it."""
    path = str(tmp_path / "failed.sqlite")
    with SqliteSaver.from_conn_string(path) as stock, pytest.raises(ValueError):
        flaky(stock).invoke({"thread": "t"}, cfg("t"))
    with RemitSaver.from_conn_string(store_url) as saver:
        graph = flaky(saver)
        migrate(path, saver.store, graph=graph)
        with pytest.raises(ValueError):
            graph.invoke({"thread": "t"}, cfg("live"))
        failed, live = saver.store.get_run("t"), saver.store.get_run("live")
        assert failed is not None and live is not None
        assert (failed.status, failed.name) == (live.status, live.name) == ("failed", "flaky")
        # LangGraph stores the error's repr only: the stock saver is named as its type
        assert failed.error == {"type": "SqliteSaver",
                                "message": "ValueError('card declined for t')"}
        assert live.error == {"type": "ValueError", "message": "card declined for t"}
        assert recover(graph).total == 0


def cli_graph() -> Any:
    """What ``--app tests.langgraph.test_migrate:cli_graph`` loads: the recovery tests'
    graph, compiled without a checkpointer (its ledger from REMIT_TEST_LEDGER)."""
    return lrw.build(os.environ["REMIT_TEST_LEDGER"]).compile(name=lrw.NAME)


def test_the_cli_keeps_lifecycles_with_the_apps_graph(
        stock_runs: tuple[str, Path], store_url: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``remit migrate langgraph --app MODULE:ATTR``: the graph ``remit worker`` takes, so
    a thread the stock process left mid-run is found by recover; an import that takes no
    graph refuses the option."""
    path, ledger = stock_runs
    monkeypatch.setenv("REMIT_TEST_LEDGER", str(ledger))
    assert main(["migrate", "langgraph", "--from", path, "--to", store_url,
                 "--app", "tests.langgraph.test_migrate:cli_graph"]) == 0
    assert "'killed' is kept in the run lifecycle as abandoned" in capsys.readouterr().out
    with open_store(store_url) as store:
        assert {r.run_id: r.lifecycle.status for r in store.list_runs()  # type: ignore[union-attr]
                } == {"killed": "abandoned", "finished": "done", "asked": "parked"}
    assert main(["migrate", "crewai", "--from", path, "--to", store_url,
                 "--app", "tests.langgraph.test_migrate:cli_graph"]) == 2
    assert "--app: the crewai import takes no graph" in capsys.readouterr().err
