"""LangGraph's own types on remit's typed envelope.

The envelope stores JSON types, bytes, datetimes, UUIDs, tuples, sets, pydantic
models, dataclasses, enums and NamedTuples; it decodes a class only if it was
registered or allowed before the read, by exact name (see :mod:`remit_core.serde`).
:func:`register_types` teaches it what the Pregel loop puts into checkpoints and
pending writes:

* ``Send`` (``__pregel_tasks`` values, ``Command.goto``), ``Interrupt``
  (``__interrupt__`` writes) and ``Command`` -- under fixed names, with their own
  ``to_data``/``from_data``;
* :data:`EMPTY`, the marker for a channel that has a version but no value;
* LangGraph's dataclasses and NamedTuples that travel in state (``Overwrite``,
  ``TimeoutPolicy``, ``_DeltaSnapshot``, where the installed version has them) and
  langchain-core's message classes (the list LangGraph itself curates) and
  ``Document`` -- allowed by class object, imported here from their defining modules.

An exception (an ``__error__`` write) is stored as what LangGraph's own serializer
makes of it, ``repr(exc)`` (see :func:`storable`), so ``task.error`` is the string
the stock savers give. Records that older remit releases wrote for an exception
(``remit_langgraph:error``) read back as that same kind of string; no exception
class is looked up or built.

The entry point ``remit.serde`` of this package names :func:`register_types`, so
that ``remit inspect`` reads LangGraph runs. Nothing here uses pickle or LangGraph's
``JsonPlusSerializer``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Final

from langgraph.types import Command, Interrupt, Send

from remit_core.adapter import Serde, default_serde
from remit_langgraph import _seam


class _Empty:
    """A channel that has a version but no value (InMemorySaver stores ``("empty", b"")``)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "remit_langgraph.EMPTY"


EMPTY: Final = _Empty()
"""Stored for a channel of ``new_versions`` that is absent from ``channel_values``."""


@dataclass(frozen=True, slots=True)
class _ErrorRecord:
    """What remit before 0.2 stored for an exception; only read now (see _old_error)."""

    type_name: str
    message: str
    args: list[Any] | None


def storable(value: Any, serde: Serde | None = None) -> Any:
    """``value`` as the envelope stores it: an exception becomes ``repr(exc)``, the string
    LangGraph's serializer makes of it (``"RuntimeError('boom')"``), so that a pending
    ``__error__`` write reads back exactly as from the stock savers. Any other value
    passes unchanged (an unsupported one then fails in the store with SerializationError).
    ``serde`` is accepted for the callers' sake and not used."""
    if isinstance(value, BaseException):
        return repr(value)
    return value


def _old_error(data: Any) -> str:
    """A record of an older remit (class name, message, arguments) as the repr-like
    string the stock savers give, e.g. ``"ValueError('bad', 3)"``; never an object."""
    type_name, message, args = data
    name = str(type_name).rpartition(":")[2].rpartition(".")[2] or "Exception"
    if isinstance(args, list):
        return f"{name}({', '.join(repr(a) for a in args)})"
    return f"{name}({str(message)!r})"


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


# classes allowed by object: (defining module, names); a name the installed version
# does not have is skipped (langgraph >= 1.0, langchain-core as langgraph requires)
_ALLOWED: Final = (
    ("langgraph.types", ("Overwrite", "TimeoutPolicy")),
    ("langchain_core.messages.base", ("BaseMessage", "BaseMessageChunk")),
    ("langchain_core.messages.human", ("HumanMessage", "HumanMessageChunk")),
    ("langchain_core.messages.ai", ("AIMessage", "AIMessageChunk")),
    ("langchain_core.messages.system", ("SystemMessage", "SystemMessageChunk")),
    ("langchain_core.messages.chat", ("ChatMessage", "ChatMessageChunk")),
    ("langchain_core.messages.tool", ("ToolMessage", "ToolMessageChunk")),
    ("langchain_core.messages.function", ("FunctionMessage", "FunctionMessageChunk")),
    ("langchain_core.messages.modifier", ("RemoveMessage",)),
    ("langchain_core.documents.base", ("Document",)),
)


def _allowed_classes() -> list[type]:
    found: list[type] = []
    for module_name, names in _ALLOWED:
        try:
            module = importlib.import_module(module_name)  # a fixed list, not stored names
        except ImportError:
            continue
        for name in names:
            cls = vars(module).get(name)
            if isinstance(cls, type) and cls.__module__ == module_name:
                found.append(cls)
    if _seam.DeltaSnapshot is not None:  # a private class of LangGraph's: through the seam
        found.append(_seam.DeltaSnapshot)
    return found


def register_types(serde: Serde) -> None:
    """Teach ``serde`` LangGraph's types (the ``remit.serde`` entry point). Idempotent;
    registered names are append-only."""
    serde.register(Send, _send_to_data, _send_from_data, name="langgraph:Send")
    serde.register(Interrupt, _interrupt_to_data, _interrupt_from_data, name="langgraph:Interrupt")
    serde.register(Command, _command_to_data, _command_from_data, name="langgraph:Command")
    serde.register(_Empty, lambda _: None, lambda _: EMPTY, name="remit_langgraph:empty")
    serde.register(_ErrorRecord, lambda r: [r.type_name, r.message, r.args], _old_error,
                   name="remit_langgraph:error")
    serde.allow(*_allowed_classes())


register_types(default_serde)

__all__ = ["EMPTY", "register_types", "storable"]
