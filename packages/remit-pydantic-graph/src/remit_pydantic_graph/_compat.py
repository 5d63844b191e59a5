"""The supported pydantic-graph range, checked once at import time.

pydantic-graph 2.0 removed the persistence API (``BaseStatePersistence``,
``Graph.iter_from_persistence``, ``persistence=``) that this adapter plugs
into, so remit-pydantic-graph supports ``pydantic-graph>=1.0,<2`` only. An
import next to any other version raises :class:`ImportError` saying so.
"""

from __future__ import annotations

import importlib.metadata

SUPPORTED = ">=1.0,<2"

_HOW = (
    "remit-pydantic-graph supports pydantic-graph{range} only: pydantic-graph 2.0 removed the "
    "persistence API (BaseStatePersistence, Graph.iter_from_persistence, persistence=) that "
    "remit plugs into. {found} Pin it with: pip install 'pydantic-graph>=1.0,<2'."
)


def _refuse(found: str) -> ImportError:
    return ImportError(_HOW.format(range=SUPPORTED, found=found))


def check_pydantic_graph() -> str:
    """Return the installed pydantic-graph version, or raise ImportError explaining the range."""
    try:
        version = importlib.metadata.version("pydantic-graph")
    except importlib.metadata.PackageNotFoundError:
        raise _refuse("pydantic-graph is not installed.") from None
    head = version.split(".", 1)[0]
    if not head.isdigit() or not 1 <= int(head) < 2:
        raise _refuse(f"Found pydantic-graph {version}.")
    try:
        import pydantic_graph.persistence  # noqa: F401
    except ImportError as exc:  # a 1.x-numbered build without the persistence module
        raise _refuse(f"Found pydantic-graph {version} without pydantic_graph.persistence.") from exc
    return version


PYDANTIC_GRAPH_VERSION = check_pydantic_graph()
