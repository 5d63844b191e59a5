"""Instrumentation for the native-async tests: who would put remit's work on a thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from remit_core import Store


class Threads:
    """Counts the calls that would put remit's work on a thread."""

    def __init__(self) -> None:
        self.to_thread = 0
        self.executor = 0


@pytest.fixture
def threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[Threads]:
    seen = Threads()
    to_thread, run_in_executor = asyncio.to_thread, asyncio.BaseEventLoop.run_in_executor

    async def counting_to_thread(*args: Any, **kwargs: Any) -> Any:
        seen.to_thread += 1
        return await to_thread(*args, **kwargs)

    def counting_executor(self: Any, executor: Any, *args: Any) -> Any:
        seen.executor += 1
        return run_in_executor(self, executor, *args)

    monkeypatch.setattr(asyncio, "to_thread", counting_to_thread)
    monkeypatch.setattr(asyncio.BaseEventLoop, "run_in_executor", counting_executor)
    yield seen


def count_sync_uses(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The threads that take the store's sync connections from now on (the lease
    keeper's renewals do, on their own thread, every third of the lease)."""
    used: list[str] = []
    if store.backend == "postgres":
        owner, name = store._pool, "connection"  # type: ignore[attr-defined]
    elif store.backend == "redis":
        owner, name = store._sync_redis, "execute_command"  # type: ignore[attr-defined]
    else:
        return used
    original = getattr(owner, name)

    def counting(*args: Any, **kwargs: Any) -> Any:
        used.append(threading.current_thread().name)
        return original(*args, **kwargs)
    monkeypatch.setattr(owner, name, counting)
    return used
