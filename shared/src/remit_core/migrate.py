"""The shared part of ``remit migrate``: the report, and the dispatch to adapters.

Each adapter registers its import as the entry point ``<framework>.migrate`` of the
group ``remit.adapters`` (:mod:`remit_core.registry`): a function
``migrate(source, target, *, run_id=None) -> MigrationReport``. The command
``remit migrate <framework> --from SRC --to URL`` loads it when it runs, so remit-core
never imports a framework and names no adapter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from remit_core.errors import RemitError
from remit_core.registry import RegistrationError, registration, registrations

if TYPE_CHECKING:
    from remit_core.records import RunEnd, RunState
    from remit_core.store import Store


class MigrationError(RemitError):
    """The source could not be read, or a record in it could not be imported."""


class RecordsRefused(MigrationError):
    """Runs of the source hold records that remit refused to decode: they name a type
    outside the allow-list, were stored with pickle, or do not parse. Nothing of those
    runs was imported, and nothing the records name was imported or called.

    ``refused`` maps each such run id to one line per refused record (where it is, and
    what it names). ``report``, when the other runs were imported, is what that import
    did; the exception is raised after it, so the exit code of ``remit migrate`` says so.
    """

    def __init__(self, source: str, refused: dict[str, list[str]], *, hint: str = "",
                 report: MigrationReport | None = None) -> None:
        self.source = source
        self.refused = {run: list(lines) for run, lines in refused.items()}
        self.report = report
        lines = [f"{len(refused)} run(s) of {source} not imported: they hold records that "
                 "remit refused to decode (nothing of these runs was imported, and nothing "
                 "the records name was imported or called):"]
        for run, what in refused.items():
            lines.append(f"  run {run!r}:")
            lines.extend(f"    {line}" for line in what)
        if report is not None:
            lines.append(f"The other runs: {report.summary()}.")
        if hint:
            lines.append(hint)
        super().__init__("\n".join(lines))


@dataclass
class MigrationReport:
    """What one import did. Running the same import again adds nothing:
    everything it finds already present is counted in ``skipped``."""

    source: str
    target: str
    runs: int = 0
    checkpoints: int = 0
    writes: int = 0
    skipped: int = 0
    notes: list[str] = field(default_factory=list)
    #: run id -> the records of that run refused undecoded (the run was not imported)
    refused: dict[str, list[str]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        text = (f"imported {self.runs} run(s): {self.checkpoints} checkpoint(s), "
                f"{self.writes} pending write(s); {self.skipped} already present")
        if self.refused:
            text += f"; {len(self.refused)} run(s) refused"
        return text


def frameworks() -> list[str]:
    """The frameworks whose adapter registers a migrate command (imports nothing)."""
    return list(registrations("migrate"))


def migrate_command(framework: str) -> Callable[..., MigrationReport]:
    """The registered ``migrate`` function of ``framework``, or a :class:`MigrationError`
    that says which adapters are installed, or why the command does not load."""
    try:
        reg = registration("migrate", framework)
    except RegistrationError as exc:
        raise MigrationError(str(exc)) from None
    try:
        fn: Callable[..., MigrationReport] = reg.load()
    except ImportError as exc:
        raise MigrationError(f"remit migrate {framework}: {reg.target} (from {reg.distribution}) "
                             f"does not load: {type(exc).__name__}: {exc}") from exc
    return fn


# ------------------------------------------------------------------------- run lifecycles

#: what comes next for an imported run, by the lifecycle its import recorded
NEXT_STEP = {
    "abandoned": "recover(graph, url) finds it and finishes it (so does remit worker); "
                 "a graph of another name finds it with recover(graph, url, name=...)",
    "parked": "the app's next resume continues it; recover() leaves it alone",
    "failed": "recover(graph, url, retry_failed=True) runs it again",
    "needs-attention": "settle its effect (remit effects resolve), then recover()",
    "done": "recover() leaves it alone",
}


def kept_note(what: str, run_id: str, status: str, *, framework: str, name: str) -> str:
    """The report note for an imported ``what`` (run, thread) kept as ``status``."""
    return (f"{what} {run_id!r} is kept in the run lifecycle as {status} (framework "
            f"{framework!r}, name {name!r}): {NEXT_STEP[status]}")


def left_note(what: str, run_id: str, run: RunState | None) -> str:
    """The report note for an imported ``what`` whose recorded lifecycle was left alone."""
    shown = "" if run is None else \
        f" ({run.status}, name {run.name!r}, {run.attempts} execution(s))"
    return (f"{what} {run_id!r}: its run lifecycle was recorded before{shown} and is left "
            "as it is")


def import_lifecycle(store: Store, what: str, run_id: str, *, framework: str, name: str,
                     status: RunEnd | Literal["abandoned"], owner: str,
                     detail: Any = None, replaces: RunState | None = None) -> str:
    """Record an imported run's first lifecycle (:meth:`Store.import_run`: ``detail`` is
    what a parked run waits for or a failed one failed with), or bring an earlier
    import's own record (``replaces``) up to date; the report note saying what was
    recorded, or that the lifecycle recorded before is left as it is."""
    if store.import_run(run_id, framework=framework, name=name, status=status, owner=owner,
                        waiting=detail, error=detail, replaces=replaces):
        return kept_note(what, run_id, status, framework=framework, name=name)
    return left_note(what, run_id, store.get_run(run_id))
