"""RemitStatePersistence in one process, on every backend: the status machine, CV,
errors and cancellation, deterministic ids and forks, many runs in one store."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pydantic_graph import BaseNode, End, GraphRunContext
from pydantic_graph.exceptions import GraphNodeStatusError
from pydantic_graph.graph import Graph

from remit_pydantic_graph import (
    ConsumeConflict,
    RemitStatePersistence,
    StateValidationError,
    effect,
    open_store,
)
from tests.pydantic_graph import pg_workers as w


def statuses(history: list[Any]) -> list[tuple[str, str]]:
    return [(s.id.split(":")[0], getattr(s, "status", "end")) for s in history]


def persistence(url: str, run_id: str, graph: Graph[Any, Any, Any], **kw: Any
                ) -> RemitStatePersistence[Any, Any]:
    p = RemitStatePersistence.from_url(url, run_id=run_id, **kw)
    p.set_graph_types(graph)
    return p


# ===================================================================== basics and ids


def test_a_run_records_every_snapshot_with_its_status(store_url: str, tmp_path: Path) -> None:
    ledger = str(tmp_path / "ledger.txt")
    p = persistence(store_url, "r", w.order_graph)
    result = asyncio.run(w.order_graph.run(w.A(), state=w.Order(), deps=w.Deps(ledger),
                                           persistence=p))
    assert result.output == 11 and result.state == w.Order(x=11, log=["txn-10", "C"])
    history = asyncio.run(p.load_all())
    assert statuses(history) == [("A", "success"), ("B", "success"), ("C", "success"),
                                 ("end", "end")]
    assert [s.state.x for s in history] == [0, 1, 11, 11]  # node snapshots hold pre-node state
    assert all(s.start_ts is not None and s.duration is not None for s in history[:3])
    assert history[1].node == w.B(amount=10)


def test_same_node_sequence_same_snapshot_ids(store_url: str, tmp_path: Path) -> None:
    """FD: ids derive from the parent id and the node, not from chance."""
    ledger = str(tmp_path / "ledger.txt")
    ids = []
    for run_id in ("one", "two"):
        p = persistence(store_url, run_id, w.order_graph)
        asyncio.run(w.order_graph.run(w.A(), state=w.Order(), deps=w.Deps(ledger), persistence=p))
        ids.append([s.id for s in asyncio.run(p.load_all())])
    assert ids[0] == ids[1] and len(set(ids[0])) == 4
    other = persistence(store_url, "three", w.order_graph)
    asyncio.run(w.order_graph.run(w.A(), state=w.Order(x=5), deps=w.Deps(ledger),
                                  persistence=other))
    assert asyncio.run(other.load_all())[0].id != ids[0][0]  # another start state


def test_one_store_holds_many_runs(store_url: str, tmp_path: Path) -> None:
    ledger = str(tmp_path / "ledger.txt")

    async def main() -> list[Any]:
        runs = [persistence(store_url, f"order-{i}", w.order_graph) for i in range(8)]
        done = await asyncio.gather(*(
            w.order_graph.run(w.A(), state=w.Order(x=i), deps=w.Deps(ledger), persistence=p)
            for i, p in enumerate(runs)))
        assert [d.output for d in done] == [(i + 1) * 11 for i in range(8)]
        return [await p.load_all() for p in runs]

    histories = asyncio.run(main())
    assert all(len(h) == 4 for h in histories)
    assert [h[-1].state.x for h in histories] == [(i + 1) * 11 for i in range(8)]
    with open_store(store_url) as store:
        assert {r.run_id for r in store.list_runs()} >= {f"order-{i}" for i in range(8)}


def test_persistences_of_one_url_share_a_store_while_one_lives(tmp_path: Path) -> None:
    """from_url shares one store per URL in the process (the core's store cache): for_run
    and fork copies share it too; it is closed once no persistence of it is left (carried
    out by the next from_url, never in the garbage collector), and reopened when needed."""
    import gc

    from remit_core.errors import StoreClosed

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    first = RemitStatePersistence.from_url(url, run_id="a")
    second = RemitStatePersistence.from_url(url, run_id="b")
    sibling = first.for_run("c")
    store = first.store
    assert second.store is store and sibling.store is store
    del first, second
    gc.collect()
    RemitStatePersistence.from_url(f"sqlite:///{tmp_path / 'other.db'}", run_id="x")
    assert store.list_runs() == []  # the sibling still holds it
    del sibling
    gc.collect()
    RemitStatePersistence.from_url(f"sqlite:///{tmp_path / 'other.db'}", run_id="z")
    with pytest.raises(StoreClosed):  # the last one went: closed by that from_url
        store.list_runs()
    again = RemitStatePersistence.from_url(url, run_id="d")
    assert again.store is not store and again.store.list_runs() == []
    again_too = RemitStatePersistence.from_url(url, run_id="d2")
    del again
    gc.collect()
    assert RemitStatePersistence.from_url(url, run_id="f").store is again_too.store  # no churn
    with open_store(url) as mine:  # a store passed in is the caller's: never closed here
        RemitStatePersistence(mine, run_id="e")
        gc.collect()
        RemitStatePersistence.from_url(f"sqlite:///{tmp_path / 'third.db'}", run_id="y")
        assert mine.list_runs() == []


def test_initialize_then_resume_elsewhere(store_url: str, tmp_path: Path) -> None:
    ledger = str(tmp_path / "ledger.txt")
    p = persistence(store_url, "init", w.order_graph)
    asyncio.run(w.order_graph.initialize(w.A(), p, state=w.Order()))
    assert statuses(asyncio.run(p.load_all())) == [("A", "created")]
    fresh = persistence(store_url, "init", w.order_graph)

    async def resume() -> Any:
        async with w.order_graph.iter_from_persistence(fresh, deps=w.Deps(ledger)) as run:
            async for _ in run:
                pass
        return run.result

    result = asyncio.run(resume())
    assert result is not None and result.output == 11
    again = persistence(store_url, "init", w.order_graph)
    with pytest.raises(ConsumeConflict) as info:  # the run has ended: nothing to resume
        asyncio.run(again.load_next())
    assert info.value.status == "ended"


def test_reads_never_claim_and_an_abandoned_claim_is_taken_over(store_url: str,
                                                                 tmp_path: Path) -> None:
    """LV: a snapshot taken by load_next and never run (its process died) is resumed by
    another process once the claim's lease ran out; load_all never claims or waits."""
    ledger = str(tmp_path / "ledger.txt")
    asyncio.run(w.park_gate(store_url, "abandoned", ledger))
    reader = persistence(store_url, "abandoned", w.gate_graph)
    with open_store(store_url) as store:
        before = store.list_claims("abandoned")  # Prep's, consumed
        asyncio.run(reader.load_all())
        assert store.list_claims("abandoned") == before
    gone = persistence(store_url, "abandoned", w.gate_graph, lease=0.5)
    assert asyncio.run(gone.load_next()) is not None  # and then its process "dies"
    assert statuses(asyncio.run(reader.load_all()))[-1] == ("Gate", "pending")
    rescuer = persistence(store_url, "abandoned", w.gate_graph, lease=5.0)

    async def rescue() -> tuple[Any, int]:
        conflicts = 0
        while True:
            try:
                return await w.resume_gate(rescuer, ledger), conflicts
            except ConsumeConflict as exc:
                assert exc.status == "claimed"
                conflicts += 1
                await asyncio.sleep(0.05)  # until the abandoned claim's lease runs out

    output, conflicts = asyncio.run(rescue())
    assert output == 7 and conflicts >= 1
    assert sum(e.startswith("enter Gate") for e in w.lines(ledger)) == 1


def test_load_next_on_an_empty_run_returns_none(store_url: str) -> None:
    p = persistence(store_url, "nothing", w.order_graph)
    assert asyncio.run(p.load_next()) is None
    assert asyncio.run(p.load_all()) == []


def test_a_second_first_node_is_refused(store_url: str, tmp_path: Path) -> None:
    """CO: one head per run; starting a run again under its id does not fork it."""
    ledger = str(tmp_path / "ledger.txt")
    asyncio.run(w.park_question(store_url, "q", ledger))
    p = persistence(store_url, "q", w.question_graph)
    with pytest.raises(ConsumeConflict) as info:
        asyncio.run(w.question_graph.run(w.Ask(), state=w.Order(x=3), deps=w.Deps(ledger),
                                         persistence=p))
    assert info.value.status == "not-loaded" and info.value.step.startswith("Answer:")
    q = persistence(store_url, "q", w.question_graph)
    with pytest.raises(ConsumeConflict):  # a different node for a head it never loaded
        asyncio.run(w.question_graph.run(w.Evaluate("x"), state=w.Order(), deps=w.Deps(ledger),
                                         persistence=q))
    assert statuses(asyncio.run(p.load_all())) == [("Ask", "success"), ("Answer", "created")]
    assert w.lines(ledger).count("enter Ask") == 1


def test_human_in_the_loop_pattern(store_url: str, tmp_path: Path) -> None:
    ledger = str(tmp_path / "ledger.txt")
    asyncio.run(w.park_question(store_url, "hitl", ledger))
    out = asyncio.run(w.deliver_answer(w.resumer(store_url, "hitl", "hitl"), ledger, "yes"))
    assert out == "done-yes"
    p = persistence(store_url, "hitl", w.question_graph)
    history = asyncio.run(p.load_all())
    assert statuses(history) == [("Ask", "success"), ("Answer", "success"),
                                 ("Evaluate", "success"), ("end", "end")]
    assert history[-1].state.log == ["graded-yes"]
    with pytest.raises(ConsumeConflict):  # a late second delivery
        asyncio.run(w.deliver_answer(w.resumer(store_url, "hitl", "hitl"), ledger, "no"))
    assert sum(e.startswith("effect grade") for e in w.lines(ledger)) == 1


def test_driving_the_run_by_hand_may_replace_its_own_next_node(store_url: str,
                                                               tmp_path: Path) -> None:
    """GraphRun.next(node) with another node: allowed for the head this persistence wrote."""
    ledger = str(tmp_path / "ledger.txt")
    p = persistence(store_url, "manual", w.order_graph)

    async def main() -> Any:
        async with w.order_graph.iter(w.A(), state=w.Order(), deps=w.Deps(ledger),
                                      persistence=p) as run:
            node = await run.next()
            assert node == w.B(amount=10)
            node = await run.next(w.B(amount=3))  # skip the graph's choice
            while not isinstance(node, End):
                node = await run.next()
        return node.data

    assert asyncio.run(main()) == 4
    assert statuses(asyncio.run(p.load_all())) == [
        ("A", "success"), ("B", "success"), ("B", "success"), ("C", "success"), ("end", "end")]


# ============================================================================= CV


@dataclass
class Tally:
    count: int = 0
    names: list[str] = field(default_factory=list)


BROKEN = {"state": True, "node": True}


@dataclass
class Begin(BaseNode[Tally, None, int]):
    async def run(self, ctx: GraphRunContext[Tally]) -> Corrupt:
        ctx.state.count += 1
        return Corrupt()


@dataclass
class Corrupt(BaseNode[Tally, None, int]):
    async def run(self, ctx: GraphRunContext[Tally]) -> Finish:
        if BROKEN["state"]:
            ctx.state.count = "five"  # type: ignore[assignment]
        else:
            ctx.state.count += 1
        return Finish(n="zz" if BROKEN["node"] else ctx.state.count)  # type: ignore[arg-type]


@dataclass
class Finish(BaseNode[Tally, None, int]):
    n: int

    async def run(self, ctx: GraphRunContext[Tally]) -> End[int]:
        return End(self.n)


cv_graph = Graph(nodes=[Begin, Corrupt, Finish])


def test_invalid_state_is_never_saved(store_url: str) -> None:
    """CV: the write is refused naming the field and the node; the history stays loadable
    and the node is marked error, which retry_errors=True runs again once fixed."""
    BROKEN.update(state=True, node=True)
    p = persistence(store_url, "cv", cv_graph)
    with pytest.raises(StateValidationError) as info:
        asyncio.run(cv_graph.run(Begin(), state=Tally(), persistence=p))
    err = info.value
    assert err.field == "count" and err.run_id == "cv" and str(err.step).startswith("Corrupt:")
    history = asyncio.run(p.load_all())
    assert statuses(history) == [("Begin", "success"), ("Corrupt", "error")]
    assert all(isinstance(s.state.count, int) for s in history)
    BROKEN["state"] = False  # a valid state, but a node field of the wrong type
    with pytest.raises(StateValidationError) as info:
        asyncio.run(_resume(cv_graph, persistence(store_url, "cv", cv_graph, retry_errors=True)))
    assert info.value.field == "node.n"
    with pytest.raises(GraphNodeStatusError):  # an error is not retried by default
        asyncio.run(_resume(cv_graph, persistence(store_url, "cv", cv_graph)))
    BROKEN["node"] = False
    assert asyncio.run(_resume(cv_graph, persistence(store_url, "cv", cv_graph, retry_errors=True))) == 2
    assert statuses(asyncio.run(p.load_all())) == [
        ("Begin", "success"), ("Corrupt", "success"), ("Finish", "success"), ("end", "end")]


def test_invalid_start_state_is_refused(store_url: str) -> None:
    p = persistence(store_url, "cv0", cv_graph)
    with pytest.raises(StateValidationError) as info:
        asyncio.run(cv_graph.run(Begin(), state=Tally(count="1"), persistence=p))  # type: ignore[arg-type]
    assert info.value.field == "count"
    assert asyncio.run(p.load_all()) == []


async def _resume(graph: Graph[Any, Any, Any], p: RemitStatePersistence[Any, Any]) -> Any:
    async with graph.iter_from_persistence(p) as run:
        async for _ in run:
            pass
    assert run.result is not None
    return run.result.output


class Opaque:
    """A value an ``Any`` field holds and pydantic cannot dump as JSON."""


@dataclass
class Stash:
    count: int = 0
    payload: Any = None


@dataclass
class Keep(BaseNode[Stash, None, int]):
    async def run(self, ctx: GraphRunContext[Stash]) -> Hide:
        ctx.state.count += 1
        return Hide()


@dataclass
class Hide(BaseNode[Stash, None, int]):
    async def run(self, ctx: GraphRunContext[Stash]) -> End[int]:
        ctx.state.payload = Opaque()
        return End(ctx.state.count)


opaque_graph = Graph(nodes=[Keep, Hide])

#: the same message shape as remit-crewai's (tests/crewai/test_flows.py, UNDUMPABLE)
UNDUMPABLE = re.compile(
    r"^invalid state in run '[^']+', step '[^']+': field 'payload': cannot be stored as "
    r"JSON \(.*Unable to serialize unknown type.*\) \(got Opaque .*\)\. Nothing was written;")


def test_a_field_that_cannot_be_dumped_is_a_state_validation_error(store_url: str) -> None:
    """A state that validates (an Any field) but cannot be dumped: StateValidationError
    naming the field, in the message shape every adapter uses; nothing is written."""
    p = persistence(store_url, "opaque", opaque_graph)
    with pytest.raises(StateValidationError) as info:
        asyncio.run(opaque_graph.run(Keep(), state=Stash(), persistence=p))
    err = info.value
    assert err.field == "payload" and err.run_id == "opaque"
    assert str(err.step).startswith("Hide:")
    assert UNDUMPABLE.match(str(err)), str(err)
    assert statuses(asyncio.run(p.load_all())) == [("Keep", "success"), ("Hide", "error")]


def test_rerunning_a_finished_node_is_a_graph_node_status_error(store_url: str,
                                                                tmp_path: Path) -> None:
    """Where the stock persistence raises GraphNodeStatusError (a node re-run on a
    finished snapshot), remit's refusal is that error and a ConsumeConflict at once."""
    ledger = str(tmp_path / "ledger.txt")
    p = persistence(store_url, "rerun", w.order_graph)
    asyncio.run(w.order_graph.run(w.A(), state=w.Order(), deps=w.Deps(ledger), persistence=p))
    history = asyncio.run(p.load_all())
    finished = history[1]  # B, status success
    assert finished.status == "success"

    async def rerun_by_hand() -> None:
        async with persistence(store_url, "rerun", w.order_graph).record_run(finished.id):
            raise AssertionError("a finished node must not run again")

    with pytest.raises(GraphNodeStatusError) as info:
        asyncio.run(rerun_by_hand())
    assert isinstance(info.value, ConsumeConflict)
    assert info.value.actual_status == "success" and info.value.run_id == "rerun"
    assert str(info.value).startswith("Incorrect snapshot status 'success'")

    async def rerun_in_the_graph() -> None:  # the graph API: iter from the finished node
        q = persistence(store_url, "rerun", w.order_graph)
        async with w.order_graph.iter(finished.node, state=finished.state,
                                      deps=w.Deps(ledger), persistence=q) as run:
            async for _ in run:
                pass

    try:
        asyncio.run(rerun_in_the_graph())
    except GraphNodeStatusError as exc:  # the clause stock-persistence code has
        assert isinstance(exc, ConsumeConflict)
    else:
        raise AssertionError("a finished node must not run again")
    assert w.lines(ledger).count("enter B") == 1

    async def while_another_runs_it() -> Any:  # stock: GraphNodeStatusError('running')
        first = persistence(store_url, "busy", w.order_graph)
        await w.order_graph.initialize(w.A(), first, state=w.Order())
        (snap,) = await first.load_all()
        async with first.record_run(snap.id):
            with pytest.raises(GraphNodeStatusError) as busy:
                async with persistence(store_url, "busy", w.order_graph).record_run(snap.id):
                    raise AssertionError("a running node must not run twice")
        return busy.value

    busy = asyncio.run(while_another_runs_it())
    assert isinstance(busy, ConsumeConflict) and busy.actual_status == "running"


# ================================================================ errors, cancellation

FLAKY: dict[str, Any] = {"raise": True, "block": False, "entered": None, "runs": 0}


@effect(name="flaky-effect")
def flaky_effect(*, idempotency_key: str) -> str:
    FLAKY["runs"] += 1
    return "done"


@dataclass
class Flaky(BaseNode[Tally, None, str]):
    async def run(self, ctx: GraphRunContext[Tally]) -> End[str]:
        out = flaky_effect()
        if FLAKY["block"]:
            FLAKY["entered"].set()
            await asyncio.Event().wait()  # until cancelled
        if FLAKY["raise"]:
            raise ValueError("flaky failed")
        return End(out)


flaky_graph = Graph(nodes=[Flaky])


def test_a_node_that_raises_is_resumed_by_the_retry_policy(store_url: str) -> None:
    FLAKY.update({"raise": True, "block": False, "runs": 0})
    p = persistence(store_url, "err", flaky_graph)
    with pytest.raises(ValueError, match="flaky failed"):
        asyncio.run(flaky_graph.run(Flaky(), state=Tally(), persistence=p))
    (snap,) = asyncio.run(p.load_all())
    assert snap.status == "error" and snap.duration is not None
    with pytest.raises(GraphNodeStatusError) as info:
        asyncio.run(_resume(flaky_graph, persistence(store_url, "err", flaky_graph)))
    assert "retry_errors=True" in "".join(getattr(info.value, "__notes__", []))
    FLAKY["raise"] = False
    assert asyncio.run(_resume(flaky_graph, persistence(store_url, "err", flaky_graph,
                                           retry_errors=True))) == "done"
    assert FLAKY["runs"] == 1  # EO: the effect of the failed attempt was replayed


@pytest.mark.parametrize("how", ["cancel", "timeout"])
def test_cancellation_never_strands_running(store_url: str, how: str) -> None:
    FLAKY.update({"raise": False, "block": True, "runs": 0})
    p = persistence(store_url, f"cancel-{how}", flaky_graph)

    async def interrupted() -> None:
        FLAKY["entered"] = asyncio.Event()
        if how == "cancel":
            task = asyncio.create_task(flaky_graph.run(Flaky(), state=Tally(), persistence=p))
            await FLAKY["entered"].wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        else:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(None) as deadline:
                    task = asyncio.create_task(
                        flaky_graph.run(Flaky(), state=Tally(), persistence=p))
                    await FLAKY["entered"].wait()
                    deadline.reschedule(asyncio.get_running_loop().time())
                    await task

    asyncio.run(interrupted())
    (snap,) = asyncio.run(p.load_all())
    assert snap.status == "created"  # not stranded in running; any resume runs it
    FLAKY["block"] = False
    assert asyncio.run(_resume(flaky_graph, persistence(store_url, f"cancel-{how}", flaky_graph))) == "done"
    assert FLAKY["runs"] == 1


# =========================================================================== forks


def test_forking_twice_gives_the_same_ids_and_state(store_url: str, tmp_path: Path) -> None:
    """FI/FD: a fork is explicit; two forks of one snapshot run to the same ids and state."""
    ledger = str(tmp_path / "ledger.txt")
    asyncio.run(w.park_question(store_url, "base", ledger))
    base = persistence(store_url, "base", w.question_graph)
    parked = asyncio.run(base.load_all())[-1]
    outs = []
    for fork_id in ("fork-1", "fork-2"):
        fork = asyncio.run(base.fork(parked.id, run_id=fork_id))
        assert asyncio.run(base.fork(parked.id, run_id=fork_id)).run_id == fork_id  # idempotent
        out = asyncio.run(w.deliver_answer(fork, ledger, "yes"))
        outs.append((out, [(s.id, s.state) for s in asyncio.run(fork.load_all())]))
    assert outs[0] == outs[1]
    assert outs[0][1][0][0] == parked.id
    with pytest.raises(ConsumeConflict):  # fork-1 started elsewhere: not a fork of Ask
        asyncio.run(base.fork(asyncio.run(base.load_all())[0].id, run_id="fork-1"))
    assert statuses(asyncio.run(base.load_all())) == [("Ask", "success"), ("Answer", "created")]


# ==================================================================== import guard


def test_import_next_to_pydantic_graph_2_explains_the_range(tmp_path: Path) -> None:
    fake = tmp_path / "site"
    (fake / "pydantic_graph").mkdir(parents=True)
    (fake / "pydantic_graph" / "__init__.py").write_text("")
    info = fake / "pydantic_graph-2.68.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pydantic-graph\nVersion: 2.68.0\n")
    code = textwrap.dedent("""
        try:
            import remit_pydantic_graph
        except ImportError as exc:
            print("ImportError:", exc)
        else:
            print("imported")
    """)
    env = {**os.environ, "PYTHONPATH": f"{fake}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.startswith("ImportError:"), out.stdout + out.stderr
    assert "pydantic-graph>=1.0,<2" in out.stdout and "2.68.0" in out.stdout
    assert "removed the persistence API" in out.stdout


def test_import_emits_no_deprecation_warning() -> None:
    """remit imports pydantic-graph 1.x only from paths that do not warn (>=1.97 deprecates
    the top-level runner imports), so `-W error` test suites keep working."""
    out = subprocess.run([sys.executable, "-W", "error", "-c", "import remit_pydantic_graph"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
