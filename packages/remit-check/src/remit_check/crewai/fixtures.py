"""pytest fixtures for CrewAI Flows (the entry point ``crewai.pytest``, which remit-check's
plugin registers). Importing this module imports no CrewAI."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from remit_check import STORE_ENV
from remit_check.crewai import FRAMEWORK, LAYERS, quiet_crewai
from remit_check.harness import use_layer
from remit_check.pytest_plugin import contract_factory


@pytest.fixture
def remit_crewai_persistence(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A ``FlowPersistence`` on a fresh directory: from the ``--remit-contract-crewai``
    factory when one was given, else ``RemitFlowPersistence`` (on ``REMIT_CHECK_STORE``
    when set)."""
    quiet_crewai()
    spec = contract_factory(request.config, FRAMEWORK, LAYERS["remit"])
    return use_layer((spec, os.environ.get(STORE_ENV)))(str(tmp_path))
