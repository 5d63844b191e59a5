"""Copy a whole store (every run, receipt and claim), for the recovery-determinism test.

A test-side helper that knows each backend's layout (on PostgreSQL its tables and the
functions its migrations create); remit itself has no store-to-store copy. The copy is
taken while no process writes.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable
from urllib.parse import parse_qsl

from remit_core.store.sql import TABLES

PG_TABLES = TABLES  # every table of a store


def clone_store(backend: str, url: str) -> tuple[str, Callable[[], None]]:
    """Return the URL of a full copy of the store at ``url`` and a function that drops it."""
    tag = uuid.uuid4().hex[:8]
    if backend == "sqlite":
        path = url.removeprefix("sqlite:///")
        copy = f"{path}.{tag}.copy.db"
        src, dst = sqlite3.connect(path), sqlite3.connect(copy)
        try:
            src.backup(dst)  # a consistent copy, WAL included
        finally:
            src.close()
            dst.close()
        return f"sqlite:///{copy}", lambda: None
    if backend == "postgres":
        import psycopg

        base, _, query = url.partition("?")
        opts = dict(parse_qsl(query))
        old = opts["schema"]
        new = f"{old}_c{tag}"
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{new}"')
            for t in PG_TABLES:
                conn.execute(f'CREATE TABLE "{new}".{t} (LIKE "{old}".{t} INCLUDING ALL)')
                conn.execute(f'INSERT INTO "{new}".{t} OVERRIDING SYSTEM VALUE '
                             f'SELECT * FROM "{old}".{t}')
            conn.execute(
                f"SELECT setval(pg_get_serial_sequence('\"{new}\".remit_checkpoints', 'seq'), "
                f'COALESCE((SELECT max(seq) FROM "{new}".remit_checkpoints), 0) + 1, false)')
            # the layout's functions (a step's write, a checkpoint's read), each created in
            # the store's schema with that schema as its search_path: the same in the copy's
            for (definition,) in conn.execute(
                    "SELECT pg_get_functiondef(p.oid) FROM pg_proc AS p JOIN pg_namespace AS n "
                    "ON n.oid = p.pronamespace WHERE n.nspname = %s", (old,)).fetchall():
                conn.execute(definition.replace(old, new))

        def drop() -> None:
            with psycopg.connect(base, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{new}" CASCADE')

        opts["schema"] = new
        return base + "?" + "&".join(f"{k}={v}" for k, v in opts.items()), drop
    if backend == "redis":
        import redis

        base, _, query = url.partition("?")
        opts = dict(parse_qsl(query))
        old = opts["prefix"]
        new = f"{old}-c{tag}"
        client = redis.Redis.from_url(base)
        try:
            for key in client.scan_iter(match=f"{old}:*", count=1000):
                dumped = client.dump(key)
                if dumped is not None:  # keys are bytes; values never name the prefix
                    client.restore(new.encode() + key[len(old.encode()):], 0, dumped)
        finally:
            client.close()

        def drop_keys() -> None:
            c = redis.Redis.from_url(base)
            try:
                for key in c.scan_iter(match=f"{new}:*", count=1000):
                    c.delete(key)
            finally:
                c.close()

        opts["prefix"] = new
        return base + "?" + "&".join(f"{k}={v}" for k, v in opts.items()), drop_keys
    raise ValueError(backend)

