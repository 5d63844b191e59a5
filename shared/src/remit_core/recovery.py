"""Runs kept in the store's lifecycle by the adapters, and recovered without a person.

Two halves, written once here for every adapter:

* **Keeping** (:func:`keep_run`): an adapter calls it where one execution of a run
  starts (a LangGraph invocation entering, a CrewAI kickoff, a pydantic-graph run) and
  ends it with :meth:`RunKeeper.end`. The run is ``running`` with a lease renewed in the
  background, one round trip per third of the lease, never one per step; at the end it
  is ``parked`` (what it waits for), ``done``, ``failed`` (the error's type and
  message) or ``needs-attention`` (an effect in doubt: its receipt key). How an
  exception maps to an end is decided once, in :func:`ending`.
* **Recovering** (:func:`recover_runs`, :func:`arecover_runs`): take the abandoned runs
  of one framework (and one graph or flow name) a batch at a time with
  :meth:`Store.take_runs <remit_core.store.Store.take_runs>` (of k recoverers taking at
  once, across processes and hosts, exactly one takes a run, and none waits for or
  races over a run another is taking) and continue each the framework's own way
  through the ``resume`` the adapter gives. Failed runs (when retrying) and runs whose
  in-doubt effect was settled are listed and taken one by one
  (:meth:`Store.recover_run <remit_core.store.Store.recover_run>`). The execution it starts is the
  recoverer's own: :func:`keep_run` inside ``resume`` finds the run taken in this
  context and continues under the recoverer's owner and fence instead of starting over.
  A :class:`RecoveryReport` says what happened to each run.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import random
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from remit_core import aio
from remit_core.errors import EffectInDoubt, RemitError
from remit_core.records import RunEnd, RunStart, RunState
from remit_core.store import Store, new_owner

log = logging.getLogger("remit.recovery")

#: executions a recovery gives a run, its first included, before it stops recovering it
DEFAULT_MAX_ATTEMPTS = 10
#: the most characters of an exception's message kept as a failed run's error
MESSAGE_LIMIT = 2000


# ============================================================================ how a run ends


def error_of(exc: BaseException) -> dict[str, str]:
    """What a failed run keeps of the exception that ended it: its type (qualified) and
    message (at most :data:`MESSAGE_LIMIT` characters)."""
    cls = type(exc)
    kind = cls.__qualname__ if cls.__module__ == "builtins" else \
        f"{cls.__module__}.{cls.__qualname__}"
    message = str(exc)
    if len(message) > MESSAGE_LIMIT:
        message = message[:MESSAGE_LIMIT] + "..."
    return {"type": kind, "message": message}


def in_doubt(exc: BaseException) -> EffectInDoubt | None:
    """The :class:`EffectInDoubt` that ended an execution, looked for through the
    exception's causes and contexts (frameworks wrap a node's exception in their own)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, EffectInDoubt):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def ending(exc: BaseException | None, waiting: Any = None, *, parked: bool = False
           ) -> tuple[RunEnd, Any]:
    """How one execution of a run ends, and the detail kept with it (the one rule).

    * no exception, ``parked``: ``parked``, with ``waiting`` (what it waits for);
    * no exception: ``done``;
    * an :class:`EffectInDoubt` (or one wrapping it): ``needs-attention``, with the
      receipt key, the effect, its step and the message: a person settles it with
      ``remit effects resolve``, then a recovery continues the run;
    * any other exception (a cancel and a closed generator included: the run did not
      finish): ``failed``, with :func:`error_of` it. A failed run is recovered only when
      asked (``retry_failed``).
    """
    if exc is None:
        return ("parked", waiting) if parked else ("done", None)
    doubt = in_doubt(exc)
    if doubt is not None:
        return "needs-attention", {"receipt": doubt.key, "effect": doubt.name,
                                   "step": doubt.step, "message": str(doubt)}
    return "failed", error_of(exc)


# ================================================================================= keeping

@dataclass
class _Taken:
    """A run a recoverer took, as the context continuing it knows it."""

    start: RunStart
    #: the adapter's keeper recorded the run's end (the recoverer need not)
    ended: bool = False


# the runs this context recovers: run id -> what took it (its owner and fence)
_taken: contextvars.ContextVar[dict[str, _Taken] | None] = contextvars.ContextVar(
    "remit_recovering", default=None)


@contextlib.contextmanager
def recovering(start: RunStart) -> Iterator[_Taken]:
    """The block continues the run ``start`` took: :func:`keep_run` of that run inside it
    is the recoverer's execution (its owner and fence), not a new start. Yields the
    record of it, whose ``ended`` says whether that execution recorded the run's end."""
    assert start.run is not None
    held = _Taken(start)
    token = _taken.set({**(_taken.get() or {}), start.run.run_id: held})
    try:
        yield held
    finally:
        _taken.reset(token)


@dataclass
class RunKeeper:
    """One execution of one run in the lifecycle: started by :func:`keep_run`, renewed in
    the background while it works, ended once by :meth:`end`.

    ``owns`` is False when another executor's lease on the run is live (the run is being
    executed elsewhere right now): this execution then records nothing, and its end is a
    no-op; the contract's own gates (claims, receipts) still decide what it may do."""

    store: Store
    run_id: str
    start: RunStart
    owner: str
    #: set when this is the execution a recoverer continues (:func:`recovering`)
    _recovery: _Taken | None = None
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    _ended: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def owns(self) -> bool:
        return self.start.owns

    @property
    def recovered(self) -> bool:
        """This is the execution a recoverer continues."""
        return self._recovery is not None

    @property
    def fence(self) -> int:
        return 0 if self.start.run is None else self.start.run.fence

    def end(self, exc: BaseException | None = None, *, parked: bool = False,
            waiting: Any = None) -> RunEnd | None:
        """Record how the execution ended (see :func:`ending`); stop renewing. Once: a
        second call does nothing. Returns the status recorded, None when nothing was
        (the keeper does not own the run, it ended already, or a later executor took the
        run over). A store that cannot be reached is logged, not raised: the app's own
        result or exception goes on, and the run, left running, becomes abandoned when
        its lease runs out, so that a recovery continues it."""
        with self._lock:
            if self._ended:
                return None
            self._ended = True
        self._stack.close()
        if not self.owns:
            return None
        status, detail = ending(exc, waiting, parked=parked)
        try:
            recorded = self._record(status, detail)
        except RemitError:
            log.warning("remit: run %s: could not record its end (%s); it reads as "
                        "abandoned once its lease runs out", self.run_id, status,
                        exc_info=True)
            return None
        if not recorded:
            log.warning("remit: run %s was taken over by another executor before this "
                        "one (%s) recorded its end (%s); that one's record stands",
                        self.run_id, self.owner, status)
            return None
        if self._recovery is not None:
            self._recovery.ended = True
        return status

    def _record(self, status: RunEnd, detail: Any) -> bool:
        try:
            return self.store.end_run(self.run_id, owner=self.owner, fence=self.fence,
                                      status=status, waiting=detail, error=detail)
        except RemitError as exc:
            if status not in ("parked", "failed", "needs-attention") or detail is None:
                raise
            # what it waits for or failed with could not be encoded: the end still counts
            log.warning("remit: run %s: its %s detail could not be stored (%s)", self.run_id,
                        status, exc)
            return self.store.end_run(self.run_id, owner=self.owner, fence=self.fence,
                                      status=status,
                                      waiting={"unreadable": repr(detail)[:MESSAGE_LIMIT]},
                                      error={"type": "unreadable",
                                             "message": repr(detail)[:MESSAGE_LIMIT]})

    def close(self) -> None:
        """Stop renewing without recording an end (the run reads as abandoned once its
        lease runs out)."""
        with self._lock:
            self._ended = True
        self._stack.close()


def keep_run(store: Store, run_id: str, *, framework: str, name: str,
             lease: float | None = None, likely_new: bool = False) -> RunKeeper:
    """Start keeping one execution of run ``run_id`` (see the module's docstring), with a
    lease of ``lease`` seconds (default: the store's), renewed every third of it.
    ``likely_new``: the adapter found nothing stored for the run (see
    :meth:`Store.start_run <remit_core.store.Store.start_run>`).

    Inside :func:`recovering` of the same run this is the recoverer's execution: it
    re-enters under the recoverer's owner (the recoverer renews the lease). Otherwise it
    starts the run (a new one, or one parked, done or failed before) with a new owner
    and renews its lease every third of it, or takes over a run whose executor's lease
    expired (logged with both owners)."""
    held = _taken.get()
    recovery = None if held is None else held.get(run_id)
    if recovery is not None and recovery.start.run is not None:
        # the recoverer took the run in this context: its execution, under its owner and
        # fence, renewed by the recoverer (no round trip to find that out again)
        run = recovery.start.run
        assert run.owner is not None
        return RunKeeper(store, run_id, RunStart("reentered", run), run.owner,
                         _recovery=recovery)
    owner = new_owner()
    start = store.start_run(run_id, framework=framework, name=name, owner=owner, lease=lease,
                            likely_new=likely_new)
    keeper = RunKeeper(store, run_id, start, owner)
    if start.outcome == "taken_over":
        log.warning("remit: run %s: %s takes over from %s, whose lease expired", run_id,
                    owner, start.previous_owner)
    elif start.outcome == "busy":
        log.info("remit: run %s is being executed by %s (lease live); this execution is "
                 "not recorded in its lifecycle", run_id,
                 start.run.owner if start.run else "?")
    if start.owns:
        keeper._stack.enter_context(store.keep_alive(functools.partial(
            store.renew_run, run_id, owner=owner, fence=keeper.fence, lease=lease),
            lease=lease))
    return keeper


async def akeep_run(store: Store, run_id: str, *, framework: str, name: str,
                    lease: float | None = None, likely_new: bool = False) -> RunKeeper:
    """:func:`keep_run` from a coroutine (its store I/O awaits the async driver)."""
    return await aio.run(keep_run, store, run_id, framework=framework, name=name,
                         lease=lease, likely_new=likely_new)


# ============================================================================== recovering


@dataclass
class RecoveryReport:
    """What one recovery pass did, run by run."""

    #: continued to an end: done, or parked again (waiting for a person)
    recovered: list[str] = field(default_factory=list)
    #: the continuation raised: run id -> the error (type: message)
    failed: dict[str, str] = field(default_factory=dict)
    #: found, but another recoverer took it first, or it was no longer abandoned
    skipped: list[str] = field(default_factory=list)
    #: stopped on an effect in doubt: run id -> the receipt key to settle
    attention: dict[str, str] = field(default_factory=dict)
    #: not taken: it had max_attempts executions (an abandoned one is recorded failed)
    exhausted: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return (len(self.recovered) + len(self.failed) + len(self.skipped)
                + len(self.attention) + len(self.exhausted))

    def merge(self, other: RecoveryReport) -> None:
        self.recovered += other.recovered
        self.failed.update(other.failed)
        self.skipped += other.skipped
        self.attention.update(other.attention)
        self.exhausted += other.exhausted

    def __str__(self) -> str:
        return (f"{len(self.recovered)} recovered, {len(self.failed)} failed, "
                f"{len(self.attention)} need attention, {len(self.skipped)} skipped, "
                f"{len(self.exhausted)} exhausted")


@dataclass(frozen=True)
class _Pass:
    store: Store
    framework: str
    name: str | None
    owner: str
    lease: float | None
    retry_failed: bool
    max_attempts: int
    page: int
    stop: threading.Event | None


def _settled(store: Store, run: RunState) -> bool:
    """A run needing attention may go on: the receipt it waited for was resolved (it has
    a result) or reset (the effect runs again)."""
    key = run.waiting.get("receipt") if isinstance(run.waiting, dict) else None
    if not isinstance(key, str):
        return False
    receipt = store.get_receipt(key)
    return receipt is None or receipt.status == "completed"


def _listed(p: _Pass, seen: set[str]) -> list[tuple[RunState, bool]]:
    """The runs a pass takes one by one, after the abandoned ones: failed ones when
    retrying, then those needing attention whose receipt was settled; none already tried
    in this pass. (A pass retries a run once: a run that failed again stays failed.)"""
    found: list[tuple[RunState, bool]] = []
    for status in ["failed", "needs-attention"] if p.retry_failed else ["needs-attention"]:
        for info in p.store.list_runs(status=status,  # type: ignore[arg-type]
                                      framework=p.framework, name=p.name, limit=p.page):
            run = info.lifecycle
            if run is None or run.run_id in seen:
                continue
            if status == "needs-attention" and not _settled(p.store, run):
                continue
            found.append((run, status == "needs-attention"))
    return found


def _exhausted(run: RunState, report: RecoveryReport) -> None:
    report.exhausted.append(run.run_id)
    log.warning("remit: run %s (%s %s) is not recovered again: it had %d executions "
                "(max_attempts)", run.run_id, run.framework, run.name, run.attempts)


def _batch(p: _Pass, n: int, report: RecoveryReport) -> list[RunStart]:
    """Take up to ``n`` abandoned runs at once (:meth:`Store.take_runs`: the runs other
    recoverers are taking are passed over, not raced for); those whose attempts were
    spent are reported exhausted."""
    taken = []
    for start in p.store.take_runs(framework=p.framework, name=p.name, owner=p.owner,
                                   limit=n, lease=p.lease, max_attempts=p.max_attempts):
        if start.outcome == "exhausted" and start.run is not None:
            _exhausted(start.run, report)
        elif start.owns and start.run is not None:
            taken.append(start)
    return taken


def _take(p: _Pass, run: RunState, attention: bool, report: RecoveryReport) -> RunStart | None:
    start = p.store.recover_run(run.run_id, owner=p.owner, lease=p.lease,
                                retry_failed=p.retry_failed, attention=attention,
                                max_attempts=p.max_attempts)
    if start.outcome == "exhausted":
        _exhausted(run, report)
        return None
    if not start.owns or start.run is None:
        report.skipped.append(run.run_id)
        return None
    return start


#: what a pass continues next: a run it took in a batch, or a listed one it takes itself
_Next = RunStart | tuple[RunState, bool]


def _next(p: _Pass, seen: set[str], limit: int | None, n: int, report: RecoveryReport
          ) -> list[_Next]:
    """The next at most ``n`` runs to continue (fewer when ``limit`` is near): abandoned
    ones taken in one batch, else the listed ones (:func:`_listed`) in a random order, so
    that recoverers listing the same runs do not all race for the first one."""
    if p.stop is not None and p.stop.is_set():
        return []
    if limit is not None:
        n = min(n, limit - len(seen))
    if n < 1:
        return []
    taken = _batch(p, n, report)
    if taken:
        seen.update(start.run.run_id for start in taken if start.run is not None)
        return list(taken)
    listed = _listed(p, seen)
    batch = random.sample(listed, len(listed))[:n]
    seen.update(run.run_id for run, _ in batch)
    return list(batch)


def _settle(p: _Pass, start: RunStart, exc: BaseException | None, ended: bool,
            report: RecoveryReport) -> None:
    """Record the outcome of one continued run, unless the adapter's keeper recorded the
    run's end already (``ended``: the execution got that far)."""
    assert start.run is not None
    run_id = start.run.run_id
    status, detail = ending(exc)
    if not ended:
        with contextlib.suppress(RemitError):
            p.store.end_run(run_id, owner=p.owner, fence=start.run.fence, status=status,
                            waiting=detail, error=detail)
    if exc is None:
        report.recovered.append(run_id)
        log.info("remit: recovered run %s (%s %s)", run_id, start.run.framework, start.run.name)
    elif status == "needs-attention":
        report.attention[run_id] = detail["receipt"]
        log.warning("remit: run %s needs attention: effect receipt %s is in doubt; settle it "
                    "with `remit effects resolve`", run_id, detail["receipt"])
    else:
        report.failed[run_id] = f"{detail['type']}: {detail['message']}"
        log.warning("remit: run %s failed in recovery: %s", run_id, report.failed[run_id])


def _renewing(p: _Pass, start: RunStart) -> contextlib.AbstractContextManager[None]:
    assert start.run is not None
    return p.store.keep_alive(functools.partial(
        p.store.renew_run, start.run.run_id, owner=p.owner, fence=start.run.fence),
        lease=p.lease)


def _one(p: _Pass, item: _Next, resume: Callable[[RunState], Any]) -> RecoveryReport:
    report = RecoveryReport()
    start = item if isinstance(item, RunStart) else _take(p, *item, report)
    if start is None:
        return report
    assert start.run is not None
    exc: BaseException | None = None
    with _renewing(p, start), recovering(start) as held:
        try:
            resume(start.run)
        except Exception as e:  # the run's failure is reported, not the pass's
            exc = e
    _settle(p, start, exc, held.ended, report)
    return report


async def _aone(p: _Pass, item: _Next, resume: Callable[[RunState], Awaitable[Any]]
                ) -> RecoveryReport:
    report = RecoveryReport()
    start = item if isinstance(item, RunStart) else \
        await aio.run(_take, p, *item, report)
    if start is None:
        return report
    assert start.run is not None
    exc: BaseException | None = None
    with _renewing(p, start), recovering(start) as held:
        try:
            await resume(start.run)
        except Exception as e:
            exc = e
    await aio.run(_settle, p, start, exc, held.ended, report)
    return report


#: (store, threads) whose capacity was checked already in this process
_checked: weakref.WeakKeyDictionary[Store, set[int]] = weakref.WeakKeyDictionary()


def _check_capacity(store: Store, threads: int) -> None:
    """Warn, once per store and number of threads, where the store cannot serve the
    recovery's threads (:meth:`Store.capacity_warnings`)."""
    done = _checked.setdefault(store, set())
    if threads in done:
        return
    done.add(threads)
    for warning in store.capacity_warnings(threads=threads):
        log.warning("remit: %s", warning)


def _pass(store: Store, framework: str, name: str | None, owner: str | None,
          lease: float | None, retry_failed: bool, max_attempts: int, page: int,
          stop: threading.Event | None, concurrency: int) -> _Pass:
    if not framework:
        raise ValueError("recover_runs needs the adapter's framework name")
    if page < 1:
        raise ValueError(f"page must be 1 or more, not {page}")
    _check_capacity(store, max(1, concurrency))
    return _Pass(store, framework, name, owner or new_owner(), lease, retry_failed,
                 max_attempts, page, stop)


def recover_runs(store: Store, resume: Callable[[RunState], Any], *, framework: str,
                 name: str | None = None, limit: int | None = None, concurrency: int = 1,
                 owner: str | None = None, lease: float | None = None,
                 retry_failed: bool = False, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
                 page: int = 100, stop: threading.Event | None = None) -> RecoveryReport:
    """Recover the abandoned runs of ``framework`` (and graph or flow ``name``): take them
    ``concurrency`` at a time in one batch (exactly one recoverer takes a run) and call
    ``resume(run)`` on each, which continues it the framework's way, in ``concurrency``
    threads; at most ``limit`` runs (None: until none is left).

    ``retry_failed`` also retries failed runs (each once per pass; ``page``: how many are
    listed at a time); runs needing attention are continued once their receipt is
    settled. A run is given at most ``max_attempts`` executions (0: no
    bound). ``owner`` names this recoverer in the store (default: a new owner token).
    Once ``stop`` is set no further run is taken; the runs being continued finish.
    An exception from ``resume`` is the run's (reported, and recorded as its end); an
    error of the store itself propagates."""
    p = _pass(store, framework, name, owner, lease, retry_failed, max_attempts, page, stop,
              concurrency)
    report = RecoveryReport()
    seen: set[str] = set()
    pool = ThreadPoolExecutor(concurrency, thread_name_prefix="remit-recover") \
        if concurrency > 1 else None
    try:
        while batch := _next(p, seen, limit, max(1, concurrency), report):
            if pool is None:
                results: Iterable[RecoveryReport] = [_one(p, item, resume) for item in batch]
            else:
                futures = [pool.submit(contextvars.copy_context().run, _one, p, item, resume)
                           for item in batch]
                results = [f.result() for f in futures]
            for r in results:
                report.merge(r)
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    return report


async def arecover_runs(store: Store, resume: Callable[[RunState], Awaitable[Any]], *,
                        framework: str, name: str | None = None, limit: int | None = None,
                        concurrency: int = 1, owner: str | None = None,
                        lease: float | None = None, retry_failed: bool = False,
                        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
                        page: int = 100, stop: threading.Event | None = None
                        ) -> RecoveryReport:
    """:func:`recover_runs` for a coroutine ``resume``; ``concurrency`` runs at a time as
    tasks of the running event loop."""
    p = _pass(store, framework, name, owner, lease, retry_failed, max_attempts, page, stop,
              concurrency)
    report = RecoveryReport()
    seen: set[str] = set()

    while batch := await aio.run(_next, p, seen, limit, max(1, concurrency), report):
        for r in await asyncio.gather(*(_aone(p, item, resume) for item in batch)):
            report.merge(r)
    return report


__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "RecoveryReport",
    "RunKeeper",
    "akeep_run",
    "arecover_runs",
    "ending",
    "error_of",
    "in_doubt",
    "keep_run",
    "recover_runs",
    "recovering",
]
