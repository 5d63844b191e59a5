"""pytest fixtures for pydantic-graph (the entry point ``pydantic-graph.pytest``, which
remit-check's plugin registers). Importing this module imports no pydantic-graph."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from remit_check import STORE_ENV
from remit_check.harness import use_layer
from remit_check.pydantic_graph import FRAMEWORK, LAYERS
from remit_check.pytest_plugin import contract_factory


@pytest.fixture
def remit_pydantic_graph_persistence(request: pytest.FixtureRequest,
                                     tmp_path: Path) -> Callable[[str], Any]:
    """``open(run_id) -> BaseStatePersistence`` on a fresh directory: from the
    ``--remit-contract-pydantic-graph`` factory when one was given, else
    ``RemitStatePersistence`` (on ``REMIT_CHECK_STORE`` when set)."""
    spec = contract_factory(request.config, FRAMEWORK, LAYERS["remit"])
    factory = use_layer((spec, os.environ.get(STORE_ENV)))

    def open_run(run_id: str) -> Any:
        return factory(str(tmp_path), run_id)

    return open_run
