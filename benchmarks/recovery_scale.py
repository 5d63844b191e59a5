"""Recovery at scale: many abandoned LangGraph threads, many worker processes, some killed.

    uv run python benchmarks/recovery_scale.py                        # PostgreSQL, 10 000 x 32
    uv run python benchmarks/recovery_scale.py --backend redis
    uv run python benchmarks/recovery_scale.py --backend sqlite --workers 8
    uv run python benchmarks/recovery_scale.py --runs 2000 --workers 16 --kill 2

1. **Abandoned runs.** Producer processes run ``--runs`` threads of ``a -> b (effect
   "charge") -> c`` with ``durability="sync"`` and stop each one when ``c`` is about to
   run: the thread's stream is left suspended there, never closed, so the thread stays
   ``running`` with its checkpoint after ``b`` durable. The producers' lease renewals
   are switched off while they make them, then each run is renewed once, so that the
   runs' leases (``--lease``) run out at about the same time; the producers are
   SIGKILLed then.
2. **Workers.** ``--workers`` processes, started before the leases run out, each
   recover pass after pass (``remit_langgraph.recover``, concurrency 1, pool_max 2 on
   PostgreSQL) until every thread is done. Once a third of the threads are done,
   ``--kill`` of them are SIGKILLed (each mid-run: its thread becomes abandoned again,
   and another worker continues it after the workers' lease).
3. **Checks.** Every thread is done; its node ``c`` ran once, twice for a thread a killed
   worker was inside (the ledger); ``b`` and its effect ran once (in the producer);
   every thread is reported recovered by exactly one worker (a killed worker's run in
   flight by the one that continued it), or by none when the worker that finished it
   was SIGKILLed before it wrote its report (its node ``c`` ran in that worker, the
   ledger says; at most one such thread per killed worker).

Printed: runs recovered per second (and recovery attempts per second: taken, or
refused because another worker had it), the time from the last lease expiry to the
first recovery, p50 / p99 time per recovered run, peak connections to the PostgreSQL
server (against its max_connections).

4. **The stock reference**, in the same run (``--reference-runs``, 0 for none): the same
   number of processes, each parking its share of ``--reference-runs`` threads of the same
   graph before ``c`` (``interrupt_before``) with the stock saver of the backend
   (PostgresSaver in a schema of its own, SqliteSaver on a file; LangGraph has none for
   Redis), then, released by a barrier, resuming each one by its id
   (``invoke(None, config)``): the same step, with the threads known and nothing to find,
   take or end. Then the same with InMemorySaver: LangGraph alone, no I/O, the ceiling
   of any saver on this machine. Printed: resumes/s and remit's rate as a ratio of it.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import signal
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import _bench  # noqa: E402

NAME = "scale-graph"
CTX = mp.get_context("forkserver")


def _merge(a: list[str], b: list[str]) -> list[str]:
    return a + b


class State(TypedDict, total=False):
    thread: str
    log: Annotated[list[str], _merge]


def note(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def graph(saver: Any, ledger: str, *, interrupt_before: list[str] | None = None) -> Any:
    """The benchmark's graph; with ``interrupt_before`` (the stock reference) its effect
    is a plain call, as the stock layer has no receipts."""
    from langgraph.graph import END, START, StateGraph

    from remit_langgraph import effect

    def charge_once(thread: str, *, idempotency_key: str = "") -> str:
        note(ledger, f"effect {thread}")
        return f"txn-{thread}"

    charge = charge_once if interrupt_before else effect(name="charge")(charge_once)

    def a(s: State) -> dict[str, Any]:
        return {"log": ["a"]}

    def b(s: State) -> dict[str, Any]:
        return {"log": [f"b:{charge(s['thread'])}"]}

    def c(s: State) -> dict[str, Any]:
        note(ledger, f"c {s['thread']} {os.getpid()}")
        return {"log": ["c"]}

    g = StateGraph(State)
    for name, fn in (("a", a), ("b", b), ("c", c)):
        g.add_node(name, fn)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", "c")
    g.add_edge("c", END)
    return g.compile(checkpointer=saver, name=NAME, interrupt_before=interrupt_before)


def cfg(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def produce(url: str, ledger: str, threads: list[str], lease: float, conn: Any) -> None:
    """Run each thread to after b and leave it there (see the module)."""
    from remit_langgraph import RemitSaver

    held: list[Any] = []
    with RemitSaver.from_conn_string(url, lease=lease) as saver:
        saver.store.keep_alive = lambda renew, **kw: contextlib.nullcontext()  # type: ignore[method-assign, assignment]
        app = graph(saver, ledger)
        for t in threads:
            stream = app.stream({"thread": t}, cfg(t), durability="sync",
                                stream_mode="debug")
            for event in stream:  # up to c's task: the checkpoint after b is durable
                if event["type"] == "task" and event["payload"].get("name") == "c":
                    break
            held.append(stream)  # suspended there, never closed
        # one renewal of each run at the end, so that their leases run out together
        store = saver.store
        mine = set(threads)
        for info in store.list_runs(status="running", name=NAME, limit=None):
            run = info.lifecycle
            if run is not None and run.run_id in mine and run.owner is not None:
                store.renew_run(run.run_id, owner=run.owner, fence=run.fence, lease=lease)
        conn.send(len(held))
        conn.recv()  # until SIGKILLed


def work(url: str, ledger: str, lease: float, start: Any, results: Any) -> None:
    """Recover pass after pass until no thread of the graph is left running; report
    each recovered thread's time and the pass reports."""
    from remit_core.adapter import poll
    from remit_langgraph import RemitSaver, recover

    with RemitSaver.from_conn_string(url, lease=lease) as saver:
        app = graph(saver, ledger)
        store = saver.store
        start.wait()
        recovered: list[str] = []
        refused = 0
        real_invoke = app.invoke

        def timed(inp: Any, config: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            out = real_invoke(inp, config, **kwargs)
            took, thread = time.perf_counter() - t0, config["configurable"]["thread_id"]
            # reported at once, in a file written before the call returns: a worker
            # SIGKILLed later still reports what it finished (a queue's feeder thread may
            # not have sent it yet)
            note(ledger + ".reports", f"run {os.getpid()} {thread} {time.time()!r} {took!r}")
            results.put(("run", os.getpid(), thread))
            return out

        app.invoke = timed  # type: ignore[method-assign]

        def left() -> bool | None:
            running = store.list_runs(status="running", name=NAME, limit=1)
            abandoned = store.list_runs(status="abandoned", name=NAME, limit=1)
            if abandoned:
                return True
            return False if not running else None

        while True:
            report = recover(app, limit=200)
            recovered += report.recovered
            refused += len(report.skipped)
            results.put(("pass", os.getpid(), len(report.skipped)))
            if report.total:
                continue
            more = poll(left, within=600, pause=0.05, most=0.5)
            if not more:
                break
        results.put(("end", os.getpid(), len(recovered), refused))


# ============================================================================ the reference

REFERENCES = {"postgres": "PostgresSaver", "sqlite": "SqliteSaver", "redis": None}


@contextlib.contextmanager
def stock_saver(kind: str, url: str) -> Iterator[Any]:
    """The stock saver named by ``kind`` on the benchmark's server or directory:
    PostgresSaver in a schema of its own, SqliteSaver on a file, or InMemorySaver."""
    if kind == "PostgresSaver":
        from langgraph.checkpoint.postgres import PostgresSaver

        with PostgresSaver.from_conn_string(url) as saver:
            yield saver
    elif kind == "SqliteSaver":
        from langgraph.checkpoint.sqlite import SqliteSaver

        with SqliteSaver.from_conn_string(url) as saver:
            yield saver
    else:
        from langgraph.checkpoint.memory import InMemorySaver

        yield InMemorySaver()


def resume_stock(kind: str, url: str, ledger: str, threads: list[str], start: Any,
                 results: Any) -> None:
    """The reference worker: park its own threads before ``c`` (``interrupt_before``)
    with the stock saver, wait for the others, then resume each one by its id
    (``invoke(None, config)``): the same graph and the same step as a recovery, with the
    threads known and nothing to find, take or end."""
    with stock_saver(kind, url) as saver:
        app = graph(saver, ledger, interrupt_before=["c"])
        for t in threads:
            app.invoke({"thread": t}, cfg(t), durability="sync")
        start.wait()
        t0 = time.perf_counter()
        for t in threads:
            app.invoke(None, cfg(t), durability="sync")
        results.put((t0, time.perf_counter()))


def reference(kind: str, runs: int, workers: int) -> float:
    """Resumes per second of ``workers`` processes resuming ``runs`` parked threads
    (each its share) with the stock saver ``kind`` (on a fresh schema or file): wall time
    from the first resume to the last, after a barrier."""
    with contextlib.ExitStack() as stack:
        d = stack.enter_context(_bench.temp_dir())
        ledger = os.path.join(d, "ledger")
        url = (_bench.pg_url(search_path=stack.enter_context(_bench.pg_schema("ref")))
               if kind == "PostgresSaver" else os.path.join(d, "stock.db"))
        if kind != "InMemorySaver":
            with stock_saver(kind, url) as saver:
                saver.setup()
        threads = [f"r{i:05d}" for i in range(runs)]
        start, results = CTX.Barrier(workers), CTX.Queue()
        procs = [CTX.Process(target=resume_stock,
                             args=(kind, url, ledger, threads[i::workers], start, results))
                 for i in range(workers)]
        for p in procs:
            p.start()
        spans = [results.get(timeout=900) for _ in procs]
        for p in procs:
            p.join(60)
        with open(ledger) as f:
            resumed = sum(line.startswith("c ") for line in f.read().splitlines())
        if resumed != runs:
            raise SystemExit(f"reference {kind}: {resumed} of {runs} threads resumed")
        return float(runs / (max(e for _, e in spans) - min(s for s, _ in spans)))


def pg_connections(url: str) -> tuple[int, int]:
    import psycopg

    base = url.split("?", 1)[0]
    with psycopg.connect(base, autocommit=True) as c:
        used = c.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = "
                         "'client backend'").fetchone()
        most = c.execute("SHOW max_connections").fetchone()
    return int(used[0]) if used else 0, int(most[0]) if most else 0


@contextlib.contextmanager
def store_url(backend: str) -> Iterator[str]:
    tag = f"scale{os.getpid()}"
    if backend == "sqlite":
        with _bench.temp_dir() as d:
            yield f"sqlite:///{d}/scale.db"
    elif backend == "postgres":
        with _bench.pg_schema(tag) as schema:
            yield _bench.pg_url(schema=schema) + "&pool_max=2&pool_min=1"
    else:
        with _bench.private_redis() as base:
            if base is None:
                raise SystemExit("redis-server is not installed")
            yield f"{base}?prefix={tag}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=["postgres", "redis", "sqlite"], default="postgres")
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=32)
    ap.add_argument("--kill", type=int, default=4)
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--lease", type=float, default=30.0,
                    help="the producers' and the workers' lease (seconds)")
    ap.add_argument("--reference-runs", type=int, default=2_000,
                    help="threads the stock reference resumes (0: no reference)")
    args = ap.parse_args()
    CTX.set_forkserver_preload(["recovery_scale", "remit_langgraph", "langgraph.graph"])
    with _bench.temp_dir() as d, store_url(args.backend) as url:
        ledger = os.path.join(d, "ledger")
        threads = [f"s{i:05d}" for i in range(args.runs)]
        from remit_langgraph import RemitSaver

        with RemitSaver.from_conn_string(url):  # the schema, before the producers
            pass
        t0 = time.time()
        producers = []
        for i in range(args.producers):
            parent, child = CTX.Pipe()
            p = CTX.Process(target=produce, args=(url, ledger, threads[i::args.producers],
                                                  args.lease, child))
            p.start()
            producers.append((p, parent))
        made = sum(parent.recv() for _, parent in producers)
        made_at = time.time()
        for p, _ in producers:
            os.kill(p.pid, signal.SIGKILL)
            p.join()
        print(f"{made} abandoned-to-be runs made by {args.producers} producers in "
              f"{made_at - t0:.1f} s; producers SIGKILLed")
        start, results = CTX.Event(), CTX.Queue()
        workers = [CTX.Process(target=work, args=(url, ledger, args.lease, start, results))
                   for _ in range(args.workers)]
        for w in workers:
            w.start()
        with RemitSaver.from_conn_string(url) as saver:
            expiry = {r.run_id: r.lifecycle.lease_until
                      for r in saver.store.list_runs(name=NAME, limit=None) if r.lifecycle}
        peak = [0, 0]
        stop_sampling = threading.Event()

        def sample() -> None:
            while not stop_sampling.wait(0.25):
                with contextlib.suppress(Exception):
                    used, most = pg_connections(url)
                    peak[0], peak[1] = max(peak[0], used), most

        sampler = threading.Thread(target=sample, daemon=True)
        if args.backend == "postgres":
            sampler.start()
        start.set()
        refused = 0
        ended: dict[int, tuple[Any, ...]] = {}
        done = 0
        killed: set[int] = set()
        alive = {w.pid for w in workers}
        started_at = time.time()
        while len(ended) < len(alive - killed):
            item = results.get(timeout=900)
            kind, pid = item[0], item[1]
            if kind == "end":
                ended[pid] = item
                continue
            if kind == "pass":
                refused += item[2]
                continue
            done += 1
            if not killed and done >= args.runs // 3:
                for w in workers[:args.kill]:
                    os.kill(w.pid, signal.SIGKILL)
                    killed.add(w.pid)
        finished_at = time.time()
        stop_sampling.set()
        for w in workers:
            w.join(60)
        # ------------------------------------------------------------------ checks
        with open(ledger) as f:
            lines = f.read().splitlines()
        with open(ledger + ".reports") as f:
            # ("run", pid, thread, ended, took)
            runs_done = [(kind, int(pid), thread, float(end), float(took))
                         for kind, pid, thread, end, took in (
                             line.split() for line in f.read().splitlines())]
        effects = Counter(line.split()[1] for line in lines if line.startswith("effect "))
        c_runs = Counter(line.split()[1] for line in lines if line.startswith("c "))
        by_any = Counter(r[2] for r in runs_done)
        with RemitSaver.from_conn_string(url) as saver:
            status = Counter(saver.store.get_run(t).status  # type: ignore[union-attr]
                             for t in threads)
        twice = [t for t in threads if c_runs[t] == 2]
        bad_c = [t for t in threads if c_runs[t] not in (1, 2)]
        # the pid that ran a thread's node c last: a thread nobody reported is one a
        # worker finished and was SIGKILLed before its report was written
        last_c = {line.split()[1]: int(line.split()[2]) for line in lines
                  if line.startswith("c ")}
        unreported = [t for t in threads if by_any[t] == 0]
        lost = [t for t in unreported if last_c.get(t) in killed]
        ok = (status == Counter({"done": args.runs}) and effects == Counter(
            {t: 1 for t in threads}) and not bad_c and len(twice) <= args.kill
            and all(by_any[t] == 1 or t in lost for t in threads)
            and len(lost) <= len(killed))
        ends = [(t, e, d) for _, _, t, e, d in runs_done]
        took = [d for _, _, d in ends]
        delays = sorted(e - d - expiry[t] for t, e, d in ends if t in expiry)
        recovered = len(took)
        span = max((e for _, e, _ in ends), default=finished_at) - \
            min((e - d for _, e, d in ends), default=started_at)
        print(f"backend {args.backend}: {args.runs} runs, {args.workers} workers "
              f"({len(killed)} SIGKILLed midway), lease {args.lease} s")
        print(f"  checks: {'OK' if ok else 'FAILED'}: status {dict(status)}; effect once: "
              f"{all(effects[t] == 1 for t in threads)}; node c once: "
              f"{args.runs - len(twice) - len(bad_c)}, twice (a killed worker was in it): "
              f"{len(twice)}, other: {len(bad_c)}; reported recovered exactly once: "
              f"{sum(by_any[t] == 1 for t in threads)}/{args.runs}, twice: "
              f"{sum(by_any[t] > 1 for t in threads)}, by none: {len(unreported)} (of them "
              f"finished by a worker SIGKILLed before it reported: {len(lost)})")
        begin = min((e - d for _, e, d in ends), default=started_at)
        finish = sorted(e - begin for _, e, _ in ends)
        bulk = finish[int(len(finish) * 0.9) - 1] if finish else span
        rate = 0.9 * recovered / bulk if finish else 0.0
        print(f"  recovered {recovered} runs in {span:.1f} s (first recovery's start to the "
              f"last one's end; the last ones waited out the killed workers' lease); 90 % "
              f"in {bulk:.1f} s: {rate:.0f} runs/s; attempts (taken, or "
              f"refused: another worker had it) {(recovered + refused) / span:.0f}/s over "
              "the whole span")
        if delays:
            print(f"  from a run's lease expiry to its recovery's start: first "
                  f"{delays[0]:.2f} s, median {statistics.median(delays):.2f} s, max "
                  f"{delays[-1]:.2f} s (workers idle before the expiries)")
        if took:
            q = statistics.quantiles(took, n=100)
            print(f"  per run: p50 {statistics.median(took) * 1e3:.1f} ms, "
                  f"p99 {q[98] * 1e3:.1f} ms")
        if args.backend == "postgres":
            print(f"  peak PostgreSQL client connections: {peak[0]} of max_connections "
                  f"{peak[1]} (pool_max=2 per worker)")
    if args.reference_runs:
        print(f"  the same resume on the stock layer, {args.workers} processes, "
              f"{args.reference_runs} parked threads resumed by id (interrupt_before c; "
              "nothing to find, take or end), this run:")
        stock_kind = REFERENCES[args.backend]
        for kind in ([stock_kind] if stock_kind else []) + ["InMemorySaver"]:
            got = reference(kind, args.reference_runs, args.workers)
            print(f"    {kind}: {got:.0f} resumes/s; remit's recovery above: "
                  f"{rate / got:.2f}x")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
