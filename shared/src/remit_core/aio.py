"""remit's async API: the sync code, run on the event loop, with native async I/O.

Every operation of remit -- a store operation, an adapter's load or save with its
consume-once gate -- is written once, as sync code. Its coroutine twin runs that same
code with :func:`run`: in a greenlet on the event loop's own thread (no worker thread,
no ``asyncio.to_thread``), where each point that would block on the network instead
awaits the async driver (:func:`wait`): psycopg's ``AsyncConnection`` from an
``AsyncConnectionPool`` on PostgreSQL, ``redis.asyncio`` on Redis. While one operation
waits for its server, the loop runs the others. This is how SQLAlchemy's asyncio
extension shares its engine with the sync one; the contract decisions, the SQL and the
scripts exist once.

SQLite has no async driver: a store operation of an SQLite store, run this way, goes to
the store's own thread pool (as aiosqlite does), not to the loop's default executor.

Code that runs under :func:`run` must not block the thread other than through the store
(or :func:`sleep`): the loop waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any, Generic, ParamSpec, TypeVar

from greenlet import getcurrent, greenlet  # type: ignore[import-untyped]

P = ParamSpec("P")
T = TypeVar("T")
R = TypeVar("R")


class _Bridge(greenlet):  # type: ignore[misc]
    """A greenlet running remit's sync code for a coroutine of ``loop``.

    It serves one :func:`run` after another: between two it waits, parked, among its
    thread's idle bridges (making a greenlet costs several microseconds, a switch a
    fraction of one, and a store operation makes one to three of them)."""

    loop: asyncio.AbstractEventLoop

    def __init__(self) -> None:
        super().__init__(self._serve)

    @staticmethod
    def _serve(job: tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]) -> None:
        while True:  # one job per turn; a parked bridge dies with GreenletExit when dropped
            fn, args, kwargs = job
            del job
            try:
                done: tuple[bool, Any] = (True, fn(*args, **kwargs))
            except BaseException as exc:  # handed to run(), which raises it
                done = (False, exc)
            del fn, args, kwargs
            job = getcurrent().parent.switch(_Done(done))
            del done


class _Done:
    """What a bridge hands back when its job ended: (returned, its result or error)."""

    __slots__ = ("outcome",)

    def __init__(self, outcome: tuple[bool, Any]) -> None:
        self.outcome = outcome


_IDLE_MAX = 64
"""Idle bridges a thread keeps for its next runs (more are made when more run at once)."""

_idle = threading.local()


async def run(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run the sync ``fn`` on this event loop's thread; the store I/O it does awaits the
    async drivers (:func:`wait`), so other tasks run meanwhile. Its context variables are a
    copy of the caller's, as ``asyncio.to_thread`` gives. Cancelling the awaiting task
    raises ``CancelledError`` inside ``fn`` at the I/O it is waiting for, so its ``with``
    and ``finally`` blocks run (a claim is released on cancel as on any exception)."""
    idle: list[_Bridge] | None = getattr(_idle, "bridges", None)
    if idle is None:
        idle = _idle.bridges = []
    here = getcurrent()
    bridge = idle.pop() if idle else _Bridge()
    bridge.parent = here
    bridge.loop = asyncio.get_running_loop()
    bridge.gr_context = contextvars.copy_context()
    result: Any = bridge.switch((fn, args, kwargs))
    while type(result) is not _Done:
        try:
            value = await result
        except BaseException:
            result = bridge.throw(*sys.exc_info())
        else:
            result = bridge.switch(value)
    bridge.gr_context = None
    if len(idle) < _IDLE_MAX and getcurrent() is here:
        idle.append(bridge)
    ok, out = result.outcome
    if not ok:
        try:
            raise out
        finally:
            del out, result
    return out  # type: ignore[no-any-return]


def bridged() -> bool:
    """True inside :func:`run`: I/O must go through :func:`wait`."""
    return isinstance(getcurrent(), _Bridge)


def blocking_the_loop() -> bool:
    """True for sync code running on an event loop's thread outside :func:`run` (say a
    sync function called by an ``async def``): while it runs, no coroutine of that loop
    -- a store write :func:`run` is awaiting included -- makes progress."""
    if bridged():
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def loop() -> asyncio.AbstractEventLoop:
    """The event loop of the :func:`run` this code is in."""
    current = getcurrent()
    if not isinstance(current, _Bridge):
        raise RuntimeError("remit_core.aio.loop() called outside remit_core.aio.run()")
    return current.loop


def wait(awaitable: Awaitable[T]) -> T:
    """Inside :func:`run`: suspend until ``awaitable`` is done, letting the loop run other
    tasks meanwhile, and return its result (or raise its exception)."""
    current = getcurrent()
    if not isinstance(current, _Bridge):
        if asyncio.iscoroutine(awaitable):
            awaitable.close()
        raise RuntimeError("remit_core.aio.wait() called outside remit_core.aio.run()")
    return current.parent.switch(awaitable)  # type: ignore[no-any-return]


def sleep(seconds: float) -> None:
    """``time.sleep``, or, inside :func:`run`, ``asyncio.sleep`` (the loop keeps running)."""
    if bridged():
        wait(asyncio.sleep(seconds))
    else:
        time.sleep(seconds)


class Signal:
    """A one-shot flag that a thread, or sync code under :func:`run`, waits for with a
    timeout, and that any thread sets (a ``threading.Event`` that does not block the loop
    of a coroutine waiting for it).

    A thread waits by acquiring a lock the first waiter made and took (its gate), which
    :meth:`set` releases; each thread that gets through releases it again for the next
    (where a ``threading.Event`` makes a condition, and a lock a wait). Under :func:`run`
    a waiter waits for a future of its loop instead. Both are made by the first waiter
    that needs them: one signal is made per task write awaiting its checkpoint, and under
    :func:`run` the objects live while it waits (on a loop with hundreds of runs, what
    lives across waits is what the garbage collector's full collections walk)."""

    __slots__ = ("_futures", "_gate", "_lock", "_set")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._set = False
        self._gate: threading.Lock | None = None  # held until set, once a thread waits
        self._futures: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] | None \
            = None

    def set(self) -> None:
        with self._lock:
            if self._set:
                return
            self._set = True
            gate, futures, self._futures = self._gate, self._futures, None
        if gate is not None:
            gate.release()
        if not futures:
            return
        try:
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        for owner, future in futures:
            if owner is here:  # set on the waiter's own loop thread: no wake-up needed
                _resolve(future)
                continue
            with contextlib.suppress(RuntimeError):  # its loop closed meanwhile
                owner.call_soon_threadsafe(_resolve, future)

    def wait(self, timeout: float | None) -> bool:
        """True once set; False if ``timeout`` seconds passed first."""
        if not bridged():
            with self._lock:
                if self._set:
                    return True
                gate = self._gate
                if gate is None:
                    gate = self._gate = threading.Lock()
                    gate.acquire()
            if gate.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
                gate.release()  # for the next waiter
                return True
            return self._set
        owner = loop()
        with self._lock:
            if self._set:
                return True
            future: asyncio.Future[None] = owner.create_future()
            if self._futures is None:
                self._futures = []
            self._futures.append((owner, future))
        try:
            wait(_within(future, timeout))
        except TimeoutError:
            return self._set
        return True


async def _within(future: asyncio.Future[None], timeout: float | None) -> None:
    """``future`` awaited for at most ``timeout`` seconds (``asyncio.timeout``: a timer,
    where ``asyncio.wait_for`` also makes a task)."""
    async with asyncio.timeout(timeout):
        await future


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


@contextlib.contextmanager
def entered(manager: AbstractAsyncContextManager[T]) -> Iterator[T]:
    """Inside :func:`run`: an async context manager used as a sync one."""
    value = wait(manager.__aenter__())
    try:
        yield value
    except BaseException as exc:
        if not wait(manager.__aexit__(type(exc), exc, exc.__traceback__)):
            raise
    else:
        wait(manager.__aexit__(None, None, None))


class _Entry(Generic[R]):
    def __init__(self, resource: R) -> None:
        self.resource = resource
        self.ender: Any = None


class PerLoop(Generic[R]):
    """One resource per event loop -- an async connection belongs to the loop that
    opened it --, made on first use inside :func:`run` (``make``), and closed
    (``close``) when its loop ends: when ``asyncio.run`` (or a runner that shuts down the
    loop's async generators) finishes, on :meth:`aclose_current`, or from
    :meth:`close_all` on the loop's own thread. A loop closed some other way drops its
    resource unclosed (its connections went with the loop)."""

    def __init__(self, make: Callable[[], R],
                 close: Callable[[R], Coroutine[Any, Any, None]]) -> None:
        self._make, self._close = make, close
        self._entries: dict[asyncio.AbstractEventLoop, _Entry[R]] = {}
        self._lock = threading.Lock()

    def get(self) -> R:
        """Inside :func:`run`: the running loop's resource."""
        here = loop()
        with self._lock:
            entry = self._entries.get(here)
            if entry is not None:
                return entry.resource
            for gone in [lp for lp in self._entries if lp.is_closed()]:
                del self._entries[gone]
            entry = self._entries[here] = _Entry(self._make())
            entry.ender = self._ender(here, entry)
            first = entry.ender.__anext__()  # the loop now tracks it (firstiter hook)
        wait(first)
        return entry.resource

    async def _ender(self, here: asyncio.AbstractEventLoop, entry: _Entry[R]
                     ) -> AsyncIterator[None]:
        try:
            yield
        finally:
            with self._lock:
                mine = self._entries.get(here) is entry
                if mine:
                    del self._entries[here]
            if mine:
                await self._close(entry.resource)

    async def aclose_current(self) -> None:
        """Close the running loop's resource, if it has one."""
        with self._lock:
            entry = self._entries.pop(asyncio.get_running_loop(), None)
        if entry is not None:
            await self._close(entry.resource)

    def close_all(self) -> None:
        """From a sync close: each loop's resource is closed on its loop -- now if that
        loop runs in another thread, as a task if it is this thread's running loop."""
        with self._lock:
            entries, self._entries = self._entries, {}
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        for lp, entry in entries.items():
            with contextlib.suppress(RuntimeError):
                if lp.is_closed():
                    continue
                if lp is current:
                    lp.create_task(self._close(entry.resource))
                elif lp.is_running():
                    asyncio.run_coroutine_threadsafe(self._close(entry.resource), lp)


async def iterate(items: Iterator[T]) -> AsyncIterator[T]:
    """The items of a sync iterator whose ``next`` does store I/O, each got with
    :func:`run`."""
    done = object()
    while (item := await run(next, items, done)) is not done:
        yield item  # type: ignore[misc]


__all__ = ["PerLoop", "blocking_the_loop", "bridged", "entered", "iterate", "loop", "run", "sleep", "wait"]
