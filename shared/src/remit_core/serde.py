"""The typed envelope every stored value goes through.

Format: one version byte (``0x01``) followed by a msgpack document. Types that
msgpack has no word for travel as msgpack *ext* records with a small integer
tag (datetime, UUID, Decimal, tuple, set, pydantic models, dataclasses, enums,
...). A ``bytearray`` reads back as ``bytes``. msgpack was chosen over JSON because
bytes stay bytes: a 1 MB value encodes about 40x faster than base64 in JSON and
is a quarter smaller, while the other state shapes measured are on par or
smaller (``benchmarks/serde_formats.py`` prints the comparison).

Guarantees:

* Never pickle. An unsupported type fails at *write* time with
  :class:`SerializationError` naming the path to the offending value.
* One nesting limit, :data:`MAX_DEPTH` (100) levels: every list, dict, tuple, set,
  frozenset, NamedTuple, pydantic model, dataclass, enum member and registered value
  is one level (the data a registered type or an enum stores counts from the next
  level, like any value). A deeper value is refused when it is written (and by
  :meth:`Serde.digest`), with :class:`SerializationError` naming the path, so that
  everything remit stores can be read back.
* Decoding runs one msgpack unpack per ext record, each called from a loop of
  ours, never from inside another unpack: it does not recurse on the C stack
  per nesting level. Bytes nested deeper than the limit, malformed, or naming
  an unknown tag are :class:`CorruptRecord` -- never a crash.
* Decoding resolves only types named *before* the read, by exact name
  ``"module:QualName"``, and never imports a module or reads an attribute that
  could run code (no ``getattr`` walk, no module ``__getattr__``):

  - types taught with :meth:`Serde.register` (their own ``from_data``);
  - classes allowed with :meth:`Serde.allow` or found by
    :meth:`Serde.allow_annotations` in typing annotations (a state schema);
  - every class this process itself encoded: a process can always read back
    what it wrote, classes defined inside functions (``<locals>``) included;
  - with ``Serde(allowed_modules=[...])``, classes of those modules if the
    module is already imported (looked up in its ``__dict__``).

  Only pydantic models, dataclasses, enums and NamedTuples (made by
  ``typing.NamedTuple`` or ``collections.namedtuple``) can be allowed; the
  record's tag must match the class's kind. Anything else is
  :class:`~remit_core.errors.UnregisteredType` (a :class:`CorruptRecord`) whose
  message names the type and says how to allow it. ``Serde(lenient=True)``
  (inspection tools) shows such a value as an :class:`UnregisteredValue`,
  ``<unregistered type module:Name>``, instead.
* A ``datetime`` in a ``zoneinfo.ZoneInfo`` zone keeps its zone (by key, with
  ``fold``); a key is resolved from the system time zone database or among the
  zones this process already used, never by importing ``tzdata``. Fixed offsets
  (``datetime.timezone``) and other ``tzinfo`` implementations are stored as the
  UTC offset at that instant. A ``str`` holding lone surrogates (``os.fsdecode``
  of undecodable bytes) round-trips.
* Adapters declare their registrations in the entry point group ``remit.serde``
  (a function ``register_types(serde)``); :func:`load_registrations` calls them,
  as ``remit inspect`` does before it reads.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime as dt
import decimal
import enum
import functools
import gc
import hashlib
import importlib.metadata
import os
import re
import sys
import threading
import types
import typing
import uuid
import zoneinfo
from collections.abc import Callable, Iterable
from itertools import compress
from typing import Any, Final

import msgpack  # type: ignore[import-untyped]
import ormsgpack
import typing_extensions
from pydantic import BaseModel

from remit_core.errors import CorruptRecord, SerializationError, UnregisteredType

FORMAT_VERSION = 1
_HEADER = bytes([FORMAT_VERSION])

MAX_DEPTH: Final = 100
"""Nesting levels a stored value may have (see the module docstring for what counts)."""

ENTRY_POINT_GROUP: Final = "remit.serde"
"""Adapters register their types through entry points of this group."""

# ext tags (append only: never renumber)
_DATETIME = 1
_DATE = 2
_TIME = 3
_TIMEDELTA = 4
_UUID = 5
_DECIMAL = 6
_TUPLE = 7
_SET = 8
_FROZENSET = 9
_MODEL = 10
_DATACLASS = 11
_ENUM = 12
_BIGINT = 13
_BYTEARRAY = 14  # reserved: msgpack stores a bytearray as bytes
_NAMEDTUPLE = 15
_REGISTERED = 16
_ZONED_DATETIME = 17  # payload "<naive ISO>|<fold>|<zone key>"
_SURROGATE_STR = 18  # payload: UTF-8 with surrogatepass

_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1

_KIND: Final = {_MODEL: "pydantic model", _DATACLASS: "dataclass", _ENUM: "enum",
                _NAMEDTUPLE: "NamedTuple", _REGISTERED: "registered type"}

# exact types msgpack stores as they are (a container of only these needs no rewriting)
_SCALARS: Final = frozenset({str, int, float, bool, type(None), bytes, bytearray})


_QUALNAMES: dict[type, str] = {}  # a cache: at most _QUALNAMES_MAX classes, then cleared
_QUALNAMES_MAX = 1024


def _qualname(cls: type) -> str:
    try:
        return _QUALNAMES[cls]
    except (KeyError, TypeError):  # (TypeError: a metaclass without a hash)
        pass
    name = f"{cls.__module__}:{cls.__qualname__}"
    with contextlib.suppress(TypeError):
        if len(_QUALNAMES) >= _QUALNAMES_MAX:
            _QUALNAMES.clear()
        _QUALNAMES[cls] = name
    return name


_PACKERS = threading.local()  # Packers per thread (msgpack.packb makes one per call)


def _pack(obj: Any) -> bytes:
    try:
        packer = _PACKERS.packer
    except AttributeError:
        packer = _PACKERS.packer = msgpack.Packer(strict_types=True)
    # (no default hook: the pack calls no Python code, so it cannot re-enter this Packer;
    # a failed pack leaves it empty)
    packed: bytes = packer.pack(obj)
    return packed


def _pack_loose(obj: Any) -> bytes:
    """``msgpack.packb(obj)`` (the digests' bytes), on this thread's loose Packer: a
    subclass of str or int packs as its base. (No default hook, as in :func:`_pack`: the
    pack cannot re-enter the Packer, and a failed pack leaves it empty.)"""
    try:
        packer = _PACKERS.loose
    except AttributeError:
        packer = _PACKERS.loose = msgpack.Packer(strict_types=False)
    packed: bytes = packer.pack(obj)
    return packed


#: ormsgpack's options that make it pack only what msgpack's strict packer packs as it is:
#: every subclass, tuple, dataclass, enum, UUID, date or time and int past 64 bits is
#: refused (passed to a default hook, and there is none) instead of written its own way
_EXACT: Final = (ormsgpack.OPT_PASSTHROUGH_SUBCLASS | ormsgpack.OPT_PASSTHROUGH_TUPLE
                 | ormsgpack.OPT_PASSTHROUGH_DATACLASS | ormsgpack.OPT_PASSTHROUGH_ENUM
                 | ormsgpack.OPT_PASSTHROUGH_UUID | ormsgpack.OPT_PASSTHROUGH_DATETIME
                 | ormsgpack.OPT_PASSTHROUGH_BIG_INT)


def _pack_as_is(value: list[Any] | dict[Any, Any]) -> bytes | None:
    """A list or dict packed as it is, or None when something in it needs the encoder's
    rewrite first (a typed value, a lone surrogate, an int past 64 bits...).

    ormsgpack packs exact scalars, lists and dicts with text keys (the common case) about
    twice as fast as msgpack, to the same bytes; what it refuses besides (other keys, an
    ext record, nesting past its own limit) goes to msgpack's strict packer. Either way
    the caller still checks the depth and the ext records (:func:`_plain_packed`)."""
    try:
        packed: bytes = ormsgpack.packb(value, option=_EXACT)
        return packed
    except TypeError:  # (ormsgpack.MsgpackEncodeError)
        pass
    try:
        return _pack(value)
    except (TypeError, ValueError, OverflowError):
        return None


_new_tuple = tuple.__new__


def _ext(code: int, data: bytes) -> Any:
    """``msgpack.ExtType(code, data)`` without its type checks, for the encoder's own
    records (an int tag, bytes)."""
    return _new_tuple(msgpack.ExtType, (code, data))


class _Refused(Exception):
    """Raised inside the encoder; collects the path to the value as it unwinds."""

    def __init__(self, reason: str, value: Any, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.value = value
        self.detail = detail
        self.segments: list[str] = []

    @property
    def path(self) -> str:
        return "$" + "".join(reversed(self.segments))


class _TooDeep(Exception):
    """Raised inside the decoder when stored bytes nest deeper than MAX_DEPTH."""


class _Deferred(tuple[int, bytes]):
    """An ext record whose payload is itself msgpack, decoded later by the walk (not
    from inside the unpack that found it): ``(code, payload)``, a tuple of its own type,
    made in C. (Lists the class among its members, as any instance of a Python class.)"""

    __slots__ = ()


_NESTED: Final = frozenset({list, dict, _Deferred})
_COMPOSITE: Final = frozenset({_TIMEDELTA, _TUPLE, _SET, _FROZENSET, _MODEL, _DATACLASS,
                               _ENUM, _NAMEDTUPLE, _REGISTERED})


class UnregisteredValue:
    """What ``Serde(lenient=True)`` gives for a value whose type this process does not know.

    ``type_name`` is ``"module:QualName"`` as stored, ``kind`` what it was (a pydantic
    model, a dataclass, ...), ``data`` its stored fields, decoded.
    """

    __slots__ = ("data", "kind", "type_name")

    def __init__(self, type_name: str, kind: str, data: Any) -> None:
        self.type_name = type_name
        self.kind = kind
        self.data = data

    def __repr__(self) -> str:
        return f"<unregistered type {self.type_name}>"


# ------------------------------------------------------------------------------- time zones

_ZONES: dict[str, zoneinfo.ZoneInfo] = {}  # zones this process used, by key
_ZONE_KEY = re.compile(r"[A-Za-z0-9_+\-]+(?:/[A-Za-z0-9_+\-]+)*")


def _zone(key: str) -> zoneinfo.ZoneInfo:
    """The zone ``key`` names, without importing anything: one this process already used,
    or one in the system time zone database (``zoneinfo.TZPATH``)."""
    zone = _ZONES.get(key)
    if zone is not None:
        return zone
    if _ZONE_KEY.fullmatch(key) and ".." not in key.split("/") and any(
            os.path.isfile(os.path.join(root, key)) for root in zoneinfo.TZPATH):
        zone = zoneinfo.ZoneInfo(key)  # found on TZPATH: read from that file
        _ZONES[key] = zone
        return zone
    raise ValueError(
        f"time zone {key[:80]!r} is not in this machine's time zone database "
        f"({', '.join(zoneinfo.TZPATH) or 'no TZPATH'}); install the system tz database, "
        f"or create zoneinfo.ZoneInfo({key[:80]!r}) once before reading")


def _zoned_datetime(payload: bytes) -> dt.datetime:
    wall, fold, key = payload.decode().split("|")
    naive = dt.datetime.fromisoformat(wall)
    if naive.tzinfo is not None or fold not in ("0", "1"):
        raise ValueError("malformed zoned datetime")
    return naive.replace(tzinfo=_zone(key), fold=int(fold))


_LEAVES: Final[dict[int, Callable[[bytes], Any]]] = {
    _DATETIME: lambda p: dt.datetime.fromisoformat(p.decode()),
    _DATE: lambda p: dt.date.fromisoformat(p.decode()),
    _TIME: lambda p: dt.time.fromisoformat(p.decode()),
    _UUID: lambda p: uuid.UUID(bytes=p),
    _DECIMAL: lambda p: decimal.Decimal(p.decode()),
    _BIGINT: lambda p: int(p.decode()),
    _ZONED_DATETIME: _zoned_datetime,
    _SURROGATE_STR: lambda p: p.decode("utf-8", "surrogatepass"),
}


def _ext_hook(code: int, payload: bytes) -> Any:
    """msgpack's hook: leaves are decoded here; records holding msgpack are deferred."""
    if code in _COMPOSITE:
        return _Deferred((code, payload))
    leaf = _LEAVES.get(code)
    if leaf is None:
        raise ValueError(f"unknown ext tag {code}")
    return leaf(payload)


def _unpack(packed: bytes | memoryview) -> Any:
    """One msgpack document, with remit's ext records (leaves decoded, the rest deferred).
    msgpack's own timestamp ext (-1), which remit never writes, reads as a datetime."""
    return msgpack.unpackb(packed, ext_hook=_ext_hook, strict_map_key=False, timestamp=3)

# ------------------------------------------------------------------------------ class kinds


def _is_namedtuple(cls: type) -> bool:
    return (issubclass(cls, tuple) and isinstance(getattr(cls, "_fields", None), tuple)
            and callable(getattr(cls, "_make", None)))


def _tag_of_class(cls: Any) -> int | None:
    """The tag the encoder uses for instances of ``cls``, if it is a kind that can be allowed."""
    if not isinstance(cls, type):
        return None
    if issubclass(cls, enum.Enum):
        return _ENUM
    if _is_namedtuple(cls):
        return _NAMEDTUPLE
    if issubclass(cls, BaseModel):
        return _MODEL if cls is not BaseModel else None
    if dataclasses.is_dataclass(cls):
        return _DATACLASS
    return None


_BULK: Final = 32  # containers this long are first checked at C speed (_plain_within)
_CONTAINERS: Final = frozenset({list, dict})
_PLAIN: Final = _SCALARS | _CONTAINERS
_is_container = _CONTAINERS.__contains__


def _children_walked(*containers: Any) -> list[Any]:
    """What :func:`_children` gives, listed in Python (where ``gc.get_referents`` is not
    known to give it)."""
    out: list[Any] = []
    for c in containers:
        if type(c) is dict:
            out += c
            out += c.values()
        else:
            out += c
    return out


def _referents_list_children() -> bool:
    """Whether ``gc.get_referents`` gives every item of a list and every value of a dict,
    and the keys of a dict whose keys are not all exact ``str`` (CPython's traversal of
    lists and dicts does; a dict whose keys are all exact ``str`` has only those as keys,
    so nothing is lost by not seeing them). Checked once, on this interpreter."""

    class _Text(str):
        pass

    items = [1, "a", None, 2.5, b"x", True, [], {}, bytearray(b"y")]
    by_text = {"k": [], "l": 2, "m": "v"}
    by_other = {1: "x", b"b": [], None: {}, _Text("s"): 3}
    try:
        got = [sorted(map(id, gc.get_referents(c))) for c in (items, by_text, by_other)]
    except Exception:  # (a runtime without it)
        return False
    return (got[0] == sorted(map(id, items))  # (in any order)
            and set(map(id, by_text.values())) <= set(got[1])
            and set(map(id, [*by_other, *by_other.values()])) <= set(got[2]))


#: every item of the given lists and every value (and key, unless they are all exact
#: ``str``) of the given dicts, in one list: at C speed on CPython, whose garbage
#: collector lists them so, else walked (the same members; a key left out is a ``str``)
_children: Callable[..., list[Any]] = (
    gc.get_referents if sys.implementation.name == "cpython" and _referents_list_children()
    else _children_walked)


def _plain_within(frontier: list[Any], room: int) -> bool:
    """Whether the lists and dicts in ``frontier`` hold only scalars and plain lists and
    dicts, ``room`` levels deep at most (the frontier being the first). One pass per
    level, listing the level's members at C speed (:data:`_children`); False means "look
    closer" (something else is inside, or it is too deep), never "wrong"."""
    while room > 0:
        items = _children(*frontier)
        types_ = set(map(type, items))
        if _SCALARS.issuperset(types_):
            return True
        if not _PLAIN.issuperset(types_):
            return False
        frontier = items if _CONTAINERS.issuperset(types_) else \
            list(compress(items, map(_is_container, map(type, items))))
        room -= 1
    return False


def _plain_ok(v: list[Any] | dict[Any, Any], room: int) -> bool:
    """Whether the list or dict ``v`` holds only scalars and plain lists and dicts,
    ``room`` levels deep at most (``v`` being the first). False means "look closer"."""
    if room <= 0:
        return False
    if isinstance(v, dict):
        if not _SCALARS.issuperset(map(type, v)):  # the keys
            return False
        children: Iterable[Any] = v.values()
    else:
        children = v
    if _SCALARS.issuperset(map(type, children)):
        return True
    if len(v) >= _BULK:
        return _plain_within([v], room)
    for x in children:
        tx = type(x)
        if tx not in _SCALARS and not ((tx is list or tx is dict) and _plain_ok(x, room - 1)):
            return False
    return True


#: whether :data:`_children` lists members at C speed (CPython's garbage collector)
_LISTED_IN_C: Final = _children is gc.get_referents


def _settled(d: dict[Any, Any]) -> bool:
    """Whether the unpacked map ``d`` holds nothing for the decoder's walk to finish: its
    keys are not records, and its values are scalars, leaves, and lists and maps of those
    (a model's fields, a checkpoint's data, mostly), one level below ``d``'s values at
    most. Listed in C, twice: ``d`` lists its values (and its keys, unless all are str),
    and those list their members: a scalar or a leaf lists none, a list its items, a map
    its values (and keys), a deferred record its class and payload. Only scalars among the
    members: nothing to walk. False means "walk it" (a record as a key or a value or in
    one, a third level, or no listing in C)."""
    return _LISTED_IN_C and _SCALARS.issuperset(map(type, _children(*_children(d))))


def _plain_packed(value: list[Any] | dict[Any, Any], packed: bytes) -> bool:
    """:func:`_plain_ok` of a list or dict ``value`` at the top level, which the strict
    packer has just packed into ``packed``, answered from those bytes and a count of its
    levels where it can be.

    The strict packer takes exact scalars, lists and dicts, and ext records
    (``msgpack.ExtType``, ``msgpack.Timestamp``), each packed behind a header byte 0xD4
    to 0xD8 or 0xC7 to 0xC9: packed bytes without such a byte hold no ext record. What is
    left is the depth: the members of a level's objects, listed in one C call
    (:data:`_children`; a scalar lists none), are the next level, and a level that lists
    nothing ends the value. The count can be one level too high (when the deepest level
    holds scalars), never too low; every object it lists was packed into at least one
    byte, so a count of more objects than bytes stops it. What this cannot clear -- an
    ext header byte in a string, a number or bytes, a value at the limit, an interpreter
    that does not list members at C speed -- :func:`_plain_ok` checks object by object
    (an ext record's members are not plain: its class is one of them)."""
    if _LISTED_IN_C and not (  # (each ``in`` a memchr: an int is looked for, not bytes)
            0xD4 in packed or 0xD5 in packed or 0xD6 in packed or 0xD7 in packed
            or 0xD8 in packed or 0xC7 in packed or 0xC8 in packed or 0xC9 in packed):
        level: list[Any] = [value]
        listed, size = 1, len(packed)
        for _ in range(MAX_DEPTH):  # (level k's members are level k + 1)
            level = _children(*level)
            if not level:
                return True
            listed += len(level)
            if listed > size:  # (not what the packer packed: looked at object by object)
                break
    return _plain_ok(value, MAX_DEPTH)


def _strict_scalar(v: Any, t: type) -> Any:
    """A scalar msgpack may refuse: a str with lone surrogates, an int beyond 64 bits."""
    if t is str and not v.isascii():
        try:
            v.encode()
        except UnicodeEncodeError:
            return msgpack.ExtType(_SURROGATE_STR, v.encode("utf-8", "surrogatepass"))
    elif t is int and not _INT_MIN <= v <= _INT_MAX:
        try:
            return msgpack.ExtType(_BIGINT, str(v).encode())
        except ValueError as exc:  # more digits than sys.get_int_max_str_digits()
            raise _Refused("type", v, str(exc)) from None
    return v


_AS_BYTES = -1
_MODEL_DUMP: Final = BaseModel.model_dump
_BASES: Final[dict[int, type]] = {-2: dict, -3: list, -4: str, -5: bytes, -6: float, -7: int}
_CONTAINER_KINDS: Final = frozenset({_TUPLE, _SET, _FROZENSET, _NAMEDTUPLE, _MODEL,
                                     _DATACLASS, _ENUM})


@functools.lru_cache(maxsize=4096)
def _kind_of(t: type) -> int | None:
    """How the envelope stores instances of ``t`` (registered types aside): an ext tag,
    _AS_BYTES, a key of _BASES, or None (unsupported). In the order the envelope has
    always used, so that stored bytes and digests stay the same."""
    if issubclass(t, enum.Enum):
        return _ENUM
    for tag, cls in ((_DATETIME, dt.datetime), (_DATE, dt.date), (_TIME, dt.time),
                     (_TIMEDELTA, dt.timedelta), (_UUID, uuid.UUID), (_DECIMAL, decimal.Decimal)):
        if issubclass(t, cls):
            return tag
    if t is tuple:
        return _TUPLE
    if issubclass(t, tuple) and hasattr(t, "_fields"):
        return _NAMEDTUPLE
    if t is set:
        return _SET
    if t is frozenset:
        return _FROZENSET
    if issubclass(t, BaseModel):
        return _MODEL
    if dataclasses.is_dataclass(t):
        return _DATACLASS
    if t is memoryview:
        return _AS_BYTES
    for key, base in _BASES.items():
        if issubclass(t, base) and not issubclass(t, bool):
            return key
    return None


class Serde:
    """Encoder/decoder for stored values. Inject one into a store to extend it.

    ``allowed_modules``: classes of these modules may be decoded when the module is
    already imported (never imports it). ``lenient``: a value of a type this process
    does not know decodes as an :class:`UnregisteredValue` instead of raising
    :class:`~remit_core.errors.UnregisteredType` (for inspection, never for resuming).
    """

    def __init__(self, *, allowed_modules: Iterable[str] = (), lenient: bool = False) -> None:
        self._allowed_modules = frozenset(allowed_modules)
        self._lenient = lenient
        self._by_type: dict[type, tuple[str, Callable[[Any], Any]]] = {}
        self._by_name: dict[str, Callable[[Any], Any]] = {}
        self._classes: dict[str, tuple[type, int]] = {}  # allowed: name -> (class, tag)

    def lenient(self) -> Serde:
        """This envelope (its registrations, now and later), decoding a value of a type this
        process does not know as an :class:`UnregisteredValue` instead of refusing it: for
        what is shown to a person (a run's lifecycle details), never for resuming."""
        if self._lenient:
            return self
        view: Serde | None = self.__dict__.get("_lenient_view")
        if view is None:
            view = copy.copy(self)
            view._lenient = True
            self._lenient_view = view
        return view

    # -- registry ------------------------------------------------------------------------------

    def register(
        self,
        cls: type,
        to_data: Callable[[Any], Any],
        from_data: Callable[[Any], Any],
        *,
        name: str | None = None,
    ) -> None:
        """Teach the envelope a type: ``to_data`` returns storable data, ``from_data`` rebuilds it.

        Stored under ``name`` (default ``"module:QualName"``); a reader must register the
        same name before it reads. Names are append-only: keep reading old ones.
        """
        key = name or _qualname(cls)
        self._by_type[cls] = (key, to_data)
        self._by_name[key] = from_data

    def allow(self, *classes: type) -> None:
        """Allow decoding instances of ``classes`` (pydantic models, dataclasses, enums,
        NamedTuples), by their exact ``"module:QualName"``.

        A class this process encodes is allowed automatically; a process that reads values
        another process wrote allows their classes first (or uses
        :meth:`allow_annotations` on its schema). Raises ``TypeError`` for any other class.
        """
        for cls in classes:
            tag = _tag_of_class(cls)
            if tag is None:
                raise TypeError(
                    f"Serde.allow() takes pydantic models, dataclasses, enums and NamedTuples; "
                    f"{cls!r} is none of them. Teach other types with Serde.register(cls, "
                    "to_data, from_data)")
            self._classes[_qualname(cls)] = (cls, tag)

    def allow_annotations(self, *annotations: Any) -> list[type]:
        """Allow every class that ``annotations`` name (see :meth:`allow`); return them.

        Walks typing annotations: TypedDicts, pydantic model fields, dataclass and
        NamedTuple fields, ``Annotated``, ``Optional``/``Union``/``X | Y``, the arguments
        of ``list``/``dict``/``set``/``tuple``/``Sequence``/... and type aliases. A class
        that is only a subclass of an annotated one is not found: allow it explicitly.
        """
        found = [cls for cls in _annotated_classes(annotations) if cls not in self._by_type]
        self.allow(*found)
        return found

    def _learn(self, cls: type, tag: int) -> str:
        """Allow a class at encode time: a process reads back what it wrote. The latest
        class of a name wins (a class defined in a function is a new one per call)."""
        name = _qualname(cls)
        entry = self._classes.get(name)
        if entry is None or entry[0] is not cls:
            self._classes[name] = (cls, tag)
        return name

    # -- encoding ------------------------------------------------------------------------------

    def encode(self, value: Any, *, record: str = "value") -> bytes:
        """Encode ``value``; raise :class:`SerializationError` naming the path if it cannot be."""
        t = type(value)
        if t in _PLAIN:  # (a typed value goes straight to the rewrite: msgpack refuses it)
            if t in _SCALARS:
                try:
                    return _HEADER + _pack(value)
                except (TypeError, ValueError, OverflowError):
                    pass  # (a lone surrogate, an int past 64 bits: rewritten below)
            else:
                # plain data (the common case), packed at C speed as it is: unless a raw
                # msgpack.ExtType is in it (the decoder would read it as one of remit's
                # records, or refuse it) or it nests deeper than MAX_DEPTH; _plain_packed
                # finds both (the slow path refuses them)
                packed = _pack_as_is(value)
                if packed is not None and _plain_packed(value, packed):
                    return _HEADER + packed
        try:
            try:
                packed = _pack(self._lower(value, 0, False, False))
            except (UnicodeEncodeError, OverflowError):
                # a lone surrogate or a big int inside a container that took the fast path:
                # once more, looking at every string and int
                packed = _pack(self._lower(value, 0, True, False))
        except _Refused as refused:
            raise _serialization_error(refused, record) from None
        except RecursionError:
            raise SerializationError(
                f"cannot store {record}: the value nests too deep for this thread's recursion "
                "limit. Nothing was written.", path="$", type_name=type(value).__name__) from None
        except (TypeError, ValueError) as exc:
            raise SerializationError(
                f"cannot store {record}: {exc}. Nothing was written.",
                path="$", type_name=type(value).__name__) from None
        return _HEADER + packed

    def _lower(self, v: Any, level: int, strict: bool, canonical: bool) -> Any:
        """``v`` as msgpack-ready data: exact containers and scalars, with ext records for
        the rest. ``level`` is how many containers enclose ``v``; ``strict`` checks every
        string and int (the fast path leaves that to msgpack); ``canonical`` is the
        digest's view (nothing is learnt, datetimes keep their offset form)."""
        t = type(v)
        if t in _SCALARS:
            return _strict_scalar(v, t) if strict else v
        if t is list:
            if level >= MAX_DEPTH:
                raise _Refused("deep", v)
            if not strict and (_SCALARS.issuperset(map(type, v)) or (
                    len(v) >= _BULK and _plain_within([v], MAX_DEPTH - level))):
                return v
            return self._lower_items(v, level + 1, strict, canonical)
        if t is dict:
            if level >= MAX_DEPTH:
                raise _Refused("deep", v)
            if not strict and len(v) >= _BULK and _plain_within([v], MAX_DEPTH - level):
                return v
            return self._lower_map(v, level + 1, strict, canonical)
        return self._lower_other(v, t, level, strict, canonical)

    def _lower_items(self, items: Iterable[Any], level: int, strict: bool,
                     canonical: bool) -> list[Any]:
        """The members of a list, tuple or set, at ``level``."""
        out: list[Any] = []
        append = out.append
        room = level < MAX_DEPTH
        for i, x in enumerate(items):
            tx = type(x)
            if not strict and (tx in _SCALARS or ((tx is list or tx is dict) and room and not x)):
                append(x)
                continue
            try:
                # (a typed value straight to its rewrite, as _lower would send it)
                append(self._lower(x, level, strict, canonical) if tx in _PLAIN else
                       self._lower_other(x, tx, level, strict, canonical))
            except _Refused as refused:
                refused.segments.append(f"[{i}]")
                raise
        return out

    def _lower_map(self, d: dict[Any, Any], level: int, strict: bool,
                   canonical: bool) -> dict[Any, Any]:
        """A dict whose keys and values are at ``level`` (a dict's, a model's fields)."""
        room = level < MAX_DEPTH
        if not strict and _LISTED_IN_C:
            # as it is when every key is a scalar and every value a scalar or an empty
            # list or dict (a model's fields, mostly): the map's members (its values, and
            # its keys unless all are str) and theirs listed in C, where a scalar lists
            # none, nor does an empty list or dict (elsewhere the loop below keeps them)
            members = _children(d)
            if (_PLAIN if room else _SCALARS).issuperset(map(type, members)) and \
                    not _children(*members):
                return d
        out: dict[Any, Any] = {}
        for k, x in d.items():
            key = k
            if strict or type(k) not in _SCALARS:
                try:
                    key = self._lower(k, level, strict, canonical)
                except _Refused as refused:
                    refused.segments.append(f".<key {k!r}>")
                    raise
            tx = type(x)
            if not strict and (tx in _SCALARS or ((tx is list or tx is dict) and room and not x)):
                out[key] = x
                continue
            try:
                out[key] = self._lower(x, level, strict, canonical)
            except _Refused as refused:
                refused.segments.append(f".{k}")
                raise
        return out

    def _lower_other(self, v: Any, t: type, level: int, strict: bool, canonical: bool) -> Any:
        ext = _ext
        registered = self._by_type.get(t)
        if registered is not None:
            if level >= MAX_DEPTH:
                raise _Refused("deep", v)
            name, to_data = registered
            try:
                data = to_data(v)
            except Exception as exc:
                raise _Refused("convert", v, f"{type(exc).__name__}: {exc}") from None
            return ext(_REGISTERED, _pack([name, self._lower(data, level + 1, strict, canonical)]))
        kind = _kind_of(t)
        if kind in _CONTAINER_KINDS and level >= MAX_DEPTH:
            raise _Refused("deep", v)
        if kind == _MODEL:
            name = _qualname(t) if canonical else self._learn(t, _MODEL)
            try:
                # the serializer pydantic's model_dump calls, without its keyword
                # forwarding (a tenth of a message's encoding); a model_dump of the class's
                # own is called as it is
                model: Any = t
                data = (model.__pydantic_serializer__.to_python(
                            v, mode="python", round_trip=True, by_alias=True)
                        if model.model_dump is _MODEL_DUMP
                        else v.model_dump(mode="python", round_trip=True, by_alias=True))
            except Exception as exc:
                raise _Refused("convert", v, f"{type(exc).__name__}: {exc}") from None
            return ext(_MODEL, _pack([name, self._lower_map(data, level + 1, strict, canonical)]))
        if kind == _DATETIME:
            tz = v.tzinfo
            if not canonical and type(tz) is zoneinfo.ZoneInfo and tz.key is not None:
                _ZONES.setdefault(tz.key, tz)
                wall = v.replace(tzinfo=None).isoformat()
                return ext(_ZONED_DATETIME, f"{wall}|{v.fold}|{tz.key}".encode())
            return ext(_DATETIME, v.isoformat().encode())
        if kind == _TUPLE:
            return ext(_TUPLE, _pack(self._lower_items(v, level + 1, strict, canonical)))
        if kind == _ENUM:
            name = _qualname(t) if canonical else self._learn(t, _ENUM)
            return ext(_ENUM, _pack([name, self._lower(v.value, level + 1, strict, canonical)]))
        if kind in (_DATE, _TIME):
            return ext(kind, v.isoformat().encode())
        if kind == _TIMEDELTA:
            return ext(_TIMEDELTA, _pack([v.days, v.seconds, v.microseconds]))
        if kind == _UUID:
            return ext(_UUID, v.bytes)
        if kind == _DECIMAL:
            return ext(_DECIMAL, str(v).encode())
        if kind == _NAMEDTUPLE:
            if t is msgpack.ExtType and not canonical:
                raise _Refused("ext", v)
            name = _qualname(t) if canonical else self._learn(t, _NAMEDTUPLE)
            items = self._lower_items(v, level + 1, strict, canonical)
            return ext(_NAMEDTUPLE, _pack([name, items]))
        if kind in (_SET, _FROZENSET):
            return ext(kind, _pack(self._lower_items(v, level + 1, strict, canonical)))
        if kind == _DATACLASS:
            name = _qualname(t) if canonical else self._learn(t, _DATACLASS)
            data = {f.name: getattr(v, f.name) for f in dataclasses.fields(v) if f.init}
            return ext(_DATACLASS, _pack([name, self._lower_map(data, level + 1, strict,
                                                                canonical)]))
        if kind == _AS_BYTES:
            return bytes(v)
        if kind is not None:  # a plain subclass of a built-in type travels as that type
            base: type = _BASES[kind]
            return self._lower(base(v), level, strict, canonical)
        raise _Refused("type", v)

    # -- decoding ------------------------------------------------------------------------------

    def decode(self, data: bytes | bytearray | memoryview, *, record: str = "value") -> Any:
        """Decode stored bytes; raise :class:`CorruptRecord` naming ``record`` if they are bad
        (:class:`~remit_core.errors.UnregisteredType` if they name a type not allowed here)."""
        raw = data if type(data) is bytes else bytes(data)
        if not raw or raw[0] != FORMAT_VERSION:
            head = raw[:1].hex() or "empty"
            raise CorruptRecord(
                f"stored bytes of {record} are not a remit envelope (header {head}); "
                "they were not used. The record may have been written by another program "
                "or damaged; restore it from a backup or delete it.",
                record=record,
            )
        try:
            # (a short value is copied: cheaper than a memoryview of it)
            obj = _unpack(raw[1:] if len(raw) < 4096 else memoryview(raw)[1:])
            t = type(obj)
            if t is dict and _settled(obj):
                return obj  # (its keys and values need no walk: see _walk_map)
            if t is list or t is dict or t is _Deferred:
                obj = self._walk(obj, 0, record)
            return obj
        except CorruptRecord:
            raise
        except (_TooDeep, msgpack.StackError):
            raise CorruptRecord(
                f"stored bytes of {record} nest deeper than {MAX_DEPTH} levels, which remit "
                "never writes; they were not used. Restore the record from a backup or delete it.",
                record=record,
            ) from None
        except Exception as exc:
            raise CorruptRecord(
                f"stored bytes of {record} failed to decode ({type(exc).__name__}: {exc}); "
                "they were not used. Restore the record from a backup or delete it.",
                record=record,
            ) from exc

    def _walk(self, obj: Any, level: int, record: str) -> Any:
        """Finish what the unpack left: decode deferred records, check the depth. In place."""
        t = type(obj)
        if t is list:
            if level >= MAX_DEPTH:
                raise _TooDeep
            if _NESTED.isdisjoint(map(type, obj)) or (
                    len(obj) >= _BULK and _plain_within([obj], MAX_DEPTH - level)):
                return obj
            self._walk_items(obj, level + 1, record)
            return obj
        if t is dict:
            if level >= MAX_DEPTH:
                raise _TooDeep
            if len(obj) >= _BULK and _plain_within([obj], MAX_DEPTH - level):
                return obj
            return self._walk_map(obj, level + 1, record)
        if t is _Deferred:
            return self._typed(obj, level, record)
        return obj

    def _walk_items(self, items: list[Any], level: int, record: str) -> None:
        room = level < MAX_DEPTH
        for i, x in enumerate(items):
            tx = type(x)
            if tx is list or tx is dict:
                if x or not room:
                    items[i] = self._walk(x, level, record)
            elif tx is _Deferred:
                items[i] = self._typed(x, level, record)

    def _walk_map(self, d: dict[Any, Any], level: int, record: str) -> dict[Any, Any]:
        room = level < MAX_DEPTH
        if room and _settled(d):
            return d
        if not _NESTED.isdisjoint(map(type, d)):  # a deferred key (a tuple, a frozenset...)
            out: dict[Any, Any] = {}
            for k, v in d.items():
                key = self._typed(k, level, record) if type(k) is _Deferred else k
                tv = type(v)
                out[key] = self._walk(v, level, record) if tv is list or tv is dict or \
                    tv is _Deferred else v
            return out
        if _NESTED.isdisjoint(map(type, d.values())):
            return d
        for k, v in d.items():
            tv = type(v)
            if tv is list or tv is dict:
                if v or not room:
                    d[k] = self._walk(v, level, record)
            elif tv is _Deferred:
                d[k] = self._typed(v, level, record)
        return d

    def _typed(self, deferred: _Deferred, level: int, record: str) -> Any:
        code, payload = deferred
        if code == _TIMEDELTA:
            days, seconds, micros = msgpack.unpackb(payload, timestamp=3)
            if not all(type(n) is int for n in (days, seconds, micros)):
                raise ValueError("malformed timedelta")
            return dt.timedelta(days=days, seconds=seconds, microseconds=micros)
        if level >= MAX_DEPTH:
            raise _TooDeep
        # a new unpack, called from this loop: never nested inside the unpack that found it
        inner = _unpack(payload)
        if code in (_TUPLE, _SET, _FROZENSET):
            if type(inner) is not list:
                raise ValueError(f"malformed ext record (tag {code})")
            self._walk_items(inner, level + 1, record)  # the list is the container itself
            items = inner
            return tuple(items) if code == _TUPLE else set(items) if code == _SET \
                else frozenset(items)
        if type(inner) is not list or len(inner) != 2 or type(inner[0]) is not str:
            raise ValueError(f"malformed ext record (tag {code})")
        name, data = inner
        if code == _REGISTERED:
            from_data = self._by_name.get(name)
            if from_data is None:
                return self._unregistered(name, code, data, level, record)
            return from_data(self._walk(data, level + 1, record))
        found = self._class_named(name, code, record)
        if found is None:
            return self._unregistered(name, code, data, level, record)
        if code == _ENUM:
            return found(self._walk(data, level + 1, record))
        if code == _NAMEDTUPLE:
            if type(data) is not list:
                raise ValueError("malformed NamedTuple record")
            self._walk_items(data, level + 1, record)
            return found(*data)
        if type(data) is not dict:
            raise ValueError(f"malformed {_KIND[code]} record")
        fields = self._walk_map(data, level + 1, record)
        if code == _MODEL and not getattr(found, "__pydantic_custom_init__", False):
            return found.model_validate(fields)
        # a dataclass, or a model with an __init__ of its own (LangChain's messages): built
        # as the application builds it. model_validate would call that __init__ with the
        # fields as keywords too (a root model's as well), but inside a validation of its
        # own that runs the model's wrap and after validators a second time around it.
        return found(**fields)

    def _class_named(self, name: str, code: int, record: str) -> Any:
        """The allowed class of exactly this name, or None. Never imports, never getattr."""
        entry = self._classes.get(name)
        if entry is None and self._allowed_modules:
            entry = self._from_allowed_module(name, record)
        if entry is None:
            return None
        cls, tag = entry
        if tag != code:
            raise ValueError(f"{name} is a {_KIND.get(tag, '?')}, but the record stores a "
                             f"{_KIND.get(code, '?')}")
        return cls

    def _from_allowed_module(self, name: str, record: str) -> tuple[type, int] | None:
        module_name, _, qual = name.partition(":")
        if module_name not in self._allowed_modules:
            return None
        module = sys.modules.get(module_name)
        if module is None and not self._lenient:
            raise UnregisteredType(
                f"{record} holds a {name}, but module {module_name!r} is not imported in this "
                "process; import it before reading (remit never imports modules named by "
                "stored bytes). The record was not used.", record=record, type_name=name)
        if type(module) is not types.ModuleType:  # (None, or a lazy module: it would load)
            return None
        obj: Any = module.__dict__.get(qual.split(".")[0])
        for part in qual.split(".")[1:]:
            if not isinstance(obj, type):
                return None
            obj = obj.__dict__.get(part)
        tag = _tag_of_class(obj)
        return None if tag is None else (obj, tag)

    def _unregistered(self, name: str, code: int, data: Any, level: int, record: str) -> Any:
        """A record of a type not allowed here: refused, or (lenient) shown as such."""
        kind = _KIND.get(code, "type")
        if not self._lenient:
            raise UnregisteredType(_unregistered_message(name, kind, record),
                                   record=record, type_name=name)
        body = self._walk(data, level + 1, record) if code in (_REGISTERED, _ENUM) \
            else self._walk(data, level, record)
        return UnregisteredValue(name, kind, body)

    # -- canonical digests (FD, RD) ------------------------------------------------------------

    def digest(self, value: Any) -> str:
        """A SHA-256 over a canonical encoding: equal values give equal digests in any process.

        Dict keys and set members are sorted by their encoding, so insertion order does
        not matter. Raises :class:`SerializationError` for unsupported values and for
        values nested deeper than :data:`MAX_DEPTH`, naming the path.
        """
        try:
            packed = _pack_loose(self._canonical(value, 0, True))
        except _Refused as refused:
            raise _serialization_error(refused, "value") from None
        except RecursionError:
            raise SerializationError(
                "cannot digest value: it nests too deep for this thread's recursion limit.",
                path="$", type_name=type(value).__name__) from None
        return hashlib.sha256(packed).hexdigest()

    def _canonical(self, value: Any, level: int, check: bool) -> Any:
        """Rewrite ``value`` into plain msgpack data whose encoding is order-independent.

        ``check``: count the levels (off inside an ext record's stored data, whose depth
        the encoder already checked). The values of exactly the built-in JSON types take
        a short path here; everything else, subclasses included, goes to
        :meth:`_canonical_any`, which gives the same result for those too."""
        t = type(value)
        if t is str:
            if value.isascii():
                return value
        elif t is int:
            if _INT_MIN <= value <= _INT_MAX:
                return value
        elif t is list or t is dict:
            if not (check and level >= MAX_DEPTH):  # (too deep: the long path refuses it)
                return self._canonical_container(value, level + 1, check)
        elif value is None or t is bool or t is float or t is bytes:
            return value
        return self._canonical_any(value, level, check)

    def _canonical_any(self, value: Any, level: int, check: bool) -> Any:
        """:meth:`_canonical` of any value."""
        if value is None or isinstance(value, bool | bytes | float):
            return value
        if isinstance(value, str):
            if not value.isascii():
                try:
                    value.encode()
                except UnicodeEncodeError:
                    return ["#ext", _SURROGATE_STR, value.encode("utf-8", "surrogatepass")]
            return value
        if isinstance(value, int) and not isinstance(value, enum.Enum):
            return value if _INT_MIN <= value <= _INT_MAX else ["#bigint", str(value)]
        if isinstance(value, dict | list | set | frozenset) or type(value) is tuple:
            if check and level >= MAX_DEPTH:
                raise _Refused("deep", value)
            return self._canonical_container(value, level + 1, check)
        # every other supported type: canonicalise what the envelope would store for it
        lowered = self._lower(value, level, True, True)
        if isinstance(lowered, msgpack.ExtType):
            inner = msgpack.unpackb(lowered.data, strict_map_key=False) \
                if lowered.code in _COMPOSITE else lowered.data
            return ["#ext", lowered.code, self._canonical(_plain(inner), 0, False)]
        return self._canonical(lowered, level, check)

    def _canonical_container(self, value: Any, level: int, check: bool) -> Any:
        """:meth:`_canonical` of a dict, list, tuple, set or frozenset whose members are at
        ``level``. What :meth:`_canonical` would do for a member is done here without the
        call where it is short: a member it returns as it is (exactly str of ASCII, int of
        64 bits, float, bool, None, bytes) is taken, and a list or dict with room for its
        own members goes straight to this method."""
        canonical, container = self._canonical, self._canonical_container
        room, inner = not (check and level >= MAX_DEPTH), level + 1
        if isinstance(value, dict):
            pairs: list[list[Any]] = []
            append = pairs.append
            text_keys = True
            k: Any = None
            try:
                for k, v in value.items():
                    if type(k) is str and k.isascii():
                        key = k
                    else:
                        key = canonical(k, level, check)
                        text_keys = False
                    tv = type(v)
                    if (tv is str and v.isascii()) or (tv is int and _INT_MIN <= v <= _INT_MAX) \
                            or v is None or tv is bool or tv is float or tv is bytes:
                        append([key, v])
                    elif (tv is list or tv is dict) and room:
                        append([key, container(v, inner, check)])
                    else:
                        append([key, canonical(v, level, check)])
            except _Refused as refused:
                refused.segments.append(f".{k}")
                raise
            pairs.sort(key=_text_order if text_keys else _packed_key)
            return ["#map", pairs]
        members: list[Any] = []
        keep = members.append
        try:
            for v in value:
                tv = type(v)
                if (tv is str and v.isascii()) or (tv is int and _INT_MIN <= v <= _INT_MAX) \
                        or v is None or tv is bool or tv is float or tv is bytes:
                    keep(v)
                elif (tv is list or tv is dict) and room:
                    keep(container(v, inner, check))
                else:
                    keep(canonical(v, level, check))
        except _Refused as refused:
            refused.segments.append(f"[{len(members)}]")
            raise
        if isinstance(value, list):
            return members
        if type(value) is tuple:
            return ["#tuple", members]
        members.sort(key=_pack_loose)
        return ["#set", members]


def _packed_key(pair: list[Any]) -> bytes:
    """A canonical map's order: its keys' encodings."""
    return _pack_loose(pair[0])


def _text_order(pair: list[Any]) -> tuple[int, str]:
    """:func:`_packed_key`'s order when every key is a str of ASCII: msgpack writes a
    str's length before its bytes, in a header that grows with it (fixstr to 31, then
    str 8, 16, 32, each length big-endian), so the encodings sort by length, then text."""
    key: str = pair[0]
    return len(key), key


def _plain(value: Any) -> Any:
    """Ext payloads unpacked without hooks contain raw ExtType records; keep them as data."""
    if isinstance(value, msgpack.ExtType):
        return ["#ext", value.code, value.data]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _serialization_error(refused: _Refused, record: str) -> SerializationError:
    path, bad = refused.path, refused.value
    type_name = type(bad).__name__
    if refused.reason == "deep":
        message = (
            f"cannot store {record}: the value at {path} nests deeper than {MAX_DEPTH} levels "
            "(each list, dict, tuple, set, model, dataclass, enum or registered value is one "
            "level); remit refuses it so that everything it stores can be read back. Flatten "
            "it, or store the deep part as text (e.g. JSON). Nothing was written.")
    elif refused.reason == "convert":
        message = (f"cannot store {record}: the value at {path} ({type_name}) could not be "
                   f"converted for storage ({refused.detail}). Nothing was written.")
    elif refused.reason == "ext":
        message = (f"cannot store {record}: the value at {path} is a raw msgpack ExtType, which "
                   "would be read back as one of remit's own records. Nothing was written.")
    else:
        detail = f" ({refused.detail})" if refused.detail else ""
        message = (
            f"cannot store {record}: the value at {path} has type {type_name}, which remit "
            "cannot serialise without pickle. Convert it to a supported type (JSON types, "
            "bytes, datetime, UUID, Decimal, tuple, set, a pydantic model, a dataclass or an "
            f"enum) or register it with Serde.register(). Nothing was written.{detail}")
    return SerializationError(message, path=path, type_name=type_name)


def _registering_adapter(prefix: str) -> str | None:
    """The package of the installed adapter whose ``remit.serde`` entry point is named
    ``prefix`` or lives in a package of that name, else None. (Reads the installed
    packages' metadata only: nothing is imported.)"""
    if not prefix:
        return None
    with contextlib.suppress(Exception):  # broken metadata: no hint, the message stands
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            package = ep.value.partition(":")[0].split(".")[0]
            if prefix in (ep.name, package):
                return package
    return None


def _unregistered_message(name: str, kind: str, record: str) -> str:
    qual = name.partition(":")[2] or name
    if kind == "registered type":
        adapter = _registering_adapter(name.partition(":")[0])
        if adapter is not None:
            todo = (f"import {adapter} before reading (it registers these types; "
                    "remit_core.serde.load_registrations(serde) loads every installed "
                    "adapter's)")
        else:
            todo = (f"register it with Serde.register(cls, to_data, from_data, name={name!r}) "
                    "before reading")
    else:
        todo = (f"allow the class before reading: store.serde.allow({qual.split('.')[-1]}) "
                "(or Serde.allow_annotations(YourState) for every class a schema names)")
        if "<locals>" in qual:
            todo += ("; it is defined inside a function, so no other process can name it: "
                     "define it at module level and allow it there")
    return (f"{record} holds a value of {kind} {name!r}, which this process has not registered or "
            f"allowed; remit builds only types named before the read and never imports a "
            f"module. To read it, {todo}. The record was not used.")


# -------------------------------------------------------------------------- annotation walk


def _type_hints(cls: type) -> list[Any]:
    try:
        return list(typing.get_type_hints(cls, include_extras=True).values())
    except Exception:  # unresolvable forward references: what is there, strings skipped
        if dataclasses.is_dataclass(cls):
            return [f.type for f in dataclasses.fields(cls)]
        return list(getattr(cls, "__annotations__", {}).values())


def _annotated_classes(roots: Iterable[Any]) -> list[type]:
    """Every class of an allowable kind that the annotations ``roots`` name, in order."""
    found: list[type] = []
    seen: dict[int, Any] = {}  # by id (annotations may be unhashable); keeps them alive
    todo = list(roots)[::-1]
    while todo:
        tp = todo.pop()
        if id(tp) in seen:
            continue
        seen[id(tp)] = tp
        if tp is None or tp is Any or tp is Ellipsis or isinstance(tp, str | typing.ForwardRef):
            continue
        pending: list[Any] = []
        if isinstance(tp, typing.TypeVar):
            pending += [tp.__bound__, *tp.__constraints__]
        elif isinstance(tp, typing.NewType):
            pending.append(tp.__supertype__)
        elif type(tp).__name__ == "TypeAliasType":  # `type X = ...` (3.12) or typing_extensions
            with contextlib.suppress(Exception):  # an alias that does not evaluate: skipped
                pending.append(tp.__value__)
        elif typing.get_origin(tp) is not None:
            origin = typing.get_origin(tp)
            args = typing.get_args(tp)
            if origin is typing.Literal or origin is typing.ClassVar:
                continue
            if origin is typing.Annotated:
                pending.append(args[0])
            else:
                pending += list(args)
                if isinstance(origin, type):
                    pending.append(origin)
        elif isinstance(tp, type):
            tag = _tag_of_class(tp)
            if tag is not None:
                found.append(tp)
            if tag == _MODEL:
                pending += [f.annotation for f in tp.model_fields.values()]  # type: ignore[attr-defined]
            elif tag in (_DATACLASS, _NAMEDTUPLE) or typing_extensions.is_typeddict(tp):
                pending += _type_hints(tp)
        todo += pending[::-1]
    return found


# ------------------------------------------------------------------------------ entry points


def load_registrations(serde: Serde, *, group: str = ENTRY_POINT_GROUP) -> list[str]:
    """Call every installed adapter's ``register_types(serde)`` (entry point group
    ``remit.serde``); return the entry points loaded. One that fails to load is skipped
    with a warning naming it, so that the others still register. (The same loader as the
    adapters' other parts: :mod:`remit_core.registry`.)"""
    from remit_core.registry import call_each

    return call_each(group, serde, what="the type registrations of")


def inspect_serde() -> Serde:
    """The envelope for inspection tools: every adapter's registrations, and a value of a
    type nobody registered shown as ``<unregistered type module:Name>``, not refused."""
    serde = Serde(lenient=True)
    load_registrations(serde)
    return serde


default_serde = Serde()
"""The process-wide envelope. Adapters register their framework's types on it."""


def encode(value: Any, *, record: str = "value") -> bytes:
    return default_serde.encode(value, record=record)


def decode(data: bytes, *, record: str = "value") -> Any:
    return default_serde.decode(data, record=record)


def digest(value: Any) -> str:
    return default_serde.digest(value)


__all__ = [
    "ENTRY_POINT_GROUP",
    "FORMAT_VERSION",
    "MAX_DEPTH",
    "Serde",
    "UnregisteredValue",
    "decode",
    "default_serde",
    "digest",
    "encode",
    "inspect_serde",
    "load_registrations",
]
