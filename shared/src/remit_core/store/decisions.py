"""The receipt, claim and run-lifecycle decisions of the contract, written once, as pure
functions.

Each function takes the stored record (``None`` when there is none), the request and
``now`` (the backend's clock, epoch seconds) and returns a :class:`Verdict`: the
outcome, the record as the caller gets it, and what to write. It reads and writes
nothing itself. A backend applies the verdict inside the one atomic operation in which it
read the record -- SQLite's ``BEGIN IMMEDIATE`` transaction, PostgreSQL's row lock
(``SELECT ... FOR UPDATE``; a verdict that writes nothing may be taken on the committed
row) -- so no decision is check-then-act across two round trips.

The SQL backends (:mod:`remit_core.store.sql`) call these functions, and render the
fenced changes (:data:`COMPLETE_RECEIPT`, :data:`RENEW_CLAIM`, ...) into one conditional
statement each. The Redis backend runs the same tables in its Lua scripts
(:mod:`remit_core.store.redis`), the one second copy: ``tests/test_store_model.py``
drives random records and requests through these functions and through every backend
(the Lua scripts on a real Redis) and compares the verdicts.

Fencing (EO, CO): an owner's later operations on a record it was granted -- complete,
renew, release, consume -- carry the ``fence`` of the grant, and apply only while the
stored owner *and* fence are still the caller's. A holder whose lease lapsed and was
taken over (the fence went up) is refused, even when the same owner token claims again.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from remit_core.records import (
    ClaimOutcome,
    ClaimRow,
    ReceiptOutcome,
    ReceiptRow,
    Recovery,
    RunEnd,
    RunRow,
    RunStartOutcome,
    RunStatus,
)

Outcome = TypeVar("Outcome")
Row = TypeVar("Row")
R = TypeVar("R", ReceiptRow, ClaimRow, RunRow)

#: what the backend writes for a verdict: nothing, the new record, the changed record,
#: or the deletion of the stored record
Write = Literal["none", "insert", "update", "delete"]


@dataclass(frozen=True, slots=True)
class Verdict(Generic[Outcome, Row]):
    """What a decision function decided."""

    outcome: Outcome
    #: the record as the caller gets it: the stored one when nothing is written, else the
    #: one to write (for a delete, the stored one)
    row: Row
    write: Write = "none"


# ==================================================================================== receipts


def start_receipt(cur: ReceiptRow | None, *, key: str, run_id: str, step: str, name: str,
                  ordinal: int, owner: str, lease: float, may_take_over: bool,
                  now: float) -> Verdict[ReceiptOutcome, ReceiptRow]:
    """EO, phase one: who calls the effect of ``key``.

    ============================================  ===========================================
    stored receipt                                outcome (and write)
    ============================================  ===========================================
    none                                          ``run``: insert started(owner, fence 1,
                                                  attempt 1, lease_until now+lease)
    completed                                     ``done``
    started, owner == owner                       ``run`` (a retried call; no write)
    started, lease_until > now                    ``busy``
    started, expired, may_take_over               ``taken_over``: owner, fence+1, attempt+1,
                                                  lease_until now+lease (the row returned
                                                  has ``previous_owner``: the dead one)
    started, expired, not may_take_over           ``in_doubt`` (no write)
    ============================================  ===========================================
    """
    if cur is None:
        return Verdict("run", ReceiptRow(key, run_id, step, name, ordinal, "started", owner, 1,
                                         now + lease, now, None, None, 1), "insert")
    if cur.status == "completed":
        return Verdict("done", cur)
    if cur.owner == owner:  # a retry of a call that committed: it owns the receipt already
        return Verdict("run", cur)
    if cur.lease_until > now:
        return Verdict("busy", cur)
    if not may_take_over:  # EO: the owner died mid-call; re-calling could fire it twice
        return Verdict("in_doubt", cur)
    return Verdict("taken_over", dataclasses.replace(
        cur, owner=owner, fence=cur.fence + 1, attempt=cur.attempt + 1,
        lease_until=now + lease, previous_owner=cur.owner), "update")


# ====================================================================================== claims


def claim(cur: ClaimRow | None, *, key: str, run_id: str, owner: str, lease: float,
          digest: str | None, value: bytes | None, now: float
          ) -> Verdict[ClaimOutcome, ClaimRow]:
    """CO: who holds the one-time slot ``key``.

    ============================================  ===========================================
    stored claim                                  outcome (and write)
    ============================================  ===========================================
    none                                          ``won``: insert claimed(owner, fence 1,
                                                  digest, value, lease_until now+lease)
    consumed                                      ``consumed``
    released                                      ``won``: claimed(owner, fence+1, digest,
                                                  value, lease)
    claimed, owner == owner                       ``reentered`` (no write)
    claimed, lease_until > now                    ``held``
    claimed, expired, digest None or equal        ``taken_over``: owner, fence+1, lease;
                                                  digest and value kept (the row returned
                                                  has ``previous_owner``)
    claimed, expired, digest differs              ``mismatch``
    ============================================  ===========================================
    """
    if cur is None:
        return Verdict("won", ClaimRow(key, run_id, "claimed", owner, 1, now + lease, digest,
                                       value, now, None), "insert")
    if cur.status == "consumed":  # CO: a value is consumed once
        return Verdict("consumed", cur)
    if cur.status == "released":
        return Verdict("won", dataclasses.replace(
            cur, status="claimed", owner=owner, fence=cur.fence + 1, lease_until=now + lease,
            digest=digest, value=value, claimed_at=now), "update")
    if cur.owner == owner:  # a retry of a call that committed: it holds the claim already
        return Verdict("reentered", cur)
    if cur.lease_until > now:
        return Verdict("held", cur)
    if digest is not None and cur.digest is not None and digest != cur.digest:
        return Verdict("mismatch", cur)
    # LV: the holder died; take over with the recorded digest and value
    return Verdict("taken_over", dataclasses.replace(
        cur, owner=owner, fence=cur.fence + 1, lease_until=now + lease,
        previous_owner=cur.owner), "update")


def consume_claim(cur: ClaimRow | None, *, owner: str, fence: int, digest: str | None,
                  now: float) -> Verdict[bool, ClaimRow | None]:
    """CO: mark the caller's claim consumed (``consumed_at`` now; ``digest`` when given).

    True when the caller holds it (owner and fence) and it is claimed, or it is already
    consumed by this owner and fence (a retry, no write); False otherwise, with the stored
    record (None when there is none)."""
    if cur is None or not holds(cur, owner, fence) or cur.status == "released":
        return Verdict(False, cur)
    if cur.status == "consumed":
        return Verdict(True, cur)
    return Verdict(True, dataclasses.replace(
        cur, status="consumed", consumed_at=now,
        digest=cur.digest if digest is None else digest), "update")


# =============================================================================== run lifecycle


def start_run(cur: RunRow | None, *, run_id: str, framework: str, name: str, owner: str,
              lease: float, recovery: Recovery | None, now: float
              ) -> Verdict[RunStartOutcome, RunRow | None]:
    """Who executes run ``run_id`` now (the run lifecycle; LV for whole runs).

    An executor that starts or continues a run records itself with a lease it renews while
    it works; a recoverer (``recovery`` given) may only take a run whose executor's lease
    has expired, or one whose stored status it asks to retake, so that of k recoverers
    exactly one continues it.

    ============================================  ===========================================
    stored run                                    outcome (and write)
    ============================================  ===========================================
    none, not recovering                          ``started``: insert running(owner, fence 1,
                                                  attempts 1, lease_until now+lease)
    none, recovering                              ``missing``
    running, owner == owner                       ``reentered`` (no write)
    running, lease_until > now                    ``busy``
    running, expired, recovering, attempts spent  ``exhausted``: failed(error
                                                  ``recovery.exhausted``), no owner
    running, expired                              ``taken_over``: owner, fence+1,
                                                  attempts+1, lease (the row returned has
                                                  ``previous_owner``)
    status in ``recovery.retake``, spent          ``exhausted`` (no write)
    status in ``recovery.retake``                 ``taken_over``: running(owner, fence+1,
                                                  attempts+1, lease), nothing it waited
                                                  for or failed with kept
                                                  (:data:`CONTINUE_RUN`)
    any other status, recovering                  ``not_abandoned``
    parked, done, failed or needs-attention,      ``started``: running(owner, fence+1,
    not recovering                                attempts+1, lease), nothing it waited for
                                                  or failed with kept
                                                  (:data:`CONTINUE_RUN`)
    ============================================  ===========================================

    ``framework`` and ``name`` are those of the newest start; a recovery keeps the run's
    own (a recoverer continues the run it found, whatever it was called). "Spent":
    ``recovery.max_attempts`` executions started already (:meth:`Recovery.spent`).
    """
    if cur is None:
        if recovery is not None:
            return Verdict("missing", None)
        return Verdict("started", RunRow(run_id, run_id, framework, name, "running", owner, 1,
                                         now + lease, None, None, 1, now, now), "insert")
    if recovery is not None:
        framework, name = cur.framework, cur.name
    if cur.status == "running":
        if cur.owner == owner:  # a retried call, or the recoverer's own run entering
            return Verdict("reentered", cur)
        if cur.lease_until > now:
            return Verdict("busy", cur)
        if recovery is not None and recovery.spent(cur.attempts):
            return Verdict("exhausted", dataclasses.replace(
                cur, status="failed", owner=None, lease_until=0.0, waiting=None,
                error=recovery.exhausted, updated_at=now), "update")
        return Verdict("taken_over", dataclasses.replace(
            cur, framework=framework, name=name, owner=owner, fence=cur.fence + 1,
            lease_until=now + lease, attempts=cur.attempts + 1, updated_at=now,
            previous_owner=cur.owner), "update")
    if recovery is not None:
        if cur.status not in recovery.retake:  # parked for a person, finished, ...
            return Verdict("not_abandoned", cur)
        if recovery.spent(cur.attempts):
            return Verdict("exhausted", cur)
    continued = apply(CONTINUE_RUN, cur, owner=owner, now=now, lease=lease,
                      framework=framework, name=name)
    return Verdict("taken_over" if recovery is not None else "started", continued.row,
                   "update")


def end_run(cur: RunRow | None, *, owner: str, fence: int, status: RunEnd,
            detail: bytes | None, now: float) -> Verdict[bool, RunRow | None]:
    """The executor of a run records how its execution ended: ``parked`` (``detail``:
    what it waits for), ``done``, ``failed`` (``detail``: the error), or
    ``needs-attention`` (``detail``: what a person must settle, e.g. an in-doubt effect's
    receipt; kept as what the run waits for).

    True when the caller still executes the run (owner and fence, status running); the
    run then has no owner and no lease. False otherwise (a later executor took it over:
    its record stands), with the stored record. It is the fenced change
    :data:`END_RUN` of ``status`` (what the SQL backends run as one statement)."""
    return apply(END_RUN[status], cur, owner=owner, fence=fence, now=now, result=detail)


def import_run(cur: RunRow | None, *, run_id: str, framework: str, name: str,
               status: RunEnd | Literal["abandoned"], owner: str, detail: bytes | None,
               now: float, replaces: tuple[int, float] | None = None
               ) -> Verdict[bool, RunRow | None]:
    """The lifecycle of a run imported from a stock layer, recorded only where the run has
    none (an import never overwrites what an adapter or an earlier import recorded).

    ``abandoned``: running under ``owner`` with a lease that ran out at ``now`` (the stock
    process died while it executed the run, so a recovery takes it at once); ``parked``,
    ``done``, ``failed`` or ``needs-attention``: as :func:`end_run` leaves an execution,
    ``detail`` what the run waits for or failed with. One execution counted. True and the
    record inserted; False, with the stored record, when the run has a lifecycle.

    ``replaces`` (fence, updated_at): the import brings its own earlier record up to date
    (the stock run went on since): the stored record is replaced when it is still that
    one (nothing took it over or changed it since: the same fence and last change), with
    fence and executions one more; otherwise False, as for any lifecycle."""
    stored: RunStatus = "running" if status == "abandoned" else status
    waiting = detail if status in ("parked", "needs-attention") else None
    error = detail if status == "failed" else None
    held = owner if stored == "running" else None
    if cur is None:
        return Verdict(True, RunRow(run_id, run_id, framework, name, stored, held, 1, now,
                                    waiting, error, 1, now, now), "insert")
    if replaces is None or (cur.fence, cur.updated_at) != replaces:
        return Verdict(False, cur)
    return Verdict(True, RunRow(run_id, run_id, framework, name, stored, held, cur.fence + 1,
                                now, waiting, error, cur.attempts + 1, now, now), "update")


# ============================================================================= fenced changes


def holds(cur: ReceiptRow | ClaimRow | RunRow, owner: str | None, fence: int | None) -> bool:
    """The caller still holds the record: its owner and fence are the caller's."""
    return cur.owner == owner and cur.fence == fence


class From(enum.Enum):
    """A value a :class:`Change` sets that comes from the request or the clock."""

    NOW = "now"
    LEASE_END = "now + lease"
    RESULT = "result"
    #: the caller's owner token, framework and name (of a run)
    OWNER = "owner"
    FRAMEWORK = "framework"
    NAME = "name"
    #: the stored number plus one (a fence, a count of executions)
    NEXT = "+ 1"


@dataclass(frozen=True, slots=True)
class Change:
    """A change to one stored record, applied when its guard holds (else nothing changes
    and the caller is told False).

    The guard: the record exists, the caller holds it (:func:`holds`) unless
    ``fenced`` is False (an operator's repair, or a change any caller may make), and its
    status is ``status`` (one of them, for a tuple) when that is given. The SQL backends
    render a change as one conditional statement
    (:meth:`remit_core.store.sql.Records.change`); :func:`apply` is its meaning.
    """

    status: str | tuple[str, ...] | None
    #: column -> the value it gets (a constant: a status, a number or None; or one of
    #: :class:`From`); None: the record is deleted
    sets: Mapping[str, str | float | From | None] | None
    fenced: bool = True

    @property
    def statuses(self) -> tuple[str, ...] | None:
        """The statuses the guard accepts (None: any)."""
        return (self.status,) if isinstance(self.status, str) else self.status


#: EO, phase two: record the result (also on a receipt this owner and fence completed)
COMPLETE_RECEIPT = Change(None, {"status": "completed", "result": From.RESULT,
                                 "completed_at": From.NOW})
#: drop a started receipt whose call raised, so that the next call runs the effect again
RELEASE_RECEIPT = Change("started", None)
#: LV: keep the lease of an effect in flight
RENEW_RECEIPT = Change("started", {"lease_until": From.LEASE_END})
#: record a result for an in-doubt receipt, after reconciling it by hand
RESOLVE_RECEIPT = Change(None, {"status": "completed", "result": From.RESULT,
                                "completed_at": From.NOW}, fenced=False)
#: give a held claim back, so that another delivery may claim it
RELEASE_CLAIM = Change("claimed", {"status": "released"})
#: LV: keep the lease of a held claim
RENEW_CLAIM = Change("claimed", {"lease_until": From.LEASE_END})
#: :func:`end_run` of the executor still running the run, by how it ended (``From.RESULT``:
#: what a parked run waits for, or the error of a failed one), as one fenced change
END_RUN: Mapping[str, Change] = {
    status: Change("running", {
        "status": status, "owner": None, "lease_until": 0.0,
        "waiting": From.RESULT if status in ("parked", "needs-attention") else None,
        "error": From.RESULT if status == "failed" else None, "updated_at": From.NOW})
    for status in ("parked", "done", "failed", "needs-attention")}
#: LV: keep the lease of a run in progress
RENEW_RUN = Change("running", {"lease_until": From.LEASE_END})
#: :func:`start_run` of a run that is not running (parked, done, failed or needing
#: attention): the caller executes it from now on, with a lease, and nothing it waited
#: for or failed with is kept; one conditional statement on the SQL backends, where a
#: start that reads the record first takes two round trips (PostgreSQL)
CONTINUE_RUN = Change(("parked", "done", "failed", "needs-attention"), {
    "framework": From.FRAMEWORK, "name": From.NAME, "status": "running",
    "owner": From.OWNER, "fence": From.NEXT, "lease_until": From.LEASE_END,
    "waiting": None, "error": None, "attempts": From.NEXT, "started_at": From.NOW,
    "updated_at": From.NOW}, fenced=False)


def apply(change: Change, cur: R | None, *, owner: str | None = None,
          fence: int | None = None, now: float, lease: float = 0.0,
          result: bytes | None = None, framework: str = "", name: str = ""
          ) -> Verdict[bool, R | None]:
    """The verdict of ``change`` on the stored record ``cur``."""
    statuses = change.statuses
    if cur is None or (change.fenced and not holds(cur, owner, fence)) or (
            statuses is not None and cur.status not in statuses):
        return Verdict(False, cur)
    if change.sets is None:
        return Verdict(True, cur, "delete")
    given = {From.NOW: now, From.LEASE_END: now + lease, From.RESULT: result,
             From.OWNER: owner, From.FRAMEWORK: framework, From.NAME: name}
    values = {col: (getattr(cur, col) + 1 if v is From.NEXT else given[v])
              if isinstance(v, From) else v for col, v in change.sets.items()}
    return Verdict(True, dataclasses.replace(cur, **values), "update")  # type: ignore[arg-type]


__all__ = ["COMPLETE_RECEIPT", "CONTINUE_RUN", "END_RUN", "RELEASE_CLAIM", "RELEASE_RECEIPT",
           "RENEW_CLAIM", "RENEW_RECEIPT", "RENEW_RUN", "RESOLVE_RECEIPT", "Change", "From",
           "Verdict", "Write",
           "apply", "claim", "consume_claim", "end_run", "holds", "start_receipt", "start_run"]
