"""A recovery can wait for a dead holder's lease instead of failing (issue 13 item 9).

A child process claims a slot and is SIGKILLed holding it (its lease still runs). A
delivery of a new value never waits; a recovery (no new value) raises at once by
default, and with the store's ``wait=`` option waits for the lease to run out and takes
the claim over -- one call, no retry loop in the caller.
"""

from __future__ import annotations

import os
import signal
import time
from multiprocessing.connection import Connection

import pytest

from remit_core import ConsumeConflict, open_store
from remit_core.errors import StoreConfigError
from remit_core.store import new_owner
from tests import procs

CTX = procs.CTX
LEASE = 3.0


def _claim_and_hang(url: str, key: str, conn: Connection) -> None:
    store = open_store(url, lease=LEASE)
    claim = store.claim_once(key, run_id="r", owner=new_owner(), digest="d1", value="v1")
    conn.send(claim.owner)
    conn.recv()  # never answered: the parent SIGKILLs this process


def _dead_holder(url: str, key: str) -> str:
    parent, child = CTX.Pipe()
    proc = CTX.Process(target=_claim_and_hang, args=(url, key, child))
    proc.start()
    assert parent.poll(60)
    owner = str(parent.recv())
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(timeout=30)
    assert proc.exitcode == -signal.SIGKILL
    return owner


def test_a_recovery_waits_for_the_lease_with_wait(store_url: str) -> None:
    dead = _dead_holder(store_url, "k-wait")
    sep = "&" if "?" in store_url else "?"
    with open_store(f"{store_url}{sep}wait=30") as store:
        assert store.wait == 30.0
        held = store.get_claim("k-wait")
        assert held is not None and held.owner == dead and held.status == "claimed"

        with pytest.raises(ConsumeConflict) as lost:  # a delivery never waits
            store.claim_once("k-wait", run_id="r", owner=new_owner(), digest="d2", value="v2")
        assert lost.value.status == "claimed" and time.time() < held.lease_until

        started = time.monotonic()
        claim = store.claim_once("k-wait", run_id="r", owner=new_owner())  # a recovery

        assert claim.taken_over and claim.previous_owner == dead and claim.value == "v1"
        assert time.time() >= held.lease_until
        assert time.monotonic() - started < LEASE + 10


def test_a_recovery_raises_at_once_without_wait(store_url: str) -> None:
    _dead_holder(store_url, "k-now")
    with open_store(store_url) as store:
        held = store.get_claim("k-now")
        assert held is not None and store.wait == 0.0
        started = time.monotonic()
        with pytest.raises(ConsumeConflict, match="wait=SECONDS") as refused:
            store.claim_once("k-now", run_id="r", owner=new_owner())
        if time.time() < held.lease_until:  # (the lease may have run out meanwhile)
            assert refused.value.status == "claimed"
        assert time.monotonic() - started < 1.0
        # the same store, asked to wait for this one call
        claim = store.claim_once("k-now", run_id="r", owner=new_owner(), wait=30)
        assert claim.taken_over


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "soon", "86401"])
def test_wait_is_bounded(tmp_path: object, value: str) -> None:
    with pytest.raises(StoreConfigError, match="wait"):
        open_store(f"sqlite:///{tmp_path}/w.db?wait={value}")
