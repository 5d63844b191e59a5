"""pytest plugin: CrewAI's own flow-persistence and human-feedback tests, each run twice:
on the stock ``SQLiteFlowPersistence`` and with ``RemitFlowPersistence`` in its place.

Loaded into a run of the ``tests/`` of a released crewai sdist (``-p
remit_upstream_crewai``, see :mod:`tests.upstream.run`, which names the test files).

CrewAI's tests have no persistence fixture: they build the stock layer themselves,
``SQLiteFlowPersistence(db_path)`` (the name imported at the top of the test module or
inside the test), or get it from CrewAI's factory fallback (a bare ``@persist()``,
``default_flow_persistence()``). So every selected test gets one more parameter:

* ``stock``: the test as it is;
* ``remit``: for the length of the test, every module attribute named
  ``SQLiteFlowPersistence`` that holds CrewAI's class (``crewai.flow.persistence.sqlite``,
  ``crewai.flow.persistence``, the test modules, ...) holds :class:`RemitInPlace`
  instead: a ``RemitFlowPersistence`` built as the suite builds the stock class. Each
  distinct ``db_path`` of the test (and ``None``, CrewAI's default file) is one fresh
  remit store on the backend ``REMIT_UPSTREAM_STORE`` names, deleted after the test.

The seam is checked loudly, never assumed: the run stops with a usage error when
CrewAI's class or its factory fallback is not where this plugin expects it, when a
selected test module that names ``SQLiteFlowPersistence`` holds no such attribute to
replace, and when the stock class is set up during a ``remit`` test (the replacement
missed a path: the test fails, it does not silently run stock twice). At the end, a run
in which no remit test built a remit backend is an error too.

Every outcome is written, as JSON lines, to ``REMIT_UPSTREAM_REPORT``.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

# CrewAI writes side files (home dir, caches, storage, lock files) where the user keeps
# theirs unless told otherwise, and reports telemetry: keep both inside the run.
_HOME = tempfile.mkdtemp(prefix="remit-up-crewai-")
for _sub in ("home", "data", "cache", "config", "storage"):
    os.makedirs(os.path.join(_HOME, _sub), exist_ok=True)
os.environ.update({
    "HOME": os.path.join(_HOME, "home"),
    "XDG_DATA_HOME": os.path.join(_HOME, "data"),
    "XDG_CACHE_HOME": os.path.join(_HOME, "cache"),
    "XDG_CONFIG_HOME": os.path.join(_HOME, "config"),
    "CREWAI_STORAGE_DIR": os.path.join(_HOME, "storage"),
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_DISABLE_TRACKING": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "OTEL_SDK_DISABLED": "true",
})

import remit_upstream_report as _report  # noqa: E402
import remit_upstream_stores as _stores  # noqa: E402  (after the environment is set)
from remit_upstream_report import pytest_runtest_logreport  # noqa: E402, F401  (a hook)

NAME = "SQLiteFlowPersistence"
LAYER = "remit_layer"
#: stock parameter -> remit parameter, as they appear in test ids
PAIRS = {"stock": "remit"}


class SeamMissing(pytest.UsageError):
    pass


def _stock_class() -> type[Any]:
    """CrewAI's class, from where CrewAI's factory fallback imports it."""
    try:
        import crewai.flow.persistence.factory as factory
        from crewai.flow.persistence.base import FlowPersistence
        from crewai.flow.persistence.sqlite import SQLiteFlowPersistence
    except ImportError as exc:
        raise SeamMissing(f"remit_upstream_crewai: cannot import CrewAI's flow persistence "
                          f"({exc}); this crewai release lays it out differently") from None
    if not (isinstance(SQLiteFlowPersistence, type)
            and issubclass(SQLiteFlowPersistence, FlowPersistence)):
        raise SeamMissing(f"remit_upstream_crewai: crewai.flow.persistence.sqlite.{NAME} is "
                          "not a FlowPersistence class")
    import inspect

    source = inspect.getsource(factory.default_flow_persistence)
    if f"from crewai.flow.persistence.sqlite import {NAME}" not in source:
        raise SeamMissing("remit_upstream_crewai: crewai's default_flow_persistence() no "
                          f"longer imports {NAME} from crewai.flow.persistence.sqlite when it "
                          "is called; the factory fallback would not be replaced")
    return SQLiteFlowPersistence


# ------------------------------------------------------------------------ the replacement

_urls: dict[str | None, str] = {}  # this test's db_path -> its remit store
_stack = contextlib.ExitStack()
_built = {"remit": 0}
_in_remit_test = {"on": False}


def _url_for(db_path: Any) -> str:
    key = None if db_path is None else os.fspath(db_path)
    if key not in _urls:
        _urls[key] = _stack.enter_context(_stores.fresh_url())
    return _urls[key]


def _make_replacement() -> type[Any]:
    from remit_crewai import RemitFlowPersistence

    class RemitInPlace(RemitFlowPersistence):
        """``RemitFlowPersistence``, built as the suite builds ``SQLiteFlowPersistence``:
        ``RemitInPlace(db_path=None)``. The same path in one test is the same store."""

        def __init__(self, db_path: str | os.PathLike[str] | None = None, **data: Any) -> None:
            if "url" not in data:  # built by a test (from_url and JSON give the url)
                data["url"] = _url_for(db_path)
            super().__init__(**data)
            _built["remit"] += 1

    RemitInPlace.__name__ = RemitInPlace.__qualname__ = "RemitInPlace"
    return RemitInPlace


_STOCK: type[Any] | None = None
_REPLACEMENT: type[Any] | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _STOCK, _REPLACEMENT
    _STOCK = _stock_class()
    _REPLACEMENT = _make_replacement()


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_HOME, ignore_errors=True)


#: what a stock instance does; each raises during a remit test (one built before the test,
#: at import, would otherwise run stock under the remit name)
STOCK_METHODS = ("init_db", "save_state", "load_state", "save_pending_feedback",
                 "load_pending_feedback", "clear_pending_feedback")


def _imports_at_top(module: ModuleType) -> bool:
    """Whether the module imports the class by name at its top level (an alias cannot be
    replaced: a usage error)."""
    tree = ast.parse(Path(str(module.__file__)).read_text(encoding="utf-8"))
    found = False
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("crewai"):
            for alias in node.names:
                if alias.name == NAME:
                    if alias.asname not in (None, NAME):
                        raise SeamMissing(f"remit_upstream_crewai: {module.__name__} imports "
                                          f"{NAME} as {alias.asname}; it cannot be replaced")
                    found = True
    return found


def _holders(stock: type[Any]) -> list[ModuleType]:
    """Every loaded module (CrewAI's and the suite's) whose ``SQLiteFlowPersistence`` is
    CrewAI's class."""
    found = []
    for name, module in list(sys.modules.items()):
        if not (name == "crewai" or name.startswith(("crewai.", "tests"))):
            continue
        if isinstance(module, ModuleType) and module.__dict__.get(NAME) is stock:
            found.append(module)
    return found


@pytest.fixture(autouse=True)
def remit_layer(request: pytest.FixtureRequest,
                monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    layer = getattr(request, "param", "stock")
    if layer != "remit":
        yield layer
        return
    assert _STOCK is not None and _REPLACEMENT is not None
    stock, replacement = _STOCK, _REPLACEMENT
    holders = _holders(stock)
    names = {m.__name__ for m in holders}
    for required in ("crewai.flow.persistence.sqlite", "crewai.flow.persistence"):
        if required not in names:
            raise SeamMissing(f"remit_upstream_crewai: {required}.{NAME} is not CrewAI's "
                              "class any more; the seam moved")
    module = request.module
    if _imports_at_top(module) and module.__name__ not in names:
        raise SeamMissing(f"remit_upstream_crewai: {module.__name__} imports {NAME} but holds "
                          "no such attribute to replace")
    for holder in holders:
        monkeypatch.setattr(holder, NAME, replacement)

    def refuse(self: Any, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"remit_upstream_crewai: CrewAI's own {NAME} was used during a "
                           "remit test: the replacement missed the path that built it")

    for method in STOCK_METHODS:
        monkeypatch.setattr(stock, method, refuse)
    _in_remit_test["on"] = True
    try:
        yield layer
    finally:
        _in_remit_test["on"] = False
        gc.collect()  # flows (and their backends) that a test left in reference cycles
        _urls.clear()
        _stack.close()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if LAYER in metafunc.fixturenames:
        metafunc.parametrize(LAYER, list(PAIRS) + list(PAIRS.values()), indirect=True)


def pytest_sessionfinish(session: pytest.Session) -> None:
    remit_ran = any(e["nodeid"].endswith("-remit]") or e["nodeid"].endswith("[remit]")
                    for e in _report.outcomes())
    if remit_ran and _built["remit"] == 0:
        print(f"\nremit_upstream_crewai: no remit test built a remit backend: the {NAME} "
              "replacement never took effect", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.USAGE_ERROR
        return
    _report.write()
