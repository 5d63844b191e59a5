"""The seam between remit-core and its adapters: what an adapter may use, and only that.

An adapter (remit-langgraph, remit-crewai, remit-pydantic-graph, or a third party's)
translates its framework's calls into store operations. From the core it imports
``remit_core`` (the public surface) and this module, nothing else, and no private name
(``tests/test_layering.py`` enforces it, with "the core imports no framework" and
"adapters never import each other"). What is here:

* **Receipt scopes (EO).** An adapter wraps each step in :func:`effect_scope` (or
  registers a :func:`register_scope_resolver` that finds the step from its framework's
  own context); ``@effect`` keys its receipts by the :class:`EffectScope` it finds.
* **Keys.** :func:`claim_key` builds the key of a one-time slot (CO) from the
  framework's name and the parts that identify the slot, escaping each part, so that
  no two slots share a key whatever their parts hold; :func:`split_claim_key` reads one
  back. Receipt keys use the same escaping (:func:`remit_core.effects.receipt_key`).
* **The shared store cache.** :func:`hold_store` gives a :class:`StoreHold` on the one
  store of a URL in this process (one connection pool however many times a framework
  builds its persistence object); the store is closed when its last hold is released
  or collected, and at exit. :func:`borrow_store` holds a store the caller opened
  without ever closing it.
* **Waiting.** :func:`poll` / :func:`apoll`: the one bounded poll with back-off (on
  tenacity) for a fact that another thread or process is about to record.
* **Refusals.** A slot found consumed is refused with
  :meth:`Store.claim_conflict <remit_core.store.Store.claim_conflict>`, the same
  :class:`ConsumeConflict` that :meth:`Store.claim_once` raises.
* **Run lifecycle and recovery.** :func:`keep_run` where an execution of a run starts,
  :meth:`RunKeeper.end` where it ends (:func:`ending` decides the status);
  :func:`recover_runs` / :func:`arecover_runs` find abandoned runs, take each once and
  continue it through the adapter's ``resume`` (:mod:`remit_core.recovery`).
* The records, errors, ids and envelope types an adapter needs, re-exported below.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import contextvars
import os
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_result,
    stop_after_delay,
    wait_exponential,
)

from remit_core import aio
from remit_core.errors import (
    ConsumeConflict,
    CorruptRecord,
    EffectInDoubt,
    LeaseLost,
    RemitError,
    SerializationError,
    StateValidationError,
    StoreConfigError,
    UnregisteredType,
)
from remit_core.ids import derive_id, derive_int, uuid_text, value_digest
from remit_core.migrate import (
    MigrationError,
    MigrationReport,
    RecordsRefused,
    import_lifecycle,
    kept_note,
    left_note,
)
from remit_core.records import Checkpoint, Claim, RunStart, RunState
from remit_core.recovery import (
    DEFAULT_MAX_ATTEMPTS,
    RecoveryReport,
    RunKeeper,
    akeep_run,
    arecover_runs,
    ending,
    error_of,
    keep_run,
    recover_runs,
    recovering,
)
from remit_core.serde import Serde, default_serde
from remit_core.store import Store, new_owner, open_store
from remit_core.urls import mask_url
from remit_core.validation import StateSchema

T = TypeVar("T")

# ============================================================================ receipt scopes


@dataclass
class EffectScope:
    """Where effects are being called: one step of one run, on one store."""

    store: Store
    run_id: str
    step: str
    _ordinals: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def next_ordinal(self, name: str) -> int:
        """EO: the k-th call of effect ``name`` in this step gets ordinal k (0, 1, ...)."""
        with self._lock:
            n = self._ordinals.get(name, 0)
            self._ordinals[name] = n + 1
            return n


_scope: contextvars.ContextVar[EffectScope | None] = contextvars.ContextVar(
    "remit_effect_scope", default=None
)
_resolvers: list[Callable[[], EffectScope | None]] = []


def register_scope_resolver(resolver: Callable[[], EffectScope | None]) -> None:
    """Let an adapter find the current step from its framework's own context.

    Called when no :func:`effect_scope` block is active. A resolver returns the
    scope of the step being executed, or None when it does not recognise the
    context. Registering the same resolver twice has no effect.
    """
    if resolver not in _resolvers:
        _resolvers.append(resolver)


@contextlib.contextmanager
def effect_scope(store: Store, run_id: str, step: str) -> Iterator[EffectScope]:
    """Set the scope for the effects called inside the block (adapters call this per step)."""
    scope = EffectScope(store, run_id, step)
    token = _scope.set(scope)
    try:
        yield scope
    finally:
        _scope.reset(token)


def current_scope() -> EffectScope | None:
    """The scope set by :func:`effect_scope`, else the first one a registered resolver finds."""
    scope = _scope.get()
    if scope is not None:
        return scope
    for resolve in _resolvers:
        scope = resolve()
        if scope is not None:
            return scope
    return None


# ====================================================================================== keys

SEPARATOR = "|"


def escape(part: str) -> str:
    """One part of a key, with ``\\`` and ``|`` escaped by a backslash."""
    return part.replace("\\", "\\\\").replace(SEPARATOR, "\\" + SEPARATOR)


def join_key(*parts: str) -> str:
    """Escaped parts joined by ``|``. Injective: an unescaped ``|`` only ever separates
    parts, so two different tuples of parts never give one key (CO, EO: one slot, one
    receipt)."""
    return SEPARATOR.join(escape(p) for p in parts)


def split_key(key: str) -> tuple[str, ...]:
    """The parts of a key made by :func:`join_key` (its inverse)."""
    parts: list[str] = []
    current: list[str] = []
    chars = iter(key)
    for ch in chars:
        if ch == "\\":
            current.append(next(chars, "\\"))
        elif ch == SEPARATOR:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return tuple(parts)


def claim_key(framework: str, *parts: str) -> str:
    """The key of a one-time slot (CO): ``framework|part|part...``, each part escaped.

    ``framework`` names the adapter (``"langgraph"``, ``"crewai"``, ...), so adapters
    sharing one store never meet each other's slots; ``parts`` identify the slot within
    a run (its run id first). Every adapter, and its migration code, builds claim keys
    here only. Keys stay readable in ``remit inspect``: a part without ``|`` or ``\\``
    appears as it is."""
    if not framework:
        raise ValueError("claim_key needs the adapter's framework name")
    return join_key(framework, *parts)


def split_claim_key(key: str) -> tuple[str, ...]:
    """``(framework, *parts)`` of a key made by :func:`claim_key`."""
    return split_key(key)


# ================================================================================== waiting


def _is_none(value: object) -> bool:
    return value is None


def _gave_up(state: RetryCallState) -> None:
    return None


def _policy(within: float, pause: float, most: float) -> dict[str, Any]:
    return dict(
        retry=retry_if_result(_is_none),
        stop=stop_after_delay(max(within, 0.0)),
        wait=wait_exponential(multiplier=pause, min=pause, max=max(most, pause)),
        retry_error_callback=_gave_up,
        reraise=True,
    )


def poll(check: Callable[[], T | None], *, within: float, pause: float = 0.002,
         most: float = 0.05) -> T | None:
    """Call ``check`` until it returns something other than None, and return that; return
    None when ``within`` seconds passed first.

    For a fact that another thread or process is about to record (a receipt's result,
    a checkpoint becoming durable); never a way to synchronise two steps of one program.
    The first call is made at once, without building a policy (the common case is that
    the fact is there). After it the pause starts at ``pause`` seconds and doubles up to
    ``most`` (tenacity's exponential wait); ``check`` runs once more after ``within``
    has passed, so a wait of 0 is one call. An exception from ``check`` propagates as it
    is, at once."""
    started = time.monotonic()
    first = check()
    if first is not None or within <= 0:
        return first
    seen: list[T | None] = [first]

    def attempt() -> T | None:
        return seen.pop() if seen else check()  # the policy sees the first call too

    left = within - (time.monotonic() - started)
    result: T | None = Retrying(sleep=aio.sleep, **_policy(left, pause, most))(attempt)
    return result


async def apoll(check: Callable[[], Awaitable[T | None]], *, within: float,
                pause: float = 0.002, most: float = 0.05) -> T | None:
    """:func:`poll` for a coroutine ``check``; the pauses are ``asyncio.sleep``."""
    started = time.monotonic()
    first = await check()
    if first is not None or within <= 0:
        return first
    seen: list[T | None] = [first]

    async def attempt() -> T | None:
        return seen.pop() if seen else await check()

    left = within - (time.monotonic() - started)
    result: T | None = await AsyncRetrying(**_policy(left, pause, most))(attempt)
    return result


# ========================================================================= the store cache
#
# Frameworks build their persistence objects often (CrewAI at class definition, from its
# factory and from flow JSON; pydantic-graph one per run), so the objects of one URL share
# one store (one connection pool) per process. Each holds it through a StoreHold. A store
# is closed when its last hold is released: ``release()`` at once, or the collection of
# the hold, carried out by the next acquisition in the process, or at interpreter exit,
# never inside the garbage collector (closing a pool joins its threads, and the collector
# may run on any thread, a pool's own included). A store the caller opened (borrowed) is
# never closed here.

StoreKey = tuple[int, str, float | None, tuple[tuple[str, str], ...]]
"""(process, real URL, lease, store options): one shared store per key."""

_lock = threading.RLock()


@dataclass
class _Shared:
    store: Store
    holds: int = 0


_stores: dict[StoreKey, _Shared] = {}  # the stores opened here, with their hold counts
_borrowed: weakref.WeakValueDictionary[StoreKey, Store] = weakref.WeakValueDictionary()
_real_urls: dict[str, str] = {}  # masked URL -> the URL it was opened with
_collected: collections.deque[tuple[StoreKey, Store]] = collections.deque()


def _key(url: str, lease: float | None, options: dict[str, Any]) -> StoreKey:
    return (os.getpid(), url, lease, tuple(sorted((k, repr(v)) for k, v in options.items())))


class StoreHold:
    """One reference to a store shared in this process (see :func:`hold_store`).

    ``release()`` gives it back (idempotent); so does the garbage collection of the
    hold. Copies of a hold are the hold itself (an object copied with its hold shares
    it). A hold on a borrowed store never closes it."""

    __slots__ = ("__weakref__", "_finalizer", "key", "store")

    def __init__(self, key: StoreKey, store: Store, *, borrowed: bool = False) -> None:
        self.key = key
        self.store = store
        self._finalizer = None if borrowed else weakref.finalize(
            self, _collected.append, (key, store))

    @property
    def released(self) -> bool:
        return self._finalizer is not None and not self._finalizer.alive

    def release(self) -> None:
        if self._finalizer is not None and self._finalizer.detach() is not None:
            _drop(self.key, self.store)
        _drain()

    def __copy__(self) -> StoreHold:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> StoreHold:
        return self

    def __repr__(self) -> str:
        return f"<StoreHold {self.store.url}{' released' if self.released else ''}>"


def hold_store(url: str, *, lease: float | None = None, **options: Any) -> StoreHold:
    """A hold on the store of (this process, ``url``, ``lease``, ``options``), opened on
    first use with :func:`open_store`; a store borrowed under that URL is used instead.

    The store stays open while any hold on it is unreleased."""
    key = _key(url, lease, options)
    with _lock:
        _real_urls[mask_url(url)] = url
        borrowed = _borrowed.get(key)
        if borrowed is not None:
            return StoreHold(key, borrowed, borrowed=True)
        entry = _stores.get(key)
        if entry is None:
            entry = _stores[key] = _Shared(open_store(url, lease=lease, **options))
        entry.holds += 1
        hold = StoreHold(key, entry.store)
    _drain()  # after taking this hold: a store in use here is not closed and reopened
    return hold


def borrow_store(store: Store) -> StoreHold:
    """A hold on a store the caller opened: never closes it. While the store lives,
    :func:`hold_store` of its URL (as :attr:`Store.url` gives it) returns it too."""
    key = _key(store.url, None, {})
    with _lock:
        if key not in _stores:
            _borrowed.setdefault(key, store)
        _real_urls.setdefault(mask_url(store.url), store.url)
    return StoreHold(key, store, borrowed=True)


def known_url(masked: str) -> str | None:
    """The URL a store was held or borrowed with in this process, by its masked form
    (what an adapter may write where a password must not go), else None."""
    with _lock:
        return _real_urls.get(masked)


def _drop(key: StoreKey, store: Store) -> None:
    if key[0] != os.getpid():  # a hold inherited by a forked child: the parent's store
        return
    with _lock:
        entry = _stores.get(key)
        if entry is None or entry.store is not store:
            return
        entry.holds -= 1
        if entry.holds > 0:
            return
        del _stores[key]
    with contextlib.suppress(Exception):
        store.close()


def _drain() -> None:
    while True:
        try:
            key, store = _collected.popleft()
        except IndexError:
            return
        _drop(key, store)


@atexit.register
def _close_all() -> None:
    with _lock:
        mine = [k for k in _stores if k[0] == os.getpid()]
        stores = [_stores.pop(k).store for k in mine]
    for store in stores:
        with contextlib.suppress(Exception):
            store.close()


__all__ = [
    # receipt scopes
    "EffectScope",
    "current_scope",
    "effect_scope",
    "register_scope_resolver",
    # keys
    "claim_key",
    "split_claim_key",
    # the async API: sync code on the event loop, native async I/O
    "aio",
    # waiting
    "apoll",
    "poll",
    # the store cache
    "StoreHold",
    "borrow_store",
    "hold_store",
    "known_url",
    # run lifecycle and recovery
    "DEFAULT_MAX_ATTEMPTS",
    "RecoveryReport",
    "RunKeeper",
    "akeep_run",
    "arecover_runs",
    "ending",
    "error_of",
    "keep_run",
    "recover_runs",
    "recovering",
    # imports from stock layers
    "import_lifecycle",
    "kept_note",
    "left_note",
    # the store, its records, ids and envelope
    "Checkpoint",
    "Claim",
    "RunStart",
    "RunState",
    "Serde",
    "StateSchema",
    "Store",
    "default_serde",
    "derive_id",
    "derive_int",
    "mask_url",
    "new_owner",
    "open_store",
    "uuid_text",
    "value_digest",
    # errors
    "ConsumeConflict",
    "CorruptRecord",
    "EffectInDoubt",
    "LeaseLost",
    "MigrationError",
    "MigrationReport",
    "RecordsRefused",
    "RemitError",
    "SerializationError",
    "StateValidationError",
    "StoreConfigError",
    "UnregisteredType",
]
