"""The resume contract, translated to LangGraph's checkpointer calls.

This module is the only place that knows how the Pregel loop drives a saver; the
LangGraph internals it relies on are all in :mod:`remit_langgraph._seam`, checked
at import. It adds three things on top of :class:`~remit_langgraph.saver.RemitSaver`'s
plain storage, each by calling remit-core's primitives (through
:mod:`remit_core.adapter`). It knows the saver only as a :class:`GatedSaver`, the base
class ``RemitSaver`` derives from, so ``saver`` imports this module and not the reverse.

* **CO (consume-once).** One invocation is one Pregel loop, from its entry to its
  exit. When a root loop loads a checkpoint parked on ``interrupt()`` (or at a static
  breakpoint) and delivers a resume value, it claims each interrupt its value answers
  -- once, at its first load; the other loads an invocation makes (LangGraph's
  ``checkpoint_superseded`` check, delta-channel history) are reads. Of k racing
  deliveries exactly one proceeds; the others raise
  :class:`~remit_core.ConsumeConflict` before any node runs. A claim is *consumed*
  when the run moves past the parked checkpoint, when the answered task parks on a
  new interrupt, or when the invocation ends normally; it is *released* when the
  answered task fails or the invocation ends with an exception (cancellation
  included), so that a corrected resume can follow. A later delivery to a consumed
  interrupt is refused; ``invoke(None, config)`` takes a claim over after its lease
  when its owner died (LV) and continues with the value the owner recorded.
  Where LangGraph itself refuses a resume (an unknown interrupt id under strict
  resume, one value for several pending interrupts) the gate claims nothing that
  LangGraph would refuse, so the user gets LangGraph's own exception.
* **EO (effects).** A scope resolver gives every node execution the receipt
  scope ``(thread_id, task namespace)``; the task id in it is a pure function
  of the checkpoint the task runs from, so a re-run after a crash, an
  interrupt or a race finds the same receipts. The first effect of a task
  waits until that checkpoint is durable, so that the key survives a crash
  under ``durability="async"``.
* **FI/FD (forks).** ``configurable["remit_fork"] = True`` marks a request as
  a fork: it takes no claim, and a fork-addressed resume never sees a value
  recorded by an earlier resume at that checkpoint.
* **The run lifecycle.** A root loop that got past the gate keeps its thread's
  lifecycle in the store for the execution (:func:`keep_lifecycle`, remit-core's
  :func:`~remit_core.adapter.keep_run`): running with a lease renewed in the
  background, then parked (on interrupts or a breakpoint, with what it waits for),
  done or failed (what ended it) when the loop exits. A recovery
  (:func:`remit_langgraph.recover`) continues threads whose executor died.
* **RD (recovery determinism of ids).** A run that continues its thread's head
  (its first load has no checkpoint id, no ``remit_fork``) stores every
  checkpoint its loop writes after a superstep (``source="loop"``) under an id
  derived from (thread, namespace, parent checkpoint id, step, the channels the
  step updated and the writes of its tasks) instead of a time-based uuid6; see
  :func:`derive_step_id`. Recovering one durable state twice therefore names the
  new checkpoints, the tasks run from them and their effect receipts alike.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import re
import threading
import uuid
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from langgraph.checkpoint.base import Checkpoint, CheckpointTuple
from langgraph.config import get_config
from langgraph.types import Command

from remit_core import ConsumeConflict, RemitError, SerializationError, Store
from remit_core.adapter import (
    Claim,
    EffectScope,
    RunKeeper,
    aio,
    derive_int,
    keep_run,
    new_owner,
    poll,
    register_scope_resolver,
    split_claim_key,
    uuid_text,
    value_digest,
)
from remit_core.adapter import claim_key as _core_claim_key
from remit_langgraph import _seam
from remit_langgraph._seam import (
    CONFIG_KEY_CHECKPOINT_MAP,
    CONFIG_KEY_CHECKPOINTER,
    CONFIG_KEY_DURABILITY,
    CONFIG_KEY_RUNTIME,
    CONFIG_KEY_SCRATCHPAD,
    CONFIG_KEY_STRICT_RESUME,
    CONFIG_KEY_TASK_ID,
    ERROR,
    INTERRUPT,
    NULL_TASK_ID,
    RESUME,
    Parked,
)

log = logging.getLogger("remit")

FRAMEWORK = "langgraph"
"""The framework part of remit-langgraph's claim keys."""

FORK_FLAG = "remit_fork"
"""``configurable`` key: True marks the request as a fork (FI)."""

DEFAULT_NAME = "LangGraph"
"""The lifecycle name of a run whose graph has no name of its own (LangGraph's default)."""

BREAKPOINT = "~breakpoint"
"""The interrupt part of the claim key of a resume delivered at a static breakpoint."""


# ======================================================================================= CO


class GatedSaver:
    """What the contract needs of a saver: its store, and a way to allow a graph's
    channel types in the store's envelope. :class:`~remit_langgraph.saver.RemitSaver`
    derives from it; the contract recognises a remit saver by it (an ``isinstance`` of
    a base class, cheap on the hot path: every effect resolves its scope through it)."""

    store: Store

    def allow_channels(self, channels: Mapping[str, Any]) -> None:
        raise NotImplementedError


def claim_key(thread_id: str, ns: str, checkpoint_id: str, interrupt_id: str,
              answered: int = 0) -> str:
    """The claim of one interrupt *instance*: the thread, namespace and checkpoint it is
    parked at, its id, and how many answers its task had received before it (a node
    that interrupts twice at one checkpoint parks two instances). Parts are escaped
    (:func:`remit_core.adapter.claim_key`), so a ``|`` in a thread id cannot make two
    keys collide."""
    return _core_claim_key(FRAMEWORK, thread_id, ns, checkpoint_id, interrupt_id,
                           str(answered))


def _split_key(key: str) -> tuple[str, ...] | None:
    """(thread, namespace, checkpoint, interrupt, answered) of a key made by
    :func:`claim_key`, None for another framework's key or another shape."""
    parts = split_claim_key(key)
    if parts[0] != FRAMEWORK or len(parts) != 6:
        return None
    return parts[1:]


@dataclass
class _Claim:
    key: str
    task_id: str | None  # None: a resume delivered at a static breakpoint
    fence: int
    state: str = "held"  # held -> consumed | released


@dataclass
class _Invocation:
    """One root loop's claims: its identity is the loop, from entry to exit."""

    gate: ConsumeGate
    thread_id: str
    ns: str
    checkpoint_id: str
    owner: str
    runtime: Any
    claims: list[_Claim] = field(default_factory=list)
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def held(self, task_id: str | None = None, *, every: bool = False) -> list[_Claim]:
        return [c for c in self.claims
                if c.state == "held" and (every or c.task_id == task_id)]


# loads seen while a loop entered, by loop (the seam's runtime check), and each root
# loop's invocation record
_loaded: weakref.WeakSet[Any] = weakref.WeakSet()
_invocations: weakref.WeakKeyDictionary[Any, _Invocation | None] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def note_loaded(loop: Any) -> bool:
    """Record that ``loop`` loaded a checkpoint while entering; True for its first load."""
    with _lock:
        first = loop not in _loaded
        _loaded.add(loop)
    return first


class ConsumeGate:
    """CO for one saver: claims parked interrupts for the invocations that answer them."""

    def __init__(self, saver: GatedSaver) -> None:
        self.saver = saver
        self._holds: dict[tuple[str, str, str], _Invocation] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ the first load

    def on_load(self, config: dict[str, Any], found: CheckpointTuple | None,
                loop: Any | None) -> CheckpointTuple | None:
        """Called by ``get_tuple`` for the first load of an entering loop; claims what
        its resume value answers. Every other load is a read and never claims."""
        if found is None or loop is None:
            return found
        view = _seam.view(loop)
        if view.is_nested:  # subgraph loops get their resume through the root's
            return found
        conf = config.get("configurable", {})
        delivering = isinstance(view.input, Command) and view.input.resume is not None
        if conf.get(FORK_FLAG):
            return _strip_resumes(found) if delivering else found  # FD: its own value
        thread_id = str(conf["thread_id"])
        ns = str(found.config["configurable"].get("checkpoint_ns", ""))
        checkpoint_id = str(found.config["configurable"]["checkpoint_id"])
        parked = _seam.parked(found.pending_writes)
        store = self.saver.store
        if delivering:
            resume = view.input.resume
            targets = self._targets(thread_id, ns, checkpoint_id, parked, resume, view,
                                    addressed=conf.get("checkpoint_id") is not None)
            values = {t: resume[t.interrupt_id] if _seam.is_resume_map(resume) else resume
                      for t in targets}
        else:
            # invoke(None) or new input: nothing is delivered, so nothing is claimed,
            # unless a delivery is in flight (held): then this is a recovery, which must
            # wait out the holder's lease and continue with its recorded value (LV)
            targets = [p for p in parked
                       if (c := store.get_claim(self._key(thread_id, ns, checkpoint_id, p)))
                       is not None and c.status == "claimed"]
            values = dict.fromkeys(targets)
        if not targets:
            return found
        inv = _Invocation(self, thread_id, ns, checkpoint_id, new_owner(),
                          conf.get(CONFIG_KEY_RUNTIME))
        taken: list[Claim] = []
        try:
            for target in targets:
                key = self._key(thread_id, ns, checkpoint_id, target)
                value = values[target]
                # CO: one atomic claim per instance; losers raise here, before any node runs
                claim = store.claim_once(
                    key, run_id=thread_id, owner=inv.owner,
                    digest=None if value is None else value_digest(value, serde=store.serde),
                    value=value)
                inv.claims.append(_Claim(key, getattr(target, "task_id", None), claim.fence))
                taken.append(claim)
        except BaseException:
            self._finish(inv, consumed=False)
            raise
        for claim in taken:
            if claim.taken_over:
                log.warning("remit: thread %s: %s takes over the resume of %s from %s, whose "
                            "lease expired (LV)", thread_id, claim.owner, checkpoint_id,
                            claim.previous_owner)
        if len(taken) == 1 and taken[0].taken_over and len(parked) <= 1:
            found = _with_claimed_value(found, taken[0].value)
        inv.stack.enter_context(store.keep_alive(functools.partial(self._renew, inv)))
        with self._lock:
            self._holds[(thread_id, ns, checkpoint_id)] = inv
        with _lock:
            _invocations[loop] = inv
        weakref.finalize(loop, self._end, inv)
        return found

    def _key(self, thread_id: str, ns: str, checkpoint_id: str, target: Parked | str) -> str:
        if isinstance(target, Parked):
            return claim_key(thread_id, ns, checkpoint_id, target.interrupt_id, target.answered)
        return claim_key(thread_id, ns, checkpoint_id, target)

    def _targets(self, thread_id: str, ns: str, checkpoint_id: str, parked: list[Parked],
                 resume: Any, view: _seam.LoopView, *, addressed: bool) -> list[Any]:
        """What a delivered resume value answers (the instances to claim), or raise when
        it answers nothing LangGraph would accept and it is a second delivery."""
        if _seam.is_resume_map(resume):
            named = set(resume)
            targets: list[Any] = [p for p in parked if p.interrupt_id in named]
            unmatched = sorted(named - {p.interrupt_id for p in parked})
            if unmatched:
                self._refuse_answered(thread_id, ns, checkpoint_id, unmatched, view,
                                      addressed=addressed)
            return targets
        if parked:  # one value: LangGraph itself refuses it when several are pending
            return list(parked)
        if view.breakpoints:  # a static breakpoint: continued once, like a parked run
            return [BREAKPOINT]
        head = self._head_id(thread_id, ns) if addressed else checkpoint_id
        moved = "" if head == checkpoint_id else f" (the thread has moved on to {head!r})"
        raise ConsumeConflict(
            f"thread {thread_id!r}: checkpoint {checkpoint_id!r}{moved} has no pending "
            "interrupt, so this resume value would be recorded and never read (it was "
            "consumed already, or the run has moved on). Nothing was stored. To branch from "
            f"a past interrupt, fork with configurable[{FORK_FLAG!r}]=True.",
            key=claim_key(thread_id, ns, checkpoint_id, ""), run_id=thread_id,
            step=checkpoint_id,
        )

    def _head_id(self, thread_id: str, ns: str) -> str | None:
        head = self.saver.store.get_checkpoint(thread_id, None, ns=ns, with_writes=False)
        return None if head is None else head.checkpoint_id

    def _refuse_answered(self, thread_id: str, ns: str, checkpoint_id: str,
                         ids: Sequence[str], view: _seam.LoopView, *, addressed: bool) -> None:
        """CO: a resume map naming an interrupt that was answered already (or is being
        answered by a delivery in flight) is a second delivery. Under LangGraph's strict
        resume at the thread's head LangGraph refuses it itself (``UnknownInterruptError``),
        so remit leaves it to LangGraph there; an id nobody answered is LangGraph's to
        accept or refuse."""
        wanted = set(ids)
        answered = [c for c in self.saver.store.list_claims(thread_id)
                    if c.status in ("consumed", "claimed")
                    and (parts := _split_key(c.key)) is not None
                    and parts[1] == ns and parts[3] in wanted]
        if not answered:
            return
        strict = (CONFIG_KEY_STRICT_RESUME is not None
                  and bool(view.configurable.get(CONFIG_KEY_STRICT_RESUME)))
        if strict and (not addressed or self._head_id(thread_id, ns) == checkpoint_id):
            return
        first = min(answered, key=lambda c: (c.status != "consumed", c.consumed_at or 0.0))
        parts = _split_key(first.key) or ("",) * 5
        if first.status == "consumed":
            when = _iso(first.consumed_at)
            what = f"was answered already, at checkpoint {parts[2]!r} by {first.owner!r} ({when})"
        else:
            what = (f"is being answered by {first.owner!r}, at checkpoint {parts[2]!r} (its "
                    f"lease runs until {_iso(first.lease_until)})")
        raise ConsumeConflict(
            f"thread {thread_id!r}: interrupt {parts[3]} {what}; a resume value is consumed "
            "once, so this one was not stored. Answer the interrupts pending now "
            f"(graph.get_state(config).interrupts), or fork with "
            f"configurable[{FORK_FLAG!r}]=True to branch from that interrupt.",
            key=first.key, run_id=thread_id, step=checkpoint_id, owner=first.owner,
            consumed_at=first.consumed_at, status=first.status,
        )

    def _renew(self, inv: _Invocation) -> bool:
        store = self.saver.store
        ok = True
        for claim in inv.held(every=True):
            ok = store.renew_claim(claim.key, owner=inv.owner, fence=claim.fence) and ok
        return ok

    # ------------------------------------------------------------------ what the run does

    def _hold_for(self, config: Mapping[str, Any]) -> _Invocation | None:
        conf = config.get("configurable", {})
        checkpoint_id = conf.get("checkpoint_id")
        if checkpoint_id is None or not self._holds:
            return None
        with self._lock:
            inv = self._holds.get((str(conf.get("thread_id")),
                                   str(conf.get("checkpoint_ns", "")), str(checkpoint_id)))
        if inv is None or conf.get(CONFIG_KEY_RUNTIME) is not inv.runtime:
            return None
        return inv

    def after_writes(self, config: Mapping[str, Any], task_id: str,
                     writes: Sequence[tuple[str, Any]]) -> None:
        """An answered task parked on a new interrupt (consumed) or failed (released)."""
        inv = self._hold_for(config)
        if inv is None or task_id == NULL_TASK_ID:
            return
        channels = {ch for ch, _ in writes}
        if ERROR in channels:
            self._settle(inv, inv.held(task_id), consumed=False)
        elif INTERRUPT in channels:
            self._settle(inv, inv.held(task_id), consumed=True)

    def after_put(self, config: Mapping[str, Any]) -> None:
        """The invocation wrote a child of the parked checkpoint: the values were consumed."""
        inv = self._hold_for(config)
        if inv is not None:
            self._settle(inv, inv.held(every=True), consumed=True)

    def ended(self, inv: _Invocation, *, ok: bool) -> None:
        """The invocation's loop exited: what it still holds is consumed if it ended
        normally (an interrupt included), released if an exception ended it."""
        self._finish(inv, consumed=ok)

    # ------------------------------------------------------------------ settling

    def _settle(self, inv: _Invocation, claims: Sequence[_Claim], *, consumed: bool) -> None:
        store = self.saver.store
        for claim in claims:
            with inv.lock:
                if claim.state != "held":
                    continue
                claim.state = "consumed" if consumed else "released"
            try:
                if consumed:
                    store.consume_claim(claim.key, owner=inv.owner, fence=claim.fence)
                else:
                    store.release_claim(claim.key, owner=inv.owner, fence=claim.fence)
            except RemitError:
                log.warning("remit: could not %s claim %s", "consume" if consumed else
                            "release", claim.key, exc_info=True)
        if not inv.held(every=True):
            self._close(inv)

    def _close(self, inv: _Invocation) -> None:
        with self._lock:
            if self._holds.get((inv.thread_id, inv.ns, inv.checkpoint_id)) is inv:
                del self._holds[(inv.thread_id, inv.ns, inv.checkpoint_id)]
        inv.stack.close()

    def _finish(self, inv: _Invocation, *, consumed: bool) -> None:
        self._settle(inv, inv.held(every=True), consumed=consumed)
        self._close(inv)

    def _end(self, inv: _Invocation) -> None:
        """Safety net: the loop was collected without exiting (a stream nobody closed).
        At interpreter exit the store may be closed already; the lease then ends it."""
        with contextlib.suppress(Exception):
            self._finish(inv, consumed=False)


# ====================================================================== the run lifecycle

_keepers: weakref.WeakKeyDictionary[Any, RunKeeper] = weakref.WeakKeyDictionary()


def keep_lifecycle(saver: GatedSaver, config: Mapping[str, Any], loop: Any | None, *,
                   found: bool = True) -> None:
    """A root loop that got past the gate (its first load) executes its thread: keep the
    thread's lifecycle from here to the loop's exit (:meth:`_Hooks.exited`), under the
    graph's name. A loop collected without exiting stops renewing: its lease then runs
    out and the thread reads as abandoned. ``found``: the load found a checkpoint (if
    not, the thread is most likely new: ``likely_new``)."""
    if loop is None or _seam.view(loop).is_nested:
        return
    thread_id = str(config.get("configurable", {})["thread_id"])
    keeper = keep_run(saver.store, thread_id, framework=FRAMEWORK,
                      name=_seam.graph_name() or DEFAULT_NAME, likely_new=not found)
    with _lock:
        _keepers[loop] = keeper
    weakref.finalize(loop, keeper.close)


class _Hooks:
    """What the seam calls: one invocation's entry and exit, and RD's id choice."""

    def graph_types(self, checkpointer: Any, channels: Any) -> None:
        if isinstance(checkpointer, GatedSaver) and channels:
            checkpointer.allow_channels(channels)

    def entered(self, loop: Any) -> None:
        if (isinstance(getattr(loop, "checkpointer", None), GatedSaver)
                and not getattr(loop, "is_nested", False) and loop not in _loaded):
            raise _seam.LangGraphSeamError(
                "the Pregel loop's entry",
                "entered without asking RemitSaver for its checkpoint in the entering "
                "context, so the consume-once gate could not see the invocation")

    def exited(self, loop: Any, *, ok: bool, error: BaseException | None) -> None:
        with _lock:
            inv = _invocations.pop(loop, None)
            keeper = _keepers.pop(loop, None)
        try:
            if inv is not None:
                inv.gate.ended(inv, ok=ok)
        finally:
            if keeper is not None:
                end = _seam.loop_end(loop, ok=ok, error=error)
                if end.drained:  # continued later: by its caller, or once its lease ends
                    keeper.close()
                else:
                    keeper.end(end.error, parked=end.parked, waiting=end.waiting)

    def derive_id(self, loop: Any, parent: Any, channels: Any, step: int, new: Any) -> None:
        derived = derived_checkpoint_id(loop, parent, channels, step, new)
        if derived is not None:
            new["id"] = derived

    def task_writes(self, loop: Any, task_id: str, writes: Sequence[tuple[str, Any]]
                    ) -> None:
        """Group commit: the last writes of a step go in the transaction of the step's
        checkpoint (remit_core.store.groups), one durable commit per step, not two."""
        saver = getattr(loop, "checkpointer", None)
        if not isinstance(saver, GatedSaver):
            return
        target = _seam.finishing_writes(loop, task_id, writes)
        if target is not None:
            thread_id, ns, checkpoint_id, background = target
            saver.store.expect_writes(thread_id, checkpoint_id, task_id, ns=ns,
                                      background=background)


def _iso(epoch: float | None) -> str:
    return datetime.fromtimestamp(epoch or 0.0, UTC).isoformat(timespec="seconds")


def _with_claimed_value(found: CheckpointTuple, value: Any) -> CheckpointTuple:
    """LV: the dead owner's resume write may not have reached the store before it died
    (LangGraph writes it in the background); the claim recorded the value, so recovery
    continues with exactly that value."""
    writes = list(found.pending_writes or ())
    if value is None or any(t == NULL_TASK_ID and ch == RESUME for t, ch, _ in writes):
        return found
    return found._replace(pending_writes=[(NULL_TASK_ID, RESUME, value), *writes])


def _strip_resumes(found: CheckpointTuple) -> CheckpointTuple:
    writes = [w for w in found.pending_writes or () if w[1] != RESUME]
    return found._replace(pending_writes=writes)


# ======================================================================================= RD

_UUID_EPOCH = 0x01B21DD213814000
"""100 ns intervals from the UUID epoch (1582-10-15) to the Unix epoch (as in uuid6)."""

_runs: weakref.WeakKeyDictionary[Any, tuple[GatedSaver, str, str] | None] = (
    weakref.WeakKeyDictionary())
_runs_lock = threading.Lock()


def note_load(saver: GatedSaver, config: Mapping[str, Any], loop: Any | None, *,
              addressed: bool) -> None:
    """RD: remember how a run's loop loaded its checkpoint (called by ``get_tuple``).

    Called for a loop's first load only. A loop that loaded the head of its thread and
    namespace (no checkpoint id) and is not a fork gets derived ids. One that addressed
    a checkpoint (time travel, a resume at a past checkpoint, a subgraph replay) keeps
    LangGraph's ids.
    """
    if loop is None:
        return
    conf = config.get("configurable", {})
    checkpointer = getattr(loop, "checkpointer", None)
    # (the loop's checkpointer may be a copy of the saver, as LangGraph's with_allowlist
    # makes for other savers: what matters is that it writes to the same store)
    head = (not addressed and not conf.get(FORK_FLAG)
            and isinstance(checkpointer, GatedSaver) and checkpointer.store is saver.store)
    with _runs_lock:
        _runs[loop] = ((saver, str(conf["thread_id"]), str(conf.get("checkpoint_ns") or ""))
                       if head else None)


def derive_step_id(thread_id: str, ns: str, parent: Checkpoint, step: int, new: Checkpoint,
                   writes: Sequence[tuple[str, Sequence[tuple[str, Any]]]], *,
                   serde: Any = None) -> str:
    """The id of the checkpoint a superstep produced from ``parent``.

    Derived from (thread, namespace, parent id, step, the channels the step updated,
    and the step's ``writes``: per task, its id and its state writes in order, as
    :func:`remit_langgraph._seam.step_writes` gives them). The parent's values and
    those writes make the new values, so equal inputs name the same child, and the
    cost is that of the step's writes, not of the whole state (a chat's message list
    is not hashed again at every turn). The writes are those stored as the parent's
    pending writes, so the id can be worked out again from what is stored. Laid out
    as a uuid6, like LangGraph's own ids: its time is the parent's plus 100 ns (the
    parent id's time when it is a uuid6, else the parent's ``ts``), its clock
    sequence the step and its node 48 bits of the digest, so a child's id sorts after
    its parent's, as along a chain of uuid6 ids. Raises ``SerializationError`` for a
    value remit cannot store.
    """
    updated = new.get("updated_channels")
    names = sorted(new.get("channel_values") or {}) if updated is None else sorted(updated)
    key = derive_int(f"{thread_id}|{ns}|{parent['id']}", f"step|{step}",
                     {"updated": names,
                      "writes": [[task, [[ch, v] for ch, v in w]] for task, w in writes]},
                     serde=serde)
    timestamp = _uuid_time(parent) + 1
    node = key & 0xFFFFFFFFFFFF
    value = ((timestamp >> 12) & 0xFFFFFFFFFFFF) << 80
    value |= (0x6000 | (timestamp & 0x0FFF)) << 64  # version 6
    value |= (0x8000 | (step & 0x3FFF)) << 48  # RFC 4122 variant, clock_seq = step
    value |= node
    return uuid_text(value)


#: a UUID in its canonical text form (what LangGraph's and remit's ids are)
_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _uuid_time(checkpoint: Checkpoint) -> int:
    """A checkpoint's time in 100 ns intervals since the UUID epoch."""
    text = checkpoint["id"]
    if type(text) is str and _CANONICAL_UUID.fullmatch(text):
        n = int(text.replace("-", ""), 16)  # uuid.UUID(text).int, without the object
        if (n >> 76) & 0xF == 6 and (n >> 62) & 0b11 == 0b10:  # version 6, RFC 4122
            return ((n >> 80) << 12) | ((n >> 64) & 0x0FFF)
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
    (``channels`` is None) and store only the last, under the id of the one before.
    Graphs with delta channels get derived ids too: the digest is of the step's
    writes, which delta channels keep like any other.
    """
    if channels is None or not isinstance(loop, _seam.PregelLoop):
        return None
    with _runs_lock:
        run = _runs.get(loop)
    if run is None:
        return None
    metadata = getattr(loop, "checkpoint_metadata", None) or {}
    if metadata.get("source") != "loop" or metadata.get("step") != step:
        return None
    saver, thread_id, ns = run
    try:
        return derive_step_id(thread_id, ns, parent, step, new, _seam.step_writes(loop),
                              serde=saver.store.serde)
    except SerializationError:
        return None  # put refuses the same value and names it


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
    try:
        config = get_config()
    except RuntimeError:  # not inside a runnable's context
        return None
    conf = config.get("configurable") or {}
    saver = conf.get(CONFIG_KEY_CHECKPOINTER)
    if not isinstance(saver, GatedSaver):
        return None
    task_id = conf.get(CONFIG_KEY_TASK_ID)
    if not task_id:
        return None
    marker = conf.get(CONFIG_KEY_RUNTIME) or conf.get(CONFIG_KEY_SCRATCHPAD)
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


def _wait_durable(saver: GatedSaver, conf: dict[str, Any], thread_id: str,
                  task_ns: str) -> None:
    """EO: a receipt key names the task's checkpoint; make sure that checkpoint is stored
    before the effect fires, or a crash could re-create the task under a new id."""
    if conf.get(CONFIG_KEY_DURABILITY) == "exit":
        raise RemitError(
            "an @effect ran under durability='exit', where LangGraph stores no checkpoint "
            "until the run ends, so its receipt could not survive a crash. Use "
            "durability='sync' or 'async' with remit."
        )
    graph_ns = task_ns.rpartition("|")[0] if "|" in task_ns else ""
    runtime = conf.get(CONFIG_KEY_RUNTIME)
    info = getattr(runtime, "execution_info", None)
    checkpoint_map: dict[str, Any] = conf.get(CONFIG_KEY_CHECKPOINT_MAP) or {}
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
    # under durability="async" the loop stores it in the background: wait for it, bounded
    def durable() -> Any:
        return saver.store.get_checkpoint(thread_id, checkpoint_id, ns=graph_ns,
                                          with_writes=False)

    # a sync effect of an async node must not wait: it would block the loop that stores it
    blocking = aio.blocking_the_loop()
    stored = durable() if blocking else poll(durable, within=DURABLE_WAIT, pause=0.002,
                                             most=0.05)
    if stored is None and blocking:
        raise RemitError(
            f"thread {thread_id!r}: a sync @effect was called on the event loop (from an "
            f"async node, task {task_ns!r}) before the loop had stored the task's "
            f"checkpoint {checkpoint_id!r} (durability='async' stores it in the "
            "background); waiting here would block the loop that stores it. Declare the "
            "effect 'async def' and await it, call it from a sync node, or run the graph "
            "with durability='sync'.")
    if stored is None:
        raise RemitError(
            f"thread {thread_id!r}: checkpoint {checkpoint_id!r} of task {task_ns!r} was "
            f"not stored within {DURABLE_WAIT:.0f} s, so its effects cannot be keyed "
            "durably; check the store."
        )


register_scope_resolver(resolve_scope)

_seam.install(_Hooks())
