"""Group commit: a step's last pending writes and the checkpoint after it, in one commit.

A framework loop stores what a step's tasks wrote (pending writes, against the step's
checkpoint), then the checkpoint the step produced (its child). Stored apart, that is two
durable commits per step. When the loop announces, before it hands the writes to the
store, that the writes of a task are the last its step makes
(:meth:`Store.expect_writes <remit_core.store.Store.expect_writes>`), the store holds
them back for a moment and commits them in the transaction of the child checkpoint.

What stays guaranteed:

* a task's writes are durable no later than the checkpoint that follows them (they are in
  its transaction, or were committed before it);
* ``put_writes`` still returns only once its writes are durable;
* writes that no checkpoint takes within :data:`WAIT` seconds (the step stopped on an
  interrupt or an error, or its checkpoint write was refused or failed) are committed on
  their own, as without grouping. A checkpoint that finds announced writes not yet handed
  over waits at most as long for them, then goes without them, and they are committed on
  their own when they arrive.

Only writes a loop announced are held; any other ``put_writes`` commits at once.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from typing import Literal

from remit_core import aio
from remit_core.records import WriteRow

WAIT = 0.05
"""Seconds announced writes wait for their checkpoint (and a checkpoint for them)."""

STALE = 60.0
"""Seconds after which an announcement nothing came for is forgotten."""

Key = tuple[str, str, str]
"""(run id, namespace, checkpoint id) of the checkpoint the writes are against."""


@dataclasses.dataclass(eq=False)
class Expected:
    """One task's announced writes, from the announcement to their commit."""

    state: Literal["expected", "staged", "taken", "alone"] = "expected"
    rows: list[WriteRow] = dataclasses.field(default_factory=list)
    overwrite: bool = False
    chunks: Mapping[bytes, bytes] = dataclasses.field(default_factory=dict)
    #: set once staged, or once a checkpoint stopped waiting for them
    ready: aio.Signal = dataclasses.field(default_factory=aio.Signal)
    #: set once the checkpoint write that took them finished (``stored`` says how)
    done: aio.Signal = dataclasses.field(default_factory=aio.Signal)
    stored: bool = False
    #: when it was announced (time.monotonic)
    since: float = 0.0


class Groups:
    """The announced writes of one store, by the checkpoint they are against."""

    def __init__(self, wait: float = WAIT) -> None:
        self.wait = wait
        self._lock = threading.Lock()
        self._by_key: dict[Key, dict[str, Expected]] = {}

    def __bool__(self) -> bool:
        return bool(self._by_key)

    def expect(self, key: Key, task_id: str) -> None:
        now = time.monotonic()
        with self._lock:
            # announcements whose writes never came (the saver refused them before they
            # reached the store) and that no checkpoint took: forgotten, oldest first
            while self._by_key:
                oldest = next(iter(self._by_key))
                group = self._by_key[oldest]
                if not all(e.state == "expected" and now - e.since > STALE
                           for e in group.values()):
                    break
                del self._by_key[oldest]
            self._by_key.setdefault(key, {})[task_id] = Expected(since=now)

    def put(self, key: Key, task_id: str, rows: list[WriteRow], overwrite: bool,
            chunks: Mapping[bytes, bytes], commit: Callable[[], None]) -> bool:
        """Hand announced writes over and wait for the checkpoint that commits them;
        ``commit`` stores them alone when none does. False if they were not announced."""
        with self._lock:
            entry = self._by_key.get(key, {}).get(task_id)
            if entry is None or entry.state != "expected":
                return False
            entry.rows, entry.overwrite, entry.chunks = rows, overwrite, chunks
            entry.state = "staged"
        entry.ready.set()
        entry.done.wait(self.wait)
        with self._lock:  # (a checkpoint write may have taken them meanwhile)
            taken = _state(entry) == "taken"
            if not taken:
                entry.state = "alone"  # no checkpoint took them in time
                self._forget(key, task_id, entry)
        if taken:
            entry.done.wait(None)  # the checkpoint write that took them is running
        if not entry.stored:
            commit()
        return True

    def take(self, key: Key) -> list[Expected]:
        """For a checkpoint write whose parent is ``key``: the announced writes against
        it, waiting up to :attr:`wait` for those not handed over yet. The caller commits
        them with the checkpoint and then calls :meth:`settle`."""
        with self._lock:
            entries = list(self._by_key.get(key, {}).values())
        if not entries:
            return []
        deadline = time.monotonic() + self.wait
        for entry in entries:
            entry.ready.wait(max(0.0, deadline - time.monotonic()))
        taken = []
        with self._lock:
            for entry in self._by_key.pop(key, {}).values():
                if entry.state == "staged":
                    entry.state = "taken"
                    taken.append(entry)
                elif entry.state == "expected":  # not handed over in time: goes alone
                    entry.state = "alone"
        return taken

    @staticmethod
    def settle(taken: list[Expected], *, stored: bool) -> None:
        for entry in taken:
            entry.stored = stored
            entry.done.set()

    def release_all(self) -> None:
        """On close: every held write is committed on its own, now."""
        with self._lock:
            entries = [e for group in self._by_key.values() for e in group.values()]
            self._by_key.clear()
            for entry in entries:
                if entry.state in ("expected", "staged"):
                    entry.state = "alone"
        for entry in entries:
            entry.ready.set()
            if entry.state == "alone":
                entry.done.set()

    def _forget(self, key: Key, task_id: str, entry: Expected) -> None:
        group = self._by_key.get(key)
        if group is not None and group.get(task_id) is entry:
            del group[task_id]
            if not group:
                del self._by_key[key]


def _state(entry: Expected) -> str:
    """``entry.state`` as another thread may have set it (not as this one last did)."""
    return entry.state
