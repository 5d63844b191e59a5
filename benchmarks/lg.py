"""Items 1, 2, 4 and 7: RemitSaver against LangGraph's SqliteSaver and PostgresSaver.

1. time per step of a 200-step linear graph with a small state;
2. ``get_tuple`` of the latest checkpoint at history lengths 10, 1 000, 100 000;
4. a 200-turn chat thread (``messages: Annotated[list, add_messages]``, a
   HumanMessage and an AIMessage per turn): bytes stored and time per turn;
7. bytes stored for a 1 MB value left unchanged over 100 steps.

(Item 3, concurrent ``ainvoke``, is in ``lg_async.py``.)

Matched settings. SQLite: both savers write a fresh file in the same directory,
in WAL mode with ``synchronous=FULL`` (SqliteSaver's connection keeps SQLite's
default, which is FULL in this build; RemitSaver's default is FULL), so each
commit is one fsync of the WAL on both. PostgreSQL: the same server and
database, each saver in a schema of its own, the server's
``synchronous_commit=on``. LangGraph runs with ``durability="sync"`` on both
(each checkpoint is stored before the next step starts); item 1 also reports
``durability="async"`` (LangGraph's default).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import sqlite3
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypedDict

from _bench import (
    PG_URL,
    Row,
    compare,
    least_durable_saver,
    null_saver,
    per_call,
    pg_available,
    pg_schema,
    pg_url,
    reference_saver,
    reps,
    size,
    temp_dir,
    us,
)
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from remit_core import open_store
from remit_langgraph import RemitSaver

# ================================================================================== savers


@contextlib.contextmanager
def sqlite_pair(directory: str, *, build: bool = False) -> Iterator[dict[str, Any]]:
    """RemitSaver and SqliteSaver on fresh files in ``directory`` (reopened on the same
    files when called again). ``build``: synchronous=NORMAL, to fill histories fast."""
    remit_path = os.path.join(directory, "remit.db")
    stock_path = os.path.join(directory, "stock.db")
    store = open_store(f"sqlite:///{remit_path}" + ("?synchronous=NORMAL" if build else ""))
    conn = sqlite3.connect(stock_path, check_same_thread=False)
    stock = SqliteSaver(conn)
    stock.setup()  # journal_mode=WAL; synchronous stays SQLite's default (FULL)
    if build:
        conn.execute("PRAGMA synchronous=NORMAL")
    try:
        yield {"remit": RemitSaver(store), "stock": stock,
               "paths": {"remit": remit_path, "stock": stock_path}, "store": store}
    finally:
        store.close()
        conn.close()


def sqlite_settings(pair: dict[str, Any]) -> str:
    """What the two connections actually run with (checked, not assumed)."""
    stock_conn: sqlite3.Connection = pair["stock"].conn
    remit_conn = pair["store"]._conn()
    def show(c: sqlite3.Connection) -> str:
        mode = c.execute("PRAGMA journal_mode").fetchone()[0]
        sync = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[c.execute(
            "PRAGMA synchronous").fetchone()[0]]
        return f"{mode}/{sync}"
    return f"remit {show(remit_conn)}, stock {show(stock_conn)}"


@contextlib.contextmanager
def postgres_pair(*, build: bool = False, schemas: tuple[str, str] | None = None
                  ) -> Iterator[dict[str, Any]]:
    """RemitSaver and PostgresSaver on the same server, each in a schema of its own.
    ``build``: synchronous_commit=off for the session, to fill histories fast."""
    with contextlib.ExitStack() as stack:
        if schemas is None:
            schemas = (stack.enter_context(pg_schema("remit")),
                       stack.enter_context(pg_schema("stock")))
        extra = {"synchronous_commit": "off"} if build else {}
        store = open_store(pg_url(schema=schemas[0], **extra))
        stack.callback(store.close)
        stock = stack.enter_context(PostgresSaver.from_conn_string(
            pg_url(search_path=schemas[1], **extra)))
        stock.setup()
        yield {"remit": RemitSaver(store), "stock": stock, "schemas": schemas, "store": store}


# ================================================================================== item 1


class Small(TypedDict):
    count: int
    label: str


def linear_graph(state: type, steps: int, field: str = "count", *,
                 asynchronous: bool = False) -> Any:
    """``steps`` nodes in a line, each adding 1 to ``field`` (``async def`` nodes if
    ``asynchronous``)."""
    builder: Any = StateGraph(state)
    names = [f"n{i}" for i in range(steps)]
    for name in names:
        def node(s: Any, _f: str = field) -> dict[str, Any]:
            return {_f: s[_f] + 1}

        async def anode(s: Any, _f: str = field) -> dict[str, Any]:
            return {_f: s[_f] + 1}
        builder.add_node(name, anode if asynchronous else node)
    builder.add_edge(START, names[0])
    for a, b in itertools.pairwise(names):
        builder.add_edge(a, b)
    builder.add_edge(names[-1], END)
    return builder


def _run_graph(graph: Any, steps: int, durability: str) -> Callable[[], float]:
    def once() -> float:
        config = {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": steps + 50}
        t0 = time.perf_counter()
        out = graph.invoke({"count": 0, "label": "bench"}, config, durability=durability)
        elapsed = time.perf_counter() - t0
        assert out["count"] == steps, out
        return elapsed / steps
    return once


TARGET_1 = {"sqlite": ("≤ 0.8x SqliteSaver", 0.8), "postgres": ("≤ 0.9x PostgresSaver", 0.9)}
"""Issue 16, row 1: the target per backend (ratio remit/stock)."""


def item1(backends: list[str]) -> list[Row]:
    steps = 200
    n = reps(7, 3)
    builder = linear_graph(Small, steps)
    bare = builder.compile()
    rows: list[Row] = []

    def bare_step() -> float:
        t0 = time.perf_counter()
        bare.invoke({"count": 0, "label": "bench"}, {"recursion_limit": steps + 50})
        return (time.perf_counter() - t0) / steps

    alone = compare({"bare": bare_step}, n)["bare"]
    nothing = builder.compile(checkpointer=null_saver())
    for backend in backends:
        with contextlib.ExitStack() as stack:
            if backend == "sqlite":
                pair = stack.enter_context(sqlite_pair(stack.enter_context(temp_dir())))
                stock_name, settings = "SqliteSaver", sqlite_settings(pair)
            else:
                pair = stack.enter_context(postgres_pair())
                stock_name, settings = "PostgresSaver", "synchronous_commit=on, same server"
            graphs = {k: builder.compile(checkpointer=pair[k]) for k in ("remit", "stock")}
            if backend == "sqlite":  # the floor of a durable saver, on the same disk
                least = least_durable_saver(
                    os.path.join(stack.enter_context(temp_dir()), "least.db"))
                stack.callback(least.conn.close)
                graphs["least"] = builder.compile(checkpointer=least)
            target, limit = TARGET_1[backend]
            for durability in ("sync", "async"):
                for g in graphs.values():  # warm-up: tables, caches, connections
                    _run_graph(g, steps, durability)()
                sides = {k: _run_graph(g, steps, durability) for k, g in graphs.items()}
                got = compare({**sides, "null": _run_graph(nothing, steps, durability)}, n)
                ratio = got["remit"] / got["stock"]
                null = got["null"]
                floor = "" if "least" not in got else (
                    f"; a saver doing only what durability needs (LangGraph's serializer, "
                    f"one fsynced commit a checkpoint carrying its step's writes, one table "
                    f"and no index: _bench.least_durable_saver) {us(got['least'])}/step, "
                    f"{got['least'] / got['stock']:.2f}x {stock_name}, adding "
                    f"{us(got['least'] - null)}")
                rows.append(Row(
                    "1", f"time per step, 200-step graph, durability={durability}", backend,
                    us(got["remit"]), f"{us(got['stock'])} ({stock_name})", ratio,
                    target, ratio <= limit,
                    f"{settings}; graph alone {us(alone)}/step; with a checkpointer that "
                    f"stores nothing (LangGraph's own share of a checkpointed step) "
                    f"{us(null)}/step, so the saver adds {us(got['remit'] - null)} (remit) vs "
                    f"{us(got['stock'] - null)} ({stock_name}), "
                    f"{(got['remit'] - null) / (got['stock'] - null):.2f}x; the target would "
                    f"leave remit {us(limit * got['stock'] - null)} a step{floor}; median "
                    f"of {n}",
                    raw={"remit_s": got["remit"], "stock_s": got["stock"], "bare_s": alone,
                         "null_s": null, "least_s": got.get("least")}))
    return rows


# ================================================================================== item 2


def _ids(count: int) -> list[str]:
    """Strictly increasing uuid6 ids (the stock savers order by id, remit by seq)."""
    base = (int(time.time() * 10_000_000) + 0x01B21DD213814000) - count
    out = []
    for i in range(count):
        t = base + i
        value = ((t >> 12) & 0xFFFFFFFFFFFF) << 80
        value |= (0x6000 | (t & 0x0FFF)) << 64
        value |= (0x8000 | (i & 0x3FFF)) << 48
        value |= uuid.uuid4().int & 0xFFFFFFFFFFFF
        out.append(str(uuid.UUID(int=value)))
    return out


def build_history(saver: BaseCheckpointSaver[Any], thread_id: str, length: int) -> None:
    """``length`` checkpoints of a two-channel state, one channel changing per checkpoint
    (as a linear graph writes them), and one pending write on the latest."""
    parent: str | None = None
    label_version = saver.get_next_version(None, None)
    version = label_version
    for i, cid in enumerate(_ids(length)):
        version = saver.get_next_version(version, None)
        ck = empty_checkpoint()
        ck["id"] = cid
        ck["channel_values"] = {"count": i, "label": "bench"}
        ck["channel_versions"] = {"count": version, "label": label_version}
        ck["updated_channels"] = ["count"]
        new_versions = {"count": version} if i else {"count": version, "label": label_version}
        config: RunnableConfig = {"configurable": {
            "thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": parent}}
        saver.put(config, ck, {"source": "loop", "step": i, "parents": {}}, new_versions)
        parent = cid
    saver.put_writes({"configurable": {"thread_id": thread_id, "checkpoint_ns": "",
                                       "checkpoint_id": parent}},
                     [("count", length)], task_id=str(uuid.uuid4()))


def item2(backends: list[str]) -> list[Row]:
    lengths = (10, 1_000, 100_000) if not _quick() else (10, 1_000, 10_000)
    calls = reps(400, 150)
    n = reps(7, 3)
    rows: list[Row] = []
    for backend in backends:
        with contextlib.ExitStack() as stack:
            if backend == "sqlite":
                directory = stack.enter_context(temp_dir())
                with sqlite_pair(directory, build=True) as builder:
                    build_t = _build_all(builder, lengths)
                pair = stack.enter_context(sqlite_pair(directory))
            else:
                schemas = (stack.enter_context(pg_schema("remit")),
                           stack.enter_context(pg_schema("stock")))
                with postgres_pair(build=True, schemas=schemas) as builder:
                    build_t = _build_all(builder, lengths)
                _pg_analyze(schemas)
                pair = stack.enter_context(postgres_pair(schemas=schemas))
            got: dict[int, dict[str, float]] = {}
            for length in lengths:
                config = {"configurable": {"thread_id": f"h{length}", "checkpoint_ns": ""}}
                for k in ("remit", "stock"):
                    found = pair[k].get_tuple(config)
                    assert found is not None and found.checkpoint["channel_values"]["count"] \
                        == length - 1 and found.pending_writes, (k, length)
                got[length] = _time_reads(pair, config, calls, n)
            first, last = lengths[0], lengths[-1]
            for length in lengths:
                ratio = got[length]["remit"] / got[length]["stock"]
                rows.append(Row(
                    "2", f"get_tuple (latest), history {length:,}", backend,
                    us(got[length]["remit"]), us(got[length]["stock"]), ratio,
                    "≤ 1.0x stock", ratio <= 1.0,
                    "" if length != first else
                    f"histories built with put() in {build_t:.0f} s (sync off while building)",
                    raw={"remit_s": got[length]["remit"], "stock_s": got[length]["stock"]}))
            flat = got[last]["remit"] / got[first]["remit"]
            stock_flat = got[last]["stock"] / got[first]["stock"]
            rows.append(Row(
                "2", f"get_tuple flatness: time at {last:,} / time at {first}", backend,
                f"{flat:.2f}x", f"{stock_flat:.2f}x", None, "≤ 1.5x", flat <= 1.5,
                f"median of {n} x {calls} calls"))
            rows.append(_graph_read(pair, backend, calls, n))
    return rows


GRAPH_NODES = 10


def _graph_read(pair: dict[str, Any], backend: str, calls: int, n: int) -> Row:
    """``get_tuple`` of the checkpoint a graph leaves: a linear graph of GRAPH_NODES
    nodes, invoked once on each side. Its checkpoint holds a version of every channel
    LangGraph made (the input, the two state keys and each node's trigger), most of them
    with no value after the run, where the histories above hold two."""
    config = {"configurable": {"thread_id": "graph", "checkpoint_ns": ""}}
    shapes = set()
    for k in ("remit", "stock"):
        linear_graph(Small, GRAPH_NODES).compile(checkpointer=pair[k]).invoke(
            {"count": 0, "label": "bench"}, config)
        found = pair[k].get_tuple(config)
        assert found is not None and found.checkpoint["channel_values"] == {
            "count": GRAPH_NODES, "label": "bench"}, (k, found)
        shapes.add((len(found.checkpoint["channel_versions"]),
                    len(found.checkpoint["channel_values"])))
    (versions, valued), = shapes  # (the same checkpoint on both sides)
    got = _time_reads(pair, config, calls, n)
    return Row(
        "2", f"get_tuple (latest) of a {GRAPH_NODES}-node graph's checkpoint", backend,
        us(got["remit"]), us(got["stock"]), got["remit"] / got["stock"], "(no target)", None,
        f"a linear graph invoked once: {versions} channel versions, {valued} of them with a "
        f"value; median of {n} x {calls} calls",
        raw={"remit_s": got["remit"], "stock_s": got["stock"]})


def _time_reads(pair: dict[str, Any], config: Any, calls: int, n: int) -> dict[str, float]:
    """Seconds a ``get_tuple(config)`` on each side, after a warm-up (see :func:`compare`)."""
    sides: dict[str, Callable[[], float]] = {}
    for k in ("remit", "stock"):
        read = functools.partial(pair[k].get_tuple, config)
        per_call(read, 20)  # warm-up
        sides[k] = functools.partial(per_call, read, calls)
    return compare(sides, n)


def _build_all(pair: dict[str, Any], lengths: tuple[int, ...]) -> float:
    t0 = time.perf_counter()
    for length in lengths:
        for k in ("remit", "stock"):
            build_history(pair[k], f"h{length}", length)
    return time.perf_counter() - t0


def _pg_analyze(schemas: tuple[str, str]) -> None:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        for schema in schemas:
            for (table,) in conn.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)).fetchall():
                conn.execute(f'VACUUM ANALYZE "{schema}"."{table}"')


def _quick() -> bool:
    import _bench

    return _bench.QUICK


# ================================================================================== item 4

TURNS = 200

_ASKS = (
    "Can you summarise the main points of the quarterly report for me?",
    "What would be a good name for a small coffee shop near the station?",
    "How do I convert a list of dictionaries into a CSV file in Python?",
    "My flight was delayed by three hours. Am I entitled to compensation?",
    "Please draft a polite reply declining the meeting on Thursday.",
    "What is the difference between a Roth IRA and a traditional IRA?",
    "Suggest a vegetarian dinner I can cook in under thirty minutes.",
    "Why does my sourdough come out dense in the middle?",
    "Explain what a race condition is, with a short example.",
    "Which of the three laptops we talked about has the best battery life?",
)
_ANSWERS = (
    "Sure. Revenue grew by about eight percent, mostly from the new subscription tier, "
    "while costs stayed flat; the main risk flagged is the supplier contract renewal.",
    "A few ideas: Platform Nine, The Daily Grind, Steam & Bean, or Last Call Coffee. "
    "Short names that hint at the station tend to stick.",
    "Use csv.DictWriter: open the file with newline='', pass fieldnames=rows[0].keys(), "
    "call writeheader() and then writerows(rows).",
    "Under EU rules a delay of three hours or more on arrival usually entitles you to "
    "compensation, unless the airline shows extraordinary circumstances.",
    "Here is a draft: Thank you for the invitation. Unfortunately I am not available on "
    "Thursday; could we find another time next week?",
    "Contributions to a traditional IRA may be tax-deductible now and are taxed when you "
    "withdraw; Roth contributions are taxed now and qualified withdrawals are tax-free.",
    "Try a chickpea and spinach curry: onion, garlic, ginger, a tin of tomatoes, a tin of "
    "chickpeas, spinach at the end, served with rice or flatbread.",
    "A dense crumb usually means under-proofing or a starter past its peak; try a longer "
    "bulk ferment and check that the dough has grown by about half.",
    "Two threads read a counter, both add one and both write it back: one increment is "
    "lost. A lock around the read and the write prevents it.",
    "Of the three, the second one lasted longest in the reviews, about fourteen hours of "
    "light use, though it is also the heaviest.",
)


def _ask(turn: int) -> str:
    return f"{_ASKS[turn % len(_ASKS)]} (turn {turn})"


def _answer(turn: int) -> str:
    a, b = _ANSWERS[turn % len(_ANSWERS)], _ANSWERS[(turn * 7 + 3) % len(_ANSWERS)]
    return f"{a} {b if turn % 3 == 0 else ''}".strip()


class Chat(TypedDict):
    messages: Annotated[list, add_messages]  # type: ignore[type-arg]


def chat_graph() -> StateGraph[Any, Any, Any, Any]:
    """One node: the assistant answers the last human message (a turn is one invoke
    that appends a HumanMessage, as the input, and an AIMessage, from the node)."""
    def reply(state: Chat) -> dict[str, Any]:
        turn = (len(state["messages"]) - 1) // 2
        return {"messages": [AIMessage(_answer(turn))]}

    builder: StateGraph[Any, Any, Any, Any] = StateGraph(Chat)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    builder.add_edge("reply", END)
    return builder


def _chat_thread(graph: Any, thread_id: str, turns: int) -> float:
    """``turns`` invokes on one thread; seconds per turn."""
    config = {"configurable": {"thread_id": thread_id}}
    t0 = time.perf_counter()
    for turn in range(turns):
        out = graph.invoke({"messages": [HumanMessage(_ask(turn))]}, config,
                           durability="sync")
    elapsed = time.perf_counter() - t0
    assert len(out["messages"]) == 2 * turns, len(out["messages"])
    return elapsed / turns


def item4(backends: list[str]) -> list[Row]:
    """Each repetition on a fresh pair (files or schemas): one 200-turn thread per side,
    the sides in alternating order; the bytes are those of the first repetition."""
    n = reps(5, 2)
    builder = chat_graph()
    rows: list[Row] = []
    # the floors: LangGraph with values kept by reference (no saver's work at all), and
    # InMemorySaver (the stock serializer's encoding and decoding, no I/O)
    floors: dict[str, list[float]] = {"reference": [], "memory": []}
    for _ in range(n):
        for k, make in (("reference", reference_saver), ("memory", InMemorySaver)):
            floors[k].append(_chat_thread(builder.compile(checkpointer=make()), "chat", TURNS))
    floor = {k: statistics.median(v) for k, v in floors.items()}
    for backend in backends:
        stock_name = "SqliteSaver" if backend == "sqlite" else "PostgresSaver"
        target, limit = {"sqlite": ("≤ 0.1x SqliteSaver", 0.1),
                         "postgres": ("≤ 0.2x PostgresSaver", 0.2)}[backend]
        times: dict[str, list[float]] = {"remit": [], "stock": []}
        stored: dict[str, Any] = {}
        for r in range(n):
            with contextlib.ExitStack() as stack:
                if backend == "sqlite":
                    pair = stack.enter_context(sqlite_pair(stack.enter_context(temp_dir())))
                else:
                    pair = stack.enter_context(postgres_pair())
                order = ("remit", "stock") if r % 2 == 0 else ("stock", "remit")
                for k in order:
                    graph = builder.compile(checkpointer=pair[k])
                    times[k].append(_chat_thread(graph, "chat", TURNS))
                if r == 0:
                    stored["usage"] = pair["store"].usage("chat")
                    if backend == "sqlite":
                        stored["rows"] = {k: _sqlite_rows(p, k)
                                          for k, p in pair["paths"].items()}
                        stored["files"] = {k: _sqlite_file_size(p)
                                           for k, p in pair["paths"].items()}
                    else:
                        stored.update(_pg_sizes(pair["schemas"]))
        t = {k: statistics.median(v) for k, v in times.items()}
        usage = stored["usage"]
        values = usage["blob_bytes"] + usage["chunk_bytes"]
        totals = stored["files"] if backend == "sqlite" else stored["tables"]
        where = "files" if backend == "sqlite" else "tables"
        ratio = stored["rows"]["remit"] / stored["rows"]["stock"]
        rows.append(Row(
            "4", f"bytes stored, {TURNS}-turn chat thread (add_messages)", backend,
            f"{size(stored['rows']['remit'])} in all rows",
            f"{size(stored['rows']['stock'])} in all rows ({stock_name})", ratio,
            target, ratio <= limit,
            f"{2 * TURNS} messages, durability=sync; remit values {size(values)} (usage "
            f"blob_bytes + chunk_bytes, {usage['chunks']} chunks); {where}: "
            f"{size(totals['remit'])} vs {size(totals['stock'])}; {usage['checkpoints']} "
            f"checkpoints, {usage['blobs']} values, {usage['writes']} pending writes",
            raw={"stored": stored}))
        ratio = t["remit"] / t["stock"]
        rows.append(Row(
            "4", f"time per turn, {TURNS}-turn chat thread", backend, us(t["remit"]),
            f"{us(t['stock'])} ({stock_name})", ratio, "≤ 0.8x stock", ratio <= 0.8,
            f"one invoke per turn, durability=sync; median of {n} threads, each on fresh "
            f"{'files' if backend == 'sqlite' else 'schemas'}; the same thread with values "
            f"kept by reference (LangGraph's own share of a turn) {us(floor['reference'])}, "
            f"on InMemorySaver (the stock serializer, no I/O) {us(floor['memory'])}: the "
            f"target would leave remit {us(0.8 * t['stock'] - floor['reference'])} a turn "
            "for encoding, decoding and storing",
            raw={"times": times, "floors": floors}))
    return rows


# ================================================================================== item 7


class Big(TypedDict):
    blob: bytes
    n: int


def _stored(pair: dict[str, Any], backend: str, steps: int, value: bytes) -> dict[str, Any]:
    """Run a ``steps``-node graph over the 1 MB value on both savers; what each stored."""
    builder = linear_graph(Big, steps, field="n")
    for k in ("remit", "stock"):
        graph = builder.compile(checkpointer=pair[k])
        out = graph.invoke({"blob": value, "n": 0},
                           {"configurable": {"thread_id": "big"}, "recursion_limit": steps + 50},
                           durability="sync")
        assert out["n"] == steps and out["blob"] == value
    got: dict[str, Any] = {"usage": pair["store"].usage("big")}
    if backend == "sqlite":
        got["rows"] = {k: _sqlite_rows(path, k) for k, path in pair["paths"].items()}
        got["files"] = {k: _sqlite_file_size(path) for k, path in pair["paths"].items()}
    else:
        got.update(_pg_sizes(pair["schemas"]))
    return got


def item7(backends: list[str]) -> list[Row]:
    value = os.urandom(1_000_000)  # incompressible: what is stored is what is counted
    rows: list[Row] = []
    for backend in backends:
        runs: dict[int, dict[str, Any]] = {}
        for steps in (1, 100):
            with contextlib.ExitStack() as stack:
                if backend == "sqlite":
                    pair = stack.enter_context(sqlite_pair(stack.enter_context(temp_dir())))
                else:
                    pair = stack.enter_context(postgres_pair())
                runs[steps] = _stored(pair, backend, steps, value)
        last, first = runs[100], runs[1]
        # channel values as their rows hold them (large ones as manifests) and the chunks
        blob_bytes = last["usage"]["blob_bytes"] + last["usage"]["chunk_bytes"]
        growth = {k: (last["rows"][k] - first["rows"][k]) / 99 for k in ("remit", "stock")}
        where = "file" if backend == "sqlite" else "tables"
        totals = last["files"] if backend == "sqlite" else last["tables"]
        stock_name = "SqliteSaver" if backend == "sqlite" else "PostgresSaver"
        rows.append(Row(
            "7", "bytes stored, 1 MB value unchanged over 100 steps", backend,
            f"{size(blob_bytes)} values (usage blob_bytes + chunk_bytes); "
            f"{size(last['rows']['remit'])} "
            "in all rows",
            f"{size(last['rows']['stock'])} in all rows ({stock_name})",
            last["rows"]["remit"] / last["rows"]["stock"], "≤ 1.2 MB", blob_bytes <= 1.2e6,
            f"each step after the first adds {size(growth['remit'])} (remit) vs "
            f"{size(growth['stock'])} ({stock_name}); {where}: {size(totals['remit'])} vs "
            f"{size(totals['stock'])}; {last['usage']['checkpoints']} checkpoints, "
            f"{last['usage']['blobs']} values, {last['usage']['writes']} pending writes. "
            "LangGraph hands a saver the 1 MB value three times: as the graph input (channel "
            "__start__), as the channel's value, and as the input task's pending write; "
            f"remit stores their {last['usage']['chunks']} chunks once",
            raw={"runs": runs}))
    return rows


def _sqlite_file_size(path: str) -> int:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))


def _sqlite_rows(path: str, side: str) -> int:
    """Bytes in the stored columns of every row (both savers keep one thread here)."""
    queries = {
        "stock": ("SELECT SUM(LENGTH(checkpoint) + LENGTH(metadata)) FROM checkpoints",
                  "SELECT SUM(LENGTH(value)) FROM writes"),
        "remit": ("SELECT SUM(LENGTH(data) + LENGTH(metadata) + LENGTH(versions)) "
                  "FROM remit_checkpoints",
                  "SELECT SUM(LENGTH(value)) FROM remit_blobs",
                  "SELECT SUM(LENGTH(value)) FROM remit_writes",
                  "SELECT SUM(LENGTH(value)) FROM remit_chunks"),
    }[side]
    conn = sqlite3.connect(path)
    try:
        return sum(int(conn.execute(q).fetchone()[0] or 0) for q in queries)
    finally:
        conn.close()


def _pg_sizes(schemas: tuple[str, str]) -> dict[str, dict[str, int]]:
    """Per side: the tables' total size (pg_total_relation_size: heap, TOAST, indexes) and
    the bytes of their stored bytea/jsonb columns (pg_column_size, as stored)."""
    import psycopg

    tables: dict[str, int] = {}
    rows: dict[str, int] = {}
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        for side, schema in zip(("remit", "stock"), schemas, strict=True):
            total = 0
            stored = 0
            for (t,) in conn.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)).fetchall():
                if t in ("remit_meta", "checkpoint_migrations"):
                    continue
                q = f'"{schema}"."{t}"'
                total += _one(conn.execute(
                    "SELECT pg_total_relation_size(%s::regclass)", (q,)).fetchone())
                cols = [c for (c, typ) in conn.execute(
                    "SELECT column_name, data_type FROM information_schema.columns "
                    "WHERE table_schema = %s AND table_name = %s", (schema, t))
                    if typ in ("bytea", "jsonb")]
                if cols:
                    expr = " + ".join(f"COALESCE(pg_column_size({c}), 0)" for c in cols)
                    stored += _one(conn.execute(f"SELECT COALESCE(SUM({expr}), 0) FROM {q}")
                                   .fetchone())
            tables[side] = total
            rows[side] = stored
    return {"tables": tables, "rows": rows}


def _one(row: tuple[Any, ...] | None) -> int:
    assert row is not None
    return int(row[0])


def _stock_backends(fn: Callable[[list[str]], list[Row]]) -> Callable[[list[str]], list[Row]]:
    """LangGraph has stock savers for SQLite and PostgreSQL only."""
    def run(backends: list[str]) -> list[Row]:
        chosen = [b for b in backends if b == "sqlite" or (b == "postgres" and pg_available())]
        return fn(chosen)
    return run


ITEMS = {"1": _stock_backends(item1), "2": _stock_backends(item2),
         "4": _stock_backends(item4), "7": _stock_backends(item7)}
