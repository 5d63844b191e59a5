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
from remit_check.tally import Tally, scenario
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


def _order(lay: Layer, d: Path, fid: str, **inputs: Any) -> tuple[Any, ...]:
    """:func:`kickoff`'s arguments for a first kickoff of the order flow ``fid`` in ``d``,
    with ``d``'s ledger."""
    return (lay, str(d), "order", {"id": fid, "ledger": str(d / "ledger"), **inputs})


def _crash_and_resume(env: CheckEnv, lay: Layer, d: Path,
                      point: str) -> tuple[Path, str, tuple[Any, ...]]:
    fid = env.new_id("order")
    CHILDREN.crash(kickoff, _order(lay, d, fid, hang=point), point)
    got = CHILDREN.call(kickoff, (lay, str(d), "order", {"id": fid, "hang": ""}))
    return d / "ledger", fid, got


def _park(env: CheckEnv, lay: Layer, d: Path) -> str:
    fid = env.new_id("review")
    got = CHILDREN.call(kickoff, (lay, str(d), "review", {"id": fid,
                                                          "ledger": str(d / "ledger")}))
    assert got[0] == "parked", got
    return fid


@scenario(MATRIX, "kill-after-effect", "EO", "PC")
def kill_after_effect(t: Tally, lay: Layer) -> list[CellResult]:
    for d in t.dirs("after-effect"):
        ledger, _, got = _crash_and_resume(t.env, lay, d, "after-effect")
        entries = lines(ledger)
        t.add(effect_calls=count(entries, "effect charge"),
              completed_method_reruns=count(entries, "enter begin") - 1,
              finished=got[0] == "finished")
    all_finished = t["finished"] == t.n
    return [
        t.cell("EO", t["effect_calls"] == t.n and all_finished, ["effect_calls", "finished"],
               "charge fired {effect_calls} times in {reps} reps; {finished} of {reps} flows "
               "finished"),
        t.cell("PC", t["completed_method_reruns"] == 0 and all_finished,
               ["completed_method_reruns"],
               "completed methods ran again {completed_method_reruns} times in {reps} reps"),
    ]


@scenario(MATRIX, "kill-after-effect", "LV")
def owner_dies(t: Tally, lay: Layer) -> list[CellResult]:
    """LV: the resume that won is SIGKILLed after its effect; kickoff(id) finishes it."""
    for d in t.dirs("owner-dies"):
        fid = _park(t.env, lay, d)
        CHILDREN.crash(resume_feedback, (lay, str(d), fid, "claimed"), "deliver")
        got = CHILDREN.call(kickoff, (lay, str(d), "review", {"id": fid, "hang": ""}))
        t.add(finished_with_claimed_value=got[0] == "finished" and got[1] == "shipped claimed",
              gated_effect_calls=count(lines(d / "ledger"), "effect ship"))
    return [t.cell("LV", t["finished_with_claimed_value"] == t["gated_effect_calls"] == t.n,
                   ["finished_with_claimed_value", "gated_effect_calls"],
                   "a resume killed after its effect: finished with its value in "
                   "{finished_with_claimed_value} of {reps} reps; effect fired "
                   "{gated_effect_calls} times")]


@scenario(MATRIX, "kill-between-steps", "PC")
def kill_between_steps(t: Tally, lay: Layer) -> list[CellResult]:
    for d in t.dirs("between"):
        ledger, _, got = _crash_and_resume(t.env, lay, d, "between")
        entries = lines(ledger)
        t.add(completed_method_reruns=count(entries, "enter begin") - 1
              + count(entries, "enter pay") - 1,
              effect_calls=count(entries, "effect charge"), finished=got[0] == "finished")
    return [t.cell("PC", t["completed_method_reruns"] == 0 and t["finished"] == t.n,
                   ["completed_method_reruns", "effect_calls"],
                   "begin and pay ran again {completed_method_reruns} times in {reps} reps; "
                   "charge fired {effect_calls} times")]


@scenario(MATRIX, "k-resumes", "CO-k")
def k_resumes(t: Tally, lay: Layer) -> list[CellResult]:
    for d in t.dirs():
        fid = _park(t.env, lay, d)
        outcomes = CHILDREN.race(resume_feedback,
                                 [(lay, str(d), fid, f"v{i}") for i in range(t.env.k)])
        t.add(gated_effect_calls=count(lines(d / "ledger"), "effect ship"),
              resumes_that_ran=outcomes.count("won"))
    return [t.cell("CO-k", t["gated_effect_calls"] == t["resumes_that_ran"] == t.n,
                   ["gated_effect_calls", "resumes_that_ran", "k"],
                   "{k} racing resumes: gated effect fired {gated_effect_calls} times in {reps} "
                   "reps")]


@scenario(MATRIX, "second-resume", "CO")
def second_resume(t: Tally, lay: Layer) -> list[CellResult]:
    for d in t.dirs():
        CHILDREN.call(stale_handles, (lay, str(d), _park(t.env, lay, d)))
        t.add(gated_effect_calls=count(lines(d / "ledger"), "effect ship"))
    return [t.cell("CO", t["gated_effect_calls"] == t.n, ["gated_effect_calls"],
                   "two stale handles, both resumed: gated effect fired {gated_effect_calls} "
                   "times in {reps} reps")]


@scenario(MATRIX, "invalid-state", "CV")
def invalid_state(t: Tally, lay: Layer) -> list[CellResult]:
    for d in t.dirs():
        fid = t.env.new_id("cv")
        with CHILDREN.one() as pool:
            pool.apply(kickoff, _order(lay, d, fid, value="many"))
            latest = flows(lay, str(d))["backend"].load_state(fid)
            again = pool.apply(kickoff, (lay, str(d), "order", {"id": fid, "value": 3}))
        t.add(invalid_persisted=latest is not None and latest.get("count") == "many",
              not_resumable_after=again[0] != "finished")
    return [t.cell("CV", t["invalid_persisted"] == t["not_resumable_after"] == 0,
                   ["invalid_persisted", "not_resumable_after"],
                   "count='many' stored in {invalid_persisted} of {reps} reps; flow not "
                   "resumable afterwards in {not_resumable_after}")]


@scenario(MATRIX, "fork-twice", "FI/FD")
def fork_twice(t: Tally, lay: Layer) -> list[CellResult]:
    for d in t.dirs():
        source = t.env.new_id("source")
        with CHILDREN.one() as pool:
            pool.apply(kickoff, _order(lay, d, source))
            forks = [pool.apply(fork_flow, (lay, str(d), source)) for _ in range(2)]
        t.add(forks_equal=forks[0] == forks[1])
    return [t.cell("FI/FD", t["forks_equal"] == t.n, ["forks_equal"],
                   "two forks of one state had the same id and state in {forks_equal} of {reps} "
                   "reps")]


@scenario(MATRIX, "recover-twice", "RD")
def recover_twice(t: Tally, lay: Layer) -> list[CellResult]:
    def crash(files: Layer, d: Path) -> str:
        fid = t.env.new_id("rd")
        CHILDREN.crash(kickoff, _order(files, d, fid, hang="between"), "between")
        return fid

    def recover(files: Layer, copy: Path, fid: str) -> Any:
        return CHILDREN.call(kickoff, (files, str(copy), "order", {"id": fid, "hang": ""}))

    return harness.recover_twice(t, lay, crash=crash, recover=recover,
                                 finished=lambda got: bool(got[0] == "finished"),
                                 agreed="gave the same result and state")


def scenarios() -> list[Scenario]:
    return list(MATRIX.scenarios)
