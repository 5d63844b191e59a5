"""Exhaustive explicit-state check of the resume contract (DESIGN.md section 2).

An abstract model of one run, after the TLA+ module described in
``research/anchors.md`` section 1.2, explored by a plain breadth-first search:

* a workflow of ``ntasks`` sequential tasks, each with one non-idempotent external
  effect (``effects[t]`` counts how often it really fired);
* task ``ip`` is interrupt-gated: the run parks (``waiting``) and the gated effect
  fires only when a human resume value is consumed;
* completing a task appends a checkpoint record ``(idx, valid)`` to ``ckpts`` and
  advances the durable ``frontier``.

Actions: ``ExecTask``, ``EmitInterrupt``, ``Consume(v)``, ``ForkResume(v)``,
``CrashRecover``, ``ExtraResume`` and ``PersistInvalid`` (a task's output violates
the schema and the adapter tries to write it as the completion record).

Properties checked (one function each below): the six safety invariants EO, PC, FD,
CV, CO, RD, and the progress obligation LV, checked as "from every reachable state
a completed state is reachable" by backward reachability over the explored graph.

Fault switches (``Config.fault``) reproduce the six violation classes of section
1.3; with no switch the model is the reference semantics and all seven properties
hold. The seventh switch ``refuse-all`` refuses every resume and every recovery: it
keeps the six safety invariants (vacuously) and breaks LV, which shows LV is not
vacuous.

Depths: ``Counterexample.depth`` is the BFS level of the first violating state, i.e.
the number of actions from Init. TLC counts the initial state as depth 1, so the
``dN`` of the section 1.3 table is ``depth + 1`` (``Counterexample.tlc_depth``);
the printed matrix uses TLC's convention so it can be read against that table.

Run ``python -m tests.model.contract_model`` for the matrix.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final, NamedTuple

# ----------------------------------------------------------------------------- names

NO_VAL: Final = 0
"""``consumedVal`` before any resume value was consumed (values are positive ints)."""

SAFETY: Final = ("EO", "PC", "FD", "CV", "CO", "RD")
PROPERTIES: Final = (*SAFETY, "LV")

REPLAY: Final = "replay"
FORK_IGNORE: Final = "forkignore"
INVALID_PERSIST: Final = "invalidpersist"
NONDET_REC: Final = "nondetrec"
DOUBLE_CONSUME: Final = "doubleconsume"
PREFIX_REPLAY: Final = "prefixreplay"
REFUSE_ALL: Final = "refuse-all"

FAULTS: Final = (REPLAY, FORK_IGNORE, INVALID_PERSIST, NONDET_REC, DOUBLE_CONSUME, PREFIX_REPLAY)
"""The six fault switches of anchors.md section 1.3, in the table's row order."""

SWITCHES: Final = (*FAULTS, REFUSE_ALL)


@dataclass(frozen=True)
class Config:
    """Model constants and at most one fault switch (``None`` = reference semantics)."""

    ntasks: int = 3
    ip: int = 2
    values: tuple[int, ...] = (1, 2)
    max_resumes: int = 3
    """Resumes addressed to the interrupt checkpoint: the first Consume plus <= 2 forks."""
    max_crashes: int = 2
    max_extra_resumes: int = 1
    max_invalid_writes: int = 1
    fault: str | None = None

    def __post_init__(self) -> None:
        if self.fault is not None and self.fault not in SWITCHES:
            raise ValueError(f"unknown fault switch {self.fault!r}; known: {SWITCHES}")
        if not 2 <= self.ip <= self.ntasks:
            raise ValueError("ip must be in 2..ntasks")
        if NO_VAL in self.values:
            raise ValueError(f"{NO_VAL} is reserved for 'no value consumed'")

    @property
    def done_pc(self) -> int:
        """``pc`` of a completed run (``NTasks + 1``)."""
        return self.ntasks + 1


class State(NamedTuple):
    """One state of the model; field names follow the TLA+ variables."""

    pc: int
    """Next task to run on the primary branch, 1..ntasks+1 (ntasks+1 = completed)."""
    effects: tuple[int, ...]
    """``effects[t-1]``: how many times task t's external effect really fired."""
    ckpts: tuple[tuple[int, bool], ...]
    """Durable log of completion records ``(task index, schema-valid)``."""
    frontier: int
    """Highest task index with a durable completion record (0 = none)."""
    waiting: bool
    """The interrupt of task ``ip`` is emitted and not yet consumed (the run is parked)."""
    consumed_val: int
    """Resume value consumed on the primary branch, or ``NO_VAL``."""
    fork_vals: tuple[int, ...]
    """Values supplied by the resumes addressed to the interrupt checkpoint."""
    fork_outs: tuple[int, ...]
    """The value each of those resumes actually observed."""
    crashes: int
    rec_hist: tuple[tuple[int, str], ...]
    """Recovery history: ``(durable state = frontier, decision)`` per crash recovery."""
    extra_resumes: int
    """Stray resumes delivered after the run completed."""
    pc_regress: bool
    """Set once a task runs again although its completion was already durable."""
    invalid_writes: int
    """Attempts to persist a schema-invalid completion record."""
    halted: bool
    """Recovery was refused (only under ``refuse-all``): the run can never go on."""


def initial_state(cfg: Config) -> State:
    """Init: nothing ran, nothing is durable."""
    return State(
        pc=1,
        effects=(0,) * cfg.ntasks,
        ckpts=(),
        frontier=0,
        waiting=False,
        consumed_val=NO_VAL,
        fork_vals=(),
        fork_outs=(),
        crashes=0,
        rec_hist=(),
        extra_resumes=0,
        pc_regress=False,
        invalid_writes=0,
        halted=False,
    )


def _fire(effects: tuple[int, ...], task: int) -> tuple[int, ...]:
    """One more real execution of ``task``'s external effect."""
    return (*effects[: task - 1], effects[task - 1] + 1, *effects[task:])


# --------------------------------------------------------------------------- actions


def successors(s: State, cfg: Config) -> Iterator[tuple[str, State]]:
    """All ``(action label, next state)`` pairs enabled in ``s``.

    Labels are unique per state, so a trace (a list of labels) replays exactly.
    A refused request (a resume under ``refuse-all``, a stray resume rejected with
    ``ConsumeConflict``) changes no model variable except the bounded counters noted.
    """
    n, ip, fault = cfg.ntasks, cfg.ip, cfg.fault
    if s.halted:
        return

    # Shared guard for running task pc: not parked, and the gated task only after
    # its resume value was consumed (IP's first run happens inside Consume).
    task_runnable = (
        1 <= s.pc <= n and not s.waiting and (s.pc != ip or s.consumed_val != NO_VAL)
    )

    # ExecTask: run task pc, write its completion record, advance the frontier.
    if task_runnable:
        # PC: re-entering the durable prefix (pc <= frontier) is the regression.
        # prefixreplay serves the gated effect from its durable record (no re-fire),
        # which is why that switch keeps CO while breaking EO and PC.
        served = fault == PREFIX_REPLAY and s.pc == ip
        yield f"ExecTask({s.pc})", s._replace(
            effects=s.effects if served else _fire(s.effects, s.pc),
            ckpts=(*s.ckpts, (s.pc, True)),
            frontier=max(s.frontier, s.pc),
            pc_regress=s.pc_regress or s.pc <= s.frontier,
            pc=s.pc + 1,
        )

    # PersistInvalid (CV): the last task's output violates the schema. As in the TLA+
    # model, the invalid output is the final task's. Reference: the write raises
    # StateValidationError, nothing is persisted, the last valid checkpoint stays the
    # latest and the task can still complete with valid state (ExecTask stays enabled);
    # no effect is counted, since the validation gate precedes it (or, equivalently,
    # the task's retry replays the effect from its receipt). invalidpersist: the
    # record is persisted silently and the run goes on as if it were valid.
    if task_runnable and s.pc == n and s.invalid_writes < cfg.max_invalid_writes:
        if fault == INVALID_PERSIST:
            yield "PersistInvalid", s._replace(
                effects=_fire(s.effects, s.pc),
                ckpts=(*s.ckpts, (s.pc, False)),
                frontier=max(s.frontier, s.pc),
                pc_regress=s.pc_regress or s.pc <= s.frontier,
                pc=s.pc + 1,
                invalid_writes=s.invalid_writes + 1,
            )
        else:
            yield "PersistInvalid", s._replace(invalid_writes=s.invalid_writes + 1)

    # EmitInterrupt: reaching the gated task parks the run.
    if s.pc == ip and not s.waiting and s.consumed_val == NO_VAL:
        yield "EmitInterrupt", s._replace(waiting=True)

    # Consume(v): the first resume consumes the interrupt and fires the gated effect
    # once (CO), recording that the branch saw v (FD). refuse-all refuses it.
    if s.waiting and len(s.fork_vals) < cfg.max_resumes and fault != REFUSE_ALL:
        for v in cfg.values:
            yield f"Consume({v})", s._replace(
                waiting=False,
                consumed_val=v,
                effects=_fire(s.effects, ip),
                ckpts=(*s.ckpts, (ip, True)),
                frontier=max(s.frontier, ip),
                pc=ip + 1,
                fork_vals=(*s.fork_vals, v),
                fork_outs=(*s.fork_outs, v),
            )

    # ForkResume(v): a further resume explicitly addressed to the interrupt checkpoint
    # (FI: fork intent is on the request) forks, and the fork must see its own value
    # (FD). forkignore serves the first resume's value instead (LangGraph #6663).
    if s.consumed_val != NO_VAL and len(s.fork_vals) < cfg.max_resumes and fault != REFUSE_ALL:
        for v in cfg.values:
            out = s.fork_outs[0] if fault == FORK_IGNORE else v
            yield f"ForkResume({v})", s._replace(
                fork_vals=(*s.fork_vals, v), fork_outs=(*s.fork_outs, out)
            )

    # CrashRecover: a crash strictly inside the run, then recovery. Reference: continue
    # at frontier + 1 ("skip" completed work; PC, EO) -- the same decision for the same
    # durable state every time (RD).
    if s.crashes < cfg.max_crashes and 2 <= s.pc <= n and not s.waiting:
        crashed = s._replace(crashes=s.crashes + 1)
        options: list[tuple[str, int]]
        if fault in (REPLAY, PREFIX_REPLAY):
            options = [(fault, 1)]  # restart at task 1 over the restored state
        elif fault == NONDET_REC:
            # Skip vs re-execute the frontier task is unconstrained at equal state (#8039).
            options = [("skip", s.frontier + 1), ("reexec", s.frontier)]
        elif fault == REFUSE_ALL:
            options = [("refuse", s.pc)]  # recovery refused: the run stays dead
        else:
            options = [("skip", s.frontier + 1)]
        for decision, pc in options:
            yield f"CrashRecover({decision})", crashed._replace(
                pc=pc,
                rec_hist=(*s.rec_hist, (s.frontier, decision)),
                halted=decision == "refuse",
            )

    # ExtraResume: a stray resume on a completed run must be inert (raises
    # ConsumeConflict); doubleconsume re-fires the gated effect (CO, EO).
    if s.pc == cfg.done_pc and s.extra_resumes < cfg.max_extra_resumes and fault != REFUSE_ALL:
        yield "ExtraResume", s._replace(
            extra_resumes=s.extra_resumes + 1,
            effects=_fire(s.effects, ip) if fault == DOUBLE_CONSUME else s.effects,
        )


# ------------------------------------------------------------------------ invariants


def effect_exactly_once(s: State, cfg: Config) -> bool:
    """EO: every task's external effect fired at most once (``effects[t] <= 1``)."""
    return all(count <= 1 for count in s.effects)


def prefix_consistency(s: State, cfg: Config) -> bool:
    """PC: no task whose completion was durable ever ran again (``~pcRegress``)."""
    return not s.pc_regress


def fork_determinism(s: State, cfg: Config) -> bool:
    """FD: each resume at the interrupt checkpoint observed its own value."""
    return all(out == val for out, val in zip(s.fork_outs, s.fork_vals, strict=True))


def checkpoint_validity(s: State, cfg: Config) -> bool:
    """CV: every persisted completion record is schema-valid."""
    return all(valid for _idx, valid in s.ckpts)


def consume_once(s: State, cfg: Config) -> bool:
    """CO: the interrupt-gated effect fired at most once (``effects[IP] <= 1``)."""
    return s.effects[cfg.ip - 1] <= 1


def recovery_determinism(s: State, cfg: Config) -> bool:
    """RD: recoveries from equal durable state (the frontier) made equal decisions."""
    first_decision: dict[int, str] = {}
    return all(first_decision.setdefault(dur, dec) == dec for dur, dec in s.rec_hist)


INVARIANTS: Final[dict[str, Callable[[State, Config], bool]]] = {
    "EO": effect_exactly_once,
    "PC": prefix_consistency,
    "FD": fork_determinism,
    "CV": checkpoint_validity,
    "CO": consume_once,
    "RD": recovery_determinism,
}


def completed(s: State, cfg: Config) -> bool:
    """The LV goal: the run finished (``pc = NTasks + 1``). No action leaves it."""
    return s.pc == cfg.done_pc


def completion_reachable(s: State, cfg: Config) -> bool:
    """LV at one state: some path from ``s`` reaches a completed state."""
    seen = {s}
    frontier = deque([s])
    while frontier:
        cur = frontier.popleft()
        if completed(cur, cfg):
            return True
        for _label, nxt in successors(cur, cfg):
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    return False


def holds(prop: str, s: State, cfg: Config) -> bool:
    """Whether property ``prop`` holds at state ``s`` (LV: completion still reachable)."""
    if prop == "LV":
        return completion_reachable(s, cfg)
    return INVARIANTS[prop](s, cfg)


# ------------------------------------------------------------------------------- BFS


@dataclass(frozen=True)
class Counterexample:
    """The shortest path from Init to the first state that violates ``prop``."""

    prop: str
    trace: tuple[str, ...]
    state: State

    @property
    def depth(self) -> int:
        """BFS level of the violating state (actions from Init)."""
        return len(self.trace)

    @property
    def tlc_depth(self) -> int:
        """The same depth as TLC reports it (Init is depth 1), as in the 1.3 table."""
        return len(self.trace) + 1


@dataclass
class Result:
    """Outcome of one exhaustive exploration."""

    config: Config
    states: int = 0
    transitions: int = 0
    max_depth: int = 0
    acyclic: bool = True
    """No cycle in the state graph: with completion absorbing, "every state can still
    complete" then equals TLA+'s ``WF_vars(Next) => <>(pc = NTasks + 1)``."""
    counterexamples: dict[str, Counterexample] = field(default_factory=dict)

    @property
    def violated(self) -> frozenset[str]:
        return frozenset(self.counterexamples)


def explore(cfg: Config) -> Result:
    """BFS over every reachable state; record the shallowest violation of each property.

    States are discovered level by level, so the first state found violating a safety
    invariant is at minimal depth and its parent chain is a shortest trace. LV is
    checked afterwards: states that cannot reach a completed state are found by
    backward reachability from the completed states over the explored edges; the
    reported witness is a shortest trace to a dead end among them.
    """
    init = initial_state(cfg)
    parent: dict[State, tuple[State, str] | None] = {init: None}
    depth: dict[State, int] = {init: 0}
    order: list[State] = [init]  # discovery (BFS) order
    preds: dict[State, list[State]] = {init: []}
    out_degree: dict[State, int] = {}
    result = Result(config=cfg)

    def trace_to(s: State) -> tuple[str, ...]:
        labels: list[str] = []
        link = parent[s]
        while link is not None:
            prev, label = link
            labels.append(label)
            link = parent[prev]
        return tuple(reversed(labels))

    def check(s: State) -> None:
        for prop, inv in INVARIANTS.items():
            if prop not in result.counterexamples and not inv(s, cfg):
                result.counterexamples[prop] = Counterexample(prop, trace_to(s), s)

    check(init)
    queue = deque([init])
    while queue:
        s = queue.popleft()
        out_degree[s] = 0
        for label, nxt in successors(s, cfg):
            result.transitions += 1
            out_degree[s] += 1
            if nxt not in parent:
                parent[nxt] = (s, label)
                depth[nxt] = depth[s] + 1
                order.append(nxt)
                preds[nxt] = []
                check(nxt)
                queue.append(nxt)
            preds[nxt].append(s)

    result.states = len(order)
    result.max_depth = max(depth.values())

    # LV: backward reachability from the completed states.
    can_complete = {s for s in order if completed(s, cfg)}
    back = deque(can_complete)
    while back:
        s = back.popleft()
        for p in preds[s]:
            if p not in can_complete:
                can_complete.add(p)
                back.append(p)
    stuck = [s for s in order if s not in can_complete]  # BFS order: shallowest first
    if stuck:
        # The witness is the shallowest dead end that never completed: a maximal
        # behaviour that stops short of completion, i.e. what violates TLA+'s
        # WF_vars(Next) => <>(pc = NTasks + 1). (Every stuck state leads to one when
        # the graph is acyclic; otherwise fall back to the shallowest stuck state.)
        dead = next((s for s in stuck if out_degree[s] == 0), stuck[0])
        result.counterexamples["LV"] = Counterexample("LV", trace_to(dead), dead)
    # Keep the report in the fixed property order.
    result.counterexamples = {
        p: result.counterexamples[p] for p in PROPERTIES if p in result.counterexamples
    }

    # Acyclicity (Kahn): repeatedly remove states with no remaining successor edges.
    remaining = dict(out_degree)
    sinks = deque(s for s, d in remaining.items() if d == 0)
    removed = 0
    while sinks:
        s = sinks.popleft()
        removed += 1
        for p in preds[s]:
            remaining[p] -= 1
            if remaining[p] == 0:
                sinks.append(p)
    result.acyclic = removed == len(order)
    return result


def replay(trace: Sequence[str], cfg: Config) -> State:
    """Apply a trace of action labels from Init; raise if an action is not enabled."""
    s = initial_state(cfg)
    for label in trace:
        enabled = dict(successors(s, cfg))
        if label not in enabled:
            raise ValueError(f"{label!r} is not enabled in {s}; enabled: {sorted(enabled)}")
        s = enabled[label]
    return s


# ------------------------------------------------------------------------ the matrix


def run_matrix(base: Config | None = None) -> dict[str, Result]:
    """Explore the reference and every switch (six faults plus refuse-all)."""
    base = base or Config()
    rows: dict[str, Result] = {}
    for fault in (None, *SWITCHES):
        cfg = Config(
            ntasks=base.ntasks,
            ip=base.ip,
            values=base.values,
            max_resumes=base.max_resumes,
            max_crashes=base.max_crashes,
            max_extra_resumes=base.max_extra_resumes,
            max_invalid_writes=base.max_invalid_writes,
            fault=fault,
        )
        rows[fault or "reference"] = explore(cfg)
    return rows


def format_matrix(rows: dict[str, Result]) -> str:
    """The section 1.3 table plus LV, distinct-state counts and the traces."""
    width = 9
    header = ["fault".ljust(15), *(p.ljust(width) for p in PROPERTIES), "states", "depth"]
    lines = [" ".join(header).rstrip()]
    for name, res in rows.items():
        cells = []
        for prop in PROPERTIES:
            cex = res.counterexamples.get(prop)
            cells.append((f"VIOL d{cex.tlc_depth}" if cex else "holds").ljust(width))
        lines.append(
            " ".join([name.ljust(15), *cells, str(res.states).rjust(6), str(res.max_depth).rjust(5)])
        )
    cfg = next(iter(rows.values())).config
    lines += [
        "",
        f"NTasks={cfg.ntasks} IP={cfg.ip} Values={set(cfg.values)} resumes<={cfg.max_resumes} "
        f"crashes<={cfg.max_crashes} extra resumes<={cfg.max_extra_resumes} "
        f"invalid writes<={cfg.max_invalid_writes}",
        "dN = TLC depth of the shortest counterexample (states incl. Init = actions + 1);",
        "states = distinct reachable states; depth = BFS levels (actions) of the deepest state.",
        "",
        "Counterexample traces:",
    ]
    for name, res in rows.items():
        for prop, cex in res.counterexamples.items():
            lines.append(f"  {name:<15} {prop}: {' -> '.join(cex.trace)}")
    return "\n".join(lines)


def main() -> int:
    """Print the matrix; exit 1 if the reference breaks any property."""
    rows = run_matrix()
    print(format_matrix(rows))
    return 1 if rows["reference"].violated else 0


if __name__ == "__main__":
    sys.exit(main())
