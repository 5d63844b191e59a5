"""Deterministic ids (FD, RD): one helper derives every id remit controls."""

from __future__ import annotations

import uuid
from typing import Any

from remit_core.serde import Serde, default_serde

REMIT_NAMESPACE = uuid.UUID("6b1f3f8e-0c55-5b7e-9d0a-72656d697430")


def derive_id(parent_id: str | None, intent: str, value: Any = None, *,
              serde: Serde | None = None) -> str:
    """A UUID (version 5) derived from (parent id, intent, canonical digest of ``value``).

    The same three inputs give the same id in every process and on every machine:
    forking twice from one checkpoint with the same input yields one fork id, and
    recovering the same durable state twice names its records alike.
    """
    digest = (serde or default_serde).digest(value)
    return str(uuid.uuid5(REMIT_NAMESPACE, f"{parent_id or ''}\x1f{intent}\x1f{digest}"))


def value_digest(value: Any, *, serde: Serde | None = None) -> str:
    """The canonical SHA-256 of a value, as recorded on consumed claims."""
    return (serde or default_serde).digest(value)
