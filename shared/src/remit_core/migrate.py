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
from typing import Any

from remit_core.errors import RemitError
from remit_core.registry import RegistrationError, registration, registrations


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
