"""remit-crewai in one process: executions, feedback handles, validation, forks, wiring.

Each test runs on SQLite, PostgreSQL and Redis (the ``store_url`` fixture).
Crash and race tests, with real processes, are in test_contract.py.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from crewai.flow.async_feedback.types import HumanFeedbackPending
from crewai.flow.flow import Flow, listen, start
from crewai.flow.human_feedback import human_feedback
from crewai.flow.persistence import persist
from crewai.flow.persistence.factory import set_flow_persistence_factory
from pydantic import BaseModel

from remit_core import adapter as seam
from remit_core.errors import StoreConfigError
from remit_crewai import (
    ConsumeConflict,
    RemitError,
    RemitFlowPersistence,
    StateValidationError,
    afork,
    durable,
    effect,
    fork,
    fork_id,
    new_execution,
    use_as_default,
)
from remit_crewai import persistence as _p
from tests.crewai import cw_flows as w


def order(url: str) -> type[Flow[Any]]:
    return w.flows(url)["OrderFlow"]


# ============================================================== a finished flow, again


def test_a_finished_flow_returns_its_recorded_result(store_url: str, tmp_path: Path) -> None:
    """The documented policy: kickoff of a finished flow id returns the recorded result and
    runs nothing; new_execution() starts the next execution, which runs every method again
    on the persisted state."""
    ledger = str(tmp_path / "ledger.txt")
    first = order(store_url)()
    result = first.kickoff(inputs={"id": "done-1", "ledger": ledger})
    assert result.startswith("done txn-")
    again = order(store_url)()
    assert again.kickoff(inputs={"id": "done-1"}) == result
    assert again.state.model_dump() == first.state.model_dump()  # the persisted final state
    assert w.count(w.lines(ledger), "enter begin") == 1
    assert w.count(w.lines(ledger), "effect charge") == 1
    backend = RemitFlowPersistence.from_url(store_url)
    assert new_execution("done-1", backend) == 1
    assert new_execution("done-1", backend) == 1  # unfinished: unchanged
    third = order(store_url)()
    rerun = third.kickoff(inputs={"id": "done-1"})
    assert rerun != result and rerun.startswith("done txn-")
    assert third.state.count == 2  # ran again on the persisted state
    entries = w.lines(ledger)
    assert w.count(entries, "enter begin") == 2 and w.count(entries, "effect charge") == 2
    assert backend.epoch("done-1").number == 1 and backend.epoch("done-1").finished


def test_kickoff_async_and_async_methods(store_url: str, tmp_path: Path) -> None:
    ledger = str(tmp_path / "ledger.txt")
    flow = w.flows(store_url)["AsyncOrderFlow"]()
    result = asyncio.run(flow.kickoff_async(inputs={"id": "async-1", "ledger": ledger}))
    again = asyncio.run(w.flows(store_url)["AsyncOrderFlow"]().kickoff_async(
        inputs={"id": "async-1"}))
    assert again == result
    assert w.count(w.lines(ledger), "effect charge") == 1


# ======================================================================= feedback (CO)


def park(url: str, fid: str, ledger: str) -> None:
    result = w.flows(url)["ApprovalFlow"]().kickoff(inputs={"id": fid, "ledger": ledger})
    assert isinstance(result, HumanFeedbackPending)


def test_inspecting_a_parked_flow_never_consumes_it(store_url: str, tmp_path: Path) -> None:
    park(store_url, "look", str(tmp_path / "ledger.txt"))
    backend = RemitFlowPersistence.from_url(store_url)
    cls = w.flows(store_url)["ApprovalFlow"]
    for _ in range(3):
        flow = cls.from_pending("look", backend)
        assert flow.pending_feedback is not None
        assert flow.pending_feedback.method_name == "draft"
    assert backend.store.list_claims("look") == []
    assert cls.from_pending("look", backend).resume("ok") == "shipped ok"


def test_two_stale_handles_and_a_second_resume(store_url: str, tmp_path: Path) -> None:
    """CO in one process: of two handles loaded before either resumed, the second raises
    ConsumeConflict; so does a later from_pending(...).resume(...) (not a ValueError)."""
    ledger = str(tmp_path / "ledger.txt")
    park(store_url, "stale", ledger)
    backend = RemitFlowPersistence.from_url(store_url)
    cls = w.flows(store_url)["ApprovalFlow"]
    first, second = cls.from_pending("stale", backend), cls.from_pending("stale", backend)
    assert first.resume("yes") == "shipped yes"
    with pytest.raises(ConsumeConflict, match="already consumed"):
        second.resume("no")
    with pytest.raises(ConsumeConflict, match="already consumed"):
        cls.from_pending("stale", backend).resume("again")
    entries = w.lines(ledger)
    assert w.count(entries, "enter deliver") == 1 and w.count(entries, "effect ship") == 1
    [claim] = backend.store.list_claims("stale")
    assert claim.status == "consumed" and claim.value == "yes"
    # kickoff of the finished flow returns its result and asks for nothing
    assert cls().kickoff(inputs={"id": "stale"}) == "shipped yes"


def test_plain_persist_flow_gets_the_clear_pending_guard(store_url: str,
                                                          tmp_path: Path) -> None:
    """Without @durable the backend's own guard still refuses a second consumption: the
    stale handle's clear_pending_feedback raises before any listener runs."""
    ledger = str(tmp_path / "ledger.txt")
    backend = RemitFlowPersistence.from_url(store_url)

    @persist(backend)
    class Plain(Flow[w.ApprovalState]):
        _skip_auto_memory = True

        @start()
        @human_feedback(message="ok?", provider=w.Park())
        def draft(self) -> str:
            return "draft"

        @listen(draft)
        def deliver(self, result: Any) -> str:
            return w.ship(self.state.ledger, result.feedback)

    assert isinstance(Plain().kickoff(inputs={"id": "plain", "ledger": ledger}),
                      HumanFeedbackPending)
    one, two = Plain.from_pending("plain", backend), Plain.from_pending("plain", backend)
    one.resume("a")
    with pytest.raises(ConsumeConflict):
        two.resume("b")
    assert w.count(w.lines(ledger), "effect ship") == 1


# ============================================================================= CV


class Counted(BaseModel):
    ledger: str = ""
    count: int = 0
    value: Any = 0


def cv_flow(url: str) -> type[Flow[Any]]:
    @durable
    @persist(RemitFlowPersistence.from_url(url, lease=w.LEASE))
    class CVFlow(Flow[Counted]):
        _skip_auto_memory = True

        @start()
        def begin(self) -> str:
            w.note(self.state.ledger, "enter begin")
            return "ok"

        @listen(begin)
        def bump(self, _: str) -> int:
            w.note(self.state.ledger, "enter bump")
            self.state.count = self.state.value  # no validate_assignment: pydantic accepts it
            return self.state.count

    return CVFlow


def test_invalid_state_is_refused_and_the_flow_stays_resumable(store_url: str,
                                                                tmp_path: Path) -> None:
    ledger = str(tmp_path / "ledger.txt")
    cls = cv_flow(store_url)
    backend = RemitFlowPersistence.from_url(store_url)
    with pytest.raises(StateValidationError) as info:
        cls().kickoff(inputs={"id": "cv", "ledger": ledger, "value": "x"})
    err = info.value
    assert err.field == "count" and err.run_id == "cv" and err.step == "e0/bump#0"
    assert "count" in str(err) and "'cv'" in str(err)
    # nothing of bump was stored: the latest state is begin's, and it loads (before it:
    # the state the kickoff started begin with, its inputs on the defaults)
    latest = backend.load_state("cv")
    assert latest is not None and latest["count"] == 0
    assert [c.metadata["method"] for c in backend.store.list_checkpoints("cv", ns="")] == [
        "begin", "_kickoff"]
    # fixed input: begin replays, bump runs again and succeeds
    flow = cls()
    assert flow.kickoff(inputs={"id": "cv", "value": 5}) == 5
    assert flow.state.count == 5
    entries = w.lines(ledger)
    assert w.count(entries, "enter begin") == 1 and w.count(entries, "enter bump") == 2


def test_a_plain_persist_flow_is_validated_too(store_url: str, tmp_path: Path) -> None:
    """No @durable: save_state still refuses the invalid state (CrewAI reports the refusal
    as a failed persistence) and a pause path's dict is checked against the state class."""
    backend = RemitFlowPersistence.from_url(store_url)

    @persist(backend)
    class Plain(Flow[Counted]):
        _skip_auto_memory = True

        @start()
        def begin(self) -> str:
            return "ok"

        @listen(begin)
        @human_feedback(message="ok?", provider=w.Park())
        def bump(self, _: str) -> int:
            self.state.count = self.state.value
            return 1

    with pytest.raises(Exception, match="count") as info:
        Plain().kickoff(inputs={"id": "plain-cv", "value": "x"})
    assert isinstance(info.value, StateValidationError | RuntimeError)
    assert [c.kind for c in backend.store.list_checkpoints("plain-cv", ns="")] == [
        _p.STATE_KIND]  # begin's state only: no pending record with the bad value
    with pytest.raises(StateValidationError, match="'count'"):
        backend.save_pending_feedback("plain-cv", _context("plain-cv"), {"id": "plain-cv",
                                                                          "count": "x"})


def _context(fid: str) -> Any:
    from crewai.flow.async_feedback.types import PendingFeedbackContext

    return PendingFeedbackContext(flow_id=fid, flow_class="x.Plain", method_name="bump",
                                  method_output=1, message="ok?")


def test_dict_state_must_be_json_as_it_is(store_url: str) -> None:
    import datetime as dt

    backend = RemitFlowPersistence.from_url(store_url)

    @durable
    @persist(backend)
    class DictFlow(Flow):  # type: ignore[type-arg]
        _skip_auto_memory = True

        @start()
        def begin(self) -> str:
            self.state["n"] = 1
            return "ok"

        @listen(begin)
        def stamp(self, _: str) -> str:
            self.state["when"] = dt.datetime(2026, 1, 2, 3, 4, 5)
            return "stamped"

    with pytest.raises(StateValidationError, match=r"'when'.*datetime") as info:
        DictFlow().kickoff(inputs={"id": "dict-1"})
    assert info.value.field == "when"
    stored = backend.load_state("dict-1")
    assert stored is not None and stored["n"] == 1 and "when" not in stored


class Opaque:
    """A value an ``Any`` field holds and pydantic cannot dump as JSON."""


class WithOpaque(BaseModel):
    count: int = 0
    payload: Any = None


#: the message of a state field that cannot be dumped: the same in every adapter
#: (tests/pydantic_graph/test_persistence.py checks its own against the same shape)
UNDUMPABLE = re.compile(
    r"^invalid state in run '[^']+', step '[^']+': field 'payload': cannot be stored as "
    r"JSON \(.*Unable to serialize unknown type.*\) \(got Opaque .*\)\. Nothing was written;")


def test_a_field_that_cannot_be_dumped_is_a_state_validation_error(store_url: str) -> None:
    backend = RemitFlowPersistence.from_url(store_url)

    @durable
    @persist(backend)
    class OpaqueFlow(Flow[WithOpaque]):
        _skip_auto_memory = True

        @start()
        def begin(self) -> str:
            self.state.count = 1
            return "ok"

        @listen(begin)
        def stash(self, _: str) -> str:
            self.state.payload = Opaque()
            return "stashed"

    with pytest.raises(StateValidationError) as info:
        OpaqueFlow().kickoff(inputs={"id": "opaque-1"})
    err = info.value
    assert (err.field, err.run_id, err.step) == ("payload", "opaque-1", "e0/stash#0")
    assert UNDUMPABLE.match(str(err)), str(err)
    stored = backend.load_state("opaque-1")
    assert stored is not None and stored["count"] == 1 and stored["payload"] is None

    with pytest.raises(StateValidationError) as direct:  # the backend's own entry point
        backend.save_state("opaque-2", "m", WithOpaque(payload=[1, {"deep": Opaque()}]))
    assert direct.value.field == "payload[1].deep"
    assert backend.load_state("opaque-2") is None


# ============================================================================== FD


def test_forking_twice_gives_one_id_and_one_state(store_url: str, tmp_path: Path) -> None:
    ledger = str(tmp_path / "ledger.txt")
    cls = order(store_url)
    cls().kickoff(inputs={"id": "source", "ledger": ledger})
    backend = RemitFlowPersistence.from_url(store_url)
    a, b = cls(), cls()
    ra = fork(a, "source", {"amount": 20})
    rb = fork(b, "source", {"amount": 20})
    assert a.state.id == b.state.id == fork_id(backend, "source", {"amount": 20})
    assert a.state.id != "source"
    assert ra == rb and a.state.model_dump() == b.state.model_dump()
    assert a.state.amount == 20 and a.state.count == 2  # the source's state, then a run
    # the repeated fork reused the lineage's receipts: one charge of 20, ever
    assert w.count(w.lines(ledger), "effect charge 20") == 1
    c = cls()
    rc = asyncio.run(afork(c, "source", {"amount": 30}))
    assert c.state.id != a.state.id and rc != ra
    with pytest.raises(RemitError, match="no state"):
        fork(cls(), "no-such-flow")


# ========================================================================== wiring


def test_process_default_through_crewai_factory(store_url: str, tmp_path: Path) -> None:
    """use_as_default(): a bare @persist(), pausing and from_pending all use remit."""
    ledger = str(tmp_path / "ledger.txt")
    backend = use_as_default(store_url, lease=w.LEASE)
    try:
        @durable
        @persist()
        class Defaulted(Flow[w.ApprovalState]):
            _skip_auto_memory = True

            @start()
            @human_feedback(message="ok?", provider=w.Park())
            def draft(self) -> str:
                return "draft"

            @listen(draft)
            def deliver(self, result: Any) -> str:
                return w.ship(self.state.ledger, result.feedback)

        assert isinstance(Defaulted().kickoff(inputs={"id": "dflt", "ledger": ledger}),
                          HumanFeedbackPending)
        assert backend.pending("dflt") is not None
        assert Defaulted.from_pending("dflt").resume("go") == "shipped go"
        with pytest.raises(ConsumeConflict):
            Defaulted.from_pending("dflt").resume("go")
    finally:
        set_flow_persistence_factory(None)


def test_a_durable_flow_without_remit_persistence_is_refused() -> None:
    @durable
    class Bare(Flow[w.ApprovalState]):
        _skip_auto_memory = True

        @start()
        def go(self) -> str:
            return "went"

    with pytest.raises(RemitError, match="has no remit persistence"):
        Bare().kickoff()


def test_flow_json_holds_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """CrewAI writes the backend into its flow JSON: the URL's password is masked, and a
    backend rebuilt from that JSON finds the open store again (or asks for the URL)."""
    url = "postgresql://postgres:s3cret@127.0.0.1:5432/test"
    try:
        backend = RemitFlowPersistence.from_url(url)
    except RemitError as exc:  # no server: this test needs PostgreSQL
        from tests.conftest import unavailable

        unavailable(f"postgres: {exc}")
    dumped = backend.model_dump_json()
    assert "s3cret" not in dumped and "***" in dumped
    rebuilt = RemitFlowPersistence.model_validate_json(dumped)
    assert rebuilt.store is backend.store
    # a process that has not opened it: the core's store cache, empty
    monkeypatch.setattr(seam, "_real_urls", {})
    monkeypatch.setattr(seam, "_stores", {})
    with pytest.raises(StoreConfigError, match="REMIT_CREWAI_URL"):
        _ = RemitFlowPersistence.model_validate_json(dumped).store
    monkeypatch.setenv("REMIT_CREWAI_URL", url)
    reopened = RemitFlowPersistence.model_validate_json(dumped).store
    assert isinstance(reopened.list_runs(limit=1), list)


def test_abandoning_an_unfinished_execution(store_url: str, tmp_path: Path) -> None:
    """What conversational flows do on every turn: an execution that ran something and did
    not finish is left behind (the next turn is not a resume of the dead one); a fresh one is
    kept."""
    backend = RemitFlowPersistence.from_url(store_url)
    assert backend.new_execution("never-ran", abandon=True) == 0
    with pytest.raises(StateValidationError):
        cv_flow(store_url)().kickoff(inputs={"id": "turn", "ledger": str(tmp_path / "l"),
                                             "value": "x"})
    assert backend.new_execution("turn") == 0  # unfinished: kept by default
    assert backend.new_execution("turn", abandon=True) == 1
    assert backend.new_execution("turn", abandon=True) == 1  # execution 1 has not run yet


def test_an_opened_store_is_accepted(store_url: str, tmp_path: Path) -> None:
    """One store (one connection pool) shared with other adapters; its password stays out
    of the flow JSON."""
    from remit_core import open_store

    store = open_store(store_url, lease=w.LEASE)
    backend = RemitFlowPersistence.from_url(store)
    assert backend.store is store

    @durable
    @persist(backend)
    class Shared(Flow[w.ApprovalState]):
        _skip_auto_memory = True

        @start()
        def go(self) -> str:
            return w.ship(str(tmp_path / "ledger"), "x")

    assert Shared().kickoff(inputs={"id": "shared-1"}) == "shipped x"
    assert store.get_checkpoint("shared-1") is not None
    rebuilt = RemitFlowPersistence.model_validate_json(backend.model_dump_json())
    assert rebuilt.store is store


def test_conversational_flows_run_every_turn(store_url: str) -> None:
    """A conversational flow runs its graph once per turn under one session id: each turn is
    a new execution, with receipts of its own (no LLM: the router's default intent)."""
    conversational = pytest.importorskip(
        "crewai.flow.conversational", reason="conversational flows came with crewai 1.15.18")
    ConversationConfig = conversational.ConversationConfig
    ConversationState = conversational.ConversationState
    RouterConfig = conversational.RouterConfig

    backend = RemitFlowPersistence.from_url(store_url, lease=w.LEASE)
    replies: list[str] = []

    @effect(name="reply")
    def reply(text: str) -> str:
        replies.append(text)
        return f"echo {text} #{len(replies)}"

    @durable
    @persist(backend)
    @ConversationConfig(router=RouterConfig(default_intent="echo", fallback_intent="echo",
                                            routes=["echo"]))
    class Chat(Flow[ConversationState]):
        _skip_auto_memory = True

        @listen("echo")
        def handle_echo(self) -> str:
            """Echo the message."""
            return reply(str(self.state.last_user_message))

    assert Chat().handle_turn("hello", session_id="chat-1") == "echo hello #1"
    assert Chat().handle_turn("again", session_id="chat-1") == "echo again #2"
    assert replies == ["hello", "again"]
    current = backend.epoch("chat-1")
    assert current.number == 1 and current.finished


# ============================================================================ memory


def test_finished_flows_do_not_accumulate(store_url: str, tmp_path: Path) -> None:
    """Nothing remit keeps after a kickoff holds on to the flow that ran (its state, its
    inputs): a server running many flows must not accumulate them. Sync and async methods;
    each method body is a receipt, so this also covers what the effect machinery caches.
    CrewAI itself keeps a flow of a context in its runtime state, so what is asked is that
    the flows still alive do not grow in number with the flows run."""
    import gc
    import weakref

    ledger = str(tmp_path / "ledger.txt")
    refs: list[weakref.ref[Any]] = []

    def run(rounds: int) -> int:
        for _ in range(rounds):
            n = len(refs)
            flow = order(store_url)()
            assert flow.kickoff(inputs={"id": f"mem-{n}", "ledger": ledger}).startswith("done")
            aflow = w.flows(store_url)["AsyncOrderFlow"]()
            asyncio.run(aflow.kickoff_async(inputs={"id": f"amem-{n}", "ledger": ledger}))
            refs.extend([weakref.ref(flow), weakref.ref(aflow)])
            del flow, aflow
        gc.collect()
        return sum(r() is not None for r in refs)

    after_two = run(2)
    after_eight = run(6)
    assert after_eight == after_two, (
        f"{after_two} of 4 flows alive after two rounds, {after_eight} of 16 after eight")
