"""Typed records returned by a :class:`~remit_core.store.Store`.

Row types (``*Row``) are what a backend reads and writes: payloads stay encoded
bytes there. The store decodes them into the public records below, naming the
record in any :class:`~remit_core.errors.CorruptRecord`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import orjson

ReceiptStatus = Literal["started", "completed"]
ClaimStatus = Literal["claimed", "consumed", "released"]
#: a run's lifecycle as stored; ``abandoned`` (running, its executor's lease expired) is
#: computed when it is read, never written
RunStatus = Literal["running", "parked", "done", "failed", "needs-attention"]
#: every status a listing filters by: the stored ones and the computed ``abandoned``
RUN_STATUSES: tuple[str, ...] = ("running", "parked", "done", "failed", "needs-attention",
                                 "abandoned")
#: how an execution of a run ends
RunEnd = Literal["parked", "done", "failed", "needs-attention"]

# Outcomes of the atomic primitives, decided inside one backend operation by the pure
# functions of remit_core.store.decisions (and the Lua scripts checked against them).
ReceiptOutcome = Literal["run", "taken_over", "done", "busy", "in_doubt"]
ClaimOutcome = Literal["won", "reentered", "taken_over", "held", "consumed", "mismatch"]
RunStartOutcome = Literal["started", "reentered", "busy", "taken_over", "missing",
                          "not_abandoned", "exhausted"]


def versions_json(versions: Mapping[str, str]) -> str:
    """A checkpoint's version map (text to text, as :meth:`Store.put_checkpoint` stores
    it) as the JSON text the backends keep: orjson, or the standard library's escapes for
    text orjson refuses (a lone surrogate). Either is read back by :func:`versions_from_json`
    and by the databases' JSON functions."""
    try:
        return orjson.dumps(versions).decode()
    except TypeError:  # orjson.JSONEncodeError
        return json.dumps(versions)


def versions_from_json(text: str | bytes) -> dict[str, str]:
    """The version map of :func:`versions_json`'s text (or of the older ``json.dumps``)."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:  # an escaped lone surrogate
        value = json.loads(text)
    return value  # type: ignore[no-any-return]


_R = TypeVar("_R", bound=type)


class _Factory:
    """The default a field with a factory shows in ``__init__``'s signature."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()


def _quick(cls: _R) -> _R:
    """``cls`` (a frozen, slotted dataclass) with an ``__init__`` that sets each slot
    through its descriptor: what the dataclass's own does (the same parameters, defaults
    and factories), at half its cost. A frozen dataclass sets its fields through
    ``object.__setattr__`` (its own ``__setattr__`` refuses), one generic lookup a field;
    the store builds several records a read, and that was a sixth of a read of the
    latest checkpoint. Nothing else of the class changes: it stays frozen, compares and
    hashes as before."""
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: _quick builds no __post_init__")
    env: dict[str, Any] = {"_FACTORY": _FACTORY}
    params, body = [], []
    for i, f in enumerate(dataclasses.fields(cls)):
        if not f.init or f.kw_only:
            raise TypeError(f"{cls.__name__}.{f.name}: _quick builds plain positional fields only")
        env[f"_set{i}"] = vars(cls)[f.name].__set__
        value = f.name
        if f.default is not dataclasses.MISSING:
            env[f"_default{i}"] = f.default
            params.append(f"{f.name}=_default{i}")
        elif f.default_factory is not dataclasses.MISSING:
            env[f"_factory{i}"] = f.default_factory
            params.append(f"{f.name}=_FACTORY")
            value = f"_factory{i}() if {f.name} is _FACTORY else {f.name}"
        else:
            params.append(f.name)
        body.append(f"    _set{i}(self, {value})\n")
    made: dict[str, Any] = {}  # (the source is built from this module's field names only)
    exec(f"def __init__(self, {', '.join(params)}):\n{''.join(body)}", env, made)
    init = made["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__annotations__ = dict(vars(cls)["__init__"].__annotations__)
    cls.__init__ = init  # type: ignore[misc]
    return cls


# -- rows (backend level) ------------------------------------------------------------------------


@_quick
@dataclass(frozen=True, slots=True)
class CheckpointRow:
    run_id: str
    ns: str
    checkpoint_id: str
    parent_id: str | None
    kind: str
    execution_id: str | None
    data: bytes
    metadata: bytes
    versions: dict[str, str]
    created_at: float
    seq: int = 0


@_quick
@dataclass(frozen=True, slots=True)
class BlobRow:
    run_id: str
    ns: str
    channel: str
    version: str
    value: bytes


@_quick
@dataclass(frozen=True, slots=True)
class WriteRow:
    run_id: str
    ns: str
    checkpoint_id: str
    task_id: str
    idx: int
    channel: str
    value: bytes
    task_path: str = ""


@_quick
@dataclass(frozen=True, slots=True)
class ReceiptRow:
    key: str
    run_id: str
    step: str
    name: str
    ordinal: int
    status: ReceiptStatus
    owner: str | None
    fence: int
    lease_until: float
    started_at: float
    completed_at: float | None
    result: bytes | None
    attempt: int
    #: set by a take-over only: the owner whose lease had expired (not stored)
    previous_owner: str | None = None


@_quick
@dataclass(frozen=True, slots=True)
class ClaimRow:
    key: str
    run_id: str
    status: ClaimStatus
    owner: str | None
    fence: int
    lease_until: float
    digest: str | None
    value: bytes | None
    claimed_at: float
    consumed_at: float | None
    #: set by a take-over only: the owner whose lease had expired (not stored)
    previous_owner: str | None = None


@_quick
@dataclass(frozen=True, slots=True)
class RunRow:
    """A run's lifecycle record. ``key`` is the run id (the record tables' key column);
    ``waiting`` (parked: what the run waits for) and ``error`` (failed) stay encoded."""

    key: str
    run_id: str
    framework: str
    name: str
    status: RunStatus
    owner: str | None
    fence: int
    lease_until: float
    waiting: bytes | None
    error: bytes | None
    attempts: int
    started_at: float
    updated_at: float
    #: set by a take-over only: the owner whose lease had expired (not stored)
    previous_owner: str | None = None


# -- public records ------------------------------------------------------------------------------


@_quick
@dataclass(frozen=True, slots=True)
class PendingWrite:
    """A write recorded against a checkpoint before the next checkpoint exists."""

    task_id: str
    idx: int
    channel: str
    value: Any
    task_path: str = ""


@_quick
@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One checkpoint/snapshot of a run.

    ``seq`` is store-wide and increasing: a higher seq was written later, so
    "newest first" is ``seq`` descending. ``values`` maps each channel to its
    value at ``versions[channel]`` (values are stored once per version).
    """

    run_id: str
    ns: str
    checkpoint_id: str
    seq: int
    parent_id: str | None
    kind: str
    execution_id: str | None
    data: Any
    metadata: Any
    versions: dict[str, str]
    values: dict[str, Any]
    created_at: float
    writes: list[PendingWrite] = field(default_factory=list)


@_quick
@dataclass(frozen=True, slots=True)
class RunState:
    """A run's lifecycle, as one read saw it (:meth:`Store.get_run`, :meth:`Store.list_runs`).

    ``status`` is the stored one, except that a ``running`` run whose executor's lease
    had expired when it was read is ``abandoned`` (computed, never written): its executor
    died or stalled, and a recoverer may continue it (:meth:`Store.recover_run`).
    ``waiting`` is what a parked run waits for, ``error`` what ended a failed one, as the
    adapter recorded them. ``attempts`` counts the executions started, recoveries
    included.
    """

    run_id: str
    framework: str
    name: str
    status: RunStatus | Literal["abandoned"]
    owner: str | None
    fence: int
    lease_until: float
    waiting: Any
    error: Any
    attempts: int
    started_at: float
    updated_at: float

    @property
    def cursor(self) -> str:
        """Where a listing continues after this run: ``list_runs(cursor=run.cursor)``."""
        return f"{self.updated_at!r}/{self.run_id}"


@_quick
@dataclass(frozen=True, slots=True)
class RunStart:
    """What :meth:`Store.start_run` or :meth:`Store.recover_run` decided, atomically.

    * ``started`` / ``taken_over`` / ``reentered``: the caller executes the run
      (``run.owner``, ``run.fence``); it renews the lease while it works and records the
      end with :meth:`Store.end_run`. ``taken_over``: the previous executor's lease had
      expired (``previous_owner``).
    * ``busy``: another executor's lease is live; the caller does not own the run.
    * ``missing`` / ``not_abandoned`` (recovery only): there is nothing to recover.
    * ``exhausted`` (recovery only): the run has had its ``max_attempts`` executions; it
      is not taken (an abandoned one is recorded ``failed``).
    """

    outcome: RunStartOutcome
    run: RunState | None
    previous_owner: str | None = None

    @property
    def owns(self) -> bool:
        return self.outcome in ("started", "taken_over", "reentered")


@_quick
@dataclass(frozen=True, slots=True)
class Recovery:
    """What a recoverer may take (:meth:`Store.recover_run`), as a backend takes it.

    Always an abandoned run (running, its executor's lease expired); also a run whose
    stored status is in ``retake`` (``failed``: a retry asked for; ``needs-attention``:
    its in-doubt effect was settled). ``max_attempts`` (0: no bound) bounds the
    executions a run gets, recoveries included: a run that has had them is not taken
    (``exhausted``), and an abandoned one is recorded ``failed`` with ``exhausted``, the
    encoded error saying so, so that a run that kills its executor every time is not
    recovered forever."""

    retake: tuple[str, ...] = ()
    max_attempts: int = 0
    exhausted: bytes | None = None

    def spent(self, attempts: int) -> bool:
        return 0 < self.max_attempts <= attempts


@_quick
@dataclass(frozen=True, slots=True)
class RunInfo:
    run_id: str
    created_at: float
    updated_at: float
    checkpoints: int
    latest_checkpoint_id: str | None
    latest_kind: str | None
    #: the run's lifecycle, when an adapter keeps one for it
    lifecycle: RunState | None = None


@_quick
@dataclass(frozen=True, slots=True)
class RunQuery:
    """The filters of :meth:`Store.list_runs` over the runs' lifecycles, as a backend
    takes them (``cursor`` parsed: the ``updated_at`` and run id listed last)."""

    status: RunStatus | Literal["abandoned"] | None = None
    framework: str | None = None
    name: str | None = None
    updated_before: float | None = None
    cursor: tuple[float, str] | None = None
    limit: int | None = None


@_quick
@dataclass(frozen=True, slots=True)
class Receipt:
    """EO: the durable record of one effect call, keyed by (run, step, name, ordinal)."""

    key: str
    run_id: str
    step: str
    name: str
    ordinal: int
    status: ReceiptStatus
    owner: str | None
    fence: int
    lease_until: float
    started_at: float
    completed_at: float | None
    result: Any
    attempt: int


@_quick
@dataclass(frozen=True, slots=True)
class ReceiptStart:
    """What :meth:`Store.start_receipt` decided, atomically.

    * ``run`` / ``taken_over``: the caller owns the receipt (``fence``) and must call
      the function, then :meth:`Store.complete_receipt`.
    * ``done``: a result is recorded; return ``receipt.result``.
    * ``busy``: another live owner holds it; wait for its result.
    * ``in_doubt``: its owner died mid-call and the caller may not re-call it.

    ``previous_owner`` (``taken_over`` only) is the owner whose lease had expired;
    ``receipt.owner`` is the caller.
    """

    outcome: ReceiptOutcome
    receipt: Receipt
    previous_owner: str | None = None


@_quick
@dataclass(frozen=True, slots=True)
class Claim:
    """CO/LV: a one-time slot, held under a lease with a fencing token."""

    key: str
    run_id: str
    status: ClaimStatus
    owner: str | None
    fence: int
    lease_until: float
    digest: str | None
    value: Any
    claimed_at: float
    consumed_at: float | None
    taken_over: bool = False
    #: when ``taken_over``: the owner whose lease had expired (``owner`` is the caller)
    previous_owner: str | None = None
