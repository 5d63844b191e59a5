"""What every adapter's check scenarios share: the ledger oracle, the fork server, kills.

* The ledger: one line per real effect call and per step entry, appended with
  ``O_APPEND`` and fsynced, so the counts survive SIGKILL.
* Child processes are forked from a fork server that imported only the check
  modules (never from a process that already started threads), each one fresh.
* A kill point is reported by the child over a pipe; the parent then SIGKILLs
  it. No sleep is ever used to synchronise.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import signal
import warnings
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any


def note(ledger: str, line: str) -> None:
    """The oracle: append one line, durable at once."""
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def lines(ledger: Path | str) -> list[str]:
    try:
        return Path(ledger).read_text().splitlines()
    except FileNotFoundError:
        return []


def count(entries: list[str], prefix: str) -> int:
    return sum(e.startswith(prefix) for e in entries)


def forkserver(module: str) -> Any:
    """The forkserver context, with ``module`` preloaded in the fork server (added to
    what other check modules asked for, so that one server serves them all)."""
    ctx = mp.get_context("forkserver")
    from multiprocessing import forkserver as fs

    server = getattr(fs, "_forkserver", None)
    current = [m for m in getattr(server, "_preload_modules", None) or [] if m != "__main__"]
    if module not in current:
        ctx.set_forkserver_preload([*current, module])
    return ctx


def quiet_children() -> None:
    """In a fork server and its children: no warnings, no remit log lines, no stdout
    (frameworks print progress panels; the report is the parent's)."""
    if mp.parent_process() is None:
        return
    warnings.filterwarnings("ignore")
    logging.getLogger("remit").setLevel(logging.ERROR)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)


def pid_of(proc: Any) -> int:
    pid = proc.pid
    assert isinstance(pid, int) and pid > 0, "the child process was not started"
    return pid


def crash(ctx: Any, target: Callable[..., Any], args: tuple[Any, ...], point: str,
          wait: float) -> bool:
    """Run ``target(*args, conn=...)`` in a child and SIGKILL it when it reports ``point``
    over the pipe (or after ``wait`` seconds of silence). Returns whether it got there."""
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=args, kwargs={"conn": child})
    proc.start()
    child.close()  # a child that dies early reads as EOF, not as a hang
    reached = False
    try:
        if parent.poll(wait):
            with contextlib.suppress(EOFError):
                reached = parent.recv() == point
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid_of(proc), signal.SIGKILL)
        proc.join(timeout=wait)
    return reached


def hold(conn: Connection | None, point: str) -> None:
    """In a child: report ``point`` to the parent and wait to be killed there."""
    if conn is not None:
        conn.send(point)
        conn.recv()  # never answered: the parent SIGKILLs this process


@contextlib.contextmanager
def one_child(ctx: Any) -> Iterator[Any]:
    """A pool of one fresh process, for a call whose result the parent needs."""
    with ctx.Pool(1) as pool:
        yield pool


#: a scenario's layer as it travels to a child: (factory spec, the remit store URL or None)
Layer = tuple[str, str | None]


def use_layer(layer: Layer) -> Callable[..., Any]:
    """In a child: point :data:`~remit_check.STORE_ENV` at the layer's store and return
    its factory. The URL travels as an argument because a fork server's children inherit
    the environment of the server's start, not the parent's current one."""
    from remit_check import STORE_ENV, load_factory

    spec, store = layer
    if store is None:
        os.environ.pop(STORE_ENV, None)
    else:
        os.environ[STORE_ENV] = store
    return load_factory(spec)


def remit_url(directory: str) -> str:
    """The store a remit layer factory opens: ``--store``'s, else a SQLite file in ``directory``."""
    from remit_check import STORE_ENV

    return os.environ.get(STORE_ENV) or f"sqlite:///{directory}/remit.db"
