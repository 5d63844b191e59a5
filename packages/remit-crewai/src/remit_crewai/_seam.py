"""What remit-crewai relies on in CrewAI, checked where it is used.

``@durable`` wraps a flow class's public ``kickoff_async``, ``resume_async`` and
``from_pending`` and reads a few things CrewAI keeps on a flow: its ``name`` field, the
parked feedback of a flow restored by ``from_pending`` (``_pending_feedback_context``)
and the fields of a :class:`~crewai.flow.async_feedback.types.PendingFeedbackContext`
(what a parked run waits for). If one of them is missing or changed, ``@durable``
raises :class:`CrewAISeamError` naming it and the installed crewai version, instead of
keeping the contract with one of its properties (or the run lifecycle) silently off.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import inspect
from typing import Any

from crewai.flow.async_feedback.types import HumanFeedbackPending, PendingFeedbackContext

from remit_core import RemitError

SUPPORTED = ">=1.15,<1.16"

try:
    CREWAI_VERSION = importlib.metadata.version("crewai")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover (imported above)
    CREWAI_VERSION = "(unknown)"


class CrewAISeamError(RemitError, RuntimeError):
    """The installed crewai lacks (or changed) something remit-crewai relies on.

    ``seam`` names it. remit refuses to run rather than keep the resume contract, or the
    run lifecycle, with a part of it silently switched off."""

    def __init__(self, seam: str, problem: str) -> None:
        self.seam = seam
        self.crewai_version = CREWAI_VERSION
        super().__init__(
            f"remit-crewai cannot keep the resume contract on crewai {CREWAI_VERSION}: "
            f"{seam} {problem}. remit-crewai supports crewai{SUPPORTED}; install one of "
            "those releases (or a remit-crewai that supports this one).")


#: the wrapped entry points of a flow class and the parameters remit passes on
ENTRY_POINTS: dict[str, tuple[str, ...]] = {
    "kickoff_async": ("inputs", "input_files", "from_checkpoint", "restore_from_state_id"),
    "resume_async": ("feedback",),
    "from_pending": ("flow_id", "persistence"),
}
#: what a parked run's lifecycle records of the feedback it waits for
FEEDBACK_FIELDS = ("flow_id", "method_name", "message", "emit", "default_outcome")


def _check_context_type() -> None:
    if not dataclasses.is_dataclass(PendingFeedbackContext):
        raise CrewAISeamError("PendingFeedbackContext", "is no longer a dataclass")
    names = {f.name for f in dataclasses.fields(PendingFeedbackContext)}
    missing = [n for n in FEEDBACK_FIELDS if n not in names]
    if missing:
        raise CrewAISeamError("PendingFeedbackContext", f"has no field {missing[0]!r}")
    if "context" not in inspect.signature(HumanFeedbackPending).parameters:
        raise CrewAISeamError("HumanFeedbackPending", "takes no context")


def check_flow_class(cls: type) -> None:
    """The entry points and attributes ``@durable`` wraps and reads exist on ``cls``."""
    for name, params in ENTRY_POINTS.items():
        member = getattr(cls, name, None)
        if not callable(member):
            raise CrewAISeamError(f"{cls.__name__}.{name}",
                                  "is missing (is the class a crewai Flow?)")
        found = inspect.signature(member).parameters
        lost = [p for p in params if p not in found]
        if lost:
            raise CrewAISeamError(f"Flow.{name}", f"takes no parameter {lost[0]!r}")
    fields = getattr(cls, "model_fields", None)
    if not isinstance(fields, dict) or "name" not in fields:
        raise CrewAISeamError("Flow.name", "is not a field of the flow")
    private = getattr(cls, "__private_attributes__", None)
    if not isinstance(private, dict) or "_pending_feedback_context" not in private:
        raise CrewAISeamError("Flow._pending_feedback_context",
                              "is not where a restored flow keeps its parked feedback")


def class_name(cls: type) -> str:
    """The lifecycle name of the runs of flow class ``cls``: the ``name`` the class gives
    its flows (CrewAI's own ``name`` field), else the class's name."""
    field = getattr(cls, "model_fields", {}).get("name")
    default = getattr(field, "default", None)
    return default if isinstance(default, str) and default else cls.__name__


def flow_name(flow: Any) -> str:
    """The lifecycle name of one flow: its ``name`` (CrewAI's, as CrewAI names the flow
    in its events), else its class's name."""
    name = getattr(flow, "name", None)
    return name if isinstance(name, str) and name else type(flow).__name__


def feedback_waiting(pending: HumanFeedbackPending) -> dict[str, Any]:
    """What a flow parked on human feedback waits for, as JSON: the method asking, its
    message, the outcomes it may emit and the default one."""
    context = getattr(pending, "context", None)
    if not isinstance(context, PendingFeedbackContext):
        raise CrewAISeamError("HumanFeedbackPending.context",
                              f"is a {type(context).__name__}, not a PendingFeedbackContext")
    return context_waiting(context)


def context_waiting(context: PendingFeedbackContext) -> dict[str, Any]:
    """:func:`feedback_waiting` of a parked flow's context (a stock layer's stored one)."""
    emit = context.emit
    return {"feedback": {
        "flow_id": str(context.flow_id),
        "method": str(context.method_name),
        "message": str(context.message),
        "emit": None if emit is None else [str(e) for e in emit],
        "default_outcome": None if context.default_outcome is None
        else str(context.default_outcome),
    }}


_check_context_type()

__all__ = ["CREWAI_VERSION", "CrewAISeamError", "check_flow_class", "class_name",
           "context_waiting", "feedback_waiting", "flow_name"]
