"""Item 3: concurrent ``ainvoke`` of a 10-step LangGraph graph, on one event loop.

64 and 256 runs of a linear graph of 10 async nodes (state ``{count: int, label: str}``)
are started together (``asyncio.gather``), each on a fresh thread, with
``durability="sync"`` (each checkpoint stored before the next step, as item 1's headline
rows). Measured: runs per second (the wave's runs / its wall time) and the event loop's
lag while the wave runs: a ticker task sleeps 1 ms, again and again, and records how much
later than asked it wakes; the row gives that lag's p99 over the wave.

Each timed wave starts from a full collection (``gc.collect()``, not timed; see
:func:`_collect`). Sides, timed in alternating order in each repetition on the same loop:
RemitSaver on PostgreSQL and on Redis (the private redis-server with AOF, ``appendfsync
always``), opened with ``RemitSaver.from_conn_string(url)`` as an async context manager, against
LangGraph's ``AsyncPostgresSaver`` on a ``psycopg_pool.AsyncConnectionPool``. The stock
side is always AsyncPostgresSaver on PostgreSQL (LangGraph has no stock Redis saver), for
the Redis row too. Pool sizes keep both sides together well under the server's
``max_connections`` (printed in the note).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import logging
import statistics
import time
import uuid
from typing import Any

from _bench import (
    PG_URL,
    Row,
    null_saver,
    pg_available,
    pg_schema,
    pg_url,
    private_redis,
    reps,
    us,
)
from lg import Small, linear_graph

from remit_langgraph import RemitSaver

STEPS = 10
WAVES = (64, 256)
POOL = 20
"""Connections at most per PostgreSQL side: AsyncConnectionPool(max_size=POOL) for the
stock saver, ``pool_max=POOL`` for remit (its async pool; its sync pool stays at
``pool_min``'s one connection here)."""
TICK = 0.001


class _Retries(logging.Handler):
    """Counts remit's "transient store error ...; retry N" warnings per side and error type
    (remit retries a store operation that failed transiently; under load that is what
    happens when a driver's pool refuses a connection), instead of printing each."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.side = ""
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith("remit: transient store error") and record.args:
            args = record.args if isinstance(record.args, tuple) else (record.args,)
            self.counts[(self.side, str(args[0]))] += 1
        else:
            logging.getLogger().handle(record)


class _FullGC:
    """Pauses of the garbage collector's full (generation 2) collections, per side: such
    a pause stops the loop, so it shows as lag (on both sides)."""

    def __init__(self) -> None:
        self.side = ""
        self.pauses: dict[str, list[float]] = collections.defaultdict(list)
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.pauses[self.side].append(time.perf_counter() - self._t0)


async def _ticker(lags: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        t0 = time.perf_counter()
        await asyncio.sleep(TICK)
        lags.append(time.perf_counter() - t0 - TICK)


def _collect(retries: _Retries, full_gc: _FullGC) -> None:
    """A full collection before a timed wave, counted for no side. The collector's
    thresholds count what every side allocated: without it a full collection lands in
    whichever wave crosses them, and a side pays for the garbage the waves before it
    left."""
    retries.side = full_gc.side = "between waves"
    gc.collect()


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0


async def wave(graph: Any, runs: int, rate: float | None = None) -> tuple[float, float, int]:
    """``runs`` ainvoke, each on a fresh thread: all at once (a closed wave), or with
    ``rate`` one every ``1 / rate`` seconds (an open load, as requests reach a server;
    below what the loop can do, it is not saturated). (runs/s, lag p99 in s, the ticker's
    samples)."""
    lags: list[float] = []
    stop = asyncio.Event()
    tick = asyncio.create_task(_ticker(lags, stop))
    await asyncio.sleep(0)
    started: list[asyncio.Task[Any]] = []
    t0 = time.perf_counter()
    for i in range(runs):
        started.append(asyncio.create_task(graph.ainvoke(
            {"count": 0, "label": "bench"},
            {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": STEPS + 50},
            durability="sync")))
        if rate is not None:
            await asyncio.sleep(max(0.0, t0 + (i + 1) / rate - time.perf_counter()))
    outs = await asyncio.gather(*started)
    elapsed = time.perf_counter() - t0
    stop.set()
    await tick
    assert all(o["count"] == STEPS for o in outs), outs[:3]
    return runs / elapsed, _p99(lags), len(lags)


PACE = 0.8
"""The open load's rate, as a share of the stock side's closed-wave runs/s."""


async def _idle_lag(seconds: float) -> float:
    lags: list[float] = []
    stop = asyncio.Event()
    tick = asyncio.create_task(_ticker(lags, stop))
    await asyncio.sleep(seconds)
    stop.set()
    await tick
    return _p99(lags)


async def _pg_clients() -> int:
    import psycopg

    async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as conn:
        cur = await conn.execute("SELECT count(*) FROM pg_stat_activity "
                                 "WHERE backend_type = 'client backend'")
        row = await cur.fetchone()
        return int(row[0]) if row else -1


async def stock_saver(stack: contextlib.AsyncExitStack, search_path: str) -> Any:
    """LangGraph's ``AsyncPostgresSaver`` on an ``AsyncConnectionPool`` of at most POOL
    connections, set up in the schema ``search_path``; the pool closes with ``stack``."""
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        pg_url(search_path=search_path), min_size=1, max_size=POOL, open=False,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row})
    await pool.open(wait=True)
    stack.push_async_callback(pool.close)
    stock = AsyncPostgresSaver(conn=pool)
    await stock.setup()
    return stock


async def _measure(urls: dict[str, str], stock_search_path: str, n: int,
                   retries: _Retries, full_gc: _FullGC) -> dict[str, Any]:
    builder = linear_graph(Small, STEPS, asynchronous=True)
    async with contextlib.AsyncExitStack() as stack:
        stock = await stock_saver(stack, stock_search_path)
        graphs = {"stock": builder.compile(checkpointer=stock)}
        for backend, url in urls.items():
            saver = await stack.enter_async_context(RemitSaver.from_conn_string(url))
            graphs[backend] = builder.compile(checkpointer=saver)
        graphs["null"] = builder.compile(checkpointer=null_saver())
        idle = await _idle_lag(1.0)
        names = list(graphs)
        got: dict[int, dict[str, dict[str, list[float]]]] = {}
        peak = 0
        for runs in WAVES:
            retries.side = full_gc.side = "warm-up"
            for g in graphs.values():  # warm-up: tables, caches, the pools' connections
                await wave(g, runs)
            peak = max(peak, await _pg_clients())
            samples: dict[str, dict[str, list[float]]] = {
                k: {"rate": [], "lag": [], "ticks": []} for k in names}
            for r in range(n):
                for k in names if r % 2 == 0 else list(reversed(names)):
                    _collect(retries, full_gc)
                    retries.side = full_gc.side = f"{k}@{runs}"
                    rate, lag, ticks = await wave(graphs[k], runs)
                    samples[k]["rate"].append(rate)
                    samples[k]["lag"].append(lag)
                    samples[k]["ticks"].append(ticks)
            # the same runs as an open load at PACE x the stock side's rate, equal for all
            rate = PACE * statistics.median(samples["stock"]["rate"])
            for k in names:
                samples[k]["paced_lag"], samples[k]["paced_ticks"] = [], []
            for r in range(n):
                for k in names if r % 2 == 0 else list(reversed(names)):
                    _collect(retries, full_gc)
                    retries.side = full_gc.side = f"{k}@{runs}/paced"
                    _, lag, ticks = await wave(graphs[k], runs, rate)
                    samples[k]["paced_lag"].append(lag)
                    samples[k]["paced_ticks"].append(ticks)
            samples["stock"]["pace"] = [rate]
            got[runs] = samples
            peak = max(peak, await _pg_clients())
        return {"waves": got, "idle": idle, "peak": peak}


def _pauses(full_gc: _FullGC, side: str, runs: int, mode: str = "") -> str:
    got = full_gc.pauses.get(f"{side}@{runs}{mode}", [])
    return f"{len(got)}" + (f" (longest {us(max(got))})" if got else "")


def item3(backends: list[str]) -> list[Row]:
    if not pg_available():
        return []
    n = reps(5, 2)
    rows: list[Row] = []
    with contextlib.ExitStack() as stack:
        urls: dict[str, str] = {}
        stock_schema = stack.enter_context(pg_schema("astock"))
        if "postgres" in backends:
            urls["postgres"] = (pg_url(schema=stack.enter_context(pg_schema("aremit")))
                                + f"&pool_max={POOL}")
        if "redis" in backends:
            redis_url = stack.enter_context(private_redis())
            if redis_url is not None:
                urls["redis"] = f"{redis_url}?prefix=bench"
        if not urls:
            return []
        retries = _Retries()
        full_gc = _FullGC()
        remit_log = logging.getLogger("remit")
        remit_log.addHandler(retries)
        gc.callbacks.append(full_gc)
        try:
            got = asyncio.run(_measure(urls, stock_schema, n, retries, full_gc))
        finally:
            remit_log.removeHandler(retries)
            gc.callbacks.remove(full_gc)
    import psycopg

    with psycopg.connect(PG_URL) as conn:
        row = conn.execute("SHOW max_connections").fetchone()
        most = row[0] if row else "?"
    import redis.asyncio

    redis_max = redis.asyncio.BlockingConnectionPool().max_connections
    pools = (f"pools: AsyncConnectionPool(min_size=1, max_size={POOL}) for "
             f"AsyncPostgresSaver, remit pool_max={POOL} (async pool; sync pool_min=1); "
             f"remit on Redis: a redis.asyncio BlockingConnectionPool per loop "
             f"(max_connections {redis_max}; past it a coroutine waits); "
             f"PostgreSQL client connections "
             f"seen after the waves: at most {got['peak']} of max_connections {most}")
    first = True
    for runs in WAVES:
        samples = got["waves"][runs]
        stock_rate = statistics.median(samples["stock"]["rate"])
        stock_lag = statistics.median(samples["stock"]["lag"])
        for backend in urls:
            rate = statistics.median(samples[backend]["rate"])
            lag = statistics.median(samples[backend]["lag"])
            ratio = rate / stock_rate
            retried = [f"{c} x {err}" for (side, err), c in sorted(retries.counts.items())
                       if side == f"{backend}@{runs}"]
            rows.append(Row(
                "3", f"{runs} concurrent ainvoke, {STEPS}-step graph (async nodes): runs/s",
                backend, f"{rate:.0f} runs/s",
                f"{stock_rate:.0f} runs/s (AsyncPostgresSaver, PostgreSQL)", ratio,
                "≥ 1.2x AsyncPostgresSaver", ratio >= 1.2,
                f"durability=sync, one event loop, each run a fresh thread; median of {n} "
                f"waves (the sides in alternating order, each wave from a full collection); "
                f"remit's retried store operations "
                f"in these {n} waves: {', '.join(retried) if retried else 'none'}"
                + (f"; {pools}" if first else ""),
                raw={"remit": samples[backend], "stock": samples["stock"]}))
            rows.append(Row(
                "3", f"{runs} concurrent ainvoke: event-loop lag p99 while they run",
                backend, us(lag), f"{us(stock_lag)} (AsyncPostgresSaver)", None, "≤ 5 ms",
                lag <= 0.005,
                (f"a ticker task sleeps {TICK * 1e3:.0f} ms and records how late it wakes; "
                 f"p99 per wave, median of {n} waves; " if first else "")
                + f"worst wave: remit {us(max(samples[backend]['lag']))}, AsyncPostgresSaver "
                f"{us(max(samples['stock']['lag']))}; ticker samples per wave (median): "
                f"remit {statistics.median(samples[backend]['ticks']):.0f}, "
                f"AsyncPostgresSaver {statistics.median(samples['stock']['ticks']):.0f}; "
                f"full (gen 2) GC pauses in the {n} waves: remit {_pauses(full_gc, backend, runs)}, "
                f"AsyncPostgresSaver {_pauses(full_gc, 'stock', runs)}; "
                "AsyncPostgresSaver's side "
                f"{'meets' if stock_lag <= 0.005 else 'misses'} ≤ 5 ms"
                + (f"; the idle loop's p99 (the ticker alone): {us(got['idle'])}"
                   if first else "")
                + f"; LangGraph with a checkpointer that stores nothing (no I/O, the loop "
                f"saturated by LangGraph alone): {statistics.median(samples['null']['rate']):.0f}"
                f" runs/s, lag p99 {us(statistics.median(samples['null']['lag']))}"))
            pace = samples["stock"]["pace"][0]
            paced = statistics.median(samples[backend]["paced_lag"])
            rows.append(Row(
                "3", f"{runs} ainvoke arriving at {pace:.0f}/s ({PACE}x AsyncPostgresSaver's "
                "runs/s, the same for both): event-loop lag p99", backend, us(paced),
                f"{us(statistics.median(samples['stock']['paced_lag']))} (AsyncPostgresSaver)",
                None, "(no target)", None,
                f"an open load: one run started every {1e3 / pace:.1f} ms; median of {n} "
                f"waves; ticker samples per wave (median): remit "
                f"{statistics.median(samples[backend]['paced_ticks']):.0f}, "
                f"AsyncPostgresSaver {statistics.median(samples['stock']['paced_ticks']):.0f}; "
                f"full (gen 2) GC pauses: remit {_pauses(full_gc, backend, runs, '/paced')}, "
                f"AsyncPostgresSaver {_pauses(full_gc, 'stock', runs, '/paced')}; the checkpointer "
                f"that stores nothing: {us(statistics.median(samples['null']['paced_lag']))}"))
            first = False
    return rows


ITEMS = {"3": item3}
