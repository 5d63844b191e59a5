"""Every backend decides as the pure functions of ``remit_core.store.decisions``.

The SQL backends call those functions; the Redis backend runs the same decision tables
in its Lua scripts. For every combination of the facts a decision depends on -- the
stored record (none, or each status, lease live or expired, digest and value set or
not), the caller (the holder, another owner, an older or newer fence) and the request
(each operation, with each kind of digest and value) -- the test writes the record
straight into the backend, runs the backend's primitive (``_start_receipt``, ``_claim``,
``_consume_claim``, ``_renew_claim`` ...) and checks that its outcome, the record it
returns and the record it leaves stored are those of the pure function's verdict, on
SQLite, on PostgreSQL and on a real Redis.

The combinations are enumerated, not sampled: a random draw reaches a branch that needs
five facts at once (the holder consumes a claimed record with a digest, giving none)
in too few runs. Leases are set far from the clock (expired 1000 s ago, or running for
1000 s more), so that no outcome depends on when the server reads its clock; the times
a verdict writes (``now + lease``, ``now``) are compared to the test's clock within a
second.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from remit_core.records import ClaimRow, ReceiptRow
from remit_core.store import Store, decisions
from remit_core.store.decisions import Verdict
from remit_core.store.redis import RedisStore
from remit_core.store.sql import SqlStore

TIMES = ("lease_until", "started_at", "completed_at", "claimed_at", "consumed_at")
FAR = 1000.0  # seconds between a stored lease's end and now
HOLDER, FENCE = "a", 2  # the stored record's owner and fence
CALLERS = list(itertools.product(["a", "b"], [1, 2, 3]))  # (owner, fence): older, same, newer


# ------------------------------------------------------------------- the record, stored raw


def _redis_fields(row: ReceiptRow | ClaimRow) -> dict[str, Any]:
    """A record as the Lua scripts store it: times with six decimals, None left out."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(row):
        v = getattr(row, f.name)
        if v is None or f.name == "previous_owner":
            continue
        out[f.name] = f"{v:.6f}" if f.name in TIMES else v
    return out


def store_raw(store: Store, key: str, row: ReceiptRow | ClaimRow | None, *,
              receipt: bool) -> Any:
    """Put ``row`` as record ``key`` behind the backend's back (or none), and return it as
    the backend reads it back."""
    if isinstance(store, RedisStore):
        name = store._k.rc(key) if receipt else store._k.cl(key)
        store._redis.delete(name)
        if row is not None:
            store._redis.hset(name, mapping=_redis_fields(row))  # type: ignore[arg-type]
    else:
        assert isinstance(store, SqlStore)
        records: Any = store._receipts if receipt else store._claims
        with store._writing() as conn:
            conn.execute(records.delete, {"key": key})
            if row is not None:
                SqlStore._apply(conn, records, Verdict(None, row, "insert"))
    return store._get_receipt(key) if receipt else store._get_claim(key)


def alike(got: Any, want: Any) -> bool:
    """Equal records, times within a second (the backend read its own clock)."""
    if got is None or want is None:
        return got is want
    for f in dataclasses.fields(want):
        a, b = getattr(got, f.name), getattr(want, f.name)
        if f.name in TIMES and a is not None and b is not None:
            if abs(a - b) > 1.0:
                return False
        elif a != b:
            return False
    return True


def left_stored(cur: Any, verdict: Verdict[Any, Any]) -> Any:
    """What the verdict leaves in the store."""
    if verdict.write == "delete":
        return None
    if verdict.write == "none":
        return cur
    return dataclasses.replace(verdict.row, previous_owner=None)  # previous_owner: not stored


Case = tuple[str, Any, Callable[[str, Any, float], Verdict[Any, Any]], Callable[[str], Any]]


def check_all(store: Store, stored: list[Any], requests: list[Case], *, receipt: bool) -> int:
    """Run every request on every stored record; fail with the first mismatches. Returns
    the number of cases."""
    read = store._get_receipt if receipt else store._get_claim
    failures: list[str] = []
    n = 0
    for make, (what, request, decide, call) in itertools.product(stored, requests):
        n += 1
        key = f"{'k' if receipt else 'g'}-{uuid.uuid4().hex[:10]}"
        cur = store_raw(store, key, make(key, time.time()), receipt=receipt)
        want = decide(key, cur, time.time())
        got = call(key)
        outcome, row = got if isinstance(got, tuple) else (got, None)
        returned_ok = not isinstance(got, tuple) or alike(row, want.row)
        left = read(key)
        if outcome != want.outcome or not returned_ok or not alike(left, left_stored(cur, want)):
            failures.append(f"{what} {request} on {cur}:\n  backend: {got}, stored {left}"
                            f"\n  decided: {want}")
    assert not failures, f"{len(failures)} of {n} cases differ:\n" + "\n".join(failures[:5])
    return n


# ---------------------------------------------------------------------------------- receipts


def stored_receipts() -> Iterator[Callable[[str, float], ReceiptRow | None]]:
    yield lambda key, now: None
    for status, live in itertools.product(["started", "completed"], [True, False]):
        def make(key: str, now: float, status: str = status, live: bool = live) -> ReceiptRow:
            done = status == "completed"
            return ReceiptRow(key, "r", "s", "n", 0,
                              status, HOLDER, FENCE,  # type: ignore[arg-type]
                              now + (FAR if live else -FAR), now - 2 * FAR,
                              now - FAR if done else None, b"\x01stored" if done else None, 2)
        yield make


LEASE = 5.0
RESULT = b"\x01done"


def change_case(what: str, change: decisions.Change, owner: str, fence: int,
                call: Callable[[str], bool]) -> Case:
    def decide(key: str, cur: Any, now: float) -> Verdict[Any, Any]:
        return decisions.apply(change, cur, owner=owner, fence=fence, now=now, lease=LEASE,
                               result=RESULT)

    return what, (owner, fence), decide, call


def receipt_requests(store: Store) -> Iterator[Case]:
    def start(owner: str, take: bool) -> Case:
        def decide(key: str, cur: Any, now: float) -> Verdict[Any, Any]:
            return decisions.start_receipt(cur, key=key, run_id="r", step="s", name="n",
                                           ordinal=0, owner=owner, lease=LEASE,
                                           may_take_over=take, now=now)

        def call(key: str) -> Any:
            return store._start_receipt(key, "r", "s", "n", 0, owner, LEASE, take)

        return "start_receipt", (owner, take), decide, call

    def fenced(owner: str, fence: int) -> Iterator[Case]:
        yield change_case("complete", decisions.COMPLETE_RECEIPT, owner, fence,
                          lambda key: store._complete_receipt(key, owner, fence, RESULT))
        yield change_case("release", decisions.RELEASE_RECEIPT, owner, fence,
                          lambda key: store._release_receipt(key, owner, fence))
        yield change_case("renew", decisions.RENEW_RECEIPT, owner, fence,
                          lambda key: store._renew_receipt(key, owner, fence, LEASE))
        yield change_case("resolve", decisions.RESOLVE_RECEIPT, owner, fence,
                          lambda key: store._resolve_receipt(key, RESULT))

    for owner, fence in CALLERS:
        yield start(owner, True)
        yield start(owner, False)
        yield from fenced(owner, fence)


def test_receipts_decide_as_the_pure_functions(store: Store) -> None:
    n = check_all(store, list(stored_receipts()), list(receipt_requests(store)), receipt=True)
    assert n == 5 * 36


# ------------------------------------------------------------------------------------ claims


def stored_claims() -> Iterator[Callable[[str, float], ClaimRow | None]]:
    yield lambda key, now: None
    for status, live, digest, value in itertools.product(
            ["claimed", "consumed", "released"], [True, False], [None, "d1"], [None, b"\x01v1"]):
        def make(key: str, now: float, status: str = status, live: bool = live,
                 digest: str | None = digest, value: bytes | None = value) -> ClaimRow:
            return ClaimRow(key, "r", status, HOLDER, FENCE,  # type: ignore[arg-type]
                            now + (FAR if live else -FAR), digest, value, now - 2 * FAR,
                            now - FAR if status == "consumed" else None)
        yield make


def claim_requests(store: Store) -> Iterator[Case]:
    def claim(owner: str, digest: str | None, value: bytes | None) -> Case:
        def decide(key: str, cur: Any, now: float) -> Verdict[Any, Any]:
            return decisions.claim(cur, key=key, run_id="r", owner=owner, lease=LEASE,
                                   digest=digest, value=value, now=now)

        def call(key: str) -> Any:
            return store._claim(key, "r", owner, LEASE, digest, value)

        return "claim", (owner, digest, value), decide, call

    def consume(owner: str, fence: int, digest: str | None) -> Case:
        def decide(key: str, cur: Any, now: float) -> Verdict[Any, Any]:
            return decisions.consume_claim(cur, owner=owner, fence=fence, digest=digest,
                                           now=now)

        def call(key: str) -> Any:
            return store._consume_claim(key, owner, fence, digest)

        return "consume", (owner, fence, digest), decide, call

    def fenced(owner: str, fence: int) -> Iterator[Case]:
        yield change_case("release", decisions.RELEASE_CLAIM, owner, fence,
                          lambda key: store._release_claim(key, owner, fence))
        yield change_case("renew", decisions.RENEW_CLAIM, owner, fence,
                          lambda key: store._renew_claim(key, owner, fence, LEASE))

    for owner, fence in CALLERS:
        for digest, value in itertools.product([None, "d1", "d2"], [None, b"\x01v2"]):
            yield claim(owner, digest, value)
        for digest in (None, "d1", "d2"):
            yield consume(owner, fence, digest)
        yield from fenced(owner, fence)


def test_claims_decide_as_the_pure_functions(store: Store) -> None:
    n = check_all(store, list(stored_claims()), list(claim_requests(store)), receipt=False)
    assert n == 25 * 66
