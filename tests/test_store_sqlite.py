"""SQLite-only tests: what the store asks of the database file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from remit_core import open_store
from remit_core.store.sqlite import SqliteStore


def test_reads_are_one_transaction_of_a_bounded_number_of_statements(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path}/s.db") as s:
        assert isinstance(s, SqliteStore)
        for n in range(30):
            s.put_checkpoint("r", f"c{n}", parent_id=f"c{n - 1}" if n else None,
                             new_values={"x": (str(n), n), "y": (str(n), -n)})
            s.put_writes("r", f"c{n}", "t", [(0, "x", n)])
        seen: list[str] = []
        s._conn().set_trace_callback(seen.append)  # the reading connection of this thread
        got = s.get_checkpoint("r")
        assert got is not None and got.values == {"x": 29, "y": -29}
        assert [w.value for w in got.writes] == [29]
        # BEGIN, the checkpoint, its blobs, its writes, COMMIT
        assert [q.split()[0] for q in seen] == ["BEGIN", "SELECT", "SELECT", "SELECT",
                                                "COMMIT"], seen
        seen.clear()
        listed = list(s.list_checkpoints("r"))
        assert len(listed) == 30 and all(c.writes for c in listed)
        assert [q.split()[0] for q in seen] == ["BEGIN", "SELECT", "SELECT", "SELECT",
                                                "COMMIT"], seen
        s._conn().set_trace_callback(None)


def test_blobs_and_writes_are_read_by_key(tmp_path: Path) -> None:
    """The statements that read a listing's blobs and writes look each one up by its
    primary key: their cost does not grow with the run's history."""
    from remit_core.store import sqlite as backend

    conn = sqlite3.connect(f"{tmp_path}/plan.db")
    with open_store(f"sqlite:///{tmp_path}/plan.db"):
        pass
    for sql in (backend._BLOBS_OF, backend._WRITES_OF):
        plan = " | ".join(r[3] for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}",
                                                       {"seqs": "[1]"}))
        assert "SCAN remit_blobs" not in plan and "SCAN remit_writes" not in plan, plan
        assert "SCAN remit_checkpoints" not in plan, plan
    conn.close()
