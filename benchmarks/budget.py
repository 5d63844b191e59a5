"""What issue 16's SQLite targets leave remit, and what remit spends (items 1 and 2).

    uv run python benchmarks/budget.py               # 12 rounds
    uv run python benchmarks/budget.py --rounds 6
    uv run python benchmarks/budget.py --only 2      # item 2 alone
    uv run python benchmarks/budget.py --instructions   # item 1 in instructions (valgrind)

Not a row of ``run.py``: a profile of the two SQLite rows that ``run.py`` reports missed,
measured the same way (fresh files in one directory, WAL, ``synchronous=FULL``, the
sides in alternating order, medians), so that the gap can be read as a budget.

**Item 1** (a 200-step linear graph, ``durability="sync"``, a fresh thread per invoke).
Four sides, each timed in wall and in process CPU per step: LangGraph on a checkpointer
that stores nothing (``_bench.null_saver``: LangGraph's own share of a step), the least
a durable saver does (``_bench.least_durable_saver``: LangGraph's serializer and one
fsynced commit a checkpoint into a table without an index), SqliteSaver and RemitSaver.
The target (remit <= 0.8x SqliteSaver) leaves a saver ``0.8 x SqliteSaver - null`` a step.
Then, in invokes of their own (not the timed ones: the counting adds about a microsecond
a call), remit's step by piece, in CPU time of the thread that runs it:

* the step's one transaction (``SqliteStore._write_checkpoint``: the checkpoint, its new
  values, the grouped writes, the run's row and the commit, fsync included);
* the typed envelope (``Serde.encode``: the checkpoint's data and metadata, each new
  value, each pending write);
* RD, the derived checkpoint id (``remit_langgraph._contract.derive_step_id``);
* the hand-over of a step's last writes into the checkpoint's transaction
  (``Groups.put`` and ``Groups.take``, remit_core.store.groups);
* the rest: everything else remit adds over the stored-nothing checkpointer (the saver's
  and the store's bookkeeping, the seam, the consume gate): RemitSaver's CPU a step in
  the timed invokes, less the pieces and less the stored-nothing checkpointer's.

The least durable saver's own ``put`` and ``put_writes`` are counted the same way, for
a comparison with remit's transaction alone.

**Item 1 in instructions** (``--instructions``, about three minutes: not part of the
default run). The four sides again, each in a process of its own under valgrind's
callgrind, which counts the instructions the process executes in user space (every
thread; the kernel's work, the write and fsync of a commit among it, is not counted):
repeatable to a few tenths of a percent from run to run and whatever else the machine
does, where the times above vary by several percent. Each side runs two invokes
uncounted (tables, caches), then ``--invokes`` counted ones (callgrind's instrumentation
switched on and off around them with ``callgrind_control``). Printed: instructions a
step, those over LangGraph on the stored-nothing checkpointer (what the saver adds), and
how they split among the libraries that execute them (the Python interpreter running
Python code, SQLite, msgpack and ormsgpack, the C library, the rest).

**Item 2** (``get_tuple`` of the latest checkpoint, history 10, built as ``run.py`` builds
it). RemitSaver, SqliteSaver, and the same read of remit's tables with no layer between
them and the caller: one read transaction, the checkpoint's row, its values by the
versions it names, its pending writes, the store's envelope decoding each record, and
LangGraph's ``CheckpointTuple`` built from them. That read is what remit's layout costs;
the difference to RemitSaver is what its layers cost (the store's admission and retry
wrapper, the record objects, the saver's translation and checks).

Then each saver's call in three parts, timed the same way: its statements (as it issues
them, on its own connection, the rows fetched and nothing decoded: SqliteSaver's two
statements, each its own read; remit's three in one read transaction), its decoding of
the fetched bytes (SqliteSaver's serializer and ``json.loads`` of the metadata; remit's
envelope on the checkpoint's data and metadata, each value and each write), and the rest
(the call less those two: what each saver does around them).
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import timeit
import uuid
from collections.abc import Callable
from typing import Any

from _bench import least_durable_saver, null_saver, temp_dir, us
from langgraph.checkpoint.base import CheckpointTuple
from lg import Small, build_history, linear_graph, sqlite_pair

import remit_core.store.chunks as chunks_module
import remit_core.store.groups as groups_module
import remit_core.store.sqlite as sqlite_module
from remit_core.records import versions_from_json
from remit_core.serde import Serde
from remit_core.store.sqlite import SqliteStore
from remit_langgraph import _contract, _seam
from remit_langgraph import saver as saver_module
from remit_langgraph._serde import EMPTY

STEPS = 200

#: remit's pieces of a step: label -> the (owner, attribute) pairs whose CPU it sums
PIECES: dict[str, tuple[tuple[Any, str], ...]] = {
    "the step's transaction (statements and commit)": ((SqliteStore, "_write_checkpoint"),),
    "the typed envelope (every encode)": ((Serde, "encode"),),
    "RD: the derived checkpoint id": ((_contract, "derive_step_id"),),
    "the hand-over of the step's writes": ((groups_module.Groups, "put"),
                                           (groups_module.Groups, "take")),
}


def _invoke(graph: Any) -> None:
    config = {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": STEPS + 50}
    out = graph.invoke({"count": 0, "label": "bench"}, config, durability="sync")
    assert out["count"] == STEPS, out


def _timed(graph: Any) -> tuple[float, float]:
    """One invoke: (wall, process CPU) seconds per step."""
    t0, c0 = time.perf_counter(), time.process_time()
    _invoke(graph)
    return (time.perf_counter() - t0) / STEPS, (time.process_time() - c0) / STEPS


class _Counted:
    """Thread CPU spent inside the wrapped functions, by label (a label's calls nested in
    one another, on one thread, count once)."""

    def __init__(self, targets: dict[str, tuple[tuple[Any, str], ...]]) -> None:
        self.targets = targets
        self.ns: collections.Counter[str] = collections.Counter()
        self._originals: list[tuple[Any, str, Any, bool]] = []

    def __enter__(self) -> _Counted:
        for label, pairs in self.targets.items():
            for owner, name in pairs:
                own = isinstance(owner, type) or name in vars(owner)
                original = vars(owner)[name] if own else getattr(owner, name)
                self._originals.append((owner, name, original, own))
                setattr(owner, name, self._wrap(label, original))
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original, own in reversed(self._originals):
            if own:
                setattr(owner, name, original)
            else:  # a bound method set on an instance: its class's method shows again
                delattr(owner, name)

    def _wrap(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        depth = collections.Counter[int]()

        @functools.wraps(fn)
        def counted(*args: Any, **kwargs: Any) -> Any:
            tid = threading.get_ident()
            depth[tid] += 1
            c0 = time.thread_time_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                depth[tid] -= 1
                if depth[tid] == 0:
                    self.ns[label] += time.thread_time_ns() - c0
        return counted


def item1(rounds: int) -> None:
    builder = linear_graph(Small, STEPS)
    with temp_dir() as directory, sqlite_pair(directory) as pair:
        least = least_durable_saver(os.path.join(directory, "least.db"))
        try:
            graphs = {"null": builder.compile(checkpointer=null_saver()),
                      "least": builder.compile(checkpointer=least),
                      "stock": builder.compile(checkpointer=pair["stock"]),
                      "remit": builder.compile(checkpointer=pair["remit"])}
            for g in graphs.values():  # warm-up: tables, caches, connections
                _invoke(g)
            samples: dict[str, list[tuple[float, float]]] = {k: [] for k in graphs}
            for r in range(rounds):
                for k in (list(graphs) if r % 2 == 0 else list(reversed(graphs))):
                    samples[k].append(_timed(graphs[k]))
            wall = {k: statistics.median(s[0] for s in v) for k, v in samples.items()}
            cpu = {k: statistics.median(s[1] for s in v) for k, v in samples.items()}
            with _Counted(PIECES) as counted:
                c0 = time.process_time()
                for _ in range(rounds):
                    _invoke(graphs["remit"])
                counted_cpu = (time.process_time() - c0) / STEPS / rounds
            whole = {"the least durable saver's put and put_writes": (
                (least, "put"), (least, "put_writes"))}
            with _Counted(whole) as counted_least:
                for _ in range(rounds):
                    _invoke(graphs["least"])
        finally:
            least.conn.close()
    print("## Item 1 on SQLite: a step of a 200-step graph, durability=sync\n")
    print(f"median of {rounds} invokes a side, alternating\n")
    print("| side | wall a step | CPU a step | wall added over the stored-nothing "
          "checkpointer |")
    print("|---|---|---|---|")
    for k, name in SIDES.items():
        added = "" if k == "null" else us(wall[k] - wall["null"])
        print(f"| {name} | {us(wall[k])} | {us(cpu[k])} | {added} |")
    budget = 0.8 * wall["stock"] - wall["null"]
    print(f"\nremit / SqliteSaver: {wall['remit'] / wall['stock']:.2f}x (target <= 0.8x); "
          f"the least durable saver: {wall['least'] / wall['stock']:.2f}x")
    print(f"the target leaves a saver {us(budget)} a step (0.8 x SqliteSaver - the "
          f"stored-nothing checkpointer); the least durable saver adds "
          f"{us(wall['least'] - wall['null'])}, RemitSaver {us(wall['remit'] - wall['null'])}\n")
    per_step = {label: ns / 1e9 / STEPS / rounds for label, ns in counted.ns.items()}
    rest = cpu["remit"] - cpu["null"] - sum(per_step.values())
    print(f"RemitSaver's step by piece, in CPU ({rounds} counted invokes of their own: "
          f"{us(counted_cpu)} of process CPU a step, against {us(cpu['remit'])} uncounted)\n")
    print("| piece | CPU a step |")
    print("|---|---|")
    for label in PIECES:
        print(f"| {label} | {us(per_step.get(label, 0.0))} |")
    print(f"| the rest of remit's work (its uncounted CPU a step, less the pieces and less "
          f"LangGraph's share, {us(cpu['null'])}) | {us(rest)} |")
    named = sum(per_step.values())
    least_cpu = sum(counted_least.ns.values()) / 1e9 / STEPS / rounds
    print(f"\nthe four pieces: {us(named)} a step, {named / budget:.2f}x what the target "
          f"leaves a saver ({us(budget)}); the least durable saver's whole put and "
          f"put_writes, counted the same way: {us(least_cpu)} a step, its serializing and "
          f"its commit included\n")


SIDES = {"null": "LangGraph on a checkpointer that stores nothing",
         "least": "the least durable saver", "stock": "SqliteSaver", "remit": "RemitSaver"}

#: how ``--instructions`` groups the shared objects that executed them: (label, a part of
#: the object's path), first match wins; anything else is "the rest"
LIBRARIES = (("the Python interpreter", "libpython"), ("SQLite", "libsqlite3"),
             ("msgpack and ormsgpack", "msgpack"), ("the C library", "libc."))


def _callgrind(state: str) -> None:
    """Switch callgrind's instrumentation of this process on or off (under valgrind)."""
    subprocess.run(["callgrind_control", "-i", state, str(os.getpid())], check=True,
                   capture_output=True)


def _instructions_child(side: str, invokes: int) -> None:
    """Run under callgrind with its instrumentation off: two invokes of ``side``, then
    ``invokes`` with it on."""
    builder = linear_graph(Small, STEPS)
    with temp_dir() as directory, sqlite_pair(directory) as pair:
        least = least_durable_saver(os.path.join(directory, "least.db"))
        try:
            savers = {"null": null_saver(), "least": least, "stock": pair["stock"],
                      "remit": pair["remit"]}
            graph = builder.compile(checkpointer=savers[side])
            _invoke(graph)
            _invoke(graph)
            _callgrind("on")
            for _ in range(invokes):
                _invoke(graph)
            _callgrind("off")
        finally:
            least.conn.close()


def _counted_instructions(side: str, invokes: int) -> tuple[int, dict[str, int]]:
    """One side under callgrind: its counted instructions, in all and by library."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no",
             f"--callgrind-out-file={out}", sys.executable, __file__,
             "--instructions-child", side, "--invokes", str(invokes)],
            capture_output=True, text=True, check=False)
        collected = re.search(r"Collected : (\d+)", run.stderr)
        if run.returncode != 0 or collected is None:
            raise SystemExit(f"callgrind run of {side} failed ({run.returncode}):\n"
                             f"{run.stderr[-2000:]}")
        listing = subprocess.run(["callgrind_annotate", "--threshold=100", out],
                                 capture_output=True, text=True, check=True).stdout
    by: collections.Counter[str] = collections.Counter()
    for line in listing.splitlines():
        # "N (p%)  file:function [object]"; a function inlined from a header is listed
        # without its object, under the header's path in the interpreter's sources
        m = re.match(r"\s*([\d,]+) \([^)]*\)\s+(\S.*?)(?: \[(.+)\])?\s*$", line)
        if m and m.group(2) != "PROGRAM TOTALS":
            obj = m.group(3) or ("libpython" if "Python-3." in m.group(2) else m.group(2))
            label = next((name for name, part in LIBRARIES if part in obj), "the rest")
            by[label] += int(m.group(1).replace(",", ""))
    return int(collected.group(1)), dict(by)


def instructions(invokes: int) -> None:
    missing = [t for t in ("valgrind", "callgrind_control", "callgrind_annotate")
               if shutil.which(t) is None]
    if missing:
        raise SystemExit(f"--instructions needs valgrind's callgrind ({', '.join(missing)} "
                         "not found): install valgrind (Debian: apt install valgrind)")
    counted = {side: _counted_instructions(side, invokes) for side in SIDES}
    steps = STEPS * invokes
    null_total = counted["null"][0]
    labels = [name for name, _ in LIBRARIES] + ["the rest"]
    print("## Item 1 on SQLite in instructions: a step of a 200-step graph, durability=sync\n")
    print(f"user-space instructions of the whole process (every thread), counted by "
          f"callgrind over {invokes} invoke(s) a side after two uncounted; a step is "
          f"1/{STEPS} of an invoke\n")
    print("| side | a step | over LangGraph alone | " + " | ".join(labels) + " |")
    print("|---|---|---|" + "---|" * len(labels))
    for side, name in SIDES.items():
        total, by = counted[side]
        over = "" if side == "null" else f"{(total - null_total) / steps / 1e3:,.0f} k"
        parts = [f"{by.get(label, 0) / steps / 1e3:,.0f} k" for label in labels]
        print(f"| {name} | {total / steps / 1e3:,.0f} k | {over} | " + " | ".join(parts) + " |")
    stock_over = counted["stock"][0] - null_total
    remit_over = counted["remit"][0] - null_total
    print(f"\nRemitSaver adds {remit_over / stock_over:.2f}x the instructions SqliteSaver "
          f"adds to a step ({counted['remit'][0] / counted['stock'][0]:.2f}x the whole "
          f"process's)\n")


def _lean_read(store: Any, thread_id: str, ns: str) -> Callable[[], CheckpointTuple]:
    """The read of RemitSaver's latest checkpoint, with nothing between its statements
    and the caller (see the module docstring)."""
    conn = store._conn()
    decode = store.serde.decode
    latest = ("SELECT checkpoint_id, parent_id, data, metadata, versions FROM "
              "remit_checkpoints WHERE run_id = ? AND ns = ? ORDER BY seq DESC LIMIT 1")
    values = ("SELECT j.key, b.value FROM json_each(?) AS j CROSS JOIN remit_blobs AS b "
              "ON b.run_id = ? AND b.ns = ? AND b.channel = j.key AND b.version = j.value")
    writes = ("SELECT task_id, channel, value FROM remit_writes WHERE run_id = ? AND ns = ? "
              "AND checkpoint_id = ? ORDER BY task_id, idx")

    def read() -> CheckpointTuple:
        conn.execute("BEGIN")
        cid, parent, data, metadata, versions = conn.execute(latest, (thread_id, ns)).fetchone()
        found = conn.execute(values, (versions, thread_id, ns)).fetchall()
        pending = conn.execute(writes, (thread_id, ns, cid)).fetchall()
        conn.execute("COMMIT")
        checkpoint = {"channel_versions": versions_from_json(versions), **decode(data),
                      "channel_values": {ch: decode(v) for ch, v in found}}
        config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                                   "checkpoint_id": cid}}
        parent_config = None if parent is None else {"configurable": {
            "thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": parent}}
        return CheckpointTuple(config, checkpoint, decode(metadata), parent_config,  # type: ignore[arg-type]
                               [(t, ch, decode(v)) for t, ch, v in pending])
    return read


def _remit_rows(conn: Any, thread_id: str, ns: str) -> tuple[Any, list[Any], list[Any]]:
    """remit's three statements for the latest checkpoint, as the store issues them, in one
    read transaction: its row, its values' rows and its writes' rows, nothing decoded."""
    conn.execute("BEGIN")
    raw = conn.execute(sqlite_module._LATEST, (thread_id, ns)).fetchone()
    blobs = conn.execute(sqlite_module._BLOBS_OF_ONE, (raw[8], thread_id, ns)).fetchall()
    writes = conn.execute(sqlite_module._WRITES_OF_ONE, (thread_id, ns, raw[2])).fetchall()
    conn.execute("COMMIT")
    return raw, blobs, writes


def _floor_read(pair: dict[str, Any], thread_id: str, ns: str) -> dict[str, Callable[[], Any]]:
    """The least a read of remit's latest checkpoint does with the contract on (see the
    module docstring), and its checks alone: the bare read, plus what no contract-keeping
    read can skip -- the check that LangGraph's seams are still remit's (a seam replaced
    under remit raises, it does not pass through), the store's admission of an operation
    (a closed store refuses it; ``close()`` waits for it), the check for values stored in
    chunks, LangGraph's empty channels dropped and its writes in ``writes_sort_key`` order.
    No records, no retry wrapper, none of the saver's other bookkeeping."""
    store = pair["store"]
    conn = store._conn()
    decode = store.serde.decode
    is_manifest = chunks_module.is_manifest
    sort_key = saver_module._writes_sort_key

    def checks(values: list[bytes]) -> bool:
        _seam.verify()
        store._admit(store._read_checkpoint)
        store._leave()
        return any(map(is_manifest, values))

    def read() -> CheckpointTuple:
        _seam.verify()
        store._admit(store._read_checkpoint)
        try:
            raw, found, pending = _remit_rows(conn, thread_id, ns)
        finally:
            store._leave()
        if any(is_manifest(v) for _, v in found) or any(is_manifest(w[3]) for w in pending):
            raise AssertionError("item 2's history has no value stored in chunks")
        cid, parent = raw[2], raw[3]
        values = {ch: v for ch, b in found if (v := decode(b)) is not EMPTY}
        checkpoint = {"channel_versions": versions_from_json(raw[8]), **decode(raw[6]),
                      "channel_values": values}
        if sort_key is not None and len(pending) > 1:
            pending.sort(key=lambda w: sort_key(w[4], w[0], w[1]))
        config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                                   "checkpoint_id": cid}}
        parent_config = None if parent is None else {"configurable": {
            "thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": parent}}
        return CheckpointTuple(config, checkpoint, decode(raw[7]), parent_config,  # type: ignore[arg-type]
                               [(w[0], w[2], decode(w[3])) for w in pending])

    _, blobs, writes = _remit_rows(conn, thread_id, ns)
    stored = [v for _, v in blobs] + [w[3] for w in writes]
    return {"floor": read, "floor checks": functools.partial(checks, stored)}


def _parts(pair: dict[str, Any], thread_id: str, ns: str) -> dict[str, Callable[[], Any]]:
    """Each saver's statements alone and its decoding alone (see the module docstring)."""
    stock_conn = pair["stock"].conn
    stock_latest = ("SELECT thread_id, checkpoint_id, parent_checkpoint_id, type, checkpoint, "
                    "metadata FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ? "
                    "ORDER BY checkpoint_id DESC LIMIT 1")
    stock_writes = ("SELECT task_id, channel, type, value FROM writes WHERE thread_id = ? AND "
                    "checkpoint_ns = ? AND checkpoint_id = ? ORDER BY task_id, idx")

    def stock_sql() -> Any:
        row = stock_conn.execute(stock_latest, (thread_id, ns)).fetchone()
        return row, stock_conn.execute(stock_writes, (thread_id, ns, row[1])).fetchall()

    stock_row, stock_pending = stock_sql()
    loads = pair["stock"].serde.loads_typed

    def stock_decode() -> Any:
        return (loads((stock_row[3], stock_row[4])), json.loads(stock_row[5]),
                [loads((t, v)) for _, _, t, v in stock_pending])

    store = pair["store"]
    conn = store._conn()

    remit_sql = functools.partial(_remit_rows, conn, thread_id, ns)
    remit_row, remit_blobs, remit_pending = remit_sql()
    decode = store.serde.decode

    def remit_decode() -> Any:
        return (decode(remit_row[6]), decode(remit_row[7]), [decode(v) for _, v in remit_blobs],
                [decode(w[3]) for w in remit_pending])

    return {"stock sql": stock_sql, "stock decode": stock_decode,
            "remit sql": remit_sql, "remit decode": remit_decode}


def item2(rounds: int) -> None:
    with temp_dir() as directory:
        with sqlite_pair(directory, build=True) as builder:
            for k in ("remit", "stock"):
                build_history(builder[k], "h10", 10)
        with sqlite_pair(directory) as pair:
            config = {"configurable": {"thread_id": "h10", "checkpoint_ns": ""}}
            sides: dict[str, Callable[[], Any]] = {
                "remit": functools.partial(pair["remit"].get_tuple, config),
                "stock": functools.partial(pair["stock"].get_tuple, config),
                "lean": _lean_read(pair["store"], "h10", ""),
                **_floor_read(pair, "h10", ""),
                **_parts(pair, "h10", "")}
            got = {k: f() for k, f in sides.items()}
            assert got["floor"] == got["remit"], (got["floor"], got["remit"])
            assert got["floor checks"] is False
            for k in ("stock", "lean"):
                assert got[k].checkpoint["channel_values"] == \
                    got["remit"].checkpoint["channel_values"], k
                assert [w[1:] for w in got[k].pending_writes] == \
                    [w[1:] for w in got["remit"].pending_writes], k
            stock_decoded, remit_decoded = got["stock decode"], got["remit decode"]
            assert sorted(map(repr, remit_decoded[2])) == sorted(
                map(repr, stock_decoded[0]["channel_values"].values()))
            assert remit_decoded[1] == stock_decoded[1] and remit_decoded[3] == stock_decoded[2]
            samples: dict[str, list[float]] = {k: [] for k in sides}
            for r in range(rounds):
                for k in (list(sides) if r % 2 == 0 else list(reversed(sides))):
                    samples[k].append(timeit.timeit(sides[k], number=1000) / 1000)
    t = {k: statistics.median(v) for k, v in samples.items()}
    print("## Item 2 on SQLite: get_tuple of the latest checkpoint, history 10\n")
    print(f"median of {rounds} x 1000 calls a side, alternating\n")
    print("| side | a call | / SqliteSaver |")
    print("|---|---|---|")
    for k, name in (("stock", "SqliteSaver"), ("remit", "RemitSaver"),
                    ("lean", "remit's tables read with no layer between (the same "
                             "statements and decodes)")):
        print(f"| {name} | {us(t[k])} | {t[k] / t['stock']:.2f}x |")
    print(f"\nremit's layers (RemitSaver less the bare read): {us(t['remit'] - t['lean'])} a call\n")
    print("Each call in parts (the statements alone, the decoding alone, the checks alone, "
          "the rest); the floor is the least a read does with the contract on:\n")
    print("| part | SqliteSaver | remit's floor | RemitSaver | floor / stock | remit / stock |")
    print("|---|---|---|---|---|---|")
    whole = {"stock": t["stock"], "floor": t["floor"], "remit": t["remit"]}
    part_t = {"sql": {k: t[("remit" if k == "floor" else k) + " sql"] for k in whole},
              "decode": {k: t[("remit" if k == "floor" else k) + " decode"] for k in whole},
              "checks": {"stock": 0.0, "floor": t["floor checks"], "remit": t["floor checks"]}}
    rest = {k: whole[k] - sum(p[k] for p in part_t.values()) for k in whole}
    names = {"sql": "its statements", "decode": "its decoding",
             "checks": "the contract's checks (seams, admission, chunks)"}
    rows = [(label, part_t[part]) for part, label in names.items()]
    rows += [("the rest of the call", rest), ("the whole call", whole)]
    for label, row in rows:
        stock = row["stock"]
        ratios = [f"{row[k] / stock:.2f}x" if stock else "-" for k in ("floor", "remit")]
        print(f"| {label} | {us(stock) if stock else '-'} | {us(row['floor'])} | "
              f"{us(row['remit'])} | {ratios[0]} | {ratios[1]} |")
    print(f"\nThe target (<= 1.0x) leaves remit {us(t['stock'])} a call; the floor takes "
          f"{us(t['floor'])}, {t['floor'] / t['stock']:.2f}x; remit's layers above the floor "
          f"{us(t['remit'] - t['floor'])}\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--only", choices=("1", "2"), help="one item only")
    parser.add_argument("--instructions", action="store_true",
                        help="item 1 in instructions, under valgrind's callgrind")
    parser.add_argument("--invokes", type=int, default=1,
                        help="counted invokes a side (--instructions)")
    parser.add_argument("--instructions-child", choices=tuple(SIDES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.instructions_child:
        _instructions_child(args.instructions_child, args.invokes)
        return
    print(f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; 1-minute load "
          f"{os.getloadavg()[0]:.1f}\n")
    if args.instructions:
        instructions(args.invokes)
        return
    if args.only in (None, "1"):
        item1(args.rounds)
    if args.only in (None, "2"):
        item2(args.rounds)


if __name__ == "__main__":
    main()
