"""``remit migrate pydantic-graph``: stock FileStatePersistence files become remit runs,
on every backend. The files are written by pydantic-graph's own FileStatePersistence.

An imported run is kept in the run lifecycle as remit would have kept it (the last
section): a stock run SIGKILLed inside a node, in a real child process that reports when
it is there (no sleeps), reads as abandoned, and ``recover(graph, url)`` finds it by the
graph's name and finishes it, the nodes that finished under the stock layer not run again
(a ledger of node entries is the oracle); a finished one reads as done, a failed one as
failed, one stopped between nodes as parked. Importing again never changes a lifecycle
that an import or a remit execution recorded."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic_graph import BaseNode, End, GraphRunContext
from pydantic_graph.exceptions import GraphNodeStatusError
from pydantic_graph.graph import Graph
from pydantic_graph.persistence.file import FileStatePersistence

from remit_core.cli import main
from remit_pydantic_graph import (
    ConsumeConflict,
    CorruptRecord,
    RemitStatePersistence,
    open_store,
    recover,
)
from remit_pydantic_graph.migrate import OWNER_PREFIX, MigrationError, migrate
from remit_pydantic_graph.persistence import graph_name
from tests import procs
from tests.pydantic_graph import pg_recovery_workers as rw
from tests.pydantic_graph import pg_workers as w


def stock(path: Path, graph: Graph[Any, Any, Any]) -> FileStatePersistence[Any, Any]:
    s: FileStatePersistence[Any, Any] = FileStatePersistence(path)
    s.set_graph_types(graph)
    return s


def remit(url: str, run_id: str, graph: Graph[Any, Any, Any], **kw: Any
          ) -> RemitStatePersistence[Any, Any]:
    p = RemitStatePersistence.from_url(url, run_id=run_id, **kw)
    p.set_graph_types(graph)
    return p


def statuses(history: list[Any]) -> list[tuple[str, str]]:
    return [(s.id.split(":")[0], getattr(s, "status", "end")) for s in history]


async def finish(graph: Graph[Any, Any, Any], p: Any, deps: Any = None) -> Any:
    async with graph.iter_from_persistence(p, deps=deps) as run:
        async for _ in run:
            pass
    assert run.result is not None
    return run.result


async def stock_park(path: Path, ledger: str) -> None:
    """The order graph under the stock layer, stopped before B (B 'created')."""
    async with w.order_graph.iter(w.A(), state=w.Order(), deps=w.Deps(ledger),
                                  persistence=stock(path, w.order_graph)) as run:
        async for node in run:
            if isinstance(node, w.B):
                break


async def stock_hitl(path: Path, ledger: str) -> None:
    """The documented human-in-the-loop pattern under the stock layer, to the end: Answer
    is left 'pending' in the middle of the history."""
    async with w.question_graph.iter(w.Ask(), state=w.Order(), deps=w.Deps(ledger),
                                     persistence=stock(path, w.question_graph)) as run:
        while not isinstance(await run.next(), w.Answer):
            pass
    s = stock(path, w.question_graph)
    snapshot = await s.load_next()
    assert snapshot is not None
    async with w.question_graph.iter(w.Evaluate("yes"), state=snapshot.state,
                                     deps=w.Deps(ledger), persistence=s) as run:
        async for _ in run:
            pass


# ===================================================================== parked and finished


def test_a_parked_run_resumes_under_remit(store_url: str, tmp_path: Path) -> None:
    ledger = str(tmp_path / "ledger.txt")
    path = tmp_path / "order.json"
    asyncio.run(stock_park(path, ledger))
    report = migrate(path, store_url, run_id="order", graph=w.order_graph)
    assert (report.runs, report.checkpoints, report.skipped) == (1, 2, 0)
    assert any("parked before B:" in n for n in report.notes)
    p = remit(store_url, "order", w.order_graph)
    assert asyncio.run(p.load_all()) == asyncio.run(stock(path, w.order_graph).load_all())

    result = asyncio.run(finish(w.order_graph, remit(store_url, "order", w.order_graph),
                                w.Deps(ledger)))
    assert result.output == 11 and result.state == w.Order(x=11, log=["txn-10", "C"])
    assert [e for e in w.lines(ledger) if e.startswith("enter")] == [
        "enter A", "enter B", "enter C"]  # A under the stock layer, B and C under remit
    history = asyncio.run(p.load_all())
    assert statuses(history) == [("A", "success"), ("B", "success"), ("C", "success"),
                                 ("end", "end")]
    assert [s.id for s in history[:2]] == [
        s.id for s in asyncio.run(stock(path, w.order_graph).load_all())]
    with pytest.raises(ConsumeConflict) as info:  # resumed once: the run has ended
        asyncio.run(finish(w.order_graph, remit(store_url, "order", w.order_graph)))
    assert info.value.status == "ended"


@pytest.mark.parametrize("with_graph", [True, False], ids=["graph", "raw"])
def test_a_finished_run_loads_the_stock_history(store_url: str, tmp_path: Path,
                                                with_graph: bool) -> None:
    """Every snapshot with its id, status, start_ts, duration, state and node; the HITL
    pattern leaves a 'pending' snapshot inside the history, which stays 'pending'."""
    ledger = str(tmp_path / "ledger.txt")
    runs = {"order": (tmp_path / "order.json", w.order_graph),
            "hitl": (tmp_path / "hitl.json", w.question_graph)}
    asyncio.run(w.order_graph.run(w.A(), state=w.Order(), deps=w.Deps(ledger),
                                  persistence=stock(runs["order"][0], w.order_graph)))
    asyncio.run(stock_hitl(runs["hitl"][0], ledger))
    for run_id, (path, graph) in runs.items():
        report = migrate(str(path), store_url, run_id=run_id,
                         graph=graph if with_graph else None)
        assert (report.runs, report.checkpoints, report.writes) == (1, 4, 0)
        assert any("has ended" in n for n in report.notes)
        expected = asyncio.run(stock(path, graph).load_all())
        history = asyncio.run(remit(store_url, run_id, graph).load_all())
        assert history == expected
        assert all(s.start_ts is not None and s.duration is not None
                   for s in history[:-1] if getattr(s, "status", "") == "success")
    assert statuses(asyncio.run(remit(store_url, "hitl", w.question_graph).load_all())) == [
        ("Ask", "success"), ("Answer", "pending"), ("Evaluate", "success"), ("end", "end")]


# ========================================================================== idempotency


def test_importing_again_stores_nothing_twice(store_url: str, tmp_path: Path) -> None:
    """Again: everything counted as skipped, nothing stored. After the file grew (the stock
    run went on), only the new snapshots are imported."""
    ledger = str(tmp_path / "ledger.txt")
    path = tmp_path / "order.json"
    asyncio.run(stock_park(path, ledger))
    first = migrate(path, store_url, run_id="order")
    with open_store(store_url) as store:
        usage = store.usage("order")
        again = migrate(path, store_url, run_id="order", graph=w.order_graph)
        assert (again.runs, again.checkpoints, again.writes, again.skipped) == (0, 0, 0, 2)
        assert "already present" in again.summary() and store.usage("order") == usage
        assert first.checkpoints == usage["checkpoints"] == 2

        asyncio.run(finish(w.order_graph, stock(path, w.order_graph), w.Deps(ledger)))
        grown = migrate(path, store_url, run_id="order")
        assert (grown.runs, grown.checkpoints, grown.skipped) == (1, 2, 2)
        assert store.usage("order")["checkpoints"] == 4
        assert migrate(path, store_url, run_id="order").skipped == 4
        assert store.usage("order")["checkpoints"] == 4
    assert asyncio.run(remit(store_url, "order", w.order_graph).load_all()) == \
        asyncio.run(stock(path, w.order_graph).load_all())


def test_importing_after_the_run_went_on_under_remit(store_url: str, tmp_path: Path) -> None:
    """The import is a no-op for a run that went on under remit, and a different history
    under the same run id is refused with nothing stored."""
    ledger = str(tmp_path / "ledger.txt")
    path, other = tmp_path / "order.json", tmp_path / "other.json"
    asyncio.run(stock_park(path, ledger))
    asyncio.run(stock_park(other, ledger))  # the same graph, other (random) stock ids
    migrate(path, store_url, run_id="order")
    asyncio.run(finish(w.order_graph, remit(store_url, "order", w.order_graph), w.Deps(ledger)))
    with open_store(store_url) as store:
        usage = store.usage("order")
        again = migrate(path, store_url, run_id="order")
        assert (again.checkpoints, again.writes, again.skipped) == (0, 0, 2)
        with pytest.raises(MigrationError, match="already holds another history"):
            migrate(other, store_url, run_id="order")
        assert store.usage("order") == usage
    assert statuses(asyncio.run(remit(store_url, "order", w.order_graph).load_all()))[-1] == (
        "end", "end")


# ====================================================== stranded statuses of the stock layer

MODE: dict[str, Any] = {"hang": False, "fail": False, "entered": None, "runs": 0}


@dataclass
class Prepare(BaseNode[w.Order, None, int]):
    async def run(self, ctx: GraphRunContext[w.Order]) -> Work:
        ctx.state.x = 5
        return Work()


@dataclass
class Work(BaseNode[w.Order, None, int]):
    async def run(self, ctx: GraphRunContext[w.Order]) -> End[int]:
        MODE["runs"] += 1
        if MODE["hang"]:
            MODE["entered"].set()
            await asyncio.Event().wait()  # until cancelled
        if MODE["fail"]:
            raise RuntimeError("work failed")
        return End(ctx.state.x * 2)


work_graph = Graph(nodes=[Prepare, Work])


def stock_stranded(path: Path, how: str) -> None:
    """'running': the run was cancelled inside Work (the stock layer leaves it running, as
    after a SIGKILL); 'error': Work raised."""
    MODE.update(hang=how == "running", fail=how == "error", runs=0)

    async def go() -> None:
        MODE["entered"] = asyncio.Event()
        task = asyncio.create_task(work_graph.run(Prepare(), state=w.Order(),
                                                  persistence=stock(path, work_graph)))
        if how == "running":
            await MODE["entered"].wait()
            task.cancel()
        with pytest.raises(asyncio.CancelledError if how == "running" else RuntimeError):
            await task

    asyncio.run(go())
    MODE.update(hang=False, fail=False, runs=0)


@pytest.mark.parametrize("how", ["running", "error", "gap"])
def test_a_stranded_stock_run_keeps_its_status_and_resumes(store_url: str, tmp_path: Path,
                                                           how: str) -> None:
    """The stock layer cannot resume these. Imported, 'running' is a dead owner's claim
    (resumed at once), 'error' resumes under retry_errors=True, and a last node that the
    stock file calls 'success' without a successor (the gap) runs again."""
    path = tmp_path / "work.json"
    stock_stranded(path, "running" if how == "gap" else how)
    if how == "gap":  # as the stock layer leaves a kill between the node and its successor
        items = json.loads(path.read_text())
        items[-1].update(status="success", duration=0.25)
        path.write_text(json.dumps(items))
    expected = asyncio.run(stock(path, work_graph).load_all())
    assert [getattr(s, "status", "end") for s in expected] == [
        "success", "success" if how == "gap" else how]
    report = migrate(path, store_url, run_id="work", graph=work_graph)
    assert (report.checkpoints, report.writes) == (2, 1)
    history = asyncio.run(remit(store_url, "work", work_graph).load_all())
    if how == "gap":
        assert history[-1].status == "running" and history[-1].start_ts == expected[-1].start_ts
        assert history[:-1] == expected[:-1]
    else:
        assert history == expected
    assert migrate(path, store_url, run_id="work").writes == 0  # settled once

    if how == "error":
        with pytest.raises(GraphNodeStatusError):
            asyncio.run(finish(work_graph, remit(store_url, "work", work_graph)))
        retrying = remit(store_url, "work", work_graph, retry_errors=True)
        assert asyncio.run(finish(work_graph, retrying)).output == 10
    else:
        assert asyncio.run(finish(work_graph, remit(store_url, "work", work_graph))).output == 10
    assert MODE["runs"] == 1
    assert statuses(asyncio.run(remit(store_url, "work", work_graph).load_all())) == [
        ("Prepare", "success"), ("Work", "success"), ("end", "end")]


# ========================================================================== bad files


def _write(path: Path, how: str, ledger: str) -> None:
    if how == "missing":
        return
    if how == "empty":  # what a kill during the stock layer's in-place rewrite leaves
        path.write_bytes(b"")
        return
    asyncio.run(w.order_graph.run(w.A(), state=w.Order(), deps=w.Deps(ledger),
                                  persistence=stock(path, w.order_graph)))
    raw = path.read_bytes()
    items = json.loads(raw)
    if how == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
    elif how == "object":
        path.write_text(json.dumps(items[0]))
    elif how == "no-node-id":  # the stock layer's fallback dump of an invalid state
        items[1]["node"] = {}
        path.write_text(json.dumps(items))
    elif how == "wrong-type":
        items[2]["state"]["x"] = "abc"
        path.write_text(json.dumps(items))


@pytest.mark.parametrize("how", ["missing", "empty", "truncated", "object", "no-node-id",
                                 "wrong-type"])
def test_a_missing_or_corrupt_file_stores_nothing(store_url: str, tmp_path: Path,
                                                  how: str) -> None:
    path = tmp_path / f"{how}.json"
    _write(path, how, str(tmp_path / "ledger.txt"))
    with pytest.raises(MigrationError) as info:
        migrate(path, store_url, run_id="bad", graph=w.order_graph)
    assert str(path) in str(info.value) and "Nothing was imported" in str(info.value)
    if how == "empty":
        assert "0 bytes" in str(info.value)
    with open_store(store_url) as store:
        assert store.list_runs() == [] and store.usage("bad")["checkpoints"] == 0


def test_without_the_graph_a_wrong_type_is_refused_when_loaded(store_url: str,
                                                               tmp_path: Path) -> None:
    """The CLI cannot import the graph: the snapshots are checked when first loaded."""
    path = tmp_path / "wrong.json"
    _write(path, "wrong-type", str(tmp_path / "ledger.txt"))
    assert migrate(path, store_url, run_id="wrong").checkpoints == 4
    with pytest.raises(CorruptRecord, match="does not load into the graph's types"):
        asyncio.run(remit(store_url, "wrong", w.order_graph).load_all())


def test_the_run_id_is_required(tmp_path: Path) -> None:
    path = tmp_path / "order.json"
    asyncio.run(stock_park(path, str(tmp_path / "ledger.txt")))
    with pytest.raises(MigrationError, match="run id"):
        migrate(path, f"sqlite:///{tmp_path}/r.db")
    assert not (tmp_path / "r.db").exists()


def test_an_empty_history_imports_nothing(tmp_path: Path) -> None:
    path = tmp_path / "none.json"
    path.write_text("[]")
    url = f"sqlite:///{tmp_path}/r.db"
    report = migrate(path, url, run_id="none")
    assert (report.runs, report.checkpoints, report.skipped) == (0, 0, 0)
    assert report.notes == ["the file holds no snapshots; nothing to import"]
    with open_store(url) as store:
        assert store.list_runs() == []


# ================================================================================= the CLI


def test_the_cli(store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ledger = str(tmp_path / "ledger.txt")
    path = tmp_path / "order.json"
    asyncio.run(stock_park(path, ledger))
    args = ["migrate", "pydantic-graph", "--from", str(path), "--to", store_url]
    assert main([*args, "--run-id", "cli", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["runs"], report["checkpoints"], report["skipped"]) == (1, 2, 0)
    assert report["source"] == str(path)
    assert main([*args, "--run-id", "cli"]) == 0
    assert "imported 0 run(s): 0 checkpoint(s), 0 pending write(s); 2 already present" in \
        capsys.readouterr().out

    result = asyncio.run(finish(w.order_graph, remit(store_url, "cli", w.order_graph),
                                w.Deps(ledger)))
    assert result.output == 11

    assert main(args) == 1  # no --run-id
    assert "MigrationError" in capsys.readouterr().err
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    assert main([*args[:3], str(empty), *args[4:], "--run-id", "empty"]) == 1
    err = capsys.readouterr().err
    assert "MigrationError" in err and str(empty) in err
    with open_store(store_url) as store:
        assert {r.run_id for r in store.list_runs()} == {"cli"}


# ============================================================== the run lifecycle of an import


def ledger_counts(ledger: Path) -> Counter[str]:
    lines = ledger.read_text().splitlines() if ledger.exists() else []
    return Counter(" ".join(line.split()[:3]) for line in lines)


def stock_killed_in_c(path: Path, ledger: Path, run: str) -> None:
    """A real process runs ``run`` of the recovery graph (A -> B (effect) -> C) on the stock
    FileStatePersistence, reports from inside node C, and is SIGKILLed there."""
    parent, child = procs.CTX.Pipe()
    proc = procs.CTX.Process(target=rw.stock_die_in_c, args=(str(path), str(ledger), run, child))
    proc.start()
    child.close()  # so that a child that dies early reads as EOF, not as a hang
    try:
        assert parent.poll(120), "the stock child never reached node C"
        assert parent.recv() == ("in C", run)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
    assert proc.exitcode == -signal.SIGKILL


def inspected(url: str, status: str, capsys: pytest.CaptureFixture[str]) -> list[tuple[str, ...]]:
    """``remit inspect URL --status STATUS``: (run id, status, framework, name) per run."""
    capsys.readouterr()
    assert main(["inspect", url, "--status", status, "--json"]) == 0
    return [(r["run_id"], r["status"], r["framework"], r["name"])
            for r in json.loads(capsys.readouterr().out)["runs"]]


def test_a_stock_run_killed_mid_node_is_recovered_after_the_import(
        store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SIGKILL inside C under the stock layer (C left 'running'); imported with the graph,
    the run is abandoned under the graph's name, so recover() finds it with no run id and
    finishes it: A and B (and B's effect) not again, C once more. A second recovery, and a
    second import, change nothing."""
    ledger, path = tmp_path / "ledger", tmp_path / "k1.json"
    stock_killed_in_c(path, ledger, "k1")
    assert statuses(asyncio.run(stock(path, rw.graph).load_all())) == [
        ("A", "success"), ("B", "success"), ("C", "running")]
    report = migrate(path, store_url, run_id="k1", graph=rw.graph)
    with open_store(store_url) as store:
        run = store.get_run("k1")
        assert run is not None
        assert (run.framework, run.name, run.status, run.attempts) == \
            ("pydantic-graph", rw.NAME, "abandoned", 1)
        assert any("abandoned" in n and "recover(graph" in n for n in report.notes), \
            report.notes
        assert [r.run_id for r in store.list_runs(status="abandoned", framework="pydantic-graph",
                                                  name=rw.NAME)] == ["k1"]
    assert inspected(store_url, "abandoned", capsys) == [
        ("k1", "abandoned", "pydantic-graph", rw.NAME)]

    recovered = recover(rw.graph, store_url)
    assert (recovered.recovered, recovered.failed, recovered.skipped) == (["k1"], {}, [])
    assert ledger_counts(ledger) == Counter({"enter A k1": 1, "enter B k1": 1,
                                             "effect charge k1": 1, "enter C k1": 2})
    history = asyncio.run(remit(store_url, "k1", rw.graph).load_all())
    assert statuses(history) == [("A", "success"), ("B", "success"), ("C", "success"),
                                 ("end", "end")]
    assert history[-1].state.log == ["A", "B:txn-k1", "C"]
    with open_store(store_url) as store:
        done = store.get_run("k1")
        assert done is not None and (done.status, done.attempts, done.name) == \
            ("done", 2, rw.NAME)
        assert recover(rw.graph, store_url).total == 0  # nothing is left
        again = migrate(path, store_url, run_id="k1", graph=rw.graph)
        assert (again.checkpoints, again.writes, again.skipped) == (0, 0, 3)
        assert store.get_run("k1") == done
    assert inspected(store_url, "done", capsys) == [("k1", "done", "pydantic-graph", rw.NAME)]
    assert inspected(store_url, "abandoned", capsys) == []


def test_a_stock_run_killed_mid_node_imported_by_the_cli_is_recovered(
        store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without the graph (the command line) the run is kept under its first node's id, the
    name remit gives a graph without one: recover() of such a graph finds it. B was killed
    after its effect, which the stock layer called without a receipt: it fires again."""
    ledger, path = tmp_path / "ledger.txt", tmp_path / "order.json"
    parent, child = procs.CTX.Pipe()
    proc = procs.CTX.Process(target=w.stock_run_and_hang, args=(str(path), str(ledger), child))
    proc.start()
    child.close()
    try:
        assert parent.poll(120) and parent.recv() == "charged"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
    assert proc.exitcode == -signal.SIGKILL
    assert main(["migrate", "pydantic-graph", "--from", str(path), "--to", store_url,
                 "--run-id", "cli-k"]) == 0
    printed = capsys.readouterr().out
    assert inspected(store_url, "abandoned", capsys) == [
        ("cli-k", "abandoned", "pydantic-graph", "A")]
    assert "kept in the run lifecycle as abandoned" in printed, printed

    unnamed = Graph(nodes=[w.A, w.B, w.C])  # the order graph, never named
    assert graph_name(unnamed) == "A"
    report = recover(unnamed, store_url, deps=w.Deps(str(ledger)))
    assert (report.recovered, report.failed) == (["cli-k"], {})
    entries = w.lines(str(ledger))
    assert Counter(" ".join(e.split()[:2]) for e in entries) == Counter(
        {"enter A": 1, "enter B": 2, "effect charge": 2, "enter C": 1}), entries
    history = asyncio.run(remit(store_url, "cli-k", w.order_graph).load_all())
    assert history[-1].result.data == 11 and history[-1].state == w.Order(x=11,
                                                                          log=["txn-10", "C"])
    assert inspected(store_url, "done", capsys) == [("cli-k", "done", "pydantic-graph", "A")]
    assert recover(unnamed, store_url, deps=w.Deps(str(ledger))).total == 0


@pytest.mark.parametrize("with_graph", [True, False], ids=["graph", "raw"])
def test_a_finished_stock_run_imports_as_done(store_url: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str],
                                              with_graph: bool) -> None:
    ledger, path = tmp_path / "ledger", tmp_path / "f1.json"
    s: FileStatePersistence[Any, Any] = FileStatePersistence(path)
    asyncio.run(rw.graph.run(rw.A(), state=rw.Job(run="f1", ledger=str(ledger)),
                             persistence=s))
    report = migrate(path, store_url, run_id="f1", graph=rw.graph if with_graph else None)
    name = rw.NAME if with_graph else "A"  # without the graph: the first node's id
    with open_store(store_url) as store:
        run = store.get_run("f1")
        assert run is not None
        assert (run.framework, run.name, run.status, run.owner, run.attempts, run.error) == \
            ("pydantic-graph", name, "done", None, 1, None)
        assert any(f"kept in the run lifecycle as done (framework 'pydantic-graph', name "
                   f"{name!r})" in n for n in report.notes), report.notes
        assert [r.run_id for r in store.list_runs(status="done")] == ["f1"]
        assert recover(rw.graph, store, name=name).total == 0  # done: not recovered
        assert store.get_run("f1") == run
    assert inspected(store_url, "done", capsys) == [("f1", "done", "pydantic-graph", name)]


def test_the_cli_keeps_the_run_under_the_name_given(store_url: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """``--name``: the lifecycle name of the imported run (a named graph's, which the
    command line cannot infer without the graph); a framework whose import keeps no
    lifecycle refuses it. ``--app``: the graph, whose name is used."""
    ledger, path = tmp_path / "ledger", tmp_path / "f2.json"
    s: FileStatePersistence[Any, Any] = FileStatePersistence(path)
    asyncio.run(rw.graph.run(rw.A(), state=rw.Job(run="f2", ledger=str(ledger)),
                             persistence=s))
    assert main(["migrate", "pydantic-graph", "--from", str(path), "--to", store_url,
                 "--run-id", "f2", "--name", rw.NAME]) == 0
    assert inspected(store_url, "done", capsys) == [("f2", "done", "pydantic-graph", rw.NAME)]
    # --app: the graph itself (its name, and its types checked), as remit worker takes it
    path3 = tmp_path / "f3.json"
    asyncio.run(rw.graph.run(rw.A(), state=rw.Job(run="f3", ledger=str(ledger)),
                             persistence=FileStatePersistence(path3)))
    assert main(["migrate", "pydantic-graph", "--from", str(path3), "--to", store_url,
                 "--run-id", "f3", "--app", "tests.pydantic_graph.pg_recovery_workers:graph"]
                ) == 0
    assert ("f3", "done", "pydantic-graph", rw.NAME) in inspected(store_url, "done", capsys)
    assert main(["migrate", "langgraph", "--from", str(tmp_path / "none.db"), "--to",
                 store_url, "--name", "x"]) == 2
    assert "--name: the langgraph import takes no name" in capsys.readouterr().err


def stock_pending(path: Path, ledger: str) -> None:
    """Parked before B on the stock layer, then B taken by the stock load_next ('pending')
    and left there (the human-in-the-loop pattern stopped before its answer)."""
    asyncio.run(stock_park(path, ledger))
    assert asyncio.run(stock(path, w.order_graph).load_next()) is not None


@pytest.mark.parametrize("how", ["created", "pending", "running", "gap", "error"])
def test_each_stock_head_is_kept_as_remit_would_have_kept_it(store_url: str, tmp_path: Path,
                                                             how: str) -> None:
    """'created' / 'pending' (between nodes): parked at that snapshot, left to the app's
    resume, as remit keeps a block left between nodes; 'running' and the gap (the process
    died in or after the node): abandoned, which recover() finishes; 'error': failed, with
    what the import knows of the error, which recover(retry_failed=True) retries."""
    ledger, path = str(tmp_path / "ledger.txt"), tmp_path / "run.json"
    graph: Graph[Any, Any, Any] = w.order_graph if how in ("created", "pending") else work_graph
    if how == "created":
        asyncio.run(stock_park(path, ledger))
    elif how == "pending":
        stock_pending(path, ledger)
    else:
        stock_stranded(path, "running" if how == "gap" else how)
        if how == "gap":
            items = json.loads(path.read_text())
            items[-1].update(status="success", duration=0.25)
            path.write_text(json.dumps(items))
    head = asyncio.run(stock(path, graph).load_all())[-1]
    migrate(path, store_url, run_id="r", graph=graph)
    name = graph_name(graph)
    with open_store(store_url) as store:
        run = store.get_run("r")
        assert run is not None and (run.framework, run.name, run.attempts) == \
            ("pydantic-graph", name, 1)
        if how in ("created", "pending"):
            assert (run.status, run.owner) == ("parked", None)
            assert run.waiting == {"snapshot": head.id, "node": "B",
                                   "migrated_from": "FileStatePersistence"}
            assert recover(graph, store).total == 0  # parked: the app resumes it
            result = asyncio.run(finish(graph, remit(store_url, "r", graph), w.Deps(ledger)))
            assert result.output == 11
        elif how == "error":
            assert run.status == "failed" and run.error["type"] == "FileStatePersistence"
            assert "keeps no error message" in run.error["message"]
            assert recover(graph, store).total == 0  # failed: retried only when asked
            assert recover(graph, store, retry_failed=True).recovered == ["r"]
            assert MODE["runs"] == 1
        else:
            assert run.status == "abandoned"
            assert recover(graph, store).recovered == ["r"]
            assert MODE["runs"] == 1
        after = store.get_run("r")
        assert after is not None and (after.status, after.attempts) == ("done", 2)
        assert recover(graph, store, retry_failed=True).total == 0


def test_the_lifecycle_is_recorded_once_and_never_over_a_remit_execution(
        store_url: str, tmp_path: Path) -> None:
    """Importing the same file again leaves the lifecycle as the first import recorded it,
    and after a remit execution as that one recorded it; a file that grew (the stock run
    went on) brings the import's own record up to date."""
    ledger, path = str(tmp_path / "ledger.txt"), tmp_path / "order.json"
    asyncio.run(stock_park(path, ledger))
    migrate(path, store_url, run_id="order")
    with open_store(store_url) as store:
        first = store.get_run("order")
        assert first is not None and first.status == "parked"
        again = migrate(path, store_url, run_id="order", graph=w.order_graph)
        assert store.get_run("order") == first  # the same, updated_at included
        assert any("lifecycle was recorded before (parked" in n and "left as it is" in n
                   for n in again.notes), again.notes

        # a remit execution loads B and leaves the block: it records its own parked
        async def load_and_leave() -> None:
            async with w.order_graph.iter_from_persistence(
                    remit(store_url, "order", w.order_graph), deps=w.Deps(ledger)):
                pass

        asyncio.run(load_and_leave())
        by_remit = store.get_run("order")
        assert by_remit is not None and (by_remit.status, by_remit.attempts) == ("parked", 2)
        migrate(path, store_url, run_id="order")
        assert store.get_run("order") == by_remit

        # the stock run goes on (in another file, the same history): the grown file's import
        # brings its own record up to date, and never a remit execution's
        grown = tmp_path / "grown.json"
        asyncio.run(stock_park(grown, ledger))
        migrate(grown, store_url, run_id="stock", graph=w.order_graph)
        asyncio.run(finish(w.order_graph, stock(grown, w.order_graph), w.Deps(ledger)))
        report = migrate(grown, store_url, run_id="stock", graph=w.order_graph)
        assert report.checkpoints == 2
        ended = store.get_run("stock")
        assert ended is not None and (ended.status, ended.attempts) == ("done", 2)
        assert migrate(grown, store_url, run_id="stock").checkpoints == 0
        assert store.get_run("stock") == ended

        # an import that died between its start and its end, and whose lease ran out, is
        # repaired by the next import (under the name given)
        assert store.start_run("half", framework="pydantic-graph", name="orders",
                               owner=f"{OWNER_PREFIX}dead", lease=0.0).owns
        migrate(path, store_url, run_id="half", name="orders")
        half = store.get_run("half")
        assert half is not None and (half.status, half.name, half.attempts) == \
            ("parked", "orders", 2)
        assert half.waiting["snapshot"] == first.waiting["snapshot"]
