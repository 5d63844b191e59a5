"""``remit migrate pydantic-graph``: a stock ``FileStatePersistence`` file becomes a remit run.

    remit migrate pydantic-graph --from runs/order-42.json --to sqlite:///runs.db --run-id order-42

or, in Python, with the graph so that every snapshot is checked before anything is stored::

    from remit_pydantic_graph.migrate import migrate

    report = migrate("runs/order-42.json", "sqlite:///runs.db", run_id="order-42", graph=graph)

Afterwards the run continues under :class:`~remit_pydantic_graph.RemitStatePersistence`
with ``graph.iter_from_persistence(...)``, and ``load_all()`` returns the stock history.

How it is stored, and why one code path serves both forms: RemitStatePersistence keeps a
snapshot as the JSON that pydantic-graph's own snapshot TypeAdapter dumps
(``dump_python(mode="json")``), and a stock file is a JSON array of exactly those dumps.
So each element of the file *is* the stored form already; decoding it needs the graph's
node and state types, storing it does not. The import therefore always stores the
file's elements as they are (only the status fields are moved to where remit keeps
them), through the persistence's own write (``_put``: one atomic ``put_checkpoint``
per snapshot, chained by parent, one successor per parent). The graph only adds a
strict check up front:

* with ``graph=`` (Python): every snapshot must load strictly into the graph's types
  before anything is stored (the same check every remit write makes);
* without it (the CLI, which cannot import the application's graph): the file's
  structure is checked, and each snapshot is checked strictly when the run is first
  loaded with its types (``set_graph_types``, or ``Graph.iter_from_persistence``),
  where one that does not fit is refused with :class:`~remit_core.CorruptRecord`.

Statuses: remit derives a snapshot's status from durable facts rather than storing it.
An earlier snapshot's stock status, ``start_ts`` and ``duration`` go into its
successor's metadata, where a native run records ``success``. The last snapshot's
status becomes the facts that mean it (``RemitStatePersistence._adopt_head``):
``created`` nothing; ``pending`` and ``running`` a claim whose owner is gone, which the
next resume takes over at once; ``error`` an error record (resumed only with
``retry_errors=True``). A last snapshot that the stock file calls ``success`` has no
successor (the stock layer's gap: the process stopped after the node and before its
successor was written), so its result is lost; it is imported as ``running``, and the
next resume runs it again.

The run lifecycle: the import keeps the run in the store's lifecycle (``Store.import_run``,
framework ``pydantic-graph``) as remit would have kept it had the run been
executed under remit, so that ``Store.list_runs(status=...)``, ``remit inspect --status``
and :func:`remit_pydantic_graph.recover` see it before it is next executed:

* an End snapshot last: ``done``;
* ``error``: ``failed``, its error ``{"type": "FileStatePersistence", "message": ...}``
  (the stock file keeps no exception type or message); ``recover(...,
  retry_failed=True)`` runs the node again;
* ``running``, or ``success`` without a successor (the gap): ``abandoned``: the stock
  process died with the run's execution running, so the run is started with a lease that
  has run out already, as a dead executor leaves it; ``recover()`` finds it at once and
  finishes it, the node that was running run again (its effects had no receipts);
* ``created`` or ``pending``: ``parked``, waiting at that snapshot, as a remit block left
  between nodes records it (a block that stops after ``load_next`` too): no node was
  running, and pydantic-graph's human-in-the-loop pattern stops exactly there on purpose,
  to replace the parked node with one built from an answer, so a recovery must not run
  it. The app's next resume continues it as before. (A stock process that died between
  nodes cannot be told from one that stopped there: it is parked too.)

The name is the graph's (``graph_name``: what ``recover(graph, url)`` looks for), or
``name=``; without the graph (the command line) it is the id of the run's first node,
which is the name remit keeps an unnamed graph's runs under when that node comes first
in its ``nodes`` (``infer_name=False``); a report note says which name was used, and
``recover(graph, url, name=...)`` finds the run under it. The next execution under remit
keeps the run under its graph's name from then on.

A lifecycle already recorded is never overwritten: importing the same file again leaves
it as it is, and so does an import after a remit execution (that execution's record
stands, and a run whose head moved on under remit is not touched at all). Only the
import's own record, untouched since, is brought up to date when the file now says
otherwise (the stock run went on and the file grew). A run imported before the import
kept lifecycles gets one when it is imported again.

Each record is one atomic operation, ``Store.import_run``: the first one writes only
where the run has no lifecycle (a remit execution that recorded one first keeps it), and
bringing the import's own record up to date (``replaces=``) writes only while that
record is still the stored one (a recovery that took the run over in between, or an
execution, keeps its record).

Importing again is idempotent: snapshots already present (same id, parent and data)
are counted as skipped and nothing is stored twice; a file that has grown since is
imported from where the last import stopped. A history that disagrees with the run
already stored under ``run_id`` is refused, and so is a missing, empty, cut-short or
malformed file: :class:`~remit_core.migrate.MigrationError` names the file, and nothing
is stored.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, cast

import pydantic
from pydantic_graph.graph import Graph
from pydantic_graph.persistence import SnapshotStatus

from remit_core import ConsumeConflict, StateValidationError, Store, open_store
from remit_core.adapter import (
    MigrationError,
    MigrationReport,
    RunState,
    import_lifecycle,
    left_note,
    new_owner,
)
from remit_pydantic_graph.persistence import (
    DEFAULT_NAME,
    FRAMEWORK,
    KIND,
    START,
    STATUSES,
    RemitStatePersistence,
    graph_name,
    parent_facts,
)

__all__ = ["MigrationError", "MigrationReport", "amigrate", "migrate"]

_TS: pydantic.TypeAdapter[datetime] = pydantic.TypeAdapter(datetime)

Kept = Literal["abandoned", "parked", "done", "failed"]
"""The lifecycle an import records: ``abandoned`` is ``running`` with a lease run out."""

MIGRATED_FROM = "FileStatePersistence"
"""What an imported run's records say they came from (checkpoint metadata, the waiting
of a parked lifecycle, the type of a failed one's error)."""
STOCK_ERROR = ("the node raised under pydantic-graph's FileStatePersistence, which keeps no "
               "error message (imported by remit migrate)")
"""All the import knows of a stock node's error (the stock file records only the status)."""
OWNER_PREFIX = f"migrate:{MIGRATED_FROM}:"
"""The owner of an imported run's lifecycle while it reads ``running``: an abandoned run
whose owner starts with it was left so by an import, and by nothing since (an executor's
owner is ``host:pid:nonce``, never this)."""


@dataclass
class _Stock:
    """One snapshot of the file: the data to store, and its stock status facts."""

    index: int
    id: str
    kind: str  # "node" or "end"
    data: dict[str, Any]
    status: SnapshotStatus | None  # None for an end snapshot
    start_ts: datetime | None
    duration: float | None


def migrate(
    source: str | os.PathLike[str],
    target: str | Store,
    *,
    run_id: str | None = None,
    graph: Graph[Any, Any, Any] | None = None,
    name: str | None = None,
) -> MigrationReport:
    """Import the ``FileStatePersistence`` file ``source`` into the remit store ``target``
    (a URL, or an opened :class:`~remit_core.Store`) as run ``run_id``.

    ``run_id`` is required: a stock file holds one run and does not name it. Pass the
    ``graph`` to check every snapshot against its types before anything is stored;
    without it, they are checked when the run is first loaded. Raises
    :class:`~remit_core.migrate.MigrationError` naming the file when it is missing,
    empty, cut short or not a snapshot history, or when ``run_id`` holds another
    history; nothing is stored then. From async code, ``await amigrate(...)``.

    The run is kept in the store's run lifecycle as remit would have kept it (see the
    module docstring), under the framework ``"pydantic-graph"`` and ``name``: by default
    the graph's (:func:`~remit_pydantic_graph.persistence.graph_name`, the name
    :func:`~remit_pydantic_graph.recover` looks for), and without ``graph`` the id of the
    run's first node (the name remit gives a graph that has none, when that node is its
    first).
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(amigrate(source, target, run_id=run_id, graph=graph, name=name))
    raise RuntimeError("migrate() was called inside a running event loop; "
                       "use `await amigrate(...)` there")


async def amigrate(
    source: str | os.PathLike[str],
    target: str | Store,
    *,
    run_id: str | None = None,
    graph: Graph[Any, Any, Any] | None = None,
    name: str | None = None,
) -> MigrationReport:
    """:func:`migrate`, as a coroutine."""
    if not run_id:
        raise MigrationError(
            "a pydantic-graph FileStatePersistence file holds one run and does not name it; "
            "give the run id to store it under (--run-id ID, or run_id=...)")
    path = Path(source)
    history = await asyncio.to_thread(read_history, path)  # a bad file: no store opened
    store = open_store(target) if isinstance(target, str) else target
    try:
        p: RemitStatePersistence[Any, Any] = RemitStatePersistence(store, run_id=run_id)
        if graph is not None:
            p.set_graph_types(graph)
            _check_types(p, path, history)
        report = MigrationReport(source=str(path), target=store.url)
        await _import(p, path, history, report, checked=graph is not None,
                      name=name or _lifecycle_name(graph, history))
        return report
    finally:
        if isinstance(target, str):
            store.close()


# ================================================================================ the file


def read_history(path: Path) -> list[_Stock]:
    """The snapshots of a stock file, checked for structure; MigrationError otherwise."""
    nothing = "Nothing was imported."
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise MigrationError(f"{path}: no such file. {nothing}") from None
    except OSError as exc:
        raise MigrationError(f"{path} cannot be read ({exc}). {nothing}") from None
    if not raw.strip():
        raise MigrationError(
            f"{path} is empty ({len(raw)} bytes). pydantic-graph's FileStatePersistence "
            "leaves an empty file when its process is killed while it rewrites the history, "
            f"and the run's history is lost with it. {nothing}")
    try:
        items = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MigrationError(
            f"{path} is not valid JSON ({exc}); it may have been cut short by a crash while "
            f"it was written. {nothing}") from None
    if not isinstance(items, list):
        raise MigrationError(
            f"{path} is not a FileStatePersistence history (a JSON array of snapshots; found "
            f"{type(items).__name__}). {nothing}")
    history = [_snapshot(path, i, item) for i, item in enumerate(items)]
    seen: set[str] = set()
    for snap in history:
        if snap.id in seen:
            raise MigrationError(f"{path}: snapshot id {snap.id!r} occurs twice. {nothing}")
        seen.add(snap.id)
    return history


def _snapshot(path: Path, i: int, item: Any) -> _Stock:
    sid = item.get("id") if isinstance(item, dict) else None

    def bad(problem: str) -> MigrationError:
        name = f" ({sid})" if isinstance(sid, str) else ""
        return MigrationError(f"{path}: snapshot {i}{name} {problem}. Nothing was imported.")

    if not isinstance(item, dict):
        raise bad(f"is not a JSON object (found {type(item).__name__})")
    kind = item.get("kind")
    if kind not in ("node", "end"):
        raise bad(f"has kind {kind!r}; a snapshot's kind is 'node' or 'end'")
    if not isinstance(sid, str) or not sid or sid == "__unset__":
        raise bad("has no id")
    if "state" not in item:
        raise bad("has no state")
    if kind == "end":
        result = item.get("result")
        if not isinstance(result, dict) or "data" not in result:
            raise bad("has no result")
        if not isinstance(item.get("ts"), str):
            raise bad("has no ts")
        _timestamp(item["ts"], bad)
        return _Stock(i, sid, kind, dict(item), None, None, None)
    node = item.get("node")
    if not isinstance(node, dict) or not isinstance(node.get("node_id"), str):
        raise bad("has no node_id in its node (the stock layer writes such a node when its "
                  "state did not match the state type; the file cannot be loaded)")
    status = item.get("status")
    if status not in STATUSES:
        raise bad(f"has status {status!r}")
    start_ts = None if item.get("start_ts") is None else _timestamp(item["start_ts"], bad)
    duration = item.get("duration")
    if duration is not None and (isinstance(duration, bool)
                                 or not isinstance(duration, int | float)):
        raise bad(f"has duration {duration!r}")
    # stored as remit stores its own snapshots: the status lives in durable facts instead
    data = {**item, "status": "created", "start_ts": None, "duration": None}
    return _Stock(i, sid, kind, data, cast(SnapshotStatus, status), start_ts,
                  None if duration is None else float(duration))


def _timestamp(value: Any, bad: Any) -> datetime:
    try:
        return _TS.validate_python(value)
    except pydantic.ValidationError:
        raise bad(f"has a timestamp that is not one: {value!r}") from None


def _check_types(p: RemitStatePersistence[Any, Any], path: Path, history: list[_Stock]) -> None:
    """With the graph: each snapshot must load strictly into its types (as every write)."""
    for snap in history:
        try:
            p._roundtrip(snap.data, snap.id)
        except StateValidationError as exc:
            raise MigrationError(
                f"{path}: snapshot {snap.index} ({snap.id}) does not load into the graph's "
                f"types: field {exc.field!r}: "
                f"{exc.errors[0].get('msg') if exc.errors else exc}. Nothing was imported."
            ) from None


# ================================================================================== import


async def _import(p: RemitStatePersistence[Any, Any], path: Path, history: list[_Stock],
                  report: MigrationReport, *, checked: bool, name: str) -> None:
    run_id, store = p.run_id, p.store
    stored = await p._io(lambda: list(store.list_checkpoints(run_id, with_writes=False)))
    by_id = {ck.checkpoint_id: ck for ck in stored}
    parents = [START, *(s.id for s in history)]  # parents[i]: the parent of history[i]
    refuse = (f"Nothing was imported; import {path} under another run id, or delete run "
              f"{run_id!r} first.")

    present = 0  # the file's prefix that an earlier import stored already
    for snap, parent in zip(history, parents, strict=False):
        ck = by_id.get(snap.id)
        if ck is None:
            break
        if ck.parent_id != parent or ck.kind != KIND or ck.data != snap.data:
            raise MigrationError(
                f"run {run_id!r} in {store.url} holds snapshot {snap.id!r}, but not as "
                f"{path} has it (snapshot {snap.index}). {refuse}")
        present += 1
    todo = history[present:]
    if todo:
        if any(s.id in by_id for s in todo):
            raise MigrationError(f"run {run_id!r} in {store.url} holds some of the snapshots "
                                 f"of {path}, in another order. {refuse}")
        head = stored[0].checkpoint_id if stored else None
        if present == 0 and head is not None:
            raise MigrationError(f"run {run_id!r} in {store.url} already holds another "
                                 f"history (its last snapshot is {head!r}). {refuse}")
        if present and head != parents[present]:
            raise MigrationError(
                f"run {run_id!r} in {store.url} went on under remit after it was imported "
                f"(its last snapshot is {head!r}), and {path} went on from "
                f"{parents[present]!r} too; the two histories cannot be joined. {refuse}")

    for snap in todo:
        i = snap.index
        prev = history[i - 1] if i else None
        if prev is None or prev.kind == "end":  # the first snapshot of a (stock) run
            metadata: dict[str, Any] = {"first": True}
        else:
            metadata = parent_facts(cast(SnapshotStatus, prev.status), prev.start_ts,
                                    prev.duration)
        metadata["migrated_from"] = MIGRATED_FROM
        try:
            await p._put(snap.id, parent=parents[i], data=snap.data, step=snap.id,
                         metadata=metadata, check=checked)
        except ConsumeConflict as exc:
            raise MigrationError(
                f"run {run_id!r} in {store.url} was written by another process during the "
                f"import ({exc.owner!r} follows {parents[i]!r}); {report.checkpoints} of "
                f"{len(todo)} snapshot(s) of {path} were imported. Run the import again once "
                "the other writer has stopped.") from None
        report.checkpoints += 1
    report.skipped = present
    report.runs = 1 if report.checkpoints else 0
    lifecycle: str | None = None
    if history:
        report.writes = await _settle_head(p, history[-1])
        lifecycle = await _settle_lifecycle(p, history[-1], name)
    _explain(p, history, report, checked=checked)
    if lifecycle is not None:
        report.notes.append(lifecycle)


async def _settle_head(p: RemitStatePersistence[Any, Any], last: _Stock) -> int:
    """The last snapshot's stock status as durable facts, once (not after a resume)."""
    if last.kind == "end" or last.status is None:
        return 0
    head = await p._io(p.store.get_checkpoint, p.run_id, with_writes=False)
    if head is None or head.checkpoint_id != last.id:
        return 0  # the run went on under remit
    if await p._io(p.store.get_claim, p._key(last.id)) is not None:
        return 0  # settled by an earlier import, or claimed under remit since
    status: SnapshotStatus = "running" if last.status == "success" else last.status
    return await p._adopt_head(last.id, status, start_ts=last.start_ts,
                               duration=last.duration, message=STOCK_ERROR)


# =========================================================================== run lifecycle


def _lifecycle_name(graph: Graph[Any, Any, Any] | None, history: list[_Stock]) -> str:
    """The name the run is kept under: the graph's as the adapter keeps it, else (no graph,
    the command line) the id of the run's first node, which is the graph's name in remit
    when the graph has none and that node comes first in its ``nodes``."""
    if graph is not None:
        return graph_name(graph)
    first = next((s for s in history if s.kind == "node"), None)
    return str(first.data["node"]["node_id"]) if first is not None else DEFAULT_NAME


def _lifecycle_of(last: _Stock) -> tuple[Kept, Any]:
    """The lifecycle remit would have recorded for a run that stopped at ``last``, with what
    goes with it (the ``waiting`` of a parked run, the ``error`` of a failed one):

    * an End snapshot: ``done``;
    * ``error``: ``failed``, with what the import knows of the error (the stock file
      keeps no type or message);
    * ``running``, or ``success`` without a successor (the stock layer's gap): the process
      died inside the node or right after it, with the run's execution running:
      ``abandoned`` (running, with a lease that has run out), which a recovery continues;
    * ``created`` or ``pending``: no node was running, the run stopped between nodes, which
      a remit block records as ``parked`` at the snapshot met last (pydantic-graph's
      human-in-the-loop pattern stops there on purpose, so a recovery must not run it).
    """
    if last.kind == "end":
        return "done", None
    if last.status == "error":
        return "failed", {"type": MIGRATED_FROM, "message": STOCK_ERROR}
    if last.status in ("running", "success"):
        return "abandoned", None
    return "parked", {"snapshot": last.id, "node": str(last.data["node"]["node_id"]),
                      "migrated_from": MIGRATED_FROM}


def _imported(run: RunState) -> bool:
    """The lifecycle is as an import left it, and nothing executed the run since (an
    execution under remit records its own owner, waiting and error)."""
    if run.status == "parked":
        return isinstance(run.waiting, dict) and run.waiting.get("migrated_from") == MIGRATED_FROM
    if run.status == "failed":
        return isinstance(run.error, dict) and run.error.get("type") == MIGRATED_FROM
    return run.status == "abandoned" and (run.owner or "").startswith(OWNER_PREFIX)


def _same(run: RunState, status: Kept, detail: Any) -> bool:
    return run.status == status and (
        run.waiting if status == "parked" else run.error if status == "failed" else None
    ) == detail


async def _settle_lifecycle(p: RemitStatePersistence[Any, Any], last: _Stock,
                            name: str) -> str | None:
    """Keep the imported run in the store's run lifecycle (``Store.import_run``: the first
    record, or the import's own record brought up to date, ``replaces=``), as
    :func:`_lifecycle_of` says; a note for the report saying what was
    recorded or left as it was, or None (the run went on under remit).

    Only while the run's head is the file's last snapshot (a run that went on under remit
    is kept by its executions), and never over a lifecycle already recorded: the same
    file imported again changes nothing, and an execution's record stands. The one
    exception is the import's own record, untouched since (:func:`_imported`), when the
    file now says otherwise (the stock run went on and the file grew): it is brought up to
    date, in the same one write, only while it is still the stored record.
    """
    store, run_id = p.store, p.run_id
    head = await p._io(store.get_checkpoint, run_id, with_writes=False)
    if head is None or head.checkpoint_id != last.id:
        return None  # the run went on under remit
    status, detail = _lifecycle_of(last)
    current = await p._io(store.get_run, run_id)
    if current is not None and (not _imported(current) or _same(current, status, detail)):
        return left_note("run", run_id, current)
    # the first record (current None), or the import's own record brought up to date:
    # one atomic write either way, never over another's (a record that changed since it
    # was read here is left as it is)
    return await p._io(import_lifecycle, store, "run", run_id, framework=FRAMEWORK,
                       name=name, status=status, owner=f"{OWNER_PREFIX}{new_owner()}",
                       detail=detail, replaces=current)


def _explain(p: RemitStatePersistence[Any, Any], history: list[_Stock], report: MigrationReport,
             *, checked: bool) -> None:
    run = f"run {p.run_id!r}"
    if not history:
        report.notes.append("the file holds no snapshots; nothing to import")
        return
    if report.checkpoints and not checked:
        report.notes.append(
            "stored without the graph's types (no graph given): each snapshot is checked "
            "strictly when the run is first loaded with them (set_graph_types, or "
            "Graph.iter_from_persistence); one that does not fit raises CorruptRecord")
    for snap in history[:-1]:
        if snap.kind == "end":
            report.notes.append(
                f"the file holds more than one run: end snapshot {snap.id} is followed by "
                f"{len(history) - 1 - snap.index} more snapshot(s); imported as one history")
        elif snap.status != "success":
            report.notes.append(
                f"snapshot {snap.id} was left {snap.status!r} and later snapshots follow it; "
                "it stays history (remit resumes a run at its last snapshot only)")
    if not (report.checkpoints or report.writes):
        report.notes.append(f"{run} holds every snapshot of the file already; nothing new")
        return
    last = history[-1]
    resume = "resume it with graph.iter_from_persistence(RemitStatePersistence...)"
    if last.kind == "end":
        report.notes.append(f"{run} has ended ({last.id}); load_all() reads its history")
    elif last.status == "created":
        report.notes.append(f"{run} is parked before {last.id}; {resume}")
    elif last.status == "pending":
        report.notes.append(
            f"{run}: {last.id} was taken by load_next and never run under the stock layer; "
            f"its taker is treated as gone, so the next resume runs it; {resume}")
    elif last.status == "running":
        report.notes.append(
            f"{run}: {last.id} was running when the stock process stopped (the stock layer "
            f"cannot resume it); the next resume runs it again, and effects it made without "
            f"remit receipts may happen again; {resume}")
    elif last.status == "success":
        report.notes.append(
            f"{run}: {last.id} finished, but the stock layer never stored the snapshot that "
            "followed it (its process stopped in between), so that node's result is lost; "
            f"it is imported as running and the next resume runs it again; {resume}")
    else:
        report.notes.append(
            f"{run}: {last.id} failed under the stock layer; it runs again only under a "
            "persistence opened with retry_errors=True")
