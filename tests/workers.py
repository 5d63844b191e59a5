"""Code that runs in child OS processes for the race and crash tests.

Children are forked from the suite's fork server (tests/procs.py: a clean process that
preloaded the worker modules; each child is a new process with no state of the parent), are
released together by a ``multiprocessing.Barrier``, and report back through
queues or pipes. A child that must die at a chosen point tells the parent it
reached the point and then blocks on a pipe; the parent SIGKILLs it there.
No sleeps are used for synchronisation.
"""

from __future__ import annotations

import contextlib
import os
import time
from multiprocessing.connection import Connection
from typing import Any

# the oracle: every real call of an effect body appends one line (O_APPEND, fsync), with
# the check harness's own ledger writer
from remit_check.harness import note
from remit_core import ConsumeConflict, EffectInDoubt, effect, effect_scope, open_store
from remit_core.store import new_owner


def claim_racer(url: str, rounds: int, barrier: Any, results: Any, broken: bool) -> None:
    """Claim key ``round-i`` once per round, released with the others by the barrier.

    ``broken`` switches the protection off (a check-then-act claim across two
    operations), to show that the test can fail.
    """
    store = open_store(url)
    try:
        for i in range(rounds):
            key = f"round-{i}"
            owner = new_owner()
            barrier.wait()
            try:
                if broken:
                    # protection off: decide by a read, then write unconditionally
                    if store.get_claim(key) is not None:
                        raise ConsumeConflict("taken", key=key, owner=None)
                    with contextlib.suppress(ConsumeConflict):
                        store.claim_once(key, run_id="race", owner=owner, lease=60.0)
                else:
                    store.claim_once(key, run_id="race", owner=owner, lease=60.0)
                results.put((i, os.getpid(), "won", owner))
            except ConsumeConflict as exc:
                results.put((i, os.getpid(), "conflict", exc.owner))
    finally:
        store.close()


def effect_racer(url: str, ledger: str, rounds: int, barrier: Any, results: Any) -> None:
    """Call one effect key per round at the same moment as the other racers."""
    store = open_store(url, lease=10.0)

    @effect(name="charge")
    def charge(round_no: int, *, idempotency_key: str) -> dict[str, Any]:
        note(ledger, f"{round_no} {os.getpid()} {idempotency_key}")
        return {"txn": f"txn-{round_no}-{os.getpid()}", "key": idempotency_key}

    broken = os.environ.get("REMIT_TEST_BREAK") == "effects"
    try:
        for i in range(rounds):
            barrier.wait()
            if broken:  # protection off: no scope, so no receipt
                results.put((i, os.getpid(), charge(i, idempotency_key=f"race|step-{i}")))
                continue
            with effect_scope(store, "race", f"step-{i}"):
                results.put((i, os.getpid(), charge(i)))
    finally:
        store.close()


def die_holding_claim(url: str, key: str, value: Any, conn: Connection) -> None:
    """Claim ``key`` with ``value``, report, then block until SIGKILLed."""
    store = open_store(url)
    claim = store.claim_once(key, run_id="lv", owner=new_owner(), digest="d-" + str(value),
                             value=value, lease=1.0)
    conn.send(("claimed", claim.owner, claim.fence))
    conn.recv()  # blocks: the parent kills us here


def die_inside_effect(url: str, ledger: str, with_key: bool, conn: Connection) -> None:
    """Start an effect (the external call happens), report, then block until SIGKILLed."""
    store = open_store(url, lease=1.0)

    if with_key:
        @effect(name="pay")
        def pay(*, idempotency_key: str) -> str:
            note(ledger, f"call {idempotency_key}")
            conn.send(("inside", idempotency_key))
            conn.recv()  # the process dies after the external call, before the receipt
            return "never"

        target: Any = pay
    else:
        @effect(name="pay")
        def pay_no_key() -> str:
            note(ledger, "call")
            conn.send(("inside", None))
            conn.recv()
            return "never"

        target = pay_no_key

    with effect_scope(store, "lv", "step"):
        target()


def recover_effect(url: str, ledger: str, with_key: bool) -> tuple[str, Any]:
    """In a fresh process: call the same effect after the owner died."""
    store = open_store(url, lease=1.0)

    @effect(name="pay")
    def pay(*, idempotency_key: str) -> str:
        note(ledger, f"call {idempotency_key}")
        return f"paid:{idempotency_key}"

    @effect(name="pay")
    def pay_no_key() -> str:
        note(ledger, "call")
        return "paid"

    try:
        with effect_scope(store, "lv", "step"):
            return ("ok", pay() if with_key else pay_no_key())
    except EffectInDoubt as exc:
        return ("in_doubt", {"key": exc.key, "owner": exc.owner})
    finally:
        store.close()


def writer_until_killed(url: str, conn: Connection, payload_size: int) -> None:
    """Write checkpoints and writes in a loop, reporting each committed index."""
    store = open_store(url)
    broken = os.environ.get("REMIT_TEST_BREAK") == "atomic-write"
    parent = None
    i = 0
    while True:
        cid = f"c{i:06d}"
        values = {"blob": (str(i), expected_payload(i, payload_size)), "i": (str(i), i)}
        if broken:  # protection off: the checkpoint and its values in two transactions
            store.put_checkpoint("w", cid, parent_id=parent, metadata={"i": i},
                                 versions={k: v for k, (v, _) in values.items()})
            conn.send(("checkpoint-only", i))
        store.put_checkpoint("w", cid, parent_id=parent, metadata={"i": i}, new_values=values)
        store.put_writes("w", cid, "task", [(0, "note", f"n{i}"), (1, "blob", bytes([i % 256]))])
        conn.send(i)
        parent = cid
        i += 1


def expected_payload(i: int, size: int) -> bytes:
    return (f"{i:08d}".encode() * (size // 8 + 1))[:size]


def spin_until(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.01)


#: what a racer of :func:`run_racer` does to a run, the status it finds the run in before,
#: and the outcome it gets when it wins
RUN_RACES = {"recover": ("abandoned", "taken_over"), "continue": ("parked", "started")}


def run_racer(url: str, how: str, runs: list[str], barrier: Any, results: Any,
              broken: bool) -> None:
    """Start each run of ``runs`` with an owner of its own, released with the other
    racers by the barrier before each run, and put (run, pid, outcome): ``how``
    "recover" takes an abandoned run for recovery, "continue" starts a parked one again.

    ``broken`` switches the protection off: a racer that decides by a read (the run is
    abandoned, or parked, so it is mine), to show that the test can fail.
    """
    status, wins = RUN_RACES[how]
    store = open_store(url)
    try:
        for run in runs:
            owner = new_owner()
            barrier.wait()
            if broken:
                state = store.get_run(run)
                won = state is not None and state.status == status
                results.put((run, os.getpid(), wins if won else "busy"))
            elif how == "recover":
                results.put((run, os.getpid(), store.recover_run(run, owner=owner).outcome))
            else:
                started = store.start_run(run, framework="fw", name="g", owner=owner)
                results.put((run, os.getpid(), started.outcome))
    finally:
        store.close()


def batch_taker(url: str, framework: str, limit: int, barrier: Any, results: Any,
                broken: bool) -> None:
    """Take the abandoned runs of ``framework``, ``limit`` at a time, until none is left,
    released with the other takers by the barrier; put (pid, [run ids taken]).

    ``broken`` switches the protection off: the runs listed as abandoned are taken by a
    read (check-then-act), to show that the test can fail."""
    store = open_store(url)
    try:
        if broken:
            break_recovery(store)
        owner, taken = new_owner(), []
        barrier.wait()
        while batch := store.take_runs(framework=framework, owner=owner, limit=limit,
                                       lease=600.0):
            taken += [start.run.run_id for start in batch if start.run is not None]
        results.put((os.getpid(), taken))
    finally:
        store.close()


def recover_until_done(store: Any, run_ids: list[str], one_pass: Any, passes: int
                       ) -> tuple[list[str], list[str], str]:
    """A surviving chaos recoverer: ``one_pass()`` (a recovery pass, returning its report)
    again each time one of ``run_ids`` reads as abandoned (a killed recoverer's lease ran
    out), until every one is done, at most ``passes`` passes. Returns (recovered, failed
    or needing attention, why it stopped)."""
    from remit_core.adapter import poll

    recovered: list[str] = []
    failed: list[str] = []

    def next_step() -> str | None:
        runs = [store.get_run(r) for r in run_ids]
        if all(r is not None and r.status == "done" for r in runs):
            return "all done"
        if any(r is not None and r.status == "abandoned" for r in runs):
            return "work"
        return None

    for _ in range(passes):
        report = one_pass()
        recovered += report.recovered
        failed += [*report.failed, *report.attention]
        step = poll(next_step, within=120, pause=0.05, most=0.25)
        if step != "work":
            break
    else:
        step = f"gave up after {passes} passes"
    return sorted(recovered), sorted(failed), str(step)


def break_recovery(store: Any) -> None:
    """REMIT_TEST_BREAK=recovery (and =runs in the store's race): the protection off in a
    recoverer. It decides by a read that a run is abandoned and goes on with it
    (check-then-act), without the atomic take of ``Store.recover_run`` or
    ``Store.take_runs``, so that k recoverers can all continue one run."""
    import dataclasses

    from remit_core.adapter import RunStart

    def by_a_read(run_id: str, *, owner: str, **kwargs: Any) -> RunStart:
        seen = store.get_run(run_id)
        if seen is None or seen.status != "abandoned":
            return RunStart("not_abandoned", seen)
        return RunStart("taken_over", dataclasses.replace(seen, owner=owner,
                                                          status="running"))

    listed: set[str] = set()  # (a read does not change what the next one lists)

    def listed_by_a_read(*, framework: str, owner: str, limit: int, name: str | None = None,
                         **kwargs: Any) -> list[RunStart]:
        found = [info.lifecycle for info in store.list_runs(
            status="abandoned", framework=framework, name=name, limit=limit + len(listed))
            if info.lifecycle is not None and info.run_id not in listed][:limit]
        listed.update(run.run_id for run in found)
        return [RunStart("taken_over", dataclasses.replace(run, owner=owner,
                                                           status="running"))
                for run in found]

    store.recover_run = by_a_read
    store.take_runs = listed_by_a_read
