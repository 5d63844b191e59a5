"""Shared pieces of the benchmark runner: timing, result rows and the backends.

Every comparison is measured in one process, in one run, on the same backend:
the two sides are timed in alternating order inside each repetition, and the
reported number is the median over the repetitions.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

PG_URL = os.environ.get("REMIT_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")

QUICK = False
"""Set by run.py: fewer repetitions and shorter histories while developing."""


def reps(full: int, quick: int) -> int:
    return quick if QUICK else full


# ==================================================================================== results


@dataclass
class Row:
    """One line of the table. ``ratio`` is remit/stock (or measured/reference)."""

    item: str
    what: str
    backend: str
    remit: str
    stock: str = ""
    ratio: float | None = None
    target: str = ""
    met: bool | None = None
    note: str = ""
    raw: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def us(seconds: float) -> str:
    """A duration for the table."""
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


def size(n: float) -> str:
    if n >= 1e6:
        return f"{n / 1e6:.2f} MB"
    if n >= 1e3:
        return f"{n / 1e3:.1f} kB"
    return f"{n:.0f} B"


# ================================================================================ null saver


def null_saver() -> Any:
    """A LangGraph checkpointer that stores nothing: its ``put`` and ``put_writes`` (and
    their async twins) return at once. A graph run on it costs what LangGraph's loop costs
    with a checkpointer (checkpoints made, copied and handed over, writes submitted) and
    nothing of any saver's own work: the part of a step no saver can remove."""
    from langgraph.checkpoint.memory import InMemorySaver

    class NullSaver(InMemorySaver):
        def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            conf = config["configurable"]
            return {"configurable": {"thread_id": conf["thread_id"],
                                     "checkpoint_ns": conf.get("checkpoint_ns", ""),
                                     "checkpoint_id": checkpoint["id"]}}

        def put_writes(self, *args: Any, **kwargs: Any) -> None:
            return None

        async def aput(self, config: Any, checkpoint: Any, metadata: Any,
                       new_versions: Any) -> Any:
            return self.put(config, checkpoint, metadata, new_versions)

        async def aput_writes(self, *args: Any, **kwargs: Any) -> None:
            return None

    return NullSaver()


def least_durable_saver(path: str) -> Any:
    """A LangGraph checkpointer that does the least a durable saver on SQLite must do per
    step, and nothing else: LangGraph's own serializer, one append-only table (no index),
    one fsynced commit (WAL, ``synchronous=FULL``) per checkpoint, which carries the
    task writes stored against its parent (group commit, as remit does); a step's writes
    are durable with the next checkpoint. It reads nothing back (each thread it runs is
    new), checks nothing and keeps no run. Not a saver anyone could use: a floor for
    item 1, what a step costs when the only work added to LangGraph's is serializing
    and one durable commit."""
    import sqlite3
    import threading

    from langgraph.checkpoint.base import BaseCheckpointSaver

    class LeastDurableSaver(BaseCheckpointSaver[int]):
        def __init__(self) -> None:
            super().__init__()
            self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=FULL")
            self.conn.execute("CREATE TABLE IF NOT EXISTS checkpoints (thread_id TEXT, "
                              "checkpoint_id TEXT, checkpoint BLOB, metadata BLOB, "
                              "writes BLOB)")
            self.lock = threading.Lock()
            self.pending: dict[Any, list[bytes]] = {}

        def get_tuple(self, config: Any) -> Any:
            return None

        def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            conf = config["configurable"]
            data = self.serde.dumps_typed(checkpoint)[1]
            meta = self.serde.dumps_typed(metadata)[1]
            with self.lock:
                writes = b"".join(self.pending.pop(conf.get("checkpoint_id"), []))
                self.conn.execute("BEGIN IMMEDIATE")
                self.conn.execute("INSERT INTO checkpoints VALUES (?, ?, ?, ?, ?)",
                                  (conf["thread_id"], checkpoint["id"], data, meta, writes))
                self.conn.execute("COMMIT")
            return {"configurable": {"thread_id": conf["thread_id"],
                                     "checkpoint_ns": conf.get("checkpoint_ns", ""),
                                     "checkpoint_id": checkpoint["id"]}}

        def put_writes(self, config: Any, writes: Any, task_id: str,
                       task_path: str = "") -> None:
            encoded = [self.serde.dumps_typed(value)[1] for _, value in writes]
            with self.lock:
                self.pending.setdefault(config["configurable"].get("checkpoint_id"),
                                        []).extend(encoded)

        def get_next_version(self, current: Any, channel: Any) -> int:
            return (int(str(current).split(".")[0]) if current else 0) + 1

    return LeastDurableSaver()


def reference_saver() -> Any:
    """LangGraph's in-memory checkpointer keeping every value by reference: no encoding, no
    decoding, no I/O. Not a saver anyone could use (a later step may change what it
    holds); a thread run on it costs what LangGraph's loop costs when it reads its state
    back at each invoke: the part of a chat turn no saver can remove."""
    from langgraph.checkpoint.memory import InMemorySaver

    class _ByReference:
        def dumps_typed(self, obj: Any) -> tuple[str, Any]:
            return ("reference", obj)

        def loads_typed(self, data: tuple[str, Any]) -> Any:
            return data[1]

    saver = InMemorySaver()
    saver.serde = _ByReference()  # type: ignore[assignment]
    return saver


# ===================================================================================== timing


def per_call(fn: Callable[[], Any], n: int) -> float:
    """Seconds per call of ``fn`` over ``n`` calls."""
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


def compare(sides: dict[str, Callable[[], float]], repetitions: int) -> dict[str, float]:
    """Run each side's measurement once per repetition, alternating the order, and
    return the median per side. A side returns its own seconds-per-unit."""
    names = list(sides)
    samples: dict[str, list[float]] = {k: [] for k in names}
    for r in range(repetitions):
        order = names if r % 2 == 0 else list(reversed(names))
        for name in order:
            samples[name].append(sides[name]())
    return {k: statistics.median(v) for k, v in samples.items()}


# =================================================================================== backends


@contextlib.contextmanager
def temp_dir(prefix: str = "remit-bench-") -> Iterator[str]:
    """A directory on the same disk as the working tree (/tmp here is not a tmpfs;
    REMIT_BENCH_DIR overrides)."""
    base = os.environ.get("REMIT_BENCH_DIR") or None
    path = tempfile.mkdtemp(prefix=prefix, dir=base)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def pg_available() -> bool:
    try:
        import psycopg

        with psycopg.connect(PG_URL, connect_timeout=3):
            return True
    except Exception:
        return False


@contextlib.contextmanager
def pg_schema(tag: str) -> Iterator[str]:
    """A fresh PostgreSQL schema, dropped afterwards."""
    import psycopg

    name = f"remit_bench_{tag}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def pg_url(*, schema: str | None = None, search_path: str | None = None,
           **params: str) -> str:
    """The server URL with remit's ``schema=`` or libpq's search_path/GUC options."""
    from urllib.parse import quote

    query: list[str] = []
    if schema is not None:
        query.append(f"schema={schema}")
    opts = []
    if search_path is not None:
        opts.append(f"-csearch_path={search_path}")
    opts += [f"-c{k}={v}" for k, v in params.items()]
    if opts:
        query.append("options=" + quote(" ".join(opts)))
    sep = "&" if "?" in PG_URL else "?"
    return PG_URL + (sep + "&".join(query) if query else "")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def private_redis() -> Iterator[str | None]:
    """A private redis-server with AOF and ``appendfsync always`` (a durable write per
    command, like SQLite FULL and PostgreSQL's synchronous_commit=on), as the tests use.
    The shared server on 6379 keeps nothing on disk, which remit refuses. Yields None
    when redis-server is not installed."""
    binary = shutil.which("redis-server")
    if binary is None:
        yield None
        return
    with temp_dir("remit-bench-redis-") as tmp:
        port = _free_port()
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", tmp,
             "--appendonly", "yes", "--appendfsync", "always", "--save", "",
             "--daemonize", "no", "--logfile", os.path.join(tmp, "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 10
            while True:
                with contextlib.suppress(OSError), socket.create_connection(
                        ("127.0.0.1", port), timeout=0.2):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("private redis-server did not start")
                time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait(timeout=10)
