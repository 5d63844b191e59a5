"""Processes on the two test hosts of tests/test_cross_host.py (network namespaces).

``python -m tests.cross_host_workers ROLE --url URL --dir DIR --host NAME --count K ...``
runs inside one namespace (``ip netns exec``): it imports LangGraph and remit once, then
forks K children (each an OS process of its own, which opens its own store after the
fork, so its connections go out from the namespace's address) and exits 0 once all of
them have; when one fails it ends the others and exits 1.

The barrier is a folder shared by both hosts: a child creates ``ready-<round>-<name>``
and polls for ``go-<round>``, which the test writes once every child of both hosts is
ready; it writes its result to ``result-<round>-<name>.json`` (written aside, then
renamed, so a file the test finds is whole). No sleeps are used for synchronisation.

Roles (the graph is lg_recovery_workers' ``a -> b (effect "charge") -> c``):

* ``race``: round ``i`` resumes thread ``xh-<i>``, parked by the test on the interrupt in
  ``b``, with ``Command(resume={"approved": True, "amount": 12.5, "by": name})``; the
  result is ``won`` (with what the graph returned) or ``refused`` (ConsumeConflict).
* ``recover``: one round of lg_recovery_workers' ``recoverer``: ``recover(graph)`` at the
  same moment as the others; the result is what it recovered, failed and skipped.

``REMIT_TEST_BREAK`` reaches these processes through the environment: ``langgraph-gate``
(applied when tests.langgraph.lg_workers is imported, below) and ``recovery`` (the
recoverer's ``broken``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from langgraph.types import Command

import remit_core.store.postgres  # noqa: F401  (imported once, before the fork)
import tests.langgraph.lg_workers  # noqa: F401  (applies REMIT_TEST_BREAK=langgraph-gate)
from remit_core.adapter import poll
from remit_langgraph import ConsumeConflict, RemitSaver
from tests.langgraph import lg_recovery_workers as w

BREAK = os.environ.get("REMIT_TEST_BREAK", "")
#: how long a child waits for the test's go (the test fails long before, if it must)
WAIT = 120.0


def thread_of(round_no: int) -> str:
    return f"xh-{round_no}"


class FileBarrier:
    """One round's barrier across hosts: ``wait()`` says ready and returns on the go."""

    def __init__(self, folder: Path, round_no: int, name: str) -> None:
        self.ready = folder / f"ready-{round_no}-{name}"
        self.go = folder / f"go-{round_no}"

    def wait(self) -> None:
        self.ready.touch(exist_ok=False)
        if poll(lambda: True if self.go.exists() else None, within=WAIT, pause=0.001,
                most=0.005) is None:
            raise TimeoutError(f"no {self.go.name} within {WAIT} s")


class FileResult:
    """One round's result of one child: ``put(value)`` writes it as JSON."""

    def __init__(self, folder: Path, round_no: int, name: str) -> None:
        self.path = folder / f"result-{round_no}-{name}.json"

    def put(self, value: Any) -> None:
        aside = self.path.with_suffix(".tmp")
        aside.write_text(json.dumps(value, default=str))
        aside.rename(self.path)


def racer(url: str, ledger: str, folder: Path, name: str, rounds: int) -> None:
    """Resume round i's thread at the same moment as every other racer, round by round."""
    with RemitSaver.from_conn_string(url, lease=5.0) as saver:
        graph = w.app(saver, ledger, park_in_b=True)
        for i in range(rounds):
            value = {"approved": True, "amount": 12.5, "by": name}
            FileBarrier(folder, i, name).wait()
            result: dict[str, Any] = {"pid": os.getpid(), "value": value}
            try:
                out = graph.invoke(Command(resume=value), w.cfg(thread_of(i)))
                result.update(verdict="won", answer=out.get("answer"), log=out.get("log"))
            except ConsumeConflict as exc:
                result.update(verdict="refused", owner=exc.owner, status=exc.status)
            FileResult(folder, i, name).put(result)


def recoverer(url: str, ledger: str, folder: Path, name: str) -> None:
    w.recoverer(url, ledger, FileBarrier(folder, 0, name), FileResult(folder, 0, name),
                "invoke", BREAK == "recovery")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cross_host_workers")
    parser.add_argument("role", choices=["race", "recover"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--host", required=True)
    parser.add_argument("--count", required=True, type=int)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    ctx = mp.get_context("fork")  # nothing is open yet: each child starts its own store
    children = []
    for n in range(args.count):
        name = f"{args.host}-{n}"
        if args.role == "race":
            target: Any = racer
            call: tuple[Any, ...] = (args.url, args.ledger, args.dir, name, args.rounds)
        else:
            target, call = recoverer, (args.url, args.ledger, args.dir, name)
        children.append(ctx.Process(target=target, args=call, name=name))
    for child in children:
        child.start()
    running = list(children)
    while running:
        for sentinel in wait([c.sentinel for c in running]):
            (child,) = [c for c in running if c.sentinel == sentinel]
            child.join()
            running.remove(child)
            if child.exitcode != 0:
                print(f"{child.name} exited with {child.exitcode}", file=sys.stderr)
                for other in running:
                    other.kill()
                    other.join()
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
