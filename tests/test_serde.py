"""The typed envelope: round trips, write-time errors, corrupt bytes, canonical digests."""

from __future__ import annotations

import dataclasses
import datetime as dt
import sys
import types
import uuid
from typing import Any, NamedTuple

import pytest
from pydantic import BaseModel, RootModel, model_validator

from remit_core import CorruptRecord, SerializationError, derive_id
from remit_core.serde import Serde, decode, digest, encode
from tests.test_store import RICH, Point


class Pair(NamedTuple):
    a: int
    b: str


class Nested(BaseModel):
    when: dt.datetime
    inner: list[Point] = []


@pytest.mark.parametrize("value", [
    None, True, 0, -1, 2**64 - 1, 2**64, -(2**63) - 1, 1.25, "", "ü", b"", b"\x00",
    [], {}, (), (1,), {1}, frozenset(), Pair(1, "x"),
    dt.time(1, 2, 3), dt.datetime(2026, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=2))),
    Nested(when=dt.datetime(2026, 5, 5), inner=[Point(1, 2.0)]), RICH,
])
def test_round_trip(value: Any) -> None:
    out = decode(encode(value))
    assert out == value and type(out) is type(value)


def test_a_value_whose_truth_is_ambiguous_is_refused_by_its_path() -> None:
    """The encoder asks only lists and dicts whether they are empty: a value of another
    type that refuses ``bool()`` (an array, say) is refused for its type, at its path."""
    class Ambiguous:
        def __bool__(self) -> bool:
            raise ValueError("the truth value is ambiguous")

    for value, path in (({"a": 1, "b": Ambiguous()}, "$.b"), ([1, Ambiguous()], "$[1]"),
                        ({"x": [{}, {"y": Ambiguous()}]}, "$.x[1].y")):
        with pytest.raises(SerializationError) as info:
            encode(value)
        assert (info.value.path, info.value.type_name) == (path, "Ambiguous"), info.value


def test_bytearray_reads_back_as_bytes() -> None:
    assert decode(encode(bytearray(b"ab"))) == b"ab"


def test_unsupported_type_fails_at_write_with_path() -> None:
    class Opaque:
        pass

    with pytest.raises(SerializationError) as info:
        encode({"a": [1, {"b": Opaque()}]}, record="state of run 'r'")
    err = info.value
    assert err.path == "$.a[1].b" and err.type_name == "Opaque"
    assert "state of run 'r'" in str(err) and "pickle" in str(err)
    with pytest.raises(SerializationError):
        encode(lambda: 1)
    with pytest.raises(SerializationError):
        digest({"x": object()})


def test_corrupt_bytes_name_the_record() -> None:
    good = encode({"x": 1})
    for bad in (b"", b"\x02" + good[1:], good[:-1], b"\x01\xc1"):
        with pytest.raises(CorruptRecord) as info:
            decode(bad, record="checkpoint 'c7' of run 'r'")
        assert info.value.record == "checkpoint 'c7' of run 'r'"


def test_decoding_never_imports_a_module() -> None:
    mod = types.ModuleType("remit_test_transient_mod")

    @dataclasses.dataclass
    class Thing:
        x: int

    Thing.__module__ = mod.__name__
    Thing.__qualname__ = "Thing"
    mod.Thing = Thing  # type: ignore[attr-defined]
    sys.modules[mod.__name__] = mod
    try:
        data = encode(Thing(3))
        assert decode(data) == Thing(3)  # the writing process reads back what it wrote
    finally:
        del sys.modules[mod.__name__]
    reader = Serde(allowed_modules=[mod.__name__])  # a reader that never saw the class
    with pytest.raises(CorruptRecord, match="not imported"):
        reader.decode(data)
    with pytest.raises(CorruptRecord, match="not registered or allowed"):
        Serde().decode(data)
    assert mod.__name__ not in sys.modules


def test_allowed_modules_are_never_imported() -> None:
    s = Serde(allowed_modules=["fractions"])
    import enum

    Color = enum.Enum("Color", {"RED": 1}, module="fractions")
    import fractions

    fractions.Color = Color  # type: ignore[attr-defined]
    data = Serde().encode(Color.RED)
    assert s.decode(data) is Color.RED  # found in the imported module's namespace
    saved = sys.modules.pop("fractions")
    try:
        with pytest.raises(CorruptRecord, match="not imported"):
            s.decode(data)
        assert "fractions" not in sys.modules
    finally:
        sys.modules["fractions"] = saved
        del fractions.Color  # type: ignore[attr-defined]


class Built(BaseModel):
    """A model with an __init__ of its own and validators that count their calls."""

    x: int
    tags: list[str] = []

    def __init__(self, **fields: Any) -> None:
        BUILT.append(("init", dict(fields)))
        super().__init__(**fields)

    @model_validator(mode="wrap")
    @classmethod
    def _wrap(cls, data: Any, handler: Any) -> Any:
        BUILT.append("wrap")
        return handler(data)

    @model_validator(mode="after")
    def _after(self) -> Built:
        BUILT.append("after")
        return self


BUILT: list[Any] = []


class Rooted(RootModel[dict[str, int]]):
    pass


def test_a_model_with_its_own_init_is_built_as_the_application_builds_it() -> None:
    """Decoding calls the model's own __init__ once with the stored fields, and its wrap and
    after validators run once, as in ``Built(**fields)`` (``model_validate`` would run them
    twice around the __init__). A model without its own __init__ (here a root model, whose
    fields are its root) is validated with ``model_validate``. Stored fields the model
    refuses are a CorruptRecord."""
    data = encode(Built(x=1, tags=["a"]))
    BUILT.clear()
    back = decode(data)
    assert BUILT == [("init", {"x": 1, "tags": ["a"]}), "wrap", "after"]
    assert back == Built(x=1, tags=["a"])
    rooted = Rooted({"root": 1, "other": 2})
    assert decode(encode(rooted)) == rooted
    with pytest.raises(CorruptRecord, match="ValidationError"):
        decode(_with_field(encode(Built(x=1)), "x", "not a number"))


def _with_field(data: bytes, field: str, value: Any) -> bytes:
    """``data`` (a model's envelope) with one stored field replaced."""
    import msgpack

    body = msgpack.unpackb(data[1:], strict_map_key=False)
    name, fields = msgpack.unpackb(body.data)
    fields[field] = value
    return data[:1] + msgpack.packb(msgpack.ExtType(body.code, msgpack.packb([name, fields])))


def test_registered_types() -> None:
    class Money:
        def __init__(self, cents: int) -> None:
            self.cents = cents

    s = Serde()
    s.register(Money, lambda m: m.cents, Money, name="money")
    out = s.decode(s.encode({"m": Money(250)}))
    assert isinstance(out["m"], Money) and out["m"].cents == 250
    with pytest.raises(CorruptRecord, match="registered type 'money'"):
        Serde().decode(s.encode(Money(1)))


def test_digest_is_canonical() -> None:
    assert digest({"a": 1, "b": [1, {"c": 2, "d": 3}]}) == digest({"b": [1, {"d": 3, "c": 2}], "a": 1})
    assert digest({1, 2, 3}) == digest({3, 2, 1})
    assert digest((1, 2)) != digest([1, 2])
    assert digest({"a": 1}) != digest({"a": 2})
    m1 = Nested(when=dt.datetime(2026, 1, 1))
    m2 = Nested(when=dt.datetime(2026, 1, 1))
    assert digest(m1) == digest(m2) != digest(Nested(when=dt.datetime(2026, 1, 2)))


def test_derive_id_is_deterministic() -> None:
    a = derive_id("parent", "fork", {"x": 1, "y": [1, 2]})
    assert a == derive_id("parent", "fork", {"y": [1, 2], "x": 1})
    assert a != derive_id("parent", "fork", {"x": 2, "y": [1, 2]})
    assert a != derive_id("parent", "retry", {"x": 1, "y": [1, 2]})
    assert a != derive_id("other", "fork", {"x": 1, "y": [1, 2]})
    assert uuid.UUID(a).version == 5


class _Probe:
    def __init__(self, n: int) -> None:
        self.n = n


@pytest.mark.parametrize(("name", "hint"), [
    # a type name of an installed adapter's registrations: import that adapter
    ("langgraph:Probe", "import remit_langgraph before reading"),
    ("remit_langgraph:probe", "import remit_langgraph before reading"),
    # anyone else's: register it
    ("someones:Probe", "register it with Serde.register(cls, to_data, from_data, "
                       "name='someones:Probe')"),
])
def test_an_unregistered_type_says_which_adapter_registers_it(name: str, hint: str) -> None:
    """The hint comes from the installed ``remit.serde`` entry points, not from a list of
    adapters in the core."""
    writer = Serde()
    writer.register(_Probe, lambda p: p.n, _Probe, name=name)
    blob = writer.encode({"v": _Probe(1)})
    with pytest.raises(CorruptRecord) as caught:
        Serde().decode(blob, record="the probe")
    assert hint in str(caught.value)
    assert "not registered" in str(caught.value)
