"""``remit migrate crewai``: a stock SQLiteFlowPersistence file becomes remit flows, on
every backend. The stock file is written by CrewAI's own SQLiteFlowPersistence, running
the real test flows (cw_flows with ``stock=True``); the imported flows then run on under
remit with the ``@durable`` classes of the same flows."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from crewai.flow.persistence.sqlite import SQLiteFlowPersistence
from pydantic import ValidationError

from remit_core.cli import main
from remit_crewai import ConsumeConflict, RemitFlowPersistence, open_store
from remit_crewai.migrate import SOURCE, MigrationError, migrate
from tests.crewai import cw_flows as w


def stock_file(tmp_path: Path, ledger: str) -> str:
    """A stock file with one finished flow ("done-1") and one parked on feedback ("parked-1")."""
    db = str(tmp_path / "flow_states.db")
    w.flows(db, stock=True)["OrderFlow"]().kickoff(inputs={"id": "done-1", "ledger": ledger})
    assert w.park(db, "parked-1", ledger, stock=True) == "parked-1"
    return db


def rows(db: str, table: str, flow_id: str | None = None) -> int:
    with closing(sqlite3.connect(db)) as conn:
        where, args = ("WHERE flow_uuid = ?", (flow_id,)) if flow_id else ("", ())
        return int(conn.execute(f"SELECT count(*) FROM {table} {where}", args).fetchone()[0])


def remit(url: str) -> RemitFlowPersistence:
    return RemitFlowPersistence.from_url(url, lease=w.LEASE)


def checkpoints(url: str) -> dict[str, list[tuple[str, str]]]:
    """Every run of the store: its ns "" checkpoints (id, kind), oldest first."""
    with open_store(url) as store:
        return {run.run_id: [(cp.checkpoint_id, cp.kind) for cp in reversed(list(
                    store.list_checkpoints(run.run_id, ns="", with_writes=False)))]
                for run in store.list_runs()}


def stock_resume(db: str, flow_id: str, feedback: str) -> Any:
    cls = w.flows(db, stock=True)["ApprovalFlow"]
    return cls.from_pending(flow_id, SQLiteFlowPersistence(db)).resume(feedback)


# ============================================================================ the import


def test_a_parked_flow_resumes_under_remit_once(store_url: str, tmp_path: Path) -> None:
    ledger = str(tmp_path / "ledger.txt")
    db = stock_file(tmp_path, ledger)
    n_states = rows(db, "flow_states")
    assert rows(db, "pending_feedback") == 1

    report = migrate(db, store_url)
    assert (report.runs, report.checkpoints, report.writes, report.skipped) == (
        2, n_states + 1, 0, 0)
    assert any("not checked against" in note for note in report.notes)
    assert any("'parked-1' is parked on feedback for 'draft'" in n for n in report.notes)

    # remit reads what the stock layer would: the latest state and the parked feedback
    stock, backend = SQLiteFlowPersistence(db), remit(store_url)
    for fid in ("done-1", "parked-1"):
        assert backend.load_state(fid) == stock.load_state(fid)
    found, expected = backend.load_pending_feedback("parked-1"), stock.load_pending_feedback(
        "parked-1")
    assert found is not None and expected is not None
    assert found[0] == expected[0] and found[1].to_dict() == expected[1].to_dict()
    assert backend.load_pending_feedback("done-1") is None
    kinds = [k for _, k in checkpoints(store_url)["parked-1"]]
    assert kinds == ["crewai-state"] * rows(db, "flow_states", "parked-1") + ["crewai-pending"]
    with open_store(store_url) as s:
        meta = s.get_checkpoint("parked-1", with_writes=False)
        assert meta is not None and meta.metadata["migrated_from"] == SOURCE

    # the parked flow goes on under remit: the listener after the feedback runs once
    cls = w.flows(store_url)["ApprovalFlow"]
    assert cls.from_pending("parked-1", backend).resume("ok") == "shipped ok"
    with pytest.raises(ConsumeConflict):
        cls.from_pending("parked-1", backend).resume("again")
    entries = w.lines(ledger)
    assert w.count(entries, "enter draft") == 1  # only the stock run; not re-run
    assert w.count(entries, "effect ship") == 1
    assert backend.load_state("parked-1")["shipped"] == "shipped ok"  # type: ignore[index]

    # importing again after the resume stores nothing and re-opens nothing
    before = checkpoints(store_url)
    again = migrate(db, store_url)
    assert (again.runs, again.checkpoints, again.skipped) == (0, 0, n_states + 1)
    assert checkpoints(store_url) == before
    with pytest.raises(ConsumeConflict):
        cls.from_pending("parked-1", backend).resume("again")
    assert w.count(w.lines(ledger), "effect ship") == 1


def test_a_parked_flow_is_kept_parked_in_the_run_lifecycle_with_a_name(
        store_url: str, tmp_path: Path) -> None:
    """With ``name=``, the flow parked on feedback is kept ``parked``, waiting for what the
    live path records for the same flow parked under remit; the finished one, which the
    stock layer cannot tell from a dead one, gets no lifecycle. Importing again leaves
    the record; the resume under remit then keeps the lifecycle as every resume does.
    Without a name nothing is kept, and the report says how to keep it."""
    ledger = str(tmp_path / "ledger.txt")
    db = stock_file(tmp_path, ledger)
    with open_store(store_url) as store:
        plain = migrate(db, store, run_id="parked-1")
        assert store.get_run("parked-1") is None
        assert any("no run lifecycle was kept" in n and "--name" in n for n in plain.notes)
        report = migrate(db, store, name="ApprovalFlow")
        assert any("'parked-1' is kept in the run lifecycle as parked" in n
                   for n in report.notes), report.notes
        assert any("1 flow(s) with states only get no run lifecycle" in n
                   for n in report.notes), report.notes
        parked, done = store.get_run("parked-1"), store.get_run("done-1")
        assert done is None
        # the record of the same flow parked under remit
        assert w.park(store_url, "live-1", ledger) == "live-1"
        live = store.get_run("live-1")
        assert parked is not None and live is not None
        assert (parked.status, parked.framework, parked.name) == (
            live.status, live.framework, live.name) == ("parked", "crewai", "ApprovalFlow")
        assert parked.waiting == {"feedback": {**live.waiting["feedback"],
                                               "flow_id": "parked-1"}}
        again = migrate(db, store, name="ApprovalFlow")
        assert any("'parked-1': its run lifecycle was recorded before" in n
                   for n in again.notes), again.notes
        assert store.get_run("parked-1") == parked
        cls = w.flows(store_url)["ApprovalFlow"]
        assert cls.from_pending("parked-1", remit(store_url)).resume("ok") == "shipped ok"
        run = store.get_run("parked-1")
        assert run is not None and (run.status, run.attempts) == ("done", 2), run


def test_a_flow_with_states_only_resumes_from_its_latest_state(store_url: str,
                                                                tmp_path: Path) -> None:
    """kickoff(inputs={"id"}) restores the latest imported state and runs the flow from its
    start methods, as the stock layer does (it records no finished methods)."""
    ledger = str(tmp_path / "ledger.txt")
    db = stock_file(tmp_path, ledger)
    latest = SQLiteFlowPersistence(db).load_state("done-1")
    assert latest is not None and latest["count"] == 1
    migrate(db, store_url)
    flow = w.flows(store_url)["OrderFlow"]()
    result = flow.kickoff(inputs={"id": "done-1"})
    assert result.startswith("done txn-")
    state = flow.state.model_dump()
    assert state["id"] == "done-1" and state["ledger"] == ledger
    assert state["count"] == 2  # the stock count, plus this run's begin
    assert state["log"][:3] == latest["log"]
    assert w.count(w.lines(ledger), "effect charge") == 2  # the stock run and this one
    # under remit the flow has now finished: a further kickoff returns its result
    assert w.flows(store_url)["OrderFlow"]().kickoff(inputs={"id": "done-1"}) == result
    assert w.count(w.lines(ledger), "effect charge") == 2


def test_states_are_imported_as_they_are(store_url: str, tmp_path: Path) -> None:
    """The CLI cannot know a flow's state class: a state the stock layer stored against its
    schema is imported, and fails when the flow is restored (as it does under the stock
    layer)."""
    db = str(tmp_path / "flow_states.db")
    SQLiteFlowPersistence(db).save_state("bad-1", "begin", {"id": "bad-1", "count": "x"})
    report = migrate(db, store_url)
    assert report.checkpoints == 1
    assert remit(store_url).load_state("bad-1") == {"id": "bad-1", "count": "x"}
    with pytest.raises(ValidationError):
        w.flows(store_url)["OrderFlow"]().kickoff(inputs={"id": "bad-1"})


# ======================================================================== importing again


def test_importing_again_adds_only_what_the_stock_layer_wrote_since(store_url: str,
                                                                     tmp_path: Path) -> None:
    ledger = str(tmp_path / "ledger.txt")
    db = stock_file(tmp_path, ledger)
    first = migrate(db, store_url)
    stored = checkpoints(store_url)
    again = migrate(db, store_url)
    assert (again.runs, again.checkpoints, again.skipped) == (0, 0, first.checkpoints)
    assert any("nothing new" in note for note in again.notes)
    assert checkpoints(store_url) == stored

    w.park(db, "parked-2", ledger, stock=True)
    third = migrate(db, store_url)
    added = rows(db, "flow_states", "parked-2") + 1
    assert (third.runs, third.checkpoints, third.skipped) == (1, added, first.checkpoints)
    after = checkpoints(store_url)
    assert {k: v for k, v in after.items() if k != "parked-2"} == stored
    assert [k for _, k in after["parked-2"]][-1] == "crewai-pending"
    cls = w.flows(store_url)["ApprovalFlow"]
    assert cls.from_pending("parked-2", remit(store_url)).resume("yes") == "shipped yes"


def test_feedback_the_stock_layer_delivered_since_is_not_delivered_again(
        store_url: str, tmp_path: Path) -> None:
    """Imported while parked, then resumed under the stock layer: importing again adds the
    stock's new states and marks the imported feedback consumed in remit."""
    ledger = str(tmp_path / "ledger.txt")
    db = stock_file(tmp_path, ledger)
    migrate(db, store_url)
    before = rows(db, "flow_states", "parked-1")
    assert stock_resume(db, "parked-1", "stock-ok") == "shipped stock-ok"
    assert rows(db, "pending_feedback") == 0
    report = migrate(db, store_url)
    # the states the stock resume wrote (after draft's feedback, after deliver)
    assert report.runs == 1 and report.checkpoints == rows(db, "flow_states", "parked-1") - before
    assert any("marked consumed" in note for note in report.notes)
    backend = remit(store_url)
    assert backend.load_pending_feedback("parked-1") is None
    assert backend.load_state("parked-1") == SQLiteFlowPersistence(db).load_state("parked-1")
    cls = w.flows(store_url)["ApprovalFlow"]
    with pytest.raises(ConsumeConflict):
        cls.from_pending("parked-1", backend).resume("twice")
    assert w.count(w.lines(ledger), "effect ship") == 1
    final = migrate(db, store_url)
    assert (final.checkpoints, final.skipped) == (0, report.skipped + report.checkpoints)
    assert not any("marked consumed" in note for note in final.notes)


def test_a_stock_resume_that_died_before_clearing_its_feedback(store_url: str,
                                                               tmp_path: Path) -> None:
    """The stock resume writes a state, then clears the pending row; one that died in between
    leaves both. Importing again adds the state; the feedback stays deliverable, as in the
    stock file."""
    ledger = str(tmp_path / "ledger.txt")
    db = stock_file(tmp_path, ledger)
    migrate(db, store_url)
    stock = SQLiteFlowPersistence(db)
    state = stock.load_state("parked-1")
    assert state is not None
    stock.save_state("parked-1", "draft", state)
    report = migrate(db, store_url)
    assert (report.runs, report.checkpoints) == (1, 1)
    cls = w.flows(store_url)["ApprovalFlow"]
    assert cls.from_pending("parked-1", remit(store_url)).resume("late") == "shipped late"


def test_a_flow_that_went_on_in_both_stores_is_refused(store_url: str, tmp_path: Path) -> None:
    ledger = str(tmp_path / "ledger.txt")
    db = stock_file(tmp_path, ledger)
    migrate(db, store_url)
    cls = w.flows(store_url)["ApprovalFlow"]
    assert cls.from_pending("parked-1", remit(store_url)).resume("remit") == "shipped remit"
    stock_resume(db, "parked-1", "stock")  # the stock application went on as well
    w.park(db, "parked-3", ledger, stock=True)
    before = checkpoints(store_url)
    with pytest.raises(MigrationError, match=r"'parked-1'.*cannot be joined"):
        migrate(db, store_url)
    assert checkpoints(store_url) == before  # nothing stored, parked-3 neither
    report = migrate(db, store_url, run_id="parked-3")  # the other flows, one by one
    assert report.runs == 1


# =============================================================================== run id, CLI


def test_run_id_imports_one_flow(store_url: str, tmp_path: Path) -> None:
    ledger = str(tmp_path / "ledger.txt")
    db = stock_file(tmp_path, ledger)
    report = migrate(db, store_url, run_id="parked-1")
    assert (report.runs, report.checkpoints) == (1, rows(db, "flow_states", "parked-1") + 1)
    assert set(checkpoints(store_url)) == {"parked-1"}
    with pytest.raises(MigrationError, match="no flow 'nope'"):
        migrate(db, store_url, run_id="nope")
    assert set(checkpoints(store_url)) == {"parked-1"}
    rest = migrate(db, store_url)
    assert (rest.runs, rest.checkpoints, rest.skipped) == (
        1, rows(db, "flow_states", "done-1"), report.checkpoints)


def test_the_cli(store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ledger = str(tmp_path / "ledger.txt")
    db = stock_file(tmp_path, ledger)
    args = ["migrate", "crewai", "--from", db, "--to", store_url]
    capsys.readouterr()  # CrewAI's console output of the stock runs
    assert main([*args, "--run-id", "parked-1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["runs"], out["checkpoints"], out["skipped"]) == (
        1, rows(db, "flow_states", "parked-1") + 1, 0)
    assert main(args) == 0
    text = capsys.readouterr().out
    assert text.startswith("imported 1 run(s)") and "already present" in text
    assert main(args) == 0
    assert capsys.readouterr().out.startswith("imported 0 run(s)")
    cls = w.flows(store_url)["ApprovalFlow"]
    assert cls.from_pending("parked-1", remit(store_url)).resume("cli") == "shipped cli"
    missing = str(tmp_path / "missing.db")
    assert main(["migrate", "crewai", "--from", missing, "--to", store_url]) == 1
    err = capsys.readouterr().err
    assert "MigrationError" in err and "missing.db" in err


# ============================================================================ bad sources


def dump(path: Path) -> list[str] | bytes | None:
    """The content of a source file: its SQL dump (WAL included), else its bytes."""
    if not path.exists():
        return None
    try:
        with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as conn:
            return list(conn.iterdump())
    except sqlite3.DatabaseError:
        return path.read_bytes()


def _foreign_sqlite(path: Path) -> None:
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("CREATE TABLE checkpoints (id INTEGER)")


def _not_sqlite(path: Path) -> None:
    path.write_text("flow_uuid,state\nabc,{}\n")


def _bad_row(column: str, value: str) -> Any:
    def make(path: Path) -> None:
        stock = SQLiteFlowPersistence(str(path))
        stock.save_state("ok-1", "begin", {"id": "ok-1"})
        with closing(sqlite3.connect(path)) as conn, conn:
            conn.execute(f"UPDATE flow_states SET {column} = ?", (value,))
    return make


@pytest.mark.parametrize(("make", "message"), [
    (None, "no such file"),
    (_foreign_sqlite, "no flow_states table"),
    (_not_sqlite, "not a SQLite database"),
    (_bad_row("state_json", '{"id": "ok-1", "cut'), "flow_states row 1: state_json is not "
                                                    "valid JSON"),
    (_bad_row("state_json", "[1, 2]"), "state_json is not a JSON object"),
], ids=["missing", "foreign", "not-sqlite", "cut-short", "not-an-object"])
def test_bad_sources_are_refused_and_store_nothing(store_url: str, tmp_path: Path, make: Any,
                                                    message: str) -> None:
    path = tmp_path / "source.db"
    if make is not None:
        make(path)
    before = dump(path)
    with pytest.raises(MigrationError, match=message) as caught:
        migrate(path, store_url)
    assert str(path) in str(caught.value)
    assert checkpoints(store_url) == {}
    assert dump(path) == before  # the source is read, never changed or given CrewAI's tables


def test_a_bad_pending_row_is_refused(store_url: str, tmp_path: Path) -> None:
    ledger = str(tmp_path / "ledger.txt")
    db = stock_file(tmp_path, ledger)
    copy = str(tmp_path / "copy.db")
    with closing(sqlite3.connect(db)) as src, closing(sqlite3.connect(copy)) as dst:
        src.backup(dst)  # the WAL too (crewai 1.15.0 leaves its connections to the GC)
    with closing(sqlite3.connect(copy)) as conn, conn:
        assert conn.execute("UPDATE pending_feedback SET flow_uuid = flow_uuid").rowcount == 1
        conn.execute("UPDATE pending_feedback SET context_json = ?", (json.dumps({"x": 1}),))
    with pytest.raises(MigrationError, match="not a CrewAI PendingFeedbackContext"):
        migrate(copy, store_url)
    assert checkpoints(store_url) == {}
