"""A recovery worker: recover abandoned runs continuously, for any installed adapter.

``remit worker --app package.module:attr --store URL`` (or :class:`Worker` from code,
e.g. at the start-up of a FastAPI or Celery app) loads the app's graphs or flows, asks
each installed adapter (the entry points ``<framework>.recover`` of
:mod:`remit_core.registry`) to recognise them, and then runs a recovery pass every
``interval`` seconds: each pass takes the abandoned runs of every target, exactly one
worker per run however many workers run on however many hosts, and continues them.
A pass that found work is followed at once by the next one. On SIGTERM (or
:meth:`Worker.stop`) it takes nothing more, lets the runs it is continuing finish, and
prints its counts.

An adapter's ``recover`` entry point is a function ``recoverable(obj, store_url)`` that
returns a :class:`Recoverable` for an object of its framework (a compiled graph, a flow
class, ...) and None for anything else.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from remit_core.errors import RemitError
from remit_core.recovery import DEFAULT_MAX_ATTEMPTS, RecoveryReport
from remit_core.registry import registrations
from remit_core.store import new_owner

log = logging.getLogger("remit.worker")

#: seconds between two passes that found nothing to do
DEFAULT_INTERVAL = 5.0


class WorkerError(RemitError):
    """The worker cannot start: the app does not load, or nothing in it is recoverable."""


@runtime_checkable
class Recoverable(Protocol):
    """One graph or flow a worker recovers (an adapter builds it, see the module)."""

    framework: str
    name: str

    def recover(self, *, limit: int | None, concurrency: int, retry_failed: bool,
                max_attempts: int, owner: str, stop: threading.Event) -> RecoveryReport:
        """One pass: recover its abandoned runs (at most ``limit``)."""
        ...

    def close(self) -> None:
        """Release what it opened (a store it opened from the worker's URL)."""
        ...


def load_app(spec: str) -> list[Any]:
    """The objects ``package.module:attr`` names: the attribute itself, each item of a
    list or tuple, or what a callable attribute returns when called without arguments
    (a factory that builds the app)."""
    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name or not attr:
        raise WorkerError(f"--app must be package.module:attribute, not {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise WorkerError(f"--app {spec}: cannot import {module_name!r}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise WorkerError(f"--app {spec}: {module_name} has no attribute {attr!r}") from None
    if callable(obj) and not isinstance(obj, type) and not _recognised(obj):
        obj = obj()
    return list(obj) if isinstance(obj, list | tuple) else [obj]


def _recognisers(*, imported_only: bool = False
                 ) -> dict[str, Callable[[Any, str | None], Recoverable | None]]:
    """The adapters' ``recover`` entry points; with ``imported_only``, those of the
    frameworks whose package this process has imported (an object of a framework means
    its package is imported, so the others need not be loaded: importing CrewAI costs
    seconds)."""
    found = registrations("recover")
    if imported_only:
        found = {fw: reg for fw, reg in found.items()
                 if fw.replace("-", "_") in sys.modules}
    return {framework: reg.load() for framework, reg in found.items()}


def _recognised(obj: Any) -> bool:
    return any(fn(obj, None) is not None
               for fn in _recognisers(imported_only=True).values())


def targets_for(objects: Sequence[Any], store_url: str | None = None) -> list[Recoverable]:
    """Each object as its adapter recovers it; a :class:`WorkerError` names an object no
    installed adapter recognises, and the adapters installed."""
    targets: list[Recoverable] = []
    for obj in objects:
        # every adapter is loaded only for an object no imported framework recognises
        # (loading them all would import every installed framework: seconds for CrewAI)
        for imported_only in (True, False):
            target = next((t for fn in _recognisers(imported_only=imported_only).values()
                           if (t := fn(obj, store_url)) is not None), None)
            if target is not None:
                targets.append(target)
                break
        else:
            installed = ", ".join(registrations("recover")) or "none"
            raise WorkerError(
                f"no installed adapter recovers {type(obj).__module__}."
                f"{type(obj).__qualname__} objects (adapters with recovery: {installed}); "
                "--app must name a compiled LangGraph graph, a CrewAI @durable flow class "
                "or a pydantic-graph recovery target")
    return targets


@dataclass
class Totals:
    """What a worker did over its passes."""

    passes: int = 0
    report: RecoveryReport = field(default_factory=RecoveryReport)

    def __str__(self) -> str:
        return f"{self.passes} passes, {self.report}"


@dataclass
class Worker:
    """Recover the abandoned runs of ``targets`` until stopped (see the module)."""

    targets: list[Recoverable]
    interval: float = DEFAULT_INTERVAL
    concurrency: int = 1
    retry_failed: bool = False
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    #: the most runs one target takes in a pass, so that every target gets its turn
    batch: int = 100
    owner: str = field(default_factory=new_owner)
    totals: Totals = field(default_factory=Totals)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def run_once(self) -> RecoveryReport:
        """One pass over every target."""
        report = RecoveryReport()
        for target in self.targets:
            if self._stop.is_set():
                break
            report.merge(target.recover(limit=self.batch, concurrency=self.concurrency,
                                        retry_failed=self.retry_failed,
                                        max_attempts=self.max_attempts, owner=self.owner,
                                        stop=self._stop))
        self.totals.passes += 1
        self.totals.report.merge(report)
        return report

    def run(self) -> Totals:
        """Pass after pass until :meth:`stop`: at once after a pass that found runs,
        ``interval`` seconds after one that found none."""
        log.info("remit worker %s: recovering %s", self.owner,
                 ", ".join(f"{t.framework} {t.name!r}" for t in self.targets))
        while not self._stop.is_set():
            report = self.run_once()
            if report.total:
                log.info("remit worker %s: pass %d: %s", self.owner, self.totals.passes,
                         report)
            if not report.total or report.total == len(report.skipped):
                self._stop.wait(self.interval)
        return self.totals

    def start(self) -> Worker:
        """Run in a background (daemon) thread; :meth:`stop` ends it."""
        if self._thread is None:
            self._thread = threading.Thread(target=self.run, name="remit-worker", daemon=True)
            self._thread.start()
        return self

    def stop(self, *, wait: float | None = None) -> Totals:
        """Take nothing more; the runs being continued finish. With a background thread,
        wait up to ``wait`` seconds (None: until it ends) for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(wait)
        return self.totals

    def close(self) -> None:
        for target in self.targets:
            target.close()


__all__ = ["DEFAULT_INTERVAL", "Recoverable", "Totals", "Worker", "WorkerError", "load_app",
           "targets_for"]
