"""The one Store interface, over SQLite, PostgreSQL and Redis.

:class:`Store` holds everything the contract needs that is *not* backend
specific: encoding and decoding through the typed envelope, validation before
writes, the interpretation of claim and receipt outcomes into errors, lease
heart-beating and bounded retries. A backend subclass implements the
underscore methods, each of which must be **one atomic operation** of its
database (a transaction, ``INSERT ... ON CONFLICT`` or a Lua script). The
decisions that the receipt and claim operations take are written once, as pure
functions, in :mod:`remit_core.store.decisions` (used by both SQL backends through
:class:`remit_core.store.sql.SqlStore`; the Redis backend's Lua scripts are checked
against them). Written once here too: opening a store from its URL
(:meth:`Store.open`, through the one option table) and the migration protocol
(:meth:`Store._open_layout`); a backend brings its DDL and a few hooks.

Every underscore method is safe to repeat after a transient failure: writes
are upserts keyed by the record's identity, and the receipt and claim
primitives recognise their own owner token, so a retry of an operation that
did commit returns the same outcome (``run`` / ``reentered``) instead of
conflicting with itself.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import datetime as dt
import functools
import logging
import math
import operator
import os
import secrets
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import chain
from typing import Any, ClassVar, Literal, ParamSpec, Self, TypeVar
from urllib.parse import SplitResult, urlsplit

from tenacity import Retrying, retry_if_result, stop_after_delay, wait_fixed

from remit_core import aio
from remit_core.errors import (
    ConsumeConflict,
    CorruptRecord,
    ForeignSchemaError,
    LeaseLost,
    SerializationError,
    StoreClosed,
    StoreConfigError,
    StoreNotFound,
    StoreUnavailable,
    StoreVersionError,
)
from remit_core.records import (
    RUN_STATUSES,
    BlobRow,
    Checkpoint,
    CheckpointRow,
    Claim,
    ClaimOutcome,
    ClaimRow,
    PendingWrite,
    Receipt,
    ReceiptOutcome,
    ReceiptRow,
    ReceiptStart,
    Recovery,
    RunEnd,
    RunInfo,
    RunQuery,
    RunRow,
    RunStart,
    RunStartOutcome,
    RunState,
    RunStatus,
    WriteRow,
)
from remit_core.retry import retrying, waiting_for_holder
from remit_core.serde import Serde, default_serde
from remit_core.store import chunks as _chunks
from remit_core.store.groups import Groups
from remit_core.store.options import Parsed, parse_options
from remit_core.urls import mask_url, password_hint, scrub, url_secrets

_value_of = operator.attrgetter("value")  # (a write's stored value)

log = logging.getLogger("remit")

#: the backend operations that write (refused on a store opened read-only)
_WRITES = frozenset({
    "_write_checkpoint", "_write_writes", "_delete_run", "_copy_run", "_prune_run",
    "_delete_executions", "_start_receipt", "_complete_receipt", "_release_receipt",
    "_renew_receipt", "_resolve_receipt", "_reset_receipt", "_claim", "_consume_claim",
    "_release_claim", "_renew_claim", "_start_run", "_take_runs", "_end_run", "_renew_run",
    "_import_run"})

P = ParamSpec("P")
T = TypeVar("T")

DEFAULT_LEASE = 30.0
"""Seconds a claim or an in-flight effect stays owned without a heartbeat (LV bound)."""

CLOSE_WAIT = 30.0
"""Seconds :meth:`Store.close` waits for operations in flight to finish."""


#: the counts of :meth:`Store.usage`, in the order the backends compute them
USAGE_KEYS = ("checkpoints", "blobs", "blob_bytes", "writes", "receipts", "claims", "chunks",
              "chunk_bytes")

#: a checkpoint as a backend reads it: the row, the blob of each of its versions, and its
#: pending writes in (task_id, idx) order
Found = tuple[CheckpointRow, dict[str, bytes], list[WriteRow]]

#: how often an open reads the layout again when another opener changed it meanwhile
LAYOUT_ATTEMPTS = 10


@dataclasses.dataclass(frozen=True)
class Layout:
    """What a backend found where its store lives, read by :meth:`Store._open_layout`."""

    #: remit's meta record (``schema``, ``version``), None when there is none
    meta: Mapping[str, str] | None
    #: (name, why) of each object that cannot be remit's, whatever the meta says (a key of
    #: the wrong type): refused
    foreign: Sequence[tuple[str, str]] = ()
    #: remit's names that exist while the meta record does not: refused by a writer
    strays: Sequence[str] = ()
    #: why there is no store here, as a sentence (what a read-only open says)
    absent: str = ""


class LayoutChanged(Exception):
    """Raised by a backend's layout session when another opener changed the layout after
    it was read (nothing was written): :meth:`Store._open_layout` reads it again."""


def new_owner() -> str:
    """A fresh owner token: host, pid and a nonce (one per claim or effect attempt).

    The nonce comes from :mod:`secrets`, not ``uuid.uuid4``, so that remit's bookkeeping
    does not draw from an application's (or its tests') patched or seeded uuid4."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(6)}"


class Store(ABC):
    """A contract-enforcing store. Open one with :func:`remit_core.open_store`.

    Thread-safe; one instance may be shared by every adapter in a process. The
    ``a``-prefixed coroutine twins run the same operation in a worker thread.
    """

    #: the URL with any password masked
    url: str
    serde: Serde
    #: encoded channel values and pending writes of at least this many bytes are stored
    #: as content-defined chunks, once per run (:mod:`remit_core.store.chunks`)
    chunk_threshold: int = 8 * 1024
    #: the average chunk size FastCDC aims at
    chunk_size: int = 2 * 1024

    #: the backend commits a checkpoint with pending writes against its parent in one
    #: transaction (group commit, :meth:`expect_writes`)
    groups_writes: ClassVar[bool] = False
    #: ... also when the caller goes on without waiting for the checkpoint (a local
    #: database commits fast enough that checkpoints do not queue up behind each other)
    groups_background_writes: ClassVar[bool] = False

    #: the backend's I/O can await an async driver under :func:`remit_core.aio.run`; if
    #: not, an operation run that way goes to the store's own pool of ``async_threads``
    native_async: ClassVar[bool] = False
    #: the threads of that pool (SQLite serialises writes, so more would only queue)
    async_threads: ClassVar[int] = 8

    #: the backend's name in the option table (:mod:`remit_core.store.options`)
    backend: ClassVar[str]
    #: keyword options of open_store that the table does not know go to the driver
    #: (else they are unknown options)
    keyword_passthrough: ClassVar[bool] = True

    #: the backend's migrations, append-only (never edit one, add one); the version of
    #: a store is their count
    migrations: ClassVar[Sequence[Any]]
    #: the version of the layout as opened: the latest, unless the store was opened
    #: read-only at an older one (which is read as it is, never migrated)
    layout_version: int
    #: words of the layout messages: what the version counts, and where the store lives
    #: (after the URL, for example `` (schema 'app')``)
    layout_noun: ClassVar[str] = "schema"
    layout_place: str = ""
    #: the name of the meta record, and what to do when the layout is not remit's
    meta_name: str = "remit_meta"
    layout_advice: str = ""

    def __init__(self, url: str, *, serde: Serde | None = None, lease: float = DEFAULT_LEASE,
                 read_only: bool = False):
        self.url = url
        self.serde = serde or default_serde
        self.lease = lease
        #: seconds a recovery waits for a claim whose holder has not finished (``wait=``
        #: URL option; see :meth:`claim_once`)
        self.wait = 0.0
        #: opened with ``open_store(url, read_only=True)``: every write is refused
        self.read_only = read_only
        self._keeper: _LeaseKeeper | None = None
        self._keeper_lock = threading.Lock()
        # operations in flight, so that close() never pulls a connection from under one
        # (an executor thread still writing when an event loop shuts down, say)
        self._inflight = 0
        # (a plain lock, taken by every operation twice: entered at C speed, where the
        # condition's own ``with`` is two Python calls)
        self._inflight_lock = threading.Lock()
        self._inflight_cond = threading.Condition(self._inflight_lock)
        self._closed = False
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._groups = Groups()

    # ================================================================================== lifecycle

    @classmethod
    def open(cls, url: str, *, serde: Serde | None = None, lease: float | None = None,
             read_only: bool = False, **options: Any) -> Self:
        """Open this backend's store at ``url`` (:func:`remit_core.open_store` picks the
        backend): the URL is split and its options (with ``lease`` and ``options`` as
        defaults) are checked by the one option table before the backend builds the store
        from them (:meth:`_from_url`)."""
        masked = mask_url(url)
        try:
            parts = urlsplit(url)
            _ = parts.port  # raises ValueError on a port that is not a number
        except ValueError as exc:
            raise StoreConfigError(
                f"malformed URL {masked!r}: {scrub(str(exc), url_secrets(url))}."
                f"{password_hint(url)}", url=masked) from None
        parsed = parse_options(cls.backend, parts.query, {"lease": lease, **options},
                               scheme=parts.scheme.lower(), where=repr(masked), url=masked,
                               keyword_passthrough=cls.keyword_passthrough)
        store = cls._from_url(url, parts, parsed, serde=serde, read_only=read_only)
        store.wait = parsed.values["wait"]
        return store

    @classmethod
    @abstractmethod
    def _from_url(cls, url: str, parts: SplitResult, parsed: Parsed, *, serde: Serde | None,
                  read_only: bool) -> Self:
        """The store named by ``url`` (split into ``parts``), with its checked options."""

    def close(self) -> None:
        """Release connections. The store must not be used afterwards.

        Operations already running finish first (waited for up to ``CLOSE_WAIT``
        seconds); any started afterwards raise :class:`StoreClosed`. From a coroutine,
        use :meth:`aclose`."""
        if self._stop_operations():
            self._release()

    def _stop_operations(self) -> bool:
        """Refuse new operations and wait for those in flight; False if closed already."""
        self._groups.release_all()  # writes held for a checkpoint are committed now
        with self._inflight_cond:
            if self._closed:
                return False
            self._closed = True
            if not aio.bridged():
                self._inflight_cond.wait_for(lambda: self._inflight == 0, timeout=CLOSE_WAIT)
                return True
        # aclose(): operations of this loop in flight need the loop to finish, so wait for
        # them without blocking it
        Retrying(retry=retry_if_result(bool), stop=stop_after_delay(CLOSE_WAIT),
                 wait=wait_fixed(0.005), sleep=aio.sleep,
                 retry_error_callback=lambda _: None)(lambda: self._inflight > 0)
        return True

    def _release(self) -> None:
        if self._keeper is not None:
            self._keeper.stop()
        if self._executor is not None:
            self._executor.shutdown(wait=False)
        self._close()

    def _async_threads(self) -> concurrent.futures.ThreadPoolExecutor:
        """The pool that runs this store's operations for coroutines (a backend without
        an async driver): ``async_threads`` threads of its own, not the loop's default
        executor, which every ``asyncio.to_thread`` of the application shares."""
        with self._keeper_lock:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    self.async_threads, thread_name_prefix=f"remit-{self.backend}")
            return self._executor

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"

    def _call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run one atomic backend operation with bounded retries on transient errors.

        The first attempt runs directly: building and entering a tenacity policy costs
        tens of microseconds, a good part of a fast operation. After a transient failure
        the policy takes over *from that failure* (it sees the first attempt fail), so
        the attempts, waits and log lines are those of a policy that made every attempt.
        """
        self._admit(fn)
        try:
            return self._run(fn, *args, **kwargs)
        except Exception as exc:
            instead = self._exhausted(exc)
            if instead is None:
                raise
            raise instead from exc
        finally:
            self._leave()

    def _exhausted(self, exc: Exception) -> BaseException | None:
        """The error to raise instead of ``exc``, which ended an operation (after its
        retries, if it was transient): a backend's :class:`StoreUnavailable` for a server
        it could not reach. None: ``exc`` itself."""
        return None

    def _admit(self, fn: Callable[..., Any]) -> None:
        """Count an operation in flight, or refuse it (store read-only or closed)."""
        if self.read_only and getattr(fn, "__name__", "") in _WRITES:
            raise StoreConfigError(
                f"{self.url!r} was opened read-only (open_store(url, read_only=True)); "
                f"{fn.__name__.lstrip('_').replace('_', ' ')} writes, so it was refused. Open "
                "the store without read_only to change it.", url=self.url)
        with self._inflight_lock:
            if self._closed:
                raise StoreClosed(
                    f"{self.url!r} was closed; {getattr(fn, '__name__', 'an operation')} "
                    "started afterwards was refused. Open the store again (open_store(url)) "
                    "or keep it open while the work that uses it runs.", url=self.url)
            self._inflight += 1

    def _leave(self) -> None:
        with self._inflight_lock:
            self._inflight -= 1
            if self._inflight == 0 and self._closed:
                self._inflight_cond.notify_all()

    def _run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        if not self.native_async and aio.bridged():
            # under remit_core.aio.run, a backend without an async driver runs the
            # operation on the store's own threads, not on the event loop
            return aio.wait(aio.loop().run_in_executor(
                self._async_threads(),
                functools.partial(self._attempts, fn, *args, **kwargs)))
        return self._attempts(fn, *args, **kwargs)

    def _attempts(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if not self._is_transient(exc):
                raise
            first = exc
        return self._retried(first, fn, *args, **kwargs)  # (outside the handler, as before)

    def _retried(self, exc: BaseException, fn: Callable[P, T], *args: P.args,
                 **kwargs: P.kwargs) -> T:
        """The retry policy, taking over after the first attempt failed with ``exc``
        (kept apart from :meth:`_attempts`: its closure's cells would be made on every
        call, and under :func:`remit_core.aio.run` they live while the call waits)."""
        failed: list[BaseException] = [exc]

        def attempt(*a: P.args, **k: P.kwargs) -> T:
            if failed:
                raise failed.pop()
            return fn(*a, **k)

        return retrying(self._is_transient, self.url)(attempt, *args, **kwargs)

    # ===================================================================== layout (migrations)

    def _open_layout(self) -> None:
        """Open the store's layout: read the meta record, refuse a layout that is not
        remit's or was written by a newer remit, and -- unless read-only -- create what is
        missing, apply the migrations after the stored version and record the new version.

        Everything happens in one layout session of the backend (its transaction, under
        its migration lock; on Redis one script that first checks that the version is
        still the one read), so concurrent openers migrate once and a refusal writes
        nothing. An open of an up-to-date store writes nothing."""
        latest = len(self.migrations)
        for _ in range(LAYOUT_ATTEMPTS):
            try:
                with self._layout_session() as session:
                    found = self._read_layout(session)
                    version = self._check_layout(found, latest)
                    self.layout_version = version
                    if self.read_only or version == latest:
                        return
                    if found.meta is None:
                        self._create_layout(session)
                    for step in self.migrations[version:]:
                        self._apply_step(session, step)
                    self._set_version(session, latest)
                    self.layout_version = latest
                return
            except LayoutChanged:
                continue
        raise StoreUnavailable(
            f"{self.url!r}{self.layout_place}: the layout changed under each of "
            f"{LAYOUT_ATTEMPTS} attempts to open it (other openers migrating it?); try "
            "again.", url=self.url)

    def _check_layout(self, found: Layout, latest: int) -> int:
        """The stored version, or the refusal of ``found``."""
        where = f"{self.url!r}{self.layout_place}"
        if found.foreign:
            name, why = found.foreign[0]
            raise ForeignSchemaError(
                f"{where}: {name} {why}; remit did not create it and left it untouched. "
                f"{self.layout_advice}.", url=self.url, name=name)
        if found.meta is None:
            if self.read_only:
                raise StoreNotFound(f"no remit store at {self.url!r}: {found.absent}",
                                    url=self.url)
            if found.strays:
                one = len(found.strays) == 1
                them = "it" if one else "them"
                raise ForeignSchemaError(
                    f"{where}: {', '.join(found.strays)} exist{'s' if one else ''} without "
                    f"{self.meta_name}; remit did not create {them} and left {them} "
                    f"untouched. {self.layout_advice}.", url=self.url, name=found.strays[0])
            return 0
        version = found.meta.get("version", "")
        if found.meta.get("schema") != "remit" or not version.isdigit():
            raise ForeignSchemaError(
                f"{where}: {self.meta_name} was not written by remit; "
                + ("it is not a remit store." if self.read_only
                   else f"remit left it untouched. {self.layout_advice}."),
                url=self.url, name=self.meta_name)
        if int(version) > latest:
            raise StoreVersionError(
                f"{where} was written by a newer remit ({self.layout_noun} version {version}; "
                f"this remit knows {latest}). Upgrade remit-core to "
                f"{'read' if self.read_only else 'open'} it.",
                url=self.url, found=int(version), supported=latest)
        return int(version)

    @abstractmethod
    def _layout_session(self) -> contextlib.AbstractContextManager[Any]:
        """The one atomic operation in which the layout is read and migrated: it writes
        everything or, when the block raises, nothing (read-only: it writes nothing)."""

    @abstractmethod
    def _read_layout(self, session: Any) -> Layout: ...

    @abstractmethod
    def _create_layout(self, session: Any) -> None:
        """Create the meta record (and what holds the store, a schema) at version 0."""

    @abstractmethod
    def _apply_step(self, session: Any, step: Any) -> None:
        """Apply one entry of :attr:`migrations`."""

    @abstractmethod
    def _set_version(self, session: Any, version: int) -> None: ...

    # ================================================================================ checkpoints

    def put_checkpoint(
        self,
        run_id: str,
        checkpoint_id: str,
        *,
        ns: str = "",
        parent_id: str | None = None,
        kind: str = "step",
        data: Any = None,
        metadata: Any = None,
        versions: Mapping[str, object] | None = None,
        new_values: Mapping[str, tuple[str, Any]] | None = None,
        execution_id: str | None = None,
        validate: Callable[[], object] | None = None,
        exclusive_child: bool = False,
    ) -> Checkpoint:
        """Store one checkpoint and the channel values it introduces, atomically.

        * CV: ``validate`` runs first; if it raises, nothing is written.
        * Every value is encoded before the transaction starts, so an unsupported
          type raises :class:`SerializationError` and nothing is written.
        * ``new_values`` maps channel -> (version, value); a (channel, version) pair is
          stored once, however many checkpoints refer to it.
        * ``versions`` is the full channel -> version map of this checkpoint (it
          defaults to the versions of ``new_values``); each version is stored as its
          ``str()``.
        * Writing the same ``checkpoint_id`` again replaces it and keeps its ``seq``.
        * ``exclusive_child`` (CO): refuse with :class:`ConsumeConflict` when another
          checkpoint of the same ``kind`` already has this ``parent_id``; one parent
          gets one successor of a kind, whoever writes first.

        Returns the checkpoint with its ``seq``; its ``data``, ``metadata`` and ``values``
        are the objects given, not copies decoded from the store.
        """
        if validate is not None:
            validate()
        new_values = new_values or {}
        all_versions = _text_map(versions or {})
        for channel, (version, _) in new_values.items():
            if channel not in all_versions:
                all_versions[str(channel)] = str(version)
        encode = self.serde.encode
        row = CheckpointRow(
            run_id=run_id,
            ns=ns,
            checkpoint_id=checkpoint_id,
            parent_id=parent_id,
            kind=kind,
            execution_id=execution_id,
            data=_named(encode, data, "checkpoint {!r} of run {!r} (data)", checkpoint_id,
                        run_id),
            metadata=_named(encode, metadata, "checkpoint {!r} of run {!r} (metadata)",
                            checkpoint_id, run_id),
            versions=all_versions,
            created_at=0.0,
        )
        chunks: dict[bytes, bytes] = {}
        blobs = []
        for channel, (version, value) in new_values.items():  # (a loop, not a comprehension:
            # on Python 3.11 that would make this frame's names cells, which live while the
            # write waits under remit_core.aio.run)
            blobs.append(BlobRow(run_id, ns, channel, str(version), self._chunked(_named(
                encode, value, "channel {!r} of checkpoint {!r} of run {!r}", channel,
                checkpoint_id, run_id), chunks)))
        # group commit: pending writes a loop announced against the parent go in this
        # transaction (remit_core.store.groups)
        grouped = (self._groups.take((run_id, ns, parent_id))
                   if self._groups and parent_id is not None else [])
        stored = False
        try:
            for entry in grouped:
                for digest, chunk in entry.chunks.items():
                    chunks.setdefault(digest, chunk)
            seq, conflict = self._call(self._write_checkpoint, row, blobs, exclusive_child,
                                       chunks, [(e.rows, e.overwrite) for e in grouped])
            stored = conflict is None
        finally:
            self._groups.settle(grouped, stored=stored)
        if conflict is not None:
            raise ConsumeConflict(
                f"run {run_id!r}: checkpoint {parent_id!r} already has a successor "
                f"{conflict!r} of kind {kind!r}; this writer lost the race and nothing of it "
                "was stored. Reload the run to see the winner's state.",
                key=f"{run_id}/{ns}/{parent_id}",
                run_id=run_id,
                step=checkpoint_id,
                owner=conflict,
            )
        # data, metadata and values are returned as given: decoding what was just encoded
        # would cost as much again as the encoding (LangGraph's data grows with the graph)
        return Checkpoint(
            run_id=run_id, ns=ns, checkpoint_id=checkpoint_id, seq=seq, parent_id=parent_id,
            kind=kind, execution_id=execution_id, data=data, metadata=metadata,
            versions=row.versions, values={c: v for c, (_, v) in new_values.items()},
            created_at=row.created_at, writes=[],
        )

    def get_checkpoint(
        self, run_id: str, checkpoint_id: str | None = None, *, ns: str = "", with_writes: bool = True
    ) -> Checkpoint | None:
        """The addressed checkpoint, or the run's latest (highest seq) when ``checkpoint_id`` is None.

        The latest is one indexed lookup whatever the history length. The checkpoint,
        its values and (``with_writes``) its pending writes are one read of the backend,
        from one snapshot; a value stored in chunks takes one more (of the chunks), except
        on PostgreSQL, whose read brings the chunks too.
        Reading never claims, consumes or blocks.
        """
        found = self._call(self._read_checkpoint, run_id, ns, checkpoint_id, with_writes)
        if found is None:
            return None
        row, blobs, writes = found
        digests = _chunks.referenced(chain(blobs.values(), map(_value_of, writes)))
        chunks = self._call(self._read_chunks, run_id, sorted(digests)) if digests else None
        return self._decode_checkpoint(row, blobs, writes, chunks)

    def list_checkpoints(
        self,
        run_id: str | None = None,
        *,
        ns: str | None = None,
        before: str | None = None,
        limit: int | None = None,
        execution_ids: Sequence[str] | None = None,
        with_writes: bool = True,
    ) -> Iterator[Checkpoint]:
        """Checkpoints newest first (seq descending).

        ``run_id`` None lists every run. ``before`` is a checkpoint id of ``run_id``:
        only checkpoints written before it are listed. ``limit`` caps the count.

        The checkpoints, their values and (``with_writes``) their writes are one read of
        the backend, however many are listed; chunked values take one more read per run
        that has them. Each checkpoint is decoded when the iterator reaches it.
        """
        found = self._call(self._list_checkpoints, run_id, ns, before, limit, execution_ids,
                           with_writes)
        yield from self._decoded(found)

    def put_writes(
        self,
        run_id: str,
        checkpoint_id: str,
        task_id: str,
        writes: Sequence[tuple[int, str, Any]],
        *,
        ns: str = "",
        task_path: str = "",
        overwrite: bool = False,
        validate: Callable[[], object] | None = None,
    ) -> None:
        """Record pending writes ``(idx, channel, value)`` of one task against a checkpoint.

        A write is keyed by (task_id, idx). An existing key is kept unless
        ``overwrite`` (then it is replaced), so repeating a call never duplicates.
        All writes of one call land atomically; ``validate`` runs before any.
        """
        if validate is not None:
            validate()
        encode = self.serde.encode
        chunks: dict[bytes, bytes] = {}
        rows = []
        for idx, channel, value in writes:  # (a loop: see put_checkpoint)
            rows.append(WriteRow(run_id, ns, checkpoint_id, task_id, idx, channel, self._chunked(
                _named(encode, value, "channel {!r} in write of task {!r} on checkpoint {!r} "
                       "of run {!r}", channel, task_id, checkpoint_id, run_id), chunks),
                task_path))
        if not rows:
            return
        self._admit(self._write_writes)
        try:
            alone = functools.partial(self._write_alone, rows, overwrite, chunks)
            # announced writes wait for their checkpoint (group commit); others go now
            if not (self._groups and self._groups.put((run_id, ns, checkpoint_id), task_id,
                                                      rows, overwrite, chunks, alone)):
                alone()
        finally:
            self._leave()

    def _write_alone(self, rows: list[WriteRow], overwrite: bool,
                     chunks: dict[bytes, bytes]) -> None:
        """One task's writes in their own transaction (no checkpoint takes them along)."""
        self._run(self._write_writes, rows, overwrite, chunks)

    def expect_writes(self, run_id: str, checkpoint_id: str, task_id: str, *,
                      ns: str = "", background: bool = False) -> bool:
        """Group commit: announce that the next :meth:`put_writes` of ``task_id`` against
        this checkpoint carries the last writes of its step, so that the store commits
        them with the step's checkpoint (the next :meth:`put_checkpoint` whose parent this
        is) in one transaction instead of two. ``put_writes`` still returns only once they
        are durable; if no checkpoint follows within ``groups.WAIT`` seconds they are
        committed alone (:mod:`remit_core.store.groups`). ``background``: the caller does
        not wait for that checkpoint before it goes on (LangGraph's ``durability="async"``),
        so the checkpoints may queue behind one another while the writes wait; grouped
        only where ``groups_background_writes``. False where the backend does not group
        (the writes are committed at once, as without the announcement)."""
        if not self.groups_writes or self.read_only or (
                background and not self.groups_background_writes):
            return False
        self._groups.expect((run_id, ns, checkpoint_id), task_id)
        return True

    def list_runs(
        self,
        *,
        limit: int | None = None,
        status: RunStatus | Literal["abandoned"] | None = None,
        framework: str | None = None,
        name: str | None = None,
        updated_before: float | None = None,
        cursor: str | None = None,
    ) -> list[RunInfo]:
        """Runs, most recently updated first.

        Without a filter: every run that has a checkpoint, with its lifecycle where an
        adapter keeps one. With one of ``status`` (``abandoned``: running, its executor's
        lease expired), ``framework``, ``name`` (the app's name for the graph or flow),
        ``updated_before`` (epoch seconds) or ``cursor``: the runs whose lifecycle
        matches, ordered by the lifecycle's last change; each filter is an indexed read,
        not a scan of every run. ``cursor`` continues a listing after the run it came
        from (``RunState.cursor`` of the last one listed).
        """
        query = RunQuery(status, framework, name, updated_before, _cursor(cursor), limit)
        if query == RunQuery(limit=limit):
            return [info if row is None else
                    dataclasses.replace(info, lifecycle=self._run_state(row, now))
                    for info, row, now in self._call(self._list_runs, limit)]
        if status is not None and status not in RUN_STATUSES:
            raise ValueError(f"status must be one of {', '.join(RUN_STATUSES)}, "
                             f"not {status!r}")
        return [dataclasses.replace(info, lifecycle=self._run_state(row, now))
                for info, row, now in self._call(self._list_lifecycles, query)]

    def delete_run(self, run_id: str) -> None:
        """Delete a run with its checkpoints, values, writes, receipts and claims."""
        self._call(self._delete_run, run_id)

    def copy_run(self, source_run_id: str, target_run_id: str) -> None:
        """Copy a run's checkpoints, values and pending writes under another run id."""
        self._call(self._copy_run, source_run_id, target_run_id)

    def prune_run(self, run_id: str, *, keep_latest: int = 1) -> None:
        """Keep the newest ``keep_latest`` checkpoints per namespace (0 deletes all of them)."""
        self._call(self._prune_run, run_id, keep_latest)

    def usage(self, run_id: str | None = None) -> dict[str, int]:
        """Counts and stored bytes: checkpoints, blobs, blob_bytes, writes, receipts, claims,
        chunks and chunk_bytes. ``blob_bytes`` counts channel values as their rows hold
        them (a chunked value as its manifest); ``chunk_bytes`` the chunks of large values."""
        return self._call(self._usage, run_id)

    def delete_executions(self, execution_ids: Sequence[str]) -> None:
        """Delete every checkpoint (and its writes) written by one of ``execution_ids``."""
        if execution_ids:
            self._call(self._delete_executions, list(execution_ids))

    # ================================================================================= lifecycle

    def start_run(self, run_id: str, *, framework: str, name: str, owner: str,
                  lease: float | None = None, likely_new: bool = False) -> RunStart:
        """An executor starts or continues run ``run_id``: atomically record it as the
        run's executor, with a lease it renews while it works (:meth:`renew_run`) and an
        end it records (:meth:`end_run`). See
        :func:`remit_core.store.decisions.start_run`: another executor's live lease is
        ``busy`` (the call does not own the run), an expired one is taken over.

        ``likely_new``: a hint that the run has no lifecycle yet (its adapter found nothing
        stored for it), so the backend tries to insert it before it reads what is stored
        (one round trip on PostgreSQL where a start that reads first takes two). The
        decision is the same either way; a wrong hint only costs time."""
        return self._run_start(run_id, framework, name, owner, lease, None, likely_new)

    def recover_run(self, run_id: str, *, owner: str, lease: float | None = None,
                    retry_failed: bool = False, attention: bool = False,
                    max_attempts: int = 0) -> RunStart:
        """A recoverer takes an abandoned run (running, its executor's lease expired):
        of k recoverers racing, across processes and hosts, exactly one gets ``taken_over``
        and continues the run; the others get ``busy`` (or ``reentered``: it is theirs
        already). A run that is not abandoned is ``not_abandoned`` or ``missing``. The
        run keeps its framework and name.

        ``retry_failed`` also takes a ``failed`` run, ``attention`` a ``needs-attention``
        one (the caller checked that what it waited for was settled). ``max_attempts``
        (0: no bound) bounds the executions a run gets: a run that has had them is
        ``exhausted`` and not taken; an abandoned one is then recorded ``failed``, with an
        error saying so. See :func:`remit_core.store.decisions.start_run`.
        """
        retake = (("failed",) if retry_failed else ()) + (
            ("needs-attention",) if attention else ())
        return self._run_start(run_id, "", "", owner, lease,
                               self._recovery(retake, max_attempts))

    def take_runs(self, *, framework: str, owner: str, limit: int, name: str | None = None,
                  lease: float | None = None, max_attempts: int = 0) -> list[RunStart]:
        """A recoverer takes up to ``limit`` abandoned runs of ``framework`` (and graph or
        flow ``name``) in one atomic operation, oldest expired lease first: each is decided
        as :meth:`recover_run` decides it, and a run another recoverer is taking at the
        same moment is passed over rather than waited for (PostgreSQL ``FOR UPDATE SKIP
        LOCKED``, one Redis script, one SQLite ``BEGIN IMMEDIATE`` transaction). Of k
        recoverers taking at once, each run goes to exactly one, and none of them makes an
        attempt that is refused.

        Returns the runs taken (``taken_over``: the caller continues each, renewing its
        lease, and records its end) and those whose ``max_attempts`` were spent
        (``exhausted``: recorded ``failed``, not taken). An empty list: no abandoned run
        is left to take.
        """
        if limit < 1:
            raise ValueError(f"limit must be 1 or more, not {limit}")
        taken = self._call(self._take_runs, str(framework), name, owner,
                           self.lease if lease is None else lease,
                           self._recovery((), max_attempts), int(limit))
        return [RunStart(outcome, self._run_state(row, now),
                         row.previous_owner if outcome == "taken_over" else None)
                for outcome, row, now in taken]

    def _recovery(self, retake: tuple[str, ...], max_attempts: int) -> Recovery:
        if max_attempts < 0:
            raise ValueError(f"max_attempts must be 0 (no bound) or more, not {max_attempts}")
        exhausted = self.serde.encode(
            {"type": "RecoveryExhausted",
             "message": f"the run was not recovered again: it had {max_attempts} executions "
                        "(max_attempts); see why its executors ended before recovering it "
                        "by hand"},
            record="error of an exhausted run") if max_attempts else None
        return Recovery(retake, max_attempts, exhausted)

    def _run_start(self, run_id: str, framework: str, name: str, owner: str,
                   lease: float | None, recovery: Recovery | None,
                   likely_new: bool = False) -> RunStart:
        outcome, row, now = self._call(self._start_run, run_id, str(framework), str(name),
                                       owner, self.lease if lease is None else lease,
                                       recovery, likely_new)
        state = None if row is None else self._run_state(row, now)
        return RunStart(outcome, state,
                        row.previous_owner if outcome == "taken_over" and row else None)

    def end_run(self, run_id: str, *, owner: str, fence: int, status: RunEnd,
                waiting: Any = None, error: Any = None) -> bool:
        """The executor records how its execution of the run ended: ``parked``
        (``waiting``: what the run waits for, e.g. the interrupts' values), ``done``,
        ``failed`` (``error``: what ended it, e.g. ``{"type": ..., "message": ...}``), or
        ``needs-attention`` (``waiting``: what a person must settle first, e.g.
        ``{"receipt": key}`` of an in-doubt effect; a recovery with ``attention=True``
        continues it once that is settled).

        Fenced: False, and nothing written, when the caller no longer executes the run
        (its lease expired and another executor took it over; that one's record stands).
        """
        if status not in ("parked", "done", "failed", "needs-attention"):
            raise ValueError("a run ends parked, done, failed or needs-attention, not "
                             f"{status!r}")
        data = self._run_detail(run_id, status, waiting, error)
        return self._call(self._end_run, run_id, owner, fence, status, data)

    def import_run(self, run_id: str, *, framework: str, name: str,
                   status: RunEnd | Literal["abandoned"], owner: str,
                   waiting: Any = None, error: Any = None,
                   replaces: RunState | None = None) -> bool:
        """Record the lifecycle of a run imported from a stock layer (``remit migrate``),
        in one atomic operation, only where the run has none: an import never overwrites
        what an adapter or an earlier import recorded. False, and nothing written, when
        the run has a lifecycle already.

        ``status``: ``abandoned`` (the stock process died while it executed the run: it
        is recorded running under ``owner`` with a lease that has run out, so a recovery
        takes it at once), or ``parked`` / ``done`` / ``failed`` / ``needs-attention`` as
        :meth:`end_run` records them (``waiting``, ``error`` likewise).

        ``replaces``: the run's lifecycle as :meth:`get_run` read it, an earlier import's
        own record to bring up to date: it is replaced, in the same one atomic operation,
        only while it is still the stored one (nothing took the run over or changed it
        since); otherwise False and nothing written."""
        if status not in ("abandoned", "parked", "done", "failed", "needs-attention"):
            raise ValueError("an imported run is abandoned, parked, done, failed or "
                             f"needs-attention, not {status!r}")
        data = self._run_detail(run_id, status, waiting, error)
        return self._call(self._import_run, run_id, framework, name, status, owner, data,
                          None if replaces is None else (replaces.fence, replaces.updated_at))

    def _run_detail(self, run_id: str, status: str, waiting: Any, error: Any) -> bytes | None:
        """What a run ``status`` keeps, encoded: what it waits for (parked,
        needs-attention) or what it failed with; None for the others."""
        waits = status in ("parked", "needs-attention")
        detail = waiting if waits else error if status == "failed" else None
        return None if detail is None else self.serde.encode(
            detail, record=f"{'waiting' if waits else 'error'} of run {run_id!r}")

    def renew_run(self, run_id: str, *, owner: str, fence: int,
                  lease: float | None = None) -> bool:
        """LV: extend the executor's lease; False when it no longer executes the run."""
        return self._call(self._renew_run, run_id, owner, fence,
                          self.lease if lease is None else lease)

    def get_run(self, run_id: str) -> RunState | None:
        """The run's lifecycle (``abandoned`` computed with the backend's clock), or None
        when no adapter has kept one for it."""
        found = self._call(self._get_run, run_id)
        return None if found is None else self._run_state(*found)

    def _run_state(self, row: RunRow, now: float) -> RunState:
        # what a run waits for or failed with is shown, never resumed from: a value of a
        # type this process has not registered (an app's interrupt value) reads as an
        # UnregisteredValue, so that one run's detail does not stop a listing of all runs
        where, serde = f"run {row.run_id!r}", self.serde.lenient()
        waiting = None if row.waiting is None else serde.decode(
            row.waiting, record=f"waiting of {where}")
        error = None if row.error is None else serde.decode(
            row.error, record=f"error of {where}")
        status: RunStatus | Literal["abandoned"] = row.status
        if status == "running" and row.lease_until <= now:
            status = "abandoned"
        return RunState(row.run_id, row.framework, row.name, status, row.owner, row.fence,
                        row.lease_until, waiting, error, row.attempts, row.started_at,
                        row.updated_at)

    # =================================================================================== receipts

    def start_receipt(
        self,
        key: str,
        *,
        run_id: str,
        step: str,
        name: str,
        ordinal: int,
        owner: str,
        may_take_over: bool,
        lease: float | None = None,
    ) -> ReceiptStart:
        """EO, phase one: atomically decide who calls the effect for ``key``.

        See :func:`remit_core.store.decisions.start_receipt` for the decision table. ``may_take_over`` says
        whether the caller may re-call the function when its previous owner died
        mid-call (it takes an idempotency key, or ``on_in_doubt="retry"``).
        """
        outcome, row = self._call(
            self._start_receipt, key, run_id, step, name, ordinal, owner,
            self.lease if lease is None else lease, may_take_over,
        )
        return ReceiptStart(outcome, self._receipt(row),
                            row.previous_owner if outcome == "taken_over" else None)

    def complete_receipt(self, key: str, *, owner: str, fence: int, result: Any) -> None:
        """EO, phase two: record the result. Fenced: raises :class:`LeaseLost` when the
        caller no longer owns the receipt (its lease expired and another took over)."""
        data = self.serde.encode(result, record=f"result of effect receipt {key!r}")
        if not self._call(self._complete_receipt, key, owner, fence, data):
            raise LeaseLost(
                f"effect receipt {key!r}: the lease of {owner!r} expired and another process "
                "took the receipt over; this result was not recorded. Increase the lease "
                "(open_store(url, lease=...)) if effects run longer than it.",
                key=key,
                owner=owner,
            )

    def release_receipt(self, key: str, *, owner: str, fence: int) -> None:
        """Drop a started receipt whose call raised: the effect did not complete, so
        the next call with this key runs it again."""
        self._call(self._release_receipt, key, owner, fence)

    def renew_receipt(self, key: str, *, owner: str, fence: int, lease: float | None = None) -> bool:
        return self._call(self._renew_receipt, key, owner, fence, self.lease if lease is None else lease)

    def get_receipt(self, key: str) -> Receipt | None:
        row = self._call(self._get_receipt, key)
        return None if row is None else self._receipt(row)

    def list_receipts(self, run_id: str | None = None) -> list[Receipt]:
        return [self._receipt(r) for r in self._call(self._list_receipts, run_id)]

    def resolve_receipt(self, key: str, result: Any) -> None:
        """Record ``result`` for an in-doubt receipt after reconciling it by hand."""
        data = self.serde.encode(result, record=f"result of effect receipt {key!r}")
        if not self._call(self._resolve_receipt, key, data):
            raise KeyError(f"no effect receipt {key!r}")

    def reset_receipt(self, key: str) -> None:
        """Forget a receipt so that the effect runs again on the next call (by hand only)."""
        self._call(self._reset_receipt, key)

    # ===================================================================================== claims

    def claim_once(
        self,
        key: str,
        *,
        run_id: str,
        owner: str,
        digest: str | None = None,
        value: Any = None,
        lease: float | None = None,
        wait: float | None = None,
    ) -> Claim:
        """CO: claim a one-time slot; the first writer wins, every other gets
        :class:`ConsumeConflict`.

        ``digest`` (and optionally ``value``) records what the winner will consume,
        so that after the winner dies (LV) another process can take the slot over and
        finish with the *same* value: a take-over passes ``digest=None`` (any value)
        or the same digest. See :func:`remit_core.store.decisions.claim` for the decision
        table.

        ``wait`` (seconds; by default the store's ``wait=`` URL option, 0): a recovery
        (``digest=None``) that meets a claim whose holder has not finished waits up to
        this long, polling with back-off, for the holder to finish or for its lease to
        run out (then it takes the claim over). A delivery (``digest`` given) never
        waits: another delivery won the race.
        """
        data = None if value is None else self.serde.encode(value, record=f"value of claim {key!r}")
        lease = self.lease if lease is None else lease
        limit = self.wait if wait is None else wait

        def attempt() -> Claim:
            outcome, row = self._call(self._claim, key, run_id, owner, lease, digest, data)
            claim = self._claim_record(row, taken_over=outcome == "taken_over")
            if outcome in ("won", "reentered", "taken_over"):
                return claim
            raise self._claim_conflict(claim, outcome)

        if digest is not None or limit <= 0:
            return attempt()
        return waiting_for_holder(limit, self.lease)(attempt)

    def consume_claim(self, key: str, *, owner: str, fence: int, digest: str | None = None) -> Claim:
        """Mark a held claim consumed (with the digest of the consumed value). Fenced."""
        ok, row = self._call(self._consume_claim, key, owner, fence, digest)
        if not ok or row is None:
            raise LeaseLost(
                f"claim {key!r}: {owner!r} no longer holds it (its lease expired and another "
                "process took it over); it was not marked consumed.",
                key=key,
                owner=None if row is None else row.owner,
            )
        return self._claim_record(row)

    def release_claim(self, key: str, *, owner: str, fence: int) -> bool:
        """Give a held claim back so that another delivery may claim it."""
        return self._call(self._release_claim, key, owner, fence)

    def renew_claim(self, key: str, *, owner: str, fence: int, lease: float | None = None) -> bool:
        return self._call(self._renew_claim, key, owner, fence, self.lease if lease is None else lease)

    def get_claim(self, key: str) -> Claim | None:
        row = self._call(self._get_claim, key)
        return None if row is None else self._claim_record(row)

    def list_claims(self, run_id: str | None = None) -> list[Claim]:
        return [self._claim_record(r) for r in self._call(self._list_claims, run_id)]

    def list_lapsed_claims(self, *, framework: str, name: str | None = None,
                           limit: int = 100, after: Claim | None = None) -> list[Claim]:
        """Claims still held (``claimed``) whose holder's lease ran out by the backend's
        clock, of runs whose lifecycle is ``parked`` under ``framework`` (and ``name``):
        each is a delivery that claimed a parked run's value and died before its execution
        was recorded (a recoverer takes it over with :meth:`claim_once`). Oldest lapse
        first (then key, bytewise), at most ``limit``; ``after`` continues a listing after
        the last claim of the previous page. An indexed read of the held claims whose
        lease ran out, never of every parked run."""
        if limit < 1:
            raise ValueError(f"limit must be 1 or more, not {limit}")
        rows = self._call(self._list_lapsed_claims, str(framework), name, int(limit),
                          None if after is None else (after.lease_until, after.key))
        return [self._claim_record(r) for r in rows]

    def claim_conflict(self, claim: Claim, outcome: ClaimOutcome = "consumed") -> ConsumeConflict:
        """The :class:`ConsumeConflict` that :meth:`claim_once` raises for ``claim`` (read
        with :meth:`get_claim`) and ``outcome``: for an adapter that finds a slot consumed
        without claiming it, so the refusal reads the same."""
        return self._claim_conflict(claim, outcome)

    def _claim_conflict(self, claim: Claim, outcome: ClaimOutcome) -> ConsumeConflict:
        """The refusal of a claim, saying who holds it, whether the holder's lease still
        runs (until when, and for how long) or has lapsed, and what to do."""
        where = f"claim {claim.key!r} of run {claim.run_id!r}"
        if outcome == "consumed":
            at = "" if claim.consumed_at is None else f" at {_iso(claim.consumed_at)}"
            msg = (f"{where} was already consumed by {claim.owner!r}{at}; a value is "
                   "consumed once. Start a fork explicitly if you mean to branch.")
        else:
            left = claim.lease_until - time.time()
            if left > 0:
                lease = (f"its lease is still running: until {_iso(claim.lease_until)} "
                         f"(in {math.ceil(left)} s)")
            else:
                lease = (f"its lease lapsed at {_iso(claim.lease_until)} "
                         f"({math.floor(-left)} s ago) without a renewal, so that process "
                         "has most likely died")
            if outcome == "mismatch":
                msg = (f"{where} is held for another value by {claim.owner!r}; {lease}. "
                       "Recover with the recorded value (resume without a new value) instead "
                       "of delivering a different one.")
            elif left > 0:
                msg = (f"{where} is held by {claim.owner!r}, which has not consumed it; "
                       f"{lease}. If that process is at work, wait for it to finish and "
                       "reload the run. If it died, retry after the lease runs out (in "
                       f"{math.ceil(left)} s): the next resume then takes the claim over. A "
                       "store opened with the wait=SECONDS URL option makes a recovery (a "
                       "resume without a new value) wait for that itself.")
            else:
                msg = (f"{where} is held by {claim.owner!r}, which has not consumed it; "
                       f"{lease}. Retry now: the next resume takes it over.")
        return ConsumeConflict(msg, key=claim.key, run_id=claim.run_id, owner=claim.owner,
                               consumed_at=claim.consumed_at, status=claim.status)

    # =================================================================================== capacity

    def capacity_warnings(self, *, threads: int = 1) -> list[str]:
        """What in this store's configuration cannot serve ``threads`` threads working at
        once (e.g. recovery threads), each sentence naming the numbers and what to change;
        empty when it fits. A backend with a connection limit checks its pool against
        it (PostgreSQL: ``pool_max`` against the connections the server has left)."""
        return []

    # ===================================================================================== leases

    @contextlib.contextmanager
    def keep_alive(self, renew: Callable[[], bool], *, lease: float | None = None) -> Iterator[None]:
        """Renew a lease in the background (every third of it) while the block runs (LV)."""
        period = (self.lease if lease is None else lease) / 3.0
        with self._keeper_lock:
            if self._keeper is None or not self._keeper.alive():
                self._keeper = _LeaseKeeper()
            keeper = self._keeper
        token = keeper.add(renew, period)
        try:
            yield
        finally:
            keeper.remove(token)

    # ===================================================================================== async
    #
    # Each coroutine twin runs its sync operation with remit_core.aio.run: on the event
    # loop's thread, the backend's I/O awaiting its async driver (PostgreSQL, Redis) or
    # the store's own thread pool (SQLite; see _call). One copy of every operation.

    async def alist_checkpoints(self, *args: Any, **kwargs: Any) -> list[Checkpoint]:
        return await aio.run(lambda: list(self.list_checkpoints(*args, **kwargs)))

    async def aclose(self) -> None:
        """:meth:`close`, from a coroutine: this loop's async connections are closed here
        (a loop's pool can only be closed on its loop)."""
        if await aio.run(self._stop_operations):
            await self._aclose_loop()
            self._release()

    async def _aclose_loop(self) -> None:
        """Close the async connections of the running loop (a backend with a native async
        driver keeps them per loop); a backend without one has none."""
        return None

    async def aput_checkpoint(self, *args: Any, **kwargs: Any) -> Checkpoint:
        return await aio.run(self.put_checkpoint, *args, **kwargs)

    async def aget_checkpoint(self, *args: Any, **kwargs: Any) -> Checkpoint | None:
        return await aio.run(self.get_checkpoint, *args, **kwargs)

    async def aput_writes(self, *args: Any, **kwargs: Any) -> None:
        await aio.run(self.put_writes, *args, **kwargs)

    async def astart_receipt(self, *args: Any, **kwargs: Any) -> ReceiptStart:
        return await aio.run(self.start_receipt, *args, **kwargs)

    async def acomplete_receipt(self, *args: Any, **kwargs: Any) -> None:
        await aio.run(self.complete_receipt, *args, **kwargs)

    async def arelease_receipt(self, *args: Any, **kwargs: Any) -> None:
        await aio.run(self.release_receipt, *args, **kwargs)

    async def arenew_receipt(self, *args: Any, **kwargs: Any) -> bool:
        return await aio.run(self.renew_receipt, *args, **kwargs)

    async def aget_receipt(self, *args: Any, **kwargs: Any) -> Receipt | None:
        return await aio.run(self.get_receipt, *args, **kwargs)

    async def alist_receipts(self, *args: Any, **kwargs: Any) -> list[Receipt]:
        return await aio.run(self.list_receipts, *args, **kwargs)

    async def aresolve_receipt(self, *args: Any, **kwargs: Any) -> None:
        await aio.run(self.resolve_receipt, *args, **kwargs)

    async def aclaim_once(self, *args: Any, **kwargs: Any) -> Claim:
        return await aio.run(self.claim_once, *args, **kwargs)

    async def aconsume_claim(self, *args: Any, **kwargs: Any) -> Claim:
        return await aio.run(self.consume_claim, *args, **kwargs)

    async def arelease_claim(self, *args: Any, **kwargs: Any) -> bool:
        return await aio.run(self.release_claim, *args, **kwargs)

    async def arenew_claim(self, *args: Any, **kwargs: Any) -> bool:
        return await aio.run(self.renew_claim, *args, **kwargs)

    async def aget_claim(self, *args: Any, **kwargs: Any) -> Claim | None:
        return await aio.run(self.get_claim, *args, **kwargs)

    async def alist_claims(self, *args: Any, **kwargs: Any) -> list[Claim]:
        return await aio.run(self.list_claims, *args, **kwargs)

    async def alist_lapsed_claims(self, *args: Any, **kwargs: Any) -> list[Claim]:
        return await aio.run(self.list_lapsed_claims, *args, **kwargs)

    async def astart_run(self, *args: Any, **kwargs: Any) -> RunStart:
        return await aio.run(self.start_run, *args, **kwargs)

    async def arecover_run(self, *args: Any, **kwargs: Any) -> RunStart:
        return await aio.run(self.recover_run, *args, **kwargs)

    async def atake_runs(self, *args: Any, **kwargs: Any) -> list[RunStart]:
        return await aio.run(self.take_runs, *args, **kwargs)

    async def aend_run(self, *args: Any, **kwargs: Any) -> bool:
        return await aio.run(self.end_run, *args, **kwargs)

    async def aimport_run(self, *args: Any, **kwargs: Any) -> bool:
        return await aio.run(self.import_run, *args, **kwargs)

    async def arenew_run(self, *args: Any, **kwargs: Any) -> bool:
        return await aio.run(self.renew_run, *args, **kwargs)

    async def aget_run(self, *args: Any, **kwargs: Any) -> RunState | None:
        return await aio.run(self.get_run, *args, **kwargs)

    async def alist_runs(self, *args: Any, **kwargs: Any) -> list[RunInfo]:
        return await aio.run(self.list_runs, *args, **kwargs)

    async def adelete_run(self, *args: Any, **kwargs: Any) -> None:
        await aio.run(self.delete_run, *args, **kwargs)

    async def acopy_run(self, *args: Any, **kwargs: Any) -> None:
        await aio.run(self.copy_run, *args, **kwargs)

    async def aprune_run(self, *args: Any, **kwargs: Any) -> None:
        await aio.run(self.prune_run, *args, **kwargs)

    async def adelete_executions(self, *args: Any, **kwargs: Any) -> None:
        await aio.run(self.delete_executions, *args, **kwargs)

    async def ausage(self, *args: Any, **kwargs: Any) -> dict[str, int]:
        return await aio.run(self.usage, *args, **kwargs)

    # ==================================================================================== decoding

    def _chunked(self, encoded: bytes, chunks: dict[bytes, bytes]) -> bytes:
        """``encoded`` as its row stores it: itself, or the manifest of its chunks."""
        if len(encoded) < self.chunk_threshold:
            return encoded
        return _chunks.split(encoded, size=self.chunk_size, into=chunks)

    def _decoded(self, found: Sequence[Found]) -> Iterator[Checkpoint]:
        """The checkpoints read, decoded one by one as they are asked for; the chunks of
        their large values are read first, in one read per run that has any."""
        wanted: dict[str, set[bytes]] = {}
        chunked: list[bool] = []
        for row, blobs, writes in found:
            digests = _chunks.referenced(chain(blobs.values(), map(_value_of, writes)))
            chunked.append(bool(digests))
            if digests:
                wanted.setdefault(row.run_id, set()).update(digests)
        chunks = {run: self._call(self._read_chunks, run, sorted(digests))
                  for run, digests in wanted.items()}
        for (row, blobs, writes), has_chunks in zip(found, chunked, strict=True):
            yield self._decode_checkpoint(
                row, blobs, writes, chunks[row.run_id] if has_chunks else None)

    def _unchunked(self, row: CheckpointRow, blobs: Mapping[str, bytes],
                   writes: Sequence[WriteRow], found: Mapping[bytes, bytes] | None
                   ) -> tuple[Mapping[str, bytes], Sequence[WriteRow]]:
        """Blobs and writes with every manifest replaced by the value it stands for, from
        the chunks ``found`` (None: there is no manifest)."""
        if found is None:
            return blobs, writes
        where = f"checkpoint {row.checkpoint_id!r} of run {row.run_id!r}"
        blobs = {
            ch: _chunks.join(b, found, record=f"channel {ch!r} of {where}")
            if _chunks.is_manifest(b) else b
            for ch, b in blobs.items()
        }
        writes = [
            dataclasses.replace(w, value=_chunks.join(
                w.value, found, record=f"write {w.task_id!r}/{w.idx} on {where}"))
            if _chunks.is_manifest(w.value) else w
            for w in writes
        ]
        return blobs, writes

    def _decode_checkpoint(self, row: CheckpointRow, blobs: Mapping[str, bytes],
                           writes: Sequence[WriteRow], chunks: Mapping[bytes, bytes] | None
                           ) -> Checkpoint:
        """The checkpoint of the rows read, every payload decoded. A payload that fails to
        decode is decoded again, alone, to name it in the error (the decoding is
        deterministic, so it fails the same way): the names are built only then."""
        blobs, writes = self._unchunked(row, blobs, writes, chunks)
        decode = self.serde.decode
        try:
            data, metadata = decode(row.data), decode(row.metadata)
            values = {ch: decode(b) for ch, b in blobs.items()}
            pending = [PendingWrite(w.task_id, w.idx, w.channel, decode(w.value), w.task_path)
                       for w in writes]
        except (SerializationError, CorruptRecord):
            self._name_the_undecodable(row, blobs, writes)
            raise
        return Checkpoint(  # (positional: every load makes one)
            row.run_id, row.ns, row.checkpoint_id, row.seq, row.parent_id, row.kind,
            row.execution_id, data, metadata, row.versions, values, row.created_at, pending)

    def _name_the_undecodable(self, row: CheckpointRow, blobs: Mapping[str, bytes],
                              writes: Sequence[WriteRow]) -> None:
        """Decode each payload of a checkpoint alone, raising for the first that fails with
        the record named (its checkpoint and run, and the channel and version, or the
        write's task, index and channel)."""
        decode = self.serde.decode
        where = f"checkpoint {row.checkpoint_id!r} of run {row.run_id!r}"
        decode(row.data, record=f"{where} (data)")
        decode(row.metadata, record=f"{where} (metadata)")
        for ch, b in blobs.items():
            decode(b, record=f"channel {ch!r} at version {row.versions.get(ch)!r} of {where}")
        for w in writes:
            decode(w.value, record=f"write {w.task_id!r}/{w.idx} ({w.channel!r}) on {where}")

    def _receipt(self, row: ReceiptRow) -> Receipt:
        result = None if row.result is None else self.serde.decode(
            row.result, record=f"result of effect receipt {row.key!r}")
        return Receipt(row.key, row.run_id, row.step, row.name, row.ordinal, row.status, row.owner,
                       row.fence, row.lease_until, row.started_at, row.completed_at, result,
                       row.attempt)

    def _claim_record(self, row: ClaimRow, *, taken_over: bool = False) -> Claim:
        value = None if row.value is None else self.serde.decode(
            row.value, record=f"value of claim {row.key!r}")
        return Claim(row.key, row.run_id, row.status, row.owner, row.fence, row.lease_until,
                     row.digest, value, row.claimed_at, row.consumed_at, taken_over,
                     row.previous_owner if taken_over else None)

    # ============================================================================ backend methods

    @abstractmethod
    def _close(self) -> None: ...

    @abstractmethod
    def _is_transient(self, exc: BaseException) -> bool:
        """True for errors that a retry may cure: a reset connection, a serialization
        failure, a busy database. Never for constraint or programming errors."""

    @abstractmethod
    def _write_checkpoint(
        self, row: CheckpointRow, blobs: list[BlobRow], exclusive_child: bool,
        chunks: Mapping[bytes, bytes], writes: Sequence[tuple[list[WriteRow], bool]] = (),
    ) -> tuple[int, str | None]:
        """Atomically: (if ``exclusive_child``) find another checkpoint of the run/ns with the
        same parent and kind and a different id -> return ``(0, its_id)`` writing nothing;
        else insert the run's chunks (digest -> bytes) and blobs that are absent, upsert the
        checkpoint (keeping its seq when it exists, else taking the next store-wide seq),
        touch the run, and return ``(seq, None)``. ``writes`` (each a ``_write_writes``
        call's rows and overwrite flag: pending writes against the parent, grouped with
        this checkpoint) are stored in the same transaction, and not at all on a conflict.
        ``row.created_at`` is ignored; the backend stamps its own clock."""

    @abstractmethod
    def _read_chunks(self, run_id: str, digests: list[bytes]) -> dict[bytes, bytes]:
        """The run's chunks among ``digests`` (a missing one is left out)."""

    @abstractmethod
    def _read_checkpoint(self, run_id: str, ns: str, checkpoint_id: str | None,
                         with_writes: bool) -> Found | None:
        """In one consistent read: the checkpoint (latest by seq when id is None), the blob
        of each of its versions and (``with_writes``) its pending writes, ordered by task_id
        then idx (byte order)."""

    @abstractmethod
    def _list_checkpoints(
        self, run_id: str | None, ns: str | None, before: str | None, limit: int | None,
        execution_ids: Sequence[str] | None, with_writes: bool,
    ) -> list[Found]:
        """In one consistent read (a bounded number of queries, whatever the count): the
        checkpoints of :meth:`list_checkpoints`, each as :meth:`_read_checkpoint` gives it."""

    @abstractmethod
    def _write_writes(self, rows: list[WriteRow], overwrite: bool,
                      chunks: Mapping[bytes, bytes]) -> None:
        """Atomically insert the chunks that are absent (all rows are of one run) and the
        rows: replacing rows with the same key when ``overwrite``, else keeping them."""

    @abstractmethod
    def _list_runs(self, limit: int | None) -> list[tuple[RunInfo, RunRow | None, float]]:
        """Every run with a checkpoint, newest first, each with its lifecycle record (None
        when it has none) and the backend's clock."""

    @abstractmethod
    def _delete_run(self, run_id: str) -> None:
        """Delete everything of the run, its chunks included."""

    @abstractmethod
    def _copy_run(self, source: str, target: str) -> None:
        """Copy checkpoints, blobs, writes and chunks."""

    @abstractmethod
    def _prune_run(self, run_id: str, keep_latest: int) -> None:
        """Delete all but the newest ``keep_latest`` checkpoints per ns, their writes,
        blobs no longer referenced by a remaining checkpoint of the run, and chunks no
        longer named by a remaining blob or write of the run."""

    @abstractmethod
    def _delete_executions(self, execution_ids: list[str]) -> None:
        """Delete the checkpoints, then the orphans of each touched run, as prune does."""

    @abstractmethod
    def _usage(self, run_id: str | None) -> dict[str, int]:
        """Keys: checkpoints, blobs, blob_bytes, writes, receipts, claims, chunks,
        chunk_bytes (for one run or all)."""

    @abstractmethod
    def _start_receipt(
        self, key: str, run_id: str, step: str, name: str, ordinal: int, owner: str,
        lease: float, may_take_over: bool,
    ) -> tuple[ReceiptOutcome, ReceiptRow]:
        """One atomic operation taking the decision of
        :func:`remit_core.store.decisions.start_receipt` (its table), with ``now`` the
        backend clock."""

    @abstractmethod
    def _complete_receipt(self, key: str, owner: str, fence: int, result: bytes) -> bool:
        """:data:`~remit_core.store.decisions.COMPLETE_RECEIPT`: set completed+result where
        owner and fence match (or it is already completed by this owner and fence); False
        otherwise."""

    @abstractmethod
    def _release_receipt(self, key: str, owner: str, fence: int) -> bool:
        """:data:`~remit_core.store.decisions.RELEASE_RECEIPT`: delete the receipt where it
        is started and owner and fence match."""

    @abstractmethod
    def _renew_receipt(self, key: str, owner: str, fence: int, lease: float) -> bool:
        """:data:`~remit_core.store.decisions.RENEW_RECEIPT`."""

    @abstractmethod
    def _get_receipt(self, key: str) -> ReceiptRow | None: ...

    @abstractmethod
    def _list_receipts(self, run_id: str | None) -> list[ReceiptRow]: ...

    @abstractmethod
    def _resolve_receipt(self, key: str, result: bytes) -> bool:
        """:data:`~remit_core.store.decisions.RESOLVE_RECEIPT`."""

    @abstractmethod
    def _reset_receipt(self, key: str) -> None: ...

    @abstractmethod
    def _claim(
        self, key: str, run_id: str, owner: str, lease: float, digest: str | None,
        value: bytes | None,
    ) -> tuple[ClaimOutcome, ClaimRow]:
        """One atomic operation taking the decision of
        :func:`remit_core.store.decisions.claim` (its table), with ``now`` the backend
        clock."""

    @abstractmethod
    def _consume_claim(
        self, key: str, owner: str, fence: int, digest: str | None
    ) -> tuple[bool, ClaimRow | None]:
        """One atomic operation taking the decision of
        :func:`remit_core.store.decisions.consume_claim`: set consumed (consumed_at now,
        digest if given) where owner and fence match and it is claimed, or it is already
        consumed by this owner and fence (a retry)."""

    @abstractmethod
    def _release_claim(self, key: str, owner: str, fence: int) -> bool:
        """:data:`~remit_core.store.decisions.RELEASE_CLAIM`."""

    @abstractmethod
    def _renew_claim(self, key: str, owner: str, fence: int, lease: float) -> bool:
        """:data:`~remit_core.store.decisions.RENEW_CLAIM`."""

    @abstractmethod
    def _get_claim(self, key: str) -> ClaimRow | None: ...

    @abstractmethod
    def _list_claims(self, run_id: str | None) -> list[ClaimRow]: ...

    @abstractmethod
    def _list_lapsed_claims(self, framework: str, name: str | None, limit: int,
                            after: tuple[float, str] | None) -> list[ClaimRow]:
        """:meth:`list_lapsed_claims`: ``after`` is (lease_until, key) of the last one."""

    @abstractmethod
    def _start_run(self, run_id: str, framework: str, name: str, owner: str, lease: float,
                   recovery: Recovery | None, likely_new: bool = False
                   ) -> tuple[RunStartOutcome, RunRow | None, float]:
        """:func:`~remit_core.store.decisions.start_run`, in one atomic operation; also
        returns the backend's clock as the decision saw it. ``likely_new``: see
        :meth:`start_run`."""

    @abstractmethod
    def _take_runs(self, framework: str, name: str | None, owner: str, lease: float,
                   recovery: Recovery, limit: int
                   ) -> list[tuple[RunStartOutcome, RunRow, float]]:
        """:meth:`take_runs`, in one atomic operation: each abandoned run chosen decided by
        :func:`~remit_core.store.decisions.start_run` (recovering), with the backend's
        clock as the decision saw it; only the runs taken over or exhausted."""

    @abstractmethod
    def _end_run(self, run_id: str, owner: str, fence: int, status: RunEnd,
                 detail: bytes | None) -> bool:
        """:func:`~remit_core.store.decisions.end_run`, in one atomic operation."""

    @abstractmethod
    def _import_run(self, run_id: str, framework: str, name: str,
                    status: RunEnd | Literal["abandoned"], owner: str,
                    detail: bytes | None, replaces: tuple[int, float] | None = None) -> bool:
        """:func:`~remit_core.store.decisions.import_run`, in one atomic operation."""

    @abstractmethod
    def _renew_run(self, run_id: str, owner: str, fence: int, lease: float) -> bool:
        """:data:`~remit_core.store.decisions.RENEW_RUN`."""

    @abstractmethod
    def _get_run(self, run_id: str) -> tuple[RunRow, float] | None:
        """The lifecycle record and the backend's clock, in one read."""

    @abstractmethod
    def _list_lifecycles(self, query: RunQuery) -> list[tuple[RunInfo, RunRow, float]]:
        """The runs whose lifecycle matches ``query``, newest change first (then run id,
        bytewise), each with its lifecycle record and the backend's clock."""


_STR: frozenset[type] = frozenset({str})


def _text_map(versions: Mapping[Any, Any]) -> dict[str, str]:
    """A version map with ``str`` keys and values (each as its ``str()``): a copy at C
    speed when they are already exactly ``str``, as LangGraph's are (a 200-node graph's
    checkpoint carries a few hundred versions)."""
    if _STR.issuperset(map(type, versions)) and _STR.issuperset(map(type, versions.values())):
        return dict(versions)
    return {str(k): str(v) for k, v in versions.items()}


def _named(code: Callable[..., T], value: Any, record: str, *parts: Any) -> T:
    """``code(value)`` -- the envelope's encode or decode -- naming the record
    (``record.format(*parts)``) in the error if it fails: the name is formatted only then
    (both are deterministic, so the second call fails the same way), not for every value
    of every step."""
    try:
        return code(value)
    except (SerializationError, CorruptRecord):
        return code(value, record=record.format(*parts))


def _cursor(cursor: str | None) -> tuple[float, str] | None:
    """``RunState.cursor`` parsed: (updated_at, run id)."""
    if cursor is None:
        return None
    stamp, sep, run_id = str(cursor).partition("/")
    try:
        if not sep:
            raise ValueError
        return float(stamp), run_id
    except ValueError:
        raise ValueError(f"cursor {cursor!r} is not one that list_runs gave (RunState.cursor)"
                         ) from None


def _iso(t: float) -> str:
    """An epoch time as ISO 8601 UTC, to the second: ``2026-12-01T08:41:00Z``."""
    return dt.datetime.fromtimestamp(t, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _LeaseKeeper:
    """One daemon thread per store that renews registered leases on time."""

    def __init__(self) -> None:
        self._items: dict[int, tuple[Callable[[], bool], float, float]] = {}
        self._next = 0
        self._cond = threading.Condition()
        self._stopped = False
        # when the loop will wake up by itself (monotonic), 0.0 while it is awake: add()
        # wakes it only for an item due earlier, so that a short keep_alive block (an
        # effect, a node) costs no thread switch
        self._wake_at = 0.0
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._loop, name="remit-lease-keeper", daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive() and self._pid == os.getpid() and not self._stopped

    def add(self, renew: Callable[[], bool], period: float) -> int:
        import time

        with self._cond:
            self._next += 1
            due = time.monotonic() + period
            self._items[self._next] = (renew, period, due)
            if due < self._wake_at:
                self._cond.notify()
            return self._next

    def remove(self, token: int) -> None:
        with self._cond:
            self._items.pop(token, None)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _loop(self) -> None:
        import time

        while True:
            with self._cond:
                if self._stopped:
                    return
                now = time.monotonic()
                due = [(t, fn, p) for t, (fn, p, at) in self._items.items() if at <= now]
                for t, fn, p in due:
                    self._items[t] = (fn, p, now + p)
                if not due:
                    nxt = min((at for _, _, at in self._items.values()), default=now + 1.0)
                    self._wake_at = nxt
                    self._cond.wait(timeout=max(0.0, nxt - now))
                    self._wake_at = 0.0
                    continue
            for t, fn, _ in due:
                try:
                    if not fn():
                        self.remove(t)
                except StoreClosed:  # the store closed under its holder: nothing to renew
                    self.remove(t)
                except Exception:  # a failed renewal is retried on the next period
                    log.warning("remit: lease renewal failed", exc_info=True)
