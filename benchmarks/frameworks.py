"""Item 6: persistence per CrewAI method and per pydantic-graph node.

CrewAI: a flow of 20 chained methods, ``@durable @persist(RemitFlowPersistence)``
against ``@persist(SQLiteFlowPersistence)``, each kicked off under a fresh id.
Both write a SQLite file in WAL mode with ``synchronous=FULL`` (CrewAI's
connection keeps SQLite's default, FULL; remit's default is FULL).

pydantic-graph: a run of 50 nodes, ``RemitStatePersistence`` against
``FileStatePersistence``. The stock layer rewrites its JSON file without fsync,
so the like-for-like comparison is remit with ``synchronous=NORMAL`` (in WAL mode
a commit is not fsynced: it survives a killed process, not a power cut, like
the stock file); remit's default (FULL, one fsync per commit) is shown too.

Both frameworks are also timed without persistence, to show what the
persistence itself adds per method or node.
"""

from __future__ import annotations

import os
import tempfile

# CrewAI reads these at import: no telemetry or tracing, side files in a temp dir
_HOME = tempfile.mkdtemp(prefix="remit-bench-crewai-")
for _sub in ("home", "data", "cache", "config", "storage"):
    os.makedirs(os.path.join(_HOME, _sub), exist_ok=True)
os.environ.update({
    "HOME": os.path.join(_HOME, "home"),
    "XDG_DATA_HOME": os.path.join(_HOME, "data"),
    "XDG_CACHE_HOME": os.path.join(_HOME, "cache"),
    "XDG_CONFIG_HOME": os.path.join(_HOME, "config"),
    "CREWAI_STORAGE_DIR": os.path.join(_HOME, "storage"),
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_DISABLE_TRACKING": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "OTEL_SDK_DISABLED": "true",
})

import asyncio  # noqa: E402
import atexit  # noqa: E402
import contextlib  # noqa: E402
import functools  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, cast  # noqa: E402

from _bench import Row, compare, reps, temp_dir, us  # noqa: E402
from crewai.flow.flow import Flow, listen, start  # noqa: E402
from crewai.flow.persistence import persist  # noqa: E402
from crewai.flow.persistence.sqlite import SQLiteFlowPersistence  # noqa: E402
from pydantic import BaseModel  # noqa: E402
from pydantic_graph import BaseNode, End, GraphRunContext  # noqa: E402
from pydantic_graph.graph import Graph  # noqa: E402
from pydantic_graph.persistence.file import FileStatePersistence  # noqa: E402

from remit_core import open_store  # noqa: E402
from remit_crewai import RemitFlowPersistence, durable  # noqa: E402
from remit_pydantic_graph import RemitStatePersistence  # noqa: E402

atexit.register(shutil.rmtree, _HOME, True)

# =================================================================================== CrewAI

METHODS = 20


class Counter(BaseModel):
    count: int = 0


def flow_class(backend: Any, *, remit: bool) -> type[Flow[Counter]]:
    """A flow of METHODS chained methods (m0 -> m1 -> ...), each adding one to the state."""
    src = ["class BenchFlow(Flow[Counter]):", "    _skip_auto_memory = True",
           "    @start()", "    def m0(self):", "        self.state.count += 1", "        return 0"]
    for i in range(1, METHODS):
        src += [f"    @listen('m{i - 1}')", f"    def m{i}(self, _):",
                "        self.state.count += 1", f"        return {i}"]
    scope: dict[str, Any] = {"Flow": Flow, "Counter": Counter, "start": start, "listen": listen,
                             "__name__": __name__}
    exec("\n".join(src), scope)
    cls: type[Flow[Counter]] = scope["BenchFlow"]
    if backend is None:
        return cls
    cls = cast(type[Flow[Counter]], persist(backend)(cls))
    return durable(cls) if remit else cls


@contextlib.contextmanager
def quiet() -> Any:
    """CrewAI prints a panel per flow and method."""
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        yield


def _kickoff(cls: type[Flow[Counter]]) -> float:
    flow = cls()
    t0 = time.perf_counter()
    with quiet():
        result = flow.kickoff(inputs={"id": str(uuid.uuid4())})
    elapsed = time.perf_counter() - t0
    assert result == METHODS - 1 and flow.state.count == METHODS, (result, flow.state)
    return elapsed / METHODS


def crewai_rows(directory: str) -> list[Row]:
    n = reps(21, 3)
    remit_store = RemitFlowPersistence.from_url(f"sqlite:///{directory}/remit.db")
    stock_store = SQLiteFlowPersistence(os.path.join(directory, "stock.db"))
    classes = {"remit": flow_class(remit_store, remit=True),
               "stock": flow_class(stock_store, remit=False),
               "none": flow_class(None, remit=False)}
    for cls in classes.values():
        _kickoff(cls)  # warm-up
    sides: dict[str, Callable[[], float]] = {
        k: functools.partial(_kickoff, c) for k, c in classes.items()}
    got = compare(sides, n)
    add_remit, add_stock = got["remit"] - got["none"], got["stock"] - got["none"]
    ratio = got["remit"] / got["stock"]
    return [Row(
        "6", f"CrewAI: time per method, {METHODS}-method flow", "sqlite", us(got["remit"]),
        f"{us(got['stock'])} (@persist(SQLiteFlowPersistence))", ratio, "≤ 1.0x stock",
        ratio <= 1.0,
        f"@durable @persist(RemitFlowPersistence) vs @persist(SQLiteFlowPersistence), both "
        f"WAL/FULL; the flow without persistence: {us(got['none'])}/method, so persistence "
        f"adds {us(add_remit)} (remit) vs {us(add_stock)} (stock) per method, "
        f"{add_remit / add_stock:.2f}x; median of {n} kickoffs",
        raw=dict(got))]


# =========================================================================== pydantic-graph

NODES = 50


@dataclass
class Tally:
    count: int = 0


@dataclass
class Step(BaseNode[Tally, None, int]):
    i: int = 0

    async def run(self, ctx: GraphRunContext[Tally]) -> Step | End[int]:
        ctx.state.count += 1
        if self.i + 1 >= NODES:
            return End(ctx.state.count)
        return Step(self.i + 1)


graph = Graph(nodes=[Step])


def _graph_run(make: Any) -> float:
    persistence = make()

    async def go() -> int:
        kwargs = {} if persistence is None else {"persistence": persistence}
        result = await graph.run(Step(0), state=Tally(), **kwargs)
        return int(result.output)

    t0 = time.perf_counter()
    out = asyncio.run(go())
    elapsed = time.perf_counter() - t0
    assert out == NODES, out
    return elapsed / NODES


def pydantic_graph_rows(directory: str) -> list[Row]:
    n = reps(9, 3)
    full = open_store(f"sqlite:///{directory}/remit-full.db")
    normal = open_store(f"sqlite:///{directory}/remit-normal.db?synchronous=NORMAL")
    files = Path(directory, "files")
    files.mkdir()
    makers = {
        "remit": lambda: RemitStatePersistence(normal, run_id=uuid.uuid4().hex),
        "remit_full": lambda: RemitStatePersistence(full, run_id=uuid.uuid4().hex),
        "stock": lambda: FileStatePersistence(files / f"{uuid.uuid4().hex}.json"),
        "none": lambda: None,
    }
    try:
        for make in makers.values():
            _graph_run(make)  # warm-up
        sides: dict[str, Callable[[], float]] = {
            k: functools.partial(_graph_run, m) for k, m in makers.items()}
        got = compare(sides, n)
    finally:
        full.close()
        normal.close()
    rows = []
    for key, label, target in (("remit", "synchronous=NORMAL (no fsync, as the stock file)",
                                True),
                               ("remit_full", "synchronous=FULL (remit's default)", False)):
        ratio = got[key] / got["stock"]
        add, add_stock = got[key] - got["none"], got["stock"] - got["none"]
        rows.append(Row(
            "6", f"pydantic-graph: time per node, {NODES}-node run, remit {label}", "sqlite",
            us(got[key]), f"{us(got['stock'])} (FileStatePersistence)", ratio,
            "≤ 1.0x stock" if target else "", (ratio <= 1.0) if target else None,
            f"without persistence {us(got['none'])}/node, so persistence adds {us(add)} "
            f"(remit) vs {us(add_stock)} (stock) per node, {add / add_stock:.2f}x; "
            f"median of {n} runs",
            raw=dict(got)))
    return rows


def item6(backends: list[str]) -> list[Row]:
    if "sqlite" not in backends:
        return []
    rows: list[Row] = []
    with temp_dir() as directory:
        rows += crewai_rows(directory)
    with temp_dir() as directory:
        rows += pydantic_graph_rows(directory)
    return rows


ITEMS = {"6": item6}
