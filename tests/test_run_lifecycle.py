"""The run lifecycle the store keeps for the adapters (issue 15), on every backend:
who executes a run, parked / done / failed, ``abandoned`` computed from an expired
lease, recovery taken by exactly one recoverer, and the indexed listing.

The race test uses real OS processes and a barrier; ``REMIT_TEST_BREAK=runs`` makes
the racers decide by a read instead of the atomic operation, to see it fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter, defaultdict
from typing import Any

import pytest

from remit_core import open_store
from remit_core.records import RunState
from remit_core.store import Store, new_owner
from tests import procs, workers
from tests.test_races import drain, join_all

CTX = procs.CTX
BREAK = os.environ.get("REMIT_TEST_BREAK", "")

# a lease that has run out as soon as it is granted: the run reads as abandoned
EXPIRED = 0.0


def likely_new_hints(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The ``likely_new`` hint of every ``store.start_run`` from now on (an adapter's
    execution starts), in order; the starts themselves run as before."""
    hints: list[bool] = []
    start_run = store.start_run

    def spying(*args: Any, **kwargs: Any) -> Any:
        hints.append(kwargs.get("likely_new", False))
        return start_run(*args, **kwargs)

    monkeypatch.setattr(store, "start_run", spying)
    return hints


def run_id(tag: str) -> str:
    return f"{tag}-{os.urandom(4).hex()}"


def test_a_run_starts_parks_resumes_and_finishes(store: Store) -> None:
    run = run_id("life")
    assert store.get_run(run) is None
    first = store.start_run(run, framework="langgraph", name="approval", owner="w1")
    assert first.outcome == "started" and first.owns and first.run is not None
    assert (first.run.status, first.run.owner, first.run.fence, first.run.attempts) == \
        ("running", "w1", 1, 1)
    assert (first.run.framework, first.run.name) == ("langgraph", "approval")
    waiting = {"interrupts": [{"id": "a" * 32, "value": {"question": "approve?"}}]}
    assert store.end_run(run, owner="w1", fence=1, status="parked", waiting=waiting)
    parked = store.get_run(run)
    assert parked is not None
    assert (parked.status, parked.owner, parked.waiting, parked.error) == \
        ("parked", None, waiting, None)
    # the resume: another executor continues it; the parked detail is gone
    again = store.start_run(run, framework="langgraph", name="approval", owner="w2")
    assert again.outcome == "started" and again.run is not None
    assert (again.run.status, again.run.owner, again.run.fence, again.run.attempts,
            again.run.waiting) == ("running", "w2", 2, 2, None)
    assert store.renew_run(run, owner="w2", fence=2)
    assert store.end_run(run, owner="w2", fence=2, status="done")
    done = store.get_run(run)
    assert done is not None and (done.status, done.owner) == ("done", None)
    assert done.updated_at >= parked.updated_at


def test_a_failed_run_keeps_its_error(store: Store) -> None:
    run = run_id("fail")
    start = store.start_run(run, framework="crewai", name="OrderFlow", owner="w1")
    assert start.run is not None
    error = {"type": "KeyError", "message": "'order_id'"}
    assert store.end_run(run, owner="w1", fence=start.run.fence, status="failed", error=error)
    failed = store.get_run(run)
    assert failed is not None and (failed.status, failed.error) == ("failed", error)
    with pytest.raises(ValueError, match="parked, done, failed or needs-attention"):
        store.end_run(run, owner="w1", fence=1, status="running")  # type: ignore[arg-type]


def test_a_live_executor_is_busy_for_others(store: Store) -> None:
    run = run_id("busy")
    store.start_run(run, framework="fw", name="g", owner="w1", lease=60.0)
    other = store.start_run(run, framework="fw", name="g", owner="w2")
    assert other.outcome == "busy" and not other.owns
    assert other.run is not None and other.run.owner == "w1"
    assert store.start_run(run, framework="fw", name="g", owner="w1").outcome == "reentered"
    assert not store.renew_run(run, owner="w2", fence=1)
    assert not store.end_run(run, owner="w2", fence=1, status="done")
    assert store.recover_run(run, owner="r1").outcome == "busy"  # not abandoned: live
    state = store.get_run(run)
    assert state is not None and (state.status, state.owner) == ("running", "w1")


def test_an_expired_lease_is_abandoned_and_one_recoverer_takes_it(store: Store) -> None:
    run = run_id("dead")
    store.start_run(run, framework="pydantic_graph", name="Ticket", owner="w1", lease=EXPIRED)
    dead = store.get_run(run)
    assert dead is not None and dead.status == "abandoned" and dead.owner == "w1"
    taken = store.recover_run(run, owner="r1", lease=60.0)
    assert taken.outcome == "taken_over" and taken.previous_owner == "w1"
    assert taken.run is not None
    assert (taken.run.status, taken.run.owner, taken.run.fence, taken.run.attempts) == \
        ("running", "r1", 2, 2)
    assert (taken.run.framework, taken.run.name) == ("pydantic_graph", "Ticket")
    assert store.recover_run(run, owner="r2").outcome == "busy"
    # the recoverer continues the run as its executor: its own start is a re-entry
    assert store.start_run(run, framework="pydantic_graph", name="Ticket",
                           owner="r1").outcome == "reentered"
    # the dead executor, if it was only slow, is fenced out
    assert not store.renew_run(run, owner="w1", fence=1)
    assert not store.end_run(run, owner="w1", fence=1, status="done")
    assert store.end_run(run, owner="r1", fence=2, status="done")
    assert store.recover_run(run, owner="r3").outcome == "not_abandoned"
    assert store.recover_run(run_id("none"), owner="r3").outcome == "missing"


def test_a_manual_restart_takes_over_an_abandoned_run(store: Store) -> None:
    run = run_id("manual")
    store.start_run(run, framework="fw", name="g", owner="w1", lease=EXPIRED)
    again = store.start_run(run, framework="fw", name="g", owner="w2")
    assert again.outcome == "taken_over" and again.previous_owner == "w1"


def test_a_failed_run_is_retaken_only_when_asked_and_attempts_are_bounded(
        store: Store) -> None:
    run = run_id("retry")
    start = store.start_run(run, framework="fw", name="g", owner="w1")
    assert start.run is not None
    store.end_run(run, owner="w1", fence=start.run.fence, status="failed",
                  error={"type": "ValueError", "message": "bad"})
    assert store.recover_run(run, owner="r1").outcome == "not_abandoned"
    retried = store.recover_run(run, owner="r1", retry_failed=True, max_attempts=3)
    assert retried.outcome == "taken_over" and retried.run is not None
    assert (retried.run.status, retried.run.attempts, retried.run.error) == ("running", 2, None)
    assert store.recover_run(run, owner="r2", retry_failed=True).outcome == "busy"
    store.end_run(run, owner="r1", fence=retried.run.fence, status="failed", error={"n": 2})
    third = store.recover_run(run, owner="r2", retry_failed=True, max_attempts=3)
    assert third.outcome == "taken_over" and third.run is not None and third.run.attempts == 3
    store.end_run(run, owner="r2", fence=third.run.fence, status="failed", error={"n": 3})
    spent = store.recover_run(run, owner="r3", retry_failed=True, max_attempts=3)
    assert spent.outcome == "exhausted"
    kept = store.get_run(run)
    assert kept is not None and (kept.status, kept.error, kept.attempts) == ("failed", {"n": 3}, 3)


def test_an_abandoned_run_whose_attempts_are_spent_is_recorded_failed(store: Store) -> None:
    run = run_id("poison")
    store.start_run(run, framework="fw", name="g", owner="w1", lease=EXPIRED)
    taken = store.recover_run(run, owner="r1", lease=EXPIRED, max_attempts=2)
    assert taken.outcome == "taken_over"  # the second execution, and it dies too
    spent = store.recover_run(run, owner="r2", max_attempts=2)
    assert spent.outcome == "exhausted"
    failed = store.get_run(run)
    assert failed is not None and failed.status == "failed" and failed.owner is None
    assert failed.error["type"] == "RecoveryExhausted" and "2 executions" in \
        failed.error["message"]
    assert run in listed(store, status="failed")
    assert run not in listed(store, status="abandoned")


def test_an_imported_run_is_recorded_once_and_an_abandoned_one_is_taken(store: Store) -> None:
    """``import_run`` records a stock run's lifecycle where none exists, never over one:
    abandoned (a recovery takes it at once), parked / done / failed as an execution ends."""
    fw = f"imp-{os.urandom(3).hex()}"
    runs = {s: run_id(f"imported-{s}") for s in ("abandoned", "parked", "done", "failed")}
    for status, run in runs.items():
        assert store.import_run(run, framework=fw, name="stock", status=status,  # type: ignore[arg-type]
                                owner="migrate:test", waiting={"node": "B"},
                                error={"type": "Stock", "message": "boom"})
    got = {s: store.get_run(r) for s, r in runs.items()}
    assert {s: (r.status, r.framework, r.name, r.attempts) for s, r in got.items() if r} == {
        s: (s, fw, "stock", 1) for s in runs}
    assert got["abandoned"] is not None and got["abandoned"].owner == "migrate:test"
    assert got["parked"] is not None and got["parked"].waiting == {"node": "B"}
    assert got["failed"] is not None and got["failed"].error["type"] == "Stock"
    assert got["done"] is not None and (got["done"].waiting, got["done"].error) == (None, None)
    assert listed(store, status="abandoned", framework=fw) == [runs["abandoned"]]

    # never over a lifecycle: a second import, or one of a run an adapter keeps
    kept = run_id("kept")
    store.start_run(kept, framework=fw, name="graph", owner="w1")
    for run in (*runs.values(), kept):
        before = store.get_run(run)
        assert not store.import_run(run, framework=fw, name="other", status="done",
                                    owner="migrate:again")
        assert store.get_run(run) == before

    taken = store.take_runs(framework=fw, owner="r1", limit=10)
    assert [(t.run.run_id, t.outcome, t.previous_owner) for t in taken if t.run] == [
        (runs["abandoned"], "taken_over", "migrate:test")]
    with pytest.raises(ValueError, match="not 'running'"):
        store.import_run(run_id("x"), framework=fw, name="n", status="running",  # type: ignore[arg-type]
                         owner="o")


def test_a_run_needing_attention_is_continued_once_settled(store: Store) -> None:
    run = run_id("doubt")
    start = store.start_run(run, framework="fw", name="g", owner="w1")
    assert start.run is not None
    assert store.end_run(run, owner="w1", fence=start.run.fence, status="needs-attention",
                         waiting={"receipt": "k1"})
    held = store.get_run(run)
    assert held is not None and (held.status, held.waiting) == ("needs-attention",
                                                                {"receipt": "k1"})
    assert run in listed(store, status="needs-attention")
    assert store.recover_run(run, owner="r1").outcome == "not_abandoned"
    again = store.recover_run(run, owner="r1", attention=True)
    assert again.outcome == "taken_over" and again.run is not None
    assert (again.run.status, again.run.waiting) == ("running", None)
    assert run not in listed(store, status="needs-attention")


def listed(store: Store, **query: Any) -> list[str]:
    found = store.list_runs(**query)
    assert all(info.lifecycle is not None for info in found)
    return [info.run_id for info in found]


def test_runs_are_listed_by_status_name_and_time_and_page_by_cursor(store: Store) -> None:
    tag = run_id("list")
    runs = {f"{tag}-{i}": i for i in range(7)}
    for run, i in runs.items():
        store.start_run(run, framework="langgraph" if i % 2 else "crewai",
                        name="approval" if i < 4 else "refund", owner=f"w{i}",
                        lease=EXPIRED if i in (1, 2) else 60.0)
    assert store.end_run(f"{tag}-3", owner="w3", fence=1, status="parked", waiting=["why?"])
    assert store.end_run(f"{tag}-4", owner="w4", fence=1, status="failed",
                         error={"type": "E", "message": "m"})
    assert store.end_run(f"{tag}-5", owner="w5", fence=1, status="done")
    mine = set(runs)

    def ours(**query: Any) -> list[str]:
        return [r for r in listed(store, **query) if r in mine]

    assert sorted(ours(status="abandoned")) == [f"{tag}-1", f"{tag}-2"]
    assert sorted(ours(status="running")) == [f"{tag}-0", f"{tag}-6"]
    assert ours(status="parked") == [f"{tag}-3"]
    assert ours(status="failed") == [f"{tag}-4"]
    assert ours(status="done") == [f"{tag}-5"]
    assert sorted(ours(name="approval")) == [f"{tag}-{i}" for i in range(4)]
    assert sorted(ours(name="approval", status="abandoned")) == [f"{tag}-1", f"{tag}-2"]
    assert sorted(ours(framework="crewai")) == [f"{tag}-{i}" for i in (0, 2, 4, 6)]
    everything = ours(framework="langgraph") + ours(framework="crewai")
    assert sorted(everything) == sorted(runs)
    # newest change first; the listing's lifecycle is the stored one, status computed
    states = {info.run_id: info.lifecycle for info in store.list_runs(name="refund")}
    failed = states[f"{tag}-4"]
    assert failed is not None and failed.error == {"type": "E", "message": "m"}
    times = [s.updated_at for s in states.values() if s is not None]
    assert times == sorted(times, reverse=True)
    # pages: the cursor continues after the last run listed, whatever the page size
    pages: list[str] = []
    cursor = None
    while True:
        page = store.list_runs(framework="crewai", limit=2, cursor=cursor)
        assert len(page) <= 2
        pages += [info.run_id for info in page]
        if len(page) < 2:
            break
        last = page[-1].lifecycle
        assert last is not None
        cursor = last.cursor
    assert [r for r in pages if r in mine] == ours(framework="crewai")
    newest = store.get_run(f"{tag}-6")
    assert newest is not None
    assert f"{tag}-6" not in ours(updated_before=newest.updated_at)
    assert f"{tag}-6" in ours(updated_before=newest.updated_at + 1)
    with pytest.raises(ValueError, match="status must be"):
        store.list_runs(status="lost")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cursor"):
        store.list_runs(cursor="not a cursor")


def test_the_plain_listing_shows_a_runs_lifecycle(store: Store) -> None:
    run = run_id("plain")
    store.put_checkpoint(run, "c1", kind="input", data={"x": 1})
    store.start_run(run, framework="fw", name="g", owner="w1")
    info = {i.run_id: i for i in store.list_runs()}[run]
    assert info.checkpoints == 1 and info.latest_checkpoint_id == "c1"
    assert isinstance(info.lifecycle, RunState) and info.lifecycle.status == "running"
    by_status = {i.run_id: i for i in store.list_runs(status="running")}[run]
    assert (by_status.checkpoints, by_status.latest_checkpoint_id) == (1, "c1")


def test_deleting_a_run_deletes_its_lifecycle(store: Store) -> None:
    run = run_id("gone")
    store.put_checkpoint(run, "c1", data={})
    store.start_run(run, framework="fw", name="g", owner="w1")
    store.delete_run(run)
    assert store.get_run(run) is None
    assert run not in listed(store, framework="fw")


def race_for_runs(store_url: str, how: str, runs: list[str], k: int) -> None:
    """``k`` processes race for each of ``runs`` (workers.run_racer ``how``): of each
    run exactly one wins, the others are told ``busy``."""
    barrier = CTX.Barrier(k)
    results = CTX.Queue()
    procs = [CTX.Process(target=workers.run_racer,
                         args=(store_url, how, runs, barrier, results, BREAK == "runs"))
             for _ in range(k)]
    for p in procs:
        p.start()
    got = drain(results, k * len(runs))
    join_all(procs)
    by_run: dict[str, Counter[str]] = defaultdict(Counter)
    for run, _pid, outcome in got:
        by_run[run][outcome] += 1
    wins = workers.RUN_RACES[how][1]
    bad = {r: dict(c) for r, c in by_run.items() if c != Counter({wins: 1, "busy": k - 1})}
    assert len(by_run) == len(runs)
    assert not bad, f"runs without exactly one winner ({how}): {bad}"


def test_eight_recoverers_race_and_one_takes_each_run(store_url: str) -> None:
    runs = [run_id("race") for _ in range(25)]
    with open_store(store_url) as s:
        for run in runs:  # each one's executor died: its lease has run out
            s.start_run(run, framework="fw", name="g", owner=new_owner(), lease=EXPIRED)
    race_for_runs(store_url, "recover", runs, 8)
    with open_store(store_url) as s:
        for run in runs:
            state = s.get_run(run)
            assert state is not None and state.fence == 2 and state.status == "running"


def test_eight_executors_race_to_continue_a_parked_run_and_one_does(store_url: str) -> None:
    """Eight processes start (continue) the same 25 parked runs, each with an owner of
    its own: of each run, exactly one executor gets ``started`` and the others ``busy``
    (on the SQL backends the start of a run that is not running is one conditional
    statement, decisions.CONTINUE_RUN)."""
    runs = [run_id("continue") for _ in range(25)]
    with open_store(store_url) as s:
        for run in runs:
            first = s.start_run(run, framework="fw", name="g", owner="w0")
            assert s.end_run(run, owner="w0", fence=first.run.fence, status="parked")
    race_for_runs(store_url, "continue", runs, 8)
    with open_store(store_url) as s:
        for run in runs:
            state = s.get_run(run)
            assert state is not None and (state.status, state.fence, state.attempts) == (
                "running", 2, 2), state


def test_eight_recoverers_take_batches_and_each_run_goes_to_one(store_url: str) -> None:
    """Eight processes take the same 200 abandoned runs, 7 at a time, until none is
    left (``Store.take_runs``): every run is taken by exactly one of them, none is left."""
    k, n = 8, 200
    framework = f"fw-{os.urandom(4).hex()}"
    runs = [run_id("batch") for _ in range(n)]
    with open_store(store_url) as s:
        for run in runs:
            s.start_run(run, framework=framework, name="g", owner=new_owner(), lease=EXPIRED)
    barrier, results = CTX.Barrier(k), CTX.Queue()
    procs = [CTX.Process(target=workers.batch_taker,
                         args=(store_url, framework, 7, barrier, results, BREAK == "runs"))
             for _ in range(k)]
    for p in procs:
        p.start()
    got = drain(results, k)
    join_all(procs)
    taken = Counter(run for _, ids in got for run in ids)
    twice = {run: c for run, c in taken.items() if c > 1}
    assert not twice, f"{len(twice)} runs taken by more than one recoverer"
    assert set(taken) == set(runs)
    with open_store(store_url) as s:
        assert s.take_runs(framework=framework, owner=new_owner(), limit=10) == []
        states = [s.get_run(run) for run in runs]
        assert all(st is not None and st.status == "running" and st.fence == 2
                   for st in states)


def test_a_store_of_the_older_layout_is_read_without_lifecycles_then_upgraded(
        tmp_path: Any) -> None:
    """A store written before the lifecycle existed: ``remit inspect`` (read-only) lists
    its runs with no lifecycle and changes nothing; the next writable open adds it."""
    import sqlite3

    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    from remit_core.store.sqlite import MIGRATIONS

    before = next(i for i, step in enumerate(MIGRATIONS) if "remit_lifecycle" in step)
    with open_store(url) as s:
        s.put_checkpoint("r1", "c1", data={})
        latest = s.layout_version
    with sqlite3.connect(path) as db:  # back to the layout before the lifecycle
        db.execute("DROP TABLE remit_lifecycle")
        db.execute("DROP INDEX remit_claims_lapsing")  # a later migration's
        db.execute("UPDATE remit_meta SET value = ? WHERE key = 'version'", (str(before),))
    with open_store(url, read_only=True) as s:
        assert s.layout_version == before
        assert [(i.run_id, i.lifecycle) for i in s.list_runs()] == [("r1", None)]
        assert s.get_run("r1") is None and s.list_runs(status="abandoned") == []
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM sqlite_master WHERE name = 'remit_lifecycle'"
                          ).fetchone() == (0,)
    with open_store(url) as s:
        assert s.layout_version == latest
        assert s.start_run("r1", framework="fw", name="g", owner="w").outcome == "started"
        assert [i.lifecycle.status for i in s.list_runs() if i.lifecycle] == ["running"]


def test_a_run_waiting_on_an_unregistered_type_does_not_stop_a_listing(
        store_url: str) -> None:
    """A parked run keeps what it waits for, app types included (here a pydantic model
    defined in this test). A process that has not registered that type still lists every
    run, that one's detail shown as an unregistered type instead of refusing the listing."""
    import pydantic

    class Approval(pydantic.BaseModel):
        amount: float
        items: list[str]

    framework = f"fw-{os.urandom(4).hex()}"
    run = run_id("odd")
    with open_store(store_url) as s:
        for plain in (run_id("plain"), run_id("plain")):
            start = s.start_run(plain, framework=framework, name="g", owner="w")
            assert start.run is not None
            s.end_run(plain, owner="w", fence=start.run.fence, status="parked",
                      waiting=[{"question": "ok?"}])
        start = s.start_run(run, framework=framework, name="g", owner="w")
        assert start.run is not None
        s.end_run(run, owner="w", fence=start.run.fence, status="parked",
                  waiting=[{"value": Approval(amount=12.5, items=["a", "b"])}])
    script = (
        "import sys\n"
        "from remit_core import open_store\n"
        "with open_store(sys.argv[1]) as s:\n"
        "    for status in (None, 'parked'):\n"
        "        runs = s.list_runs(framework=sys.argv[2], status=status)\n"
        "        print(len(runs), *sorted(repr(i.lifecycle.waiting) for i in runs), sep='|')\n")
    out = subprocess.run([sys.executable, "-c", script, store_url, framework],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 2
    for line in lines:
        count, *shown = line.split("|")
        assert count == "3"
        assert shown.count("[{'question': 'ok?'}]") == 2
        odd = [w for w in shown if "question" not in w]
        assert odd == [
            "[{'value': <unregistered type "
            "tests.test_run_lifecycle:test_a_run_waiting_on_an_unregistered_type_does_not_"
            "stop_a_listing.<locals>.Approval>}]"], shown


def test_an_execution_kept_with_its_own_lease_renews_that_lease(store: Store) -> None:
    """``keep_run(..., lease=)``: the execution's lease is its own, not the store's (2 s
    here), and the background keeper renews it every third of it."""
    from remit_core.adapter import keep_run, poll

    run = run_id("short")
    keeper = keep_run(store, run, framework="fw", name="g", lease=0.6)
    first = store.get_run(run)
    assert first is not None and first.status == "running"
    assert first.lease_until - first.updated_at == pytest.approx(0.6, abs=1e-3)

    def renewed() -> bool | None:
        now = store.get_run(run)
        return True if now is not None and now.lease_until > first.lease_until else None

    assert poll(renewed, within=10, pause=0.05, most=0.1)
    assert keeper.end() == "done"
    done = store.get_run(run)
    assert done is not None and done.status == "done"


def test_held_claims_whose_lease_ran_out_are_listed_for_their_parked_runs(
        store: Store) -> None:
    """``list_lapsed_claims``: a held claim whose lease ran out, of a run parked under the
    framework (and name) asked for, is listed, oldest lapse first, paged with ``after``;
    a live, consumed or released claim is not, nor one of a running run or of another
    framework or name; a take-over or a renewal makes it live again, and deleting the run
    removes it."""
    fw = f"fw-{os.urandom(4).hex()}"

    def parked(tag: str, name: str = "review", framework: str = fw) -> str:
        run = run_id(tag)
        store.start_run(run, framework=framework, name=name, owner="w")
        assert store.end_run(run, owner="w", fence=1, status="parked")
        return run

    def claimed(run: str, lease: float = EXPIRED, owner: str = "dead") -> str:
        key = f"{run}:feedback"
        store.claim_once(key, run_id=run, owner=owner, digest="d", value={"ok": True},
                         lease=lease)
        return key

    lapsed = [claimed(parked(f"lapsed{i}")) for i in range(3)]
    claimed(parked("live"), lease=600.0)
    consumed = claimed(parked("consumed"), lease=600.0, owner="c")
    store.consume_claim(consumed, owner="c", fence=1)
    released = claimed(parked("released"), lease=600.0, owner="r")
    assert store.release_claim(released, owner="r", fence=1)
    other_name = claimed(parked("other-name", name="other"))
    claimed(parked("other-framework", framework=f"{fw}-x"))
    running = run_id("running")
    store.start_run(running, framework=fw, name="review", owner="w")
    claimed(running)

    found = store.list_lapsed_claims(framework=fw, name="review")
    assert [c.key for c in found] == lapsed  # in the order their leases lapsed
    assert all((c.status, c.owner, c.value) == ("claimed", "dead", {"ok": True})
               for c in found)
    assert {c.key for c in store.list_lapsed_claims(framework=fw)} == {*lapsed, other_name}
    # paged: one at a time, each page after the last claim of the one before
    pages, after = [], None
    while page := store.list_lapsed_claims(framework=fw, name="review", limit=1, after=after):
        pages.append(page[0].key)
        after = page[-1]
    assert pages == lapsed
    # a recoverer takes the first over (its lease is live again); the second is renewed
    # by its holder; deleting the third's run removes its claim
    taken = store.claim_once(lapsed[0], run_id=found[0].run_id, owner="recoverer",
                             lease=600.0)
    assert taken.taken_over
    assert store.renew_claim(lapsed[1], owner="dead", fence=1, lease=600.0)
    store.delete_run(found[2].run_id)
    assert store.list_lapsed_claims(framework=fw, name="review") == []
    with pytest.raises(ValueError, match="limit"):
        store.list_lapsed_claims(framework=fw, limit=0)


def test_lapsed_claims_are_read_through_their_index(tmp_path: Any) -> None:
    """SQLite answers ``list_lapsed_claims`` from the index of held claims by lease
    expiry (remit_claims_lapsing), not by a scan of the claims or of the parked runs."""
    with open_store(f"sqlite:///{tmp_path / 'plan.db'}") as s:
        for i in range(50):
            run = f"parked-{i}"
            s.start_run(run, framework="fw", name="g", owner="w")
            assert s.end_run(run, owner="w", fence=1, status="parked")
            s.claim_once(f"{run}:k", run_id=run, owner="o", digest="d",
                         lease=EXPIRED if i % 10 == 0 else 600.0)
        conn = s._conn()  # this thread's connection: the statement the listing ran
        seen: list[str] = []
        conn.set_trace_callback(seen.append)
        try:
            assert len(s.list_lapsed_claims(framework="fw", name="g")) == 5
        finally:
            conn.set_trace_callback(None)
        [statement] = [q for q in seen if "remit_claims AS c" in q]
        plan = [row[-1] for row in conn.execute(f"EXPLAIN QUERY PLAN {statement}")]
    assert any("remit_claims_lapsing" in step for step in plan), plan
    assert not any(step.startswith("SCAN") for step in plan), plan


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_take_reads_the_expired_head_of_the_running_runs_through_their_index(
        backend: str, make_url: Any) -> None:
    """take_runs reads the running runs of one framework and name in lease order through
    remit_lifecycle_lapsing and stops at its limit: no scan of the runs and no sort of them
    (without the index, PostgreSQL scanned and sorted every running run of the table for
    each run a recoverer took). PostgreSQL is asked with sequential scans disabled, so the
    plan shows whether the index can serve the statement, whatever the table's size."""
    with open_store(make_url(backend)) as s:
        for i in range(40):
            s.start_run(f"run-{i}", framework="fw", name="g" if i % 4 else "other",
                        owner="dead", lease=EXPIRED if i % 2 else 600.0)
        statement, args = s._take_runs_query("fw", "g", 3)  # type: ignore[attr-defined]
        if backend == "sqlite":
            conn = s._writer()  # type: ignore[attr-defined]
            plan = [row[-1] for row in conn.execute(f"EXPLAIN QUERY PLAN {statement}", args)]
            assert not any(step.startswith("SCAN") or "TEMP B-TREE" in step
                           for step in plan), plan
        else:
            with s._transaction() as conn:  # type: ignore[attr-defined]
                conn.execute("SET LOCAL enable_seqscan = off")
                plan = [row[0] for row in conn.execute(f"EXPLAIN {statement}", args)]
            assert not any("Sort" in step or "Seq Scan" in step for step in plan), plan
        assert any("remit_lifecycle_lapsing" in step for step in plan), plan
        taken = s.take_runs(framework="fw", name="g", owner="w", limit=3, lease=30.0)
    assert len(taken) == 3 and all(t.run is not None and t.run.name == "g" for t in taken)
