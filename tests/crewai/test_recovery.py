"""Recovery without a person: ``@durable`` flows SIGKILLed mid-method are found and finished.

A child runs flows of ``a -> b (effect) -> c`` and is SIGKILLed while every one of them
is inside ``c`` (the child reports when they all are; no sleeps). Once the dead
executor's lease runs out the flows read as abandoned, and :func:`remit_crewai.recover`
(or ``arecover``) finds them by the flow class's name, with no flow id given, and
continues each under its own id (``kickoff(inputs={"id": ...})``): ``a`` and ``b`` do
not run again, the effect fired once, ``c`` runs once more. Flows that finished or
parked are left alone; a second recovery finds nothing. A resume of parked feedback
killed after its claim is finished with the value it claimed, also one killed before it
recorded its execution (the run still parked; eight recoverers racing over such runs
finish each once, and a live resume stopped at the same point is not taken from). A
flow killed inside its first method is recovered from the state it started with: the
kickoff's inputs, a fork's source state, the previous execution's state. Eight recoverer processes
racing over the same abandoned flows finish each exactly once: 16 flows by default,
``REMIT_RACE_RUNS=200`` (the issue's number) races over that many. Eight recoverers of
which two are SIGKILLed inside method c of a flow they continue leave those flows to the
others, which finish them after the lease, still once (REMIT_TEST_BREAK=recovery
replaces the atomic take with a check-then-act read in the recoverers, and the race and
chaos tests fail). A flow killed inside an effect that takes no idempotency key stops
for a person (needs-attention, with the receipt); ``remit effects resolve`` settles it
and the next recovery continues the flow without calling the effect again.

The lifecycle each kickoff and resume keeps (done, failed, parked, cancelled) is checked
in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from crewai.flow.async_feedback.types import HumanFeedbackPending
from crewai.flow.flow import Flow, listen, start
from crewai.flow.persistence import persist
from pydantic import BaseModel

from remit_core import RemitError, Store
from remit_core.adapter import poll
from remit_core.worker import WorkerError, targets_for
from remit_crewai import (
    CrewAISeamError,
    RemitFlowPersistence,
    arecover,
    durable,
    fork_id,
    new_execution,
    recover,
)
from remit_crewai.recovery import recoverable
from tests import procs
from tests.crewai import cw_recovery_workers as w
from tests.test_races import drain, join_all
from tests.test_run_lifecycle import likely_new_hints

# Fresh processes forked from a server that imported CrewAI (and started no thread):
# spawn's isolation without ~10 s of imports per child (one server for the whole
# session: the contract tests' module is preloaded too)
CTX = mp.get_context("forkserver")
CTX.set_forkserver_preload(["tests.crewai.cw_flows", "tests.crewai.cw_recovery_workers"])
BREAK = os.environ.get("REMIT_TEST_BREAK", "")
#: the abandoned flows the eight recoverers race over (REMIT_RACE_RUNS=200: the issue's)
RACE_RUNS = int(os.environ.get("REMIT_RACE_RUNS") or 16)
#: flows one killed child runs at once (more are killed in several children)
CHUNK = 50


@pytest.fixture
def persistence(store_url: str) -> Iterator[RemitFlowPersistence]:
    with RemitFlowPersistence.from_url(store_url) as persistence:
        yield persistence


def ledger_lines(ledger: Path) -> list[str]:
    return ledger.read_text().splitlines() if ledger.exists() else []


def counts(ledger: Path) -> Counter[str]:
    """Ledger lines by their first three words (``enter c <flow>``, without the pid)."""
    return Counter(" ".join(line.split()[:3]) for line in ledger_lines(ledger))


def _killed(proc: Any, parent: Any, expected: tuple[str, Any]) -> None:
    try:
        assert parent.poll(180), "the child never reached its kill point"
        assert parent.recv() == expected
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
    assert proc.exitcode == -signal.SIGKILL


def wait_abandoned(store: Store, flow_ids: list[str]) -> None:
    """Poll the store until every run in ``flow_ids`` reads abandoned (the dead executor's
    lease ran out)."""
    def all_abandoned() -> bool | None:
        states = [store.get_run(f) for f in flow_ids]
        return True if all(s is not None and s.status == "abandoned" for s in states) \
            else None

    assert poll(all_abandoned, within=w.LEASE + 30, pause=0.05, most=0.25), \
        f"the killed flows never read as abandoned: {[store.get_run(f) for f in flow_ids]}"


def kill_in_c(url: str, ledger: Path, specs: list[str], api: str = "kickoff") -> None:
    """Run ``specs`` in a child until each killable flow is in method c, then SIGKILL it,
    and wait until its flows read as abandoned."""
    parent, child = CTX.Pipe()
    proc = CTX.Process(target=w.die_in_c, args=(url, str(ledger), specs, child, api))
    proc.start()
    child.close()  # a child that dies early reads as EOF, not as a hang
    _killed(proc, parent, ("in c", w.killable(specs)))
    with RemitFlowPersistence.from_url(url) as backend:
        wait_abandoned(backend.store, w.killable(specs))


def kill_many_in_c(url: str, ledger: Path, flow_ids: list[str], api: str = "kickoff") -> None:
    """:func:`kill_in_c` for many flows: at most :data:`CHUNK` of them in each child."""
    for i in range(0, len(flow_ids), CHUNK):
        kill_in_c(url, ledger, flow_ids[i:i + CHUNK], api)


def check_once(ledger: Path, flow_ids: list[str], recoveries: int = 1) -> None:
    seen = counts(ledger)
    for f in flow_ids:
        assert seen[f"enter a {f}"] == 1, ledger_lines(ledger)
        assert seen[f"enter b {f}"] == 1, ledger_lines(ledger)
        assert seen[f"effect charge {f}"] == 1, ledger_lines(ledger)
        assert seen[f"enter c {f}"] == 1 + recoveries, ledger_lines(ledger)


# ===================================================================== killed, then recovered


@pytest.mark.parametrize("api", ["kickoff", "kickoff_async"])
def test_flows_killed_mid_method_are_found_and_finished(store_url: str, tmp_path: Path,
                                                        api: str) -> None:
    ledger = tmp_path / "ledger"
    killed = [f"k{i}" for i in range(3)]
    kill_in_c(store_url, ledger, ["done:1", "park:1", *killed], api)
    flow = w.recovery_flow(store_url)
    # two at a time: threads for recover, tasks of one event loop for arecover
    report = recover(flow, concurrency=2) if api == "kickoff" else \
        asyncio.run(arecover(flow, concurrency=2))
    assert sorted(report.recovered) == killed, report
    assert (report.failed, report.skipped, report.attention) == ({}, [], {})
    check_once(ledger, killed)
    with RemitFlowPersistence.from_url(store_url) as backend:
        store = backend.store
        for f in killed:
            state = backend.load_state(f)
            assert state is not None
            assert (state["log"], state["txn"]) == (["a", "b", "c"], f"txn-{f}")
            assert backend.epoch(f).finished and backend.epoch(f).result == f"done txn-{f}"
            run = store.get_run(f)
            assert run is not None
            assert (run.status, run.attempts, run.framework, run.name) == \
                ("done", 2, "crewai", w.NAME)
        # the finished and the parked flow were left alone
        seen = counts(ledger)
        assert (seen["enter a done:1"], seen["enter c done:1"], seen["enter ask park:1"]) == \
            (1, 1, 1)
        done, parked = store.get_run("done:1"), store.get_run("park:1")
        assert done is not None and (done.status, done.attempts) == ("done", 1)
        assert parked is not None and (parked.status, parked.attempts) == ("parked", 1)
        assert parked.waiting == {"feedback": {
            "flow_id": "park:1", "method": "ask", "message": "ship it?",
            "emit": ["approved", "rejected"], "default_outcome": "approved"}}
    # a second recovery finds nothing
    again = recover(flow)
    assert again.total == 0, again


def test_a_recovery_finds_only_its_flows_runs(store_url: str, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    kill_in_c(store_url, ledger, ["mine"])
    assert recover(w.flows(store_url)["OtherFlow"]).total == 0
    assert recover(w.recovery_flow(store_url), name="another-name").total == 0
    assert recover(w.recovery_flow(store_url)).recovered == ["mine"]
    check_once(ledger, ["mine"])


def test_a_resume_killed_after_its_claim_is_finished_with_its_value(
        store_url: str, tmp_path: Path, persistence: RemitFlowPersistence) -> None:
    """The LV path: a resume of parked feedback claims it and dies inside the listener that
    follows; recovery finds the run and finishes it with the claimed value."""
    ledger = tmp_path / "ledger"
    backend = persistence
    flow = w.recovery_flow(store_url)
    parked = flow().kickoff(inputs={"id": "rv", "ledger": str(ledger), "mode": "reviewing"})
    assert isinstance(parked, HumanFeedbackPending)
    run = backend.store.get_run("rv")
    assert run is not None and run.status == "parked"
    assert run.waiting["feedback"]["message"] == "review?"
    parent, child = CTX.Pipe()
    proc = CTX.Process(target=w.resume_and_die, args=(store_url, "rv", "ok", child))
    proc.start()
    child.close()
    _killed(proc, parent, ("in after", "rv"))
    wait_abandoned(backend.store, ["rv"])
    report = recover(flow)
    assert report.recovered == ["rv"], report
    seen = counts(ledger)
    assert (seen["enter a rv"], seen["enter review rv"], seen["enter after rv"]) == (1, 1, 2)
    assert [line.split()[3] for line in ledger_lines(ledger)
            if line.startswith("enter after")] == ["ok", "ok"]
    state = backend.load_state("rv")
    assert state is not None and state["log"] == ["a", "after ok"]
    run = backend.store.get_run("rv")
    assert run is not None and (run.status, run.attempts) == ("done", 3)
    assert recover(flow).total == 0


def _claimed_then_killed(url: str, flow_ids: list[str], value: str, lease: float
                         ) -> tuple[Any, Any]:
    """Start a child that resumes the parked reviews ``flow_ids`` with ``value`` and stops
    each between its claim and the record of its execution; return (process, pipe) once
    all are there (the caller kills it, or lets it go on)."""
    parent, child = CTX.Pipe()
    proc = CTX.Process(target=w.resume_until_lifecycle,
                       args=(url, flow_ids, value, lease, child))
    proc.start()
    child.close()
    assert parent.poll(180), "the child never claimed the feedback"
    assert parent.recv() == ("claimed", sorted(flow_ids))
    return proc, parent


def _kill(proc: Any) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGKILL)
    proc.join(30)
    assert proc.exitcode == -signal.SIGKILL


def wait_claims_lapse(store: Store, flow_ids: list[str]) -> None:
    """Poll until each flow's feedback claim is held under a lease that ran out."""
    def lapsed() -> bool | None:
        claims = [c for f in flow_ids for c in store.list_claims(f)]
        return True if len(claims) == len(flow_ids) and all(
            c.status == "claimed" and c.lease_until <= time.time() for c in claims) else None

    assert poll(lapsed, within=w.LEASE + 30, pause=0.05, most=0.25), \
        [c for f in flow_ids for c in store.list_claims(f)]


def park_reviews(url: str, ledger: Path, flow_ids: list[str]) -> None:
    flow = w.recovery_flow(url)
    for f in flow_ids:
        parked = flow().kickoff(inputs={"id": f, "ledger": str(ledger), "mode": "reviewing"})
        assert isinstance(parked, HumanFeedbackPending), parked


def test_a_resume_killed_between_its_claim_and_its_lifecycle_is_finished(
        store_url: str, tmp_path: Path, persistence: RemitFlowPersistence) -> None:
    """A resume claims the parked feedback and is SIGKILLed before it records its execution
    in the run lifecycle: the run still reads ``parked``. Once the claim's lease ran out,
    recovery finishes it with the claimed value, once. Another resume stopped at the same
    point but alive (its lease runs) is not taken from: it goes on and finishes its own."""
    ledger = tmp_path / "ledger"
    store = persistence.store
    park_reviews(store_url, ledger, ["dead", "alive"])
    dying, _ = _claimed_then_killed(store_url, ["dead"], "dead-ok", w.LEASE)
    _kill(dying)
    live, pipe = _claimed_then_killed(store_url, ["alive"], "live-ok", 600.0)
    try:
        for f in ("dead", "alive"):
            run = store.get_run(f)
            assert run is not None and (run.status, run.attempts) == ("parked", 1), run
        wait_claims_lapse(store, ["dead"])
        flow = w.recovery_flow(store_url)
        report = recover(flow)
        assert report.recovered == ["dead"], report
        assert (report.failed, report.skipped, report.attention) == ({}, [], {}), report
        seen = counts(ledger)
        assert (seen["enter review dead"], seen["enter after dead"]) == (1, 1), seen
        assert "enter after dead dead-ok" in " ".join(ledger_lines(ledger))
        state = persistence.load_state("dead")
        assert state is not None and state["log"] == ["a", "after dead-ok"]
        assert persistence.epoch("dead").result == "reviewed dead-ok"
        run = store.get_run("dead")
        assert run is not None and (run.status, run.attempts) == ("done", 2), run
        [claim] = store.list_claims("dead")
        assert (claim.status, claim.value, claim.fence) == ("consumed", "dead-ok", 2)
        # the live resume was left alone: still parked, its claim its own
        run = store.get_run("alive")
        assert run is not None and run.status == "parked", run
        [held] = store.list_claims("alive")
        assert (held.status, held.fence) == ("claimed", 1), held
        assert held.owner is not None and f":{live.pid}:" in held.owner
        assert seen["enter after alive"] == 0
        pipe.send("go on")
        assert pipe.poll(180) and pipe.recv() == ("finished", {"alive": "reviewed live-ok"})
    finally:
        live.kill()
        live.join(30)
    seen = counts(ledger)
    assert seen["enter after alive"] == 1 and seen["enter after dead"] == 1, seen
    run = store.get_run("alive")
    assert run is not None and (run.status, run.attempts) == ("done", 2), run
    assert recover(w.recovery_flow(store_url)).total == 0


def test_resumes_dying_before_their_lifecycle_are_bounded_by_max_attempts(
        store_url: str, tmp_path: Path, persistence: RemitFlowPersistence,
        caplog: pytest.LogCaptureFixture) -> None:
    """A resume that claims the parked feedback and is SIGKILLed before it records its
    execution counts as an attempt (the claim's fence): with ``max_attempts=1`` the one
    that died has used the flow's attempts, so recovery reports the flow exhausted, leaves
    it parked with the dead resume's claim, taking nothing over; a recovery allowed more
    attempts finishes it with the claimed value, once."""
    ledger = tmp_path / "ledger"
    store = persistence.store
    park_reviews(store_url, ledger, ["spent"])
    dying, _ = _claimed_then_killed(store_url, ["spent"], "yes", w.LEASE)
    _kill(dying)
    wait_claims_lapse(store, ["spent"])
    flow = w.recovery_flow(store_url)
    with caplog.at_level(logging.DEBUG, logger="remit.recovery"):
        for _ in range(3):  # a worker's passes: reported each time, warned about once
            report = recover(flow, max_attempts=1)
            assert (report.recovered, report.skipped, report.failed) == ([], [], {}), report
            assert report.exhausted == ["spent"], report
    said = [r.levelno for r in caplog.records if "run spent (crewai) not recovered" in r.message]
    assert said == [logging.WARNING, logging.DEBUG, logging.DEBUG], said
    run = store.get_run("spent")
    assert run is not None and (run.status, run.attempts) == ("parked", 1), run
    [claim] = store.list_claims("spent")
    assert (claim.status, claim.fence, claim.value) == ("claimed", 1, "yes"), claim
    assert counts(ledger)["enter after spent"] == 0
    report = recover(flow, max_attempts=2)
    assert report.recovered == ["spent"] and not (report.failed or report.exhausted), report
    assert counts(ledger)["enter after spent"] == 1
    assert persistence.epoch("spent").result == "reviewed yes"
    [claim] = store.list_claims("spent")
    assert (claim.status, claim.fence) == ("consumed", 2), claim


@pytest.mark.slow
def test_recoverers_racing_over_dead_resumes_finish_each_once(store_url: str,
                                                               tmp_path: Path) -> None:
    """Eight flows whose resume died between its claim and its lifecycle record, then eight
    recoverer processes released at once (four with recover, four with arecover): each
    flow is finished by exactly one of them, with the claimed value, ``after`` entered
    once."""
    ledger = tmp_path / "ledger"
    flow_ids = [f"d{i}" for i in range(8)]
    park_reviews(store_url, ledger, flow_ids)
    dying, _ = _claimed_then_killed(store_url, flow_ids, "yes", w.LEASE)
    _kill(dying)
    with RemitFlowPersistence.from_url(store_url) as backend:
        wait_claims_lapse(backend.store, flow_ids)
        k = 8
        barrier, results = CTX.Barrier(k), CTX.Queue()
        procs = [CTX.Process(target=w.recoverer, args=(
                     store_url, barrier, results, "kickoff_async" if i % 2 else "kickoff", False))
                 for i in range(k)]
        for p in procs:
            p.start()
        reports = drain(results, k, timeout=300)
        join_all(procs)
        recovered = Counter(f for _, done, _, _ in reports for f in done)
        assert all(not failed for _, _, failed, _ in reports), reports
        assert recovered == Counter({f: 1 for f in flow_ids}), reports
        seen = counts(ledger)
        for f in flow_ids:
            assert (seen[f"enter review {f}"], seen[f"enter after {f}"]) == (1, 1), seen
            run = backend.store.get_run(f)
            assert run is not None and (run.status, run.attempts) == ("done", 2), run
            [claim] = backend.store.list_claims(f)
            assert (claim.status, claim.value) == ("consumed", "yes"), claim
            assert backend.epoch(f).result == "reviewed yes"


@pytest.mark.parametrize("how", ["kickoff", "fork", "new-execution"])
def test_a_flow_killed_inside_its_first_method_is_recovered_with_its_inputs(
        store_url: str, tmp_path: Path, persistence: RemitFlowPersistence, how: str) -> None:
    """A flow SIGKILLed inside its first method, before CrewAI stored any state of the
    execution: recovery runs that method again from the state it started with, the
    kickoff's inputs on the class's defaults (``kickoff``), on the source's state
    (``fork``), or on the previous execution's state (``new-execution``)."""
    ledger = str(tmp_path / "ledger")
    flow = w.inputs_flow(store_url, ledger)
    if how == "kickoff":
        fid, inputs, seen = "in-1", {"amount": 30, "note": "given"}, "30 given"
        target = fid
    elif how == "fork":
        flow().kickoff(inputs={"id": "src", "amount": 7, "note": "source"})
        inputs, seen = {"note": "forked"}, "7 forked"
        fid, target = fork_id(persistence, "src", inputs), "src"
    else:
        flow().kickoff(inputs={"id": "ne", "amount": 1, "note": "one"})
        assert new_execution("ne", persistence) == 1
        fid, inputs, seen = "ne", {"amount": 5, "note": "two"}, "5 two"
        target = fid
    before = len(ledger_lines(Path(ledger)))  # the source's or the first execution's
    parent, child = CTX.Pipe()
    proc = CTX.Process(target=w.die_in_first,
                       args=(store_url, ledger, "fork" if how == "fork" else "kickoff",
                             target, inputs, child))
    proc.start()
    child.close()
    _killed(proc, parent, ("in first", fid))
    wait_abandoned(persistence.store, [fid])
    report = recover(flow)
    assert report.recovered == [fid], report
    firsts = [" ".join(line.split()[3:5]) for line in ledger_lines(Path(ledger))[before:]
              if line.startswith(f"enter first {fid} ")]
    assert firsts == [seen, seen], ledger_lines(Path(ledger))  # the killed one, the recovery
    state = persistence.load_state(fid)
    assert state is not None
    earlier = {"kickoff": [], "fork": ["first 7 source", "second"],
               "new-execution": ["first 1 one", "second"]}[how]
    assert state["log"] == [*earlier, f"first {seen}", "second"], state
    assert persistence.epoch(fid).result == f"second after {seen}"
    run = persistence.store.get_run(fid)
    assert run is not None and run.status == "done", run


def test_a_kickoff_stores_the_state_its_first_method_starts_with(
        store_url: str, persistence: RemitFlowPersistence, tmp_path: Path) -> None:
    """What a kickoff stores before its first method runs (in this process): the state
    it starts with, when a restore of the flow id would give another one; nothing for a
    kickoff with only an id, nor for a resume whose execution stored states already."""
    ledger = str(tmp_path / "ledger")
    flow = w.inputs_flow(store_url, ledger)
    seen: dict[str, Any] = {}

    @durable
    @persist(persistence)
    class Peek(Flow[w.IState]):
        _skip_auto_memory = True

        @start()
        def first(self) -> str:
            seen[self.state.id] = persistence.load_state(self.state.id)
            return "first"

    Peek().kickoff(inputs={"id": "p-1", "amount": 3})
    assert seen["p-1"] is not None and (seen["p-1"]["amount"], seen["p-1"]["id"]) == (3, "p-1")
    Peek().kickoff(inputs={"id": "p-2"})  # a restore gives the defaults: nothing to store
    assert seen["p-2"] is None
    assert [c.metadata["method"] for c in persistence.store.list_checkpoints("p-1", ns="")] \
        == ["first", "_kickoff"]
    assert flow().kickoff(inputs={"id": "p-3", "note": "n"}) == "second after 0 n"
    assert [c.metadata["method"] for c in persistence.store.list_checkpoints("p-3", ns="")] \
        == ["second", "first", "_kickoff"]


@pytest.mark.slow
@pytest.mark.parametrize("api", ["kickoff", "kickoff_async"])
def test_eight_recoverers_race_and_each_flow_finishes_once(store_url: str, tmp_path: Path,
                                                           api: str) -> None:
    """RACE_RUNS flows (16; REMIT_RACE_RUNS=200 for the issue's 200) killed in c, then
    eight recoverer processes released at once: each flow recovered by exactly one."""
    ledger = tmp_path / "ledger"
    flow_ids = [f"r{i:03d}" for i in range(RACE_RUNS)]
    kill_many_in_c(store_url, ledger, flow_ids, api)
    k = 8
    barrier, results = CTX.Barrier(k), CTX.Queue()
    procs = [CTX.Process(target=w.recoverer, args=(store_url, barrier, results, api,
                                                   BREAK == "recovery"))
             for _ in range(k)]
    for p in procs:
        p.start()
    reports = drain(results, k, timeout=300 + 3 * RACE_RUNS)
    join_all(procs)
    recovered = Counter(f for _, done, _, _ in reports for f in done)
    assert all(not failed for _, _, failed, _ in reports), reports
    assert recovered == Counter({f: 1 for f in flow_ids}), recovered
    check_once(ledger, flow_ids)
    with RemitFlowPersistence.from_url(store_url) as backend:
        for f in flow_ids:
            run = backend.store.get_run(f)
            assert run is not None and (run.status, run.attempts) == ("done", 2), run


@pytest.mark.slow
def test_recoverers_killed_while_recovering_leave_their_flows_to_the_others(
        store_url: str, tmp_path: Path) -> None:
    """Eight recoverers over 16 abandoned flows; two of them report from inside method c of
    the flow they continue and are SIGKILLed there. Once their lease runs out those flows
    read as abandoned again and the six others finish them: every flow recovered once,
    its effect fired once, a and b not run again, c entered a third time only in the two
    flows whose recoverer died in it."""
    ledger = tmp_path / "ledger"
    flow_ids = [f"x{i:02d}" for i in range(16)]
    kill_in_c(store_url, ledger, flow_ids)
    # victims: (pid, the flow it was inside method c of)
    victims, reports = procs.chaos(w.chaos_recoverer, lambda *sync: (
        store_url, flow_ids, *sync, BREAK == "recovery"))
    recovered = Counter(f for _, done, _, _ in reports for f in done)
    assert recovered == Counter({f: 1 for f in flow_ids}), recovered
    assert all(step == "all done" and not failed for _, _, failed, step in reports), reports
    cut_short = {f for _, f in victims}
    lines, seen = ledger_lines(ledger), counts(ledger)
    for f in flow_ids:
        assert seen[f"effect charge {f}"] == 1, lines
        assert (seen[f"enter a {f}"], seen[f"enter b {f}"]) == (1, 1), lines
        # c: the killed executor, the killed recoverer (in the flows it was in), the
        # recoverer that finished it
        assert seen[f"enter c {f}"] == (3 if f in cut_short else 2), lines
    with RemitFlowPersistence.from_url(store_url) as backend:
        for f in flow_ids:
            state = backend.load_state(f)
            assert state is not None
            assert (state["log"], state["txn"]) == (["a", "b", "c"], f"txn-{f}")
            assert backend.epoch(f).result == f"done txn-{f}"
            run = backend.store.get_run(f)
            assert run is not None
            assert (run.status, run.attempts) == ("done", 3 if f in cut_short else 2), run


def remit(*args: str, env: dict[str, str] | None = None, **kwargs: Any
          ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "remit_core.cli", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})}, **kwargs)


@pytest.mark.slow
def test_an_effect_in_doubt_stops_the_flow_for_a_person_then_it_continues(
        store_url: str, tmp_path: Path) -> None:
    """Flows killed inside the effect ``ship`` (no idempotency key: it may or may not have
    happened): recovery stops each for a person (needs-attention, with the receipt's
    key), ``remit effects`` lists and settles them, and the next recovery continues
    them: a resolved effect returns the recorded result and is not called again, a
    rerun one is called again."""
    ledger = tmp_path / "ledger"
    kill_in_c(store_url, ledger, ["ship-1", "ship-2"])  # killed inside the effect "ship"
    flow = w.recovery_flow(store_url)
    report = recover(flow)
    assert sorted(report.attention) == ["ship-1", "ship-2"], report
    assert (report.recovered, report.failed) == ([], {}), report
    keys = dict(report.attention)
    with RemitFlowPersistence.from_url(store_url) as backend:
        store = backend.store
        for f, key in keys.items():
            run = store.get_run(f)
            assert run is not None and run.status == "needs-attention", run
            assert run.waiting["receipt"] == key and run.waiting["effect"] == "ship"
        assert recover(flow).total == 0  # nothing settled yet: the flows wait
        listed = remit("effects", "list", store_url, "--json")
        assert listed.returncode == 0, listed.stderr
        shown = {r["key"]: r for r in json.loads(listed.stdout)}
        assert set(shown) == set(keys.values()), shown
        assert all((r["status"], r["run_waits"], r["effect"]) == ("in doubt", "yes", "ship")
                   for r in shown.values()), shown
        # a person checked the carrier: ship-1 was shipped, ship-2 was not
        done = remit("effects", "resolve", store_url, keys["ship-1"],
                     "--result", '{"shipped": "ship-1", "carrier": "checked by hand"}')
        assert done.returncode == 0 and "continues run ship-1" in done.stdout, done
        bad = remit("effects", "resolve", store_url, keys["ship-2"], "--result", "{nope")
        assert bad.returncode == 2 and "not JSON" in bad.stderr, bad
        rerun = remit("effects", "resolve", store_url, keys["ship-2"], "--rerun")
        assert rerun.returncode == 0 and "continues run ship-2" in rerun.stdout, rerun
        again = recover(flow)
        assert sorted(again.recovered) == ["ship-1", "ship-2"], again
        seen = counts(ledger)
        assert seen["effect ship ship-1"] == 1  # resolved: not called again
        assert seen["effect ship ship-2"] == 2  # rerun: called again
        for f in keys:
            assert seen[f"enter a {f}"] == 1, ledger_lines(ledger)
            # send: the killed executor, the recovery stopped by the doubt, the last one
            assert seen[f"enter send {f}"] == 3, ledger_lines(ledger)
        shipped = {f: backend.load_state(f) for f in keys}
        assert shipped["ship-1"]["shipment"] == {  # type: ignore[index]
            "shipped": "ship-1", "carrier": "checked by hand"}
        assert shipped["ship-2"]["shipment"] == {  # type: ignore[index]
            "shipped": "ship-2", "carrier": "parcel-co"}
        for f in keys:
            assert shipped[f]["log"] == ["a", f"sent {f}"]  # type: ignore[index]
            assert backend.epoch(f).result == f"shipped {f}"
            run = store.get_run(f)
            assert run is not None and (run.status, run.attempts) == ("done", 3), run
        assert recover(flow).total == 0
    settled = remit("effects", "resolve", store_url, keys["ship-1"], "--rerun")
    assert settled.returncode == 1 and "has a result already" in settled.stderr, settled


@pytest.mark.slow
def test_an_effect_resolved_as_failed_fails_its_flow_and_a_retry_calls_it_again(
        store_url: str, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    kill_in_c(store_url, ledger, ["ship-f"])
    flow = w.recovery_flow(store_url)
    key = recover(flow).attention["ship-f"]
    failed = remit("effects", "resolve", store_url, key, "--failed", "carrier refused")
    assert failed.returncode == 0 and "ship-f is failed" in failed.stdout, failed
    with RemitFlowPersistence.from_url(store_url) as backend:
        run = backend.store.get_run("ship-f")
        assert run is not None and run.status == "failed", run
        assert run.error == {"type": "EffectFailed", "message": "carrier refused",
                             "receipt": key}
        assert recover(flow).total == 0  # a failed flow is not retried unless asked
        retried = recover(flow, retry_failed=True)
        assert retried.recovered == ["ship-f"], retried
        assert counts(ledger)["effect ship ship-f"] == 2
        state = backend.load_state("ship-f")
        assert state is not None and state["log"] == ["a", "sent ship-f"]
        done = backend.store.get_run("ship-f")
        assert done is not None and done.status == "done", done


@pytest.mark.slow
def test_the_worker_recovers_flows_until_sigterm_and_prints_its_counts(
        store_url: str, tmp_path: Path) -> None:
    """``remit worker --app <flow class> --store URL`` finds the flows killed in c and
    finishes each once, ``--once`` and then pass after pass until SIGTERM. The class's own
    backend is another (empty) store: the worker's flows are built with its --store."""
    ledger = tmp_path / "ledger"
    app = "tests.crewai.cw_recovery_workers:worker_app"
    env = {"REMIT_TEST_CLASS_STORE": f"sqlite:///{tmp_path}/class-store.db"}
    flows = ["w1", "w2", "w3"]
    kill_in_c(store_url, ledger, flows)
    once = remit("worker", "--app", app, "--store", store_url, "--once", "--concurrency", "2",
                 env=env)
    assert once.returncode == 0, once.stderr
    assert "3 recovered, 0 failed" in once.stdout, once.stdout
    assert sum("recovered run" in line for line in once.stderr.splitlines()) == 3
    check_once(ledger, flows)
    # a long-running worker: another flow dies while it runs; SIGTERM stops it cleanly
    kill_in_c(store_url, ledger, ["w4"])
    out, err = tmp_path / "worker.out", tmp_path / "worker.err"
    with out.open("w") as stdout, err.open("w") as stderr:  # files: no pipe to fill up
        proc = subprocess.Popen([sys.executable, "-m", "remit_core.cli", "worker", "--app", app,
                                 "--store", store_url, "--interval", "0.2"],
                                stdout=stdout, stderr=stderr, env={**os.environ, **env})
    try:
        with RemitFlowPersistence.from_url(store_url) as backend:
            assert poll(lambda: True if (r := backend.store.get_run("w4")) is not None
                        and r.status == "done" else None, within=180, pause=0.05,
                        most=0.5), f"the worker never recovered w4: {err.read_text()}"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err.read_text()
    assert "SIGTERM" in err.read_text(), err.read_text()
    assert "1 recovered, 0 failed" in out.read_text(), out.read_text()
    check_once(ledger, [*flows, "w4"])
    with RemitFlowPersistence.from_url(store_url) as backend:
        for f in [*flows, "w4"]:
            run = backend.store.get_run(f)
            assert run is not None and (run.status, run.attempts, run.name) == \
                ("done", 2, w.NAME)


def test_the_worker_takes_durable_flow_classes_only(store_url: str) -> None:
    """remit worker's recogniser, found through the registry: a @durable flow class is a
    target on the worker's --store, a plain Flow class is refused with the reason, and an
    object of no framework is no adapter's."""
    (target,) = targets_for([w.recovery_flow(store_url)], store_url)
    assert (target.framework, target.name) == ("crewai", w.NAME)
    assert target.recover(limit=None, concurrency=1, retry_failed=False, max_attempts=10,
                          owner="test", stop=threading.Event()).total == 0
    target.close()

    class PlainFlow(Flow[w.RState]):
        _skip_auto_memory = True

        @start()
        def a(self) -> str:
            return "a"

    with pytest.raises(RemitError, match=r"cannot recover the flow class \S+PlainFlow: "
                       r"recover\(\) needs a @durable flow class"):
        targets_for([PlainFlow], store_url)
    assert recoverable(object(), store_url) is None
    with pytest.raises(WorkerError, match=r"no installed adapter recovers builtins\.object"):
        targets_for([object()], store_url)


# ============================================================== the lifecycle, in-process


class Order(BaseModel):
    steps: list[str] = []


class Lifecycle:
    """Flows on one backend, and what the test steers them with."""

    def __init__(self, backend: RemitFlowPersistence) -> None:
        self.outage = False  # Orders.pack raises while it is True
        self.taken = 0  # Orders.take's entries
        self.inside = asyncio.Event()  # set when Hangs is inside its method
        self.flows = _lifecycle_flows(backend, self)


def _lifecycle_flows(backend: RemitFlowPersistence, steer: Lifecycle
                     ) -> dict[str, type[Flow[Any]]]:

    @durable
    @persist(backend)
    class Orders(Flow[Order]):
        _skip_auto_memory = True

        @start()
        def take(self) -> str:
            steer.taken += 1
            self.state.steps.append("take")
            return "taken"

        @listen(take)
        def pack(self, _: str) -> str:
            if steer.outage:
                raise ValueError("out of boxes")
            self.state.steps.append("pack")
            return "packed"

    @durable
    @persist(backend)
    class Named(Flow[Order]):
        _skip_auto_memory = True
        name: str | None = "nightly-orders"

        @start()
        def take(self) -> str:
            return "taken"

    @durable
    @persist(backend)
    class Hangs(Flow[Order]):
        _skip_auto_memory = True

        @start()
        async def wait(self) -> str:
            steer.inside.set()
            await asyncio.Event().wait()  # until cancelled
            return "never"

    @persist(backend)
    class Plain(Flow[Order]):
        _skip_auto_memory = True

        @start()
        def take(self) -> str:
            return "taken"

    return {"Orders": Orders, "Named": Named, "Hangs": Hangs, "Plain": Plain}


def test_a_kickoff_keeps_the_lifecycle_done_or_failed(
        persistence: RemitFlowPersistence) -> None:
    steer = Lifecycle(persistence)
    flows = steer.flows
    store = persistence.store
    assert flows["Orders"]().kickoff(inputs={"id": "o-1"}) == "packed"
    run = store.get_run("o-1")
    assert run is not None
    assert (run.framework, run.name, run.status, run.attempts, run.owner) == \
        ("crewai", "Orders", "done", 1, None)
    # a finished execution kicked off again runs and records nothing
    assert flows["Orders"]().kickoff(inputs={"id": "o-1"}) == "packed"
    assert store.get_run("o-1") == run

    steer.outage = True
    with pytest.raises(ValueError, match="out of boxes"):
        flows["Orders"]().kickoff(inputs={"id": "o-2"})
    run = store.get_run("o-2")
    assert run is not None and run.status == "failed"
    assert run.error == {"type": "ValueError", "message": "out of boxes"}
    # a failed run is recovered only when asked (and fails again while the outage lasts)
    assert recover(flows["Orders"]).total == 0
    assert recover(flows["Orders"], retry_failed=True).failed == {
        "o-2": "ValueError: out of boxes"}
    steer.outage = False
    assert recover(flows["Orders"], retry_failed=True).recovered == ["o-2"]
    assert steer.taken == 2  # o-1's and o-2's: take did not run again in the recoveries
    assert persistence.load_state("o-2")["steps"] == ["take", "pack"]  # type: ignore[index]
    run = store.get_run("o-2")
    assert run is not None and (run.status, run.attempts) == ("done", 3)

    # the name the class gives its flows, else the class's name
    flows["Named"]().kickoff(inputs={"id": "n-1"})
    named = store.get_run("n-1")
    assert named is not None and named.name == "nightly-orders"
    # a flow id kicked off without inputs: its state.id
    flow = flows["Named"]()
    flow.kickoff()
    assert store.get_run(flow.state.id) is not None


def test_a_flow_ids_first_kickoff_starts_its_run_as_likely_new(
        persistence: RemitFlowPersistence, monkeypatch: pytest.MonkeyPatch) -> None:
    """The execution's start tells the store whether the flow id had anything stored: a
    new id's first kickoff starts its run as ``likely_new`` (PostgreSQL then inserts it in
    one statement), a later kickoff of the same execution as a run that exists; the
    lifecycle is the same either way."""
    store = persistence.store
    hints = likely_new_hints(store, monkeypatch)
    steer = Lifecycle(persistence)
    steer.outage = True
    with pytest.raises(ValueError, match="out of boxes"):
        steer.flows["Orders"]().kickoff(inputs={"id": "o-1"})
    steer.outage = False
    assert steer.flows["Orders"]().kickoff(inputs={"id": "o-1"}) == "packed"
    flow = steer.flows["Named"]()
    flow.kickoff()  # no inputs: a new flow id
    assert hints == [True, False, True]
    run = store.get_run("o-1")
    assert run is not None and (run.status, run.attempts) == ("done", 2)
    named = store.get_run(flow.state.id)
    assert named is not None and (named.status, named.attempts) == ("done", 1)


def test_a_cancelled_kickoff_is_failed(persistence: RemitFlowPersistence) -> None:
    steer = Lifecycle(persistence)
    hangs = steer.flows["Hangs"]

    async def main() -> None:
        task = asyncio.create_task(hangs().kickoff_async(inputs={"id": "h-1"}))
        await steer.inside.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    run = persistence.store.get_run("h-1")
    assert run is not None and run.status == "failed", run
    assert run.error["type"] == "asyncio.exceptions.CancelledError"


def test_plain_flows_keep_no_lifecycle(persistence: RemitFlowPersistence) -> None:
    plain = Lifecycle(persistence).flows["Plain"]
    assert plain().kickoff(inputs={"id": "p-1"}) == "taken"
    assert persistence.load_state("p-1") is not None
    assert persistence.store.get_run("p-1") is None
    with pytest.raises(TypeError, match="@durable"):
        recover(plain)


def test_a_missing_seam_is_refused_naming_the_crewai_version() -> None:
    import importlib.metadata

    class NotAFlow:
        pass

    with pytest.raises(CrewAISeamError) as refused:
        durable(NotAFlow)
    assert f"crewai {importlib.metadata.version('crewai')}" in str(refused.value)
    assert refused.value.seam == "NotAFlow.kickoff_async"
