"""CV for LangGraph: a graph's state schema, checked on channel values and node writes.

A LangGraph state is stored channel by channel, so a checkpoint is validated
field by field (``partial``) on the channels it changes. A node's write is
validated against its field's type only when the field has no reducer: a
reducer's input (one message for ``Annotated[list, add_messages]``) is not of
the field's type, so those fields are checked after the reducer ran, on the
checkpoint.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Annotated, Any, get_args, get_origin, get_type_hints, is_typeddict

from pydantic import BaseModel

from remit_core import StateSchema


def _has_reducer(tp: Any, metadata: Sequence[Any] = ()) -> bool:
    extras = list(metadata)
    if get_origin(tp) is Annotated:
        extras.extend(get_args(tp)[1:])
    return any(callable(x) for x in extras)


def reducer_fields(schema: Any) -> set[str]:
    """Fields of ``schema`` declared with a reducer (``Annotated[T, reducer]``)."""
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return {n for n, f in schema.model_fields.items()
                if _has_reducer(f.annotation, f.metadata)}
    if is_typeddict(schema) or (dataclasses.is_dataclass(schema) and isinstance(schema, type)):
        hints = get_type_hints(schema, include_extras=True)
        return {n for n, tp in hints.items() if _has_reducer(tp)}
    return set()


class GraphSchema:
    """The declared state of a graph: a TypedDict, a pydantic model or a dataclass."""

    def __init__(self, schema: Any) -> None:
        self.schema = schema
        self._state = StateSchema(schema)
        self._fields = self._state.field_names
        self._reduced = reducer_fields(schema)

    def check_state(self, values: dict[str, Any], *, run_id: str, step: str) -> None:
        """Validate the state channels of a checkpoint (only the schema's fields)."""
        mine = {k: v for k, v in values.items() if k in self._fields}
        if mine:
            self._state.check(mine, run_id=run_id, step=step, partial=True)

    def check_writes(self, writes: Sequence[tuple[str, Any]], *, run_id: str, node: str) -> None:
        """Validate a node's writes to fields without a reducer."""
        mine = {ch: v for ch, v in writes if ch in self._fields and ch not in self._reduced}
        if mine:
            self._state.check(mine, run_id=run_id, step=f"node {node!r}", partial=True)
