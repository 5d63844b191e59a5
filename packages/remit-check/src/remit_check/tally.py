"""A scenario's repetitions added up, and the cells made of the sums.

Every framework's scenarios run their fault point ``reps`` times, add up what each rep
saw and make one cell per property of the sums: whether it holds, the counts it shows
and a one-line summary of them. :class:`Tally` is that part, the same for every
framework, so that a scenario says only what one rep does and what its cells claim.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from remit_check import CellResult, CheckEnv, Matrix


class Tally:
    """The sums of one scenario on one layer over its reps, and its cells::

        @scenario(MATRIX, "fork-twice", "FI/FD")
        def fork_twice(t: Tally, lay: Layer) -> list[CellResult]:
            for d in t.dirs():
                ...
                t.add(forks_equal=a == b)
            return [t.cell("FI/FD", t["forks_equal"] == t.n, ["forks_equal"],
                           "two forks were the same in {forks_equal} of {reps} reps")]

    A cell shows the counts it names, then ``reps``; its summary is a template over the
    same names (``str.format``), so a number the summary says is the count of that name
    and cannot drift apart from it.
    """

    def __init__(self, matrix: Matrix, env: CheckEnv, layer: str, fault: str) -> None:
        self.matrix = matrix
        self.env = env
        self.layer = layer
        self.fault = fault
        #: what the reps saw, added up by name (a name no rep added reads as 0)
        self.sums: dict[str, int] = {}
        #: why a rep went wrong, one line each: the cells' detail unless they are given one
        self.notes: list[str] = []

    @property
    def n(self) -> int:
        """How many reps the scenario runs."""
        return self.env.reps

    def dirs(self, name: str = "") -> Iterator[Path]:
        """A fresh directory per rep, named after the fault point (or ``name``)."""
        return self.env.rep_dirs(name or self.fault)

    def add(self, **seen: int) -> None:
        """Add what one rep saw to the sums (a bool adds 1 when true)."""
        for name, value in seen.items():
            self.sums[name] = self[name] + value

    def __getitem__(self, name: str) -> int:
        return self.sums.get(name, 0)

    def cell(self, prop: str, ok: bool, shows: Sequence[str], summary: str,
             detail: str | None = None, **more: Any) -> CellResult:
        """The cell of ``prop``; it holds when ``ok``. Its counts are the values named in
        ``shows`` (sums, ``k``, or the call's ``more``), then ``reps``; ``summary`` is
        formatted with all of them. ``detail``: the notes, unless given."""
        values: defaultdict[str, Any] = defaultdict(int, {"k": self.env.k, **self.sums, **more,
                                                          "reps": self.n})
        counts = {name: values[name] for name in (*shows, "reps")}
        text = summary.format_map(values)
        return self.matrix.cell(self.layer, self.fault, prop, ok, counts, text,
                                "\n".join(self.notes) if detail is None else detail)


TallyRun = Callable[[Tally, tuple[str, str | None]], list[CellResult]]
"""``run(tally, layer)``: a scenario's cells, from its :class:`Tally` and the layer as it
travels to a child (:meth:`CheckEnv.layer`)."""


def scenario(matrix: Matrix, fault: str, *properties: str) -> Callable[[TallyRun], TallyRun]:
    """:meth:`Matrix.scenario` for a run written against a :class:`Tally`: it is called
    with a fresh tally of its fault point on the layer, so the fault point is named once,
    and with the layer as a child opens it."""

    def declare(run: TallyRun) -> TallyRun:
        def on_layer(env: CheckEnv, layer: str, factory: str) -> list[CellResult]:
            return run(Tally(matrix, env, layer, fault), env.layer(factory))

        matrix.scenario(fault, *properties)(on_layer)
        return run

    return declare
