"""``remit check`` for CrewAI Flows: the fault matrix on SQLiteFlowPersistence and on remit.

Every cell is measured by real runs of small flows with no LLM
(:mod:`remit_check.crewai.flows`), in child processes forked from a server that
imported only this module (and CrewAI). Kill points are reported by the child over a
pipe (the parent then SIGKILLs it); racers are released by a barrier; a ledger file
(one fsynced line per real effect call and per method entry) is the oracle. The
layers and their factory contract are declared in :mod:`remit_check.crewai`.

Not measured here: a SIGKILL *during* a write. CrewAI's SQLite backend writes
one row per transaction, which SQLite keeps atomic, and remit's writes are
single transactions too; CrewAI's Checkpointing (the path that tears JSON
files) is not a ``FlowPersistence`` and remit does not use it.
"""

from __future__ import annotations

from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from crewai.flow.async_feedback.types import HumanFeedbackPending

from remit_check import CellResult, CheckEnv, Matrix, Scenario, harness
from remit_check.crewai import FRAMEWORK
from remit_check.crewai.flows import flows, kill_pipe
from remit_check.harness import Children, Layer, count, lines, quiet_children
from remit_core import ConsumeConflict, StateValidationError

WAIT = 60.0

# ========================================================================== child bodies


def kickoff(layer: Layer, d: str, name: str, inputs: dict[str, Any],
            conn: Connection | None = None) -> tuple[str, Any, dict[str, Any]]:
    """Kick a flow off (or again, with its id: the documented resume); report how it ended."""
    kill_pipe(conn)
    flow = flows(layer, d)[name]()
    try:
        result = flow.kickoff(inputs=inputs)
    except (StateValidationError, RuntimeError) as exc:
        return ("refused", type(exc).__name__, {})
    except ConsumeConflict as exc:
        return ("conflict", str(exc)[:80], {})
    except Exception as exc:
        return ("failed", type(exc).__name__, {})
    kind = "parked" if isinstance(result, HumanFeedbackPending) else "finished"
    return (kind, None if kind == "parked" else result, flow.state.model_dump())


def resume_feedback(layer: Layer, d: str, flow_id: str, value: str, barrier: Any = None,
                    results: Any = None, conn: Connection | None = None) -> str:
    """Load the parked flow, wait at the barrier, resume with ``value``."""
    kill_pipe(conn)
    cls = flows(layer, d)["review"]
    backend: Any = flows(layer, d)["backend"]
    try:
        flow = cls.from_pending(flow_id, backend)
    except Exception as exc:
        out = f"load {type(exc).__name__}"
    else:
        if barrier is not None:
            barrier.wait()
        try:
            flow.state.hang = "deliver" if conn is not None else ""
            flow.resume(value)
            out = "won"
        except ConsumeConflict:
            out = "conflict"
        except Exception as exc:
            out = f"error {type(exc).__name__}"
    if results is not None:
        results.put(out)
    return out


def stale_handles(layer: Layer, d: str, flow_id: str) -> list[str]:
    """Two handles loaded before either resumed, in one process; both resume."""
    cls = flows(layer, d)["review"]
    backend: Any = flows(layer, d)["backend"]
    handles = [cls.from_pending(flow_id, backend) for _ in range(2)]
    out = []
    for h, value in zip(handles, ("first", "second"), strict=True):
        try:
            h.resume(value)
            out.append("won")
        except ConsumeConflict:
            out.append("conflict")
        except Exception as exc:
            out.append(f"error {type(exc).__name__}")
    return out


def fork_flow(layer: Layer, d: str, source: str) -> tuple[str, dict[str, Any]]:
    made = flows(layer, d)
    flow = made["order"]()
    if made["durable"]:  # remit's fork, explicit (FI)
        from remit_crewai import fork

        fork(flow, source, {"value": 2})
    else:  # CrewAI's own fork: restore_from_state_id
        flow.kickoff(inputs={"value": 2}, restore_from_state_id=source)
    state = flow.state.model_dump()
    return str(state.pop("id")), state


# ============================================================================= the parent

CHILDREN = Children(__name__, WAIT)
quiet_children()
MATRIX = Matrix(FRAMEWORK)


def _crash_and_resume(env: CheckEnv, lay: Layer, name: str, point: str,
                      d: Path | None = None) -> tuple[Path, str, tuple[Any, ...]]:
    d = d or env.fresh_dir(point)
    ledger = d / "ledger"
    fid = env.new_id("order")
    CHILDREN.crash(kickoff, (lay, str(d), "order",
                             {"id": fid, "ledger": str(ledger), "hang": point}), point)
    got = CHILDREN.call(kickoff, (lay, str(d), "order", {"id": fid, "hang": ""}))
    return ledger, fid, got


def _park(env: CheckEnv, lay: Layer, d: Path) -> str:
    fid = env.new_id("review")
    got = CHILDREN.call(kickoff, (lay, str(d), "review", {"id": fid,
                                                          "ledger": str(d / "ledger")}))
    assert got[0] == "parked", got
    return fid


@MATRIX.scenario("kill-after-effect", "EO", "PC")
def kill_after_effect(env: CheckEnv, layer: str, factory: str) -> list[CellResult]:
    lay = env.layer(factory)
    charges = reruns = finished = 0
    for _ in range(env.reps):
        ledger, _, got = _crash_and_resume(env, lay, "order", "after-effect")
        entries = lines(ledger)
        charges += count(entries, "effect charge")
        reruns += count(entries, "enter begin") - 1
        finished += got[0] == "finished"
    n = env.reps
    return [
        MATRIX.cell(layer, "kill-after-effect", "EO", charges == n and finished == n,
                    {"effect_calls": charges, "finished": finished, "reps": n},
                    f"charge fired {charges} times in {n} reps; {finished} of {n} flows finished"),
        MATRIX.cell(layer, "kill-after-effect", "PC", reruns == 0 and finished == n,
                    {"completed_method_reruns": reruns, "reps": n},
                    f"completed methods ran again {reruns} times in {n} reps"),
    ]


@MATRIX.scenario("kill-after-effect", "LV")
def owner_dies(env: CheckEnv, layer: str, factory: str) -> list[CellResult]:
    """LV: the resume that won is SIGKILLed after its effect; kickoff(id) finishes it."""
    lay = env.layer(factory)
    finished = shipped = 0
    for d in env.rep_dirs("owner-dies"):
        fid = _park(env, lay, d)
        CHILDREN.crash(resume_feedback, (lay, str(d), fid, "claimed"), "deliver")
        got = CHILDREN.call(kickoff, (lay, str(d), "review", {"id": fid, "hang": ""}))
        finished += got[0] == "finished" and got[1] == "shipped claimed"
        shipped += count(lines(d / "ledger"), "effect ship")
    n = env.reps
    return [MATRIX.cell(layer, "kill-after-effect", "LV", finished == n and shipped == n,
                        {"finished_with_claimed_value": finished, "gated_effect_calls": shipped,
                         "reps": n},
                        f"a resume killed after its effect: finished with its value in {finished} "
                        f"of {n} reps; effect fired {shipped} times")]


@MATRIX.scenario("kill-between-steps", "PC")
def kill_between_steps(env: CheckEnv, layer: str, factory: str) -> list[CellResult]:
    lay = env.layer(factory)
    reruns = charges = finished = 0
    for _ in range(env.reps):
        ledger, _, got = _crash_and_resume(env, lay, "order", "between")
        entries = lines(ledger)
        reruns += count(entries, "enter begin") - 1 + count(entries, "enter pay") - 1
        charges += count(entries, "effect charge")
        finished += got[0] == "finished"
    n = env.reps
    return [MATRIX.cell(layer, "kill-between-steps", "PC", reruns == 0 and finished == n,
                        {"completed_method_reruns": reruns, "effect_calls": charges, "reps": n},
                        f"begin and pay ran again {reruns} times in {n} reps; charge fired "
                        f"{charges} times")]


@MATRIX.scenario("k-resumes", "CO-k")
def k_resumes(env: CheckEnv, layer: str, factory: str) -> list[CellResult]:
    lay = env.layer(factory)
    delivered = ran = 0
    for d in env.rep_dirs("k-resumes"):
        fid = _park(env, lay, d)
        outcomes = CHILDREN.race(resume_feedback,
                                 [(lay, str(d), fid, f"v{i}") for i in range(env.k)])
        ran += count(lines(d / "ledger"), "effect ship")
        delivered += outcomes.count("won")
    n = env.reps
    return [MATRIX.cell(layer, "k-resumes", "CO-k", ran == n and delivered == n,
                        {"gated_effect_calls": ran, "resumes_that_ran": delivered, "k": env.k,
                         "reps": n},
                        f"{env.k} racing resumes: gated effect fired {ran} times in {n} reps")]


@MATRIX.scenario("second-resume", "CO")
def second_resume(env: CheckEnv, layer: str, factory: str) -> list[CellResult]:
    lay = env.layer(factory)
    ran = 0
    for d in env.rep_dirs("second-resume"):
        fid = _park(env, lay, d)
        CHILDREN.call(stale_handles, (lay, str(d), fid))
        ran += count(lines(d / "ledger"), "effect ship")
    n = env.reps
    return [MATRIX.cell(layer, "second-resume", "CO", ran == n,
                        {"gated_effect_calls": ran, "reps": n},
                        f"two stale handles, both resumed: gated effect fired {ran} times in {n} "
                        "reps")]


@MATRIX.scenario("invalid-state", "CV")
def invalid_state(env: CheckEnv, layer: str, factory: str) -> list[CellResult]:
    lay = env.layer(factory)
    stored = stuck = 0
    for d in env.rep_dirs("invalid-state"):
        fid = env.new_id("cv")
        with CHILDREN.one() as pool:
            pool.apply(kickoff, (lay, str(d), "order",
                                 {"id": fid, "ledger": str(d / "ledger"), "value": "many"}))
            backend = flows(lay, str(d))["backend"]
            latest = backend.load_state(fid)
            stored += latest is not None and latest.get("count") == "many"
            again = pool.apply(kickoff, (lay, str(d), "order", {"id": fid, "value": 3}))
        stuck += again[0] != "finished"
    n = env.reps
    return [MATRIX.cell(layer, "invalid-state", "CV", stored == 0 and stuck == 0,
                        {"invalid_persisted": stored, "not_resumable_after": stuck, "reps": n},
                        f"count='many' stored in {stored} of {n} reps; flow not resumable "
                        f"afterwards in {stuck}")]


@MATRIX.scenario("fork-twice", "FI/FD")
def fork_twice(env: CheckEnv, layer: str, factory: str) -> list[CellResult]:
    lay = env.layer(factory)
    same = 0
    for d in env.rep_dirs("fork-twice"):
        source = env.new_id("source")
        with CHILDREN.one() as pool:
            pool.apply(kickoff, (lay, str(d), "order", {"id": source, "ledger": str(d / "ledger")}))
            a = pool.apply(fork_flow, (lay, str(d), source))
            b = pool.apply(fork_flow, (lay, str(d), source))
        same += a == b
    n = env.reps
    return [MATRIX.cell(layer, "fork-twice", "FI/FD", same == n, {"forks_equal": same, "reps": n},
                        f"two forks of one state had the same id and state in {same} of {n} reps")]


@MATRIX.scenario("recover-twice", "RD")
def recover_twice(env: CheckEnv, layer: str, factory: str) -> list[CellResult]:
    lay: Layer = (factory, None)  # copies need a file store: SQLite for remit

    def crash(d: Path) -> str:
        fid = env.new_id("rd")
        CHILDREN.crash(kickoff, (lay, str(d), "order", {"id": fid, "ledger": str(d / "ledger"),
                                                         "hang": "between"}), "between")
        return fid

    def recover(copy: Path, fid: str) -> Any:
        return CHILDREN.call(kickoff, (lay, str(copy), "order", {"id": fid, "hang": ""}))

    return harness.recover_twice(MATRIX, env, layer, crash=crash, recover=recover,
                                 finished=lambda got: bool(got[0] == "finished"),
                                 agreed="gave the same result and state")


def scenarios() -> list[Scenario]:
    return list(MATRIX.scenarios)
