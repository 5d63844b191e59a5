"""More of the resume contract on LangGraph: a SIGKILL sweep over every saver call,
code before interrupt(), durability modes, subgraphs / Send / the functional API,
CV on pydantic and dataclass states and reducer fields, and recovery determinism.

Every run that matters for a crash or a race happens in its own OS process,
forked from one zygote per module (see ``lg_more_workers``); the oracle is a
ledger file. Fault switches, set for the whole pytest run:

* ``REMIT_TEST_BREAK=langgraph-gate``: no consume-once gate -> the race tests fail.
* ``REMIT_TEST_BREAK=langgraph-receipts``: effects run without receipts -> the kill
  sweep and the other EO tests fail.
* ``REMIT_TEST_BREAK=langgraph-ids``: the loop's checkpoints keep LangGraph's uuid6
  ids -> the RD id tests fail.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command

from remit_langgraph import ConsumeConflict, RemitError, RemitSaver, StateValidationError
from tests.langgraph import lg_more_workers as w

APIS = ("invoke", "ainvoke", "stream", "astream")


# ================================================================================ fixtures


@pytest.fixture(scope="module")
def zygote_proc() -> Iterator[w.Zygote]:
    with w.zygote() as z:
        yield z


@pytest.fixture
def zyg(zygote_proc: w.Zygote) -> Iterator[w.Zygote]:
    yield zygote_proc
    zygote_proc.cleanup()  # a failed test may leave a child blocked: kill it by pid


def lines(ledger: Path) -> list[str]:
    return ledger.read_text().splitlines() if ledger.exists() else []


def fired(entries: list[str], name: str) -> list[str]:
    """The ``effect <name> ...`` lines: one per real call of the effect."""
    return [x for x in entries if x.startswith(f"effect {name} ")]


def count(entries: list[str], prefix: str) -> int:
    return sum(x.startswith(prefix) for x in entries)


def recover_after_lease(zyg: w.Zygote, *args: Any, deadline: float = 60.0,
                        **kwargs: Any) -> Any:
    """``invoke(None)`` in a fresh process, retried while the dead owner's claim
    lease runs (LV: it must succeed once the lease is over)."""
    end = time.monotonic() + deadline
    while True:
        msg = zyg.outcome("recover", *args, **kwargs)
        if msg[0] == "result":
            return msg[1]
        assert msg[1] == "ConsumeConflict", msg
        assert time.monotonic() < end, f"no takeover within {deadline} s: {msg[2]}"
        time.sleep(0.2)


def race(zyg: w.Zygote, url: str, kind: str, thread: str, ledger: Path,
         apis: tuple[str, ...], durability: str | None = None) -> list[tuple[Any, ...]]:
    """len(apis) processes resume one parked interrupt with values 100, 101, ...;
    all are connected and waiting before one message releases them together."""
    racers = [zyg.start("resume", url, kind, thread, str(ledger), 100 + i, api=api,
                        durability=durability, wait_go=True)
              for i, api in enumerate(apis)]
    for r in racers:
        assert r.recv() == ("ready",)
    zyg.release(racers)
    return [r.finish() for r in racers]


def check_one_winner(outcomes: list[tuple[Any, ...]], entries: list[str], node: str,
                     k: int) -> int:
    """Exactly one racer proceeded; the others raised ConsumeConflict; no code after the
    interrupt ran in a loser. Returns the winner's value."""
    verdicts = Counter(o[0] if o[0] == "result" else o[1] for o in outcomes)
    assert verdicts == Counter(result=1, ConsumeConflict=k - 1), outcomes
    after = [x for x in entries if x.startswith(f"after-interrupt {node} ")]
    assert len(after) == 1, entries
    value = int(after[0].split()[2])
    assert value in range(100, 100 + k)
    return value


# ============================================================= 1. EO: the kill-point sweep


SWEEP_COMBOS = [("invoke", "sync"), ("invoke", "async"), ("ainvoke", "sync"), ("ainvoke", "async")]


def _durable(crash: list[str]) -> dict[str, bool]:
    """Which node's completion the crashed process made durable, from its saver log:
    the node's writes, or a later checkpoint (a runs in step 0, b in step 1)."""
    calls = [x.split(maxsplit=2)[2] for x in crash if x.startswith("saver ")]
    puts = [int(c.split()[1]) for c in calls if c.startswith("put ")]
    return {
        "a": "put_writes a" in calls or any(s >= 1 for s in puts),
        "b": "put_writes b" in calls or any(s >= 2 for s in puts),
    }


@pytest.mark.slow
@pytest.mark.parametrize(("api", "durability"), SWEEP_COMBOS,
                         ids=[f"{a}-{d}" for a, d in SWEEP_COMBOS])
def test_eo_kill_sweep(zyg: w.Zygote, store_url: str, tmp_path: Path, api: str,
                       durability: str) -> None:
    """SIGKILL after each put/put_writes of a run (and inside each node right after its
    effect), then invoke(None) in a fresh process: every effect fired exactly once,
    no durably completed node ran again, the final state is the uncrashed one. (Under
    "async" the input task's writes may be stored before the input checkpoint; a crash
    between leaves no checkpoint, and the recovery starts over with the input.)"""
    base_ledger = tmp_path / "base.txt"
    base = zyg.run("eo_run", store_url, "base", str(base_ledger), api, durability)
    total = base["calls"]
    entries = lines(base_ledger)
    saver_calls = [x.split(maxsplit=2)[2] for x in entries if x.startswith("saver ")]
    assert total == len(saver_calls) == 7, entries  # 3 checkpoints of the loop + input, 3 writes
    assert count(saver_calls, "put ") == 4 and count(saver_calls, "put_writes ") == 3
    assert len(fired(entries, "pay")) == len(fired(entries, "ship")) == 1
    assert base["values"] == {"x": 11, "log": "pay-1,ship-11"} and base["next"] == []

    failures = []
    for point in [*range(1, total + 1), "in-a", "in-b"]:
        thread = f"k-{point}"
        crash_ledger, rec_ledger = tmp_path / f"{thread}.crash", tmp_path / f"{thread}.rec"
        kill = {"kill_at": point} if isinstance(point, int) else {"kill_in": point}
        job = zyg.start("eo_run", store_url, thread, str(crash_ledger), api, durability, **kill)
        msg = job.recv()
        assert msg[0] == "reached", msg
        job.kill()
        crash = lines(crash_ledger)
        rec = zyg.run("eo_run", store_url, thread, str(rec_ledger), api, durability,
                      recover=True)
        after = lines(rec_ledger)
        problems = []
        for name in ("pay", "ship"):
            n = len(fired(crash + after, name))
            if n != 1:
                problems.append(f"{name} fired {n}x")
        for node, durable in _durable(crash).items():
            if count(after, f"enter {node}") != (0 if durable else 1):
                problems.append(f"{node} durable={durable} but entered "
                                f"{count(after, f'enter {node}')}x in recovery")
        if (rec["values"], rec["next"]) != (base["values"], []):
            problems.append(f"final {rec['values']} {rec['next']}")
        if problems:
            failures.append((point, msg[2], problems, crash, after))
    assert not failures, "\n".join(f"kill after {p} ({what}): {pr}\n  crash={c}\n  rec={r}"
                                   for p, what, pr, c, r in failures)


# =============================================== 2. code before interrupt() re-runs, EO holds


@pytest.mark.parametrize("api", APIS)
def test_code_before_interrupt_reruns_but_effects_replay(zyg: w.Zygote, store_url: str,
                                                         tmp_path: Path, api: str) -> None:
    ledger = tmp_path / "ledger.txt"
    parked = zyg.run("park", store_url, "pre", "t", str(ledger), api=api)
    assert parked["next"] == ["b"] and parked["interrupts"] == [
        {"question": "approve?", "prep": "prepare-1"}]
    done = zyg.run("resume", store_url, "pre", "t", str(ledger), 5, api=api)
    assert done["values"] == {"x": 6, "log": "charge-5!"} and done["next"] == []
    entries = lines(ledger)
    assert count(entries, "enter b") == 2, entries  # LangGraph re-runs the node body ...
    (prep,) = fired(entries, "prepare")  # ... but the effect before interrupt() replays
    assert prep.startswith("effect prepare 1 t|b:")
    assert len(fired(entries, "charge")) == 1 and count(entries, "after-interrupt b 5") == 1
    assert count(entries, "enter c") == 1


# ======================================================================== 3. durability modes


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_race_and_late_resume_under_durability(zyg: w.Zygote, store_url: str, tmp_path: Path,
                                               durability: str) -> None:
    """CO (+ EO where effects are allowed) under each durability: 2 racers (one sync
    API, one async API) -> one proceeds; a later third resume is refused and stores
    nothing. 'exit' refuses effects, so it runs the same graph without them."""
    ledger = tmp_path / "ledger.txt"
    kind = "plain" if durability == "exit" else "pre"
    zyg.run("park", store_url, kind, "r", str(ledger), durability=durability)
    outcomes = race(zyg, store_url, kind, "r", ledger, ("invoke", "ainvoke"), durability)
    entries = lines(ledger)
    value = check_one_winner(outcomes, entries, "b", 2)
    if kind == "pre":
        assert len(fired(entries, "prepare")) == 1
        assert [x.split()[:3] for x in fired(entries, "charge")] == [
            ["effect", "charge", str(value)]]
    assert count(entries, "enter c") == 1
    with RemitSaver.from_conn_string(store_url) as saver:
        app = w.app_for(kind, str(ledger), saver)
        cfg = w.cfg_of("r")
        before = [(c.config, c.pending_writes) for c in saver.list(cfg)]
        with pytest.raises(ConsumeConflict, match="no pending interrupt"):
            w.drive(app, "invoke", Command(resume=7), cfg, durability)
        assert [(c.config, c.pending_writes) for c in saver.list(cfg)] == before
        assert app.get_state(cfg).values == {
            "x": 1 + value, "log": f"charge-{value}!" if kind == "pre" else "!"}
        assert [c.status for c in saver.store.list_claims("r")] == ["consumed"]
    assert count(lines(ledger), "after-interrupt") == 1


@pytest.mark.parametrize("api", ["invoke", "ainvoke"])
def test_exit_durability_refuses_effects(store_url: str, tmp_path: Path, api: str) -> None:
    """An @effect under durability='exit' is refused with a RemitError before it fires;
    the run stays resumable with a durability that keeps receipts."""
    ledger = tmp_path / "ledger.txt"
    with RemitSaver.from_conn_string(store_url) as saver:
        app = w.pre_graph(str(ledger)).compile(checkpointer=saver)
        cfg = w.cfg_of("x")
        with pytest.raises(RemitError, match="durability='exit'"):
            w.drive(app, api, {"x": 1, "log": ""}, cfg, "exit")
        assert fired(lines(ledger), "prepare") == []
        state = app.get_state(cfg)
        assert state.values == {"x": 1, "log": ""} and state.next == ("b",)
        parked = w.drive(app, api, None, cfg, "sync")
        assert parked["interrupts"] == [{"question": "approve?", "prep": "prepare-1"}]
        done = w.drive(app, api, Command(resume=2), cfg, "sync")
        assert done["values"] == {"x": 3, "log": "charge-2!"}
    entries = lines(ledger)
    assert len(fired(entries, "prepare")) == 1 and len(fired(entries, "charge")) == 1


@pytest.mark.parametrize("api", ["invoke", "ainvoke"])
def test_exit_durability_keeps_consume_once(store_url: str, tmp_path: Path, api: str) -> None:
    ledger = tmp_path / "ledger.txt"
    with RemitSaver.from_conn_string(store_url) as saver:
        app = w.plain_graph(str(ledger)).compile(checkpointer=saver)
        cfg = w.cfg_of("x")
        assert w.drive(app, api, {"x": 1, "log": ""}, cfg, "exit")["interrupts"] == ["approve?"]
        assert w.drive(app, api, Command(resume=5), cfg, "exit")["values"] == {
            "x": 6, "log": "!"}
        before = [(c.config, c.pending_writes) for c in saver.list(cfg)]
        with pytest.raises(ConsumeConflict, match="no pending interrupt"):
            w.drive(app, api, Command(resume=6), cfg, "exit")
        assert [(c.config, c.pending_writes) for c in saver.list(cfg)] == before
        assert [c.status for c in saver.store.list_claims("x")] == ["consumed"]
    assert [x.split()[:3] for x in lines(ledger) if x.startswith("after")] == [
        ["after-interrupt", "b", "5"]]


# ================================================= 4. subgraphs, Send fan-out, functional API

CRASH_EXPECTED: dict[str, Callable[[int], Any]] = {
    "sub": lambda v: {"x": 2 + v, "log": f"charge-{v}!"},
    "send": lambda v: {"x": 200, "items": ["pay-b0", "pay-b1", f"charge-{v}"]},
    "func": lambda v: {"x": 1 + v, "log": f"charge-{v}"},
}
GATED_NODE = {"sub": "inner", "send": "branch1", "func": "workflow"}
DOWNSTREAM = {"sub": "enter c", "send": "enter join", "func": "enter pay"}
BEFORE_EFFECTS = {"sub": ["prepare"], "send": ["pay"], "func": ["prepare"]}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sub", "send", "func"])
def test_coverage_effect_once_across_resume_and_sigkill(zyg: w.Zygote, store_url: str,
                                                        tmp_path: Path, kind: str) -> None:
    """Park; resume in a process killed right after the gated effect; recover in a fresh
    process: every effect fired once (the ones before interrupt() across the resume,
    the gated one across the crash), the final state is the expected one."""
    ledger = tmp_path / "ledger.txt"
    api = {"sub": "invoke", "send": "astream", "func": "ainvoke"}[kind]
    zyg.run("park", store_url, kind, "eo", str(ledger), api=api)
    job = zyg.start("resume", store_url, kind, "eo", str(ledger), 7, api=api, hang=True,
                    lease=1.0)
    assert job.recv()[:2] == ("reached", "charged")
    job.kill()
    final = recover_after_lease(zyg, store_url, kind, "eo", str(ledger), api=api)
    assert final["values"] == CRASH_EXPECTED[kind](7) and final["next"] == []
    entries = lines(ledger)
    for name in BEFORE_EFFECTS[kind]:
        assert len(fired(entries, name)) == (2 if kind == "send" else 1), entries
    if kind == "send":  # one per branch, each with its own receipt key
        assert sorted(x.split()[2] for x in fired(entries, "pay")) == ["b0", "b1"]
    assert [x.split()[:3] for x in fired(entries, "charge")] == [["effect", "charge", "7"]]
    # the task killed mid-body (func: the @task itself) re-runs; what follows it runs once
    assert count(entries, DOWNSTREAM[kind]) == (2 if kind == "func" else 1)


@pytest.mark.parametrize("kind", ["sub", "send", "func"])
def test_coverage_two_racers_one_proceeds(zyg: w.Zygote, store_url: str, tmp_path: Path,
                                          kind: str) -> None:
    ledger = tmp_path / "ledger.txt"
    parked = zyg.run("park", store_url, kind, "co", str(ledger))
    assert len(parked["interrupts"]) == 1
    apis = {"sub": ("invoke", "astream"), "send": ("stream", "ainvoke"),
            "func": ("ainvoke", "invoke")}[kind]
    outcomes = race(zyg, store_url, kind, "co", ledger, apis)
    entries = lines(ledger)
    value = check_one_winner(outcomes, entries, GATED_NODE[kind], 2)
    (winner,) = [o[1] for o in outcomes if o[0] == "result"]
    assert winner["values"] == CRASH_EXPECTED[kind](value) and winner["next"] == []
    assert [x.split()[:3] for x in fired(entries, "charge")] == [
        ["effect", "charge", str(value)]]
    assert count(entries, DOWNSTREAM[kind]) == 1
    for name in BEFORE_EFFECTS[kind]:
        assert len(fired(entries, name)) == (2 if kind == "send" else 1), entries
    for loser in (o for o in outcomes if o[0] != "result"):
        assert loser[3]["run_id"] == "co"


# ======================================================================================= 5. CV


def cv_graph(schema: Any, broken: dict[str, bool]) -> StateGraph:
    def get_x(s: Any) -> int:
        return int(s["x"] if isinstance(s, dict) else s.x)

    def ok(s: Any) -> dict[str, Any]:
        return {"x": get_x(s) + 1}

    def bad(s: Any) -> dict[str, Any]:
        return {"x": "not a number" if broken["on"] else get_x(s) * 10}

    g = StateGraph(schema)
    g.add_node("ok", ok)
    g.add_node("bad", bad)
    g.add_edge(START, "ok")
    g.add_edge("ok", "bad")
    g.add_edge("bad", END)
    return g


@pytest.mark.parametrize("durability", ["sync", "async"])
@pytest.mark.parametrize("schema", [w.PState, w.DState], ids=["pydantic", "dataclass"])
def test_invalid_state_refused_for_model_states(store_url: str, schema: Any,
                                                durability: str) -> None:
    broken = {"on": True}
    with RemitSaver.from_conn_string(store_url, schema=schema) as saver:
        app = cv_graph(schema, broken).compile(checkpointer=saver)
        cfg = w.cfg_of("cv")
        with pytest.raises(StateValidationError) as info:
            w.drive(app, "invoke", {"x": 1, "log": ""}, cfg, durability)
        assert info.value.field == "x" and "'bad'" in str(info.value.step)
        assert info.value.run_id == "cv" and "'bad'" in str(info.value)
        state = app.get_state(cfg)
        assert dict(state.values) == {"x": 2, "log": ""} and state.next == ("bad",)
        for ck in saver.list(cfg):
            assert ck.checkpoint["channel_values"].get("x") != "not a number"
            assert all(v != "not a number" for (_, _, v) in ck.pending_writes or [])
        broken["on"] = False
        assert w.drive(app, "ainvoke", None, cfg, durability)["values"] == {"x": 20, "log": ""}


@pytest.mark.parametrize("source", ["builder", "compiled"])
def test_schema_taken_from_the_graph(store_url: str, source: str) -> None:
    """schema= may name the StateGraph (or a compiled graph) instead of its state class."""
    broken = {"on": True}
    builder = cv_graph(w.PState, broken)
    given = builder if source == "builder" else builder.compile()
    with RemitSaver.from_conn_string(store_url, schema=given) as saver:
        assert saver._schema is not None and saver._schema.schema is w.PState
        app = builder.compile(checkpointer=saver)
        cfg = w.cfg_of("cv-graph")
        with pytest.raises(StateValidationError) as info:
            app.invoke({"x": 1, "log": ""}, cfg, durability="sync")  # type: ignore[arg-type]
        assert info.value.field == "x" and "'bad'" in str(info.value.step)
        assert dict(app.get_state(cfg).values) == {"x": 2, "log": ""}


@pytest.mark.parametrize("api", ["invoke", "ainvoke"])
def test_invalid_state_under_exit_durability(store_url: str, api: str) -> None:
    """'exit' stores nothing until the run ends, so the one checkpoint it would store is
    refused and the run leaves nothing behind (the error names the step, as put_writes
    never saw the node's write); a fixed graph then starts over from the input."""
    broken = {"on": True}
    with RemitSaver.from_conn_string(store_url, schema=w.PState) as saver:
        app = cv_graph(w.PState, broken).compile(checkpointer=saver)
        cfg = w.cfg_of("cv-exit")
        with pytest.raises(StateValidationError) as info:
            w.drive(app, api, {"x": 1, "log": ""}, cfg, "exit")
        assert info.value.field == "x" and info.value.run_id == "cv-exit"
        assert str(info.value.step).startswith("step ")
        assert list(saver.list(cfg)) == [] and app.get_state(cfg).values == {}
        broken["on"] = False
        done = w.drive(app, api, {"x": 1, "log": ""}, cfg, "exit")
        assert done["values"] == {"x": 20, "log": ""}


def reducer_graph(bad_item: Any) -> StateGraph:
    g = StateGraph(w.RState)
    g.add_node("ok", lambda s: {"x": s["x"] + 1, "items": [1]})
    g.add_node("bad", lambda s: {"items": [bad_item]})
    g.add_node("after", lambda s: {"x": s["x"] * 10})
    g.add_edge(START, "ok")
    g.add_edge("ok", "bad")
    g.add_edge("bad", "after")
    g.add_edge("after", END)
    return g


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_reducer_field_wrong_element_caught_at_checkpoint(store_url: str,
                                                          durability: str) -> None:
    with RemitSaver.from_conn_string(store_url, schema=w.RState) as saver:
        app = reducer_graph("oops").compile(checkpointer=saver)
        cfg = w.cfg_of("red")
        with pytest.raises(StateValidationError) as info:
            app.invoke({"x": 1, "items": []}, cfg, durability=durability)  # type: ignore[arg-type]
        # the write is refused on its own (folded into the stored list, which under
        # "async" durability may not be stored yet: then the bad element is items[0])
        assert info.value.field in ("items[0]", "items[1]") and info.value.run_id == "red"
        assert "'bad'" in str(info.value.step)
        stored = [ck.checkpoint["channel_values"] for ck in saver.list(cfg)]
        assert stored[0]["items"] == [1]  # the latest stored checkpoint is the last valid one
        assert all("oops" not in v.get("items", []) for v in stored)


def _checkpoint(values: dict[str, Any], versions: dict[str, int]) -> Any:
    return {**empty_checkpoint(), "channel_values": values,
            "channel_versions": {ch: str(v) for ch, v in versions.items()}}


def test_what_langgraph_puts_after_a_refused_checkpoint_is_refused_too(store_url: str) -> None:
    """LangGraph before 1.2.15, under durability="async", still puts the next checkpoint
    (and writes against the refused one) after a refused put: its loop issues the next
    put in a ``finally:``. Both name the refused checkpoint and get its refusal."""
    with RemitSaver.from_conn_string(store_url, schema=w.RState) as saver:
        cfg: Any = {"configurable": {"thread_id": "orphan", "checkpoint_ns": ""}}
        good = _checkpoint({"x": 1, "items": [1]}, {"x": 1, "items": 1})
        stored = saver.put(cfg, good, {"source": "loop", "step": 0}, {"x": "1", "items": "1"})
        bad = _checkpoint({"x": "many", "items": [1]}, {"x": 2, "items": 1})
        with pytest.raises(StateValidationError) as refused:
            saver.put(stored, bad, {"source": "loop", "step": 1}, {"x": "2"})
        assert refused.value.field == "x" and refused.value.run_id == "orphan"
        on_bad: Any = {"configurable": {**stored["configurable"], "checkpoint_id": bad["id"]}}
        with pytest.raises(StateValidationError) as writes:
            saver.put_writes(on_bad, [("x", 3)], "task-after")
        child = _checkpoint({"x": 3, "items": [1]}, {"x": 3, "items": 1})
        with pytest.raises(StateValidationError) as put:
            saver.put(on_bad, child, {"source": "loop", "step": 2}, {"x": "3"})
        assert writes.value is refused.value and put.value is refused.value
        assert [t.checkpoint["id"] for t in saver.list(cfg)] == [good["id"]]
        grandchild: Any = {"configurable": {**stored["configurable"], "checkpoint_id": child["id"]}}
        with pytest.raises(StateValidationError):  # the refusal is passed down the chain
            saver.put(grandchild, _checkpoint({"x": 4}, {"x": 4}),
                      {"source": "loop", "step": 3}, {"x": "4"})
        # the thread goes on from its last valid checkpoint
        fixed = _checkpoint({"x": 5, "items": [1]}, {"x": 5, "items": 1})
        saver.put(stored, fixed, {"source": "loop", "step": 1}, {"x": "5"})
        latest = saver.get_tuple(cfg)
        assert latest is not None and latest.checkpoint["channel_values"] == {"x": 5, "items": [1]}


def test_reducer_field_invalid_write_leaves_thread_resumable(store_url: str) -> None:
    with RemitSaver.from_conn_string(store_url, schema=w.RState) as saver:
        cfg = w.cfg_of("red")
        with pytest.raises(StateValidationError):
            reducer_graph("oops").compile(checkpointer=saver).invoke(
                {"x": 1, "items": []}, cfg, durability="sync")  # type: ignore[arg-type]
        fixed = reducer_graph(7).compile(checkpointer=saver)
        state = fixed.get_state(cfg)
        pending = [v for ck in saver.list(cfg) for (_, _, v) in ck.pending_writes or []]
        assert ["oops"] not in pending
        assert state.values == {"x": 2, "items": [1]} and state.next == ("bad",)
        assert fixed.invoke(None, cfg, durability="sync") == {"x": 20, "items": [1, 7]}  # type: ignore[arg-type]


# ================================================================ 6. recovery determinism (RD)


def _copy_sqlite(src: Path, dst: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{src}{suffix}").exists():
            shutil.copyfile(f"{src}{suffix}", f"{dst}{suffix}")


def recover_copies(zyg: w.Zygote, tmp: Path, kill_in: str) -> dict[str, Any]:
    """One crashed sqlite store (killed at ``kill_in``, right after that node's effect,
    async durability), copied twice (db + -wal + -shm); each copy recovered in a fresh
    process."""
    db = tmp / "crashed.db"
    job = zyg.start("eo_run", f"sqlite:///{db}", "rd", str(tmp / "crash.txt"),
                    "invoke", "async", kill_in=kill_in)
    assert job.recv()[0] == "reached"
    job.kill()
    for name in ("one", "two"):  # before anything else opens the crashed files
        _copy_sqlite(db, tmp / f"{name}.db")
    crashed = zyg.run("inspect_state", f"sqlite:///{db}", "eo", "rd")
    out: dict[str, Any] = {"crash": lines(tmp / "crash.txt"), "crashed_ids": crashed["ids"]}
    for name in ("one", "two"):
        rec = zyg.run("eo_run", f"sqlite:///{tmp / name}.db", "rd",
                      str(tmp / f"{name}.txt"), "invoke", "async", recover=True)
        out[name] = {**rec, "ledger": lines(tmp / f"{name}.txt")}
    return out


@pytest.fixture(scope="module")
def rd_recoveries(zygote_proc: w.Zygote, tmp_path_factory: pytest.TempPathFactory
                  ) -> dict[str, Any]:
    """Killed inside b, the last node: a recovery re-runs b and writes one checkpoint."""
    return recover_copies(zygote_proc, tmp_path_factory.mktemp("rd"), "in-b")


@pytest.fixture(scope="module")
def rd_recoveries_in_a(zygote_proc: w.Zygote, tmp_path_factory: pytest.TempPathFactory
                       ) -> dict[str, Any]:
    """Killed inside a: a recovery re-runs a, then runs b for the first time from a
    checkpoint it wrote itself."""
    return recover_copies(zygote_proc, tmp_path_factory.mktemp("rd-a"), "in-a")


def test_recovery_is_deterministic_on_copies(rd_recoveries: dict[str, Any]) -> None:
    """sqlite file copies only: RD needs two independent recoveries of one durable
    state, and the test's PostgreSQL schema / Redis prefix isolation cannot clone one."""
    one, two, crash = rd_recoveries["one"], rd_recoveries["two"], rd_recoveries["crash"]
    assert len(fired(crash, "pay")) == len(fired(crash, "ship")) == 1
    steps = [[x for x in r["ledger"] if not x.startswith("saver ")] for r in (one, two)]
    assert steps[0] == steps[1] == ["enter b"]  # the same node re-run, nothing else
    assert fired(one["ledger"], "ship") == fired(two["ledger"], "ship") == []  # replayed
    assert one["values"] == two["values"] == {"x": 11, "log": "pay-1,ship-11"}
    saver_calls = [sorted(x.split(maxsplit=2)[2] for x in r["ledger"] if x.startswith("saver "))
                   for r in (one, two)]
    assert saver_calls[0] == saver_calls[1]
    new = [[i for i in r["checkpoint_ids"] if i not in rd_recoveries["crashed_ids"]]
           for r in (one, two)]
    assert len(new[0]) == len(new[1]) >= 1


def test_recovery_checkpoint_ids_are_deterministic(rd_recoveries: dict[str, Any]) -> None:
    new = [[i for i in rd_recoveries[n]["checkpoint_ids"] if i not in
            rd_recoveries["crashed_ids"]] for n in ("one", "two")]
    assert new[0] == new[1]


def test_recovery_ids_hold_across_supersteps(rd_recoveries_in_a: dict[str, Any]) -> None:
    """RD over two supersteps: b runs from a checkpoint the recovery itself wrote, so
    its task id, and with it the idempotency key of its effect, is the same in both
    recoveries only if that checkpoint's id is."""
    rd = rd_recoveries_in_a
    one, two, crash = rd["one"], rd["two"], rd["crash"]
    assert len(fired(crash, "pay")) == 1 and fired(crash, "ship") == []
    steps = [[x for x in r["ledger"] if not x.startswith(("saver ", "effect "))]
             for r in (one, two)]
    assert steps[0] == steps[1] == ["enter a", "more work a", "enter b"]
    assert fired(one["ledger"], "pay") == fired(two["ledger"], "pay") == []  # replayed
    assert len(fired(one["ledger"], "ship")) == 1
    assert fired(one["ledger"], "ship") == fired(two["ledger"], "ship")  # same key
    assert one["values"] == two["values"] == {"x": 11, "log": "pay-1,ship-11"}
    new = [[i for i in r["checkpoint_ids"] if i not in rd["crashed_ids"]] for r in (one, two)]
    assert len(new[0]) >= 2
    assert new[0] == new[1]
