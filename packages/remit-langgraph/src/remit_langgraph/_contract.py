"""The resume contract, translated to LangGraph's checkpointer calls.

This module is the only place that knows how the Pregel loop drives a saver.
It adds three things on top of :class:`~remit_langgraph.saver.RemitSaver`'s
plain storage, each by calling remit-core's primitives:

* **CO (consume-once).** A run that starts on a checkpoint parked on
  ``interrupt()`` claims the parked slot in ``get_tuple`` -- the one hook the
  loop calls synchronously before any node runs -- so that of k racing
  ``invoke(Command(resume=...))`` calls exactly one proceeds and the others
  raise :class:`~remit_core.ConsumeConflict` before any code after the
  interrupt point runs. The claim is consumed when the run moves past the
  parked checkpoint (a child checkpoint, or a new interrupt), released when
  the resumed task fails or the run ends without consuming it, and taken over
  after its lease by ``invoke(None, config)`` when its owner died (LV).
* **EO (effects).** A scope resolver gives every node execution the receipt
  scope ``(thread_id, task namespace)``; the task id in it is a pure function
  of the checkpoint the task runs from, so a re-run after a crash, an
  interrupt or a race finds the same receipts. The first effect of a task
  waits until that checkpoint is durable, so that the key survives a crash
  under ``durability="async"``.
* **FI/FD (forks).** ``configurable["remit_fork"] = True`` marks a request as
  a fork: it takes no claim, and a fork-addressed resume never sees a value
  recorded by an earlier resume at that checkpoint.

* **RD (recovery determinism of ids).** A run that continues its thread's head
  (``get_tuple`` without a checkpoint id, no ``remit_fork``) stores every
  checkpoint its loop writes after a superstep (``source="loop"``) under an id
  derived from (thread, namespace, parent checkpoint id, step, the channels the
  step updated and their values) instead of a time-based uuid6; see
  :func:`derive_step_id`. Recovering one durable state twice therefore names the
  new checkpoints, the tasks run from them and their effect receipts alike.

The gate learns whether an invocation delivers a resume value from the loop
object that called ``get_tuple`` (found on the call stack). RD needs a second
seam: the loop mints a checkpoint's id in ``create_checkpoint`` and ignores the
config ``put`` returns, so remit wraps ``langgraph.pregel._loop.create_checkpoint``
(a no-op for loops that do not run on a RemitSaver). These are the LangGraph
internals remit depends on; the contract tests fail if they move.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import FrameType, ModuleType
from typing import TYPE_CHECKING, Any

from langgraph.checkpoint.base import Checkpoint, CheckpointTuple
from langgraph.types import Command

from remit_core import ConsumeConflict, RemitError, SerializationError
from remit_core.effects import EffectScope, register_scope_resolver
from remit_core.ids import derive_id, value_digest
from remit_core.store import new_owner

if TYPE_CHECKING:
    from remit_langgraph.saver import RemitSaver

log = logging.getLogger("remit")

FORK_FLAG = "remit_fork"
"""``configurable`` key: True marks the request as a fork (FI)."""

INTERRUPT = "__interrupt__"
RESUME = "__resume__"
ERROR = "__error__"
CONTROL_WRITES = frozenset((INTERRUPT, RESUME, ERROR, "__error_source_node__"))
NULL_TASK_ID = "00000000-0000-0000-0000-000000000000"
_RUNTIME = "__pregel_runtime"

_PregelLoop: type[Any] | None
_loop_module: ModuleType | None
try:
    from langgraph.pregel import _loop as _loop_module
    from langgraph.pregel._loop import PregelLoop as _PregelLoop
except ImportError:  # pragma: no cover - moved in some release
    _PregelLoop = None
    _loop_module = None

_DeltaChannel: type[Any] | None
try:
    from langgraph.channels.delta import DeltaChannel as _DeltaChannel
except ImportError:  # pragma: no cover - langgraph before delta channels
    _DeltaChannel = None


# ======================================================================== pending interrupts


def _interrupt_id(item: Any) -> str:
    for attr in ("id", "interrupt_id"):
        value = getattr(item, attr, None)
        if isinstance(value, str) and value:
            return value
    return repr(item)


def pending_interrupt_ids(writes: Sequence[tuple[str, str, Any]] | None) -> list[str]:
    """Ids of the interrupts still waiting for an answer (LangGraph's own rule: a task's
    last interrupt is pending while the task has recorded no output write)."""
    finished = {t for t, ch, _ in writes or () if t != NULL_TASK_ID and ch not in CONTROL_WRITES}
    ids: set[str] = set()
    for task_id, channel, value in writes or ():
        if channel == INTERRUPT and task_id not in finished:
            items = value if isinstance(value, list | tuple) else [value]
            ids.update(_interrupt_id(i) for i in items)
    return sorted(ids)


def _find_loop() -> Any | None:
    """The Pregel loop whose ``__enter__``/``__aenter__`` is asking for a checkpoint."""
    if _PregelLoop is None:
        return None
    frame: FrameType | None = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, _PregelLoop):
            return candidate
        frame = frame.f_back
    return None


# ======================================================================================= CO


@dataclass
class _Hold:
    """A claim this process holds for one invocation parked at ``checkpoint_id``."""

    key: str
    thread_id: str
    ns: str
    checkpoint_id: str
    owner: str
    fence: int
    interrupt_ids: list[str]
    runtime: Any
    done: bool = False
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)


class ConsumeGate:
    """CO for one saver: claims parked checkpoints for the invocations that resume them."""

    def __init__(self, saver: RemitSaver) -> None:
        self.saver = saver
        self._holds: dict[tuple[str, str, str], _Hold] = {}
        self._lock = threading.Lock()

    @staticmethod
    def claim_key(thread_id: str, ns: str, checkpoint_id: str, ids: Sequence[str]) -> str:
        return f"langgraph|{thread_id}|{ns}|{checkpoint_id}|{','.join(ids)}"

    def on_load(self, config: dict[str, Any], found: CheckpointTuple | None,
                loop: Any | None) -> CheckpointTuple | None:
        """Called by ``get_tuple`` for every load; acts only for a run's own load."""
        if found is None or loop is None:
            return found  # a read (get_state, history) or a fresh thread: never claims
        conf = config.get("configurable", {})
        if conf.get(FORK_FLAG):
            return _strip_resumes(found) if _delivers(loop) else found  # FD: its own value
        if not _is_root_load(loop):
            return found
        thread_id = str(conf["thread_id"])
        ns = str(found.config["configurable"].get("checkpoint_ns", ""))
        checkpoint_id = str(found.config["configurable"]["checkpoint_id"])
        ids = pending_interrupt_ids(found.pending_writes)
        delivering = _delivers(loop)
        if delivering and not ids:
            raise ConsumeConflict(
                f"thread {thread_id!r}: checkpoint {checkpoint_id!r} has no pending interrupt, "
                "so this resume value would be recorded and never read (it was consumed "
                "already, or the run has moved on). Nothing was stored. Resume a static "
                "breakpoint with invoke(None, config); fork with "
                f"configurable[{FORK_FLAG!r}]=True to branch from a past interrupt.",
                key=self.claim_key(thread_id, ns, checkpoint_id, ids), run_id=thread_id,
                step=checkpoint_id,
            )
        if not ids:
            return found
        key = self.claim_key(thread_id, ns, checkpoint_id, ids)
        store = self.saver.store
        resume = loop.input.resume if delivering else None
        if delivering and isinstance(resume, dict) and resume and all(
                isinstance(k, str) for k in resume):
            unknown = sorted(set(resume) - set(ids))
            if unknown and set(resume) & set(ids) == set():
                raise ConsumeConflict(
                    f"thread {thread_id!r}: interrupt(s) {', '.join(unknown)} are not pending "
                    f"at checkpoint {checkpoint_id!r} (pending: {', '.join(ids)}); they were "
                    "answered already. Nothing was stored.",
                    key=key, run_id=thread_id, step=checkpoint_id,
                )
        if not delivering:
            current = store.get_claim(key)
            if current is None or current.status != "claimed":
                return found  # nothing in flight: invoke(None) just re-runs to the interrupt
        owner = new_owner()
        # CO: one atomic claim; losers raise here, before the loop runs any node.
        claim = store.claim_once(
            key, run_id=thread_id, owner=owner,
            digest=value_digest(resume, serde=store.serde) if delivering else None,
            value=resume if delivering else None,
        )
        if claim.taken_over:
            log.warning("remit: thread %s: taking over the resume of %s from %s, whose lease "
                        "expired (LV)", thread_id, checkpoint_id, claim.owner)
            found = _with_claimed_value(found, claim.value, ids)
        hold = _Hold(key, thread_id, ns, checkpoint_id, owner, claim.fence, ids,
                     conf.get(_RUNTIME))
        hold.stack.enter_context(store.keep_alive(
            lambda: store.renew_claim(key, owner=owner, fence=claim.fence)))
        with self._lock:
            self._holds[(thread_id, ns, checkpoint_id)] = hold
        weakref.finalize(loop, self._end, hold)
        return found

    def _hold_for(self, config: dict[str, Any], checkpoint_id: str | None) -> _Hold | None:
        conf = config.get("configurable", {})
        if checkpoint_id is None:
            return None
        with self._lock:
            hold = self._holds.get((str(conf.get("thread_id")),
                                    str(conf.get("checkpoint_ns", "")), str(checkpoint_id)))
        if hold is None or hold.done or conf.get(_RUNTIME) is not hold.runtime:
            return None
        return hold

    def after_writes(self, config: dict[str, Any], task_id: str,
                     writes: Sequence[tuple[str, Any]]) -> None:
        """The holder's task re-parked on a new interrupt (consumed) or failed (released)."""
        hold = self._hold_for(config, config.get("configurable", {}).get("checkpoint_id"))
        if hold is None or task_id == NULL_TASK_ID:
            return
        channels = {ch for ch, _ in writes}
        if ERROR in channels:
            self._finish(hold, consumed=False)
        elif INTERRUPT in channels:
            new = {_interrupt_id(i) for ch, v in writes if ch == INTERRUPT
                   for i in (v if isinstance(v, list | tuple) else [v])}
            if new - set(hold.interrupt_ids):
                self._finish(hold, consumed=True)

    def after_put(self, config: dict[str, Any]) -> None:
        """The holder's run wrote a child of the parked checkpoint: the value was consumed."""
        hold = self._hold_for(config, config.get("configurable", {}).get("checkpoint_id"))
        if hold is not None:
            self._finish(hold, consumed=True)

    def _finish(self, hold: _Hold, *, consumed: bool) -> None:
        with self._lock:
            if hold.done:
                return
            hold.done = True
            self._holds.pop((hold.thread_id, hold.ns, hold.checkpoint_id), None)
        hold.stack.close()
        store = self.saver.store
        try:
            if consumed:
                store.consume_claim(hold.key, owner=hold.owner, fence=hold.fence)
            else:
                store.release_claim(hold.key, owner=hold.owner, fence=hold.fence)
        except RemitError:
            log.warning("remit: could not %s claim %s", "consume" if consumed else "release",
                        hold.key, exc_info=True)

    def _end(self, hold: _Hold) -> None:
        """The invocation ended (its loop was collected) without consuming: give it back.

        At interpreter exit the store may be closed already; the lease then ends the claim.
        """
        if not hold.done:
            with contextlib.suppress(Exception):
                self._finish(hold, consumed=False)


def _delivers(loop: Any) -> bool:
    value = getattr(loop, "input", None)
    return isinstance(value, Command) and value.resume is not None


def _is_root_load(loop: Any) -> bool:
    """Subgraph loops receive the resume through their parent; only the root gates."""
    return not getattr(loop, "is_nested", False)


def _with_claimed_value(found: CheckpointTuple, value: Any, ids: Sequence[str]) -> CheckpointTuple:
    """LV: the dead owner's resume write may not have reached the store before it died
    (LangGraph writes it in the background); the claim recorded the value, so recovery
    continues with exactly that value."""
    writes = list(found.pending_writes or ())
    if value is None or any(t == NULL_TASK_ID and ch == RESUME for t, ch, _ in writes):
        return found
    if isinstance(value, dict) and value and set(value) <= set(ids):
        if len(value) != 1:
            return found  # a map answering several interrupts travels in the config only
        (value,) = value.values()
    return found._replace(pending_writes=[(NULL_TASK_ID, RESUME, value), *writes])


def _strip_resumes(found: CheckpointTuple) -> CheckpointTuple:
    writes = [w for w in found.pending_writes or () if w[1] != RESUME]
    return found._replace(pending_writes=writes)


# ======================================================================================= RD

_UUID_EPOCH = 0x01B21DD213814000
"""100 ns intervals from the UUID epoch (1582-10-15) to the Unix epoch (as in uuid6)."""

_runs: weakref.WeakKeyDictionary[Any, tuple[RemitSaver, str, str] | None] = (
    weakref.WeakKeyDictionary())
_runs_lock = threading.Lock()


def note_load(saver: RemitSaver, config: Mapping[str, Any], loop: Any | None, *,
              addressed: bool) -> None:
    """RD: remember how a run's loop loaded its checkpoint (called by ``get_tuple``).

    A loop that loaded the head of its thread and namespace (no checkpoint id) and is
    not a fork gets derived ids. One that addressed a checkpoint (time travel, a resume
    at a past checkpoint, a subgraph replay) keeps LangGraph's ids, also when it asks
    for the head afterwards (LangGraph's ``checkpoint_superseded`` check does).
    """
    if loop is None:
        return
    conf = config.get("configurable", {})
    head = (not addressed and not conf.get(FORK_FLAG)
            and getattr(loop, "checkpointer", None) is saver)
    with _runs_lock:
        if loop in _runs and _runs[loop] is None:
            return
        _runs[loop] = ((saver, str(conf["thread_id"]), str(conf.get("checkpoint_ns") or ""))
                       if head else None)


def derive_step_id(thread_id: str, ns: str, parent: Checkpoint, step: int, new: Checkpoint,
                   *, serde: Any = None) -> str:
    """The id of the checkpoint a superstep produced from ``parent``.

    Derived from (thread, namespace, parent id, step, the channels the step updated
    and their values); channel versions are left out, their suffix is random. Laid out
    as a uuid6, like LangGraph's own ids: its time is the parent's plus 100 ns (the
    parent id's time when it is a uuid6, else the parent's ``ts``), its clock sequence
    the step and its node 48 bits of the digest, so a child's id sorts after its
    parent's, as along a chain of uuid6 ids. Raises ``SerializationError`` for a value
    remit cannot store.
    """
    values = new.get("channel_values") or {}
    updated = new.get("updated_channels")
    names = sorted(values) if updated is None else sorted(updated)
    written = {ch: [values[ch]] if ch in values else [] for ch in names}
    key = derive_id(f"{thread_id}|{ns}|{parent['id']}", f"loop|{step}",
                    {"updated": names, "values": written}, serde=serde)
    timestamp = _uuid_time(parent) + 1
    node = uuid.UUID(key).int & 0xFFFFFFFFFFFF
    value = ((timestamp >> 12) & 0xFFFFFFFFFFFF) << 80
    value |= (0x6000 | (timestamp & 0x0FFF)) << 64  # version 6
    value |= (0x8000 | (step & 0x3FFF)) << 48  # RFC 4122 variant, clock_seq = step
    value |= node
    return str(uuid.UUID(int=value))


def _uuid_time(checkpoint: Checkpoint) -> int:
    """A checkpoint's time in 100 ns intervals since the UUID epoch."""
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        parsed = uuid.UUID(str(checkpoint["id"]))
        if parsed.version == 6:
            return ((parsed.int >> 80) << 12) | ((parsed.int >> 64) & 0x0FFF)
    with contextlib.suppress(ValueError, TypeError, KeyError):
        ts = datetime.fromisoformat(str(checkpoint["ts"]))
        return int(ts.timestamp() * 10_000_000) + _UUID_EPOCH
    return 0


def derived_checkpoint_id(loop: Any, parent: Checkpoint, channels: Mapping[str, Any] | None,
                          step: int, new: Checkpoint) -> str | None:
    """RD: the id a RemitSaver run's loop stores ``new`` under, or None for LangGraph's.

    Derived only for a checkpoint written after a superstep (``source="loop"``) by a
    loop that continues its thread's head (:func:`note_load`). Not under
    ``durability="exit"``, whose steps build checkpoints without their new values
    (``channels`` is None) and store only the last, under the id of the one before;
    and not when the graph has delta channels (their values are not in the
    checkpoint, so the digest could not tell two children apart).
    """
    if channels is None or _PregelLoop is None or not isinstance(loop, _PregelLoop):
        return None
    with _runs_lock:
        run = _runs.get(loop)
    if run is None:
        return None
    metadata = getattr(loop, "checkpoint_metadata", None) or {}
    if metadata.get("source") != "loop" or metadata.get("step") != step:
        return None
    if _has_delta_channels(loop, channels):
        return None
    saver, thread_id, ns = run
    try:
        return derive_step_id(thread_id, ns, parent, step, new, serde=saver.store.serde)
    except SerializationError:
        return None  # put refuses the same value and names it


# whether a loop's graph has delta channels: its channel types are fixed for the run, and
# a graph has a channel per node and per edge, so this is worked out once per loop
_delta: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _has_delta_channels(loop: Any, channels: Mapping[str, Any]) -> bool:
    if _DeltaChannel is None:
        return False
    with _runs_lock:
        found = _delta.get(loop)
    if found is None:
        delta = _DeltaChannel
        found = any(issubclass(t, delta) for t in {type(ch) for ch in channels.values()})
        with _runs_lock:
            _delta[loop] = found
    return found


def _install_id_hook() -> None:
    """Wrap the ``create_checkpoint`` the Pregel loop calls, once per process.

    The loop keeps the id it minted (it discards what ``put`` returns), so the id has
    to be chosen when the loop builds the checkpoint. The wrapper changes nothing for
    a loop remit does not know (another saver, a read, ``update_state``, which uses
    its own import), and nothing when the loop passes an id (the exit re-put)."""
    module = _loop_module
    original: Callable[..., Any] | None = getattr(module, "create_checkpoint", None)
    if module is None or original is None or getattr(original, "__remit__", False):
        return

    @functools.wraps(original)
    def create_checkpoint(checkpoint: Checkpoint, channels: Mapping[str, Any] | None,
                          step: int, *args: Any, **kwargs: Any) -> Any:
        new = original(checkpoint, channels, step, *args, **kwargs)
        if kwargs.get("id") is None and len(_runs):
            loop = sys._getframe(1).f_locals.get("self")
            derived = derived_checkpoint_id(loop, checkpoint, channels, step, new)
            if derived is not None:
                new["id"] = derived
        return new

    create_checkpoint.__remit__ = True  # type: ignore[attr-defined]
    module.create_checkpoint = create_checkpoint  # type: ignore[attr-defined]


_install_id_hook()


# ======================================================================================= EO


@dataclass
class _LgScope:
    marker: Any
    scope: EffectScope


_current: contextvars.ContextVar[_LgScope | None] = contextvars.ContextVar(
    "remit_langgraph_scope", default=None)

DURABLE_WAIT = 60.0
"""Seconds the first effect of a task waits for the task's checkpoint to become durable."""


def resolve_scope() -> EffectScope | None:
    """The receipt scope of the LangGraph task running in this context, if its
    checkpointer is a RemitSaver."""
    from remit_langgraph.saver import RemitSaver

    try:
        from langgraph.config import get_config

        config = get_config()
    except (RuntimeError, ImportError):
        return None
    conf = config.get("configurable") or {}
    saver = conf.get("__pregel_checkpointer")
    if not isinstance(saver, RemitSaver):
        return None
    task_id = conf.get("__pregel_task_id")
    if not task_id:
        return None
    marker = conf.get(_RUNTIME) or conf.get("__pregel_scratchpad")
    cached = _current.get()
    if cached is not None and cached.marker is marker:
        return cached.scope
    thread_id = str(conf["thread_id"])
    ns = str(conf.get("checkpoint_ns", ""))
    _wait_durable(saver, conf, thread_id, ns)
    step = ns if str(task_id) in ns else f"{ns}|{task_id}"
    scope = EffectScope(saver.store, thread_id, step)
    _current.set(_LgScope(marker, scope))
    return scope


def _wait_durable(saver: RemitSaver, conf: dict[str, Any], thread_id: str, task_ns: str) -> None:
    """EO: a receipt key names the task's checkpoint; make sure that checkpoint is stored
    before the effect fires, or a crash could re-create the task under a new id."""
    if conf.get("__pregel_durability") == "exit":
        raise RemitError(
            "an @effect ran under durability='exit', where LangGraph stores no checkpoint "
            "until the run ends, so its receipt could not survive a crash. Use "
            "durability='sync' or 'async' with remit."
        )
    graph_ns = task_ns.rpartition("|")[0] if "|" in task_ns else ""
    runtime = conf.get(_RUNTIME)
    info = getattr(runtime, "execution_info", None)
    checkpoint_map: dict[str, Any] = conf.get("checkpoint_map") or {}
    checkpoint_id = getattr(info, "checkpoint_id", None) or checkpoint_map.get(graph_ns)
    if not checkpoint_id:
        return
    # The namespace the checkpoint is stored in is that of the loop running the task. A
    # functional @task runs in its caller's loop, but its namespace nests under the caller
    # task's ("wf:<id>|prep:<id>"), and the map lists the caller's namespace with the same
    # checkpoint id: the loop's own namespace is the shortest one mapped to that id.
    owners = [k for k, v in checkpoint_map.items() if v == checkpoint_id]
    if owners:
        graph_ns = min(owners, key=len)
    deadline = time.monotonic() + DURABLE_WAIT
    pause = 0.002
    while saver.store.get_checkpoint(thread_id, checkpoint_id, ns=graph_ns,
                                     with_writes=False) is None:
        if time.monotonic() > deadline:
            raise RemitError(
                f"thread {thread_id!r}: checkpoint {checkpoint_id!r} of task {task_ns!r} was "
                f"not stored within {DURABLE_WAIT:.0f} s, so its effects cannot be keyed "
                "durably; check the store."
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


register_scope_resolver(resolve_scope)
