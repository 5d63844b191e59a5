"""The records' quicker ``__init__`` (remit_core.records._quick) against the one the
dataclass itself would give: the same parameters and defaults, the same fields set, a
fresh default from a factory, the same errors, and every other behaviour unchanged."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle
from typing import Any

import pytest

import remit_core.records as records

RECORDS = sorted(
    (c for c in vars(records).values()
     if isinstance(c, type) and dataclasses.is_dataclass(c) and c.__module__ == records.__name__),
    key=lambda c: c.__name__)


def _reference(cls: type) -> type:
    """The same fields as ``cls``, as a frozen slotted dataclass with its own ``__init__``."""
    spec = []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            spec.append((f.name, Any, dataclasses.field(default=f.default)))
        elif f.default_factory is not dataclasses.MISSING:
            spec.append((f.name, Any, dataclasses.field(default_factory=f.default_factory)))
        else:
            spec.append((f.name, Any))
    return dataclasses.make_dataclass(cls.__name__, spec, frozen=True, slots=True)


def _values(cls: type) -> list[Any]:
    """A distinct value for each field without a default (hashable, as a record of them is)."""
    return [(i, f"v{i}") for i, f in enumerate(dataclasses.fields(cls))
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]


def test_every_record_has_the_quick_init() -> None:
    assert len(RECORDS) >= 15
    for cls in RECORDS:
        assert cls.__init__.__module__ == records.__name__, cls
        assert "_set0" in cls.__init__.__code__.co_names, cls


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
def test_quick_init_is_the_dataclass_init(cls: type) -> None:
    ref = _reference(cls)
    mine, theirs = inspect.signature(cls), inspect.signature(ref)
    assert list(mine.parameters) == list(theirs.parameters)
    for name, p in mine.parameters.items():
        q = theirs.parameters[name]
        assert p.kind is q.kind, name
        assert (p.default is inspect.Parameter.empty) == (q.default is inspect.Parameter.empty)
        if repr(q.default) != "<factory>":
            assert p.default == q.default, name
        else:
            assert repr(p.default) == "<factory>"

    args = _values(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    made, expected = cls(*args), ref(*args)
    assert [getattr(made, n) for n in names] == [getattr(expected, n) for n in names]
    by_name = cls(**dict(zip(names, args, strict=False)))
    assert by_name == made
    try:
        expected_hash = hash(ref(*args))
    except TypeError:  # a field's default is a list: neither record hashes
        with pytest.raises(TypeError):
            hash(made)
    else:
        assert hash(by_name) == hash(made) == expected_hash
    # a default from a factory is fresh for each record, as the dataclass's is
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING:
            assert getattr(cls(*args), f.name) == f.default_factory()
            assert getattr(cls(*args), f.name) is not getattr(cls(*args), f.name)
    # every field given, positionally and by name
    full = [*args, *(("given", i) for i in range(len(names) - len(args)))]
    assert [getattr(cls(*full), n) for n in names] == full
    assert cls(*full) == cls(**dict(zip(names, full, strict=True)))

    if args:
        with pytest.raises(TypeError):
            cls(*args[:-1])
    with pytest.raises(TypeError):
        cls(*full, "one too many")
    with pytest.raises(TypeError):
        cls(*args, not_a_field=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, names[0], "changed")
    assert not hasattr(made, "__dict__")
    assert repr(made) == repr(expected).replace(ref.__qualname__, cls.__qualname__, 1)
    changed = dataclasses.replace(made, **{names[0]: "other"})
    assert getattr(changed, names[0]) == "other" and changed != made
    assert pickle.loads(pickle.dumps(made)) == made
    assert copy.deepcopy(made) == made


def test_quick_refuses_what_it_does_not_build() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class KeywordOnly:
        a: int
        b: int = dataclasses.field(default=0, kw_only=True)

    with pytest.raises(TypeError, match="positional"):
        records._quick(KeywordOnly)

    @dataclasses.dataclass(frozen=True, slots=True)
    class PostInit:
        a: int

        def __post_init__(self) -> None:
            pass

    with pytest.raises(TypeError, match="__post_init__"):
        records._quick(PostInit)
