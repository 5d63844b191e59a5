"""EO: ``@effect``, keyed by the per-step scope that adapters set.

An adapter wraps each step of a run in :func:`~remit_core.adapter.effect_scope` (the
scope lives in :mod:`remit_core.adapter`, the adapters' seam). Inside it, the
k-th call of an effect named ``name`` has the receipt key
``(run_id, step, name, k)``, which is the same in every process that executes
that step, so:

* the first call runs the function and records its result (two phases:
  ``started``, then ``completed``), under a lease renewed while it runs;
* every later call with that key (after an interrupt, an exception elsewhere,
  a SIGKILL, or from a racing process) returns the recorded result;
* a racer that finds the receipt started by a live owner waits, bounded, for
  the result (:func:`~remit_core.adapter.poll`), and never runs the function itself;
* a receipt whose owner died mid-call is in doubt: the function is re-called
  with the same ``idempotency_key`` when it accepts one (or with
  ``on_in_doubt="retry"``), else :class:`EffectInDoubt` is raised;
* a call that raises leaves no receipt: the next call runs it again;
* outside any scope the function runs as a plain call (a function that takes
  ``idempotency_key`` gets a fresh one), with a one-line warning.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import threading
import typing
import uuid
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Literal, ParamSpec, TypeVar, overload

from remit_core import aio
from remit_core.adapter import (
    EffectScope,
    apoll,
    current_scope,
    effect_scope,
    join_key,
    poll,
    register_scope_resolver,
)
from remit_core.adapter import _resolvers as _resolvers  # (the same registry, as before)
from remit_core.errors import ConsumeConflict, EffectInDoubt
from remit_core.records import ReceiptStart
from remit_core.store import new_owner

log = logging.getLogger("remit")

P = ParamSpec("P")
R = TypeVar("R")

InDoubtPolicy = Literal["raise", "retry"]

_warned: set[str] = set()

FIRST_PAUSE = 0.01
"""Seconds a racer first waits for a live owner's result; the pause doubles up to LONGEST_PAUSE."""
LONGEST_PAUSE = 0.25


def receipt_key(run_id: str, step: str, name: str, ordinal: int) -> str:
    """The receipt key, which is also the idempotency key handed to the function (its
    parts escaped as in every remit key, :func:`remit_core.adapter.claim_key`)."""
    return join_key(run_id, step, name, str(ordinal))


def _accepts_key(fn: Callable[..., Any]) -> bool:
    try:
        return "idempotency_key" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class _Call:
    """The decision of one effect call, shared by the sync and async paths."""

    def __init__(self, scope: EffectScope, name: str, takes_key: bool,
                 on_in_doubt: InDoubtPolicy, wait: float | None) -> None:
        self.scope = scope
        self.store = scope.store
        self.name = name
        self.takes_key = takes_key
        self.may_take_over = takes_key or on_in_doubt == "retry"
        self.ordinal = scope.next_ordinal(name)
        self.key = receipt_key(scope.run_id, scope.step, name, self.ordinal)
        self.wait = wait if wait is not None else 2 * self.store.lease
        self.busy: ReceiptStart | None = None  # the last receipt found started by a live owner

    def start_kwargs(self, owner: str) -> dict[str, Any]:
        return dict(run_id=self.scope.run_id, step=self.scope.step, name=self.name,
                    ordinal=self.ordinal, owner=owner, may_take_over=self.may_take_over)

    def decide(self, owner: str, st: ReceiptStart) -> tuple[str, ReceiptStart] | None:
        """``(owner, start)`` to call the function (``run``, ``taken_over``) or return the
        recorded result (``done``); None while a live owner is calling it (a racer waits,
        and never calls it itself)."""
        if st.outcome == "done":
            return owner, st
        if st.outcome in ("run", "taken_over"):
            if st.outcome == "taken_over":
                # the receipt now names the caller: the dead owner comes with the take-over
                log.warning("remit: effect %s: owner %s died mid-call (its lease expired); "
                            "taken over by %s, which re-calls it with idempotency key %r",
                            self.key, st.previous_owner or "(unknown)", st.receipt.owner,
                            self.key)
            return owner, st
        r = st.receipt
        if st.outcome == "in_doubt":
            raise EffectInDoubt(
                f"effect {self.name!r} (key {self.key!r}) was started by {r.owner!r}, which "
                "died before recording its result; remit cannot tell whether it happened. "
                "Check the outside system for this key, then Store.resolve_receipt(key, "
                "result) or Store.reset_receipt(key). Give the function an idempotency_key "
                "parameter (or @effect(on_in_doubt='retry')) to have remit re-call it.",
                key=self.key, run_id=self.scope.run_id, step=self.scope.step, name=self.name,
                owner=r.owner, started_at=r.started_at,
            )
        self.busy = st
        return None

    def attempt(self) -> tuple[str, ReceiptStart] | None:
        owner = new_owner()
        return self.decide(owner, self.store.start_receipt(self.key, **self.start_kwargs(owner)))

    async def aattempt(self) -> tuple[str, ReceiptStart] | None:
        owner = new_owner()
        return self.decide(owner, await self.store.astart_receipt(
            self.key, **self.start_kwargs(owner)))

    def gave_up(self) -> ConsumeConflict:
        """The refusal after the wait: the live owner did not finish within it."""
        assert self.busy is not None
        r = self.busy.receipt
        return ConsumeConflict(
            f"effect {self.name!r} (key {self.key!r}) is being called by {r.owner!r}, "
            "which did not finish within the wait; it was not called again here. "
            "Retry later: the recorded result will be returned.",
            key=self.key, run_id=self.scope.run_id, step=self.scope.step, owner=r.owner,
            status=r.status,
        )

    def renewer(self, owner: str, fence: int) -> Callable[[], bool]:
        return lambda: self.store.renew_receipt(self.key, owner=owner, fence=fence)

    def kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        if self.takes_key and "idempotency_key" not in kwargs:
            return {**kwargs, "idempotency_key": self.key}
        return kwargs


def _unscoped_kwargs(takes_key: bool, kwargs: dict[str, Any]) -> dict[str, Any]:
    """A plain call still gets an idempotency key (a fresh one: there is no receipt)."""
    if takes_key and "idempotency_key" not in kwargs:
        return {**kwargs, "idempotency_key": f"unscoped-{uuid.uuid4()}"}
    return kwargs


#: the resolved return annotation of each function an effect wraps, for as long as the
#: function lives: weak keys, so that a function made per call (a closure over the
#: caller's objects) is not kept alive by this cache, nor what it closes over
_ANNOTATIONS: weakref.WeakKeyDictionary[Callable[..., Any], Any] = weakref.WeakKeyDictionary()
_ANNOTATIONS_LOCK = threading.Lock()


def _result_annotation(func: Callable[..., Any]) -> Any:
    """The return annotation of ``func`` (None if it has none or it does not resolve)."""
    try:
        return _ANNOTATIONS[func]
    except (KeyError, TypeError):  # (TypeError: a callable without weak references)
        pass
    try:
        found = typing.get_type_hints(func).get("return")
    except Exception:
        found = None
    with _ANNOTATIONS_LOCK, contextlib.suppress(TypeError):
        _ANNOTATIONS[func] = found
    return found


def _warn_unscoped(name: str) -> None:
    if name not in _warned:
        _warned.add(name)
        log.warning("remit: effect %r called outside a remit step; it ran as a plain call "
                    "with no receipt", name)


@overload
def effect(fn: Callable[P, R], /) -> Callable[P, R]: ...


@overload
def effect(
    *, name: str | None = None, on_in_doubt: InDoubtPolicy = "raise", wait: float | None = None
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def effect(
    fn: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    on_in_doubt: InDoubtPolicy = "raise",
    wait: float | None = None,
) -> Any:
    """Declare a function with consequences outside the store (EO).

    Use bare (``@effect``) or with options: ``name`` (default: the function's
    qualified name; keep it stable across deployments), ``on_in_doubt``
    (``"raise"`` or ``"retry"``) and ``wait`` (seconds a racer waits for a live
    owner's result; default twice the store's lease). Works on sync and async
    functions. The result must be storable by the envelope.
    """
    if on_in_doubt not in ("raise", "retry"):
        raise ValueError(f"on_in_doubt must be 'raise' or 'retry', not {on_in_doubt!r}")

    def wrap(func: Callable[P, R]) -> Callable[P, R]:
        ename = name or f"{func.__module__}.{func.__qualname__}"
        takes_key = _accepts_key(func)

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                # on the loop: a resolver may read the store (the step's checkpoint)
                scope = await aio.run(current_scope)
                if scope is None:
                    _warn_unscoped(ename)
                    return await func(*args, **_unscoped_kwargs(takes_key, kwargs))
                call = _Call(scope, ename, takes_key, on_in_doubt, wait)
                store = call.store
                # a receipt recorded by another process decodes here: allow its classes
                store.serde.allow_annotations(_result_annotation(func))
                found = await apoll(call.aattempt, within=call.wait, pause=FIRST_PAUSE,
                                    most=LONGEST_PAUSE)
                if found is None:
                    raise call.gave_up()
                owner, st = found
                if st.outcome == "done":
                    return st.receipt.result
                fence = st.receipt.fence
                with store.keep_alive(call.renewer(owner, fence)):
                    try:
                        result = await func(*args, **call.kwargs(kwargs))
                    except BaseException:
                        await store.arelease_receipt(call.key, owner=owner, fence=fence)
                        raise
                await store.acomplete_receipt(call.key, owner=owner, fence=fence,
                                              result=result)
                return result

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            scope = current_scope()
            if scope is None:
                _warn_unscoped(ename)
                return func(*args, **_unscoped_kwargs(takes_key, kwargs))
            call = _Call(scope, ename, takes_key, on_in_doubt, wait)
            store = call.store
            store.serde.allow_annotations(_result_annotation(func))  # (as above)
            found = poll(call.attempt, within=call.wait, pause=FIRST_PAUSE, most=LONGEST_PAUSE)
            if found is None:
                raise call.gave_up()
            owner, st = found
            if st.outcome == "done":
                return st.receipt.result
            fence = st.receipt.fence
            with store.keep_alive(call.renewer(owner, fence)):
                try:
                    result = func(*args, **call.kwargs(kwargs))
                except BaseException:
                    store.release_receipt(call.key, owner=owner, fence=fence)
                    raise
            store.complete_receipt(call.key, owner=owner, fence=fence, result=result)
            return result

        return sync_wrapper

    if fn is not None:
        return wrap(fn)
    return wrap


AsyncFn = Callable[..., Awaitable[Any]]


__all__ = ["AsyncFn", "EffectScope", "InDoubtPolicy", "current_scope", "effect", "effect_scope",
           "receipt_key", "register_scope_resolver"]
