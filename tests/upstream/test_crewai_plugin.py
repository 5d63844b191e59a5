"""The plugin that runs CrewAI's own tests with RemitFlowPersistence in place of
SQLiteFlowPersistence (tests/upstream/plugins/remit_upstream_crewai.py) replaces the class
where the tests get it, and fails loudly where it cannot: never a run of the stock layer
twice under the remit name.

A small suite of our own, in the shapes CrewAI's tests use, runs through the plugin in a
child pytest. (The real suite runs in the nox session ``crewai_upstream``.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "tests" / "upstream" / "plugins"

SUITE = {
    # the name imported at the top, and CrewAI's factory fallback inside a test
    "test_replaced.py": '''
        import os
        from crewai.flow.persistence.factory import default_flow_persistence
        from crewai.flow.persistence.sqlite import SQLiteFlowPersistence

        def test_save_and_load(tmp_path):
            p = SQLiteFlowPersistence(os.path.join(tmp_path, "flows.db"))
            p.save_state("f-1", "step", {"id": "f-1", "n": 1})
            again = SQLiteFlowPersistence(os.path.join(tmp_path, "flows.db"))
            assert again.load_state("f-1")["n"] == 1
            with open(os.environ["LAYERS"], "a") as out:
                out.write(type(p).__name__ + " " + type(default_flow_persistence()).__name__
                          + "\\n")
    ''',
    # an alias cannot be replaced: the remit twin errors
    "test_alias.py": '''
        from crewai.flow.persistence.sqlite import SQLiteFlowPersistence as Stock

        def test_alias(tmp_path):
            Stock(str(tmp_path / "flows.db"))
    ''',
    # an instance built at import (a decorator argument, say) is the stock class: the
    # remit twin fails when it is used, instead of running stock under the remit name
    "test_built_at_import.py": '''
        import tempfile
        from crewai.flow.persistence.sqlite import SQLiteFlowPersistence

        AT_IMPORT = SQLiteFlowPersistence(tempfile.mkdtemp() + "/flows.db")

        def test_uses_it():
            AT_IMPORT.save_state("f-2", "step", {"id": "f-2"})
    ''',
}


def test_the_plugin_replaces_the_class_and_fails_loudly_where_it_cannot(
        tmp_path: Path) -> None:
    suite = tmp_path / "tests"
    suite.mkdir()
    (suite / "__init__.py").write_text("")
    for name, body in SUITE.items():
        (suite / name).write_text(textwrap.dedent(body))
    report, layers = tmp_path / "outcomes.jsonl", tmp_path / "layers.txt"
    env = {**os.environ, "PYTHONPATH": str(PLUGINS), "REMIT_UPSTREAM_STORE": "sqlite",
           "REMIT_UPSTREAM_REPORT": str(report), "LAYERS": str(layers)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "tests", "-p", "remit_upstream_crewai", "-q",
         "-p", "no:cacheprovider", "-o", "addopts=", "--tb=line"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    outcomes = {e["nodeid"]: e for e in map(json.loads, report.read_text().splitlines())}
    summary = done.stdout[-3000:]
    assert {k: v["outcome"] for k, v in outcomes.items()} == {
        "tests/test_replaced.py::test_save_and_load[stock]": "passed",
        "tests/test_replaced.py::test_save_and_load[remit]": "passed",
        "tests/test_alias.py::test_alias[stock]": "passed",
        "tests/test_alias.py::test_alias[remit]": "failed",
        "tests/test_built_at_import.py::test_uses_it[stock]": "passed",
        "tests/test_built_at_import.py::test_uses_it[remit]": "failed",
    }, summary
    assert "imports SQLiteFlowPersistence as Stock" in \
        outcomes["tests/test_alias.py::test_alias[remit]"]["message"], summary
    assert "was used during a remit test" in \
        outcomes["tests/test_built_at_import.py::test_uses_it[remit]"]["message"], summary
    assert layers.read_text().splitlines() == [
        "SQLiteFlowPersistence SQLiteFlowPersistence", "RemitInPlace RemitInPlace"]
