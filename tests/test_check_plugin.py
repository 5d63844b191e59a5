"""The pytest plugin (remit-check's ``pytest11`` entry point): ``--remit-contract`` turns the
LangGraph fault matrix into tests for any checkpointer factory. Each case runs pytest in a
subprocess (pytester), with real child processes under it."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

ISOLATED = ("-p", "no:cacheprovider")


def test_without_the_option_it_adds_nothing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_one="""
        import sys

        def test_one():
            assert "remit_check.pytest_plugin" in sys.modules
            assert not [m for m in sys.modules if m.startswith(("langgraph", "remit_langgraph"))]
    """)
    result = pytester.runpytest_subprocess(*ISOLATED)
    result.assert_outcomes(passed=1)


def test_help_lists_the_options(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--help")
    result.stdout.fnmatch_lines(["*--remit-contract=MODULE:FACTORY*",
                                 "*--remit-contract-k=K*", "*--remit-contract-reps=N*"])


def test_a_malformed_factory_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(*ISOLATED, "--remit-contract=nonsense")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--remit-contract=nonsense: name a factory as MODULE:FUNCTION*"])


def test_an_unknown_factory_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(*ISOLATED, "--remit-contract=remit_check.langgraph:nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*cannot load the factory: AttributeError*nope*"])


def test_without_remit_langgraph_it_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("""
        import sys

        sys.modules["remit_langgraph"] = None  # as if remit-langgraph were not installed
    """)
    result = pytester.runpytest_subprocess(*ISOLATED, "--remit-contract=myapp:make_saver")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--remit-contract checks a LangGraph checkpointer and needs "
                                 "remit-langgraph (pip install remit-langgraph)*"])


def test_fixtures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_env="""
        def test_env(remit_check_env):
            assert (remit_check_env.k, remit_check_env.reps) == (5, 3)
            assert remit_check_env.workdir.is_dir()

        def test_factory(remit_contract_factory):
            raise AssertionError("skipped without --remit-contract")
    """)
    result = pytester.runpytest_subprocess(*ISOLATED, "--remit-contract-k=5",
                                           "--remit-contract-reps=3")
    result.assert_outcomes(passed=1, skipped=1)


@pytest.mark.slow
def test_remit_saver_passes_every_cell(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(
        *ISOLATED, "-v", "--remit-contract=remit_check.langgraph:remit_saver",
        "--remit-contract-k=3")
    result.assert_outcomes(passed=9)
    result.stdout.fnmatch_lines(["*collected 9 items*",
                                 "remit-contract::kill-after-effect?EO? PASSED*",
                                 "remit-contract::k-resumes?CO-k? PASSED*",
                                 "remit-contract::fork-twice?FI-FD? PASSED*",
                                 "remit-contract::recover-twice?RD? PASSED*"])


@pytest.mark.slow
def test_stock_saver_fails_where_stock_violates(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(
        *ISOLATED, "--remit-contract=remit_check.langgraph:stock_saver",
        "-k", "k-resumes or second-resume or invalid-state or kill-between-steps")
    result.assert_outcomes(passed=1, failed=3, deselected=5)
    result.stdout.fnmatch_lines([
        "*CO-k violated at k-resumes on remit_check.langgraph:stock_saver: 4 racing resumes: "
        "gated effect fired * times*resumes_accepted=4*",
        "*CO violated at second-resume*second_values_stored=1*",
        "*CV violated at invalid-state*invalid_stored=1*",
        "FAILED remit-contract::k-resumes[[]CO-k[]]*",
    ])


# ============================================= every framework that registers checks


def test_help_lists_one_option_per_framework(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--help")
    result.stdout.fnmatch_lines(["*--remit-contract-crewai=MODULE:FACTORY*",
                                 "*--remit-contract-pydantic-graph=MODULE:FACTORY*"])


def test_each_framework_gets_its_fixtures(pytester: pytest.Pytester) -> None:
    """Without an option the framework fixtures open the remit layer (RemitSaver,
    RemitFlowPersistence, RemitStatePersistence) on a fresh directory."""
    pytester.makepyfile(test_layers="""
        def test_langgraph(remit_langgraph_saver):
            from remit_langgraph import RemitSaver
            assert isinstance(remit_langgraph_saver, RemitSaver)
            assert remit_langgraph_saver.get_tuple({"configurable": {"thread_id": "t"}}) is None

        def test_crewai(remit_crewai_persistence):
            from remit_crewai import RemitFlowPersistence
            assert isinstance(remit_crewai_persistence, RemitFlowPersistence)
            assert remit_crewai_persistence.load_state("nobody") is None

        def test_pydantic_graph(remit_pydantic_graph_persistence):
            import asyncio
            from remit_pydantic_graph import RemitStatePersistence
            p = remit_pydantic_graph_persistence("run-1")
            assert isinstance(p, RemitStatePersistence) and p.run_id == "run-1"
    """)
    result = pytester.runpytest_subprocess(*ISOLATED)
    result.assert_outcomes(passed=3)


def test_a_fixture_opens_the_given_factory(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_layer="""
        def test_pydantic_graph(remit_pydantic_graph_persistence):
            from pydantic_graph.persistence.file import FileStatePersistence
            assert isinstance(remit_pydantic_graph_persistence("r"), FileStatePersistence)
    """)
    result = pytester.runpytest_subprocess(
        *ISOLATED, "--remit-contract-pydantic-graph=remit_check.pydantic_graph:stock_persistence",
        "-k", "test_pydantic_graph")
    result.assert_outcomes(passed=1)


@pytest.mark.slow
def test_crewai_persistence_cells(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(
        *ISOLATED, "-v", "--remit-contract-crewai=remit_check.crewai:remit_persistence",
        "--remit-contract-k=2")
    result.assert_outcomes(passed=9)
    result.stdout.fnmatch_lines(["*collected 9 items*",
                                 "remit-contract-crewai::kill-after-effect?LV? PASSED*",
                                 "remit-contract-crewai::k-resumes?CO-k? PASSED*"])


@pytest.mark.slow
def test_pydantic_graph_stock_persistence_fails_where_stock_violates(
        pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(
        *ISOLATED, "--remit-contract-pydantic-graph=remit_check.pydantic_graph:stock_persistence",
        "--remit-contract-k=2", "-k", "second-resume or invalid-state or kill-during-write")
    result.assert_outcomes(passed=1, failed=3, deselected=6)
    result.stdout.fnmatch_lines([
        "*LV violated at kill-during-write on remit_check.pydantic_graph:stock_persistence*",
        "*CO violated at second-resume*late_deliveries_accepted=1*",
        "*CV violated at invalid-state*invalid_persisted=1*",
    ])
