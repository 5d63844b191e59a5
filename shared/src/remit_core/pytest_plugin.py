"""pytest plugin: check a LangGraph checkpointer against the resume contract.

Loaded by pytest through remit-core's ``pytest11`` entry point. Without
``--remit-contract`` it adds no test and imports no framework::

    pytest --remit-contract=myapp.persistence:make_saver

adds one test per fault point and property of ``remit check`` for LangGraph
(``remit_langgraph.check``), run on the layer ``custom`` built by that factory.
The factory keeps the contract documented in ``remit_langgraph.check``:
``factory(directory: str)`` returns a ``BaseCheckpointSaver`` (or a context
manager yielding one) that opens the same durable store every time it is
called with the same directory, in any process. A test fails with the cell's
summary and raw counts when its property does not hold.

Options: ``--remit-contract-k`` (concurrent resumers, default 4) and
``--remit-contract-reps`` (repetitions per cell, default 1); select cells with
``-k``, e.g. ``-k "k-resumes or CV"``.

Fixtures, for tests that drive the scenarios themselves:

* ``remit_check_env``: a :class:`~remit_core.check.CheckEnv` with a fresh work
  directory, and ``k`` and ``reps`` from the options above;
* ``remit_contract_factory``: the ``--remit-contract`` factory spec (the test is
  skipped when the option was not given).
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from remit_core.check import STORE_ENV, CellResult, CheckEnv, Scenario, load_factory

CHECK_MODULE = "remit_langgraph.check"
LAYER = "custom"


@dataclass
class _Contract:
    """The session's contract run: the factory, the adapter's check module, the cells."""

    spec: str
    module: ModuleType
    k: int
    reps: int
    workdir: Path
    cells: dict[str, list[CellResult] | BaseException] = field(default_factory=dict)

    def run(self, scenario: Scenario) -> list[CellResult]:
        """The scenario's cells on the custom layer, run once for all its properties."""
        if scenario.fault not in self.cells:
            env = CheckEnv(workdir=self.workdir / scenario.fault, k=self.k, reps=self.reps,
                           store_url=os.environ.get(STORE_ENV))
            env.workdir.mkdir(parents=True, exist_ok=True)
            try:
                self.cells[scenario.fault] = scenario.run(env, LAYER, self.spec)
            except Exception as exc:
                self.cells[scenario.fault] = exc
        got = self.cells[scenario.fault]
        if isinstance(got, BaseException):
            raise ContractError(
                f"{scenario.fault} could not run on {self.spec}: {type(got).__name__}: {got}\n"
                + "".join(traceback.format_exception(got)))
        return got


_KEY = pytest.StashKey[_Contract]()


class ContractError(Exception):
    """A cell that does not hold, or a scenario that could not run."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("remit", "remit: the resume contract")
    group.addoption(
        "--remit-contract", metavar="MODULE:FACTORY", default=None,
        help="check a LangGraph checkpointer against the resume contract: one test per "
             "fault point and property of `remit check`, on the saver that "
             "MODULE:FACTORY(directory) returns (see remit_langgraph.check)")
    group.addoption("--remit-contract-k", metavar="K", type=int, default=4,
                    help="concurrent resumers for --remit-contract (default 4)")
    group.addoption("--remit-contract-reps", metavar="N", type=int, default=1,
                    help="repetitions per cell for --remit-contract (default 1)")


def pytest_configure(config: pytest.Config) -> None:
    spec = config.getoption("remit_contract", None)
    if not spec:
        return
    module_name, _, name = str(spec).partition(":")
    if not module_name or not name:
        raise pytest.UsageError(
            f"--remit-contract={spec}: name a factory as MODULE:FUNCTION, "
            "e.g. --remit-contract=myapp.persistence:make_saver")
    try:
        check = importlib.import_module(CHECK_MODULE)
    except ImportError as exc:
        raise pytest.UsageError(
            "--remit-contract checks a LangGraph checkpointer and needs remit-langgraph "
            f"(pip install remit-langgraph): {exc}") from exc
    try:
        load_factory(str(spec))
    except (ImportError, AttributeError) as exc:
        raise pytest.UsageError(f"--remit-contract={spec}: cannot load the factory: "
                                f"{type(exc).__name__}: {exc}") from exc
    k = int(config.getoption("remit_contract_k"))
    reps = int(config.getoption("remit_contract_reps"))
    if k < 2 or reps < 1:
        raise pytest.UsageError("--remit-contract-k must be at least 2 and "
                                "--remit-contract-reps at least 1")
    workdir = Path(tempfile.mkdtemp(prefix="remit-contract-"))
    config.stash[_KEY] = _Contract(str(spec), check, k, reps, workdir)


def pytest_unconfigure(config: pytest.Config) -> None:
    contract = config.stash.get(_KEY, None)
    if contract is not None and not os.environ.get("REMIT_CHECK_KEEP"):
        shutil.rmtree(contract.workdir, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)  # before -k and -m deselect
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    contract = config.stash.get(_KEY, None)
    if contract is None:
        return
    collector = ContractCollector.from_parent(session, name="remit-contract",
                                              nodeid="remit-contract")
    mine = collector.collect()
    # reported like any collected node, so that the terminal counts these tests too
    config.hook.pytest_collectreport(
        report=pytest.CollectReport(collector.nodeid, "passed", None, list(mine)))
    items.extend(mine)


class ContractCollector(pytest.Collector):
    """The contract's tests: one per scenario and property."""

    def collect(self) -> list[pytest.Item]:
        contract = self.config.stash[_KEY]
        items: list[pytest.Item] = []
        for scenario in contract.module.scenarios():
            for prop in scenario.properties:
                items.append(ContractItem.from_parent(
                    self, name=f"{scenario.fault}[{prop.replace('/', '-')}]",
                    scenario=scenario, prop=prop))
        return items


class ContractItem(pytest.Item):
    """One cell: a property of one fault point, on the --remit-contract factory."""

    def __init__(self, *, scenario: Scenario, prop: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scenario = scenario
        self.prop = prop

    def runtest(self) -> None:
        contract = self.config.stash[_KEY]
        cells = contract.run(self.scenario)
        mine = [c for c in cells if c.property == self.prop]
        if not mine:
            raise ContractError(f"{self.scenario.fault} reported no {self.prop} cell")
        for cell in mine:
            if not cell.holds:
                counts = ", ".join(f"{k}={v}" for k, v in cell.counts.items())
                raise ContractError(
                    f"{self.prop} {cell.verdict} at {self.scenario.fault} on {contract.spec}: "
                    f"{cell.summary} [{counts}]" + (f"\n{cell.detail}" if cell.detail else ""))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: Any = None) -> Any:
        if isinstance(excinfo.value, ContractError):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"remit contract: {self.scenario.fault} {self.prop}"


# ================================================================================ fixtures


@pytest.fixture
def remit_check_env(tmp_path: Path, request: pytest.FixtureRequest) -> CheckEnv:
    """A :class:`~remit_core.check.CheckEnv` for running contract scenarios in a test."""
    workdir = tmp_path / "remit-check"
    workdir.mkdir()
    return CheckEnv(workdir=workdir, k=int(request.config.getoption("remit_contract_k")),
                    reps=int(request.config.getoption("remit_contract_reps")),
                    store_url=os.environ.get(STORE_ENV))


@pytest.fixture
def remit_contract_factory(request: pytest.FixtureRequest) -> str:
    """The factory spec given with ``--remit-contract`` (skips the test without it)."""
    spec = request.config.getoption("remit_contract", None)
    if not spec:
        pytest.skip("no --remit-contract=MODULE:FACTORY given")
    return str(spec)
