"""Items 5 and 8: remit-core's own primitives, per backend.

5. the overhead of one ``@effect`` call (its receipt: ``start_receipt``, then
   ``complete_receipt``, each one durable write) against a plain call, compared
   with one durable write (the target: two durable writes are the floor for
   exactly-once) and with one backend round trip (a trivial read);
8. the time for 16 processes, released together by a barrier, to resolve one
   claim (``Store.claim_once``): from the first racer's call to the last racer's
   answer, one winner and 15 ``ConsumeConflict``.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing as mp
import os
import sqlite3
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from _bench import (
    Row,
    compare,
    per_call,
    pg_available,
    pg_schema,
    pg_url,
    private_redis,
    reps,
    temp_dir,
    us,
)

from remit_core import ConsumeConflict, Store, effect, effect_scope, open_store
from remit_core.store import new_owner

# ================================================================================= backends


@contextlib.contextmanager
def backend_urls(backends: list[str]) -> Iterator[dict[str, str]]:
    """A fresh store URL per available backend."""
    with contextlib.ExitStack() as stack:
        urls: dict[str, str] = {}
        if "sqlite" in backends:
            urls["sqlite"] = f"sqlite:///{stack.enter_context(temp_dir())}/remit.db"
        if "postgres" in backends and pg_available():
            urls["postgres"] = pg_url(schema=stack.enter_context(pg_schema("core")))
        if "redis" in backends:
            redis = stack.enter_context(private_redis())
            if redis is not None:
                urls["redis"] = f"{redis}?prefix=bench"
        yield urls


@contextlib.contextmanager
def references(backend: str, url: str, store: Store
               ) -> Iterator[tuple[str, Callable[[], Any], str, Callable[[], Any]]]:
    """(name, one round trip, name, one durable write) on the store's own server/file,
    over a connection of the kind the store uses."""
    if backend == "sqlite":
        path = url.removeprefix("sqlite:///")
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE IF NOT EXISTS bench_ref (k INTEGER PRIMARY KEY, n INTEGER)")
        conn.execute("INSERT OR IGNORE INTO bench_ref VALUES (1, 0)")

        def write() -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("UPDATE bench_ref SET n = n + 1 WHERE k = 1")
            conn.execute("COMMIT")
        try:
            yield ("read of one row (same file)",
                   lambda: conn.execute("SELECT n FROM bench_ref WHERE k = 1").fetchone(),
                   "one-row UPDATE + COMMIT (WAL, FULL: one fsync)", write)
        finally:
            conn.close()
    elif backend == "postgres":
        import psycopg

        schema = url.split("schema=")[1].split("&")[0]
        with psycopg.connect(url.split("?")[0], autocommit=True) as pconn:
            pconn.execute(f'CREATE TABLE IF NOT EXISTS "{schema}".bench_ref '
                          "(k int PRIMARY KEY, n bigint)")
            pconn.execute(f'INSERT INTO "{schema}".bench_ref VALUES (1, 0) ON CONFLICT DO NOTHING')
            yield ("SELECT 1", lambda: pconn.execute("SELECT 1").fetchone(),
                   "one-row UPDATE, autocommit (WAL flush)",
                   lambda: pconn.execute(
                       f'UPDATE "{schema}".bench_ref SET n = n + 1 WHERE k = 1'))
    else:
        import redis

        client = redis.Redis.from_url(url.split("?")[0])
        try:
            yield ("PING", client.ping, "INCR (appendfsync always)",
                   lambda: client.incr("bench-ref"))
        finally:
            client.close()


# ==================================================================================== item 5

EFFECT_LIMIT = 2.2
"""Issue 16, row 5: the overhead at most this many durable writes of the backend."""

#: a table like remit_receipts (the same columns, key and run index): the receipt's two
#: statements run on it with no remit code around them
_RECEIPTS_LIKE = (
    "CREATE TABLE IF NOT EXISTS {t} (key TEXT PRIMARY KEY, run_id TEXT NOT NULL, "
    "step TEXT NOT NULL, name TEXT NOT NULL, ordinal INTEGER NOT NULL, status TEXT NOT NULL, "
    "owner TEXT, fence BIGINT NOT NULL, lease_until {f} NOT NULL, started_at {f} NOT NULL, "
    "completed_at {f}, result {b}, attempt INTEGER NOT NULL)")


@contextlib.contextmanager
def receipt_statements(backend: str, url: str) -> Iterator[Callable[[], Any] | None]:
    """One receipt's two statements -- the INSERT of the started receipt and its UPDATE
    to completed, each its own durable transaction (autocommit), as remit's SQL backends
    run them -- on a scratch table like remit_receipts in the store's file or schema,
    with no remit code: the floor of an effect's two durable writes on that table. None
    for Redis (its receipt is a script)."""
    owner, run = "bench-owner", uuid.uuid4().hex
    count = iter(range(10**9))
    if backend == "sqlite":
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(_RECEIPTS_LIKE.format(t="bench_rc", f="REAL", b="BLOB"))
        conn.execute("CREATE INDEX IF NOT EXISTS bench_rc_run ON bench_rc (run_id)")

        def pair() -> None:
            key = f"{run}|step|bench-effect|{next(count)}"
            now = time.time()
            conn.execute("INSERT INTO bench_rc VALUES (?, ?, 'step', 'bench-effect', 0, "
                         "'started', ?, 1, ?, ?, NULL, NULL, 1) ON CONFLICT DO NOTHING "
                         "RETURNING *", (key, run, owner, now + 30, now)).fetchall()
            conn.execute("UPDATE bench_rc SET status = 'completed', result = ?, "
                         "completed_at = ? WHERE key = ? AND owner = ? AND fence = 1",
                         (b"\x01\x02", time.time(), key, owner))
        try:
            yield pair
        finally:
            conn.close()
    elif backend == "postgres":
        import psycopg

        schema = url.split("schema=")[1].split("&")[0]
        table = f'"{schema}".bench_rc'
        with psycopg.connect(url.split("?")[0], autocommit=True) as pconn:
            pconn.execute(_RECEIPTS_LIKE.format(t=table, f="DOUBLE PRECISION", b="BYTEA"))
            pconn.execute(f"CREATE INDEX IF NOT EXISTS bench_rc_run ON {table} (run_id)")

            def ppair() -> None:
                key = f"{run}|step|bench-effect|{next(count)}"
                pconn.execute(
                    f"INSERT INTO {table} VALUES (%s, %s, 'step', 'bench-effect', 0, "
                    "'started', %s, 1, extract(epoch from clock_timestamp()) + 30, "
                    "extract(epoch from clock_timestamp()), NULL, NULL, 1) "
                    "ON CONFLICT DO NOTHING RETURNING *", (key, run, owner)).fetchall()
                pconn.execute(
                    f"UPDATE {table} SET status = 'completed', result = %s, completed_at = "
                    "extract(epoch from clock_timestamp()) WHERE key = %s AND owner = %s "
                    "AND fence = 1", (b"\x01\x02", key, owner))
            yield ppair
    else:
        yield None


def item5(backends: list[str]) -> list[Row]:
    calls = reps(300, 100)
    n = reps(7, 3)
    rows: list[Row] = []

    def work(x: int) -> int:
        return x + 1

    recorded = effect(name="bench-effect")(work)
    with backend_urls(backends) as urls:
        for backend, url in urls.items():
            store = open_store(url)
            with references(backend, url, store) as (rt_name, rt, w_name, write):
                def effects(store: Store = store) -> float:
                    with effect_scope(store, run_id=uuid.uuid4().hex, step="step"):
                        return per_call(lambda: recorded(1), calls)  # a new receipt each

                replay_run = uuid.uuid4().hex
                with effect_scope(store, run_id=replay_run, step="step"):
                    for _ in range(calls):
                        recorded(1)

                def replays(store: Store = store, run: str = replay_run) -> float:
                    with effect_scope(store, run_id=run, step="step"):
                        return per_call(lambda: recorded(1), calls)  # recorded: returned

                with receipt_statements(backend, url) as pair:
                    for fn in (effects, replays, rt, write, pair):  # warm-up
                        if fn is not None:
                            fn()
                    sides = {
                        "plain": lambda: per_call(lambda: work(1), calls * 10),
                        "effect": effects, "replay": replays,
                        "rt": lambda: per_call(rt, calls),
                        "write": lambda: per_call(write, calls),
                    }
                    if pair is not None:
                        sides["pair"] = functools.partial(per_call, pair, calls)
                    got = compare(sides, n)
            store.close()
            overhead = got["effect"] - got["plain"]
            floor = ("" if "pair" not in got else
                     f"; the receipt's two statements alone (INSERT and UPDATE on a table like "
                     f"remit_receipts, each committed, no remit code): {us(got['pair'])} = "
                     f"{got['pair'] / got['write']:.2f}x one durable write")
            rows.append(Row(
                "5", "@effect overhead per call (start + complete receipt)", backend,
                us(overhead), f"{us(got['write'])} ({w_name})", overhead / got["write"],
                f"≤ {EFFECT_LIMIT}x one durable write", overhead <= EFFECT_LIMIT * got["write"],
                f"plain call {us(got['plain'])}; a replayed call (recorded result) costs "
                f"{us(got['replay'] - got['plain'])}; one round trip ({rt_name}): "
                f"{us(got['rt'])}, so the receipt costs {overhead / got['rt']:.2f}x a round "
                f"trip{floor}; median of {n} x {calls} calls",
                raw={k: v for k, v in got.items()}))
    return rows


# ==================================================================================== item 8

RACERS = 16


def _racer(url: str, prefix: str, rounds: int, barrier: Any, out: Any, idx: int) -> None:
    store = open_store(url)
    try:
        store.get_claim(f"{prefix}-warmup")  # connect before the race
        for r in range(rounds):
            barrier.wait(timeout=120)
            t0 = time.perf_counter()
            try:
                store.claim_once(f"{prefix}-{r}", run_id="race", owner=new_owner())
                won = True
            except ConsumeConflict:
                won = False
            t1 = time.perf_counter()
            out.put((r, idx, t0, t1, won))
    finally:
        store.close()


def race(url: str, rounds: int) -> list[dict[str, float]]:
    """``rounds`` races of RACERS spawned processes (the process pool is reused; each
    round races for a fresh key). Times are CLOCK_MONOTONIC, the same in every process."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(RACERS)
    out = ctx.Queue()
    prefix = uuid.uuid4().hex[:8]
    procs = [ctx.Process(target=_racer, args=(url, prefix, rounds, barrier, out, i), daemon=True)
             for i in range(RACERS)]
    for p in procs:
        p.start()
    results: dict[int, list[tuple[float, float, bool]]] = {r: [] for r in range(rounds)}
    try:
        for _ in range(rounds * RACERS):
            r, _idx, t0, t1, won = out.get(timeout=300)
            results[r].append((t0, t1, won))
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    summary = []
    for r, got in results.items():
        winners = sum(1 for _, _, w in got if w)
        if winners != 1:
            raise AssertionError(f"round {r}: {winners} winners")
        first = min(t0 for t0, _, _ in got)
        summary.append({
            "resolve": max(t1 for _, t1, _ in got) - first,
            "winner": next(t1 for _, t1, w in got if w) - first,
            "skew": max(t0 for t0, _, _ in got) - first,
        })
    return summary


def item8(backends: list[str]) -> list[Row]:
    rounds = reps(25, 6)
    rows: list[Row] = []
    with backend_urls(backends) as urls:
        for backend, url in urls.items():
            store = open_store(url)
            def solo_claim(store: Store = store) -> None:
                store.claim_once(uuid.uuid4().hex, run_id="solo", owner=new_owner())

            solo = statistics.median(per_call(solo_claim, 20) for _ in range(3))
            store.close()
            got = race(url, rounds)
            resolve = sorted(g["resolve"] for g in got)
            med = statistics.median(resolve)
            p90 = resolve[min(len(resolve) - 1, int(0.9 * len(resolve)))]
            target = "< 50 ms" if backend in ("sqlite", "postgres") else "(none)"
            rows.append(Row(
                "8", f"{RACERS} processes race for one claim: first call to last answer",
                backend, f"{us(med)} (p90 {us(p90)}, max {us(resolve[-1])})",
                f"{us(solo)} (one uncontended claim)", None, target,
                med < 0.050 if backend in ("sqlite", "postgres") else None,
                f"{rounds} rounds, one winner in each; the winner answered after "
                f"{us(statistics.median(g['winner'] for g in got))}; the barrier released "
                f"the racers over {us(statistics.median(g['skew'] for g in got))} (their "
                f"first calls' spread, included in the time); {os.cpu_count()} CPUs",
                raw={"resolve": resolve, "solo": solo, "rounds": got}))
    return rows


ITEMS = {"5": item5, "8": item8}
