"""RemitStatePersistence: a pydantic-graph 1.x ``BaseStatePersistence`` on a remit store.

This module is the only place that knows how pydantic-graph drives a
persistence. One persistence instance is one run, as pydantic-graph intends.

=====================================  ===================================================
pydantic-graph                         remit store
=====================================  ===================================================
the run                                ``run_id`` (a constructor argument)
a snapshot (``NodeSnapshot`` or        one checkpoint: ``checkpoint_id`` = the snapshot id,
``EndSnapshot``)                       ``kind`` = ``"pydantic-graph"``, ``data`` = the snapshot
                                       dumped by pydantic-graph's own TypeAdapter (JSON types,
                                       never pickle), ``parent_id`` = the snapshot whose node
                                       returned it (``"__start__"`` for the run's first)
``load_next`` / ``record_run``         a claim per snapshot, ``pydantic-graph|run|snapshot``
                                       (:func:`remit_core.adapter.claim_key`; owner, lease
                                       renewed while the node runs, fence)
a node that raised                     an error record: a pending write on the snapshot,
                                       task ``pydantic-graph:error``, idx = the claim's fence
``@effect`` inside ``node.run``        receipts keyed (run, snapshot id, effect name, ordinal)
one ``graph.iter`` /                   one execution in the run lifecycle
``iter_from_persistence`` block        (:func:`remit_core.adapter.keep_run`), framework
(``graph.run`` is one)                 ``pydantic-graph``, name :func:`graph_name`; where
                                       it starts and ends comes from ``_compat``'s wrapper
=====================================  ===================================================

A run is a chain: every snapshot but the first has the previous one as its
parent, and ``put_checkpoint(..., exclusive_child=True)`` lets a parent have one
successor, whoever writes first (CO). So the run's *head*, the snapshot to run
next, is its latest checkpoint: one indexed lookup.

Statuses are derived from durable facts, never stored as a field that a
stale process could overwrite:

==========  ===========================================================================
status      durable facts
==========  ===========================================================================
success     the snapshot has a successor (written in the same operation that ends it)
error       an error record exists for the fence of the snapshot's current claim
running     claimed by ``record_run`` (a dead owner's claim stays here until its lease)
pending     claimed by ``load_next``
created     no claim, or a claim given back (a cancelled or interrupted run, an effect in doubt)
==========  ===========================================================================

(A stock ``FileStatePersistence`` history imported by :mod:`remit_pydantic_graph.migrate`
keeps each earlier snapshot's stock status, ``start_ts`` and ``duration`` in its
successor's metadata, where a native run records ``success``; its last snapshot's
status becomes the durable facts above, see ``_adopt_head``.)

Each transition the contract depends on is one atomic store operation:

* created -> pending/running: ``claim_once``. Of k racers one wins and the
  others raise :class:`~remit_core.ConsumeConflict` (CO). A claim whose owner
  died is taken over after its lease (LV), with the fence raised.
* running -> success: ``put_checkpoint`` of the successor. ``record_run`` defers
  the success of a node until ``snapshot_node``/``snapshot_end`` writes its
  successor, so a crash between the two looks like a crash inside the node and
  is recovered the same way (the gap is closed). ``consume_claim`` afterwards
  is bookkeeping: the successor is the record.
* running -> error: ``put_writes`` of the error record, keyed by the fence, so a
  stale owner's record never marks a newer attempt. The claim is then released.
* running -> created on cancellation (``asyncio`` timeouts, KeyboardInterrupt):
  ``release_claim``. The next resume runs the node again; effects replay.
* running -> created on an effect in doubt (:class:`~remit_core.EffectInDoubt`, raised
  where a dead owner's call of an effect may or may not have happened): ``release_claim``
  too. The run needs a person (its lifecycle says ``needs-attention``); once the effect's
  receipt is settled, the next resume (or :func:`remit_pydantic_graph.recover`) runs the
  node again and the effect returns the settled result, or runs again if it was reset.
* error -> pending/running, only with ``retry_errors=True``: ``claim_once`` on the
  released claim (a new fence makes the old error record stale).
"""

from __future__ import annotations

import functools
import json
import logging
import re
import uuid
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from time import perf_counter
from typing import Annotated, Any, Self, TypeVar, cast

import pydantic
from pydantic import BaseModel
from pydantic_core import PydanticSerializationError
from pydantic_graph import BaseNode, End
from pydantic_graph.exceptions import GraphNodeStatusError, GraphRuntimeError
from pydantic_graph.persistence import (
    BaseStatePersistence,
    EndSnapshot,
    NodeSnapshot,
    RunEndT,
    Snapshot,
    SnapshotStatus,
    StateT,
)

from remit_core import ConsumeConflict, CorruptRecord, StateSchema, StateValidationError, Store
from remit_core.adapter import (
    Checkpoint,
    Claim,
    LeaseLost,
    RemitError,
    RunKeeper,
    StoreHold,
    aio,
    akeep_run,
    claim_key,
    derive_id,
    effect_scope,
    ending,
    hold_store,
    new_owner,
)
from remit_pydantic_graph import _compat

log = logging.getLogger("remit")

T = TypeVar("T")

KIND = "pydantic-graph"
"""``kind`` of every snapshot checkpoint. One kind for node and end snapshots, so that
``exclusive_child`` gives a parent one successor of either sort (CO)."""
START = "__start__"
"""``parent_id`` of a run's first snapshot: ``exclusive_child`` makes it one per run."""
FRAMEWORK = "pydantic-graph"
"""The framework part of remit-pydantic-graph's claim keys, and the framework its runs are
kept under in the store's run lifecycle."""
DEFAULT_NAME = "pydantic-graph"
"""The lifecycle name of a run whose graph has no name and no nodes (see :func:`graph_name`)."""
ERROR_TASK = "pydantic-graph:error"
RUNNING_TASK = "pydantic-graph:running"

# pydantic-graph's own ids are f"{node_id}:{uuid4().hex}" (random); remit's are uuid5.
_RANDOM_ID = re.compile(r"^.+:[0-9a-f]{12}4[0-9a-f]{3}[89ab][0-9a-f]{15}$")
_FIELD = re.compile(r"field_name='([^']+)'")


def _now() -> datetime:
    return datetime.now(tz=UTC)


def graph_name(graph: Any) -> str:
    """The name the runs of ``graph`` are kept under in the run lifecycle (and that
    :func:`remit_pydantic_graph.recover` looks for): ``graph.name`` as pydantic-graph has
    it when the run's execution starts, i.e. ``Graph(name=...)``, or, for a graph created
    without one, the name pydantic-graph infers from the calling frame of ``run`` /
    ``iter`` (the variable that holds the graph there); when it has none (``infer_name=
    False``, or no variable holds it), the id of its first node in ``Graph(nodes=...)``
    order; :data:`DEFAULT_NAME` for a graph without nodes."""
    name = getattr(graph, "name", None)
    if name:
        return str(name)
    first = next(iter(getattr(graph, "node_defs", None) or ()), None)
    return str(first) if first else DEFAULT_NAME


@dataclass
class _Execution:
    """One execution of the run: an ``async with graph.iter(...)`` (or
    ``iter_from_persistence``, or ``graph.run``) block over this persistence, kept in the
    run lifecycle from its first node claim to the block's exit (or its End snapshot)."""

    graph: Any
    depth: int = 1  # blocks of this persistence nested in each other: the outermost keeps
    keeper: RunKeeper | None = None
    finalizer: weakref.finalize[Any, Any] | None = None
    #: the block wrote the run's first snapshot: the run is new, and so is its lifecycle
    first: bool = False


@dataclass
class _Attempt:
    """A node that ran to the end and whose success waits for its successor's write."""

    snapshot_id: str
    claim: Claim
    start_ts: datetime
    duration: float


# ================================================================================ errors


class NodeStatusConflict(ConsumeConflict, GraphNodeStatusError):
    """remit's refusal to run a node whose snapshot finished (``actual_status`` is
    ``'success'``) or that another process is running (``'running'``): where the stock
    persistence raises pydantic-graph's ``GraphNodeStatusError``, this is an instance of
    that error and of :class:`~remit_core.ConsumeConflict`, so ``except
    GraphNodeStatusError`` clauses written for the stock layer keep working. The message
    starts as pydantic-graph's does and says who ran the node."""

    def __init__(self, message: str, *, actual_status: SnapshotStatus, key: str,
                 run_id: str | None = None, step: str | None = None, owner: str | None = None,
                 consumed_at: float | None = None, status: str | None = None) -> None:
        text = (f"Incorrect snapshot status {actual_status!r}, must be 'created' or "
                f"'pending': {message}")
        # (ConsumeConflict's base chain reaches GraphNodeStatusError.__init__ with the text
        # as the status; the attributes and args are set right afterwards)
        ConsumeConflict.__init__(self, text, key=key, run_id=run_id, step=step, owner=owner,
                                 consumed_at=consumed_at, status=status)
        self.actual_status = actual_status
        self.message = text
        self.args = (text,)


# ============================================================================ persistence


class RemitStatePersistence(BaseStatePersistence[StateT, RunEndT]):
    """pydantic-graph state persistence that keeps the resume contract.

    A drop-in for ``FileStatePersistence``: pass it as ``persistence=`` and resume
    with ``graph.iter_from_persistence(persistence)`` in any process::

        persistence = RemitStatePersistence.from_url("sqlite:///runs.db", run_id="order-42")
        await graph.run(Start(), state=state, persistence=persistence)

    Guarantees, on SQLite, PostgreSQL and Redis:

    * LV/PC: a run whose process died inside a node, or between a node and its
      successor's snapshot, is resumed by ``iter_from_persistence`` in any process
      once the dead owner's lease (``lease`` seconds) runs out: that node runs again,
      earlier nodes do not. Before that, the resume raises
      :class:`~remit_core.ConsumeConflict`. Reads never wait.
    * EO: ``@effect`` calls inside a node replay their recorded results when the node
      runs again (receipts keyed by run, snapshot id, effect name and call ordinal).
    * CO: of k processes resuming one parked run, one runs the next node; the others
      raise :class:`~remit_core.ConsumeConflict` before any node code runs. The
      documented human-in-the-loop pattern (``load_next()``, else start a new run) is
      covered: ``load_next`` raises for the losers and for a late second delivery, and
      a new first node is refused on a run that has one.
    * CV: a state that violates the graph's state type (checked strictly) raises
      :class:`~remit_core.StateValidationError` naming the field and the node, and
      nothing is written; the node is marked ``error`` and the history stays loadable.
    * FD/RD: snapshot ids are derived from the parent snapshot id, the node class and
      the node's fields (the first one from the node and the start state), so the
      same run, a fork and a recovery name their snapshots alike.
    * Errors and cancellation: a node that raises leaves ``error``, resumed only when
      the persistence is opened with ``retry_errors=True``; a cancelled node
      (``asyncio`` timeout) goes back to ``created`` and the next resume runs it.
      A snapshot is never left ``running`` by a live process.
    * The run lifecycle: each ``async with graph.iter(...)`` /
      ``graph.iter_from_persistence(...)`` block (``graph.run`` is one) that runs or
      loads a node is one execution of the run, kept in the store under the framework
      ``"pydantic-graph"`` and :func:`graph_name`: ``running`` (its lease renewed in the
      background, every third of the store's lease) from its first node claim; ``done``
      when it writes the End snapshot; at the block's exit ``parked`` (left before the
      End: ``waiting`` names the snapshot and node it stopped at), ``failed`` (an
      exception, a cancellation included: its type and message) or
      ``needs-attention`` (an effect in doubt). A run whose process died reads
      ``abandoned`` once that lease runs out, and :func:`remit_pydantic_graph.recover`
      finds and finishes it. Calls made on the persistence outside such a block
      (``load_next()`` of the human-in-the-loop pattern, ``graph.initialize``) keep no
      lifecycle of their own.

    One instance serves one run and one caller at a time (as pydantic-graph
    intends); make another with :meth:`for_run` or :meth:`from_url` per run.
    """

    store: Store
    run_id: str
    lease: float
    retry_errors: bool

    def __init__(
        self,
        store: Store,
        *,
        run_id: str,
        lease: float | None = None,
        retry_errors: bool = False,
    ) -> None:
        if not isinstance(run_id, str) or not run_id:
            raise ValueError("run_id must be a non-empty string naming the run")
        self.store = store
        self.run_id = run_id
        self.lease = store.lease if lease is None else float(lease)
        self.retry_errors = retry_errors
        self._owner = new_owner()
        # a store from from_url is shared in the process and held while a persistence
        # of it lives (for_run copies share the hold); a store passed in is the caller's
        self._hold: StoreHold | None = None
        self._adapter: pydantic.TypeAdapter[Any] | None = None
        self._schema: StateSchema | None = None
        self._result_schema: StateSchema | None = None
        self._node_schemas: dict[type[Any], StateSchema | None] = {}
        self._alias: dict[str, str] = {}  # pydantic-graph's random id -> the stored id
        self._known: set[str] = set()  # ids stored in this run (written or read here)
        self._held: dict[str, Claim] = {}  # claims this instance holds, by snapshot id
        self._done: _Attempt | None = None  # a node whose success waits for its successor
        self._mine: str | None = None  # the head this instance wrote last
        self._execution: _Execution | None = None  # the block running this run, if any
        self._head: tuple[str, str] | None = None  # (snapshot id, node id) met last

    # =============================================================================== opening

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        run_id: str,
        lease: float | None = None,
        retry_errors: bool = False,
        **store_options: Any,
    ) -> Self:
        """A persistence for ``run_id`` on the store at ``url``.

        ``sqlite:///path.db``, ``postgresql://...`` or ``redis://...``;
        ``store_options`` go to :func:`remit_core.open_store`. Persistences opened
        from the same URL (and options) in one process share one store (one connection
        pool), the core's shared store cache (:func:`remit_core.adapter.hold_store`).
        It is closed when no persistence of it is left (the last one is garbage-collected;
        the next ``from_url`` in the process, or the interpreter's exit, closes it, never
        the garbage collector) and at exit. Pass an opened :class:`~remit_core.Store` to
        the constructor to manage its lifetime yourself.
        """
        hold = hold_store(url, lease=lease, **store_options)
        self = cls(hold.store, run_id=run_id, lease=lease, retry_errors=retry_errors)
        self._hold = hold
        return self

    def for_run(self, run_id: str) -> Self:
        """Another run on the same store, with the same options (one store holds many runs)."""
        other = type(self)(self.store, run_id=run_id, lease=self.lease,
                           retry_errors=self.retry_errors)
        other._adapter, other._schema = self._adapter, self._schema
        other._result_schema, other._node_schemas = self._result_schema, self._node_schemas
        other._hold = self._hold  # the same shared store: held while either lives
        return other

    def __repr__(self) -> str:
        return f"<{type(self).__name__} run {self.run_id!r} on {self.store.url}>"

    # ================================================================================= types

    def should_set_types(self) -> bool:
        return self._adapter is None

    def set_types(self, state_type: type[StateT], run_end_type: type[RunEndT]) -> None:
        """Build the snapshot TypeAdapter (pydantic-graph calls this inside its node-type
        context) and the CV schema of the state."""
        snapshot_type: Any = cast(Any, Snapshot)[state_type, run_end_type]
        self._adapter = pydantic.TypeAdapter(
            Annotated[snapshot_type, pydantic.Discriminator("kind")])
        self._schema = _schema_of(state_type)
        self._result_schema = _schema_of(run_end_type)

    def _types(self) -> pydantic.TypeAdapter[Any]:
        if self._adapter is None:
            raise GraphRuntimeError(
                f"{self!r}: the graph's types are not set. Graph.run, iter and "
                "iter_from_persistence set them; when you call load_next or load_all "
                "directly, call persistence.set_graph_types(graph) first.")
        return self._adapter

    # ============================================================================ snapshots

    async def snapshot_node(self, state: StateT, next_node: BaseNode[StateT, Any, RunEndT]) -> None:
        """Write the snapshot of ``next_node``; when a node just ran, this write also
        records its success (one atomic operation)."""
        await self._commit(NodeSnapshot(state=state, node=next_node), next_node)

    async def snapshot_end(self, state: StateT, end: End[RunEndT]) -> None:
        """Write the end snapshot; it also records the last node's success (one operation).
        The execution is ``done`` in the run lifecycle from here."""
        await self._commit(EndSnapshot(state=state, result=end), end)
        if self._execution is not None:
            await self._end_execution(self._execution, None, done=True)

    async def snapshot_node_if_new(
        self, snapshot_id: str, state: StateT, next_node: BaseNode[StateT, Any, RunEndT]
    ) -> None:
        """Write the snapshot of a node that enters the run from outside the graph's edges,
        unless ``snapshot_id`` is stored already.

        Such a node is the run's first node (``graph.run(Start())``), or replaces the
        head that this persistence loaded with ``load_next`` or wrote itself (the
        human-in-the-loop pattern, or ``GraphRun.next(node)``). Any other new node on
        a run that has history raises :class:`~remit_core.ConsumeConflict` (CO: one
        head per run).
        """
        if snapshot_id in self._alias or snapshot_id in self._known:
            return
        self._types()
        stored = await self._io(self.store.get_checkpoint, self.run_id, snapshot_id,
                                with_writes=False)
        if stored is not None:
            self._known.add(snapshot_id)
            return
        snapshot: NodeSnapshot[StateT, RunEndT] = NodeSnapshot(state=state, node=next_node)
        head = await self._io(self.store.get_checkpoint, self.run_id, with_writes=True)
        if head is None:
            await self._write_first(snapshot, next_node)
        elif self._is_end(head):
            raise await self._ended(head)
        else:
            await self._replace_head(head, snapshot, next_node)
        self._alias[snapshot_id] = snapshot.id

    async def _commit(self, snapshot: Snapshot[StateT, RunEndT],
                      target: BaseNode[StateT, Any, RunEndT] | End[RunEndT]) -> None:
        self._types()
        parent = self._done
        if parent is None:  # Graph.initialize, or a direct call: the run's first snapshot
            await self._write_first(snapshot, target)
            return
        self._done = None
        step = parent.snapshot_id
        try:
            data = self._encode(snapshot, step=step)
            new_id = self._rekey(snapshot, data, parent=step)
            await self._put(new_id, parent=step, data=data, step=step, metadata=parent_facts(
                "success", parent.start_ts, parent.duration))
        except StateValidationError as exc:
            # CV: nothing was written; the node that produced this state failed
            await self._fail(step, parent.claim, exc, parent.start_ts, parent.duration)
            raise
        except ConsumeConflict:
            self._held.pop(step, None)  # another owner of this node committed first
            raise
        target.set_snapshot_id(new_id)
        self._known.add(new_id)
        self._mine = new_id
        self._met(new_id, snapshot)
        await self._consume(step, parent.claim)

    async def _write_first(self, snapshot: Snapshot[StateT, RunEndT],
                           target: BaseNode[StateT, Any, RunEndT] | End[RunEndT]) -> None:
        data = self._encode(snapshot, step=None)
        new_id = self._rekey(snapshot, data, parent=None)
        try:
            await self._put(new_id, parent=START, data=data, step=new_id,
                            metadata={"first": True})
        except ConsumeConflict as exc:
            raise ConsumeConflict(
                f"run {self.run_id!r} already started at snapshot {exc.owner!r}; a run has one "
                "first node. Resume it with graph.iter_from_persistence(persistence), or start "
                "a new run under a new run_id. Nothing was written.",
                key=self._key(str(exc.owner)), run_id=self.run_id, step=new_id,
                owner=exc.owner, status="started",
            ) from None
        if self._execution is not None:
            self._execution.first = True
        target.set_snapshot_id(new_id)
        self._known.add(new_id)
        self._mine = new_id
        self._met(new_id, snapshot)

    async def _replace_head(self, head: Checkpoint, snapshot: NodeSnapshot[StateT, RunEndT],
                            node: BaseNode[StateT, Any, RunEndT]) -> None:
        hid = head.checkpoint_id
        if hid not in self._held and hid != self._mine:
            raise ConsumeConflict(
                f"run {self.run_id!r} is at snapshot {hid!r}, which this persistence neither "
                "loaded nor wrote, so a new node cannot take its place (one head per run). "
                "Resume with graph.iter_from_persistence(persistence), or load_next() first "
                "(the human-in-the-loop pattern); start a new run under a new run_id.",
                key=self._key(hid), run_id=self.run_id, step=hid, status="not-loaded",
            )
        claim = await self._claim(hid, head, phase="pending")
        try:
            data = self._encode(snapshot, step=hid)
            new_id = self._rekey(snapshot, data, parent=hid)
            await self._put(new_id, parent=hid, data=data, step=hid,
                            metadata={"parent_status": "success", "parent_replaced": True})
        except StateValidationError:
            await self._release(hid, claim)
            raise
        node.set_snapshot_id(new_id)
        self._known.add(new_id)
        self._mine = new_id
        self._met(new_id, snapshot)
        await self._consume(hid, claim)

    # ================================================================================= runs

    @asynccontextmanager
    async def record_run(self, snapshot_id: str) -> AsyncIterator[None]:
        """Claim the snapshot (CO; a dead owner's claim after its lease, LV), keep the
        lease while the node runs, and give ``@effect`` calls the snapshot's receipt scope.

        On success the node's ``success`` is deferred to its successor's write. On an
        exception the error is recorded (status ``error``); on cancellation, and on an
        effect in doubt (:class:`~remit_core.EffectInDoubt`), the claim is given back
        (status ``created``). Raises :class:`~remit_core.ConsumeConflict`
        when another process holds or consumed the snapshot, and ``LookupError`` for
        an unknown id.
        """
        sid = self._alias.get(snapshot_id, snapshot_id)
        ck = await self._io(self.store.get_checkpoint, self.run_id, sid, with_writes=True)
        if ck is None:
            raise LookupError(f"No snapshot found with id={sid!r} in run {self.run_id!r}")
        if self._is_end(ck):
            raise GraphRuntimeError(f"snapshot {sid!r} is an end snapshot; only node snapshots run")
        _compat.check_installed()
        was_pending = self._held.get(sid)
        claim = await self._claim(sid, ck, phase="running")
        await self._keep(sid, claim)
        if was_pending is not None and was_pending.fence == claim.fence:
            # display only: the claim taken by load_next now runs its node
            await self._io(self.store.put_writes, self.run_id, sid, RUNNING_TASK,
                           [(claim.fence, "running", {"start_ts": _now().isoformat()})])
        start_ts = _now()
        t0 = perf_counter()
        key, fence = self._key(sid), claim.fence

        def renew() -> bool:
            return self.store.renew_claim(key, owner=self._owner, fence=fence, lease=self.lease)

        # LV: the lease is renewed while the node runs, so only a dead owner loses it
        with self.store.keep_alive(renew, lease=self.lease), \
                effect_scope(self.store, self.run_id, sid):  # EO: receipts keyed by snapshot
            try:
                yield
            except Exception as exc:
                if ending(exc)[0] == "needs-attention":
                    # an effect in doubt is not the node's failure: the snapshot goes back
                    # to created, and the node runs again once a person settled the effect
                    self._abandon(sid, claim)
                else:
                    await self._fail(sid, claim, exc, start_ts, perf_counter() - t0)
                raise
            except BaseException:
                self._abandon(sid, claim)
                raise
        self._defer_success(_Attempt(sid, claim, start_ts, perf_counter() - t0))

    def _defer_success(self, attempt: _Attempt) -> None:
        """The gap: the success is written with the successor, in one operation."""
        self._done = attempt

    async def load_next(self) -> NodeSnapshot[StateT, RunEndT] | None:
        """Claim the run's head and return it with status ``pending``; None for an empty run.

        * The head is claimed atomically: of k racers one gets it, the others raise
          :class:`~remit_core.ConsumeConflict` (CO).
        * A head left ``running`` or ``pending`` by a process that died is taken over once
          its lease ran out (LV); before that, this raises ConsumeConflict.
        * A run that has ended raises ConsumeConflict (a parked run resumes once).
        * A head whose node raised raises ``GraphNodeStatusError('error')`` unless the
          persistence was opened with ``retry_errors=True``.
        """
        self._types()
        for _ in range(16):
            head = await self._io(self.store.get_checkpoint, self.run_id, with_writes=True)
            if head is None:
                return None
            if self._is_end(head):
                raise await self._ended(head)
            sid = head.checkpoint_id
            await self._claim(sid, head, phase="pending")
            if sid not in self._held:  # the head had a successor already (settled); go on
                continue
            snapshot = cast(NodeSnapshot[StateT, RunEndT], self._decode(head))
            snapshot.status = "pending"
            self._known.add(sid)
            self._met(sid, snapshot)
            await self._keep(sid, self._held[sid])
            return snapshot
        raise RemitError(f"run {self.run_id!r} kept moving while load_next looked for its head; "
                         "retry load_next.")

    async def load_all(self) -> list[Snapshot[StateT, RunEndT]]:
        """The run's snapshots in order, with their statuses. Never claims or waits."""
        self._types()
        cks = list(reversed(await self._io(
            lambda: list(self.store.list_checkpoints(self.run_id, with_writes=False)))))
        out: list[Snapshot[StateT, RunEndT]] = [self._decode(ck) for ck in cks]
        for i, snap in enumerate(out):
            if not isinstance(snap, NodeSnapshot):
                continue
            if i + 1 < len(out):
                meta = cks[i + 1].metadata if isinstance(cks[i + 1].metadata, dict) else {}
                # "success", unless an imported stock history said otherwise (migrate.py)
                status = meta.get("parent_status")
                snap.status = status if status in STATUSES else "success"
                snap.start_ts = _parse_ts(meta.get("parent_start_ts"))
                snap.duration = meta.get("parent_duration")
            else:
                await self._head_status(snap)
        return out

    async def fork(self, snapshot_id: str, *, run_id: str) -> Self:
        """FI/FD: start run ``run_id`` at snapshot ``snapshot_id`` of this run, explicitly.

        The fork's first snapshot is a copy of that one (same id, same pre-node state,
        status ``created``); resume it with ``iter_from_persistence``. Forking again into
        the same ``run_id`` is idempotent, and two forks of one snapshot run to the same
        snapshot ids and state. Effects in a fork fire for the fork (its own receipts).
        Raises :class:`~remit_core.ConsumeConflict` when ``run_id`` already started
        elsewhere.
        """
        self._types()
        ck = await self._io(self.store.get_checkpoint, self.run_id, snapshot_id, with_writes=False)
        if ck is None:
            raise LookupError(f"No snapshot found with id={snapshot_id!r} in run {self.run_id!r}")
        if self._is_end(ck):
            raise ValueError(f"snapshot {snapshot_id!r} is the end of run {self.run_id!r}; "
                             "fork from a node snapshot")
        other = self.for_run(run_id)
        try:
            await other._io(
                other.store.put_checkpoint, run_id, snapshot_id, parent_id=START, kind=KIND,
                data=ck.data, metadata={"first": True, "forked_from": {
                    "run_id": self.run_id, "snapshot_id": snapshot_id}},
                validate=lambda: self._decode(ck), exclusive_child=True)
        except ConsumeConflict as exc:
            raise ConsumeConflict(
                f"run {run_id!r} already started at snapshot {exc.owner!r}, so it cannot become "
                f"a fork of {snapshot_id!r}; fork into a new run_id.",
                key=other._key(snapshot_id), run_id=run_id, step=snapshot_id, owner=exc.owner,
                status="started") from None
        return other

    # ===================================================================== the run lifecycle

    def _entered(self, graph: Any) -> None:
        """A ``graph.iter`` / ``iter_from_persistence`` block over this persistence enters
        (:mod:`remit_pydantic_graph._compat` calls it)."""
        if self._execution is None:
            self._execution = _Execution(graph)
        else:
            self._execution.depth += 1

    async def _exited(self, error: BaseException | None) -> None:
        """The block exits: the outermost one ends the execution (see :meth:`_end_execution`)."""
        ex = self._execution
        if ex is None:
            return
        ex.depth -= 1
        if ex.depth > 0:
            return
        self._execution = None
        await self._end_execution(ex, error)

    async def _keep(self, sid: str, claim: Claim) -> None:
        """The block claimed its first snapshot (it runs or loads a node): start keeping
        the execution (:func:`remit_core.adapter.keep_run`; inside a recovery, the
        recoverer's), ``likely_new`` when the block wrote the run's first snapshot. On
        failure the claim is given back and the error raised."""
        ex = self._execution
        if ex is None or ex.keeper is not None:
            return
        try:
            keeper = await akeep_run(self.store, self.run_id, framework=FRAMEWORK,
                                     name=graph_name(ex.graph), likely_new=ex.first)
        except BaseException:
            self._abandon(sid, claim)
            raise
        ex.keeper = keeper
        # a block never exited (its coroutine dropped) stops renewing with the persistence
        ex.finalizer = weakref.finalize(self, keeper.close)

    async def _end_execution(self, ex: _Execution, error: BaseException | None, *,
                             done: bool = False) -> None:
        """Record how the execution ended, by remit-core's one rule (``ending``): ``done``
        (the End snapshot written), else no exception: ``parked`` at the snapshot met last,
        an exception: ``failed`` / ``needs-attention``. Once; the app's own outcome goes on
        if the store cannot be reached (the run then reads abandoned after its lease)."""
        keeper = ex.keeper
        if keeper is None:
            return
        if ex.finalizer is not None:
            ex.finalizer.detach()
        if done:
            await aio.run(keeper.end)
            return
        waiting = None if self._head is None else \
            {"snapshot": self._head[0], "node": self._head[1]}
        if error is None or isinstance(error, Exception):
            await aio.run(keeper.end, error, parked=error is None, waiting=waiting)
        else:  # cancelled or interrupted: no await, the task may be cancelled again
            keeper.end(error)

    def _met(self, sid: str, snapshot: Snapshot[StateT, RunEndT]) -> None:
        if isinstance(snapshot, NodeSnapshot):
            self._head = (sid, str(snapshot.node.get_node_id()))

    # ================================================================================ claims

    def _key(self, snapshot_id: str) -> str:
        """CO: the claim of one snapshot of this run."""
        return claim_key(FRAMEWORK, self.run_id, snapshot_id)

    async def _claim(self, sid: str, ck: Checkpoint, *, phase: str) -> Claim:
        """Claim snapshot ``sid`` for this instance (CO, LV), then settle what the claim
        reveals: a failed previous attempt, or a successor written by a dead owner."""
        before = self._held.get(sid)
        try:
            claim = await self._claim_slot(sid, phase)
        except ConsumeConflict as exc:
            holder = None
            if phase == "running" and exc.status == "claimed":  # is the holder running it?
                holder = await self._io(self.store.get_claim, self._key(sid))
            raise self._conflict(sid, exc, phase=phase, holder=holder) from None
        if claim.taken_over:
            log.warning("remit: run %s: taking over snapshot %s, whose owner's lease ran out "
                        "(LV; fence %d)", self.run_id, sid, claim.fence)
        self._held[sid] = claim
        if before is not None and before.fence == claim.fence:
            return claim  # held since load_next; settled then
        if claim.fence > 1:  # someone claimed it before: learn how that attempt ended
            if not await self._is_head(sid):
                # a successor exists: its writer died before consuming the claim
                await self._consume(sid, claim)
                if phase == "running":
                    raise GraphNodeStatusError("success")
                return claim
            fresh = await self._io(self.store.get_checkpoint, self.run_id, sid, with_writes=True)
            error = _record(fresh or ck, ERROR_TASK, claim.fence - 1)
            if error is not None and not self.retry_errors:
                await self._release(sid, claim)
                failed = GraphNodeStatusError("error")
                failed.add_note(
                    f"snapshot {sid!r} of run {self.run_id!r} failed: {error.get('type')}: "
                    f"{error.get('message')}. It is not run again by default; open the "
                    "persistence with retry_errors=True to retry it.")
                raise failed
        return claim

    async def _claim_slot(self, sid: str, phase: str) -> Claim:
        """The one atomic claim of a snapshot (``Store.claim_once``)."""
        return await self._io(self.store.claim_once, self._key(sid), run_id=self.run_id,
                              owner=self._owner, value={"phase": phase}, lease=self.lease)

    def _conflict(self, sid: str, exc: ConsumeConflict, *, phase: str,
                  holder: Claim | None = None) -> ConsumeConflict:
        """The refusal of claiming ``sid``. Where the stock persistence's ``record_run``
        refuses too (it raises GraphNodeStatusError for a node whose snapshot is
        ``success`` or ``running``), the refusal is a :class:`NodeStatusConflict`, an
        instance of both errors."""
        if exc.status == "consumed":
            msg = (f"snapshot {sid!r} of run {self.run_id!r} was already run by {exc.owner!r}; "
                   "a parked snapshot is resumed once. Read the run with load_all(), or fork() "
                   "to branch from it.")
        else:
            msg = (f"snapshot {sid!r} of run {self.run_id!r} is being run by {exc.owner!r}, "
                   f"which has not finished it ({exc}) A resume with the store's wait=SECONDS "
                   "option waits for it to finish or for its lease to run out (then it "
                   "recovers the run) instead of raising.")
        actual: SnapshotStatus | None = None
        if phase == "running":  # record_run: the node is about to run
            if exc.status == "consumed":
                actual = "success"
            elif holder is not None and isinstance(holder.value, dict) and \
                    holder.value.get("phase") == "running":
                actual = "running"
        if actual is not None:
            return NodeStatusConflict(msg, actual_status=actual, key=exc.key, run_id=self.run_id,
                                      step=sid, owner=exc.owner, consumed_at=exc.consumed_at,
                                      status=exc.status)
        return ConsumeConflict(msg, key=exc.key, run_id=self.run_id, step=sid, owner=exc.owner,
                               consumed_at=exc.consumed_at, status=exc.status)

    async def _consume(self, sid: str, claim: Claim) -> None:
        self._held.pop(sid, None)
        try:
            await self._io(self.store.consume_claim, self._key(sid), owner=self._owner,
                           fence=claim.fence)
        except LeaseLost:
            # the successor is the durable record of success; the claim is bookkeeping
            log.info("remit: run %s: claim of %s was taken over before it was consumed",
                     self.run_id, sid)

    async def _release(self, sid: str, claim: Claim) -> None:
        self._held.pop(sid, None)
        await self._io(self.store.release_claim, self._key(sid), owner=self._owner,
                       fence=claim.fence)

    async def _fail(self, sid: str, claim: Claim, exc: BaseException, start_ts: datetime,
                    duration: float) -> None:
        """running -> error: one error record keyed by the fence, then give the claim back."""
        record = {"type": type(exc).__qualname__, "message": str(exc)[:2000],
                  "start_ts": start_ts.isoformat(), "duration": duration}
        try:
            await self._mark_error(sid, claim, record)
        except Exception:  # the node's own exception is the one to raise
            log.warning("remit: run %s: could not record the failure of %s", self.run_id, sid,
                        exc_info=True)

    async def _mark_error(self, sid: str, claim: Claim, record: dict[str, Any]) -> None:
        await self._io(self.store.put_writes, self.run_id, sid, ERROR_TASK,
                       [(claim.fence, "error", record)])
        await self._release(sid, claim)

    def _abandon(self, sid: str, claim: Claim) -> None:
        """Cancelled or interrupted: give the claim back so the next resume runs the node.
        Synchronous, because the task may be cancelled again while it waits."""
        self._held.pop(sid, None)
        try:
            self.store.release_claim(self._key(sid), owner=self._owner, fence=claim.fence)
        except Exception:
            log.warning("remit: run %s: could not give back %s; it is recovered after its "
                        "lease", self.run_id, sid, exc_info=True)

    async def _is_head(self, sid: str) -> bool:
        latest = await self._io(self.store.get_checkpoint, self.run_id, with_writes=False)
        return latest is not None and latest.checkpoint_id == sid

    async def _ended(self, head: Checkpoint) -> ConsumeConflict:
        parent = head.parent_id or ""
        claim = await self._io(self.store.get_claim, self._key(parent)) if parent else None
        return ConsumeConflict(
            f"run {self.run_id!r} has ended (snapshot {head.checkpoint_id!r}); nothing is left "
            "to resume, and a parked run is resumed once"
            + (f" (its last node was run by {claim.owner!r})" if claim else "")
            + ". Read the result with load_all(); start a new run under a new run_id.",
            key=self._key(head.checkpoint_id), run_id=self.run_id, step=head.checkpoint_id,
            owner=None if claim is None else claim.owner,
            consumed_at=None if claim is None else claim.consumed_at, status="ended",
        )

    async def _head_status(self, snap: NodeSnapshot[StateT, RunEndT]) -> None:
        claim = await self._io(self.store.get_claim, self._key(snap.id))
        status: SnapshotStatus = "created"
        if claim is not None:
            ck = await self._io(self.store.get_checkpoint, self.run_id, snap.id, with_writes=True)
            error = _record(ck, ERROR_TASK, claim.fence)
            running = _record(ck, RUNNING_TASK, claim.fence)
            if claim.status == "consumed":
                status = "success"
            elif error is not None:
                status = "error"
                snap.start_ts = _parse_ts(error.get("start_ts"))
                snap.duration = error.get("duration")
            elif claim.status == "claimed":
                pending = isinstance(claim.value, dict) and claim.value.get("phase") == "pending"
                status = "pending" if pending and running is None else "running"
                if status == "running":
                    snap.start_ts = _parse_ts((running or {}).get("start_ts")) or \
                        datetime.fromtimestamp(claim.claimed_at, tz=UTC)
        snap.status = status

    # ========================================================================= CV and ids

    def _encode(self, snapshot: Snapshot[StateT, RunEndT], *, step: str | None) -> dict[str, Any]:
        """CV: check the state strictly against the graph's state type, then dump the
        snapshot with pydantic-graph's adapter (any serializer warning is an error)."""
        adapter = self._types()
        where = step or f"{_node_id(snapshot)} (first node)"
        if self._schema is not None:
            _check(self._schema, snapshot.state, run_id=self.run_id, step=where)
        if isinstance(snapshot, NodeSnapshot):  # the node's own fields, named as node.<field>
            schema = self._node_schema(type(snapshot.node))
            if schema is not None:
                try:
                    _check(schema, snapshot.node, run_id=self.run_id, step=where)
                except StateValidationError as exc:
                    raise StateValidationError(
                        str(exc).replace("invalid state", "invalid node", 1).replace(
                            f"field {exc.field!r}", f"field {'node.' + exc.field!r}", 1),
                        run_id=exc.run_id, step=exc.step, field=f"node.{exc.field}",
                        errors=exc.errors) from None
        elif self._result_schema is not None:
            try:
                self._result_schema.check(snapshot.result.data, run_id=self.run_id, step=where)
            except StateValidationError as exc:
                field = "result" if exc.field == "$" else f"result.{exc.field}"
                raise StateValidationError(
                    str(exc).replace("invalid state", "invalid end result", 1),
                    run_id=exc.run_id, step=exc.step, field=field, errors=exc.errors) from None
        try:
            data = adapter.dump_python(snapshot, mode="json", warnings="error")
        except PydanticSerializationError as exc:
            self._undumpable(snapshot, where)  # names the field, in the core's words
            found = _FIELD.search(str(exc))
            part = "result" if isinstance(snapshot, EndSnapshot) else "node"
            field = f"{part}.{found.group(1)}" if found else part
            raise StateValidationError(
                f"invalid snapshot in run {self.run_id!r}, step {where!r}: field {field!r} "
                f"cannot be stored as its declared type ({str(exc).splitlines()[-1].strip()}). "
                "Nothing was written; the last valid snapshot is still the latest. Fix the "
                "value the node returns and resume.",
                run_id=self.run_id, step=where, field=field) from None
        if not isinstance(data, dict) or (
                isinstance(snapshot, NodeSnapshot) and "node_id" not in data.get("node", {})):
            raise StateValidationError(
                f"snapshot in run {self.run_id!r}, step {where!r} dumped without its node id; "
                "nothing was written.", run_id=self.run_id, step=where, field="node")
        return data

    def _undumpable(self, snapshot: Snapshot[StateT, RunEndT], where: str) -> None:
        """Raise the core's StateValidationError for the part of ``snapshot`` that cannot
        be dumped (a state field as itself, a node field as ``node.<field>``, the end
        result as ``result[.<field>]``), the same error remit-crewai gives; return when no
        part alone fails (the caller then names the part)."""
        parts: list[tuple[str, StateSchema | None, Any]] = [("", self._schema, snapshot.state)]
        if isinstance(snapshot, NodeSnapshot):
            parts.append(("node", self._node_schema(type(snapshot.node)), snapshot.node))
        else:
            parts.append(("result", self._result_schema, snapshot.result.data))
        for prefix, schema, value in parts:
            if schema is None:
                continue
            try:
                schema.dump_json(value, run_id=self.run_id, step=where)
            except StateValidationError as err:
                if not prefix:
                    raise
                field = prefix if err.field == "$" else f"{prefix}.{err.field}"
                raise StateValidationError(
                    str(err).replace("invalid state", f"invalid {prefix}", 1).replace(
                        f"field {err.field!r}", f"field {field!r}", 1),
                    run_id=err.run_id, step=err.step, field=field, errors=err.errors) from None

    def _node_schema(self, cls: type[Any]) -> StateSchema | None:
        if cls not in self._node_schemas:
            self._node_schemas[cls] = _schema_of(cls) if hasattr(
                cls, "__dataclass_fields__") else None
        return self._node_schemas[cls]

    def _roundtrip(self, data: dict[str, Any], step: str | None) -> None:
        """CV: what is written must load again (strictly) into the graph's types."""
        try:
            self._types().validate_json(json.dumps(data), strict=True)
        except pydantic.ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            field = ".".join(str(p) for p in first.get("loc", ())) or "$"
            raise StateValidationError(
                f"snapshot in run {self.run_id!r}, step {step!r} would not load again: field "
                f"{field!r}: {first.get('msg')}. Nothing was written.",
                run_id=self.run_id, step=step, field=field,
                errors=[dict(e) for e in exc.errors(include_url=False)]) from None

    def _decode(self, ck: Checkpoint) -> Snapshot[StateT, RunEndT]:
        """Stored data back into a snapshot, validated strictly; refused if it does not fit."""
        where = f"snapshot {ck.checkpoint_id!r} of run {ck.run_id!r}"
        try:
            snap: Snapshot[StateT, RunEndT] = self._types().validate_json(
                json.dumps(ck.data), strict=True)
        except (pydantic.ValidationError, TypeError, ValueError) as exc:
            raise CorruptRecord(
                f"{where} does not load into the graph's types ({exc}); it was not used. "
                "Was the run written by another graph, or were node classes renamed?",
                record=where) from None
        snap.id = ck.checkpoint_id
        if isinstance(snap, NodeSnapshot):
            snap.node.set_snapshot_id(snap.id)
        else:
            snap.result.set_snapshot_id(snap.id)
        return snap

    def _rekey(self, snapshot: Snapshot[StateT, RunEndT], data: dict[str, Any], *,
               parent: str | None) -> str:
        """FD/RD: replace pydantic-graph's random id with one derived from durable facts.
        An id the caller set explicitly is kept."""
        if _RANDOM_ID.match(snapshot.id):
            if isinstance(snapshot, EndSnapshot):
                payload: Any = data["result"]
            else:
                payload = data["node"]
            if parent is None:
                payload = {"node": payload, "state": data["state"]}
            snapshot.id = self._derive(parent, _node_id(snapshot), payload)
        data["id"] = snapshot.id
        return snapshot.id

    def _derive(self, parent: str | None, node_id: str, payload: Any) -> str:
        digest = uuid.UUID(derive_id(parent, node_id, payload, serde=self.store.serde))
        return f"{node_id}:{digest.hex}"

    def _is_end(self, ck: Checkpoint) -> bool:
        return isinstance(ck.data, dict) and ck.data.get("kind") == "end"

    async def _put(self, new_id: str, *, parent: str, data: dict[str, Any], step: str | None,
                   metadata: dict[str, Any], check: bool = True) -> None:
        """One snapshot, written atomically; a second successor of ``parent`` is refused.

        ``check=False`` only for a stock history imported without the graph's types
        (migrate.py): it is checked strictly when it is first loaded (``_decode``).
        """
        await self._io(self.store.put_checkpoint, self.run_id, new_id, parent_id=parent,
                       kind=KIND, data=data, metadata=metadata,
                       validate=(lambda: self._roundtrip(data, step)) if check else None,
                       exclusive_child=True)

    async def _io(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await aio.run(functools.partial(fn, *args, **kwargs))

    # ============================================================================ migration

    async def _adopt_head(self, sid: str, status: SnapshotStatus, *, start_ts: datetime | None,
                          duration: float | None, message: str) -> int:
        """Give an imported last snapshot the status it had in the stock file, as the durable
        facts that stand for that status here (the table in the module docstring):

        * ``pending`` / ``running``: a claim whose lease is over already, so the next resume
          takes it over at once (LV), as after a dead owner; ``running`` also records when
          the node started.
        * ``error``: an error record (``message``) on a released claim, as ``_fail`` leaves it.
        * ``created``: nothing. (``success`` is never a last snapshot's status here.)

        Returns the number of pending writes written.
        """
        if status not in ("pending", "running", "error"):
            return 0
        phase = "pending" if status == "pending" else "running"
        claim = await self._io(self.store.claim_once, self._key(sid), run_id=self.run_id,
                               owner=self._owner, value={"phase": phase}, lease=0.0)
        if status == "error":
            await self._mark_error(sid, claim, {
                "type": "FileStatePersistence", "message": message,
                "start_ts": None if start_ts is None else start_ts.isoformat(),
                "duration": duration})
            return 1
        if status == "running" and start_ts is not None:
            await self._io(self.store.put_writes, self.run_id, sid, RUNNING_TASK,
                           [(claim.fence, "running", {"start_ts": start_ts.isoformat()})])
            return 1
        return 0


# ================================================================================ helpers

STATUSES: frozenset[str] = frozenset(("created", "pending", "running", "success", "error"))


def parent_facts(status: SnapshotStatus, start_ts: datetime | None,
                 duration: float | None) -> dict[str, Any]:
    """The metadata of a snapshot that records how its parent's node ran (``load_all``
    reads it back as the parent's status, ``start_ts`` and ``duration``)."""
    return {"parent_status": status,
            "parent_start_ts": None if start_ts is None else start_ts.isoformat(),
            "parent_duration": duration}


def _node_id(snapshot: Snapshot[Any, Any]) -> str:
    if isinstance(snapshot, EndSnapshot):
        return "end"
    return str(snapshot.node.get_node_id())


def _schema_of(tp: Any) -> StateSchema | None:
    """A strict CV schema for ``tp``, or None where there is nothing to check."""
    if tp in (None, type(None), Any):
        return None
    try:
        return StateSchema(tp, strict=True)
    except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError):
        return None  # the snapshot dump (warnings are errors) still guards it


def _check(schema: StateSchema, value: Any, *, run_id: str, step: str) -> None:
    """Strict: a dataclass or model instance is checked field by field (a strict validator
    would refuse the instance's fields as a dict), anything else as a whole."""
    if isinstance(value, BaseModel) or (
            hasattr(value, "__dataclass_fields__") and not isinstance(value, type)):
        fields = _fields(value)
        if fields and schema.field_names:  # (a partial check of no fields checks the whole)
            schema.check(fields, run_id=run_id, step=step, partial=True)
    else:
        schema.check(value, run_id=run_id, step=step)


def _fields(state: Any) -> dict[str, Any]:
    if isinstance(state, BaseModel):
        return {name: getattr(state, name) for name in type(state).model_fields}
    return {name: getattr(state, name) for name in state.__dataclass_fields__}


def _record(ck: Checkpoint | None, task: str, fence: int) -> dict[str, Any] | None:
    for w in (ck.writes if ck is not None else ()):
        if w.task_id == task and w.idx == fence:
            return w.value if isinstance(w.value, dict) else {"message": repr(w.value)}
    return None


def _parse_ts(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


# ===================================================================== the execution seam


class _Executions:
    """The persistence's side of :mod:`remit_pydantic_graph._compat`'s wrapped blocks."""

    def ours(self, persistence: Any) -> bool:
        return isinstance(persistence, RemitStatePersistence)

    def entered(self, persistence: Any, graph: Any) -> None:
        persistence._entered(graph)

    async def exited(self, persistence: Any, error: BaseException | None) -> None:
        await persistence._exited(error)


_compat.install(_Executions())
