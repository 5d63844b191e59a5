"""URL options are parsed and bounded in one place (issue 13, item 8).

A bad value is a ``StoreConfigError`` that names the option, the value and the allowed
range; an unknown option is a ``StoreConfigError`` listing the known ones. Nothing is
created by a URL that is refused: no SQLite file, no PostgreSQL schema or table, no
Redis key.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from remit_core import open_store
from remit_core.errors import StoreConfigError

KNOWN = {
    "sqlite": ("lease", "mode", "synchronous", "timeout"),
    "postgres": ("lease", "schema", "pool_min", "pool_max", "pool_timeout"),
    "redis": ("lease", "prefix", "durability"),
}

# (query, option named in the message, words the message must hold)
SQLITE_BAD = [
    ("timeout=abc", "timeout", ["'abc'", "seconds"]),
    ("timeout=inf", "timeout", ["'inf'", "seconds"]),
    ("timeout=-1", "timeout", ["'-1'", "seconds"]),
    ("lease=nan", "lease", ["'nan'", "0 < lease"]),
    ("lease=inf", "lease", ["'inf'", "0 < lease"]),
    ("lease=0", "lease", ["'0'", "0 < lease"]),
    ("lease=1e9", "lease", ["'1e9'", "0 < lease"]),
    ("synchronous=maybe", "synchronous", ["'maybe'", "FULL"]),
    ("mode=0999", "mode", ["'0999'", "octal"]),
    ("mode=0400", "mode", ["'0400'", "owner"]),
    ("mode=04600", "mode", ["'04600'", "octal"]),
]
PG_BAD = [
    ("lease=nan", "lease", ["'nan'"]),
    ("lease=inf", "lease", ["'inf'"]),
    ("schema=information_schema", "schema", ["'information_schema'", "reserved"]),
    ("schema=INFORMATION_SCHEMA", "schema", ["'INFORMATION_SCHEMA'", "reserved"]),
    ("schema=pg_catalog", "schema", ["'pg_catalog'", "pg_"]),
    ("schema=pg_toast", "schema", ["'pg_toast'", "pg_"]),
    ("schema=pg_remit", "schema", ["'pg_remit'", "pg_"]),
    ("schema=a-b", "schema", ["'a-b'", "letters"]),
    ("pool_min=abc", "pool_min", ["'abc'", "integer"]),
    ("pool_max=0", "pool_max", ["'0'", "integer"]),
    ("pool_timeout=inf", "pool_timeout", ["'inf'", "seconds"]),
    ("connect_timeout=inf", "connect_timeout", ["'inf'", "integer"]),
]
REDIS_BAD = [
    ("lease=nan", "lease", ["'nan'"]),
    ("lease=inf", "lease", ["'inf'"]),
    ("durability=maybe", "durability", ["'maybe'", "none", "required"]),
    ("socket_timeout=inf", "socket_timeout", ["'inf'", "seconds"]),
    ("socket_timeout=abc", "socket_timeout", ["'abc'", "seconds"]),
    ("max_connections=0", "max_connections", ["'0'", "integer"]),
    ("db=abc", "db", ["'abc'", "integer"]),
]


def _assert_clear(exc: StoreConfigError, option: str, words: list[str]) -> None:
    text = str(exc)
    assert f"option {option}=" in text, text
    for word in words:
        assert word in text, (word, text)
    assert exc.url is not None


# ------------------------------------------------------------------------------------ sqlite


@pytest.mark.parametrize("query, option, words", SQLITE_BAD)
def test_sqlite_bad_values(tmp_path: Path, query: str, option: str, words: list[str]) -> None:
    with pytest.raises(StoreConfigError) as info:
        open_store(f"sqlite:///{tmp_path}/s.db?{query}")
    _assert_clear(info.value, option, words)
    assert list(tmp_path.iterdir()) == []  # refused before anything was created


def test_sqlite_unknown_option_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(StoreConfigError) as info:
        open_store(f"sqlite:///{tmp_path}/s.db?foo=1")
    text = str(info.value)
    assert "unknown option(s) foo" in text
    for name in KNOWN["sqlite"]:
        assert name in text, (name, text)
    with pytest.raises(StoreConfigError, match="did you mean synchronous"):
        open_store(f"sqlite:///{tmp_path}/s.db?synchronus=full")
    assert list(tmp_path.iterdir()) == []


def test_sqlite_keyword_options_are_checked_by_the_same_table(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    with pytest.raises(StoreConfigError, match=r"option lease=nan"):
        open_store(url, lease=math.nan)
    with pytest.raises(StoreConfigError, match=r"option timeout=inf"):
        open_store(url, timeout=math.inf)
    with pytest.raises(StoreConfigError, match="unknown option"):
        open_store(url, pool_max=3)
    assert list(tmp_path.iterdir()) == []


def test_sqlite_good_values_open(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path}/s.db?timeout=5&lease=2.5&synchronous=normal"
                    "&mode=0640") as s:
        assert s.lease == 2.5
        s.put_checkpoint("r", "c1")
    with open_store(f"sqlite:///{tmp_path}/s.db", lease=7, timeout=0) as s:
        assert s.lease == 7.0  # a keyword gives a default; the URL wins over it
    with open_store(f"sqlite:///{tmp_path}/s.db?lease=3", lease=7) as s:
        assert s.lease == 3.0


def test_the_table_is_the_one_place() -> None:
    """Every backend reads its options from the one table; each entry says its range."""
    from remit_core.store.options import OPTIONS, known_options

    for backend in ("sqlite", "postgres", "redis"):
        assert set(KNOWN[backend]) <= set(known_options(backend))
    for opt in OPTIONS:
        assert opt.allowed and opt.doc, opt.name


# ---------------------------------------------------------------------------------- postgres


def _pg_schemas_like(base: str, pattern: str) -> list[str]:
    import psycopg

    with psycopg.connect(base, autocommit=True) as conn:
        return [r[0] for r in conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", (pattern,))]


def _pg_remit_tables_in(base: str, schema: str) -> list[str]:
    import psycopg

    with psycopg.connect(base, autocommit=True) as conn:
        return [r[0] for r in conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname LIKE 'remit%%'", (schema,))]


@pytest.fixture
def pg_tag(pg_base_url: str) -> Iterator[str]:
    """A schema name no one uses; afterwards anything a refused URL wrongly created is
    dropped (the schema, and remit tables in information_schema)."""
    import psycopg

    tag = f"remit_t_{uuid.uuid4().hex[:12]}"
    yield tag
    with psycopg.connect(pg_base_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{tag}" CASCADE')
        for table in _pg_remit_tables_in(pg_base_url, "information_schema"):
            conn.execute(f'DROP TABLE IF EXISTS information_schema."{table}" CASCADE')


@pytest.mark.parametrize("query, option, words", PG_BAD)
def test_postgres_bad_values(pg_base_url: str, pg_tag: str, query: str, option: str,
                             words: list[str]) -> None:
    tag = pg_tag
    sep = "&" if "?" in pg_base_url else "?"
    url = f"{pg_base_url}{sep}{query}" if query.startswith("schema=") else \
        f"{pg_base_url}{sep}schema={tag}&{query}"
    with pytest.raises(StoreConfigError) as info:
        open_store(url)
    _assert_clear(info.value, option, words)
    assert _pg_schemas_like(pg_base_url, f"{tag}%") == []
    for schema in ("information_schema", "pg_catalog"):
        assert _pg_remit_tables_in(pg_base_url, schema) == []


def test_postgres_unknown_option_lists_the_known_ones(pg_base_url: str, pg_tag: str) -> None:
    tag = pg_tag
    sep = "&" if "?" in pg_base_url else "?"
    with pytest.raises(StoreConfigError) as info:
        open_store(f"{pg_base_url}{sep}schema={tag}&foo=1")
    text = str(info.value)
    assert "unknown option(s) foo" in text
    for name in (*KNOWN["postgres"], "sslmode", "application_name"):
        assert name in text, (name, text)
    assert _pg_schemas_like(pg_base_url, f"{tag}%") == []


def test_postgres_good_values_open(make_url: Callable[[str], str]) -> None:
    url = make_url("postgres")
    with open_store(f"{url}&lease=2.5&pool_min=0&pool_max=2&pool_timeout=3"
                    "&connect_timeout=4&application_name=remit-test") as s:
        assert s.lease == 2.5
        s.put_checkpoint("r", "c1")


# ------------------------------------------------------------------------------------- redis


def _redis_keys(server: str, prefix: str) -> list[Any]:
    import redis

    r = redis.Redis.from_url(server)
    try:
        return list(r.scan_iter(match=f"{prefix}*"))
    finally:
        r.close()


@pytest.mark.parametrize("query, option, words", REDIS_BAD)
def test_redis_bad_values(redis_server: str, query: str, option: str, words: list[str]) -> None:
    prefix = f"remit-t-{uuid.uuid4().hex[:12]}"
    with pytest.raises(StoreConfigError) as info:
        open_store(f"{redis_server}?prefix={prefix}&{query}")
    _assert_clear(info.value, option, words)
    assert _redis_keys(redis_server, prefix) == []


def test_redis_unknown_option_lists_the_known_ones(redis_server: str) -> None:
    prefix = f"remit-t-{uuid.uuid4().hex[:12]}"
    with pytest.raises(StoreConfigError) as info:
        open_store(f"{redis_server}?prefix={prefix}&foo=1")
    text = str(info.value)
    assert "unknown option(s) foo" in text
    for name in (*KNOWN["redis"], "socket_timeout", "client_name"):
        assert name in text, (name, text)
    assert _redis_keys(redis_server, prefix) == []


def test_redis_good_values_open(make_url: Callable[[str], str]) -> None:
    url = make_url("redis")
    with open_store(f"{url}&lease=2.5&socket_timeout=5&socket_connect_timeout=2"
                    "&health_check_interval=0&max_connections=20&client_name=remit") as s:
        assert s.lease == 2.5
        s.put_checkpoint("r", "c1")


def test_the_readme_lists_every_option() -> None:
    from remit_core.store.options import OPTIONS

    text = (Path(__file__).parents[1] / "shared" / "README.md").read_text()
    section = text.split("### URL options", 1)[1].split("\n## ", 1)[0]
    for opt in OPTIONS:
        assert f"`{opt.name}`" in section, opt.name
