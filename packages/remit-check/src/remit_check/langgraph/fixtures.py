"""pytest fixtures for LangGraph (the entry point ``langgraph.pytest``, which remit-check's
plugin registers). Importing this module imports no LangGraph."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from remit_check import STORE_ENV
from remit_check.langgraph import FRAMEWORK, LAYERS
from remit_check.pytest_plugin import contract_factory


@pytest.fixture
def remit_langgraph_saver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A ``BaseCheckpointSaver`` on a fresh directory: from the ``--remit-contract``
    factory when one was given, else ``RemitSaver`` (on ``REMIT_CHECK_STORE`` when set).
    A factory that returns a context manager is entered, and left after the test."""
    from remit_check.langgraph.matrix import open_layer

    spec = contract_factory(request.config, FRAMEWORK, LAYERS["remit"])
    with open_layer((spec, os.environ.get(STORE_ENV)), str(tmp_path)) as saver:
        yield saver
