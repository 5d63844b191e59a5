"""Shared fixtures: one store per test on every backend, each isolated.

* SQLite: a file in the test's tmp_path.
* PostgreSQL: the server at REMIT_TEST_PG (default postgresql://postgres@127.0.0.1:5432/test),
  with a fresh schema per test, dropped afterwards.
* Redis: a private redis-server with AOF (started once per session on a free port in a
  temporary directory), with a fresh key prefix per test.

A backend whose server is unreachable is skipped with a one-line reason, unless
REMIT_REQUIRE_SERVICES=1, which turns the skip into a failure.

REMIT_BACKENDS (a comma list, default "sqlite,postgres,redis") restricts the backends:
tests parametrized over an excluded backend are deselected, and tests that need an
excluded server (``pg_base_url``, ``redis_server``) are skipped. Tests that use no
backend still run. The nox sessions (noxfile.py) run one backend each this way.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.aio_probe import threads  # noqa: F401 (a fixture of the native-async tests)

REQUIRE = os.environ.get("REMIT_REQUIRE_SERVICES") == "1"
PG_URL = os.environ.get("REMIT_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_SHARED = os.environ.get("REMIT_TEST_REDIS", "redis://127.0.0.1:6379/0")

ALL_BACKENDS = ("sqlite", "postgres", "redis")


def _backends_from_env() -> list[str]:
    raw = os.environ.get("REMIT_BACKENDS", "")
    chosen = [b.strip() for b in raw.split(",") if b.strip()] or list(ALL_BACKENDS)
    unknown = sorted(set(chosen) - set(ALL_BACKENDS))
    if unknown:
        raise pytest.UsageError(
            f"REMIT_BACKENDS: unknown backend(s) {', '.join(unknown)}; "
            f"choose from {', '.join(ALL_BACKENDS)}")
    return [b for b in ALL_BACKENDS if b in chosen]


BACKENDS = _backends_from_env()


def excluded(backend: str) -> None:
    """Skip a test that needs a backend REMIT_BACKENDS leaves out (never a failure)."""
    if backend not in BACKENDS:
        pytest.skip(f"{backend} is not in REMIT_BACKENDS={','.join(BACKENDS)}")


#: run the adapters' slow crash and race tests on every backend (the nox sessions do, by
#: naming their backend); the default run keeps them on SQLite to stay within CI's time
FULL = os.environ.get("REMIT_FULL") == "1" or bool(os.environ.get("REMIT_BACKENDS"))
ADAPTER_DIRS = ("langgraph", "crewai", "pydantic_graph")


def _slow_adapter_test_on_a_server(item: pytest.Item, backend: str | None) -> bool:
    return (not FULL and backend in ("postgres", "redis")
            and item.get_closest_marker("slow") is not None
            and item.path.parent.name in ADAPTER_DIRS)


def pytest_report_header(config: pytest.Config) -> str:
    if FULL:
        return f"remit: backends {','.join(BACKENDS)}, every test"
    return ("remit: the adapters' slow crash and race tests run on SQLite here; "
            "REMIT_FULL=1 (or a nox session) runs them on PostgreSQL and Redis too")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect tests parametrized (directly or indirectly) over an excluded backend, and,
    unless FULL, the adapters' slow tests on the server backends (the core's store, race
    and restart tests always run on every backend)."""
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        backend = params.get("backend")
        out = (backend is not None and backend not in BACKENDS) or \
            _slow_adapter_test_on_a_server(item, backend)
        (drop if out else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collection_finish(session: pytest.Session) -> None:
    """The fork server of the child processes preloads every worker module (tests/procs.py),
    set once all test modules are imported and before any child starts."""
    from tests import procs

    procs.preload()


def unavailable(reason: str) -> None:
    """Skip, or fail when REMIT_REQUIRE_SERVICES=1."""
    if REQUIRE:
        pytest.fail(f"{reason} (REMIT_REQUIRE_SERVICES=1)")
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout: float = 20.0) -> bool:
    """Poll a TCP port until it accepts (readiness, not a timing assumption)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.02)
    return False


# --------------------------------------------------------------------------------- postgres


def _pg_reachable() -> str | None:
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed"
    try:
        with psycopg.connect(PG_URL, connect_timeout=3):
            return None
    except Exception as exc:
        return f"PostgreSQL at {PG_URL} is unreachable: {exc}".splitlines()[0]


@pytest.fixture(scope="session")
def pg_base_url() -> str:
    excluded("postgres")
    reason = _pg_reachable()
    if reason:
        unavailable(reason)
    return PG_URL


def _drop_pg_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


# ------------------------------------------------------------------------------------ redis


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    """A private Redis with AOF (appendfsync always) for this test session."""
    excluded("redis")
    binary = shutil.which("redis-server")
    if binary is None:
        unavailable("redis-server is not installed")
    tmp = tempfile.mkdtemp(prefix="remit-redis-")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", tmp,
         "--appendonly", "yes", "--appendfsync", "always", "--save", "",
         "--daemonize", "no", "--logfile", os.path.join(tmp, "redis.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        if not wait_for_port(port):
            unavailable(f"private redis-server did not start on port {port}")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------------------ store urls


@pytest.fixture
def make_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """``make_url(backend)`` -> a URL of a fresh, isolated store on that backend.

    Several calls in one test with the same backend return the same store URL.
    """
    made: dict[str, str] = {}
    schemas: list[str] = []

    def make(backend: str) -> str:
        if backend in made:
            return made[backend]
        tag = uuid.uuid4().hex[:12]
        if backend == "sqlite":
            url = f"sqlite:///{tmp_path}/remit-{tag}.db"
        elif backend == "postgres":
            base = request.getfixturevalue("pg_base_url")
            schema = f"remit_t_{tag}"
            schemas.append(schema)
            url = f"{base}{'&' if '?' in base else '?'}schema={schema}"
        elif backend == "redis":
            base = request.getfixturevalue("redis_server")
            url = f"{base}?prefix=remit-t-{tag}"
        else:
            raise ValueError(backend)
        made[backend] = url
        return url

    yield make
    for schema in schemas:
        _drop_pg_schema(schema)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_url(backend: str, make_url: Callable[[str], str]) -> str:
    return make_url(backend)


@pytest.fixture
def store(store_url: str) -> Iterator[object]:
    from remit_core import open_store

    s = open_store(store_url, lease=2.0)
    try:
        yield s
    finally:
        s.close()
