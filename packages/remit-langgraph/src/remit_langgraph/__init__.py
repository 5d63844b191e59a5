"""remit for LangGraph. The adapter lands with its own issue; this package re-exports the core."""

from remit_core import (
    ConsumeConflict,
    CorruptRecord,
    EffectInDoubt,
    RemitError,
    StateValidationError,
    effect,
    open_store,
)

__version__ = "0.1.0"

__all__ = [
    "ConsumeConflict",
    "CorruptRecord",
    "EffectInDoubt",
    "RemitError",
    "StateValidationError",
    "effect",
    "open_store",
]
