"""``remit inspect`` is read-only (issue 13, item 6; DESIGN.md section 4b).

Inspection creates no file, table, schema or key. A URL that names no remit store (a
mistyped path, a foreign SQLite file, a missing PostgreSQL schema, an unused Redis
prefix) is reported as "no remit store at URL", with the URL masked, and a non-zero exit.
"""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from remit_core import open_store
from remit_core.cli import main


def listing(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def inspect(url: str, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    code = main(["inspect", url, *extra])
    got = capsys.readouterr()
    return code, got.out, got.err


# ------------------------------------------------------------------------------------ sqlite


def test_mistyped_sqlite_path_creates_nothing(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/mistyped.db"
    code, _out, err = inspect(url, capsys)
    assert code != 0
    assert f"no remit store at '{url}'" in err, err
    assert list(tmp_path.iterdir()) == []


def test_foreign_sqlite_file_is_left_as_it_was(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE orders (id INTEGER)")
    conn.execute("INSERT INTO orders VALUES (1)")
    conn.commit()
    conn.close()
    before = listing(tmp_path)
    code, _out, err = inspect(f"sqlite:///{path}", capsys, "run-1")
    assert code != 0
    assert "no remit store at" in err and "app.db" in err, err
    assert listing(tmp_path) == before
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    conn.close()
    assert tables == {"orders"}


def test_not_a_database_file_is_no_remit_store(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not sqlite " * 100)
    before = listing(tmp_path)
    code, _out, err = inspect(f"sqlite:///{path}", capsys)
    assert code != 0 and "no remit store at" in err, err
    assert listing(tmp_path) == before


def test_inspecting_a_remit_store_changes_no_file(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    with open_store(url) as s:
        s.put_checkpoint("run-1", "c1", new_values={"x": ("1", 1)})
    before = listing(tmp_path)
    code, out, err = inspect(url, capsys)
    assert code == 0, err
    assert "run-1" in out
    code, out, err = inspect(url, capsys, "run-1", "--json")
    assert code == 0 and "c1" in out, err
    assert listing(tmp_path) == before


def test_a_read_only_store_refuses_writes(tmp_path: Path) -> None:
    from remit_core.errors import StoreConfigError, StoreNotFound

    url = f"sqlite:///{tmp_path}/s.db"
    with pytest.raises(StoreNotFound):
        open_store(url, read_only=True)
    with open_store(url) as s:
        s.put_checkpoint("run-1", "c1")
    with open_store(url, read_only=True) as ro:
        assert [r.run_id for r in ro.list_runs()] == ["run-1"]
        with pytest.raises(StoreConfigError, match="read-only"):
            ro.put_checkpoint("run-1", "c2", parent_id="c1")
        with pytest.raises(StoreConfigError, match="read-only"):
            ro.take_runs(framework="fw", owner="o", limit=1)
        with pytest.raises(StoreConfigError, match="read-only"):
            ro.import_run("run-1", framework="fw", name="n", status="done", owner="o")
    with open_store(url) as s:
        assert s.get_checkpoint("run-1").checkpoint_id == "c1"  # type: ignore[union-attr]


def test_inspect_in_a_subprocess(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/mistyped.db"
    done = subprocess.run([str(Path(sys.executable).with_name("remit")), "inspect", url],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"remit: StoreNotFound: no remit store at '{url}': the file does not exist. "
        "Check the path; remit creates a store only when an application opens it for "
        "writing."], done.stderr
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------- postgres


def _pg_schema_exists(base: str, schema: str) -> bool:
    import psycopg

    with psycopg.connect(base, autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s",
                            (schema,)).fetchone() is not None


@pytest.fixture
def pg_schema(pg_base_url: str) -> Iterator[str]:
    import psycopg

    schema = f"remit_t_{uuid.uuid4().hex[:12]}"
    yield schema
    with psycopg.connect(pg_base_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _with_password(base: str) -> str:
    """The base URL with a password (the server trusts local users, so it is ignored)."""
    scheme, rest = base.split("://", 1)
    user, _, host = rest.partition("@")
    return f"{scheme}://{user}:Sx9pwQv7z@{host}"


def test_mistyped_schema_is_not_created(pg_base_url: str, pg_schema: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    sep = "&" if "?" in pg_base_url else "?"
    url = f"{_with_password(pg_base_url)}{sep}schema={pg_schema}"
    code, _out, err = inspect(url, capsys)
    assert code != 0
    assert "no remit store at" in err and pg_schema in err, err
    assert "Sx9" not in err and "Qv7z" not in err and "***" in err, err
    assert not _pg_schema_exists(pg_base_url, pg_schema)


def test_schema_without_remit_tables_gets_none(pg_base_url: str, pg_schema: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    import psycopg

    with psycopg.connect(pg_base_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{pg_schema}"')
    sep = "&" if "?" in pg_base_url else "?"
    code, _out, err = inspect(f"{pg_base_url}{sep}schema={pg_schema}", capsys)
    assert code != 0 and "no remit store at" in err, err
    with psycopg.connect(pg_base_url, autocommit=True) as conn:
        assert conn.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s", (pg_schema,)).fetchone() == (0,)


def test_postgres_store_is_inspected(make_url: Callable[[str], str],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    url = make_url("postgres")
    with open_store(url) as s:
        s.put_checkpoint("run-1", "c1")
    code, out, err = inspect(url, capsys)
    assert code == 0 and "run-1" in out, err


# ------------------------------------------------------------------------------------- redis


def _keys(server: str, prefix: str) -> list[bytes]:
    import redis

    r = redis.Redis.from_url(server)
    try:
        return list(r.scan_iter(match=f"{prefix}*"))
    finally:
        r.close()


def test_unused_redis_prefix_gets_no_key(redis_server: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    prefix = f"remit-t-{uuid.uuid4().hex[:12]}"
    code, _out, err = inspect(f"{redis_server}?prefix={prefix}", capsys)
    assert code != 0
    assert "no remit store at" in err and prefix in err, err
    assert _keys(redis_server, prefix) == []


def test_redis_store_is_inspected_without_a_write(make_url: Callable[[str], str],
                                                  redis_server: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import redis

    url = make_url("redis")
    with open_store(url) as s:
        s.put_checkpoint("run-1", "c1")
    r = redis.Redis.from_url(redis_server)
    try:
        before = r.info("stats")["total_commands_processed"]
        writes_before = r.info("persistence").get("aof_current_size")
        code, out, err = inspect(url, capsys)
        assert code == 0 and "run-1" in out, err
        assert r.info("persistence").get("aof_current_size") == writes_before
        assert r.info("stats")["total_commands_processed"] > before
    finally:
        r.close()
