"""The take-over warning names the dead owner and the new one (issue 13, item 7).

A real child process starts an effect on a store with a short lease, tells the parent
over a pipe that it is inside the call, and is SIGKILLed there. The parent waits the
lease out (polling the stored lease against the clock), calls the same effect, takes the
receipt over and logs it. A claim taken over tells its previous owner the same way.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import pytest

from remit_core import effect, effect_scope, open_store
from remit_core.store import new_owner
from tests import workers as w

LEASE = 1.0


def _lease_run_out(lease_until: float, deadline: float = 30.0) -> None:
    """Poll the clock until the stored lease has run out (no sleep as synchronisation)."""
    end = time.monotonic() + deadline
    while time.time() <= lease_until + 0.05:
        assert time.monotonic() < end, "the lease did not run out"
        time.sleep(0.02)


def _killed_child(target: object, args: tuple[object, ...]) -> int:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(*args, child))
    proc.start()
    child.close()
    assert parent.poll(60), "the child never reached its point"
    parent.recv()
    pid = proc.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    proc.join(30)
    assert proc.exitcode == -signal.SIGKILL
    return pid


def test_effect_take_over_names_the_dead_owner_and_the_new_one(
        store_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ledger = str(tmp_path / "ledger")
    pid = _killed_child(w.die_inside_effect, (store_url, ledger, True))
    store = open_store(store_url, lease=LEASE)
    try:
        (started,) = store.list_receipts("lv")
        dead = started.owner
        assert dead is not None and f":{pid}:" in dead
        _lease_run_out(started.lease_until)

        @effect(name="pay")
        def pay(*, idempotency_key: str) -> str:
            return f"paid:{idempotency_key}"

        caplog.set_level(logging.WARNING, logger="remit")
        with effect_scope(store, "lv", "step"):
            assert pay() == f"paid:{started.key}"
        (done,) = store.list_receipts("lv")
        new = done.owner
        assert new is not None and new != dead and f":{os.getpid()}:" in new
    finally:
        store.close()
    (record,) = [r for r in caplog.records if "mid-call" in r.getMessage()]
    msg = record.getMessage()
    assert f"owner {dead} died mid-call" in msg, msg
    assert f"taken over by {new}" in msg, msg
    assert f"owner {new} died" not in msg, msg


def test_claim_take_over_tells_the_dead_owner(store_url: str) -> None:
    """A claim taken over says whose it was (``previous_owner``) besides its new owner, so
    that an adapter's warning can name both."""
    pid = _killed_child(w.die_holding_claim, (store_url, "gate", "yes"))
    store = open_store(store_url, lease=LEASE)
    try:
        held = store.get_claim("gate")
        assert held is not None and held.owner is not None and f":{pid}:" in held.owner
        _lease_run_out(held.lease_until)
        me = new_owner()
        took = store.claim_once("gate", run_id="lv", owner=me, digest="d-yes")
        assert took.taken_over and took.owner == me and took.fence == held.fence + 1
        assert took.previous_owner == held.owner
        again = store.claim_once("gate", run_id="lv", owner=me, digest="d-yes")
        assert not again.taken_over and again.previous_owner is None
    finally:
        store.close()
