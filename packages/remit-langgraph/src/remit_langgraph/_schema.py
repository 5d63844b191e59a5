"""CV for LangGraph: a graph's state schema, checked on channel values and node writes.

A LangGraph state is stored channel by channel, so a checkpoint is validated
field by field (``partial``) on the channels it changes. A node's write to a
plain field is validated against the field's type. A write to a field with a
reducer (``Annotated[list, add_messages]``) is not of the field's type, so the
reducer is applied to the field's stored value and the result is validated:
an invalid write is refused before it is stored as a pending write, which would
otherwise be re-applied on every resume.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, get_args, get_origin, get_type_hints, is_typeddict

from pydantic import BaseModel

from remit_core import StateSchema

Reducer = Callable[[Any, Any], Any]


def _reducer(tp: Any, metadata: Sequence[Any] = ()) -> tuple[Reducer, Any] | None:
    """The reducer of an ``Annotated[T, reducer]`` field and its base type ``T``."""
    extras = list(metadata)
    base = tp
    if get_origin(tp) is Annotated:
        base, *more = get_args(tp)
        extras.extend(more)
    for x in extras:
        if callable(x):
            return x, base
    return None


def reducers(schema: Any) -> dict[str, tuple[Reducer, Any]]:
    """Fields of ``schema`` declared with a reducer, with the reducer and the base type."""
    found: dict[str, tuple[Reducer, Any] | None] = {}
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        found = {n: _reducer(f.annotation, f.metadata) for n, f in schema.model_fields.items()}
    elif is_typeddict(schema) or (dataclasses.is_dataclass(schema) and isinstance(schema, type)):
        found = {n: _reducer(tp) for n, tp in get_type_hints(schema, include_extras=True).items()}
    return {n: r for n, r in found.items() if r is not None}


def _empty(base: Any) -> Any:
    """The value a reducer channel starts from (LangGraph calls the type with no args)."""
    origin = get_origin(base) or base
    try:
        return origin()
    except Exception:
        return None


def state_schema_of(schema: Any) -> Any:
    """The state schema ``schema`` names: itself (a TypedDict, a pydantic model or a
    dataclass), or the ``state_schema`` of a ``StateGraph`` or of a compiled graph's
    builder, so that ``schema=builder`` declares what the graph already declares."""
    builder = getattr(schema, "builder", schema)  # a compiled graph keeps its StateGraph
    found = getattr(builder, "state_schema", None)
    if found is not None and not isinstance(schema, type):
        return found
    return schema


class GraphSchema:
    """The declared state of a graph: a TypedDict, a pydantic model or a dataclass."""

    def __init__(self, schema: Any) -> None:
        schema = state_schema_of(schema)
        self.schema = schema
        self._state = StateSchema(schema)
        self._fields = self._state.field_names
        self._reducers = reducers(schema)

    def check_state(self, values: dict[str, Any], *, run_id: str, step: str) -> None:
        """Validate the state channels of a checkpoint (only the schema's fields)."""
        mine = {k: v for k, v in values.items() if k in self._fields}
        if mine:
            self._state.check(mine, run_id=run_id, step=step, partial=True)

    def check_writes(self, writes: Sequence[tuple[str, Any]], *, run_id: str, node: str,
                     current: Callable[[], Mapping[str, Any]]) -> None:
        """Validate a node's writes; ``current()`` gives the stored values reducers fold into."""
        mine: dict[str, Any] = {}
        stored: Mapping[str, Any] | None = None
        for channel, value in writes:
            if channel not in self._fields:
                continue
            if channel not in self._reducers:
                mine[channel] = value
                continue
            reduce, base = self._reducers[channel]
            if channel not in mine:
                if stored is None:
                    stored = current()
                mine[channel] = stored[channel] if channel in stored else _empty(base)
            try:
                mine[channel] = reduce(mine[channel], value)
            except Exception:  # the reducer itself refuses it: LangGraph will raise
                mine.pop(channel)
        if mine:
            self._state.check(mine, run_id=run_id, step=f"node {node!r}", partial=True)
