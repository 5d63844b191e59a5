"""RemitSaver under real LangGraph graphs (no LLM), on every backend.

Each scenario runs the same graph twice, on InMemorySaver and on RemitSaver, and
compares what a user sees: final values, ``get_state`` and the shape of
``get_state_history``. Checkpoint ids differ by design (LangGraph's uuid6, or the ids
remit derives for the loop's checkpoints, see the RD section), so they are not
compared across savers.
"""

from __future__ import annotations

import asyncio
import inspect
import operator
import sys
import uuid
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypedDict

import langgraph.checkpoint.base
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command, Interrupt, Send, interrupt

from remit_core import SerializationError, Store
from remit_core.serde import default_serde
from remit_langgraph import RemitSaver, _seam
from remit_langgraph._contract import derive_step_id
from remit_langgraph._serde import EMPTY, storable
from remit_langgraph.saver import next_version
from tests.test_run_lifecycle import likely_new_hints

# the pending-write order a saver must give, where langgraph-checkpoint defines one
# (2.1.x does not)
WRITES_SORT_KEY = hasattr(langgraph.checkpoint.base, "writes_sort_key")

# ================================================================================ fixtures


@pytest.fixture
def saver(store: Store) -> RemitSaver:
    return RemitSaver(store)


def cfg(thread: str | None = None) -> Any:
    return {"configurable": {"thread_id": thread or uuid.uuid4().hex}}


def shape(graph: Any, config: Any) -> list[tuple[Any, ...]]:
    """What get_state_history shows, minus ids and timestamps."""
    return [
        (s.metadata["source"], s.metadata["step"], s.next, s.values)
        for s in graph.get_state_history(config)
    ]


def both(build: Callable[[BaseCheckpointSaver[Any]], Any], saver: RemitSaver) -> tuple[Any, Any]:
    return build(InMemorySaver()), build(saver)


# ================================================================================== graphs


class Linear(TypedDict):
    items: Annotated[list[str], operator.add]
    count: int


def linear_graph(checkpointer: BaseCheckpointSaver[Any]) -> Any:
    b = StateGraph(Linear)
    b.add_node("a", lambda s: {"items": ["a"], "count": s["count"] + 1})
    b.add_node("b", lambda s: {"items": ["b"], "count": s["count"] + 1})
    b.add_node("c", lambda s: {"items": ["c"], "count": s["count"] * 10})
    b.add_edge(START, "a")
    b.add_edge("a", "b")
    b.add_edge("b", "c")
    b.add_edge("c", END)
    return b.compile(checkpointer=checkpointer)


def chat_graph(checkpointer: BaseCheckpointSaver[Any]) -> Any:
    def assistant(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage("calling", id="ai-1", tool_calls=[
            {"name": "lookup", "args": {"q": "x"}, "id": "call-1"}])]}

    def tool(state: MessagesState) -> dict[str, Any]:
        return {"messages": [ToolMessage("42", tool_call_id="call-1", id="tool-1")]}

    b = StateGraph(MessagesState)
    b.add_node("assistant", assistant)
    b.add_node("tool", tool)
    b.add_edge(START, "assistant")
    b.add_edge("assistant", "tool")
    b.add_edge("tool", END)
    return b.compile(checkpointer=checkpointer)


class Ask(TypedDict):
    question: str
    answer: str
    log: Annotated[list[str], operator.add]


def ask_graph(checkpointer: BaseCheckpointSaver[Any]) -> Any:
    def ask(state: Ask) -> dict[str, Any]:
        answer = interrupt({"question": state["question"]})
        return {"answer": answer, "log": ["asked"]}

    b = StateGraph(Ask)
    b.add_node("prepare", lambda s: {"log": ["prepared"]})
    b.add_node("ask", ask)
    b.add_node("finish", lambda s: {"log": [f"done:{s['answer']}"]})
    b.add_edge(START, "prepare")
    b.add_edge("prepare", "ask")
    b.add_edge("ask", "finish")
    b.add_edge("finish", END)
    return b.compile(checkpointer=checkpointer)


class Items(TypedDict):
    items: Annotated[list[str], operator.add]


def nested_graph(checkpointer: BaseCheckpointSaver[Any]) -> Any:
    def approve(state: Items) -> dict[str, Any]:
        return {"items": [f"approved:{interrupt('approve?')}"]}

    sub = StateGraph(Items)
    sub.add_node("s1", lambda s: {"items": ["s1"]})
    sub.add_node("approve", approve)
    sub.add_edge(START, "s1")
    sub.add_edge("s1", "approve")
    sub.add_edge("approve", END)

    b = StateGraph(Items)
    b.add_node("before", lambda s: {"items": ["before"]})
    b.add_node("child", sub.compile())
    b.add_node("after", lambda s: {"items": ["after"]})
    b.add_edge(START, "before")
    b.add_edge("before", "child")
    b.add_edge("child", "after")
    b.add_edge("after", END)
    return b.compile(checkpointer=checkpointer)


class Jokes(TypedDict):
    subjects: list[str]
    jokes: Annotated[list[str], operator.add]


class Subject(TypedDict):
    subject: str


def fanout_graph(checkpointer: BaseCheckpointSaver[Any]) -> Any:
    def joke(state: Subject) -> dict[str, Any]:
        if state["subject"] == "dogs":  # one branch parks; the others' writes must survive
            return {"jokes": [f"dogs: {interrupt('punchline?')}"]}
        return {"jokes": [f"{state['subject']}: ha"]}

    b = StateGraph(Jokes)
    b.add_node("joke", joke)
    b.add_conditional_edges(START, lambda s: [Send("joke", {"subject": x}) for x in s["subjects"]],
                            ["joke"])
    b.add_edge("joke", END)
    return b.compile(checkpointer=checkpointer)


def functional_workflow(checkpointer: BaseCheckpointSaver[Any]) -> Any:
    @task
    def double(x: int) -> int:
        return x * 2

    @entrypoint(checkpointer=checkpointer)
    def workflow(n: int) -> dict[str, Any]:
        doubled = [double(i).result() for i in range(n)]
        approved = interrupt({"doubled": doubled})
        return {"doubled": doubled, "approved": approved}

    return workflow


# =================================================================================== tests


def test_put_writes_declares_task_path(saver: RemitSaver) -> None:
    # the Pregel loop passes task_path only when the signature names it (research 5.3)
    for method in (saver.put_writes, saver.aput_writes):
        param = inspect.signature(method).parameters["task_path"]
        assert param.default == ""


def test_linear_invoke_state_and_history(saver: RemitSaver) -> None:
    mem, rem = both(linear_graph, saver)
    c1, c2 = cfg(), cfg()
    out1 = mem.invoke({"items": [], "count": 0}, c1)
    out2 = rem.invoke({"items": [], "count": 0}, c2)
    assert out2 == out1 == {"items": ["a", "b", "c"], "count": 20}
    assert rem.get_state(c2).values == mem.get_state(c1).values
    assert rem.get_state(c2).next == ()
    assert shape(rem, c2) == shape(mem, c1)
    assert len(shape(rem, c2)) == 5  # input, then one per superstep


def test_langchain_messages_round_trip(saver: RemitSaver) -> None:
    mem, rem = both(chat_graph, saver)
    c1, c2 = cfg(), cfg()
    start = {"messages": [HumanMessage("hi", id="h-1")]}
    assert rem.invoke(start, c2) == mem.invoke(start, c1)
    msgs = rem.get_state(c2).values["messages"]
    assert [type(m) for m in msgs] == [HumanMessage, AIMessage, ToolMessage]
    assert msgs[1].tool_calls[0]["args"] == {"q": "x"}
    assert shape(rem, c2) == shape(mem, c1)


def test_interrupt_and_resume_sync(saver: RemitSaver) -> None:
    mem, rem = both(ask_graph, saver)
    results = []
    for graph, config in ((mem, cfg()), (rem, cfg())):
        parked = graph.invoke({"question": "name?", "answer": "", "log": []}, config)
        (intr,) = parked["__interrupt__"]
        assert isinstance(intr, Interrupt) and intr.value == {"question": "name?"}
        state = graph.get_state(config)
        assert state.next == ("ask",)
        assert [i.value for i in state.interrupts] == [{"question": "name?"}]
        assert state.interrupts[0].id == intr.id
        final = graph.invoke(Command(resume="Ada"), config)
        results.append((final, shape(graph, config)))
    assert results[1] == results[0]
    assert results[1][0]["log"] == ["prepared", "asked", "done:Ada"]


def test_interrupt_and_resume_async(saver: RemitSaver) -> None:
    async def scenario(graph: Any) -> tuple[Any, ...]:
        config = cfg()
        parked = await graph.ainvoke({"question": "q", "answer": "", "log": []}, config)
        assert parked["__interrupt__"][0].value == {"question": "q"}
        assert (await graph.aget_state(config)).next == ("ask",)
        final = await graph.ainvoke(Command(resume="async-yes"), config)
        history = [(s.metadata["source"], s.metadata["step"], s.next, s.values)
                   async for s in graph.aget_state_history(config)]
        return final, history

    mem, rem = both(ask_graph, saver)
    expected = asyncio.run(scenario(mem))
    got = asyncio.run(scenario(rem))
    assert got == expected
    assert got[0]["log"] == ["prepared", "asked", "done:async-yes"]


def test_subgraph_namespace(saver: RemitSaver) -> None:
    mem, rem = both(nested_graph, saver)
    seen = []
    for graph, config in ((mem, cfg()), (rem, cfg())):
        graph.invoke({"items": []}, config)
        state = graph.get_state(config, subgraphs=True)
        assert state.next == ("child",)
        sub_state = state.tasks[0].state
        assert sub_state.next == ("approve",)
        assert sub_state.config["configurable"]["checkpoint_ns"].startswith("child:")
        assert sub_state.values == {"items": ["before", "s1"]}
        final = graph.invoke(Command(resume="yes"), config)
        seen.append((final, shape(graph, config)))
    assert seen[1] == seen[0]
    assert seen[1][0]["items"] == ["before", "before", "s1", "approved:yes", "after"]
    # the subgraph's checkpoints live in their own namespace of the same thread
    namespaces = {t.config["configurable"]["checkpoint_ns"]
                  for t in saver.list({"configurable": {"thread_id": config["configurable"]["thread_id"]}})}
    assert "" in namespaces and any(ns.startswith("child:") for ns in namespaces)


def test_send_fanout_with_parked_branch(saver: RemitSaver) -> None:
    mem, rem = both(fanout_graph, saver)
    seen = []
    for graph, config in ((mem, cfg()), (rem, cfg())):
        parked = graph.invoke({"subjects": ["cats", "dogs", "owls"], "jokes": []}, config)
        assert parked["__interrupt__"][0].value == "punchline?"
        final = graph.invoke(Command(resume="woof"), config)
        seen.append((final, shape(graph, config)))
    assert seen[1] == seen[0]
    assert sorted(seen[1][0]["jokes"]) == ["cats: ha", "dogs: woof", "owls: ha"]


def test_functional_api(saver: RemitSaver) -> None:
    mem, rem = both(functional_workflow, saver)
    seen = []
    for wf, config in ((mem, cfg()), (rem, cfg())):
        wf.invoke(3, config)
        state = wf.get_state(config)
        assert [i.value for i in state.interrupts] == [{"doubled": [0, 2, 4]}]
        final = wf.invoke(Command(resume=True), config)
        seen.append((final, [(s.metadata["source"], s.next, s.values)
                             for s in wf.get_state_history(config)]))
    assert seen[1] == seen[0]
    assert seen[1][0] == {"doubled": [0, 2, 4], "approved": True}


def test_update_state_and_fork(saver: RemitSaver) -> None:
    mem, rem = both(linear_graph, saver)
    seen = []
    for graph, config in ((mem, cfg()), (rem, cfg())):
        graph.invoke({"items": [], "count": 0}, config)
        graph.update_state(config, {"items": ["edited"], "count": 99}, as_node="c")
        after_update = graph.get_state(config)
        assert after_update.metadata["source"] == "update"
        # fork from the checkpoint taken before "b" ran, then continue from it
        before_b = next(s for s in graph.get_state_history(config) if s.next == ("b",))
        fork_config = graph.update_state(before_b.config, {"items": ["forked"]})
        fork_state = graph.get_state(fork_config)
        resumed = graph.invoke(None, fork_config)
        seen.append((after_update.values, fork_state.values, fork_state.next, resumed,
                     shape(graph, config)))
    assert seen[1] == seen[0]  # remit gives what the stock saver gives, on every release
    assert seen[1][0] == {"items": ["a", "b", "c", "edited"], "count": 99}
    # which node an update without as_node is attributed to changed after langgraph 1.0
    # (1.0.0 resumes the fork at "c", 1.2 at "b"); the fork's own value is kept either way
    tail = ["forked", "c"] if seen[1][2] == ("c",) else ["forked", "b", "c"]
    assert seen[1][3]["items"][-len(tail):] == tail


class Flaky(TypedDict):
    log: Annotated[list[str], operator.add]


def test_node_error_is_stored_as_its_repr_like_the_stock_savers(saver: RemitSaver) -> None:
    """An ``__error__`` write reads back as LangGraph's serializer gives it: ``repr(exc)``."""
    calls = {"n": 0}

    def flaky(state: Flaky) -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyError("first attempt fails")
        return {"log": ["flaky ok"]}

    def build(checkpointer: BaseCheckpointSaver[Any]) -> Any:
        b = StateGraph(Flaky)
        b.add_node("first", lambda s: {"log": ["first"]})
        b.add_node("flaky", flaky)
        b.add_edge(START, "first")
        b.add_edge("first", "flaky")
        b.add_edge("flaky", END)
        return b.compile(checkpointer=checkpointer)

    seen = []
    for graph in both(build, saver):
        calls["n"] = 0
        config = cfg()
        with pytest.raises(KeyError):
            graph.invoke({"log": []}, config, durability="sync")
        state = graph.get_state(config)
        assert state.next == ("flaky",)
        (error,) = [t.error for t in state.tasks if t.error is not None]
        seen.append(error)
        assert graph.invoke(None, config) == {"log": ["first", "flaky ok"]}
    stock, remit = seen
    assert remit == stock == "KeyError('first attempt fails')"


def test_error_of_any_class_is_its_repr(saver: RemitSaver) -> None:
    import subprocess

    def boom(state: Flaky) -> dict[str, Any]:
        raise subprocess.CalledProcessError(2, ["ls", "-l"], output=b"x")

    b = StateGraph(Flaky)
    b.add_node("boom", boom)
    b.add_edge(START, "boom")
    graph = b.compile(checkpointer=saver)
    config = cfg()
    with pytest.raises(subprocess.CalledProcessError):
        graph.invoke({"log": []}, config)
    (task_,) = graph.get_state(config).tasks
    assert task_.error == "CalledProcessError(2, ['ls', '-l'])"
    assert "CalledProcessError(" in task_.error


class Holder(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    blob: Any


class Opaque:
    """Neither a pydantic model, a dataclass nor a registered type: not storable."""


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_unserialisable_state_is_refused_and_latest_stays(
    saver: RemitSaver, durability: Literal["sync", "async"]
) -> None:
    b = StateGraph(Holder)
    b.add_node("good", lambda s: {"log": ["good"]})
    b.add_node("bad", lambda s: {"blob": Opaque()})
    b.add_edge(START, "good")
    b.add_edge("good", "bad")
    b.add_edge("bad", END)
    graph = b.compile(checkpointer=saver)
    config = cfg()
    with pytest.raises(SerializationError) as info:
        graph.invoke({"log": []}, config, durability=durability)
    assert info.value.type_name == "Opaque"
    latest = saver.get_tuple(config)
    assert latest is not None
    assert latest.metadata["step"] == 1 and latest.checkpoint["channel_values"]["log"] == ["good"]
    assert "blob" not in latest.checkpoint["channel_values"]
    assert graph.get_state(config).next == ("bad",)


def test_from_conn_string_sync_and_async(store_url: str) -> None:
    thread = cfg()
    with RemitSaver.from_conn_string(store_url) as saver:
        linear_graph(saver).invoke({"items": [], "count": 0}, thread)

    async def read_back() -> Any:
        async with RemitSaver.from_url(store_url) as saver:
            return (await linear_graph(saver).aget_state(thread)).values

    assert asyncio.run(read_back()) == {"items": ["a", "b", "c"], "count": 20}
    opened = RemitSaver.from_conn_string(store_url)
    with opened:
        pass
    with pytest.raises(RuntimeError), opened:
        pass


def test_schema_is_kept(store: Store) -> None:
    assert RemitSaver(store, schema=Linear).schema is Linear
    assert RemitSaver(store).schema is None


# ==================================================================== a LangGraph serializer


def test_a_langgraph_serializer_is_refused_not_ignored(store: Store, store_url: str) -> None:
    """Values go through remit's envelope, so serde= would never be used: it is refused,
    as a constructor argument, through from_conn_string (before anything is opened), and
    as an assignment; the message says what to do instead."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    with pytest.raises(TypeError, match=r"serde= JsonPlusSerializer.*store\.serde\.allow"):
        RemitSaver(store, serde=JsonPlusSerializer(pickle_fallback=True))
    with pytest.raises(TypeError, match="does not take a LangGraph serializer"):
        RemitSaver.from_conn_string(store_url, serde=JsonPlusSerializer())
    saver = RemitSaver(store, serde=None)
    with pytest.raises(TypeError, match=r"saver\.serde = JsonPlusSerializer"):
        saver.serde = JsonPlusSerializer()
    assert saver.serde is BaseCheckpointSaver.serde  # LangGraph's default, unused
    assert saver.with_allowlist({("app.models", "Ticket")}) is saver


STRICT_CHILD = """
import logging, sys
from typing import TypedDict
from langgraph.graph import START, StateGraph
from remit_langgraph import RemitSaver

class S(TypedDict):
    n: int

warnings = []
logging.getLogger().addHandler(type("H", (logging.Handler,), {
    "emit": lambda self, r: warnings.append(r.getMessage())})())
builder = StateGraph(S)
builder.add_node("inc", lambda s: {"n": s["n"] + 1})
builder.add_edge(START, "inc")
with RemitSaver.from_conn_string(sys.argv[1]) as saver:
    graph = builder.compile(checkpointer=saver)
    assert graph.checkpointer is saver, graph.checkpointer
    assert graph.invoke({"n": 1}, {"configurable": {"thread_id": "t"}}) == {"n": 2}
assert not [w for w in warnings if "allowlist" in w], warnings
print("ok")
"""


def test_strict_msgpack_mode_compiles_with_the_saver_itself(store_url: str) -> None:
    """Under LANGGRAPH_STRICT_MSGPACK, compile() asks the checkpointer for a copy with
    LangGraph's msgpack allow-list (with_allowlist): RemitSaver, which does not use
    LangGraph's serializer, is its own answer, and LangGraph logs no warning about it."""
    import os
    import subprocess

    env = {**os.environ, "LANGGRAPH_STRICT_MSGPACK": "true"}
    done = subprocess.run([sys.executable, "-c", STRICT_CHILD, store_url], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


# ================================================================================= envelope


@pytest.mark.parametrize("value", [
    Send("node", {"arg": [1, 2]}),
    Interrupt({"question": "?"}, id="abc"),
    Command(resume={"id-1": "yes"}, update={"k": 1}, goto=[Send("n", 1)]),
    Command(graph=Command.PARENT, goto="elsewhere"),
    [Interrupt("v", id="x"), Interrupt("w", id="y")],
    Interrupt("v", id="z", response_schema={"type": "string"}),
])
def test_langgraph_types_round_trip(value: Any) -> None:
    assert default_serde.decode(default_serde.encode(value)) == value


def test_empty_marker_round_trips() -> None:
    assert default_serde.decode(default_serde.encode(EMPTY)) is EMPTY
    # its record, as stores written before 6e1d20e hold it for a channel with a version
    # and no value: they read it back
    assert default_serde.encode(EMPTY) == b"\x01\xc7\x18\x10\x92\xb5remit_langgraph:empty\xc0"


@pytest.mark.parametrize("exc", [ValueError("bad", 3), RuntimeError(), KeyError("k"),
                                 RuntimeError(Opaque())])
def test_storable_exception_is_its_repr(exc: BaseException) -> None:
    assert storable(exc, default_serde) == repr(exc)
    assert default_serde.decode(default_serde.encode(storable(exc, default_serde))) == repr(exc)


def old_error_record(type_name: str, message: str, args: Any) -> bytes:
    """What remit stored for an exception before it stored ``repr(exc)``."""
    import msgpack  # type: ignore[import-untyped]

    payload = msgpack.packb(["remit_langgraph:error", [type_name, message, args]])
    return b"\x01" + msgpack.packb(msgpack.ExtType(16, payload))


@pytest.mark.parametrize("record, text", [
    (("builtins:ValueError", "('bad', 3)", ["bad", 3]), "ValueError('bad', 3)"),
    (("builtins:RuntimeError", "boom", None), "RuntimeError('boom')"),
    (("subprocess:CalledProcessError", "Command 'ls' returned 1.", [1, "ls"]),
     "CalledProcessError(1, 'ls')"),
    (("remit_test_vanishing_errors:Gone", "it left", ["it left"]), "Gone('it left')"),
])
def test_old_error_records_read_as_the_repr_string(record: Any, text: str) -> None:
    before = set(sys.modules)
    out = default_serde.decode(old_error_record(*record))
    assert out == text and type(out) is str
    assert set(sys.modules) == before


# ========================================================================= saver, directly# ========================================================================= saver, directly


def put_chain(saver: RemitSaver, thread: str, sources: list[str]) -> list[Any]:
    """Checkpoints parent -> child on ``thread``, one per source; returns their configs."""
    stored: list[Any] = []
    for step, source in enumerate(sources):
        config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        if stored:
            config["configurable"]["checkpoint_id"] = stored[-1]["configurable"]["checkpoint_id"]
        metadata: Any = {"source": source, "step": step}
        stored.append(saver.put(config, empty_checkpoint(), metadata, {}))
    return stored


def test_channel_versions_are_stored_once_and_read_back_as_given(
        saver: RemitSaver, store: Store) -> None:
    thread = uuid.uuid4().hex
    config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    as_langgraph = {**empty_checkpoint(), "channel_values": {"a": 1, "b": 2},
                    "channel_versions": {"a": saver.get_next_version(None, None),
                                         "b": saver.get_next_version(None, None)}}
    stored = saver.put(config, as_langgraph, {"source": "loop", "step": 0},
                       as_langgraph["channel_versions"])
    ints = {**empty_checkpoint(), "channel_values": {"a": 3},
            "channel_versions": {"a": 2, "b": 1.5}}
    latest = saver.put(stored, ints, {"source": "loop", "step": 1}, {"a": 2})
    rows = {ck.checkpoint_id: ck for ck in store.list_checkpoints(thread)}
    # LangGraph's string versions live in the store's versions column only
    assert "channel_versions" not in rows[as_langgraph["id"]].data
    assert rows[as_langgraph["id"]].versions == as_langgraph["channel_versions"]
    for sent, at in ((as_langgraph, stored), (ints, latest)):
        got = saver.get_tuple(at)
        assert got is not None and got.checkpoint["channel_versions"] == sent["channel_versions"]
        assert [type(v) for v in got.checkpoint["channel_versions"].values()] == \
            [type(v) for v in sent["channel_versions"].values()]


def test_pending_writes_come_back_in_writes_sort_key_order(saver: RemitSaver) -> None:
    (stored,) = put_chain(saver, uuid.uuid4().hex, ["loop"])
    # task ids sort opposite to task paths: the store's (task_id, idx) order is wrong here
    saver.put_writes(stored, [("x", "late-1"), ("y", "late-2")], "task-a", task_path="~push:2")
    saver.put_writes(stored, [("x", "early")], "task-b", task_path="~push:1")
    saver.put_writes(stored, [("x", "input")], "task-c")  # graph input: no path, first
    saver.put_writes(stored, [(ERROR, ValueError("boom"))], "task-b", task_path="~push:1")
    tup = saver.get_tuple(stored)
    assert tup is not None and tup.pending_writes is not None
    order = [(t, c) for t, c, _ in tup.pending_writes]
    if WRITES_SORT_KEY:
        assert order == [("task-c", "x"), ("task-b", ERROR), ("task-b", "x"),
                         ("task-a", "x"), ("task-a", "y")]
    else:  # langgraph-checkpoint 2.1.x has no writes_sort_key: (task_id, idx), as stock
        assert order == [("task-a", "x"), ("task-a", "y"), ("task-b", ERROR),
                         ("task-b", "x"), ("task-c", "x")]
    # an error write reads back as the stock savers give it: repr(exc)
    assert dict(((t, c), v) for t, c, v in tup.pending_writes)[("task-b", ERROR)] == \
        "ValueError('boom')"


def test_special_writes_replace_regular_writes_stay(saver: RemitSaver) -> None:
    (stored,) = put_chain(saver, uuid.uuid4().hex, ["loop"])
    saver.put_writes(stored, [(INTERRUPT, "first")], "t")
    saver.put_writes(stored, [(INTERRUPT, "second")], "t")  # only special writes: replaced
    saver.put_writes(stored, [("ch", "kept")], "t")
    saver.put_writes(stored, [("ch", "ignored")], "t")  # a repeat keeps the stored write
    tup = saver.get_tuple(stored)
    assert tup is not None
    assert sorted((c, v) for _, c, v in tup.pending_writes or []) == [
        ("__interrupt__", "second"), ("ch", "kept")]


def test_list_applies_limit_after_filter_and_before(saver: RemitSaver) -> None:
    thread = uuid.uuid4().hex
    stored = put_chain(saver, thread, ["input", "loop"] * 5)
    ids = [c["configurable"]["checkpoint_id"] for c in stored]
    base: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    found = list(saver.list(base, filter={"source": "input"}, limit=3))
    assert [t.checkpoint["id"] for t in found] == [ids[8], ids[6], ids[4]]
    found = list(saver.list(base, filter={"source": "loop"}, before=stored[7], limit=2))
    assert [t.checkpoint["id"] for t in found] == [ids[5], ids[3]]
    assert [t.checkpoint["id"] for t in saver.list(base, limit=2)] == [ids[9], ids[8]]
    assert list(saver.list(base, limit=0)) == []
    one: Any = {"configurable": {**base["configurable"], "checkpoint_id": ids[2]}}
    assert [t.checkpoint["id"] for t in saver.list(one, limit=1)] == [ids[2]]
    assert [t.metadata["step"] for t in saver.list(base, filter={"step": 4})] == [4]
    assert list(saver.list(base, filter={"source": "update"})) == []


def test_alist_matches_list(saver: RemitSaver) -> None:
    thread = uuid.uuid4().hex
    put_chain(saver, thread, ["input", "loop", "loop"])
    base: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}

    async def collect() -> list[Any]:
        return [t async for t in saver.alist(base, filter={"source": "loop"}, limit=5)]

    assert asyncio.run(collect()) == list(saver.list(base, filter={"source": "loop"}, limit=5))


def test_channel_without_value_reads_back_absent(saver: RemitSaver) -> None:
    thread = uuid.uuid4().hex
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"a": 1}
    checkpoint["channel_versions"] = {"a": "1", "gone": "1"}
    config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    stored = saver.put(config, checkpoint, {"source": "loop", "step": 0}, {"a": "1", "gone": "1"})
    tup = saver.get_tuple(stored)
    assert tup is not None
    assert tup.checkpoint["channel_values"] == {"a": 1}
    assert tup.checkpoint["channel_versions"] == {"a": "1", "gone": "1"}


def test_a_channel_a_step_empties_stores_its_version_and_no_value(
        saver: RemitSaver, store: Store) -> None:
    config = cfg()
    thread = config["configurable"]["thread_id"]
    assert linear_graph(saver).invoke({"items": [], "count": 1}, config)["count"] == 30
    checkpoints = list(store.list_checkpoints(thread))
    emptied = {ch for ck in checkpoints for ch in ck.versions if ch not in ck.values}
    assert {"branch:to:a", "branch:to:b", "branch:to:c"} <= emptied  # each node's trigger
    assert all(v is not EMPTY for ck in checkpoints for v in ck.values.values())
    latest = saver.get_tuple(config)
    assert latest is not None
    assert latest.checkpoint["channel_values"] == {"items": ["a", "b", "c"], "count": 30}
    assert set(latest.checkpoint["channel_versions"]) >= emptied


def test_a_no_value_marker_stored_before_reads_as_no_value(saver: RemitSaver,
                                                           store: Store) -> None:
    thread = uuid.uuid4().hex
    checkpoint_id = str(uuid.uuid4())
    # as a checkpoint was written before: the emptied channel's version with EMPTY stored
    store.put_checkpoint(thread, checkpoint_id, data={"v": 4, "ts": "2026-12-07T00:00:00",
                                                     "id": checkpoint_id,
                                                     "versions_seen": {},
                                                     "updated_channels": None},
                         metadata={"source": "loop", "step": 0},
                         new_values={"a": ("1", 1), "gone": ("1", EMPTY)})
    assert store.get_checkpoint(thread, checkpoint_id).values["gone"] is EMPTY
    config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    tup = saver.get_tuple(config)
    assert tup is not None
    assert tup.checkpoint["channel_values"] == {"a": 1}
    assert tup.checkpoint["channel_versions"] == {"a": "1", "gone": "1"}


def test_next_version_is_ordered_and_unique(saver: RemitSaver) -> None:
    first = saver.get_next_version(None, None)
    again = saver.get_next_version(None, None)
    assert first.startswith("a1.") and first != again  # forks must not share a version
    assert len(first) == 14  # the stock savers' shape takes 51 characters
    assert saver.get_next_version(first, None).startswith("a2.")
    assert saver.get_next_version(7, None).startswith("a8.")  # type: ignore[arg-type]
    assert saver.get_next_version("1", None).startswith("a2.")  # another saver's "1"
    chain = [first]
    for _ in range(1100):
        chain.append(saver.get_next_version(chain[-1], None))
    assert chain == sorted(chain) and len(set(chain)) == len(chain)
    assert chain[9].startswith("b10.") and chain[-1].startswith("d1101.")


@settings(max_examples=300)
@given(n=st.integers(0, 10**25 - 2), shape=st.sampled_from(["int", "stock", "remit"]),
       other=st.integers(0, 10**25 - 2))
def test_a_next_version_sorts_above_any_version_it_follows(n: int, shape: str,
                                                           other: int) -> None:
    """LangGraph compares versions as strings (``version > seen``, ``max`` of them): the
    next version of any n sorts above every version whose counter is at most n, of
    remit's shape or of the stock savers' (a thread begun on a stock saver goes on)."""
    current: Any
    if shape == "int":
        current = n
    elif shape == "stock":
        current = f"{n:032}.{0.5:016}"
    else:  # remit's own shape has no counter 0: its first version is a1
        n = max(n, 1)
        current = next_version(n - 1 if n > 1 else None)
    after = next_version(current)
    assert after.startswith(f"{chr(96 + len(str(n + 1)))}{n + 1}.")
    low = min(other, n)
    assert after > f"{low:032}.{0.99:016}"  # above every stock-shaped version up to n
    if low:
        assert after > next_version(low - 1)  # and every remit-shaped one
    assert next_version(after).startswith(f"{chr(96 + len(str(n + 2)))}{n + 2}.")


@pytest.mark.parametrize("version", ["", "x", "Z12.3", "b1.x", "\u00b2", "c1.5", -3])
def test_a_version_of_no_known_shape_is_a_clear_error(version: Any) -> None:
    with pytest.raises(ValueError, match="cannot go on from the channel version"):
        next_version(version)


def test_prune_rejects_a_bare_string_and_unknown_strategy(saver: RemitSaver) -> None:
    with pytest.raises(TypeError):
        saver.prune("thread")
    with pytest.raises(ValueError):
        saver.prune(["thread"], strategy="keep_some")


def test_unsupported_write_raises_at_put_writes(saver: RemitSaver) -> None:
    (stored,) = put_chain(saver, uuid.uuid4().hex, ["input"])
    with pytest.raises(SerializationError):
        saver.put_writes(stored, [("ch", Opaque())], "task-1")
    tup = saver.get_tuple(stored)
    assert tup is not None and tup.pending_writes == []


# ========================================================================== RD: derived ids


def ids_of(saver: BaseCheckpointSaver[Any], config: Any) -> list[str]:
    return [t.config["configurable"]["checkpoint_id"] for t in saver.list(config)]


def rederived(saver: BaseCheckpointSaver[Any], config: Any, serde: Any) -> dict[str, bool]:
    """For each stored ``source="loop"`` checkpoint: whether its id is the one
    :func:`derive_step_id` gives for its parent, step and the writes stored as the
    parent's pending writes (per task, control writes left out)."""
    history = list(saver.list(config))
    by_id = {t.config["configurable"]["checkpoint_id"]: t for t in history}
    out = {}
    for t in history:
        if t.metadata["source"] != "loop" or t.parent_config is None:
            continue
        own = t.config["configurable"]["checkpoint_id"]
        parent = by_id[t.parent_config["configurable"]["checkpoint_id"]]
        tasks: dict[str, list[tuple[str, Any]]] = {}
        for task_id, channel, value in parent.pending_writes or ():
            if task_id != _seam.NULL_TASK_ID and channel not in _seam.CONTROL_WRITES:
                tasks.setdefault(task_id, []).append((channel, value))
        out[own] = own == derive_step_id(str(config["configurable"]["thread_id"]), "",
                                         parent.checkpoint, t.metadata["step"], t.checkpoint,
                                         sorted(tasks.items()), serde=serde)
    return out


@pytest.mark.parametrize("api", ["invoke", "ainvoke"])
def test_loop_checkpoints_get_derived_ids(saver: RemitSaver, api: str) -> None:
    graph, config = linear_graph(saver), cfg()
    if api == "invoke":
        graph.invoke({"items": [], "count": 0}, config)
    else:
        asyncio.run(graph.ainvoke({"items": [], "count": 0}, config))
    derived = rederived(saver, config, saver.store.serde)
    assert len(derived) == 4 and all(derived.values())  # every superstep; not the input
    history = list(saver.list(config))
    for t in history:
        if t.metadata["source"] == "loop":
            own = uuid.UUID(t.config["configurable"]["checkpoint_id"])
            assert own.version == 6 and (own.int >> 48) & 0x3FFF == t.metadata["step"]
    ids = ids_of(saver, config)  # newest first (store order): also descending id order
    assert ids == sorted(ids, reverse=True)

    mem, mem_config = InMemorySaver(), cfg()  # another saver's loop keeps LangGraph's ids
    linear_graph(mem).invoke({"items": [], "count": 0}, mem_config)
    kept = rederived(mem, mem_config, saver.store.serde)
    assert len(kept) == 4 and not any(kept.values())


def _extend(current: list[str], writes: list[list[str]]) -> list[str]:
    return [*current, *(x for w in writes for x in w)]


if _seam.DeltaChannel is not None:
    class DeltaLog(TypedDict, total=False):
        log: Annotated[list[str], _seam.DeltaChannel(_extend)]


@pytest.mark.skipif(_seam.DeltaChannel is None, reason="this langgraph has no DeltaChannel")
def test_a_graph_with_a_delta_channel_gets_derived_ids(saver: RemitSaver) -> None:
    """A delta channel's value is not in the checkpoint; the id is derived from the
    step's writes, so two runs that write differently get different children."""
    def build(word: str) -> Any:
        return (StateGraph(DeltaLog).add_node("a", lambda s: {"log": [word]})
                .add_node("b", lambda s: {"log": [f"{word}!"]})
                .add_edge(START, "a").add_edge("a", "b").compile(checkpointer=saver))

    config = cfg()
    assert build("x").invoke({"log": ["in"]}, config) == {"log": ["in", "x", "x!"]}
    derived = rederived(saver, config, saver.store.serde)
    assert len(derived) == 3 and all(derived.values())  # START, a, b
    head = saver.get_tuple(config)
    assert head is not None and head.parent_config is not None
    parent = saver.get_tuple(head.parent_config)
    assert parent is not None
    other = derive_step_id(str(config["configurable"]["thread_id"]), "", parent.checkpoint,
                           head.metadata["step"], head.checkpoint,
                           [(t, [("log", ["y!"])]) for t, _, _ in parent.pending_writes],
                           serde=saver.store.serde)
    assert other != head.config["configurable"]["checkpoint_id"]


def test_recovering_one_state_twice_gives_the_same_ids(saver: RemitSaver) -> None:
    """RD in one process on every backend: recover, undo the recovery with
    ``delete_for_runs``, recover again."""
    down = {"on": True}

    def flaky(state: Flaky) -> dict[str, Any]:
        if down["on"]:
            raise KeyError("down")
        return {"log": ["flaky ok"]}

    b = StateGraph(Flaky)
    b.add_node("first", lambda s: {"log": ["first"]})
    b.add_node("flaky", flaky)
    b.add_node("last", lambda s: {"log": ["last"]})
    b.add_edge(START, "first")
    b.add_edge("first", "flaky")
    b.add_edge("flaky", "last")
    b.add_edge("last", END)
    graph, config = b.compile(checkpointer=saver), cfg()
    with pytest.raises(KeyError):
        graph.invoke({"log": []}, config, durability="sync")
    crashed = ids_of(saver, config)
    down["on"] = False
    recoveries = []
    for _ in range(2):
        run_id = str(uuid.uuid4())
        out = graph.invoke(None, {**config, "metadata": {"run_id": run_id}})
        recoveries.append((out, [i for i in ids_of(saver, config) if i not in crashed]))
        saver.delete_for_runs([run_id])
        assert ids_of(saver, config) == crashed
    assert recoveries[0] == recoveries[1]
    assert recoveries[0][0] == {"log": ["first", "flaky ok", "last"]}
    assert len(recoveries[0][1]) == 2


def test_time_travel_keeps_langgraph_ids(saver: RemitSaver) -> None:
    """A run that addresses a past checkpoint branches off with fresh ids, as on the
    stock savers: replaying twice gives two branches, not one."""
    sizes = []
    for checkpointer in (InMemorySaver(), saver):
        graph, config = linear_graph(checkpointer), cfg()
        graph.invoke({"items": [], "count": 0}, config)
        past = next(s for s in graph.get_state_history(config) if s.next == ("b",))
        branches = []
        for _ in range(2):
            before = set(ids_of(checkpointer, config))
            assert graph.invoke(None, past.config) == {"items": ["a", "b", "c"], "count": 20}
            branches.append([i for i in ids_of(checkpointer, config) if i not in before])
        assert not set(branches[0]) & set(branches[1])
        sizes.append([len(b) for b in branches])
    # b and c, after a fork checkpoint on langgraph 1.2 (1.0.0 stores none): as stock
    assert sizes[1] == sizes[0] and sizes[1][0] == sizes[1][1] >= 2


def test_a_parent_bound_keeps_the_subgraph_checkpoints_made_before_it(
        saver: RemitSaver) -> None:
    """LangGraph's subgraph replay lists a subgraph's history ``before`` a checkpoint of
    the root. Under ``durability="async"`` the root's checkpoint can be stored after the
    subgraph's next ones; what counts, as with the stock savers' time-ordered ids, is
    when each was made. (Seen failing with the store order: the newest subgraph
    checkpoint stored before the root's, one made after it, came first.)"""
    thread = uuid.uuid4().hex
    inner_ns = "mid|inner"
    made: list[tuple[str, Any]] = []  # (ns, checkpoint) in the order LangGraph makes them
    made += [(inner_ns, empty_checkpoint()) for _ in range(10)]
    made += [("", empty_checkpoint())]  # the root's checkpoint: the replay's bound
    made += [(inner_ns, empty_checkpoint()) for _ in range(3)]
    made += [("mid", empty_checkpoint())]
    bound = made[10][1]
    # stored in another order: the root's checkpoint last, as a lagging async put is
    stored_order = [*made[:10], *made[11:], made[10]]
    results = {}
    for name, target in (("stock", InMemorySaver()), ("remit", saver)):
        last: dict[str, str] = {}
        for ns, checkpoint in stored_order:
            config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}
            if ns in last:
                config["configurable"]["checkpoint_id"] = last[ns]
            target.put(config, checkpoint, {"source": "loop", "step": len(last)}, {})
            last[ns] = checkpoint["id"]
        inner: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": inner_ns}}
        # as LangGraph's replay gives it (the id alone), and as a whole config
        bare: Any = {"configurable": {"checkpoint_id": bound["id"]}}
        named: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": "",
                                       "checkpoint_id": bound["id"]}}
        results[name] = tuple(
            (
                [t.checkpoint["id"] for t in target.list(inner, before=before, limit=1)],
                [t.checkpoint["id"] for t in target.list(inner, before=before)],
                [t.checkpoint["id"] for t in target.list(inner, before=before, limit=9)],
            )
            for before in (bare, named))
    made_before = [c["id"] for ns, c in reversed(made[:10])]
    assert results["stock"] == (([made_before[0]], made_before, made_before[:9]),) * 2
    assert results["remit"] == results["stock"]
    # within one namespace ``before`` is unchanged: what was stored before it
    mid_bound: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": inner_ns,
                                       "checkpoint_id": made[12][1]["id"]}}
    inner = {"configurable": {"thread_id": thread, "checkpoint_ns": inner_ns}}
    assert [t.checkpoint["id"] for t in saver.list(inner, before=mid_bound)] == \
        [made[11][1]["id"], *made_before]


def test_a_threads_first_invoke_starts_its_run_as_likely_new(
        saver: RemitSaver, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's start tells the store whether the load found a checkpoint: a new thread's
    first invoke starts its run as ``likely_new`` (PostgreSQL then inserts it in one
    statement), a later one as a run that exists; both record the same lifecycle."""
    hints = likely_new_hints(saver.store, monkeypatch)
    graph = linear_graph(saver)
    config = cfg()
    first = graph.invoke({"items": [], "count": 0}, config)
    assert graph.invoke({"items": [], "count": 0}, config)["count"] == first["count"]
    asyncio.run(graph.ainvoke({"items": [], "count": 0}, cfg()))
    assert hints == [True, False, True]
    thread = config["configurable"]["thread_id"]
    run = saver.store.get_run(thread)
    assert run is not None and run.status == "done" and run.attempts == 2
