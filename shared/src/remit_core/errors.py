"""The errors remit raises.

Every error subclasses :class:`RemitError`, carries its facts as attributes and
says in its message what to do next.
"""

from __future__ import annotations

from typing import Any


def _rebuild(cls: type[RemitError], args: tuple[Any, ...], state: dict[str, Any]) -> RemitError:
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class RemitError(Exception):
    """Base class of every error remit raises.

    Errors pickle with their attributes, so they cross process boundaries
    (multiprocessing, task queues) intact.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


# --- configuration and the store itself ---------------------------------------------------------


class StoreConfigError(RemitError, ValueError):
    """The store URL or its options are wrong (unknown scheme, typo, bad option)."""

    def __init__(self, message: str, *, url: str | None = None) -> None:
        self.url = url
        super().__init__(message)


class StoreNotFound(StoreConfigError):
    """A read-only open (``remit inspect``) found no remit store at the URL: no such
    file, schema or key prefix, or one that remit did not write. Nothing was created."""


class StoreUnavailable(RemitError, ConnectionError):
    """The store's server could not be reached (after the bounded retries)."""

    def __init__(self, message: str, *, url: str | None = None) -> None:
        self.url = url
        super().__init__(message)


class StoreClosed(RemitError, RuntimeError):
    """The store was closed; an operation started after :meth:`Store.close` is refused."""

    def __init__(self, message: str, *, url: str | None = None) -> None:
        self.url = url
        super().__init__(message)


class StoreVersionError(RemitError):
    """The store was written by a newer remit than this one."""

    def __init__(self, message: str, *, url: str | None = None, found: int, supported: int) -> None:
        self.url = url
        self.found = found
        self.supported = supported
        super().__init__(message)


class ForeignSchemaError(RemitError):
    """A table or key with remit's name exists but was not created by remit."""

    def __init__(self, message: str, *, url: str | None = None, name: str) -> None:
        self.url = url
        self.name = name
        super().__init__(message)


class DurabilityError(RemitError):
    """The backend would lose committed records on a restart (for example a Redis without AOF/RDB)."""

    def __init__(self, message: str, *, url: str | None = None) -> None:
        self.url = url
        super().__init__(message)


# --- the contract ------------------------------------------------------------------------------


class ConsumeConflict(RemitError):
    """CO: a one-time slot (a resume value, a claim, an effect key) was already taken.

    Raised before any code after the gated point runs. ``owner`` is who holds or
    consumed the slot, ``consumed_at`` when it was consumed (None while it is only
    claimed).
    """

    def __init__(
        self,
        message: str,
        *,
        key: str,
        run_id: str | None = None,
        step: str | None = None,
        owner: str | None = None,
        consumed_at: float | None = None,
        status: str | None = None,
    ) -> None:
        self.key = key
        self.run_id = run_id
        self.step = step
        self.owner = owner
        self.consumed_at = consumed_at
        self.status = status
        super().__init__(message)


class StateValidationError(RemitError, ValueError):
    """CV: a state that violates the declared schema was refused; nothing was written."""

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None,
        step: str | None,
        field: str,
        errors: list[dict[str, Any]] | None = None,
    ) -> None:
        self.run_id = run_id
        self.step = step
        self.field = field
        self.errors = errors or []
        super().__init__(message)


class EffectInDoubt(RemitError):
    """EO: an effect started in a process that died before its result was recorded.

    remit cannot know whether the external call happened. Reconcile with the
    outside system using ``key`` (the idempotency key the call would have used),
    then record the outcome with ``Store.resolve_receipt(key, result)`` or allow a
    re-run with ``Store.reset_receipt(key)``. Declaring the function with an
    ``idempotency_key`` parameter, or ``@effect(on_in_doubt="retry")``, makes remit
    re-call it instead.
    """

    def __init__(
        self,
        message: str,
        *,
        key: str,
        run_id: str | None,
        step: str | None,
        name: str,
        owner: str | None,
        started_at: float | None,
    ) -> None:
        self.key = key
        self.run_id = run_id
        self.step = step
        self.name = name
        self.owner = owner
        self.started_at = started_at
        super().__init__(message)


class CorruptRecord(RemitError):
    """Stored bytes failed to decode or validate; they were not used."""

    def __init__(self, message: str, *, record: str) -> None:
        self.record = record
        super().__init__(message)


class UnregisteredType(CorruptRecord):
    """Stored bytes name a type this process has not registered or allowed; nothing was used.

    Decoding builds only types named before the read (``Serde.register``,
    ``Serde.allow``, ``Serde.allow_annotations``, or a class the process itself
    encoded), by exact name, and never imports a module. ``type_name`` is
    ``"module:QualName"`` as stored.
    """

    def __init__(self, message: str, *, record: str, type_name: str) -> None:
        self.type_name = type_name
        super().__init__(message, record=record)


class SerializationError(RemitError, TypeError):
    """A value cannot be stored (an unsupported type); raised at write time, nothing was written."""

    def __init__(self, message: str, *, path: str, type_name: str) -> None:
        self.path = path
        self.type_name = type_name
        super().__init__(message)


class LeaseLost(RemitError):
    """A fenced write was refused because another owner took over the lease."""

    def __init__(self, message: str, *, key: str, owner: str | None = None) -> None:
        self.key = key
        self.owner = owner
        super().__init__(message)


__all__ = [
    "ConsumeConflict",
    "CorruptRecord",
    "DurabilityError",
    "EffectInDoubt",
    "ForeignSchemaError",
    "LeaseLost",
    "RemitError",
    "SerializationError",
    "StateValidationError",
    "StoreConfigError",
    "StoreNotFound",
    "StoreUnavailable",
    "StoreVersionError",
    "UnregisteredType",
]
