"""The message of a refused claim says whose it is, whether its lease still runs, until
when (ISO 8601 UTC and "in N s" / "N s ago") and what to do (issue 13, item 9)."""

from __future__ import annotations

import datetime as dt
import re
import time
from dataclasses import replace

import pytest

from remit_core import ConsumeConflict
from remit_core.store import Store, new_owner

ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"
RAW_EPOCH = re.compile(r"\b1\d{9}(\.\d+)?\b")


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_held_claim_says_the_lease_is_running(store: Store) -> None:
    holder = new_owner()
    held = store.claim_once("gate", run_id="r", owner=holder, digest="d1", lease=40.0)
    with pytest.raises(ConsumeConflict) as info:
        store.claim_once("gate", run_id="r", owner=new_owner(), digest="d1")
    exc = info.value
    msg = str(exc)
    assert exc.key == "gate" and exc.run_id == "r" and exc.owner == holder
    assert exc.status == "claimed" and exc.consumed_at is None
    assert holder in msg
    assert "lease is still running" in msg, msg
    assert f"until {_iso(held.lease_until)}" in msg, msg
    left = re.search(r"\(in (\d+) s\)", msg)
    assert left is not None and 35 <= int(left.group(1)) <= 40, msg
    assert "won the race" not in msg and not RAW_EPOCH.search(msg), msg
    assert "retry" in msg.lower()


def test_lapsed_claim_says_the_lease_ran_out(store: Store) -> None:
    """A claim whose holder stopped renewing it, met with a different value: the message
    says that the lease lapsed, when, how long ago, and what to do."""
    holder = new_owner()
    held = store.claim_once("gate", run_id="r", owner=holder, digest="d1", value="yes",
                            lease=0.2)
    end = time.monotonic() + 30
    while time.time() <= held.lease_until + 1.05:  # wait the lease out (plus 1 s to see)
        assert time.monotonic() < end
        time.sleep(0.02)
    with pytest.raises(ConsumeConflict) as info:
        store.claim_once("gate", run_id="r", owner=new_owner(), digest="d2", value="no")
    exc = info.value
    msg = str(exc)
    assert exc.owner == holder and exc.status == "claimed"
    assert holder in msg
    assert "lapsed" in msg and f"at {_iso(held.lease_until)}" in msg, msg
    ago = re.search(r"\((\d+) s ago\)", msg)
    assert ago is not None and 1 <= int(ago.group(1)) <= 30, msg
    assert "resume without a new value" in msg
    assert not RAW_EPOCH.search(msg), msg


def test_held_claim_past_its_lease_on_this_clock(store: Store) -> None:
    """The store decides on its own clock; when this host's clock is past the lease
    (skew), the message says the lease lapsed instead of counting down."""
    holder = new_owner()
    store.claim_once("gate", run_id="r", owner=holder, lease=5.0)
    claim = store.get_claim("gate")
    assert claim is not None
    exc = store._claim_conflict(replace(claim, lease_until=time.time() - 12), "held")
    msg = str(exc)
    assert "lapsed" in msg and "ago" in msg and holder in msg, msg
    assert "next resume takes it over" in msg, msg


def test_consumed_claim_has_an_iso_time(store: Store) -> None:
    holder = new_owner()
    c = store.claim_once("gate", run_id="r", owner=holder, digest="d1")
    done = store.consume_claim("gate", owner=holder, fence=c.fence)
    with pytest.raises(ConsumeConflict) as info:
        store.claim_once("gate", run_id="r", owner=new_owner(), digest="d1")
    msg = str(info.value)
    assert info.value.consumed_at == done.consumed_at
    assert done.consumed_at is not None and _iso(done.consumed_at) in msg, msg
    assert not RAW_EPOCH.search(msg), msg
