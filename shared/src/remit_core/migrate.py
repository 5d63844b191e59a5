"""The shared part of ``remit migrate``: the report, and the dispatch to adapters.

Each adapter package ships a module ``remit_<framework>.migrate`` with a
function ``migrate(source, target, *, run_id=None) -> MigrationReport``. The
command ``remit migrate <framework> --from SRC --to URL`` finds the module,
so remit-core never imports a framework.
"""

from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass, field
from typing import Any

from remit_core.errors import RemitError

#: command-line name -> the module that implements it
ADAPTERS: dict[str, str] = {
    "langgraph": "remit_langgraph.migrate",
    "crewai": "remit_crewai.migrate",
    "pydantic-graph": "remit_pydantic_graph.migrate",
}


class MigrationError(RemitError):
    """The source could not be read, or a record in it could not be imported."""


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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        return (f"imported {self.runs} run(s): {self.checkpoints} checkpoint(s), "
                f"{self.writes} pending write(s); {self.skipped} already present")


def adapter_module(framework: str) -> Any:
    """Import the migrate module of ``framework``, or explain what to install."""
    try:
        name = ADAPTERS[framework]
    except KeyError:
        raise MigrationError(f"unknown framework {framework!r}; "
                             f"choose one of {', '.join(ADAPTERS)}") from None
    package = name.split(".")[0].replace("_", "-")
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise MigrationError(f"remit migrate {framework} needs the adapter package: "
                                 f"pip install {package}") from None
        raise
