"""Errors keep their message and facts across a pickle round trip (process boundaries)."""

from __future__ import annotations

import pickle

import pytest

from remit_core import errors as e

SAMPLES = [
    e.StoreConfigError("bad url", url="x://"),
    e.StoreUnavailable("down", url="postgresql://h/db"),
    e.StoreVersionError("newer", url="sqlite:///a.db", found=9, supported=1),
    e.ConsumeConflict("taken", key="k", run_id="r", owner="o", status="consumed"),
    e.StateValidationError("bad", run_id="r", step="s", field="count", errors=[{"loc": ["count"]}]),
    e.EffectInDoubt("doubt", key="k", run_id="r", step="s", name="charge", owner="o",
                    started_at=1.0),
    e.CorruptRecord("corrupt", record="checkpoint c"),
    e.SerializationError("no", path="$.x", type_name="object"),
    e.LeaseLost("lost", key="k", owner="o"),
]


@pytest.mark.parametrize("exc", SAMPLES, ids=lambda x: type(x).__name__)
def test_errors_pickle_with_their_facts(exc: e.RemitError) -> None:
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc)
    assert str(back) == str(exc)
    assert back.__dict__ == exc.__dict__
