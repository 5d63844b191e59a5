"""CV: state schemas, checked before anything is written.

:class:`StateSchema` wraps a pydantic model, a dataclass or a TypedDict (or any
type pydantic can validate) and turns a validation failure into
:class:`StateValidationError` naming the field path, the run and the step.
Adapters pass ``lambda: schema.check(values, run_id=..., step=...)`` as the
``validate=`` argument of the store's writes, so that a failure writes nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, get_type_hints, is_typeddict

import pydantic
from pydantic import BaseModel, TypeAdapter
from pydantic_core import PydanticSerializationError

from remit_core.errors import StateValidationError


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "$"


class StateSchema:
    """A declared state type and its validators.

    ``check(values)`` validates a whole state; ``check(values, partial=True)``
    validates only the fields present (for stores that see state channel by
    channel). Unknown keys are left to the framework.
    """

    def __init__(self, schema: Any, *, strict: bool = False) -> None:
        self.schema = schema
        self.strict = strict
        self._fields: dict[str, TypeAdapter[Any]] = {}
        self._unchecked: set[str] = set()
        for name, tp in self._field_types(schema).items():
            try:
                self._fields[name] = TypeAdapter(tp)
            except pydantic.PydanticUserError:
                # a field pydantic cannot build a validator for on this Python (e.g. a nested
                # typing.TypedDict before 3.12): it is stored unchecked
                self._unchecked.add(name)
        self._required: frozenset[str] = frozenset()
        self._adapter: TypeAdapter[Any] | None
        if is_typeddict(schema):
            # pydantic refuses typing.TypedDict before Python 3.12: validate field by field
            self._adapter = None
            self._required = frozenset(getattr(schema, "__required_keys__", ()))
        else:
            self._adapter = TypeAdapter(schema)

    @staticmethod
    def _field_types(schema: Any) -> dict[str, Any]:
        if isinstance(schema, type) and issubclass(schema, BaseModel):
            return {n: f.annotation for n, f in schema.model_fields.items()}
        if dataclasses.is_dataclass(schema) and isinstance(schema, type):
            hints = get_type_hints(schema, include_extras=True)
            return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(schema)}
        if is_typeddict(schema):
            return dict(get_type_hints(schema, include_extras=True))
        return {}

    @property
    def field_names(self) -> set[str]:
        return set(self._fields) | self._unchecked

    def check(self, values: Any, *, run_id: str | None = None, step: str | None = None,
              partial: bool = False) -> Any:
        """Return the validated value, or raise :class:`StateValidationError`."""
        try:
            if partial and isinstance(values, Mapping):
                return self._each_field(values)
            if isinstance(values, self._python_type()):
                # an instance may have been built or assigned without validation: check the
                # values its fields hold now, one by one (strict mode included)
                return self._each_field(_as_mapping(values))
            if self._adapter is None:
                return self._check_fields(values)
            return self._adapter.validate_python(values, strict=self.strict)
        except _PrefixedError as exc:
            raise self._error(exc.error, exc.prefix, run_id, step) from None
        except pydantic.ValidationError as exc:
            raise self._error(exc, "", run_id, step) from None

    def _check_fields(self, values: Any) -> Any:
        if not isinstance(values, Mapping):
            raise pydantic.ValidationError.from_exception_data(
                "state", [{"type": "dict_type", "loc": (), "input": values}])
        missing = sorted(self._required - set(values))
        if missing:
            raise pydantic.ValidationError.from_exception_data(
                "state", [{"type": "missing", "loc": (missing[0],), "input": values}])
        return self._each_field(values)

    def _each_field(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Validate each present field on its own; unknown keys pass through."""
        out = {}
        for name, value in values.items():
            adapter = self._fields.get(name)
            if adapter is None:
                out[name] = value
                continue
            try:
                out[name] = adapter.validate_python(value, strict=self.strict)
            except pydantic.ValidationError as exc:
                raise _prefixed(exc, name) from None
        return out

    def dump_json(self, values: Any, *, run_id: str | None = None,
                  step: str | None = None) -> Any:
        """``values`` (already checked) as JSON-ready data: pydantic's ``mode="json"``,
        with a serializer warning treated as an error. A value that validates but cannot
        be dumped (an object in an ``Any`` field, say) raises :class:`StateValidationError`
        naming the field that holds it, never pydantic's raw serialization error."""
        try:
            if self._adapter is not None:
                return self._adapter.dump_python(values, mode="json", warnings="error")
            return {name: self._fields.get(name, _ANY).dump_python(
                        value, mode="json", warnings="error")
                    for name, value in dict(values).items()}
        except PydanticSerializationError as exc:
            raise self.dump_error(values, exc, run_id=run_id, step=step) from None

    def dump_error(self, values: Any, exc: Exception, *, run_id: str | None = None,
                   step: str | None = None) -> StateValidationError:
        """The :class:`StateValidationError` for ``exc``, pydantic's error when dumping
        ``values``: it names the deepest field whose value cannot be dumped."""
        field, bad = "$", values
        mapping = _as_mapping(values)
        if isinstance(mapping, Mapping):
            for name, value in mapping.items():
                try:
                    self._fields.get(name, _ANY).dump_python(value, mode="json",
                                                             warnings="error")
                except PydanticSerializationError:
                    field, bad = _deepest(value, str(name))
                    break
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        msg = lines[-1] if lines else type(exc).__name__
        where = f"run {run_id!r}, step {step!r}" if run_id or step else "this state"
        return StateValidationError(
            f"invalid state in {where}: field {field!r}: cannot be stored as JSON ({msg}) "
            f"(got {type(bad).__name__} {bad!r:.60}). Nothing was written; the last valid "
            f"checkpoint is still the latest. Store a value of a JSON type, a pydantic model "
            f"or a dataclass there (or declare the field's type), then resume.",
            run_id=run_id, step=step, field=field,
            errors=[{"type": "serialization", "loc": field, "msg": msg}],
        )

    def _python_type(self) -> tuple[type, ...]:
        """The schema's class when its instances carry fields (a model or a dataclass)."""
        schema = self.schema
        if isinstance(schema, type) and (issubclass(schema, BaseModel)
                                         or dataclasses.is_dataclass(schema)):
            return (schema,)
        return ()

    def _error(self, exc: pydantic.ValidationError, prefix: str, run_id: str | None,
               step: str | None) -> StateValidationError:
        errors = exc.errors(include_url=False)
        first = errors[0] if errors else {"loc": (), "msg": str(exc), "type": "unknown"}
        loc = tuple(first.get("loc", ()))
        field = _loc(((prefix,) if prefix else ()) + loc)
        got = first.get("input")
        got_s = f" (got {type(got).__name__} {got!r:.60})" if "input" in first else ""
        where = f"run {run_id!r}, step {step!r}" if run_id or step else "this state"
        return StateValidationError(
            f"invalid state in {where}: field {field!r}: {first.get('msg')}{got_s}. "
            f"Nothing was written; the last valid checkpoint is still the latest. "
            f"Fix the value the step returns and resume.",
            run_id=run_id, step=step, field=field,
            errors=[dict(e) for e in errors],
        )


_ANY: TypeAdapter[Any] = TypeAdapter(Any)


def _children(value: Any) -> list[tuple[str | int, Any]]:
    if isinstance(value, BaseModel) or (dataclasses.is_dataclass(value)
                                        and not isinstance(value, type)):
        return list(_as_mapping(value).items())
    if isinstance(value, Mapping):
        return [(k if isinstance(k, str | int) else repr(k), v) for k, v in value.items()]
    if isinstance(value, list | tuple | set | frozenset):
        return list(enumerate(value))
    return []


def _deepest(value: Any, path: str) -> tuple[str, Any]:
    """Walk down from ``value`` (at ``path``) to the innermost value that cannot be
    dumped on its own: the field to name. A loop, not recursion."""
    while True:
        for key, child in _children(value):
            try:
                _ANY.dump_python(child, mode="json", warnings="error")
            except PydanticSerializationError:
                value = child
                path = f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}"
                break
        else:
            return path, value


class _PrefixedError(Exception):
    def __init__(self, error: pydantic.ValidationError, prefix: str) -> None:
        self.error = error
        self.prefix = prefix


def _prefixed(exc: pydantic.ValidationError, prefix: str) -> _PrefixedError:
    return _PrefixedError(exc, prefix)


def _as_mapping(value: Any) -> Any:
    if isinstance(value, BaseModel):  # the raw field values, as assigned
        return {name: getattr(value, name) for name in type(value).model_fields}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return value
