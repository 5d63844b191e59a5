"""remit against the stock persistence layers, measured in one run on one machine.

    uv run python benchmarks/run.py                 # everything (several minutes)
    uv run python benchmarks/run.py --quick         # fewer repetitions, shorter histories
    uv run python benchmarks/run.py --only 1,4      # some items
    uv run python benchmarks/run.py --backends sqlite

Items, numbered as issue 16's target table (1-6), then two older ones (7, 8); each row
prints its target and whether it is met (see benchmarks/README.md for the latest table):

1. LangGraph: time per step of a 200-step linear graph, durability sync and async;
   target <= 0.8x SqliteSaver, <= 0.9x PostgresSaver
2. LangGraph: get_tuple of the latest checkpoint at history lengths 10 / 1 000 / 100 000;
   target <= 1.0x stock on SQLite and PostgreSQL, and flat (100 000 / 10 <= 1.5x)
3. LangGraph: 64 and 256 concurrent ainvoke of a 10-step graph (async nodes), RemitSaver
   on PostgreSQL and on Redis against AsyncPostgresSaver on an AsyncConnectionPool;
   target >= 1.2x its runs/s, event-loop lag p99 <= 5 ms while they run
4. LangGraph: a 200-turn chat thread (add_messages, two messages a turn); target bytes
   stored <= 0.1x SqliteSaver's, <= 0.2x PostgresSaver's, time per turn <= 0.8x
5. @effect overhead per call; target <= 2.2x one durable write of the backend
6. CrewAI persistence per method, pydantic-graph persistence per node; target <= 1.0x stock
7. LangGraph: bytes stored for a 1 MB value left unchanged over 100 steps; target <= 1.2 MB
8. 16 processes racing for one claim (Store.claim_once); target < 50 ms (SQLite, PostgreSQL)

Each item runs in a fresh subprocess of this script (CrewAI sets process-wide
state at import); ``--in-process`` runs them here, e.g. under a profiler.
PostgreSQL: REMIT_BENCH_PG (default postgresql://postgres@127.0.0.1:5432/test),
each side in a schema of its own, dropped afterwards. Redis: a private
redis-server with AOF (appendfsync always) started for the run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import importlib.metadata as md
import json
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import _bench  # noqa: E402

MODULES = {"1": "lg", "2": "lg", "3": "lg_async", "4": "lg", "5": "core", "6": "frameworks",
           "7": "lg", "8": "core"}
ALL_BACKENDS = ("sqlite", "postgres", "redis")


def run_item(item: str, backends: list[str]) -> list[dict[str, Any]]:
    module = importlib.import_module(MODULES[item])
    rows = module.ITEMS[item](backends)
    return [r.as_dict() for r in rows]


def child(item: str, backends: list[str], quick: bool) -> list[dict[str, Any]]:
    with tempfile.NamedTemporaryFile("r", suffix=".json", delete=False) as f:
        out = f.name
    cmd = [sys.executable, os.path.abspath(__file__), "--child", item, "--out", out,
           "--backends", ",".join(backends)] + (["--quick"] if quick else [])
    try:
        proc = subprocess.run(cmd, check=False)
        if proc.returncode != 0:
            return [{"item": item, "what": "FAILED (see stderr above)", "backend": "",
                     "remit": "", "stock": "", "ratio": None, "target": "", "met": False,
                     "note": f"exit code {proc.returncode}", "raw": {}}]
        with open(out) as fh:
            rows: list[dict[str, Any]] = json.load(fh)
            return rows
    finally:
        os.unlink(out)


# ================================================================================== report


def _sh(cmd: str) -> str:
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True,
                              timeout=10).stdout.rstrip()
    except Exception as exc:  # pragma: no cover - informational only
        return f"({exc})"


def machine() -> dict[str, str]:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": _sh("nproc"),
        "cpu": cpu,
        "free -g": _sh("free -g"),
        "uptime": _sh("uptime"),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
    }


def versions() -> dict[str, str]:
    out: dict[str, str] = {}
    for name in ("remit-core", "remit-langgraph", "remit-crewai", "remit-pydantic-graph",
                 "langgraph", "langgraph-checkpoint", "langgraph-checkpoint-sqlite",
                 "langgraph-checkpoint-postgres", "crewai", "pydantic-graph", "psycopg",
                 "redis", "hiredis"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "-"
    out["git"] = _sh(f"git -C {HERE} rev-parse --short HEAD") + (
        " (dirty)" if _sh(f"git -C {HERE} status --porcelain -- ../shared ../packages") else "")
    try:
        import psycopg

        with psycopg.connect(_bench.PG_URL, connect_timeout=3) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            out["postgresql"] = str(row[0]) if row else "?"
    except Exception:
        out["postgresql"] = "unavailable"
    out["redis-server"] = _sh("redis-server --version").split(" ")[2].removeprefix("v=") \
        if _sh("command -v redis-server") else "-"
    return out


def _fmt_ratio(r: float | None) -> str:
    return "" if r is None else f"{r:.2f}x"


def _fmt_met(m: bool | None) -> str:
    return "" if m is None else ("yes" if m else "**no**")


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| # | measure | backend | remit | stock / reference | ratio | target | met |",
             "|---|---|---|---|---|---|---|---|"]
    notes: list[str] = []
    for r in rows:
        what = r["what"]
        if r.get("note"):
            notes.append(r["note"])
            what += f" [{len(notes)}]"
        lines.append(f"| {r['item']} | {what} | {r['backend']} | {r['remit']} | {r['stock']} | "
                     f"{_fmt_ratio(r['ratio'])} | {r['target']} | {_fmt_met(r['met'])} |")
    if notes:
        lines.append("")
        lines += [f"[{i}] {n}" for i, n in enumerate(notes, 1)]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (for development)")
    ap.add_argument("--only", default=",".join(MODULES), help="items, e.g. 1,4 (default all)")
    ap.add_argument("--backends", default=",".join(ALL_BACKENDS))
    ap.add_argument("--in-process", action="store_true", help="no subprocess per item")
    ap.add_argument("--json", help="also write the rows and the machine info to this file")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    _bench.QUICK = args.quick
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(backends) - set(ALL_BACKENDS)
    if unknown:
        ap.error(f"unknown backend(s) {', '.join(sorted(unknown))}")
    if args.child:
        got = run_item(args.child, backends)
        with open(args.out, "w") as f:
            json.dump(got, f)
        return 0
    items = [i.strip() for i in args.only.split(",") if i.strip()]
    bad = [i for i in items if i not in MODULES]
    if bad:
        ap.error(f"unknown item(s) {', '.join(bad)}; items are 1-{len(MODULES)}")
    before = machine()
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    loads: list[str] = []
    for item in items:
        loads.append(f"{item}: {os.getloadavg()[0]:.1f}")
        print(f"-- item {item} ...", file=sys.stderr, flush=True)
        got = run_item(item, backends) if args.in_process else child(item, backends, args.quick)
        rows += got
        print(table(got), file=sys.stderr, flush=True)
    after = machine()
    info = {**before, "1-minute load as each item started": ", ".join(loads),
            "uptime after": after["uptime"],
            "duration": f"{time.perf_counter() - t0:.0f} s", "quick": str(args.quick)}
    vers = versions()
    print()
    print(table(rows))
    print()
    for k, v in info.items():
        if k == "free -g":
            print(f"- {k}:\n```\n{v}\n```")
        else:
            print(f"- {k}: {v}")
    print("- versions: " + ", ".join(f"{k} {v}" for k, v in vers.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "machine": info, "versions": vers}, f, indent=1)
    failed = [r for r in rows if r["what"].startswith("FAILED")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
