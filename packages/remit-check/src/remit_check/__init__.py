"""``remit check``: the resume contract's fault matrix, stock against remit, as real runs.

A *cell* is one property, one fault point, one framework and one layer (the
framework's stock persistence, or remit). Each cell is measured by real runs:
a small graph or flow with no LLM runs in child processes, is killed with
SIGKILL, raced by k processes released by a barrier, or fed invalid state,
and an effect ledger (a file every real effect call appends to) is the
oracle. A cell reports its raw counts, not only a verdict.

This package names no framework here either. An adapter registers its part of the
matrix as the entry point ``<framework>.check`` of the group ``remit.adapters``
(:mod:`remit_core.registry`): a *declaration* module with::

    FRAMEWORK: str                      # the command-line name: "langgraph", "crewai", ...
    FRAMEWORK_MODULE: str               # the framework's import name (is it installed?)
    ADAPTER_MODULE: str                 # the adapter's import name (the remit layer)
    SUBJECT: str                        # what a layer is, in messages: "a LangGraph checkpointer"
    LAYERS: dict[str, str]              # layer name -> factory spec, "module:function"
    POSITION: int                       # optional: where its rows go in the report (lower first)
    def scenarios() -> list[Scenario]   # the fault points it can produce
    def layer_unavailable(layer) -> str | None   # optional: why a layer cannot run here

Importing a declaration must not import the framework (``scenarios()`` may): the
runner's own process and the pytest plugin read it. This package carries the
declarations of LangGraph, CrewAI and pydantic-graph (``remit_check.langgraph``,
``remit_check.crewai``, ``remit_check.pydantic_graph``), which their adapters
register; a third-party adapter ships its own.

A :class:`Scenario` runs one fault point on one layer, ``reps`` times, and
returns one :class:`CellResult` per property it observes. The runner calls
every scenario for every layer and collects the matrix.

A layer's factory (``LAYERS[layer]``) is called in the child processes with a
directory that belongs to one scenario; every call with the same directory
opens the same durable store. A remit factory uses the store named by
:data:`STORE_ENV` when it is set (``remit check --store URL``), else a SQLite
file in that directory.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.util
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from remit_core.registry import Registration, registrations

PROPERTIES = ("PC", "EO", "FI/FD", "CV", "CO", "CO-k", "RD", "LV")
FAULTS = {
    "kill-after-effect": "SIGKILL inside a step after an effect",
    "kill-between-steps": "SIGKILL between steps",
    "kill-during-write": "SIGKILL during a write",
    "k-resumes": "k concurrent resumes",
    "second-resume": "a second resume",
    "invalid-state": "invalid state",
    "fork-twice": "fork twice",
    "recover-twice": "recover twice",
}
#: a declaration's POSITION when it gives none
LAST = 1000

Verdict = Literal["holds", "violated", "error"]

#: set for the scenarios' child processes when ``--store`` names a remit store
STORE_ENV = "REMIT_CHECK_STORE"


@dataclass
class CellResult:
    """One cell of the matrix: what was measured, and whether the property held."""

    framework: str
    layer: str
    fault: str
    property: str
    verdict: Verdict
    counts: dict[str, int]
    #: one line that reads on its own: "gated effect fired 4 times in 4 reps"
    summary: str
    seconds: float = 0.0
    detail: str = ""

    @builtins.property  # (the field above is named "property")
    def holds(self) -> bool:
        return self.verdict == "holds"


@dataclass
class CheckEnv:
    """What a scenario gets: a private work directory, the options, and stores."""

    workdir: Path
    k: int
    reps: int
    #: the remit store to use (``--store``); None: a fresh SQLite file per scenario
    store_url: str | None = None
    _n: int = 0

    def fresh_dir(self, name: str) -> Path:
        self._n += 1
        d = self.workdir / f"{self._n:03d}-{name}"
        d.mkdir(parents=True)
        return d

    def rep_dirs(self, name: str) -> Iterator[Path]:
        """A fresh directory for each repetition."""
        for _ in range(self.reps):
            yield self.fresh_dir(name)

    def layer(self, factory: str) -> tuple[str, str | None]:
        """A layer as it travels to a child: its factory, and the remit store it is to use
        (None: its own file in the scenario's directory)."""
        return (factory, self.store_url)

    def remit_url(self, d: Path) -> str:
        """The store a remit layer uses for one scenario (runs are told apart by id)."""
        return self.store_url or f"sqlite:///{d / 'remit.db'}"

    @staticmethod
    def new_id(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:10]}"


ScenarioRun = Callable[[CheckEnv, str, str], list[CellResult]]
"""``run(env, layer, factory)``: a scenario's cells for that layer."""


@dataclass
class Scenario:
    """One fault point. ``run(env, layer, factory)`` returns its cells for that layer."""

    fault: str
    properties: tuple[str, ...]
    run: ScenarioRun


class Matrix:
    """One framework's scenarios, declared where they are defined, and its cells::

        MATRIX = Matrix("myframework")

        @MATRIX.scenario("k-resumes", "CO-k")
        def k_resumes(env: CheckEnv, layer: str, factory: str) -> list[CellResult]:
            ...
            return [MATRIX.cell(layer, "k-resumes", "CO-k", ok, counts, summary)]
    """

    def __init__(self, framework: str) -> None:
        self.framework = framework
        #: in the order they were declared (the order they run in)
        self.scenarios: list[Scenario] = []

    def scenario(self, fault: str, *properties: str) -> Callable[[ScenarioRun], ScenarioRun]:
        """Declare ``run`` as the scenario of ``fault`` that measures ``properties``."""
        if fault not in FAULTS or not properties or set(properties) - set(PROPERTIES):
            raise ValueError(f"not a fault point and its properties: {fault} {properties}")

        def declare(run: ScenarioRun) -> ScenarioRun:
            self.scenarios.append(Scenario(fault, properties, run))
            return run

        return declare

    def cell(self, layer: str, fault: str, prop: str, ok: bool, counts: dict[str, int],
             summary: str, detail: str = "") -> CellResult:
        """A measured cell: it holds when ``ok``."""
        return CellResult(self.framework, layer, fault, prop, verdict(ok), counts, summary,
                          detail=detail)


@dataclass
class Report:
    cells: list[CellResult] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Every remit cell holds (a stock violation is a finding, not a failure), and
        there was at least one."""
        mine = [c for c in self.cells if c.layer == "remit"]
        return bool(mine) and all(c.holds for c in mine)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "seconds": round(self.seconds, 1), "options": self.options,
                "skipped": self.skipped, "cells": [asdict(c) for c in self.cells]}


def verdict(ok: bool) -> Verdict:
    return "holds" if ok else "violated"


def load_factory(spec: str) -> Callable[..., Any]:
    """``"package.module:function"`` -> the function."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"not a factory spec {spec!r}: use 'package.module:function'")
    fn: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return fn


def installed_frameworks() -> list[str]:
    """The frameworks whose adapter registers checks, in the report's order (their
    declarations' ``POSITION``, then by name). Imports only the declarations."""
    regs = registrations("check")

    def position(name: str) -> tuple[int, str]:
        try:
            return int(getattr(declaration(regs[name]), "POSITION", LAST)), name
        except ImportError:  # reported by available(), in its place
            return LAST, name

    return sorted(regs, key=position)


def declaration(reg: Registration) -> ModuleType:
    """The check declaration module a registration names (imports no framework)."""
    module: ModuleType = reg.load()
    return module


def available(framework: str) -> str:
    """Why ``framework`` cannot be checked here (one line), or "" when it can. Imports
    only its declaration, never the framework."""
    reg = registrations("check").get(framework)
    if reg is None:
        return f"no installed adapter registers checks for {framework}"
    if importlib.util.find_spec(reg.module.split(".")[0]) is None:
        return (f"its checks ({reg.module}, registered by {reg.distribution}) are not "
                "installed")
    module = declaration(reg)
    if importlib.util.find_spec(module.FRAMEWORK_MODULE) is None:
        return f"{framework} is not installed"
    if importlib.util.find_spec(module.ADAPTER_MODULE) is None:
        dist = reg.distribution
        return f"{framework} is installed but {dist} is not (pip install {dist})"
    return ""


class Progress:
    """A one-line progress bar on stderr (a plain line per cell when not a terminal)."""

    def __init__(self, total: int, enabled: bool = True) -> None:
        self.total = total
        self.done = 0
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.start = time.monotonic()

    def step(self, label: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        width = 30
        filled = int(width * self.done / max(self.total, 1))
        elapsed = time.monotonic() - self.start
        line = (f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
                f"{elapsed:5.0f}s  {label}")
        if self.tty:
            sys.stderr.write("\r\x1b[2K" + line[:120])
            if self.done == self.total:
                sys.stderr.write("\n")
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def run_check(frameworks: Sequence[str] | None = None, *, store_url: str | None = None,
              k: int = 4, reps: int = 2, layers: Sequence[str] = ("stock", "remit"),
              progress: bool = True, workdir: Path | None = None,
              only: Sequence[str] | None = None) -> Report:
    """Run the matrix. ``only`` limits it to some fault points (names of :data:`FAULTS`).

    Each framework runs in a process of its own (spawned, so that it imports only that
    framework and its adapter's check module, and its scenarios' fork server preloads
    just that); cells come back over a queue as they finish. Every framework's process
    first sends its plan (the number of cells it will run) and then waits for its turn,
    so the progress bar's total is known before the first cell runs. What the
    frameworks and the scenarios' children print goes to a file in the work directory
    (kept with ``REMIT_CHECK_KEEP=1``), never between the report's rows.
    """
    started = time.monotonic()
    registered = registrations("check")
    names = list(frameworks or installed_frameworks())
    for name in names:
        if name not in registered:
            raise ValueError(f"unknown framework {name!r}; choose from {', '.join(registered)}")
    report = Report(options={"frameworks": names, "k": k, "reps": reps,
                             "store": _masked(store_url) or "sqlite (temporary)",
                             "layers": list(layers)})
    bar = Progress(0, progress)
    own_dir = workdir is None
    root = Path(tempfile.mkdtemp(prefix="remit-check-")) if workdir is None else workdir
    ctx = mp.get_context("spawn")
    running: list[tuple[str, Any, Any, Any]] = []
    try:
        for name in names:
            reason = available(name)
            if reason:
                report.skipped[name] = reason
                continue
            queue: Any = ctx.Queue()
            go: Any = ctx.Event()
            proc = ctx.Process(target=_run_framework, name=f"remit-check-{name}",
                               args=(name, registered[name].module, list(layers), store_url, k,
                                     reps,
                                     list(only) if only else None, str(root), queue, go))
            proc.start()
            running.append((name, proc, queue, go))
        # every plan first, so that the bar's total never grows while it runs
        planned = [(name, proc, queue, go) for name, proc, queue, go in running
                   if _collect(name, queue, report, bar, until="plan")]
        for name, _proc, queue, go in planned:
            go.set()
            _collect(name, queue, report, bar, until="done")
    finally:
        for _name, proc, _queue, go in running:
            go.set()
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)
        if own_dir and not os.environ.get("REMIT_CHECK_KEEP"):
            shutil.rmtree(root, ignore_errors=True)
    report.seconds = time.monotonic() - started
    return report


#: the longest a framework's process may stay silent (one scenario, all its reps)
SCENARIO_TIMEOUT = 900.0


def _collect(name: str, queue: Any, report: Report, bar: Progress,
             until: Literal["plan", "done"]) -> bool:
    """Take one framework's messages until its plan (``until="plan"``) or its end. Returns
    whether it has more to send (False once it is done or went silent)."""
    while True:
        try:
            msg = queue.get(timeout=SCENARIO_TIMEOUT)
        except Exception:
            report.cells.append(CellResult(name, "-", "-", "-", "error", {},
                                           f"no answer for {SCENARIO_TIMEOUT:.0f}s"))
            return False
        kind = msg[0]
        if kind == "plan":
            bar.total += msg[1]
            if until == "plan":
                return True
        elif kind == "skip":
            report.skipped[msg[1]] = msg[2]
        elif kind == "cells":
            report.cells.extend(CellResult(**c) for c in msg[1])
            bar.step(msg[2])
        elif kind == "fatal":
            report.cells.append(CellResult(name, "-", "-", "-", "error", {},
                                           f"the {name} checks could not start: {msg[1]}",
                                           detail=msg[2]))
        elif kind == "done":
            return False


def _quiet(path: Path) -> None:
    """Send this process's stdout and stderr (and its children's) to ``path``: frameworks
    print panels, warnings and listener tracebacks; the report and the bar are the
    parent's."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _run_framework(name: str, declared: str, layers: list[str], store_url: str | None, k: int,
                   reps: int, only: list[str] | None, root: str, queue: Any, go: Any) -> None:
    """The body of one framework's process: send the plan, wait for the turn (``go``),
    run the scenarios and send the cells back. ``declared``: its declaration module."""
    _quiet(Path(root) / f"{name}-output.log")
    try:
        module = importlib.import_module(declared)
        # optional in a check module: ``layer_unavailable(layer) -> str | None``
        unavailable = getattr(module, "layer_unavailable", None)
        runnable = []
        for layer in layers:
            why = unavailable(layer) if unavailable is not None else None
            if why:
                queue.put(("skip", f"{name} ({layer})", why))
            else:
                runnable.append(layer)
        plan = [(scenario, layer) for scenario in module.scenarios()
                if not only or scenario.fault in only for layer in runnable]
        queue.put(("plan", len(plan)))
        go.wait()
        if store_url is not None:  # child processes open the same store
            os.environ[STORE_ENV] = store_url
        for scenario, layer in plan:
            env = CheckEnv(workdir=Path(root) / f"{name}-{layer}", k=k, reps=reps,
                           store_url=store_url if layer == "remit" else None)
            env.workdir.mkdir(parents=True, exist_ok=True)
            t0 = time.monotonic()
            try:
                cells = scenario.run(env, layer, module.LAYERS[layer])
            except Exception as exc:  # a scenario that cannot run is an error cell, not a crash
                first = str(exc).splitlines()[0] if str(exc) else ""
                cells = [CellResult(name, layer, scenario.fault, prop, "error", {},
                                    f"could not run: {type(exc).__name__}: {first}",
                                    detail=traceback.format_exc())
                         for prop in scenario.properties]
            for cell in cells:
                cell.seconds = round(time.monotonic() - t0, 2)
            queue.put(("cells", [asdict(c) for c in cells], f"{name} {layer} {scenario.fault}"))
    except BaseException as exc:
        queue.put(("fatal", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
    finally:
        queue.put(("done",))


def _masked(url: str | None) -> str | None:
    if url is None:
        return None
    from remit_core.urls import mask_url

    return mask_url(url)


__all__ = ["FAULTS", "PROPERTIES", "STORE_ENV", "CellResult", "CheckEnv", "Matrix", "Report",
           "Scenario", "available", "declaration", "installed_frameworks", "load_factory",
           "run_check", "verdict"]
