"""Fresh, isolated remit stores for one upstream test, on the backend the run names."""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from collections.abc import Iterator

PG_URL = os.environ.get("REMIT_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("REMIT_TEST_REDIS", "redis://127.0.0.1:6379/0")
BACKENDS = ("sqlite", "postgres", "redis")


def backend() -> str:
    name = os.environ.get("REMIT_UPSTREAM_STORE", "sqlite")
    if name not in BACKENDS:
        raise ValueError(f"REMIT_UPSTREAM_STORE={name!r}: choose one of {', '.join(BACKENDS)}")
    return name


@contextlib.contextmanager
def fresh_url(kind: str | None = None) -> Iterator[str]:
    """A URL of a store nobody else uses; whatever it held is deleted afterwards."""
    kind = kind or backend()
    # (not uuid4: the suite's deterministic_uuids fixture patches it for the test)
    tag = secrets.token_hex(6)
    if kind == "sqlite":
        with tempfile.TemporaryDirectory(prefix="remit-up-") as tmp:
            yield f"sqlite:///{tmp}/remit-{tag}.db"
    elif kind == "postgres":
        import psycopg

        schema = f"remit_up_{tag}"
        try:
            yield f"{PG_URL}{'&' if '?' in PG_URL else '?'}schema={schema}"
        finally:
            with psycopg.connect(PG_URL, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    else:
        import redis

        prefix = f"remit-up-{tag}"
        try:
            yield f"{REDIS_URL}?prefix={prefix}&durability=none"
        finally:
            client = redis.Redis.from_url(REDIS_URL)
            try:
                keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
                for i in range(0, len(keys), 500):
                    client.delete(*keys[i:i + 500])
            finally:
                client.close()
