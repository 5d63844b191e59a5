"""Deterministic ids (FD, RD): one helper derives every id remit controls."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

from remit_core.serde import Serde, default_serde

REMIT_NAMESPACE = uuid.UUID("6b1f3f8e-0c55-5b7e-9d0a-72656d697430")
_NAMESPACE_BYTES = REMIT_NAMESPACE.bytes


def derive_id(parent_id: str | None, intent: str, value: Any = None, *,
              serde: Serde | None = None) -> str:
    """A UUID (version 5) derived from (parent id, intent, canonical digest of ``value``).

    The same three inputs give the same id in every process and on every machine:
    forking twice from one checkpoint with the same input yields one fork id, and
    recovering the same durable state twice names its records alike.
    """
    return uuid_text(derive_int(parent_id, intent, value, serde=serde))


def derive_int(parent_id: str | None, intent: str, value: Any = None, *,
               serde: Serde | None = None) -> int:
    """:func:`derive_id` as the UUID's 128-bit integer (``uuid.UUID(derive_id(...)).int``),
    for a caller that lays out an id of its own from it."""
    digest = (serde or default_serde).digest(value)
    # uuid.uuid5(REMIT_NAMESPACE, name).int, without building the UUID objects
    name = f"{parent_id or ''}\x1f{intent}\x1f{digest}".encode()
    n = int.from_bytes(hashlib.sha1(_NAMESPACE_BYTES + name).digest()[:16], "big")
    return (n & ~(0xC000 << 48) | 0x8000 << 48) & ~(0xF000 << 64) | 5 << 76


def uuid_text(n: int) -> str:
    """``str(uuid.UUID(int=n))``, without building the UUID."""
    h = f"{n:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def value_digest(value: Any, *, serde: Serde | None = None) -> str:
    """The canonical SHA-256 of a value, as recorded on consumed claims."""
    return (serde or default_serde).digest(value)
