"""The store suite: the same tests on SQLite, PostgreSQL and Redis."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import decimal
import enum
import json
import logging
import os
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from remit_core import (
    ConsumeConflict,
    CorruptRecord,
    EffectInDoubt,
    SerializationError,
    StateSchema,
    StateValidationError,
    effect,
    effect_scope,
    open_store,
)
from remit_core.errors import LeaseLost
from remit_core.records import WriteRow, versions_from_json, versions_json
from remit_core.store import Store, chunks, new_owner
from remit_core.store import sqlite as sqlite_backend


class Color(enum.Enum):
    RED = "red"


class Item(BaseModel):
    name: str
    at: dt.datetime
    tags: set[str] = set()


@dataclasses.dataclass
class Point:
    x: int
    y: float


RICH: dict[str, Any] = {
    "text": "héllo",
    "n": 2**70,
    "neg": -5,
    "f": 1.5,
    "none": None,
    "bytes": b"\x00\xff" * 10,
    "tuple": (1, "a", (2, 3)),
    "set": {1, 2, 3},
    "frozen": frozenset({"a"}),
    "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "when": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
    "day": dt.date(2026, 1, 2),
    "delta": dt.timedelta(seconds=90),
    "dec": decimal.Decimal("1.10"),
    "enum": Color.RED,
    "model": Item(name="x", at=dt.datetime(2026, 1, 1), tags={"a"}),
    "dc": Point(1, 2.5),
    "nested": {"list": [1, {"k": (1,)}], 3: "int key"},
}


def wait_until(predicate: Any, timeout: float = 10.0) -> None:
    """Poll a condition (lease expiry is a time condition; this is not synchronisation)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


def put(store: Store, run: str, cid: str, parent: str | None = None, **kw: Any) -> Any:
    return store.put_checkpoint(run, cid, parent_id=parent, data={"id": cid},
                                metadata={"step": kw.pop("step", 0)}, **kw)


# ------------------------------------------------------------------------------ checkpoints


def test_checkpoint_roundtrip_rich_values(store: Store) -> None:
    put(store, "r", "c1", new_values={"state": ("v1", RICH)})
    got = store.get_checkpoint("r")
    assert got is not None
    assert got.checkpoint_id == "c1"
    assert got.values["state"] == RICH
    assert got.data == {"id": "c1"} and got.metadata == {"step": 0}
    assert got.versions == {"state": "v1"}


def test_a_version_map_round_trips_with_any_text(store: Store) -> None:
    """The version map is kept as JSON text (orjson): non-ASCII names and versions, quotes,
    backslashes and control characters come back as they were, with every channel's value."""
    versions = {"état": "v\u00e9\"1\"", "中文": "2", "back\\slash": "3\n", "t\tab": "4"}
    put(store, "r", "c1", new_values={ch: (v, ch) for ch, v in versions.items()},
        versions={**versions, "unchanged": "0"})
    got = store.get_checkpoint("r")
    assert got is not None
    assert got.versions == {**versions, "unchanged": "0"}
    assert got.values == {ch: ch for ch in versions}


def test_version_map_text_reads_the_standard_librarys_form_too() -> None:
    """Maps stored before (``json.dumps``: spaces, ``\\u`` escapes) read back the same, and
    text orjson refuses (a lone surrogate) is written with the standard library's escapes."""
    versions = {"état": "1", "中": "2.0.5"}
    assert versions_from_json(json.dumps(versions)) == versions
    assert versions_from_json(versions_json(versions)) == versions
    assert versions_from_json(versions_json(versions).encode()) == versions
    odd = {"a\ud800": "1"}
    assert versions_json(odd) == json.dumps(odd)
    assert versions_from_json(versions_json(odd)) == odd


def test_latest_is_highest_seq_and_addressed_reads(store: Store) -> None:
    a = put(store, "r", "c1", new_values={"x": ("1", 1)})
    b = put(store, "r", "c2", "c1", new_values={"x": ("2", 2)})
    assert b.seq > a.seq
    latest = store.get_checkpoint("r")
    assert latest is not None and latest.checkpoint_id == "c2" and latest.values == {"x": 2}
    first = store.get_checkpoint("r", "c1")
    assert first is not None and first.values == {"x": 1} and first.parent_id is None
    assert store.get_checkpoint("r", "nope") is None
    assert store.get_checkpoint("other") is None


def test_unchanged_value_stored_once(store: Store) -> None:
    big = b"x" * (1 << 20)
    put(store, "r", "c0", new_values={"big": ("1", big), "n": ("1", 0)})
    for i in range(1, 100):
        put(store, "r", f"c{i}", f"c{i - 1}", versions={"big": "1", "n": str(i + 1)},
            new_values={"n": (str(i + 1), i)})
    usage = store.usage("r")
    assert usage["checkpoints"] == 100
    assert usage["blob_bytes"] < int(1.2 * (1 << 20))
    latest = store.get_checkpoint("r")
    assert latest is not None and latest.values["big"] == big and latest.values["n"] == 99


def test_a_large_value_is_stored_once_in_every_form(store: Store) -> None:
    """The same 1 MB handed over as a graph input (inside a dict), as a pending write and
    as a channel of its own, unchanged over 100 checkpoints: about 1 MB stored."""
    big = os.urandom(1_000_000)
    graph_input = {"blob": big, "n": 0}
    put(store, "r", "c0", new_values={"__start__": ("1", graph_input)})
    store.put_writes("r", "c0", "input", [(0, "__start__", graph_input)])
    put(store, "r", "c1", "c0", versions={"__start__": "1"},
        new_values={"blob": ("1", big), "n": ("1", 0)})
    for i in range(2, 101):
        put(store, "r", f"c{i}", f"c{i - 1}", versions={"blob": "1", "n": str(i)},
            new_values={"n": (str(i), i)})
    usage = store.usage("r")
    assert usage["blob_bytes"] + usage["chunk_bytes"] < 1_100_000, usage
    assert usage["chunk_bytes"] >= 1_000_000  # the bytes themselves are there, once
    first = store.get_checkpoint("r", "c0")
    assert first is not None and first.values["__start__"] == graph_input
    assert [w.value for w in first.writes] == [graph_input]
    latest = store.get_checkpoint("r")
    assert latest is not None and latest.values == {"blob": big, "n": 100}
    # a value just under the threshold is stored whole, as before
    small = b"s" * (store.chunk_threshold - 100)
    put(store, "s", "c0", new_values={"v": ("1", small)})
    assert store.usage("s")["chunks"] == 0 and store.get_checkpoint("s").values["v"] == small  # type: ignore[union-attr]


def test_a_growing_list_stores_about_what_it_adds(store: Store) -> None:
    """A message list that gains one 6 kB message per checkpoint: once it is chunked,
    a checkpoint stores the new message and the chunks at the edges (the list's header
    changes), not the whole list again."""
    messages: list[dict[str, str]] = []
    grew: list[int] = []
    for i in range(60):
        messages.append({"role": "user" if i % 2 else "ai", "content": os.urandom(3000).hex()})
        before = store.usage("r")
        put(store, "r", f"c{i}", f"c{i - 1}" if i else None,
            new_values={"messages": (str(i), list(messages))})
        after = store.usage("r")
        grew.append(after["blob_bytes"] + after["chunk_bytes"]
                    - before["blob_bytes"] - before["chunk_bytes"])
    whole = len(store.serde.encode(messages))
    assert whole > 350_000
    # each of the last 10 checkpoints: the new message, a new head (the list's length is
    # in its first bytes, chunks.HEAD of them a chunk of their own) and a new last chunk
    # of at most 4 x chunk_size (FastCDC's maximum), and its manifest (32 bytes a chunk),
    # where a whole copy would be the whole list again
    manifest = 32 * (whole // (store.chunk_size // 4) + 2)
    bound = 6_100 + chunks.HEAD + 4 * store.chunk_size + manifest
    assert max(grew[-10:]) < bound < whole / 2, grew[-10:]
    assert sum(grew[-10:]) < 10 * whole / 3
    latest = store.get_checkpoint("r")
    assert latest is not None and latest.values["messages"] == messages
    assert [c.values["messages"] for c in store.list_checkpoints("r", limit=2)] == \
        [messages, messages[:-1]]


def test_a_grown_list_stores_only_a_small_head_again() -> None:
    """The list's length sits in the first bytes of its encoding: they are a chunk of
    chunks.HEAD bytes of their own, so one more item changes that small head and the
    last chunks, and the content-defined chunks in between stay the same."""
    from remit_core.serde import default_serde

    items = [{"role": "ai", "content": f"message {i} " + "x" * (200 + i)} for i in range(300)]
    one, two = default_serde.encode(items), default_serde.encode([*items, items[0]])
    a: dict[bytes, bytes] = {}
    b: dict[bytes, bytes] = {}
    first, grown = chunks.digests(chunks.split(one, size=2048, into=a)), chunks.digests(
        chunks.split(two, size=2048, into=b))
    assert len(a[first[0]]) == len(b[grown[0]]) == chunks.HEAD and first[0] != grown[0]
    assert grown[1:len(first) - 1] == first[1:-1]
    added = sum(len(b[d]) for d in set(grown) - set(first))
    assert added <= chunks.HEAD + 4 * 2048 + len(default_serde.encode(items[0])), added


def test_chunks_follow_copy_prune_executions_and_delete(store: Store) -> None:
    one, two, three = (os.urandom(300_000) for _ in range(3))
    put(store, "r", "c0", new_values={"x": ("1", one)}, execution_id="e0")
    put(store, "r", "c1", "c0", new_values={"x": ("2", two)}, execution_id="e1")
    store.put_writes("r", "c1", "t", [(0, "y", three)])
    full = store.usage("r")["chunk_bytes"]
    assert full >= 900_000
    store.copy_run("r", "r2")
    assert store.usage("r2")["chunk_bytes"] == full
    copied = store.get_checkpoint("r2")
    assert copied is not None and copied.values == {"x": two} and copied.writes[0].value == three

    store.prune_run("r2", keep_latest=1)  # c0 and the chunks only its value used go
    assert 600_000 <= store.usage("r2")["chunk_bytes"] < full - 250_000
    kept = store.get_checkpoint("r2")
    assert kept is not None and kept.values == {"x": two} and kept.writes[0].value == three

    store.delete_executions(["e1"])  # c1 of both runs, with its write
    assert 300_000 <= store.usage("r")["chunk_bytes"] < 400_000
    assert store.get_checkpoint("r") is not None and store.get_checkpoint("r").values == {"x": one}  # type: ignore[union-attr]
    assert store.usage("r2")["chunk_bytes"] == 0

    store.delete_run("r")
    assert store.usage("r")["chunks"] == 0


def test_reads_are_one_backend_operation(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint with its values and writes is one read of the backend; so is a listing,
    however many checkpoints it holds; chunked values take one more read per run (on
    PostgreSQL a checkpoint's read brings its chunks too, in the same snapshot)."""
    store.chunk_threshold = 300
    for i in range(12):
        big = {"big": ("1", bytes(range(256)) * 4)} if i == 0 else {}
        put(store, "r", f"c{i}", f"c{i - 1}" if i else None,
            new_values={"x": (str(i), i), **big}, versions={"big": "1"})
        store.put_writes("r", f"c{i}", "t", [(0, "x", i), (1, "y", -i)])
    calls: list[str] = []
    real = store._call

    def counting(fn: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(fn.__name__)
        return real(fn, *args, **kwargs)

    monkeypatch.setattr(store, "_call", counting)
    got = store.get_checkpoint("r", "c5")
    assert got is not None and [w.value for w in got.writes] == [5, -5]
    assert got.values["big"] == bytes(range(256)) * 4
    one_read = store.backend == "postgres"
    assert calls == ["_read_checkpoint"] + ([] if one_read else ["_read_chunks"]), calls
    calls.clear()
    listed = list(store.list_checkpoints("r"))
    assert [c.checkpoint_id for c in listed] == [f"c{i}" for i in range(11, -1, -1)]
    assert all([w.value for w in c.writes] == [i, -i] for c, i in zip(listed, range(11, -1, -1),
                                                                      strict=True))
    assert all(c.values["big"] == bytes(range(256)) * 4 for c in listed)
    assert calls == ["_list_checkpoints", "_read_chunks"], calls


def test_sqlite_reads_are_one_transaction_of_a_bounded_number_of_statements(
        tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path}/s.db") as s:
        assert isinstance(s, sqlite_backend.SqliteStore)
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


def test_sqlite_blobs_and_writes_are_read_by_key(tmp_path: Path) -> None:
    """The statements that read the blobs and writes of a checkpoint, or of a listing,
    look each one up by its primary key: their cost does not grow with the run's
    history."""
    conn = sqlite3.connect(f"{tmp_path}/plan.db")
    with open_store(f"sqlite:///{tmp_path}/plan.db"):
        pass
    for sql, args in ((sqlite_backend._BLOBS_OF, {"seqs": "[1]"}),
                      (sqlite_backend._WRITES_OF, {"seqs": "[1]"}),
                      (sqlite_backend._BLOBS_OF_ONE, ('{"x": "1"}', "r", "")),
                      (sqlite_backend._WRITES_OF_ONE, ("r", "", "c"))):
        plan = " | ".join(r[3] for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}", args))
        assert "SCAN remit_blobs" not in plan and "SCAN remit_writes" not in plan, plan
        assert "SCAN remit_checkpoints" not in plan and "TEMP B-TREE" not in plan, plan
    conn.close()


def test_rewrite_keeps_seq(store: Store) -> None:
    a = put(store, "r", "c1")
    put(store, "r", "c2", "c1")
    again = store.put_checkpoint("r", "c1", data={"id": "c1", "v": 2})
    assert again.seq == a.seq
    latest = store.get_checkpoint("r")
    assert latest is not None and latest.checkpoint_id == "c2"
    c1 = store.get_checkpoint("r", "c1")
    assert c1 is not None and c1.data == {"id": "c1", "v": 2}


def test_namespaces_are_separate(store: Store) -> None:
    put(store, "r", "c1", new_values={"x": ("1", "root")})
    store.put_checkpoint("r", "s1", ns="sub:1", new_values={"x": ("1", "sub")})
    root = store.get_checkpoint("r")
    sub = store.get_checkpoint("r", ns="sub:1")
    assert root is not None and root.values == {"x": "root"}
    assert sub is not None and sub.values == {"x": "sub"} and sub.ns == "sub:1"


def test_exclusive_child(store: Store) -> None:
    put(store, "r", "p")
    put(store, "r", "a", "p", exclusive_child=True)
    put(store, "r", "a", "p", exclusive_child=True)  # the same child again is fine
    with pytest.raises(ConsumeConflict) as info:
        put(store, "r", "b", "p", exclusive_child=True)
    assert info.value.run_id == "r" and info.value.owner == "a"
    assert store.get_checkpoint("r", "b") is None
    put(store, "r", "f", "p", kind="fork", exclusive_child=True)  # another kind is separate


def test_list_newest_first_limit_before(store: Store) -> None:
    for i in range(5):
        put(store, "r", f"c{i}", f"c{i - 1}" if i else None, execution_id=f"e{i % 2}")
    put(store, "q", "x0")
    ids = [c.checkpoint_id for c in store.list_checkpoints("r")]
    assert ids == ["c4", "c3", "c2", "c1", "c0"]
    assert [c.checkpoint_id for c in store.list_checkpoints("r", limit=2)] == ["c4", "c3"]
    assert [c.checkpoint_id for c in store.list_checkpoints("r", before="c3")] == ["c2", "c1", "c0"]
    assert [c.checkpoint_id for c in store.list_checkpoints("r", before="c3", limit=1)] == ["c2"]
    assert [c.checkpoint_id for c in store.list_checkpoints("r", execution_ids=["e1"])] == ["c3", "c1"]
    everything = [(c.run_id, c.checkpoint_id) for c in store.list_checkpoints()]
    assert everything[0] == ("q", "x0") and len(everything) == 6
    assert [c.checkpoint_id for c in store.list_checkpoints("r", ns="other")] == []


def test_before_names_the_lowest_checkpoint_with_that_id_in_any_namespace(store: Store
                                                                        ) -> None:
    """``before`` is a checkpoint id of the run: the listing stops at the earliest
    checkpoint stored under that id, whichever namespace holds it, and lists only the
    namespace asked for."""
    put(store, "r", "a0")
    store.put_checkpoint("r", "x", ns="sub:1")  # the id "x" first in a subgraph's namespace
    store.put_checkpoint("r", "s1", ns="sub:1", parent_id="x")
    put(store, "r", "a1", "a0")
    put(store, "r", "x", "a1")  # and later in the root namespace
    put(store, "r", "a2", "x")
    store.put_checkpoint("r", "s2", ns="sub:2")
    put(store, "q", "a0")  # another run with the same ids
    put(store, "q", "x", "a0")
    assert [c.checkpoint_id for c in store.list_checkpoints("r", ns="", before="x")] == ["a0"]
    assert [c.checkpoint_id for c in store.list_checkpoints("r", before="x")] == ["a0"]
    assert [c.checkpoint_id for c in store.list_checkpoints("r", ns="", before="a2")] == [
        "x", "a1", "a0"]
    assert [c.checkpoint_id for c in store.list_checkpoints("r", ns="sub:1", before="s1")
            ] == ["x"]
    assert [c.checkpoint_id for c in store.list_checkpoints("r", before="s2", limit=2)] == [
        "a2", "x"]
    assert [c.checkpoint_id for c in store.list_checkpoints("q", before="x")] == ["a0"]
    assert list(store.list_checkpoints("r", before="absent")) == []
    assert list(store.list_checkpoints("nobody", before="x")) == []


def test_sqlite_a_listing_before_an_id_costs_what_it_lists_not_the_runs_history(
        tmp_path: Path) -> None:
    """Finding where ``before`` stops looks the id up in each namespace of the run by the
    checkpoints' unique key: the listing's cost does not grow with the run's history
    (LangGraph pages through a thread's history with ``before``). Counted in SQLite's
    virtual-machine steps on the reading connection."""
    with open_store(f"sqlite:///{tmp_path}/s.db?synchronous=NORMAL") as s:
        assert isinstance(s, sqlite_backend.SqliteStore)
        for run, length in (("short", 40), ("long", 4_000)):
            for n in range(length):
                s.put_checkpoint(run, f"c{n:05d}", parent_id=f"c{n - 1:05d}" if n else None)
                if n % 20 == 0:
                    s.put_checkpoint(run, f"s{n:05d}", ns=f"sub:{n % 3}")
        steps: dict[str, int] = {}
        for run, length in (("short", 40), ("long", 4_000)):
            counted = [0]

            def count(box: list[int] = counted) -> int:
                box[0] += 1
                return 0
            s._conn().set_progress_handler(count, 100)  # this thread's reading connection
            listed = list(s.list_checkpoints(run, ns="", before=f"c{length // 2:05d}", limit=5))
            s._conn().set_progress_handler(None, 0)
            assert [c.checkpoint_id for c in listed] == [
                f"c{n:05d}" for n in range(length // 2 - 1, length // 2 - 6, -1)]
            steps[run] = counted[0]
    assert steps["long"] <= 2 * steps["short"] + 10, steps


def test_writes_idempotent_and_overwrite(store: Store) -> None:
    put(store, "r", "c1")
    store.put_writes("r", "c1", "t1", [(0, "a", 1), (1, "b", "x")], task_path="p")
    store.put_writes("r", "c1", "t1", [(0, "a", 99)])  # kept: first write wins
    store.put_writes("r", "c1", "t0", [(-3, "__resume__", "v1")], overwrite=True)
    store.put_writes("r", "c1", "t0", [(-3, "__resume__", "v2")], overwrite=True)
    got = store.get_checkpoint("r", "c1")
    assert got is not None
    seen = [(w.task_id, w.idx, w.channel, w.value, w.task_path) for w in got.writes]
    assert seen == [("t0", -3, "__resume__", "v2", ""), ("t1", 0, "a", 1, "p"),
                    ("t1", 1, "b", "x", "p")]


def test_pending_writes_round_trip_with_any_text(store: Store) -> None:
    """Channel names, task ids and paths with quotes, backslashes, braces, commas, non-ASCII
    and control characters, and empty, binary and large values, come back as written (the
    PostgreSQL backend sends a step's writes as array literals of its own making)."""
    put(store, "r", "c1")
    names = ['"quoted"', "back\\slash", "{brace},comma", "NULL", "état 中", "tab\tnl\n", ""]
    values: list[Any] = [b"", b"\x00\xff\\\"", "x" * 70_000, None, {"a": [1, "b"]}, 2**70, "é"]
    store.put_writes("r", "c1", 'task "1" \\', list(zip(range(len(names)), names, values,
                                                       strict=True)), task_path="p {x}, \"y\"")
    got = store.get_checkpoint("r")
    assert got is not None
    assert [(w.idx, w.channel, w.value) for w in got.writes] == list(
        zip(range(len(names)), names, values, strict=True))
    assert {(w.task_id, w.task_path) for w in got.writes} == {('task "1" \\', 'p {x}, "y"')}


def test_delete_copy_prune_executions(store: Store) -> None:
    put(store, "r", "c0", new_values={"x": ("1", "a")}, execution_id="e0")
    put(store, "r", "c1", "c0", new_values={"x": ("2", "b")}, execution_id="e1")
    put(store, "r", "c2", "c1", new_values={"x": ("3", "c")}, execution_id="e1")
    store.put_writes("r", "c2", "t", [(0, "x", "w")])
    store.copy_run("r", "r2")
    copied = [c.checkpoint_id for c in store.list_checkpoints("r2")]
    assert copied == ["c2", "c1", "c0"]
    c2 = store.get_checkpoint("r2")
    assert c2 is not None and c2.values == {"x": "c"} and [w.value for w in c2.writes] == ["w"]

    store.prune_run("r2", keep_latest=1)
    assert [c.checkpoint_id for c in store.list_checkpoints("r2")] == ["c2"]
    assert store.usage("r2")["blobs"] == 1

    store.delete_executions(["e1"])
    assert [c.checkpoint_id for c in store.list_checkpoints("r")] == ["c0"]
    assert store.usage("r")["writes"] == 0

    assert store.get_checkpoint("r2") is None  # its one checkpoint came from execution e1

    put(store, "z", "z0")
    store.delete_run("r")
    assert store.get_checkpoint("r") is None
    assert store.usage("r") == {k: 0 for k in store.usage("r")}
    assert store.get_checkpoint("z") is not None


def test_list_runs(store: Store) -> None:
    put(store, "a", "a0")
    put(store, "b", "b0")
    put(store, "b", "b1", "b0", kind="end")
    runs = {r.run_id: r for r in store.list_runs()}
    assert runs["b"].checkpoints == 2 and runs["b"].latest_checkpoint_id == "b1"
    assert runs["b"].latest_kind == "end" and runs["a"].checkpoints == 1


# ------------------------------------------------------------------------- CV and bad input


def test_validation_failure_writes_nothing(store: Store) -> None:
    class State(BaseModel):
        count: int

    schema = StateSchema(State)
    put(store, "r", "c1", new_values={"count": ("1", 1)})
    bad = {"count": "not a number"}
    with pytest.raises(StateValidationError) as info:
        store.put_checkpoint("r", "c2", parent_id="c1", new_values={"count": ("2", bad["count"])},
                             validate=lambda: schema.check(bad, run_id="r", step="node_b"))
    err = info.value
    assert err.field == "count" and err.run_id == "r" and err.step == "node_b"
    assert "count" in str(err) and "node_b" in str(err)
    latest = store.get_checkpoint("r")
    assert latest is not None and latest.checkpoint_id == "c1" and latest.values == {"count": 1}
    with pytest.raises(StateValidationError):
        store.put_writes("r", "c1", "t", [(0, "count", "x")],
                         validate=lambda: schema.check({"count": "x"}, partial=True))
    assert store.get_checkpoint("r", "c1").writes == []  # type: ignore[union-attr]


def test_unserialisable_value_writes_nothing(store: Store) -> None:
    put(store, "r", "c1", new_values={"x": ("1", 1)})
    with pytest.raises(SerializationError) as info:
        store.put_checkpoint("r", "c2", new_values={"x": ("2", {"ok": 1, "bad": [object()]})})
    assert info.value.path == "$.bad[0]" and info.value.type_name == "object"
    assert "channel 'x' of checkpoint 'c2' of run 'r'" in str(info.value)  # the record
    with pytest.raises(SerializationError) as info:
        store.put_writes("r", "c1", "t", [(0, "a", 1), (1, "b", lambda: 1)])
    assert "channel 'b' in write of task 't' on checkpoint 'c1' of run 'r'" in str(info.value)
    latest = store.get_checkpoint("r")
    assert latest is not None and latest.checkpoint_id == "c1" and latest.writes == []


def test_corrupt_bytes_are_refused(store: Store) -> None:
    put(store, "r", "c1")
    store._write_writes([WriteRow("r", "", "c1", "t", 0, "x", b"\x01\xc1garbage")], False, {})
    with pytest.raises(CorruptRecord) as info:
        store.get_checkpoint("r")
    assert "'t'" in info.value.record and "c1" in info.value.record
    assert store.get_checkpoint("r", with_writes=False) is not None  # the rest stays readable
    put(store, "r", "c2", "c1")
    store._write_writes([WriteRow("r", "", "c2", "u", 0, "x", b"PK\x03")], False, {})
    with pytest.raises(CorruptRecord, match="not a remit envelope"):
        store.get_checkpoint("r")



def test_a_corrupt_payload_of_a_checkpoint_is_named(tmp_path: Path) -> None:
    """Each payload of a read checkpoint (its data, its metadata, each value, each write)
    that fails to decode is named in the error with its checkpoint and run, and the reader
    is refused the whole checkpoint; with the bytes restored, it reads as before."""
    url = f"sqlite:///{tmp_path}/s.db"
    with open_store(url) as s:
        put(s, "r", "c1", new_values={"x": ("v1", [1, 2]), "y": ("v7", {"a": 1})})
        s.put_writes("r", "c1", "t", [(0, "x", 3)])
        before = s.get_checkpoint("r")
    cases = {
        ("remit_checkpoints", "data", "checkpoint_id = 'c1'"):
            "checkpoint 'c1' of run 'r' (data)",
        ("remit_checkpoints", "metadata", "checkpoint_id = 'c1'"):
            "checkpoint 'c1' of run 'r' (metadata)",
        ("remit_blobs", "value", "channel = 'y'"):
            "channel 'y' at version 'v7' of checkpoint 'c1' of run 'r'",
        ("remit_writes", "value", "task_id = 't'"):
            "write 't'/0 ('x') on checkpoint 'c1' of run 'r'",
    }
    for (table, column, where), named in cases.items():
        conn = sqlite3.connect(f"{tmp_path}/s.db")
        kept = conn.execute(f"SELECT {column} FROM {table} WHERE {where}").fetchone()[0]
        with conn:
            conn.execute(f"UPDATE {table} SET {column} = ? WHERE {where}", (b"\x01\xc1bad",))
        with open_store(url) as s:
            with pytest.raises(CorruptRecord) as info:
                s.get_checkpoint("r")
            assert info.value.record == named, table
            assert named in str(info.value)
            with conn:
                conn.execute(f"UPDATE {table} SET {column} = ? WHERE {where}", (kept,))
            assert s.get_checkpoint("r") == before
        conn.close()


# ----------------------------------------------------------------------------------- receipts


def start(store: Store, key: str, owner: str, *, take: bool = False, lease: float | None = None):
    return store.start_receipt(key, run_id="r", step="s", name="n", ordinal=0, owner=owner,
                               may_take_over=take, lease=lease)


def test_receipt_decision_table(store: Store) -> None:
    a, b = new_owner(), new_owner()
    st = start(store, "k", a)
    assert st.outcome == "run" and st.receipt.fence == 1 and st.receipt.status == "started"
    assert start(store, "k", a).outcome == "run"  # a retried call of the same owner
    assert start(store, "k", b).outcome == "busy"
    store.complete_receipt("k", owner=a, fence=1, result={"txn": 7})
    done = start(store, "k", b)
    assert done.outcome == "done" and done.receipt.result == {"txn": 7}
    with pytest.raises(LeaseLost):
        store.complete_receipt("k", owner=b, fence=1, result=1)


def test_receipt_expired_owner(store: Store) -> None:
    a, b, c = new_owner(), new_owner(), new_owner()
    start(store, "k", a, lease=0.2)
    wait_until(lambda: start(store, "k", b).outcome == "in_doubt")
    assert start(store, "k", b).receipt.owner == a  # in_doubt writes nothing
    st = start(store, "k", c, take=True)
    assert st.outcome == "taken_over" and st.receipt.fence == 2 and st.receipt.attempt == 2
    with pytest.raises(LeaseLost):
        store.complete_receipt("k", owner=a, fence=1, result="late")  # fenced out
    store.complete_receipt("k", owner=c, fence=2, result="ok")
    assert store.get_receipt("k").result == "ok"  # type: ignore[union-attr]


def test_receipt_release_resolve_reset(store: Store) -> None:
    a = new_owner()
    start(store, "k", a)
    store.release_receipt("k", owner=a, fence=1)
    assert store.get_receipt("k") is None
    start(store, "k", a, lease=0.1)
    store.resolve_receipt("k", {"by": "hand"})
    assert start(store, "k", new_owner()).receipt.result == {"by": "hand"}
    store.reset_receipt("k")
    assert start(store, "k", new_owner()).outcome == "run"
    assert [r.key for r in store.list_receipts("r")] == ["k"]


# ------------------------------------------------------------------------------------- claims


def test_claim_decision_table(store: Store) -> None:
    a, b = new_owner(), new_owner()
    c = store.claim_once("gate", run_id="r", owner=a, digest="d1", value={"v": 1})
    assert c.status == "claimed" and c.fence == 1 and c.value == {"v": 1}
    assert store.claim_once("gate", run_id="r", owner=a).fence == 1  # re-entry
    with pytest.raises(ConsumeConflict) as held:
        store.claim_once("gate", run_id="r", owner=b, digest="d2")
    assert held.value.owner == a and held.value.consumed_at is None
    store.consume_claim("gate", owner=a, fence=1)
    store.consume_claim("gate", owner=a, fence=1)  # a retry is harmless
    with pytest.raises(ConsumeConflict) as done:
        store.claim_once("gate", run_id="r", owner=b)
    assert done.value.owner == a and done.value.consumed_at is not None
    assert done.value.status == "consumed"
    got = store.get_claim("gate")
    assert got is not None and got.digest == "d1" and got.status == "consumed"


def test_claim_release_and_take_over(store: Store) -> None:
    a, b, c, d = (new_owner() for _ in range(4))
    store.claim_once("g", run_id="r", owner=a, digest="d1")
    assert store.release_claim("g", owner=a, fence=1)
    again = store.claim_once("g", run_id="r", owner=b, digest="d2", value="v2", lease=0.2)
    assert again.fence == 2 and again.digest == "d2"
    wait_until(lambda: store.get_claim("g").lease_until < time.time() - 0.05)  # type: ignore[union-attr]
    with pytest.raises(ConsumeConflict, match="another value"):
        store.claim_once("g", run_id="r", owner=c, digest="d3")
    took = store.claim_once("g", run_id="r", owner=d)  # recovery: any value -> the recorded one
    assert took.taken_over and took.fence == 3 and took.value == "v2" and took.digest == "d2"
    with pytest.raises(LeaseLost):
        store.consume_claim("g", owner=b, fence=2)
    assert not store.renew_claim("g", owner=b, fence=2)
    assert store.renew_claim("g", owner=d, fence=3)
    store.consume_claim("g", owner=d, fence=3)
    assert [x.key for x in store.list_claims("r")] == ["g"]


# ------------------------------------------------------------------------------------ effects


def test_effect_runs_once_per_key_and_replays(store: Store) -> None:
    calls: list[tuple[int, str]] = []

    @effect
    def charge(amount: int, *, idempotency_key: str) -> dict[str, Any]:
        calls.append((amount, idempotency_key))
        return {"txn": f"t{len(calls)}", "amount": amount}

    with effect_scope(store, "run-1", "step-a"):
        first = charge(10)
        second = charge(20)
    with effect_scope(store, "run-1", "step-a"):  # the step re-runs (resume, crash, racer)
        assert charge(10) == first
        assert charge(20) == second
    assert [c[0] for c in calls] == [10, 20]
    assert calls[0][1] != calls[1][1] and "run-1" in calls[0][1]
    with effect_scope(store, "run-1", "step-b"):
        charge(10)
    assert len(calls) == 3


def test_an_effect_made_per_call_does_not_keep_what_it_closes_over(store: Store) -> None:
    """An effect wrapped at each call (a closure over the caller's objects, as an adapter
    or an application may make one) is not kept alive by remit once the call returned,
    nor is the object it closes over; its recorded result still replays with its type."""
    import gc
    import weakref

    class Order(BaseModel):
        txn: str

    class Job:
        def __init__(self, n: int) -> None:
            self.n = n

    def run(job: Job) -> Order:
        def charge() -> Order:
            return Order(txn=f"t{job.n}")
        with effect_scope(store, "run-closures", f"step-{job.n}"):
            return effect(name="charge")(charge)()

    refs = []
    for n in range(5):
        job = Job(n)
        assert run(job) == Order(txn=f"t{n}")
        refs.append(weakref.ref(job))
        del job
    gc.collect()
    assert [r() for r in refs] == [None] * 5
    assert run(Job(99)) == Order(txn="t99")
    replayed = run(Job(3))  # step-3 again: its receipt, decoded as the annotation says
    assert isinstance(replayed, Order) and replayed.txn == "t3"


def test_effect_async(store: Store) -> None:
    calls: list[int] = []

    @effect(name="notify")
    async def notify(x: int) -> int:
        calls.append(x)
        return x * 2

    async def step() -> list[int]:
        with effect_scope(store, "run-2", "s"):
            return [await notify(1), await notify(2)]

    assert asyncio.run(step()) == [2, 4]
    assert asyncio.run(step()) == [2, 4]
    assert calls == [1, 2]


def test_effect_exception_leaves_no_receipt(store: Store) -> None:
    attempts: list[int] = []

    @effect
    def flaky() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("boom")
        return "ok"

    with effect_scope(store, "r", "s"), pytest.raises(RuntimeError):
        flaky()
    with effect_scope(store, "r", "s"):
        assert flaky() == "ok"
    assert len(attempts) == 2


def test_effect_in_doubt_and_retry_policies(store: Store) -> None:
    @effect(name="pay")
    def pay() -> str:
        return "paid"

    @effect(name="pay", on_in_doubt="retry")
    def pay_retry() -> str:
        return "paid again"

    dead = new_owner()
    from remit_core.effects import receipt_key

    key = receipt_key("r", "s", "pay", 0)
    store.start_receipt(key, run_id="r", step="s", name="pay", ordinal=0, owner=dead,
                        may_take_over=False, lease=0.2)
    wait_until(lambda: store.get_receipt(key).lease_until < time.time())  # type: ignore[union-attr]
    with effect_scope(store, "r", "s"), pytest.raises(EffectInDoubt) as info:
        pay()
    assert info.value.key == key and info.value.owner == dead and info.value.step == "s"
    with effect_scope(store, "r", "s"):
        assert pay_retry() == "paid again"
    with effect_scope(store, "r", "s"):
        assert pay() == "paid again"  # now recorded


def test_effect_outside_scope_is_plain_call(caplog: pytest.LogCaptureFixture) -> None:
    @effect(name="plain-once")
    def f(x: int) -> int:
        return x + 1

    with caplog.at_level(logging.WARNING, logger="remit"):
        assert f(1) == 2 and f(2) == 3
    assert sum("outside a remit step" in r.message for r in caplog.records) == 1


def test_unserialisable_effect_result_is_an_error(store: Store) -> None:
    @effect
    def returns_object() -> object:
        return object()

    with effect_scope(store, "r", "s"), pytest.raises(SerializationError):
        returns_object()


# ------------------------------------------------------------------------------ configuration


def test_reopen_sees_data(store_url: str) -> None:
    with open_store(store_url) as s:
        s.put_checkpoint("r", "c1", new_values={"x": ("1", 1)})
    with open_store(store_url) as s:
        got = s.get_checkpoint("r")
        assert got is not None and got.values == {"x": 1}


def test_async_twins(store: Store) -> None:
    async def go() -> Any:
        await store.aput_checkpoint("r", "c1", new_values={"x": ("1", 5)})
        await store.aput_writes("r", "c1", "t", [(0, "y", 1)])
        got = await store.aget_checkpoint("r")
        listed = await store.alist_checkpoints("r")
        return got, listed

    got, listed = asyncio.run(go())
    assert got.values == {"x": 5} and got.writes[0].value == 1 and len(listed) == 1


def test_scope_resolver(store: Store) -> None:
    """An adapter's resolver supplies the scope when no effect_scope block is active."""
    from remit_core.effects import EffectScope, _resolvers, register_scope_resolver

    active: dict[str, EffectScope] = {}
    calls: list[int] = []

    def resolver() -> EffectScope | None:
        return active.get("scope")

    @effect(name="resolved")
    def f(x: int) -> int:
        calls.append(x)
        return x

    register_scope_resolver(resolver)
    register_scope_resolver(resolver)
    try:
        assert _resolvers.count(resolver) == 1
        active["scope"] = EffectScope(store, "run-r", "step-r")
        assert f(1) == 1
        active["scope"] = EffectScope(store, "run-r", "step-r")  # the step runs again
        assert f(2) == 1  # replayed from the receipt of ordinal 0
        assert calls == [1]
    finally:
        _resolvers.remove(resolver)


def test_unscoped_effect_with_key_parameter_gets_a_fresh_key() -> None:
    keys: list[str] = []

    @effect(name="unscoped-key")
    def f(*, idempotency_key: str) -> str:
        keys.append(idempotency_key)
        return "ok"

    assert f() == "ok" and f() == "ok"
    assert len(set(keys)) == 2 and all(k.startswith("unscoped-") for k in keys)
