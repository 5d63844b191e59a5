"""The resume contract on LangGraph, with real processes, a barrier and SIGKILL.

REMIT_TEST_BREAK=langgraph-gate switches the consume-once gate off (the saver
behaves like a stock one) to show that the race test fails without it.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from langgraph.types import Command

from remit_langgraph import ConsumeConflict, RemitSaver
from tests import procs
from tests.langgraph import lg_workers as w

CTX = procs.CTX


def park_then_kill_resumer(store_url: str, thread: str, value: int, ledger: Path) -> None:
    """Park the thread, resume it with ``value`` in a child that claims, fires its gated
    effect and reports; SIGKILL the child there."""
    w.park(store_url, thread, str(ledger))
    parent, child = CTX.Pipe()
    proc = CTX.Process(target=w.resume_and_hang,
                       args=(store_url, thread, value, str(ledger), child))
    proc.start()
    assert parent.poll(120) and parent.recv() == "charged"
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(timeout=30)
    assert proc.exitcode == -signal.SIGKILL


def recover_after_lease(store_url: str, thread: str, ledger: Path) -> Any:
    """invoke(None) in fresh processes until the dead owner's lease (1 s) has run out and
    recovery takes the claim over (a live claim answers ConsumeConflict)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            with CTX.Pool(1) as pool:
                return pool.apply(w.recover, (store_url, thread, str(ledger)))
        except ConsumeConflict:
            assert time.monotonic() < deadline


def lines(ledger: Path) -> list[str]:
    return ledger.read_text().splitlines() if ledger.exists() else []


@pytest.mark.slow
@pytest.mark.parametrize("use_map", [False, True], ids=["plain", "resume-map"])
def test_k8_racers_one_proceeds(store_url: str, tmp_path: Path, use_map: bool) -> None:
    k = 8
    ledger = tmp_path / "ledger.txt"
    parked = w.park(store_url, "race", str(ledger))
    assert "__interrupt__" in parked
    barrier = CTX.Barrier(k + 1)
    results = CTX.Queue()
    procs = [CTX.Process(target=w.resume_racer,
                         args=(store_url, "race", 100 + i, str(ledger), barrier, results, use_map))
             for i in range(k)]
    procs.append(CTX.Process(target=w.reader, args=(store_url, "race", barrier, results, 20)))
    for p in procs:
        p.start()
    got = [results.get(timeout=180) for _ in range(k + 1)]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    verdicts = Counter(g[0] for g in got)
    assert verdicts == Counter(ok=1, conflict=k - 1, reader=1), got
    (winner,) = [g for g in got if g[0] == "ok"]
    entries = lines(ledger)
    after = [x for x in entries if x.startswith("after-interrupt B")]
    assert after == [f"after-interrupt B {winner[1]} " + after[0].split()[-1]], entries
    assert sum(x.startswith("enter C") for x in entries) == 1
    assert sum(x.startswith("effect charge") for x in entries) == 1
    assert sum(x.startswith("effect prepare") for x in entries) == 1  # replayed on resume
    with RemitSaver.from_conn_string(store_url) as saver:
        app = w.build(os.devnull).compile(checkpointer=saver)
        state = app.get_state({"configurable": {"thread_id": "race"}})
        assert state.values["log"] == f"txn-{winner[1]}!"
        # nothing of the losers is stored: the history holds exactly one resume value
        resumes = [v for ck in saver.list({"configurable": {"thread_id": "race"}})
                   for (_, ch, v) in ck.pending_writes or [] if ch == "__resume__"]
        assert all(v in (winner[1], [winner[1]]) or v == {} or
                   (isinstance(v, dict) and list(v.values()) == [winner[1]]) for v in resumes), resumes


def test_late_second_resume_is_refused(store_url: str, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    w.park(store_url, "t", str(ledger))
    with RemitSaver.from_conn_string(store_url) as saver:
        app = w.build(str(ledger)).compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": "t"}}
        done = app.invoke(Command(resume=5), cfg)
        before = [(c.config, c.pending_writes) for c in saver.list(cfg)]
        with pytest.raises(ConsumeConflict, match="no pending interrupt"):
            app.invoke(Command(resume=6), cfg)
        assert [(c.config, c.pending_writes) for c in saver.list(cfg)] == before
        assert app.get_state(cfg).values == {k: v for k, v in done.items()}
    assert sum(x.startswith("after-interrupt B") for x in lines(ledger)) == 1


def test_reads_take_no_claim(store_url: str, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    w.park(store_url, "t", str(ledger))
    with RemitSaver.from_conn_string(store_url) as saver:
        app = w.build(str(ledger)).compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": "t"}}
        for _ in range(3):
            assert app.get_state(cfg).next == ("b",)
            list(app.get_state_history(cfg))
        assert saver.store.list_claims("t") == []
        app.invoke(Command(resume=1), cfg)
        assert [c.status for c in saver.store.list_claims("t")] == ["consumed"]


@pytest.mark.slow
def test_owner_dies_after_claiming(store_url: str, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    park_then_kill_resumer(store_url, "lv", 7, ledger)
    with RemitSaver.from_conn_string(store_url) as saver:
        app = w.build(str(ledger)).compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": "lv"}}
        with pytest.raises(ConsumeConflict):  # a different value never replaces the claimed one
            app.invoke(Command(resume=8), cfg)
    final = recover_after_lease(store_url, "lv", ledger)
    assert final["x"] == 2 + 7 and final["log"] == "txn-7!"
    entries = lines(ledger)
    assert sum(x.startswith("effect charge 7") for x in entries) == 1  # replayed from receipt
    assert sum(x.startswith("enter C") for x in entries) == 1


@pytest.mark.slow
def test_recovery_waits_for_the_take_over_with_wait(store_url: str, tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    """With the store's wait= option one invoke(None) waits out the dead owner's lease
    and finishes with its value, no retry loop; the warning names the dead owner and the
    one that takes over."""
    ledger = tmp_path / "ledger.txt"
    park_then_kill_resumer(store_url, "wait", 7, ledger)
    with RemitSaver.from_conn_string(store_url, wait=30) as saver:
        (dead,) = [c.owner for c in saver.store.list_claims("wait") if c.status == "claimed"]
        app = w.build(str(ledger)).compile(checkpointer=saver)
        with caplog.at_level("WARNING", logger="remit"):
            final = app.invoke(None, {"configurable": {"thread_id": "wait"}})
        (claim,) = saver.store.list_claims("wait")
    assert final["x"] == 2 + 7 and final["log"] == "txn-7!"
    (record,) = [r for r in caplog.records if "takes over the resume" in r.getMessage()]
    assert dead in record.getMessage() and claim.owner in record.getMessage()
    assert claim.owner != dead and claim.status == "consumed"


def test_fork_flag_bypasses_gate_and_uses_its_own_value(store_url: str, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    w.park(store_url, "f", str(ledger))
    with RemitSaver.from_conn_string(store_url) as saver:
        app = w.build(str(ledger)).compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": "f"}}
        parked_cfg = app.get_state(cfg).config
        assert app.invoke(Command(resume=1), cfg)["x"] == 3
        with pytest.raises(ConsumeConflict):  # retry without the fork flag
            app.invoke(Command(resume=2), parked_cfg)
        fork_cfg = {"configurable": {**parked_cfg["configurable"], "remit_fork": True}}
        out: dict[str, Any] = app.invoke(Command(resume=2), fork_cfg)
        assert out["x"] == 4  # its own value, not the 1 recorded by the first resume


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_invalid_state_is_never_saved(store_url: str, durability: str) -> None:
    from langgraph.graph import END, START, StateGraph

    from remit_langgraph import StateValidationError

    broken = {"on": True}

    def ok(s: w.State) -> dict[str, Any]:
        return {"x": s["x"] + 1}

    def bad(s: w.State) -> dict[str, Any]:
        return {"x": "not a number" if broken["on"] else s["x"] * 10}

    g = StateGraph(w.State)
    g.add_node("ok", ok)
    g.add_node("bad", bad)
    g.add_edge(START, "ok")
    g.add_edge("ok", "bad")
    g.add_edge("bad", END)
    with RemitSaver.from_conn_string(store_url, schema=w.State) as saver:
        app = g.compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": "cv"}}
        with pytest.raises(StateValidationError) as info:
            app.invoke({"x": 1, "log": ""}, cfg, durability=durability)  # type: ignore[arg-type]
        assert info.value.field == "x" and "'bad'" in str(info.value.step)
        assert info.value.run_id == "cv"
        state = app.get_state(cfg)
        assert state.values == {"x": 2, "log": ""} and state.next == ("bad",)
        for ck in saver.list(cfg):
            assert ck.checkpoint["channel_values"].get("x") != "not a number"
            assert all(v != "not a number" for (_, _, v) in ck.pending_writes or [])
        broken["on"] = False
        assert app.invoke(None, cfg, durability=durability) == {"x": 20, "log": ""}  # type: ignore[arg-type]


@pytest.mark.slow
def test_effect_fires_once_across_sigkill(store_url: str, tmp_path: Path) -> None:
    """SIGKILL inside B after its gated effect; recovery replays the effect."""
    ledger = tmp_path / "ledger.txt"
    park_then_kill_resumer(store_url, "eo", 3, ledger)
    final = recover_after_lease(store_url, "eo", ledger)
    clean = tmp_path / "clean.txt"
    w.park(store_url, "eo-clean", str(clean))
    with RemitSaver.from_conn_string(store_url) as saver:
        app = w.build(str(clean)).compile(checkpointer=saver)
        uncrashed = app.invoke(Command(resume=3), {"configurable": {"thread_id": "eo-clean"}})
    assert final == uncrashed
    assert [x.split()[:3] for x in lines(ledger) if x.startswith("effect")] == [
        ["effect", "prepare", "2"], ["effect", "charge", "3"]]




def test_fork_twice_gives_one_checkpoint(store_url: str) -> None:
    """FD: the same fork request (flag, parent, node, values) yields the same id and state."""
    import asyncio

    from langgraph.graph import END, START, StateGraph

    class S(w.State):
        pass

    def a(s: S) -> dict[str, Any]:
        return {"x": s["x"] + 1}

    def b(s: S) -> dict[str, Any]:
        return {"x": s["x"] * 2}

    g = StateGraph(S)
    g.add_node("a", a)
    g.add_node("b", b)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", END)
    with RemitSaver.from_conn_string(store_url) as saver:
        app = g.compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": "fd"}}
        app.invoke({"x": 1, "log": ""}, cfg)
        (after_a,) = [h for h in app.get_state_history(cfg) if h.next == ("b",)]
        fork = {"configurable": {**after_a.config["configurable"], "remit_fork": True}}
        first = app.update_state(fork, {"x": 42}, as_node="a")
        count = len(list(saver.list(cfg)))
        second = app.update_state(fork, {"x": 42}, as_node="a")
        third = asyncio.run(app.aupdate_state(fork, {"x": 42}, as_node="a"))
        assert first == second == third
        assert len(list(saver.list(cfg))) == count  # the repeats stored nothing
        other = app.update_state(fork, {"x": 43}, as_node="a")
        assert other["configurable"]["checkpoint_id"] != first["configurable"]["checkpoint_id"]
        plain = app.update_state(after_a.config, {"x": 42}, as_node="a")  # no flag: not a fork
        assert plain["configurable"]["checkpoint_id"] != first["configurable"]["checkpoint_id"]
        assert app.get_state(first).values["x"] == 42
        assert app.invoke(None, first)["x"] == 84
        assert app.invoke(None, second)["x"] == 84


def test_recovery_uses_the_claimed_value_when_the_resume_write_was_lost(
        store_url: str, tmp_path: Path) -> None:
    """LV: the winner claimed (value recorded) and died before LangGraph's background
    resume write reached the store; recovery still finishes with the claimed value."""
    from remit_core.ids import value_digest
    from remit_core.store import new_owner
    from remit_langgraph._contract import claim_key
    from remit_langgraph._seam import parked as parked_interrupts

    ledger = tmp_path / "ledger.txt"
    w.park(store_url, "lost", str(ledger))
    with RemitSaver.from_conn_string(store_url, lease=1.0) as saver:
        cfg = {"configurable": {"thread_id": "lost"}}
        parked = saver.get_tuple(cfg)
        assert parked is not None
        (instance,) = parked_interrupts(parked.pending_writes)
        key = claim_key("lost", "", parked.config["configurable"]["checkpoint_id"],
                        instance.interrupt_id, instance.answered)
        saver.store.claim_once(key, run_id="lost", owner=new_owner(), digest=value_digest(7),
                               value=7, lease=0.2)  # a dead owner: nothing renews it
    final = recover_after_lease(store_url, "lost", ledger)
    assert final["x"] == 2 + 7 and final["log"] == "txn-7!"
