"""Group commit (remit_core.store.groups): the last pending writes of a step go in the
transaction of the step's checkpoint, one durable commit per step instead of two, and
nothing the separate commits guaranteed is lost.

On every backend (``groups_writes``: SQLite and PostgreSQL in the checkpoint's transaction,
Redis in its script); under ``durability="async"`` only where
``groups_background_writes`` (SQLite).
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from tenacity import Retrying, retry_if_result, stop_after_delay, wait_fixed

from remit_core import ConsumeConflict, StateValidationError
from remit_core.store import Store
from remit_langgraph import RemitSaver


@pytest.fixture
def counted(store: Store, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """How many times the backend stored pending writes on their own."""
    calls = {"alone": 0}
    alone = store._write_writes

    def counting(*args: Any, **kwargs: Any) -> None:
        calls["alone"] += 1
        alone(*args, **kwargs)

    monkeypatch.setattr(store, "_write_writes", counting)
    yield calls


def _parent(store: Store, run: str) -> str:
    store.put_checkpoint(run, "p", new_values={"a": ("1", 0)})
    return "p"


def _writes_of(store: Store, run: str, checkpoint_id: str) -> list[tuple[str, int, Any]]:
    found = store.get_checkpoint(run, checkpoint_id)
    assert found is not None
    return [(w.task_id, w.idx, w.value) for w in found.writes]


def _in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def body() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=body)
    thread.start()
    return thread, errors


def _until_held(store: Store) -> None:
    """Until the store holds announced writes that were handed over (polled, bounded)."""
    def held() -> bool:
        return any(e.state == "staged" for group in store._groups._by_key.values()
                   for e in group.values())
    Retrying(retry=retry_if_result(lambda ok: not ok), stop=stop_after_delay(10),
             wait=wait_fixed(0.001), reraise=True)(held)


def test_announced_writes_are_committed_with_the_child(store: Store,
                                                       counted: dict[str, int]) -> None:
    parent = _parent(store, "r")
    groups = store.expect_writes("r", parent, "t1")
    assert groups is store.groups_writes
    thread, errors = _in_thread(lambda: store.put_writes("r", parent, "t1", [(0, "a", 1)]))
    if groups:
        _until_held(store)
        assert _writes_of(store, "r", parent) == []  # held, not committed yet
    store.put_checkpoint("r", "c", parent_id=parent, new_values={"a": ("2", 1)})
    thread.join()
    assert errors == []
    assert _writes_of(store, "r", parent) == [("t1", 0, 1)]
    assert counted["alone"] == (0 if groups else 1)


def test_grouped_writes_keep_any_text(store: Store, counted: dict[str, int]) -> None:
    """Writes committed with their child checkpoint come back as written, whatever their
    channel names, task id and path hold (the PostgreSQL backend binds them, and the
    child's channel names, as array literals of its own in one client-side statement)."""
    parent = _parent(store, "r")
    names = ['"q"', "back\\slash", "{b},c", "NULL", "été", "nl\n"]
    values: list[Any] = [b"\x00\\\"", None, {"k": ['"', "\\"]}, "", 2**70, "x"]
    task = 'task "t" \\ {1}'
    groups = store.expect_writes("r", parent, task)
    thread, errors = _in_thread(lambda: store.put_writes(
        "r", parent, task, list(zip(range(6), names, values, strict=True)), task_path="a, {b}"))
    if groups:
        _until_held(store)
    store.put_checkpoint("r", "c", parent_id=parent,
                         new_values={n: (f"v{i}", i) for i, n in enumerate(names)})
    thread.join()
    assert errors == []
    found = store.get_checkpoint("r", parent)
    assert found is not None
    assert [(w.task_id, w.idx, w.channel, w.value, w.task_path) for w in found.writes] == [
        (task, i, n, v, "a, {b}") for i, (n, v) in enumerate(zip(names, values, strict=True))]
    child = store.get_checkpoint("r", "c")
    assert child is not None and child.values == {n: i for i, n in enumerate(names)}
    assert counted["alone"] == (0 if groups else 1)


def test_grouped_writes_of_several_tasks_keep_or_replace_as_alone(
        store: Store, counted: dict[str, int]) -> None:
    """Several tasks' writes committed with one child checkpoint: each call keeps an
    existing key, or replaces it with ``overwrite``, and a key repeated within a call keeps
    its first value (its last with ``overwrite``), as the same calls committed alone do."""
    parent = _parent(store, "r")
    store.put_writes("r", parent, "keep", [(0, "a", "old")])  # not announced: alone
    store.put_writes("r", parent, "replace", [(-1, "a", "old")])
    calls: list[tuple[str, list[tuple[int, str, Any]], bool]] = [
        ("keep", [(0, "a", "new"), (1, "b", "first"), (1, "b", "second")], False),
        ("replace", [(-1, "a", "new"), (2, "b", "first"), (2, "b", "second")], True),
        ("fresh", [(0, "c", [1, {"d": None}])], False),
    ]
    threads = []
    for task, writes, overwrite in calls:
        assert store.expect_writes("r", parent, task) is store.groups_writes
        threads.append(_in_thread(lambda t=task, w=writes, o=overwrite: store.put_writes(
            "r", parent, t, w, overwrite=o, task_path=f"path of {t}")))
    if store.groups_writes:
        Retrying(retry=retry_if_result(lambda n: n < len(calls)), stop=stop_after_delay(10),
                 wait=wait_fixed(0.001), reraise=True)(lambda: sum(
                     e.state == "staged" for group in store._groups._by_key.values()
                     for e in group.values()))
    store.put_checkpoint("r", "c", parent_id=parent, new_values={"a": ("2", 1)})
    for thread, errors in threads:
        thread.join()
        assert errors == []
    assert sorted(_writes_of(store, "r", parent)) == [
        ("fresh", 0, [1, {"d": None}]), ("keep", 0, "old"), ("keep", 1, "first"),
        ("replace", -1, "new"), ("replace", 2, "second")]
    found = store.get_checkpoint("r", parent)
    assert found is not None and sorted((w.task_id, w.idx, w.task_path) for w in found.writes) == [
        ("fresh", 0, "path of fresh"), ("keep", 0, ""), ("keep", 1, "path of keep"),
        ("replace", -1, "path of replace"), ("replace", 2, "path of replace")]
    assert counted["alone"] == (2 if store.groups_writes else 2 + len(calls))


def test_writes_no_checkpoint_takes_are_committed_alone(store: Store,
                                                        counted: dict[str, int]) -> None:
    """The step stopped (an interrupt, an error): no child comes; put_writes returns once
    its writes are stored, after at most the wait."""
    parent = _parent(store, "r")
    store.expect_writes("r", parent, "t1")
    store.put_writes("r", parent, "t1", [(0, "a", {"x": [1, 2]})])
    assert _writes_of(store, "r", parent) == [("t1", 0, {"x": [1, 2]})]
    assert counted["alone"] == 1
    assert not store._groups  # nothing left held


def test_a_checkpoint_waits_for_announced_writes_only_so_long(store: Store,
                                                              counted: dict[str, int]) -> None:
    """Announced writes that never reach the store (the saver refused them first) hold a
    checkpoint up for at most the wait; writes that come later are committed alone."""
    parent = _parent(store, "r")
    store.expect_writes("r", parent, "t1")
    store.put_checkpoint("r", "c", parent_id=parent, new_values={"a": ("2", 1)})
    store.put_writes("r", parent, "t1", [(0, "a", 1)])  # after its checkpoint went
    assert _writes_of(store, "r", parent) == [("t1", 0, 1)]
    assert counted["alone"] == 1


@pytest.mark.parametrize("refusal", ["conflict", "invalid"])
def test_a_refused_child_leaves_the_writes_stored(store: Store, counted: dict[str, int],
                                                  refusal: str) -> None:
    parent = _parent(store, "r")
    store.put_checkpoint("r", "first", parent_id=parent, kind="resume")
    store.expect_writes("r", parent, "t1")
    thread, errors = _in_thread(lambda: store.put_writes("r", parent, "t1", [(0, "a", 7)]))
    if store.groups_writes:
        _until_held(store)

    def invalid() -> None:
        raise StateValidationError("no", run_id="r", step="c", field="a")

    if refusal == "conflict":
        with pytest.raises(ConsumeConflict):
            store.put_checkpoint("r", "second", parent_id=parent, kind="resume",
                                 exclusive_child=True)
    else:
        with pytest.raises(StateValidationError):
            store.put_checkpoint("r", "second", parent_id=parent, validate=invalid)
    thread.join()
    assert errors == []
    assert _writes_of(store, "r", parent) == [("t1", 0, 7)]
    assert store.get_checkpoint("r", "second") is None
    assert counted["alone"] == 1


def test_close_commits_held_writes(store_url: str) -> None:
    from remit_core import open_store

    store = open_store(store_url)
    parent = _parent(store, "r")
    store.expect_writes("r", parent, "t1")
    thread, errors = _in_thread(lambda: store.put_writes("r", parent, "t1", [(0, "a", 3)]))
    if store.groups_writes:
        _until_held(store)
    store.close()
    thread.join()
    assert errors == []
    with open_store(store_url) as again:
        assert _writes_of(again, "r", parent) == [("t1", 0, 3)]


# ================================================================= through LangGraph


class Log(TypedDict):
    log: Annotated[list[str], operator.add]


def _graph(saver: Any) -> Any:
    """a, then b and c side by side, then d."""
    b = StateGraph(Log)
    for name in "abcd":
        b.add_node(name, lambda s, _n=name: {"log": [_n]})
    b.add_edge(START, "a")
    b.add_edge("a", "b")
    b.add_edge("a", "c")
    b.add_edge(["b", "c"], "d")
    b.add_edge("d", END)
    return b.compile(checkpointer=saver)


def _writes_by_step(saver: Any, config: Any) -> list[tuple[int, list[tuple[str, Any]]]]:
    return sorted((t.metadata["step"], sorted((ch, repr(v)) for _, ch, v in t.pending_writes))
                  for t in saver.list(config))


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_a_graph_stores_every_write_and_groups_the_last_of_each_step(
        store: Store, counted: dict[str, int], durability: str) -> None:
    saver = RemitSaver(store)
    graph, config = _graph(saver), {"configurable": {"thread_id": "g"}}
    assert graph.invoke({"log": []}, config, durability=durability) == {
        "log": ["a", "b", "c", "d"]}
    # every step's writes are on its checkpoint, as the stock saver has them
    stock, stock_config = InMemorySaver(), {"configurable": {"thread_id": "g"}}
    _graph(stock).invoke({"log": []}, stock_config, durability=durability)
    assert _writes_by_step(saver, config) == _writes_by_step(stock, stock_config)
    if store.groups_writes and (durability == "sync" or store.groups_background_writes):
        # the b/c step: the first to finish is stored alone (its sibling still ran)
        assert counted["alone"] == 1
    else:
        assert counted["alone"] == 5
