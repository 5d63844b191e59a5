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
import sqlite3
import subprocess
import sys
import time
import uuid
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
from remit_langgraph import ConsumeConflict, RemitSaver
from remit_langgraph.migrate import MARKER_RUN, migrate
from tests import procs

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
