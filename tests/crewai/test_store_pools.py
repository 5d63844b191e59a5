"""remit-crewai's shared stores are released: a process that builds and drops many
backends (a test run, a worker that serves many tenants) does not keep a connection pool
per URL for ever. Measured on PostgreSQL, where the server counts the connections."""

from __future__ import annotations

import gc
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from pydantic import BaseModel

from remit_crewai import RemitFlowPersistence


class Count(BaseModel):
    n: int = 0


def connections(base: str, app: str) -> int:
    with psycopg.connect(base, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                           (app,)).fetchone()
    assert row is not None
    return int(row[0])


def settled(base: str, app: str, at_most: int, within: float = 5.0) -> int:
    """The server's count, once it is ``at_most`` or ``within`` seconds have passed: a
    connection closed by the client leaves pg_stat_activity when its server process has
    exited, a moment later (a bounded readiness poll of the server, as for a port)."""
    deadline = time.monotonic() + within
    while True:
        found = connections(base, app)
        if found <= at_most or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


@pytest.fixture
def schemas(pg_base_url: str) -> Iterator[list[str]]:
    made: list[str] = []
    yield made
    with psycopg.connect(pg_base_url, autocommit=True) as conn:
        for schema in made:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def url(base: str, schema: str, app: str) -> str:
    return f"{base}{'&' if '?' in base else '?'}schema={schema}&application_name={app}"


def test_dropped_backends_release_their_pools(pg_base_url: str, schemas: list[str]) -> None:
    """10 backends, each on its own store, used and dropped one after another: the server
    never sees more than a couple of pools' connections from this process (a leak would
    show 10)."""
    app = f"remit-pools-{uuid.uuid4().hex[:8]}"
    seen = []
    for i in range(10):
        schema = f"remit_pool_{uuid.uuid4().hex[:10]}"
        schemas.append(schema)
        backend = RemitFlowPersistence.from_url(url(pg_base_url, schema, app))
        backend.save_state(f"flow-{i}", "step", Count(n=i))
        assert backend.load_state(f"flow-{i}") == {"n": i}
        seen.append(settled(pg_base_url, app, at_most=2))
        assert seen[-1] <= 2, seen  # this backend's pool, and at most one closing
        del backend
        gc.collect()


def test_close_releases_now_and_copies_share_one_hold(pg_base_url: str,
                                                      schemas: list[str]) -> None:
    app = f"remit-pools-{uuid.uuid4().hex[:8]}"
    schema = f"remit_pool_{uuid.uuid4().hex[:10]}"
    schemas.append(schema)
    target = url(pg_base_url, schema, app)
    first = RemitFlowPersistence.from_url(target)
    second = RemitFlowPersistence.from_url(target)  # the same URL: the same store
    assert first.store is second.store
    copy = first.model_copy()  # CrewAI copies its models; the copy holds the same store
    copy.save_state("f", "step", Count(n=1))
    assert connections(pg_base_url, app) >= 1
    first.close()
    assert second.load_state("f") == {"n": 1}  # second still holds it
    second.close()
    assert settled(pg_base_url, app, 0) == 0  # the last hold went: the pool is closed
    assert first.load_state("f") == {"n": 1}  # a closed backend reopens when used again
    first.close()
    assert settled(pg_base_url, app, 0) == 0
