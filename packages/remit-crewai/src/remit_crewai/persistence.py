"""RemitFlowPersistence: a CrewAI ``FlowPersistence`` on a remit store.

This module is the only place that knows how CrewAI hands state to a
persistence backend. What it stores, per flow id (the store's ``run_id``):

===============================  =====================================================
CrewAI                           remit store
===============================  =====================================================
``save_state`` after a method    a checkpoint of kind ``crewai-state``, ``data`` =
                                 ``{"state", "method", "epoch"}``; with ``@durable``
                                 its id is derived from (flow, epoch, method, ordinal)
the state a kickoff starts from  (``@durable``, before its first method runs) a
                                 ``crewai-state`` checkpoint of method ``_kickoff``,
                                 id derived from (flow, epoch); only when a restore
                                 would give another state (``save_kickoff_state``)
``save_pending_feedback``        a checkpoint of kind ``crewai-pending`` that holds
                                 the state, the feedback context and the position of
                                 the run, in one write
a resume of parked feedback      a claim ``crewai|<flow>|<pending checkpoint id>``
                                 (:func:`feedback_key`, parts escaped):
                                 one delivery wins, the value is recorded on it (CO)
an execution (an epoch)          checkpoints ``start-N`` / ``end-N`` in namespace
                                 ``remit-epoch``; ``end-N`` records the flow's result
a method body (``@durable``)     a receipt per (flow, epoch, method, ordinal): the
                                 method's output and the state it left (EO, PC)
a kickoff or resume              the flow id's run lifecycle (framework ``crewai``,
(``@durable``)                   name: the flow's ``name`` or class name), kept by
                                 :mod:`remit_crewai._durable`; plain flows keep none
===============================  =====================================================

``load_state`` returns the state of the latest checkpoint: a pure function
of the store, never of a wall clock.

CV: every state is validated before it is written. A pydantic state is
checked field by field in strict mode against its own class (so a value
assigned without ``validate_assignment`` is caught); a dict that CrewAI hands
over for a structured flow (the pause and ``ask`` paths) is checked against
the class remembered for that flow; a dict state must be JSON as it is:
nothing is turned into a string.

The backend is a pydantic model that CrewAI serialises into its flow JSON, so
its fields hold the store URL with the password masked, never a secret. The
open store lives in a process-wide cache keyed by the real URL; a model
rebuilt from JSON finds it again by its masked URL (or through
``REMIT_CREWAI_URL``).

Store lifetime. CrewAI builds backends often (at class definition, from its
factory, from flow JSON), so backends of one URL share one store (one connection
pool) per process: the core's shared store cache (:func:`remit_core.adapter.hold_store`).
Each backend holds it through a :class:`~remit_core.adapter.StoreHold`; copies of a
backend share their hold. A store is closed when its last hold is released:

* ``backend.close()`` (or leaving ``with backend:``) releases that backend's hold
  at once; a closed backend opens the store again if it is used again;
* a backend that is garbage-collected releases its hold too. The release is carried
  out by the next store acquisition or ``close()`` in the process, or at interpreter
  exit, never inside the garbage collector (closing a pool joins its threads, and the
  collector may run on any thread, a pool's own included);
* at interpreter exit every store still open is closed;
* a :class:`~remit_core.Store` handed to :meth:`RemitFlowPersistence.from_url` is the
  caller's to close: remit never closes it.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, Protocol

from crewai.flow.async_feedback.types import PendingFeedbackContext
from crewai.flow.persistence.base import FlowPersistence
from pydantic import BaseModel, Field, PrivateAttr

from remit_core import ConsumeConflict, RemitError, StateSchema, StateValidationError, derive_id
from remit_core.adapter import (
    Checkpoint,
    Store,
    StoreConfigError,
    StoreHold,
    borrow_store,
    claim_key,
    hold_store,
    known_url,
    mask_url,
    new_owner,
)

STATE_KIND = "crewai-state"
PENDING_KIND = "crewai-pending"
EPOCH_KIND = "crewai-epoch"
EPOCH_NS = "remit-epoch"
URL_ENV = "REMIT_CREWAI_URL"
#: the method name of the state a ``@durable`` kickoff starts its first method with
KICKOFF_METHOD = "_kickoff"
FRAMEWORK = "crewai"
"""The framework part of remit-crewai's claim keys."""


def feedback_key(flow_id: str, pending_id: str) -> str:
    """CO: the claim of one parked feedback (the flow, its pending checkpoint). Every
    delivery, recovery and ``remit migrate crewai`` claims it under this key."""
    return claim_key(FRAMEWORK, flow_id, pending_id)


# ================================================================== the @durable run in progress


class DurableRun(Protocol):
    """What a save consults of the ``@durable`` kickoff or resume running its flow
    (:mod:`remit_crewai._durable` sets it with :func:`running`)."""

    flow_id: str | None
    epoch: int
    state_type: type[BaseModel] | None
    held_claim: tuple[str, str, int] | None

    def step_name(self, method: str) -> str: ...

    def position(self) -> dict[str, Any]: ...

    def check_claim(self) -> None: ...


_active: ContextVar[DurableRun | None] = ContextVar("remit_crewai_run", default=None)


@contextmanager
def running(run: DurableRun) -> Iterator[None]:
    """Make ``run`` the ``@durable`` run of this context for the block."""
    token = _active.set(run)
    try:
        yield
    finally:
        _active.reset(token)


def active_run() -> DurableRun | None:
    """The ``@durable`` run of this context, if any."""
    return _active.get()


def current_run(flow_id: str) -> DurableRun | None:
    """The ``@durable`` kickoff or resume running ``flow_id`` in this context, if any."""
    run = _active.get()
    if run is None or run.flow_id != flow_id:
        return None
    return run


@dataclass(frozen=True)
class Epoch:
    """Where a flow id stands: the execution in progress, or the last one finished."""

    number: int
    finished: bool
    result: Any = None


@lru_cache(maxsize=256)
def _schema(cls: type) -> StateSchema:
    return StateSchema(cls, strict=True)


def _json_path_error(value: Any, path: str = "") -> tuple[str, Any] | None:
    """The first value in a dict state that JSON cannot hold as it is."""
    if value is None or isinstance(value, (str, bool, int)):
        return None
    if isinstance(value, float):
        return None if value == value and value not in (float("inf"), float("-inf")) else (
            path or "$", value)
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                return (f"{path}.{k!r}" if path else repr(k), k)
            found = _json_path_error(v, f"{path}.{k}" if path else k)
            if found:
                return found
        return None
    if isinstance(value, list):
        for i, v in enumerate(value):
            found = _json_path_error(v, f"{path}[{i}]")
            if found:
                return found
        return None
    return (path or "$", value)


def dump_state(state: Any, *, flow_id: str, step: str,
               state_type: type[BaseModel] | None = None) -> dict[str, Any]:
    """CV: the state as JSON-ready data, or :class:`StateValidationError`; writes nothing.

    A pydantic state is checked field by field, then dumped as JSON by the core's
    :meth:`~remit_core.StateSchema.dump_json`: a field that validates but cannot be dumped
    (an arbitrary object in an ``Any`` field) is a ``StateValidationError`` naming it, in
    the message every adapter gives, never pydantic's raw serialization error."""
    if isinstance(state, BaseModel):
        schema = _schema(type(state))
        schema.check(state, run_id=flow_id, step=step)
        return _as_dict(schema.dump_json(state, run_id=flow_id, step=step))
    if not isinstance(state, Mapping):
        raise StateValidationError(
            f"invalid state in flow {flow_id!r}, step {step!r}: a flow state is a pydantic "
            f"model or a dict, not {type(state).__name__}. Nothing was written.",
            run_id=flow_id, step=step, field="$")
    if state_type is not None:
        schema = _schema(state_type)
        schema.check(dict(state), run_id=flow_id, step=step)
        return _as_dict(schema.dump_json(state_type.model_validate(dict(state)),
                                         run_id=flow_id, step=step))
    bad = _json_path_error(state)
    if bad is not None:
        field, value = bad
        raise StateValidationError(
            f"invalid state in flow {flow_id!r}, step {step!r}: field {field!r} holds a "
            f"{type(value).__name__} ({value!r:.60}), which JSON cannot store as it is. "
            "remit never turns a value into a string: store it as a str, number, bool, "
            "list or dict (for example a datetime as .isoformat()), or give the flow a "
            "pydantic state. Nothing was written; the last valid state is still the latest.",
            run_id=flow_id, step=step, field=field)
    copied: dict[str, Any] = json.loads(json.dumps(state))
    return copied


def _as_dict(dumped: Any) -> dict[str, Any]:
    return dict(dumped)


class RemitFlowPersistence(FlowPersistence):
    """A CrewAI ``FlowPersistence`` that keeps the resume contract.

    Open it with :meth:`from_url`. Use it as ``@persist(store)``, as
    ``Flow(persistence=store)``, or process-wide with
    :func:`remit_crewai.use_as_default`. Add :func:`remit_crewai.durable` to the
    flow class so that completed methods are not run again.
    """

    persistence_type: str = Field(default="RemitFlowPersistence")
    #: the store URL with its password masked (CrewAI writes this field into flow JSON)
    url: str = Field(default="")
    lease: float | None = Field(default=None)

    _hold: StoreHold | None = PrivateAttr(default=None)
    _state_types: dict[str, type[BaseModel]] = PrivateAttr(default_factory=dict)

    @classmethod
    def from_url(cls, url: str | Store, *, lease: float | None = None) -> RemitFlowPersistence:
        """Open ``url`` (``sqlite:///flows.db``, ``postgresql://...``, ``redis://...``), or
        use an already opened :class:`~remit_core.Store` (to share one connection pool
        with other adapters).

        ``lease`` (seconds) bounds how long a dead process holds a method or a
        resume before another process may take over; the store default is 30.

        Backends of one URL share one store in the process; it is closed when the last
        of them is closed or collected (see :meth:`close`). A ``Store`` passed here
        stays yours to close.
        """
        if isinstance(url, Store):
            self = cls(url=mask_url(url.url))
            self._hold = borrow_store(url)
        else:
            self = cls(url=mask_url(url), lease=lease)
            self._hold = hold_store(url, lease=lease)
        return self

    # ------------------------------------------------------------------------------ the store

    @property
    def store(self) -> Store:
        hold = self._hold
        if hold is None or hold.released:
            hold = self._hold = hold_store(self._real_url(), lease=self.lease)
        return hold.store

    def close(self) -> None:
        """Release this backend's hold on its store (and its copies', which share it).
        The store, and its connection pool, is closed when no backend holds it any more;
        a closed backend opens it again if it is used again."""
        hold, self._hold = self._hold, None
        if hold is not None:
            hold.release()

    def __enter__(self) -> RemitFlowPersistence:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _real_url(self) -> str:
        real = known_url(self.url)
        if real is not None:
            return real
        env = os.environ.get(URL_ENV)
        if env and (not self.url or mask_url(env) == self.url):
            return env
        if self.url and "***" not in self.url:
            return self.url
        raise StoreConfigError(
            f"RemitFlowPersistence for {self.url or '<no URL>'!r} was rebuilt from flow JSON "
            f"in a process that has not opened it: call RemitFlowPersistence.from_url(url) "
            f"once at start-up, or set {URL_ENV} to the full URL.", url=self.url or None)

    def remember_state_type(self, flow_id: str, state_type: type[BaseModel]) -> None:
        """Validate dicts that CrewAI hands over for ``flow_id`` against this class."""
        self._state_types[flow_id] = state_type

    # ----------------------------------------------------------------------- FlowPersistence

    def init_db(self) -> None:
        self.store  # noqa: B018  (opens the store and creates its tables)

    def save_state(self, flow_uuid: str, method_name: str,
                   state_data: dict[str, Any] | BaseModel) -> None:
        run = current_run(flow_uuid)
        step = method_name if run is None else run.step_name(method_name)
        if isinstance(state_data, BaseModel):
            self._state_types.setdefault(flow_uuid, type(state_data))
        state = dump_state(state_data, flow_id=flow_uuid, step=step,
                           state_type=self._state_type(flow_uuid, run))
        epoch = run.epoch if run is not None else self.epoch(flow_uuid).number
        self._write(flow_uuid, self._state_id(flow_uuid, method_name, run), state=state,
                    method=method_name, epoch=epoch, step=step)

    def save_kickoff_state(self, flow_uuid: str, epoch: int, state: dict[str, Any], *,
                           default: dict[str, Any] | None) -> tuple[bool, bool]:
        """Store ``state`` (checked already, as :func:`dump_state` gives it) as the state
        that execution ``epoch`` of the flow starts its first method with, before that
        method runs. Returns (stored, first): whether it was stored, and whether the flow
        id had no state stored before this call.

        CrewAI stores a state only after a method, and a kickoff of the flow id restores
        the latest stored one (the class's defaults, ``default``, when there is none). So
        it is stored when the execution has stored no state yet and a restore would give
        another one: the kickoff's inputs on the defaults, on the previous execution's
        state or on an imported one, or a fork's source state. A kickoff with only an id
        stores nothing, and neither does a resume of an execution that stored states
        (its next method starts from them). Its id is derived from (flow, epoch): the
        same in every process (RD)."""
        latest = self.store.get_checkpoint(flow_uuid, with_writes=False)
        first = latest is None
        if latest is None:
            restored = default
        else:
            data = latest.data if isinstance(latest.data, dict) else {}
            meta = latest.metadata if isinstance(latest.metadata, dict) else {}
            if int(data.get("epoch", 0)) >= epoch and "migrated_from" not in meta:
                return False, first  # this execution stored a state already
            restored = data.get("state")
        if restored == state:
            return False, first
        self._write(flow_uuid, derive_id(flow_uuid, f"crewai-kickoff/e{epoch}"), state=state,
                    method=KICKOFF_METHOD, epoch=epoch, step=f"e{epoch}/{KICKOFF_METHOD}")
        return True, first

    def load_state(self, flow_uuid: str) -> dict[str, Any] | None:
        latest = self.store.get_checkpoint(flow_uuid, with_writes=False)
        if latest is None:
            return None
        return dict(latest.data["state"])

    def save_pending_feedback(self, flow_uuid: str, context: PendingFeedbackContext,
                              state_data: dict[str, Any] | BaseModel) -> None:
        run = current_run(flow_uuid)
        method = context.method_name
        step = method if run is None else run.step_name(method)
        if isinstance(state_data, BaseModel):
            self._state_types.setdefault(flow_uuid, type(state_data))
        state = dump_state(state_data, flow_id=flow_uuid, step=step,
                           state_type=self._state_type(flow_uuid, run))
        epoch = run.epoch if run is not None else self.epoch(flow_uuid).number
        pending_id = (derive_id(flow_uuid, f"crewai-pending/{step}") if run is not None
                      else _time_ordered_id())
        self._write(flow_uuid, pending_id, state=state, method=method, epoch=epoch, step=step,
                    context=context.to_dict(),
                    position=None if run is None else run.position())

    def load_pending_feedback(
        self, flow_uuid: str
    ) -> tuple[dict[str, Any], PendingFeedbackContext] | None:
        """The parked feedback of ``flow_uuid`` that no resume has consumed. Read-only:
        loading a pending flow to look at it never claims it."""
        found = self.pending(flow_uuid)
        if found is None or found[1] == "consumed":
            return None
        cp = found[0]
        return dict(cp.data["state"]), PendingFeedbackContext.from_dict(cp.data["context"])

    def clear_pending_feedback(self, flow_uuid: str) -> None:
        """CrewAI calls this after it accepted feedback and before any listener runs.

        Under ``@durable`` the resume already holds the claim: check that it still
        does. Without it this is the only guard: claim and consume here, so that
        of two deliveries the second raises :class:`ConsumeConflict` before its
        listeners run.
        """
        run = current_run(flow_uuid)
        if run is not None and run.held_claim is not None:
            run.check_claim()
            return
        found = self.pending(flow_uuid)
        if found is None:
            return
        key = feedback_key(flow_uuid, found[0].checkpoint_id)
        owner = new_owner()
        claim = self.store.claim_once(key, run_id=flow_uuid, owner=owner)
        self.store.consume_claim(key, owner=owner, fence=claim.fence)

    # --------------------------------------------------------------------------- remit reads

    def pending(self, flow_uuid: str) -> tuple[Checkpoint, Literal["open", "held", "consumed"]] | None:
        """The newest parked-feedback record of the flow and the state of its claim."""
        for cp in self.store.list_checkpoints(flow_uuid, ns="", with_writes=False):
            if cp.kind != PENDING_KIND:
                continue
            claim = self.store.get_claim(feedback_key(flow_uuid, cp.checkpoint_id))
            if claim is None or claim.status == "released":
                return cp, "open"
            return cp, "consumed" if claim.status == "consumed" else "held"
        return None

    def epoch(self, flow_uuid: str) -> Epoch:
        """The flow's current execution: the latest ``start-N`` or ``end-N`` record."""
        latest = self.store.get_checkpoint(flow_uuid, ns=EPOCH_NS, with_writes=False)
        if latest is None:
            return Epoch(0, False)
        data = latest.data
        return Epoch(int(data["epoch"]), bool(data["finished"]), data.get("result"))

    def finish_epoch(self, flow_uuid: str, epoch: int, result: Any) -> None:
        self.store.put_checkpoint(
            flow_uuid, f"end-{epoch}", ns=EPOCH_NS, kind=EPOCH_KIND,
            data={"epoch": epoch, "finished": True, "result": result})

    def new_execution(self, flow_uuid: str, *, abandon: bool = False) -> int:
        """Start a new execution (epoch) of a finished flow; return its number.

        The next ``kickoff(inputs={"id": flow_uuid})`` then runs every method again
        on the persisted state, with fresh receipts. Calling it while an execution
        is unfinished changes nothing and returns that execution's number, unless
        ``abandon`` (a conversational turn that died is not resumed by the next turn).
        """
        current = self.epoch(flow_uuid)
        if not current.finished and not (abandon and self._started(flow_uuid, current)):
            return current.number
        nxt = current.number + 1
        self.store.put_checkpoint(
            flow_uuid, f"start-{nxt}", ns=EPOCH_NS, kind=EPOCH_KIND,
            data={"epoch": nxt, "finished": False})
        return nxt

    def _started(self, flow_uuid: str, current: Epoch) -> bool:
        """Whether the unfinished execution ``current`` has run anything yet."""
        prefix = f"e{current.number}/"
        return any(r.step.startswith(prefix) for r in self.store.list_receipts(flow_uuid))

    def latest_state_id(self, flow_uuid: str) -> str | None:
        latest = self.store.get_checkpoint(flow_uuid, with_writes=False)
        return None if latest is None else latest.checkpoint_id

    # ------------------------------------------------------------------------------ helpers

    def _write(self, flow_uuid: str, checkpoint_id: str, *, state: dict[str, Any], method: str,
               epoch: int, step: str, context: dict[str, Any] | None = None,
               position: dict[str, Any] | None = None,
               extra: Mapping[str, Any] | None = None) -> None:
        """The one write of a flow state (``save_state``, ``save_pending_feedback`` and
        ``remit migrate crewai``): a ``crewai-state`` checkpoint, or with ``context`` (a
        ``PendingFeedbackContext.to_dict()``) a ``crewai-pending`` one. ``state`` is
        stored as given (the saves check it first; the import stores stock states as they
        are); ``extra`` is added to the metadata."""
        metadata: dict[str, Any] = {"method": method, "epoch": epoch, "step": step}
        if context is None:
            kind = STATE_KIND
            data: dict[str, Any] = {"state": state, "method": method, "epoch": epoch}
        else:
            kind = PENDING_KIND
            data = {"state": state, "context": context, "method": method, "epoch": epoch,
                    "position": position}
            metadata["pending"] = True
        metadata.update(extra or {})
        self.store.put_checkpoint(flow_uuid, checkpoint_id, kind=kind, data=data,
                                  metadata=metadata)

    def _state_type(self, flow_uuid: str, run: DurableRun | None) -> type[BaseModel] | None:
        if run is not None and run.state_type is not None:
            return run.state_type
        return self._state_types.get(flow_uuid)

    @staticmethod
    def _state_id(flow_uuid: str, method_name: str, run: DurableRun | None) -> str:
        if run is not None:
            return derive_id(flow_uuid, f"crewai-state/{run.step_name(method_name)}")
        return _time_ordered_id()

    def __repr__(self) -> str:
        return f"RemitFlowPersistence({self.url!r})"


def _time_ordered_id() -> str:
    """An id for a save that ``@durable`` does not position (plain ``@persist`` flows)."""
    return str(uuid.uuid7()) if hasattr(uuid, "uuid7") else str(uuid.uuid4())


def not_remit(flow: Any) -> RemitError:
    return RemitError(
        f"@durable flow {type(flow).__name__} has no remit persistence: decorate the class "
        "with @persist(RemitFlowPersistence.from_url(url)), pass "
        "Flow(persistence=RemitFlowPersistence.from_url(url)), or call "
        "remit_crewai.use_as_default(url) at start-up.")


__all__ = ["KICKOFF_METHOD", "ConsumeConflict", "DurableRun", "Epoch", "RemitFlowPersistence",
           "current_run", "dump_state", "feedback_key", "running"]
