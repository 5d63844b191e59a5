"""Which types a process can read back (issue 12 item 5, issue 13 item 5).

* A class defined inside a function (``<locals>``) kept in graph state reads back in
  the process that wrote it; another process gets a clear ``UnregisteredType`` that
  says to allow the class, never a thread that is unreadable for everyone.
* A reader in another process allows a schema's classes with ``schema=`` (or
  ``store.serde.allow(...)``) and then reads them.
* ``remit inspect`` reads LangGraph runs: the CLI loads every adapter's type
  registrations (entry point group ``remit.serde``) and shows a type nobody
  registered as such, not as corruption.
"""

# no `from __future__ import annotations`: LangGraph resolves the annotations of the state
# classes these tests define inside functions, as a user's module would have them

import json
import subprocess
import sys
import textwrap
import uuid
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any

import pytest
from langgraph.graph import START, StateGraph
from langgraph.types import interrupt
from pydantic import BaseModel

from remit_core import Store
from remit_langgraph import RemitSaver

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def saver(store: Store) -> RemitSaver:
    return RemitSaver(store)


def cfg(thread: str | None = None) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread or uuid.uuid4().hex}}


def in_child(source: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``source`` in a fresh interpreter (a process that never saw the test's classes)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(source), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)


class Ticket(BaseModel):
    """A module-level class: another process can allow it by importing this module."""

    n: int


class TicketState(BaseModel):
    ticket: Annotated[Ticket, lambda old, new: new]
    done: bool = False


def ticket_graph(saver: RemitSaver) -> Any:
    b = StateGraph(TicketState)
    b.add_node("bump", lambda s: {"ticket": Ticket(n=s.ticket.n + 1), "done": True})
    b.add_edge(START, "bump")
    return b.compile(checkpointer=saver)


def test_a_class_defined_in_a_function_reads_back_in_the_writing_process(
    saver: RemitSaver,
) -> None:
    class InnerObject(BaseModel):
        yo: int

    class State(BaseModel):
        query: str
        inner: Annotated[InnerObject, lambda x, y: y]
        answer: str | None = None

    def answer(state: State) -> dict[str, Any]:
        return {"inner": InnerObject(yo=state.inner.yo + 1), "answer": "ok"}

    b = StateGraph(State)
    b.add_node("answer", answer)
    b.add_edge(START, "answer")
    graph = b.compile(checkpointer=saver, interrupt_after=["answer"])
    config = cfg()
    graph.invoke({"query": "q", "inner": InnerObject(yo=1)}, config)
    values = graph.get_state(config).values
    assert isinstance(values["inner"], InnerObject) and values["inner"].yo == 2
    history = [s.values for s in graph.get_state_history(config)]
    assert [v["inner"].yo for v in history if "inner" in v] == [2, 1]
    graph.invoke(None, config)  # resume: reads the state back


CHILD_READ = """
    import sys
    from remit_core import CorruptRecord
    from remit_langgraph import RemitSaver

    url, thread, how = sys.argv[1:]
    options = {}
    if how == "schema":
        from tests.langgraph.test_serde_types import TicketState
        options["schema"] = TicketState
    with RemitSaver.from_conn_string(url, **options) as saver:
        if how == "allow":
            from tests.langgraph.test_serde_types import Ticket
            saver.store.serde.allow(Ticket)
        try:
            got = saver.get_tuple({"configurable": {"thread_id": thread}})
        except CorruptRecord as exc:
            print(type(exc).__name__, getattr(exc, "type_name", "-"))
            print(exc)
        else:
            print("read", got.checkpoint["channel_values"])
"""


def test_another_process_is_told_to_allow_a_local_class(store_url: str) -> None:
    class InnerObject(BaseModel):
        yo: int

    class State(BaseModel):
        inner: Annotated[InnerObject, lambda x, y: y]

    thread = uuid.uuid4().hex
    with RemitSaver.from_conn_string(store_url) as saver:
        b = StateGraph(State)
        b.add_node("keep", lambda s: {"inner": InnerObject(yo=s.inner.yo)})
        b.add_edge(START, "keep")
        b.compile(checkpointer=saver).invoke({"inner": InnerObject(yo=1)}, cfg(thread))
    out = in_child(CHILD_READ, store_url, thread, "plain")
    assert out.returncode == 0, out.stderr
    first, message = out.stdout.split("\n", 1)
    name = f"{__name__}:test_another_process_is_told_to_allow_a_local_class.<locals>.InnerObject"
    assert first == f"UnregisteredType {name}", out.stdout
    assert "store.serde.allow(InnerObject)" in message
    assert "define it at module level" in message


# (spawned interpreters: on PostgreSQL and Redis under REMIT_FULL / nox)
@pytest.mark.slow
@pytest.mark.parametrize("how", ["allow", "schema"])
def test_another_process_reads_a_class_it_allowed(store_url: str, how: str) -> None:
    thread = uuid.uuid4().hex
    with RemitSaver.from_conn_string(store_url) as saver:
        ticket_graph(saver).invoke({"ticket": Ticket(n=1)}, cfg(thread))
    refused = in_child(CHILD_READ, store_url, thread, "plain")
    assert refused.stdout.startswith(f"UnregisteredType {__name__}:Ticket"), refused
    out = in_child(CHILD_READ, store_url, thread, how)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("read ") and "Ticket(n=2)" in out.stdout, out.stdout


# ========================================================================= remit inspect


def test_the_adapter_declares_its_registrations() -> None:
    points = {ep.value for ep in metadata.entry_points(group="remit.serde")}
    assert "remit_langgraph._serde:register_types" in points


def test_remit_inspect_reads_a_langgraph_run(tmp_path: Path) -> None:
    class Local(BaseModel):  # a type no other process can register
        n: int

    class State(BaseModel):
        local: Annotated[Local, lambda x, y: y]
        answer: str = ""

    def ask(state: State) -> dict[str, Any]:
        return {"answer": str(interrupt("approve?"))}

    url = f"sqlite:///{tmp_path / 'app.db'}"
    thread = "inspect-me"
    with RemitSaver.from_conn_string(url) as saver:
        b = StateGraph(State)
        b.add_node("ask", ask)
        b.add_edge(START, "ask")
        graph = b.compile(checkpointer=saver)
        graph.invoke({"local": Local(n=1)}, cfg(thread))  # parks: pending writes, EMPTY
        ids = [s.config["configurable"]["checkpoint_id"] for s in graph.get_state_history(
            cfg(thread))]
    cli = [sys.executable, "-m", "remit_core.cli", "inspect"]
    out = subprocess.run([*cli, url, thread], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "CorruptRecord" not in out.stdout + out.stderr
    for checkpoint_id in ids:
        assert checkpoint_id in out.stdout
    runs = subprocess.run([*cli, url, "--json"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert runs.returncode == 0, runs.stderr
    assert [r["run_id"] for r in json.loads(runs.stdout)["runs"]] == [thread]
