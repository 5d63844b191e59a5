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
