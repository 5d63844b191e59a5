"""Recovery without a person: ``@durable`` flows SIGKILLed mid-method are found and finished.

A child runs flows of ``a -> b (effect) -> c`` and is SIGKILLed while every one of them
is inside ``c`` (the child reports when they all are; no sleeps). Once the dead
executor's lease runs out the flows read as abandoned, and :func:`remit_crewai.recover`
(or ``arecover``) finds them by the flow class's name, with no flow id given, and
continues each under its own id (``kickoff(inputs={"id": ...})``): ``a`` and ``b`` do
not run again, the effect fired once, ``c`` runs once more. Flows that finished or
parked are left alone; a second recovery finds nothing. A resume of parked feedback
killed after its claim is finished with the value it claimed. Eight recoverer processes
racing over the same abandoned flows finish each exactly once (REMIT_TEST_BREAK=recovery
replaces the atomic take with a check-then-act read in the recoverers, and the race
test fails).

The lifecycle each kickoff and resume keeps (done, failed, parked, cancelled) is checked
in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
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
    recover,
)
from remit_crewai.recovery import recoverable
from tests.crewai import cw_recovery_workers as w
from tests.test_races import drain, join_all

# Fresh processes forked from a server that imported CrewAI (and started no thread):
# spawn's isolation without ~10 s of imports per child (one server for the whole
# session: the contract tests' module is preloaded too)
CTX = mp.get_context("forkserver")
CTX.set_forkserver_preload(["tests.crewai.cw_flows", "tests.crewai.cw_recovery_workers"])
BREAK = os.environ.get("REMIT_TEST_BREAK", "")


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


@pytest.mark.slow
@pytest.mark.parametrize("api", ["kickoff", "kickoff_async"])
def test_eight_recoverers_race_and_each_flow_finishes_once(store_url: str, tmp_path: Path,
                                                           api: str) -> None:
    ledger = tmp_path / "ledger"
    flow_ids = [f"r{i:02d}" for i in range(16)]
    kill_in_c(store_url, ledger, flow_ids, api)
    k = 8
    barrier, results = CTX.Barrier(k), CTX.Queue()
    procs = [CTX.Process(target=w.recoverer, args=(store_url, barrier, results, api,
                                                   BREAK == "recovery"))
             for _ in range(k)]
    for p in procs:
        p.start()
    reports = drain(results, k, timeout=300)
    join_all(procs)
    recovered = Counter(f for _, done, _, _ in reports for f in done)
    assert all(not failed for _, _, failed, _ in reports), reports
    assert recovered == Counter({f: 1 for f in flow_ids}), recovered
    check_once(ledger, flow_ids)
    with RemitFlowPersistence.from_url(store_url) as backend:
        for f in flow_ids:
            run = backend.store.get_run(f)
            assert run is not None and (run.status, run.attempts) == ("done", 2), run


def remit(*args: str, env: dict[str, str] | None = None, **kwargs: Any
          ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "remit_core.cli", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})}, **kwargs)


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
