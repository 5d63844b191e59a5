"""``remit check`` for LangGraph: the declaration its adapter registers (``langgraph.check``).

Importing this module imports no LangGraph: the runner and the pytest plugin read it;
the scenarios are in :mod:`remit_check.langgraph.matrix`, the graphs in
:mod:`remit_check.langgraph.graphs`.

**The layer factory contract.** ``LAYERS[layer]`` names a factory
``factory(directory: str) -> BaseCheckpointSaver`` (or a context manager that
yields one, like the savers' ``from_conn_string``). Every call with the same
directory, in any process, must open the same durable store; the scenarios call
it in fresh child processes, never share a saver object, and tell runs apart by
thread id. A factory that also accepts a keyword ``schema`` is given the graph's
state type (the invalid-state scenario's pydantic model); one that does not
gets no schema, and cannot refuse invalid state. The recover-twice scenario
copies the files of the directory, so a factory must keep its store in the
directory when :data:`~remit_check.STORE_ENV` is unset (that scenario
unsets it).

* ``stock``: :func:`stock_saver`, LangGraph's ``SqliteSaver`` on
  ``<directory>/stock.db`` (``pip install 'remit-langgraph[check]'``).
* ``remit``: :func:`remit_saver`, ``RemitSaver.from_conn_string(url)`` with the
  store named by ``REMIT_CHECK_STORE`` (``remit check --store``), else
  ``sqlite:///<directory>/remit.db``, and a 1 s lease so that LV is measured in
  seconds.

The pytest plugin (``pytest --remit-contract=module:factory``) runs these
scenarios on any factory that keeps this contract.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from remit_check import Scenario
from remit_check.harness import remit_url

FRAMEWORK = "langgraph"
FRAMEWORK_MODULE = "langgraph"
ADAPTER_MODULE = "remit_langgraph"
SUBJECT = "a LangGraph checkpointer"
CONTRACT_OPTION = "--remit-contract"
"""The pytest plugin's option for this framework (the first it had; the others' are
``--remit-contract-<framework>``)."""
POSITION = 10
LAYERS = {"stock": "remit_check.langgraph:stock_saver",
          "remit": "remit_check.langgraph:remit_saver"}
LEASE = 1.0
"""The remit layer's lease (seconds): how long a dead owner's claim blocks recovery."""
STOCK_MISSING = ("langgraph-checkpoint-sqlite is not installed "
                 "(pip install 'remit-langgraph[check]')")


def stock_saver(directory: str) -> Any:
    """LangGraph's own ``SqliteSaver`` on ``<directory>/stock.db``."""
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
    except ImportError as exc:
        raise RuntimeError(STOCK_MISSING) from exc
    return SqliteSaver.from_conn_string(os.path.join(directory, "stock.db"))


def remit_saver(directory: str, schema: Any = None) -> Any:
    """``RemitSaver`` on ``REMIT_CHECK_STORE``, else on ``<directory>/remit.db``."""
    from remit_langgraph import RemitSaver

    return RemitSaver.from_conn_string(remit_url(directory), schema=schema, lease=LEASE)


def layer_unavailable(layer: str) -> str | None:
    """A one-line reason when a layer cannot run here (the stock layer's package)."""
    if layer == "stock" and importlib.util.find_spec("langgraph.checkpoint.sqlite") is None:
        return STOCK_MISSING
    return None


def scenarios() -> list[Scenario]:
    """The fault points (this imports LangGraph and remit-langgraph)."""
    from remit_check.langgraph.matrix import scenarios

    return scenarios()


__all__ = ["FRAMEWORK", "LAYERS", "STOCK_MISSING", "layer_unavailable", "remit_saver",
           "scenarios", "stock_saver"]
