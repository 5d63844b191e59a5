"""``remit check`` for LangGraph: the resume contract's fault matrix, stock saver against remit.

Every cell is measured by real runs of small LLM-free graphs in child processes:
a child that must die at a chosen point tells the parent over its pipe that it
got there and blocks, and the parent SIGKILLs it; k racers are released by a
``multiprocessing.Barrier``; nothing waits on a sleep for synchronisation. The
oracle is a ledger file per run: every node entry and every real call of an
``@effect`` body appends one line (``O_APPEND`` + ``fsync``), so counts survive
SIGKILL. Every run uses ``durability="sync"`` (the stock savers' safest mode).
The layers and their factory contract are declared in :mod:`remit_check.langgraph`.

**The fault points** (one graph ``a -> b -> c``: ``b`` calls the effect ``pay``,
parks on ``interrupt()``, and with the answer calls the gated effect ``charge``):

* ``kill-after-effect`` (EO, PC, LV): SIGKILL inside ``b`` right after ``pay``
  returned; ``invoke(None)`` in a fresh child. Then resume, SIGKILL the resumer
  right after ``charge`` (it holds remit's claim), and ``invoke(None)`` from fresh
  children until one finishes the run (remit: after the dead owner's lease).
  EO counts effect calls (2 per rep is right), PC counts re-runs of ``a`` and
  whether the first recovery went on from ``b``, LV whether the run finished
  with the claimed value. (The stock saver has no claim to wait out, so LV
  usually holds there; LangGraph stores the resume value from a background
  thread, and a kill that lands before it is stored shows as a lost resume.)
* ``kill-between-steps`` (PC): SIGKILL at the first line of ``c``, after ``b``'s
  writes are stored; recover; does ``b`` run again?
* ``k-resumes`` (CO-k): k children, released by a barrier, each resume the parked
  run with their own value; how often does the code after ``interrupt()`` run?
* ``second-resume`` (CO): after a resume finished, a second ``Command(resume=)``
  from a fresh child: refused, or recorded silently?
* ``invalid-state`` (CV): a node writes a string into an ``int`` field of a
  pydantic state: is it stored, and can the thread still be read?
* ``fork-twice`` (FI/FD): two children fork the same checkpoint with the same
  input (``update_state`` with ``configurable["remit_fork"] = True``, the explicit
  fork intent; a stock saver ignores the flag): same id and state? And does a
  fork-addressed resume at an answered interrupt use its own value?
* ``recover-twice`` (RD): crash as in kill-after-effect, copy the store files
  twice, recover each copy in a fresh child, compare final state, node sequence,
  effects and checkpoint ids. Always on SQLite files (copies need a file store),
  also under ``--store``.

``kill-during-write`` is not measured for LangGraph: the stock ``SqliteSaver``
stores a checkpoint with one ``INSERT OR REPLACE`` and a step's writes with one
``executemany`` inside SQLite's own transaction, so a child has no point inside a
write at which it could report "I am mid-write" without patching SQLite or the
saver (then it is no longer the stock layer), and a SIGKILL at an unreported
moment is not a repeatable cell.
"""

from __future__ import annotations

import atexit
import contextlib
import inspect
import logging
import os
import shutil
import signal
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.types import Command

from remit_check import STORE_ENV, CellResult, CheckEnv, Matrix, Scenario
from remit_check.harness import Layer, count, forkserver, lines, use_layer
from remit_check.langgraph import FRAMEWORK, LAYERS, STOCK_MISSING, layer_unavailable
from remit_check.langgraph.graphs import BAD, GRAPHS, INPUTS, SCHEMAS, fork_graph
from remit_check.tally import Tally

WAIT = 90.0
"""Seconds a child may take to answer one command before the scenario gives up."""
RECOVER_WAIT = 90.0
"""Seconds recovery keeps retrying while a dead owner's claim is live (LV)."""


# ========================================================================== child bodies


@contextlib.contextmanager
def open_layer(layer: Layer, directory: str, schema: Any = None) -> Iterator[Any]:
    """The layer's saver in this process. The store URL travels as an argument: a fork
    server's children see the environment of its start, not the parent's current one."""
    factory = use_layer(layer)
    kwargs: dict[str, Any] = {}
    if schema is not None and _accepts(factory, "schema"):
        kwargs["schema"] = schema
    made = factory(directory, **kwargs)
    if isinstance(made, BaseCheckpointSaver):
        yield made
    elif hasattr(made, "__enter__"):
        with made as saver:
            yield saver
    else:
        raise TypeError(f"{layer[0]} returned {type(made).__name__}, not a BaseCheckpointSaver "
                        "or a context manager yielding one")


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in params)


def cfg_of(thread: str, checkpoint_id: str | None = None, fork: bool = False) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": thread}
    if checkpoint_id is not None:
        conf["checkpoint_ns"] = ""
        conf["checkpoint_id"] = checkpoint_id
    if fork:
        conf["remit_fork"] = True
    return {"configurable": conf}


def _input(kind: str, inp: tuple[Any, ...]) -> Any:
    if inp[0] == "start":
        return INPUTS[kind]
    if inp[0] == "resume":
        return Command(resume=inp[1])
    return None


def _invoke(app: Any, inp: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    try:
        out = app.invoke(inp, cfg, durability="sync")
    except Exception as exc:
        return {"outcome": type(exc).__name__, "message": str(exc)[:300],
                "status": getattr(exc, "status", None)}
    values = dict(out) if isinstance(out, dict) else {}
    parked = values.pop("__interrupt__", None) is not None
    return {"outcome": "ok", "values": _plain(values), "parked": parked}


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, int | str | float | bool | None) else repr(v)
            for k, v in values.items()}


def run(ctl: Connection, barrier: Any, layer: Layer, directory: str, kind: str, thread: str,
        ledger: str, inp: tuple[Any, ...], hold_at: str | None = None,
        checkpoint_id: str | None = None, fork: bool = False) -> dict[str, Any]:
    """Run (``("start",)``), resume (``("resume", v)``) or continue (``("none",)``) a
    thread. ``hold_at``: report that point to the parent and block there until killed."""

    def hold(point: str) -> None:
        if point == hold_at:
            ctl.send(("reached", point))
            threading.Event().wait()

    with open_layer(layer, directory, SCHEMAS.get(kind)) as saver:
        app = GRAPHS[kind](ledger, hold=hold).compile(checkpointer=saver)
        return _invoke(app, _input(kind, inp), cfg_of(thread, checkpoint_id, fork))


def race(ctl: Connection, barrier: Any, layer: Layer, directory: str, kind: str, thread: str,
         ledger: str, value: Any) -> dict[str, Any]:
    """Open the layer and read the thread (connections are up), wait at the barrier with
    the other racers, then resume with ``value``."""
    with open_layer(layer, directory) as saver:
        app = GRAPHS[kind](ledger).compile(checkpointer=saver)
        cfg = cfg_of(thread)
        app.get_state(cfg)
        barrier.wait(timeout=WAIT)
        return _invoke(app, Command(resume=value), cfg)


def inspect_thread(ctl: Connection, barrier: Any, layer: Layer, directory: str, kind: str,
                   thread: str) -> dict[str, Any]:
    """What the store holds for a thread: the state (or why it cannot be read), the
    checkpoints (newest first, with their next nodes), stored resume values, and how
    many stored checkpoints or writes hold the invalid-state scenario's bad value."""
    with open_layer(layer, directory, SCHEMAS.get(kind)) as saver:
        app = GRAPHS[kind](os.devnull).compile(checkpointer=saver)
        cfg = cfg_of(thread)
        out: dict[str, Any] = {}
        try:
            state = app.get_state(cfg)
            out["values"] = _plain(dict(state.values))
            out["next"] = list(state.next)
            out["checkpoint_id"] = state.config["configurable"]["checkpoint_id"]
        except Exception as exc:
            out["unreadable"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        tuples = list(saver.list(cfg))
        out["ids"] = [t.config["configurable"]["checkpoint_id"] for t in tuples]
        out["resumes"] = [repr(v) for t in tuples for (_, ch, v) in t.pending_writes or []
                          if ch == "__resume__"]
        out["bad_stored"] = sum(
            BAD in repr(t.checkpoint.get("channel_values", {}))
            or any(BAD in repr(v) for (_, _, v) in t.pending_writes or [])
            for t in tuples)
        history: list[tuple[str, list[str]]] = []
        with contextlib.suppress(Exception):
            history = [(h.config["configurable"]["checkpoint_id"], list(h.next))
                       for h in app.get_state_history(cfg)]
        out["history"] = history
        return out


def fork_at(ctl: Connection, barrier: Any, layer: Layer, directory: str, thread: str,
            checkpoint_id: str, value: int) -> dict[str, Any]:
    """Fork the fork graph's thread at ``checkpoint_id``: ``update_state`` as node a with
    ``x=value``, flagged as a fork. Returns the new checkpoint id and its state."""
    with open_layer(layer, directory) as saver:
        app = fork_graph(os.devnull).compile(checkpointer=saver)
        new = app.update_state(cfg_of(thread, checkpoint_id, fork=True), {"x": value},
                               as_node="a")
        state = app.get_state(new)
        return {"id": new["configurable"]["checkpoint_id"], "values": _plain(dict(state.values)),
                "next": list(state.next)}


COMMANDS: dict[str, Callable[..., Any]] = {
    f.__name__: f for f in (run, race, inspect_thread, fork_at)
}


def _serve(conn: Connection, barrier: Any) -> None:
    """A worker: run commands from the parent until told to stop (or killed)."""
    warnings.filterwarnings("ignore")
    logging.getLogger("remit").addHandler(logging.NullHandler())  # the cells carry the facts
    logging.getLogger("remit").propagate = False
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        name, kwargs = msg
        try:
            conn.send(("ok", COMMANDS[name](conn, barrier, **kwargs)))
        except Exception as exc:
            conn.send(("raised", type(exc).__name__, str(exc)[:500], traceback.format_exc()))


# ============================================================================== the parent


class ChildError(RuntimeError):
    """A child could not do what the scenario needs (the cell becomes an error)."""

    @classmethod
    def of(cls, msg: tuple[Any, ...]) -> ChildError:
        """From a ``("raised", type, message, traceback)`` reply; the child's traceback
        goes into a note (it shows in the cell's detail, not in its summary)."""
        err = cls(f"{msg[1]}: {msg[2]}")
        err.add_note(f"in the child:\n{msg[3]}")
        return err


class Worker:
    """A long-lived child process that serves commands over a pipe."""

    def __init__(self, ctx: Any, barrier: Any) -> None:
        self.conn, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(theirs, barrier), daemon=True)
        self.proc.start()
        theirs.close()
        self.pid: int = self.proc.pid

    def send(self, name: str, **kwargs: Any) -> None:
        self.conn.send((name, kwargs))

    def reply(self, timeout: float = WAIT) -> tuple[Any, ...]:
        deadline = time.monotonic() + timeout
        while not self.conn.poll(0.25):
            if not self.proc.is_alive():
                raise ChildError(f"worker {self.pid} died (exit code {self.proc.exitcode})")
            if time.monotonic() > deadline:
                raise ChildError(f"worker {self.pid} did not answer within {timeout:.0f} s")
        try:
            msg: tuple[Any, ...] = self.conn.recv()
        except EOFError as exc:
            raise ChildError(f"worker {self.pid} closed its pipe") from exc
        return msg

    def result(self, timeout: float = WAIT) -> Any:
        msg = self.reply(timeout)
        if msg[0] == "raised":
            raise ChildError.of(msg)
        if msg[0] != "ok":
            raise ChildError(f"worker {self.pid}: unexpected message {msg[0]!r}")
        return msg[1]

    def call(self, name: str, **kwargs: Any) -> Any:
        self.send(name, **kwargs)
        return self.result()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.proc.join(timeout=WAIT)
        self.conn.close()

    def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(None)
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.kill()


class Pool:
    """k+1 workers forked by the fork server (which imported only what this module
    imports, and started no thread), reused across scenarios; a killed worker is
    replaced by a fresh process."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.ctx = _context()
        self.barrier = self.ctx.Barrier(k)
        self.workers = [Worker(self.ctx, self.barrier) for _ in range(k + 1)]
        self._turn = 0

    def next(self) -> Worker:
        """The next worker, round robin: consecutive steps run in different processes."""
        self._turn = (self._turn + 1) % len(self.workers)
        return self.workers[self._turn]

    def fresh(self, dead: Worker) -> Worker:
        """Replace a killed worker with a new process, and return it."""
        i = self.workers.index(dead)
        self.workers[i] = Worker(self.ctx, self.barrier)
        self._turn = i
        return self.workers[i]

    def crash(self, hold_at: str, **kwargs: Any) -> tuple[Worker, dict[str, Any] | None]:
        """Run ``run(**kwargs, hold_at=...)`` in a worker; SIGKILL it when it reports the
        point. Returns a fresh worker in its place, and the run's result when the point
        was never reached (then nothing was killed)."""
        w = self.next()
        w.send("run", hold_at=hold_at, **kwargs)
        msg = w.reply()
        if msg[0] == "reached":
            w.kill()
            return self.fresh(w), None
        if msg[0] == "raised":
            raise ChildError.of(msg)
        return w, msg[1]

    def race(self, values: list[Any], **kwargs: Any) -> list[dict[str, Any]]:
        """One ``race`` command per value, in k different workers, released together."""
        self.barrier.reset()
        racers = self.workers[:len(values)]
        for w, v in zip(racers, values, strict=True):
            w.send("race", value=v, **kwargs)
        return [w.result() for w in racers]

    def close(self) -> None:
        for w in self.workers:
            w.stop()
        self.workers = []


_POOL: Pool | None = None


def _context() -> Any:
    return forkserver(__name__)


def pool(k: int) -> Pool:
    global _POOL
    if _POOL is not None and (_POOL.k != k or not all(w.proc.is_alive() for w in _POOL.workers)):
        _POOL.close()
        _POOL = None
    if _POOL is None:
        _POOL = Pool(k)
    return _POOL


@atexit.register
def _close_pool() -> None:
    global _POOL
    if _POOL is not None:
        _POOL.close()
        _POOL = None


# ============================================================================== scenarios

MATRIX = Matrix(FRAMEWORK)


class Run(Tally):
    """One scenario on one layer: its tally, its directory, the layer as children see it,
    the pool."""

    def __init__(self, env: CheckEnv, layer: str, factory: str, fault: str, *,
                 file_store: bool = False) -> None:
        super().__init__(MATRIX, env, layer, fault)
        self.dir = env.fresh_dir(fault)
        self.lay: Layer = (factory, None if file_store else os.environ.get(STORE_ENV))
        self.pool = pool(env.k)

    def args(self, kind: str, thread: str, directory: Path | None = None) -> dict[str, Any]:
        d = self.dir if directory is None else directory
        return {"layer": self.lay, "directory": str(d), "kind": kind, "thread": thread,
                "ledger": str(d / f"{thread}.ledger")}

    def ledger(self, thread: str) -> Path:
        return self.dir / f"{thread}.ledger"

    def call(self, command: str, **kwargs: Any) -> Any:
        """``command`` in the next worker: consecutive steps run in different processes."""
        return self.pool.next().call(command, **kwargs)

    def start(self, kind: str, prefix: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
        """A new thread of ``kind`` (id ``prefix-...``) run from its input in the next worker:
        its id, its :meth:`args`, and how that run ended."""
        thread = self.env.new_id(prefix)
        args = self.args(kind, thread)
        return thread, args, self.call("run", inp=("start",), **args)

    def inspect(self, kind: str, thread: str, directory: Path | None = None) -> dict[str, Any]:
        """What the store holds for ``thread`` (:func:`inspect_thread`)."""
        d = self.dir if directory is None else directory
        seen: dict[str, Any] = self.call("inspect_thread", layer=self.lay, directory=str(d),
                                         kind=kind, thread=thread)
        return seen


def _recover(r: Run, w: Worker, kind: str, thread: str) -> tuple[dict[str, Any], int]:
    """``invoke(None)`` in fresh children until the run goes on; a live claim of a dead
    owner answers ConsumeConflict until its lease runs out. Returns the last outcome and
    how many attempts were refused."""
    deadline = time.monotonic() + RECOVER_WAIT
    refused = 0
    while True:
        out: dict[str, Any] = w.call("run", inp=("none",), **r.args(kind, thread))
        if out["outcome"] != "ConsumeConflict" or time.monotonic() > deadline:
            return out, refused
        refused += 1
        time.sleep(0.1)  # polling for the dead owner's lease to run out, not a handshake
        w = r.pool.next()


@MATRIX.scenario("kill-after-effect", "EO", "PC", "LV")
def kill_after_effect(env: CheckEnv, layer: str, factory: str) -> list[CellResult]:
    r = Run(env, layer, factory, "kill-after-effect")
    for rep in range(r.n):
        thread = env.new_id("eo")
        value = 7 + rep
        args = r.args("flow", thread)
        # 1. SIGKILL inside b, right after pay returned; 2. invoke(None) in a fresh child
        w, early = r.pool.crash("after-pay", inp=("start",), **args)
        r.add(not_reached=early is not None)
        parked = w.call("run", inp=("none",), **args)
        r.add(continued_at_frontier=parked["outcome"] == "ok" and bool(parked.get("parked")))
        if not parked.get("parked"):
            r.notes.append(f"rep {rep}: recovery did not continue to b's interrupt: {parked}")
        # 3. resume; SIGKILL the resumer right after charge; 4. recover from fresh children
        w, early = r.pool.crash("after-charge", inp=("resume", value), **args)
        out, refused = _recover(r, w, "flow", thread)
        entries = lines(r.ledger(thread))
        done = out["outcome"] == "ok" and not out.get("parked")
        r.add(not_reached=early is not None, recoveries_refused=refused,
              effect_calls=count(entries, "effect "),
              completed_node_reruns=count(entries, "enter a") - 1,
              finished_with_claimed_value=done and out["values"].get("x") == 2 + value)
        if out.get("parked"):
            r.notes.append(f"rep {rep}: recovery parked on interrupt() again: the resume value "
                           "given to the killed resumer was lost")
        elif not done:
            r.notes.append(f"rep {rep}: recovery ended with {out}")
    detail = "\n".join(r.notes)
    if r["not_reached"]:
        detail += f"\n{r['not_reached']} kill points were not reached"
    return [
        r.cell("EO", r["effect_calls"] == 2 * r.n and r["not_reached"] == 0,
               ["effect_calls", "effect_calls_declared", "kills"],
               "2 effects fired {effect_calls} times over {kills} kills in {reps} reps", detail,
               effect_calls_declared=2 * r.n, kills=2 * r.n),
        r.cell("PC", r["completed_node_reruns"] == 0 and r["continued_at_frontier"] == r.n,
               ["completed_node_reruns", "continued_at_frontier"],
               "completed node a re-ran {completed_node_reruns} times; recovery went on from b "
               "in {continued_at_frontier} of {reps} reps", detail),
        r.cell("LV", r["finished_with_claimed_value"] == r.n,
               ["finished_with_claimed_value", "recoveries_refused"],
               "resumer killed holding the resume: finished with its value in "
               "{finished_with_claimed_value} of {reps} reps ({recoveries_refused} tries "
               "refused while its lease ran)", detail),
    ]


@MATRIX.scenario("kill-between-steps", "PC")
def kill_between_steps(env: CheckEnv, layer: str, factory: str) -> list[CellResult]:
    r = Run(env, layer, factory, "kill-between-steps")
    for rep in range(r.n):
        thread, args, _ = r.start("flow", "pc")
        value = 5 + rep
        w, early = r.pool.crash("start-c", inp=("resume", value), **args)
        out, _ = _recover(r, w, "flow", thread)
        entries = lines(r.ledger(thread))
        done = (out["outcome"] == "ok" and not out.get("parked")
                and out["values"].get("x") == 2 + value)
        # b's part after interrupt() and a are completed work once c has started
        r.add(not_reached=early is not None, finished=done,
              completed_step_reruns=count(entries, "after-interrupt b") - 1
              + count(entries, "enter a") - 1)
        if not done:
            r.notes.append(f"rep {rep}: recovery ended with {out}")
    return [r.cell("PC", r["completed_step_reruns"] == 0 and r["finished"] == r.n
                   and r["not_reached"] == 0, ["completed_step_reruns", "finished"],
                   "killed at the start of c: completed steps re-ran {completed_step_reruns} "
                   "times; {finished} of {reps} runs finished")]


@MATRIX.scenario("k-resumes", "CO-k")
def k_resumes(env: CheckEnv, layer: str, factory: str) -> list[CellResult]:
    r = Run(env, layer, factory, "k-resumes")
    per_rep: list[int] = []
    for rep in range(r.n):
        thread, args, _ = r.start("flow", "co-k")
        outs = r.pool.race([100 + i for i in range(env.k)], **args)
        entries = lines(r.ledger(thread))
        per_rep.append(count(entries, "effect charge"))
        odd = [o for o in outs if o["outcome"] not in ("ok", "ConsumeConflict")]
        r.add(gated_effect_calls=per_rep[-1],
              after_interrupt_runs=count(entries, "after-interrupt b"),
              resumes_accepted=sum(o["outcome"] == "ok" for o in outs), other_errors=len(odd))
        r.notes.extend(f"rep {rep}: {o['outcome']}: {o.get('message')}" for o in odd)
    return [r.cell("CO-k", r["gated_effect_calls"] == r.n and r["after_interrupt_runs"] == r.n
                   and r["resumes_accepted"] == r.n,
                   ["gated_effect_calls", "after_interrupt_runs", "resumes_accepted",
                    "other_errors", "k"],
                   "{k} racing resumes: gated effect fired {gated_effect_calls} times in {reps} "
                   "reps ({per_rep}); {resumes_accepted} accepted",
                   per_rep=", ".join(map(str, per_rep)))]


@MATRIX.scenario("second-resume", "CO")
def second_resume(env: CheckEnv, layer: str, factory: str) -> list[CellResult]:
    r = Run(env, layer, factory, "second-resume")
    for rep in range(r.n):
        thread, args, _ = r.start("flow", "co")
        first = r.call("run", inp=("resume", 1), **args)
        if first["outcome"] != "ok":
            raise ChildError(f"the first resume failed: {first}")
        late = 900 + rep
        second = r.call("run", inp=("resume", late), **args)
        seen = r.inspect("flow", thread)
        entries = lines(r.ledger(thread))
        r.add(second_resumes_refused=second["outcome"] == "ConsumeConflict",
              second_values_stored=any(str(late) in v for v in seen["resumes"]),
              extra_runs=count(entries, "after-interrupt b") - 1
              + count(entries, "effect charge") - 1)
    return [r.cell("CO", r["second_resumes_refused"] == r.n and r["second_values_stored"] == 0
                   and r["extra_runs"] == 0,
                   ["second_resumes_refused", "second_values_stored", "extra_runs"],
                   "second resume refused in {second_resumes_refused} of {reps} reps; stored "
                   "silently in {second_values_stored}")]


@MATRIX.scenario("invalid-state", "CV")
def invalid_state(env: CheckEnv, layer: str, factory: str) -> list[CellResult]:
    r = Run(env, layer, factory, "invalid-state")
    raised: set[str] = set()
    for _ in range(r.n):
        thread, _, out = r.start("cv", "cv")
        raised.add(out["outcome"])
        seen = r.inspect("cv", thread)
        r.add(refused=out["outcome"] == "StateValidationError",
              invalid_stored=seen["bad_stored"] > 0,
              thread_unreadable="unreadable" in seen or seen.get("values", {}).get("x") != 2)
    return [r.cell("CV", r["refused"] == r.n and r["invalid_stored"] == 0
                   and r["thread_unreadable"] == 0,
                   ["refused", "invalid_stored", "thread_unreadable"],
                   "invalid write stored in {invalid_stored} of {reps} reps, refused in "
                   "{refused}; thread unreadable in {thread_unreadable}",
                   "the run ended with: " + ", ".join(sorted(raised)))]


@MATRIX.scenario("fork-twice", "FI/FD")
def fork_twice(env: CheckEnv, layer: str, factory: str) -> list[CellResult]:
    r = Run(env, layer, factory, "fork-twice")
    for rep in range(r.n):
        # FD 1: two children fork the same checkpoint with the same input
        thread, _, _ = r.start("fork", "fd")
        seen = r.inspect("fork", thread)
        after_a = [cid for cid, nxt in seen["history"] if nxt == ["b"]]
        if len(after_a) != 1:
            raise ChildError(f"expected one checkpoint before b, found {seen['history']}")
        forks = [r.call("fork_at", layer=r.lay, directory=str(r.dir),
                                    thread=thread, checkpoint_id=after_a[0], value=42)
                 for _ in range(2)]
        r.add(forks_same_id=forks[0]["id"] == forks[1]["id"],
              forks_same_state=forks[0]["values"] == forks[1]["values"] == {"x": 42, "log": ""})
        # FD 2: a fork-addressed resume at an answered interrupt uses its own value
        thread, args, parked = r.start("flow", "fd-resume")
        at = r.inspect("flow", thread)["checkpoint_id"]
        r.call("run", inp=("resume", 1), **args)
        forked = r.call("run", inp=("resume", 2), checkpoint_id=at, fork=True,
                                    **args)
        ok = forked["outcome"] == "ok" and forked["values"].get("x") == 2 + 2
        r.add(fork_resume_own_value=ok)
        if not ok:
            r.notes.append(f"rep {rep}: parked {parked.get('parked')}, fork resume: {forked}")
    return [r.cell("FI/FD", r["forks_same_id"] == r.n and r["forks_same_state"] == r.n
                   and r["fork_resume_own_value"] == r.n,
                   ["forks_same_id", "forks_same_state", "fork_resume_own_value"],
                   "forked twice: same id in {forks_same_id} of {reps} reps, same state in "
                   "{forks_same_state}; fork resume used its own value in "
                   "{fork_resume_own_value}")]


@MATRIX.scenario("recover-twice", "RD")
def recover_twice(env: CheckEnv, layer: str, factory: str) -> list[CellResult]:
    r = Run(env, layer, factory, "recover-twice", file_store=True)
    same = ("state", "nodes", "effects", "ids")
    for rep in range(r.n):
        d = r.dir / f"rep{rep}"
        d.mkdir()
        thread = env.new_id("rd")
        _, early = r.pool.crash("after-pay", inp=("start",), **r.args("straight", thread, d))
        if early is not None:
            raise ChildError(f"the kill point was not reached: {early}")
        got = []
        for i in (1, 2):
            copy = r.dir / f"rep{rep}-copy{i}"
            shutil.copytree(d, copy)
            ledger = copy / f"{thread}.recovery"
            args = {**r.args("straight", thread, copy), "ledger": str(ledger)}
            out = r.call("run", inp=("none",), **args)
            seen = r.inspect("straight", thread, copy)
            entries = lines(ledger)
            got.append({"state": seen.get("values"), "ids": seen["ids"],
                        "nodes": [e for e in entries if e.startswith("enter")],
                        "effects": [e for e in entries if e.startswith("effect")],
                        "finished": out["outcome"] == "ok" and not out.get("parked")})
        r.add(**{f"same_{k}": got[0][k] == got[1][k] for k in same},
              finished=got[0]["finished"] and got[1]["finished"])
    differ = [k for k in same if r[f"same_{k}"] < r.n]
    agreed = ("agreed on state, nodes, effects and ids" if not differ
              else "differed in " + ", ".join(differ))
    where = (" (SQLite copies; --store not used)"
             if layer != "stock" and os.environ.get(STORE_ENV) else "")
    return [r.cell("RD", not differ and r["finished"] == r.n,
                   [*(f"same_{k}" for k in same), "finished"],
                   "two recoveries of one crash {agreed} ({reps} reps){where}", agreed=agreed,
                   where=where)]


def scenarios() -> list[Scenario]:
    return list(MATRIX.scenarios)


__all__ = ["LAYERS", "STOCK_MISSING", "ChildError", "layer_unavailable", "scenarios"]
