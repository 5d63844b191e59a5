"""Graphs and child-process bodies for tests/langgraph/test_contract_more.py (no LLM).

Processes are expensive (importing langgraph takes seconds), so the tests spawn
one *zygote* per module: a clean process that imports everything once and then
``os.fork()``s a child per job. A child is a real OS process with its own store
connection; the parent talks to it through the zygote, and SIGKILLs it by pid.

The oracle is a ledger file (O_APPEND + fsync, see :func:`lg_workers.note`): node
entries, effect calls (with their idempotency key) and, for the kill sweep, every
saver call that completed.

Fault switches (``REMIT_TEST_BREAK``, read at import in every process):

* ``langgraph-gate``: the consume-once gate is off (applied by ``lg_workers``).
* ``langgraph-ids``: checkpoints the loop writes keep LangGraph's uuid6 ids instead of
  remit's derived ones (applied by ``lg_workers``).
* ``langgraph-receipts``: effects run unscoped, i.e. as plain calls with no receipt.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import multiprocessing as mp
import operator
import os
import signal
import threading
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Annotated, Any, TypedDict

from langgraph.func import entrypoint, task
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Send, interrupt
from pydantic import BaseModel

from remit_core import effects as _effects
from remit_langgraph import RemitSaver, effect
from remit_langgraph.saver import _node_of
from tests.langgraph.lg_workers import note  # also applies REMIT_TEST_BREAK=langgraph-gate

if os.environ.get("REMIT_TEST_BREAK") == "langgraph-receipts":  # EO off, in every process
    _effects._resolvers.clear()

Hook = Callable[[str], None]


def _no_hook(_: str) -> None:
    return None


# ==================================================================================== graphs


class State(TypedDict):
    x: int
    log: str


def effects_for(ledger: str, lock: Any = None) -> dict[str, Callable[..., Any]]:
    """The effects of these tests, each logging ``effect <name> <arg> <key>``.

    ``lock``: held around each whole @effect call (receipt start, call, receipt
    completion), so that a kill taken while holding it never lands mid-effect; the
    scope is resolved first, outside the lock (its first resolution waits for a
    checkpoint that a saver call under the same lock writes).
    """

    def make(name: str) -> Callable[..., Any]:
        @effect(name=name)
        def fire(x: Any, *, idempotency_key: str | None = None) -> str:
            note(ledger, f"effect {name} {x} {idempotency_key}")
            return f"{name}-{x}"

        def call(x: Any) -> str:
            _effects.current_scope()
            with lock if lock is not None else contextlib.nullcontext():
                return fire(x)

        return call

    return {n: make(n) for n in ("pay", "ship", "prepare", "charge")}


def eo_graph(ledger: str, *, lock: Any = None, hook: Hook = _no_hook) -> StateGraph:
    """a (pay, then more work) -> b (ship) -> END. ``hook(point)`` after each effect."""
    fx = effects_for(ledger, lock)

    def a(s: State) -> dict[str, Any]:
        note(ledger, "enter a")
        paid = fx["pay"](s["x"])
        hook("in-a")
        note(ledger, "more work a")
        return {"x": s["x"] + 10, "log": paid}

    def b(s: State) -> dict[str, Any]:
        note(ledger, "enter b")
        shipped = fx["ship"](s["x"])
        hook("in-b")
        return {"log": s["log"] + "," + shipped}

    g = StateGraph(State)
    g.add_node("a", a)
    g.add_node("b", b)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", END)
    return g


def gated_node(ledger: str, name: str, hook: Hook) -> Callable[[Any], dict[str, Any]]:
    """A node: prepare (effect), interrupt, charge (effect with the answer), hook."""
    fx = effects_for(ledger)

    def node(s: Any) -> dict[str, Any]:
        note(ledger, f"enter {name}")
        prep = fx["prepare"](s["x"])
        answer = interrupt({"question": "approve?", "prep": prep})
        note(ledger, f"after-interrupt {name} {answer} {os.getpid()}")
        txn = fx["charge"](answer)
        hook("charged")
        return {"x": s["x"] + int(answer), "log": txn}

    return node


def pre_graph(ledger: str, hook: Hook = _no_hook) -> StateGraph:
    """START -> b (prepare, interrupt, charge) -> c."""
    g = StateGraph(State)
    g.add_node("b", gated_node(ledger, "b", hook))
    g.add_node("c", lambda s: (note(ledger, "enter c"), {"log": s["log"] + "!"})[1])
    g.add_edge(START, "b")
    g.add_edge("b", "c")
    g.add_edge("c", END)
    return g


def plain_graph(ledger: str, hook: Hook = _no_hook) -> StateGraph:
    """START -> b (interrupt, no effect) -> c: what durability='exit' can run."""

    def b(s: State) -> dict[str, Any]:
        note(ledger, "enter b")
        answer = interrupt("approve?")
        note(ledger, f"after-interrupt b {answer} {os.getpid()}")
        return {"x": s["x"] + int(answer)}

    g = StateGraph(State)
    g.add_node("b", b)
    g.add_node("c", lambda s: (note(ledger, "enter c"), {"log": s["log"] + "!"})[1])
    g.add_edge(START, "b")
    g.add_edge("b", "c")
    g.add_edge("c", END)
    return g


def sub_graph(ledger: str, hook: Hook = _no_hook) -> StateGraph:
    """a -> sub (a compiled subgraph whose node interrupts, with effects) -> c."""
    inner = StateGraph(State)
    inner.add_node("inner", gated_node(ledger, "inner", hook))
    inner.add_edge(START, "inner")
    inner.add_edge("inner", END)
    g = StateGraph(State)
    g.add_node("a", lambda s: (note(ledger, "enter a"), {"x": s["x"] + 1})[1])
    g.add_node("sub", inner.compile())
    g.add_node("c", lambda s: (note(ledger, "enter c"), {"log": s["log"] + "!"})[1])
    g.add_edge(START, "a")
    g.add_edge("a", "sub")
    g.add_edge("sub", "c")
    g.add_edge("c", END)
    return g


class FanState(TypedDict):
    x: int
    items: Annotated[list[str], operator.add]


def send_graph(ledger: str, hook: Hook = _no_hook) -> StateGraph:
    """fan -> Send(branch, 0), Send(branch, 1) in parallel -> join. Each branch pays;
    branch 1 then interrupts and charges the answer."""
    fx = effects_for(ledger)

    def branch(arg: dict[str, Any]) -> dict[str, Any]:
        i = arg["i"]
        note(ledger, f"enter branch{i}")
        paid = fx["pay"](f"b{i}")
        if i == 0:
            return {"items": [paid]}
        answer = interrupt({"question": "approve?", "paid": paid})
        note(ledger, f"after-interrupt branch1 {answer} {os.getpid()}")
        txn = fx["charge"](answer)
        hook("charged")
        return {"items": [paid, txn]}

    g = StateGraph(FanState)
    g.add_node("fan", lambda s: (note(ledger, "enter fan"), {"x": s["x"] + 1})[1])
    g.add_node("branch", branch)
    g.add_node("join", lambda s: (note(ledger, "enter join"), {"x": s["x"] * 100})[1])
    g.add_edge(START, "fan")
    g.add_conditional_edges("fan", lambda s: [Send("branch", {"i": i}) for i in (0, 1)],
                            ["branch"])
    g.add_edge("branch", "join")
    g.add_edge("join", END)
    return g


def functional(ledger: str, saver: Any, hook: Hook = _no_hook) -> Any:
    """An @entrypoint that interrupts, with @effects inside @tasks."""
    fx = effects_for(ledger)

    @task
    def prep(x: int) -> str:
        note(ledger, "enter prep")
        return fx["prepare"](x)

    @task
    def pay(answer: int) -> str:
        note(ledger, "enter pay")
        txn = fx["charge"](answer)
        hook("charged")
        return txn

    @entrypoint(checkpointer=saver)
    def workflow(x: int) -> dict[str, Any]:
        note(ledger, "enter workflow")
        p = prep(x).result()
        answer = interrupt({"question": "approve?", "prep": p})
        note(ledger, f"after-interrupt workflow {answer} {os.getpid()}")
        txn = pay(answer).result()
        return {"x": x + int(answer), "log": txn}

    return workflow


GRAPHS: dict[str, Callable[..., StateGraph]] = {
    "eo": eo_graph, "pre": pre_graph, "plain": plain_graph, "sub": sub_graph,
    "send": send_graph,
}
START_INPUT: dict[str, Any] = {
    "pre": {"x": 1, "log": ""}, "plain": {"x": 1, "log": ""}, "sub": {"x": 1, "log": ""}, "send": {"x": 1, "items": []},
    "func": 1,
}


def app_for(kind: str, ledger: str, saver: RemitSaver, hook: Hook = _no_hook) -> Any:
    if kind == "func":
        return functional(ledger, saver, hook)
    return GRAPHS[kind](ledger, hook=hook).compile(checkpointer=saver)


# ============================================================================== CV schemas


class PState(BaseModel):
    x: int
    log: str = ""


@dataclasses.dataclass
class DState:
    x: int
    log: str = ""


class RState(TypedDict):
    x: int
    items: Annotated[list[int], operator.add]


# ================================================================================= driving


def drive(app: Any, api: str, inp: Any, cfg: Any, durability: str | None = None) -> dict[str, Any]:
    """Run ``app`` through one of invoke / ainvoke / stream / astream; return what
    ``get_state`` shows afterwards (values, next nodes, pending interrupt values)."""
    kw: dict[str, Any] = {} if durability is None else {"durability": durability}
    if api == "invoke":
        app.invoke(inp, cfg, **kw)
    elif api == "stream":
        for _ in app.stream(inp, cfg, **kw):
            pass
    elif api in ("ainvoke", "astream"):

        async def go() -> None:
            if api == "ainvoke":
                await app.ainvoke(inp, cfg, **kw)
            else:
                async for _ in app.astream(inp, cfg, **kw):
                    pass

        asyncio.run(go())
    else:
        raise ValueError(api)
    state = app.get_state(cfg)
    return {"values": dict(state.values) if isinstance(state.values, dict) else state.values,
            "next": list(state.next), "interrupts": [i.value for i in state.interrupts]}


def cfg_of(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


# ====================================================================== the kill sweep (EO)


class SweepSaver(RemitSaver):
    """Counts the put/put_writes calls that completed; after the ``kill_at``-th it tells
    the parent and blocks (holding ``lock``, so no other saver call or effect can
    complete afterwards) until the parent SIGKILLs the process. Each completed call
    is logged as ``saver <n> put <step>`` / ``saver <n> put_writes <node>``."""

    def __init__(self, store: Any, *, ledger: str, kill_at: int | None, ctl: Connection,
                 **kwargs: Any) -> None:
        super().__init__(store, **kwargs)
        self.ledger = ledger
        self.kill_at = kill_at
        self.ctl = ctl
        self.calls = 0
        self.lock = threading.RLock()

    def _done(self, what: str) -> None:
        self.calls += 1
        note(self.ledger, f"saver {self.calls} {what}")
        if self.kill_at == self.calls:
            self.ctl.send(("reached", self.calls, what))
            threading.Event().wait()

    def _put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any,
             **kwargs: Any) -> Any:
        # put and aput both end here (RemitSaver's one implementation of a put)
        with self.lock:
            out = super()._put(config, checkpoint, metadata, new_versions, **kwargs)
            self._done(f"put {metadata.get('step')}")
        return out

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        with self.lock:
            super().put_writes(config, writes, task_id, task_path)
            self._done(f"put_writes {_node_of(task_path, task_id)}")

    def freeze(self, point: str) -> None:
        """Kill point inside a node: stop every saver call, tell the parent, block."""
        self.lock.acquire()
        self.ctl.send(("reached", point, point))
        threading.Event().wait()


def eo_run(ctl: Connection, url: str, thread: str, ledger: str, api: str, durability: str,
           kill_at: int | None = None, kill_in: str | None = None,
           recover: bool = False) -> dict[str, Any]:
    """One run of :func:`eo_graph` (``recover``: ``invoke(None)``), counting saver calls."""
    with RemitSaver.from_conn_string(url, lease=1.0) as opened:
        saver = SweepSaver(opened.store, ledger=ledger, kill_at=kill_at, ctl=ctl)

        def hook(point: str) -> None:
            if point == kill_in:
                saver.freeze(point)

        app = eo_graph(ledger, lock=saver.lock, hook=hook).compile(checkpointer=saver)
        inp = None if recover else {"x": 1, "log": ""}
        if recover and saver.get_tuple(cfg_of(thread)) is None:
            # nothing durable to resume: under durability="async" LangGraph may store the
            # input task's writes before the input checkpoint, and the crash fell between;
            # a user finds no state and starts the run again with its input
            note(ledger, "restart")
            inp = {"x": 1, "log": ""}
        out = drive(app, api, inp, cfg_of(thread), durability)
        ids = [c.config["configurable"]["checkpoint_id"] for c in saver.list(cfg_of(thread))]
        return {**out, "calls": saver.calls, "checkpoint_ids": ids}


# ============================================================================ other children


def park(ctl: Connection, url: str, kind: str, thread: str, ledger: str, api: str = "invoke",
         durability: str | None = None) -> dict[str, Any]:
    with RemitSaver.from_conn_string(url, lease=2.0) as saver:
        app = app_for(kind, ledger, saver)
        return drive(app, api, START_INPUT[kind], cfg_of(thread), durability)


def resume(ctl: Connection, url: str, kind: str, thread: str, ledger: str, value: Any,
           api: str = "invoke", durability: str | None = None, wait_go: bool = False,
           hang: bool = False, lease: float = 5.0) -> dict[str, Any]:
    """Resume with ``value``. ``wait_go``: report ready and wait for "go" (the race);
    ``hang``: block after the gated effect until killed."""
    with RemitSaver.from_conn_string(url, lease=lease) as saver:

        def hook(point: str) -> None:
            if hang:
                ctl.send(("reached", point, point))
                threading.Event().wait()

        app = app_for(kind, ledger, saver, hook)
        cfg = cfg_of(thread)
        app.get_state(cfg)  # warm up: the race is about the resume, not about connecting
        if wait_go:
            ctl.send(("ready",))
            assert ctl.recv() == "go"
        return drive(app, api, Command(resume=value), cfg, durability)


def recover(ctl: Connection, url: str, kind: str, thread: str, ledger: str,
            api: str = "invoke", durability: str | None = None) -> dict[str, Any]:
    with RemitSaver.from_conn_string(url, lease=1.0) as saver:
        app = app_for(kind, ledger, saver)
        return drive(app, api, None, cfg_of(thread), durability)


def inspect_state(ctl: Connection, url: str, kind: str, thread: str) -> dict[str, Any]:
    with RemitSaver.from_conn_string(url) as saver:
        app = app_for(kind, os.devnull, saver)
        cfg = cfg_of(thread)
        state = app.get_state(cfg)
        return {"values": state.values, "next": list(state.next),
                "ids": [c.config["configurable"]["checkpoint_id"] for c in saver.list(cfg)],
                "claims": [c.status for c in saver.store.list_claims(thread)]}


JOBS: dict[str, Callable[..., Any]] = {
    f.__name__: f for f in (eo_run, park, resume, recover, inspect_state)
}


# ================================================================================= zygote


_FINAL = ("result", "raised")


def _error_facts(exc: BaseException) -> dict[str, Any]:
    facts = {}
    for attr in ("run_id", "step", "key", "owner", "status", "field"):
        value = getattr(exc, attr, None)
        if isinstance(value, str | int | float | bool) or value is None:
            facts[attr] = value
    return facts


def _child(conn: Connection, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    try:
        value = JOBS[name](conn, *args, **kwargs)
        conn.send(("result", value))
    except Exception as exc:
        conn.send(("raised", type(exc).__name__, str(exc), _error_facts(exc),
                   traceback.format_exc()))


def zygote_main(link: Connection) -> None:
    """Serve the parent: fork a child per job and relay messages to and from it."""
    import importlib

    for backend in ("remit_core.store.postgres", "remit_core.store.redis"):
        with contextlib.suppress(ImportError):  # imported once here, not in every child
            importlib.import_module(backend)
    assert threading.active_count() == 1, "fork needs a single-threaded zygote"
    jobs: dict[int, tuple[int, Connection]] = {}
    next_id = 0
    while True:
        msg = link.recv()
        op = msg[0]
        if op == "start":
            _, name, args, kwargs = msg
            mine, theirs = mp.Pipe()
            pid = os.fork()
            if pid == 0:  # the child: a fresh process for one job
                code = 0
                try:
                    link.close()
                    mine.close()
                    _child(theirs, name, args, kwargs)
                except BaseException:
                    code = 1
                finally:
                    os._exit(code)
            theirs.close()
            next_id += 1
            jobs[next_id] = (pid, mine)
            link.send((next_id, pid))
        elif op == "recv":
            _, job, timeout = msg
            conn = jobs[job][1]
            try:
                ready = conn.poll(timeout)
                link.send(conn.recv() if ready else ("timeout",))
            except (EOFError, OSError):
                link.send(("eof",))
        elif op == "send":
            _, targets, payload = msg
            for job in targets:  # back to back: the race's release
                jobs[job][1].send(payload)
            link.send(("sent",))
        elif op == "reap":
            pid, conn = jobs.pop(msg[1])
            conn.close()
            _, status = os.waitpid(pid, 0)
            link.send(("reaped", status))
        elif op in ("cleanup", "stop"):
            for pid, conn in jobs.values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                conn.close()
            jobs.clear()
            link.send(("clean",))
            if op == "stop":
                return


class Job:
    """A forked child, seen from the parent."""

    def __init__(self, zygote: Zygote, job: int, pid: int) -> None:
        self.zygote = zygote
        self.id = job
        self.pid = pid
        self.final: tuple[Any, ...] | None = None

    def recv(self, timeout: float = 120.0) -> tuple[Any, ...]:
        msg = self.zygote.ask(("recv", self.id, timeout))
        if msg[0] in ("timeout", "eof"):
            raise AssertionError(f"job {self.id} (pid {self.pid}): {msg[0]}")
        return tuple(msg)

    def send(self, payload: Any) -> None:
        self.zygote.ask(("send", [self.id], payload))

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        self.zygote.ask(("reap", self.id))

    def finish(self, timeout: float = 120.0) -> tuple[Any, ...]:
        """The child's final message (``result`` or ``raised``); reaps it."""
        while True:
            msg = self.recv(timeout)
            if msg[0] in _FINAL:
                self.zygote.ask(("reap", self.id))
                self.final = msg
                return msg

    def result(self, timeout: float = 120.0) -> Any:
        msg = self.finish(timeout)
        if msg[0] == "raised":
            raise AssertionError(f"child raised {msg[1]}: {msg[2]}\n{msg[4]}")
        return msg[1]


class Zygote:
    """The parent's handle on the zygote process."""

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self.link, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=zygote_main, args=(theirs,), daemon=True)
        self.proc.start()
        theirs.close()

    def ask(self, msg: tuple[Any, ...]) -> Any:
        self.link.send(msg)
        return self.link.recv()

    def start(self, name: str, *args: Any, **kwargs: Any) -> Job:
        job, pid = self.ask(("start", name, args, kwargs))
        return Job(self, job, pid)

    def run(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Run a job to completion and return its result (AssertionError if it raised)."""
        return self.start(name, *args, **kwargs).result()

    def outcome(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Run a job to completion; its final message, raised or not."""
        return self.start(name, *args, **kwargs).finish()

    def release(self, jobs: list[Job]) -> None:
        """Send "go" to every job back to back (they are all waiting for it)."""
        self.ask(("send", [j.id for j in jobs], "go"))

    def cleanup(self) -> None:
        self.ask(("cleanup",))

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.ask(("stop",))
        self.proc.join(timeout=30)


@contextlib.contextmanager
def zygote() -> Iterator[Zygote]:
    z = Zygote()
    try:
        yield z
    finally:
        z.stop()
