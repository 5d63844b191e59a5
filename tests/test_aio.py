"""remit_core.aio.run: sync code on the event loop, in greenlets reused from run to run.

A bridge that served one run serves the next: nothing of the first may reach the second
(context variables, an error, a cancellation), and runs at once each get their own.
"""

from __future__ import annotations

import asyncio
import contextvars
import traceback

import pytest

from remit_core import aio

var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")


async def _later(value: object) -> object:
    await asyncio.sleep(0)
    return value


def _set_and_wait(value: str) -> tuple[str, object]:
    var.set(value)
    got = aio.wait(_later(value))
    return var.get(), got


def test_each_run_sees_a_copy_of_its_callers_context() -> None:
    async def main() -> None:
        var.set("caller")
        assert await aio.run(_set_and_wait, "first") == ("first", "first")
        assert var.get() == "caller"  # the run's change stayed in its copy
        assert await aio.run(var.get) == "caller"  # the reused bridge: the caller's again
        results = await asyncio.gather(*(aio.run(_set_and_wait, str(i)) for i in range(40)))
        assert results == [(str(i), str(i)) for i in range(40)]
    asyncio.run(main())


def test_an_error_reaches_its_caller_with_its_traceback_and_not_the_next_run() -> None:
    def failing() -> None:
        aio.wait(_later(None))
        raise ValueError("boom")

    async def main() -> None:
        with pytest.raises(ValueError, match="boom") as info:
            await aio.run(failing)
        assert "failing" in [f.name for f in traceback.extract_tb(info.value.__traceback__)]
        assert await aio.run(_set_and_wait, "after") == ("after", "after")
    asyncio.run(main())


def test_a_cancelled_run_unwinds_and_its_bridge_serves_again() -> None:
    unwound: list[str] = []

    def waiting() -> None:
        try:
            aio.wait(asyncio.sleep(60))
        finally:
            unwound.append("finally")

    async def main() -> None:
        task = asyncio.create_task(aio.run(waiting))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert unwound == ["finally"]
        assert await aio.run(_set_and_wait, "again") == ("again", "again")
    asyncio.run(main())


def test_runs_at_once_get_bridges_of_their_own_and_wait_outside_a_run_is_refused() -> None:
    seen: list[object] = []

    def which() -> object:
        from greenlet import getcurrent
        me = getcurrent()
        aio.wait(_later(None))
        seen.append(me)
        return me is getcurrent()

    async def main() -> None:
        assert all(await asyncio.gather(*(aio.run(which) for _ in range(10))))
        assert len({id(g) for g in seen}) == 10
        assert not aio.bridged()
    asyncio.run(main())
    with pytest.raises(RuntimeError, match="outside"):
        aio.wait(_later(None))


def test_a_signal_releases_every_thread_waiting_and_every_later_wait() -> None:
    """Threads wait on a gate the first of them made; a set releases them all, each
    passing it on, and a wait after the set returns at once; setting twice is a no-op."""
    import threading

    signal = aio.Signal()
    assert signal.wait(0) is False and signal.wait(0.001) is False  # not set: times out
    waiting = threading.Barrier(6)
    results: list[bool] = []

    def waiter() -> None:
        waiting.wait()
        results.append(signal.wait(None))

    threads = [threading.Thread(target=waiter) for _ in range(5)]
    for t in threads:
        t.start()
    waiting.wait()  # all five are at (or about to be at) their wait
    signal.set()
    signal.set()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert results == [True] * 5
    assert signal.wait(None) is True and signal.wait(0) is True


def test_a_signal_set_from_another_thread_wakes_a_timed_wait_and_a_bridged_one() -> None:
    import threading

    signal = aio.Signal()
    ready = threading.Event()

    def setter() -> None:
        ready.wait()
        signal.set()

    t = threading.Thread(target=setter)
    t.start()
    ready.set()
    assert signal.wait(60) is True
    t.join()

    bridged = aio.Signal()

    def wait_bridged() -> bool:
        threading.Thread(target=bridged.set).start()
        return bridged.wait(60)

    async def main() -> bool:
        return await aio.run(wait_bridged)
    assert asyncio.run(main()) is True
