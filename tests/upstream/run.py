"""Run a framework's own released test suite on its stock layer and on remit's adapter.

    python -m tests.upstream.run [--store sqlite|postgres|redis] [--workers N] langgraph \\
        [-- PYTEST ARGS]

1. downloads the sdist of the *installed* release of the framework with ``pip download``
   (cached under ``$REMIT_UPSTREAM_CACHE``, default ``~/.cache/remit/upstream``) and
   keeps its ``tests/`` and pytest configuration (not its source: the installed release
   is what is tested); nothing of it is copied into this repository;
2. runs those tests with a plugin of ours (``plugins/remit_upstream_<framework>.py``) that
   puts remit's adapter beside the stock layer in the suite's persistence fixtures;
3. pairs every remit test with its stock twin and prints the *remit-only failures*: tests
   that pass on the stock layer and fail on remit.

It exits 1 when a remit-only failure is not on the documented list of deliberate
differences (a table in the adapter's README, each row a test id, the contract property
that requires it and what to do instead), or when the run compared nothing; 0 otherwise.
Before that, each such failure is run again serially, RERUNS times: one that passes every
re-run is printed as having done so and does not fail the run (LangGraph's streaming
tests time their chunks to 0.1 s windows that a loaded machine can miss once); one that
fails any re-run stays a failure.
``--json FILE`` writes the counts and lists. LangGraph's suite runs on pytest-xdist
workers (``--workers``, default up to 2); CrewAI's serially.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = Path(__file__).resolve().parent / "plugins"
CACHE = Path(os.environ.get("REMIT_UPSTREAM_CACHE",
                            Path.home() / ".cache" / "remit" / "upstream"))


@dataclasses.dataclass(frozen=True)
class Suite:
    framework: str  # the distribution whose sdist holds the tests
    plugin: str  # module in plugins/
    readme: Path  # the adapter README with the documented list
    pairs: dict[str, str]  # stock parameter id -> remit parameter id
    args: tuple[str, ...]  # what to run, relative to the sdist root
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    #: runs on pytest-xdist workers by default (checked to give the serial run's outcomes)
    parallel: bool = False


SUITES = {
    "langgraph": Suite(
        framework="langgraph",
        plugin="remit_upstream_langgraph",
        readme=ROOT / "packages/remit-langgraph/README.md",
        pairs={"sqlite": "remit", "sqlite_aio": "remit_aio"},
        args=("tests",),
        # the suite's PostgreSQL fixtures expect a docker compose server on port 5442
        env={"NO_DOCKER": "true"},
        # 2 workers: the same 648 + 648 outcomes as serially, in 101 s instead of 168 s
        parallel=True,
    ),
    # CrewAI's flow-persistence and human-feedback tests: the files about saving, loading
    # and restoring flow state or parking and resuming human feedback (grep: persist,
    # FlowPersistence, human_feedback, HumanFeedback). Left out: files that only mention
    # it while testing something else (tracing, telemetry, events, the conversational and
    # declaration DSLs), those that bring their own in-memory FlowPersistence (ask, the
    # feedback trace events), and the stock class's own SQLite connection handling. Each
    # test runs on the stock layer and on remit (the plugin's stock / remit parameter).
    "crewai": Suite(
        framework="crewai",
        plugin="remit_upstream_crewai",
        readme=ROOT / "packages/remit-crewai/README.md",
        pairs={"stock": "remit"},
        args=(
            "tests/test_flow_persistence.py",
            "tests/test_flow_persistence_factory.py",
            "tests/test_flow_default_override.py",
            "tests/test_flow_resumability_regression.py",
            "tests/test_async_human_feedback.py",
            "tests/test_human_feedback_decorator.py",
            "tests/test_human_feedback_integration.py",
        ),
    ),
}

#: the heading of the README section that holds the documented list
LIST_HEADING = re.compile(r"^#+ .*deliberate differences", re.IGNORECASE)
LIST_ROW = re.compile(r"^\|\s*`(tests/[^`]+)`")


def documented(readme: Path) -> list[str]:
    """Test ids in the first table under the "deliberate differences" heading."""
    ids: list[str] = []
    inside = False
    for line in readme.read_text(encoding="utf-8").splitlines():
        if LIST_HEADING.match(line):
            inside = True
            continue
        if inside and line.startswith("#"):
            break
        if inside and (m := LIST_ROW.match(line)):
            ids.append(m.group(1))
    return ids


#: what is kept of an unpacked sdist: its tests and the pytest configuration; not the
#: package's source, which would shadow the installed release on sys.path (the run's
#: working directory is the sdist's root)
KEEP = ("tests", "pyproject.toml", "conftest.py")


def sdist(framework: str, version: str) -> Path:
    """The tests of the released sdist of ``framework==version`` (downloaded once)."""
    target = CACHE / f"{framework}-{version}-tests"
    if (target / "tests").is_dir():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             "--disable-pip-version-check", "-q", "-d", tmp, f"{framework}=={version}"],
            check=True)
        (archive,) = Path(tmp).glob("*.tar.gz")
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        (unpacked,) = (p for p in Path(tmp).iterdir() if p.is_dir())
        kept = Path(tmp) / "kept"
        kept.mkdir()
        for name in KEEP:
            if (unpacked / name).exists():
                (unpacked / name).rename(kept / name)
        kept.rename(target)
    return target


def twin(nodeid: str, pairs: dict[str, str]) -> tuple[str, str] | None:
    """(layer, the id with the layer's parameter replaced by the stock one), or None
    for a test that is not parametrized by layer."""
    head, sep, params = nodeid.partition("[")
    if not sep:
        return None
    parts = params[:-1].split("-")
    remit = {v: k for k, v in pairs.items()}
    for i, part in enumerate(parts):
        if part in pairs:
            return "stock", nodeid
        if part in remit:
            parts[i] = remit[part]
            return "remit", f"{head}[{'-'.join(parts)}]"
    return None


@dataclasses.dataclass
class Comparison:
    stock: dict[str, int]
    remit: dict[str, int]
    remit_only: dict[str, str]  # remit id -> failure message
    stock_only: list[str]  # remit passes, stock fails
    listed: list[str]  # documented, and failing remit-only in this run
    unlisted: dict[str, str]
    listed_but_passing: list[str]
    #: unlisted at first, then passed every serial re-run (see RERUNS)
    passed_on_rerun: dict[str, str] = dataclasses.field(default_factory=dict)


def compare(outcomes: Sequence[dict[str, str]], pairs: dict[str, str],
            allowed: Sequence[str]) -> Comparison:
    stock: dict[str, dict[str, str]] = {}
    remit: dict[str, tuple[str, dict[str, str]]] = {}
    for entry in outcomes:
        found = twin(entry["nodeid"], pairs)
        if found is None:
            continue
        layer, key = found
        if layer == "stock":
            stock[key] = entry
        else:
            remit[key] = (entry["nodeid"], entry)

    def count(entries: Sequence[dict[str, str]]) -> dict[str, int]:
        out = {"passed": 0, "failed": 0, "skipped": 0}
        for e in entries:
            out[e["outcome"]] += 1
        return out

    remit_only: dict[str, str] = {}
    stock_only: list[str] = []
    for key, (remit_id, entry) in sorted(remit.items()):
        base = stock.get(key)
        if base is None:
            continue
        if base["outcome"] == "passed" and entry["outcome"] == "failed":
            remit_only[remit_id] = entry["message"]
        elif base["outcome"] == "failed" and entry["outcome"] == "passed":
            stock_only.append(remit_id)
    allowed_set = set(allowed)
    passed = {remit_id for remit_id, entry in remit.values() if entry["outcome"] == "passed"}
    return Comparison(
        stock=count(list(stock.values())),
        remit=count([e for _, e in remit.values()]),
        remit_only=remit_only,
        stock_only=stock_only,
        listed=[t for t in remit_only if t in allowed_set],
        unlisted={t: m for t, m in remit_only.items() if t not in allowed_set},
        listed_but_passing=[t for t in allowed if t in passed],
    )


def parallel(workers: int) -> list[str]:
    """pytest-xdist's ``-n`` for ``workers`` processes (none for one, or without xdist)."""
    if workers <= 1:
        return []
    if importlib.util.find_spec("xdist") is None:
        print(f"upstream: pytest-xdist is not installed; running serially, not on {workers} "
              "workers", flush=True)
        return []
    return ["-n", str(workers)]


#: serial re-runs of a remit-only failure that is not on the documented list: it counts
#: as a failure unless it passes every one (the suite's streaming tests time their chunks
#: to 0.1 s windows, which a loaded 2-CPU machine can miss once; a real difference fails
#: again)
RERUNS = 3


def pytest_run(suite: Suite, root: Path, store: str, args: Sequence[str],
               workers: int) -> tuple[list[dict[str, str]], float] | None:
    """Run pytest on the suite with our plugin; (the outcomes, seconds), or None when
    pytest gave no comparable result."""
    with tempfile.TemporaryDirectory(prefix="remit-upstream-") as tmp:
        report = Path(tmp) / "outcomes.jsonl"
        env = {
            **os.environ, **suite.env,
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(PLUGINS), os.environ.get("PYTHONPATH", "")) if p),
            "REMIT_UPSTREAM_STORE": store,
            "REMIT_UPSTREAM_REPORT": str(report),
        }
        # test paths given on the command line replace the suite's default selection
        paths = [] if any(a.startswith("tests") for a in args) else list(suite.args)
        command = [
            sys.executable, "-m", "pytest", *paths, "-p", suite.plugin,
            # the suite's own addopts, less --full-trace and --durations
            "-o", "addopts=--strict-markers --snapshot-warn-unused",
            "-p", "no:cacheprovider", "-q", "--tb=short", "--timeout=180",
            *parallel(workers), *args,
        ]
        print(f"upstream: {suite.framework}, remit on {store}: {' '.join(command[1:])}",
              flush=True)
        started = time.monotonic()
        code = subprocess.run(command, cwd=root, env=env).returncode
        elapsed = time.monotonic() - started
        if code not in (0, 1) or not report.exists():
            print(f"upstream: pytest exited {code} without a comparable result", file=sys.stderr)
            return None
        return [json.loads(line) for line in report.read_text().splitlines() if line], elapsed


def rerun(suite: Suite, root: Path, store: str, tests: Sequence[str]) -> list[str]:
    """The ``tests`` that pass each of RERUNS serial re-runs."""
    passing = set(tests)
    for _ in range(RERUNS):
        if not passing:
            break
        got = pytest_run(suite, root, store, sorted(passing), 1)
        outcomes = {} if got is None else {e["nodeid"]: e["outcome"] for e in got[0]}
        passing = {t for t in passing if outcomes.get(t) == "passed"}
    return sorted(passing)


def run(name: str, store: str, pytest_args: Sequence[str], json_out: str | None,
        workers: int = 1) -> int:
    suite = SUITES[name]
    version = metadata.version(suite.framework)
    root = sdist(suite.framework, version)
    got = pytest_run(suite, root, store, pytest_args, workers)
    if got is None:
        return 1
    outcomes, elapsed = got
    allowed = documented(suite.readme)
    result = compare(outcomes, suite.pairs, allowed)
    total = sum(result.remit.values())
    if result.unlisted:
        for test in rerun(suite, root, store, list(result.unlisted)):
            result.passed_on_rerun[test] = result.unlisted.pop(test)

    def fmt(counts: dict[str, int]) -> str:
        return f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"

    print(f"\nupstream: {suite.framework} {version}, remit on {store} ({elapsed:.0f} s)")
    print(f"  stock: {fmt(result.stock)}")
    print(f"  remit: {fmt(result.remit)}")
    print(f"  remit-only failures: {len(result.remit_only)} "
          f"({len(result.listed)} on the documented list, {len(result.unlisted)} not)")
    for test in result.listed:
        print(f"    documented  {test}")
    for test, message in result.unlisted.items():
        print(f"    FAILED      {test}\n                {message.splitlines()[0][:300]}")
    for test, message in result.passed_on_rerun.items():
        print(f"    RE-RUN OK   {test}\n                failed once: "
              f"{message.splitlines()[0][:300]}\n                then passed {RERUNS} of "
              f"{RERUNS} serial re-runs")
    for test in result.listed_but_passing:
        print(f"  documented but passing now (remove it from the list): {test}")
    if result.stock_only:
        print(f"  pass on remit, fail on stock: {len(result.stock_only)}")
        for test in result.stock_only:
            print(f"    {test}")
    if json_out:
        Path(json_out).write_text(json.dumps(
            {"framework": suite.framework, "version": version, "store": store,
             **dataclasses.asdict(result)}, indent=2))
    if total == 0:
        print("upstream: no remit test ran", file=sys.stderr)
        return 1
    return 1 if result.unlisted else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.upstream.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite", choices=sorted(SUITES))
    parser.add_argument("--store", choices=("sqlite", "postgres", "redis"), default="sqlite")
    parser.add_argument("--json", dest="json_out")
    parser.add_argument(
        "--workers", type=int, default=int(os.environ.get("REMIT_UPSTREAM_WORKERS", 0)),
        help="pytest-xdist processes (default: $REMIT_UPSTREAM_WORKERS, else up to 2 CPUs "
             "for a suite that runs in parallel, LangGraph's; 1 for CrewAI's)")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = parser.parse_args(argv)
    workers = args.workers or (min(2, os.cpu_count() or 1) if SUITES[args.suite].parallel
                               else 1)
    return run(args.suite, args.store, args.pytest_args, args.json_out, workers)


if __name__ == "__main__":
    sys.exit(main())
