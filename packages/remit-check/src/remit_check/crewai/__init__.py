"""``remit check`` for CrewAI Flows: the declaration its adapter registers (``crewai.check``).

Importing this module imports no CrewAI: the runner and the pytest plugin read it;
the scenarios are in :mod:`remit_check.crewai.matrix`, the flows in
:mod:`remit_check.crewai.flows`.

**The layer factory contract.** ``LAYERS[layer]`` names a factory
``factory(directory: str) -> FlowPersistence``: every call with the same directory,
in any process, reaches the same durable store. The stock flows are plain
``@persist`` flows; on the remit layer (or a layer whose persistence is a
``RemitFlowPersistence``) the same classes are ``@durable``. The recover-twice
scenario copies the files of the directory, so a factory must keep its store in the
directory when :data:`~remit_check.STORE_ENV` is unset (that scenario unsets it).

* ``stock``: :func:`stock_persistence`, CrewAI's ``SQLiteFlowPersistence`` on
  ``<directory>/stock.db``.
* ``remit``: :func:`remit_persistence`, ``RemitFlowPersistence.from_url(url)`` with
  the store named by ``REMIT_CHECK_STORE`` (``remit check --store``), else
  ``sqlite:///<directory>/remit.db``, and a 1 s lease.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from remit_check import Scenario
from remit_check.harness import remit_url

if TYPE_CHECKING:
    from crewai.flow.persistence.base import FlowPersistence

FRAMEWORK = "crewai"
FRAMEWORK_MODULE = "crewai"
ADAPTER_MODULE = "remit_crewai"
SUBJECT = "a CrewAI FlowPersistence"
POSITION = 20
LAYERS = {"stock": "remit_check.crewai:stock_persistence",
          "remit": "remit_check.crewai:remit_persistence"}
LEASE = 1.0
QUIET = {"CREWAI_DISABLE_TELEMETRY": "true", "CREWAI_DISABLE_TRACKING": "true",
         "CREWAI_TRACING_ENABLED": "false", "OTEL_SDK_DISABLED": "true"}
"""CrewAI's telemetry and tracing off (unless set otherwise), before CrewAI is imported."""


def quiet_crewai() -> None:
    for var, value in QUIET.items():
        os.environ.setdefault(var, value)


def stock_persistence(directory: str) -> FlowPersistence:
    """CrewAI's own ``SQLiteFlowPersistence`` on ``<directory>/stock.db``."""
    quiet_crewai()
    from crewai.flow.persistence.sqlite import SQLiteFlowPersistence

    return SQLiteFlowPersistence(db_path=f"{directory}/stock.db")


def remit_persistence(directory: str) -> FlowPersistence:
    """``RemitFlowPersistence`` on ``REMIT_CHECK_STORE``, else on ``<directory>/remit.db``."""
    quiet_crewai()
    from remit_core.urls import with_options
    from remit_crewai import RemitFlowPersistence

    # a recovery waits for a dead resumer's lease instead of raising at once (wait=)
    return RemitFlowPersistence.from_url(with_options(remit_url(directory), wait=20 * LEASE),
                                         lease=LEASE)


def scenarios() -> list[Scenario]:
    """The fault points (this imports CrewAI and remit-crewai)."""
    from remit_check.crewai.matrix import scenarios

    return scenarios()


__all__ = ["FRAMEWORK", "LAYERS", "quiet_crewai", "remit_persistence", "scenarios",
           "stock_persistence"]
