"""RemitSaver as a drop-in: what everyday human-in-the-loop code does, on every backend,
sync and async (issue 12). Each test is one way users resume a LangGraph graph that the
consume-once gate used to refuse or get wrong:

* a dict or a list as the resume value (only a map of interrupt ids is a map);
* resuming with ``graph.get_state(cfg).config`` (LangGraph loads twice then);
* a graph with a delta channel (LangGraph reads the channel's history while it enters);
* a claim given back on every way out of an invocation: LangGraph refusing the resume,
  the resumed node raising, a stream closed early, an async task cancelled;
* a later interrupt that reuses an answered interrupt id at one checkpoint;
* ``Command(resume=...)`` at a static breakpoint;
* LangGraph's strict resume: LangGraph's own ``UnknownInterruptError``, not remit's.

The contract still holds in each: a second delivery of a consumed value is refused.
The seam checks (a LangGraph internal moved or undone: a loud error, never a run with
consume-once off) are at the end.
"""

from __future__ import annotations

import asyncio
import dataclasses
import operator
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from typing import Annotated, Any

import pytest
from langgraph.func import entrypoint, task
from langgraph.graph import START, StateGraph
from langgraph.types import Command, Interrupt, Send, interrupt
from pydantic import BaseModel
from typing_extensions import TypedDict

from remit_core import ConsumeConflict, Store
from remit_langgraph import RemitSaver, _seam

MODES = ["sync", "async"]


class State(TypedDict, total=False):
    log: Annotated[list[str], operator.add]


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def saver(store: Store) -> Iterator[RemitSaver]:
    yield RemitSaver(store)


def run(graph: Any, value: Any, config: dict[str, Any], mode: str, **kwargs: Any) -> Any:
    """``graph.invoke`` or ``graph.ainvoke``, as the test's mode says."""
    if mode == "sync":
        return graph.invoke(value, config, **kwargs)
    return asyncio.run(graph.ainvoke(value, config, **kwargs))


def thread() -> dict[str, Any]:
    return {"configurable": {"thread_id": f"t-{uuid.uuid4().hex[:8]}"}}


def held(saver: RemitSaver, config: dict[str, Any]) -> list[str]:
    """Claims of the thread still held by someone."""
    return [c.key for c in saver.store.list_claims(config["configurable"]["thread_id"])
            if c.status == "claimed"]


def approval(saver: RemitSaver, *, fail_once: list[str] | None = None) -> Any:
    def ask(state: State) -> dict[str, Any]:
        answer = interrupt("approve?")
        if fail_once:
            raise RuntimeError(fail_once.pop())
        return {"log": [f"ask:{answer!r}"]}

    return (StateGraph(State).add_node("ask", ask).add_node("after", lambda s: {"log": ["after"]})
            .add_edge(START, "ask").add_edge("ask", "after").compile(checkpointer=saver))


def parallel(saver: RemitSaver) -> Any:
    def a(state: State) -> dict[str, Any]:
        return {"log": [f"a:{interrupt('a?')}"]}

    def b(state: State) -> dict[str, Any]:
        return {"log": [f"b:{interrupt('b?')}"]}

    return (StateGraph(State).add_node("a", a).add_node("b", b)
            .add_edge(START, "a").add_edge(START, "b").compile(checkpointer=saver))


def ask_twice(saver: RemitSaver) -> Any:
    def ask(state: State) -> dict[str, Any]:
        first = interrupt("first?")
        second = interrupt("second?")
        return {"log": [f"{first},{second}"]}

    return StateGraph(State).add_node("ask", ask).add_edge(START, "ask").compile(
        checkpointer=saver)


def extend(current: list[str], writes: list[list[str]]) -> list[str]:
    return [*current, *(x for w in writes for x in w)]


if _seam.DeltaChannel is not None:
    class DeltaState(TypedDict, total=False):
        log: Annotated[list[str], _seam.DeltaChannel(extend)]


def pending(graph: Any, config: dict[str, Any]) -> dict[str, str]:
    return {i.value: i.id for i in graph.get_state(config).interrupts}


# ==================================================================== what a resume carries


@pytest.mark.parametrize("value", [{"approved": True}, {"approved": False, "note": "no"},
                                   ["a", {"b": 1}], {"": "empty key"}],
                         ids=["dict", "dict2", "list", "dict-empty-key"])
def test_a_dict_or_list_resume_value_is_a_value(saver: RemitSaver, mode: str,
                                                value: Any) -> None:
    """Only a dict whose every key is an interrupt id answers interrupts by id; any
    other dict is the value itself (LangGraph's rule)."""
    graph = approval(saver)
    config = thread()
    run(graph, {"log": []}, config, mode)

    result = run(graph, Command(resume=value), config, mode)

    assert result["log"] == [f"ask:{value!r}", "after"]
    with pytest.raises(ConsumeConflict):  # still consumed once
        run(graph, Command(resume=value), config, mode)
    assert held(saver, config) == []


def test_resume_with_the_config_get_state_returns(saver: RemitSaver, mode: str) -> None:
    """``invoke(Command(resume=v), graph.get_state(cfg).config)``: the config names the
    head checkpoint, so LangGraph loads the head a second time to see whether the thread
    moved on; one invocation is one claim however many loads it makes."""
    graph = approval(saver)
    config = thread()
    run(graph, {"log": []}, config, mode)
    head = graph.get_state(config).config

    result = run(graph, Command(resume="yes"), head, mode)

    assert result["log"] == ["ask:'yes'", "after"]
    with pytest.raises(ConsumeConflict, match=r"answered already|no pending interrupt"):
        run(graph, Command(resume="again"), head, mode)


@pytest.mark.skipif(_seam.DeltaChannel is None, reason="this langgraph has no DeltaChannel")
def test_a_graph_with_a_delta_channel_resumes(saver: RemitSaver, mode: str) -> None:
    """A delta channel makes LangGraph read the channel's history while the loop enters."""
    def ask(state: DeltaState) -> dict[str, Any]:
        return {"log": [f"ask:{interrupt('approve?')}"]}

    graph = (StateGraph(DeltaState).add_node("first", lambda s: {"log": ["first"]})
             .add_node("ask", ask).add_edge(START, "first").add_edge("first", "ask")
             .compile(checkpointer=saver))
    config = thread()
    run(graph, {"log": ["in"]}, config, mode)

    result = run(graph, Command(resume={"ok": 1}), config, mode)

    assert result["log"] == ["in", "first", "ask:{'ok': 1}"]
    with pytest.raises(ConsumeConflict):
        run(graph, Command(resume={"ok": 2}), config, mode)


def test_a_later_interrupt_reusing_an_answered_id_is_answered(saver: RemitSaver,
                                                              mode: str) -> None:
    """A node that interrupts twice parks two instances at one checkpoint; when the
    second carries the first one's id (as stored by older releases), it is still a
    new instance: the claim key names the instance, not only the id."""
    graph = ask_twice(saver)
    config = thread()
    run(graph, {"log": []}, config, mode)
    (card,) = graph.get_state(config).interrupts
    run(graph, Command(resume={card.id: "1"}), config, mode)
    state = graph.get_state(config)
    saver.put_writes(state.config, [("__interrupt__", (Interrupt(value="second?", id=card.id),))],
                     state.tasks[0].id)

    result = run(graph, Command(resume={card.id: "2"}), config, mode)

    assert result["log"] == ["1,2"]


def test_each_interrupt_of_a_node_takes_one_answer(saver: RemitSaver, mode: str) -> None:
    graph = ask_twice(saver)
    config = thread()
    run(graph, {"log": []}, config, mode)
    run(graph, Command(resume="1"), config, mode)

    assert run(graph, Command(resume="2"), config, mode)["log"] == ["1,2"]
    with pytest.raises(ConsumeConflict):
        run(graph, Command(resume="3"), config, mode)


class Approval(BaseModel):
    approved: bool
    note: str = ""
    tags: list[str] = []


def test_a_pydantic_model_resume_value(saver: RemitSaver, mode: str) -> None:
    graph = approval(saver)
    config = thread()
    run(graph, {"log": []}, config, mode)
    answer = Approval(approved=True, note="ok", tags=["a", "b"])

    result = run(graph, Command(resume=answer), config, mode)

    assert result["log"] == [f"ask:{answer!r}", "after"]
    with pytest.raises(ConsumeConflict):
        run(graph, Command(resume=answer), config, mode)


def test_an_interrupt_inside_a_subgraph(saver: RemitSaver, mode: str) -> None:
    def inner(state: State) -> dict[str, Any]:
        return {"log": [f"inner:{interrupt('sub?')}"]}

    sub = StateGraph(State).add_node("inner", inner).add_edge(START, "inner").compile()
    graph = (StateGraph(State).add_node("sub", sub).add_node("after", lambda s: {"log": ["after"]})
             .add_edge(START, "sub").add_edge("sub", "after").compile(checkpointer=saver))
    config = thread()
    run(graph, {"log": []}, config, mode)
    assert [i.value for i in graph.get_state(config).interrupts] == ["sub?"]

    result = run(graph, Command(resume={"approved": True}), config, mode)

    assert result["log"] == ["inner:{'approved': True}", "after"]
    with pytest.raises(ConsumeConflict):
        run(graph, Command(resume={"approved": False}), config, mode)


class Fan(TypedDict, total=False):
    items: list[str]
    log: Annotated[list[str], operator.add]


def test_send_tasks_each_interrupt_and_one_map_answers_them(saver: RemitSaver,
                                                           mode: str) -> None:
    def review(item: dict[str, str]) -> dict[str, Any]:
        return {"log": [f"{item['item']}:{interrupt(item['item'])}"]}

    graph = (StateGraph(Fan).add_node("review", review)
             .add_conditional_edges(START, lambda s: [Send("review", {"item": i})
                                                      for i in s["items"]], ["review"])
             .compile(checkpointer=saver))
    config = thread()
    run(graph, {"items": ["x", "y", "z"], "log": []}, config, mode)
    ids = pending(graph, config)
    assert sorted(ids) == ["x", "y", "z"]

    answers = {ids[v]: {"ok": v != "y", "by": ["me"]} for v in ids}
    result = run(graph, Command(resume=answers), config, mode)

    assert sorted(result["log"]) == sorted(f"{v}:{answers[ids[v]]!r}" for v in ids)
    with pytest.raises(ConsumeConflict):
        run(graph, Command(resume=answers), config, mode)


def test_the_functional_api(saver: RemitSaver, mode: str) -> None:
    @task
    def prepare(order: dict[str, Any]) -> str:
        return f"order {order['id']}"

    @entrypoint(checkpointer=saver)
    def workflow(order: dict[str, Any]) -> dict[str, Any]:
        text = prepare(order).result()
        answer = interrupt({"question": f"approve {text}?"})
        return {"text": text, "answer": answer}

    config = thread()
    run(workflow, {"id": 7}, config, mode)

    result = run(workflow, Command(resume={"approved": True, "by": "ops"}), config, mode)

    assert result == {"text": "order 7", "answer": {"approved": True, "by": "ops"}}
    with pytest.raises(ConsumeConflict):
        run(workflow, Command(resume={"approved": False}), config, mode)


# ============================================================ a claim ends with its invocation


def test_a_claim_is_released_when_langgraph_refuses_the_resume(saver: RemitSaver,
                                                              mode: str) -> None:
    """One value for two pending interrupts: LangGraph refuses it (after remit claimed);
    the claim is given back at once, however long the exception is kept alive, so the
    user's next, correct resume proceeds."""
    graph = parallel(saver)
    config = thread()
    run(graph, {"log": []}, config, mode)

    with pytest.raises(RuntimeError, match="multiple pending interrupts") as refused:
        run(graph, Command(resume="yes"), config, mode)

    assert refused.value is not None and held(saver, config) == []
    ids = pending(graph, config)
    result = run(graph, Command(resume={ids["a?"]: "1", ids["b?"]: "2"}), config, mode)
    assert sorted(result["log"]) == ["a:1", "b:2"]


def test_a_claim_is_released_when_the_resumed_node_raises(saver: RemitSaver,
                                                         mode: str) -> None:
    graph = approval(saver, fail_once=["flaky api"])
    config = thread()
    run(graph, {"log": []}, config, mode)

    with pytest.raises(RuntimeError, match="flaky api"):
        run(graph, Command(resume="first"), config, mode)

    assert held(saver, config) == []
    assert run(graph, Command(resume="second"), config, mode)["log"][-1] == "after"


def test_a_claim_is_released_when_a_stream_is_closed_early(saver: RemitSaver) -> None:
    """A consumer that stops reading a stream closes the invocation."""
    release: list[str] = []

    def ask(state: State) -> dict[str, Any]:
        answer = interrupt("approve?")
        release.append(answer)
        return {"log": [f"ask:{answer}"]}

    graph = (StateGraph(State).add_node("ask", ask).add_node("b", lambda s: {"log": ["b"]})
             .add_edge(START, "ask").add_edge("ask", "b").compile(checkpointer=saver))
    config = thread()
    graph.invoke({"log": []}, config)
    stream = graph.stream(Command(resume="yes"), config, stream_mode="debug")
    next(stream)  # the first task has started; the claim is held
    assert len(held(saver, config)) == 1

    stream.close()

    assert held(saver, config) == []


def test_a_claim_is_released_when_the_async_task_is_cancelled(saver: RemitSaver) -> None:
    async def main() -> list[str]:
        entered = asyncio.Event()
        gate = asyncio.Event()

        async def ask(state: State) -> dict[str, Any]:
            answer = interrupt("approve?")
            entered.set()
            await gate.wait()  # never set: the task is cancelled here
            return {"log": [answer]}

        graph = StateGraph(State).add_node("ask", ask).add_edge(START, "ask").compile(
            checkpointer=saver)
        config = thread()
        await graph.ainvoke({"log": []}, config)
        task = asyncio.create_task(graph.ainvoke(Command(resume="yes"), config))
        await entered.wait()
        assert len(held(saver, config)) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return held(saver, config)

    assert asyncio.run(main()) == []


# ============================================================ breakpoints and strict resume


def test_a_resume_at_a_static_breakpoint_continues_once(saver: RemitSaver, mode: str) -> None:
    graph = (StateGraph(State).add_node("a", lambda s: {"log": ["a"]})
             .add_node("b", lambda s: {"log": ["b"]}).add_edge(START, "a").add_edge("a", "b")
             .compile(checkpointer=saver, interrupt_before=["b"]))
    config = thread()
    assert run(graph, {"log": []}, config, mode) == {"log": ["a"]}
    at_breakpoint = graph.get_state(config).config
    assert graph.get_state(config).next == ("b",)

    assert run(graph, Command(resume="go"), config, mode) == {"log": ["a", "b"]}
    with pytest.raises(ConsumeConflict):  # the same breakpoint, delivered again
        run(graph, Command(resume="go"), at_breakpoint, mode)


strict_resume = pytest.mark.skipif(_seam.CONFIG_KEY_STRICT_RESUME is None,
                                   reason="this langgraph has no strict resume")


def strict(config: dict[str, Any], on: bool = True) -> dict[str, Any]:
    return {"configurable": {**config["configurable"], _seam.CONFIG_KEY_STRICT_RESUME: on}}


@strict_resume
def test_strict_resume_refuses_an_unknown_id_with_langgraphs_error(saver: RemitSaver,
                                                                   mode: str) -> None:
    from langgraph.errors import UnknownInterruptError

    graph = parallel(saver)
    config = strict(thread())
    run(graph, {"log": []}, config, mode)

    with pytest.raises(UnknownInterruptError) as refused:
        run(graph, Command(resume={"0" * 32: "x"}), config, mode)

    assert not isinstance(refused.value, ConsumeConflict)
    assert held(saver, config) == []
    ids = pending(graph, config)
    result = run(graph, Command(resume={ids["a?"]: "1", ids["b?"]: "2"}), config, mode)
    assert sorted(result["log"]) == ["a:1", "b:2"]


@strict_resume
def test_strict_resume_refuses_an_answered_id_with_langgraphs_error(saver: RemitSaver,
                                                                    mode: str) -> None:
    from langgraph.errors import UnknownInterruptError

    graph = parallel(saver)
    config = strict(thread())
    run(graph, {"log": []}, config, mode)
    ids = pending(graph, config)
    run(graph, Command(resume={ids["a?"]: "yes"}), config, mode)

    with pytest.raises(UnknownInterruptError, match=ids["a?"]):
        run(graph, Command(resume={ids["a?"]: "again"}), config, mode)


def test_an_answered_id_is_refused_by_remit_without_strict_resume(saver: RemitSaver,
                                                                  mode: str) -> None:
    """Without strict resume LangGraph ignores a map entry for an answered interrupt (the
    value is never read); that is a second delivery, which remit refuses (CO). An id
    nobody ever answered is LangGraph's business, and it ignores it."""
    graph = parallel(saver)
    config = thread()
    run(graph, {"log": []}, config, mode)
    ids = pending(graph, config)
    run(graph, Command(resume={"f" * 32: "nobody's"}), config, mode)  # ignored, as stock
    run(graph, Command(resume={ids["a?"]: "yes"}), config, mode)

    with pytest.raises(ConsumeConflict, match="answered already") as refused:
        run(graph, Command(resume={ids["a?"]: "again"}), config, mode)

    assert refused.value.status == "consumed"
    assert run(graph, Command(resume={ids["b?"]: "no"}), config, mode)["log"] == ["a:yes", "b:no"]


# ============================================================ what a failed or local value reads


def test_a_node_error_reads_back_as_the_stock_savers_give_it(saver: RemitSaver,
                                                            mode: str) -> None:
    """An ``__error__`` write is what LangGraph's serializer makes of an exception: its
    repr, a str (user code does ``"RuntimeError(" in task.error``)."""
    def fail(state: State) -> dict[str, Any]:
        raise RuntimeError("card declined")

    graph = StateGraph(State).add_node("pay", fail).add_edge(START, "pay").compile(
        checkpointer=saver)
    config = thread()
    with pytest.raises(RuntimeError, match="card declined"):
        run(graph, {"log": []}, config, mode)

    state = graph.get_state(config) if mode == "sync" else asyncio.run(graph.aget_state(config))
    (task,) = state.tasks
    assert task.error == "RuntimeError('card declined')" and "RuntimeError(" in task.error
    writes = saver.get_tuple(config).pending_writes  # type: ignore[union-attr]
    assert [v for _, ch, v in writes if ch == "__error__"] == ["RuntimeError('card declined')"]


def test_a_class_defined_inside_a_function_reads_back(saver: RemitSaver, mode: str) -> None:
    """A state value of a class declared in a function (``<locals>``) is read back by
    the process that wrote it: the thread stays readable and resumable."""
    class Inner(BaseModel):
        yo: int

    # (the functional form: this module's annotations are strings, and LangGraph resolves
    # a TypedDict's in the module, where a class declared here is not)
    LocalState = TypedDict("LocalState", {"inner": Inner, "log": list[str]}, total=False)  # noqa: UP013

    def ask(state: Any) -> dict[str, Any]:
        return {"log": [f"{state['inner'].yo}:{interrupt('go?')}"]}

    graph = StateGraph(LocalState).add_node("ask", ask).add_edge(START, "ask").compile(
        checkpointer=saver)
    config = thread()
    run(graph, {"inner": Inner(yo=1), "log": []}, config, mode)

    state = graph.get_state(config) if mode == "sync" else asyncio.run(graph.aget_state(config))
    assert state.values["inner"] == Inner(yo=1) and state.next == ("ask",)
    assert run(graph, Command(resume="yes"), config, mode)["log"] == ["1:yes"]


# ================================================================ a reader in a fresh process


class Order(BaseModel):
    sku: str
    qty: int


@dataclasses.dataclass
class Audit:
    by: str
    notes: list[str]


class OrderState(TypedDict, total=False):
    order: Order
    audit: Audit
    log: Annotated[list[str], operator.add]


def order_graph(saver: RemitSaver) -> Any:
    def ask(state: OrderState) -> dict[str, Any]:
        answer = interrupt(f"ship {state['order'].qty}?")
        return {"log": [f"ship:{answer}"], "audit": Audit("ops", [*state["audit"].notes, "ok"])}

    return StateGraph(OrderState).add_node("ask", ask).add_edge(START, "ask").compile(
        checkpointer=saver)


def _in_fresh_process(url: str, thread_id: str, mode: str, step: str) -> Any:
    with RemitSaver.from_conn_string(url) as saver:  # no schema=: the graph's types
        graph = order_graph(saver)
        config = {"configurable": {"thread_id": thread_id}}
        if step == "park":
            return run(graph, {"order": Order(sku="a-1", qty=2), "audit": Audit("me", [])},
                       config, mode)["__interrupt__"][0].value
        if step == "read":
            state = (graph.get_state(config) if mode == "sync"
                     else asyncio.run(graph.aget_state(config)))
            history = list(graph.get_state_history(config))
            return type(state.values["order"]).__name__, state.values["order"].qty, len(history)
        return run(graph, Command(resume="yes"), config, mode)


# (three spawned interpreters each: on PostgreSQL and Redis under REMIT_FULL / nox)
@pytest.mark.slow
def test_a_fresh_process_reads_the_graphs_own_types(store_url: str, mode: str) -> None:
    """A reader that never wrote the thread's values -- a recovery worker, another host --
    rebuilds the classes the graph's state declares, without schema=: the graph's channel
    types are allowed before its state is read."""
    import multiprocessing as mp

    config = thread()["configurable"]["thread_id"]
    with mp.get_context("spawn").Pool(1, maxtasksperchild=1) as pool:
        asked = pool.apply(_in_fresh_process, (store_url, config, mode, "park"))
    with mp.get_context("spawn").Pool(1, maxtasksperchild=1) as pool:
        read = pool.apply(_in_fresh_process, (store_url, config, mode, "read"))
    with mp.get_context("spawn").Pool(1, maxtasksperchild=1) as pool:
        done = pool.apply(_in_fresh_process, (store_url, config, mode, "resume"))

    assert asked == "ship 2?"
    assert read[:2] == ("Order", 2) and read[2] >= 2
    assert done["log"] == ["ship:yes"] and done["audit"] == Audit("ops", ["ok"])
    assert done["order"] == Order(sku="a-1", qty=2)


# ===================================================================================== seams


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize(("module", "name"), [
    ("langgraph.pregel._utils", "is_xxh3_128_hexdigest"),
    ("langgraph.pregel._loop", "create_checkpoint"),
    ("langgraph.pregel._loop.SyncPregelLoop", "__enter__"),
    ("langgraph.pregel._loop.AsyncPregelLoop", "__aexit__"),
    ("langgraph.pregel._loop.PregelLoop", "_put_checkpoint"),
    ("langgraph.pregel.main.Pregel", "bulk_update_state"),
])
def test_a_missing_seam_is_a_loud_error_at_import(module: str, name: str) -> None:
    """A langgraph release without an internal remit relies on: importing
    remit_langgraph fails, naming the seam and the langgraph version."""
    parts = module.split(".")
    probe = _python(f"""
        import importlib
        parts = {parts!r}
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
                break
            except ImportError:
                continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        delattr(obj, {name!r})
        import remit_langgraph
        print("imported")
    """)
    assert probe.returncode != 0, probe.stdout
    assert "LangGraphSeamError" in probe.stderr
    assert name in probe.stderr and "langgraph" in probe.stderr


def test_a_seam_undone_after_import_is_refused_not_ignored(
        saver: RemitSaver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Someone replaces the loop entry remit wrapped (another library, a test double):
    the gate would not see the invocation, so loading a checkpoint refuses to run."""
    import inspect

    from langgraph.pregel._loop import SyncPregelLoop

    graph = approval(saver)
    config = thread()
    graph.invoke({"log": []}, config)
    monkeypatch.setattr(SyncPregelLoop, "__enter__",
                        inspect.unwrap(vars(SyncPregelLoop)["__enter__"]))

    with pytest.raises(_seam.LangGraphSeamError, match="replaced"):
        graph.invoke(Command(resume="yes"), config)

    monkeypatch.undo()
    assert held(saver, config) == []
    assert graph.get_state(config).next == ("ask",)  # nothing was resumed


@pytest.mark.parametrize("seam", [f"{c.__qualname__}.{n}" for c, n in _seam._WRAPPED]
                         + ["create_checkpoint"])
def test_every_seam_replaced_after_a_passing_check_is_refused(
        seam: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check on every load compares the wrappers it last verified by identity: a seam
    replaced after that (on the class that holds it, or shadowed by a subclass that
    getattr finds first) still fails it, each named."""
    import inspect

    _seam.verify()  # passes, and records what it saw
    if seam == "create_checkpoint":
        where: Any = _seam._loop_mod
        name = "create_checkpoint"
        monkeypatch.setattr(where, name, inspect.unwrap(getattr(where, name)))
        expected = "create_checkpoint"
    else:
        cls, name = next((c, n) for c, n in _seam._WRAPPED if f"{c.__qualname__}.{n}" == seam)
        monkeypatch.setattr(cls, name, inspect.unwrap(vars(cls).get(name, getattr(cls, name))))
        expected = f"{cls.__qualname__}.{name}"
    with pytest.raises(_seam.LangGraphSeamError, match="replaced") as info:
        _seam.verify()
    assert expected in str(info.value)
    monkeypatch.undo()
    _seam.verify()  # the wrappers back: it passes again


def test_a_loop_entering_unseen_is_refused(saver: RemitSaver,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A release whose loop loads its checkpoint outside the entering context (say, on
    a helper thread) would switch the gate off: entering refuses instead."""
    import concurrent.futures

    graph = approval(saver)
    config = thread()
    graph.invoke({"log": []}, config)
    original: Callable[..., Any] = saver.get_tuple

    def elsewhere(cfg: Any) -> Any:  # the load happens where no loop is entering
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(original, cfg).result()

    monkeypatch.setattr(saver, "get_tuple", elsewhere)

    with pytest.raises(_seam.LangGraphSeamError, match="without asking RemitSaver"):
        graph.invoke(Command(resume="yes"), config)


def test_a_loop_without_its_tasks_is_refused_when_ids_are_derived() -> None:
    """RD reads the superstep's writes from the loop's ``tasks``; a LangGraph whose loop no
    longer has them gets a clear error naming the internal, not ids derived from nothing
    (and not a SerializationError, which derived_checkpoint_id would take for a value put
    refuses)."""
    from types import SimpleNamespace

    from remit_core import SerializationError

    for loop in (SimpleNamespace(), SimpleNamespace(tasks=[("t", "x")])):
        with pytest.raises(_seam.LangGraphSeamError, match=r"PregelLoop\.tasks") as err:
            _seam.step_writes(loop)
        assert not isinstance(err.value, SerializationError)
    task = SimpleNamespace(writes=[("log", ["a"]), ("__interrupt__", ()), ("n", {"k": [1]})])
    assert _seam.step_writes(SimpleNamespace(tasks={"b": task, "a": SimpleNamespace(
        writes=[])})) == [("b", [("log", ["a"]), ("n", {"k": [1]})])]
