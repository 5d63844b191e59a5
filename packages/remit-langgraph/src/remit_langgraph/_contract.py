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

The gate learns whether an invocation delivers a resume value from the loop
object that called ``get_tuple`` (found on the call stack); this is the one
LangGraph internal remit depends on, and the contract tests fail if it moves.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any

from langgraph.checkpoint.base import CheckpointTuple
from langgraph.types import Command

from remit_core import ConsumeConflict, RemitError
from remit_core.effects import EffectScope, register_scope_resolver
from remit_core.ids import value_digest
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
try:
    from langgraph.pregel._loop import PregelLoop as _PregelLoop
except ImportError:  # pragma: no cover - moved in some release
    _PregelLoop = None


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
