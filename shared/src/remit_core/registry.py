"""What installed adapters add to remit, found through entry points; the core names none.

An adapter distribution declares its parts as entry points of the group
``remit.adapters``, each named ``<framework>.<part>``::

    [project.entry-points."remit.adapters"]
    "myframework.migrate" = "remit_myframework.migrate:migrate"
    "myframework.check" = "remit_myframework_check"
    "myframework.pytest" = "remit_myframework_check.fixtures"
    "myframework.recover" = "remit_myframework.recovery:recoverable"

* ``migrate``: a function ``migrate(source, target, *, run_id=None) -> MigrationReport``,
  the command ``remit migrate <framework>``;
* ``check``: a module declaring the framework's part of ``remit check`` (its layers and
  fault scenarios; the protocol is in the remit-check package, ``remit_check``);
* ``pytest``: a module of pytest fixtures for that framework, which remit-check's pytest
  plugin registers;
* ``recover``: a function ``recoverable(obj, store_url) -> Recoverable | None`` that
  recognises the framework's graphs or flows for ``remit worker``
  (:mod:`remit_core.worker`).

Its serde types go through the same loader, in the group ``remit.serde`` (a function
``register_types(serde)``, see :func:`remit_core.serde.load_registrations`).

Listing reads installed metadata only: it imports nothing, so ``remit --help`` and the
pytest plugin stay cheap. A part is imported when a command needs it
(:meth:`Registration.load`).
"""

from __future__ import annotations

import importlib.metadata
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from remit_core.errors import RemitError

GROUP: Final = "remit.adapters"
"""The entry point group of the adapters' parts, named ``<framework>.<part>``."""
PARTS: Final = ("migrate", "check", "pytest", "recover")


class RegistrationError(RemitError):
    """A part that is not registered, or that does not load."""


@dataclass(frozen=True)
class Registration:
    """One part of one adapter, as its distribution declared it."""

    framework: str
    part: str
    #: ``"module:attribute"`` or ``"module"``
    target: str
    #: the distribution that declared it: what to ``pip install``
    distribution: str
    entry_point: importlib.metadata.EntryPoint

    @property
    def module(self) -> str:
        return self.entry_point.module

    def load(self) -> Any:
        """Import the part (a module, or an attribute of one)."""
        return self.entry_point.load()


def _distribution(ep: importlib.metadata.EntryPoint) -> str:
    dist = ep.dist
    return dist.name if dist is not None else "?"


def registrations(part: str, *, group: str = GROUP) -> dict[str, Registration]:
    """Framework name -> its registration of ``part``, sorted by name. Imports nothing.

    Two distributions that register the same part of the same framework: the first
    found is kept, with a warning naming both."""
    if part not in PARTS:
        raise ValueError(f"unknown part {part!r}; the parts are {', '.join(PARTS)}")
    found: dict[str, Registration] = {}
    for ep in importlib.metadata.entry_points(group=group):
        framework, dot, kind = ep.name.rpartition(".")
        if not dot or kind != part or not framework:
            continue
        reg = Registration(framework, part, ep.value, _distribution(ep), ep)
        if framework in found and found[framework].target != reg.target:
            warnings.warn(f"remit: {part} of {framework} is registered twice, by "
                          f"{found[framework].distribution} ({found[framework].target}) and "
                          f"{reg.distribution} ({reg.target}); using the first", stacklevel=2)
            continue
        found.setdefault(framework, reg)
    return dict(sorted(found.items()))


def registration(part: str, framework: str) -> Registration:
    """The registration of ``part`` for ``framework``, or a :class:`RegistrationError`
    that lists the frameworks that have one."""
    found = registrations(part)
    try:
        return found[framework]
    except KeyError:
        known = ", ".join(found) or "none is installed"
        raise RegistrationError(f"no installed adapter registers {part} for {framework!r} "
                                f"(installed: {known})") from None


def distributions(*groups: str) -> list[str]:
    """The distributions that declare entry points in ``groups`` (default: :data:`GROUP`),
    sorted by name. Imports nothing."""
    names = {_distribution(ep) for group in groups or (GROUP,)
             for ep in importlib.metadata.entry_points(group=group)}
    return sorted(names)


def call_each(group: str, *args: Any, what: str = "the entry point") -> list[str]:
    """Load every entry point of ``group`` and call it with ``args``; return the entry
    points called. One that fails to load or raises is skipped with a warning naming it
    (``what`` says what it is), so that the others still run (the serde registrations
    use this)."""
    called: list[str] = []
    for ep in importlib.metadata.entry_points(group=group):
        try:
            fn: Callable[..., Any] = ep.load()
            fn(*args)
        except Exception as exc:
            warnings.warn(f"remit: {what} {ep.value} ({ep.name}, from {_distribution(ep)}) "
                          f"could not be loaded: {type(exc).__name__}: {exc}", stacklevel=3)
        else:
            called.append(ep.value)
    return called


__all__ = ["GROUP", "PARTS", "Registration", "RegistrationError", "call_each", "distributions",
           "registration", "registrations"]
