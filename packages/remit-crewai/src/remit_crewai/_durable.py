"""``@durable``: a CrewAI flow whose completed methods do not run again.

``FlowPersistence`` only sees state snapshots, so a backend alone cannot skip
a method that already ran. ``@durable`` adds what is missing, through public
seams only:

* **Method bodies (PC, EO).** Each method body becomes a receipt, keyed by
  (flow id, execution, method, ordinal), where the ordinal is the k-th run of
  that method in this execution (cycles and routers get one receipt per
  pass). The receipt records the method's output and the state it left, in
  one write. When a flow id is kicked off again, a method with a receipt
  does not run: its recorded output goes to its listeners (a router takes the
  recorded branch) and its recorded state is restored. ``@effect`` calls
  inside a method get receipts of their own, so a method killed halfway runs
  again with its effects replayed. CrewAI still runs its own bookkeeping,
  events, ``save_state`` and listener dispatch around each body.
* **Resumes of parked feedback (CO).** ``resume``/``resume_async`` claim the
  parked slot atomically before CrewAI finalises anything: of k racing
  deliveries one wins, the others raise :class:`~remit_core.ConsumeConflict`.
  The winner's value is recorded on the claim; a winner that dies is taken
  over after the lease by ``kickoff(inputs={"id": ...})``, which finishes
  the flow with the recorded value (LV), and by :func:`remit_crewai.recover`, also
  when it died before its execution was recorded (:func:`afinish_claimed`).
* **The state a kickoff starts from (LV, RD).** CrewAI stores a state only after a
  method, so before the first method of an execution runs, the state it starts with
  (the kickoff's inputs applied; for a fork, on the source's state) is stored when
  restoring the flow id would give another one: a flow killed inside that method is
  recovered from it, not from the class's defaults.
* **Executions.** A flow id has numbered executions (epochs). ``kickoff`` of a
  flow id whose execution finished returns the recorded result and runs
  nothing; :func:`new_execution` starts the next execution, which runs every
  method again on the persisted state. Conversational flows
  (``conversational = True``) start a new execution on every turn.
* **The run lifecycle.** Each kickoff or resume that runs something keeps the flow
  id's lifecycle in the store (remit-core's :func:`~remit_core.adapter.keep_run`):
  from the moment its flow id is fixed (its first method, once the state it starts
  from is stored; or the claim of a resume) the run is ``running`` under a lease
  renewed in the background, and when the call returns or raises it is ``done`` (the
  flow finished), ``parked`` (it waits for human feedback: the method, message and
  ``emit`` options), ``failed`` (an exception or a cancellation: its type and message)
  or ``needs-attention`` (an effect in doubt). The lifecycle's name is the flow's
  ``name`` (CrewAI's field), else its class's name. A run whose process died reads as
  abandoned once its lease runs out; :func:`remit_crewai.recover` continues it. A
  kickoff that returns a finished execution's recorded result runs nothing and records
  nothing.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import functools
import inspect
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, cast

from crewai.flow.async_feedback.types import HumanFeedbackPending
from crewai.flow.flow_wrappers import FlowMethod
from crewai.flow.persistence.factory import default_flow_persistence, set_flow_persistence_factory
from pydantic import BaseModel

from remit_core import ConsumeConflict, RemitError, derive_id, effect
from remit_core.adapter import (
    Claim,
    RunKeeper,
    Store,
    effect_scope,
    keep_run,
    new_owner,
    value_digest,
)
from remit_crewai._seam import check_flow_class, feedback_waiting, flow_name
from remit_crewai.persistence import (
    FRAMEWORK,
    KICKOFF_METHOD,
    RemitFlowPersistence,
    active_run,
    dump_state,
    feedback_key,
    not_remit,
    running,
)

log = logging.getLogger("remit")

F = TypeVar("F")

#: the effect name under which a method body's receipt is stored
METHOD_EFFECT = "remit:crewai-method"


class _Run:
    """One kickoff or resume of one flow instance: its execution and its counters (the
    :class:`~remit_crewai.persistence.DurableRun` its saves consult)."""

    def __init__(self, flow: Any, persistence: RemitFlowPersistence) -> None:
        self.flow = flow
        self.persistence = persistence
        self.store: Store = persistence.store
        self.flow_id: str | None = None
        self.epoch = 0
        self.state_type: type[BaseModel] | None = None
        self.held_claim: tuple[str, str, int] | None = None
        #: the kickoff's inputs but the id: they apply on top of every replayed state
        self.inputs: dict[str, Any] = {}
        self._next: dict[str, int] = {}
        self._seq = 0
        self._lock = threading.Lock()
        #: this execution in the flow id's lifecycle: kept from bind() to end()
        self.keeper: RunKeeper | None = None
        self._ended = False

    def bind(self, flow_id: str | None = None, *, epoch: int | None = None,
             position: dict[str, Any] | None = None) -> str:
        """Fix the flow id and execution on first use (the id is final once a method runs).

        A kickoff binds at its first method (``epoch`` None), before that method runs:
        the state the flow starts with is stored first (:meth:`_store_kickoff_state`),
        then the lifecycle is kept. A resume binds with the parked execution's
        ``epoch`` and ``position`` once its claim is won."""
        with self._lock:
            if self.flow_id is not None:
                return self.flow_id
            fid = flow_id or str(self.flow.flow_id)
            kickoff = epoch is None
            if epoch is None:
                current = self.persistence.epoch(fid)
                epoch = (self.persistence.new_execution(fid) if current.finished
                         else current.number)
            self.epoch = epoch
            if position:
                self._next = {str(k): int(v) for k, v in position.get("next", {}).items()}
                self._seq = int(position.get("seq", 0))
            state = self.flow.state
            if isinstance(state, BaseModel):
                self.state_type = type(state)
                self.persistence.remember_state_type(fid, type(state))
            first = False  # the flow id has nothing stored: its lifecycle is likely new
            if kickoff and not self._ended:
                # before the lifecycle: a process killed between the two leaves no run to
                # recover (as before a first method), never one recovered without its inputs
                first = self._store_kickoff_state(fid) and current.number == 0 \
                    and not current.finished
            if not self._ended:  # the execution starts here: its id is final
                self.keeper = keep_run(self.store, fid, framework=FRAMEWORK,
                                       name=flow_name(self.flow), likely_new=first)
            self.flow_id = fid
            return fid

    def _store_kickoff_state(self, fid: str) -> bool:
        """LV, RD: make the state this kickoff starts its first method with durable before
        that method runs (CrewAI stores a state only after a method), so that a recovery
        of a flow killed inside its first method (``kickoff(inputs={"id": ...})``, which
        restores the latest state) starts it from the same state: the kickoff's inputs on
        the class's defaults, on the previous execution's state, or on a fork's source.
        Stored only when a recovery would restore something else (see
        :meth:`RemitFlowPersistence.save_kickoff_state`); CV: checked like every state.
        True when the flow id had no state stored before."""
        state = self.flow.state
        step = f"e{self.epoch}/{KICKOFF_METHOD}"
        data = dump_state(state, flow_id=fid, step=step, state_type=self.state_type)
        return self.persistence.save_kickoff_state(fid, self.epoch, data,
                                                   default=_default_state(state, fid, step))[1]

    def end(self, exc: BaseException | None = None, result: Any = None) -> None:
        """Record how this execution ended (once; nothing if it never bound a flow id):
        the exception that ended it, else parked on the feedback ``result`` asks for,
        else done."""
        with self._lock:
            self._ended = True
            keeper, self.keeper = self.keeper, None
        if keeper is None:
            return
        if exc is None and isinstance(result, HumanFeedbackPending):
            try:
                waiting = feedback_waiting(result)
            except BaseException as bad:  # a changed seam: still one end for the keeper
                keeper.end(bad)
                raise
            keeper.end(parked=True, waiting=waiting)
        else:
            keeper.end(exc)

    def begin(self, method: str) -> str:
        """Take the next ordinal of ``method``; return the step name of this pass."""
        self.bind()
        with self._lock:
            n = self._next.get(method, 0)
            self._next[method] = n + 1
        return f"e{self.epoch}/{method}#{n}"

    def step_name(self, method: str) -> str:
        """The step of the latest pass of ``method`` (``save_state`` runs after it)."""
        with self._lock:
            n = max(self._next.get(method, 1) - 1, 0)
        return f"e{self.epoch}/{method}#{n}"

    def position(self) -> dict[str, Any]:
        with self._lock:
            return {"next": dict(self._next), "seq": self._seq}

    def record(self, step: str, output: Any) -> dict[str, Any]:
        """What a method's receipt holds: its output and the (validated) state it left."""
        assert self.flow_id is not None
        state = dump_state(self.flow.state, flow_id=self.flow_id, step=step,
                           state_type=self.state_type)
        with self._lock:
            self._seq += 1
            seq = self._seq
        return {"output": output, "state": state, "seq": seq}

    def replay(self, record: dict[str, Any]) -> Any:
        """Apply a recorded pass: restore the state it left if it is the newest seen."""
        with self._lock:
            newer = int(record["seq"]) > self._seq
            if newer:
                self._seq = int(record["seq"])
        if newer:
            _assign_state(self.flow, record["state"], self.inputs)
        return record["output"]

    def check_claim(self) -> None:
        """The resume still holds its claim (its lease did not lapse to another process)."""
        assert self.held_claim is not None
        key, owner, fence = self.held_claim
        if not self.store.renew_claim(key, owner=owner, fence=fence):
            raise ConsumeConflict(
                f"flow {self.flow_id!r}: this resume lost its claim on the parked feedback "
                "(its lease expired and another process took it over); CrewAI was stopped "
                "before any listener ran here.", key=key, run_id=self.flow_id, owner=owner)


def _run_for(flow: Any) -> _Run | None:
    run = active_run()
    return run if isinstance(run, _Run) and run.flow is flow else None


def _default_state(state: Any, fid: str, step: str) -> dict[str, Any] | None:
    """The state a kickoff of ``fid`` restores when nothing is stored: the state class's
    defaults with the flow id (None when it cannot be built: then it is not assumed)."""
    try:
        if isinstance(state, BaseModel):
            return dump_state(type(state).model_validate({"id": fid}), flow_id=fid, step=step)
    except (ValueError, RemitError):  # required fields, or defaults that do not validate
        return None
    return {"id": fid} if isinstance(state, dict) else None


def _assign_state(flow: Any, data: dict[str, Any], inputs: dict[str, Any]) -> None:
    """Put recorded state back into the live state object (listeners may hold it).

    Inputs given to this kickoff apply on top, as CrewAI applies them on top of a
    restored state: the methods that run now see them, the replayed ones did not.
    """
    state = flow.state
    data = {**data, **inputs}
    if isinstance(state, BaseModel):
        fresh = type(state).model_validate(data)
        for name in type(state).model_fields:
            object.__setattr__(state, name, getattr(fresh, name))
    elif isinstance(state, dict):
        state.clear()
        state.update(copy.deepcopy(data))


# ----------------------------------------------------------------------------------- methods


def _wrap_method(name: str, meth: Callable[..., Any]) -> Callable[..., Any]:
    # The body is made an effect here, once per method, not at each call: wrapping reads
    # its signature and return annotation, and the effect's cache of annotations would
    # keep a closure made per call alive, and with it the flow it ran on.
    if inspect.iscoroutinefunction(meth):

        @effect(name=METHOD_EFFECT, on_in_doubt="retry")
        async def async_body(run: _Run, step: str, ran: list[bool], flow: Any,
                             args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
            ran.append(True)
            return run.record(step, await meth(flow, *args, **kwargs))

        @functools.wraps(meth)
        async def async_method(self: Any, *args: Any, **kwargs: Any) -> Any:
            run = _run_for(self)
            if run is None:
                return await meth(self, *args, **kwargs)
            step = run.begin(name)
            ran: list[bool] = []
            assert run.flow_id is not None
            with effect_scope(run.store, run.flow_id, step):
                record = await async_body(run, step, ran, self, args, kwargs)
            return record["output"] if ran else run.replay(record)

        return async_method

    @effect(name=METHOD_EFFECT, on_in_doubt="retry")
    def body(run: _Run, step: str, ran: list[bool], flow: Any, args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> dict[str, Any]:
        ran.append(True)
        return run.record(step, meth(flow, *args, **kwargs))

    @functools.wraps(meth)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        run = _run_for(self)
        if run is None:
            return meth(self, *args, **kwargs)
        step = run.begin(name)
        ran: list[bool] = []
        assert run.flow_id is not None
        with effect_scope(run.store, run.flow_id, step):
            record = body(run, step, ran, self, args, kwargs)
        return record["output"] if ran else run.replay(record)

    return method


# ---------------------------------------------------------------------------- kickoff, resume


def persistence_of(flow: Any) -> RemitFlowPersistence:
    """The remit backend a flow instance uses, else a clear error."""
    persistence = flow.persistence
    if isinstance(persistence, RemitFlowPersistence):
        return persistence
    if persistence is None:
        default = default_flow_persistence()
        if isinstance(default, RemitFlowPersistence):
            flow.persistence = default
            return default
    raise not_remit(flow)


def _finish(run: _Run, result: Any) -> None:
    if run.flow_id is None or isinstance(result, HumanFeedbackPending):
        return
    try:
        run.persistence.finish_epoch(run.flow_id, run.epoch, result)
    except RemitError as exc:  # an unstorable result: the execution still counts as finished
        log.warning("remit: flow %s finished, but its result could not be stored (%s); a "
                    "later kickoff of this id returns None", run.flow_id, exc)
        run.persistence.finish_epoch(run.flow_id, run.epoch, None)


#: what :func:`_resume` returns with ``take_over`` when there was no dead resume to take over
_NOT_TAKEN: Any = object()


async def _resume(flow: Any, feedback: str | None, original: Callable[..., Any], *,
                  take_over: bool = False) -> Any:
    """Claim the parked feedback, then let CrewAI resume. ``feedback=None`` (recovery)
    continues with the value a dead resume recorded.

    ``take_over`` (a recovery that found the run parked, see :func:`afinish_claimed`):
    go on only by taking over a claim whose holder's lease ran out; a claim held by a
    live resume, consumed or free is left as it is and ``_NOT_TAKEN`` returned."""
    context = flow._pending_feedback_context
    if context is None:
        return await original(flow, feedback or "")
    persistence = persistence_of(flow)
    store = persistence.store
    flow_id = str(context.flow_id)
    found = persistence.pending(flow_id)
    if found is None:
        raise RemitError(f"flow {flow_id!r}: no parked feedback is recorded in "
                         f"{persistence.url}; nothing to resume.")
    if take_over and found[1] != "held":
        return _NOT_TAKEN
    parked = found[0]
    key = feedback_key(flow_id, parked.checkpoint_id)
    owner = new_owner()
    digest = None if feedback is None else value_digest(feedback)
    try:
        claim = _claim(store, key, flow_id, owner, digest, feedback,
                       wait=0.0 if take_over else None)
    except ConsumeConflict:
        if take_over:  # CO: a live resume holds it, or another recoverer took it first
            return _NOT_TAKEN
        raise
    if take_over and not claim.taken_over:
        # the claim was free again (a resume that raised released it): a delivery's to
        # make, with its own value; give it straight back
        store.release_claim(key, owner=owner, fence=claim.fence)
        return _NOT_TAKEN
    if feedback is None:
        feedback = "" if claim.value is None else str(claim.value)
        if claim.digest is None:  # nobody recorded a value: this recovery's is the value
            digest = value_digest(feedback)
    run = _Run(flow, persistence)
    run.held_claim = (key, owner, claim.fence)
    try:
        try:
            # the execution (and its lifecycle) starts once the claim is this resume's
            run.bind(flow_id, epoch=int(parked.data["epoch"]),
                     position=parked.data.get("position"))
            with running(run), store.keep_alive(
                    lambda: store.renew_claim(key, owner=owner, fence=claim.fence)):
                result = await original(flow, feedback)
        except BaseException:
            store.release_claim(key, owner=owner, fence=claim.fence)
            raise
        store.consume_claim(key, owner=owner, fence=claim.fence, digest=digest)
        _finish(run, result)
    except BaseException as exc:
        run.end(exc)
        raise
    run.end(result=result)
    return result


def _claim(store: Store, key: str, flow_id: str, owner: str, digest: str | None,
           feedback: str | None, *, wait: float | None = None) -> Claim:
    """Claim the parked feedback. A delivery (``feedback`` given) that loses raises at once;
    a recovery (``feedback=None``) that meets a holder which has not finished waits as the
    store's ``wait=`` URL option says (0, the default: it raises at once), as in every
    adapter (:meth:`remit_core.Store.claim_once`), or ``wait`` seconds."""
    return store.claim_once(key, run_id=flow_id, owner=owner, digest=digest, value=feedback,
                            wait=wait)


def _patch_kickoff(cls: type) -> None:
    original_kickoff = cls.kickoff_async  # type: ignore[attr-defined]
    original_resume = cls.resume_async  # type: ignore[attr-defined]
    original_from_pending = cls.from_pending  # type: ignore[attr-defined]

    @functools.wraps(original_kickoff)
    async def kickoff_async(self: Any, inputs: dict[str, Any] | None = None,
                            input_files: Any = None, from_checkpoint: Any = None,
                            restore_from_state_id: str | None = None) -> Any:
        if from_checkpoint is not None:
            raise RemitError(
                f"@durable flow {type(self).__name__}: from_checkpoint is CrewAI's "
                "Checkpointing, a separate path that loses method outputs; resume with "
                "kickoff(inputs={'id': flow_id}) instead.")
        persistence = persistence_of(self)
        run = _Run(self, persistence)
        run.inputs = {k: v for k, v in (inputs or {}).items() if k != "id"}
        with running(run):
            try:
                result = await _kickoff(self, run, persistence, inputs, input_files,
                                        restore_from_state_id)
            except BaseException as exc:  # an exception or a cancellation: failed
                run.end(exc)
                raise
            run.end(result=result)
            return result

    async def _kickoff(self: Any, run: _Run, persistence: RemitFlowPersistence,
                       inputs: dict[str, Any] | None, input_files: Any,
                       restore_from_state_id: str | None) -> Any:
        flow_id = str(inputs["id"]) if inputs and inputs.get("id") else None
        if flow_id is not None:
            if getattr(self, "conversational", False):  # every turn is a new execution
                persistence.new_execution(flow_id, abandon=True)
            current = persistence.epoch(flow_id)
            if current.finished:
                latest = persistence.load_state(flow_id)
                if latest is not None:
                    _assign_state(self, latest, {})
                log.info("remit: flow %s already finished execution %d; returning its "
                         "recorded result (remit_crewai.new_execution starts another)",
                         flow_id, current.number)
                return current.result
            found = persistence.pending(flow_id)
            if found is not None and found[1] == "held" and restore_from_state_id is None:
                # a resume claimed the feedback and died: finish it with its value (LV)
                parked = type(self).from_pending(flow_id, persistence)
                result = await _resume(parked, None, original_resume)
                state = parked.state
                _assign_state(self, state.model_dump(mode="json")
                              if isinstance(state, BaseModel) else dict(state), {})
                return result
        result = await original_kickoff(self, inputs, input_files, None,
                                        restore_from_state_id)
        _finish(run, result)
        return result

    @functools.wraps(original_resume)
    async def resume_async(self: Any, feedback: str = "") -> Any:
        return await _resume(self, feedback, original_resume)

    def from_pending(klass: type, /, flow_id: str, persistence: Any = None,
                     **kwargs: Any) -> Any:
        try:
            return original_from_pending.__func__(klass, flow_id, persistence, **kwargs)
        except ValueError:
            backend = persistence if persistence is not None else default_flow_persistence()
            if isinstance(backend, RemitFlowPersistence):
                found = backend.pending(flow_id)
                if found is not None and found[1] == "consumed":
                    store = backend.store
                    claim = store.get_claim(feedback_key(flow_id, found[0].checkpoint_id))
                    assert claim is not None
                    raise store.claim_conflict(claim, "consumed") from None
            raise

    cls.kickoff_async = kickoff_async  # type: ignore[attr-defined]
    cls.resume_async = resume_async  # type: ignore[attr-defined]
    cls.from_pending = classmethod(from_pending)  # type: ignore[attr-defined]
    # CrewAI's own resume, for the recovery of a resume that died (afinish_claimed)
    cls.__remit_resume__ = original_resume  # type: ignore[attr-defined]


def durable(cls: F) -> F:
    """Make a ``Flow`` subclass resume instead of re-running. Use above ``@persist``::

        @durable
        @persist(RemitFlowPersistence.from_url("sqlite:///flows.db"))
        class OrderFlow(Flow[OrderState]): ...

    Every kickoff and resume of the class then keeps its flow id's run lifecycle (see
    the module's docstring), so that :func:`remit_crewai.recover` finds the runs whose
    process died. Raises :class:`~remit_crewai._seam.CrewAISeamError` if the installed
    crewai lacks an entry point or attribute this relies on.
    """
    klass = cast(type, cls)
    if klass.__dict__.get("__remit_durable__"):
        return cls
    check_flow_class(klass)  # CrewAISeamError, naming the crewai version, if one is gone
    for name in dir(klass):
        member = inspect.getattr_static(klass, name, None)
        if not isinstance(member, FlowMethod):
            continue
        wrapped = copy.copy(member)
        wrapped._meth = _wrap_method(name, member._meth)
        setattr(klass, name, wrapped)
    _patch_kickoff(klass)
    klass.__remit_durable__ = True  # type: ignore[attr-defined]
    return cls


# ----------------------------------------------------------------------- dead resumes


async def afinish_claimed(flow_class: Any, flow_id: str,
                          persistence: RemitFlowPersistence) -> bool:
    """LV: finish the resume of ``flow_id``'s parked feedback whose resumer claimed it and
    died before its execution was recorded (the run still reads ``parked``): take the
    claim over once its lease ran out and resume with the value it records, in a flow of
    ``flow_class`` on ``persistence``. The execution that follows keeps the run lifecycle
    as every resume does (``parked`` -> ``running`` -> its end).

    CO: the take-over is the store's one atomic claim: of k recoverers racing one takes
    it, the others get False, and so does a recoverer that finds the claim held by a
    live resume (its lease is renewed), consumed, or free. Exceptions of the resumed flow
    propagate (its lifecycle records them)."""
    found = persistence.pending(flow_id)
    if found is None or found[1] != "held":
        return False
    try:
        parked = flow_class.from_pending(flow_id, persistence)
    except (ValueError, ConsumeConflict):  # consumed meanwhile: the winner finished it
        return False
    result = await _resume(parked, None, flow_class.__remit_resume__, take_over=True)
    return result is not _NOT_TAKEN


def finish_claimed(flow_class: Any, flow_id: str, persistence: RemitFlowPersistence) -> bool:
    """:func:`afinish_claimed` for sync code (in a thread of its own when this one runs an
    event loop, as CrewAI's ``resume`` cannot)."""
    def run() -> bool:
        return asyncio.run(afinish_claimed(flow_class, flow_id, persistence))

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run()
    with ThreadPoolExecutor(1, thread_name_prefix="remit-resume") as pool:
        return pool.submit(contextvars.copy_context().run, run).result()


# -------------------------------------------------------------------------------- helpers


def new_execution(flow_id: str, persistence: RemitFlowPersistence | None = None) -> int:
    """Start a new execution of a finished flow: its next kickoff runs every method
    again on the persisted state, with fresh receipts. Returns the execution number."""
    backend = persistence if persistence is not None else default_flow_persistence()
    if not isinstance(backend, RemitFlowPersistence):
        raise RemitError("new_execution needs a RemitFlowPersistence (pass it, or call "
                         "remit_crewai.use_as_default(url) first)")
    return backend.new_execution(flow_id)


def fork_id(persistence: RemitFlowPersistence, source_id: str,
            inputs: dict[str, Any] | None = None) -> str:
    """The id of the fork of ``source_id``'s latest state with ``inputs``: the same
    source state and inputs give the same id in every process (FD)."""
    latest = persistence.latest_state_id(source_id)
    if latest is None:
        raise RemitError(f"cannot fork flow {source_id!r}: {persistence.url} holds no state "
                         "for it")
    extra = {k: v for k, v in (inputs or {}).items() if k != "id"}
    return derive_id(latest, "crewai-fork", extra)


def fork(flow: Any, source_id: str, inputs: dict[str, Any] | None = None) -> Any:
    """Fork ``source_id``: run ``flow`` (a fresh instance of a ``@durable`` class) from the
    source's latest state under a derived id. Forking twice with the same inputs gives
    the same flow id and state; a repeated fork resumes (or returns) the same lineage."""
    fid = fork_id(persistence_of(flow), source_id, inputs)
    return flow.kickoff(inputs={**(inputs or {}), "id": fid}, restore_from_state_id=source_id)


async def afork(flow: Any, source_id: str, inputs: dict[str, Any] | None = None) -> Any:
    """:func:`fork` for async code."""
    fid = fork_id(persistence_of(flow), source_id, inputs)
    return await flow.kickoff_async(inputs={**(inputs or {}), "id": fid},
                                    restore_from_state_id=source_id)


def use_as_default(url: str, *, lease: float | None = None) -> RemitFlowPersistence:
    """Make remit CrewAI's process-wide default persistence (a bare ``@persist()``,
    pausing and ``from_pending``), through CrewAI's own factory. Returns the backend."""
    backend = RemitFlowPersistence.from_url(url, lease=lease)
    set_flow_persistence_factory(lambda: backend)
    return backend
