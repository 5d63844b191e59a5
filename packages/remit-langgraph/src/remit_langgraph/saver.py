"""RemitSaver: a LangGraph ``BaseCheckpointSaver`` on a remit :class:`~remit_core.Store`.

One LangGraph thread is one remit run. The mapping, in one place:

=======================================  ==============================================
LangGraph                                remit store
=======================================  ==============================================
``configurable["thread_id"]``            ``run_id``
``configurable["checkpoint_ns"]``        ``ns``
``checkpoint["id"]``                     ``checkpoint_id``
``configurable["checkpoint_id"]`` (put)  ``parent_id``
``metadata["source"]``                   ``kind``
``metadata["run_id"]``                   ``execution_id`` (``delete_for_runs``)
checkpoint without ``channel_values``    ``data``
  and ``channel_versions``
``channel_versions``                     ``versions`` (stored once: ``data`` keeps them
                                         too only when one is not a string)
``new_versions`` + ``channel_values``    ``new_values`` {channel: (version, value)}
``put_writes`` (channel, value) list     writes (idx, channel, value), idx from
                                         ``WRITES_IDX_MAP`` for special channels
=======================================  ==============================================

Every value goes through remit's typed envelope (no pickle; decoding never
imports a module), extended with LangGraph's types in :mod:`remit_langgraph._serde`.
A LangGraph serializer is refused (``serde=``, or assigned to ``saver.serde``) rather
than accepted and ignored; see :class:`RemitSaver`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import os
import random
import threading
from collections.abc import AsyncIterator, Callable, Collection, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, ParamSpec, TypeVar, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from remit_core import StateValidationError, Store, open_store
from remit_core.adapter import Checkpoint as StoredCheckpoint
from remit_core.adapter import aio, default_serde, derive_id, poll
from remit_langgraph import _seam, _serde
from remit_langgraph._contract import (
    FORK_FLAG,
    ConsumeGate,
    GatedSaver,
    keep_lifecycle,
    note_load,
    note_loaded,
)
from remit_langgraph._schema import GraphSchema
from remit_langgraph._serde import EMPTY, storable
from remit_langgraph._stock import StockSource, import_thread, open_source

_writes_sort_key: Callable[[str, str, int], tuple[str, str, int]] | None
try:  # langgraph-checkpoint >= 4: the order get_tuple must return pending writes in
    from langgraph.checkpoint.base import writes_sort_key as _writes_sort_key
except ImportError:  # 2.1.x: the store's (task_id, idx) order is the stock order
    _writes_sort_key = None

P = ParamSpec("P")
T = TypeVar("T")

PRUNE_STRATEGIES = ("keep_latest", "delete")

_STR: frozenset[type] = frozenset({str})

_LANGGRAPH_SERDE: SerializerProtocol = BaseCheckpointSaver.serde
"""LangGraph's default serializer, what ``saver.serde`` reads (RemitSaver never uses it)."""

SERDE_REFUSED = (
    "RemitSaver does not take a LangGraph serializer ({what}): remit stores every value "
    "through its own typed envelope (no pickle; decoding never imports a module or calls "
    "an arbitrary constructor), so the serializer would never be used. To store a class "
    "of your own, pass schema= (its classes are allowed) or call "
    "saver.store.serde.allow(MyClass); for a custom encoding, "
    "saver.store.serde.register(MyClass, to_data, from_data, name='app:MyClass'). "
    "To give the store another envelope, open it with open_store(url, serde=Serde()).")


def _refuse_serde(what: str, serde: object) -> None:
    if serde is not None and serde is not _LANGGRAPH_SERDE:
        raise TypeError(SERDE_REFUSED.format(what=f"{what} {type(serde).__name__}"))


class RemitSaver(BaseCheckpointSaver[str], GatedSaver):
    """LangGraph checkpointer backed by a remit store (SQLite, PostgreSQL or Redis).

    Takes an already opened :class:`~remit_core.Store`, so that an application
    shares one connection pool across frameworks; closing the store stays the
    caller's job. :meth:`from_conn_string` opens (and on exit closes) one from a URL.

    Guarantees, on every backend:

    * ``put`` stores the checkpoint and the channel values it introduces in one
      atomic store operation; an unsupported value raises
      :class:`~remit_core.SerializationError` before anything is written, so the
      previous checkpoint stays the latest.
    * ``put_writes`` stores all writes of one call atomically; a regular write is
      kept on a repeat, special writes (error, interrupt, resume, scheduled) are
      replaced when a call carries only those (as the stock savers do).
    * ``get_tuple`` without a checkpoint id returns the latest checkpoint written
      (store seq), with pending writes in ``writes_sort_key`` order.
    * Reading never claims, consumes or blocks.

    Sync and async methods have the same semantics: the async ones run the same code
    on the event loop (:mod:`remit_core.aio`), with the store's native async driver on
    PostgreSQL and Redis, and the store's own threads on SQLite.

    The resume contract (see :mod:`remit_langgraph._contract`):

    * CO: a run that resumes a checkpoint parked on ``interrupt()`` claims it in
      ``get_tuple``; of k racing resumes one proceeds and the others raise
      :class:`~remit_core.ConsumeConflict` before any node runs. A resume value
      delivered where no interrupt is pending raises too, and stores nothing.
    * CV: with ``schema`` (a TypedDict, pydantic model or dataclass, or the
      ``StateGraph`` whose ``state_schema`` it is), a node write or
      a checkpoint whose state violates it raises
      :class:`~remit_core.StateValidationError` naming the field and the node, and
      nothing of it is stored. Without ``schema`` nothing is validated.
    * EO: ``@effect`` calls inside nodes get receipts keyed by thread and task.
    * FI: ``configurable["remit_fork"] = True`` marks a fork; it takes no claim and a
      fork-addressed resume uses its own value.
    * RD: a run that continues its thread's latest checkpoint (no ``checkpoint_id``,
      no ``remit_fork``) stores each checkpoint its loop writes after a superstep under
      an id derived from the parent id, the step and its tasks' writes
      (:func:`remit_langgraph._contract.derive_step_id`), not a time-based uuid6, so
      recovering one durable state twice writes the same ids. ``put`` itself stores
      and returns the id it is given.

    Switching over from a stock saver: with ``legacy=`` (an open stock ``SqliteSaver`` or
    ``PostgresSaver``), a thread that remit has not imported yet is imported from it on
    its first use here (``get_tuple``, ``list``, ``put``, ``put_writes``, ``delete_thread``,
    ``copy_thread``, ``prune`` naming the thread), whole history and pending writes
    included, before the call proceeds; see :mod:`remit_langgraph.migrate`. Two processes
    importing one thread at once import it once. ``list(None)`` lists only what remit
    holds; ``remit migrate langgraph`` imports every thread up front.

    Serialization: ``serde=`` (and assigning ``saver.serde``) is refused with a
    ``TypeError`` when given a serializer: LangGraph's serializers (``JsonPlusSerializer``,
    ``EncryptedSerializer``, ...) would never be used, since every value goes through
    remit's envelope on the store (``saver.store.serde``), which decodes only registered
    or allowed classes. Register or allow your classes there (or pass ``schema=``).
    ``saver.serde`` reads LangGraph's default serializer, unused. For the same reason
    :meth:`with_allowlist`, which LangGraph's ``compile()`` calls in its strict-msgpack
    mode, returns the saver itself: the graph's channel types are allowed in the
    envelope before its state is read.
    """

    store: Store
    schema: Any
    legacy: Any

    def __init__(
        self,
        store: Store,
        *,
        schema: Any = None,
        serde: SerializerProtocol | None = None,
        legacy: BaseCheckpointSaver[Any] | None = None,
    ) -> None:
        _refuse_serde("serde=", serde)
        super().__init__()
        self.store = store
        self.schema = schema
        self.legacy = legacy
        self._legacy: StockSource | None = None
        if legacy is not None:
            if isinstance(legacy, str | os.PathLike):
                raise TypeError("RemitSaver(legacy=...) takes an open stock saver; for a path "
                                "or URL use RemitSaver.from_conn_string(url, legacy=...)")
            self._legacy = StockSource(legacy)
        self._imported: set[str] = set()
        self._importer: RemitSaver | None = None
        self._import_lock = threading.Lock()
        self._schema = None if schema is None else GraphSchema(schema)
        if self._schema is not None:  # a reader of another process's writes decodes them
            store.serde.allow_annotations(self._schema.schema)
        self._gate = ConsumeGate(self)
        # graphs whose channel types were allowed in the envelope (by id of their channels)
        self._allowed: dict[int, Mapping[str, Any]] = {}
        # CV: a node write refused by put_writes, by the checkpoint it was written against,
        # so that the refusal of the next checkpoint names the node rather than the step
        self._refused: dict[tuple[str, str, str], StateValidationError] = {}
        # CV: checkpoints this saver refused, by (thread, namespace, checkpoint id).
        # LangGraph before 1.2.15, under durability="async", still puts the next
        # checkpoint (and that step's writes) after a refused put; they name the refused
        # one as their parent and are refused with the same error, so that nothing of a
        # step built on invalid state is stored.
        self._refused_checkpoints: dict[tuple[str, str, str], StateValidationError] = {}
        if store.serde is not default_serde:  # a store opened with its own envelope
            _serde.register_types(store.serde)

    # ============================================================================ serializer

    @property
    def serde(self) -> SerializerProtocol:
        """LangGraph's default serializer, never used: values go through ``store.serde``."""
        return _LANGGRAPH_SERDE

    @serde.setter
    def serde(self, value: SerializerProtocol) -> None:
        _refuse_serde("saver.serde =", value)  # (LangGraph's own __init__ sets the default)

    def with_allowlist(self, extra_allowlist: Collection[tuple[str, ...]]) -> RemitSaver:
        """The saver itself: LangGraph's msgpack allow-list is for its own serializer,
        which this saver does not use; remit's envelope decodes only registered or allowed
        classes, and the graph's channel types are allowed before its state is read."""
        return self

    # ================================================================================ opening

    @classmethod
    def from_conn_string(
        cls,
        conn_string: str,
        *,
        schema: Any = None,
        serde: SerializerProtocol | None = None,
        legacy: str | os.PathLike[str] | BaseCheckpointSaver[Any] | None = None,
        **store_options: Any,
    ) -> OpenedSaver:
        """Open a store from a URL for the length of a ``with`` or ``async with`` block.

        ``sqlite:///path.db``, ``postgresql://...`` or ``redis://...``;
        ``store_options`` go to :func:`remit_core.open_store` (``lease=`` ...)::

            with RemitSaver.from_conn_string("sqlite:///app.db") as saver: ...
            async with RemitSaver.from_conn_string("postgresql://...") as saver: ...

        ``serde`` is refused when given (see the class). ``legacy``: a stock saver to
        import threads from on first use (see the class),
        as an open ``SqliteSaver``/``PostgresSaver``, a SQLite file path or a
        ``postgresql://`` URL. The store, and a stock saver opened here, are closed
        when the block exits.
        """
        _refuse_serde("serde=", serde)
        return OpenedSaver(cls, conn_string, schema=schema, legacy=legacy,
                           options=store_options)

    from_url = from_conn_string

    # ================================================================================ reading

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The addressed checkpoint, or the thread's latest in the namespace (None if absent).

        When a run (not a read) loads a parked checkpoint, this is where it claims the
        resume (CO) and where a losing racer gets :class:`~remit_core.ConsumeConflict`.
        """
        return self._load(config, _seam.entering_loop())

    def _load(self, config: RunnableConfig, loop: Any) -> CheckpointTuple | None:
        _seam.verify()
        thread_id, ns = _thread_and_ns(config)
        self._adopt(thread_id)
        checkpoint_id = get_checkpoint_id(config)
        found = self.store.get_checkpoint(thread_id, checkpoint_id, ns=ns)
        loaded = None if found is None else _to_tuple(found)
        if loop is None or not note_loaded(loop):
            return loaded  # a read, or a later load of an invocation that loaded already
        note_load(self, config, loop, addressed=checkpoint_id is not None)
        gated = self._gate.on_load(dict(config), loaded, loop)
        keep_lifecycle(self, config, loop, found=found is not None)
        return gated

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first (store seq descending).

        ``config`` narrows to a thread, and to a namespace and checkpoint id when it
        names them; ``None`` lists every thread. ``filter`` keeps checkpoints whose
        metadata has every key equal to the given value; ``before`` keeps those
        written before the checkpoint it names; ``limit`` counts what remains after
        all of these.

        A ``before`` of another namespace (LangGraph's subgraph replay bounds a
        subgraph's history by a parent checkpoint) keeps the checkpoints *made* before
        it, as the stock savers' time-ordered ids do: under ``durability="async"`` a
        parent's checkpoint can be stored after its subgraph's next ones, so the store
        order is not the order they were made in. See :func:`_made_before`.
        """
        if limit is not None and limit <= 0:
            return
        configurable = config.get("configurable", {}) if config else {}
        thread_id = configurable.get("thread_id")
        if thread_id is not None:
            self._adopt(str(thread_id))
        ns = configurable.get("checkpoint_ns")
        only_id = configurable.get("checkpoint_id")
        before_id = get_checkpoint_id(before) if before else None
        # the limit can go to the store only when nothing is filtered here afterwards
        checked_here = bool(filter) or only_id is not None
        before_ns = (before or {}).get("configurable", {}).get("checkpoint_ns")
        bound = (None if before_id is None or thread_id is None or ns is None
                 else self._bound_in_an_ancestor(str(thread_id), str(ns), before_id,
                                                 None if before_ns is None else str(before_ns)))
        found: Iterator[StoredCheckpoint]
        if bound is not None:
            found = _made_before(self.store, str(thread_id), str(ns), bound)
        else:
            found = self.store.list_checkpoints(
                None if thread_id is None else str(thread_id),
                ns=ns,
                before=before_id,
                limit=None if checked_here else limit,
            )
        left = limit
        for ck in found:
            if only_id is not None and ck.checkpoint_id != only_id:
                continue
            if filter and not _matches(ck.metadata, filter):
                continue
            yield _to_tuple(ck)
            if left is not None:
                left -= 1
                if left <= 0:
                    return

    def _bound_in_an_ancestor(self, thread_id: str, ns: str, before_id: str,
                              before_ns: str | None) -> datetime | None:
        """When ``before_id`` is not a checkpoint of ``ns`` but of an enclosing namespace
        (the root's or a parent subgraph's), the time it was made; else None.

        A ``before`` that names its namespace (``get_state_history(before=state.config)``)
        is looked up there alone; one that does not (LangGraph's subgraph replay gives the
        id only) in ``ns``, then in each enclosing namespace, innermost first."""
        if ns == "" or before_ns == ns:
            return None
        if before_ns is None:
            if self.store.get_checkpoint(thread_id, before_id, ns=ns,
                                         with_writes=False) is not None:
                return None
            parts = ns.split("|")
            places = ["|".join(parts[:depth]) for depth in range(len(parts) - 1, -1, -1)]
        else:
            places = [before_ns]
        for place in places:
            found = self.store.get_checkpoint(thread_id, before_id, ns=place,
                                              with_writes=False)
            if found is not None:
                return _made_at(found)
        return None

    # ================================================================================ writing

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store ``checkpoint`` as a child of ``config``'s checkpoint id, atomically.

        Only the channels in ``new_versions`` get a stored value (once per channel
        version); the others are read back at the version ``channel_versions`` names.

        FD: an ``update_state`` with ``configurable["remit_fork"] = True`` stores its
        checkpoint under an id derived from (thread, namespace, parent, step, node,
        written values), so forking twice from one checkpoint with the same input
        yields one checkpoint; the second request stores nothing and returns it.
        """
        return self._put(config, checkpoint, metadata, new_versions,
                         from_update=_seam.updating_state())

    def _put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
        *,
        from_update: bool,
    ) -> RunnableConfig:
        # (no closure or comprehension over this frame's names: on Python 3.11 each would
        # make its names cells, and under remit_core.aio.run they live while the write
        # waits for the server)
        thread_id, ns = _thread_and_ns(config)
        self._adopt(thread_id)
        serde = self.store.serde
        values = checkpoint.get("channel_values", {})
        if from_update and config["configurable"].get(FORK_FLAG):
            fork_id = derive_fork_id(thread_id, ns, config["configurable"].get("checkpoint_id"),
                                     metadata, _written(values, new_versions), serde=serde)
            answer: RunnableConfig = {"configurable": {
                "thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": fork_id}}
            if self.store.get_checkpoint(thread_id, fork_id, ns=ns, with_writes=False):
                return answer  # FD: a repeated fork request is idempotent
            checkpoint = cast(Checkpoint, {**checkpoint, "id": fork_id})
        versions = checkpoint["channel_versions"]
        stored_metadata = get_checkpoint_metadata(config, metadata)
        execution_id = stored_metadata.get("run_id")
        parent_id = config["configurable"].get("checkpoint_id")
        self._refuse_child_of_refused(thread_id, ns, parent_id, refusing=checkpoint["id"])
        self.store.put_checkpoint(
            thread_id,
            checkpoint["id"],
            ns=ns,
            parent_id=parent_id,
            kind=str(stored_metadata.get("source", "loop")),
            data=_stored_data(checkpoint),
            metadata=stored_metadata,
            versions=versions,  # (the store stores each as str(version))
            new_values=_new_values(values, new_versions),
            execution_id=None if execution_id is None else str(execution_id),
            validate=None if self._schema is None else functools.partial(
                self._check_state, values, new_versions, thread_id, ns, parent_id,
                checkpoint["id"], stored_metadata.get("step")),
        )
        self._gate.after_put(dict(config))
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    def _check_state(self, values: Mapping[str, Any], new_versions: ChannelVersions,
                     thread_id: str, ns: str, parent_id: Any, checkpoint_id: str,
                     step: Any) -> None:
        """CV for :meth:`put`: the channels a checkpoint writes, against the graph's schema;
        a refusal is remembered for the checkpoint's children and names the node."""
        assert self._schema is not None
        try:
            self._schema.check_state(_written(values, new_versions), run_id=thread_id,
                                     step=f"step {step}")
        except StateValidationError as exc:
            error = self._node_error((thread_id, ns, str(parent_id)), exc)
            self._remember_refused(self._refused_checkpoints, (thread_id, ns, checkpoint_id),
                                   error)
            raise error from None

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Record one task's writes against ``config``'s checkpoint, atomically.

        A write is keyed by (task_id, idx): regular writes take their position, special
        channels their fixed negative index. A call made only of special writes
        replaces them (a later interrupt or error supersedes the earlier one); any
        other call keeps what is stored, so a repeat never duplicates.
        """
        # (no closure over this frame's names: see _put)
        thread_id, ns = _thread_and_ns(config)
        self._adopt(thread_id)
        checkpoint_id = str(config["configurable"]["checkpoint_id"])
        self._refuse_child_of_refused(thread_id, ns, checkpoint_id, refusing=None)
        self.store.put_writes(
            thread_id,
            config["configurable"]["checkpoint_id"],
            task_id,
            _indexed(writes),
            ns=ns,
            task_path=task_path,
            overwrite=all(channel in WRITES_IDX_MAP for channel, _ in writes),
            validate=None if self._schema is None else functools.partial(
                self._check_writes, writes, thread_id, ns, checkpoint_id, task_path, task_id),
        )
        self._gate.after_writes(dict(config), task_id, writes)

    def _check_writes(self, writes: Sequence[tuple[str, Any]], thread_id: str, ns: str,
                      checkpoint_id: str, task_path: str, task_id: str) -> None:
        """CV for :meth:`put_writes`: one task's writes, against the graph's schema; a
        refusal is remembered for the checkpoint that the loop stores next."""
        assert self._schema is not None
        try:
            self._schema.check_writes(
                writes, run_id=thread_id, node=_node_of(task_path, task_id),
                current=functools.partial(self._values_at, thread_id, ns, checkpoint_id))
        except StateValidationError as exc:
            self._remember_refused(self._refused, (thread_id, ns, checkpoint_id), exc)
            raise

    @staticmethod
    def _remember_refused(table: dict[tuple[str, str, str], StateValidationError],
                          key: tuple[str, str, str], error: StateValidationError) -> None:
        if len(table) > 1000:  # a bound, not a cache: entries matter for one step only
            table.clear()
        table[key] = error

    def _refuse_child_of_refused(self, thread_id: str, ns: str, parent_id: Any, *,
                                 refusing: str | None) -> None:
        """Raise the parent's refusal when ``parent_id`` is a checkpoint this saver
        refused (a put or writes LangGraph issued after that refusal); a refused child
        checkpoint is remembered in turn."""
        if parent_id is None:
            return
        error = self._refused_checkpoints.get((thread_id, ns, str(parent_id)))
        if error is None:
            return
        if refusing is not None:
            self._remember_refused(self._refused_checkpoints, (thread_id, ns, refusing), error)
        raise error

    def _node_error(self, key: tuple[str, str, str],
                    fallback: StateValidationError) -> StateValidationError:
        """The refusal of a node's write against the parent checkpoint, which names the node.

        The loop may store the checkpoint while that node's ``put_writes`` is still in
        flight in another thread; on this failure path only, wait a moment for it.
        """
        return poll(lambda: self._refused.pop(key, None), within=0.5, pause=0.005,
                    most=0.005) or fallback

    def _values_at(self, thread_id: str, ns: str, checkpoint_id: str) -> dict[str, Any]:
        found = self.store.get_checkpoint(thread_id, checkpoint_id, ns=ns, with_writes=False)
        if found is None:
            return {}
        return {c: v for c, v in found.values.items() if v is not EMPTY}

    # ============================================================================== deleting

    def delete_thread(self, thread_id: str) -> None:
        """Delete the thread: its checkpoints, values and writes in every namespace,
        with remit's effect receipts and claims of the run. With ``legacy=``, the stock
        saver's copy is left alone and is not imported again."""
        self._adopt(str(thread_id))
        self.store.delete_run(str(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete every checkpoint (and its writes) that a LangGraph run wrote, in every
        thread and namespace. Unknown ids and an empty list are no-ops."""
        self.store.delete_executions([str(r) for r in run_ids])

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy a thread's checkpoints (same ids, same order, same metadata), values and
        pending writes under another thread id. A missing source copies nothing."""
        self._adopt(str(source_thread_id))
        self._adopt(str(target_thread_id))
        self.store.copy_run(str(source_thread_id), str(target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``"keep_latest"`` keeps each namespace's latest checkpoint with its pending
        writes and the values it refers to; ``"delete"`` deletes every checkpoint of the
        threads. Threads not listed are untouched."""
        if isinstance(thread_ids, str):
            raise TypeError("thread_ids must be a sequence of thread ids, not a str")
        if strategy not in PRUNE_STRATEGIES:
            raise ValueError(
                f"unknown prune strategy {strategy!r}; use one of {', '.join(PRUNE_STRATEGIES)}"
            )
        keep = 1 if strategy == "keep_latest" else 0
        for thread_id in thread_ids:
            self._adopt(str(thread_id))
            self.store.prune_run(str(thread_id), keep_latest=keep)

    # ================================================================================ legacy

    def _adopt(self, thread_id: str) -> None:
        """``legacy=``: import the thread from the stock saver on its first use here.

        Once per thread and process; the import itself is idempotent and guarded by a
        store receipt, so another process importing the same thread is waited for."""
        source = self._legacy
        if source is None or thread_id in self._imported:
            return
        with self._import_lock:
            if self._importer is None:  # writes through the same paths, without legacy=
                self._importer = type(self)(self.store, schema=self.schema)
            importer = self._importer
        import_thread(source, importer, thread_id)
        with self._import_lock:
            if len(self._imported) > 100_000:
                self._imported.clear()
            self._imported.add(thread_id)

    # ================================================================================= types

    def allow_channels(self, channels: Mapping[str, Any]) -> None:
        """Allow the classes a graph's channels are declared with (their value and
        update types) in the store's envelope, so that a process that did not write a
        value can still read it. Called by the seam before a graph's loop loads its
        checkpoint and before ``get_state``/``get_state_history``; once per graph."""
        key = id(channels)
        if self._allowed.get(key) is channels:
            return
        annotations: list[Any] = []
        for channel in channels.values():
            for attr in ("ValueType", "UpdateType"):
                with contextlib.suppress(Exception):  # a channel without a declared type
                    annotations.append(getattr(channel, attr))
        self.store.serde.allow_annotations(*annotations)
        if len(self._allowed) > 1000:
            self._allowed.clear()
        self._allowed[key] = channels

    # =============================================================================== versions

    def get_next_version(self, current: str | None, channel: None) -> str:
        """``"<letter><n>.<random>"``: ``n`` in decimal after the letter that gives its
        number of digits (``a`` one, ``b`` two, ...), then 64 random bits in 11 URL-safe
        base64 characters -- ``"c101.X6QT5Ef1drc"``.

        LangGraph compares versions as strings: these sort by ``n``, and above every
        version of the stock savers' shape (``"<n:032>.<random>"``, digits first), so a
        thread begun on a stock saver or an earlier remit goes on from its highest
        version. The random part keeps two forks of one checkpoint apart (their values
        are stored once per channel and version). 15 characters for a counter of two
        digits, where the stock shape takes 51: LangGraph keeps a version per channel and
        one per node and channel it has seen, so a checkpoint of a graph of many nodes is
        half as large.
        """
        return next_version(current)

    # ================================================================================== async

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await aio.run(self._load, config, _seam.entering_loop())

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        async for ck in aio.iterate(self.list(config, filter=filter, before=before,
                                              limit=limit)):
            yield ck

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await aio.run(self._put, config, checkpoint, metadata, new_versions,
                             from_update=_seam.updating_state())

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await aio.run(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await aio.run(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await aio.run(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await aio.run(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await aio.run(functools.partial(self.prune, strategy=strategy), thread_ids)


class OpenedSaver:
    """What :meth:`RemitSaver.from_conn_string` returns: enter it with ``with`` or
    ``async with`` to get a :class:`RemitSaver` on a store opened from the URL; the
    store is closed on exit. One use only."""

    def __init__(
        self,
        saver_cls: type[RemitSaver],
        url: str,
        *,
        schema: Any,
        options: Mapping[str, Any],
        legacy: str | os.PathLike[str] | BaseCheckpointSaver[Any] | None = None,
    ) -> None:
        self._saver_cls = saver_cls
        self._url = url
        self._schema = schema
        self._options = dict(options)
        self._legacy = legacy
        self._store: Store | None = None
        self._stack = contextlib.ExitStack()
        self._used = False

    def _make(self, store: Store) -> RemitSaver:
        self._store = store
        legacy = self._legacy
        try:
            if isinstance(legacy, str | os.PathLike):
                legacy = self._stack.enter_context(open_source(legacy)).saver
            return self._saver_cls(store, schema=self._schema, legacy=legacy)
        except BaseException:
            self._close()
            raise

    def _close(self) -> None:
        try:
            self._stack.close()
        finally:
            if self._store is not None:
                self._store.close()

    def _claim_use(self) -> None:
        if self._used:
            raise RuntimeError("RemitSaver.from_conn_string(...) can be entered once; call it again")
        self._used = True

    def __enter__(self) -> RemitSaver:
        self._claim_use()
        return self._make(open_store(self._url, **self._options))

    def __exit__(self, *exc: object) -> None:
        self._close()

    async def __aenter__(self) -> RemitSaver:
        self._claim_use()
        store = await _in_thread(open_store, self._url, **self._options)
        return await _in_thread(self._make, store)

    async def __aexit__(self, *exc: object) -> None:
        try:
            await _in_thread(self._stack.close)
        finally:
            if self._store is not None:
                await self._store.aclose()  # with this loop's async connections


# ================================================================================== helpers


async def _in_thread(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    return await asyncio.to_thread(fn, *args, **kwargs)


def derive_fork_id(thread_id: str, ns: str, parent_id: str | None, metadata: Any,
                   written: Mapping[str, Any], *, serde: Any = None) -> str:
    """The id of a fork: the same parent, node and written values give the same id."""
    intent = f"fork|{ns}|{metadata.get('source')}|{metadata.get('step')}"
    return derive_id(f"{thread_id}|{parent_id or ''}", intent, dict(written), serde=serde)


def _node_of(task_path: str, task_id: str) -> str:
    """The node name in a task path such as ``"~__pregel_pull, node"``, else the task id."""
    if task_path:
        last = task_path.split(",")[-1].strip().strip("~()' ")
        if last:
            return last
    return task_id


def _thread_and_ns(config: RunnableConfig) -> tuple[str, str]:
    configurable = config["configurable"]
    return str(configurable["thread_id"]), str(configurable.get("checkpoint_ns") or "")


def _made_at(ck: StoredCheckpoint) -> datetime | None:
    """When LangGraph made the checkpoint (its ``ts``), or None if it has none."""
    data = ck.data if isinstance(ck.data, Mapping) else {}
    with contextlib.suppress(KeyError, TypeError, ValueError):
        made = datetime.fromisoformat(str(data["ts"]))
        return made if made.tzinfo is not None else made.replace(tzinfo=UTC)
    return None


_PAGE = 8


def _made_before(store: Store, thread_id: str, ns: str,
                 bound: datetime) -> Iterator[StoredCheckpoint]:
    """The checkpoints of one namespace made before ``bound``, newest first.

    Within a namespace the loop stores its checkpoints in the order it makes them, so
    the newest one made before ``bound`` is found by paging back from the head; it and
    everything stored before it is the answer. A checkpoint without a ``ts`` counts as
    made before (the store order is all there is to go by)."""
    page_before: str | None = None
    while True:
        page = list(store.list_checkpoints(thread_id, ns=ns, before=page_before,
                                           limit=_PAGE))
        for i, ck in enumerate(page):
            made = _made_at(ck)
            if made is None or made < bound:
                yield from page[i:]
                if len(page) == _PAGE:
                    yield from store.list_checkpoints(thread_id, ns=ns,
                                                      before=page[-1].checkpoint_id)
                return
        if len(page) < _PAGE:
            return
        page_before = page[-1].checkpoint_id


def next_version(current: Any) -> str:
    """:meth:`RemitSaver.get_next_version` (see there): the version after ``current``, which
    is None, an int, or a version of either string shape (this one's, or the stock
    savers' ``"<n:032>.<random>"`` and any other that starts with its counter in digits)."""
    if current is None:
        n = 0
    elif isinstance(current, int):
        n = current
    else:
        head = str(current).partition(".")[0]
        lettered = head[:1].isalpha()  # this shape, else the stock one (digits only)
        digits = head[1:] if lettered else head
        known = digits.isascii() and digits.isdigit() and (
            not lettered or head[0] == _count_letter(digits))
        n = int(digits) if known else -1
    if n < 0:
        raise ValueError(
            f"RemitSaver cannot go on from the channel version {current!r}: a version "
            f"starts with its counter (not negative), in digits or after the letter that "
            f"gives their number; store versions that RemitSaver.get_next_version or a "
            f"stock saver made")
    digits = str(n + 1)
    if len(digits) > 26:
        raise ValueError(f"RemitSaver's channel versions count to 26 digits, not {digits}")
    tail = base64.urlsafe_b64encode(random.getrandbits(64).to_bytes(8, "big"))[:11]
    return f"{_count_letter(digits)}{digits}.{tail.decode()}"


def _count_letter(digits: str) -> str:
    """The letter before a version's counter: its number of digits, ``a`` for one."""
    return chr(96 + len(digits))


def _indexed(writes: Sequence[tuple[str, Any]]) -> list[tuple[int, str, Any]]:
    """One task's writes as ``put_writes`` takes them: regular writes at their position,
    special channels at their fixed negative index."""
    return [(WRITES_IDX_MAP.get(channel, idx), channel, storable(value))
            for idx, (channel, value) in enumerate(writes)]


def _written(values: Mapping[str, Any], new_versions: ChannelVersions) -> dict[str, Any]:
    """The values of the channels a checkpoint writes (those it has a value for)."""
    return {ch: values[ch] for ch in new_versions if ch in values}


def _new_values(values: Mapping[str, Any], new_versions: ChannelVersions
                ) -> dict[str, tuple[str, Any]]:
    """``put_checkpoint``'s ``new_values``: each written channel's version and value. A
    channel with a new version and no value (a node's trigger once it ran) stores nothing
    but that version in the checkpoint's map, as LangGraph's savers store it: a version
    with no value behind it reads as no value (records written as :data:`EMPTY` before
    read the same way)."""
    return {ch: (str(version), storable(values[ch]))
            for ch, version in new_versions.items() if ch in values}


def _stored_data(checkpoint: Checkpoint) -> dict[str, Any]:
    """The checkpoint without its values (stored apart). The versions are stored once, as
    the store's own column (LangGraph's are strings); a saver that hands over ints or
    floats keeps them in data as given."""
    exact = _STR.issuperset(map(type, checkpoint["channel_versions"].values()))
    return {k: v for k, v in checkpoint.items()
            if k != "channel_values" and (k != "channel_versions" or not exact)}


def _matches(metadata: Any, query: Mapping[str, Any]) -> bool:
    return isinstance(metadata, Mapping) and all(
        metadata.get(key) == value for key, value in query.items()
    )


def _to_tuple(ck: StoredCheckpoint) -> CheckpointTuple:
    """A store checkpoint as LangGraph reads it: empty channels dropped, pending
    writes in ``writes_sort_key`` order. (Built positionally: every load makes one.)"""
    checkpoint: Any = {
        "channel_versions": dict(ck.versions),  # (stored here unless data has its own)
        **ck.data,
        "channel_values": {c: v for c, v in ck.values.items() if v is not EMPTY},
    }
    writes = ck.writes
    if _writes_sort_key is not None and len(writes) > 1:
        key = _writes_sort_key
        writes = sorted(writes, key=lambda w: key(w.task_path, w.task_id, w.idx))
    run_id, ns, parent_id = ck.run_id, ck.ns, ck.parent_id
    metadata: Any = ck.metadata
    return CheckpointTuple(
        {"configurable": {"thread_id": run_id, "checkpoint_ns": ns,
                          "checkpoint_id": ck.checkpoint_id}},
        checkpoint,
        metadata,
        {"configurable": {"thread_id": run_id, "checkpoint_ns": ns,
                          "checkpoint_id": parent_id}} if parent_id else None,
        [(w.task_id, w.channel, w.value) for w in writes],
    )


__all__ = ["FORK_FLAG", "OpenedSaver", "RemitSaver"]
