"""The envelope against hostile and extreme values (issue 13 items 1, 3, 13; issue 12 item 5).

* one nesting limit, enforced when a value is written (``SerializationError`` naming the
  path, nothing stored) and when bytes are read (``CorruptRecord``, never a crash: the
  crafted blobs are decoded in a child process, so a segfault shows as a signal);
* decoding resolves only types registered or allowed before the read, by exact name,
  and imports nothing;
* ``ZoneInfo`` datetimes keep their zone; strings with lone surrogates round-trip.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import hashlib
import operator
import sys
import types
import uuid
from typing import Annotated, Any, NamedTuple, Optional, TypedDict
from zoneinfo import ZoneInfo

import msgpack  # type: ignore[import-untyped]
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, Field

import remit_core.serde as serde_module
from remit_core import CorruptRecord, SerializationError, derive_id
from remit_core.errors import UnregisteredType
from remit_core.serde import Serde, decode, digest, encode
from remit_core.store import Store
from tests.serde_child import Decoder

MAX_DEPTH: int = getattr(serde_module, "MAX_DEPTH", 100)

# ext tags of the envelope (append-only, so crafted blobs can name them)
TUPLE, SET, MODEL, DATACLASS, ENUM, NAMEDTUPLE, REGISTERED = 7, 8, 10, 11, 12, 15, 16


def blob(obj: Any) -> bytes:
    """A crafted envelope: the version byte, then ``obj`` packed as is."""
    packed: bytes = msgpack.packb(obj, strict_types=True)
    return b"\x01" + packed


def ext(code: int, payload: Any) -> msgpack.ExtType:
    return msgpack.ExtType(code, msgpack.packb(payload, strict_types=True))


def deep_tuple(n: int) -> Any:
    value: Any = ()
    for _ in range(n - 1):
        value = (value,)
    return value


@dataclasses.dataclass
class Link:
    next: Link | None = None


def link_chain(n: int) -> Link:
    head = Link()
    for _ in range(n - 1):
        head = Link(head)
    return head


class Leaf(BaseModel):
    n: int


class Shade(enum.Enum):
    DARK = "dark"


class Pair(NamedTuple):
    a: int
    b: str


@dataclasses.dataclass
class Holder:
    leaf: Leaf
    shade: Shade
    pair: Pair | None = None


# =============================================================================== A: depth


@pytest.mark.parametrize("make, where", [
    (lambda: deep_tuple(200), "$" + "[0]" * MAX_DEPTH),
    (lambda: link_chain(220), "$" + ".next" * MAX_DEPTH),
], ids=["tuple-200", "dataclass-chain-220"])
def test_too_deep_is_refused_at_write_and_nothing_is_stored(
    store: Store, make: Any, where: str
) -> None:
    value = make()
    with pytest.raises(SerializationError) as info:
        store.put_checkpoint("deep", "c1", new_values={"state": ("1", value)})
    err = info.value
    assert err.path == where, err.path
    assert f"nests deeper than {MAX_DEPTH} levels" in str(err) and "Nothing was written" in str(err)
    with pytest.raises(SerializationError):
        store.put_checkpoint("deep", "c1", data=value)
    with pytest.raises(SerializationError):
        store.put_writes("deep", "c0", "task", [(0, "ch", value)])
    assert store.get_checkpoint("deep") is None
    assert store.list_runs() == []


@pytest.mark.parametrize("value", [
    msgpack.ExtType(1, b"2026-01-01T00:00:00"),  # reads as a datetime
    {"a": msgpack.ExtType(1, b"x")},
    [1, msgpack.ExtType(99, b"zz")],  # an unknown tag: unreadable
    {"k": [{"deep": msgpack.ExtType(10, msgpack.packb(["m:C", {}]))}]},  # a model record
], ids=["alone", "in-a-dict", "in-a-list", "nested"])
def test_a_raw_msgpack_ext_record_is_refused_at_write(store: Store, value: Any) -> None:
    """msgpack packs its own ExtType as an ext record: stored as it is, it would be read
    back as one of remit's records (or not at all). It is refused by its path, small or
    large, and nothing is stored."""
    with pytest.raises(SerializationError, match="raw msgpack ExtType"):
        encode(value)
    with pytest.raises(SerializationError, match="raw msgpack ExtType"):
        store.put_checkpoint("ext", "c1", new_values={"state": ("1", value)})
    assert store.get_checkpoint("ext") is None


class _Text(str):
    pass


def _wide(leaf: Any, *, width: int = 40, at: int = 17) -> dict[str, Any]:
    """A dict of ``width`` dicts (past the encoder's bulk check), ``leaf`` in one of them."""
    return {f"node{i}": {"ch": leaf if i == at else f"v{i}"} for i in range(width)}


def _deep_bulk(levels: int, leaf: Any = 1) -> list[Any]:
    """A list of 40 scalars and one value ``levels`` levels deep in all (``leaf`` in the
    deepest, or the deepest itself when it is an empty list)."""
    inner: Any = leaf
    for _ in range(levels - (2 if leaf == [] else 1)):
        inner = [inner]
    return [*range(40), inner]


LARGE = {
    "plain": _wide("v"),
    "ext value": _wide(msgpack.ExtType(1, b"2026-01-01T00:00:00")),
    "ext key": {**_wide("v"), "x": {msgpack.ExtType(99, b"z"): 1}},
    "ext key, wide": {msgpack.ExtType(99, b"z"): 1, **{f"k{i}": i for i in range(40)}},
    "memoryview": _wide(memoryview(b"abc")),
    "str subclass key": {**_wide("v"), "x": {_Text("k"): 1}},
    "tuple": _wide((1, 2)),
    "at the limit": _deep_bulk(MAX_DEPTH),
    "one past": _deep_bulk(MAX_DEPTH + 1),
    "empty one past": _deep_bulk(MAX_DEPTH + 1, []),
    "empty at the limit": _deep_bulk(MAX_DEPTH, []),
}


@pytest.mark.parametrize("name", list(LARGE))
def test_the_bulk_check_lists_members_as_the_walk_does(name: str) -> None:
    """The check of large containers lists a level's members through the garbage
    collector's traversal on CPython (at C speed); it answers as the same check listing
    them in Python, keys of every kind and values of every kind seen."""
    assert serde_module._children is __import__("gc").get_referents
    value = LARGE[name]
    fast = serde_module._plain_within([value], MAX_DEPTH)
    saved = serde_module._children
    try:
        serde_module._children = serde_module._children_walked
        walked = serde_module._plain_within([value], MAX_DEPTH)
    finally:
        serde_module._children = saved
    assert fast == walked == (name in ("plain", "at the limit", "empty at the limit"))


@pytest.mark.parametrize("name, error", [
    ("ext value", "raw msgpack ExtType"), ("ext key", "raw msgpack ExtType"),
    ("ext key, wide", "raw msgpack ExtType"), ("one past", "nests deeper"),
    ("empty one past", "nests deeper"),
])
def test_large_values_the_bulk_check_refuses_are_refused_at_write(name: str,
                                                                   error: str) -> None:
    with pytest.raises(SerializationError, match=error):
        encode(LARGE[name])


@pytest.mark.parametrize("name", ["plain", "at the limit", "empty at the limit", "memoryview",
                                  "str subclass key", "tuple"])
def test_large_values_the_bulk_check_passes_on_read_back(name: str) -> None:
    value = LARGE[name]
    back = decode(encode(value))
    if name == "memoryview":  # (stored as its bytes)
        assert back == _wide(b"abc")
        assert type(back["node17"]["ch"]) is bytes
    else:
        assert back == value
        assert list(map(type, back)) == list(map(type, value))


def _deep_small(levels: int, leaf: Any = 1) -> list[Any]:
    """A list ``levels`` levels deep with nothing beside it (``leaf`` in the deepest, or
    the deepest itself when it is an empty list): too small for the bulk check."""
    inner: Any = leaf
    for _ in range(levels - (1 if leaf == [] else 0) - 1):
        inner = [inner]
    return [inner]


#: values the strict packer packs as they are, for the check after the pack: each kind of
#: ext record, bytes that hold an ext header byte without one (a float, an int, a text, a
#: length), the depth at and past the limit, and values of few objects and many bytes
PACKED = {
    **LARGE,
    "small ext value": {"a": msgpack.ExtType(1, b"x")},
    "small ext in a list": [1, msgpack.ExtType(99, b"zz")],
    "ext of 300 bytes": [msgpack.ExtType(5, b"x" * 300)],
    "timestamp": {"at": msgpack.Timestamp(1, 2)},
    "float with a header byte": {"x": 2.0 ** -300, "y": [float.fromhex("0x1.d4d4d4p+3")]},
    "int 212": [212, {"k": 0xD4D5}],
    "non-ascii text": {"t": "Ǉ ԅ ה ث", "u": ["\u01c7" * 3]},
    "string of 212 characters": {"s": "a" * 212},
    "small at the limit": _deep_small(MAX_DEPTH),
    "small one past": _deep_small(MAX_DEPTH + 1),
    "small empty at the limit": _deep_small(MAX_DEPTH, []),
    "small empty one past": _deep_small(MAX_DEPTH + 1, []),
    "long text in a dict": {"doc": "word " * 100_000},
    "long bytes in a list": [b"\xd4" * 70_000, 1],
    "small memoryview": {"m": memoryview(b"\xd4\xc7")},
    "bytearray": [bytearray(b"ab"), {"b": bytearray(b"\xc9")}],
    "int keys": {1: [2], 3: {4: None}, None: True},
    "plain checkpoint data": {"v": 4, "ts": "2026-12-07T02:15:44+00:00", "id": "1f1f",
                              "versions_seen": {f"n{i}": {f"branch:to:n{i}": f"{i:032}.0.5"}
                                                for i in range(150)},
                              "updated_channels": ["count"]},
}


@pytest.mark.parametrize("name", list(PACKED))
def test_the_check_after_the_pack_answers_as_the_check_of_each_object(name: str) -> None:
    """After the strict packer packed a list or dict, the encoder clears it by its depth
    (counted a level at a time in C) and by its bytes (no ext record header in them);
    what it cannot clear goes to the check of each object. The two store the same bytes
    and refuse the same values: a value the count clears is one the object check clears
    too, but for a memoryview (stored as its bytes either way)."""
    value = PACKED[name]
    try:
        packed = serde_module._pack(value)
    except TypeError:  # (a str subclass, a tuple: the encoder rewrites them first)
        assert name in ("str subclass key", "tuple")
    else:
        by_object = serde_module._plain_ok(value, MAX_DEPTH)
        if serde_module._plain_packed(value, packed) and not by_object:
            assert "memoryview" in name
    general = Serde()
    saved = serde_module._plain_packed
    try:
        serde_module._plain_packed = lambda v, _p: serde_module._plain_ok(v, MAX_DEPTH)
        try:
            expected: Any = general.encode(value)
        except SerializationError as exc:
            expected = (str(exc), exc.path)
    finally:
        serde_module._plain_packed = saved
    try:
        got: Any = Serde().encode(value)
    except SerializationError as exc:
        got = (str(exc), exc.path)
    assert got == expected
    refused = ("ext" in name and "text" not in name) or "timestamp" in name or "past" in name
    assert isinstance(got, tuple) == refused, got


@pytest.mark.parametrize("name", [n for n in PACKED if ("ext" in n and "text" not in n)
                                  or n == "timestamp"])
def test_the_count_never_walks_into_an_ext_record(name: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """An ext record's members include its class, and through the class every object of
    the interpreter: the count of levels must never list them. The record's header byte
    sends the value to the check of each object before the count starts."""
    gc = __import__("gc")
    listed: list[Any] = []

    def spy(*objects: Any) -> list[Any]:
        members: list[Any] = gc.get_referents(*objects)
        listed.extend(members)
        return members

    monkeypatch.setattr(serde_module, "_children", spy)
    value = PACKED[name]
    assert not serde_module._plain_packed(value, serde_module._pack(value))
    assert not [x for x in listed if isinstance(x, type)]


@pytest.mark.parametrize("name", ["plain", "plain checkpoint data", "int keys",
                                  "small at the limit", "small empty at the limit"])
def test_plain_data_is_cleared_without_the_check_of_each_object(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The count and the bytes clear plain data whose bytes hold no ext header byte, up to
    one level below the limit, without looking at each object (what a checkpoint's data
    costs at every step); the check of each object is not called."""
    def by_object(*_: Any) -> bool:
        raise AssertionError("checked object by object")

    value = PACKED[name]
    if name.startswith("small"):  # one level below the limit: the count's one level more
        value = value[0]
    monkeypatch.setattr(serde_module, "_plain_ok", by_object)
    assert serde_module._plain_packed(value, serde_module._pack(value))
    assert decode(Serde().encode(value)) == value


_plain_data = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(),
              st.text(), st.binary()),
    lambda inner: st.one_of(st.lists(inner, max_size=5),
                            st.dictionaries(st.text(max_size=8), inner, max_size=5)),
    max_leaves=30)


@given(_plain_data)
def test_plain_data_packs_to_the_strict_packers_bytes(value: Any) -> None:
    """The encoder packs plain data with ormsgpack where it can: to the bytes msgpack's
    strict packer writes for it, byte for byte."""
    try:
        expected = serde_module._pack(value)
    except (TypeError, ValueError, OverflowError):
        expected = None
    assert serde_module._pack_as_is(value) == expected


def _strict_only(value: Any) -> bytes | None:
    """The encoder's pack before ormsgpack: msgpack's strict packer alone."""
    try:
        return serde_module._pack(value)
    except (TypeError, ValueError, OverflowError):
        return None


class _Number(int):
    pass


@pytest.mark.parametrize("value", [
    (1, 2), Pair(1, "a"), {1, 2}, frozenset({3}), Leaf(n=1), Holder(Leaf(n=2), Shade.DARK),
    Shade.DARK, _Number(5), _Text("t"), {"k": _Text("v")}, {_Text("k"): 1},
    dt.datetime(2026, 1, 2, tzinfo=ZoneInfo("Europe/Paris")), dt.date(2026, 1, 2),
    dt.time(3, 4), dt.timedelta(seconds=5), uuid.UUID(int=9), decimal.Decimal("1.5"),
    2**64, -2**63 - 1, "odd-\udcff", msgpack.ExtType(1, b"x"), msgpack.Timestamp(1, 2),
    __import__("ormsgpack").Ext(3, b"x"), memoryview(b"mv"), bytearray(b"ba"),
    {1: "int key"}, {None: "none key"}, {b"k": "bytes key"}, types.SimpleNamespace(a=1),
], ids=lambda v: type(v).__name__)
def test_ormsgpack_packs_nothing_the_strict_packer_would_not(value: Any) -> None:
    """With every passthrough option, ormsgpack writes no typed value its own way (a
    tuple as a list, a datetime as text, a subclass as its base...): each, alone, in a
    list and in a dict, is stored (or refused) exactly as with msgpack's strict packer
    alone."""
    for v in (value, [1, value], {"v": value}):
        got: list[Any] = []
        for pack in (serde_module._pack_as_is, _strict_only):
            saved = serde_module._pack_as_is
            serde_module._pack_as_is = pack
            try:
                got.append(encode(v))
            except SerializationError as exc:
                got.append((str(exc), exc.path))
            finally:
                serde_module._pack_as_is = saved
        assert got[0] == got[1], v


def test_everything_below_the_limit_round_trips() -> None:
    nested_list: Any = 1
    for _ in range(MAX_DEPTH):
        nested_list = [nested_list]
    mixed: Any = 1
    for i in range(MAX_DEPTH):
        mixed = ({"k": mixed}, (mixed,), {mixed} if i == 0 else [mixed])[i % 3]
    def chain(make: Any, n: int) -> Any:
        value: Any = None
        for _ in range(n):
            value = make(value)
        return value

    kinds = [lambda v: frozenset([v]), lambda v: Pair(1, v)]  # type: ignore[arg-type]
    keyed = chain(lambda v: {"k": v, (1,): 0}, MAX_DEPTH - 1)  # a tuple key is one level more
    assert decode(encode(keyed)) == keyed
    with pytest.raises(SerializationError, match=r"\$(\.k){99}\.<key \(1,\)> nests deeper"):
        encode({"k": keyed, (1,): 0})
    for value in (deep_tuple(MAX_DEPTH), nested_list, link_chain(MAX_DEPTH), mixed,
                  *(chain(make, MAX_DEPTH) for make in kinds)):
        assert decode(encode(value)) == value
        assert digest(value) == digest(decode(encode(value)))
    for value in (deep_tuple(MAX_DEPTH + 1), [nested_list], link_chain(MAX_DEPTH + 1),
                  *(chain(make, MAX_DEPTH + 1) for make in kinds)):
        with pytest.raises(SerializationError, match="nests deeper"):
            encode(value)
        with pytest.raises(SerializationError, match="nests deeper"):
            digest(value)


def test_deep_values_give_serialization_error_from_the_digest() -> None:
    """Deterministic ids digest values: a deep one is refused, not a RecursionError."""
    deep: Any = None
    for _ in range(3000):
        deep = [deep]
    for value in (deep, {"x": deep_tuple(600)}, link_chain(2000)):
        with pytest.raises(SerializationError) as info:
            derive_id("parent", "fork", value)
        assert info.value.path.startswith("$")
        with pytest.raises(SerializationError):
            encode(value)


def nested_ext(code: int, depth: int, wrap: Any = None) -> Any:
    inner: Any = None
    for _ in range(depth):
        inner = ext(code, [inner] if wrap is None else wrap(inner))
    return inner


CRAFTED_DEEP = {
    "tuple-300": blob(nested_ext(TUPLE, 300)),
    "tuple-5000": blob(nested_ext(TUPLE, 5000)),
    "send-chain-400": blob(nested_ext(
        REGISTERED, 400, wrap=lambda inner: ["langgraph:Send", {"node": "n", "arg": inner}])),
    "list-in-tuple-250": blob(nested_ext(TUPLE, 250, wrap=lambda inner: [[[inner]]])),
    "plain-lists-1000": b"\x01" + b"\x91" * 1000 + b"\xc0",
    "plain-lists-5000": b"\x01" + b"\x91" * 5000 + b"\xc0",
    "plain-maps-800": b"\x01" + b"\x81\xa1k" * 800 + b"\xc0",
}


def test_crafted_deep_blobs_are_corrupt_records_in_a_child() -> None:
    with Decoder() as child:
        answers = {name: child.decode(data) for name, data in CRAFTED_DEEP.items()}
    for name, answer in answers.items():
        assert answer["outcome"] == "corrupt", (name, answer)
        assert answer["imported"] == [], (name, answer)
    assert "nest deeper than" in answers["tuple-300"]["message"]


# ===================================================== B: exact names, nothing imported


CRAFTED_NAMES = {
    "FakeEmbeddings": blob(ext(MODEL, ["langchain_core.embeddings:FakeEmbeddings", {"size": 3}])),
    "FakeListLLM": blob(ext(MODEL, ["langchain_core.language_models:FakeListLLM",
                                    {"responses": ["hi"]}])),
    "stat_result": blob(ext(NAMEDTUPLE, ["os:stat_result", list(range(10))])),
    "os.system-model": blob(ext(MODEL, ["os:system", {"command": "true"}])),
    "os.system-dataclass": blob(ext(DATACLASS, ["os:system", {}])),
    "os.system-namedtuple": blob(ext(NAMEDTUPLE, ["os:system", ["true"]])),
    "signal-enum": blob(ext(ENUM, ["signal:Signals", 9])),
    "base-model": blob(ext(MODEL, ["pydantic:BaseModel", {}])),
    "unimported-module": blob(ext(DATACLASS, ["http.server:HTTPServer", {}])),
    "registered-unknown": blob(ext(REGISTERED, ["subprocess:CalledProcessError", [1, "ls"]])),
    "no-such-zone": b"\x01" + msgpack.packb(
        msgpack.ExtType(17, b"2026-01-01T00:00:00|0|Remit/No_Such_Zone")),
}


def test_crafted_type_names_import_nothing_and_build_nothing() -> None:
    with Decoder() as child:
        answers = {name: child.decode(data) for name, data in CRAFTED_NAMES.items()}
    for name, answer in answers.items():
        assert answer["imported"] == [], (name, answer)
        assert answer["outcome"] == "corrupt", (name, answer)
    assert "langchain_core.language_models:FakeListLLM" in answers["FakeListLLM"]["message"]
    assert answers["stat_result"]["type"] == "UnregisteredType"


class Stranger(BaseModel):
    """Encoded by one Serde, read by another that never saw it."""

    n: int


def test_an_unregistered_type_is_refused_with_what_to_do() -> None:
    data = Serde().encode({"x": Stranger(n=1)}, record="checkpoint 'c1'")
    reader = Serde()
    with pytest.raises(CorruptRecord) as info:
        reader.decode(data, record="checkpoint 'c1'")
    err = info.value
    assert type(err).__name__ == "UnregisteredType"
    assert getattr(err, "type_name", None) == f"{__name__}:Stranger"
    assert "checkpoint 'c1'" in str(err) and ".allow(" in str(err)
    reader.allow(Stranger)
    assert reader.decode(data) == {"x": Stranger(n=1)}


def test_a_class_the_process_encodes_is_readable_in_that_process() -> None:
    class Local(BaseModel):
        n: int

    @dataclasses.dataclass
    class LocalDC:
        local: Local

    s = Serde()
    value = LocalDC(Local(n=2))
    assert s.decode(s.encode(value)) == value
    assert "<locals>" in type(value).__qualname__

    class Local2(BaseModel):  # the same name defined again (a function called twice)
        n: int

    Local2.__qualname__ = Local.__qualname__
    again = s.decode(s.encode(Local2(n=3)))
    assert type(again) is Local2


def test_allow_takes_only_classes_it_can_rebuild() -> None:
    s = Serde()
    s.allow(Leaf, Shade, Pair, Holder)
    value = Holder(Leaf(n=1), Shade.DARK, Pair(1, "x"))
    assert s.decode(Serde().encode(value)) == value
    import os

    for bad in (os.stat_result, int, dict, Exception, BaseModel):
        with pytest.raises(TypeError, match="allow"):
            s.allow(bad)


class Inner(TypedDict):
    pair: Pair


class Graphish(TypedDict, total=False):
    leaves: Annotated[list[Leaf], operator.add]
    maybe: Optional[Holder]  # noqa: UP045 -- the old spelling must be understood too
    by_name: dict[str, Shade]
    inner: Inner


def test_allow_annotations_walks_typing_annotations() -> None:
    s = Serde()
    found = s.allow_annotations(Graphish)
    assert set(found) == {Leaf, Holder, Shade, Pair}
    value = {"leaves": [Leaf(n=1)], "maybe": Holder(Leaf(n=2), Shade.DARK),
             "by_name": {"a": Shade.DARK}, "inner": {"pair": Pair(2, "y")}}
    assert s.decode(Serde().encode(value)) == value
    assert s.allow_annotations(int, list[str], Any, None, "Forward") == []


def test_allowed_modules_look_only_at_imported_modules() -> None:
    module = types.ModuleType("remit_test_lazy_mod")
    called: list[str] = []

    def lazy(name: str) -> Any:  # a module __getattr__ that would import on access
        called.append(name)
        raise AttributeError(name)

    @dataclasses.dataclass
    class Thing:
        x: int

    Thing.__module__, Thing.__qualname__ = module.__name__, "Thing"
    module.Thing = Thing  # type: ignore[attr-defined]
    module.__getattr__ = lazy  # type: ignore[method-assign]
    data = Serde().encode(Thing(3))
    sys.modules[module.__name__] = module
    try:
        reader = Serde(allowed_modules=[module.__name__])
        assert reader.decode(data) == Thing(3)
        missing = blob(ext(DATACLASS, [f"{module.__name__}:Other", {}]))
        with pytest.raises(CorruptRecord):
            reader.decode(missing)
        assert called == []
    finally:
        del sys.modules[module.__name__]
    with pytest.raises(CorruptRecord, match="not imported"):
        Serde(allowed_modules=[module.__name__]).decode(data)
    assert module.__name__ not in sys.modules


def test_a_lenient_serde_shows_an_unregistered_type_as_such() -> None:
    data = Serde().encode({"x": Stranger(n=5), "t": (1, 2)})
    out = Serde(lenient=True).decode(data)  # type: ignore[call-arg,unused-ignore]
    assert out["t"] == (1, 2)
    assert repr(out["x"]) == f"<unregistered type {__name__}:Stranger>"


def test_a_serdes_lenient_view_shares_its_registrations_and_leaves_it_strict() -> None:
    strict = Serde()
    view = strict.lenient()
    strict.register(Payment, dataclasses.asdict, lambda d: Payment(**d))  # after the view
    data = Serde().encode({"x": Stranger(n=5)})
    paid = strict.encode(Payment("p1", decimal.Decimal("2.50")))
    assert repr(view.decode(data)["x"]) == f"<unregistered type {__name__}:Stranger>"
    assert view.decode(paid) == Payment("p1", decimal.Decimal("2.50"))
    with pytest.raises(UnregisteredType):
        strict.decode(data)
    assert view.lenient() is view and strict.lenient() is view


# ============================================================ effects replayed elsewhere


@dataclasses.dataclass
class Payment:
    id: str
    amount: decimal.Decimal


CHILD_PAY = """
import sys
from remit_core import effect, effect_scope, open_store
from tests.test_serde_hardening import Payment

calls = []

@effect(name="pay")
def pay(amount: str) -> Payment | None:
    calls.append(amount)
    return Payment(f"tx-{amount}", __import__("decimal").Decimal(amount))

with open_store(sys.argv[1]) as store, effect_scope(store, run_id="order", step="bill"):
    print(repr(pay("9.50")), len(calls))
"""


def test_an_effect_result_replays_in_another_process(store_url: str) -> None:
    """A receipt recorded by one process replays in the next one (a recovery): the
    effect's return annotation allows its classes there."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    runs = [subprocess.run([sys.executable, "-c", CHILD_PAY, store_url], cwd=root,
                           capture_output=True, text=True, timeout=120, check=False)
            for _ in range(2)]
    first, replay = runs
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "Payment(id='tx-9.50', amount=Decimal('9.50')) 1"
    assert replay.returncode == 0, replay.stderr[-2000:]
    assert replay.stdout.strip() == "Payment(id='tx-9.50', amount=Decimal('9.50')) 0"


# ====================================================================== C: zones, surrogates


def test_a_zoneinfo_datetime_keeps_its_zone() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    winter = dt.datetime(2026, 1, 15, 12, 0, tzinfo=berlin)
    ambiguous = dt.datetime(2026, 10, 25, 2, 30, tzinfo=berlin, fold=1)
    for value in (winter, ambiguous):
        out = decode(encode(value))
        assert out == value and out.tzinfo is berlin and out.fold == value.fold
        assert out.utcoffset() == value.utcoffset()
    summer = decode(encode(winter)) + dt.timedelta(days=180)  # DST is kept, not a fixed +01:00
    assert summer.utcoffset() == dt.timedelta(hours=2)
    assert decode(encode({"at": [winter]})) == {"at": [winter]}


def test_a_fixed_offset_stays_a_fixed_offset() -> None:
    fixed = dt.datetime(2026, 1, 15, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    out = decode(encode(fixed))
    assert out == fixed and type(out.tzinfo) is dt.timezone
    assert (out + dt.timedelta(days=180)).utcoffset() == dt.timedelta(hours=1)


def test_a_string_with_a_lone_surrogate_round_trips() -> None:
    odd = "file-\udcff.txt"
    value = {odd: [odd, ("x", odd)], "leaf": Leaf(n=1), "plain": "ok"}
    out = decode(encode(value))
    assert out == value and type(next(iter(out))) is str
    assert digest(value) == digest(out) != digest({**value, odd: []})


def test_digest_is_unchanged_for_values_stored_before() -> None:
    """Ids derived by earlier releases stay the same (fork ids, claim digests)."""
    assert digest({"a": 1, "b": (1, 2)}) == (
        "837f85418231a579673fc395ecb10468bab4b89d8ec20678e2de3623111e95d4")
    assert derive_id("p", "fork", [uuid.UUID(int=1), Leaf(n=1)]) == (
        "353ffb60-2708-512a-8079-f4a88752accd")
    rich = [Holder(Leaf(n=2), Shade.DARK, Pair(1, "x")), {3, 1, 2}, frozenset({"a"}),
            dt.datetime(2026, 1, 1, tzinfo=dt.UTC), dt.timedelta(5), decimal.Decimal("1.5"),
            2**70, {"k": {(1, 2): [1.5, None, b"x"]}}]
    assert digest(rich) == "f5ac68cedcb5d25e7a088249624e2703b80091d552a88825420c57d20892e41a"


class _Text(str):
    pass


class _Count(int):
    pass


_leaves = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False), st.text(), st.binary(max_size=8),
    st.text(max_size=4).map(_Text), st.integers(-5, 5).map(_Count),
    st.sampled_from([Shade.DARK, "odd-\udcff", uuid.UUID(int=7), decimal.Decimal("2.5")]))
_nested = st.recursive(_leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.tuples(inner, inner),
    st.dictionaries(st.one_of(st.text(max_size=6), st.integers(0, 3),
                              st.text(max_size=3).map(_Text)), inner, max_size=4),
    st.frozensets(st.integers(0, 9), max_size=3)), max_leaves=20)


@given(_nested)
def test_the_short_path_of_exact_json_types_digests_as_the_long_one(value: Any) -> None:
    """The digest's short path for values of exactly str, int, list, dict, ... gives the
    digest the general path gives (ids derived before it stay the same), subclasses,
    non-text keys and lone surrogates included."""
    general = Serde()
    general._canonical = general._canonical_any  # type: ignore[method-assign]
    assert digest(value) == general.digest(value)


class _EarlierDigest(Serde):
    """The digest as remit wrote it before its members were taken without a call: every
    member through ``_canonical``, each map's keys ordered by ``msgpack.packb`` of the key,
    packed by ``msgpack.packb``. The digest of today must give the same bytes (derived ids
    are compared across releases)."""

    def digest(self, value: Any) -> str:
        try:
            packed = msgpack.packb(self._canonical(value, 0, True), strict_types=False)
        except serde_module._Refused as refused:
            raise serde_module._serialization_error(refused, "value") from None
        return hashlib.sha256(packed).hexdigest()

    def _canonical_container(self, value: Any, level: int, check: bool) -> Any:
        if isinstance(value, dict):
            items = []
            for k, v in value.items():
                try:
                    items.append((self._canonical(k, level, check),
                                  self._canonical(v, level, check)))
                except serde_module._Refused as refused:
                    refused.segments.append(f".{k}")
                    raise
            items.sort(key=lambda kv: msgpack.packb(kv[0]))
            return ["#map", [list(kv) for kv in items]]
        members = []
        for i, v in enumerate(value):
            try:
                members.append(self._canonical(v, level, check))
            except serde_module._Refused as refused:
                refused.segments.append(f"[{i}]")
                raise
        if isinstance(value, list):
            return members
        if type(value) is tuple:
            return ["#tuple", members]
        members.sort(key=msgpack.packb)
        return ["#set", members]


# keys of every msgpack str header (fixstr, str 8, str 16), ASCII or not, beside others
_keys = st.one_of(
    st.text(max_size=6), st.text(alphabet="ab", min_size=28, max_size=36),
    st.text(alphabet="ab\u00e9\u4e2d", min_size=0, max_size=40),
    st.sampled_from(["x" * 255, "x" * 256, "y" * 256, "x" * 300, "\u00e9" * 20]),
    st.integers(-3, 2**65), st.booleans(), st.none(), st.floats(allow_nan=False),
    st.binary(max_size=3), st.tuples(st.integers(0, 2), st.text(max_size=2)),
    st.text(max_size=3).map(_Text))
_digestible = st.recursive(_leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.tuples(inner, inner),
    st.dictionaries(_keys, inner, max_size=6),
    st.dictionaries(st.text(alphabet="abz", max_size=40), inner, max_size=6),
    st.sets(st.one_of(st.integers(-5, 300), st.text(max_size=40)), max_size=4),
    st.frozensets(st.text(alphabet="ab", max_size=34), max_size=3)), max_leaves=30)


@given(_digestible)
def test_the_digest_gives_the_bytes_of_earlier_releases(value: Any) -> None:
    """Derived ids stay those of earlier releases: the digest's members taken without a
    call, its text keys ordered by length and text, its own Packer, give the same
    digests as every member through ``_canonical`` and every key through ``packb``."""
    assert digest(value) == _EarlierDigest().digest(value)


@pytest.mark.parametrize("value", [
    {"b": 1, "aa": 2, "": 3, "a" * 31: 4, "a" * 32: 5, "b" * 32: 6, "a" * 256: 7, "c" * 255: 8},
    {"zz": {"y": [{"xxx": 1, "w": 2}]}, "a": ({"bb": 1, "c": 2},)},
    {"a": 1, "\u00e9": 2, "b": 3}, {"ab": 1, 7: 2, "b": 3},
])
def test_text_keys_are_ordered_as_their_encodings(value: Any) -> None:
    """Text keys go by length, then text, as msgpack's encodings of them sort."""
    assert digest(value) == _EarlierDigest().digest(value)


@pytest.mark.parametrize("value", [
    {"ok": [1, {"deep": [object()]}]},
    [1, "a", (2, {3: {"k": [None, object()]}})],
    {"a": 1, (1, 2): [b"x", {frozenset({1}): object()}]},
    {"\u00e9": [object()]},
    {"z": [[[[[]]]]], "y": ["x" * 40, {"w": {1, 2, object}}]},
])
def test_a_refusal_names_the_path_of_earlier_releases(value: Any) -> None:
    """The digest's refusal names the same path as before it took members without a call."""
    with pytest.raises(SerializationError) as now:
        digest(value)
    with pytest.raises(SerializationError) as before:
        _EarlierDigest().digest(value)
    assert now.value.path == before.value.path != "$"
    assert str(now.value) == str(before.value)


def test_a_deep_value_in_a_map_is_refused_at_the_same_level() -> None:
    """The depth limit holds where a nested list or dict goes straight to the container."""
    limit = serde_module.MAX_DEPTH
    for depth in (limit - 2, limit - 1, limit, limit + 1):
        value: Any = 1
        for i in range(depth):
            value = {"k": value} if i % 2 else [value]
        try:
            expected = _EarlierDigest().digest(value)
        except SerializationError as exc:
            with pytest.raises(SerializationError) as info:
                digest(value)
            assert info.value.path == exc.path
        else:
            assert digest(value) == expected


@given(st.integers(min_value=0, max_value=2**128 - 1), st.text(), st.text())
def test_derived_ints_and_texts_are_uuids(n: int, parent: str, intent: str) -> None:
    from remit_core.ids import REMIT_NAMESPACE, derive_int, uuid_text

    assert uuid_text(n) == str(uuid.UUID(int=n))
    name = f"{parent}\x1f{intent}\x1f{digest([parent])}"
    try:
        expected = uuid.uuid5(REMIT_NAMESPACE, name)
    except UnicodeEncodeError:  # a lone surrogate in the id: refused alike
        with pytest.raises(UnicodeEncodeError):
            derive_int(parent, intent, [parent])
        return
    assert derive_int(parent, intent, [parent]) == expected.int
    assert derive_id(parent, intent, [parent]) == str(expected)


# ====================================== the model fast paths: what they store and refuse


class Box(BaseModel):
    items: list[int] = []
    tags: dict[str, str] = {}
    note: str = ""


class Aliased(BaseModel):
    model_config = {"populate_by_name": True}
    inner: Leaf = Leaf(n=1)
    label: str = Field("x", alias="Label")


class Stamped(BaseModel):
    """A model with a ``model_dump`` of its own: the envelope stores what it returns."""
    at: str

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        dumped = super().model_dump(**kwargs)
        dumped["at"] = dumped["at"].upper()
        return dumped


def test_a_model_with_its_own_model_dump_is_stored_as_it_dumps() -> None:
    serde = Serde()
    serde.allow(Stamped)
    back = serde.decode(serde.encode([Stamped(at="noon"), {"s": Stamped(at="dusk")}]))
    assert back == [Stamped(at="NOON"), {"s": Stamped(at="DUSK")}]


def test_models_store_the_bytes_of_their_model_dump() -> None:
    """The encoder calls a model's serializer as ``model_dump`` does when the class keeps
    pydantic's ``model_dump``: the same bytes as through ``model_dump``, in every place a
    model can be (alone, in a list, a dict, a tuple, another model's fields)."""
    values = [Box(items=[1, 2], tags={"a": "b"}, note="n"), Box(),
              Aliased(inner=Leaf(n=3), Label="y"), [Box(), Aliased(), Leaf(n=2)],
              {"k": Box(items=[3])}, (Aliased(), Box(note="t")), Stamped(at="x")]
    serde = Serde()
    got = [serde.encode(v) for v in values]
    saved = serde_module._MODEL_DUMP
    try:
        serde_module._MODEL_DUMP = object()  # every model through its model_dump
        assert [Serde().encode(v) for v in values] == got
    finally:
        serde_module._MODEL_DUMP = saved
    serde.allow(Box, Aliased, Leaf, Stamped)
    assert [serde.decode(g) for g in got][:-1] == values[:-1]


def _boxed(wrappers: int, fields: dict[str, Any]) -> bytes:
    """A crafted Box record inside ``wrappers`` plain lists (the record at that level, its
    fields one level deeper)."""
    record = ext(MODEL, [f"{Box.__module__}:Box", fields])
    return b"\x01" + b"\x91" * wrappers + msgpack.packb(record, strict_types=True)


def _outcome(serde: Serde, data: bytes) -> Any:
    try:
        return serde.decode(data)
    except CorruptRecord as exc:
        return str(exc)


def test_a_models_fields_are_read_at_the_depth_limit_as_the_walk_reads_them() -> None:
    """A model's fields whose lists and dicts are all empty are taken as they are (their
    members listed once, in C); at the depth limit an empty list among them is still one
    level too deep, as the walk of each field finds."""
    serde = Serde()
    serde.allow(Box)
    field_sets = [{"items": [], "note": "n"}, {"items": [], "tags": {}}, {"note": "n"},
                  {"items": [1]}, {"items": [], "tags": {"a": "b"}}, {},
                  {"items": ext(TUPLE, [1, 2]), "tags": {}}]  # (a record among them)
    outcomes = {}
    for wrappers in range(MAX_DEPTH - 3, MAX_DEPTH + 1):
        for i, fields in enumerate(field_sets):
            data = _boxed(wrappers, fields)
            fast = _outcome(serde, data)
            saved = serde_module._LISTED_IN_C
            try:
                serde_module._LISTED_IN_C = False  # each field walked
                walked = _outcome(serde, data)
            finally:
                serde_module._LISTED_IN_C = saved
            assert fast == walked, (wrappers, fields)
            outcomes[wrappers, i] = "corrupt" if isinstance(fast, str) else "read"
    assert outcomes[MAX_DEPTH - 2, 0] == "read"
    assert outcomes[MAX_DEPTH - 1, 0] == "corrupt"  # the empty list is one level too deep
    assert outcomes[MAX_DEPTH - 1, 2] == "read"  # scalars only: at the limit, still read
    assert outcomes[MAX_DEPTH, 2] == "corrupt"  # the record itself past it
    assert serde.decode(_boxed(3, field_sets[-1])) == [[[Box(items=[1, 2])]]]
    box: Any = Box(note="n")
    for _ in range(MAX_DEPTH - 2):
        box = [box]
    assert serde.decode(serde.encode(box)) == box  # what the encoder writes there is read


@pytest.mark.parametrize("fields", [{}, {"items": [3]}, {"tags": {"a": "b"}}])
def test_a_model_near_the_depth_limit_is_stored_only_as_it_reads_back(
        fields: dict[str, Any]) -> None:
    """A model's fields kept as they are (scalars, empty lists and maps) are kept so only
    while they have room below them: around the depth limit, a model whose fields hold
    empty or short lists and maps is either refused or read back equal."""
    serde = Serde()
    serde.allow(Box)
    stored = refused = 0
    for depth in range(MAX_DEPTH - 3, MAX_DEPTH + 2):
        value: Any = Box(**fields)
        for _ in range(depth):
            value = [value]
        try:
            data = serde.encode(value)
        except SerializationError as err:
            assert "nests deeper" in str(err)
            refused += 1
            continue
        assert serde.decode(data) == value
        stored += 1
    assert stored and refused  # (both sides of the limit were tried)


class Pairs(BaseModel):
    """A model whose fields hold records: a map with tuples as keys, a tuple."""
    by: dict[tuple[int, int], str]
    at: tuple[int, int] | None = None
    n: int = 0


TOP_LEVEL_MAPS = {
    "scalars and empty containers": {"a": [], "b": {}, "c": 1, "d": None},
    "lists and maps of scalars": {"a": [1, "x", 2.5], "b": {"k": None, "l": b"y"}},
    "int keys inside": {"a": {1: "x", 2: [3]}},
    "a record two levels down": {"a": [(1, 2)], "b": "x"},
    "a record in a map inside": {"a": {"b": (1, 2)}},
    "a record as a key": {(1, 2): 1, "b": [3]},
    "a record as a key inside": {"a": {(1,): "x"}},
    "three levels": {"a": [[1]], "b": {"c": {"d": 2}}},
    "leaves two levels down": {"a": [dt.datetime(2026, 12, 7, 1, 2, 3), uuid.UUID(int=7)],
                               "b": {"c": decimal.Decimal("1.5")}},
    "models two levels down": {"a": [Leaf(n=1)], "b": {"c": Leaf(n=2)}},
    "a model with records as keys in a field": {"a": Pairs(by={(1, 2): "x"}, n=3)},
    "a model with a record as a field": {"a": Pairs(by={}, at=(4, 5))},
}


@pytest.mark.parametrize("name", list(TOP_LEVEL_MAPS))
def test_a_top_level_map_reads_back_as_the_walk_reads_it(name: str) -> None:
    """A map of scalars, and of lists and maps of scalars, is returned as the unpack
    made it (its members listed once, in C); one with a record anywhere in it, as a key
    too, or three levels deep, is walked, and both read the same value."""
    serde = Serde()
    serde.allow(Leaf)
    serde.allow(Pairs)
    value = TOP_LEVEL_MAPS[name]
    data = serde.encode(value)
    fast = serde.decode(data)
    saved = serde_module._LISTED_IN_C
    try:
        serde_module._LISTED_IN_C = False  # walked, level by level
        walked = serde.decode(data)
    finally:
        serde_module._LISTED_IN_C = saved
    assert fast == walked == value
    assert repr(fast) == repr(value)  # (the same types: tuples stay tuples)
