"""``remit check`` for pydantic-graph: the declaration its adapter registers
(``pydantic-graph.check``).

Importing this module imports no pydantic-graph: the runner and the pytest plugin read
it; the scenarios are in :mod:`remit_check.pydantic_graph.matrix`, the graphs in
:mod:`remit_check.pydantic_graph.graphs`.

**The layer factory contract.** ``LAYERS[layer]`` names a factory
``factory(directory: str, run_id: str) -> BaseStatePersistence``: every call with the
same directory and run id, in any process, reaches the same durable history. The
recover-twice scenario copies the files of the directory, so a factory must keep its
store in the directory when :data:`~remit_check.STORE_ENV` is unset (that scenario
unsets it).

* ``stock``: :func:`stock_persistence`, pydantic-graph's ``FileStatePersistence`` on
  ``<directory>/<run_id>.json``.
* ``remit``: :func:`remit_persistence`, ``RemitStatePersistence.from_url(url,
  run_id=...)`` with the store named by ``REMIT_CHECK_STORE`` (``remit check
  --store``), else ``sqlite:///<directory>/remit.db``, and a 1 s lease.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from remit_check import Scenario
from remit_check.harness import remit_url

if TYPE_CHECKING:
    from pydantic_graph.persistence import BaseStatePersistence

FRAMEWORK = "pydantic-graph"
FRAMEWORK_MODULE = "pydantic_graph"
ADAPTER_MODULE = "remit_pydantic_graph"
SUBJECT = "a pydantic-graph state persistence"
POSITION = 30
LAYERS = {"stock": "remit_check.pydantic_graph:stock_persistence",
          "remit": "remit_check.pydantic_graph:remit_persistence"}
LEASE = 1.0


def stock_persistence(directory: str, run_id: str) -> BaseStatePersistence[Any, Any]:
    """pydantic-graph's own ``FileStatePersistence`` on ``<directory>/<run_id>.json``."""
    from pydantic_graph.persistence.file import FileStatePersistence

    return FileStatePersistence(Path(directory) / f"{run_id}.json")


def remit_persistence(directory: str, run_id: str) -> BaseStatePersistence[Any, Any]:
    """``RemitStatePersistence`` on ``REMIT_CHECK_STORE``, else on ``<directory>/remit.db``."""
    from remit_pydantic_graph import RemitStatePersistence

    return RemitStatePersistence.from_url(remit_url(directory), run_id=run_id, lease=LEASE)


def scenarios() -> list[Scenario]:
    """The fault points (this imports pydantic-graph and remit-pydantic-graph)."""
    from remit_check.pydantic_graph.matrix import scenarios

    return scenarios()


__all__ = ["FRAMEWORK", "LAYERS", "remit_persistence", "scenarios", "stock_persistence"]
