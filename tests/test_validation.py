"""StateSchema: TypedDict, pydantic and dataclass schemas, whole and field by field."""

from __future__ import annotations

import dataclasses
from typing import Annotated, TypedDict

import pytest
from pydantic import BaseModel

from remit_core import StateSchema, StateValidationError


class TD(TypedDict):
    count: int
    tags: Annotated[list[str], "meta"]


class PM(BaseModel):
    count: int
    tags: list[str] = []


@dataclasses.dataclass
class DC:
    count: int
    tags: list[str] = dataclasses.field(default_factory=list)


@pytest.mark.parametrize("schema", [TD, PM, DC], ids=["typeddict", "pydantic", "dataclass"])
def test_schemas(schema: object) -> None:
    s = StateSchema(schema)
    assert s.field_names == {"count", "tags"}
    s.check({"count": 1, "tags": ["a"]})
    assert s.check({"count": 2}, partial=True) == {"count": 2}
    with pytest.raises(StateValidationError) as info:
        s.check({"count": 1, "tags": ["a", 5]}, run_id="r", step="node 'n'")
    err = info.value
    assert err.field == "tags[1]" and err.run_id == "r" and err.step == "node 'n'"
    assert "tags[1]" in str(err) and "node 'n'" in str(err) and err.errors
    with pytest.raises(StateValidationError) as partial:
        s.check({"count": "many"}, partial=True)
    assert partial.value.field == "count"


def test_instance_of_the_schema_is_checked() -> None:
    s = StateSchema(PM)
    ok = PM(count=1)
    s.check(ok)
    bad = PM.model_construct(count="x")  # built without validation, as frameworks may
    with pytest.raises(StateValidationError, match="count"):
        s.check(bad)
    s_dc = StateSchema(DC)
    with pytest.raises(StateValidationError, match="count"):
        s_dc.check(DC(count="x"))  # type: ignore[arg-type]


def test_typeddict_missing_required_key() -> None:
    with pytest.raises(StateValidationError) as info:
        StateSchema(TD).check({"count": 1})
    assert info.value.field == "tags"


def test_strict_instances_and_partial_without_fields() -> None:
    strict = StateSchema(DC, strict=True)
    strict.check(DC(count=1, tags=["a"]))
    with pytest.raises(StateValidationError, match="count"):
        strict.check(DC(count="1"))  # type: ignore[arg-type]
    assert StateSchema(int).check({"anything": 1}, partial=True) == {"anything": 1}


def test_scalar_schema() -> None:
    s = StateSchema(int, strict=True)
    assert s.check(5) == 5
    with pytest.raises(StateValidationError) as info:
        s.check("5", run_id="r", step="end")
    assert info.value.field == "$"
