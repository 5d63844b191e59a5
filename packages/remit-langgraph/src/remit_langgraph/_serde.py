"""LangGraph's own types on remit's typed envelope.

The envelope already stores JSON types, bytes, datetimes, UUIDs, tuples, sets,
pydantic models (langchain-core messages and documents among them), dataclasses
(``Overwrite``, ``TimeoutPolicy``), enums and NamedTuples (``_DeltaSnapshot``).
This module teaches it the rest of what the Pregel loop puts into checkpoints
and pending writes:

* ``Send`` (``__pregel_tasks`` values, ``Command.goto``), ``Interrupt``
  (``__interrupt__`` writes) and ``Command`` -- under fixed names, so decoding
  looks them up in the registry and never imports or resolves a module;
* exceptions (``__error__`` writes) -- as their class name, message and
  arguments, see :func:`storable`;
* :data:`EMPTY`, the marker for a channel that has a version but no value.

Nothing here uses pickle or LangGraph's ``JsonPlusSerializer``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Final

from langgraph.types import Command, Interrupt, Send

from remit_core import RemitError, SerializationError
from remit_core.serde import Serde, default_serde


class RemitStoredError(RemitError):
    """An exception read back from the store whose class cannot be rebuilt here.

    Raised in place of the original when its class is not imported in this process
    (remit never imports a module named by stored bytes) or does not accept the
    stored arguments. ``type_name`` is ``"module:QualName"`` of the original,
    ``message`` its ``str()``.
    """

    def __init__(self, type_name: str, message: str) -> None:
        self.type_name = type_name
        self.message = message
        super().__init__(
            f"{type_name}: {message} (stored by an earlier attempt; its class is not imported "
            "in this process or refuses the stored arguments, so remit raises this in its "
            f"place; import {type_name.split(':')[0]} before reading to get the original class)"
        )

    def __reduce__(self) -> tuple[type[RemitStoredError], tuple[str, str]]:
        return type(self), (self.type_name, self.message)


class _Empty:
    """A channel that has a version but no value (InMemorySaver stores ``("empty", b"")``)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "remit_langgraph.EMPTY"


EMPTY: Final = _Empty()
"""Stored for a channel of ``new_versions`` that is absent from ``channel_values``."""


@dataclass(frozen=True, slots=True)
class _ErrorRecord:
    """What is stored for an exception: enough to rebuild it without pickle."""

    type_name: str
    message: str
    args: list[Any] | None  # None: the arguments themselves cannot be stored


def _qualname(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def storable(value: Any, serde: Serde) -> Any:
    """``value`` ready for the envelope: an exception becomes an :class:`_ErrorRecord`.

    The envelope registers types by exact class, and ``__error__`` writes carry an
    instance of whatever class a node raised, so exceptions are converted here, at
    the top level of a channel value or pending write. Any other value passes
    unchanged (an unsupported one then fails in the store with SerializationError).
    """
    if not isinstance(value, BaseException):
        return value
    args: list[Any] | None = list(value.args)
    try:
        serde.encode(args)
    except SerializationError:
        args = None
    return _ErrorRecord(_qualname(type(value)), str(value), args)


def _rebuild_error(data: list[Any]) -> BaseException:
    """The original exception when its class is already imported and accepts the
    stored arguments, else a :class:`RemitStoredError` naming it."""
    type_name, message, args = data
    module_name, _, qual = str(type_name).partition(":")
    obj: Any = sys.modules.get(module_name)  # never import a module named by stored bytes
    for part in qual.split(".") if obj is not None else ():
        obj = getattr(obj, part, None)
    if isinstance(obj, type) and issubclass(obj, BaseException) and args is not None:
        try:
            exc = obj(*args)
        except Exception:
            pass
        else:
            return exc
    return RemitStoredError(str(type_name), str(message))


def _interrupt_to_data(obj: Interrupt[Any]) -> dict[str, Any]:
    schema = getattr(obj, "response_schema", None)  # absent before langgraph 1.2
    if isinstance(schema, type):  # a Python type: keep its JSON Schema, as interrupt() does
        from pydantic import TypeAdapter

        schema = TypeAdapter(schema).json_schema()
    return {"value": obj.value, "id": obj.id, "response_schema": schema}


def _interrupt_from_data(data: dict[str, Any]) -> Interrupt[Any]:
    obj: Interrupt[Any] = Interrupt(value=data["value"], id=data["id"])
    schema = data.get("response_schema")
    if schema is not None and hasattr(obj, "response_schema"):
        obj.response_schema = schema
    return obj


def _send_to_data(obj: Send) -> dict[str, Any]:
    data = {"node": obj.node, "arg": obj.arg}
    timeout = getattr(obj, "timeout", None)  # absent before langgraph 1.2
    if timeout is not None:
        data["timeout"] = timeout
    return data


def _send_from_data(data: dict[str, Any]) -> Send:
    if "timeout" in data:
        return Send(data["node"], data["arg"], timeout=data["timeout"])  # type: ignore[call-arg,unused-ignore]
    return Send(data["node"], data["arg"])


def _command_to_data(obj: Command[Any]) -> dict[str, Any]:
    return {"graph": obj.graph, "update": obj.update, "resume": obj.resume, "goto": obj.goto}


def _command_from_data(data: dict[str, Any]) -> Command[Any]:
    return Command(**data)


def register_types(serde: Serde) -> None:
    """Teach ``serde`` the LangGraph types above. Idempotent; names are append-only."""
    serde.register(Send, _send_to_data, _send_from_data, name="langgraph:Send")
    serde.register(Interrupt, _interrupt_to_data, _interrupt_from_data, name="langgraph:Interrupt")
    serde.register(Command, _command_to_data, _command_from_data, name="langgraph:Command")
    serde.register(_Empty, lambda _: None, lambda _: EMPTY, name="remit_langgraph:empty")
    serde.register(
        _ErrorRecord,
        lambda r: [r.type_name, r.message, r.args],
        _rebuild_error,
        name="remit_langgraph:error",
    )


register_types(default_serde)

__all__ = ["EMPTY", "RemitStoredError", "register_types", "storable"]
