"""CrewAI tests: side files in a temporary directory, telemetry off (see _env)."""

import os
import shutil

import pytest

from tests.crewai import _env  # must run before crewai is imported


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the directory that held CrewAI's side files (and the tests' temporary files)."""
    if os.getpid() == _env.OWNER:
        shutil.rmtree(os.environ[_env.HOME_VAR], ignore_errors=True)
