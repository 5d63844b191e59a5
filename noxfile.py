"""The version matrix: one session per adapter, framework release and backend.

    uv run nox -l
    uv run nox -s "langgraph(version='1.0.0', store='postgres')"
"""

# Each session makes a fresh uv venv under .nox/, installs remit-core[postgres,redis] and
# the adapter from this checkout (editable), the pinned framework release and the test
# tools, and runs pytest on the adapter's test directory with one backend
# (REMIT_BACKENDS=<store>) and REMIT_REQUIRE_SERVICES=1, so an unreachable PostgreSQL or
# Redis fails the session instead of skipping. "The newest" release of each framework is
# the one in uv.lock, read from there. The full matrix is run by hand (README.md, "The
# version matrix"); CI runs .ci/run, not nox.

from __future__ import annotations

import tomllib
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv"
nox.options.error_on_missing_interpreters = True
# `nox` without -s runs nothing (it lists the sessions): the default CI is .ci/run, and
# the whole matrix (crewai installs ~1 GB per venv) is run by hand, one session at a time.
nox.options.sessions = []

PYTHON = "3.11"  # the oldest Python remit supports (requires-python >= 3.11)
STORES = ["sqlite", "postgres", "redis"]

ROOT = Path(__file__).parent
LOCKED: dict[str, str] = {
    package["name"]: package["version"]
    for package in tomllib.loads((ROOT / "uv.lock").read_text())["package"]
    if "version" in package
}


def locked(*names: str) -> list[str]:
    """``name==version`` pins for packages at their uv.lock version."""
    return [f"{name}=={LOCKED[name]}" for name in names]


# The test tools every session installs, at the uv.lock versions (they are not what the
# matrix varies).
TEST_TOOLS = locked("pytest", "pytest-timeout", "hypothesis")

# ------------------------------------------------------------------------------ langgraph

# The stock savers are needed by tests/langgraph (remit migrate, remit check) and the
# conformance suite by tests/langgraph/test_conformance.py.
LANGGRAPH_STOCK = ["langgraph-checkpoint-sqlite", "langgraph-checkpoint-postgres"]
LANGGRAPH: dict[str, list[str]] = {
    # The oldest langgraph remit-langgraph allows (langgraph>=1.0), with the oldest
    # langgraph-checkpoint line it allows (2.1.x; 2.1.2 is its last release) and the
    # newest stock savers that accept langgraph-checkpoint 2.1.x. The conformance suite
    # (0.0.2 needs only langgraph-checkpoint>=2.0) installs and passes FULL here, so no
    # test module is deselected for this version.
    "1.0.0": [
        "langgraph==1.0.0",
        "langgraph-checkpoint==2.1.2",
        "langgraph-checkpoint-sqlite==2.0.11",
        "langgraph-checkpoint-postgres==3.0.5",
        "langgraph-checkpoint-conformance==0.0.2",
    ],
    # A middle release; langgraph-checkpoint and the savers resolve to the newest that fit.
    "1.2.9": ["langgraph==1.2.9", *LANGGRAPH_STOCK, "langgraph-checkpoint-conformance"],
    # The newest: the whole family at the uv.lock versions.
    LOCKED["langgraph"]: locked(
        "langgraph", "langgraph-checkpoint", *LANGGRAPH_STOCK,
        "langgraph-checkpoint-conformance",
    ),
}

# ------------------------------------------------------------------------------- crewai

CREWAI: dict[str, list[str]] = {
    # The oldest release with the flow persistence API remit-crewai uses (crewai>=1.15;
    # 1.15.1 is yanked).
    "1.15.0": ["crewai==1.15.0"],
    LOCKED["crewai"]: locked("crewai"),
}

# ----------------------------------------------------------------------- pydantic-graph

PYDANTIC_GRAPH: dict[str, list[str]] = {
    "1.0.0": ["pydantic-graph==1.0.0"],
    LOCKED["pydantic-graph"]: locked("pydantic-graph"),
}


def matrix(versions: dict[str, list[str]]) -> list[tuple[str, str]]:
    """(version, store) for every version and backend: one parametrize over both, so the
    names read ``adapter(version='...', store='...')`` and list version by version."""
    return [(version, store) for version in versions for store in STORES]


def run_adapter(session: nox.Session, package: str, tests: str, framework: list[str],
                store: str) -> None:
    session.install(
        "-e", "shared[postgres,redis]",
        "-e", f"packages/{package}",
        "-e", "packages/remit-check",  # the tests import the check's scenario graphs
        *framework,
        *TEST_TOOLS,
    )
    session.run("uv", "pip", "list", external=True)  # the versions, for the README table
    session.run(
        "pytest", tests, *session.posargs,
        env={"REMIT_REQUIRE_SERVICES": "1", "REMIT_BACKENDS": store},
    )


@nox.session(python=PYTHON)
@nox.parametrize(("version", "store"), matrix(LANGGRAPH))
def langgraph(session: nox.Session, version: str, store: str) -> None:
    """remit-langgraph on one langgraph release and one backend."""
    run_adapter(session, "remit-langgraph", "tests/langgraph", LANGGRAPH[version], store)


@nox.session(python=PYTHON)
@nox.parametrize(("version", "store"), matrix(CREWAI))
def crewai(session: nox.Session, version: str, store: str) -> None:
    """remit-crewai on one crewai release and one backend."""
    run_adapter(session, "remit-crewai", "tests/crewai", CREWAI[version], store)


@nox.session(python=PYTHON)
@nox.parametrize("store", STORES)
def crewai_upstream(session: nox.Session, store: str) -> None:
    """CrewAI's own flow-persistence and human-feedback tests (the tests/ of the released
    crewai sdist at the uv.lock version, downloaded at run time by tests/upstream/run.py),
    each on SQLiteFlowPersistence and with RemitFlowPersistence in its place, remit on
    ``store``. Prints the remit-only failures; fails on any that is not on the documented
    list in packages/remit-crewai/README.md. Arguments after ``--`` go to pytest."""
    session.install(
        "-e", "shared[postgres,redis]", "-e", "packages/remit-crewai",
        # CrewAI's async tests need pytest-asyncio; two feedback tests build a Claude LLM
        *locked("crewai", "pytest-asyncio", "anthropic"), *UPSTREAM_TOOLS,
    )
    session.run("uv", "pip", "list", external=True)
    # (the options before the suite's name, pytest's after `--`: paths and options may follow)
    session.run("python", "-m", "tests.upstream.run", "--store", store, "crewai", "--",
                *session.posargs, env={"REMIT_REQUIRE_SERVICES": "1"})


@nox.session(python=PYTHON)
@nox.parametrize(("version", "store"), matrix(PYDANTIC_GRAPH))
def pydantic_graph(session: nox.Session, version: str, store: str) -> None:
    """remit-pydantic-graph on one pydantic-graph release and one backend."""
    run_adapter(session, "remit-pydantic-graph", "tests/pydantic_graph",
                PYDANTIC_GRAPH[version], store)


# ------------------------------------------------------------- the frameworks' own suites

# What the released test suites import beyond the framework (tests/upstream/run.py
# downloads the suite itself with pip download).
UPSTREAM_TOOLS = locked("pytest", "pytest-timeout", "pytest-xdist", "pytest-mock", "syrupy",
                        "pip")
# langgraph 1.0.0 allows langgraph-prebuilt 1.0.x, whose newest releases import what
# langgraph 1.0.0 does not have (langgraph.runtime.ExecutionInfo), and its stock
# AsyncSqliteSaver (langgraph-checkpoint-sqlite 2.0.x) calls aiosqlite's
# Connection.is_alive, gone in aiosqlite 0.22: its suite needs the releases of its time
UPSTREAM_PINS = {"1.0.0": ["langgraph-prebuilt==1.0.0", "aiosqlite<0.22"]}


@nox.session(python=PYTHON)
@nox.parametrize(("version", "store"), matrix(LANGGRAPH))
def langgraph_upstream(session: nox.Session, version: str, store: str) -> None:
    """LangGraph's own test suite (the released sdist of that langgraph, downloaded at
    run time): its checkpointer-parametrized tests on the stock SqliteSaver and on
    RemitSaver (on ``store``); prints the remit-only failures and fails on any that is
    not on the documented list in packages/remit-langgraph/README.md."""
    session.install(
        "-e", "shared[postgres,redis]", "-e", "packages/remit-langgraph",
        *LANGGRAPH[version], *UPSTREAM_PINS.get(version, []), *UPSTREAM_TOOLS,
        "psycopg[binary]", "psycopg-pool", "redis", "httpx",
    )
    session.run("uv", "pip", "list", external=True)
    # (the options before the suite's name, pytest's after `--`: paths and options may follow)
    session.run("python", "-m", "tests.upstream.run", "--store", store, "langgraph", "--",
                *session.posargs, env={"REMIT_REQUIRE_SERVICES": "1"})


# ---------------------------------------------------------------------------- remit-core

CORE_TESTS = [
    "tests/test_store.py", "tests/test_store_postgres.py", "tests/test_store_redis.py",
    "tests/test_store_model.py", "tests/test_config.py", "tests/test_serde.py",
    "tests/test_validation.py", "tests/test_errors.py", "tests/test_races.py",
]


@nox.session(python=PYTHON)
@nox.parametrize("store", STORES)
def core_lowest(session: nox.Session, store: str) -> None:
    """remit-core's store suite with its direct dependencies at the lowest versions its
    pyproject allows (uv's ``--resolution lowest-direct``): the floors are tested, not
    only the newest releases."""
    session.install("--resolution", "lowest-direct", "-e", "shared[postgres,redis]",
                    *TEST_TOOLS)
    session.run("uv", "pip", "list", external=True)
    session.run(
        "pytest", *CORE_TESTS, *session.posargs,
        env={"REMIT_REQUIRE_SERVICES": "1", "REMIT_BACKENDS": store},
    )


# ------------------------------------------------------------------ the default run, other Pythons

OTHER_PYTHONS = ["3.12", "3.13"]


@nox.session(python=OTHER_PYTHONS)
def suite(session: nox.Session) -> None:
    """The default test run (what ``.ci/run`` runs on 3.11) on a newer Python: the whole
    workspace from uv.lock, every backend. The interpreter must be findable by uv
    (``uv python install 3.13``; with pyenv, e.g. ``PYENV_VERSION=3.11.7:3.12.1:3.13.0``)."""
    session.run_install(
        "uv", "sync", "--frozen", "--all-packages", "--inexact",
        env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location}, external=True)
    session.run("pytest", *session.posargs, env={"REMIT_REQUIRE_SERVICES": "1"})
