"""LangGraph's own checkpointer conformance suite, on every backend.

``validate()`` calls the registered factory once per capability; each call gets a
fresh, isolated store (a new SQLite file, PostgreSQL schema or Redis key prefix),
which is dropped again when the capability's run ends.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from remit_langgraph import RemitSaver

FreshUrl = Callable[[], tuple[str, Callable[[], None]]]


@pytest.fixture
def fresh_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FreshUrl]:
    """``fresh_url()`` -> (url of a new isolated store on ``backend``, its cleanup)."""
    leftovers: list[Callable[[], None]] = []

    def make() -> tuple[str, Callable[[], None]]:
        tag = uuid.uuid4().hex[:12]
        if backend == "sqlite":
            return f"sqlite:///{tmp_path}/conformance-{tag}.db", lambda: None
        if backend == "postgres":
            base = request.getfixturevalue("pg_base_url")
            schema = f"remit_lgc_{tag}"

            def drop() -> None:
                import psycopg

                with psycopg.connect(base, autocommit=True) as conn:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

            leftovers.append(drop)
            return f"{base}{'&' if '?' in base else '?'}schema={schema}", drop
        if backend == "redis":
            base = request.getfixturevalue("redis_server")
            prefix = f"remit-lgc-{tag}"

            def flush() -> None:
                import redis

                with redis.Redis.from_url(base) as client:
                    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
                    if keys:
                        client.delete(*keys)

            leftovers.append(flush)
            return f"{base}?prefix={prefix}", flush
        raise ValueError(backend)

    yield make
    for cleanup in leftovers:  # idempotent: also covers a run that failed half-way
        cleanup()


def test_conformance_full(backend: str, fresh_url: FreshUrl) -> None:
    @checkpointer_test(name=f"RemitSaver[{backend}]")
    async def remit_saver() -> AsyncIterator[RemitSaver]:
        url, cleanup = fresh_url()
        async with RemitSaver.from_conn_string(url) as saver:
            yield saver
        await asyncio.to_thread(cleanup)

    report = asyncio.run(validate(remit_saver))
    report.print_report()
    for name, result in sorted(report.results.items()):
        print(f"  {backend} {name}: detected={result.detected} passed={result.tests_passed} "
              f"failed={result.tests_failed}")

    detected = {name for name, result in report.results.items() if result.detected}
    assert detected == {cap.value for cap in ALL_CAPABILITIES}
    failures = {name: r.failures for name, r in report.results.items() if r.passed is not True}
    assert not failures, failures
    assert report.passed_all()
    assert report.conformance_level() == "FULL"
