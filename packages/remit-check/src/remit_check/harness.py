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
import shutil
import signal
import warnings
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from remit_check import CellResult
    from remit_check.tally import Tally

T = TypeVar("T")

#: a scenario's layer as it travels to a child: (factory spec, the remit store URL or None)
Layer = tuple[str, str | None]


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


class Children:
    """The child processes of one framework's scenarios: each a fresh process forked from
    the fork server that preloaded ``module`` (see :func:`forkserver`). Make it at the
    import of that module, so that the server, when it starts, preloads it."""

    def __init__(self, module: str, wait: float) -> None:
        self.ctx = forkserver(module)
        #: seconds a child may stay silent before it counts as stuck
        self.wait = wait

    def crash(self, target: Callable[..., Any], args: tuple[Any, ...], point: str) -> bool:
        """:func:`crash` in a fresh child."""
        return crash(self.ctx, target, args, point, self.wait)

    def one(self) -> contextlib.AbstractContextManager[Any]:
        """A pool of one fresh process (:func:`one_child`)."""
        return one_child(self.ctx)

    def call(self, target: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """``target(*args)`` in a fresh process; its result."""
        with self.one() as pool:
            return pool.apply(target, args)

    def race(self, target: Callable[..., Any], argsets: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Run ``target(*args, barrier, results)`` in one fresh process per ``args``, all
        released at once by the barrier; return what they put on ``results``."""
        barrier = self.ctx.Barrier(len(argsets))
        results = self.ctx.Queue()
        procs = [self.ctx.Process(target=target, args=(*args, barrier, results))
                 for args in argsets]
        for p in procs:
            p.start()
        try:
            return [results.get(timeout=self.wait * 2) for _ in procs]
        finally:
            for p in procs:
                p.join(timeout=self.wait)


def copies(directory: Path, n: int) -> list[Path]:
    """``n`` copies of a scenario's directory beside it (``<name>-copy1``, ...): the same
    durable state, to recover more than once (RD)."""
    made = [directory.with_name(f"{directory.name}-copy{i}") for i in range(1, n + 1)]
    for copy in made:
        shutil.copytree(directory, copy)
    return made


def recover_twice(t: Tally, lay: Layer, *, crash: Callable[[Layer, Path], T],
                  recover: Callable[[Layer, Path, T], Any], finished: Callable[[Any], bool],
                  agreed: str) -> list[CellResult]:
    """RD, the same way for every framework: per rep, ``crash(layer, directory)`` leaves a
    crashed run (and returns what names it), the directory is copied twice, and
    ``recover(layer, copy, name)`` recovers each copy in a fresh process. The cell holds
    when the two recoveries return the same and the first ``finished``. Copies need a file
    store, so ``layer`` is ``lay`` without its store URL: on the remit layer the copies are
    SQLite files, also under ``--store`` (the summary says so)."""
    files: Layer = (lay[0], None)
    for d in t.dirs():
        name = crash(files, d)
        got = [recover(files, c, name) for c in copies(d, 2)]
        t.add(recoveries_equal=got[0] == got[1] and finished(got[0]))
    where = " (on SQLite copies)" if t.layer == "remit" else ""
    return [t.cell("RD", t["recoveries_equal"] == t.n, ["recoveries_equal"],
                   "two recoveries of one crash {agreed} in {recoveries_equal} of {reps} reps"
                   "{where}", agreed=agreed, where=where)]


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
