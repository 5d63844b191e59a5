"""Opening stores: clear errors for bad URLs and foreign or newer stores; data left intact."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from remit_core import RemitError, open_store
from remit_core.errors import ForeignSchemaError, StoreConfigError, StoreVersionError
from remit_core.store.sqlite import MIGRATIONS
from remit_core.urls import mask_url


def test_mask_url() -> None:
    assert mask_url("postgresql://bob:hunter2@db:5432/x?schema=s") == \
        "postgresql://bob:***@db:5432/x?schema=s"
    assert mask_url("redis://:pw@h:6379/0") == "redis://:***@h:6379/0"
    assert mask_url("sqlite:///a.db") == "sqlite:///a.db"
    assert mask_url("postgresql://u:secret@h:port/db") == "postgresql://u:***@h:port/db"
    assert "secret" not in mask_url("postgresql://h/db?user=u&password=secret&sslmode=off")
    assert "sslmode=off" in mask_url("postgresql://h/db?user=u&password=secret&sslmode=off")


@pytest.mark.parametrize("url, fragment", [
    ("sqllite:///x.db", "unknown store scheme 'sqllite'"),
    ("mysql://u:hunter2@h/db", "unknown store scheme 'mysql'"),
    ("x.db", "not a store URL"),
    ("sqlite://x.db", "names host 'x.db'"),
    ("sqlite:///x.db?lease=-1", "lease"),
    ("sqlite:///x.db?synchronus=full", "unknown option(s) synchronus"),
])
def test_bad_urls(url: str, fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreConfigError) as info:
        open_store(url)
    assert fragment in str(info.value)
    assert "hunter2" not in str(info.value)
    assert isinstance(info.value, RemitError)
    assert list(tmp_path.iterdir()) == []  # nothing created


def test_sqlite_memory_store() -> None:
    with open_store("sqlite://") as s:
        s.put_checkpoint("r", "c", new_values={"x": ("1", 1)})
        assert s.get_checkpoint("r").values == {"x": 1}  # type: ignore[union-attr]


def test_sqlite_newer_version_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    with open_store(url) as s:
        s.put_checkpoint("r", "c", new_values={"x": ("1", 1)})
    conn = sqlite3.connect(tmp_path / "s.db")
    conn.execute("UPDATE remit_meta SET value = ? WHERE key = 'version'", (str(len(MIGRATIONS) + 1),))
    conn.commit()
    conn.close()
    with pytest.raises(StoreVersionError) as info:
        open_store(url)
    assert info.value.found == len(MIGRATIONS) + 1 and "newer remit" in str(info.value)
    conn = sqlite3.connect(tmp_path / "s.db")
    assert conn.execute("SELECT COUNT(*) FROM remit_checkpoints").fetchone()[0] == 1
    conn.close()


def test_sqlite_store_of_schema_version_1_is_upgraded(tmp_path: Path) -> None:
    """A store written before chunked values (version 1) opens, gains remit_chunks, keeps
    its data and stores large values in chunks from then on."""
    url = f"sqlite:///{tmp_path}/s.db"
    with open_store(url) as s:
        s.put_checkpoint("r", "c1", new_values={"x": ("1", 1)})
    conn = sqlite3.connect(tmp_path / "s.db")
    conn.execute("DROP TABLE remit_chunks")  # the version-1 layout
    conn.execute("DROP TABLE remit_lifecycle")  # (version 3)
    conn.execute("DROP INDEX remit_claims_lapsing")  # (version 4)
    conn.execute("UPDATE remit_meta SET value = '1' WHERE key = 'version'")
    conn.commit()
    conn.close()
    big = bytes(range(256)) * 1000
    with open_store(url) as s:
        assert s.get_checkpoint("r").values == {"x": 1}  # type: ignore[union-attr]
        s.put_checkpoint("r", "c2", parent_id="c1", new_values={"x": ("2", big)})
        assert s.usage("r")["chunks"] > 0 and s.get_checkpoint("r").values == {"x": big}  # type: ignore[union-attr]
    conn = sqlite3.connect(tmp_path / "s.db")
    assert conn.execute("SELECT value FROM remit_meta WHERE key = 'version'").fetchone() == (
        str(len(MIGRATIONS)),)
    conn.close()


def test_sqlite_foreign_table_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE remit_checkpoints (id INTEGER, note TEXT)")
    conn.execute("INSERT INTO remit_checkpoints VALUES (1, 'theirs')")
    conn.commit()
    conn.close()
    with pytest.raises(ForeignSchemaError) as info:
        open_store(f"sqlite:///{path}")
    assert info.value.name == "remit_checkpoints" and "did not create" in str(info.value)
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT * FROM remit_checkpoints").fetchall() == [(1, "theirs")]
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "remit_meta" not in tables
    conn.close()


def test_not_a_database_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello, this is not sqlite" * 100)
    with pytest.raises(RemitError, match="Is it a SQLite database"):
        open_store(f"sqlite:///{path}")
    assert path.read_text().startswith("hello")


def test_stock_saver_tables_coexist(tmp_path: Path) -> None:
    """remit's tables are prefixed, so a stock saver's tables in the same file are untouched."""
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE checkpoints (thread_id TEXT, checkpoint BLOB)")
    conn.execute("INSERT INTO checkpoints VALUES ('t', x'00')")
    conn.commit()
    conn.close()
    with open_store(f"sqlite:///{path}") as s:
        s.put_checkpoint("r", "c")
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT thread_id FROM checkpoints").fetchall() == [("t",)]
    conn.close()
