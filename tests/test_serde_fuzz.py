"""Fuzzing the decoder (issue 13): hostile bytes never crash a reader, import a module,
or raise anything but ``CorruptRecord``.

Hypothesis makes random byte strings and structured-hostile ones: a valid envelope
header and msgpack holding ext records of every tag (and unknown ones), nested deep,
with huge lengths, truncated payloads, wrong types inside payloads, and the names of
real modules and classes (``os:system``, ``subprocess:CalledProcessError``,
``os:stat_result``, ``langchain_core.language_models:FakeListLLM``...). Each blob is
decoded in a long-lived child process (:mod:`tests.serde_child`), restarted if it
dies; a death is a failure, as is any module appearing in the child's ``sys.modules``.

``REMIT_FUZZ_EXAMPLES`` (default 2400) sets the number of examples.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import uuid
from collections.abc import Iterator
from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.serde_child import Decoder

EXAMPLES = int(os.environ.get("REMIT_FUZZ_EXAMPLES", "2400"))

SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    print_blob=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much],
)

TAGS = [*range(0, 21), 100, 127]  # the envelope's tags (1-18), neighbours, strangers
NAMES = [
    "os:system", "os:stat_result", "os:popen", "posix:system", "builtins:eval",
    "builtins:exec", "builtins:__import__", "importlib:import_module", "pickle:loads",
    "subprocess:CalledProcessError", "subprocess:Popen", "shutil:rmtree",
    "langchain_core.language_models:FakeListLLM", "langchain_core.embeddings:FakeEmbeddings",
    "langchain_core.messages:AIMessage", "langchain_core.messages.ai:AIMessage",
    "langchain_core.documents.base:Document", "langgraph.types:Overwrite",
    "langgraph:Send", "langgraph:Command", "langgraph:Interrupt", "remit_langgraph:empty",
    "remit_langgraph:error", "pydantic:BaseModel", "enum:Enum", "signal:Signals",
    "collections:OrderedDict", "http.server:HTTPServer", "tzdata:zoneinfo",
    "builtins:object.__subclasses__", "os:system:", ":", "", "os", "a" * 300,
]
ZONE_PAYLOADS = [
    b"2026-01-01T00:00:00|0|Europe/Berlin", b"2026-01-01T00:00:00|1|UTC",
    b"2026-01-01T00:00:00|0|../../etc/passwd", b"2026-01-01T00:00:00|0|/etc/localtime",
    b"2026-01-01T00:00:00|0|Remit/Nowhere", b"2026-01-01T00:00:00+01:00|0|UTC",
    b"2026-01-01T00:00:00|2|UTC", b"|||", b"x",
]
HUGE = [  # headers that claim far more than the blob holds
    b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff",
    b"\xc6\xff\xff\xff\xff", b"\xc9\xff\xff\xff\xff\x07", b"\xc9\x7f\xff\xff\xff\x10",
    b"\xdc\xff\xff", b"\xde\xff\xff", b"\xc8\xff\xff\x0b", b"\xd9\xff", b"\xc1",
    b"\x91" * 2000 + b"\xc0", b"\x81\xc0" * 1500 + b"\xc0",
    # negative ext codes (msgpack's own timestamp is -1), valid and not
    b"\xd4\xff\x00", b"\xd6\xff\x00\x00\x00\x01", b"\xd7\xff" + b"\xff" * 8,
    b"\xc7\x0c\xff" + b"\x7f" * 12, b"\xd4\x80\x00", b"\xc7\x01\xfe\x00",
]




def pick(options: list[Any]) -> st.SearchStrategy[Any]:
    """One of ``options``, by index: hypothesis then does not print them in every repr."""

    def option(i: int) -> Any:
        return options[i]

    return st.integers(0, len(options) - 1).map(option)


raw_snippets = pick(HUGE)
names = pick(NAMES)


def pack(obj: Any) -> bytes:
    packed: bytes = msgpack.packb(obj, use_bin_type=True)
    return packed


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True), st.text(max_size=12), st.binary(max_size=12),
    names,
)
keys = st.one_of(st.text(max_size=8), st.integers(-5, 5), st.binary(max_size=4), st.none())


def payloads(children: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    """What an ext record may carry: random bytes, packed values, [name, data] records
    (whole, truncated, or with the wrong shape), zone strings, huge-length headers."""
    named = st.tuples(names, children)
    return st.one_of(
        st.binary(max_size=24),
        children.map(pack),
        named.map(lambda nd: pack(list(nd))),
        named.map(lambda nd: pack(list(nd))[:-1]),
        st.tuples(names, children, children).map(lambda t: pack(list(t))),
        names.map(lambda n: pack([n])),
        st.lists(children, max_size=3).map(pack),
        pick(ZONE_PAYLOADS),
        raw_snippets,
    )


def exts(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.builds(msgpack.ExtType, st.sampled_from(TAGS), payloads(children))


trees = st.recursive(
    st.one_of(scalars, exts(scalars)),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(keys, children, max_size=4),
        exts(children),
    ),
    max_leaves=24,
)


def deep(kind: str, depth: int, name: str) -> Any:
    """``depth`` levels of one kind: plain lists or maps, or ext records of a tag."""
    inner: Any = None
    for _ in range(depth):
        if kind == "list":
            inner = [inner]
        elif kind == "map":
            inner = {"k": inner}
        elif kind in ("7", "8", "9"):
            inner = msgpack.ExtType(int(kind), pack([inner]))
        elif kind == "16":
            inner = msgpack.ExtType(16, pack([name, {"node": "n", "arg": inner}]))
        else:
            inner = msgpack.ExtType(int(kind), pack([name, {"next": inner}]))
    return inner


deep_trees = st.builds(
    deep, st.sampled_from(["list", "map", "7", "8", "9", "10", "11", "12", "15", "16"]),
    st.integers(min_value=90, max_value=400),
    st.sampled_from(["langgraph:Send", "langchain_core.messages.ai:AIMessage",
                     "langgraph.types:Overwrite", "os:stat_result", "remit_langgraph:error"]),
)


def envelope(body: bytes) -> bytes:
    return b"\x01" + body


def valid_blobs() -> list[bytes]:
    """Real envelopes of rich values, for mutation."""
    from langchain_core.messages import AIMessage
    from langgraph.types import Command, Interrupt, Send

    import remit_langgraph._serde  # noqa: F401  (registrations)
    from remit_core.serde import Serde, default_serde

    values: list[Any] = [
        {"messages": [AIMessage(content="hi", id="1")], "n": 2**70, "t": (1, {2}, frozenset())},
        [Send("n", {"x": (1, 2)}), Interrupt("q", id="i"), Command(resume={"a": 1})],
        {"when": dt.datetime(2026, 1, 1, tzinfo=dt.UTC), "id": uuid.UUID(int=7),
         "delta": dt.timedelta(days=1), "odd": "\udcff"},
    ]
    out = []
    for v in values:
        with contextlib.suppress(Exception):  # (an older envelope refuses the surrogate)
            out.append(default_serde.encode(v))
    out.append(Serde().encode({"deep": [[[[[[1]]]]]]}))
    return out


VALID = valid_blobs()


def mutate(blob: bytes, at: int, byte: int, cut: int) -> bytes:
    at %= len(blob)
    changed = blob[:at] + bytes([byte]) + blob[at + 1:]
    return changed[: max(1, len(changed) - cut)]


structured = trees.map(pack).map(envelope)
blobs = st.one_of(  # a branch listed twice is drawn twice as often
    st.binary(max_size=64),
    st.binary(max_size=64).map(envelope),
    structured,
    structured,
    structured,
    trees.map(pack).map(lambda b: envelope(b)[: max(1, len(b) // 2)]),
    deep_trees.map(pack).map(envelope),
    deep_trees.map(pack).map(envelope),
    raw_snippets.map(envelope),
    st.builds(mutate, pick(VALID),
              st.integers(0, 10**6), st.integers(0, 255), st.integers(0, 8)),
)


@pytest.fixture(scope="module")
def decoder() -> Iterator[Decoder]:
    with Decoder() as child:
        yield child


def test_the_decoder_survives_hostile_bytes(decoder: Decoder) -> None:
    seen: dict[str, int] = {}
    failures: list[tuple[bytes, dict[str, Any]]] = []

    @SETTINGS
    @given(blob=blobs)
    def decode_one(blob: bytes) -> None:
        answer = decoder.decode(blob)
        seen[answer["outcome"]] = seen.get(answer["outcome"], 0) + 1
        if answer["outcome"] not in ("ok", "corrupt") or answer["imported"]:
            failures.append((blob, answer))
        assert answer["outcome"] in ("ok", "corrupt"), (blob[:200], answer)
        assert answer["imported"] == [], (blob[:200], answer)

    decode_one()
    assert not failures
    assert sum(seen.values()) >= min(EXAMPLES, 2000), seen
    assert seen.get("corrupt", 0) > 0 and seen.get("ok", 0) > 0, seen  # both kinds were made
    assert decoder.starts == 1  # the child never died
