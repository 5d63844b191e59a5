"""pytest plugin: check a persistence layer against the resume contract.

Loaded by pytest through remit-check's ``pytest11`` entry point. It names no
framework: each adapter that registers checks (``<framework>.check`` in the entry
point group ``remit.adapters``) gets an option, the one its declaration names as
``CONTRACT_OPTION`` or else ``--remit-contract-<framework>``; LangGraph's is
``--remit-contract``::

    pytest --remit-contract=myapp.persistence:make_saver
    pytest --remit-contract-crewai=myapp.persistence:make_persistence

Each adds one test per fault point and property of that framework's ``remit check``,
run on the layer ``custom`` built by that factory. The factory keeps the contract
documented in the framework's declaration (``remit_check.langgraph``,
``remit_check.crewai``, ``remit_check.pydantic_graph``): it opens the same durable
store every time it is called with the same directory, in any process. A test fails
with the cell's summary and raw counts when its property does not hold.

Without such an option the plugin adds no test and imports no framework (only the
declarations, which import none).

Options: ``--remit-contract-k`` (concurrent resumers, default 4) and
``--remit-contract-reps`` (repetitions per cell, default 1); select cells with
``-k``, e.g. ``-k "k-resumes or CV"``.

Fixtures, for tests that drive the scenarios themselves:

* ``remit_check_env``: a :class:`~remit_check.CheckEnv` with a fresh work
  directory, and ``k`` and ``reps`` from the options above;
* ``remit_contract_factory``: the factory spec of the ``--remit-contract`` option
  given (the test is skipped when none was);
* each framework's own (its ``<framework>.pytest`` entry point, registered here as a
  plugin): ``remit_langgraph_saver``, ``remit_crewai_persistence``,
  ``remit_pydantic_graph_persistence``.
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

from remit_check import STORE_ENV, CellResult, CheckEnv, Scenario, declaration, load_factory
from remit_core.registry import Registration, registrations

LAYER = "custom"


@dataclass
class _Framework:
    """One framework that registers checks, as this plugin offers it."""

    reg: Registration
    module: ModuleType  # its declaration (imports no framework)
    option: str  # "--remit-contract"

    @property
    def dest(self) -> str:
        return "remit_contract_" + self.reg.framework.replace("-", "_")

    @property
    def subject(self) -> str:
        return str(getattr(self.module, "SUBJECT", f"a {self.reg.framework} persistence layer"))


@dataclass
class _Contract:
    """One framework's contract run: the factory, the scenarios, the cells."""

    framework: _Framework
    spec: str
    scenarios: list[Scenario]
    k: int
    reps: int
    workdir: Path
    cells: dict[str, list[CellResult] | BaseException] = field(default_factory=dict)

    def run(self, scenario: Scenario) -> list[CellResult]:
        """The scenario's cells on the custom layer, run once for all its properties.
        (A framework may measure one fault point in two scenarios: keyed by both.)"""
        key = f"{scenario.fault} {','.join(scenario.properties)}"
        if key not in self.cells:
            env = CheckEnv(workdir=self.workdir / scenario.fault, k=self.k, reps=self.reps,
                           store_url=os.environ.get(STORE_ENV))
            env.workdir.mkdir(parents=True, exist_ok=True)
            try:
                self.cells[key] = scenario.run(env, LAYER, self.spec)
            except Exception as exc:
                self.cells[key] = exc
        got = self.cells[key]
        if isinstance(got, BaseException):
            raise ContractError(
                f"{scenario.fault} could not run on {self.spec}: {type(got).__name__}: {got}\n"
                + "".join(traceback.format_exception(got)))
        return got


_FRAMEWORKS = pytest.StashKey[list[_Framework]]()
_CONTRACTS = pytest.StashKey[list[_Contract]]()


class ContractError(Exception):
    """A cell that does not hold, or a scenario that could not run."""


def _frameworks() -> list[_Framework]:
    """The frameworks that register checks (their declarations only are imported). One
    whose declaration does not import is left out: `remit check` says why."""
    found = []
    for name, reg in registrations("check").items():
        try:
            module = declaration(reg)
        except ImportError:
            continue
        option = str(getattr(module, "CONTRACT_OPTION", f"--remit-contract-{name}"))
        found.append(_Framework(reg, module, option))
    return found


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    group = parser.getgroup("remit", "remit: the resume contract")
    for fw in _frameworks():
        group.addoption(
            fw.option, metavar="MODULE:FACTORY", dest=fw.dest, default=None,
            help=f"check {fw.subject} against the resume contract: one test per fault point "
                 "and property of `remit check`, on the layer that MODULE:FACTORY returns "
                 f"(see {fw.reg.module})")
    group.addoption("--remit-contract-k", metavar="K", type=int, default=4,
                    help="concurrent resumers for --remit-contract (default 4)")
    group.addoption("--remit-contract-reps", metavar="N", type=int, default=1,
                    help="repetitions per cell for --remit-contract (default 1)")
    # each framework's fixtures: its "<framework>.pytest" entry point, a plugin module
    for name, reg in registrations("pytest").items():
        plugin_name = f"remit-{name}"
        if pluginmanager.get_plugin(plugin_name) is None:
            try:
                pluginmanager.register(reg.load(), plugin_name)
            except ImportError:
                continue  # its framework's checks are not installed: no fixtures


def pytest_configure(config: pytest.Config) -> None:
    frameworks = _frameworks()
    config.stash[_FRAMEWORKS] = frameworks
    k = int(config.getoption("remit_contract_k"))
    reps = int(config.getoption("remit_contract_reps"))
    contracts = []
    for fw in frameworks:
        spec = config.getoption(fw.dest, None)
        if not spec:
            continue
        contracts.append(_contract(fw, str(spec), k, reps))
    config.stash[_CONTRACTS] = contracts


def _contract(fw: _Framework, spec: str, k: int, reps: int) -> _Contract:
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise pytest.UsageError(
            f"{fw.option}={spec}: name a factory as MODULE:FUNCTION, "
            f"e.g. {fw.option}=myapp.persistence:make_layer")
    try:
        importlib.import_module(fw.module.ADAPTER_MODULE)  # the checks compare with its layer
        scenarios = fw.module.scenarios()
    except ImportError as exc:
        dist = fw.reg.distribution
        raise pytest.UsageError(f"{fw.option} checks {fw.subject} and needs {dist} "
                                f"(pip install {dist}): {exc}") from exc
    try:
        load_factory(spec)
    except (ImportError, AttributeError) as exc:
        raise pytest.UsageError(f"{fw.option}={spec}: cannot load the factory: "
                                f"{type(exc).__name__}: {exc}") from exc
    if k < 2 or reps < 1:
        raise pytest.UsageError("--remit-contract-k must be at least 2 and "
                                "--remit-contract-reps at least 1")
    workdir = Path(tempfile.mkdtemp(prefix=f"remit-contract-{fw.reg.framework}-"))
    return _Contract(fw, spec, scenarios, k, reps, workdir)


def pytest_unconfigure(config: pytest.Config) -> None:
    for contract in config.stash.get(_CONTRACTS, []):
        if not os.environ.get("REMIT_CHECK_KEEP"):
            shutil.rmtree(contract.workdir, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)  # before -k and -m deselect
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    for contract in config.stash.get(_CONTRACTS, []):
        name = contract.framework.option.lstrip("-")  # "remit-contract"
        collector = ContractCollector.from_parent(session, name=name, nodeid=name,
                                                  contract=contract)
        mine = collector.collect()
        # reported like any collected node, so that the terminal counts these tests too
        config.hook.pytest_collectreport(
            report=pytest.CollectReport(collector.nodeid, "passed", None, list(mine)))
        items.extend(mine)


class ContractCollector(pytest.Collector):
    """One framework's contract tests: one per scenario and property."""

    def __init__(self, *, contract: _Contract, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.contract = contract

    def collect(self) -> list[pytest.Item]:
        items: list[pytest.Item] = []
        for scenario in self.contract.scenarios:
            for prop in scenario.properties:
                items.append(ContractItem.from_parent(
                    self, name=f"{scenario.fault}[{prop.replace('/', '-')}]",
                    contract=self.contract, scenario=scenario, prop=prop))
        return items


class ContractItem(pytest.Item):
    """One cell: a property of one fault point, on the factory of a --remit-contract option."""

    def __init__(self, *, contract: _Contract, scenario: Scenario, prop: str,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.contract = contract
        self.scenario = scenario
        self.prop = prop

    def runtest(self) -> None:
        cells = self.contract.run(self.scenario)
        mine = [c for c in cells if c.property == self.prop]
        if not mine:
            raise ContractError(f"{self.scenario.fault} reported no {self.prop} cell")
        for cell in mine:
            if not cell.holds:
                counts = ", ".join(f"{k}={v}" for k, v in cell.counts.items())
                raise ContractError(
                    f"{self.prop} {cell.verdict} at {self.scenario.fault} on "
                    f"{self.contract.spec}: {cell.summary} [{counts}]"
                    + (f"\n{cell.detail}" if cell.detail else ""))

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
    """A :class:`~remit_check.CheckEnv` for running contract scenarios in a test."""
    workdir = tmp_path / "remit-check"
    workdir.mkdir()
    return CheckEnv(workdir=workdir, k=int(request.config.getoption("remit_contract_k")),
                    reps=int(request.config.getoption("remit_contract_reps")),
                    store_url=os.environ.get(STORE_ENV))


@pytest.fixture
def remit_contract_factory(request: pytest.FixtureRequest) -> str:
    """The factory spec given with a ``--remit-contract`` option (the first, when several
    were); skips the test without one."""
    for fw in request.config.stash.get(_FRAMEWORKS, []):
        spec = request.config.getoption(fw.dest, None)
        if spec:
            return str(spec)
    pytest.skip("no --remit-contract=MODULE:FACTORY given")


def contract_factory(config: pytest.Config, framework: str, default: str) -> str:
    """The factory spec of ``framework``'s option, else ``default`` (for the frameworks'
    fixture modules)."""
    spec = config.getoption("remit_contract_" + framework.replace("-", "_"), None)
    return str(spec) if spec else default
