"""CrewAI tests: side files in a temporary directory, telemetry off (see _env)."""

from tests.crewai import _env  # noqa: F401  (must run before crewai is imported)
