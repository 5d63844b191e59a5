"""Races and crashes with real OS processes, a barrier and SIGKILL, on every backend.

Each test can fail; switch a protection off with REMIT_TEST_BREAK to see it:
``claims`` (a check-then-act gate in the claim racers), ``effects`` (racers call
the effect with no scope, so no receipt), ``atomic-write`` (the writer stores a
checkpoint and its values in two transactions, and is killed between them).
"""

from __future__ import annotations

import os
import queue
import random
import signal
import sqlite3
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from remit_core import open_store
from remit_core.store import new_owner
from tests import procs, workers

CTX = procs.CTX
BREAK = os.environ.get("REMIT_TEST_BREAK", "")


def drain(results: Any, n: int, timeout: float = 120.0) -> list[Any]:
    out = []
    for _ in range(n):
        try:
            out.append(results.get(timeout=timeout))
        except queue.Empty:
            raise AssertionError(f"only {len(out)} of {n} results arrived") from None
    return out


def join_all(procs: list[Any]) -> None:
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0, f"worker {p.pid} exited with {p.exitcode}"


@pytest.mark.slow
def test_claim_race_16_processes_50_rounds(store_url: str) -> None:
    k, rounds = 16, 50
    open_store(store_url).close()  # create the schema once, before the racers
    barrier = CTX.Barrier(k)
    results = CTX.Queue()
    procs = [CTX.Process(target=workers.claim_racer,
                         args=(store_url, rounds, barrier, results, BREAK == "claims"))
             for _ in range(k)]
    for p in procs:
        p.start()
    got = drain(results, k * rounds)
    join_all(procs)
    by_round: dict[int, Counter[str]] = defaultdict(Counter)
    for i, _pid, verdict, _owner in got:
        by_round[i][verdict] += 1
    bad = {i: dict(c) for i, c in by_round.items() if c != Counter(won=1, conflict=k - 1)}
    assert len(by_round) == rounds
    assert not bad, f"rounds without exactly one winner: {bad}"
    with open_store(store_url) as s:
        claims = s.list_claims("race")
        assert len(claims) == rounds
        winners = {i: o for i, _, v, o in got if v == "won"}
        assert all(c.owner == winners[int(c.key.split("-")[1])] for c in claims)


@pytest.mark.slow
def test_effect_race_8_processes(store_url: str, tmp_path: Path) -> None:
    k, rounds = 8, 10
    open_store(store_url).close()
    ledger = tmp_path / "ledger.txt"
    barrier = CTX.Barrier(k)
    results = CTX.Queue()
    procs = [CTX.Process(target=workers.effect_racer,
                         args=(store_url, str(ledger), rounds, barrier, results))
             for _ in range(k)]
    for p in procs:
        p.start()
    got = drain(results, k * rounds)
    join_all(procs)
    calls = Counter(int(line.split()[0]) for line in ledger.read_text().splitlines())
    assert calls == Counter({i: 1 for i in range(rounds)}), f"body ran per round: {calls}"
    per_round: dict[int, list[Any]] = defaultdict(list)
    for i, _pid, result in got:
        per_round[i].append(result)
    for i, seen in per_round.items():
        assert len(seen) == k and all(r == seen[0] for r in seen), f"round {i}: {seen}"


def _spawn_and_wait(target: Any, *args: Any) -> tuple[Any, Any, Any]:
    parent, child = CTX.Pipe()
    proc = CTX.Process(target=target, args=(*args, child))
    proc.start()
    assert parent.poll(60), "child did not reach the kill point"
    return proc, parent, parent.recv()


def _kill(proc: Any, conn: Any) -> None:
    """SIGKILL the child. ``conn``, the parent's end of its pipe, is kept open until then:
    a child that read EOF would leave its kill point on its own."""
    os.kill(proc.pid, signal.SIGKILL)
    conn.close()
    proc.join(timeout=30)
    assert proc.exitcode == -signal.SIGKILL


@pytest.mark.slow
def test_owner_dies_holding_claim(store_url: str) -> None:
    open_store(store_url).close()
    proc, conn, (_, dead_owner, fence) = _spawn_and_wait(
        workers.die_holding_claim, store_url, "gate", {"answer": 42})
    _kill(proc, conn)
    with open_store(store_url) as s:
        from remit_core import ConsumeConflict

        with pytest.raises(ConsumeConflict):  # the lease is still live right after the kill
            s.claim_once("gate", run_id="lv", owner=new_owner(), lease=1.0)
        me = new_owner()
        took = None

        def try_take() -> bool:
            nonlocal took
            try:
                took = s.claim_once("gate", run_id="lv", owner=me, lease=5.0)
                return True
            except ConsumeConflict:
                return False

        workers.spin_until(try_take)
        assert took is not None and took.taken_over and took.fence == fence + 1
        assert took.value == {"answer": 42} and took.owner == me != dead_owner
        s.consume_claim("gate", owner=me, fence=took.fence)


@pytest.mark.slow
@pytest.mark.parametrize("with_key", [True, False], ids=["idempotency-key", "no-key"])
def test_owner_dies_inside_effect(store_url: str, tmp_path: Path, with_key: bool) -> None:
    open_store(store_url).close()
    ledger = tmp_path / "ledger.txt"
    proc, conn, (_, key) = _spawn_and_wait(workers.die_inside_effect, store_url, str(ledger),
                                        with_key)
    _kill(proc, conn)
    with CTX.Pool(1) as pool:
        # a fresh process; the effect's lease (1 s) expires while it waits (bounded wait)
        verdict, value = pool.apply(workers.recover_effect, (store_url, str(ledger), with_key))
    lines = ledger.read_text().splitlines()
    if with_key:
        assert verdict == "ok" and value == f"paid:{key}"
        assert lines == [f"call {key}", f"call {key}"]  # re-called with the same key
    else:
        assert verdict == "in_doubt" and value["owner"] is not None
        assert lines == ["call"]  # never silently re-fired


@pytest.mark.slow
def test_killed_mid_write_sqlite(make_url: Any) -> None:
    url = make_url("sqlite")
    path = url.removeprefix("sqlite:///")
    open_store(url).close()
    rng = random.Random(20261130)
    kills = 24
    last_committed = -1
    for _ in range(kills):
        parent, child = CTX.Pipe()
        proc = CTX.Process(target=workers.writer_until_killed, args=(url, child, 64 * 1024))
        proc.start()
        target = rng.randint(1, 12)
        seen = 0
        while seen < target:  # kill at a random point: after the target-th commit report
            assert parent.poll(60), "writer stalled"
            msg = parent.recv()
            if isinstance(msg, tuple):  # REMIT_TEST_BREAK=atomic-write: kill in the gap
                break
            last_committed = max(last_committed, msg)
            seen += 1
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(timeout=30)
        while parent.poll():  # reports that were in flight when it died
            msg = parent.recv()
            last_committed = max(last_committed, msg if isinstance(msg, int) else -1)
        conn = sqlite3.connect(path)
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        conn.close()
        with open_store(url) as s:
            latest = s.get_checkpoint("w")
            assert latest is not None
            i = latest.metadata["i"]
            assert i >= last_committed  # everything reported as committed is there
            assert latest.values["blob"] == workers.expected_payload(i, 64 * 1024)
            c = s.get_checkpoint("w", f"c{last_committed:06d}")
            assert c is not None and c.values["i"] == last_committed
            assert [w.value for w in c.writes] == [f"n{last_committed}",
                                                   bytes([last_committed % 256])]
            # the next writer continues the history
            s.delete_run("w")
        last_committed = -1
