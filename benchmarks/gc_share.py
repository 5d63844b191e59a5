"""Item 3's closed waves by the garbage collector's share, with and without ``gc.freeze()``.

Not a target row: a profile of why the event loop lags while 64 runs share it. Two parts:

1. A full (generation 2) collection in a fresh interpreter, after importing each of a few
   modules: the objects tracked and the best of five ``gc.collect()`` calls. What a full
   collection walks is mostly what the imports made.
2. Item 3's closed waves (64 ``ainvoke`` of the 10-step graph, started together, on one
   event loop; :func:`lg_async.wave`) on RemitSaver (PostgreSQL), ``AsyncPostgresSaver``
   and the checkpointer that stores nothing, each side's waves one after another from one
   full collection (so that the collections a side meets are those its own garbage brings
   on, as in a process that serves only it), first as the process is, then after
   ``gc.collect(); gc.freeze()`` (which moves every object alive then out of all later
   collections; ``gc.unfreeze()`` after). Per side: runs/s and the lag p99 (medians of the
   waves), the process's CPU per step, and the collections of each generation and the
   time spent in them (``gc.callbacks``), a wave on average.

``uv run python benchmarks/gc_share.py [--quick]``
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import statistics
import subprocess
import sys
import time
from typing import Any

import _bench
from _bench import null_saver, pg_available, pg_schema, pg_url, reps
from lg import Small, linear_graph
from lg_async import POOL, STEPS, stock_saver, wave

from remit_langgraph import RemitSaver

RUNS = 64
IMPORTS = ("", "pydantic", "langchain_core.messages", "langgraph.graph", "remit_langgraph")

_PROBE = """
import gc, sys, time
if sys.argv[1]:
    __import__(sys.argv[1])
gc.collect()
times = []
for _ in range(5):
    t0 = time.perf_counter()
    gc.collect()
    times.append(time.perf_counter() - t0)
print(len(gc.get_objects()), min(times))
"""


def imports() -> list[tuple[str, int, float]]:
    """(module, objects tracked, seconds of a full collection) in a fresh interpreter."""
    out = []
    for module in IMPORTS:
        done = subprocess.run([sys.executable, "-c", _PROBE, module], check=True,
                              capture_output=True, text=True)
        objects, seconds = done.stdout.split()
        out.append((module or "(nothing)", int(objects), float(seconds)))
    return out


class _Collections:
    """Seconds spent in, and count of, the collections of each generation."""

    def __init__(self) -> None:
        self.spent: collections.defaultdict[int, float] = collections.defaultdict(float)
        self.count: collections.Counter[int] = collections.Counter()
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.spent[info["generation"]] += time.perf_counter() - self._t0
            self.count[info["generation"]] += 1

    def reset(self) -> None:
        self.spent.clear()
        self.count.clear()


async def _waves(url: str, stock_search_path: str, n: int) -> dict[str, dict[str, Any]]:
    builder = linear_graph(Small, STEPS, asynchronous=True)
    seen = _Collections()
    gc.callbacks.append(seen)
    got: dict[str, dict[str, Any]] = {}
    try:
        async with contextlib.AsyncExitStack() as stack:
            stock = await stock_saver(stack, stock_search_path)
            saver = await stack.enter_async_context(RemitSaver.from_conn_string(url))
            graphs = {"remit": builder.compile(checkpointer=saver),
                      "stock": builder.compile(checkpointer=stock),
                      "null": builder.compile(checkpointer=null_saver())}
            for mode in ("as is", "frozen"):
                for g in graphs.values():  # warm-up
                    await wave(g, RUNS)
                if mode == "frozen":
                    gc.collect()
                    gc.freeze()
                frozen = gc.get_freeze_count()
                for k in graphs:
                    got[f"{k}/{mode}"] = {"rate": [], "lag": [], "cpu": [], "spent": [],
                                          "count": [], "frozen": frozen}
                # each side's waves one after the other, from one full collection: the
                # collections a side meets are those its own garbage brings on, as in a
                # process that serves only it (item 3 alternates the sides instead, each
                # wave from a full collection, and so meets none that several waves'
                # garbage brings on)
                for k in graphs:
                    side = got[f"{k}/{mode}"]
                    gc.collect()
                    for _ in range(n):
                        seen.reset()
                        c0 = time.process_time()
                        rate, lag, _ = await wave(graphs[k], RUNS)
                        side["cpu"].append((time.process_time() - c0) / (RUNS * STEPS))
                        side["rate"].append(rate)
                        side["lag"].append(lag)
                        side["spent"].append(dict(seen.spent))
                        side["count"].append(dict(seen.count))
                gc.unfreeze()
    finally:
        gc.callbacks.remove(seen)
    return got


def main() -> None:
    _bench.QUICK = "--quick" in sys.argv[1:]
    print("## A full collection after each import (a fresh interpreter, best of 5)\n")
    print("| imported | objects tracked | full collection |")
    print("|---|---|---|")
    for module, objects, seconds in imports():
        print(f"| {module} | {objects:,} | {seconds * 1e3:.1f} ms |")
    if not pg_available():
        print("\n(PostgreSQL is not reachable: the waves were not run)")
        return
    n = reps(8, 3)
    with pg_schema("gcremit") as remit_schema, pg_schema("gcstock") as stock_schema:
        got = asyncio.run(_waves(pg_url(schema=remit_schema) + f"&pool_max={POOL}",
                                 stock_schema, n))
    print(f"\n## {RUNS} concurrent ainvoke of the {STEPS}-step graph, {n} waves a side\n")
    print("| side | heap | runs/s | lag p99 | CPU a step | collections a wave (gen 0 / 1 / 2) "
          "| time in them a wave (gen 0 / 1 / 2) | share of the wave's CPU |")
    print("|---|---|---|---|---|---|---|---|")
    names = {"remit": "RemitSaver (PostgreSQL)", "stock": "AsyncPostgresSaver",
             "null": "the checkpointer that stores nothing"}
    for key, side in got.items():
        k, mode = key.split("/")
        med = statistics.median
        counts = [statistics.fmean(c.get(g, 0) for c in side["count"]) for g in range(3)]
        spent = [statistics.fmean(s.get(g, 0.0) for s in side["spent"]) for g in range(3)]
        shares = [sum(s.values()) / (c * RUNS * STEPS)
                  for s, c in zip(side["spent"], side["cpu"], strict=True)]
        heap = "as is" if mode == "as is" else f"frozen ({side['frozen']:,} objects)"
        print(f"| {names[k]} | {heap} | {med(side['rate']):.0f} | {med(side['lag']) * 1e3:.2f} ms "
              f"| {med(side['cpu']) * 1e6:.0f} µs | {' / '.join(f'{c:.2g}' for c in counts)} "
              f"| {' / '.join(f'{s * 1e3:.0f}' for s in spent)} ms | {med(shares):.0%} |")


if __name__ == "__main__":
    main()
