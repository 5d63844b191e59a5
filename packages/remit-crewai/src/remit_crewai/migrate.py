"""``remit migrate crewai``: a stock ``SQLiteFlowPersistence`` file becomes remit flows.

    remit migrate crewai --from flow_states.db --to sqlite:///flows.db [--run-id FLOW_ID]
                         [--name FLOW_NAME]

or, in Python::

    from remit_crewai.migrate import migrate

    report = migrate("flow_states.db", "postgresql://.../app")

Afterwards the flows continue under :class:`~remit_crewai.RemitFlowPersistence`: a flow
parked on ``@human_feedback`` with ``Flow.from_pending(flow_id, backend).resume(fb)``
(its feedback is consumed once: a second delivery raises
:class:`~remit_core.ConsumeConflict`), any other with
``kickoff(inputs={"id": flow_id})`` from its latest state.

What is read: the two tables of CrewAI's SQLite layer, with :mod:`sqlite3` directly (the
file is opened read-only; CrewAI's layer would create its tables in a foreign file):

* ``flow_states``: every row, in ``id`` order, becomes a ``crewai-state`` checkpoint of
  its flow with its ``method_name`` (``_ask_checkpoint`` rows included);
* ``pending_feedback`` (absent before CrewAI 1.8): a flow's row becomes a
  ``crewai-pending`` checkpoint placed after that flow's states. The stock layer writes
  the parked state into ``flow_states`` and ``pending_feedback`` in one transaction, so
  the parked state is the latest, and it is the latest here too.

Both hold plain JSON; nothing is unpickled. The states are stored as the stock layer
stored them: the CLI cannot import the application's flow classes, so a state is not
checked against its state class here (see the report's notes).

What is written: each record through ``RemitFlowPersistence._write``, the write of
``save_state`` and ``save_pending_feedback``, so an imported flow looks to remit as if
it had been saved by an un-``@durable`` flow under remit (execution 0, no receipts).

Ids and idempotence. A checkpoint id is derived from the stock row: a state's from
(flow id, row id, method, timestamp, state JSON), the pending record's from (flow id,
created_at, context JSON, state JSON). Importing again stores nothing twice: what is
present is counted in ``skipped``, and what the stock layer wrote since is added after
it. When the stock layer has resumed a parked flow since (its ``pending_feedback`` row
is gone), the feedback imported before is marked consumed in remit, so that it cannot
be delivered a second time there.

The run lifecycle (``name=``, ``--name`` on the command line: the name a ``@durable``
class's lifecycle has, its ``name`` field or else its class's name, as
:func:`remit_crewai.recover` looks for). A flow parked on feedback in the stock file is
kept as ``parked``, waiting for what the live path records for it (the method, its
message, the outcomes it may emit), with ``Store.import_run``: one atomic write, only
where the flow has no lifecycle (importing again, or after the flow ran under remit,
leaves the recorded one). ``remit inspect URL --status parked`` lists it then, and a
resume under remit that dies after claiming its feedback is finished by ``recover``. A
flow with states only gets none: the stock layer records neither finished methods nor
finished flows, so a flow that finished cannot be told from one whose process died, and
recovering a finished one would run it again (a report note says so). Without ``name``
no lifecycle is kept.

Refusals (:class:`~remit_core.migrate.MigrationError`, before anything is stored): a
missing file, a file that is not SQLite or has no ``flow_states`` table, a row that is
not a JSON object, a ``--run-id`` the file does not hold, and a flow that went on under
remit after it was imported while the stock layer wrote more rows for it too (the two
histories cannot be joined).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remit_core import ConsumeConflict, Store, derive_id, open_store
from remit_core.adapter import (
    Checkpoint,
    MigrationError,
    MigrationReport,
    import_lifecycle,
    mask_url,
    new_owner,
)
from remit_crewai._seam import context_waiting
from remit_crewai.persistence import FRAMEWORK, PENDING_KIND, RemitFlowPersistence, feedback_key

__all__ = ["MigrationError", "MigrationReport", "SOURCE", "StockFlow", "migrate",
           "read_flows"]

SOURCE = "SQLiteFlowPersistence"
"""The value of ``migrated_from`` in the metadata of every imported checkpoint."""

_NOTHING = "Nothing was imported."


# ===================================================================================== reading


@dataclass(frozen=True)
class StockRecord:
    """One stock row as it will be stored: a state (``context`` None) or parked feedback."""

    checkpoint_id: str
    method: str
    state: dict[str, Any]
    context: dict[str, Any] | None
    stock: dict[str, Any]  # where it came from: the row id and its timestamp


@dataclass
class StockFlow:
    """Everything the stock file holds for one flow id, in the order it is stored."""

    flow_id: str
    states: list[StockRecord] = field(default_factory=list)
    pending: StockRecord | None = None

    def records(self) -> list[StockRecord]:
        return [*self.states, *([self.pending] if self.pending else [])]


def read_flows(source: str | os.PathLike[str], *, run_id: str | None = None) -> list[StockFlow]:
    """The flows of a stock ``SQLiteFlowPersistence`` file (or only ``run_id``), in the
    order their first row was written. :class:`MigrationError` names the file when it is
    missing, not a CrewAI flow database, or holds a row that cannot be imported."""
    path = _path(source)
    states: list[tuple[Any, ...]] = []
    pending: list[tuple[Any, ...]] = []
    with _connect(path) as conn:
        tables = _tables(conn, path)
        if "flow_states" not in tables:
            raise MigrationError(
                f"{path} holds no CrewAI flow states (it has no flow_states table of a stock "
                f"SQLiteFlowPersistence). {_NOTHING}")
        where, params = ("WHERE flow_uuid = ?", (run_id,)) if run_id is not None else ("", ())
        try:
            states = conn.execute(
                "SELECT id, flow_uuid, method_name, timestamp, state_json FROM flow_states "
                f"{where} ORDER BY id", params).fetchall()
            if "pending_feedback" in tables:
                pending = conn.execute(
                    "SELECT id, flow_uuid, context_json, state_json, created_at FROM "
                    f"pending_feedback {where} ORDER BY id", params).fetchall()
        except sqlite3.Error as exc:
            raise MigrationError(f"{path}: cannot read CrewAI's tables ({exc}); they are not "
                                 f"those of a stock SQLiteFlowPersistence. {_NOTHING}") from exc
    flows: dict[str, StockFlow] = {}
    for row_id, flow_id, method, timestamp, state_json in states:
        where_ = f"flow_states row {row_id}"
        fid = _text(path, where_, "flow_uuid", flow_id)
        method = _text(path, where_, "method_name", method)
        state = _object(path, where_, "state_json", state_json)
        flows.setdefault(fid, StockFlow(fid)).states.append(StockRecord(
            derive_id(fid, f"crewai-import/{row_id}", [method, str(timestamp), state_json]),
            method, state, None, {"stock_row": int(row_id), "stock_timestamp": str(timestamp)}))
    for row_id, flow_id, context_json, state_json, created_at in pending:
        where_ = f"pending_feedback row {row_id}"
        fid = _text(path, where_, "flow_uuid", flow_id)
        context = _object(path, where_, "context_json", context_json)
        state = _object(path, where_, "state_json", state_json)
        method = _context_method(path, where_, context)
        flows.setdefault(fid, StockFlow(fid)).pending = StockRecord(
            derive_id(fid, "crewai-import/pending",
                      [str(created_at), context_json, state_json]),
            method, state, context,
            {"stock_pending_row": int(row_id), "stock_timestamp": str(created_at)})
    if run_id is not None and run_id not in flows:
        raise MigrationError(f"{path} holds no flow {run_id!r} (no row of flow_states or "
                             f"pending_feedback has that flow_uuid). {_NOTHING}")
    return list(flows.values())


def _path(source: str | os.PathLike[str]) -> Path:
    text = os.fspath(source)
    return Path(text.removeprefix("sqlite:///") if text.startswith("sqlite:///") else text)


@contextlib.contextmanager
def _connect(path: Path) -> Iterator[sqlite3.Connection]:
    if not path.is_file():
        raise MigrationError(f"{path}: no such file (a stock SQLiteFlowPersistence database "
                             f"was expected). {_NOTHING}")
    try:  # read-only: never create or change anything in the source
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise MigrationError(f"{path} cannot be opened ({exc}). {_NOTHING}") from exc
    with contextlib.closing(conn):
        yield conn


def _tables(conn: sqlite3.Connection, path: Path) -> set[str]:
    try:
        return {str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master")}
    except sqlite3.DatabaseError as exc:
        raise MigrationError(f"{path} is not a SQLite database ({exc}). {_NOTHING}") from exc


def _text(path: Path, where: str, column: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise MigrationError(f"{path}: {where} has {column} {value!r}, not a non-empty text. "
                             f"{_NOTHING}")
    return value


def _object(path: Path, where: str, column: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    try:
        parsed = json.loads(value) if isinstance(value, str) else None
    except ValueError as exc:
        raise MigrationError(f"{path}: {where}: {column} is not valid JSON ({exc}). "
                             f"{_NOTHING}") from None
    if not isinstance(parsed, dict):
        raise MigrationError(
            f"{path}: {where}: {column} is not a JSON object (found "
            f"{type(parsed).__name__}); CrewAI cannot restore it either. {_NOTHING}")
    return parsed


def _context_method(path: Path, where: str, context: dict[str, Any]) -> str:
    """The parked method, once the context is known to load into CrewAI's class."""
    from crewai.flow.async_feedback.types import PendingFeedbackContext

    try:
        loaded = PendingFeedbackContext.from_dict(context)
    except (KeyError, TypeError, ValueError) as exc:
        raise MigrationError(f"{path}: {where}: context_json is not a CrewAI "
                             f"PendingFeedbackContext ({type(exc).__name__}: {exc}). "
                             f"{_NOTHING}") from None
    return _text(path, where, "context_json.method_name", loaded.method_name)


# ===================================================================================== writing


@dataclass
class _Plan:
    """What importing one flow does."""

    flow: StockFlow
    todo: list[StockRecord]
    stale: list[Checkpoint]  # imported parked feedback that the stock layer no longer holds


def _plan(p: RemitFlowPersistence, flow: StockFlow, path: Path) -> _Plan:
    fid = flow.flow_id
    existing = list(p.store.list_checkpoints(fid, ns="", with_writes=False))
    have = {cp.checkpoint_id for cp in existing}
    records = flow.records()
    todo = [r for r in records if r.checkpoint_id not in have]
    refuse = (f"{_NOTHING} Import the other flows with --run-id, or delete flow {fid!r} "
              f"from {p.store.url} first.")
    if todo:
        states = [r.checkpoint_id for r in flow.states]
        present = [cid in have for cid in states]
        if present != sorted(present, reverse=True):  # the imported states: a prefix
            raise MigrationError(f"flow {fid!r} in {p.store.url} holds some of the states "
                                 f"of {path}, but not the first ones. {refuse}")
        native = [cp for cp in existing if _imported(cp) is None]
        if native:
            raise MigrationError(
                f"flow {fid!r} in {p.store.url} went on under remit (its latest checkpoint "
                f"is {existing[0].checkpoint_id!r}), and {path} holds {len(todo)} record(s) "
                f"of it that were written since the last import (or that were never "
                f"imported); the two histories cannot be joined. {refuse}")
    current = flow.pending.checkpoint_id if flow.pending else None
    stale = [cp for cp in existing if cp.kind == PENDING_KIND and _imported(cp) is not None
             and cp.checkpoint_id != current]
    return _Plan(flow, todo, stale)


def _imported(cp: Checkpoint) -> str | None:
    meta = cp.metadata if isinstance(cp.metadata, dict) else {}
    found = meta.get("migrated_from")
    return str(found) if found is not None else None


def _store(p: RemitFlowPersistence, plan: _Plan) -> None:
    fid = plan.flow.flow_id
    epoch = p.epoch(fid).number
    for record in plan.todo:
        p._write(fid, record.checkpoint_id, state=record.state, method=record.method,
                 epoch=epoch, step=record.method, context=record.context,
                 extra={"migrated_from": SOURCE, **record.stock})


def _retire(p: RemitFlowPersistence, cp: Checkpoint) -> str | None:
    """Mark imported parked feedback consumed: the stock layer resumed the flow since.
    Returns a note, or None when remit had consumed it already."""
    store, fid = p.store, cp.run_id
    key = feedback_key(fid, cp.checkpoint_id)
    method = cp.data.get("method") if isinstance(cp.data, dict) else None
    owner = f"remit-migrate:crewai:{new_owner()}"
    try:
        claim = store.claim_once(key, run_id=fid, owner=owner,
                                 value="delivered under the stock SQLiteFlowPersistence")
    except ConsumeConflict as exc:
        if exc.status == "consumed":
            return None
        return (f"flow {fid!r}: the stock layer resumed the feedback of {method!r} that was "
                f"imported before, and a resume under remit holds it right now ({exc.owner!r}); "
                "the feedback may be delivered twice. Check the flow.")
    store.consume_claim(key, owner=owner, fence=claim.fence)
    return (f"flow {fid!r}: the feedback of {method!r} imported before is no longer pending "
            "in the stock file (the stock layer resumed it); marked consumed in remit, so "
            "that it is not delivered a second time")


def migrate(source: str | os.PathLike[str], target: str | Store, *,
            run_id: str | None = None, name: str | None = None) -> MigrationReport:
    """Import the flows of the stock ``SQLiteFlowPersistence`` file ``source`` (or only
    flow ``run_id``) into the remit store ``target`` (a URL, or an open
    :class:`~remit_core.Store`).

    ``name``: the lifecycle name of the flows' ``@durable`` class (its ``name`` field,
    else the class's name). With it each flow parked on feedback is kept in the run
    lifecycle as ``parked`` (see the module docstring); without it none is kept.

    Running it again stores nothing twice: what is present is counted in ``skipped``.
    Raises :class:`~remit_core.migrate.MigrationError` (and stores nothing) for a
    missing or foreign file, a row that cannot be imported, an unknown ``run_id``, or a
    flow whose remit and stock histories have both gone on since an earlier import.
    """
    path = _path(source)
    flows = read_flows(path, run_id=run_id)  # a bad file: no store is opened
    with contextlib.ExitStack() as stack:
        store = target if isinstance(target, Store) else stack.enter_context(open_store(target))
        p = RemitFlowPersistence.from_url(store)  # the store stays this function's to close
        report = MigrationReport(source=str(path), target=mask_url(store.url))
        plans = [_plan(p, flow, path) for flow in flows]  # every refusal before any write
        for plan in plans:
            _store(p, plan)
            report.checkpoints += len(plan.todo)
            report.skipped += len(plan.flow.records()) - len(plan.todo)
            report.runs += 1 if plan.todo else 0
        retired = [note for plan in plans for cp in plan.stale
                   if (note := _retire(p, cp)) is not None]
        _explain(report, plans, retired)
        if name is not None:
            _keep_lifecycles(store, plans, name, report)
        elif plans:
            report.notes.append(
                "no run lifecycle was kept (no name given): the parked flows have no "
                "status, so remit inspect --status parked does not list them until they "
                "next run under remit; to keep one, give the lifecycle name of the flows' "
                "@durable class: remit migrate crewai ... --name NAME, or "
                "migrate(source, target, name=...)")
        return report


def _keep_lifecycles(store: Store, plans: list[_Plan], name: str,
                     report: MigrationReport) -> None:
    """Keep each flow parked on feedback in the stock file as ``parked``; say why the
    others get no lifecycle."""
    from crewai.flow.async_feedback.types import PendingFeedbackContext

    states_only = 0
    for plan in plans:
        pending = plan.flow.pending
        if pending is None or pending.context is None:
            states_only += 1
            continue
        waiting = context_waiting(PendingFeedbackContext.from_dict(pending.context))
        report.notes.append(import_lifecycle(
            store, "flow", plan.flow.flow_id, framework=FRAMEWORK, name=name,
            status="parked", owner=f"migrate:{SOURCE}:{new_owner()}", detail=waiting))
    if states_only:
        report.notes.append(
            f"{states_only} flow(s) with states only get no run lifecycle: the stock layer "
            "records neither finished methods nor finished flows, so a finished flow cannot "
            "be told from one whose process died, and recovering it would run it again")


def _explain(report: MigrationReport, plans: list[_Plan], retired: list[str]) -> None:
    if not plans:
        report.notes.append("the file holds no flows; nothing to import")
        return
    if report.checkpoints:
        report.notes.append(
            "states are imported as the stock layer stored them, not checked against the "
            "flows' state classes (the CLI cannot import them, and the stock layer never "
            "validated them): a state that does not fit its class fails when the flow is "
            "restored (pydantic's ValidationError in kickoff or from_pending), and every "
            "state remit writes from then on is checked strictly")
    for pl in plans:
        pending = pl.flow.pending
        if pending is None or all(r is not pending for r in pl.todo):
            continue
        report.notes.append(
            f"flow {pl.flow.flow_id!r} is parked on feedback for {pending.method!r}: "
            "resume it with Flow.from_pending(flow_id, RemitFlowPersistence...).resume(...); "
            "its feedback is consumed once")
    plain = [pl for pl in plans if pl.todo and pl.flow.pending is None]
    if plain:
        report.notes.append(
            f"{len(plain)} flow(s) hold states only: kickoff(inputs={{'id': flow_id}}) "
            "restores the latest state and runs the flow from its start methods, as under the "
            "stock layer, which records neither finished methods nor finished flows (a flow "
            "that had finished runs again)")
    report.notes.extend(retired)
    if not report.checkpoints and not retired:
        report.notes.append("every record of the file is in the store already; nothing new")
