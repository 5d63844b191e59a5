"""The ``remit`` command: ``check``, ``inspect``, ``migrate``, ``worker`` and ``effects``.

``inspect`` looks inside a store. ``worker`` recovers abandoned runs continuously
(:mod:`remit_core.worker`). ``effects`` lists the effects in doubt and settles them by
hand. ``migrate`` imports runs that a stock
persistence layer stored; each adapter registers its own part (the entry points of
:mod:`remit_core.registry`). ``check`` runs the resume contract's fault matrix for
every installed adapter, stock against remit; the matrix is the package remit-check
(``remit_check``), which the runtime packages do not install.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import inspect
import json
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from remit_core.errors import RemitError
from remit_core.registry import GROUP, registrations
from remit_core.store import open_store
from remit_core.urls import mask_url, scrub_lines, url_secrets

CHECK_DIST = "remit-check"
"""The distribution of ``remit check`` (import ``remit_check``)."""
CHECK_MISSING = ("remit check: the fault matrix is not installed (it is the package "
                 f"{CHECK_DIST}): pip install {CHECK_DIST}")


def _ts(t: float | None) -> str:
    if t is None:
        return "-"
    return dt.datetime.fromtimestamp(t, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    if not rows:
        return "  (none)"
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    head = "  ".join(c.ljust(widths[c]) for c in columns)
    lines = [head, "  ".join("-" * widths[c] for c in columns)]
    lines += ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in columns) for r in rows]
    return "\n".join("  " + line for line in lines)


def _versions() -> str:
    """``remit X (remit-core X, remit-check X, <each adapter> X; Python X)``: the installed
    remit packages (the adapters are the distributions that register entry points)."""
    from importlib.metadata import PackageNotFoundError, version

    from remit_core.registry import distributions
    from remit_core.serde import ENTRY_POINT_GROUP

    found = []
    adapters = [d for d in distributions(GROUP, ENTRY_POINT_GROUP) if d != "remit-core"]
    for dist in ("remit-core", CHECK_DIST, *adapters):
        try:
            found.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            continue
    core = found[0].split()[1] if found and found[0].startswith("remit-core ") else "?"
    return f"remit {core} ({', '.join(found)}; Python {sys.version.split()[0]})"


class _Version(argparse.Action):
    """``--version``, printed as one line (argparse's own action re-wraps it)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        print(_versions())
        parser.exit()


def _lifecycle(state: Any) -> dict[str, Any]:
    """A run's lifecycle as ``remit inspect`` shows it ("-" where no adapter kept one)."""
    if state is None:
        return {"status": "-", "name": "-", "owner": "-"}
    shown: dict[str, Any] = {"status": state.status, "name": state.name,
                             "owner": state.owner or "-", "framework": state.framework,
                             "attempts": state.attempts}
    if state.waiting is not None:
        shown["waiting"] = state.waiting
    if state.error is not None:
        shown["error"] = state.error
    return shown


@contextlib.contextmanager
def _reading(url: str) -> Iterator[Any]:
    """The store at ``url``, read-only (inspection creates no file, table, schema or key),
    decoding every adapter's types and showing unknown ones as such. The adapters' types
    are loaded once the store opened: a URL that cannot be opened imports no framework."""
    from remit_core.serde import inspect_serde

    with open_store(url, read_only=True) as store:
        store.serde = inspect_serde()
        yield store


def _inspect(args: argparse.Namespace) -> int:
    with _reading(args.url) as store:
        report: dict[str, Any] = {"store": store.url}
        if args.run is None:
            report["runs"] = [
                {"run_id": r.run_id, **_lifecycle(r.lifecycle), "checkpoints": r.checkpoints,
                 "latest_checkpoint": r.latest_checkpoint_id, "latest_kind": r.latest_kind,
                 "updated": _ts(r.updated_at)}
                for r in store.list_runs(limit=args.limit, status=args.status, name=args.name)
            ]
        else:
            report["run_id"] = args.run
            report["checkpoints"] = [
                {"seq": c.seq, "ns": c.ns, "checkpoint_id": c.checkpoint_id,
                 "parent_id": c.parent_id, "kind": c.kind, "channels": ",".join(sorted(c.versions)),
                 "pending_writes": len(c.writes), "created": _ts(c.created_at)}
                for c in store.list_checkpoints(args.run, limit=args.limit)
            ]
        report["receipts"] = [
            {"key": r.key, "status": r.status, "owner": r.owner, "attempt": r.attempt,
             "lease_until": _ts(r.lease_until), "completed": _ts(r.completed_at)}
            for r in store.list_receipts(args.run)
        ]
        report["claims"] = [
            {"key": c.key, "status": c.status, "owner": c.owner, "fence": c.fence,
             "digest": (c.digest or "")[:16], "lease_until": _ts(c.lease_until),
             "consumed": _ts(c.consumed_at)}
            for c in store.list_claims(args.run)
        ]
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return 0
    print(f"store: {report['store']}")
    if "runs" in report:
        print("runs:")
        print(_table(report["runs"], ["run_id", "status", "name", "owner", "checkpoints",
                                      "latest_checkpoint", "latest_kind", "updated"]))
    else:
        print(f"checkpoints of run {args.run!r} (newest first):")
        print(_table(report["checkpoints"], ["seq", "ns", "checkpoint_id", "parent_id", "kind",
                                             "channels", "pending_writes", "created"]))
    print("receipts:")
    print(_table(report["receipts"], ["key", "status", "owner", "attempt", "lease_until",
                                      "completed"]))
    print("claims:")
    print(_table(report["claims"], ["key", "status", "owner", "fence", "digest", "lease_until",
                                    "consumed"]))
    return 0


def _in_doubt(receipt: Any, now: float) -> bool:
    """Started by a process whose lease ran out before it recorded a result."""
    return bool(receipt.status == "started" and receipt.lease_until <= now)


def _effects_list(args: argparse.Namespace) -> int:
    import time

    with _reading(args.url) as store:
        now = time.time()
        waiting = {}
        for info in store.list_runs(status="needs-attention", limit=None):
            run = info.lifecycle
            if run is not None and isinstance(run.waiting, dict):
                waiting[run.waiting.get("receipt")] = run.run_id
        rows = [
            {"key": r.key, "run_id": r.run_id, "step": r.step, "effect": r.name,
             "status": "in doubt" if _in_doubt(r, now) else r.status,
             "owner": r.owner or "-", "started": _ts(r.started_at),
             "run_waits": "yes" if r.key in waiting else "-"}
            for r in store.list_receipts(args.run)
            if args.all or _in_doubt(r, now)
        ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"effects {'(all)' if args.all else 'in doubt'} in {store.url}:")
    print(_table(rows, ["key", "run_id", "step", "effect", "status", "owner", "started",
                        "run_waits"]))
    if rows and not args.all:
        print("settle each with: remit effects resolve URL KEY --result JSON "
              "| --rerun | --failed WHY")
    return 0


def _effects_resolve(args: argparse.Namespace) -> int:
    import time

    from remit_core.store import new_owner

    with open_store(args.url) as store:
        receipt = store.get_receipt(args.key)
        if receipt is None:
            print(f"remit effects: no effect receipt {args.key!r} in {store.url}",
                  file=sys.stderr)
            return 1
        if receipt.status == "completed":
            print(f"remit effects: receipt {args.key!r} has a result already "
                  f"(completed {_ts(receipt.completed_at)}); nothing to settle",
                  file=sys.stderr)
            return 1
        if not _in_doubt(receipt, time.time()):
            print(f"remit effects: receipt {args.key!r} is being called now by "
                  f"{receipt.owner} (lease until {_ts(receipt.lease_until)}); it is not in "
                  "doubt", file=sys.stderr)
            return 1
        waiting = [info.lifecycle for info in store.list_runs(status="needs-attention")
                   if info.lifecycle is not None and isinstance(info.lifecycle.waiting, dict)
                   and info.lifecycle.waiting.get("receipt") == args.key]
        if args.result is not None:
            try:
                result = json.loads(args.result)
            except json.JSONDecodeError as exc:
                print(f"remit effects: --result is not JSON ({exc}); nothing was recorded",
                      file=sys.stderr)
                return 2
            store.resolve_receipt(args.key, result)
            what = "recorded its result; the effect returns it and is not called again"
        elif args.rerun:
            store.reset_receipt(args.key)
            what = "forgot its receipt; the effect is called again"
        else:
            store.reset_receipt(args.key)
            owner = new_owner()
            for run in waiting:
                start = store.recover_run(run.run_id, owner=owner, attention=True)
                if start.owns and start.run is not None:
                    store.end_run(run.run_id, owner=owner, fence=start.run.fence,
                                  status="failed",
                                  error={"type": "EffectFailed", "message": args.failed,
                                         "receipt": args.key})
            print(f"receipt {args.key!r}: recorded as failed ({args.failed}); "
                  + (f"run {', '.join(r.run_id for r in waiting)} is failed (a recovery "
                     "with --retry-failed calls the effect again)" if waiting else
                     "no run waits for it"))
            return 0
        runs = ", ".join(r.run_id for r in waiting)
        print(f"receipt {args.key!r}: {what}"
              + (f"; the next recovery continues run {runs}" if waiting else ""))
    return 0


def _worker(args: argparse.Namespace) -> int:
    import logging
    import signal

    from remit_core.worker import Worker, load_app, targets_for

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    targets = targets_for(load_app(args.app), args.store)
    worker = Worker(targets, interval=args.interval, concurrency=args.concurrency,
                    retry_failed=args.retry_failed, max_attempts=args.max_attempts)

    def stop(signum: int, frame: Any) -> None:
        logging.getLogger("remit.worker").info(
            "remit worker %s: %s: taking nothing more, finishing what it holds",
            worker.owner, signal.Signals(signum).name)
        worker.stop(wait=0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        if args.once:
            worker.run_once()
        else:
            worker.run()
    finally:
        worker.close()
    print(f"remit worker {worker.owner}: {worker.totals}", flush=True)
    return 0


def _migrate(args: argparse.Namespace) -> int:
    from remit_core.migrate import migrate_command

    migrate = migrate_command(args.framework)
    options: dict[str, Any] = {} if args.run_id is None else {"run_id": args.run_id}
    takes = inspect.signature(migrate).parameters
    if args.name is not None:
        if "name" not in takes:
            print(f"remit: --name: the {args.framework} import takes no name (a run it "
                  "keeps is under its graph's name, from --app); leave the option out",
                  file=sys.stderr)
            return 2
        options["name"] = args.name
    if args.app is not None:
        if "graph" not in takes:
            print(f"remit: --app: the {args.framework} import takes no graph; leave the "
                  "option out", file=sys.stderr)
            return 2
        from remit_core.worker import load_app

        found = load_app(args.app)
        if len(found) != 1:
            print(f"remit: --app {args.app}: names {len(found)} objects; the import takes "
                  "one graph", file=sys.stderr)
            return 2
        options["graph"] = found[0]
    report = migrate(args.source, args.target, **options)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(report.summary())
        for note in report.notes:
            print(f"  {note}")
    return 0


def _check_faults() -> list[str] | None:
    """The fault points ``remit check`` knows, or None when remit-check is not installed."""
    import importlib.util

    if importlib.util.find_spec("remit_check") is None:
        return None
    from remit_check import FAULTS

    return list(FAULTS)


def _check(args: argparse.Namespace) -> int:
    import importlib.util
    from pathlib import Path

    if importlib.util.find_spec("remit_check") is None:
        print(CHECK_MISSING, file=sys.stderr)
        return 2
    from remit_check import run_check
    from remit_check.report import text, write_html, write_json

    if args.store is not None:
        # an unusable store is a configuration error, found before any cell runs
        try:
            open_store(args.store).close()
        except RemitError as exc:
            print(f"remit check: cannot use --store {mask_url(args.store)!r}: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)
            return 2
    report = run_check(args.framework or None, store_url=args.store, k=args.k, reps=args.reps,
                       progress=not args.quiet, only=args.fault or None)
    print(text(report))
    if args.json:
        write_json(report, Path(args.json))
        print(f"JSON report: {args.json}")
    if args.html:
        write_html(report, Path(args.html))
        print(f"HTML report: {args.html}")
    return 0 if report.ok else 1


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="remit", description="Resume means resume.")
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="print the versions of the installed remit packages and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    ins = sub.add_parser("inspect", help="list runs, checkpoints, receipts and claims")
    ins.add_argument("url", help="store URL, e.g. sqlite:///app.db")
    ins.add_argument("run", nargs="?", help="a run id: show its checkpoints")
    ins.add_argument("--json", action="store_true", help="print JSON")
    ins.add_argument("--limit", type=int, default=50)
    ins.add_argument("--status", choices=["running", "abandoned", "parked", "done", "failed",
                                          "needs-attention"],
                     help="only the runs in this lifecycle status (abandoned: running, its "
                     "executor's lease expired)")
    ins.add_argument("--name", help="only the runs of this graph or flow name")
    ins.set_defaults(func=_inspect)
    wrk = sub.add_parser("worker", help="recover abandoned runs continuously")
    wrk.add_argument("--app", required=True, metavar="MODULE:ATTR",
                     help="the graph(s) or flow(s) to recover: a compiled LangGraph graph, a "
                     "CrewAI flow class, ..., a list of them, or a function returning them")
    wrk.add_argument("--store", help="the store URL (default: the store each graph's or "
                     "flow's own remit persistence uses)")
    wrk.add_argument("--concurrency", type=_positive, default=1,
                     help="runs continued at a time (default 1)")
    wrk.add_argument("--interval", type=float, default=5.0,
                     help="seconds between passes that find nothing (default 5)")
    wrk.add_argument("--retry-failed", action="store_true",
                     help="also retry runs whose last execution raised")
    wrk.add_argument("--max-attempts", type=int, default=10,
                     help="executions a run gets before recovery gives it up (default 10; "
                     "0: no bound)")
    wrk.add_argument("--once", action="store_true", help="one pass, then exit")
    wrk.set_defaults(func=_worker)
    eff = sub.add_parser("effects", help="list effects in doubt and settle them")
    efs = eff.add_subparsers(dest="action", required=True)
    el = efs.add_parser("list", help="the effects whose process died mid-call")
    el.add_argument("url", help="store URL")
    el.add_argument("--run", help="only this run's")
    el.add_argument("--all", action="store_true", help="every receipt, not only in doubt")
    el.add_argument("--json", action="store_true", help="print JSON")
    el.set_defaults(func=_effects_list)
    er = efs.add_parser("resolve", help="settle an effect in doubt after checking the "
                        "outside system")
    er.add_argument("url", help="store URL")
    er.add_argument("key", help="the receipt key (remit effects list)")
    how = er.add_mutually_exclusive_group(required=True)
    how.add_argument("--result", metavar="JSON",
                     help="the call happened: its result, which the effect returns")
    how.add_argument("--rerun", action="store_true",
                     help="the call did not happen: call the effect again")
    how.add_argument("--failed", metavar="WHY",
                     help="the call failed: the run waiting for it fails with WHY")
    er.set_defaults(func=_effects_resolve)
    faults = _check_faults()
    chk = sub.add_parser("check", help="run the resume-contract fault matrix, stock vs remit"
                         + ("" if faults is not None else f" (needs {CHECK_DIST})"))
    chk.add_argument("--store", help="a remit store URL to test on (default: a temporary "
                     "SQLite file); use a PostgreSQL or Redis server to test across hosts")
    chk.add_argument("--framework", action="append", choices=list(registrations("check")),
                     help="only this framework (repeatable; default: every installed one)")
    chk.add_argument("--fault", action="append", choices=faults,
                     help="only this fault point (repeatable)")
    chk.add_argument("--k", type=int, default=4, help="concurrent resumers (default 4)")
    chk.add_argument("--reps", type=int, default=2, help="repetitions per cell (default 2)")
    chk.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    chk.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page")
    chk.add_argument("--quiet", action="store_true", help="no progress bar")
    chk.set_defaults(func=_check)
    mig = sub.add_parser("migrate", help="import runs from a stock persistence layer")
    fw = mig.add_subparsers(dest="framework", required=True)
    from remit_core.migrate import frameworks

    for framework in frameworks():
        p = fw.add_parser(framework, help=f"import from the stock {framework} persistence")
        p.add_argument("--from", dest="source", required=True,
                       help="the stock store: a file path or a database URL")
        p.add_argument("--to", dest="target", required=True, help="the remit store URL")
        p.add_argument("--json", action="store_true", help="print the report as JSON")
        p.add_argument("--run-id", dest="run_id", default=None,
                       help="the run id to store under, for a source that holds one run "
                            "and does not name it; elsewhere, import only this run")
        p.add_argument("--app", default=None, metavar="MODULE:ATTR",
                       help="the app's graph (langgraph: a compiled graph; pydantic-graph: a "
                            "Graph), as for `remit worker`: its types are checked and each "
                            "imported run is kept in the run lifecycle, so `recover` and "
                            "`remit worker` find the runs a stock process left mid-run")
        p.add_argument("--name", default=None,
                       help="the name the imported run is kept under in the run lifecycle "
                            "(what `recover` and `remit worker` look for; pydantic-graph: "
                            "default, the id of the run's first node; crewai: the @durable "
                            "class's name, which keeps each flow parked on feedback parked)")
        p.set_defaults(func=_migrate)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except RemitError as exc:
        print(f"remit: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except Exception:
        # an unexpected error still never shows a password of a URL on the command line
        import traceback

        secrets = [s for a in (argv if argv is not None else sys.argv[1:]) if "://" in a
                   for s in url_secrets(a)]
        print(scrub_lines(traceback.format_exc(), secrets), file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
