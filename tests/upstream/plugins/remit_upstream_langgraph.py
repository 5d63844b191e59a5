"""pytest plugin: LangGraph's own test suite with RemitSaver beside the stock SqliteSaver.

Loaded into a run of the ``tests/`` of a released langgraph sdist (``-p
remit_upstream_langgraph``, see :mod:`tests.upstream.run`). It replaces the
suite's ``sync_checkpointer`` and ``async_checkpointer`` fixtures, before pytest reads
them, with two parameters each:

* ``sqlite`` / ``sqlite_aio``: the stock saver exactly as the suite builds it (its own
  ``_checkpointer_sqlite`` / ``_checkpointer_sqlite_aio`` helpers);
* ``remit`` / ``remit_aio``: ``RemitSaver.from_conn_string(url)`` on a fresh store of the
  backend ``REMIT_UPSTREAM_STORE`` names (sqlite, postgres or redis).

Only the tests that take a checkpointer are kept. Every outcome is written, as JSON
lines, to ``REMIT_UPSTREAM_REPORT``. If the suite's conftest does not define the two
fixtures (a release that moved them), the run stops with an error: a comparison that
silently ran nothing would pass.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from types import ModuleType
from typing import Any

import pytest
import remit_upstream_report as _report
import remit_upstream_stores as _stores
from remit_upstream_report import pytest_runtest_logreport  # noqa: F401  (a hook)

SYNC = "sync_checkpointer"
ASYNC = "async_checkpointer"
#: stock parameter -> remit parameter, as they appear in test ids
PAIRS = {"sqlite": "remit", "sqlite_aio": "remit_aio"}

_patched: list[str] = []


def _replace_fixtures(conftest: ModuleType) -> None:
    stock_sync = getattr(conftest, "_checkpointer_sqlite", None)
    stock_async = getattr(conftest, "_checkpointer_sqlite_aio", None)
    if stock_sync is None or stock_async is None:
        raise pytest.UsageError(
            f"{conftest.__file__}: defines {SYNC}/{ASYNC} but not the stock helpers "
            "_checkpointer_sqlite/_checkpointer_sqlite_aio that tests.upstream expects; "
            "this langgraph release lays out its fixtures differently"
        )

    @pytest.fixture(params=["sqlite", "remit"])
    def sync_checkpointer(request: pytest.FixtureRequest) -> Iterator[Any]:
        if request.param == "sqlite":
            with stock_sync() as saver:
                yield saver
            return
        from remit_langgraph import RemitSaver

        with _stores.fresh_url() as url, RemitSaver.from_conn_string(url) as saver:
            yield saver

    @pytest.fixture(params=["sqlite_aio", "remit_aio"])
    async def async_checkpointer(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
        if request.param == "sqlite_aio":
            async with stock_async() as saver:
                yield saver
            return
        from remit_langgraph import RemitSaver

        with _stores.fresh_url() as url:
            async with RemitSaver.from_conn_string(url) as saver:
                yield saver

    conftest.sync_checkpointer = sync_checkpointer  # type: ignore[attr-defined]
    conftest.async_checkpointer = async_checkpointer  # type: ignore[attr-defined]
    _patched.append(str(conftest.__file__))


@pytest.hookimpl(tryfirst=True)
def pytest_plugin_registered(plugin: object) -> None:
    """Swap the fixtures in the suite's conftest before pytest's fixture manager reads it."""
    if (isinstance(plugin, ModuleType) and plugin.__name__ == "tests.conftest"
            and hasattr(plugin, SYNC) and hasattr(plugin, ASYNC)):
        _replace_fixtures(plugin)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _patched:
        raise pytest.UsageError(
            f"remit_upstream_langgraph: no conftest named tests.conftest defined "
            f"{SYNC} and {ASYNC}; this langgraph release lays out its fixtures differently"
        )
    keep, drop = [], []
    for item in items:
        names = getattr(item, "fixturenames", ())
        (keep if SYNC in names or ASYNC in names else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_sessionfinish(session: pytest.Session) -> None:
    _report.write()
