"""Recovery without a person: threads SIGKILLed mid-step are found and finished.

A child runs threads of ``a -> b (effect) -> c`` and is SIGKILLed while every one of them
is inside ``c`` (the child reports when they all are; no sleeps). Once the dead
executor's lease runs out the threads read as abandoned, and :func:`remit_langgraph.recover`
(or ``arecover``) finds them by the graph's name, with no thread id given, and continues
each from its last checkpoint: ``a`` and ``b`` do not run again, the effect fired once,
``c`` runs once more. Threads that finished or parked are left alone. A second recovery
finds nothing. Eight recoverer processes racing over the same abandoned threads finish
each exactly once: 24 threads by default, ``REMIT_RACE_RUNS=200`` (the issue's number)
races over that many. Eight recoverers of which two are SIGKILLed inside node c of a
thread they continue leave those threads to the others, which finish them after the
lease, still once. REMIT_TEST_BREAK=recovery replaces the atomic take with a
check-then-act read in the recoverers, and the race and chaos tests fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from remit_core.adapter import poll
from remit_langgraph import RemitSaver, arecover, recover
from tests import procs
from tests.langgraph import lg_recovery_workers as w
from tests.test_races import drain, join_all

CTX = procs.CTX
BREAK = os.environ.get("REMIT_TEST_BREAK", "")
#: the abandoned threads the eight recoverers race over (REMIT_RACE_RUNS=200: the issue's)
RACE_RUNS = int(os.environ.get("REMIT_RACE_RUNS") or 24)
#: threads one killed child runs at once (more are killed in several children)
CHUNK = 50


def ledger_lines(ledger: Path) -> list[str]:
    return ledger.read_text().splitlines() if ledger.exists() else []


def kill_in_c(url: str, ledger: Path, threads: list[str], api: str = "invoke") -> None:
    """Run ``threads`` in a child until each killable one is in node c, then SIGKILL it,
    and wait (polling the store) until its threads read as abandoned."""
    parent, child = CTX.Pipe()
    proc = CTX.Process(target=w.die_in_c, args=(url, str(ledger), threads, child, api))
    proc.start()
    try:
        assert parent.poll(120), "the child never reached node c"
        tag, arrived = parent.recv()
        killable = sorted(t for t in threads if not t.startswith(("done:", "park:")))
        assert (tag, arrived) == ("in c", killable)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
    assert proc.exitcode == -signal.SIGKILL
    with RemitSaver.from_conn_string(url) as saver:
        def all_abandoned() -> bool | None:
            states = [saver.store.get_run(t) for t in killable]
            return True if all(s is not None and s.status == "abandoned"
                               for s in states) else None

        assert poll(all_abandoned, within=w.LEASE + 30, pause=0.05, most=0.25), \
            "the killed threads never read as abandoned"


def kill_many_in_c(url: str, ledger: Path, threads: list[str], api: str = "invoke") -> None:
    """:func:`kill_in_c` for many threads: at most :data:`CHUNK` of them in each child."""
    for i in range(0, len(threads), CHUNK):
        kill_in_c(url, ledger, threads[i:i + CHUNK], api)


def check_once(ledger: Path, threads: list[str], recoveries: int = 1) -> None:
    lines = ledger_lines(ledger)
    counts = Counter(" ".join(line.split()[:3]) for line in lines)
    for t in threads:
        assert counts[f"enter a {t}"] == 1, lines
        assert counts[f"enter b {t}"] == 1, lines
        assert counts[f"effect charge {t}"] == 1, lines
        assert counts[f"enter c {t}"] == 1 + recoveries, lines


@pytest.mark.parametrize("api", ["invoke", "ainvoke"])
def test_threads_killed_mid_step_are_found_and_finished(store_url: str, tmp_path: Path,
                                                        api: str) -> None:
    ledger = tmp_path / "ledger"
    killed = [f"k{i}" for i in range(3)]
    kill_in_c(store_url, ledger, ["done:1", "park:1", *killed], api)
    with RemitSaver.from_conn_string(store_url) as saver:
        graph = w.app(saver, str(ledger))
        report = recover(graph) if api == "invoke" else asyncio.run(arecover(graph))
        assert sorted(report.recovered) == killed, report
        assert (report.failed, report.skipped, report.attention) == ({}, [], {})
        check_once(ledger, killed)
        for t in killed:
            state = graph.get_state(w.cfg(t))
            assert state.values["log"] == ["a", f"b:txn-{t}", "c"] and not state.next
            run = saver.store.get_run(t)
            assert run is not None and (run.status, run.attempts, run.name) == \
                ("done", 2, w.NAME)
        # finished and parked threads were left alone
        assert saver.store.get_run("done:1").status == "done"  # type: ignore[union-attr]
        assert saver.store.get_run("park:1").status == "parked"  # type: ignore[union-attr]
        # a second recovery finds nothing
        again = recover(graph)
        assert again.total == 0, again


def test_a_recovery_finds_only_its_graphs_threads(store_url: str, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    kill_in_c(store_url, ledger, ["mine"])
    with RemitSaver.from_conn_string(store_url) as saver:
        other = w.build(str(ledger)).compile(checkpointer=saver, name="another-graph")
        assert recover(other).total == 0
        assert recover(w.app(saver, str(ledger))).recovered == ["mine"]


@pytest.mark.slow
@pytest.mark.parametrize("api", ["invoke", "ainvoke"])
def test_eight_recoverers_race_and_each_thread_finishes_once(store_url: str, tmp_path: Path,
                                                             api: str) -> None:
    """RACE_RUNS threads (24; REMIT_RACE_RUNS=200 for the issue's 200) killed in c, then
    eight recoverer processes released at once: each thread recovered by exactly one."""
    ledger = tmp_path / "ledger"
    threads = [f"r{i:03d}" for i in range(RACE_RUNS)]
    kill_many_in_c(store_url, ledger, threads, api)
    k = 8
    barrier, results = CTX.Barrier(k), CTX.Queue()
    procs = [CTX.Process(target=w.recoverer, args=(store_url, str(ledger), barrier, results,
                                                   api, BREAK == "recovery"))
             for _ in range(k)]
    for p in procs:
        p.start()
    reports = drain(results, k, timeout=120 + 3 * RACE_RUNS)
    join_all(procs)
    recovered = Counter(t for _, done, _, _ in reports for t in done)
    assert all(not failed for _, _, failed, _ in reports), reports
    assert recovered == Counter({t: 1 for t in threads}), recovered
    check_once(ledger, threads)


def remit(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "remit_core.cli", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})


@pytest.mark.slow
def test_an_effect_in_doubt_stops_the_run_for_a_person_then_it_continues(
        store_url: str, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    kill_in_c(store_url, ledger, ["ship-1", "ship-2"])  # killed inside the effect "ship"
    with RemitSaver.from_conn_string(store_url) as saver:
        graph = w.app(saver, str(ledger))
        report = recover(graph)
        assert sorted(report.attention) == ["ship-1", "ship-2"] and not report.recovered
        keys = {t: report.attention[t] for t in report.attention}
        for t, key in keys.items():
            run = saver.store.get_run(t)
            assert run is not None and run.status == "needs-attention"
            assert run.waiting["receipt"] == key and run.waiting["effect"] == "ship"
        assert recover(graph).total == 0  # nothing settled yet: the runs wait
        listed = remit("effects", "list", store_url, "--json")
        assert listed.returncode == 0, listed.stderr
        shown = {r["key"]: r for r in json.loads(listed.stdout)}
        assert set(shown) == set(keys.values())
        assert all(r["status"] == "in doubt" and r["run_waits"] == "yes"
                   for r in shown.values())
        # a person checked the outside system: ship-1 happened, ship-2 did not
        done = remit("effects", "resolve", store_url, keys["ship-1"],
                     "--result", '{"shipped": "ship-1"}')
        assert done.returncode == 0 and "continues run ship-1" in done.stdout, done
        bad = remit("effects", "resolve", store_url, keys["ship-2"], "--result", "{nope")
        assert bad.returncode == 2 and "not JSON" in bad.stderr
        rerun = remit("effects", "resolve", store_url, keys["ship-2"], "--rerun")
        assert rerun.returncode == 0, rerun
        again = recover(graph)
        assert sorted(again.recovered) == ["ship-1", "ship-2"], again
        calls = Counter(" ".join(line.split()[:3]) for line in ledger_lines(ledger))
        assert calls["effect ship ship-1"] == 1  # resolved: not called again
        assert calls["effect ship ship-2"] == 2  # rerun: called again
        for t in keys:
            assert graph.get_state(w.cfg(t)).values["log"][-1] == f"c:{t}"
            assert saver.store.get_run(t).status == "done"  # type: ignore[union-attr]
        settled = remit("effects", "resolve", store_url, keys["ship-1"], "--rerun")
        assert settled.returncode == 1 and "has a result already" in settled.stderr


@pytest.mark.slow
def test_an_effect_resolved_as_failed_fails_its_run_and_a_retry_calls_it_again(
        store_url: str, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    kill_in_c(store_url, ledger, ["ship-f"])
    with RemitSaver.from_conn_string(store_url) as saver:
        graph = w.app(saver, str(ledger))
        key = recover(graph).attention["ship-f"]
        failed = remit("effects", "resolve", store_url, key, "--failed", "carrier refused")
        assert failed.returncode == 0 and "ship-f is failed" in failed.stdout, failed
        run = saver.store.get_run("ship-f")
        assert run is not None and run.status == "failed"
        assert run.error == {"type": "EffectFailed", "message": "carrier refused",
                             "receipt": key}
        assert recover(graph).total == 0  # a failed run is not retried unless asked
        retried = recover(graph, retry_failed=True)
        assert retried.recovered == ["ship-f"], retried
        calls = Counter(" ".join(line.split()[:3]) for line in ledger_lines(ledger))
        assert calls["effect ship ship-f"] == 2


@pytest.mark.slow
def test_the_worker_recovers_until_sigterm_and_prints_its_counts(store_url: str,
                                                                 tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    threads = ["w1", "w2", "w3"]
    kill_in_c(store_url, ledger, threads)
    once = remit("worker", "--app", "tests.langgraph.lg_recovery_workers:worker_app",
                 "--store", store_url, "--once", "--concurrency", "2",
                 env={"REMIT_TEST_LEDGER": str(ledger)})
    assert once.returncode == 0, once.stderr
    assert "3 recovered, 0 failed" in once.stdout, once.stdout
    assert sum("recovered run" in line for line in once.stderr.splitlines()) == 3
    check_once(ledger, threads)
    # a long-running worker: more threads die while it runs; SIGTERM stops it cleanly
    kill_in_c(store_url, ledger, ["w4"])
    proc = subprocess.Popen([sys.executable, "-m", "remit_core.cli", "worker", "--app",
                             "tests.langgraph.lg_recovery_workers:worker_app", "--store",
                             store_url, "--interval", "0.2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "REMIT_TEST_LEDGER": str(ledger)})
    try:
        with RemitSaver.from_conn_string(store_url) as saver:
            assert poll(lambda: True if (r := saver.store.get_run("w4")) is not None
                        and r.status == "done" else None, within=120, pause=0.05,
                        most=0.5), "the worker never recovered w4"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "SIGTERM" in err and "1 recovered" in out, (out, err)
    check_once(ledger, [*threads, "w4"])


def test_the_worker_names_what_it_cannot_recover(capsys: pytest.CaptureFixture[str]) -> None:
    from remit_core.cli import main

    assert main(["worker", "--app", "tests.langgraph.lg_recovery_workers:cfg_missing",
                 "--once"]) == 1
    assert "has no attribute 'cfg_missing'" in capsys.readouterr().err
    assert main(["worker", "--app", "tests.langgraph.lg_recovery_workers:NAME",
                 "--once"]) == 1
    assert "no installed adapter recovers builtins.str" in capsys.readouterr().err


@pytest.mark.slow
def test_recoverers_killed_while_recovering_leave_their_threads_to_the_others(
        store_url: str, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    threads = [f"x{i:02d}" for i in range(16)]
    kill_in_c(store_url, ledger, threads)
    # victims: (pid, the thread it was inside node c of)
    victims, reports = procs.chaos(w.chaos_recoverer, lambda *sync: (
        store_url, str(ledger), threads, *sync, BREAK == "recovery"))
    recovered = Counter(t for _, done, _, _ in reports for t in done)
    assert recovered == Counter({t: 1 for t in threads}), recovered
    assert all(step == "all done" and not failed for _, _, failed, step in reports), reports
    cut_short = {t for _, t in victims}
    lines = ledger_lines(ledger)
    counts = Counter(" ".join(line.split()[:3]) for line in lines)
    for t in threads:
        assert counts[f"effect charge {t}"] == 1, lines
        assert (counts[f"enter a {t}"], counts[f"enter b {t}"]) == (1, 1), lines
        # c: the killed executor, the killed recoverer (for the threads it was in), the
        # recoverer that finished it
        assert counts[f"enter c {t}"] == (3 if t in cut_short else 2), lines


def test_a_worker_for_a_langgraph_app_imports_no_other_framework(tmp_path: Path) -> None:
    """``remit worker`` loads the recognisers of the frameworks the app imported first; the
    other adapters (and so CrewAI, whose import takes seconds) are loaded only for an
    object none of those recognise."""
    script = (
        "import sys\n"
        "from remit_core.worker import load_app, targets_for\n"
        "targets = targets_for(load_app('tests.langgraph.lg_recovery_workers:worker_app'),"
        " sys.argv[1])\n"
        "print([t.framework for t in targets], 'crewai' in sys.modules,"
        " 'pydantic_graph' in sys.modules)\n"
        "for t in targets: t.close()\n")
    out = subprocess.run([sys.executable, "-c", script, f"sqlite:///{tmp_path}/s.db"],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "REMIT_TEST_LEDGER": str(tmp_path / "ledger")})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "['langgraph'] False False", out.stdout
